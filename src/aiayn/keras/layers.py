"""Feed-forward, residual + LayerNorm, and the encoder and decoder layers (§3.1, §3.3), as Keras layers.

The PyTorch boxes are :mod:`aiayn.model.layers`. Masks: bool, True = may attend. Each layer returns
its output and the attention weights of its attention sub-layers (the PyTorch layers keep them in
attributes instead; a Keras layer's state is better left to its weights).
"""

from __future__ import annotations

from typing import Callable

import keras
from keras import ops

from aiayn.keras.attention import KVCache, MultiHeadAttention
from aiayn.keras.base import BuiltLayer, build_part

#: The feed-forward activations by their TransformerConfig names; GELU is the exact (erf) one, as
#: PyTorch's ``F.gelu`` (Keras's default is the tanh approximation); SiLU is x * sigmoid(x).
ACTIVATIONS: dict[str, Callable] = {
    "relu": ops.relu,
    "gelu": lambda x: ops.gelu(x, approximate=False),
    "silu": ops.silu,
}


class PositionwiseFeedForward(BuiltLayer):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2  (Eq. 2); GELU or SiLU in place of max(0, .) as options."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", **kwargs) -> None:
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation: unknown value {activation!r}; valid: {', '.join(ACTIVATIONS)}")
        self.w_1 = keras.layers.Dense(d_ff, name="w_1")
        self.w_2 = keras.layers.Dense(d_model, name="w_2")
        self.d_model, self.d_ff, self.activation = d_model, d_ff, ACTIVATIONS[activation]

    def build(self, input_shape=None) -> None:
        build_part(self.w_1, (None, self.d_model))
        build_part(self.w_2, (None, self.d_ff))

    def call(self, x):
        return self.w_2(self.activation(self.w_1(x)))


class Residual(BuiltLayer):
    """A sub-layer wrapped with dropout, a residual connection and LayerNorm.

    Post-norm (paper, §3.1): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-norm (``norm_first``):  x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float = 1e-5, **kwargs) -> None:
        super().__init__(**kwargs)
        self.norm = keras.layers.LayerNormalization(epsilon=eps, name="norm")
        self.dropout = keras.layers.Dropout(dropout)
        self.norm_first, self.d_model = norm_first, d_model

    def build(self, input_shape=None) -> None:
        build_part(self.norm, (None, self.d_model))

    def call(self, x, sublayer: Callable, training=None):
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)), training=training)
        return self.norm(x + self.dropout(sublayer(x), training=training))


class EncoderLayer(BuiltLayer):
    """Self-attention, then the feed-forward network, each in a :class:`Residual`."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        attention_dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        eps: float = 1e-5,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, name="self_attn")
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, activation, name="feed_forward")
        self.attn_block = Residual(d_model, dropout, norm_first, eps, name="attn_block")
        self.ff_block = Residual(d_model, dropout, norm_first, eps, name="ff_block")

    def build(self, input_shape=None) -> None:
        for part in (self.self_attn, self.feed_forward, self.attn_block, self.ff_block):
            build_part(part)

    def call(self, x, src_mask=None, training=None):
        """``x`` ``(B, S, D)``; ``src_mask`` ``(B, 1, 1, S)`` bool, True = may attend.
        Returns ``(x, self-attention weights (B, H, S, S))``."""
        weights = []

        def attend(y):
            out, w = self.self_attn(y, attention_mask=src_mask, training=training)
            weights.append(w)
            return out

        x = self.attn_block(x, sublayer=attend, training=training)
        return self.ff_block(x, sublayer=self.feed_forward, training=training), weights[0]


class DecoderLayer(BuiltLayer):
    """Masked self-attention, attention over the encoder ``memory``, then the feed-forward network."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        attention_dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        eps: float = 1e-5,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, name="self_attn")
        self.cross_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, name="cross_attn")
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, activation, name="feed_forward")
        self.self_block = Residual(d_model, dropout, norm_first, eps, name="self_block")
        self.cross_block = Residual(d_model, dropout, norm_first, eps, name="cross_block")
        self.ff_block = Residual(d_model, dropout, norm_first, eps, name="ff_block")

    def build(self, input_shape=None) -> None:
        parts = (self.self_attn, self.cross_attn, self.feed_forward, self.self_block, self.cross_block)
        for part in (*parts, self.ff_block):
            build_part(part)

    def call(
        self,
        x,
        memory,
        src_mask=None,
        tgt_mask=None,
        cache: tuple[KVCache, KVCache] | None = None,
        training=None,
    ):
        """``x`` ``(B, T, D)``, ``memory`` ``(B, S, D)``; ``tgt_mask`` ``(B, 1, T, T_total)`` and
        ``src_mask`` ``(B, 1, 1, S)``, bool, True = may attend. ``cache`` = (self, cross) caches.
        Returns ``(x, self-attention weights, cross-attention weights)``."""
        self_cache, cross_cache = cache if cache is not None else (None, None)
        weights = []

        def self_attend(y):
            out, w = self.self_attn(y, attention_mask=tgt_mask, cache=self_cache, training=training)
            weights.append(w)
            return out

        def cross_attend(y):
            out, w = self.cross_attn(y, memory, attention_mask=src_mask, cache=cross_cache, training=training)
            weights.append(w)
            return out

        x = self.self_block(x, sublayer=self_attend, training=training)
        x = self.cross_block(x, sublayer=cross_attend, training=training)
        return self.ff_block(x, sublayer=self.feed_forward, training=training), weights[0], weights[1]
