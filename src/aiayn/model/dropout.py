"""Dropout (§5.4: on each sub-layer's output and on the embedding sums), with cheaper random numbers on CPU.

PyTorch's CPU dropout draws a random double per element (``bernoulli_``): about 12% of a training
step of the tiny Multi30k model here. :func:`dropout` draws one 64-bit integer per four elements and
drops an element when its 16-bit slice is below ``p * 65536``: Bernoulli masks from the same global
generator (seeded and checkpointed as before), with ``p`` rounded to a multiple of 1/65536
(0.1 -> 0.1000061; the kept values are scaled by the exact 1 / (1 - p) of the rounded p, so the
expectation is unchanged). Elsewhere (CUDA, where the generator is fast) it is ``F.dropout``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LEVELS = 1 << 16  # a mask element is one 16-bit slice of a 64-bit draw


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element of ``x`` with probability ``p`` (rounded to 1/65536 on CPU), scale the rest."""
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0:
        return x
    threshold = round(p * LEVELS)  # drop where the slice, as an unsigned value, is below this
    if x.device.type != "cpu" or not 0 < threshold < LEVELS:  # and p too close to 0 or 1 to round
        return F.dropout(x, p, True)
    n = x.numel()
    draws = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=x.device)
    keep = draws.view(torch.int16)[:n].view(x.shape) >= threshold - LEVELS // 2  # int16 is offset by 2^15
    return x * (keep.to(x.dtype) * (LEVELS / (LEVELS - threshold)))


class Dropout(nn.Module):
    """``nn.Dropout`` through :func:`dropout`."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
