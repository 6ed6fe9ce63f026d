"""A forecasting config and what one training needs from it: the data, the model and train configs,
the windows. ``aiayn forecast train`` and ``aiayn forecast tune`` both build their runs here.

A YAML config has up to four sections: ``data`` (:class:`~aiayn.forecast.data.SeriesConfig`: path
relative to the config file, target, features, input_len, label_len, horizon), ``model``
(:class:`~aiayn.forecast.model.ForecastConfig` fields but the data's shapes), ``train``
(:class:`~aiayn.forecast.train.ForecastTrainConfig`: the engine's settings and forecasting's own) and
``tune`` (:class:`~aiayn.forecast.tune.TuneConfig`), all read by the one strict loader of
:mod:`aiayn.config`; settings under their former names are read with one warning.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiayn.config import Checked, assign_flags, from_mapping, read_yaml, reported, upgrade, warn_renamed
from aiayn.errors import Setting, SettingError, UserError
from aiayn.forecast.data import ForecastData, SeriesConfig, Windows, prepare
from aiayn.forecast.model import ForecastConfig
from aiayn.forecast.train import RENAMED, ForecastTrainConfig


@dataclass
class ForecastRun(Checked):
    """A forecasting config file; ``model`` and ``train`` are checked once the data gives the shapes."""

    data: SeriesConfig = field(default_factory=SeriesConfig)
    model: dict[str, Any] = field(default_factory=dict)  #: ForecastConfig fields but the data's
    train: dict[str, Any] = field(default_factory=dict)  #: ForecastTrainConfig fields
    tune: dict[str, Any] = field(default_factory=dict)  #: TuneConfig fields (aiayn forecast tune)


def load_config(path: str | Path, **flags: Any) -> ForecastRun:
    """The YAML config with ``flags`` (``"section.key"``: value, None = not given) applied; data.path
    made absolute (relative to the config file; a --data path stays as given)."""
    raw = read_yaml(path)
    data = raw.get("data")
    if isinstance(data, dict) and isinstance(data.get("path"), str):
        raw["data"] = {**data, "path": str((Path(path).parent / data["path"]).resolve())}
    raw = upgrade(assign_flags(raw, flags), RENAMED, path)
    tune = raw.get("tune")
    if isinstance(tune, dict) and isinstance(tune.get("space"), dict):
        raw["tune"] = {**tune, "space": _upgrade_space(tune["space"], path)}
    with reported(path):
        return from_mapping(ForecastRun, raw)


def _upgrade_space(space: dict[str, Any], source: str | Path) -> dict[str, Any]:
    """A search space whose keys use former names, under the new ones (one warning each)."""
    space = dict(space)
    for rename in RENAMED:
        if rename.old not in space:
            continue
        if rename.new in space:
            old = f"tune.space.{rename.old}"
            raise UserError(f"{source}: {old} is the former name of {rename.new}: give {rename.new} only")
        values = space.pop(rename.old)
        space[rename.new] = [rename.convert(v) for v in values] if isinstance(values, list) else values
        warn_renamed(source, f"tune.space.{rename.old}", f"tune.space.{rename.new}", space[rename.new])
    return space


def model_config(config: ForecastRun, data: ForecastData, source: str | Path) -> ForecastConfig:
    """The :class:`ForecastConfig` of the config's ``model`` section, shaped by ``data``; a ``period``
    of 0 for last_period placeholders becomes a day of its steps."""
    d = config.data
    shape = {
        "n_features": len(data.columns),
        "outputs": data.outputs,
        "seq_len": d.input_len,
        "label_len": min(d.label_len, d.input_len),
        "horizon": d.horizon,
    }
    if config.model.get("placeholders") == "last_period" and not config.model.get("period"):
        shape["period"] = data.series.steps_per_day
    with reported(source):
        return from_mapping(ForecastConfig, {**config.model, **shape}, "model.")


@dataclass
class Training:
    """What one training needs, built from a config: the data, the model and train configs, the windows."""

    data: ForecastData
    model: ForecastConfig
    train: ForecastTrainConfig
    run_config: dict[str, Any]  # stored in every checkpoint
    windows: dict[str, Windows]  # "train", "val"


def build_training(config: ForecastRun, source: str | Path, data: ForecastData | None = None) -> Training:
    """The data (read unless given), configs and windows of ``config``; bad values name ``source``."""
    with reported(source):
        train_cfg = from_mapping(ForecastTrainConfig, config.train, "train.")
    d = config.data
    if d.path is None:
        raise SettingError("no data file: set ", Setting("data.path"))
    data = data or prepare(d.path, d.features, d.target, d.input_len, d.horizon)
    model_cfg = model_config(config, data, source)
    run_config = {
        "model": model_cfg.to_dict(),
        "data": {**dataclasses.asdict(d), "columns": data.columns},
        "scaler": data.scaler.to_dict(),
        "train": dataclasses.asdict(train_cfg),
    }
    windows = {s: data.windows(s, d.input_len, d.horizon) for s in ("train", "val")}
    return Training(data, model_cfg, train_cfg, run_config, windows)
