"""Projection: the words of a run and of its translation, and for each source word the target words
its alignment gives it.

The run is cut into segments: its sentences, translated, and the text between them (whitespace),
kept and aligned to itself. Words are ``str.split()`` words, cut further into pieces where an
element starts or ends inside one (``H<sub>2</sub>O``: three pieces), so that an element covers whole
pieces. A target word equal to the source word it is aligned to copies it: its pieces are the source
word's, so that tags inside copied words (formulas, names, numbers) stay where they were. Another
target word is its letters and, as pieces apart, the punctuation before and after them, so that the
source's ``<a>Wiese</a>.`` gives ``<a>field</a>.`` and its ``<a>Wiese.</a>`` gives ``<a>field.</a>``.
"""

from __future__ import annotations

import bisect
import re
from enum import Enum
from typing import NamedTuple, Sequence

from aiayn.decode.align import Aligned
from aiayn.documents.markup.inline import Inline

_WORD = re.compile(r"\S+")  # str.split()'s words: re's \s is str.isspace()


#: A sentence of the run (its index), or the text between two (sentence -1); words: its source words
Segment = NamedTuple("Segment", [("start", int), ("end", int), ("sentence", int), ("words", range)])
Word = NamedTuple("Word", [("start", int), ("end", int), ("pieces", range)])
#: A source word, or the part of one between two elements' bounds
Piece = NamedTuple("Piece", [("start", int), ("end", int), ("word", int), ("segment", int)])
#: What a target piece holds of its word: the punctuation before its letters, they, or the punctuation
#: after them (a copied word's pieces, and a word of punctuation alone: CORE)
Part = Enum("Part", "LEAD CORE TRAIL")
#: copy_of: the source piece the target piece copies, or -1
TargetPiece = NamedTuple("TargetPiece", [("start", int), ("end", int), ("part", Part), ("copy_of", int)])
#: Target text [start, end) copied from the source text at source_start
Copy = NamedTuple("Copy", [("start", int), ("end", int), ("source_start", int)])


class Span(NamedTuple):
    """Target pieces ``low`` to ``high``, both included."""

    low: int
    high: int

    @property
    def pieces(self) -> range:
        return range(self.low, self.high + 1)

    def within(self, outer: Span) -> Span | None:
        """The part of the span inside ``outer``, None for none."""
        low, high = max(self.low, outer.low), min(self.high, outer.high)
        return Span(low, high) if low <= high else None

    def join(self, other: Span | None) -> Span:
        """The span from the first piece of the two to the last."""
        return self if other is None else Span(min(self.low, other.low), max(self.high, other.high))


class Source:
    """The source side of a run: its segments, words and pieces, in order."""

    def __init__(self, inline: Inline, spans: Sequence[tuple[int, int]]) -> None:
        self.inline = inline
        self.segments: list[Segment] = []
        self.words: list[Word] = []
        self.pieces: list[Piece] = []
        cuts = sorted({p for e in inline.elements for p in (e.start, e.end)})
        for index, (start, end, sentence) in enumerate(_segments(spans, len(inline.text))):
            first = len(self.words)
            for word in _WORD.finditer(inline.text, start, end):
                self._add_word(*word.span(), index, cuts)
            self.segments.append(Segment(start, end, sentence, range(first, len(self.words))))
        self.starts = [piece.start for piece in self.pieces]
        self.ends = [piece.end for piece in self.pieces]

    def _add_word(self, start: int, end: int, segment: int, cuts: list[int]) -> None:
        bounds = [start, *cuts[bisect.bisect_right(cuts, start) : bisect.bisect_left(cuts, end)], end]
        first = len(self.pieces)
        self.pieces += [Piece(lo, hi, len(self.words), segment) for lo, hi in zip(bounds, bounds[1:])]
        self.words.append(Word(start, end, range(first, len(self.pieces))))


def _segments(spans: Sequence[tuple[int, int]], length: int) -> list[tuple[int, int, int]]:
    """The sentences ``(start, end, index)`` and the text between them ``(start, end, -1)``."""
    out, pos = [], 0
    for k, (start, end) in enumerate(spans):
        if start > pos:
            out.append((pos, start, -1))
        out.append((start, end, k))
        pos = end
    if pos < length:
        out.append((pos, length, -1))
    return out


def _parts(text: str, start: int, end: int) -> list[tuple[int, int, Part]]:
    """``text[start:end]`` (a word) as its leading punctuation, letters and trailing punctuation:
    the parts there are (one part for a word of letters or of punctuation)."""
    low, high = start, end
    while low < high and not text[low].isalnum():
        low += 1
    while high > low and not text[high - 1].isalnum():
        high -= 1
    if low == high:
        return [(start, end, Part.CORE)]
    parts = [(start, low, Part.LEAD), (low, high, Part.CORE), (high, end, Part.TRAIL)]
    return [(lo, hi, part) for lo, hi, part in parts if lo < hi]


