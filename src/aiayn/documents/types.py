"""What the documents layer passes between its parts: a translated sentence with its word alignment,
and the protocol each format (plain text, HTML, Markdown) follows.

A format turns one document into the sentences to translate (:meth:`Parsed.sentences`) and builds
the translated document back from their translations (:meth:`Parsed.rebuild`). The sentences of many
documents are translated together, in one stream of token-bounded batches, between the two calls.

Words are ``str.split()`` words on both sides: an alignment pair ``(i, j)`` says that source word
``i`` of the sentence is aligned to target word ``j`` of its translation (Moses' ``i-j``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence


@dataclass(frozen=True)
class Aligned:
    """One translated sentence: its text and ``(source word, target word)`` pairs, sorted."""

    text: str
    alignment: tuple[tuple[int, int], ...] = field(default=())


def moses(pairs: Sequence[tuple[int, int]]) -> str:
    """An alignment in Moses' format: ``0-0 1-2 ...``."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


def joined_alignment(sources: Sequence[str], translations: Sequence[Aligned]) -> tuple[tuple[int, int], ...]:
    """The alignment of ``sources`` and of their ``translations``, each joined with whitespace: every
    pair shifted by the words of the texts before it."""
    pairs, source, target = [], 0, 0
    for text, translation in zip(sources, translations):
        pairs.extend((source + i, target + j) for i, j in translation.alignment)
        source, target = source + len(text.split()), target + len(translation.text.split())
    return tuple(pairs)


#: The sentence spans of a text: ``(start, end)`` offsets, stripped, in order (see
#: :class:`aiayn.documents.segment.Segmenter`).
SplitSentences = Callable[[str], list[tuple[int, int]]]
#: Translations of sentences, one :class:`Aligned` per sentence, in order.
TranslateSentences = Callable[[Sequence[str]], list[Aligned]]
Warn = Callable[[str], None]
#: The document formats (``aiayn translate --format``, the API's ``format``)
FORMATS = ("text", "html", "markdown")


class Parsed(Protocol):
    """One parsed document of some format."""

    def sentences(self) -> list[str]:
        """The sentences to translate, in document order (no blank ones)."""
        ...

    def rebuild(self, translations: Sequence[Aligned]) -> str:
        """The translated document: ``translations[k]`` is the translation of ``sentences()[k]``."""
        ...
