"""``aiayn forecast train | evaluate | predict | plot``.

A YAML config has three sections: ``data`` (:class:`~aiayn.forecast.data.DataConfig`: path relative to
the config file, target, features, input_len, label_len, horizon), ``model`` (:class:`ForecastConfig`
fields) and ``train`` (:class:`~aiayn.forecast.train.TrainConfig` fields), all read by the one strict
loader of :mod:`aiayn.config`. Command-line flags override it. The evaluate/predict/plot commands never
import the training package.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aiayn.checkpoint import load
from aiayn.config import Checked, assign, from_mapping, read_yaml, reported
from aiayn.errors import UserError
from aiayn.forecast.data import (
    FEATURE_MODES,
    SPLITS,
    DataConfig,
    Scaler,
    prepare,
    read_series,
    select_features,
)
from aiayn.forecast.metrics import evaluate
from aiayn.forecast.model import ForecastConfig, Forecaster


@dataclass
class ForecastRun(Checked):
    """A forecasting config file; ``model`` and ``train`` are checked once the data gives the shapes."""

    data: DataConfig = field(default_factory=DataConfig)
    model: dict[str, Any] = field(default_factory=dict)  #: ForecastConfig fields but the data's
    train: dict[str, Any] = field(default_factory=dict)  #: TrainConfig fields


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("forecast", help="time-series forecasting with the encoder-decoder")
    commands = parser.add_subparsers(dest="forecast_command", required=True, metavar="ACTION")
    _add_train(commands)
    ev = commands.add_parser("evaluate", help="MSE and MAE of a checkpoint on a split")
    ev.add_argument("--checkpoint", required=True)
    ev.add_argument("--split", default="test", choices=SPLITS)
    ev.add_argument("--data", help="CSV file (default: the training file)")
    ev.set_defaults(func=cmd_evaluate)
    pr = commands.add_parser("predict", help="forecast the steps after the last row into a CSV")
    pr.add_argument("--checkpoint", required=True)
    pr.add_argument("--data", help="CSV file (default: the training file)")
    pr.add_argument("--out", required=True, help="output CSV")
    pr.set_defaults(func=cmd_predict)
    pl = commands.add_parser("plot", help="history, truth and forecast of the last test window as a PNG")
    pl.add_argument("--checkpoint", required=True)
    pl.add_argument("--data", help="CSV file (default: the training file)")
    pl.add_argument("--column", help="column to draw (default: the target)")
    pl.add_argument("--out", required=True, help="output PNG")
    pl.set_defaults(func=cmd_plot)


def _add_train(commands: argparse._SubParsersAction) -> None:
    tr = commands.add_parser("train", help="train a forecaster (resumes when --out holds a checkpoint)")
    tr.add_argument("--config", required=True, help="YAML config (e.g. configs/etth1.yaml)")
    tr.add_argument("--data", help="CSV file (overrides data.path)")
    tr.add_argument("--horizon", type=int)
    tr.add_argument("--input-len", type=int)
    tr.add_argument("--target")
    tr.add_argument("--features", choices=FEATURE_MODES)
    tr.add_argument("--out", default="runs/forecast", help="run directory (checkpoints)")
    tr.add_argument("--max-epochs", type=int)
    tr.add_argument("--seed", type=int)
    tr.add_argument("--threads", type=int, help="torch CPU threads")
    tr.set_defaults(func=cmd_train)


# --- config ------------------------------------------------------------------------------------


def load_config(path: str | Path, **flags: Any) -> ForecastRun:
    """The YAML config with ``flags`` (``"section.key"``: value, None = not given) applied; data.path
    made absolute (relative to the config file; a --data path stays as given)."""
    raw = read_yaml(path)
    data = raw.get("data")
    if isinstance(data, dict) and isinstance(data.get("path"), str):
        raw["data"] = {**data, "path": str((Path(path).parent / data["path"]).resolve())}
    for key, value in flags.items():
        if value is not None:
            assign(raw, key, value)
    with reported(path):
        return from_mapping(ForecastRun, raw)


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "data.path": args.data,
        "data.horizon": args.horizon,
        "data.input_len": args.input_len,
        "data.target": args.target,
        "data.features": args.features,
        "train.max_epochs": args.max_epochs,
        "train.seed": args.seed,
    }


def model_config(config: ForecastRun, columns: list[str], outputs: list[int], source: str | Path):
    """The :class:`ForecastConfig` of the config's ``model`` section, shaped by the data."""
    d = config.data
    shape = {
        "n_features": len(columns),
        "outputs": outputs,
        "seq_len": d.input_len,
        "label_len": min(d.label_len, d.input_len),
        "horizon": d.horizon,
    }
    with reported(source):
        return from_mapping(ForecastConfig, {**config.model, **shape}, "model.")


