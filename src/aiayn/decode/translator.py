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
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from typing import Callable, Sequence

import torch

from aiayn.data.batching import pad, token_batches
from aiayn.decode.align import Pairs, alignment_layer, cross_attention, word_alignment
from aiayn.decode.search import DecodeOptions, Hypothesis, generate

Warn = Callable[[str], None]
NBest = list[list[tuple[float, str]]]  # per line, its n-best (score, text), best first; [] for a blank line
#: per line, its best translation and that translation's word alignment (:mod:`aiayn.decode.align`)
AlignedLines = list[tuple[str, Pairs]]
LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def clamp_pairs(pairs: Pairs, source_words: int, target_words: int) -> Pairs:
    """``pairs`` within the texts' words: pieces and ``str.split()`` words can disagree at the edges
    (a normalised character, an unknown piece decoded with spaces), so an index past the last word
    is read as the last word."""
    if not source_words or not target_words:
        return ()
    return tuple(sorted({(min(i, source_words - 1), min(j, target_words - 1)) for i, j in pairs}))


def _stderr(message: str) -> None:
    print(f"aiayn: warning: {message}", file=sys.stderr)


class Translator:
    """Translate lines of text with a trained model and its tokenizer.

    ``options`` (:class:`DecodeOptions`) may be given whole or as keywords (``beam=4, alpha=0.6,
    nbest=1, max_len_a=1.0, max_len_b=50, use_cache=True, sample=False, temperature=1.0, top_k=0,
    top_p=1.0, seed=None``). ``progress`` is called with the number of sentences of each finished
    batch (for a progress bar). ``align_layer``: the decoder layer alignments are read from
    (default :func:`~aiayn.decode.align.alignment_layer`, the last).
    """

    def __init__(
        self,
        model,
        tokenizer,
        device: str | torch.device = "cpu",
        *,
        batch_tokens: int = 4096,
        options: DecodeOptions | None = None,
        warn: Warn = _stderr,
        align_layer: int | None = None,
        **option_values,
    ) -> None:
        self.model = model.to(device).eval()
        self.align_layer = (
            alignment_layer(model.config.n_decoder_layers) if align_layer is None else align_layer
        )
        self.tokenizer, self.device = tokenizer, torch.device(device)
        self.batch_tokens, self.warn = batch_tokens, warn
        self.options = replace(options or DecodeOptions(), **option_values)
        self.progress: Callable[[int], None] | None = None

    def translate(self, lines: Sequence[str]) -> list[str]:
        """One detokenized translation per line (the best hypothesis)."""
        options = replace(self.options, nbest=1, scores=False)  # text only: greedy skips the log-softmax
        return [nbest[0][1] if nbest else "" for nbest in self._search(lines, options)]

    def translate_nbest(self, lines: Sequence[str], nbest: int | None = None) -> NBest:
        """``nbest`` (default: the options') ``(score, text)`` pairs per line, best first; [] for a
        blank line."""
        options = replace(self.options, nbest=nbest or self.options.nbest)
        return self._search(lines, options)

    def translate_aligned(self, lines: Sequence[str]) -> AlignedLines:
        """The best translation of each line with its ``(source word, target word)`` pairs (words:
        ``str.split()``); ``("", ())`` for a blank line."""
        options = replace(self.options, nbest=1, scores=False)
        aligned: AlignedLines = [("", ()) for _ in lines]
        self._search(lines, options, aligned=aligned)
        return aligned

    def encode_source(self, text: str, line_number: int | None = None) -> list[int]:
        """``encode(text) + [EOS]``, truncated (with a warning) to the model's ``max_len``."""
        ids = self.tokenizer.encode(text)
        limit = self.model.config.max_len - 1
        if len(ids) > limit:
            where = f"line {line_number}: " if line_number is not None else ""
            self.warn(f"{where}source has {len(ids) + 1} tokens, more than max_len={limit + 1}; truncated")
            ids = ids[:limit]
        return ids + [self.model.config.eos_id]

    def batches(self, sources: dict[int, list[int]]) -> list[list[int]]:
        """The keys of ``sources`` (line -> :meth:`encode_source` ids) in the batches decoded together."""
        return token_batches({i: len(ids) for i, ids in sources.items()}, self.batch_tokens)

    # --- internals ---------------------------------------------------------------------------------
    def _search(
        self, lines: Sequence[str], options: DecodeOptions, aligned: AlignedLines | None = None
    ) -> NBest:
        """The n-best of each line; with ``aligned``, also its best translation and alignment there."""
        results: NBest = [[] for _ in lines]
        sources = {i: self.encode_source(line, i + 1) for i, line in enumerate(lines) if line.strip()}
        pad_id = self.model.config.pad_id
        for batch in self.batches(sources):
            src = pad([sources[i] for i in batch], pad_id).to(self.device)  # (B, S)
            hypotheses = generate(self.model, src, options)
            for i, hyps in zip(batch, hypotheses):
                results[i] = [(h.score, self.detokenize(h)) for h in hyps]
            if aligned is not None:
                best = [hyps[0] for hyps in hypotheses]
                texts = [results[i][0][1] for i in batch]
                self._align(
                    src, batch, [lines[i] for i in batch], [sources[i] for i in batch], best, texts, aligned
                )
            if self.progress is not None:
                self.progress(len(batch))
        return results

    def _align(
        self, src, batch, lines, sources, best: list[Hypothesis], texts, aligned: AlignedLines
    ) -> None:
        """Each line of ``batch``: its best text (``texts``) and the word alignment read off the
        cross-attention."""
        weights = cross_attention(self.model, src, [h.tokens for h in best], self.align_layer)
        piece = self.tokenizer.id_to_piece
        for i, line, ids, hypothesis, text, rows in zip(batch, lines, sources, best, texts, weights):
            pairs = word_alignment(rows, [piece(t) for t in ids[:-1]], [piece(t) for t in hypothesis.tokens])
            aligned[i] = (text, clamp_pairs(pairs, len(line.split()), len(text.split())))

    def detokenize(self, hypothesis: Hypothesis) -> str:
        """The text of ``hypothesis`` on one line (characters that split lines become spaces)."""
        return LINE_BREAKS.sub(" ", self.tokenizer.decode(hypothesis.tokens))
