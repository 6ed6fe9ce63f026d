"""How much longer BPE-dropout makes the Multi30k training sentences, and what re-segmenting costs.

Trains the joint 8k BPE tokenizer the en-de config trains (train split, seed 1), encodes the
training pairs, and re-segments them as one epoch of ``data.bpe_dropout`` does
(``EpochResampler``). Prints the mean pieces per sentence with all merges and with dropout, per
language, and the seconds per epoch (one thread); writes ``--results`` (JSON).

    python benchmarks/bpe_dropout_lengths.py --p 0.1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from aiayn.data.bpe_dropout import BpeDropout, EpochResampler
from aiayn.data.corpus import read_parallel
from aiayn.data.tokenizer import Tokenizer
from common import command, machine, versions

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--p", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument(
        "--results", default=str(ROOT / "benchmarks" / "results" / "bpe_dropout_lengths.json")
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    pairs, _ = read_parallel(Path(args.data_dir), "train", "en", "de")
    tokenizer = Tokenizer.train(
        [s for pair in pairs for s in pair], vocab_size=8000, model_type="bpe", seed=1
    )
    src = tokenizer.encode_batch([s for s, _ in pairs])
    tgt = tokenizer.encode_batch([t for _, t in pairs])
    resampler = EpochResampler(list(zip(src, tgt)), BpeDropout(tokenizer, args.p), seed=1)
    full = {"en": statistics.mean(map(len, src)), "de": statistics.mean(map(len, tgt))}
    seconds, dropped = [], {"en": [], "de": []}
    for epoch in range(args.epochs):
        start = time.perf_counter()
        examples = resampler(epoch)
        seconds.append(time.perf_counter() - start)
        dropped["en"].append(statistics.mean(len(s) for s, _ in examples))
        dropped["de"].append(statistics.mean(len(t) for _, t in examples))
    with_dropout = {lang: statistics.mean(v) for lang, v in dropped.items()}
    for lang in full:
        print(
            f"{lang}: {full[lang]:.2f} pieces per sentence with all merges, {with_dropout[lang]:.2f} with "
            f"p = {args.p} ({with_dropout[lang] / full[lang]:.2f}x)"
        )
    print(
        f"re-segmenting {len(pairs):,} pairs: median {statistics.median(seconds):.1f} s per epoch (1 thread)"
    )
    results = {
        "benchmark": "bpe_dropout_lengths",
        "command": command(),
        "versions": versions(),
        "machine": machine(),
        "p": args.p,
        "pairs": len(pairs),
        "pieces_full": full,
        "pieces_dropout": with_dropout,
        "seconds_per_epoch": seconds,
    }
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
