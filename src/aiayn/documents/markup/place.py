"""Placement: where each element goes in the translation, given the projection of its words.

- An element wraps the target pieces from the first to the last one aligned to any source piece
  inside it, inside its parent's. Of two sibling spans that would cross, the later one (in source
  order) keeps the longest part the earlier one leaves free.
- An element whose words are translated holds at least one target word: one whose aligned pieces
  its siblings took takes one of them back from a sibling that keeps another; one whose words have
  no aligned piece takes its neighbour's nearest target word (the last of the source word before it,
  else the first of the one after it) where that neighbour has another.
- An element left with none (its words dropped, or the only word of a sibling) is written empty
  where its neighbours suggest: after the target of the source piece before it (the nearest aligned
  one in its sentence), else before the target of the next aligned one, else at the end of its
  sentence's translation. So is a zero-width element; one glued to the following word
  (``<img>caption``) goes before the target of that word.
- An element whose parent has no span goes inside its parent, written with it.
"""

from __future__ import annotations

import bisect
from typing import Sequence

from aiayn.documents.markup.inline import Element, Glue
from aiayn.documents.markup.project import Part, Source, Span, Target


class Layout:
    """Where each element goes: a span of target pieces (``spans``), or a gap between pieces
    (``items``: gap ``g`` is before target piece ``g``), or inside its parent (``inner``)."""

    def __init__(self, source: Source, target: Target) -> None:
        self.source, self.target = source, target
        self.elements = source.inline.elements
        self.spans: list[Span | None] = [None] * len(self.elements)
        self.children: dict[int, list[int]] = {}  # parent (-1: the run) -> its children with spans, in order
        self.items: dict[int, dict[int, list[int]]] = {}  # parent -> gap -> items, in source order
        self.inner: dict[int, list[int]] = {}  # parent with no span -> its children
        with_words: dict[int, list[int]] = {}  # parent -> its children that are not zero-width
        for index, element in enumerate(self.elements):
            if element.start < element.end:
                with_words.setdefault(element.parent, []).append(index)
        self._place(with_words, -1, Span(0, len(target.pieces) - 1))
        for index in sorted((i for i, span in enumerate(self.spans) if span), key=self.spans.__getitem__):
            self.children.setdefault(self.elements[index].parent, []).append(index)
        for index, element in enumerate(self.elements):
            if self.spans[index] is None:
                self._set_item(index, element)

    def _place(self, with_words: dict[int, list[int]], parent: int, bounds: Span) -> None:
        """The spans of ``parent``'s children inside ``bounds`` (the parent's span), then theirs'. In
        source order, each child takes the longest part of its aligned span that the ones before left
        free; then each one left with none takes a piece back (:meth:`_take`) or, where none of its
        words is aligned, its neighbour's word (:meth:`_borrow`)."""
        siblings = with_words.get(parent, [])
        for index in siblings:
            aligned = self._aligned(index, bounds)
            self.spans[index] = aligned and _free(aligned, self._taken(siblings))
        for index in siblings:
            if self.spans[index] is None:
                aligned = self._aligned(index, bounds)
                if aligned is not None:
                    self._take(index, aligned, siblings)
                else:
                    self._borrow(index, bounds, siblings)
        for index in siblings:
            if self.spans[index] is not None:
                self._place(with_words, index, self.spans[index])

    def _taken(self, siblings: Sequence[int]) -> list[Span]:
        return [span for span in map(self.spans.__getitem__, siblings) if span is not None]

    def _aligned(self, index: int, bounds: Span) -> Span | None:
        """The first and last target pieces aligned to the source pieces inside the element, inside
        ``bounds``."""
        joined = None
        for piece in self._pieces(index):
            span = self.target.aligned[piece]
            joined = joined if span is None else span.join(joined)
        return joined and joined.within(bounds)

    def _pieces(self, index: int) -> range:
        """The source pieces inside the element."""
        starts, element = self.source.starts, self.elements[index]
        return range(bisect.bisect_left(starts, element.start), bisect.bisect_left(starts, element.end))

    def _take(self, index: int, aligned: Span, siblings: list[int]) -> None:
        """An element whose aligned pieces its siblings took: one of its own pieces back from a
        sibling that keeps another (the longest part of its span without it), and then the longest
        free part of its aligned span. Nothing is taken from a sibling that holds that piece only."""
        spans = [self.target.aligned[piece] for piece in self._pieces(index)]
        spans = [span.within(aligned) for span in spans if span is not None]
        for piece in sorted({piece for span in spans if span is not None for piece in span.pieces}):
            owner = next((s for s in siblings if (span := self.spans[s]) and piece in span.pieces), None)
            if owner is not None and len(self.spans[owner].pieces) > 1:
                self.spans[owner] = _free(self.spans[owner], [Span(piece, piece)])
                break
        self.spans[index] = _free(aligned, self._taken(siblings))

    def _borrow(self, index: int, bounds: Span, siblings: list[int]) -> None:
        """An element with words, none of them aligned inside ``bounds``: the nearest target word of
        its neighbour in the source (the last of the word before it, else the first of the word after
        it, in its sentence) where the neighbour has another (:meth:`_spare`)."""
        pieces = self._pieces(index)
        if not pieces:
            return  # whitespace only
        first, last = self.source.pieces[pieces[0]], self.source.pieces[pieces[-1]]
        words, taken = self.source.segments[first.segment].words, self._taken(siblings)
        for neighbour, nearest in ((first.word - 1, -1), (last.word + 1, 0)):
            targets = self.target.targets[neighbour] if neighbour in words else []
            span = self._spare(targets[nearest], bounds, taken) if len(targets) > 1 else None
            if span is not None:
                self.spans[index] = span
                return

    def _spare(self, word: int, bounds: Span, taken: list[Span]) -> Span | None:
        """The letters of target word ``word`` if it is inside ``bounds``, in none of the ``taken``
        spans, and each source word aligned to it has another (the one translation of a word is that
        word's)."""
        pieces = self.target.words[word]
        whole = Span(pieces[0], pieces[-1])
        if whole.within(bounds) != whole or any(span.within(whole) for span in taken):
            return None
        if any(word in targets and len(targets) < 2 for targets in self.target.targets):
            return None
        letters = [p for p in pieces if self.target.pieces[p].part is Part.CORE]
        return Span(letters[0], letters[-1])

    def _set_item(self, index: int, element: Element) -> None:
        parent = element.parent
        if parent >= 0 and self.spans[parent] is None:
            self.inner.setdefault(parent, []).append(index)
            return
        low, high = self.spans[parent] if parent >= 0 else (0, len(self.target.pieces) - 1)
        gap = min(max(self._neighbour_gap(element), low), high + 1)
        for sibling in self.children.get(parent, ()):
            start, end = self.spans[sibling]
            if start < gap <= end:  # not inside a sibling: before it or after it, as in the source
                gap = start if index < sibling else end + 1
        self.items.setdefault(parent, {}).setdefault(gap, []).append(index)

    def _neighbour_gap(self, element: Element) -> int:
        """The gap after the target of the nearest aligned source piece before the element in its
        sentence (before the next one's, for an element glued to the word after it), else the gap
        before the target of the nearest one after it, else the end of its sentence's translation."""
        source, pos = self.source, element.start
        before = bisect.bisect_right(source.ends, pos) - 1
        after = bisect.bisect_left(source.starts, pos)
        glued_right = element.start == element.end and element.glue == Glue.RIGHT
        home = after if (glued_right or before < 0) else before
        if home >= len(source.pieces):
            home = before
        if home < 0:
            return 0
        segment = source.pieces[home].segment
        searches = ((after, 1), (before, -1)) if glued_right else ((before, -1), (after, 1))
        for gap in (self._nearest(piece, step, segment) for piece, step in searches):
            if gap is not None:
                return gap
        return self.target.segment_end[segment]

    def _nearest(self, piece: int, step: int, segment: int) -> int | None:
        """The gap after the target of the first aligned piece from ``piece`` back (``step`` -1) in
        ``segment``, or before the target of the first one from it on (``step`` 1)."""
        while 0 <= piece < len(self.source.pieces) and self.source.pieces[piece].segment == segment:
            span = self.target.aligned[piece]
            if span is not None:
                return span.high + 1 if step < 0 else span.low
            piece += step
        return None


def _free(span: Span, taken: list[Span]) -> Span | None:
    """The longest part of ``span`` outside the ``taken`` spans (the first one of a tie)."""
    free = [span]
    for low, high in taken:
        parts = [(Span(a, min(b, low - 1)), Span(max(a, high + 1), b)) for a, b in free]
        free = [part for pair in parts for part in pair if part.low <= part.high]
    return max(free, key=lambda part: part.high - part.low, default=None)
