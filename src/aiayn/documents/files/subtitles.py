"""SubRip subtitles (.srt), read and written by the ``srt`` library.

Each cue's text is translated as one run: its lines joined with single spaces (a cue is often one
sentence broken for the screen), its tags (``<i>``, ``<b>``, ``<u>``, ``<font ...>``) carried by
alignment as HTML's inline elements are, ``{\\...}`` positioning codes carried as zero-width items.
The translation is broken again into as many lines as the cue had (at most), at the spaces that
make the lines' lengths closest to equal. Cue numbers and timings are kept (written by ``srt`` in
the canonical ``HH:MM:SS,mmm --> HH:MM:SS,mmm`` form), and so is any text after the timings.
"""

from __future__ import annotations

import bisect
import re
from typing import TYPE_CHECKING

import srt

from aiayn.documents.files.package import translate_runs
from aiayn.documents.files.types import characters
from aiayn.documents.markup import Inline, InlineBuilder
from aiayn.errors import UserError

if TYPE_CHECKING:
    from aiayn.decode.search import DecodeOptions
    from aiayn.documents.translate import DocumentTranslator

_TAG = re.compile(r"<(/?)(i|b|u|font)\b[^>]*>|\{\\[^}]*\}", re.IGNORECASE)


class Cue:
    """A cue's text as a run (a :class:`~aiayn.documents.files.package.Paragraph` written as text)."""

    def __init__(self, content: str) -> None:
        self.lines = len([line for line in content.split("\n") if line.strip()])
        builder = InlineBuilder()
        stack: list[str] = []
        pos = 0
        text = " ".join(line.strip() for line in content.split("\n") if line.strip())
        for match in _TAG.finditer(text):
            builder.text(text[pos : match.start()], text[pos : match.start()])
            name = (match.group(2) or "").lower()
            if not name:
                builder.void(match.group(0), separates=False)
            elif not match.group(1):
                builder.open(match.group(0))
                stack.append(name)
            elif stack and stack[-1] == name:
                builder.close(match.group(0))
                stack.pop()
            else:
                builder.void(match.group(0), separates=False)
            pos = match.end()
        builder.text(text[pos:], text[pos:])
        self.inline: Inline = builder.build()


def rewrap(text: str, lines: int) -> str:
    """``text`` broken at spaces outside tags into at most ``lines`` lines of near-equal length."""
    if lines <= 1:
        return text
    visible = _TAG.sub("", text)
    spaces = []  # (position in text, visible characters before it)
    seen, pos = 0, 0
    for match in list(_TAG.finditer(text)) + [None]:
        end = match.start() if match else len(text)
        for k in range(pos, end):
            if text[k] == " ":
                spaces.append((k, seen))
            seen += 1
        pos = match.end() if match else end
    if not spaces:
        return text
    before = [seen for _, seen in spaces]  # increasing: each space is a visible character
    cuts: list[int] = []
    for j in range(1, lines):
        goal = len(visible) * j / lines
        k = bisect.bisect_left(before, goal)  # the space nearest the goal: k - 1 or k (the first on a tie)
        if k == len(before) or (k > 0 and goal - before[k - 1] <= before[k] - goal):
            k -= 1
        best = spaces[k][0]
        if not cuts or best > cuts[-1]:
            cuts.append(best)
    out, last = [], 0
    for cut in cuts:
        out.append(text[last:cut])
        last = cut + 1
    out.append(text[last:])
    return "\n".join(out)


class Subtitles:
    def __init__(self, text: str, name: str) -> None:
        try:
            self.cues = list(srt.parse(text))
        except (srt.SRTParseError, ValueError, IndexError, OverflowError) as err:  # Overflow: a huge time
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserError(f"{name}: not SubRip subtitles ({message[:200]})") from None
        self.name = name
        self.runs = [Cue(cue.content) for cue in self.cues]

    @property
    def characters(self) -> int:
        return sum(characters(run.inline.text) for run in self.runs)

    def translate(self, translator: DocumentTranslator, options: DecodeOptions) -> tuple[str, int]:
        written, sentences = translate_runs(translator, options, self.runs, self.name, escape=_identity)
        cues = []
        for cue, run, text in zip(self.cues, self.runs, written):
            content = cue.content if text is None else rewrap(text, run.lines)
            cues.append(srt.Subtitle(cue.index, cue.start, cue.end, content, cue.proprietary))
        return srt.compose(cues, reindex=False), sentences


def _identity(text: str) -> str:
    return text
