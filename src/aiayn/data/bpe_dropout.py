"""BPE-dropout (Provilkov et al., 2020): a new segmentation of the training data every epoch.

BPE segments a word by merging, again and again, the adjacent pair of symbols whose merge ranks
highest. BPE-dropout skips each merge it is about to apply with probability ``p``; a skipped pair
stays skipped (a new pair forms only when one of its symbols grows), and the next-ranked pair is
tried. So a word comes out in smaller pieces now and then, and the model learns the pieces that
full BPE hides. Decoding uses all merges (``p = 0``), as in the paper.

This re-implements SentencePiece's BPE encoder (``bpe_model.cc``: symbols are characters, pairs
ranked by the merged piece's score, ties to the left) rather than calling its sampling mode,
because SentencePiece's sampling cannot be seeded here: the same seed gave other segmentations in
every process, which would break exact resume and make DDP ranks disagree. With ``p = 0`` this
encoder gives SentencePiece's pieces exactly (tested on Multi30k), and with ``p > 0`` its average
lengths match SentencePiece's own BPE-dropout.

It works on the ids of the full segmentation: a word is a run of pieces that starts at a piece
with the word-boundary mark ``▁``. Words holding byte-fallback or unknown pieces keep their ids.
"""

from __future__ import annotations

import random
from typing import Sequence

from aiayn.data.tokenizer import Tokenizer

WORD_MARK = "\u2581"  # SentencePiece's "▁": a piece that starts a word
Example = tuple[list[int], list[int]]


class BpeDropout:
    """Sample BPE-dropout segmentations with a SentencePiece BPE ``tokenizer``'s merges."""

    def __init__(self, tokenizer: Tokenizer, p: float) -> None:
        if not 0 <= p < 1:
            raise ValueError(f"BPE-dropout p must be in [0, 1), got {p}")
        self.p = p
        self._ids = tokenizer.merge_ranks()  # piece -> id of every piece a merge can make
        self._score = {piece: score for piece, (_, score) in self._ids.items()}
        self._words: dict[
            tuple[int, ...], list[str] | None
        ] = {}  # ids -> the word's characters (None: keep ids)
        self._piece = tokenizer.id_to_piece

    def words(self, ids: Sequence[int]) -> list[tuple[int, ...]]:
        """``ids`` cut into words: each starts at a piece with ``▁`` (the first may lack one)."""
        words, current = [], []
        for i in ids:
            if current and self._piece(i).startswith(WORD_MARK):
                words.append(tuple(current))
                current = []
            current.append(i)
        if current:
            words.append(tuple(current))
        return words

    def sample(self, ids: Sequence[int], rng: random.Random) -> list[int]:
        """A BPE-dropout segmentation of the text whose full segmentation is ``ids``."""
        out: list[int] = []
        for word in self.words(ids):
            chars = self._chars(word)
            out.extend(word if chars is None else (self._ids[s][0] for s in self.segment(chars, rng)))
        return out

    def _chars(self, word: tuple[int, ...]) -> list[str] | None:
        if word not in self._words:
            chars = list("".join(self._piece(i) for i in word))
            self._words[word] = chars if all(c in self._ids for c in chars) else None
        return self._words[word]

    def segment(self, chars: Sequence[str], rng: random.Random | None = None) -> list[str]:
        """Merge ``chars`` as SentencePiece's BPE does, skipping each merge with probability p."""
        symbols, skipped, score = list(chars), set(), self._score
        while len(symbols) > 1:
            best, best_score, start = None, 0.0, 0
            for i in range(len(symbols) - 1):
                merged = symbols[i] + symbols[i + 1]
                s = score.get(merged)
                if s is not None and (best is None or s > best_score):
                    key = (start, len(merged), len(symbols[i]))  # this pair, until one of its symbols grows
                    if key not in skipped:
                        best, best_score = (i, key), s
                start += len(symbols[i])
            if best is None:
                break
            if self.p and rng.random() < self.p:
                skipped.add(best[1])
                continue
            i = best[0]
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        return symbols


class EpochResampler:
    """The training examples of each epoch under BPE-dropout, for ``TokenBatchSampler(resample=...)``.

    ``resampler(epoch)`` segments every example anew from a generator seeded with ``(seed, epoch)``:
    the same epoch gets the same examples in every process and after a resume. An example whose
    sample is longer than the longest full-merge example keeps its full-merge ids, so the batch-size
    check made on ``examples`` holds in every epoch.
    """

    def __init__(self, examples: Sequence[Example], dropout: BpeDropout, seed: int) -> None:
        self.examples, self.dropout, self.seed = examples, dropout, seed
        self.cap = max((max(len(s), len(t)) for s, t in examples), default=0)

    def __call__(self, epoch: int) -> list[Example]:
        rng = random.Random(f"bpe-dropout/{self.seed}/{epoch}")
        out = []
        for src, tgt in self.examples:
            s, t = self.dropout.sample(src, rng), self.dropout.sample(tgt, rng)
            out.append((s, t) if max(len(s), len(t)) <= self.cap else (src, tgt))
        return out
