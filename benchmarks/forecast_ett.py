"""ETTh1 multivariate (features M, 7 variables) long-horizon benchmark.

For each horizon: repeat-last, seasonal naive (period 24), DLinear and the encoder-decoder
Transformer, all through the same data pipeline (standard splits, train-fitted scaler), trained with
early stopping on the validation split and scored once on the test split (MSE/MAE, scaled data).
Writes ``benchmarks/results/ett.json`` after every horizon and prints a table.

    .venv/bin/python benchmarks/forecast_ett.py --threads 1
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from aiayn.forecast.baselines import DLinear, RepeatLast, SeasonalNaive
from aiayn.forecast.data import prepare
from aiayn.forecast.model import ForecastConfig, Forecaster
from aiayn.forecast.train import TrainConfig, evaluate, fit
from common import machine, peak_rss_mib, versions

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "ett" / "ETTh1.csv"
ANCHORS = {  # published test MSE, ETTh1 multivariate
    "PatchTST/64": {96: 0.370, 192: 0.413, 336: 0.422, 720: 0.447},
    "DLinear": {96: 0.375, 192: 0.405, 336: 0.439, 720: 0.472},
}
INPUT_LEN = 432  # steps (18 days) for every horizon, chosen on val (README)
MODEL = dict(
    label_len=48,
    d_model=64,
    n_heads=4,
    n_encoder_layers=2,
    n_decoder_layers=1,
    d_ff=128,
    dropout=0.1,
    norm_first=True,
    instance_norm=True,
    channel_independent=True,
    patch_len=24,
    decoding="one_pass",
    placeholders="last_patch",
    attention_dropout=0.1,
)
TRAIN = dict(batch_size=128, lr=1e-3, lr_decay=0.8, max_epochs=4, patience=2, ema=0.97, loss="mae")
DLINEAR_TRAIN = dict(batch_size=32, lr=5e-3, lr_decay=0.5, max_epochs=10, patience=3)
DLINEAR_INPUT_LEN = (
    336  # DLinear's own (its paper's); the test windows' targets are the same for any input length
)
# The published figures come from code that scores the test windows in batches with drop_last=True
# (the Informer/Autoformer data loader that PatchTST and DLinear reuse): the last len % batch windows,
# the latest in time, are left out. Their test batch sizes on ETTh1 (PatchTST's etth1.sh: 128;
# DLinear's: 32) give the windows each anchor was scored on.
PUBLISHED_TEST_BATCH = {"PatchTST/64": 128, "DLinear": 32}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--horizons", type=int, nargs="+", default=[96, 192, 336, 720])
    parser.add_argument("--input-len", type=int, default=INPUT_LEN)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--max-epochs",
        type=int,
        default=TRAIN["max_epochs"],
        help="the Transformer's (DLinear keeps its own)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0],
        help="train the Transformer once per seed; the first seed's model is the table's row "
        "(and seeds DLinear), the others give the spread over seeds",
    )
    parser.add_argument("--skip-baselines", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ett.json"))
    parser.add_argument(
        "--merge", nargs="+", help="combine the JSON files of earlier (parallel) runs into --out"
    )
    return parser.parse_args()


def timed(fn):
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def run_horizon(path: str, seq_len: int, horizon: int, args: argparse.Namespace) -> dict:
    data = prepare(path, "M", "OT", seq_len, horizon)
    train, val, test = (data.windows(s, seq_len, horizon) for s in ("train", "val", "test"))
    outs = data.outputs
    rows = {}
    if not args.skip_baselines:
        for name, model in (
            ("repeat_last", RepeatLast(horizon, outs)),
            ("seasonal_naive_24", SeasonalNaive(horizon, outs, 24)),
        ):
            scores, secs = timed(lambda model=model: evaluate(model, test, outs))
            rows[name] = {**scores, "seconds": secs}
        rows["dlinear"] = train_dlinear(data, horizon, args.seeds[0])
    runs = {
        seed: train_transformer(data, train, val, test, seq_len, horizon, seed, args.max_epochs)
        for seed in args.seeds
    }
    rows["transformer"] = runs[args.seeds[0]]
    if len(runs) > 1:
        rows["transformer_seeds"] = seed_spread(runs)
    return rows


def train_dlinear(data, horizon: int, seed: int) -> dict:
    """DLinear with its own recipe (input 336, 10 epochs, patience 3), scored on the same test targets."""
    train, val, test = (data.windows(s, DLINEAR_INPUT_LEN, horizon) for s in ("train", "val", "test"))
    torch.manual_seed(seed)
    dlinear = DLinear(DLINEAR_INPUT_LEN, horizon, data.outputs)
    row = fit_and_score(
        dlinear, TrainConfig(**{**DLINEAR_TRAIN, "seed": seed}), train, val, test, data.outputs
    )
    return {**row, "input_len": DLINEAR_INPUT_LEN}


def train_transformer(data, train, val, test, seq_len: int, horizon: int, seed: int, max_epochs: int) -> dict:
    """Train the encoder-decoder with one seed (early stopping on val), score it on test."""
    torch.manual_seed(seed)
    model = Forecaster(
        ForecastConfig(
            n_features=len(data.columns), outputs=data.outputs, seq_len=seq_len, horizon=horizon, **MODEL
        )
    )
    cfg = TrainConfig(**{**TRAIN, "max_epochs": max_epochs, "seed": seed})
    return fit_and_score(model, cfg, train, val, test, data.outputs, history=True)


def fit_and_score(model, cfg: TrainConfig, train, val, test, outs: list[int], history: bool = False) -> dict:
    """Train with early stopping on val; test scores (every window and each anchor's) and training facts."""
    state, secs = timed(lambda: fit(model, train, val, outs, cfg, progress=False))
    return {
        **evaluate(model, test, outs),
        "seconds": secs,
        "epochs": state.epoch,
        "best_val_mse": state.best_val,
        **({"history": state.history} if history else {}),
        "on_published_windows": published_windows(model, test, outs),
    }


def seed_spread(runs: dict[int, dict]) -> dict:
    """Per-seed test MSE (every window and PatchTST's windows) with their mean and sample std."""

    def stats(values: list[float]) -> dict:
        return {
            "mean": float(np.mean(values)),
            "std": float(np.std(values, ddof=1)),
            "min": min(values),
            "max": max(values),
        }

    every = [r["mse"] for r in runs.values()]
    patchtst = [r["on_published_windows"]["PatchTST/64"]["mse"] for r in runs.values()]
    return {
        "seeds": list(runs),
        "mse": every,
        "mse_on_patchtst_windows": patchtst,
        "best_val_mse": [r["best_val_mse"] for r in runs.values()],
        "seconds": [r["seconds"] for r in runs.values()],
        "mse_stats": stats(every),
        "mse_on_patchtst_windows_stats": stats(patchtst),
    }


def published_windows(model, test, outs) -> dict:
    """Scores on the test windows each anchor was scored on (drop_last with its test batch size)."""
    scores = {}
    for anchor, batch in PUBLISHED_TEST_BATCH.items():
        kept = len(test) - len(test) % batch
        if kept:  # fewer windows than one batch: that code would have scored none
            scores[anchor] = {**evaluate(model, test, outs, limit=kept), "windows": kept, "of": len(test)}
    return scores


def print_table(results: dict) -> None:
    names = ["transformer", "dlinear", "seasonal_naive_24", "repeat_last"]
    print(
        f"{'H':>4} "
        + " ".join(f"{n:>22}" for n in names)
        + f" {'PatchTST':>9} {'DLinear*':>9} {'time(s)':>8}"
        + f" {'tf@PatchTST windows':>20}"
    )
    for h, rows in results["horizons"].items():
        cells = [f"{rows[n]['mse']:.3f}/{rows[n]['mae']:.3f}" if n in rows else "-" for n in names]
        published = rows["transformer"].get("on_published_windows", {}).get("PatchTST/64")
        print(
            f"{h:>4} "
            + " ".join(f"{c:>22}" for c in cells)
            + f" {ANCHORS['PatchTST/64'].get(int(h), float('nan')):>9.3f}"
            + f" {ANCHORS['DLinear'].get(int(h), float('nan')):>9.3f}"
            + f" {rows['transformer']['seconds']:>8.0f}"
            + (f" {published['mse']:>11.3f}/{published['mae']:.3f}" if published else f" {'-':>20}")
        )
    for h, rows in results["horizons"].items():
        if "transformer_seeds" in rows:
            spread = rows["transformer_seeds"]
            every, patchtst = spread["mse_stats"], spread["mse_on_patchtst_windows_stats"]
            print(
                f"{h:>4} transformer over seeds {spread['seeds']}: test MSE {every['mean']:.4f} ± "
                f"{every['std']:.4f} "
                f"(every window), {patchtst['mean']:.4f} ± {patchtst['std']:.4f} "
                f"[{patchtst['min']:.4f}, {patchtst['max']:.4f}] on PatchTST's windows"
            )
    print(
        "cells: test MSE/MAE on standardised data, every window; anchors are published MSE; time = "
        "transformer "
        "training; tf@PatchTST windows: the transformer on the windows PatchTST was scored on "
        "(drop_last, batch 128)"
    )


def merge(parts: list[str], out: str) -> None:
    """One results file from runs that each did some horizons (run in parallel)."""
    loaded = [json.loads(Path(p).read_text()) for p in parts]
    results = {
        **loaded[0],
        "command": [r["command"] for r in loaded],
        "horizons": {},
        "peak_rss_mib": max(r.get("peak_rss_mib", 0.0) for r in loaded),  # of the largest process
        "peak_rss_mib_by_command": [r.get("peak_rss_mib") for r in loaded],
    }
    for r in loaded:
        results["horizons"].update(r["horizons"])
    results["horizons"] = dict(sorted(results["horizons"].items(), key=lambda kv: int(kv[0])))
    Path(out).write_text(json.dumps(results, indent=2))
    print_table(results)


def main() -> None:
    args = parse_args()
    if args.merge:
        return merge(args.merge, args.out)
    torch.set_num_threads(args.threads)
    results = {
        "command": "cd /work/main && .venv/bin/python " + " ".join(shlex.quote(a) for a in sys.argv),
        "dataset": "ETTh1",
        "features": "M (7 variables, all forecast)",
        "input_len": args.input_len,
        "splits": "rows [0,8640) train, [8640,11520) val, [11520,14400) test; val/test start input_len "
        "earlier",
        "metric": "MSE/MAE on train-standardised data, every test window (stride 1); on_published_windows: "
        "the same on the first len - len % batch windows, the ones each anchor's code scored "
        f"(drop_last=True, test batch {PUBLISHED_TEST_BATCH})",
        "model": {
            **MODEL,
            "note": "paper encoder-decoder (aiayn.model Encoder/Decoder); channel independent, "
            "pre-norm, patch tokens of 24 steps (one day) embedded linearly, RevIN-style instance "
            "norm, one-pass decoding "
            "from the last known day repeated as placeholders",
        },
        "train": {**TRAIN, "max_epochs": args.max_epochs, "seed": args.seeds[0]},
        "seeds": args.seeds,
        "dlinear_train": {**DLINEAR_TRAIN, "seed": args.seeds[0], "input_len": DLINEAR_INPUT_LEN},
        "anchors_mse": ANCHORS,
        "versions": versions(numpy=np.__version__),
        "machine": machine(),
        "horizons": {},
    }
    for horizon in args.horizons:
        t0 = time.perf_counter()
        results["horizons"][str(horizon)] = run_horizon(args.data, args.input_len, horizon, args)
        results["horizons"][str(horizon)]["wall_seconds"] = time.perf_counter() - t0
        results["peak_rss_mib"] = peak_rss_mib()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
        print_table(results)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
