"""Building an :class:`~aiayn.documents.markup.inline.Inline` from a run's content in document order.

Zero-width elements (``<br>``, ``<img>``, or an untranslated element such as ``<code>`` whose whole
markup is carried as one) edit the text the model sees, and take whitespace with them: the text has
one space where the source had ``a <br> b`` (the other goes with the ``<br>``, as its ``lead`` or
``trail``), and a space where it had ``a<br>b``. Each one's :class:`~aiayn.documents.markup.inline.Glue`
records how it sat between the words.
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import Callable, NamedTuple

from aiayn.documents.markup.inline import CLOSING, Chunk, Element, Event, Glue, Inline, Tag

Shift = Callable[[int, bool], int]  # an offset of the text before the edits -> after them


# The builder's log, in document order: text added, and tags (a zero-width element's: WHOLE)
_Text = NamedTuple("_Text", [("start", int), ("end", int)])
_Markup = NamedTuple("_Markup", [("element", int), ("tag", Tag)])
Edit = NamedTuple("Edit", [("start", int), ("end", int), ("new", str)])  # text[start:end] -> new


class _Glued(NamedTuple):  # a zero-width element's fields
    glue: Glue
    lead: str = ""
    trail: str = ""


class InlineBuilder:
    """Collects a run of inline content in document order and builds its :class:`Inline`.

    ``text`` adds text (with its source spelling when it differs, e.g. a Markdown escape);
    ``open``/``close`` bracket an element (``empty=False``: one that means nothing without words,
    such as Markdown's emphasis, is left out when the translation leaves it none); ``void`` adds a
    zero-width element: an empty element such as ``<br>``, or the whole markup of an element that
    stays untranslated. ``separates`` says whether the void parts two words glued to it on both sides
    (``a<br>b``: yes; ``<wbr>``: no).
    """

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._chunks: list[Chunk] = []
        self._length = 0
        self._elements: list[Element] = []  # start, end: over the text before the edits
        self._joins: set[int] = set()  # the voids that do not separate
        self._stack: list[int] = []
        self._log: list[_Text | _Markup] = []  # in document order

    def text(self, text: str, raw: str | None = None) -> None:
        """Adds text; ``raw``: how the source spelled it (``None``: unknown, escaped on output)."""
        if text:
            start, end = self._length, self._length + len(text)
            if raw is not None:
                self._chunks.append(Chunk(start, end, None if raw == text else raw))
            self._log.append(_Text(start, end))
            self._parts.append(text)
            self._length = end

    def open(self, markup: str, empty: bool = True) -> None:
        self._add(Element(self._length, -1, markup, empty=empty), Tag.OPEN)
        self._stack.append(len(self._elements) - 1)

    def close(self, markup: str) -> None:
        index = self._stack.pop()
        self._elements[index] = replace(self._elements[index], end=self._length, close=markup)
        self._log.append(_Markup(index, Tag.CLOSE))

    def void(self, markup: str, separates: bool = True) -> None:
        self._add(Element(self._length, self._length, markup), Tag.WHOLE)
        if not separates:
            self._joins.add(len(self._elements) - 1)

    def _add(self, element: Element, tag: Tag) -> None:
        self._elements.append(replace(element, parent=self._stack[-1] if self._stack else -1))
        self._log.append(_Markup(len(self._elements) - 1, tag))

    def build(self) -> Inline:
        """The Inline; elements still open are closed at the end with no closing markup."""
        while self._stack:
            self.close("")
        raw_text = "".join(self._parts)
        glues, edits = _zero_width(raw_text, self._elements, self._joins)
        text, shift = _apply(raw_text, edits)
        elements = tuple(
            replace(e, start=shift(e.start), end=shift(e.end), **glues.get(i, _Glued(Glue.NONE))._asdict())
            for i, e in enumerate(self._elements)
        )  # an element's tags before a space put in stay at their place
        chunks = _shift_chunks(self._chunks, edits, shift)
        return Inline(text, elements, chunks, self._events(raw_text, shift))

    def _events(self, text: str, shift: Shift) -> tuple[Event, ...]:
        """The elements' tags between the words, over the edited text. An element with no word
        inside is one event, with its whole markup."""
        out: list[Event] = []
        whole: list[tuple[bool, str]] = []  # the markup and text of an element with no word, so far
        inside = -1
        for step in self._log:
            if isinstance(step, _Text):
                if inside >= 0:
                    whole.append((True, text[step.start : step.end]))
                continue
            index, tag = step
            element = self._elements[index]
            if inside < 0 and tag is not Tag.WHOLE and text[element.start : element.end].strip():
                out.append(Event(shift(element.start if tag is Tag.OPEN else element.end), tag, index))
                continue
            if inside < 0:
                inside, whole = index, []
            whole.append((False, element.close if tag is Tag.CLOSE else element.open))
            if index == inside and tag is not Tag.OPEN:
                out.append(Event(shift(element.start), Tag.WHOLE, index, tuple(whole)))
                inside = -1
        return tuple(out)


def _zero_width(text: str, elements: list[Element], joins: set[int]) -> tuple[dict[int, _Glued], list[Edit]]:
    """The glue of each zero-width element and its whitespace (lead, trail), and the edits of the
    text that go with them.

    Elements at one position are one group. Glued on both sides, a space goes into the text (so that
    the model sees two words) unless no element of the group separates. With whitespace on both
    sides, one of the two goes out of the text and into the group: the whitespace before it (its
    first element's ``lead``), or where that is not its own (another element's tag is between, or a
    group before took it), the whitespace after it (its last element's ``trail``).
    """
    groups: dict[int, list[int]] = {}
    for i, e in enumerate(elements):
        if e.start == e.end:
            groups.setdefault(e.start, []).append(i)
    bounds = sorted({p for e in elements if e.start < e.end for p in (e.start, e.end)})
    opening = {e.start for e in elements if e.start < e.end}
    closing = {e.end for e in elements if e.start < e.end}
    positions = sorted(groups)
    glues: dict[int, _Glued] = {}
    edits: list[Edit] = []  # in order
    taken = 0  # the text before this is not a later group's
    for k, pos in enumerate(positions):
        below, above = bisect.bisect_left(bounds, pos), bisect.bisect_right(bounds, pos)
        floor = pos if pos in opening else max(bounds[below - 1] if below else 0, taken)
        ceiling = len(text) if k + 1 == len(positions) else positions[k + 1]
        if above < len(bounds):
            ceiling = min(ceiling, bounds[above])
        if pos in closing:
            ceiling = pos
        separates = any(i not in joins for i in groups[pos])
        glued, edit = _glue(text, pos, separates, floor, ceiling)
        if edit is not None:
            edits.append(edit)
            taken = max(taken, edit.end)
        members = groups[pos]
        outer = [i for i in members if elements[i].parent not in members]  # not inside another member
        for i in members:
            glues[i] = _Glued(glued.glue, glued.lead * (i == outer[0]), glued.trail * (i == outer[-1]))
    return glues, edits


def _glue(text: str, pos: int, separates: bool, floor: int, ceiling: int) -> tuple[_Glued, Edit | None]:
    """The glue of a group at ``pos`` and the edit that goes with it; its whitespace is within
    [floor, ceiling). Punctuation that closes a clause after it (``<code>x</code>.``) glues nothing:
    the word it would follow in the translation is the model's."""
    before = pos > 0 and not text[pos - 1].isspace()
    after = pos < len(text) and not text[pos].isspace() and text[pos] not in CLOSING
    if before and after:
        return (_Glued(Glue.BOTH), Edit(pos, pos, " ")) if separates else (_Glued(Glue.INSIDE), None)
    if before or after:
        return _Glued(Glue.LEFT if before else Glue.RIGHT), None
    start, end = pos, pos
    while start > floor and text[start - 1].isspace():
        start -= 1
    if start < pos:
        return _Glued(Glue.NONE, text[start:pos], ""), Edit(start, pos, "")
    while end < ceiling and text[end].isspace():
        end += 1
    return _Glued(Glue.NONE, "", text[pos:end]), (Edit(pos, end, "") if end > pos else None)


def _apply(text: str, edits: list[Edit]) -> tuple[str, Shift]:
    """The edited text, and the map of an old offset to the new one: an offset inside a deleted
    range goes to where the range was; at an insertion, to its left or (``right``) its right side."""
    out, last = [], 0
    for start, end, new in edits:
        out += [text[last:start], new]
        last = end
    out.append(text[last:])

    def shift(pos: int, right: bool = False) -> int:
        delta = 0
        for start, end, new in edits:
            if start > pos or (start == end == pos and not right):
                break
            if end > pos:  # inside a deletion
                return start + delta
            delta += len(new) - (end - start)
        return pos + delta

    return "".join(out), shift


def _shift_chunks(chunks: list[Chunk], edits: list[Edit], shift: Shift) -> tuple[Chunk, ...]:
    """The chunks over the edited text: a chunk with a spelling of its own cut by an edit is dropped."""
    out = []
    for start, end, raw in chunks:
        cut = any(s < end and e > start and (s > start or e < end) for s, e, _ in edits)
        new_start, new_end = shift(start, True), shift(end)
        if new_start < new_end and (raw is None or not cut):
            out.append(Chunk(new_start, new_end, raw))
    for start, _, new in edits:  # the spaces put in
        if new:
            out.append(Chunk(shift(start), shift(start) + len(new), None))
    return tuple(sorted(out))
