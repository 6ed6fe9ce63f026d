"""Never cut: a sentence longer than the model takes is split into pieces that fit, translated piece by
piece and joined.

Pieces are cut after clause punctuation first (``, ; :`` and dashes between spaces), packed greedily so
that each holds as much as fits; a clause that alone is too long is cut between words, and a word too
long for the model (a 100,000-character token) between characters. Token counts add up over words:
SentencePiece never joins pieces across whitespace, so a text's count is the sum of its words'.
"""

from __future__ import annotations

import re
from typing import Callable

Count = Callable[[str], int]
#: After a clause mark followed by whitespace, or before a dash set between spaces
CLAUSE_BREAK = re.compile(r"(?<=[,;:\u060c\u3001\uff0c\uff1b])\s+|\s+(?=[\u2013\u2014-]\s)")


def source_limit(max_len: int, max_len_a: float, max_len_b: int) -> int:
    """The most source tokens (before EOS) a piece may hold: what the model's ``max_len`` takes,
    and little enough that its output limit ``a * (S + 1) + b`` still fits the decoder's positions
    (so that a search is never stopped by the model's length rather than its own EOS). At least 8."""
    room = max_len - 1
    if max_len_a > 0:
        room = min(room, int((max_len - 1 - max_len_b) / max_len_a) - 1)
    return max(room, 8)


def fit(sentence: str, count: Count, limit: int) -> tuple[list[str], bool]:
    """``sentence`` (words separated by single spaces) as pieces of at most ``limit`` tokens each,
    joined by a space they give it back; and whether a cut had to fall outside clause punctuation."""
    if count(sentence) <= limit:
        return [sentence], False
    pieces: list[str] = []
    blind = False
    for clause in _pack(CLAUSE_BREAK.split(sentence), count, limit):
        if count(clause) <= limit:
            pieces.append(clause)
            continue
        blind = True
        words = [part for word in clause.split(" ") for part in _chop(word, count, limit)]
        pieces += _pack(words, count, limit)
    return pieces, blind


def _pack(parts: list[str], count: Count, limit: int) -> list[str]:
    """Consecutive ``parts`` joined by spaces while their tokens fit ``limit`` (a part too long on its
    own stays alone)."""
    out: list[str] = []
    current: list[str] = []
    used = 0
    for part in parts:
        n = count(part)
        if current and used + n > limit:
            out.append(" ".join(current))
            current, used = [], 0
        current.append(part)
        used += n
    if current:
        out.append(" ".join(current))
    return out


def _chop(word: str, count: Count, limit: int) -> list[str]:
    """``word`` cut into runs of characters of at most ``limit`` tokens each (the word itself when it
    fits). A run is taken as long as the remaining characters allow, halving until it fits."""
    if count(word) <= limit:
        return [word]
    out, rest = [], word
    while rest:
        size = min(len(rest), limit * 4)
        while size > 1 and count(rest[:size]) > limit:
            size //= 2
        out.append(rest[:size])
        rest = rest[size:]
    return out
