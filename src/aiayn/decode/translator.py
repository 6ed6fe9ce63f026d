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
from aiayn.decode.search import DecodeOptions, Hypothesis, generate

Warn = Callable[[str], None]
NBest = list[list[tuple[float, str]]]  # per line, its n-best (score, text), best first; [] for a blank line
LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def _stderr(message: str) -> None:
    print(f"aiayn: warning: {message}", file=sys.stderr)


class Translator:
    """Translate lines of text with a trained model and its tokenizer.

    ``options`` (:class:`DecodeOptions`) may be given whole or as keywords (``beam=4, alpha=0.6,
    nbest=1, max_len_a=1.0, max_len_b=50, use_cache=True, sample=False, temperature=1.0, top_k=0,
    top_p=1.0, seed=None``). ``progress`` is called with the number of sentences of each finished
    batch (for a progress bar).
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
        **option_values,
    ) -> None:
        self.model = model.to(device).eval()
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
    def _search(self, lines: Sequence[str], options: DecodeOptions) -> NBest:
        results: NBest = [[] for _ in lines]
        sources = {i: self.encode_source(line, i + 1) for i, line in enumerate(lines) if line.strip()}
        pad_id = self.model.config.pad_id
        for batch in self.batches(sources):
            src = pad([sources[i] for i in batch], pad_id).to(self.device)  # (B, S)
            hypotheses = generate(self.model, src, options)
            for i, hyps in zip(batch, hypotheses):
                results[i] = [(h.score, self.detokenize(h)) for h in hyps]
            if self.progress is not None:
                self.progress(len(batch))
        return results

    def detokenize(self, hypothesis: Hypothesis) -> str:
        """The text of ``hypothesis`` on one line (characters that split lines become spaces)."""
        return LINE_BREAKS.sub(" ", self.tokenizer.decode(hypothesis.tokens))
