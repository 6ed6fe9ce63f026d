"""Training steps under three allocator settings for PyTorch's large CPU tensors.

glibc serves every block above 32 MiB (its mmap threshold's ceiling) with a fresh ``mmap``, so a
training step that allocates the generator's logits (target tokens × vocabulary × 4 bytes: ~100 MB
for the ~3,100 target tokens of a ~4,000-token batch and 8k vocabulary) and their gradients
page-faults every 4 KiB of them again on every step: about a sixth of a step's process time is
system time here. The settings:

* ``glibc default`` (``AIAYN_MALLOC=default``);
* ``THP_MEM_ALLOC_ENABLE=1``: PyTorch aligns large CPU allocations to 2 MiB and ``madvise``s them
  as huge pages, a fault per 2 MiB instead of per 4 KiB (the kernel still zeroes every page);
* ``aiayn`` (what the ``aiayn`` command does at start-up): :func:`aiayn.malloc.keep_freed_memory`
  turns glibc's ``mmap`` of large blocks and heap trimming off, so freed blocks are reused.

These are read once, when the process starts or first allocates, so the settings are compared across
processes: each round starts one child per setting (the order rotates between rounds), each child
times ``--steps`` aiayn training steps (forward, backward, fused Adam; the trainer's
``Seq2SeqObjective``) after ``--warmup`` untimed ones, on Multi30k-sized batches (~4,000 padded
tokens).

Reports, per setting, the median over rounds of process CPU time per step (user + system, so load
from other processes does not count), system time, minor page faults and wall time per step, peak
RSS, and the CPU-time ratios against glibc's default; writes ``benchmarks/results/allocator.json``.

    .venv/bin/python benchmarks/allocator.py                       # the Multi30k en-de shape
    .venv/bin/python benchmarks/allocator.py --shape small --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (d_model, n_heads, d_ff, layers, vocab, batch, max_len): the Multi30k configs' shapes at ~4k tokens
SHAPES = {"tiny": (128, 4, 256, 4, 8000, 160, 26), "small": (256, 4, 1024, 3, 8000, 160, 26)}
SETTINGS = {
    "glibc default": {"AIAYN_MALLOC": "default"},
    "THP_MEM_ALLOC_ENABLE=1": {"AIAYN_MALLOC": "default", "THP_MEM_ALLOC_ENABLE": "1"},
    "aiayn (keep_freed_memory)": {},
}
ALL_VARIABLES = {key for settings in SETTINGS.values() for key in settings}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "allocator.json"))
    return parser.parse_args()


def child(args: argparse.Namespace) -> None:
    """Time the steps in this process and print one JSON line."""
    from aiayn.malloc import keep_freed_memory

    kept = keep_freed_memory()  # first, as the aiayn command does; a no-op under AIAYN_MALLOC=default
    import torch

    from aiayn.config import PAD_ID
    from train_throughput import Shape, make_batches, make_runners

    torch.set_num_threads(args.threads)
    shape = Shape(*SHAPES[args.shape])
    batches = make_batches(shape, 4, torch.Generator().manual_seed(0))
    runner = make_runners(shape, "fp32", argparse.Namespace(compile=False, peers=[], seed=0))[0]
    for i in range(args.warmup):
        runner.step(batches[i % len(batches)])
    before, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for i in range(args.steps):
        runner.step(batches[i % len(batches)])
    wall, after = time.perf_counter() - wall, resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "cpu_s_per_step": (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
                / args.steps,
                "sys_s_per_step": (after.ru_stime - before.ru_stime) / args.steps,
                "minor_faults_per_step": (after.ru_minflt - before.ru_minflt) / args.steps,
                "wall_s_per_step": wall / args.steps,
                "peak_rss_mib": after.ru_maxrss / 1024,
                "target_tokens_per_step": sum(int((b[2] != PAD_ID).sum()) for b in batches) / len(batches),
                "kept_freed_memory": kept,
                "environment": {key: os.environ[key] for key in sorted(ALL_VARIABLES) if key in os.environ},
            }
        )
    )


def run_child(args: argparse.Namespace, settings: dict[str, str]) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ALL_VARIABLES} | settings
    argv = [
        sys.executable,
        __file__,
        "--child",
        "--shape",
        args.shape,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--threads",
        str(args.threads),
    ]
    done = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    args = parse_args()
    if args.child:
        return child(args)
    from common import command, machine, versions

    samples: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for round_ in range(args.rounds):
        order = list(SETTINGS)[round_ % len(SETTINGS) :] + list(SETTINGS)[: round_ % len(SETTINGS)]
        for name in order:
            samples[name].append(run_child(args, SETTINGS[name]))
            print(f"round {round_ + 1} {name}: {samples[name][-1]}", flush=True)
    medians = {
        name: {
            key: statistics.median(s[key] for s in runs)
            for key in runs[0]
            if key not in ("environment", "kept_freed_memory")
        }
        for name, runs in samples.items()
    }
    base = medians["glibc default"]["cpu_s_per_step"]
    ratios = {name: base / m["cpu_s_per_step"] for name, m in medians.items() if name != "glibc default"}
    thp_mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    results = {
        "benchmark": "allocator",
        "command": command(),
        "versions": versions(),
        "machine": machine(),
        "kernel_thp": thp_mode.read_text().strip() if thp_mode.exists() else None,
        "shape": dict(
            zip(("d_model", "n_heads", "d_ff", "layers", "vocab", "batch", "max_len"), SHAPES[args.shape])
        ),
        "threads": args.threads,
        "rounds": args.rounds,
        "steps": args.steps,
        "median": medians,
        "cpu_time_ratio_default_over_setting": ratios,
        "samples": samples,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    for name, m in medians.items():
        print(
            f"{name:24s} cpu {m['cpu_s_per_step']:.3f} s/step  sys {m['sys_s_per_step']:.3f}  "
            f"faults {m['minor_faults_per_step']:.0f}  wall {m['wall_s_per_step']:.3f}  rss "
            f"{m['peak_rss_mib']:.0f} MiB"
        )
    for name, ratio in ratios.items():
        print(f"CPU time per step, default / {name}: {ratio:.2f}x")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
