"""Training throughput: aiayn against ``torch.nn.Transformer`` and HuggingFace ``MarianMTModel``.

One training step = forward + backward + optimizer step on identical batches, for every model of
identical dimensions, in one process. After a warm-up the repetitions are interleaved (the order
alternates every round) so that load from other work falls on all. Prints the median real (non-pad)
target tokens/s, the ratio of aiayn to the faster peer, and model-FLOPs utilisation (MFU) against a
matmul peak measured in the same run (a square matmul of the same dtype), and writes
``benchmarks/results/train_throughput.json``.

    .venv/bin/python benchmarks/train_throughput.py                 # shapes a and b, fp32 and bf16
    .venv/bin/python benchmarks/train_throughput.py --shapes a --precisions fp32 --rounds 5

Shapes: (a) d=256, h=4, d_ff=1024, 3+3 layers, V=8000, batch 64×24; (b) the paper's base model
(d=512, h=8, d_ff=2048, 6+6 layers) with V=37000 at batch 32×32. Sentence lengths are uniform in
[T/2, T], so about a quarter of each batch is padding, as in unsorted batches.

The three steps, as each library's users write them:

* **aiayn** — what its trainer runs: ``Seq2SeqObjective`` (fused QKV projections, the generator and
  the label-smoothed loss on non-pad target positions only, loss in fp32, one fused loss backward).
  ``--compile`` adds a ``torch.compile``d variant.
* **nn.Transformer** — ``nn.Transformer`` (post-norm, batch_first) + embeddings × √d + sinusoidal
  positions + a bias-free generator, ``F.cross_entropy(label_smoothing=0.1, ignore_index=pad)`` in
  fp32 over all positions; no dropout inside the feed-forward or on attention weights (as aiayn).
* **Marian** — ``transformers.MarianMTModel`` (random init, post-norm, SDPA attention) with the
  same dimensions, the same cross-entropy on its logits.

All: dropout 0.1 on embeddings and sub-layer outputs, in training mode; no weight tying;
``torch.optim.Adam(betas=(0.9, 0.98), eps=1e-9, fused=True)`` (the optimizer is not what is
compared); bf16 through
``torch.autocast`` (aiayn's own autocast helper for aiayn).
The process keeps freed memory in glibc's heap as the ``aiayn`` command does (:mod:`aiayn.malloc`);
the setting is process-wide, so it applies to every model. The bound on oneDNN's per-shape caches
that aiayn's trainer sets for bf16 on a CPU is off here unless ``--onednn-caches bounded``: it slows
PyTorch's fused attention kernel (the peers' attention) several times, and these fixed batch shapes
do not need it.

Model FLOPs per step (for MFU) count the useful work only: 6 × (weights of the linear layers) per
real token (source tokens for the encoder, target tokens for the decoder and the generator) plus
12 × d × (attended length) per token and layer for each attention. The peers' extra work on padding
is not counted, for them either.

bf16 on a CPU without AMX / AVX512-BF16 is emulated (tens of times slower than fp32): there the
bf16 run of shape b is skipped unless ``--force-bf16`` is given, and the JSON says why.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, TransformerConfig
from aiayn.malloc import bound_onednn_caches, keep_freed_memory
from aiayn.model import build_model
from aiayn.model.embedding import positional_encoding
from aiayn.precision import autocast, native_bf16
from aiayn.train.loss import Seq2SeqObjective
from common import command, machine, peak_rss_mib, versions

ROOT = Path(__file__).resolve().parents[1]
SMOOTHING, DROPOUT = 0.1, 0.1
CPU = torch.device("cpu")
Batch = tuple[Tensor, Tensor, Tensor]


@dataclass(frozen=True)
class Shape:
    d_model: int
    n_heads: int
    d_ff: int
    layers: int
    vocab: int
    batch: int
    max_len: int


SHAPES = {"a": Shape(256, 4, 1024, 3, 8000, 64, 24), "b": Shape(512, 8, 2048, 6, 37000, 32, 32)}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["a", "b"])
    parser.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    parser.add_argument(
        "--peers", nargs="+", choices=("nn.Transformer", "Marian"), default=["nn.Transformer", "Marian"]
    )
    parser.add_argument("--compile", action="store_true", help="also time aiayn under torch.compile")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per model per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model before timing")
    # Emulated bf16 (no AMX / AVX512-BF16) runs tens of times slower than fp32: fewer repetitions there.
    parser.add_argument(
        "--emulated-bf16-reps",
        type=int,
        nargs=3,
        default=[3, 1, 1],
        metavar=("ROUNDS", "STEPS", "WARMUP"),
        help="rounds, steps and warm-up steps for bf16 where it is emulated",
    )
    parser.add_argument(
        "--force-bf16", action="store_true", help="run bf16 shape b even where bf16 is emulated"
    )
    parser.add_argument(
        "--onednn-caches",
        choices=("default", "bounded"),
        default="default",
        help="bounded: as aiayn's trainer sets them for bf16 on a CPU (aiayn.malloc.bound_onednn_caches)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "train_throughput.json"))
    return parser.parse_args()


# ----------------------------------------------------------------------------- data


def make_batches(shape: Shape, n: int, generator: torch.Generator) -> list[Batch]:
    """``n`` batches (src, tgt_in, tgt_out), each ``(B, T)``, padded with 0 after a random length."""
    b, t, v = shape.batch, shape.max_len, shape.vocab
    batches = []
    for _ in range(n):
        src_len = torch.randint(t // 2, t + 1, (b,), generator=generator)
        tgt_len = torch.randint(t // 2, t + 1, (b,), generator=generator)  # incl. BOS / EOS
        positions = torch.arange(t)[None, :]
        src = torch.randint(4, v, (b, t), generator=generator).masked_fill(
            positions >= src_len[:, None], PAD_ID
        )
        words = torch.randint(4, v, (b, t), generator=generator)
        tgt_in = torch.where(positions < tgt_len[:, None], torch.roll(words, 1, dims=1), PAD_ID)
        tgt_in[:, 0] = BOS_ID
        tgt_out = torch.where(positions < (tgt_len - 1)[:, None], words, PAD_ID)
        tgt_out[torch.arange(b), tgt_len - 1] = EOS_ID
        batches.append((src, tgt_in, tgt_out))
    return batches


def model_flops(shape: Shape, batch: Batch) -> float:
    """Useful training FLOPs of one step on ``batch`` (see the module docstring)."""
    src, _, tgt_out = batch
    d, f, n = shape.d_model, shape.d_ff, shape.layers
    src_len, tgt_len = (src != PAD_ID).sum(1).double(), (tgt_out != PAD_ID).sum(1).double()  # (B,)
    # per source token: the encoder layers, and the decoder's cross-attention K/V projections (2d²)
    encoder = (6 * n * (4 * d * d + 2 * d * f + 2 * d * d) + 12 * n * d * src_len) * src_len
    decoder = (
        6 * n * (6 * d * d + 2 * d * f) + 12 * n * d * (tgt_len / 2 + src_len) + 6 * d * shape.vocab
    ) * tgt_len
    return float((encoder + decoder).sum())


# ----------------------------------------------------------------------------- models


class PeerTransformer(nn.Module):
    """``nn.Transformer`` with embeddings × √d, sinusoidal positions and a generator."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        d, v = shape.d_model, shape.vocab
        self.src_embed, self.tgt_embed = (
            nn.Embedding(v, d, padding_idx=PAD_ID),
            nn.Embedding(v, d, padding_idx=PAD_ID),
        )
        self.register_buffer("pe", positional_encoding(shape.max_len, d), persistent=False)
        self.dropout = nn.Dropout(DROPOUT)
        self.transformer = nn.Transformer(
            d_model=d,
            nhead=shape.n_heads,
            num_encoder_layers=shape.layers,
            num_decoder_layers=shape.layers,
            dim_feedforward=shape.d_ff,
            dropout=DROPOUT,
            batch_first=True,
        )
        self.generator = nn.Linear(d, v, bias=False)
        self.scale = math.sqrt(d)
        for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
            layer.dropout = nn.Identity()  # dropout inside the feed-forward: aiayn and Marian have none
            for attention in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                if attention is not None:
                    attention.dropout = 0.0  # no dropout on attention weights either (as aiayn, Marian)

    def embed(self, embedding: nn.Embedding, tokens: Tensor) -> Tensor:
        return self.dropout(embedding(tokens) * self.scale + self.pe[: tokens.size(1)])  # (B, T, D)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits ``(B, T, V)``; torch masks: True = may NOT attend."""
        src_pad, tgt_pad = src == PAD_ID, tgt_in == PAD_ID  # (B, S), (B, T)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), dtype=torch.bool)
        hidden = self.transformer(
            self.embed(self.src_embed, src),
            self.embed(self.tgt_embed, tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )
        return self.generator(hidden)


def marian(shape: Shape) -> nn.Module:
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=shape.vocab,
        decoder_vocab_size=shape.vocab,
        d_model=shape.d_model,
        encoder_layers=shape.layers,
        decoder_layers=shape.layers,
        encoder_attention_heads=shape.n_heads,
        decoder_attention_heads=shape.n_heads,
        encoder_ffn_dim=shape.d_ff,
        decoder_ffn_dim=shape.d_ff,
        activation_function="relu",
        dropout=DROPOUT,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=max(shape.max_len, 64),
        scale_embedding=True,
        share_encoder_decoder_embeddings=False,
        tie_word_embeddings=False,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
    )
    return MarianMTModel(config)


