"""Scaled dot-product attention, multi-head attention (§3.2) and the key/value cache.

Masks follow :mod:`aiayn.model.masks`: bool, **True = may attend**, broadcastable to
``(B, H, T_q, T_k)``. A query row whose keys are all masked yields a zero output, never NaN.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PATHS = ("auto", "fused", "formula")  # how Eq. 1 is computed: see scaled_dot_product_attention
# On CPU, the backward of PyTorch's fused (flash) kernel in bf16/fp16 pays a large fixed cost per
# (batch row, head), while the written-out formula costs about T_q * T_k per (row, head): for score
# matrices up to this size the formula's backward is the faster one (``benchmarks/attention_paths.py``).
SMALL_SCORES_GRAD = 4096  # T_q * T_k per (row, head), ~64 x 64

# q, k, v, mask, need_weights -> (output, weights or None): what a cache's ``attend`` calls
AttentionFn = Callable[[Tensor, Tensor, Tensor, Optional[Tensor], bool], tuple[Tensor, Optional[Tensor]]]


def attention_weights(q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) in fp32, ``(B, H, T_q, T_k)``; masked keys get weight 0.

    Masked scores are filled with the most negative fp32 value (not a constant like -1e9, which
    overflows in half precision), and weights are multiplied by the mask afterwards so that a
    fully masked row is all zeros instead of a uniform distribution.
    """
    with torch.autocast(q.device.type, enabled=False):  # fp32 even under autocast
        scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T_q, T_k)
        if mask is None:
            return scores.softmax(dim=-1)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        return scores.softmax(dim=-1) * mask


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool | None = False,
    path: str = "auto",
) -> tuple[Tensor, Tensor | None]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V  (Eq. 1).

    ``q`` ``(B, H, T_q, d_k)``, ``k``/``v`` ``(B, H, T_k, d_k)``; ``mask`` bool, True = may attend.
    Two paths, which agree to 1e-5 in fp32: PyTorch's fused ``F.scaled_dot_product_attention``, and
    the formula written out (the reference, which also gives the weights). ``path``: "fused",
    "formula", or "auto" (the default): the fused kernel unless the formula is the faster one
    (:func:`formula_is_faster`). ``need_weights=True`` always takes the formula and returns the
    weights ``(B, H, T_q, T_k)``; otherwise (``False`` or ``None``) the weights are None.
    """
    if path not in PATHS:
        raise ValueError(f"path: unknown value {path!r}; valid: {', '.join(PATHS)}")
    if not (need_weights or path == "formula" or (path == "auto" and formula_is_faster(q, k))):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p), None
    weights = attention_weights(q, k, mask)  # (B, H, T_q, T_k), fp32
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return (dropped.to(v.dtype) @ v), weights if need_weights else None  # (B, H, T_q, d_k)


def formula_is_faster(q: Tensor, k: Tensor) -> bool:
    """Whether "auto" takes the written-out formula: on CPU, when gradients will flow back through
    bf16/fp16 attention over at most ``SMALL_SCORES_GRAD`` scores per (row, head). Everywhere else
    (no gradients, fp32, larger score matrices, GPUs) the fused kernel."""
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    small = q.size(-2) * k.size(-2) <= SMALL_SCORES_GRAD
    return q.device.type == "cpu" and grad and q.dtype != torch.float32 and small


class KVCache:
    """Keys and values of one attention module, kept across decoding steps.

    ``static=True`` (cross-attention): keys/values of the encoder memory, computed once per source.
    ``static=False`` (decoder self-attention): grows by one position per step.
    """

    def __init__(self, static: bool) -> None:
        self.static = static
        self.k: Tensor | None = None  # (B, H, T, d_k)
        self.v: Tensor | None = None

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store (static) or append (incremental) new keys/values; return all of them."""
        if self.k is not None and not self.static:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        elif self.static:  # read at every step: contiguous, so that the batched matmuls need no copy
            k, v = k.contiguous(), v.contiguous()
        self.k, self.v = k, v
        return k, v

    @property
    def filled(self) -> bool:
        return self.k is not None

    def reorder(self, new_order: Tensor) -> None:
        """Select batch rows (beam search): row i becomes old row ``new_order[i]``."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, new_order), self.v.index_select(0, new_order)

    def attend(
        self, attention: AttentionFn, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """``attention(q, k, v, mask, need_weights)``: query row i attends to cached row i. (A decoder
        may keep fewer rows than it has queries by overriding this; see :mod:`aiayn.decode.cache`.)"""
        return attention(q, k, v, mask, need_weights)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    The three input projections W^Q, W^K, W^V are stored stacked in one ``in_proj`` of shape
    ``(3 d_model, d_model)`` (rows: Q, then K, then V), so self-attention does one matmul; cross
    attention uses the Q rows on the decoder states and the K/V rows on the memory.
    ``path``: how :func:`scaled_dot_product_attention` computes Eq. 1 ("auto", "fused" or
    "formula"); an attribute, so it can be changed on a built model.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, path: str = "auto") -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if path not in PATHS:
            raise ValueError(f"path: unknown value {path!r}; valid: {', '.join(PATHS)}")
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.dropout, self.path = dropout, path
        self.in_proj = nn.Linear(d_model, 3 * d_model)  # [W^Q; W^K; W^V]
        self.out_proj = nn.Linear(d_model, d_model)  # W^O

    def forward(
        self,
        query: Tensor,
        key_value: Tensor | None = None,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """``query`` ``(B, T_q, D)``; ``key_value`` ``(B, T_k, D)`` or None for self-attention.

        ``mask``: bool, True = may attend, broadcastable to ``(B, H, T_q, T_k)``.
        ``cache``: see :class:`KVCache`; a filled static cache skips the K/V projections.
        Returns the output ``(B, T_q, D)`` and, when ``need_weights``, the weights ``(B, H, T_q, T_k)``.
        """
        q, k, v = self._project(query, key_value, cache)
        if cache is None:
            out, weights = self._attention(q, k, v, mask, need_weights)
        else:
            out, weights = cache.attend(self._attention, q, k, v, mask, need_weights)
        return self.out_proj(self._merge_heads(out)), weights

    def _attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Eq. 1 on every head at once: ``(B, H, T_q, d_k)``, with this module's dropout and path."""
        dropout_p = self.dropout if self.training else 0.0
        return scaled_dot_product_attention(q, k, v, mask, dropout_p, need_weights, self.path)

    def _project(
        self, query: Tensor, key_value: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V split into heads, each ``(B, H, T, d_k)``, with the cache applied."""
        if key_value is None:  # self-attention: one fused projection
            q, k, v = self.in_proj(query).chunk(3, dim=-1)
        else:
            d = self.d_model
            q = F.linear(query, self.in_proj.weight[:d], self.in_proj.bias[:d])
            if cache is not None and cache.static and cache.filled:
                return self._split_heads(q), cache.k, cache.v
            k, v = F.linear(key_value, self.in_proj.weight[d:], self.in_proj.bias[d:]).chunk(2, dim=-1)
        q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
        if cache is not None:
            k, v = cache.update(k, v)
        return q, k, v

    def _split_heads(self, x: Tensor) -> Tensor:
        """``(B, T, D)`` -> ``(B, H, T, d_k)``."""
        return x.unflatten(-1, (self.n_heads, self.d_k)).transpose(1, 2)

    def _merge_heads(self, x: Tensor) -> Tensor:
        """``(B, H, T, d_k)`` -> ``(B, T, D)``."""
        b, h, t, d = x.shape
        return x.transpose(1, 2).reshape(b, t, h * d)
