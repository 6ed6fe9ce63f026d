"""Writing: the translated run with each element's markup where :mod:`~aiayn.documents.markup.place`
put it, and a document of literal text and such runs.

Tags attach to words, not to the spaces around them: at a gap between target pieces, closing tags and
elements glued to the word before go left of the gap's whitespace, opening tags and elements glued to
the word after go right of it. Source text that comes back unchanged (the whitespace between
sentences, copied words) is written with its source spelling (an entity, a Markdown escape); other
text goes through the format's ``escape``. Between two copied words that were neighbours in the
source, with the same elements between them, the source's own layout of tags and whitespace is
written: a translation that changes nothing gives the run back byte for byte.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from enum import Enum
from typing import Callable, NamedTuple, Sequence

from aiayn.decode.align import Aligned, Pairs
from aiayn.documents.markup.inline import CLOSING, Event, Glue, Inline, Tag
from aiayn.documents.markup.place import Layout
from aiayn.documents.markup.project import Source, Target

#: Which side of the whitespace at a gap a mark is written on (BETWEEN: in place of a single space that
#: stood for it, ``a<br>b``)
Side = Enum("Side", "LEFT RIGHT BETWEEN")
#: Markup written at a gap: an element's opening or closing tag, or the whole of an item
Mark = NamedTuple("Mark", [("side", Side), ("markup", str), ("tag", Tag), ("element", int)])


def _identity(text: str) -> str:
    return text


def transfer(
    inline: Inline,
    spans: Sequence[tuple[int, int]],
    translations: Sequence[Aligned],
    escape: Callable[[str], str] = _identity,
) -> str:
    """The translated run with its elements: ``translations[k]`` translates ``inline.text[s:e]`` for
    ``(s, e) = spans[k]``; the text between spans (whitespace) is kept as it was."""
    if len(spans) != len(translations):
        raise ValueError(f"{len(spans)} sentences but {len(translations)} translations")
    source = Source(inline, spans)
    target = Target(source, translations)
    return _Writer(source, target, Layout(source, target), escape).write()


class _Writer:
    """Writes the target text with the elements' markup at the gaps between pieces."""

    def __init__(self, source: Source, target: Target, layout: Layout, escape: Callable[[str], str]):
        self.source, self.target, self.layout, self.escape = source, target, layout, escape
        self.inline = source.inline
        self.copy_starts = [copy.start for copy in target.copies]
        self.copied = [index for index, piece in enumerate(target.pieces) if piece.copy_of >= 0]

    def write(self) -> str:
        """The text up to each gap with markup, that gap, and so on; the rest of the text."""
        gaps: dict[int, list[Mark]] = {}
        self._walk(-1, gaps)
        out: list[str] = []
        pos = 0
        for gap in sorted(gaps):
            start, end = self._bounds(gap)
            out.append(self._spell(pos, start))
            self._flush(gap, gaps[gap], out)
            pos = end
        out.append(self._spell(pos, len(self.target.text)))
        return "".join(out)

    def _walk(self, parent: int, gaps: dict[int, list[Mark]]) -> None:
        """The marks of ``parent``'s content at their gaps. Its items at a child's first gap go
        before the child, those at the gap after it after it."""
        items = self.layout.items.get(parent, {})
        at = sorted(items)
        k = 0
        for child in self.layout.children.get(parent, ()):
            start, end = self.layout.spans[child]
            while k < len(at) and at[k] <= start:
                self._items(items[at[k]], at[k], gaps)
                k += 1
            element = self.layout.elements[child]
            gaps.setdefault(start, []).append(Mark(Side.RIGHT, element.open, Tag.OPEN, child))
            self._walk(child, gaps)
            gaps.setdefault(end + 1, []).append(Mark(Side.LEFT, element.close, Tag.CLOSE, child))
        for gap in at[k:]:
            self._items(items[gap], gap, gaps)

    def _items(self, indices: Sequence[int], gap: int, gaps: dict[int, list[Mark]]) -> None:
        """Items at a gap: elements with no word, or zero-width, each on the side of the gap's
        whitespace it was on, with the whitespace it took out of the text."""
        for index in indices:
            element = self.layout.elements[index]
            side, lead, trail = Side.LEFT, element.lead, element.trail
            if element.start == element.end:
                side = {Glue.RIGHT: Side.RIGHT, Glue.BOTH: Side.BETWEEN}.get(element.glue, Side.LEFT)
                if element.glue == Glue.NONE:
                    side, lead, trail = self._apart(gap, lead, trail)
            gaps.setdefault(gap, []).append(Mark(side, lead + self._markup(index) + trail, Tag.WHOLE, index))

    def _apart(self, gap: int, lead: str, trail: str) -> tuple[Side, str, str]:
        """Side and whitespace of an element that stood apart from the words on both sides: with the
        whitespace it took before it, on the left of the gap's own; with the one after it, on the
        right; a space on a side with a word and no whitespace."""
        start, end = self._bounds(gap)
        words_after = gap < len(self.target.pieces)
        if trail:
            if not words_after and start == end:
                return Side.LEFT, " " if gap > 0 else "", ""
            return Side.RIGHT, "", trail
        lead = lead or (" " if gap > 0 else "")
        closing = words_after and self.target.text[start : end + 1][-1:] in CLOSING
        return Side.LEFT, lead, " " if words_after and start == end and not closing else ""

    def _markup(self, index: int) -> str:
        """An element written with no words: its markup around its children's (a Markdown element
        that means nothing empty goes if it has no children either)."""
        element = self.layout.elements[index]
        children = self.layout.inner.get(index, ())
        inner = "".join(
            self.layout.elements[c].lead + self._markup(c) + self.layout.elements[c].trail for c in children
        )
        return element.open + inner + element.close if element.empty or inner else inner

    def _flush(self, gap: int, marks: list[Mark], out: list[str]) -> None:
        """The marks at a gap and its whitespace. Where the gap is a gap of the source (its words on
        both sides copied) with the same elements in the same order, it is written as the source
        had it; else the whitespace goes after the marks written on the left of it (closing tags,
        elements glued to the word before), before the others, and an element that stood for a
        space between two glued words takes the place of a single space."""
        start, end = self._bounds(gap)
        plain = self.target.text[start:end]
        source = self._source_gap(gap, plain)
        if source is not None:
            events = self.inline.between(*source)
            if [(e.tag, e.element) for e in events] == [(m.tag, m.element) for m in marks]:
                self._replay(source, events, out)
                return
        spelled = self._spell(start, end)
        placed, between = False, 0 < gap < len(self.target.pieces) and plain == " "
        for mark in marks:
            if mark.side is Side.BETWEEN and between and not placed:
                placed, spelled = True, ""
            elif mark.side is Side.RIGHT and not placed:
                out.append(spelled)
                placed = True
            out.append(mark.markup)
        if not placed:
            out.append(spelled)

    def _source_gap(self, gap: int, plain: str) -> tuple[int, int] | None:
        """The source positions between the source pieces that the pieces around ``gap`` copy, if
        they were neighbours there with the same text between them."""
        pieces, last = self.source.pieces, len(self.target.pieces)
        left = self.target.pieces[gap - 1].copy_of if gap > 0 else -1
        right = self.target.pieces[gap].copy_of if gap < last else len(pieces)
        if (gap > 0 and left < 0) or (gap < last and right < 0) or right != left + 1:
            return None
        start = pieces[left].end if left >= 0 else 0
        end = pieces[right].start if right < len(pieces) else len(self.inline.text)
        return (start, end) if self.inline.text[start:end] == plain else None

    def _replay(self, source: tuple[int, int], events: tuple[Event, ...], out: list[str]) -> None:
        """The source's layout between two words: its tags, and its whitespace between them (that
        of the text, and that taken out of it with a zero-width element; not a space put in)."""
        position = source[0]
        for at, tag, index, whole in events:
            out.append(self.inline.source(position, at, self.escape) if position < at else "")
            element = self.layout.elements[index]
            if tag is not Tag.WHOLE:
                out.append(element.open if tag is Tag.OPEN else element.close)
                position = max(position, at)
                continue
            markup = "".join(self.escape(t) if is_text else t for is_text, t in whole) or self._markup(index)
            out.append(element.lead + markup + element.trail)
            after = element.end if element.start < element.end else at + (element.glue == Glue.BOTH)
            position = max(position, after)  # past the text it holds, or the space put in for it
        end = source[1]
        out.append(self.inline.source(position, end, self.escape) if position < end else "")

    def _bounds(self, gap: int) -> tuple[int, int]:
        """The target text between pieces ``gap - 1`` and ``gap``."""
        pieces = self.target.pieces
        start = pieces[gap - 1].end if gap > 0 else 0
        return start, pieces[gap].start if gap < len(pieces) else len(self.target.text)

    def _spell(self, start: int, end: int) -> str:
        """``target.text[start:end]`` (whole pieces and gaps) as written: escaped, except the pieces
        copied from the source and the whitespace around them, written with the source's spelling."""
        text = self.target.text
        if start >= end or not self.inline.chunks:
            return self.escape(text[start:end])
        pieces = self.target.pieces
        out, pos = [], start
        first = bisect.bisect_left(self.copied, bisect.bisect_left(self.target.starts, start))
        for index in self.copied[first:]:
            piece_start, piece_end = pieces[index].start, pieces[index].end
            if piece_start >= end:
                break
            space = max(pieces[index - 1].end if index > 0 else 0, pos)
            out += [self.escape(text[pos:space]), self._space(index, space, piece_start), self._piece(index)]
            after = pieces[index + 1].start if index + 1 < len(pieces) else len(text)
            pos = min(after, end)
            out.append(self._space(index + 1 if after <= end else -1, piece_end, pos))
        out.append(self.escape(text[pos:end]))
        return "".join(out)

    def _piece(self, index: int) -> str:
        start, end, _, copy = self.target.pieces[index]
        if copy >= 0:
            start, end = self.source.pieces[copy].start, self.source.pieces[copy].end
            return self.inline.source(start, end, self.escape)
        return self.escape(self.target.text[start:end])

    def _space(self, gap: int, start: int, end: int) -> str:
        """Whitespace ``[start, end)`` before piece ``gap`` (-1: unknown), as written: the source's
        spelling where it is copied from the text between sentences, or between two copied words
        that were neighbours in the source; else escaped."""
        if start >= end:
            return ""
        plain = self.target.text[start:end]
        k = bisect.bisect_right(self.copy_starts, start) - 1
        if k >= 0 and end <= self.target.copies[k].end:
            offset = self.target.copies[k].source_start - self.copy_starts[k]
            return self.inline.source(start + offset, end + offset, self.escape)
        if 0 < gap < len(self.target.pieces):
            source = self._source_gap(gap, plain)
            if source is not None:
                return self.inline.source(*source, self.escape)
        return self.escape(plain)


