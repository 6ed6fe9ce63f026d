"""Fakes for the document format tests: a sentence splitter and translators with exact alignments."""

from __future__ import annotations

from aiayn.decode.request import Translation
from aiayn.documents.types import Parsed


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Sentences that end with a full stop followed by whitespace (or the text's end), stripped."""
    spans, start = [], None
    for pos, char in enumerate(text):
        if start is None and not char.isspace():
            start = pos
        if start is not None and char == "." and (pos + 1 == len(text) or text[pos + 1].isspace()):
            spans.append((start, pos + 1))
            start = None
    if start is not None:
        spans.append((start, len(text.rstrip())))
    return spans


def identity(sentence: str) -> Translation:
    words = sentence.split()
    return Translation(sentence, tuple((i, i) for i in range(len(words))))


def reverse(sentence: str) -> Translation:
    """The words in reverse order, each aligned to itself."""
    words = sentence.split()
    n = len(words)
    return Translation(" ".join(reversed(words)), tuple(sorted((i, n - 1 - i) for i in range(n))))


def upper(sentence: str) -> Translation:
    """Every word changed (so none is a copy of its source word), each aligned to its own."""
    words = sentence.split()
    return Translation(" ".join(w.upper() for w in words), tuple((i, i) for i in range(len(words))))


def merge_and_drop(sentence: str) -> Translation:
    """The first two words merged into one, the third dropped, the rest upper-cased."""
    words = sentence.split()
    if len(words) < 3:
        return upper(sentence)
    target = [(words[0] + words[1]).upper(), *(w.upper() for w in words[3:])]
    pairs = [(0, 0), (1, 0), *((i, i - 2) for i in range(3, len(words)))]
    return Translation(" ".join(target), tuple(pairs))


def unaligned(sentence: str) -> Translation:
    """Upper-cased words with no alignment at all."""
    return Translation(sentence.upper(), ())


def translate(parsed: Parsed, translator) -> str:
    return parsed.rebuild([translator(sentence) for sentence in parsed.sentences()])
