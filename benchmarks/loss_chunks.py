"""The label-smoothed loss on CPU: blocks of rows against the whole (N, V) logits at once (before),
in the same process.

    .venv/bin/python benchmarks/loss_chunks.py                     # shape (a)'s loss: 1,536 x 8,000

``aiayn.train.loss.label_smoothed_nll`` (forward + its hand-written backward) goes over the logits in
blocks of ``CHUNK_ELEMENTS`` logits (rows of V) on a CPU, so that a block's fp32 temporaries are still
in cache for the next operation on them. This benchmark times the loss's forward and backward on
random logits of shape (a) of ``train_throughput.py`` (N = 64 x 24 target tokens, V = 8,000;
``--tokens``, ``--vocab``) with ``CHUNK_ELEMENTS`` set to each of ``--chunks``, against PyTorch's
``F.cross_entropy`` with ``label_smoothing`` (the library primitive it stands in for; compared with
the shipped ``CHUNK_ELEMENTS``, which ``--chunks`` must include), and against the implementation it
replaced (``WholeLogits`` below, the function as of commit 2eda7f0: an fp32 copy of
the whole logits kept for the backward, each operation a pass over all N x V), for bf16 logits (what
bf16 autocast's generator gives) and fp32.

Timing: every round runs every setting once (``--reps`` calls), in an order that rotates each round;
figures are medians of ``--rounds`` rounds and the paired ratio before / blocks (> 1: blocks faster).
Writes ``benchmarks/results/loss_chunks.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import aiayn.train.loss as loss
from common import command, machine, peak_rss_mib, versions

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64 * 24, help="rows N (real target tokens per batch)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument(
        "--chunks",
        type=int,
        nargs="+",
        default=[1 << 16, 1 << 18, 1 << 20],
        help="CHUNK_ELEMENTS values to compare with the implementation before blocks",
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "loss_chunks.json"))
    return parser.parse_args()


class WholeLogits(torch.autograd.Function):
    """The label-smoothed loss before blocks of rows (aiayn.train.loss at commit 2eda7f0)."""

    @staticmethod
    def forward(ctx, logits, target, epsilon):
        x = logits.float()
        lse = torch.logsumexp(x, dim=-1)
        nll = lse - x.gather(-1, target[:, None]).squeeze(-1)
        ctx.save_for_backward(x, lse, target)
        ctx.epsilon, ctx.dtype = epsilon, logits.dtype
        if epsilon == 0:
            return nll.sum(), nll.sum()
        smooth = lse - x.mean(dim=-1)
        return ((1.0 - epsilon) * nll + epsilon * smooth).sum(), nll.sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, grad_nll):
        x, lse, target = ctx.saved_tensors
        eps, vocab = ctx.epsilon, x.size(-1)
        grad = torch.exp(x - lse[:, None]).mul_(grad_loss + grad_nll).sub_(grad_loss * eps / vocab)
        at_target = (-(grad_loss * (1.0 - eps) + grad_nll)).reshape(1, 1).expand(target.size(0), 1)
        grad.scatter_add_(-1, target[:, None], at_target)
        return grad.to(ctx.dtype), None, None


BEFORE = 0  # the setting that runs WholeLogits
PEER = -1  # the setting that runs PyTorch's F.cross_entropy (the library primitive)


def forward_backward(logits: torch.Tensor, target: torch.Tensor, chunk_elements: int) -> torch.Tensor:
    leaf = logits.detach().requires_grad_()
    if chunk_elements == BEFORE:
        smoothed, nll = WholeLogits.apply(leaf, target, 0.1)
    elif chunk_elements == PEER:  # the same two sums from the library's loss, as autograd sees them
        x = leaf.float()
        smoothed = F.cross_entropy(x, target, label_smoothing=0.1, reduction="sum")
        nll = F.cross_entropy(x, target, reduction="sum")
    else:
        smoothed, nll = loss.label_smoothed_nll(leaf, target, 0.1, chunk_elements)
    (smoothed + nll).backward()
    return leaf.grad


def time_setting(logits, target, chunk_elements: int, reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        forward_backward(logits, target, chunk_elements)
    return (time.perf_counter() - start) / reps


def measure(dtype: torch.dtype, args: argparse.Namespace) -> dict:
    generator = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(args.tokens, args.vocab, generator=generator)).to(dtype)
    target = torch.randint(0, args.vocab, (args.tokens,), generator=generator)
    before = BEFORE
    settings = [before, PEER, *args.chunks]
    reference = forward_backward(logits, target, before).float()
    max_diff = {
        c: (forward_backward(logits, target, c).float() - reference).abs().max().item() for c in args.chunks
    }
    times: dict[int, list[float]] = {c: [] for c in settings}
    for i in range(args.rounds):
        shift = i % len(settings)
        for c in settings[shift:] + settings[:shift]:
            times[c].append(time_setting(logits, target, c, args.reps))
    rows = []
    for c in args.chunks:
        rows.append(
            {
                "chunk_elements": c,
                "rows_per_block": max(1, c // args.vocab),
                "ms": 1e3 * statistics.median(times[c]),
                "paired_before_over_blocks": statistics.median(
                    w / b for w, b in zip(times[before], times[c])
                ),
                "grad_max_abs_diff_vs_before": max_diff[c],
            }
        )
    shipped = loss.CHUNK_ELEMENTS
    peer_ratios = sorted(p / s for p, s in zip(times[PEER], times[shipped])) if shipped in times else []
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "before_ms": 1e3 * statistics.median(times[before]),
        "f_cross_entropy_ms": 1e3 * statistics.median(times[PEER]),
        "paired_f_cross_entropy_over_shipped": statistics.median(peer_ratios) if peer_ratios else None,
        "paired_f_cross_entropy_over_shipped_min_max": [peer_ratios[0], peer_ratios[-1]]
        if peer_ratios
        else None,
        "blocks": rows,
    }


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    shipped = loss.CHUNK_ELEMENTS
    results = []
    print(f"loss forward + backward, N={args.tokens}, V={args.vocab}, {args.threads} threads")
    for dtype in (torch.bfloat16, torch.float32):
        result = measure(dtype, args)
        results.append(result)
        print(f"{result['dtype']:9} before (whole logits) {result['before_ms']:7.1f} ms")
        if result["paired_f_cross_entropy_over_shipped"] is not None:
            low, high = result["paired_f_cross_entropy_over_shipped_min_max"]
            print(
                f"{'':9} F.cross_entropy      {result['f_cross_entropy_ms']:7.1f} ms"
                f"   F.cross_entropy/shipped {result['paired_f_cross_entropy_over_shipped']:.2f}x"
                f" [{low:.2f}-{high:.2f}]"
            )
        for row in result["blocks"]:
            print(
                f"{'':9} blocks of {row['chunk_elements']:>8} ({row['rows_per_block']:>4} rows) "
                f"{row['ms']:7.1f} ms"
                f"   before/blocks {row['paired_before_over_blocks']:.2f}x   grad max diff "
                f"{row['grad_max_abs_diff_vs_before']:.2g}"
                + ("   (shipped)" if row["chunk_elements"] == shipped else ""),
                flush=True,
            )
    Path(args.out).write_text(
        json.dumps(
            {
                "benchmark": "loss_chunks",
                "command": command(),
                "versions": versions(),
                "machine": machine(),
                "settings": {
                    "tokens": args.tokens,
                    "vocab": args.vocab,
                    "rounds": args.rounds,
                    "reps": args.reps,
                    "threads": args.threads,
                    "shipped_chunk_elements": shipped,
                },
                "results": results,
                "peak_rss_mib": peak_rss_mib(),
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
