"""Long-horizon forecasting on every CSV of a folder: the user's recipe, scored on the full test set.

For each file and horizon it runs exactly what a user runs on their own data: ``aiayn forecast tune``
with ``configs/ett.yaml`` (its ``tune`` section: a seeded search on that file's validation split),
then ``aiayn forecast train`` of the chosen settings once per seed. Each model is scored on the **full
test set** (every window, none dropped) and, labelled as such, on the windows PatchTST's code scores
(``drop_last`` with its test batch). DLinear (its own recipe, input 336), seasonal naive (one day)
and repeat-last run in the same benchmark on the same test targets. MSE and MAE on the train-
standardised scale, mean and sample std over seeds. Writes the results file after every horizon.

    python benchmarks/forecast_ett.py --seeds 0 1 2 --out benchmarks/results/forecast_ett.json
    python benchmarks/forecast_ett.py --merge a.json b.json --out benchmarks/results/forecast_ett.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from aiayn.forecast.baselines import DLinear, RepeatLast, SeasonalNaive
from aiayn.forecast.data import prepare
from aiayn.forecast.metrics import evaluate
from aiayn.forecast.run import build_training, load_config
from aiayn.forecast.train import ForecastTask, ForecastTrainConfig
from aiayn.forecast.tune import Tuner, with_settings
from aiayn.train.engine import train
from common import command, machine, peak_rss_mib, versions

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT.parent / "shared" / "data" / "ett"
CONFIG = ROOT / "configs" / "ett.yaml"
HORIZONS = (96, 192, 336, 720)
# Published test MSE (multivariate), scored by their code on the drop_last windows. PatchTST/64 and
# /42: Nie et al. 2023, Table 3; SparseTSF: Lin et al. 2024, Table 2. The targets are the
# best of these per horizon for ETTh1 and ETTm1; for any other file, PatchTST/64 + 2%.
ANCHORS = {
    "ETTh1": {
        "PatchTST/64": {96: 0.370, 192: 0.413, 336: 0.422, 720: 0.447},
        "SparseTSF": {96: 0.362, 192: 0.403, 336: 0.434, 720: 0.426},
    },
    "ETTm1": {
        "PatchTST/64": {96: 0.293, 192: 0.333, 336: 0.369, 720: 0.416},
        "PatchTST/42": {96: 0.290, 192: 0.332, 336: 0.366, 720: 0.420},
    },
    "ETTh2": {"PatchTST/64": {96: 0.274, 192: 0.341, 336: 0.329, 720: 0.379}},
    "ETTm2": {"PatchTST/64": {96: 0.166, 192: 0.223, 336: 0.274, 720: 0.362}},
    "weather": {"PatchTST/64": {96: 0.149, 192: 0.194, 336: 0.245, 720: 0.314}},
    "electricity": {"PatchTST/64": {96: 0.129, 192: 0.147, 336: 0.163, 720: 0.197}},
    "traffic": {"PatchTST/64": {96: 0.360, 192: 0.379, 336: 0.392, 720: 0.432}},
}
# PatchTST's test loader drops the last partial batch; its scripts' batch sizes per dataset.
PATCHTST_TEST_BATCH = {"electricity": 32, "traffic": 24}
MODELS = ("transformer", "dlinear", "naive")
PART_KEYS = ("command", "device", "gpu", "threads", "machine", "versions")
DLINEAR_INPUT_LEN = 336
DLINEAR_TRAIN = dict(batch_size=32, lr=5e-3, lr_decay=0.5, max_epochs=10, patience=3, precision="fp32")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-dir", default=str(DATA_DIR), help="folder of CSV files, each run (ETT*.csv ...)"
    )
    parser.add_argument("--datasets", nargs="+", help="only these file stems (default: every ETT*.csv)")
    parser.add_argument("--horizons", type=int, nargs="+", default=list(HORIZONS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", default=str(CONFIG), help="the recipe, with its tune section")
    parser.add_argument("--work", default="/tmp/forecast_ett", help="tune directories (a rerun goes on)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--models",
        nargs="+",
        choices=MODELS,
        default=list(MODELS),
        help="what to run (runs of different models --merge into one file)",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "forecast_ett.json"))
    parser.add_argument("--merge", nargs="+", help="combine the results files of earlier (parallel) runs")
    return parser.parse_args()


def files(args: argparse.Namespace) -> list[Path]:
    found = sorted(Path(args.data_dir).glob("*.csv"))
    if args.datasets:
        found = [Path(args.data_dir) / f"{name}.csv" for name in args.datasets]
    if not found:
        raise SystemExit(f"no .csv file in {args.data_dir}")
    return found


def stats(values: list[float]) -> dict:
    return {
        "mean": float(np.mean(values)),
        "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
        "values": values,
    }


def patchtst_windows(path: Path, count: int) -> int:
    """How many of ``count`` test windows PatchTST's code scores (it drops the last partial batch)."""
    batch = PATCHTST_TEST_BATCH.get(path.stem, 128)
    return count - count % batch


