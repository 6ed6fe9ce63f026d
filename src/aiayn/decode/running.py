"""Step-level batching: a beam search whose batch takes new sentences between its steps.

A server's requests arrive while others are being decoded. Decoding them batch by batch (each
batch to its end before the next starts) makes a batch run as many steps as its longest sentence,
with fewer rows at each step as the short ones finish, and keeps every answer until the whole
batch is done. :class:`RunningSearch` lets sentences join the batch between steps instead, as the
finished ones leave and are answered (the iteration-level scheduling of Orca, Yu et al. 2022): the
batch stays full, and a short sentence does not wait for a long one.

Each sentence is searched exactly as :func:`~aiayn.decode.search.beam_search` searches it (its own
beams, maximum length and stopping rule), so it gets the hypotheses it gets alone, up to float
rounding, as between any two batchings (tested). The model side is
:meth:`~aiayn.decode.step.ModelStep.join`: the new sources are encoded and their rows start at
their first step (:mod:`aiayn.decode.cache`). Beam search only (``beam >= 2``, on the cache):
greedy search and sampling decode whole batches (:func:`~aiayn.decode.search.generate`).
"""

from __future__ import annotations

import torch

from aiayn.decode.search import DecodeOptions, Hypothesis, SpecialIds, _Beams
from aiayn.decode.step import ModelStep, max_output_lengths, source_lengths


class RunningSearch:
    """Beam search over sentences added at any time; :meth:`step` runs one step of all of them.

    ``model`` in eval mode; ``options`` as :func:`~aiayn.decode.search.generate` takes them
    (:meth:`supports` says which). Sentences are source ids (with their EOS), known by the key
    :meth:`add` returns.
    """

    def __init__(self, model, options: DecodeOptions) -> None:
        if not self.supports(options):
            raise ValueError("a running search is a beam search (beam >= 2, no sampling) on the cache")
        config = model.config
        self.model, self.options = model, options
        self.ids = SpecialIds(config.bos_id, config.eos_id, config.pad_id)
        self.device = next(model.parameters()).device
        self._pending: list[tuple[int, list[int]]] = []  # (key, source ids): join at the next step
        self._search: tuple[ModelStep, _Beams] | None = None
        self._next_key = 0

    @staticmethod
    def supports(options: DecodeOptions) -> bool:
        return options.beam >= 2 and not options.sample and options.use_cache

    def add(self, source: list[int]) -> int:
        """Queue one sentence's source ids to join at the next step; returns its key."""
        key, self._next_key = self._next_key, self._next_key + 1
        self._pending.append((key, source))
        return key

    @property
    def sentences(self) -> int:
        """Sentences added and not yet finished."""
        return len(self._pending) + (len(self._search[1].active) if self._search else 0)

    def step(self) -> dict[int, list[Hypothesis]]:
        """Join the sentences added since the last step, run one step; returns the n-best (best
        first) of each sentence that finished at it, by key."""
        with torch.inference_mode():
            self._join()
            if self._search is None:
                return {}
            beams = self._search[1]
            beams.advance()
            done = {s: self._nbest(beams.finished.pop(s)) for s in beams.completed}
            if not beams.active:
                self._search = None
            return done

    def _nbest(self, finished: list[Hypothesis]) -> list[Hypothesis]:
        return sorted(finished, key=lambda h: -h.score)[: self.options.nbest]

    def _join(self) -> None:
        if not self._pending:
            return
        keys, src = [key for key, _ in self._pending], self._pad([ids for _, ids in self._pending])
        self._pending = []
        o = self.options
        max_lens = max_output_lengths(
            source_lengths(src, self.ids.pad), o.max_len_a, o.max_len_b, self.model.config.max_len
        )
        if self._search is None:
            step = ModelStep(self.model, src, True, True, o.group_rows, o.by_length)
            beams = _Beams(step, max_lens, o.beam, o.alpha, self.ids, o.shortlist, o.two_stage, keys)
            self._search = (step, beams)
            return
        step, beams = self._search
        step.join(src, o.beam)
        beams.add(keys, max_lens)

    def _pad(self, sources: list[list[int]]) -> torch.Tensor:
        """Right-padded ``(M, S)`` ids on the model's device."""
        width = max(len(s) for s in sources)
        rows = [s + [self.ids.pad] * (width - len(s)) for s in sources]
        return torch.tensor(rows, dtype=torch.long, device=self.device)
