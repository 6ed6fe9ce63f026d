"""Inline markup carried through translation by word alignment (Bergamot's and Marian's technique).

A format turns a run of inline content (a paragraph's text with its bold words, links, line breaks)
into an :class:`Inline`: the plain text the model translates, and the inline elements as character
ranges over it, each with the markup that opens and closes it. After translation,
:func:`transfer` writes the target text with every element around the target words aligned to the
source words it covered:

- an element wraps the target words from the first to the last one aligned to any source word inside
  it; an element stays inside its parent, and of two sibling ranges that would cross, the later one
  (in source order) keeps the longest part the earlier one leaves free;
- an element with no aligned word left (its words dropped by the translation, or taken by a
  sibling) is written empty where its neighbours suggest: after the target word aligned to the source
  word before it (the nearest aligned one in its sentence), else before the next aligned one, else at
  the end of its sentence's translation (an element that means nothing empty, as Markdown's ``**``,
  is then left out);
- a zero-width element (``<br>``, ``<img>``, or an untranslated element such as ``<code>`` whose whole
  markup is carried as one zero-width element) goes after the target word aligned to the source word
  before it; one glued to the following word (``<img>caption``) goes before the target word aligned
  to that word (a full stop or comma after it glues nothing: ``<code>x</code>.``);
- a translated word's punctuation is apart from its letters: the source's ``<a>Wiese</a>.`` gives
  ``<a>field</a>.``, its ``<a>Wiese.</a>`` gives ``<a>field.</a>``.

Every other element is written exactly once, and the result nests properly. Tags attach to words,
not to the spaces around them. Words are ``str.split()`` words, cut further where an element starts
or ends inside one (``H<sub>2</sub>O``): a target word equal to the source word it is aligned to
keeps those cuts, so tags inside copied words (formulas, names, numbers) stay where they were. Source
text that comes back unchanged (the whitespace between sentences, copied words) is written with its
source spelling (an entity, a Markdown escape); other text goes through the format's ``escape``.
Between two copied words that were neighbours in the source, with the same elements between them,
the source's own layout of tags and whitespace is written: a translation that changes nothing gives
the run back byte for byte.

Zero-width elements take whitespace with them: the model's text has one space where the source had
``a <br> b`` (the other goes with the ``<br>``), and a space where it had ``a<br>b``.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

from aiayn.decode.align import Pairs
from aiayn.decode.request import Translation

_WORD = re.compile(r"\S+")  # str.split()'s words: re's \s is str.isspace()

#: How a zero-width element sat between words, which decides where it goes and what whitespace
#: comes with it: "left" glued to the word before, "right" glued to the word after, "none" with
#: whitespace (or the text's edge) on both sides, "both" between two words with no space (a space
#: stands for it in the text), "inside" within a word (``<wbr>``).
GLUES = ("left", "right", "none", "both", "inside")
_LEFT, _RIGHT, _BETWEEN = 0, 1, 2  # which side of the whitespace at a gap an item is written on
CLOSING = frozenset(".,;:!?)]}…»”’")  # punctuation that ends a clause, glued to the word before it
_LEAD, _CORE, _TRAIL = 0, 1, 2  # a translated word's punctuation before its letters, they, after them


@dataclass(frozen=True)
class Element:
    """One inline element: ``[start, end)`` over :attr:`Inline.text` (``start == end``: zero-width)."""

    start: int
    end: int
    open: str
    close: str = ""
    parent: int = -1  # index of the enclosing element in Inline.elements, -1 for none
    glue: str = "none"  # for zero-width elements: one of GLUES
    lead: str = ""  # whitespace written before a zero-width element (taken out of the text)
    trail: str = ""  # whitespace written after it (taken out of the text)
    empty: bool = True  # written when it is left with no word (False: Markdown's emphasis, "****")


@dataclass(frozen=True)
class Inline:
    """A run of inline content: the text to translate and its elements, in document order.

    ``chunks`` are ``(start, end, raw)``: text the source spelled as ``raw``, or as itself where
    ``raw`` is ``None``; text in no chunk is escaped when it is written.
    """

    text: str
    elements: tuple[Element, ...] = ()
    chunks: tuple[tuple[int, int, str | None], ...] = ()
    #: The elements' tags between the words, in document order: ``(position, kind, element, whole)``
    #: with kind "o" (an element opens), "c" (closes) or "z" (an element with no word: ``whole``, its
    #: markup and text, ``(is text, string)`` pairs).
    events: tuple[tuple[int, str, int, tuple], ...] = ()
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _event_positions: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", tuple(s for s, _, _ in self.chunks))
        object.__setattr__(self, "_event_positions", tuple(e[0] for e in self.events))

    def between(self, start: int, end: int) -> tuple[tuple[int, str, int, tuple], ...]:
        """The events at positions ``start`` to ``end``, both included."""
        positions = self._event_positions
        return self.events[bisect.bisect_left(positions, start) : bisect.bisect_right(positions, end)]

    def source(self, start: int, end: int, escape: Callable[[str], str]) -> str:
        """``text[start:end]`` as the source spelled it (text with no spelling of its own: escaped)."""
        out, pos = [], start
        first = max(bisect.bisect_right(self._starts, start) - 1, 0)
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


# ---------------------------------------------------------------------------------------------
# Building an Inline


@dataclass
class _Open:
    start: int
    markup: str
    close: str = ""
    end: int = -1
    parent: int = -1
    separates: bool = True
    empty: bool = True


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
        self._chunks: list[tuple[int, int, str | None]] = []
        self._length = 0
        self._elements: list[_Open] = []
        self._stack: list[int] = []
        # in document order: ("text", start, end), or ("open" | "close" | "void", element, 0)
        self._log: list[tuple[str, int, int]] = []

    def text(self, text: str, raw: str | None = None) -> None:
        """Adds text; ``raw``: how the source spelled it (``None``: unknown, escaped on output)."""
        if text:
            if raw is not None:
                self._chunks.append((self._length, self._length + len(text), None if raw == text else raw))
            self._log.append(("text", self._length, self._length + len(text)))
            self._parts.append(text)
            self._length += len(text)

    def open(self, markup: str, empty: bool = True) -> None:
        parent = self._stack[-1] if self._stack else -1
        self._elements.append(_Open(self._length, markup, parent=parent, empty=empty))
        self._stack.append(len(self._elements) - 1)
        self._log.append(("open", len(self._elements) - 1, 0))

    def close(self, markup: str) -> None:
        index = self._stack.pop()
        self._elements[index].end, self._elements[index].close = self._length, markup
        self._log.append(("close", index, 0))

    def void(self, markup: str, separates: bool = True) -> None:
        parent = self._stack[-1] if self._stack else -1
        void = _Open(self._length, markup, end=self._length, parent=parent, separates=separates)
        self._elements.append(void)
        self._log.append(("void", len(self._elements) - 1, 0))

    def build(self) -> Inline:
        """The Inline; elements still open are closed at the end with no closing markup."""
        while self._stack:
            self.close("")
        raw_text = "".join(self._parts)
        glues, edits = _zero_width(raw_text, self._elements)
        text, shift = _apply(raw_text, edits)
        elements = tuple(_element(e, glues.get(i), shift) for i, e in enumerate(self._elements))
        chunks = _shift_chunks(self._chunks, raw_text, edits, shift)
        return Inline(text, elements, chunks, self._events(raw_text, shift))

    def _events(self, text: str, shift: Callable[[int, bool], int]) -> tuple:
        """The elements' tags between the words (see :attr:`Inline.events`), over the edited text.
        An element with no word inside is one event, with its whole markup."""
        out: list[tuple] = []
        whole: list[tuple[bool, str]] = []  # the markup and text of an element with no word, so far
        inside = -1
        for kind, index, end in self._log:
            if inside < 0 and kind == "text":
                continue
            element = self._elements[index] if kind != "text" else None
            if inside < 0 and kind != "void" and text[element.start : element.end].strip():
                position = shift(element.start if kind == "open" else element.end)
                out.append((position, kind[0], index, ()))
                continue
            if inside < 0:
                inside, whole = index, []
            if kind == "text":
                whole.append((True, text[index:end]))
            else:
                whole.append((False, element.close if kind == "close" else element.markup))
            if index == inside and kind in ("close", "void"):
                out.append((shift(element.start), "z", index, tuple(whole)))
                inside = -1
        return tuple(out)


def _element(e: _Open, glue: tuple[str, str, str] | None, shift: Callable[[int, bool], int]) -> Element:
    """The element over the edited text: its tags before a space put in at their place."""
    kind, lead, trail = glue or ("none", "", "")
    return Element(shift(e.start), shift(e.end), e.markup, e.close, e.parent, kind, lead, trail, e.empty)


def _zero_width(text: str, elements: list[_Open]) -> tuple[dict[int, tuple[str, str, str]], list]:
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
    glues: dict[int, tuple[str, str, str]] = {}
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement) over the text, in order
    taken = 0  # the text before this is not a later group's
    for k, pos in enumerate(positions):
        below, above = bisect.bisect_left(bounds, pos), bisect.bisect_right(bounds, pos)
        floor = pos if pos in opening else max(bounds[below - 1] if below else 0, taken)
        ceiling = len(text) if k + 1 == len(positions) else positions[k + 1]
        if above < len(bounds):
            ceiling = min(ceiling, bounds[above])
        if pos in closing:
            ceiling = pos
        separates = any(elements[i].separates for i in groups[pos])
        kind, lead, trail, edit = _glue(text, pos, separates, floor, ceiling)
        if edit is not None:
            edits.append(edit)
            taken = max(taken, edit[1])
        members = groups[pos]
        outer = [i for i in members if elements[i].parent not in members]  # not inside another member
        for i in members:
            glues[i] = (kind, lead if i == outer[0] else "", trail if i == outer[-1] else "")
    return glues, edits


def _glue(text: str, pos: int, separates: bool, floor: int, ceiling: int) -> tuple:
    """(glue, lead, trail, edit) of a group at ``pos``; its whitespace is within [floor, ceiling).
    Punctuation that closes a clause after it (``<code>x</code>.``) glues nothing: the word it would
    follow in the translation is the model's."""
    before = pos > 0 and not text[pos - 1].isspace()
    after = pos < len(text) and not text[pos].isspace() and text[pos] not in CLOSING
    if before and after:
        return ("both", "", "", (pos, pos, " ")) if separates else ("inside", "", "", None)
    if before:
        return "left", "", "", None
    if after:
        return "right", "", "", None
    start, end = pos, pos
    while start > floor and text[start - 1].isspace():
        start -= 1
    if start < pos:
        return "none", text[start:pos], "", (start, pos, "")
    while end < ceiling and text[end].isspace():
        end += 1
    return "none", "", text[pos:end], ((pos, end, "") if end > pos else None)


