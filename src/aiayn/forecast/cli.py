"""``aiayn forecast train | tune | evaluate | predict | plot``.

The config and what a training builds from it are in :mod:`aiayn.forecast.run`; command-line flags
override the config. The evaluate/predict/plot commands never import the training package: train and
tune load it (:mod:`aiayn.forecast.run`, :mod:`aiayn.forecast.tune`) when they run.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aiayn.config import add_training_flags, training_flags
from aiayn.device import apply_device_flags
from aiayn.errors import UserError, naming_flags
from aiayn.forecast.data import FEATURE_MODES, SPLITS, Scaler, prepare, read_series, select_features
from aiayn.forecast.metrics import evaluate
from aiayn.forecast.model import Forecaster
from aiayn.loading import load

#: How a library error names the settings the training commands set by flags.
FLAGS = {
    "run_dir": "--out",
    "tune_dir": "--out",
    "data.path": "data.path in the config or pass --data",
    "train.max_steps": "train.max_steps (--max-steps)",
    "train.max_epochs": "train.max_epochs (--max-epochs)",
    "train.max_hours": "train.max_hours (--max-hours)",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("forecast", help="time-series forecasting with the encoder-decoder")
    commands = parser.add_subparsers(dest="forecast_command", required=True, metavar="ACTION")
    _add_train(commands)
    _add_tune(commands)
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
    pl = commands.add_parser("plot", help="input, truth and forecast of a test window as a PNG")
    pl.add_argument("--checkpoint", required=True)
    pl.add_argument("--data", help="CSV file (default: the training file)")
    pl.add_argument("--column", nargs="+", help="columns to draw, a panel each (default: the target)")
    pl.add_argument("--window", type=int, default=-1, help="test window (default -1: the last)")
    pl.add_argument("--out", required=True, help="output PNG")
    pl.set_defaults(func=cmd_plot)


def _add_train(commands: argparse._SubParsersAction) -> None:
    tr = commands.add_parser("train", help="train a forecaster (resumes when --out holds a checkpoint)")
    tr.add_argument(
        "--config", required=True, help="YAML config (e.g. configs/ett.yaml, or a tune run's best.yaml)"
    )
    tr.add_argument("--data", help="CSV file (overrides data.path)")
    tr.add_argument("--horizon", type=int)
    tr.add_argument("--input-len", type=int)
    tr.add_argument("--target")
    tr.add_argument("--features", choices=FEATURE_MODES)
    tr.add_argument("--out", default="runs/forecast", help="run directory (checkpoints)")
    add_training_flags(tr)  # --set, --device, --threads, --max-steps/-epochs/-hours: as every trainer
    tr.add_argument("--seed", type=int)
    tr.set_defaults(func=cmd_train)


def _add_tune(commands: argparse._SubParsersAction) -> None:
    tu = commands.add_parser(
        "tune",
        help="choose settings on the validation split (the config's tune section); writes OUT/best.yaml",
    )
    tu.add_argument("--config", required=True, help="YAML config with a tune section (configs/ett.yaml)")
    tu.add_argument("--data", help="CSV file (overrides data.path)")
    tu.add_argument("--horizon", type=int)
    tu.add_argument("--target")
    tu.add_argument("--features", choices=FEATURE_MODES)
    tu.add_argument("--out", required=True, help="directory for trials.jsonl and best.yaml (a rerun goes on)")
    tu.add_argument("--trials", type=int, help="at most this many trials (overrides tune.trials)")
    tu.add_argument("--minutes", type=float, help="start no trial after this many minutes (tune.minutes)")
    add_training_flags(tu)  # the same flags as train's; the budgets bound each trial's trainings
    tu.set_defaults(func=cmd_tune)


# --- config ------------------------------------------------------------------------------------


def _flags(args: argparse.Namespace, tuning: bool = False) -> dict[str, Any]:
    """The config overrides of ``train`` (or, ``tuning``, of ``tune``'s fewer flags; its --device
    goes to the tuner, outside what makes two searches the same)."""
    flags = {
        "data.path": args.data,
        "data.horizon": args.horizon,
        "data.target": args.target,
        "data.features": args.features,
        **training_flags(args),
    }
    if tuning:
        return {**flags, "train.device": None}
    return {**flags, "data.input_len": args.input_len, "train.seed": args.seed}


# --- commands ----------------------------------------------------------------------------------


@naming_flags(FLAGS)
def cmd_train(args: argparse.Namespace) -> int:
    # lazily: the training package is loaded only by the training commands
    from aiayn.forecast.run import build_training, load_config
    from aiayn.forecast.train import ForecastTask
    from aiayn.train.engine import train

    apply_device_flags(args)
    config = load_config(args.config, args.set, **_flags(args))
    run = build_training(config, args.config)
    out, windows = Path(args.out), run.windows
    print(f"train {len(windows['train'])} windows, val {len(windows['val'])}; run directory {out}")
    task = ForecastTask.from_config(run)
    train(task, out)
    state = task.result()
    print(
        f"done after {state.epoch} epochs; best val MSE {state.best_val:.4f}; best weights in {out / 'best'}"
    )
    return 0


@naming_flags(FLAGS)
def cmd_tune(args: argparse.Namespace) -> int:
    # lazily, as cmd_train
    from aiayn.forecast.run import load_config
    from aiayn.forecast.tune import Tuner

    apply_device_flags(args)
    if args.trials is not None and args.trials < 1:
        raise UserError(f"--trials must be >= 1; got {args.trials}")
    if args.minutes is not None and args.minutes < 0:
        raise UserError(f"--minutes must be >= 0; got {args.minutes}")
    config = load_config(args.config, args.set, **_flags(args, tuning=True))
    best = Tuner(config, args.config, args.out, device=args.device).run(args.trials, args.minutes)
    chosen = ", ".join(f"{k}={v}" for k, v in best["settings"].items()) or "the config as written"
    print(f"best: trial {best['trial']}, val MSE {best['val_mse']:.4f} ({chosen})")
    print(f"wrote {Path(args.out) / 'best.yaml'}")
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
    windows = data.windows(args.split, d["input_len"], d["horizon"])
    scores = evaluate(model, windows, data.outputs)
    print(
        f"{args.split}: MSE {scores['mse']:.4f}  MAE {scores['mae']:.4f}  over every window of the split "
        f"({len(windows)} windows, none dropped; horizon {d['horizon']}, input {d['input_len']}, "
        "standardised scale)"
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
    from aiayn.forecast.plot import plot_window  # lazily: matplotlib is slow to import

    model, config = load_forecaster(args.checkpoint)
    data = _data_for(config, args.data)
    columns = args.column or [config["data"]["target"]]
    forecast = [data.columns[o] for o in data.outputs]
    for column in columns:
        if column not in forecast:
            raise UserError(f"--column: '{column}' is not a forecast column; they are {', '.join(forecast)}")
    d = config["data"]
    count = len(data.windows("test", d["input_len"], d["horizon"]))
    if not -count <= args.window < count:
        raise UserError(
            f"--window {args.window}: the test split has {count} windows (0 to {count - 1}; -1: the last)"
        )
    plot_window(model, data, config, columns, out=args.out, window=args.window)
    print(f"wrote {args.out}")
    return 0
