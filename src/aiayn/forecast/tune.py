"""``aiayn forecast tune``: a seeded search over a config's ``tune.space`` on one file's validation split.

The space maps dotted settings (``data.input_len``, ``model.dropout``, ``train.lr`` ...) to lists of
values; its points are the grid they span, less those the model refuses (an input length that is not
a multiple of the patch length). Trial 0 is the config as written; the others are distinct points
drawn in an order seeded by ``tune.seed``, until ``tune.trials`` trials have run or ``tune.minutes``
have passed. A trial trains once per seed of ``tune.seeds`` on the training split with early stopping
on the validation split, and scores the mean of their best validation MSEs: the test split is never
read. Each trial appends one line to ``OUT/trials.jsonl``; ``OUT/best.yaml`` is the config with the
best trial's settings, for ``aiayn forecast train --config OUT/best.yaml``. Run again with the same
``OUT``, the search goes on: trials already in ``trials.jsonl`` are not trained again.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from aiayn.config import Checked, ConfigError, from_mapping, reported, setting
from aiayn.errors import Setting, SettingError, UserError
from aiayn.forecast.data import SeriesConfig, prepare
from aiayn.forecast.model import ForecastConfig
from aiayn.forecast.run import ForecastRun, build_training
from aiayn.forecast.train import FitState, ForecastTask, ForecastTrainConfig
from aiayn.train.engine import train

#: Settings a search may vary, by section; the file, its columns and the horizon are the task, not settings.
TUNABLE = {
    "data": {"input_len", "label_len"},
    "model": set(ForecastConfig.__dataclass_fields__)
    - {"n_features", "outputs", "seq_len", "label_len", "horizon"},
    "train": set(ForecastTrainConfig.__dataclass_fields__) - {"device", "log_every", "seed"},
}
assert TUNABLE["data"] <= set(SeriesConfig.__dataclass_fields__)


@dataclass
class TuneConfig(Checked):
    """The ``tune`` section: the space and the budget."""

    space: dict[str, Any] = setting(factory=dict)  #: "section.key": [values]
    trials: int = setting(8, ge=1)  #: at most this many trials (trial 0 is the config as written)
    minutes: float = setting(0.0, ge=0)  #: start no trial after this many minutes (0: no time budget)
    seed: int = setting(0, ge=0)  #: the order the points are drawn in
    seeds: list[int] = setting(factory=lambda: [0])  #: train.seed of each training of a trial

    def check(self) -> None:
        for key, values in self.space.items():
            section, _, name = str(key).partition(".")
            if name not in TUNABLE.get(section, ()):
                tunable = ", ".join(f"{s}.{k}" for s in TUNABLE for k in sorted(TUNABLE[s]))
                raise ConfigError(f"space.{key}", f"is not a setting a search may vary; valid: {tunable}")
            if not isinstance(values, list) or not values:
                raise ConfigError(f"space.{key}", f"must be a non-empty list of values; got {values!r}")
        if not self.seeds:
            raise ConfigError("seeds", "must list at least one seed")


def with_settings(config: ForecastRun, settings: dict[str, Any]) -> ForecastRun:
    """``config`` with dotted ``settings`` applied (a new object; ``config`` is unchanged)."""
    new = copy.deepcopy(config)
    for key, value in settings.items():
        section, _, name = key.partition(".")
        if section == "data":
            setattr(new.data, name, value)
        else:
            getattr(new, section)[name] = value
    return new


def points(
    config: ForecastRun, tune: TuneConfig, check: Callable[[ForecastRun], None]
) -> tuple[list[dict], int]:
    """Trial 0's settings (``{}``), then the valid grid points in the seeded order; and how many were
    refused."""
    keys = list(tune.space)
    grid = [dict(zip(keys, values)) for values in itertools.product(*(tune.space[k] for k in keys))]
    valid, refused = [], 0
    for point in grid:
        try:
            check(with_settings(config, point))
        except (ConfigError, UserError):
            refused += 1
            continue
        if point != current(config, keys):
            valid.append(point)
    random.Random(tune.seed).shuffle(valid)
    return [{}, *valid], refused


def current(config: ForecastRun, keys: list[str]) -> dict[str, Any]:
    """The config's own values of ``keys`` (absent model/train keys: their defaults)."""
    defaults = {"model": ForecastConfig, "train": ForecastTrainConfig}
    values = {}
    for key in keys:
        section, _, name = key.partition(".")
        if section == "data":
            values[key] = getattr(config.data, name)
        else:
            field = defaults[section].__dataclass_fields__[name]
            default = field.default_factory() if callable(field.default_factory) else field.default
            values[key] = getattr(config, section).get(name, default)
    return values