def _apply(text: str, edits: list[tuple[int, int, str]]) -> tuple[str, Callable[[int, bool], int]]:
    """The edited text, and the map of an old offset to the new one: an offset inside a deleted
    range goes to where the range was; at an insertion, to its left or (``right``) its right side."""
    out, last = [], 0
    for start, end, new in edits:
        out += [text[last:start], new]
        last = end
    out.append(text[last:])
    if not edits:
        return text, lambda pos, right=False: pos

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


def _shift_chunks(chunks, text: str, edits, shift) -> tuple[tuple[int, int, str | None], ...]:
    """The chunks over the edited text: a chunk with a spelling of its own cut by an edit is dropped."""
    cuts = [(s, e) for s, e, _ in edits]
    out = []
    for start, end, raw in chunks:
        cut = any(s < end and e > start and (s > start or e < end) for s, e in cuts)
        new_start, new_end = shift(start, True), shift(end)
        if new_start < new_end and (raw is None or not cut):
            out.append((new_start, new_end, raw))
    for start, _, new in edits:  # the spaces put in
        if new:
            out.append((shift(start), shift(start) + len(new), None))
    return tuple(sorted(out))


# ---------------------------------------------------------------------------------------------
# Writing the translation with the elements


def _identity(text: str) -> str:
    return text


