"""Attention on CPU: the written-out formula against PyTorch's fused kernel, by shape, same process.

    .venv/bin/python benchmarks/attention_paths.py                  # the grid below, fp32 and bf16

``aiayn.model.attention.scaled_dot_product_attention`` has two paths: the formula written out (two
batched matmuls around an fp32 softmax) and ``F.scaled_dot_product_attention`` (on CPU, a flash
kernel); this benchmark calls each directly (``path="formula"`` and ``path="fused"``), with q/k/v in
the dtype the model's projections give (bf16 under bf16 autocast), and reports which one
``path="auto"`` takes for those tensors (``formula_is_faster``: the formula only for a bf16/fp16
backward over at most ``SMALL_SCORES_GRAD`` scores T_q * T_k per (row, head), where the flash
kernel's backward pays a large fixed cost per (batch row, head)). This
benchmark measures both paths over (B, H, T, d_k) shapes, self-attention with a padding mask (about
a quarter of the keys padded; ``(B, 1, 1, T)``, the encoder's) and, with gradients, also with the
decoder's causal-and-padding mask ``(B, 1, T, T)``, forward only (``no_grad``) and forward +
backward, fp32 and bf16 (autocast, as training runs it), and prints which path the rule picks.

Timing: every round runs both paths once per shape, in alternating order; figures are medians of
``--rounds`` rounds of ``--reps`` calls each, and the paired ratio fused / formula (> 1: the formula
is faster; median, min and max over the rounds). Writes ``benchmarks/results/attention_paths.json``
(``--out``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import aiayn.model.attention as attention
from common import command, machine, versions

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [
    (256, 4, 16, 32),
    (64, 4, 24, 64),
    (128, 4, 32, 32),
    (32, 4, 64, 32),
    (16, 4, 128, 32),
    (8, 8, 256, 64),
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5, help="calls per path per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "attention_paths.json"))
    return parser.parse_args()


def one_call(formula: bool, q, k, v, mask, backward: bool, bf16: bool) -> None:
    """One attention call on the chosen path, as the model makes it: q/k/v in the dtype that autocast's
    projections give (bf16 under bf16 autocast), under the same autocast."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        path = "formula" if formula else "fused"
        out, _ = attention.scaled_dot_product_attention(q, k, v, mask, path=path)
    if backward:
        out.float().sum().backward()


def time_path(formula: bool, inputs, backward: bool, bf16: bool, reps: int) -> float:
    q, k, v, mask = inputs
    start = time.perf_counter()
    for _ in range(reps):
        if backward:
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            one_call(formula, *leaves, mask, True, bf16)
        else:
            with torch.no_grad():
                one_call(formula, q, k, v, mask, False, bf16)
    return (time.perf_counter() - start) / reps


def measure(
    shape: tuple[int, int, int, int], backward: bool, bf16: bool, causal: bool, args: argparse.Namespace
) -> dict:
    b, h, t, d = shape
    generator = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if bf16 else torch.float32  # what the Q/K/V projections give under autocast
    q, k, v = (torch.randn(b, h, t, d, generator=generator).to(dtype) for _ in range(3))
    lengths = torch.randint(t - t // 4, t + 1, (b,), generator=generator)
    mask = (torch.arange(t)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T), True = may attend
    if causal:
        mask = mask & torch.ones(t, t, dtype=torch.bool).tril()  # (B, 1, T, T)
    inputs = (q, k, v, mask)
    for formula in (True, False):  # warm-up
        time_path(formula, inputs, backward, bf16, 1)
    times: dict[str, list[float]] = {"formula": [], "fused": []}
    for i in range(args.rounds):
        for formula in (True, False) if i % 2 == 0 else (False, True):
            times["formula" if formula else "fused"].append(
                time_path(formula, inputs, backward, bf16, args.reps)
            )
    paired = [f / g for f, g in zip(times["fused"], times["formula"])]
    picks_formula = attention.formula_is_faster(q.detach().requires_grad_(backward), k)
    return {
        "shape": list(shape),
        "backward": backward,
        "mask": "causal" if causal else "padding",
        "precision": "bf16" if bf16 else "fp32",
        "formula_ms": 1e3 * statistics.median(times["formula"]),
        "fused_ms": 1e3 * statistics.median(times["fused"]),
        "paired_fused_over_formula": statistics.median(paired),
        "paired_min": min(paired),
        "paired_max": max(paired),
        "rule_picks_formula": picks_formula,
    }


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    header = "shape (B, H, T, d_k)   pass     mask     prec   formula ms   fused ms"
    print(f"{header}   fused/formula [min-max]  auto")
    for shape in SHAPES:
        for backward, causal in ((False, False), (True, False), (True, True)):
            for bf16 in (False, True):
                row = measure(shape, backward, bf16, causal, args)
                rows.append(row)
                print(
                    f"{str(shape):22} {'fwd+bwd' if backward else 'fwd':8} {row['mask']:8} "
                    f"{row['precision']}  "
                    f"{row['formula_ms']:10.2f} {row['fused_ms']:10.2f}   "
                    f"{row['paired_fused_over_formula']:8.2f}×"
                    f" [{row['paired_min']:.2f}-{row['paired_max']:.2f}]"
                    f"   {'formula' if row['rule_picks_formula'] else 'fused'}",
                    flush=True,
                )
    Path(args.out).write_text(
        json.dumps(
            {
                "benchmark": "attention_paths",
                "command": command(),
                "versions": versions(),
                "machine": machine(),
                "settings": {
                    "rounds": args.rounds,
                    "reps": args.reps,
                    "threads": args.threads,
                    "small_scores_grad": attention.SMALL_SCORES_GRAD,
                },
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