def scores(model, test, outputs, kept: int) -> dict:
    """MSE/MAE over the full test set, and over PatchTST's windows (labelled)."""
    full = evaluate(model, test, outputs)
    dropped = evaluate(model, test, outputs, limit=kept) if kept else None
    return {
        **full,
        "windows": len(test),
        "on_patchtst_windows": {**dropped, "windows": kept} if dropped else None,
    }


def run_horizon(path: Path, horizon: int, args: argparse.Namespace) -> dict:
    """Tune and train each seed; the baselines on the same test targets."""
    config = load_config(args.config, **{"data.path": str(path), "data.horizon": horizon})
    row = {}
    if "transformer" in args.models:
        t0 = time.perf_counter()
        tuner = Tuner(config, args.config, Path(args.work) / f"{path.stem}-{horizon}", device=args.device)
        best = tuner.run()
        row["tune"] = {
            "chosen": best["settings"],
            "val_mse": best["val_mse"],
            "trials": len((tuner.out / "trials.jsonl").read_text().splitlines()),
            "seconds": time.perf_counter() - t0,
        }
        config = with_settings(config, best["settings"])
        row["transformer"] = train_seeds(config, args, path)
    if "dlinear" in args.models:
        row["dlinear"] = train_dlinear(path, horizon, args)
    if "naive" in args.models:
        row.update(naive_baselines(path, config, horizon))
    return row


def train_seeds(config, args: argparse.Namespace, path: Path) -> dict:
    per_seed = []
    data = None
    for seed in args.seeds:
        seeded = with_settings(config, {"train.seed": seed})
        seeded.train = {**seeded.train, "seed": seed, "device": args.device, "log_every": 0}
        run = build_training(seeded, args.config, data)
        data = run.data
        task = ForecastTask.from_config(run)
        model = task.model
        t0 = time.perf_counter()
        train(task, None, log=_quiet, progress=False)
        state = task.result()
        seconds = time.perf_counter() - t0
        test = data.windows("test", run.model.seq_len, run.model.horizon)
        per_seed.append(
            {
                "seed": seed,
                **scores(model, test, data.outputs, patchtst_windows(path, len(test))),
                "best_val_mse": state.best_val,
                "epochs": state.epoch,
                "seconds": seconds,
            }
        )
    return summary(per_seed)


def summary(per_seed: list[dict]) -> dict:
    out = {"per_seed": per_seed}
    for metric in ("mse", "mae"):
        out[metric] = stats([r[metric] for r in per_seed])
        if per_seed[0]["on_patchtst_windows"]:
            out[f"{metric}_on_patchtst_windows"] = stats([r["on_patchtst_windows"][metric] for r in per_seed])
    out["seconds"] = stats([r["seconds"] for r in per_seed])
    return out


def train_dlinear(path: Path, horizon: int, args: argparse.Namespace) -> dict:
    """DLinear with its own recipe (input 336, 10 epochs, patience 3), each seed, same test targets."""
    data = prepare(path, "M", "OT", DLINEAR_INPUT_LEN, horizon)
    train_windows, val, test = (data.windows(s, DLINEAR_INPUT_LEN, horizon) for s in ("train", "val", "test"))
    per_seed = []
    for seed in args.seeds:
        torch.manual_seed(seed)
        model = DLinear(DLINEAR_INPUT_LEN, horizon, data.outputs)
        cfg = ForecastTrainConfig(**DLINEAR_TRAIN, seed=seed, device=args.device, log_every=0)
        t0 = time.perf_counter()
        task = ForecastTask(model, train_windows, val, data.outputs, cfg)
        train(task, None, log=_quiet, progress=False)
        state = task.result()
        per_seed.append(
            {
                "seed": seed,
                **scores(model, test, data.outputs, patchtst_windows(path, len(test))),
                "best_val_mse": state.best_val,
                "epochs": state.epoch,
                "seconds": time.perf_counter() - t0,
            }
        )
    return {**summary(per_seed), "input_len": DLINEAR_INPUT_LEN}


