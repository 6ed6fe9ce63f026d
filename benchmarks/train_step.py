"""Training-step speed: aiayn against ``torch.nn.Transformer`` of the same dimensions.

One training step = forward + backward + Adam step on a small configuration (d_model 256, 4 heads,
d_ff 1024, 3 + 3 layers, vocabularies 8000, batches of 64 sentences of up to 24 tokens), in fp32
and under bf16 autocast. Both models run in this one process on identical batches; after a warm-up
the repetitions are interleaved (the order alternates every round) so that load from other work on
the machine falls on both. Prints the median real (non-pad) target tokens per second and the ratio
aiayn / peer, and writes ``benchmarks/results/train_step.json``.

    .venv/bin/python benchmarks/train_step.py --precisions fp32 bf16 --threads 2

aiayn's step is what its trainer runs: ``Seq2SeqObjective`` (encode, decode, the generator on
non-pad target positions only, label-smoothed loss in fp32), summed loss / target tokens. The peer:
``nn.Transformer`` (post-norm, batch_first, with its final encoder/decoder LayerNorms) + token
embeddings × √d + sinusoidal positions + a bias-free ``Linear(256, 8000)`` generator (aiayn's has no
bias either), ``F.cross_entropy(label_smoothing=0.1, ignore_index=pad)`` in fp32 over all positions,
key-padding masks and a causal mask. Both: dropout 0.1 in training mode, no weight tying,
Adam(0.9, 0.98, eps 1e-9).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import aiayn
from aiayn.config import BOS_ID, EOS_ID, PAD_ID, TransformerConfig
from aiayn.model import build_model
from aiayn.model.embedding import positional_encoding
from aiayn.precision import autocast
from aiayn.train.loss import Seq2SeqObjective

ROOT = Path(__file__).resolve().parents[1]
DIMS = dict(d_model=256, n_heads=4, d_ff=1024, layers=3, vocab=8000, batch=64, max_len=24, min_len=12)
SMOOTHING, DROPOUT = 0.1, 0.1
CPU = torch.device("cpu")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds (fp32)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per model per round (fp32)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model before timing (fp32)")
    # Emulated bf16 (no AMX / AVX512-BF16) runs ~10x slower than fp32: fewer repetitions by default.
    parser.add_argument("--bf16-rounds", type=int, default=3)
    parser.add_argument("--bf16-steps", type=int, default=1)
    parser.add_argument("--bf16-warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "train_step.json"))
    return parser.parse_args()


# ----------------------------------------------------------------------------- data


def make_batches(n: int, generator: torch.Generator) -> list[tuple[Tensor, Tensor, Tensor]]:
    """``n`` batches (src, tgt_in, tgt_out), each ``(B, T)``, padded with 0 after a random length.

    Source: ``L_s`` tokens; target input: BOS + ``L_t - 1`` tokens; labels: the same tokens + EOS.
    """
    b, t, v = DIMS["batch"], DIMS["max_len"], DIMS["vocab"]
    batches = []
    for _ in range(n):
        src_len = torch.randint(DIMS["min_len"], t + 1, (b,), generator=generator)
        tgt_len = torch.randint(DIMS["min_len"], t + 1, (b,), generator=generator)  # incl. BOS / EOS
        tokens = torch.randint(4, v, (b, t), generator=generator)
        positions = torch.arange(t)[None, :]
        src = tokens.masked_fill(positions >= src_len[:, None], PAD_ID)
        words = torch.randint(4, v, (b, t), generator=generator)
        tgt_in = torch.where(positions < tgt_len[:, None], torch.roll(words, 1, dims=1), PAD_ID)
        tgt_in[:, 0] = BOS_ID
        tgt_out = torch.where(positions < (tgt_len - 1)[:, None], words, PAD_ID)
        tgt_out[torch.arange(b), tgt_len - 1] = EOS_ID
        batches.append((src, tgt_in, tgt_out))
    return batches


# ----------------------------------------------------------------------------- models


class PeerTransformer(nn.Module):
    """``nn.Transformer`` with embeddings × √d, sinusoidal positions and a generator."""

    def __init__(self) -> None:
        super().__init__()
        d, v = DIMS["d_model"], DIMS["vocab"]
        self.src_embed, self.tgt_embed = nn.Embedding(v, d, padding_idx=PAD_ID), nn.Embedding(v, d, padding_idx=PAD_ID)
        self.register_buffer("pe", positional_encoding(DIMS["max_len"], d), persistent=False)
        self.dropout = nn.Dropout(DROPOUT)
        self.transformer = nn.Transformer(d_model=d, nhead=DIMS["n_heads"], num_encoder_layers=DIMS["layers"],
                                          num_decoder_layers=DIMS["layers"], dim_feedforward=DIMS["d_ff"],
                                          dropout=DROPOUT, batch_first=True)
        self.generator = nn.Linear(d, v, bias=False)
        self.scale = math.sqrt(d)

    def embed(self, embedding: nn.Embedding, tokens: Tensor) -> Tensor:
        return self.dropout(embedding(tokens) * self.scale + self.pe[: tokens.size(1)])  # (B, T, D)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits ``(B, T, V)``; torch masks: True = may NOT attend."""
        src_pad, tgt_pad = src == PAD_ID, tgt_in == PAD_ID  # (B, S), (B, T)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), dtype=torch.bool)
        hidden = self.transformer(self.embed(self.src_embed, src), self.embed(self.tgt_embed, tgt_in),
                                  tgt_mask=causal, src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                                  memory_key_padding_mask=src_pad, tgt_is_causal=True)
        return self.generator(hidden)


