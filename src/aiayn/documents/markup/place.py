"""Placement: where each element goes in the translation, given the projection of its words.

- An element wraps the target pieces from the first to the last one aligned to any source piece
  inside it, inside its parent's. Of two sibling spans that would cross, the later one (in source
  order) keeps the longest part the earlier one leaves free.
- An element whose words are translated holds at least one target word: one whose aligned pieces
  its siblings took takes one of them back from a sibling that keeps another; one whose words have
  no aligned piece takes the target word just before its place (its neighbour's last), else the one
  just after, if that word is spare (its source words have another target word, or it has none).
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
        for index, element in enumerate(self.elements):
            if self.spans[index] is not None:
                self.children.setdefault(element.parent, []).append(index)
        for children in self.children.values():
            children.sort(key=lambda i: self.spans[i])
        for index, element in enumerate(self.elements):
            if self.spans[index] is None:
                self._set_item(index, element)

    def _place(self, with_words: dict[int, list[int]], parent: int, bounds: Span) -> None:
        """The spans of ``parent``'s children inside ``bounds`` (the parent's span), then theirs'. In
        source order, each child takes the longest part of its aligned span that the ones before left
        free; then each one left with none takes a piece back (:meth:`_take`) or, where none of its
        words is aligned, a spare word beside its place (:meth:`_borrow`)."""
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
        """An element with words, none of them aligned inside ``bounds``: the target word just before
        the gap where it would go empty (its neighbour's last), else the one just after, if that word
        is in its sentence, free and spare, and some word of the sentence is aligned (else there is
        nothing to go by)."""
        pieces = self._pieces(index)
        if not pieces:
            return  # whitespace only
        segment = self.source.pieces[pieces[0]].segment
        ends, taken = self.target.segment_end, self._taken(siblings)
        window = Span(ends[segment - 1] if segment > 0 else 0, ends[segment] - 1).within(bounds)
        if window is not None and any(self.target.fan[word] for word in self.source.segments[segment].words):
            gap = self._gap(index, bounds, siblings)
            self.spans[index] = self._spare(gap - 1, window, taken) or self._spare(gap, window, taken)

    def _spare(self, piece: int, window: Span, taken: list[Span]) -> Span | None:
        """The letters of the target word that holds ``piece``, if the word is inside ``window``, in
        none of the ``taken`` spans, and spare: aligned to no source word, or only to source words
        that have another target word (the one translation of another source word is not this one's)."""
        word = self.target.words[self.target.pieces[piece].word] if piece in window.pieces else None
        if word is None or word.pieces[0] < window.low or word.pieces[-1] > window.high:
            return None
        whole = Span(word.pieces[0], word.pieces[-1])
        if any(span.within(whole) for span in taken) or any(self.target.fan[s] < 2 for s in word.sources):
            return None
        letters = [p for p in word.pieces if self.target.pieces[p].part is Part.CORE]
        return Span(letters[0], letters[-1])

    def _gap(self, index: int, bounds: Span, siblings: Sequence[int]) -> int:
        """The gap where the element goes with no word: its neighbours' (:meth:`_neighbour_gap`),
        inside ``bounds`` and not inside a sibling (before it or after it, as in the source)."""
        gap = min(max(self._neighbour_gap(self.elements[index]), bounds.low), bounds.high + 1)
        for sibling in sorted((s for s in siblings if self.spans[s]), key=self.spans.__getitem__):
            start, end = self.spans[sibling]
            if start < gap <= end:
                gap = start if index < sibling else end + 1
        return gap

    def _set_item(self, index: int, element: Element) -> None:
        parent = element.parent
        if parent >= 0 and self.spans[parent] is None:
            self.inner.setdefault(parent, []).append(index)
            return
        bounds = self.spans[parent] if parent >= 0 else Span(0, len(self.target.pieces) - 1)
        gap = self._gap(index, bounds, self.children.get(parent, ()))
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