def naive_baselines(path: Path, config, horizon: int) -> dict:
    data = prepare(path, "M", "OT", config.data.input_len, horizon)
    test = data.windows("test", config.data.input_len, horizon)
    day = max(int(np.timedelta64(1, "D") / data.series.freq), 1)  # steps per day
    rows = {"repeat_last": RepeatLast(horizon, data.outputs)}
    if day <= config.data.input_len:
        rows[f"seasonal_naive_{day}"] = SeasonalNaive(horizon, data.outputs, day)
    return {
        name: scores(model, test, data.outputs, patchtst_windows(path, len(test)))
        for name, model in rows.items()
    }


def _quiet(_: str) -> None:
    """Per-epoch lines are not printed."""


def print_table(results: dict) -> None:
    head = (
        "file",
        "H",
        "MSE (full test)",
        "MAE (full test)",
        "PatchTST windows",
        "DLinear",
        "anchor",
        "ratio",
        "s/model",
    )
    print("{:<8} {:>4} {:>17} {:>17} {:>16} {:>8} {:>7} {:>6} {:>8}".format(*head))
    for name, horizons in results["datasets"].items():
        for h, row in horizons.items():
            if "transformer" not in row:
                continue
            tf = row["transformer"]
            anchors = ANCHORS.get(name, {})
            anchor = min((a[int(h)] for a in anchors.values() if int(h) in a), default=float("nan"))
            dlinear = row.get("dlinear", {}).get("mse", {}).get("mean", float("nan"))
            windows = tf.get("mse_on_patchtst_windows", {}).get("mean", float("nan"))
            mse, mae = (f"{tf[m]['mean']:.4f} ± {tf[m]['std']:.4f}" for m in ("mse", "mae"))
            ratio = tf["mse"]["mean"] / anchor
            print(
                f"{name:<8} {h:>4} {mse:>17} {mae:>17} {windows:>16.4f} {dlinear:>8.4f} {anchor:>7.3f} "
                f"{ratio:>6.3f} {tf['seconds']['mean']:>8.0f}"
            )
    print(
        "mean ± sample std over seeds, every test window; PatchTST windows: the windows its code scores; "
        "anchor: the best published MSE per horizon; ratio: full-test MSE / anchor"
    )


def merge(parts: list[str], out: str) -> None:
    loaded = [json.loads(Path(p).read_text()) for p in parts]
    results = {**loaded[0], "command": command(), "datasets": {}}
    # each run's command, machine and device (ETTh1 on a CPU, ETTm1 on a GPU, say)
    results["parts"] = [{k: r.get(k) for k in PART_KEYS} for p in loaded for r in p.get("parts", [p])]
    for r in loaded:  # rows of the same file and horizon from runs of different models are joined
        for name, horizons in r["datasets"].items():
            for h, row in horizons.items():
                results["datasets"].setdefault(name, {}).setdefault(h, {}).update(row)
    for name in results["datasets"]:
        results["datasets"][name] = dict(sorted(results["datasets"][name].items(), key=lambda kv: int(kv[0])))
    results["peak_rss_mib"] = max(r.get("peak_rss_mib", 0.0) for r in loaded)
    Path(out).write_text(json.dumps(results, indent=2))
    print_table(results)


def main() -> None:
    args = parse_args()
    if args.merge:
        return merge(args.merge, args.out)
    torch.set_num_threads(args.threads)
    gpu = torch.cuda.get_device_name() if args.device != "cpu" and torch.cuda.is_available() else None
    results = {
        "command": command(),
        "recipe": args.config,
        "recipe_text": Path(args.config).read_text(),
        "protocol": "tune on the file's val split (the recipe's tune section), train each seed with the "
        "chosen settings (early stopping on val), score every test window (no drop_last); "
        "on_patchtst_windows: the first len - len % batch test windows (PatchTST's code; batch 128 "
        "unless PATCHTST_TEST_BATCH names another)",
        "seeds": args.seeds,
        "device": args.device,
        "gpu": gpu,
        "threads": args.threads,
        "anchors_mse": ANCHORS,
        "dlinear_train": {**DLINEAR_TRAIN, "input_len": DLINEAR_INPUT_LEN},
        "versions": versions(numpy=np.__version__),
        "machine": machine(),
        "datasets": {},
    }
    for path in files(args):
        for horizon in args.horizons:
            t0 = time.perf_counter()
            row = run_horizon(path, horizon, args)
            row["wall_seconds_" + "_".join(args.models)] = time.perf_counter() - t0
            results["datasets"].setdefault(path.stem, {})[str(horizon)] = row
            results["peak_rss_mib"] = peak_rss_mib()
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(results, indent=2))
            print_table(results)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
