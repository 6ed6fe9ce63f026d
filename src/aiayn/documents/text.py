"""Plain text: sentences between the whitespace that separates them, which is kept exactly.

A document is ``gap, sentence, gap, sentence, ..., gap``: every gap is whitespace (spaces, line
breaks, blank lines, indentation), kept as it is; each sentence is replaced by its translation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from aiayn.documents.types import Aligned, SplitSentences


@dataclass
class TextDocument:
    """A parsed plain-text document: ``parts[0::2]`` the gaps, ``parts[1::2]`` the sentences."""

    parts: list[str]
    starts: list[int]  # each sentence's offset in the document

    def sentences(self) -> list[str]:
        return self.parts[1::2]

    def rebuild(self, translations: Sequence[Aligned]) -> str:
        out = list(self.parts)
        out[1::2] = [t.text for t in translations]
        return "".join(out)

    def alignment(self, translations: Sequence[Aligned]) -> tuple[tuple[int, int], ...]:
        """The sentences' alignments over the whole document's words: ``str.split()`` of the
        document and of :meth:`rebuild`'s text (the gaps hold no words)."""
        pairs, source, target = [], 0, 0
        for sentence, translation in zip(self.sentences(), translations):
            pairs.extend((source + i, target + j) for i, j in translation.alignment)
            source, target = source + len(sentence.split()), target + len(translation.text.split())
        return tuple(pairs)

    def line_of(self, k: int) -> int:
        """The line (from 1) on which sentence ``k`` starts."""
        return self.parts[0].count("\n") + 1 + "".join(self.parts[1 : 2 * k + 1]).count("\n")


def parse_text(document: str, split: SplitSentences | None) -> TextDocument:
    """``document`` cut into gaps and sentences by ``split`` (None: the whole text, stripped, is one
    sentence)."""
    spans = split(document) if split is not None else _whole(document)
    parts, starts, end = [], [], 0
    for start, stop in spans:
        parts += [document[end:start], document[start:stop]]
        starts.append(start)
        end = stop
    parts.append(document[end:])
    return TextDocument(parts, starts)


def _whole(document: str) -> list[tuple[int, int]]:
    stripped = document.strip()
    if not stripped:
        return []
    start = len(document) - len(document.lstrip())
    return [(start, start + len(stripped))]
