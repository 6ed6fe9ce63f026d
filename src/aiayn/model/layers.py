"""Feed-forward, residual + LayerNorm, and the encoder and decoder layers (§3.1, §3.3).

Masks: bool, True = may attend (see :mod:`aiayn.model.masks`).
"""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.model.attention import KVCache, MultiHeadAttention

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2  (Eq. 2); GELU in place of max(0, .) as an option."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu") -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.activation(self.w_1(x)))


class Residual(nn.Module):
    """A sub-layer wrapped with dropout, a residual connection and LayerNorm.

    Post-norm (paper, §3.1): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-norm (``norm_first``):  x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
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
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, activation)
        self.attn_block = Residual(d_model, dropout, norm_first, eps)
        self.ff_block = Residual(d_model, dropout, norm_first, eps)
        self.last_attention: Tensor | None = None

    def forward(self, x: Tensor, src_mask: Tensor | None, need_weights: bool = False) -> Tensor:
        """``x`` ``(B, S, D)``; ``src_mask`` ``(B, 1, 1, S)`` bool, True = may attend."""
        x = self.attn_block(x, lambda y: self._attend(y, src_mask, need_weights))
        return self.ff_block(x, self.feed_forward)

    def _attend(self, x: Tensor, mask: Tensor | None, need_weights: bool) -> Tensor:
        out, self.last_attention = self.self_attn(x, mask=mask, need_weights=need_weights)
        return out


class DecoderLayer(nn.Module):
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
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, activation)
        self.self_block = Residual(d_model, dropout, norm_first, eps)
        self.cross_block = Residual(d_model, dropout, norm_first, eps)
        self.ff_block = Residual(d_model, dropout, norm_first, eps)
        self.last_self_attention: Tensor | None = None
        self.last_cross_attention: Tensor | None = None

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        cache: tuple[KVCache, KVCache] | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        """``x`` ``(B, T, D)``, ``memory`` ``(B, S, D)``; ``tgt_mask`` ``(B, 1, T, T_total)`` and
        ``src_mask`` ``(B, 1, 1, S)``, bool, True = may attend. ``cache`` = (self, cross) caches."""
        self_cache, cross_cache = cache if cache is not None else (None, None)
        x = self.self_block(x, lambda y: self._self_attend(y, tgt_mask, self_cache, need_weights))
        x = self.cross_block(x, lambda y: self._cross_attend(y, memory, src_mask, cross_cache, need_weights))
        return self.ff_block(x, self.feed_forward)

    def _self_attend(
        self, x: Tensor, mask: Tensor | None, cache: KVCache | None, need_weights: bool
    ) -> Tensor:
        out, self.last_self_attention = self.self_attn(x, mask=mask, cache=cache, need_weights=need_weights)
        return out

    def _cross_attend(
        self, x: Tensor, memory: Tensor, mask: Tensor | None, cache: KVCache | None, need_weights: bool
    ) -> Tensor:
        out, self.last_cross_attention = self.cross_attn(
            x, memory, mask=mask, cache=cache, need_weights=need_weights
        )
        return out
