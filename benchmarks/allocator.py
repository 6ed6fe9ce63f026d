"""Training steps with and without transparent huge pages for PyTorch's large CPU tensors.

glibc serves every block above 32 MiB (its mmap threshold's ceiling) with a fresh ``mmap``, so a
training step that allocates the generator's logits (tokens × vocabulary × 4 bytes: ~130 MB for a
4,096-token batch and 8k vocabulary) and their gradients page-faults every 4 KiB of them again on
every step: about a sixth of a step's process time is system time here. ``THP_MEM_ALLOC_ENABLE=1``
makes PyTorch align large CPU allocations to 2 MiB and ``madvise`` them as huge pages, a fault per
2 MiB instead of per 4 KiB. Measured here it cuts the faults 40-fold but makes the step *slower*
(more system time: the kernel zeroes and compacts huge pages on fault), so aiayn does not set it;
this benchmark is kept to re-check on other kernels. The variable is read once, when torch first
allocates, so it is compared across processes: each round starts one child per setting (the order
alternates between rounds), each child times ``--steps`` aiayn training steps (forward, backward,
fused Adam; the trainer's ``Seq2SeqObjective``) after ``--warmup`` untimed ones, on Multi30k-sized
batches (~4,000 padded tokens).

Reports, per setting, the median over rounds of process CPU time per step (user + system, so load
from other processes does not count), system time, minor page faults and wall time per step, peak
RSS, and the CPU-time ratio; writes ``benchmarks/results/allocator.json``.

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
SETTINGS = {"glibc default": "0", "THP_MEM_ALLOC_ENABLE=1": "1"}


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
    print(json.dumps({
        "cpu_s_per_step": (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / args.steps,
        "sys_s_per_step": (after.ru_stime - before.ru_stime) / args.steps,
        "minor_faults_per_step": (after.ru_minflt - before.ru_minflt) / args.steps,
        "wall_s_per_step": wall / args.steps,
        "peak_rss_mib": after.ru_maxrss / 1024,
        "target_tokens_per_step": sum(int((b[2] != PAD_ID).sum()) for b in batches) / len(batches),
        "thp_mem_alloc_enable": os.environ.get("THP_MEM_ALLOC_ENABLE"),
    }))


def run_child(args: argparse.Namespace, value: str) -> dict:
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": value}
    argv = [sys.executable, __file__, "--child", "--shape", args.shape, "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--threads", str(args.threads)]
    done = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    args = parse_args()
    if args.child:
        return child(args)
    from common import command, machine, versions

    samples: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for round_ in range(args.rounds):
        order = list(SETTINGS) if round_ % 2 == 0 else list(reversed(SETTINGS))
        for name in order:
            samples[name].append(run_child(args, SETTINGS[name]))
            print(f"round {round_ + 1} {name}: {samples[name][-1]}", flush=True)
    medians = {name: {key: statistics.median(s[key] for s in runs) for key in runs[0] if key != "thp_mem_alloc_enable"}
               for name, runs in samples.items()}
    base, thp = medians["glibc default"], medians["THP_MEM_ALLOC_ENABLE=1"]
    ratio = base["cpu_s_per_step"] / thp["cpu_s_per_step"]
    thp_mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    results = {
        "benchmark": "allocator", "command": command(), "versions": versions(), "machine": machine(),
        "kernel_thp": thp_mode.read_text().strip() if thp_mode.exists() else None,
        "shape": dict(zip(("d_model", "n_heads", "d_ff", "layers", "vocab", "batch", "max_len"), SHAPES[args.shape])),
        "threads": args.threads, "rounds": args.rounds, "steps": args.steps,
        "median": medians, "cpu_time_ratio_default_over_thp": ratio, "samples": samples,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    for name, m in medians.items():
        print(f"{name:24s} cpu {m['cpu_s_per_step']:.3f} s/step  sys {m['sys_s_per_step']:.3f}  "
              f"faults {m['minor_faults_per_step']:.0f}  wall {m['wall_s_per_step']:.3f}  rss {m['peak_rss_mib']:.0f} MiB")
    print(f"CPU time per step, default / THP: {ratio:.2f}x; wrote {args.out}")


if __name__ == "__main__":
    main()
