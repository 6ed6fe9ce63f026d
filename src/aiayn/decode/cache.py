"""The key/value cache as the searches use it: rows that share a source share its memory.

Beam search keeps ``beam`` rows per sentence, and sampling ``nbest``; all rows of a sentence read
the same encoder memory. :class:`GroupedDecoderCache` (what :class:`~aiayn.decode.step.ModelStep`
decodes with) keeps the tensors that depend on the source alone (the memory, its mask, the
cross-attention keys/values) once per *group* of consecutive rows with the same source, and the
cross-attention queries of a group attend to that one row together (:class:`GroupedKVCache`),
instead of a copy of it for every row. Results are the same as with the model's plain
:class:`~aiayn.model.DecoderCache`; only copies and per-row work are saved.

Sources may also *join* a batch that is being decoded (:meth:`GroupedDecoderCache.join`, for
step-level batching): their rows start at their first step while the others go on. The
self-attention keys/values of all rows share one time axis, each row's own positions at its end
(left-padded), with one decoded length per row; :meth:`GroupedDecoderCache.self_mask` keeps a row
from attending to the columns before its start, and the positional encoding takes each row's own
position. Columns no row needs any more are cut off as rows leave.
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
        if new_order.numel() == self.sources.numel() and torch.equal(
            new_order, torch.arange(new_order.numel(), device=new_order.device)
        ):
            return
        for self_cache, _ in self.layers:
            self_cache.reorder(new_order)
        if isinstance(self.length, Tensor):
            self.length = self.length.index_select(0, new_order)
            self._trim()
        sources = self.sources.index_select(0, new_order)  # (N',) memory row of each new row
        if not torch.equal(sources, self.sources):
            self._regroup(sources)

    def join(
        self, memory: Tensor, src_mask: Tensor, keys_values: list[tuple[Tensor, Tensor]] | None, group: int
    ) -> None:
        """Add sources after the rows there are, ``group`` rows each, at their first step.

        ``memory`` ``(M, S', D)`` and ``src_mask`` ``(M, 1, 1, S')`` (True = may attend) of the new
        sources; ``keys_values``: each decoder layer's cross-attention keys and values of
        ``memory``, ``(M, H, S', d_k)`` each, or None while the cache holds none yet (no step run).
        """
        filled = bool(self.layers) and self.layers[0][1].filled
        if filled and keys_values is None:
            raise ValueError("join: the cache holds cross-attention keys/values; give the new sources' ones")
        rows, width = self.sources.numel(), max(self.memory.size(1), memory.size(1))
        new_rows = memory.size(0) * group
        sources = torch.cat([self.sources, self.memory.size(0) + self._source_ids(memory, group)])
        self.memory = torch.cat([_pad_to(self.memory, 1, width), _pad_to(memory, 1, width)])
        self.src_mask = torch.cat([_pad_to(self._mask(), 3, width), _pad_to(src_mask, 3, width)])
        for i, (self_cache, cross_cache) in enumerate(self.layers):
            if filled:
                k, v = keys_values[i]
                cross_cache.k = torch.cat([_pad_to(cross_cache.k, 2, width), _pad_to(k, 2, width)])
                cross_cache.v = torch.cat([_pad_to(cross_cache.v, 2, width), _pad_to(v, 2, width)])
            if self_cache.filled:  # the new rows have no columns of their own yet
                self_cache.k, self_cache.v = (
                    _add_rows(self_cache.k, new_rows),
                    _add_rows(self_cache.v, new_rows),
                )
        if self.layers and self.layers[0][0].filled:
            old = self.length if isinstance(self.length, Tensor) else torch.full((rows,), self.length)
            self.length = torch.cat([old.to(sources.device), sources.new_zeros(new_rows)])  # (N,)
        self.group, self.sources = 1, torch.arange(self.memory.size(0), device=memory.device)
        self._regroup(sources)

    def self_mask(self) -> Tensor | None:
        """The decoder self-attention mask of the next step, ``(N, 1, 1, T+1)`` (True = may attend):
        each row attends to its own positions only; None while all rows have the same length."""
        if not isinstance(self.length, Tensor):
            return None
        width = self.layers[0][0].k.size(2)  # T columns held
        keys = torch.arange(width + 1, device=self.length.device)
        return (keys >= width - self.length[:, None])[:, None, None, :]

    def _trim(self) -> None:
        """Cut the columns no row needs; back to one length when all rows have it."""
        width = int(self.length.max()) if self.length.numel() else 0
        for self_cache, _ in self.layers:
            if self_cache.filled and self_cache.k.size(2) > width:
                start = self_cache.k.size(2) - width
                self_cache.k, self_cache.v = self_cache.k[:, :, start:], self_cache.v[:, :, start:]
        if not self.length.numel() or bool((self.length == width).all()):
            self.length = width

    def _mask(self) -> Tensor:
        if self.src_mask is not None:
            return self.src_mask
        return torch.ones(
            self.memory.size(0), 1, 1, self.memory.size(1), dtype=torch.bool, device=self.memory.device
        )

    @staticmethod
    def _source_ids(memory: Tensor, group: int) -> Tensor:
        return torch.arange(memory.size(0), device=memory.device).repeat_interleave(group)

    def _regroup(self, sources: Tensor) -> None:
        """Rows now read memory rows ``sources`` ``(N',)``: keep each run of equal sources once when
        the runs are of equal length (and ``group_rows``), else one memory row per row."""
        rows, counts = torch.unique_consecutive(sources, return_counts=True)  # runs of equal sources
        group = int(counts[0]) if counts.numel() else 1  # no rows left: nothing to group
        if not self.group_rows or not bool((counts == group).all()):
            rows, group = sources, 1
        self.group = group
        self.sources = torch.arange(rows.numel(), device=rows.device).repeat_interleave(group)
        for _, cross_cache in self.layers:
            cross_cache.group = group
        if torch.equal(rows, torch.arange(self.memory.size(0), device=rows.device)):
            return  # the same sources, now in groups of ``group`` rows
        for _, cross_cache in self.layers:
            cross_cache.reorder(rows)
        self.memory = self.memory.index_select(0, rows)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, rows)


def _pad_to(x: Tensor, dim: int, size: int) -> Tensor:
    """``x`` with zeros (False for a mask) appended along ``dim`` up to ``size``."""
    missing = size - x.size(dim)
    if not missing:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def _add_rows(x: Tensor, rows: int) -> Tensor:
    """``x`` ``(N, H, T, d)`` with ``rows`` rows of zeros after its own."""
    return torch.cat([x, x.new_zeros((rows, *x.shape[1:]))])
