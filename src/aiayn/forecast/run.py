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
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from aiayn.config import (
    Checked,
    Renamed,
    apply_overrides,
    assign_flags,
    from_mapping,
    read_yaml,
    reported,
    upgrade,
)
from aiayn.errors import Setting, SettingError
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


def load_config(path: str | Path, overrides: Sequence[str] = (), **flags: Any) -> ForecastRun:
    """The YAML config with ``overrides`` (``--set section.key=value``) and then ``flags``
    (``"section.key"``: value, None = not given) applied; data.path made absolute (relative to the
    config file; a path given by --data or --set stays as given)."""
    raw = read_yaml(path)
    data = raw.get("data")
    if isinstance(data, dict) and isinstance(data.get("path"), str):
        raw["data"] = {**data, "path": str((Path(path).parent / data["path"]).resolve())}
    raw = upgrade(assign_flags(apply_overrides(raw, overrides), flags), RENAMED, path)
    tune = raw.get("tune")
    if isinstance(tune, dict) and isinstance(tune.get("space"), dict):
        raw["tune"] = {**tune, "space": _upgrade_space(tune["space"], path)}
    with reported(path):
        return from_mapping(ForecastRun, raw)


def _upgrade_space(space: dict[str, Any], source: str | Path) -> dict[str, Any]:
    """A search space whose keys use former names, under the new ones (:func:`upgrade` on the
    ``tune`` section, each value of a key's list converted)."""
    renamed = [
        Renamed(f"tune.space.{r.old}", f"tune.space.{r.new}", functools.partial(_each, r.convert))
        for r in RENAMED
    ]
    tune = upgrade({"tune": {f"space.{key}": values for key, values in space.items()}}, renamed, source)
    return {key.removeprefix("space."): values for key, values in tune["tune"].items()}


def _each(convert: Callable[[Any], Any], values: Any) -> Any:
    return [convert(value) for value in values] if isinstance(values, list) else values


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