def transfer(
    inline: Inline,
    spans: Sequence[tuple[int, int]],
    translations: Sequence[Translation],
    escape: Callable[[str], str] = _identity,
) -> str:
    """The translated run with its elements: ``translations[k]`` translates ``inline.text[s:e]`` for
    ``(s, e) = spans[k]``; the text between spans (whitespace) is kept as it was."""
    if len(spans) != len(translations):
        raise ValueError(f"{len(spans)} sentences but {len(translations)} translations")
    source = _Source(inline, spans)
    target = _Target(source, translations)
    layout = _Layout(source, target)
    return _Writer(source, target, layout, escape).write()


@dataclass
class _Source:
    """The source side: segments (sentences and the text between them), words, and pieces (words
    cut where an element starts or ends inside them)."""

    inline: Inline
    spans: Sequence[tuple[int, int]]
    segments: list[tuple[int, int, int]] = field(default_factory=list)  # (start, end, sentence or -1)
    words: list[tuple[int, int, int]] = field(default_factory=list)  # (start, end, segment)
    word_pieces: list[range] = field(default_factory=list)
    pieces: list[tuple[int, int, int]] = field(default_factory=list)  # (start, end, word)
    piece_segment: list[int] = field(default_factory=list)
    segment_words: list[range] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.segments = _segments(self.spans, len(self.inline.text))
        cuts = sorted({p for e in self.inline.elements for p in (e.start, e.end)})
        for index, (start, end, _) in enumerate(self.segments):
            first = len(self.words)
            words = [m.span() for m in _WORD.finditer(self.inline.text, start, end)]
            if _cut_inside(words, cuts[bisect.bisect_right(cuts, start) : bisect.bisect_left(cuts, end)]):
                for word_start, word_end in words:
                    self._add_word(word_start, word_end, index, cuts)
            else:  # a piece per word
                self._add_whole_words(words, index)
            self.segment_words.append(range(first, len(self.words)))
        self.starts = [s for s, _, _ in self.pieces]
        self.ends = [e for _, e, _ in self.pieces]

    def _add_whole_words(self, words: list[tuple[int, int]], segment: int) -> None:
        first_word, first_piece = len(self.words), len(self.pieces)
        self.pieces += [(start, end, first_word + k) for k, (start, end) in enumerate(words)]
        self.piece_segment += [segment] * len(words)
        self.word_pieces += [range(first_piece + k, first_piece + k + 1) for k in range(len(words))]
        self.words += [(start, end, segment) for start, end in words]

    def _add_word(self, start: int, end: int, segment: int, cuts: list[int]) -> None:
        inner = cuts[bisect.bisect_right(cuts, start) : bisect.bisect_left(cuts, end)]
        bounds = [start, *inner, end]
        first = len(self.pieces)
        for lo, hi in zip(bounds, bounds[1:]):
            self.pieces.append((lo, hi, len(self.words)))
            self.piece_segment.append(segment)
        self.word_pieces.append(range(first, len(self.pieces)))
        self.words.append((start, end, segment))


