"""What the documents layer passes between its parts: the protocol each format (plain text, HTML,
Markdown) follows.

A format turns one document into the sentences to translate (:meth:`Parsed.sentences`) and builds
the translated document back from their translations (:meth:`Parsed.rebuild`). The sentences of many
documents are translated together, in one stream of token-bounded batches, between the two calls.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from aiayn.decode.align import Pairs
from aiayn.decode.request import Translation

#: The sentence spans of a text: ``(start, end)`` offsets, stripped, in order (see
#: :class:`aiayn.documents.segment.Segmenter`).
SplitSentences = Callable[[str], list[tuple[int, int]]]
#: The document formats (``aiayn translate --format``, the API's ``format``)
FORMATS = ("text", "html", "markdown")


class Sentences(Protocol):
    """What the translator's stream reads of a parsed document: its sentences, and where each is."""

    def sentences(self) -> list[str]: ...

    def line_of(self, k: int) -> int: ...


class Parsed(Protocol):
    """One parsed document of some format."""

    def sentences(self) -> list[str]:
        """The sentences to translate, in document order (no blank ones)."""
        ...

    def rebuild(self, translations: Sequence[Translation]) -> str:
        """The translated document: ``translations[k]`` is the translation of ``sentences()[k]``."""
        ...

    def alignment(self, translations: Sequence[Translation]) -> Pairs:
        """The sentences' word alignments over the words of the document and of its translation
        (``()`` where those words are not the sentences' own: markup)."""
        ...

    def line_of(self, k: int) -> int:
        """The line (from 1) on which sentence ``k`` starts, for warnings."""
        ...
