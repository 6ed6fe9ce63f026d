"""Token embeddings scaled by sqrt(d_model) (§3.4) and positional encodings (§3.5)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def positional_encoding(max_len: int, d_model: int) -> Tensor:
    """The sinusoidal table ``(max_len, d_model)``.

    PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).
    """
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d/2),)
    angle = position / 10000.0 ** (two_i / d_model)  # (max_len, ceil(d/2))
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class TokenEmbedding(nn.Module):
    """Embedding lookup multiplied by sqrt(d_model), as in §3.4."""

    def __init__(self, vocab_size: int, d_model: int, pad_id: int | None = None) -> None:
        super().__init__()
        self.lut = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.scale = math.sqrt(d_model)

    @property
    def weight(self) -> nn.Parameter:
        return self.lut.weight

    def forward(self, tokens: Tensor) -> Tensor:
        """``(B, T)`` ids -> ``(B, T, D)``."""
        return self.lut(tokens) * self.scale


class PositionalEncoding(nn.Module):
    """Adds position information, then dropout (§5.4: "to the sums of the embeddings and the
    positional encodings").

    ``kind``: "sinusoidal" (a non-trainable buffer, the paper), "learned" (a trained table, the
    paper's Table 3 row E), or "none" (identity apart from dropout; used for some time series).
    """

    def __init__(self, d_model: int, max_len: int, kind: str = "sinusoidal", dropout: float = 0.0) -> None:
        super().__init__()
        self.kind, self.max_len = kind, max_len
        self.dropout = nn.Dropout(dropout)
        if kind == "sinusoidal":
            self.register_buffer("table", positional_encoding(max_len, d_model), persistent=False)
        elif kind == "learned":
            self.table = nn.Parameter(torch.empty(max_len, d_model).normal_(0.0, d_model**-0.5))
        elif kind != "none":
            raise ValueError(f"positional: unknown value {kind!r}; valid: sinusoidal, learned, none")

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """``x`` ``(B, T, D)`` holding positions ``offset .. offset+T-1``."""
        if self.kind != "none":
            end = offset + x.size(1)
            if end > self.max_len:
                raise ValueError(f"sequence of {end} positions exceeds max_len={self.max_len}")
            x = x + self.table[offset:end].to(x.dtype)
        return self.dropout(x)
