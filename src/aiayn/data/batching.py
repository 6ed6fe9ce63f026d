"""Token-bounded batches from length buckets, resumable and shardable; collation into tensors.

The token bound is written once (:func:`_cut`) and serves training (:func:`make_batches`) and
inference (:func:`token_batches`: the batches of :class:`aiayn.decode.Translator` and of the
CTranslate2 backend); padding is written once too (:func:`pad`, which :func:`collate` and the
Translator use).

The paper batches "by approximate sequence length", about 25,000 source and 25,000 target tokens
per batch (§5.1). Here:

- The size of an example is ``max(len(src) + 1, len(tgt) + 1)`` (the encoder sees source + EOS,
  as in fairseq and as :class:`aiayn.decode.Translator` feeds it; the decoder sees BOS + target, is
  trained on target + EOS), and a batch of ``B`` examples costs ``B × largest size`` tokens, i.e.
  its padded size. Batches are cut so that this stays ``<= max_tokens``.
- Each epoch, examples are sorted by (size, source length) with a random tie-break, cut greedily
  into batches, and the batch order is shuffled. The random generator is seeded from
  ``(seed, epoch)``: same seed, same batches; each epoch differs.
- :class:`TokenBatchSampler` is resumable mid-epoch: ``state_dict()`` holds plain JSON values
  (the epoch and how many batches of it were handed out) and iterating after
  ``load_state_dict()`` continues with the next batch.
- Distributed data parallel: every rank builds the same global batches and takes the sentences
  ``batch[rank::world_size]`` of each. So the global batch is the one a single process would use
  (with the same ``batch_multiple``), and the world size may change between save and resume. With
  another ``batch_multiple`` (its default, 0, means the world size) the resumed epoch is cut into
  other batches, so its remaining batches are not the ones the saved position counted: the translation
  task warns (``state_dict`` keeps ``batch_multiple`` for that).
  Every batch holds a multiple of ``batch_multiple`` sentences, which must be a multiple of
  ``world_size`` so that the ranks get equal shares; to make that possible, ``len(examples) %
  batch_multiple`` random examples sit out each epoch (a different few each epoch; see
  ``n_skipped_per_epoch``). With ``shuffle=False`` (evaluation) nothing is skipped, so the last
  batch may split unevenly across ranks.

The sampler reads only the lengths (a prepared split's ``lengths`` index, or counted from examples
in memory). Iterate it directly (reading a batch's pairs and :func:`collate` are cheap); a
``DataLoader`` with worker prefetching would advance the position before the batches are used.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

from aiayn.config import BOS_ID, EOS_ID, PAD_ID
from aiayn.errors import UserError

Example = tuple[Sequence[int], Sequence[int]]  # (source ids, target ids), no BOS/EOS


def example_lengths(examples: Sequence[Example]) -> np.ndarray:
    """``(N, 2)`` source and target lengths: a prepared split's ``lengths`` index, else counted."""
    lengths = getattr(examples, "lengths", None)
    if lengths is not None:
        return lengths
    return np.array([(len(src), len(tgt)) for src, tgt in examples], dtype=np.int64).reshape(-1, 2)


def example_sizes(examples: Sequence[Example]) -> np.ndarray:
    """Padded-token cost of each example: ``max(len(src) + 1, len(tgt) + 1)`` (EOS on both sides)."""
    return example_lengths(examples).max(axis=1, initial=0) + 1


def make_batches(
    lengths: np.ndarray | Sequence[Example],
    max_tokens: int,
    rng: np.random.Generator,
    batch_multiple: int = 1,
) -> list[np.ndarray]:
    """Length-bucketed batches of indices into ``lengths`` ((N, 2) source and target lengths, or the
    examples themselves), in sorted order (shuffling is the sampler's job).

    ``N`` should be a multiple of ``batch_multiple``; every batch then is one too.
    """
    if not isinstance(lengths, np.ndarray):
        lengths = example_lengths(lengths)
    sizes = lengths.max(axis=1, initial=0) + 1
    order = np.lexsort((rng.random(len(lengths)), lengths[:, 0], sizes))  # last key sorts first
    return [order[start:end] for start, end in _cut(sizes[order], max_tokens, batch_multiple)]


