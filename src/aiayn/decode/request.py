"""The one way in to translation: lines in, one :class:`Translation` per line out.

Every engine (:class:`~aiayn.decode.Translator`, the CTranslate2 backend of
:mod:`aiayn.decode.backends`) and whatever stands between an engine and its callers (the server's
``BatchedBackend``, in front of its batcher) answers the same call, :meth:`Backend.translate`::

    backend.translate([Line("Ein Hund läuft."), Line("Zwei Männer", prefix="Two men")],
                      DecodeOptions(beam=4, nbest=2), Wanted(scores=True, alignment=True))

* a :class:`Line` is what differs from line to line: its source text and the target text its
  translation starts with (a plain string is a line without a prefix);
* :class:`~aiayn.decode.search.DecodeOptions` is how to search, the same for every line of a call:
  beam, length penalty, n-best size, sampling, glossary;
* :class:`Wanted` is what to compute besides each line's texts: their scores, the best text's
  confidence (its tokens' log-probabilities) and its word alignment. What is not wanted may be
  skipped (greedy search then takes no log-softmax); what a call may get anyway (a batch shared with
  calls that wanted more) is never wrong, so callers read only what they asked for.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass
from typing import Any, Callable, Protocol, Sequence, Union, runtime_checkable

from aiayn.decode.align import Pairs
from aiayn.decode.search import DecodeOptions


@dataclass(frozen=True)
class Line:
    """One line to translate: its source ``text`` and the ``prefix`` its translation starts with
    (target text; the model continues after it, and it is kept in the output exactly as given)."""

    text: str
    prefix: str = ""


@dataclass(frozen=True)
class Wanted:
    """What a call wants besides the texts: ``scores`` (each hypothesis's log P / lp), ``confidence``
    (the best hypothesis's token log-probabilities: :attr:`Translation.confidence`, ``words``,
    ``length``; with its score), ``alignment`` (the best hypothesis's word alignment)."""

    scores: bool = False
    confidence: bool = False
    alignment: bool = False

    def __or__(self, other: "Wanted") -> "Wanted":
        """What either wants: what a batch of both computes."""
        return Wanted(*(a or b for a, b in zip(astuple(self), astuple(other))))


@dataclass(frozen=True)
class Translation:
    """One line's answer.

    ``text``: the best translation (``""`` for a blank line); ``alignment``: its ``(source word,
    target word)`` pairs over ``str.split()`` words of the line and of ``text`` (with
    ``Wanted.alignment``, :mod:`aiayn.decode.align`); ``score``: log P / lp, NaN where not wanted or
    not computed; ``nbest``: every hypothesis ``(score, text)``, best first (``options.nbest`` of
    them; ``()`` for a blank line); with ``Wanted.confidence``: ``confidence`` (the mean
    log-probability of its tokens, EOS included; ``probability`` is its exp), ``words`` (each word of
    ``text.split()`` with its probability: the product of its pieces'), ``length`` (the tokens scored;
    0, with ``confidence`` 0.0 and no ``words``, where confidence was not computed); ``terms``:
    glossary terms (met, asked).
    """

    text: str
    alignment: Pairs = ()
    score: float = math.nan
    nbest: tuple[tuple[float, str], ...] = ()
    confidence: float = 0.0
    words: tuple[tuple[str, float], ...] = ()
    terms: tuple[int, int] = (0, 0)
    length: int = 0

    @property
    def probability(self) -> float:
        return math.exp(self.confidence)


#: What every engine takes as a line: a :class:`Line`, or a string (a line without a prefix).
LineLike = Union[Line, str]
TEXT = Wanted()  #: the texts only


def as_lines(lines: Sequence[LineLike]) -> list[Line]:
    return [line if isinstance(line, Line) else Line(line) for line in lines]


@runtime_checkable
class Backend(Protocol):
    """What translates: ``name`` (its engine), ``tokenizer`` (:class:`~aiayn.data.Tokenizer`),
    ``config`` (:class:`~aiayn.TransformerConfig`), ``progress`` (None, or called with the number of
    sentences of each finished batch) and :meth:`translate`.

    Every engine keeps :class:`~aiayn.decode.Translator`'s text conventions: a blank line gives
    ``Translation("")``, a source longer than ``max_len`` is truncated with a warning naming the line,
    line breaks in an output become spaces, the answers come in the order of the lines. An engine
    answers one call at a time (its model, ``progress`` and ``warn`` are its own): the server calls
    it from one thread."""

    progress: Callable[[int], None] | None

    @property
    def name(self) -> str: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def config(self) -> Any: ...

    def translate(
        self, lines: Sequence[LineLike], options: DecodeOptions, wanted: Wanted = TEXT
    ) -> list[Translation]: ...
