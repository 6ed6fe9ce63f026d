"""Sentence segmentation: a text's sentences as character offsets, in the source language's rules.

    >>> segmenter = segmenter_for("de")
    >>> segmenter.split("Wir brauchen z. B. Äpfel. Dann gehen wir heim.")
    ['Wir brauchen z. B. Äpfel.', 'Dann gehen wir heim.']

The rules are sentencex's (Wikimedia; chosen on accuracy and speed in ``benchmarks/segmenters.py``,
see ``benchmarks/README.md``): abbreviations, ordinals, numbers, quotes and ellipses per language.
A language it has no rules for gets a language-neutral rule (:func:`neutral_spans`), said once.

What holds for every text, whatever the library does with it: the spans are in order, do not
overlap, start and end on non-whitespace, and together cover every non-whitespace character, so
that the text between and around them is whitespace only (a document is rebuilt from the spans and
that whitespace). A blank line (two or more line breaks) always ends a sentence; a single line
break inside a sentence does not by itself end one (the rules decide). Whitespace is Python's
(``str.isspace``: NBSP, the Unicode spaces and line separators included).
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

import sentencex

# The languages sentencex 1.0 has rules of its own for, and the ISO 639-1 codes its fallback chain
# leads to one of them (cs -> sk, lb -> de, gl -> pt, ...; src/languages/fallbacks.rs). Any other
# code would silently get its English rules; here it gets the neutral rule, and a warning.
_OWN_RULES = "am ar bg bn ca da de el en es fi fr gu hi hy it ja kk kn ml mr my nl pa pl pt ru sk ta te uk"
_BY_FALLBACK = "ab an av ay ba bm ce co cs cv gl gn ht kl kv lb li ln mg oc os qu rm sa sg tt ty wa wo"
SUPPORTED: frozenset[str] = frozenset(f"{_OWN_RULES} {_BY_FALLBACK}".split())

_BLANK_LINE = re.compile(r"\n\s*\n")  # two or more line breaks with only whitespace between
_NONSPACE = re.compile(r"\S")
_WORD = re.compile(r"\S+")
# The neutral rule's candidates: terminal punctuation, closing quotes or brackets (French spacing
# before a closing guillemet allowed: « Non. »), then whitespace
_CLOSING = "\"'\u201d\u201c\u2019\u2018\u00bb\u00ab\u203a\u2039)\\]}"
_TERMINAL = re.compile(f"[.!?\u2026]+(?:[ \u00a0\u202f]?[{_CLOSING}])*(\\s+)")
_OPENING = frozenset("\"'\u201c\u201e\u201a\u2018\u00ab\u00bb\u2039\u203a([{\u00bf\u00a1")
# Whitespace beyond ASCII (NBSP, the Unicode spaces, U+2028, U+3000): each is one plain space to sentencex
_WIDE_SPACE = re.compile("[\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")
_SEARCH_SLACK = 256  # how far past its expected place a library's sentence is looked for


class Segmenter:
    """The sentences of a text in one language (``language``, ISO 639-1), or by the language-neutral
    rule (``language`` None). Build one with :func:`segmenter_for`."""

    def __init__(self, language: str | None) -> None:
        if language is not None and language not in SUPPORTED:
            raise ValueError(f"no sentence rules for {language!r}; use segmenter_for()")
        self.language = language

    def __repr__(self) -> str:
        return f"Segmenter({self.language!r})"

    def spans(self, text: str) -> list[tuple[int, int]]:
        """(start, end) character offsets of each sentence of text, in order, non-overlapping,
        each stripped of surrounding whitespace (text[start:end] == text[start:end].strip() and
        non-empty); everything between/around spans is whitespace only. Never loses non-whitespace
        text: the union of spans covers every non-whitespace character."""
        spans = []
        for start, end in _paragraphs(text):
            block = text[start:end]
            found = neutral_spans(block) if self.language is None else self._library_spans(block)
            spans.extend((start + a, start + b) for a, b in found)
        return spans

    def split(self, text: str) -> list[str]:
        """The sentences of text: ``[text[a:b] for a, b in self.spans(text)]``."""
        return [text[a:b] for a, b in self.spans(text)]

    def _library_spans(self, block: str) -> list[tuple[int, int]]:
        """sentencex's sentences of block, which has no blank lines. sentencex 1.0.32 panics on an
        initial before non-ASCII whitespace ("A\\xa0."), so it is given the block with such
        whitespace made a plain space (offsets unchanged); a panic left is the neutral rule's."""
        plain = _WIDE_SPACE.sub(" ", block)
        try:
            return spans_of(plain, sentencex.segment(self.language, plain))
        except BaseException as err:  # pyo3's PanicException is a BaseException
            if type(err).__name__ != "PanicException":
                raise
            return neutral_spans(block)


