"""aiayn's CPU dropout (16-bit slices of 64-bit draws) against ``F.dropout``, in aiayn training steps.

Same process, same model and batches; the model's dropout function is swapped between
``aiayn.model.dropout.dropout`` and ``torch.nn.functional.dropout`` for alternate timings. Each
round times every batch once with each (the order alternates between rounds); the figure is the
paired speedup, F.dropout's round time over aiayn's (median, min, max), for forward + backward +
fused Adam (the ``train_throughput`` runner, dropout 0.1 on embeddings and sub-layer outputs).

    .venv/bin/python benchmarks/dropout.py                 # tiny (the Multi30k en-de model) and (a)

Writes ``benchmarks/results/dropout.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

import aiayn.model.dropout as aiayn_dropout
from allocator import SHAPES as ALLOCATOR_SHAPES
from common import command, machine, peak_rss_mib, versions
from train_throughput import SHAPES as THROUGHPUT_SHAPES
from train_throughput import Shape, make_batches, make_runners

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"tiny": Shape(*ALLOCATOR_SHAPES["tiny"]), "a": THROUGHPUT_SHAPES["a"]}


def torch_dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    return F.dropout(x, p, training) if p > 0 else x


VARIANTS = {"F.dropout": torch_dropout, "aiayn": aiayn_dropout.dropout}


def measure(shape: Shape, rounds: int, seed: int) -> dict:
    batches = make_batches(shape, 4, torch.Generator().manual_seed(seed))
    runner = make_runners(shape, "fp32", argparse.Namespace(compile=False, peers=[], seed=seed))[0]
    for name in VARIANTS:  # untimed warm-up: every batch shape, both variants
        aiayn_dropout.dropout = VARIANTS[name]
        for batch in batches:
            runner.step(batch)
    seconds = {name: [] for name in VARIANTS}
    try:
        for r in range(rounds):
            for name in list(VARIANTS)[:: 1 if r % 2 == 0 else -1]:
                aiayn_dropout.dropout = VARIANTS[name]
                start = time.perf_counter()
                for batch in batches:
                    runner.step(batch)
                seconds[name].append((time.perf_counter() - start) / len(batches))
    finally:
        aiayn_dropout.dropout = VARIANTS["aiayn"]
    ratios = [t / a for t, a in zip(seconds["F.dropout"], seconds["aiayn"])]
    return {
        "shape": asdict(shape),
        "seconds_per_step": seconds,
        "median_s_per_step": {name: statistics.median(s) for name, s in seconds.items()},
        "speedup_aiayn_over_F_dropout": {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["tiny", "a"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "dropout.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    figures = {}
    for name in args.shapes:
        figures[name] = measure(SHAPES[name], args.rounds, args.seed)
        s = figures[name]["speedup_aiayn_over_F_dropout"]
        m = figures[name]["median_s_per_step"]
        print(
            f"shape {name}: F.dropout {m['F.dropout']:.3f} s/step, aiayn {m['aiayn']:.3f} s/step, "
            f"aiayn {s['median']:.3f}x [{s['min']:.3f}-{s['max']:.3f}]",
            flush=True,
        )
    results = {
        "benchmark": "dropout",
        "command": command(),
        "versions": versions(),
        "machine": machine(),
        "settings": {"rounds": args.rounds, "threads": args.threads, "seed": args.seed, "precision": "fp32"},
        "figures": figures,
        "peak_rss_mib": peak_rss_mib(),
    }
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