def token_batches(sizes: Mapping[int, int], max_tokens: int) -> list[list[int]]:
    """Inference batches: the keys of ``sizes`` (e.g. line numbers -> source tokens with EOS),
    longest first (ties: the lower key first), cut greedily so that ``len(batch) * longest <=
    max_tokens`` (at least one each)."""
    keys = sorted(sizes, key=lambda i: (-sizes[i], i))
    ordered = np.array([sizes[i] for i in keys], dtype=np.int64)
    return [keys[start:end] for start, end in _cut(ordered, max_tokens, 1)]


def _cut(sizes: np.ndarray, max_tokens: int, multiple: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each batch of ``sizes`` in their order, cut greedily: an example joins the
    current batch unless the batch would then cost more than ``max_tokens`` padded tokens (its
    length times its largest size) and already holds ``multiple`` examples; then the batch's
    largest multiple of ``multiple`` examples is cut and the rest carries over. With ``multiple``
    above 1 the sizes must ascend (training), so that the carry fits with the new example."""
    bounds, start, scan, n = [], 0, 0, len(sizes)
    while scan < n:
        first = max(scan, start + multiple)  # the first example that may close the batch
        if first >= n:
            break
        largest = int(sizes[start : first + 1].max())
        # the cost (j - start + 1) * max(sizes[start..j]) grows with j, above max_tokens by
        # j = start + max_tokens // largest
        window = sizes[first : max(first, start + max_tokens // largest) + 1]
        widest = np.maximum(np.maximum.accumulate(window), largest)  # (len(window),)
        over = np.flatnonzero((np.arange(first, first + len(window)) - start + 1) * widest > max_tokens)
        if not len(over):  # the window reached the end
            break
        j = first + int(over[0])
        k = (j - start) // multiple * multiple
        bounds.append((start, start + k))
        start, scan = start + k, j + 1
    if start < n:
        bounds.append((start, n))
    return bounds


class TokenBatchSampler:
    """Yields this rank's share of each token-bounded batch (a list of example indices).

    One ``for`` loop over the sampler walks the rest of the current epoch and then moves to the
    next epoch, so ``for epoch in ...: for indices in sampler: ...`` trains epoch after epoch.
    """

    def __init__(
        self,
        examples: Sequence[Example],
        max_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        batch_multiple: int | None = None,
        resample: Callable[[int], Sequence[Example]] | None = None,
    ):
        self.examples, self.max_tokens, self.seed, self.shuffle = examples, max_tokens, seed, shuffle
        self.resample = resample
        self.rank, self.world_size = rank, world_size
        self.batch_multiple = world_size if batch_multiple is None else batch_multiple
        self.lengths = example_lengths(examples)  # (N, 2)
        self._validate(int(self.lengths.max(initial=-1)) + 1)
        self.n_skipped_per_epoch = len(examples) % self.batch_multiple if shuffle else 0
        self.epoch, self.position = 0, 0
        self._cache: tuple[int, list[np.ndarray]] | None = None
        self._examples_cache: tuple[int, Sequence[Example]] | None = None

    def _validate(self, longest: int) -> None:
        if not self.examples:
            raise UserError("no examples to batch")
        if not 0 <= self.rank < self.world_size:
            raise UserError(f"rank {self.rank} is outside world_size {self.world_size}")
        if self.batch_multiple % self.world_size:
            raise UserError(
                f"batch_multiple {self.batch_multiple} must be a multiple of world_size {self.world_size}"
            )
        if self.batch_multiple * longest > self.max_tokens:
            raise UserError(
                f"max_tokens={self.max_tokens} is too small: batch_multiple {self.batch_multiple} × longest "
                f"example {longest} tokens = {self.batch_multiple * longest}; raise max_tokens or "
                "filter long pairs"
            )

    # --- the batches of one epoch ---------------------------------------------------------------
    def batches(self, epoch: int) -> list[np.ndarray]:
        """The global batches of ``epoch`` in the order they are served (the same on every rank)."""
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, self._build(epoch))
        return self._cache[1]

    def examples_of(self, epoch: int) -> Sequence[Example]:
        """The examples the indices of ``epoch`` point into: ``examples``, or ``resample(epoch)``
        (e.g. :class:`aiayn.data.corpus.BpeDropout`: the same pairs, segmented anew each epoch,
        no longer than the longest of ``examples``)."""
        if self.resample is None:
            return self.examples
        if self._examples_cache is None or self._examples_cache[0] != epoch:
            self._examples_cache = (epoch, self.resample(epoch))
        return self._examples_cache[1]

    def _build(self, epoch: int) -> list[np.ndarray]:
        lengths = self.lengths if self.resample is None else example_lengths(self.examples_of(epoch))
        rng = np.random.default_rng((self.seed, epoch) if self.shuffle else (self.seed,))
        if self.n_skipped_per_epoch:
            keep = np.sort(rng.permutation(len(lengths))[self.n_skipped_per_epoch :])
            batches = [
                keep[b] for b in make_batches(lengths[keep], self.max_tokens, rng, self.batch_multiple)
            ]
        else:
            batches = make_batches(lengths, self.max_tokens, rng, self.batch_multiple)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __len__(self) -> int:
        return len(self.batches(self.epoch))

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches(self.epoch)
        while self.position < len(batches):
            batch = batches[self.position]
            self.position += 1
            yield batch[self.rank :: self.world_size].tolist()
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    # --- resuming --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able state; the same on every rank."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "n_examples": len(self.examples),
            "batch_multiple": self.batch_multiple,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "max_tokens", "n_examples"):
            mine = self.state_dict()[key]
            if key in state and state[key] != mine:
                raise UserError(f"batch sampler state has {key}={state[key]}, but this run has {key}={mine}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


# --- tensors ---------------------------------------------------------------------------------------


@dataclass
class Batch:
    """Padded token ids, batch first. The model builds the masks (``True`` = may attend)."""

    src: torch.Tensor  # (B, S) source ids + EOS, PAD_ID after the end
    tgt_in: torch.Tensor  # (B, T) BOS + target: the decoder input
    tgt_out: torch.Tensor  # (B, T) target + EOS: what the decoder must predict
    n_src_tokens: int  # real source tokens (no padding)
    n_tgt_tokens: int  # real target tokens in tgt_out (target + EOS, no padding): the loss's count

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return replace(self, src=move(self.src), tgt_in=move(self.tgt_in), tgt_out=move(self.tgt_out))

    def __len__(self) -> int:
        return self.src.shape[0]


def pad(
    sequences: Sequence[Sequence[int]],
    pad_id: int = PAD_ID,
    *,
    start: int | None = None,
    end: int | None = None,
) -> torch.Tensor:
    """``[start] + ids + [end]`` of each sequence (lists or arrays; ``start``/``end`` only when
    given), right-padded with ``pad_id`` to the longest: one ``(B, S)`` int64 tensor (on the CPU)."""
    lengths = [len(ids) for ids in sequences]
    offset = int(start is not None)
    extra = offset + int(end is not None)
    out = np.full((len(sequences), max(lengths, default=-extra) + extra), pad_id, dtype=np.int64)  # (B, S)
    if start is not None:
        out[:, :1] = start  # a slice: no error for an empty batch
    for i, ids in enumerate(sequences):
        out[i, offset : offset + lengths[i]] = ids
        if end is not None:
            out[i, offset + lengths[i]] = end
    return torch.from_numpy(out)


def collate(examples: Sequence[Example]) -> Batch:
    """Stack ``(src_ids, tgt_ids)`` examples (lists or arrays) into a padded :class:`Batch`."""
    sources, targets = [s for s, _ in examples], [t for _, t in examples]
    src = pad(sources, end=EOS_ID)  # (B, S) source + EOS
    tgt_in = pad(targets, start=BOS_ID)  # (B, T) BOS + target
    tgt_out = pad(targets, end=EOS_ID)  # (B, T) target + EOS
    n = len(examples)
    n_src, n_tgt = sum(map(len, sources)) + n, sum(map(len, targets)) + n
    return Batch(src, tgt_in, tgt_out, n_src, n_tgt)


def iterate_batches(examples: Sequence[Example], sampler: Iterable[list[int]]) -> Iterator[Batch]:
    """Collated batches in the sampler's order."""
    for indices in sampler:
        yield collate([examples[i] for i in indices])


def padding_share(batches: Iterable[Batch]) -> float:
    """Fraction of padding among all positions of ``src`` and ``tgt_out`` (``tgt_in`` pads alike)."""
    pad = total = 0
    for batch in batches:
        pad += batch.src.numel() - batch.n_src_tokens + batch.tgt_out.numel() - batch.n_tgt_tokens
        total += batch.src.numel() + batch.tgt_out.numel()
    return pad / total if total else 0.0
