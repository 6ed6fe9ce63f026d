"""The key/value cache as the searches use it: rows that share a source share its memory.

Beam search keeps ``beam`` rows per sentence, and sampling ``nbest``; all rows of a sentence read
the same encoder memory. :class:`GroupedDecoderCache` (what :class:`~aiayn.decode.step.ModelStep`
decodes with) keeps the tensors that depend on the source alone (the memory, its mask, the
cross-attention keys/values) once per *group* of consecutive rows with the same source, and the
cross-attention queries of a group attend to that one row together (:class:`GroupedKVCache`),
instead of a copy of it for every row. Results are the same as with the model's plain
:class:`~aiayn.model.DecoderCache`; only copies and per-row work are saved.
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.model import DecoderCache, KVCache
from aiayn.model.attention import AttentionFn


def fold(x: Tensor, group: int, inverse: bool = False) -> Tensor:
    """``(B*g, H, T, d)`` -> ``(B, H, g*T, d)``: the g rows that share keys become one row's queries
    (``inverse``: back). A view, no copy, for queries split into heads from a projection."""
    if group == 1:
        return x
    n, h, t, d = x.shape
    b, t = (n * group, t // group) if inverse else (n // group, t * group)
    return x.transpose(1, 2).reshape(b, t, h, d).transpose(1, 2)


def is_identity(order: Tensor, rows: int) -> bool:
    """Whether the reorder ``order`` keeps ``rows`` rows as they are (a reorder that copies nothing)."""
    return order.numel() == rows and torch.equal(order, torch.arange(rows, device=order.device))


def memory_groups(sources: Tensor, group_rows: bool = True) -> tuple[Tensor, int]:
    """Rows reading memory rows ``sources`` ``(N,)``: the memory rows to keep and how many consecutive
    rows read each. Each run of equal sources is kept once when the runs are of equal length (and
    ``group_rows``), else one memory row per row (group 1)."""
    runs, counts = torch.unique_consecutive(sources, return_counts=True)
    group = int(counts[0]) if counts.numel() else 1  # no rows left: nothing to group
    if not group_rows or not bool((counts == group).all()):
        return sources, 1
    return runs, group


class GroupedKVCache(KVCache):
    """A static (cross-attention) cache whose row i is read by query rows ``i*g .. i*g+g-1``."""

    def __init__(self) -> None:
        super().__init__(static=True)
        self.group = 1  # consecutive query rows per cached row

    def attend(
        self, attention: AttentionFn, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """The queries of a group as one row's ``g*T`` queries; output and weights unfolded back."""
        out, weights = attention(fold(q, self.group), k, v, mask, need_weights)  # (B, H, g*T, d_k)
        if weights is not None:
            weights = fold(weights, self.group, inverse=True)  # (B*g, H, T, S)
        return fold(out, self.group, inverse=True), weights  # (B*g, H, T, d_k)


class GroupedDecoderCache(DecoderCache):
    """A :class:`~aiayn.model.DecoderCache` that keeps each source once per group of rows.

    ``group_rows=False`` keeps one memory row per row (the reference the grouped path is tested
    and measured against); reorders still copy only what changes, as below.
    """

    def __init__(
        self, n_layers: int, memory: Tensor, src_mask: Tensor | None, group_rows: bool = True
    ) -> None:
        super().__init__(n_layers, memory, src_mask)  # memory (B, S, D), src_mask (B, 1, 1, S): per group
        self.layers = [(KVCache(static=False), GroupedKVCache()) for _ in range(n_layers)]
        self.group_rows = group_rows
        self.group = 1  # rows per memory row (consecutive rows share it)
        self.sources = torch.arange(memory.size(0), device=memory.device)  # memory row of each row

    def reorder(self, new_order: Tensor) -> None:
        """Row i of every cached tensor becomes old row ``new_order[i]``.

        Only the rows' contents matter, so copies are skipped where they would change nothing: an
        identity order (greedy search with no sentence finished) copies nothing, and the tensors
        that depend on the source alone are copied only when the sources of the groups change,
        not when beam search shuffles the beams of a sentence among that sentence's rows.
        """
        if is_identity(new_order, self.sources.numel()):
            return
        for self_cache, _ in self.layers:
            self_cache.reorder(new_order)
        sources = self.sources.index_select(0, new_order)  # (N',) memory row of each new row
        if not torch.equal(sources, self.sources):
            self._regroup(sources)

    def _regroup(self, sources: Tensor) -> None:
        """Rows now read memory rows ``sources`` ``(N',)``: keep each run of equal sources once when
        the runs are of equal length (and ``group_rows``), else one memory row per row."""
        rows, group = memory_groups(sources, self.group_rows)
        self.group = group
        self.sources = torch.arange(rows.numel(), device=rows.device).repeat_interleave(group)
        for _, cross_cache in self.layers:
            cross_cache.group = group
        if is_identity(rows, self.memory.size(0)):
            return  # the same sources, now in groups of ``group`` rows
        for _, cross_cache in self.layers:
            cross_cache.reorder(rows)
        self.memory = self.memory.index_select(0, rows)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, rows)