def cross_entropy(logits: Tensor, tgt_out: Tensor) -> Tensor:
    """The peers' loss: label-smoothed cross-entropy in fp32 over all positions, pad ignored."""
    return F.cross_entropy(
        logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID, label_smoothing=SMOOTHING
    )


class Runner:
    """One model, its optimizer and its training step."""

    def __init__(self, name: str, model: nn.Module, loss_fn: Callable[..., Tensor], precision: str) -> None:
        self.name, self.model, self.loss_fn, self.precision = name, model.train(), loss_fn, precision
        # fused Adam for every model: aiayn's trainer uses it, and any user of a peer can ask for it
        self.optimizer = torch.optim.Adam(
            model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True
        )

    def step(self, batch: Batch) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(CPU, self.precision):
            loss = self.loss_fn(*batch)
        loss.backward()
        self.optimizer.step()
        return loss.item()


def make_runners(shape: Shape, precision: str, args: argparse.Namespace) -> list[Runner]:
    runners = []
    for compiled in (False, True) if args.compile else (False,):
        torch.manual_seed(args.seed)
        config = TransformerConfig(
            src_vocab_size=shape.vocab,
            tgt_vocab_size=shape.vocab,
            d_model=shape.d_model,
            n_heads=shape.n_heads,
            n_encoder_layers=shape.layers,
            n_decoder_layers=shape.layers,
            d_ff=shape.d_ff,
            dropout=DROPOUT,
        )
        objective = Seq2SeqObjective(build_model(config), SMOOTHING, pad_id=PAD_ID)
        if compiled:
            objective.compile(dynamic=False)

        def aiayn_loss(src: Tensor, tgt_in: Tensor, tgt_out: Tensor, objective=objective) -> Tensor:
            loss, _ = objective(src, tgt_in, tgt_out)
            return loss / (tgt_out != PAD_ID).sum()

        runners.append(Runner("aiayn+compile" if compiled else "aiayn", objective, aiayn_loss, precision))
    if "nn.Transformer" in args.peers:
        torch.manual_seed(args.seed)
        peer = PeerTransformer(shape)
        runners.append(
            Runner("nn.Transformer", peer, lambda s, ti, to: cross_entropy(peer(s, ti), to), precision)
        )
    if "Marian" in args.peers:
        torch.manual_seed(args.seed)
        hf = marian(shape)

        def hf_loss(src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
            out = hf(
                input_ids=src,
                attention_mask=src != PAD_ID,
                decoder_input_ids=tgt_in,
                decoder_attention_mask=tgt_in != PAD_ID,
                use_cache=False,
            )
            return cross_entropy(out.logits, tgt_out)

        runners.append(Runner("Marian", hf, hf_loss, precision))
    return runners


# ----------------------------------------------------------------------------- timing


def matmul_peak(dtype: torch.dtype, n: int) -> float:
    """FLOP/s of an ``n × n`` matmul in ``dtype`` (best of a few), the MFU denominator."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def bench(
    shape: Shape,
    precision: str,
    args: argparse.Namespace,
    batches: list[Batch],
    peak: float | None,
    reps: tuple[int, int, int],
) -> dict:
    rounds, steps, warmup = reps
    runners = make_runners(shape, precision, args)
    cursor = {r.name: 0 for r in runners}

    def run(runner: Runner, steps: int) -> tuple[int, float, float, float]:
        tokens, flops, loss, t0 = 0, 0.0, 0.0, time.perf_counter()
        for _ in range(steps):
            batch = batches[cursor[runner.name] % len(batches)]
            cursor[runner.name] += 1
            loss = runner.step(batch)
            tokens += int((batch[2] != PAD_ID).sum())
            flops += model_flops(shape, batch)
        return tokens, flops, time.perf_counter() - t0, loss

    for runner in runners:  # a compiled model sees every batch shape before timing (one compile each)
        run(runner, max(warmup, len(batches)) if runner.name.endswith("compile") else warmup)
    samples: dict[str, list[float]] = {r.name: [] for r in runners}
    flop_rates: dict[str, list[float]] = {r.name: [] for r in runners}
    last_loss = {}
    for i in range(rounds):
        for runner in runners if i % 2 == 0 else runners[::-1]:
            tokens, flops, seconds, last_loss[runner.name] = run(runner, steps)
            samples[runner.name].append(tokens / seconds)
            flop_rates[runner.name].append(flops / seconds)
        print(
            f"  {precision} round {i + 1}/{rounds}: "
            + "  ".join(f"{n} {s[-1]:,.0f}" for n, s in samples.items())
            + " tok/s",
            flush=True,
        )
    return {
        "rounds": rounds,
        "steps_per_round": steps,
        "warmup_steps": warmup,
        **summarise(runners, samples, flop_rates, peak, last_loss),
    }


def summarise(
    runners: list[Runner], samples: dict, flop_rates: dict, peak: float | None, last_loss: dict
) -> dict:
    medians = {n: statistics.median(s) for n, s in samples.items()}
    peers = [n for n in medians if not n.startswith("aiayn")]
    result = {
        "target_tokens_per_s": {
            n: {"median": medians[n], "min": min(s), "max": max(s), "samples": s} for n, s in samples.items()
        },
        "mfu": {n: statistics.median(r) / peak if peak else None for n, r in flop_rates.items()},
        "model_tflops_per_s": {n: statistics.median(r) / 1e12 for n, r in flop_rates.items()},
        "last_loss": last_loss,
        "parameters": {r.name: sum(p.numel() for p in r.model.parameters()) for r in runners},
        "peak_rss_mib_after": peak_rss_mib(),
    }
    if peers:
        faster = max(peers, key=medians.get)
        result["faster_peer"] = faster
        result["ratio_aiayn_over_faster_peer"] = medians["aiayn"] / medians[faster]
        # per-round ratios pair samples taken seconds apart: more robust to load from other work
        result["paired_ratio_aiayn_over_faster_peer"] = statistics.median(
            a / p for a, p in zip(samples["aiayn"], samples[faster])
        )
    return result


def main() -> None:
    args = parse_args()
    # process-wide settings, made before the first tensor (see the module docstring)
    process = {
        "freed_memory_kept": keep_freed_memory(),
        "onednn_caches": args.onednn_caches,
        "onednn_caches_set": bound_onednn_caches() if args.onednn_caches == "bounded" else {},
    }
    torch.set_num_threads(args.threads)
    info = machine()
    native = native_bf16(CPU)
    print(
        f"{info['cpu_model']}, {info['cpu_count']} cores, {args.threads} threads, native bf16: {native}",
        flush=True,
    )
    # Emulated bf16 has no meaningful peak (its matmul speed depends on the shape's code path, and a
    # model step ran faster per FLOP than a square matmul): no MFU there.
    peaks = {
        "fp32": matmul_peak(torch.float32, 2048),
        "bf16": matmul_peak(torch.bfloat16, 2048) if native and "bf16" in args.precisions else None,
    }
    print(
        "matmul peak: " + ", ".join(f"{k} {v / 1e9:,.1f} GFLOP/s" for k, v in peaks.items() if v), flush=True
    )
    results = {
        "benchmark": "train_throughput",
        "command": command(),
        "versions": versions(**peer_versions()),
        "machine": {**info, "native_bf16": native},
        "process": process,
        "matmul_peak_flops": peaks,
        "settings": {"dropout": DROPOUT, "label_smoothing": SMOOTHING, "seed": args.seed},
        "shapes": {},
    }
    for name in args.shapes:
        shape = SHAPES[name]
        batches = make_batches(shape, 4, torch.Generator().manual_seed(args.seed))
        entry = results["shapes"][name] = {
            "shape": asdict(shape),
            "precisions": {},
            "real_target_tokens_per_batch": [int((b[2] != PAD_ID).sum()) for b in batches],
        }
        for precision in args.precisions:
            if precision == "bf16" and name == "b" and not native and not args.force_bf16:
                entry["precisions"][precision] = {
                    "skipped": "bf16 is emulated on this CPU (no AMX / AVX512-BF16); --force-bf16 runs it"
                }
                continue
            print(f"shape {name} {asdict(shape)}, {precision}", flush=True)
            emulated = precision == "bf16" and not native
            reps = tuple(args.emulated_bf16_reps) if emulated else (args.rounds, args.steps, args.warmup)
            entry["precisions"][precision] = bench(shape, precision, args, batches, peaks[precision], reps)
    results["peak_rss_mib"] = peak_rss_mib()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    print(f"wrote {out}")


def peer_versions() -> dict:
    try:
        import transformers
    except ImportError:
        return {}
    return {"transformers": transformers.__version__}


def print_table(results: dict) -> None:
    print(f"\n{'shape':<6}{'prec':<6}{'system':<16}{'tok/s':>10}{'MFU':>8}  vs faster peer")
    for name, entry in results["shapes"].items():
        for precision, row in entry["precisions"].items():
            if "skipped" in row:
                print(f"{name:<6}{precision:<6}skipped: {row['skipped']}")
                continue
            for system, tps in row["target_tokens_per_s"].items():
                ratio = ""
                if system == "aiayn" and "faster_peer" in row:
                    ratio = (
                        f"{row['ratio_aiayn_over_faster_peer']:.2f}x {row['faster_peer']} "
                        f"(paired {row['paired_ratio_aiayn_over_faster_peer']:.2f}x)"
                    )
                mfu = row["mfu"][system]
                mfu_text = f"{mfu:.1%}" if mfu is not None else "n/a"
                print(f"{name:<6}{precision:<6}{system:<16}{tps['median']:>10,.0f}{mfu_text:>8}  {ratio}")
    print(
        "(median real target tokens/s; MFU = useful model FLOP/s / the same-dtype matmul peak of this run;\n"
        " n/a where bf16 is emulated)"
    )


if __name__ == "__main__":
    main()
