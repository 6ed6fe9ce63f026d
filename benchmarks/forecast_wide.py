"""Time to train one model of the forecasting recipe on a wide file (many variables), on this machine.

The common long-horizon benchmark files are wider than ETT: Weather has 21 variables, Electricity
321, Traffic 862. They are not in ``../shared/data``, so this makes files of their shapes from ETT's
columns (``$AIAYN_DATA/ett``, default ``../shared/data/ett``; each copy of a column with its own
noise, a week's shift and a scale; never committed) and
times ``aiayn forecast train`` of the recipe's settings (trial 0 of its search) on each, with
``train.channels_per_step`` as the recipe sets it and, for comparison, off.

    python benchmarks/forecast_wide.py --shapes weather_like
    python benchmarks/forecast_wide.py --shapes electricity_like --channels-per-step -1

A run adds its runs to the results file (the same run name replaces the earlier one).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from common import command, machine, versions

ROOT = Path(__file__).resolve().parents[1]
ETT = Path(os.environ.get("AIAYN_DATA") or ROOT.parent / "shared" / "data") / "ett"  # ETTh1.csv, ETTm1.csv
SHAPES = {"weather_like": ("ETTm1.csv", 21, 52_696), "electricity_like": ("ETTh1.csv", 321, 26_304)}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--horizon", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--channels-per-step", type=int, nargs="+", default=[-1, 0], help="-1: the recipe's")
    parser.add_argument("--work", default="/tmp/forecast_wide")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "forecast_wide.json"))
    return parser.parse_args()


def make_file(source: str, columns: int, rows: int, path: Path) -> None:
    """``columns`` variables of ``rows`` rows from the source file's 7, as text with a date column."""
    lines = (ETT / source).read_text().splitlines()
    header, body = lines[0].split(","), [line.split(",") for line in lines[1:]]
    first, second = (np.datetime64(r[0].replace(" ", "T")) for r in body[:2])
    stamps = [str(first + i * (second - first)).replace("T", " ") for i in range(rows)]
    values = np.resize(np.array([[float(v) for v in r[1:]] for r in body]), (rows, len(header) - 1))
    rng = np.random.default_rng(0)
    out = np.empty((rows, columns))
    for c in range(columns):
        base = np.roll(values[:, c % values.shape[1]], 168 * (c // values.shape[1]))
        out[:, c] = base * rng.uniform(0.5, 2.0) + rng.normal(0, 0.1 * base.std(), len(base))
    names = [f"v{c}" for c in range(columns - 1)] + ["OT"]
    with path.open("w") as handle:
        handle.write(",".join([header[0], *names]) + "\n")
        for stamp, row in zip(stamps, out):
            handle.write(stamp + "," + ",".join(f"{v:.4f}" for v in row) + "\n")


def train(data: Path, horizon: int, threads: int, channels: int, run: Path) -> dict:
    """``aiayn forecast train`` of configs/ett.yaml; wall seconds and the printed result."""
    config = run.parent / f"{run.name}.yaml"
    recipe = yaml.safe_load((ROOT / "configs" / "ett.yaml").read_text())
    if channels >= 0:
        recipe["train"]["channels_per_step"] = channels
    config.write_text(yaml.safe_dump(recipe, sort_keys=False))
    args = [sys.executable, "-m", "aiayn", "forecast", "train", "--config", str(config), "--data", str(data)]
    args += ["--horizon", str(horizon), "--threads", str(threads), "--out", str(run)]
    t0 = time.perf_counter()
    with open(run.parent / f"{run.name}.log", "w+") as log:
        child = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak memory
        seconds = time.perf_counter() - t0
        log.seek(0)
        output = log.read()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(output)
    return {
        "seconds": seconds,
        "epochs": [line for line in output.splitlines() if line.startswith("epoch ")],
        "result": output.strip().splitlines()[-1],
        "peak_rss_mib": usage.ru_maxrss / 2**10,
    }


def _listed(value: str | list[str]) -> list[str]:
    return value if isinstance(value, list) else [value]


def main() -> None:
    args = parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results = {
        "command": command(),
        "versions": versions(),
        "machine": machine(),
        "threads": args.threads,
        "horizon": args.horizon,
        "runs": {},
    }
    if Path(args.out).exists():  # a run of other shapes or settings adds to the file
        earlier = json.loads(Path(args.out).read_text())
        results["runs"] = earlier["runs"]
        results["command"] = [*_listed(earlier["command"]), results["command"]]
    for shape in args.shapes:
        source, columns, rows = SHAPES[shape]
        data = work / f"{shape}.csv"
        if not data.exists():
            make_file(source, columns, rows, data)
        for channels in args.channels_per_step:
            name = f"{shape}-channels{'_recipe' if channels < 0 else channels}"
            run = work / name
            shutil.rmtree(run, ignore_errors=True)
            results["runs"][name] = {
                "variables": columns,
                "rows": rows,
                **train(data, args.horizon, args.threads, channels, run),
            }
            print(name, json.dumps(results["runs"][name], indent=1), flush=True)
            Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
