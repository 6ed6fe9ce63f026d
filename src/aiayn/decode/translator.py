"""Text in, text out: tokenize, batch by tokens, search, detokenize, restore the input order.

Source sentences are fed to the encoder as ``tokenizer.encode(text) + [EOS]`` (no BOS), the same
convention as training (src = ids + [EOS], tgt_in = [BOS] + ids, tgt_out = ids + [EOS]).

* A blank (or all-whitespace) line gives a blank output without running the model.
* A source longer than the model's ``max_len`` (EOS included) is truncated to fit, with a warning
  on stderr naming the line (1-based); no line is ever dropped.
* An output never contains a line break: characters that ``str.splitlines`` splits on (a model
  can emit them through SentencePiece's byte fallback, e.g. ``<0x0A>``) become spaces, so the
  output keeps exactly one line per input line.
* Batches hold at most ``batch_tokens`` padded source tokens (at least one sentence), sentences
  sorted by length so that little padding is computed (:func:`aiayn.data.batching.token_batches`);
  outputs come back in input order.
* A **prefix** (per line, target text) is tokenized as the target side is, forced as the start of
  the output, and kept exactly as given in the text (the model continues after it).
* A **glossary** (``options.glossary``, :mod:`aiayn.decode.glossary`; its source terms found in
  their inflected forms too where ``options.glossary_language`` is given) makes each line's target
  terms constraints of a beam search (:mod:`aiayn.decode.constraints`), searched with the beam widened by
  one slot per term token for that line (said through ``warn`` in one message, the same each call);
  terms that do not fit the line's maximum output length are left out from the last, with a warning
  naming the line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Sequence

import torch

from aiayn.data.batching import pad, token_batches
from aiayn.decode import glossary
from aiayn.decode.align import (
    WORD_START,
    Pairs,
    alignment_layer,
    clamp_pairs,
    cross_attention,
    word_alignment,
    word_starts,
)
from aiayn.decode.constraints import beam_for, total_tokens
from aiayn.decode.request import TEXT, Line, LineLike, Translation, Wanted, as_lines
from aiayn.decode.search import Controls, DecodeOptions, Hypothesis, generate
from aiayn.decode.step import max_output_lengths
from aiayn.errors import Warn, warning

LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


#: The characters of a piece that ends a sentence (no such piece before a line's terms are met).
SENTENCE_ENDS = frozenset(".!?\u2026\u3002\uff01\uff1f")


@dataclass
class _Line:
    """What a line's search is given besides its source: a prefix, glossary terms (target ids) with
    their places (the source words of each term's source term), and the word of each source id."""

    prefix: list[int] = field(default_factory=list)
    terms: list[list[int]] = field(default_factory=list)
    places: list[list[int]] = field(default_factory=list)
    source_words: list[int] = field(default_factory=list)


def word_probabilities(text: str, pieces: Sequence[str], log_probs: Sequence[float]) -> tuple:
    """``(word, probability)`` for each word of ``text.split()``: the pieces' log-probabilities
    summed per word (a piece starting with ``▁`` starts one), the words matched in order (where the
    two counts differ, the extra pieces' words join the last word, an extra text word takes the last
    probability)."""
    words = text.split()
    if not words or not pieces:
        return ()
    sums = [0.0] * (word_starts(pieces)[-1] + 1)
    for index, log_prob in zip(word_starts(pieces), log_probs):
        sums[min(index, len(words) - 1)] += log_prob
    sums = sums[: len(words)]
    return tuple((word, math.exp(sums[min(k, len(sums) - 1)])) for k, word in enumerate(words))


def with_prefix(text: str, prefix: str, tokenizer) -> str:
    """``text`` (a translation that began with ``prefix``'s pieces) with the prefix exactly as the
    user gave it (tokenizing and detokenizing may normalise it), then the rest."""
    if not prefix:
        return text
    given = LINE_BREAKS.sub(" ", tokenizer.decode(tokenizer.encode(prefix, target=True)))
    rest = text[len(given) :] if text.startswith(given) else text
    return prefix + (rest.lstrip() if prefix[-1:].isspace() else rest)


def source_ids(tokenizer, config, text: str, warn: Warn, line_number: int | None = None) -> list[int]:
    """``text``'s ids, cut to leave room for the EOS in ``config.max_len``, with a warning naming the
    line (1-based) when cut: every engine truncates alike."""
    ids = tokenizer.encode(text)
    limit = config.max_len - 1
    if len(ids) > limit:
        where = f"line {line_number}: " if line_number is not None else ""
        warn(f"{where}source has {len(ids) + 1} tokens, more than max_len={limit + 1}; truncated")
    return ids[:limit]


class Translator:
    """Translate lines of text with a trained model and its tokenizer: the torch engine
    (:class:`~aiayn.decode.request.Backend`).

    ``options`` (:class:`DecodeOptions`) may be given whole or as keywords (``beam=4, alpha=0.6,
    nbest=1, max_len_a=1.0, max_len_b=50, use_cache=True, sample=False, temperature=1.0, top_k=0,
    top_p=1.0, seed=None, glossary=()``): the options of a call that gives none. ``progress`` is
    called with the number of sentences of each finished batch (for a progress bar). ``align_layer``:
    the decoder layer alignments are read from (default :func:`~aiayn.decode.align.alignment_layer`,
    the last).
    """

    name = "torch"

    def __init__(
        self,
        model,
        tokenizer,
        device: str | torch.device = "cpu",
        *,
        batch_tokens: int = 4096,
        options: DecodeOptions | None = None,
        warn: Warn = warning,
        align_layer: int | None = None,
        **option_values,
    ) -> None:
        self.model = model.to(device).eval()
        self.config = model.config
        self.align_layer = (
            alignment_layer(model.config.n_decoder_layers) if align_layer is None else align_layer
        )
        self.tokenizer, self.device = tokenizer, torch.device(device)
        self.batch_tokens, self.warn = batch_tokens, warn
        self.options = replace(options or DecodeOptions(), **option_values)
        self.progress: Callable[[int], None] | None = None
        self._kinds: tuple[torch.Tensor, torch.Tensor] | None = None  # see _piece_kinds

    def translate(
        self, lines: Sequence[LineLike], options: DecodeOptions | None = None, wanted: Wanted = TEXT
    ) -> list[Translation]:
        """One :class:`~aiayn.decode.request.Translation` per line (``options``: the translator's
        own when None); ``Translation("")`` for a blank line."""
        lines = as_lines(lines)
        options = replace(options or self.options, scores=wanted.scores or wanted.confidence)
        results = [Translation("") for _ in lines]
        for batch, src, hypotheses in self._decoded(lines, options):
            best = [hyps[0] for hyps in hypotheses]
            nbest = [
                [(h.score, self.text(h, lines[i].prefix)) for h in hyps] for i, hyps in zip(batch, hypotheses)
            ]
            texts = [found[0][1] for found in nbest]
            alignments = (
                self._align(src, [lines[i].text for i in batch], best, texts) if wanted.alignment else None
            )
            for k, i in enumerate(batch):
                asked = len(glossary.targets(options.glossary, lines[i].text, options.glossary_language))
                alignment = alignments[k] if alignments else ()
                results[i] = self._translation(best[k], nbest[k], alignment, asked, wanted)
        return results

    def hypotheses(self, lines: Sequence[LineLike]) -> list[list[Hypothesis]]:
        """Each line's hypotheses (tokens, scores, token log-probabilities), best first; [] for a blank
        line."""
        lines = as_lines(lines)
        found: list[list[Hypothesis]] = [[] for _ in lines]
        for batch, _, hypotheses in self._decoded(lines, self.options):
            for i, hyps in zip(batch, hypotheses):
                found[i] = hyps
        return found

    def encode_source(self, text: str, line_number: int | None = None) -> list[int]:
        """``encode(text) + [EOS]``, truncated (with a warning) to the model's ``max_len``."""
        return source_ids(self.tokenizer, self.config, text, self.warn, line_number) + [self.config.eos_id]

    def batches(self, sources: dict[int, list[int]]) -> list[list[int]]:
        """The keys of ``sources`` (line -> :meth:`encode_source` ids) in the batches decoded together."""
        return token_batches({i: len(ids) for i, ids in sources.items()}, self.batch_tokens)

    # --- internals ---------------------------------------------------------------------------------
    def _decoded(
        self, lines: Sequence[Line], options: DecodeOptions
    ) -> Iterator[tuple[list[int], torch.Tensor, list[list[Hypothesis]]]]:
        """Per batch: its lines' indices, their padded sources ``(B, S)`` and their hypotheses (best
        first). Lines whose glossary terms widen the beam are decoded in batches of their own beam."""
        sources = {
            i: self.encode_source(line.text, i + 1) for i, line in enumerate(lines) if line.text.strip()
        }
        controls = self._controls(lines, sources, options)
        for beam, group in self._beams(sources, controls, options).items():
            searched = replace(options, beam=beam)
            for batch in self.batches({i: sources[i] for i in group}):
                src = pad([sources[i] for i in batch], self.model.config.pad_id).to(self.device)  # (B, S)
                yield batch, src, generate(self.model, src, searched, self._batch_controls(batch, controls))
                if self.progress is not None:
                    self.progress(len(batch))

    def _controls(self, lines: Sequence[Line], sources, options: DecodeOptions) -> dict[int, _Line]:
        """Each line's prefix and glossary terms as target ids, fitted to its maximum output length."""
        if not any(line.prefix for line in lines) and not options.glossary:
            return {}
        limits = max_output_lengths(
            torch.tensor([len(ids) for ids in sources.values()]),
            options.max_len_a,
            options.max_len_b,
            self.model.config.max_len,
        )
        return {i: self._line(i, lines[i], sources[i], options, limit) for i, limit in zip(sources, limits)}

    def _line(self, i: int, line: Line, source: list[int], options: DecodeOptions, limit: int) -> _Line:
        room = self.model.config.max_len - 1
        ids = self.tokenizer.encode(line.prefix, target=True) if line.prefix else []
        if len(ids) > room:
            self.warn(f"line {i + 1}: the prefix has {len(ids)} tokens, more than an output's {room}; cut")
            ids = ids[:room]
        found = glossary.find(options.glossary, line.text, options.glossary_language)
        terms = [self.tokenizer.encode(f.target, target=True) for f in found]
        kept = list(terms)
        while kept and len(ids) + total_tokens(kept) > max(limit, len(ids)):
            kept.pop()
        if len(kept) < len(terms):
            self.warn(
                f"line {i + 1}: its glossary terms need {len(ids) + total_tokens(terms)} tokens, more than "
                f"the {max(limit, len(ids))} its translation may have; {len(kept)} of {len(terms)} kept"
            )
        if not kept:
            return _Line(ids)
        places = [list(f.words(line.text)) for f in found[: len(kept)]]
        pieces = [self.tokenizer.id_to_piece(t) for t in source[:-1]]  # its EOS last
        return _Line(ids, kept, places, [*word_starts(pieces), -1])

    def _beams(self, sources, controls: dict[int, _Line], options: DecodeOptions) -> dict[int, list[int]]:
        """The lines decoded with each beam: the options' own, or wider for a line's terms (said once)."""
        if options.sample:
            return {options.beam: list(sources)}
        groups: dict[int, list[int]] = {}
        for i in sources:
            terms = controls[i].terms if i in controls else []
            groups.setdefault(beam_for(options.beam, terms), []).append(i)
        if any(beam > options.beam for beam in groups):
            self.warn(
                f"glossary: lines with terms are searched with beam {options.beam} + one per term token"
            )
        return groups

    def _batch_controls(self, batch: list[int], controls: dict[int, _Line]) -> Controls:
        if not controls:
            return Controls()
        lines = [controls[i] for i in batch]
        terms = [line.terms for line in lines]
        if not any(terms):
            return Controls(prefixes=[line.prefix for line in lines])
        continues, ends = self._piece_kinds()
        return Controls(
            prefixes=[line.prefix for line in lines],
            terms=terms,
            continues=continues,
            ends=ends,
            places=[line.places for line in lines],
            source_words=[line.source_words for line in lines],
        )

    def _piece_kinds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(V,)`` each: the target pieces that continue a word (no ``▁``, a letter or digit first) and
        those that end a sentence (:data:`SENTENCE_ENDS` only, ``▁`` aside); computed once."""
        if self._kinds is None:
            piece = self.tokenizer.id_to_piece
            pieces = [piece(i, target=True) for i in range(self.model.config.tgt_vocab_size)]
            bare = [p.lstrip(WORD_START) for p in pieces]
            self._kinds = (
                torch.tensor([not p.startswith(WORD_START) and p[:1].isalnum() for p in pieces]),
                torch.tensor([bool(b) and set(b) <= SENTENCE_ENDS for b in bare]),
            )
        return self._kinds

    def text(self, hypothesis: Hypothesis, prefix: str = "") -> str:
        """The text of ``hypothesis`` (:meth:`detokenize`), its prefix kept as given."""
        return with_prefix(self.detokenize(hypothesis), prefix, self.tokenizer)

    def _translation(
        self, best: Hypothesis, nbest, alignment: Pairs, asked: int, wanted: Wanted
    ) -> Translation:
        """A line's answer from its hypotheses (``nbest``: their scores and texts, best first)."""
        text = nbest[0][1]
        if not (wanted.scores or wanted.confidence):  # a greedy search took no log-softmax
            nbest = [(math.nan, found) for _, found in nbest]
        terms = (best.met, asked)
        if not wanted.confidence:
            return Translation(text, alignment, nbest[0][0], tuple(nbest), terms=terms)
        lps = best.token_log_probs
        pieces = [self.tokenizer.id_to_piece(t, target=True) for t in best.tokens]
        confidence = sum(lps) / len(lps) if lps else 0.0
        words = word_probabilities(text, pieces, lps[: len(pieces)])
        return Translation(text, alignment, best.score, tuple(nbest), confidence, words, terms, len(lps))

    def _align(self, src, lines, best: list[Hypothesis], texts) -> list[Pairs]:
        """Each line's word alignment (over ``str.split()`` words of the line and of its text) read off
        the cross-attention."""
        weights = cross_attention(self.model, src, [h.tokens for h in best], self.align_layer)
        piece = self.tokenizer.id_to_piece
        pairs = []
        for row, line, hypothesis, text, rows in zip(range(len(lines)), lines, best, texts, weights):
            source = [piece(int(t)) for t in src[row] if int(t) != self.model.config.pad_id][:-1]
            found = word_alignment(rows, source, [piece(t, target=True) for t in hypothesis.tokens])
            pairs.append(clamp_pairs(found, len(line.split()), len(text.split())))
        return pairs

    def detokenize(self, hypothesis: Hypothesis) -> str:
        """The text of ``hypothesis`` on one line (characters that split lines become spaces)."""
        return LINE_BREAKS.sub(" ", self.tokenizer.decode(hypothesis.tokens))
