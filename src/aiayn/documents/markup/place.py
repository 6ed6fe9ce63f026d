"""Placement: where each element goes in the translation, given the projection of its words.

- An element wraps the target pieces from the first to the last one aligned to any source piece
  inside it. It stays inside its parent, and of two sibling spans that would cross, the later one (in
  source order) keeps the longest part the earlier one leaves free.
- An element with no aligned piece left (its words dropped by the translation, or taken by a
  sibling) is an item at a gap between target pieces, written empty where its neighbours suggest:
  after the target of the source piece before it (the nearest aligned one in its sentence), else
  before the target of the next aligned one, else at the end of its sentence's translation.
- A zero-width element goes after the target of the source piece before it; one glued to the
  following word (``<img>caption``) before the target of that word.
- An element whose parent has no span goes inside its parent, written with it.
"""

from __future__ import annotations

import bisect

from aiayn.documents.markup.inline import Element, Glue
from aiayn.documents.markup.project import Source, Span, Target


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
        taken: dict[int, list[Span]] = {}
        for index, element in enumerate(self.elements):
            self._set_span(index, element, taken)
        for index, element in enumerate(self.elements):
            if self.spans[index] is not None:
                self.children.setdefault(element.parent, []).append(index)
        for children in self.children.values():
            children.sort(key=lambda i: self.spans[i])
        for index, element in enumerate(self.elements):
            if self.spans[index] is None:
                self._set_item(index, element)

    def _set_span(self, index: int, element: Element, taken: dict[int, list[Span]]) -> None:
        parent = element.parent
        if element.start == element.end or (parent >= 0 and self.spans[parent] is None):
            return
        span = self._aligned(element)
        if span is not None and parent >= 0:
            span = span.within(self.spans[parent])
        siblings = taken.setdefault(parent, [])
        span = _free(span, siblings) if span is not None else None
        if span is not None:
            self.spans[index] = span
            siblings.append(span)

    def _aligned(self, element: Element) -> Span | None:
        """The first and last target pieces aligned to the source pieces inside the element."""
        first = bisect.bisect_left(self.source.starts, element.start)
        last = bisect.bisect_left(self.source.starts, element.end)
        spans = [span for span in self.target.aligned[first:last] if span is not None]
        return Span(min(s.low for s in spans), max(s.high for s in spans)) if spans else None

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
