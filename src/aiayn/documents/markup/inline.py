"""The inline model: a run's plain text and its inline elements as character ranges over it.

A format builds an :class:`Inline` for each run of inline content (a paragraph's text with its bold
words, links and line breaks): the text the model translates, the elements with the markup that opens
and closes each, how the source spelled its text (:class:`Chunk`), and where the tags stood between
the words (:class:`Event`), so that what the translation leaves unchanged is written as it was.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from enum import Enum
from operator import attrgetter
from typing import Callable, NamedTuple

CLOSING = frozenset(".,;:!?)]}…»”’")  # punctuation that ends a clause, glued to the word before it


class Glue(str, Enum):
    """How a zero-width element sat between words, which decides where it goes and what whitespace
    comes with it."""

    LEFT = "left"  # glued to the word before
    RIGHT = "right"  # glued to the word after
    NONE = "none"  # whitespace (or the text's edge) on both sides
    BOTH = "both"  # between two words with no space (a space stands for it in the text)
    INSIDE = "inside"  # within a word (``<wbr>``)


@dataclass(frozen=True)
class Element:
    """One inline element: ``[start, end)`` over :attr:`Inline.text` (``start == end``: zero-width)."""

    start: int
    end: int
    open: str
    close: str = ""
    parent: int = -1  # index of the enclosing element in Inline.elements, -1 for none
    glue: Glue = Glue.NONE  # for zero-width elements
    lead: str = ""  # whitespace written before a zero-width element (taken out of the text)
    trail: str = ""  # whitespace written after it (taken out of the text)
    empty: bool = True  # written when it is left with no word (False: Markdown's emphasis, "****")


#: ``text[start:end]`` as the source spelled it: ``raw``, or the text itself where ``raw`` is None
Chunk = NamedTuple("Chunk", [("start", int), ("end", int), ("raw", str | None)])
#: What an :class:`Event` writes: an element's opening tag, its closing tag, or the whole of an element
#: with no word inside (its markup and the text it holds)
Tag = Enum("Tag", "OPEN CLOSE WHOLE")


class Event(NamedTuple):
    """An element's tag at ``position`` between the words; ``whole`` (:attr:`Tag.WHOLE`): its markup
    and text as ``(is text, string)`` pairs."""

    position: int
    tag: Tag
    element: int
    whole: tuple[tuple[bool, str], ...] = ()


@dataclass(frozen=True)
class Inline:
    """A run of inline content: the text to translate and its elements, in document order.

    Text in no chunk is escaped when it is written. ``events`` are the elements' tags between the
    words, in document order.
    """

    text: str
    elements: tuple[Element, ...] = ()
    chunks: tuple[Chunk, ...] = ()
    events: tuple[Event, ...] = ()

    def between(self, start: int, end: int) -> tuple[Event, ...]:
        """The events at positions ``start`` to ``end``, both included."""
        events, key = self.events, attrgetter("position")
        return events[bisect.bisect_left(events, start, key=key) : bisect.bisect_right(events, end, key=key)]

    def source(self, start: int, end: int, escape: Callable[[str], str]) -> str:
        """``text[start:end]`` as the source spelled it (text with no spelling of its own: escaped)."""
        out, pos = [], start
        first = max(bisect.bisect_right(self.chunks, start, key=attrgetter("start")) - 1, 0)
        for s, e, raw in self.chunks[first:]:
            if s >= end:
                break
            lo, hi = max(s, start), min(e, end)
            if lo >= hi:
                continue
            if lo > pos:
                out.append(escape(self.text[pos:lo]))
            if raw is None:
                out.append(self.text[lo:hi])
            else:  # a spelling of its own (an entity, an escape) is whole or not at all
                out.append(raw if (lo, hi) == (s, e) else escape(self.text[lo:hi]))
            pos = hi
        if pos < end:
            out.append(escape(self.text[pos:end]))
        return "".join(out)