# --- commands ----------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    from aiayn.forecast.train import TrainConfig, fit

    if args.threads:
        torch.set_num_threads(args.threads)
    config = load_config(args.config, **_flags(args))
    with reported(args.config):
        train_cfg = from_mapping(TrainConfig, config.train, "train.")
    d = config.data
    if d.path is None:
        raise UserError("no data file: set data.path in the config or pass --data")
    data = prepare(d.path, d.features, d.target, d.input_len, d.horizon)
    model_cfg = model_config(config, data.columns, data.outputs, args.config)
    torch.manual_seed(train_cfg.seed)
    model = Forecaster(model_cfg)
    run_config = {
        "model": model_cfg.to_dict(),
        "data": {**dataclasses.asdict(d), "columns": data.columns},
        "scaler": data.scaler.to_dict(),
        "train": dataclasses.asdict(train_cfg),
    }
    windows = {s: data.windows(s, d.input_len, d.horizon) for s in ("train", "val")}
    out = Path(args.out)
    print(f"train {len(windows['train'])} windows, val {len(windows['val'])}; run directory {out}")
    state = fit(model, windows["train"], windows["val"], data.outputs, train_cfg, out, run_config)
    print(
        f"done after {state.epoch} epochs; best val MSE {state.best_val:.4f}; best weights in {out / 'best'}"
    )
    return 0


def load_forecaster(path: str | Path) -> tuple[Forecaster, dict[str, Any]]:
    """A trained model (eval mode) and its stored run config, from a run or checkpoint directory."""
    loaded = load(path)
    if loaded.kind != "forecast":
        raise UserError(f"{loaded.checkpoint.path} is a {loaded.kind!r} checkpoint, not a forecaster")
    return loaded.model, loaded.checkpoint.config


def _data_for(config: dict[str, Any], data_path: str | None):
    d = config["data"]
    return prepare(
        data_path or d["path"],
        d["features"],
        d["target"],
        d["input_len"],
        d["horizon"],
        scaler=Scaler.from_dict(config["scaler"]),
        value_columns=d.get("columns"),
    )


def cmd_evaluate(args: argparse.Namespace) -> int:
    model, config = load_forecaster(args.checkpoint)
    data = _data_for(config, args.data)
    d = config["data"]
    scores = evaluate(model, data.windows(args.split, d["input_len"], d["horizon"]), data.outputs)
    print(
        f"{args.split}: MSE {scores['mse']:.4f}  MAE {scores['mae']:.4f}  "
        f"(horizon {d['horizon']}, input {d['input_len']}, standardised scale)"
    )
    return 0


@torch.no_grad()
def forecast_last(
    model: Forecaster, config: dict[str, Any], path: str
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Timestamps ``(H,)``, values ``(H, n_out)`` in original units, and column names after the file's
    last row."""
    d, scaler = config["data"], Scaler.from_dict(config["scaler"])
    series = read_series(path)
    if d.get("columns") is not None:
        series = series.select(d["columns"])
    values, columns, outputs = select_features(series, d["features"], d["target"])
    if len(values) < d["input_len"]:
        raise UserError(f"{path}: {len(values)} rows, fewer than the input length {d['input_len']}")
    x = torch.from_numpy(scaler.transform(values[-d["input_len"] :])).float()[None]  # (1, L, n)
    pred = model(x)[0].double().numpy()  # (H, n_out)
    stamps = series.timestamps[-1] + series.freq * np.arange(1, d["horizon"] + 1)
    return stamps, scaler.inverse(pred, outputs), [columns[o] for o in outputs]


def cmd_predict(args: argparse.Namespace) -> int:
    model, config = load_forecaster(args.checkpoint)
    stamps, values, names = forecast_last(model, config, args.data or config["data"]["path"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["date", *names])
        for stamp, row in zip(stamps, values):
            writer.writerow([str(stamp).replace("T", " "), *(f"{v:.6g}" for v in row)])
    print(f"wrote {len(values)} forecast rows ({stamps[0]} .. {stamps[-1]}) to {args.out}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from aiayn.forecast.plot import plot_window

    model, config = load_forecaster(args.checkpoint)
    data = _data_for(config, args.data)
    column = args.column or config["data"]["target"]
    if column not in [data.columns[o] for o in data.outputs]:
        raise UserError(f"--column: '{column}' is not a forecast column")
    plot_window(model, data, config, column, args.out)
    print(f"wrote {args.out}")
    return 0
