"""Where a training step's time goes: aiayn's step under ``torch.profiler``, eager and compiled.

    python3 benchmarks/train_profile.py --device cuda --shape base --batch-tokens 25000 --max-len 64
    .venv/bin/python benchmarks/train_profile.py --shape tiny --steps 2 --results /tmp/train_profile.json

The step is ``train_throughput.py``'s (its ``Runner``: ``Seq2SeqObjective``, fused Adam, bf16 through
aiayn's autocast, the same random batches with about a quarter padding). After ``--warmup`` steps
(every batch shape once, so that a compiled step has compiled), ``--steps`` steps run under the
profiler. Written per variant (``eager``; ``compiled`` with ``--compile``):

* ``wall_s``: the profiled steps' wall time (the device synchronised before and after);
* ``busy``: the fraction of that wall time in which the device ran at least one kernel (the union of
  the kernels' intervals; on a CPU the operators' self time over wall time, a rough figure); the rest
  are the gaps a captured or compiled step would remove (launches, Python, synchronisations);
* ``top``: the ``--top`` operators by self device time (CUDA) or self CPU time, with their share;
* ``kinds``: the same time by kind of kernel (matmul, attention, softmax/loss, optimizer, normalisation,
  elementwise and copies, other), so that a change can say what it moved.

Writes ``benchmarks/results/train_profile_gpu.json`` on a GPU, ``train_profile.json`` otherwise
(``--results``), with command, versions and machine. ``benchmarks/gpu_run.sh`` runs it (stage A0).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from aiayn.malloc import keep_freed_memory
from common import command, gpu, machine, versions
from train_throughput import PAD_ID, SHAPES, make_batches, make_runners, sized, synchronize

ROOT = Path(__file__).resolve().parents[1]
#: kinds of kernel by name (first match wins), lower case
KINDS = (
    ("attention", r"flash|fmha|attention|sdpa|efficient_attention|cudnn_.*mha"),
    ("matmul", r"gemm|matmul|\bmm\b|addmm|bmm|linear|cutlass|sm\d+_xmma|nvjet|wgmma|ampere_|hopper_"),
    ("softmax and loss", r"softmax|cross_entropy|nll|log_sum|logsumexp"),
    ("optimizer", r"adam|foreach|multi_tensor|fused_adam"),
    ("normalisation", r"layer_norm|layernorm|norm_"),
    (
        "elementwise and copies",
        r"elementwise|vectorized|copy|cat|index|fill|where|dropout|bernoulli|add|sub|mul|div|exp|neg|relu|"
        r"gather|scatter|reduce|sum|mean|masked|clone|zero|embedding|triton_",
    ),
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", default="base", choices=sorted(SHAPES))
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument(
        "--batch-tokens", type=int, default=0, help="real target tokens per batch (0: the shape's)"
    )
    parser.add_argument("--max-len", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--compile", action="store_true", help="also profile the torch.compile'd step")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (ignored on a GPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results")
    return parser.parse_args()


def kind_of(name: str) -> str:
    lowered = name.lower()
    for kind, pattern in KINDS:
        if re.search(pattern, lowered):
            return kind
    return "other"


def busy_fraction(intervals: list[tuple[float, float]], wall_us: float) -> float:
    """The share of ``wall_us`` covered by the union of ``intervals`` (start, end) in microseconds."""
    covered, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        covered += stop - max(start, end)
        end = stop
    return min(1.0, covered / wall_us) if wall_us > 0 else 0.0


def profile_steps(runner, batches, steps: int, cuda: bool, top: int) -> dict:
    device = runner.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for i in range(steps):
            loss = runner.step(batches[i % len(batches)])
        synchronize(device)
        wall = time.perf_counter() - start
    averages = prof.key_averages()
    attribute = "self_device_time_total" if cuda else "self_cpu_time_total"
    rows = [(e.key, getattr(e, attribute), e.count) for e in averages if getattr(e, attribute) > 0]
    total = sum(t for _, t, _ in rows) or 1.0
    kinds: dict[str, float] = {}
    for name, t, _ in rows:
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + t / total
    if cuda:  # kernels' own intervals on the device's clock
        intervals = [
            (e.time_range.start, e.time_range.end)
            for e in prof.events()
            if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
        ]
        busy = busy_fraction(intervals, wall * 1e6)
    else:
        busy = min(1.0, total / (wall * 1e6 * torch.get_num_threads()))
    rows.sort(key=lambda r: r[1], reverse=True)
    return {
        "steps": steps,
        "wall_s": wall,
        "seconds_per_step": wall / steps,
        "busy": busy,
        "loss": float(loss),
        "time_counted": "self device time" if cuda else "self CPU time",
        "top": [
            {
                "name": name[:160],
                "share": t / total,
                "ms_per_step": t / 1e3 / steps,
                "calls_per_step": n / steps,
            }
            for name, t, n in rows[:top]
        ],
        "kinds": dict(sorted(kinds.items(), key=lambda kv: kv[1], reverse=True)),
    }


def main() -> None:
    args = parse_args()
    keep_freed_memory()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(args.threads)
    shape = sized(SHAPES[args.shape], args.batch_tokens, args.max_len)
    batches = [
        tuple(t.to(device) for t in b)
        for b in make_batches(shape, 4, torch.Generator().manual_seed(args.seed))
    ]
    options = argparse.Namespace(device=args.device, compile=args.compile, seed=args.seed, peers=())
    variants = {}
    for runner in make_runners(shape, args.precision, options):
        name = "compiled" if runner.name.endswith("compile") else "eager"
        t0 = time.perf_counter()
        for i in range(max(args.warmup, len(batches))):
            runner.step(batches[i % len(batches)])
        synchronize(device)
        warm = time.perf_counter() - t0
        variants[name] = {"warmup_s": warm, **profile_steps(runner, batches, args.steps, cuda, args.top)}
        row = variants[name]
        print(
            f"{name}: {row['seconds_per_step'] * 1e3:.1f} ms/step, busy {row['busy']:.0%}, "
            + ", ".join(f"{k} {v:.0%}" for k, v in row["kinds"].items()),
            flush=True,
        )
        for entry in row["top"][:8]:
            print(
                f"  {entry['share']:6.1%}  {entry['ms_per_step']:8.2f} ms  {entry['name'][:90]}", flush=True
            )
        del runner
        if cuda:
            torch.cuda.empty_cache()
    results = {
        "benchmark": "train_profile",
        "command": command(),
        "versions": versions(),
        "machine": {**machine(), **({"gpu": gpu(device)} if cuda else {})},
        "settings": {
            "shape": args.shape,
            "dimensions": {k: getattr(shape, k) for k in shape.__dataclass_fields__},
            "precision": args.precision,
            "real_target_tokens_per_batch": [int((b[2] != PAD_ID).sum()) for b in batches],
            "warmup": args.warmup,
            "steps": args.steps,
        },
        "variants": variants,
    }
    default = "train_profile_gpu.json" if cuda else "train_profile.json"
    path = Path(args.results or ROOT / "benchmarks" / "results" / default)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