def _cut_inside(words: list[tuple[int, int]], cuts: list[int]) -> bool:
    """Whether one of the (sorted) ``cuts`` falls inside one of the (sorted) ``words``."""
    starts = [start for start, _ in words]
    for cut in cuts:
        k = bisect.bisect_right(starts, cut) - 1
        if k >= 0 and words[k][0] < cut < words[k][1]:
            return True
    return False


def _edges(text: str, start: int, end: int) -> list[tuple[int, int, int]]:
    """``text[start:end]`` (a word) as its leading punctuation, letters and trailing punctuation:
    ``(start, end, kind)`` of each part there is (one part for a word of letters or of punctuation)."""
    low, high = start, end
    while low < high and not text[low].isalnum():
        low += 1
    while high > low and not text[high - 1].isalnum():
        high -= 1
    if low == high:
        return [(start, end, _CORE)]
    parts = [(start, low, _LEAD), (low, high, _CORE), (high, end, _TRAIL)]
    return [(lo, hi, kind) for lo, hi, kind in parts if lo < hi]


def _segments(spans: Sequence[tuple[int, int]], length: int) -> list[tuple[int, int, int]]:
    out, pos = [], 0
    for k, (start, end) in enumerate(spans):
        if start > pos:
            out.append((pos, start, -1))
        out.append((start, end, k))
        pos = end
    if pos < length:
        out.append((pos, length, -1))
    return out


