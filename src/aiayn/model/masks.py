"""The one mask convention of aiayn.

A mask is a **boolean** tensor, **True = may attend**, broadcastable to the attention scores'
shape ``(B, H, T_q, T_k)``. The helpers here build the two masks the paper needs:

* a padding mask ``(B, 1, 1, T_k)``: key position j is True when token j is not padding;
* a causal ("subsequent") mask ``(1, 1, T, T)``: query i may attend key j when j <= i.

They combine with ``&``. PyTorch's ``nn.MultiheadAttention`` uses the opposite polarity for bool
masks (True = masked out); :func:`to_torch_mha_mask` converts at that boundary.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """``(B, T)`` token ids -> ``(B, 1, 1, T)`` bool, True where the key is a real token."""
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(size: int, device: torch.device | None = None) -> Tensor:
    """``(1, 1, T, T)`` bool, True on and below the diagonal (position i sees positions <= i)."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()[None, None]


def target_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Decoder self-attention mask: padding & causal, ``(B, 1, T, T)``."""
    return padding_mask(tokens, pad_id) & causal_mask(tokens.size(1), tokens.device)


def to_torch_mha_mask(mask: Tensor) -> Tensor:
    """Our convention (True = may attend) -> ``nn.MultiheadAttention``'s (True = may NOT attend)."""
    return ~mask
