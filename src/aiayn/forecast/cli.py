"""``aiayn forecast train | evaluate | predict | plot``.

A YAML config has three sections: ``data`` (path relative to the config file, target, features,
input_len, label_len, horizon), ``model`` (:class:`ForecastConfig` fields) and ``train``
(:class:`TrainConfig` fields). Command-line flags override it.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from aiayn.checkpoint import load, load_checkpoint
from aiayn.errors import UserError
from aiayn.forecast.data import FEATURE_MODES, SPLITS, Scaler, prepare, read_series, select_features
from aiayn.forecast.model import ForecastConfig, Forecaster
from aiayn.forecast.train import LAST_DIR, TrainConfig, evaluate, fit
from aiayn.train.config import load_yaml

DATA_DEFAULTS = {
    "path": None,
    "target": "OT",
    "features": "M",
    "input_len": 96,
    "label_len": 48,
    "horizon": 96,
}
KIND_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
DATA_TYPES = {"path": str, "target": str, "features": str, "input_len": int, "label_len": int, "horizon": int}


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


def load_config(path: str | Path) -> dict[str, Any]:
    """The YAML config as ``{"data", "model", "train"}`` dicts; data.path made absolute."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config not found: {path}")
    try:
        raw = load_yaml(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None
    raw = _mapping(raw, "config", path)
    unknown = sorted(map(str, set(raw) - {"data", "model", "train"}))
    if unknown:
        raise UserError(f"{path}: unknown section(s) {', '.join(unknown)}; valid: data, model, train")
    sections = {name: _mapping(raw.get(name) or {}, name, path) for name in ("data", "model", "train")}
    data = {**DATA_DEFAULTS, **_check_data(sections["data"], path)}
    if data["path"] is not None:
        data["path"] = str((path.parent / data["path"]).resolve())
    return {"data": data, "model": sections["model"], "train": sections["train"]}


def _mapping(value: Any, name: str, source: Path) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UserError(f"{source}: {name}: must be a mapping of field: value, got {type(value).__name__}")
    return dict(value)


def _check_data(data: dict[str, Any], source: Path) -> dict[str, Any]:
    """The ``data`` section, refusing unknown fields and wrong types (one line naming the field)."""
    unknown = sorted(map(str, set(data) - set(DATA_TYPES)))
    if unknown:
        raise UserError(
            f"{source}: data: unknown field(s) {', '.join(unknown)}; valid: {', '.join(DATA_TYPES)}"
        )
    set_fields = {k: v for k, v in data.items() if not (k == "path" and v is None)}  # path: null = unset
    try:
        return _typed(DATA_TYPES, set_fields)
    except ValueError as err:
        raise UserError(f"{source}: data: {err}") from None


def _typed(types: dict[str, type], values: dict[str, Any]) -> dict[str, Any]:
    """``values``, checked against ``types`` (ValueError naming the field); names not in ``types`` pass."""
    for name, value in values.items():
        kind = types.get(name)
        if kind is not None and not _is(value, kind):
            raise ValueError(f"{name}: must be {KIND_WORDS[kind]}, got {value!r}")
    return values


def _is(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def _field_types(cls: type) -> dict[str, type]:
    """The scalar fields of a dataclass and their types (annotations are strings here)."""
    scalars = {"int": int, "float": float, "str": str, "bool": bool}
    names = {f.name: getattr(f.type, "__name__", f.type) for f in dataclasses.fields(cls)}
    return {name: scalars[kind] for name, kind in names.items() if kind in scalars}


def _apply_flags(config: dict[str, Any], args: argparse.Namespace) -> None:
    flags = {
        "path": args.data,
        "horizon": args.horizon,
        "input_len": args.input_len,
        "target": args.target,
        "features": args.features,
    }
    config["data"].update({k: v for k, v in flags.items() if v is not None})
    if args.max_epochs is not None:
        config["train"]["max_epochs"] = args.max_epochs
    if args.seed is not None:
        config["train"]["seed"] = args.seed
    if config["data"]["path"] is None:
        raise UserError("no data file: set data.path in the config or pass --data")


def _build(kind: str, cls: type, values: dict[str, Any], source: str):
    try:
        return cls.from_dict(_typed(_field_types(cls), values))
    except (ValueError, TypeError) as err:
        raise UserError(f"{source}: {kind}: {err}") from None


# --- commands ----------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    config = load_config(args.config)
    _apply_flags(config, args)
    d = config["data"]
    data = prepare(d["path"], d["features"], d["target"], d["input_len"], d["horizon"])
    model_cfg = _build(
        "model",
        ForecastConfig,
        {
            **config["model"],
            "n_features": len(data.columns),
            "outputs": data.outputs,
            "seq_len": d["input_len"],
            "label_len": min(d["label_len"], d["input_len"]),
            "horizon": d["horizon"],
        },
        args.config,
    )
    train_cfg = _build("train", TrainConfig, config["train"], args.config)
    out = Path(args.out)
    if (out / LAST_DIR).is_dir():
        _check_same_run(out, model_cfg)
    torch.manual_seed(train_cfg.seed)
    model = Forecaster(model_cfg)
    run_config = {
        "model": model_cfg.to_dict(),
        "data": {**d, "columns": data.columns},
        "scaler": data.scaler.to_dict(),
        "train": train_cfg.__dict__,
    }
    windows = {s: data.windows(s, d["input_len"], d["horizon"]) for s in ("train", "val")}
    print(f"train {len(windows['train'])} windows, val {len(windows['val'])}; run directory {out}")
    state = fit(model, windows["train"], windows["val"], data.outputs, train_cfg, out, run_config)
    print(
        f"done after {state.epoch} epochs; best val MSE {state.best_val:.4f}; best weights in {out / 'best'}"
    )
    return 0


def _check_same_run(out: Path, model_cfg: ForecastConfig) -> None:
    stored = load_checkpoint(out / LAST_DIR, with_state=False).config.get("model")
    if stored != model_cfg.to_dict():
        raise UserError(f"{out / LAST_DIR} holds a different model config; use another --out to start afresh")


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
