"""Scaled dot-product attention, multi-head attention (§3.2) and the key/value cache, in ``keras.ops``.

The PyTorch boxes are :mod:`aiayn.model.attention`. Masks: bool, **True = may attend**,
broadcastable to ``(B, H, T_q, T_k)``; a query row whose keys are all masked yields a zero output,
never NaN. Eq. 1 is written out (there is no fused kernel common to the three backends); it is
PyTorch's "formula" path, which also gives the weights.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from aiayn.keras.base import BuiltLayer, build_part

#: What masked scores are filled with: the most negative finite float32 (as aiayn does), not -1e9.
MASKED = float(np.finfo(np.float32).min)


def scaled_dot_product_attention(q, k, v, mask=None, dropout=None, training=None):
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V  (Eq. 1) -> ``(output, weights)``.

    ``q`` ``(B, H, T_q, d_k)``, ``k``/``v`` ``(B, H, T_k, d_k)``; ``mask`` bool, True = may attend.
    The scores and the softmax are float32; weights of masked keys are 0 (a fully masked row is all
    zeros, not uniform). ``dropout``: a ``keras.layers.Dropout`` on the weights (training only).
    Returns the output ``(B, H, T_q, d_k)`` and the weights ``(B, H, T_q, T_k)`` (before dropout).
    """
    q32, k32 = ops.cast(q, "float32"), ops.cast(k, "float32")
    scores = ops.matmul(q32, ops.swapaxes(k32, -1, -2)) / math.sqrt(ops.shape(q)[-1])  # (B, H, T_q, T_k)
    if ops.shape(scores)[-1] == 1:  # one key (the first decoding step): its weight is 1
        weights = ops.ones_like(scores)  # (Keras warns about a softmax over one element)
    else:
        weights = ops.softmax(scores if mask is None else ops.where(mask, scores, MASKED), axis=-1)
    if mask is not None:
        weights = weights * ops.cast(mask, "float32")
    dropped = dropout(weights, training=training) if dropout is not None else weights
    return ops.matmul(ops.cast(dropped, v.dtype), v), weights


class KVCache:
    """Keys and values of one attention layer, kept across decoding steps.

    ``static=True`` (cross-attention): the memory's keys/values, computed once per source.
    ``static=False`` (decoder self-attention): grows by one position per step.
    """

    def __init__(self, static: bool) -> None:
        self.static = static
        self.k = None  # (B, H, T, d_k)
        self.v = None

    @property
    def filled(self) -> bool:
        return self.k is not None

    def update(self, k, v):
        """Store (static) or append (incremental) new keys/values; return all of them."""
        if self.k is not None and not self.static:
            k, v = ops.concatenate([self.k, k], axis=2), ops.concatenate([self.v, v], axis=2)
        self.k, self.v = k, v
        return k, v

    def reorder(self, rows) -> None:
        """Select batch rows: row i becomes old row ``rows[i]``."""
        if self.k is not None:
            self.k, self.v = ops.take(self.k, rows, axis=0), ops.take(self.v, rows, axis=0)


class MultiHeadAttention(BuiltLayer):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    As in :class:`aiayn.model.MultiHeadAttention`, the three input projections are one ``in_proj``
    (a ``Dense`` of ``3 d_model`` units: Q's columns, then K's, then V's), so self-attention does
    one matmul and cross-attention uses the Q columns on the decoder states and the K/V columns on
    the memory; ``out_proj`` is W^O. (A Keras ``Dense`` kernel is ``(in, out)``, the transpose of a
    PyTorch ``Linear`` weight.)
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, **kwargs) -> None:
        super().__init__(**kwargs)
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.in_proj = keras.layers.Dense(3 * d_model, name="in_proj")  # [W^Q  W^K  W^V]
        self.out_proj = keras.layers.Dense(d_model, name="out_proj")  # W^O
        self.dropout = keras.layers.Dropout(dropout) if dropout > 0 else None

    def build(self, input_shape=None) -> None:
        build_part(self.in_proj, (None, self.d_model))
        build_part(self.out_proj, (None, self.d_model))

    def call(self, query, key_value=None, attention_mask=None, cache: KVCache | None = None, training=None):
        """``query`` ``(B, T_q, D)``; ``key_value`` ``(B, T_k, D)`` or None for self-attention.

        ``attention_mask``: bool, True = may attend, broadcastable to ``(B, H, T_q, T_k)`` (not
        ``mask``, which Keras fills in by itself from its own masking mechanism).
        ``cache``: see :class:`KVCache`; a filled static cache skips the K/V projections.
        Returns the output ``(B, T_q, D)`` and the weights ``(B, H, T_q, T_k)``.
        """
        q, k, v = self._project(query, key_value, cache)
        out, weights = scaled_dot_product_attention(q, k, v, attention_mask, self.dropout, training)
        return self.out_proj(self._merge_heads(out)), weights

    def _project(self, query, key_value, cache):
        """Q, K, V split into heads, each ``(B, H, T, d_k)``, with the cache applied."""
        if key_value is None:  # self-attention: one fused projection
            q, k, v = ops.split(self.in_proj(query), 3, axis=-1)
        else:
            d, kernel, bias = self.d_model, self.in_proj.kernel, self.in_proj.bias
            q = ops.matmul(query, kernel[:, :d]) + bias[:d]
            if cache is not None and cache.static and cache.filled:
                return self._split_heads(q), cache.k, cache.v
            k, v = ops.split(ops.matmul(key_value, kernel[:, d:]) + bias[d:], 2, axis=-1)
        q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
        if cache is not None:
            k, v = cache.update(k, v)
        return q, k, v

    def _split_heads(self, x):
        """``(B, T, D)`` -> ``(B, H, T, d_k)``."""
        b, t = ops.shape(x)[0], ops.shape(x)[1]
        return ops.transpose(ops.reshape(x, (b, t, self.n_heads, self.d_k)), (0, 2, 1, 3))

    def _merge_heads(self, x):
        """``(B, H, T, d_k)`` -> ``(B, T, D)``."""
        b, t = ops.shape(x)[0], ops.shape(x)[2]
        return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (b, t, self.d_model))
