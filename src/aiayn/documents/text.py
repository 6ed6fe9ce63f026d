"""Plain text: sentences between the whitespace that separates them, which is kept exactly.

A document is ``gap, sentence, gap, sentence, ..., gap``: every gap is whitespace (spaces, line
breaks, blank lines, indentation), kept as it is; each sentence is replaced by its translation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from aiayn.decode.align import Pairs, joined_alignment
from aiayn.decode.request import Translation
from aiayn.documents.types import SplitSentences


@dataclass
class TextDocument:
    """A parsed plain-text document: ``parts[0::2]`` the gaps, ``parts[1::2]`` the sentences."""

    parts: list[str]
    starts: list[int]  # each sentence's offset in the document

    def sentences(self) -> list[str]:
        return self.parts[1::2]

    def rebuild(self, translations: Sequence[Translation]) -> str:
        out = list(self.parts)
        out[1::2] = [t.text for t in translations]
        return "".join(out)

    def alignment(self, translations: Sequence[Translation]) -> Pairs:
        """The sentences' alignments over the whole document's words: ``str.split()`` of the
        document and of :meth:`rebuild`'s text (the gaps hold no words)."""
        return joined_alignment(self.sentences(), translations)

    def line_of(self, k: int) -> int:
        """The line (from 1) on which sentence ``k`` starts."""
        return self.parts[0].count("\n") + 1 + "".join(self.parts[1 : 2 * k + 1]).count("\n")


def parse_text(document: str, split: SplitSentences) -> TextDocument:
    """``document`` cut into gaps and sentences by ``split``."""
    spans = split(document)
    parts, starts, end = [], [], 0
    for start, stop in spans:
        parts += [document[end:start], document[start:stop]]
        starts.append(start)
        end = stop
    parts.append(document[end:])
    return TextDocument(parts, starts)


def whole(text: str) -> list[tuple[int, int]]:
    """The whole text, stripped, as one sentence (a :data:`SplitSentences` that splits nothing)."""
    stripped = text.strip()
    if not stripped:
        return []
    start = len(text) - len(text.lstrip())
    return [(start, start + len(stripped))]
