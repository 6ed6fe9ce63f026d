"""Does resident memory grow when batch shapes vary? A training loop over random (B, T) batches.

    python benchmarks/memory_shapes.py fp32 400
    python benchmarks/memory_shapes.py bf16 400                      # as aiayn's trainer runs
    python benchmarks/memory_shapes.py bf16 400 --onednn-caches default   # oneDNN's own cache sizes
    AIAYN_MALLOC=default python benchmarks/memory_shapes.py fp32 400  # glibc's allocator defaults

A 2+2-layer d=128 model, V=8000, about 2,000 tokens per batch with T uniform in [5, 60], label-
smoothed loss and fused Adam as the trainer runs them; records the resident set (``/proc/self/statm``)
sixteen times along the way. Users of other toolkits report RSS growing to several GB in such loops
under bf16 autocast. Like the ``aiayn`` command, the loop keeps freed memory in glibc's heap
(:func:`aiayn.malloc.keep_freed_memory`) unless ``AIAYN_MALLOC=default``; like aiayn's trainer in
bf16 on a CPU, it bounds oneDNN's per-shape caches (:func:`aiayn.malloc.bound_onednn_caches`)
unless ``--onednn-caches default`` (oneDNN's and ideep's own default of 1,024 entries each).

Writes ``benchmarks/results/memory_shapes_{precision}_{caches}.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

from aiayn.config import TransformerConfig
from aiayn.malloc import ONEDNN_CACHES, bound_onednn_caches, keep_freed_memory
from aiayn.model import build_model
from aiayn.precision import autocast
from aiayn.train.loss import Seq2SeqObjective
from common import command, machine, peak_rss_mib, versions

ROOT = Path(__file__).resolve().parents[1]


def rss_mib() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("precision", choices=("fp32", "bf16"))
    parser.add_argument("steps", type=int)
    parser.add_argument("--onednn-caches", choices=("bounded", "default"), default="bounded")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--out", help="results file (default: benchmarks/results/memory_shapes_{precision}_{caches}.json)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    kept = keep_freed_memory()  # first, as the aiayn command does
    if args.onednn_caches == "default":
        os.environ.update({name: "1024" for name in ONEDNN_CACHES})
    bound = bound_onednn_caches() if args.precision == "bf16" else {}  # as the trainer: bf16 on a CPU only
    print(
        f"{args.precision}, {args.steps} steps, freed memory kept: {kept}, oneDNN caches: "
        f"{args.onednn_caches}",
        flush=True,
    )
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    random.seed(0)
    config = TransformerConfig(
        src_vocab_size=8000,
        tgt_vocab_size=8000,
        d_model=128,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=512,
        dropout=0.1,
    )
    objective = Seq2SeqObjective(build_model(config), 0.1, 0)
    optimizer = torch.optim.Adam(objective.parameters(), fused=True)
    start, series = time.time(), []
    for i in range(args.steps):
        length = random.randint(5, 60)
        batch = max(1, 2000 // length)
        src, tgt = torch.randint(4, 8000, (batch, length)), torch.randint(4, 8000, (batch, length))
        with autocast(torch.device("cpu"), args.precision):
            loss, _ = objective(src, tgt, tgt)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i % max(1, args.steps // 16) == 0 or i == args.steps - 1:
            series.append({"step": i, "rss_mib": rss_mib(), "seconds": time.time() - start})
            print(
                f"step {i}: {series[-1]['rss_mib']:.0f} MiB after {series[-1]['seconds']:.0f} s", flush=True
            )
    out = Path(
        args.out
        or ROOT / "benchmarks" / "results" / f"memory_shapes_{args.precision}_{args.onednn_caches}.json"
    )
    out.write_text(
        json.dumps(
            {
                "benchmark": "memory_shapes",
                "command": command(),
                "versions": versions(),
                "machine": machine(),
                "settings": {
                    "precision": args.precision,
                    "steps": args.steps,
                    "threads": args.threads,
                    "freed_memory_kept": kept,
                    "onednn_caches": args.onednn_caches,
                    "set_by_bound": bound,
                    "cache_variables": {name: os.environ.get(name) for name in ONEDNN_CACHES},
                },
                "rss": series,
                "peak_rss_mib": peak_rss_mib(),
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
