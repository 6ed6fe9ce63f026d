"""Token-bounded batches from length buckets, resumable and shardable; collation into tensors.

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
  other batches, so its remaining batches are not the ones the saved position counted: the trainer
  warns (``state_dict`` keeps ``batch_multiple`` for that).
  Every batch holds a multiple of ``batch_multiple`` sentences, which must be a multiple of
  ``world_size`` so that the ranks get equal shares; to make that possible, ``len(examples) %
  batch_multiple`` random examples sit out each epoch (a different few each epoch; see
  ``n_skipped_per_epoch``). With ``shuffle=False`` (evaluation) nothing is skipped, so the last
  batch may split unevenly across ranks.

Iterate the sampler directly (the examples are token ids in memory and :func:`collate` is cheap);
a ``DataLoader`` with worker prefetching would advance the position before the batches are used.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from aiayn.config import BOS_ID, EOS_ID, PAD_ID
from aiayn.errors import UserError

Example = tuple[Sequence[int], Sequence[int]]  # (source ids, target ids), no BOS/EOS


def example_sizes(examples: Sequence[Example]) -> np.ndarray:
    """Padded-token cost of each example: ``max(len(src) + 1, len(tgt) + 1)`` (EOS on both sides)."""
    return np.array([max(len(src), len(tgt)) + 1 for src, tgt in examples], dtype=np.int64)


def make_batches(
    examples: Sequence[Example], max_tokens: int, rng: np.random.Generator, batch_multiple: int = 1
) -> list[list[int]]:
    """Length-bucketed batches of indices, in sorted order (shuffling is the sampler's job).

    ``len(examples)`` should be a multiple of ``batch_multiple``; every batch then is one too.
    """
    sizes = example_sizes(examples)
    src_lens = np.array([len(src) for src, _ in examples], dtype=np.int64)
    order = np.lexsort((rng.random(len(examples)), src_lens, sizes))  # last key sorts first
    return _cut(order.tolist(), sizes, max_tokens, batch_multiple)


def _cut(order: list[int], sizes: np.ndarray, max_tokens: int, multiple: int) -> list[list[int]]:
    batches, current = [], []
    for i in order:
        if len(current) >= multiple and (len(current) + 1) * sizes[i] > max_tokens:
            k = len(current) // multiple * multiple  # sizes ascend: the carry fits with i
            batches.append(current[:k])
            current = current[k:]
        current.append(i)
    if current:
        batches.append(current)
    return batches


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
        self._validate(int(example_sizes(examples).max(initial=0)))
        self.n_skipped_per_epoch = len(examples) % self.batch_multiple if shuffle else 0
        self.epoch, self.position = 0, 0
        self._cache: tuple[int, list[list[int]]] | None = None
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
    def batches(self, epoch: int) -> list[list[int]]:
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

    def _build(self, epoch: int) -> list[list[int]]:
        examples = self.examples_of(epoch)
        rng = np.random.default_rng((self.seed, epoch) if self.shuffle else (self.seed,))
        keep = np.arange(len(examples))
        if self.n_skipped_per_epoch:
            keep = np.sort(rng.permutation(keep)[self.n_skipped_per_epoch :])
        batches = make_batches([examples[i] for i in keep], self.max_tokens, rng, self.batch_multiple)
        batches = [keep[b].tolist() for b in batches]
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
            yield batch[self.rank :: self.world_size]
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


def collate(examples: Sequence[Example]) -> Batch:
    """Stack ``(src_ids, tgt_ids)`` examples into a padded :class:`Batch`."""
    src = _pad([[*s, EOS_ID] for s, _ in examples])
    tgt_in = _pad([[BOS_ID, *t] for _, t in examples])
    tgt_out = _pad([[*t, EOS_ID] for _, t in examples])
    n_src = sum(len(s) + 1 for s, _ in examples)
    n_tgt = sum(len(t) + 1 for _, t in examples)
    return Batch(src, tgt_in, tgt_out, n_src, n_tgt)


def _pad(rows: list[list[int]]) -> torch.Tensor:
    out = np.full((len(rows), max(map(len, rows), default=0)), PAD_ID, dtype=np.int64)  # (B, L)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return torch.from_numpy(out)


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