def segmenter_for(language: str | None, warn: Callable[[str], None] | None = None) -> Segmenter:
    """The segmenter for ``language`` (an ISO 639-1 code; a region or script after "-" or "_" is
    ignored, case too): sentencex's rules where it has them (:data:`SUPPORTED`), otherwise the
    language-neutral rule, and then ``warn`` is called once, with one line saying so."""
    code = _primary_code(language)
    if code in SUPPORTED:
        return Segmenter(code)
    if warn is not None:
        named = "no source language given" if language is None else f"no sentence segmenter for {language!r}"
        warn(f"{named}; using a language-neutral rule (a sentence ends at . ! ? or … before a capital)")
    return Segmenter(None)


def _primary_code(language: str | None) -> str | None:
    if language is None:
        return None
    return re.split(r"[-_]", language.strip().lower(), maxsplit=1)[0]


def _paragraphs(text: str) -> Iterable[tuple[int, int]]:
    """The stripped, non-empty stretches of text between blank lines, as offsets."""
    start = 0
    for gap in _BLANK_LINE.finditer(text):
        yield from _stripped(text, start, gap.start())
        start = gap.end()
    yield from _stripped(text, start, len(text))


def _stripped(text: str, start: int, end: int) -> Iterable[tuple[int, int]]:
    first = _NONSPACE.search(text, start, end)
    if first is not None:
        yield first.start(), start + len(text[start:end].rstrip())


def neutral_spans(text: str) -> list[tuple[int, int]]:
    """The language-neutral rule, on a text with no blank lines: a sentence ends after ., !, ? or …
    (a run of them), with any closing quotes or brackets, where whitespace follows and then a letter
    that is not lowercase (a capital, or a letter of a script without case), a digit or an opening
    quote or bracket. No abbreviations: "Dr. Smith" is two sentences by this rule."""
    stretch = next(iter(_stripped(text, 0, len(text))), None)
    if stretch is None:
        return []
    start, end = stretch
    spans = []
    for candidate in _TERMINAL.finditer(text, start, end):
        if _opens_sentence(text[candidate.end()]):  # the stretch ends on non-whitespace: in range
            spans.append((start, candidate.start(1)))
            start = candidate.end()
    spans.append((start, end))
    return spans


def _opens_sentence(char: str) -> bool:
    return (char.isalnum() and not char.islower()) or char in _OPENING


def spans_of(text: str, pieces: Iterable[str]) -> list[tuple[int, int]]:
    """The offsets in ``text`` of the sentences a library returned for it (``pieces``, in order),
    each stripped, with the invariants of :meth:`Segmenter.spans`. Each piece is looked for where
    the previous one ended; one the library changed (whitespace collapsed, characters replaced) is
    placed by counting its non-whitespace characters. Text the library dropped joins the sentence
    after it, or the last sentence at the end: nothing is lost."""
    spans: list[tuple[int, int]] = []
    cursor = 0
    for piece in pieces:
        core = piece.strip()
        first = _NONSPACE.search(text, cursor)
        if not core or first is None:
            continue
        start = _find(text, core, cursor, first.start())
        end = start + len(core) if start >= 0 else _count_forward(text, first.start(), core)
        spans.append((first.start(), end))
        cursor = end
    tail = _NONSPACE.search(text, cursor)
    if tail is not None:
        last = len(text.rstrip())
        spans[-1:] = [(spans[-1][0], last)] if spans else [(tail.start(), last)]
    return spans


def _find(text: str, core: str, cursor: int, first: int) -> int:
    """Where ``core`` starts at or after ``cursor``: at the first non-whitespace character as a rule,
    else within a bounded window (linear time over a text however many pieces miss); -1 if not."""
    if text.startswith(core, first):
        return first
    return text.find(core, cursor, first + 2 * len(core) + _SEARCH_SLACK)


def _count_forward(text: str, first: int, core: str) -> int:
    """The end of as many non-whitespace characters of text, from ``first``, as ``core`` has."""
    wanted = sum(len(word) for word in core.split())
    end = first + 1
    for word in _WORD.finditer(text, first):
        size = word.end() - word.start()
        end = word.start() + min(wanted, size)
        wanted -= size
        if wanted <= 0:
            break
    return end
