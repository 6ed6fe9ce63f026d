"""Backends made of backends (each a :class:`~aiayn.decode.request.Backend`, so that documents,
batching and the routes take them as any engine):

* :class:`Tagged`: a multi-target model asked for one target: each source line starts with the
  target's ``>>xx<<`` piece (as opus-mt's models are trained), and the alignments leave it out.
* :class:`Chain`: a pivot, sentence by sentence: each line is translated by the first backend, its
  translation by the next, and so on. The answer is the last leg's, so that its text equals the
  legs run one after the other by hand. A ``prefix`` is the last leg's (target text); n-best
  lists are the last leg's hypotheses for the earlier legs' best; ``alignment`` is composed through
  the legs (source word i -> bridge word j -> target word k); ``confidence`` is the sum of the legs'
  (its ``probability`` the product of theirs), ``words`` and ``score`` the last leg's. A glossary is
  refused over a pivot (:func:`check_pivot_options`): its target terms are in the last leg's
  language but its source terms are not in that leg's source.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from aiayn.decode.align import Pairs
from aiayn.decode.request import TEXT, Backend, Line, LineLike, Translation, Wanted, as_lines
from aiayn.decode.search import DecodeOptions
from aiayn.errors import UserError


class Tagged:
    """``backend`` with every non-blank source line starting with ``token`` (``>>fr<<``)."""

    def __init__(self, backend: Backend, token: str) -> None:
        self.backend, self.token = backend, token
        self.name, self.tokenizer, self.config = backend.name, backend.tokenizer, backend.config
        self.progress: Callable[[int], None] | None = None

    def translate(
        self, lines: Sequence[LineLike], options: DecodeOptions, wanted: Wanted = TEXT
    ) -> list[Translation]:
        tagged = [
            replace(line, text=f"{self.token} {line.text}") if line.text.strip() else line
            for line in as_lines(lines)
        ]
        results = self.backend.translate(tagged, options, wanted)
        return [replace(r, alignment=_untagged(r.alignment)) for r in results]


def _untagged(pairs: Pairs) -> Pairs:
    """Pairs over the source without its first word (the ``>>xx<<`` piece)."""
    return tuple((i - 1, j) for i, j in pairs if i > 0)


class Chain:
    """``legs`` one after the other (a pivot), as one backend: the first leg's tokenizer and
    config (what documents count and split sentences with)."""

    def __init__(self, legs: Sequence[Backend]) -> None:
        self.legs = list(legs)
        self.name = self.legs[-1].name
        self.tokenizer, self.config = self.legs[0].tokenizer, self.legs[0].config
        self.progress: Callable[[int], None] | None = None

    def translate(
        self, lines: Sequence[LineLike], options: DecodeOptions, wanted: Wanted = TEXT
    ) -> list[Translation]:
        check_pivot_options(options)
        lines = as_lines(lines)
        between = replace(options, nbest=1)
        asked = Wanted(alignment=wanted.alignment, confidence=wanted.confidence)
        texts, earlier = [line.text for line in lines], []
        for leg in self.legs[:-1]:
            found = leg.translate(texts, between, asked)
            earlier.append(found)
            texts = [result.text for result in found]
        last = self.legs[-1].translate(
            [Line(t, line.prefix) for t, line in zip(texts, lines)], options, wanted
        )
        return [_joined([legs[k] for legs in earlier], result) for k, result in enumerate(last)]


def _joined(earlier: list[Translation], last: Translation) -> Translation:
    alignment = last.alignment
    for leg in reversed(earlier):
        alignment = compose(leg.alignment, alignment)
    confidence = last.confidence + sum(leg.confidence for leg in earlier)
    return replace(last, alignment=alignment, confidence=confidence)


def compose(first: Pairs, second: Pairs) -> Pairs:
    """Pairs (i, k) where ``first`` links source word i to bridge word j and ``second`` j to target
    word k; sorted, each once."""
    sources: dict[int, list[int]] = {}
    for i, j in first:
        sources.setdefault(j, []).append(i)
    return tuple(sorted({(i, k) for j, k in second for i in sources.get(j, ())}))


def check_pivot_options(options: DecodeOptions) -> None:
    if options.glossary:
        raise UserError(
            "glossary: not over a pivot (its source terms are not in the last model's source language); "
            "ask a pair that a model translates directly"
        )