class Tuner:
    """Runs the trials of one search into ``out`` (see the module docstring)."""

    def __init__(
        self,
        config: ForecastRun,
        source: str | Path,
        out: str | Path,
        device: str | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        with reported(source):
            self.tune = from_mapping(TuneConfig, config.tune, "tune.")
        self.config, self.source, self.out, self.log = config, source, Path(out), log
        self.device = device
        self._data: dict[int, Any] = {}  # ForecastData by input length
        self.fingerprint = self._fingerprint()

    def _fingerprint(self) -> str:
        """What makes two searches the same: the config as written, its file's bytes, the seeds."""
        d = self.config.data
        stamp = (
            hashlib.sha256(Path(d.path).read_bytes()).hexdigest() if d.path and Path(d.path).is_file() else ""
        )
        base = {
            "data": {k: v for k, v in vars(d).items() if k != "path"},
            "file": stamp,
            "model": self.config.model,
            "train": {k: v for k, v in self.config.train.items() if k not in ("device", "log_every")},
            "seeds": self.tune.seeds,
        }
        return hashlib.sha256(json.dumps(base, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def data(self, config: ForecastRun):
        d = config.data
        if d.input_len not in self._data:
            self._data[d.input_len] = prepare(d.path, d.features, d.target, d.input_len, d.horizon)
        return self._data[d.input_len]

    def check(self, config: ForecastRun) -> None:
        """Refuse a point the model or the data cannot take (a ConfigError or UserError)."""
        build_training(config, self.source, self.data(config))

    # --- the search -------------------------------------------------------------------------------
    def run(self, trials: int | None = None, minutes: float | None = None) -> dict[str, Any]:
        """Run the search; returns the best record (also written to ``best.yaml``)."""
        trials = trials or self.tune.trials
        minutes = self.tune.minutes if minutes is None else minutes
        self.check(self.config)  # the config as written must run: its errors are the user's to see
        todo, refused = points(self.config, self.tune, self.check)
        done = self._done()
        self.log(
            f"{len(todo)} points to try ({refused} refused by the model), up to {trials} trials"
            + (f" or {minutes:g} minutes" if minutes else "")
            + (f"; {len(done)} already in {self.out / 'trials.jsonl'}" if done else "")
        )
        start, ran = time.perf_counter(), 0
        for index, settings in enumerate(todo[:trials]):
            key = json.dumps(settings, sort_keys=True)
            if key in done:
                continue
            if minutes and ran and time.perf_counter() - start > 60 * minutes:
                self.log(f"time budget of {minutes:g} minutes spent after {ran} trials")
                break
            ran += 1
            record = self.trial(index, settings)
            done[key] = record
            with open(self.out / "trials.jsonl", "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
        best = min(done.values(), key=lambda r: (r["val_mse"], r["trial"]))
        self._write_best(best)
        return best

    def trial(self, index: int, settings: dict[str, Any]) -> dict[str, Any]:
        """Train once per seed with ``settings``; the record of their validation scores."""
        config = with_settings(self.config, settings)
        t0 = time.perf_counter()
        runs = [self._train(config, seed) for seed in self.tune.seeds]
        record = {
            "trial": index,
            "settings": settings,
            "val_mse": sum(r.best_val for r in runs) / len(runs),
            "val_mse_by_seed": [r.best_val for r in runs],
            "epochs": [r.epoch for r in runs],
            "seconds": time.perf_counter() - t0,
            "fingerprint": self.fingerprint,
        }
        described = ", ".join(f"{k}={v}" for k, v in settings.items()) or "the config as written"
        self.log(f"trial {index}: val MSE {record['val_mse']:.4f}  ({described}; {record['seconds']:.0f} s)")
        return record

    def _train(self, config: ForecastRun, seed: int) -> FitState:
        settings = {**config.train, "seed": seed, "log_every": 0}
        if self.device:
            settings["device"] = self.device
        config = with_settings(config, {})
        config.train = settings
        task = ForecastTask.from_config(build_training(config, self.source, self.data(config)))
        train(task, None, log=_quiet, progress=False)
        state = task.result()
        if not math.isfinite(state.best_val):
            raise UserError(f"a trial's validation MSE is {state.best_val}: check the data and lr")
        return state

    def _done(self) -> dict[str, dict[str, Any]]:
        """The trials already in ``trials.jsonl`` (refusing those of another search)."""
        self.out.mkdir(parents=True, exist_ok=True)
        path, done = self.out / "trials.jsonl", {}
        if not path.exists():
            return done
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number == len(path.read_text(encoding="utf-8").splitlines()):
                    continue  # a line cut short by a kill: that trial runs again
                raise UserError(f"{path}:{number}: not a JSON line") from None
            if record.get("fingerprint") != self.fingerprint:
                raise SettingError(
                    f"{path} holds trials of another search (other data, settings or seeds); give another ",
                    Setting("tune_dir"),
                )
            done[json.dumps(record["settings"], sort_keys=True)] = record
        return done

    def _write_best(self, best: dict[str, Any]) -> None:
        config = with_settings(self.config, best["settings"])
        data = {**vars(config.data), "path": str(Path(config.data.path).resolve())}
        body = {"data": data, "model": config.model, "train": config.train}
        header = (
            f"# chosen by aiayn forecast tune: trial {best['trial']} of {self.out / 'trials.jsonl'}, "
            f"val MSE {best['val_mse']:.4f} (mean of seeds {self.tune.seeds})\n"
            f"# aiayn forecast train --config {self.out / 'best.yaml'} --out RUN\n"
        )
        text = header + yaml.safe_dump(body, sort_keys=False)
        tmp = self.out / "best.yaml.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(self.out / "best.yaml")


def _quiet(_: str) -> None:
    """A trial's per-epoch lines are not printed (its record is)."""
