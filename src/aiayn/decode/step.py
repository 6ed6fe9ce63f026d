"""One decoding step of a :class:`~aiayn.model.Transformer`, as the search algorithms see it.

The searches in :mod:`aiayn.decode.search` never touch the model directly; they talk to a *step
function*: an object with

* ``__call__(prefix)``: ``prefix`` ``(N, t)`` target ids (BOS first) -> log-probabilities
  ``(N, V)`` (fp32) of the next token for each of the N rows, in a new tensor each call (the
  searches write into it: PAD, BOS and forced endings). Greedy search, which only needs each row's
  argmax, also takes unnormalised logits (``ModelStep(..., log_probs=False)``) and normalises
  only when scores are asked for;
* ``reorder(new_order)``: row i of the state becomes old row ``new_order[i]`` (beam search
  calls it after each step; ``new_order`` may repeat rows or select fewer rows);
* ``vocab_size`` and (optionally) ``device``, where the searches put their tensors.

:class:`ModelStep` is that object for the real model; the tests drive the same search code with
a fake step function of fixed probabilities.

The encoder runs once per batch, before the first step. By default (:func:`encode_by_length`) it
runs on buckets of sources of similar length, each padded only to its own longest, and the
memories are gathered into one ``(B, S, D)`` tensor padded with zeros: a batch of mixed lengths
(a server's requests as they arrive) would otherwise encode every sentence at the longest one's
length. Padded memory positions are never attended (the source mask), so only the padding's cost
changes, not the result (up to float rounding, as between any two batchings).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.decode.cache import GroupedDecoderCache
from aiayn.model.masks import padding_mask

BUCKET_RATIO = 0.8  # a bucket's shortest source has at least this fraction of its longest's tokens


@dataclass(frozen=True)
class SearchPaths:
    """Which implementation of each exact speed-up decodes: the fast paths by default (the
    inference step where it was measured faster).

    Each switch set to False takes the reference path the fast one replaces, with the same output,
    so that tests and ``benchmarks/decode_paths.py`` can compare the two:
    ``two_stage`` (block-wise argmax/top-k over the vocabulary, :func:`aiayn.decode.search.stable_topk`),
    ``shortlist`` (beam search scores each row's best ``2 * beam`` tokens, not all of them),
    ``group_rows`` (rows of one source share its memory, :mod:`aiayn.decode.cache`) and
    ``by_length`` (the encoder on buckets of similar length, :func:`encode_by_length`) and
    ``fast_step`` (the decoder step written for inference, :mod:`aiayn.decode.fast_step`; None, the
    default: for a model on the CPU, where it was measured faster, :func:`~aiayn.decode.fast_step.by_default`;
    False: :class:`ModelStep`, the model's own forward on its key/value cache).
    """

    two_stage: bool = True
    shortlist: bool = True
    group_rows: bool = True
    by_length: bool = True
    fast_step: bool | None = None


FAST_PATHS = SearchPaths()  # the defaults: every fast path (the inference step on the CPU)


class ModelStep:
    """The Transformer as a step function, with (default) or without the key/value cache.

    ``src`` ``(B, S)`` padded source ids. With ``use_cache=True`` each call feeds only the last
    prefix token and reuses the cached keys/values (a :class:`GroupedDecoderCache`: rows with the
    same source share its memory unless ``group_rows=False``); with ``use_cache=False`` it recomputes
    the decoder over the whole prefix (slow, the reference the cached path is tested against).
    ``log_probs=False``: calls return the generator's logits, not log-probabilities.
    ``paths``: its ``group_rows`` and ``by_length`` (False: the encoder runs on the whole padded
    batch at once, the reference of :func:`encode_by_length`). ``attention_layer``: after each call,
    ``attention`` ``(N, S)`` holds that decoder layer's cross-attention of the last position, its
    heads averaged (None: not kept).
    """

    def __init__(
        self,
        model,
        src: Tensor,
        *,
        use_cache: bool = True,
        log_probs: bool = True,
        paths: SearchPaths = FAST_PATHS,
        attention_layer: int | None = None,
    ) -> None:
        self.model, self.use_cache, self.log_probs = model, use_cache, log_probs
        self.attention_layer, self.attention = attention_layer, None
        self.memory, self.src_mask = encode_sources(model, src, paths.by_length)
        self.cache = None
        if use_cache:
            layers = len(model.decoder.layers)
            self.cache = GroupedDecoderCache(layers, self.memory, self.src_mask, paths.group_rows)

    @property
    def device(self) -> torch.device:
        return self.memory.device

    @property
    def vocab_size(self) -> int:
        return self.model.config.tgt_vocab_size

    def __call__(self, prefix: Tensor) -> Tensor:
        """``prefix`` ``(N, t)`` -> next-token log-probs (or logits) ``(N, V)``, fp32."""
        weights = self.attention_layer is not None
        if self.cache is not None:
            states = self.model.decode(
                prefix[:, -1:], self.memory, self.src_mask, cache=self.cache, need_weights=weights
            )  # (N, 1, D)
        else:
            states = self.model.decode(prefix, self.memory, self.src_mask, need_weights=weights)  # (N, t, D)
        if weights:
            cross = self.model.decoder.layers[self.attention_layer].last_cross_attention  # (N, H, T, S)
            self.attention = cross[:, :, -1].float().mean(dim=1)
        return self.model.generator(states[:, -1:], log_probs=self.log_probs)[:, 0].float()  # (N, V)

    def reorder(self, new_order: Tensor) -> None:
        """Select rows (beams, finished sentences dropped): row i becomes old row ``new_order[i]``."""
        if self.cache is not None:
            self.cache.reorder(new_order)  # also reorders the memory and mask it holds
            self.memory, self.src_mask = self.cache.memory, self.cache.src_mask
            return
        self.memory = self.memory.index_select(0, new_order)  # (N', S, D)
        self.src_mask = self.src_mask.index_select(0, new_order)  # (N', 1, 1, S)


def encode_sources(model, src: Tensor, by_length: bool = True) -> tuple[Tensor, Tensor]:
    """The memory ``(B, S, D)`` of padded sources ``src`` ``(B, S)`` and their padding mask
    ``(B, 1, 1, S)`` (True = may attend): by buckets of similar length (:func:`encode_by_length`),
    or the whole batch at once (``by_length=False``)."""
    src_mask = padding_mask(src, model.config.pad_id)
    encode = encode_by_length if by_length else _encode_whole
    return encode(model, src, src_mask), src_mask


def _encode_whole(model, src: Tensor, src_mask: Tensor) -> Tensor:
    return model.encode(src, src_mask)  # (B, S, D)


def encode_by_length(model, src: Tensor, src_mask: Tensor, ratio: float = BUCKET_RATIO) -> Tensor:
    """``model.encode`` of right-padded ``src`` ``(B, S)`` in buckets of similar length -> ``(B, S, D)``.

    Sources sorted longest first; a bucket takes them while they have at least ``ratio`` times the
    tokens of its first, and is encoded padded to that one's length. Memory positions beyond a
    source's length are zeros. Sources that are not right-padded are encoded whole.
    """
    lengths = src_mask[:, 0, 0].sum(dim=-1)  # (B,)
    positions = torch.arange(src.size(1), device=src.device)
    if not torch.equal(src_mask[:, 0, 0], positions < lengths[:, None]):
        return _encode_whole(model, src, src_mask)
    memory = None
    for rows, width in _buckets(lengths, ratio):
        part = model.encode(src[rows, :width], src_mask[rows, :, :, :width])  # (b, width, D)
        if memory is None:
            memory = part.new_zeros(src.size(0), src.size(1), part.size(-1))
        memory[rows, :width] = part
    if memory is None:  # no source has a token
        return _encode_whole(model, src, src_mask)
    return memory.masked_fill_(~src_mask[:, 0, 0, :, None], 0.0)  # a bucket's padding too


def _buckets(lengths: Tensor, ratio: float) -> list[tuple[Tensor, int]]:
    """(rows, width) of each bucket of non-empty sources, longest first (see :func:`encode_by_length`)."""
    order = lengths.argsort(descending=True, stable=True).tolist()
    sizes = lengths.tolist()
    buckets, start = [], 0
    while start < len(order) and sizes[order[start]] > 0:
        width, end = sizes[order[start]], start + 1
        while end < len(order) and sizes[order[end]] >= ratio * width:
            end += 1
        buckets.append((torch.tensor(order[start:end], device=lengths.device), width))
        start = end
    return buckets


def source_lengths(src: Tensor, pad_id: int) -> Tensor:
    """``(B, S)`` padded ids -> ``(B,)`` number of non-pad tokens."""
    return (src != pad_id).sum(dim=1)


def max_output_lengths(
    src_lengths: Tensor, max_len_a: float, max_len_b: int, max_positions: int
) -> list[int]:
    """Most tokens each output may have *before* its EOS: ``floor(a * S + b)``, fairseq-style.

    ``S`` counts the source tokens fed to the encoder (with their EOS). The result is also capped at
    ``max_positions - 1`` so that the decoder input (BOS + tokens) never exceeds the model's max_len.
    The cap is applied in double precision, before the conversion to integers, so a huge (or
    infinite) ``a`` or ``b`` gives the cap, not an int64 overflow.
    """
    limits = torch.floor(src_lengths.double() * max_len_a + max_len_b).clamp(0, max_positions - 1).long()
    return [int(n) for n in limits]
