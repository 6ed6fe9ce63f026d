"""Tune the ETTh1 forecaster on the validation split only (the test split is never read).

Each run trains the settings of ``benchmarks/forecast_ett.py`` with some fields overridden and
appends one JSON line (settings, best validation MSE/MAE, epochs, seconds) to
``benchmarks/results/ett_tuning.jsonl``. The settings chosen from that log go into
``forecast_ett.py``, which alone reports test figures.

    .venv/bin/python benchmarks/forecast_tune.py --horizon 96 --set dropout=0.3 --set lr=5e-4
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aiayn.forecast.data import prepare  # noqa: E402
from aiayn.forecast.model import ForecastConfig, Forecaster  # noqa: E402
from aiayn.forecast.train import TrainConfig, fit  # noqa: E402
from common import command, versions  # noqa: E402
from forecast_ett import DATA, INPUT_LEN, MODEL, ROOT, TRAIN  # noqa: E402


def parse_value(text: str):
    """``KEY=VALUE`` values: JSON where it parses (numbers, true/false), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizon", type=int, required=True)
    parser.add_argument("--input-len", type=int, default=INPUT_LEN)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a model field (ForecastConfig) or a train field (TrainConfig)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ett_tuning.jsonl"))
    return parser.parse_args()


def split_overrides(pairs: list[str]) -> tuple[dict, dict]:
    """``KEY=VALUE`` pairs -> (model overrides, train overrides), by which config has the field."""
    model_fields = set(ForecastConfig.__dataclass_fields__)
    train_fields = set(TrainConfig.__dataclass_fields__)
    model, train = {}, {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in model_fields | train_fields:
            raise SystemExit(
                f"--set {pair!r}: expected KEY=VALUE with KEY a ForecastConfig or TrainConfig field"
            )
        (model if key in model_fields else train)[key] = parse_value(value)
    return model, train


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    model_over, train_over = split_overrides(args.set)
    data = prepare(DATA, "M", "OT", args.input_len, args.horizon)
    train, val = (data.windows(s, args.input_len, args.horizon) for s in ("train", "val"))
    settings = {**MODEL, **model_over}
    torch.manual_seed(train_over.get("seed", 0))
    model = Forecaster(
        ForecastConfig(
            n_features=len(data.columns),
            outputs=data.outputs,
            seq_len=args.input_len,
            horizon=args.horizon,
            **settings,
        )
    )
    train_cfg = {**TRAIN, **train_over}
    t0 = time.perf_counter()
    state = fit(model, train, val, data.outputs, TrainConfig(**train_cfg), progress=False)
    best = min(state.history, key=lambda h: h["val_mse"])
    record = {
        "command": command(),
        "versions": versions(),
        "horizon": args.horizon,
        "input_len": args.input_len,
        "overrides": {**model_over, **train_over},
        "model": settings,
        "train": train_cfg,
        "best_val_mse": best["val_mse"],
        "best_val_mae": best["val_mae"],
        "best_epoch": best["epoch"],
        "epochs": state.epoch,
        "seconds": round(time.perf_counter() - t0, 1),
        "threads": args.threads,
        "history": state.history,
    }
    with open(args.out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(
        f"H={args.horizon} L={args.input_len} {record['overrides']}: best val MSE {best['val_mse']:.4f} "
        f"(epoch {best['epoch']}/{state.epoch}, {record['seconds']:.0f}s)"
    )


if __name__ == "__main__":
    main()