@dataclass
class _Target:
    """The target side: the translated run's plain text (translations, and the source's text between
    them), its pieces, and for each source piece the first and last target piece aligned to it."""

    source: _Source
    translations: Sequence[Translation]

    def __post_init__(self) -> None:
        self.parts: list[str] = []
        self.copies: list[tuple[int, int, int]] = []  # (target start, target end, source start)
        self.pieces: list[tuple[int, int]] = []
        self.copy_of: list[int] = []  # the source piece a target piece copies, or -1
        self.kind: list[int] = []  # what a target piece holds of its word: _LEAD, _CORE or _TRAIL
        self.segment_end: list[int] = []  # the first target piece after each segment's
        self.low: list[int] = [-1] * len(self.source.pieces)  # -1: no aligned target piece
        self.high: list[int] = [-1] * len(self.source.pieces)
        self._length = 0
        for index, segment in enumerate(self.source.segments):
            self._add_segment(index, segment)
        self.text = "".join(self.parts)

    def _add_segment(self, index: int, segment: tuple[int, int, int]) -> None:
        start, end, sentence = segment
        source_words = self.source.segment_words[index]
        if sentence < 0:
            text = self.source.inline.text[start:end]
            self.copies.append((self._length, self._length + len(text), start))
            pairs = [(i, i) for i in range(len(source_words))]
        else:
            text = self.translations[sentence].text.strip()
            pairs = list(self.translations[sentence].alignment)
        words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
        pairs = [(source_words[i], j) for i, j in pairs if 0 <= i < len(source_words) and 0 <= j < len(words)]
        self._add_words(text, words, pairs)
        self.parts.append(text)
        self._length += len(text)
        self.segment_end.append(len(self.pieces))

    def _add_words(self, text: str, words: list[tuple[int, int]], pairs: list[tuple[int, int]]) -> None:
        source = self.source
        copies = self._copies(text, words, pairs)
        targets = [self._add_word(text, lo, hi, copies.get(j, -1)) for j, (lo, hi) in enumerate(words)]
        for i, j in pairs:
            target = targets[j]
            if copies.get(j, -1) == i:  # piece to piece
                for piece in source.word_pieces[i]:
                    other = target[piece - source.word_pieces[i][0]]
                    self._link(piece, other, other)
                continue
            for piece in source.word_pieces[i]:
                self._link(piece, *self._match(piece, source.word_pieces[i], target))

    def _match(self, piece: int, word: range, target: range) -> tuple[int, int]:
        """The target pieces a source piece of ``word`` is aligned to, in the target word ``target``:
        punctuation to punctuation, letters to letters (``<a>Wiese</a>.`` -> ``<a>field</a>.``);
        the whole word where one side has no such part."""
        if len(target) == 1:
            return target[0], target[0]
        start, end, _ = self.source.pieces[piece]
        text = self.source.inline.text[start:end]
        kinds = {self.kind[t]: t for t in target}
        if not any(ch.isalnum() for ch in text):  # punctuation alone, cut off its word by an element
            side = _TRAIL if piece == word[-1] else _LEAD if piece == word[0] else None
            found = kinds.get(side)
            return (found, found) if found is not None else (target[0], target[-1])
        low = kinds.get(_LEAD) if not text[0].isalnum() else None
        high = kinds.get(_TRAIL) if not text[-1].isalnum() else None
        core = kinds[_CORE]
        return (core if low is None else low), (core if high is None else high)

    def _copies(
        self, text: str, words: list[tuple[int, int]], pairs: list[tuple[int, int]]
    ) -> dict[int, int]:
        """Target word -> the source word aligned to it that it copies (written with the source's
        spelling, its tags inside it, and the source's layout between it and a copied neighbour)."""
        source = self.source
        copies: dict[int, int] = {}
        source_text = source.inline.text
        for i, j in pairs:
            (source_start, source_end, _), (start, end) = source.words[i], words[j]
            if source_end - source_start == end - start and j not in copies:
                if source_text[source_start:source_end] == text[start:end]:
                    copies[j] = i
        return copies

    def _add_word(self, text: str, start: int, end: int, copy: int) -> range:
        """The target pieces of a word: a copy's are its source word's; another word's are its
        letters and, apart from them, the punctuation before and after them."""
        first = len(self.pieces)
        if copy < 0:
            for lo, hi, kind in _edges(text, start, end):
                self.pieces.append((self._length + lo, self._length + hi))
                self.copy_of.append(-1)
                self.kind.append(kind)
            return range(first, len(self.pieces))
        source_start = self.source.words[copy][0]
        for piece in self.source.word_pieces[copy]:
            lo, hi, _ = self.source.pieces[piece]
            offset = self._length + start - source_start
            self.pieces.append((offset + lo, offset + hi))
            self.copy_of.append(piece)
            self.kind.append(_CORE)
        return range(first, len(self.pieces))

    def _link(self, piece: int, low: int, high: int) -> None:
        if self.low[piece] < 0:
            self.low[piece], self.high[piece] = low, high
        else:
            self.low[piece], self.high[piece] = min(self.low[piece], low), max(self.high[piece], high)


