"""The masks of :mod:`aiayn.model.masks` in ``keras.ops``: boolean, **True = may attend**,
broadcastable to the attention scores' shape ``(B, H, T_q, T_k)``; they combine with ``&``
(``ops.logical_and``)."""

from __future__ import annotations

from keras import ops


def padding_mask(tokens, pad_id: int):
    """``(B, T)`` token ids -> ``(B, 1, 1, T)`` bool, True where the key is a real token."""
    return ops.expand_dims(ops.expand_dims(ops.not_equal(tokens, pad_id), 1), 1)


def causal_mask(size: int):
    """``(1, 1, T, T)`` bool, True on and below the diagonal (position i sees positions <= i)."""
    positions = ops.arange(size)
    return ops.expand_dims(ops.expand_dims(positions[:, None] >= positions[None, :], 0), 0)


def target_mask(tokens, pad_id: int):
    """Decoder self-attention mask: padding & causal, ``(B, 1, T, T)``."""
    return ops.logical_and(padding_mask(tokens, pad_id), causal_mask(ops.shape(tokens)[1]))
