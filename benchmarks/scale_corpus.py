"""A synthetic parallel corpus of N pairs, as varied as news text, from Multi30k's sentences.

    .venv/bin/python benchmarks/scale_corpus.py --pairs 1000000 --out /tmp/scale/corpus_1m

Multi30k has ~10k word types per language; news text of WMT14's size has millions. Each pair here
joins two random Multi30k pairs (``a b`` / ``a' b'``) and replaces each word, with probability
``--replace`` (0.3), by a word drawn from a pool of ``--pool`` (1M) made-up words of random letters,
picked with a Zipf-like law (a few frequent, a long tail), independently on each side. That gives a
type/token curve like news text (tens of thousands of types in the first 100k lines, millions over
the corpus), so SentencePiece's counting and merging are not flattered. Lines are ~2x Multi30k's.

Writes ``train.{src,tgt}`` (N pairs) and ``val.{src,tgt}`` (Multi30k's val unchanged) into ``--out``.
Seeded: the same arguments write the same bytes. The corpus is generated for a run and never committed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

MULTI30K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"
LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyzäöüéß"))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--replace", type=float, default=0.3, help="share of words replaced by pool words")
    parser.add_argument("--pool", type=int, default=1_000_000, help="made-up words to draw from")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--multi30k", type=Path, default=MULTI30K)
    return parser.parse_args()


def made_up_words(n: int, rng: np.random.Generator) -> list[str]:
    """``n`` distinct-ish words of 3 to 12 random letters."""
    lengths = rng.integers(3, 13, size=n)
    letters = LETTERS[rng.integers(0, len(LETTERS), size=int(lengths.sum()))]
    text = "".join(letters.tolist())
    ends = np.cumsum(lengths)
    return [text[end - length : end] for end, length in zip(ends.tolist(), lengths.tolist())]


class Side:
    """One language: Multi30k's sentences as word ids into a table of its words plus the pool."""

    def __init__(self, lines: list[str], pool: list[str]) -> None:
        words = sorted({w for line in lines for w in line.split()})
        self.table = np.array(words + pool, dtype=object)
        index = {w: i for i, w in enumerate(words)}
        self.sentences = [np.array([index[w] for w in line.split()], dtype=np.int64) for line in lines]
        self.n_own, self.n_pool = len(words), len(pool)

    def lines(self, picks: np.ndarray, rng: np.random.Generator, replace: float) -> list[str]:
        """One line per row of ``picks`` (two sentence numbers): the sentences joined, words replaced."""
        parts = [self.sentences[i] for pair in picks.tolist() for i in pair]
        lengths = np.array([len(p) for p in parts]).reshape(-1, 2).sum(axis=1)
        flat = np.concatenate(parts)
        swap = rng.random(len(flat)) < replace
        rank = np.minimum(rng.zipf(1.15, size=int(swap.sum())) - 1, self.n_pool - 1)
        flat[swap] = self.n_own + rank
        words = self.table[flat].tolist()
        ends = np.cumsum(lengths).tolist()
        return [" ".join(words[end - n : end]) for end, n in zip(ends, lengths.tolist())]


def write_corpus(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    src_lines = (args.multi30k / f"train.{args.src}").read_text(encoding="utf-8").splitlines()
    tgt_lines = (args.multi30k / f"train.{args.tgt}").read_text(encoding="utf-8").splitlines()
    src, tgt = (
        Side([s.strip() for s in lines], made_up_words(args.pool, rng)) for lines in (src_lines, tgt_lines)
    )
    args.out.mkdir(parents=True, exist_ok=True)
    chunk = 100_000
    with (
        open(args.out / f"train.{args.src}", "w") as s_file,
        open(args.out / f"train.{args.tgt}", "w") as t_file,
    ):
        for start in range(0, args.pairs, chunk):
            picks = rng.integers(0, len(src_lines), size=(min(chunk, args.pairs - start), 2))
            s_file.write("\n".join(src.lines(picks, rng, args.replace)) + "\n")
            t_file.write("\n".join(tgt.lines(picks, rng, args.replace)) + "\n")
    for lang in (args.src, args.tgt):
        (args.out / f"val.{lang}").write_bytes((args.multi30k / f"val.{lang}").read_bytes())


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    write_corpus(args)
    size = sum(f.stat().st_size for f in args.out.iterdir()) / 2**20
    print(f"wrote {args.pairs} pairs ({size:.0f} MiB) to {args.out} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