class _Layout:
    """Where each element goes: a range of target pieces, or a gap between pieces (an item), or
    inside its parent when the parent has no range."""

    def __init__(self, source: _Source, target: _Target) -> None:
        self.source, self.target = source, target
        self.elements = source.inline.elements
        self.range: list[tuple[int, int] | None] = [None] * len(self.elements)
        self.children: dict[int, list[int]] = {}  # parent -> its ranged children, by range
        self.items: dict[int, dict[int, list[int]]] = {}  # parent -> gap -> items, in source order
        self.inner: dict[int, list[int]] = {}  # parent with no range -> its children
        taken: dict[int, list[tuple[int, int]]] = {}
        for index, element in enumerate(self.elements):
            self._set_range(index, element, taken)
        for index, element in enumerate(self.elements):
            if self.range[index] is not None:
                self.children.setdefault(element.parent, []).append(index)
        for children in self.children.values():
            children.sort(key=lambda i: self.range[i])
        for index, element in enumerate(self.elements):
            if self.range[index] is None:
                self._set_item(index, element)

    def _set_range(self, index: int, element: Element, taken: dict[int, list[tuple[int, int]]]) -> None:
        parent = element.parent
        if element.start == element.end or (parent >= 0 and self.range[parent] is None):
            return
        span = self._aligned(element)
        if span is not None and parent >= 0:
            low, high = self.range[parent]
            span = (max(span[0], low), min(span[1], high)) if span[0] <= high and span[1] >= low else None
        siblings = taken.setdefault(parent, [])
        span = _free(span, siblings) if span is not None else None
        if span is not None:
            self.range[index] = span
            siblings.append(span)

    def _aligned(self, element: Element) -> tuple[int, int] | None:
        """The first and last target pieces aligned to the source pieces inside the element."""
        first = bisect.bisect_left(self.source.starts, element.start)
        last = bisect.bisect_left(self.source.starts, element.end)
        lows = [self.target.low[p] for p in range(first, last) if self.target.low[p] >= 0]
        if not lows:
            return None
        return min(lows), max(self.target.high[p] for p in range(first, last) if self.target.low[p] >= 0)

    def _set_item(self, index: int, element: Element) -> None:
        parent = element.parent
        if parent >= 0 and self.range[parent] is None:
            self.inner.setdefault(parent, []).append(index)
            return
        low, high = self.range[parent] if parent >= 0 else (0, len(self.target.pieces) - 1)
        gap = min(max(self._neighbour_gap(element), low), high + 1)
        for sibling in self.children.get(parent, ()):
            start, end = self.range[sibling]
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
        glued_right = element.start == element.end and element.glue == "right"
        home = after if (glued_right or before < 0) else before
        if home >= len(source.pieces):
            home = before
        if home < 0:
            return 0
        segment = source.piece_segment[home]
        searches = (self._after(after, segment), self._before(before, segment))
        for gap in searches if glued_right else searches[::-1]:
            if gap is not None:
                return gap
        return self.target.segment_end[segment]

    def _before(self, piece: int, segment: int) -> int | None:
        while piece >= 0 and self.source.piece_segment[piece] == segment:
            if self.target.low[piece] >= 0:
                return self.target.high[piece] + 1
            piece -= 1
        return None

    def _after(self, piece: int, segment: int) -> int | None:
        while piece < len(self.source.pieces) and self.source.piece_segment[piece] == segment:
            if self.target.low[piece] >= 0:
                return self.target.low[piece]
            piece += 1
        return None


