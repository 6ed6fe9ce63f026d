"""Decoding on the key/value cache: greedy search, beam search (GNMT length penalty), sampling.

    >>> from aiayn.decode import Translator
    >>> translator = Translator(model, tokenizer, beam=4, alpha=0.6)   # doctest: +SKIP
    >>> translator.translate(["A man is riding a bike."])               # doctest: +SKIP

:mod:`aiayn.decode.search` holds the searches (their conventions: length, score, stopping rule);
:mod:`aiayn.decode.step` the model as a step function; :mod:`aiayn.decode.cache` the key/value
cache it decodes with (rows of one source share its memory); :mod:`aiayn.decode.fast_step` the
step written for inference that the searches take on the CPU (and int8 there);
:mod:`aiayn.decode.translator` text in/out; :mod:`aiayn.decode.request` the one call every engine
answers (lines in, a :class:`Translation` per line out); :mod:`aiayn.decode.align` word alignments.
"""

from aiayn.decode.cache import GroupedDecoderCache
from aiayn.decode.request import Backend, Line, Translation, Wanted
from aiayn.decode.search import (
    DecodeOptions,
    Hypothesis,
    SearchPaths,
    SpecialIds,
    beam_search,
    generate,
    greedy_search,
    length_penalty,
    sample_search,
)
from aiayn.decode.step import ModelStep, max_output_lengths
from aiayn.decode.translator import Translator

__all__ = [
    "Backend",
    "DecodeOptions",
    "GroupedDecoderCache",
    "Hypothesis",
    "Line",
    "ModelStep",
    "SearchPaths",
    "SpecialIds",
    "Translation",
    "Translator",
    "Wanted",
    "beam_search",
    "generate",
    "greedy_search",
    "length_penalty",
    "max_output_lengths",
    "sample_search",
]