@dataclass(frozen=True)
class Run:
    """A run of inline content to translate: its sentences are ``inline.text[s:e]`` for ``spans``.

    ``escape`` writes target text in the format; ``breaks`` are written for the line breaks of the
    written run, in order, the last one repeated (a Markdown line break with the container markers
    of the next line).
    """

    inline: Inline
    spans: tuple[tuple[int, int], ...]
    escape: Callable[[str], str] = _identity
    breaks: tuple[str, ...] = ()

    def write(self, translations: Sequence[Aligned]) -> str:
        text = transfer(self.inline, self.spans, translations, self.escape)
        if not self.breaks or "\n" not in text:
            return text
        lines = text.split("\n")
        breaks = [*self.breaks, *[self.breaks[-1]] * len(lines)]
        return lines[0] + "".join(brk + line for brk, line in zip(breaks, lines[1:]))


class Assembled:
    """A parsed document (:class:`aiayn.documents.types.Parsed`): literal text, kept as it is, and
    runs, written back from their translations."""

    def __init__(self, parts: Sequence[str | Run]) -> None:
        self.parts = list(parts)

    def sentences(self) -> list[str]:
        return [p.inline.text[s:e] for p in self.parts if isinstance(p, Run) for s, e in p.spans]

    def alignment(self, translations: Sequence[Aligned]) -> Pairs:
        return ()  # the document's words are its markup's too

    def line_of(self, k: int) -> int:
        return 1

    def rebuild(self, translations: Sequence[Aligned]) -> str:
        expected = sum(len(p.spans) for p in self.parts if isinstance(p, Run))
        if len(translations) != expected:
            raise ValueError(f"{expected} sentences but {len(translations)} translations")
        out, k = [], 0
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            else:
                out.append(part.write(translations[k : k + len(part.spans)]))
                k += len(part.spans)
        return "".join(out)