def _free(span: tuple[int, int], taken: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The longest part of ``span`` outside the ``taken`` ranges (the first one of a tie)."""
    free = [span]
    for low, high in taken:
        parts = [((a, min(b, low - 1)), (max(a, high + 1), b)) for a, b in free]
        free = [part for pair in parts for part in pair if part[0] <= part[1]]
    return max(free, key=lambda part: part[1] - part[0], default=None)


class _Writer:
    """Writes the target text with the elements' markup at the gaps between pieces."""

    def __init__(self, source: _Source, target: _Target, layout: _Layout, escape: Callable[[str], str]):
        self.source, self.target, self.layout, self.escape = source, target, layout, escape
        self.inline = source.inline
        self.copy_starts = [start for start, _, _ in target.copies]
        self.copied = [index for index, copy in enumerate(target.copy_of) if copy >= 0]  # pieces

    def write(self) -> str:
        """The text up to each gap with markup, that gap, and so on; the rest of the text."""
        gaps: dict[int, list[tuple]] = {}
        self._walk(-1, 0, len(self.target.pieces) - 1, gaps)
        out: list[str] = []
        pos = 0
        for gap in sorted(gaps):
            start, end = self._bounds(gap)
            out.append(self._spell(pos, start))
            self._flush(gap, gaps[gap], out)
            pos = end
        out.append(self._spell(pos, len(self.target.text)))
        return "".join(out)

    def _walk(self, parent: int, low: int, high: int, gaps: dict[int, list[tuple]]) -> None:
        """The markup of ``parent``'s content (pieces ``low..high``) at its gaps: (side, markup).
        Its items at a child's first gap go before the child, those at the gap after it after it."""
        items = self.layout.items.get(parent, {})
        at = sorted(items)
        k = 0
        for child in self.layout.children.get(parent, ()):
            start, end = self.layout.range[child]
            while k < len(at) and at[k] <= start:
                self._items(items[at[k]], at[k], gaps)
                k += 1
            gaps.setdefault(start, []).append((_RIGHT, self.layout.elements[child].open, "o", child))
            self._walk(child, start, end, gaps)
            gaps.setdefault(end + 1, []).append((_LEFT, self.layout.elements[child].close, "c", child))
        for gap in at[k:]:
            self._items(items[gap], gap, gaps)

    def _items(self, indices: Sequence[int], gap: int, gaps: dict[int, list[tuple]]) -> None:
        """Items at a gap: elements with no word, or zero-width, each on the side of the gap's
        whitespace it was on, with the whitespace it took out of the text."""
        for index in indices:
            element = self.layout.elements[index]
            side, lead, trail = _LEFT, element.lead, element.trail
            if element.start == element.end:
                side = {"right": _RIGHT, "both": _BETWEEN}.get(element.glue, _LEFT)
                if element.glue == "none":
                    side, lead, trail = self._apart(gap, lead, trail)
            gaps.setdefault(gap, []).append((side, lead + self._markup(index) + trail, "z", index))

    def _apart(self, gap: int, lead: str, trail: str) -> tuple[int, str, str]:
        """Side and whitespace of an element that stood apart from the words on both sides: with the
        whitespace it took before it, on the left of the gap's own; with the one after it, on the
        right; a space on a side with a word and no whitespace."""
        start, end = self._bounds(gap)
        words_after = gap < len(self.target.pieces)
        if trail:
            if not words_after and start == end:
                return _LEFT, " " if gap > 0 else "", ""
            return _RIGHT, "", trail
        lead = lead or (" " if gap > 0 else "")
        closing = words_after and self.target.text[start : end + 1][-1:] in CLOSING
        return _LEFT, lead, " " if words_after and start == end and not closing else ""

    def _markup(self, index: int) -> str:
        """An element written with no words: its markup around its children's (a Markdown element
        that means nothing empty goes if it has no children either)."""
        element = self.layout.elements[index]
        children = self.layout.inner.get(index, ())
        inner = "".join(
            self.layout.elements[c].lead + self._markup(c) + self.layout.elements[c].trail for c in children
        )
        return element.open + inner + element.close if element.empty or inner else inner

    def _flush(self, gap: int, items: list[tuple], out: list[str]) -> None:
        """The items at a gap and its whitespace. Where the gap is a gap of the source (its words on
        both sides copied) with the same elements in the same order, it is written as the source
        had it; else the whitespace goes after the items written on the left of it (closing tags,
        elements glued to the word before), before the others, and an element that stood for a
        space between two glued words takes the place of a single space."""
        start, end = self._bounds(gap)
        plain = self.target.text[start:end]
        source = self._source_gap(gap, plain)
        if source is not None:
            events = self.inline.between(*source)
            if [(kind, i) for _, kind, i, _ in events] == [(k, i) for _, _, k, i in items]:
                self._replay(source, events, out)
                return
        spelled = self._spell(start, end)
        placed = False
        for side, markup, _, _ in items:
            if side == _BETWEEN and 0 < gap < len(self.target.pieces) and plain == " " and not placed:
                placed, spelled = True, ""
            elif side == _RIGHT and not placed:
                out.append(spelled)
                placed = True
            out.append(markup)
        if not placed:
            out.append(spelled)

    def _source_gap(self, gap: int, plain: str) -> tuple[int, int] | None:
        """The source positions between the source pieces that the pieces around ``gap`` copy, if
        they were neighbours there with the same text between them."""
        copy_of, pieces, last = self.target.copy_of, self.source.pieces, len(self.target.pieces)
        left = copy_of[gap - 1] if gap > 0 else -1
        right = copy_of[gap] if gap < last else len(pieces)
        if (gap > 0 and left < 0) or (gap < last and right < 0) or right != left + 1:
            return None
        start = pieces[left][1] if left >= 0 else 0
        end = pieces[right][0] if right < len(pieces) else len(self.inline.text)
        return (start, end) if self.inline.text[start:end] == plain else None

    def _replay(self, source: tuple[int, int], events: tuple, out: list[str]) -> None:
        """The source's layout between two words: its tags, and its whitespace between them (that
        of the text, and that taken out of it with a zero-width element; not a space put in)."""
        position = source[0]
        for at, kind, index, whole in events:
            out.append(self.inline.source(position, at, self.escape) if position < at else "")
            element = self.layout.elements[index]
            if kind != "z":
                out.append(element.open if kind == "o" else element.close)
                position = max(position, at)
                continue
            markup = "".join(self.escape(t) if is_text else t for is_text, t in whole) or self._markup(index)
            out.append(element.lead + markup + element.trail)
            after = element.end if element.start < element.end else at + (element.glue == "both")
            position = max(position, after)  # past the text it holds, or the space put in for it
        end = source[1]
        out.append(self.inline.source(position, end, self.escape) if position < end else "")

    def _bounds(self, gap: int) -> tuple[int, int]:
        """The target text between pieces ``gap - 1`` and ``gap``."""
        pieces = self.target.pieces
        start = pieces[gap - 1][1] if gap > 0 else 0
        return start, pieces[gap][0] if gap < len(pieces) else len(self.target.text)

    def _spell(self, start: int, end: int) -> str:
        """``target.text[start:end]`` (whole pieces and gaps) as written: escaped, except the pieces
        copied from the source and the whitespace around them, written with the source's spelling."""
        text = self.target.text
        if start >= end or not self.inline.chunks:
            return self.escape(text[start:end])
        pieces = self.target.pieces
        out, pos = [], start
        first = bisect.bisect_left(self.copied, bisect.bisect_left(pieces, (start, start)))
        for index in self.copied[first:]:
            piece_start, piece_end = pieces[index]
            if piece_start >= end:
                break
            space = max(pieces[index - 1][1] if index > 0 else 0, pos)
            out += [self.escape(text[pos:space]), self._space(index, space, piece_start), self._piece(index)]
            after = pieces[index + 1][0] if index + 1 < len(pieces) else len(text)
            pos = min(after, end)
            out.append(self._space(index + 1 if after <= end else -1, piece_end, pos))
        out.append(self.escape(text[pos:end]))
        return "".join(out)

    def _piece(self, index: int) -> str:
        start, end = self.target.pieces[index]
        copy = self.target.copy_of[index]
        if copy >= 0:
            source_start, source_end, _ = self.source.pieces[copy]
            return self.inline.source(source_start, source_end, self.escape)
        return self.escape(self.target.text[start:end])

    def _space(self, gap: int, start: int, end: int) -> str:
        """Whitespace ``[start, end)`` before piece ``gap`` (-1: unknown), as written: the source's
        spelling where it is copied from the text between sentences, or between two copied words
        that were neighbours in the source; else escaped."""
        if start >= end:
            return ""
        plain = self.target.text[start:end]
        k = bisect.bisect_right(self.copy_starts, start) - 1
        if k >= 0 and end <= self.target.copies[k][1]:
            offset = self.target.copies[k][2] - self.copy_starts[k]
            return self.inline.source(start + offset, end + offset, self.escape)
        if 0 < gap < len(self.target.pieces):
            left, right = self.target.copy_of[gap - 1], self.target.copy_of[gap]
            if left >= 0 and right == left + 1:
                source_start, source_end = self.source.pieces[left][1], self.source.pieces[right][0]
                if self.inline.text[source_start:source_end] == plain:
                    return self.inline.source(source_start, source_end, self.escape)
        return self.escape(plain)


# ---------------------------------------------------------------------------------------------
# A document as literal text and runs to translate


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

    def write(self, translations: Sequence[Translation]) -> str:
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

    def alignment(self, translations: Sequence[Translation]) -> Pairs:
        return ()  # the document's words are its markup's too

    def line_of(self, k: int) -> int:
        return 1

    def rebuild(self, translations: Sequence[Translation]) -> str:
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