class Target:
    """The target side of a run: its plain text (the translations, and the source's text between
    them), its words and pieces, for each source piece the span of target pieces aligned to it
    (``aligned[piece]``, None for none), and for each source word the target words aligned to it
    (``targets[word]``)."""

    def __init__(self, source: Source, translations: Sequence[Aligned]) -> None:
        self.source = source
        self.pieces: list[TargetPiece] = []
        self.words: list[range] = []  # the pieces of each target word
        self.targets: list[list[int]] = [[] for _ in source.words]
        self.copies: list[Copy] = []
        self.segment_end: list[int] = []  # the first target piece after each segment's
        self.aligned: list[Span | None] = [None] * len(source.pieces)
        self._length, parts = 0, []
        for segment in source.segments:
            parts.append(self._add_segment(segment, translations))
            self._length += len(parts[-1])
        self.text = "".join(parts)
        self.starts = [piece.start for piece in self.pieces]

    def _add_segment(self, segment: Segment, translations: Sequence[Aligned]) -> str:
        if segment.sentence < 0:
            text = self.source.inline.text[segment.start : segment.end]
            self.copies.append(Copy(self._length, self._length + len(text), segment.start))
            pairs: Sequence[tuple[int, int]] = [(i, i) for i in range(len(segment.words))]
        else:
            text = translations[segment.sentence].text.strip()
            pairs = translations[segment.sentence].alignment
        words = [m.span() for m in _WORD.finditer(text)]
        source_words = segment.words
        pairs = [(source_words[i], j) for i, j in pairs if 0 <= i < len(source_words) and 0 <= j < len(words)]
        self._add_words(text, words, pairs)
        self.segment_end.append(len(self.pieces))
        return text

    def _add_words(self, text: str, words: list[tuple[int, int]], pairs: list[tuple[int, int]]) -> None:
        source = self.source
        copies: dict[int, int] = {}  # target word -> the source word aligned to it that it copies
        for i, j in pairs:
            self.targets[i].append(len(self.words) + j)
            (start, end, _), (lo, hi) = source.words[i], words[j]
            if j not in copies and end - start == hi - lo and source.inline.text[start:end] == text[lo:hi]:
                copies[j] = i
        targets = [self._add_word(text, lo, hi, copies.get(j, -1)) for j, (lo, hi) in enumerate(words)]
        self.words += targets
        for i, j in pairs:
            pieces = source.words[i].pieces
            if copies.get(j, -1) == i:  # piece to piece
                for k, piece in enumerate(pieces):
                    self._link(piece, Span(targets[j][k], targets[j][k]))
                continue
            for piece in pieces:
                self._link(piece, self._match(piece, pieces, targets[j]))

    def _match(self, piece: int, word: range, target: range) -> Span:
        """The target pieces a source piece of ``word`` is aligned to, in the target word ``target``:
        punctuation to punctuation, letters to letters (``<a>Wiese</a>.`` -> ``<a>field</a>.``);
        the whole word where one side has no such part."""
        if len(target) == 1:
            return Span(target[0], target[0])
        start, end, _, _ = self.source.pieces[piece]
        text = self.source.inline.text[start:end]
        parts = {self.pieces[t].part: t for t in target}
        if not any(ch.isalnum() for ch in text):  # punctuation alone, cut off its word by an element
            side = Part.TRAIL if piece == word[-1] else Part.LEAD if piece == word[0] else None
            found = parts.get(side)
            return Span(found, found) if found is not None else Span(target[0], target[-1])
        low = parts.get(Part.LEAD) if not text[0].isalnum() else None
        high = parts.get(Part.TRAIL) if not text[-1].isalnum() else None
        core = parts[Part.CORE]
        return Span(core if low is None else low, core if high is None else high)

    def _add_word(self, text: str, start: int, end: int, copy: int) -> range:
        """The target pieces of a word: a copy's are its source word's; another word's are its
        letters and, apart from them, the punctuation before and after them."""
        first = len(self.pieces)
        if copy < 0:
            for lo, hi, part in _parts(text, start, end):
                self.pieces.append(TargetPiece(self._length + lo, self._length + hi, part, -1))
            return range(first, len(self.pieces))
        offset = self._length + start - self.source.words[copy].start
        for piece in self.source.words[copy].pieces:
            lo, hi, _, _ = self.source.pieces[piece]
            self.pieces.append(TargetPiece(offset + lo, offset + hi, Part.CORE, piece))
        return range(first, len(self.pieces))

    def _link(self, piece: int, span: Span) -> None:
        self.aligned[piece] = span.join(self.aligned[piece])
