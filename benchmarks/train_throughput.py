"""Training throughput: aiayn against ``torch.nn.Transformer`` and HuggingFace ``MarianMTModel``.

One training step = forward + backward + optimizer step on identical batches, for every model of
identical dimensions, in one process. After a warm-up the repetitions are interleaved (the order
alternates every round) so that load from other work falls on all. Prints the median real (non-pad)
target tokens/s, the ratio of aiayn to the faster peer, and model-FLOPs utilisation (MFU) against a
matmul peak measured in the same run (a square matmul of the same dtype), and writes
``benchmarks/results/train_throughput.json``.

    .venv/bin/python benchmarks/train_throughput.py                 # shapes a and b, fp32 and bf16
    .venv/bin/python benchmarks/train_throughput.py --shapes a --precisions fp32 --rounds 5
    python3 benchmarks/train_throughput.py --device cuda --shapes base big --precisions bf16 \
        --batch-tokens 25000 --max-len 64          # on a GPU: the paper's batches

Shapes: (a) d=256, h=4, d_ff=1024, 3+3 layers, V=8000, batch 64×24; (b) or ``base``, the paper's base
model (d=512, h=8, d_ff=2048, 6+6 layers) with V=37000 at batch 32×32; ``big``, the paper's big model
(d=1024, h=16, d_ff=4096, 6+6 layers, V=37000) at batch 32×32; ``tiny`` (d=64, 1+1 layers, V=1000), a
rehearsal of the flow only. Sentence lengths are uniform in [T/2, T], so about a quarter of each
batch is padding, as in unsorted batches. ``--max-len T`` sets every shape's T; ``--batch-tokens N``
sets every shape's batch size so that a batch holds about N real target tokens (the mean length is
(T//2 + T)/2 ≈ 0.75·T): the paper's WMT batches held ~25,000 source and ~25,000 target tokens.

On a GPU (``--device cuda``): models and batches on the device, bf16 through the same autocast,
``torch.cuda.synchronize()`` before every clock reading, the matmul peak measured on the device
(8192×8192; fp32 with PyTorch's default, TF32 off), ``--threads`` ignored. The JSON then also holds the
GPU (``machine.gpu``), each model's peak CUDA memory, MFU against the card's datasheet peak (H100 /
H200: SXM figures, dense bf16 989.4 TFLOP/s and fp32 66.9 TFLOP/s; ``null`` for other cards) beside
the measured one, and the hours that the paper's 100k steps of ~25,000 target tokens would take at the
measured rate (with the paper's own figures for reference). Default output:
``benchmarks/results/train_throughput_gpu.json``.

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
import gc
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, replace
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
from common import command, gpu, machine, peak_rss_mib, versions

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


SHAPES = {
    "a": Shape(256, 4, 1024, 3, 8000, 64, 24),
    "b": Shape(512, 8, 2048, 6, 37000, 32, 32),
    "big": Shape(1024, 16, 4096, 6, 37000, 32, 32),
    "tiny": Shape(64, 4, 128, 1, 1000, 8, 16),
}
SHAPES["base"] = SHAPES["b"]  # the paper's base model, under its name
# The paper's training (section 5.2 and Table 3): batches of ~25,000 source and ~25,000 target tokens,
# 8 P100 GPUs; base 100k steps in 12 hours, big 300k steps in 3.5 days.
PAPER = {
    "target_tokens_per_step": 25000,
    "hardware": "8 NVIDIA P100",
    "base": {"steps": 100000, "hours": 12.0},
    "big": {"steps": 300000, "hours": 3.5 * 24},
}
PAPER_STEPS = {"b": 100000, "base": 100000, "big": 300000}
# Datasheet peaks (dense, no sparsity) of the cards named by substring, in FLOP/s: (bf16, fp32 without
# tensor cores). The H100 PCIe and NVL are slower than the SXM boards that "H100" names otherwise.
SPEC_PEAKS = (
    ("H100 PCIe", {"bf16": 756.5e12, "fp32": 51.2e12}),
    ("H100 NVL", {"bf16": 835.5e12, "fp32": 60.0e12}),
    ("H100", {"bf16": 989.4e12, "fp32": 66.9e12}),
    ("H200", {"bf16": 989.4e12, "fp32": 66.9e12}),
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["a", "b"])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--batch-tokens",
        type=int,
        default=0,
        help="set each shape's batch size for about this many real target tokens per batch (0: the shape's)",
    )
    parser.add_argument("--max-len", type=int, default=0, help="every shape's T (0: the shape's)")
    parser.add_argument(
        "--skip",
        nargs="+",
        default=[],
        metavar="SHAPE:PRECISION",
        help="leave out these runs of --shapes x --precisions, e.g. big:fp32",
    )
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
    parser.add_argument("--threads", type=int, default=2, help="torch threads on the CPU (ignored on cuda)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        help="results file (default benchmarks/results/train_throughput.json, _gpu.json with --device cuda)",
    )
    args = parser.parse_args()
    if args.out is None:
        name = "train_throughput_gpu.json" if args.device == "cuda" else "train_throughput.json"
        args.out = str(ROOT / "benchmarks" / "results" / name)
    return args


def sized(shape: Shape, batch_tokens: int, max_len: int) -> Shape:
    """``shape`` with ``max_len`` (when > 0) and a batch of about ``batch_tokens`` real target tokens
    (when > 0): lengths are uniform in [T//2, T], so a sentence holds (T//2 + T)/2 tokens on average."""
    t = max_len or shape.max_len
    batch = round(batch_tokens / ((t // 2 + t) / 2)) if batch_tokens else shape.batch
    return replace(shape, max_len=t, batch=max(1, batch))


def spec_peaks(device: torch.device) -> tuple[str | None, dict | None]:
    """The datasheet peaks of the card (by name; see SPEC_PEAKS), or (None, None) for others."""
    if not on_gpu(device):
        return None, None
    name = torch.cuda.get_device_name(device)
    for key, peaks in SPEC_PEAKS:
        if key in name:
            return key, peaks
    return None, None


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
        causal = nn.Transformer.generate_square_subsequent_mask(
            tgt_in.size(1), device=tgt_in.device, dtype=torch.bool
        )
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
    """One model (moved to ``device``), its optimizer and its training step."""

    def __init__(
        self,
        name: str,
        model: nn.Module,
        loss_fn: Callable[..., Tensor],
        precision: str,
        device: torch.device = CPU,
    ) -> None:
        self.name, self.model, self.loss_fn = name, model.to(device).train(), loss_fn
        self.precision, self.device = precision, device
        # fused Adam for every model: aiayn's trainer uses it, and any user of a peer can ask for it
        self.optimizer = torch.optim.Adam(
            model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True
        )

    def step(self, batch: Batch) -> Tensor:
        """One training step; the loss, detached (read it after the timed steps: ``.item()`` waits
        for the GPU)."""
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.device, self.precision):
            loss = self.loss_fn(*batch)
        loss.backward()
        self.optimizer.step()
        return loss.detach()


def make_runners(shape: Shape, precision: str, args: argparse.Namespace) -> list[Runner]:
    device = torch.device(args.device)
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

        name = "aiayn+compile" if compiled else "aiayn"
        runners.append(Runner(name, objective, aiayn_loss, precision, device))
    if "nn.Transformer" in args.peers:
        torch.manual_seed(args.seed)
        peer = PeerTransformer(shape)
        runners.append(
            Runner(
                "nn.Transformer", peer, lambda s, ti, to: cross_entropy(peer(s, ti), to), precision, device
            )
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

        runners.append(Runner("Marian", hf, hf_loss, precision, device))
    return runners


# ----------------------------------------------------------------------------- timing


def on_gpu(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA device (one place to ask, for the GPU-only steps)."""
    return device.type == "cuda"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU): before every clock reading."""
    if on_gpu(device):
        torch.cuda.synchronize(device)


def matmul_peak(dtype: torch.dtype, n: int, device: torch.device = CPU) -> float:
    """FLOP/s of an ``n × n`` matmul in ``dtype`` (best of a few), the MFU denominator. On a GPU each
    timing covers 10 matmuls between two synchronisations (one takes a millisecond or two)."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    repeat = 10 if on_gpu(device) else 1
    for _ in range(repeat):
        a @ b
    best = math.inf
    for _ in range(3):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(repeat):
            a @ b
        synchronize(device)
        best = min(best, (time.perf_counter() - t0) / repeat)
    return 2 * n**3 / best


def mib(n_bytes: int) -> float:
    return n_bytes / 2**20


def bench(
    shape: Shape,
    precision: str,
    args: argparse.Namespace,
    batches: list[Batch],
    peak: float | None,
    reps: tuple[int, int, int],
    spec_peak: float | None = None,
) -> dict:
    rounds, steps, warmup = reps
    device = torch.device(args.device)
    runners = make_runners(shape, precision, args)
    cursor = {r.name: 0 for r in runners}
    # counted once on the CPU copies (on a GPU, counting in the timed loop would wait for the device)
    counts = [(int((b[2] != PAD_ID).sum()), model_flops(shape, b)) for b in batches]
    on_device = [tuple(t.to(device) for t in b) for b in batches]
    cuda = on_gpu(device)
    memory = {r.name: {"resident_mib": 0.0, "peak_allocated_mib": 0.0} for r in runners}

    def run(runner: Runner, steps: int) -> tuple[int, float, float, float]:
        tokens, flops, loss = 0, 0.0, None
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            resident = torch.cuda.memory_allocated(device)
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            i = cursor[runner.name] % len(batches)
            cursor[runner.name] += 1
            loss = runner.step(on_device[i])
            tokens += counts[i][0]
            flops += counts[i][1]
        synchronize(device)
        seconds = time.perf_counter() - t0
        if cuda:
            m = memory[runner.name]
            m["resident_mib"] = max(m["resident_mib"], mib(resident))
            m["peak_allocated_mib"] = max(
                m["peak_allocated_mib"], mib(torch.cuda.max_memory_allocated(device))
            )
        return tokens, flops, seconds, float(loss) if loss is not None else math.nan

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
    result = {
        "rounds": rounds,
        "steps_per_round": steps,
        "warmup_steps": warmup,
        **summarise(runners, samples, flop_rates, peak, last_loss),
    }
    for runner in runners:
        if runner.name == "Marian":  # which attention transformers chose (sdpa where it can)
            result["marian_attn_implementation"] = runner.model.config._attn_implementation
    if spec_peak:
        result["mfu_spec"] = {n: statistics.median(r) / spec_peak for n, r in flop_rates.items()}
    if cuda:
        # process-wide while the model's steps ran: the other models' weights and Adam moments
        # (resident) are in it; the model's own step needs peak - resident beyond what it keeps
        result["cuda_memory"] = memory
    return result


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
    device = torch.device(args.device)
    # process-wide settings, made before the first tensor (see the module docstring)
    process = {
        "freed_memory_kept": keep_freed_memory(),
        "onednn_caches": args.onednn_caches,
        "onednn_caches_set": bound_onednn_caches() if args.onednn_caches == "bounded" else {},
    }
    if not on_gpu(device):
        torch.set_num_threads(args.threads)
    info = machine()
    native = native_bf16(device)
    card = gpu(device) if on_gpu(device) else None
    if card is not None:
        print(
            f"{card['name']}, {card['memory_gib']:.0f} GiB, CUDA {card['torch_cuda']}, "
            f"torch {torch.__version__}",
            flush=True,
        )
    else:
        print(
            f"{info['cpu_model']}, {info['cpu_count']} cores, {args.threads} threads, native bf16: {native}",
            flush=True,
        )
    # Emulated bf16 has no meaningful peak (its matmul speed depends on the shape's code path, and a
    # model step ran faster per FLOP than a square matmul): no MFU there.
    n = 8192 if on_gpu(device) else 2048
    peaks = {
        "fp32": matmul_peak(torch.float32, n, device)
        if "fp32" in args.precisions or not on_gpu(device)
        else None,
        "bf16": matmul_peak(torch.bfloat16, n, device) if native and "bf16" in args.precisions else None,
    }
    print(
        "matmul peak: " + ", ".join(f"{k} {v / 1e9:,.1f} GFLOP/s" for k, v in peaks.items() if v), flush=True
    )
    spec_name, spec = spec_peaks(device)
    results = {
        "benchmark": "train_throughput",
        "command": command(),
        "versions": versions(**peer_versions()),
        "machine": {**info, "native_bf16": native, **({"gpu": card} if card is not None else {})},
        "process": process,
        "matmul_peak_flops": peaks,
        "settings": {"dropout": DROPOUT, "label_smoothing": SMOOTHING, "seed": args.seed},
        "shapes": {},
    }
    if on_gpu(device):
        results["device"] = args.device
        results["matmul_peak_size"] = n
        results["spec_peak_flops"] = spec
        results["spec_peak_card"] = spec_name
        results["paper"] = PAPER
        results["settings"].update(batch_tokens=args.batch_tokens, max_len=args.max_len)
    for name in args.shapes:
        shape = sized(SHAPES[name], args.batch_tokens, args.max_len)
        batches = make_batches(shape, 4, torch.Generator().manual_seed(args.seed))
        entry = results["shapes"][name] = {
            "shape": asdict(shape),
            "precisions": {},
            "real_target_tokens_per_batch": [int((b[2] != PAD_ID).sum()) for b in batches],
        }
        for precision in args.precisions:
            if f"{name}:{precision}" in args.skip:
                entry["precisions"][precision] = {"skipped": f"--skip {name}:{precision}"}
                continue
            if precision == "bf16" and name in ("b", "base", "big") and not native and not args.force_bf16:
                entry["precisions"][precision] = {
                    "skipped": "bf16 is emulated on this CPU (no AMX / AVX512-BF16); --force-bf16 runs it"
                }
                continue
            print(f"shape {name} {asdict(shape)}, {precision}", flush=True)
            emulated = precision == "bf16" and not native
            reps = tuple(args.emulated_bf16_reps) if emulated else (args.rounds, args.steps, args.warmup)
            spec_peak = spec[precision] if spec else None
            if not on_gpu(device):
                row = bench(shape, precision, args, batches, peaks[precision], reps)
            else:  # one failure (out of memory, a peer's error) is recorded, the next run goes on
                try:
                    row = bench(shape, precision, args, batches, peaks[precision], reps, spec_peak)
                except Exception as error:  # noqa: BLE001 - recorded in the results, not hidden
                    print(f"  failed: {error!r}", flush=True)
                    row = {"error": repr(error)[:2000]}
                gc.collect()
                torch.cuda.empty_cache()
                if "error" not in row:
                    row["implied_hours_paper_100k_steps"] = {
                        system: 100000 * PAPER["target_tokens_per_step"] / tps["median"] / 3600
                        for system, tps in row["target_tokens_per_s"].items()
                    }
                    if PAPER_STEPS.get(name, 100000) != 100000:
                        steps = PAPER_STEPS[name]
                        row[f"implied_hours_paper_{steps // 1000}k_steps"] = {
                            system: steps * PAPER["target_tokens_per_step"] / tps["median"] / 3600
                            for system, tps in row["target_tokens_per_s"].items()
                        }
            entry["precisions"][precision] = row
            if on_gpu(device):  # after every run: a later failure or a kill keeps what was measured
                write(results, Path(args.out))
    results["peak_rss_mib"] = peak_rss_mib()
    out = Path(args.out)
    write(results, out)
    print_table(results)
    print(f"wrote {out}")


def write(results: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


def peer_versions() -> dict:
    try:
        import transformers
    except ImportError:
        return {}
    return {"transformers": transformers.__version__}


def print_table(results: dict) -> None:
    gpu_run = "spec_peak_flops" in results
    extra = f"{'MFU spec':>9}{'h/100k':>8}" if gpu_run else ""
    print(f"\n{'shape':<6}{'prec':<6}{'system':<16}{'tok/s':>10}{'MFU':>8}{extra}  vs faster peer")
    for name, entry in results["shapes"].items():
        for precision, row in entry["precisions"].items():
            if "skipped" in row or "error" in row:
                print(
                    f"{name:<6}{precision:<6}{'skipped' if 'skipped' in row else 'failed'}: "
                    f"{row.get('skipped') or row.get('error')}"
                )
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
                columns = f"{tps['median']:>10,.0f}{mfu_text:>8}"
                if gpu_run:
                    spec = row.get("mfu_spec", {}).get(system)
                    hours = row["implied_hours_paper_100k_steps"][system]
                    columns += (f"{spec:>9.1%}" if spec is not None else f"{'n/a':>9}") + f"{hours:>8.1f}"
                print(f"{name:<6}{precision:<6}{system:<16}{columns}  {ratio}")
    print(
        "(median real target tokens/s; MFU = useful model FLOP/s / the same-dtype matmul peak of this run;\n"
        " n/a where bf16 is emulated"
        + (
            "; MFU spec = against the card's datasheet peak; h/100k = hours for the paper's\n"
            " 100k steps of 25,000 target tokens at this rate (the paper: base 12 h on 8 P100s))"
            if gpu_run
            else ")"
        )
    )


if __name__ == "__main__":
    main()