def adam(model: nn.Module) -> torch.optim.Adam:
    return torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)


class Runner:
    """One model, its optimizer and its training step."""

    def __init__(self, name: str, model: nn.Module, loss_fn, precision: str) -> None:
        self.name, self.model, self.loss_fn, self.precision = name, model.train(), loss_fn, precision
        self.optimizer = adam(model)

    def step(self, batch: tuple[Tensor, Tensor, Tensor]) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(CPU, self.precision):
            loss = self.loss_fn(*batch)
        loss.backward()
        self.optimizer.step()
        return loss.item()


def make_runners(precision: str, seed: int) -> list[Runner]:
    torch.manual_seed(seed)
    config = TransformerConfig(src_vocab_size=DIMS["vocab"], tgt_vocab_size=DIMS["vocab"], d_model=DIMS["d_model"],
                               n_heads=DIMS["n_heads"], n_encoder_layers=DIMS["layers"],
                               n_decoder_layers=DIMS["layers"], d_ff=DIMS["d_ff"], dropout=DROPOUT)
    objective = Seq2SeqObjective(build_model(config), SMOOTHING, pad_id=PAD_ID)

    def aiayn_loss(src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        loss, _ = objective(src, tgt_in, tgt_out)
        return loss / (tgt_out != PAD_ID).sum()

    torch.manual_seed(seed)
    peer = PeerTransformer()

    def peer_loss(src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        logits = peer(src, tgt_in)  # (B, T, V)
        return F.cross_entropy(logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID,
                               label_smoothing=SMOOTHING)  # mean over non-pad positions

    return [Runner("aiayn", objective, aiayn_loss, precision), Runner("nn.Transformer", peer, peer_loss, precision)]


# ----------------------------------------------------------------------------- timing


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def bench_precision(precision: str, rounds: int, steps: int, warmup: int, args: argparse.Namespace,
                    batches) -> dict:
    runners = make_runners(precision, args.seed)
    cursor = {r.name: 0 for r in runners}

    def run(runner: Runner, steps: int) -> tuple[int, float, float]:
        tokens, loss, t0 = 0, 0.0, time.perf_counter()
        for _ in range(steps):
            batch = batches[cursor[runner.name] % len(batches)]
            cursor[runner.name] += 1
            loss = runner.step(batch)
            tokens += int((batch[2] != PAD_ID).sum())
        return tokens, time.perf_counter() - t0, loss

    for runner in runners:
        run(runner, warmup)
    samples: dict[str, list[float]] = {r.name: [] for r in runners}
    last_loss = {}
    for i in range(rounds):
        for runner in runners if i % 2 == 0 else runners[::-1]:
            tokens, seconds, last_loss[runner.name] = run(runner, steps)
            samples[runner.name].append(tokens / seconds)
        print(f"  {precision} round {i + 1}/{rounds}: "
              + "  ".join(f"{n} {s[-1]:,.0f} tok/s" for n, s in samples.items()), flush=True)
    medians = {n: statistics.median(s) for n, s in samples.items()}
    return {
        "rounds": rounds, "steps_per_round": steps, "warmup_steps": warmup,
        "target_tokens_per_s": {n: {"median": medians[n], "min": min(s), "max": max(s), "samples": s}
                                for n, s in samples.items()},
        "ratio_aiayn_over_peer": medians["aiayn"] / medians["nn.Transformer"],
        # per-round ratios pair samples taken seconds apart: more robust to load from other work
        "median_round_ratio": statistics.median(a / p for a, p in zip(samples["aiayn"], samples["nn.Transformer"])),
        "last_loss": last_loss,
        "parameters": {r.name: sum(p.numel() for p in r.model.parameters()) for r in runners},
        "peak_rss_mib_after": peak_rss_mib(),
    }


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return {"platform": platform.platform(), "cpu_model": model, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "amx_tile": bool(torch.cpu._is_amx_tile_supported()),
            "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported())}


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    batches = make_batches(4, torch.Generator().manual_seed(args.seed))
    real = [int((b[2] != PAD_ID).sum()) for b in batches]
    info = machine()
    print(f"{info['cpu_model']}, {info['cpu_count']} cores, {args.threads} threads, "
          f"native bf16: {info['amx_tile'] or info['avx512_bf16']}; "
          f"real target tokens per batch: {real} of {DIMS['batch'] * DIMS['max_len']}", flush=True)
    results = {
        "benchmark": "train_step",
        "command": "python " + shlex.join(["benchmarks/train_step.py", *sys.argv[1:]]),
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__, "aiayn": aiayn.__version__},
        "machine": info,
        "setup": {**DIMS, "dropout": DROPOUT, "label_smoothing": SMOOTHING, "batches": len(batches),
                  "real_target_tokens_per_batch": real, "seed": args.seed},
        "precisions": {},
    }
    for precision in args.precisions:
        reps = (args.rounds, args.steps, args.warmup) if precision == "fp32" else \
            (args.bf16_rounds, args.bf16_steps, args.bf16_warmup)
        results["precisions"][precision] = bench_precision(precision, *reps, args, batches)
    results["peak_rss_mib"] = peak_rss_mib()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    print(f"wrote {out}")


def print_table(results: dict) -> None:
    print(f"\n{'precision':<10}{'aiayn tok/s':>14}{'nn.Transformer tok/s':>22}{'ratio':>8}{'paired':>8}{'peak RSS MiB':>14}")
    for precision, row in results["precisions"].items():
        tps = row["target_tokens_per_s"]
        print(f"{precision:<10}{tps['aiayn']['median']:>14,.0f}{tps['nn.Transformer']['median']:>22,.0f}"
              f"{row['ratio_aiayn_over_peer']:>8.2f}{row['median_round_ratio']:>8.2f}{row['peak_rss_mib_after']:>14,.0f}")
    print("(median real target tokens/s; ratio = aiayn / nn.Transformer of the medians; paired = median of the\n"
          " per-round ratios; peak RSS of the whole process so far, both models)")


if __name__ == "__main__":
    main()
