"""The Keras port against aiayn.model on every Keras backend installed: PyTorch, JAX, TensorFlow.

    PYTHONPATH=/tmp/k36-extra .venv/bin/python benchmarks/keras_backends.py

Runs ``python -m aiayn.keras.parity`` (every combination of the model's options: post/pre-norm,
each activation, each kind of positions, each tying mode, generator bias or not; the logits of both
calls, every attention weight, the greedy tokens) once per backend, each in its own process (Keras
chooses its backend once per process), and writes the largest differences per backend, the worst
combination and the time to ``benchmarks/results/keras_backends.json``. A backend whose package is
not importable is recorded as skipped. ``PYTHONPATH`` may point at a directory holding JAX and
TensorFlow (``pip install --target DIR``), so that they need not be in the project's environment;
the results file records it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import command, machine, versions

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = {"torch": "torch", "jax": "jax", "tensorflow": "tensorflow"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    parser.add_argument("--pairwise", action="store_true", help="only the suite's pairwise combinations")
    default = ROOT / "benchmarks" / "results" / "keras_backends.json"
    parser.add_argument("--results", type=Path, default=default)
    return parser.parse_args()


def run_backend(backend: str, pairwise: bool) -> dict:
    if importlib.util.find_spec(BACKENDS[backend]) is None:
        return {"skipped": f"{BACKENDS[backend]} is not installed"}
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "aiayn.keras.parity", *(["--pairwise"] if pairwise else [])],
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        return {"failed": result.stderr[-2000:]}
    report = json.loads(result.stdout)
    results = report.pop("results")
    worst = max(results, key=lambda r: max(r["logits"], r["logits_with_attention"]))
    return {
        **report,
        "seconds": round(time.perf_counter() - started, 1),
        "worst_combination": worst,
        "greedy_unequal": [r for r in results if not r["greedy_equal"]],
    }


def main() -> None:
    args = parse_args()
    backends = {}
    for backend in args.backends:
        backends[backend] = run_backend(backend, args.pairwise)
        print(backend, json.dumps({k: v for k, v in backends[backend].items() if k != "worst_combination"}))
    results = {
        "command": command(),
        "pythonpath": os.environ.get("PYTHONPATH"),
        "versions": versions(),
        "machine": machine(),
        "backends": backends,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
