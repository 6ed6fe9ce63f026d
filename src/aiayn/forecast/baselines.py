"""Baselines measured with the same data pipeline: repeat-last, seasonal naive, DLinear.

Each maps an input window ``x`` ``(B, L, n)`` to a forecast ``(B, H, len(outputs))``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RepeatLast(nn.Module):
    """Every future step equals the last known value."""

    def __init__(self, horizon: int, outputs: list[int]) -> None:
        super().__init__()
        self.horizon, self.outputs = horizon, outputs

    def forward(self, x: Tensor) -> Tensor:
        return x[:, -1:, self.outputs].expand(-1, self.horizon, -1)  # (B, H, n_out)


class SeasonalNaive(nn.Module):
    """Step ``t`` of the horizon equals the value one ``period`` earlier (the last cycle repeated)."""

    def __init__(self, horizon: int, outputs: list[int], period: int) -> None:
        super().__init__()
        self.horizon, self.outputs, self.period = horizon, outputs, period

    def forward(self, x: Tensor) -> Tensor:
        if x.size(1) < self.period:
            raise ValueError(f"input length {x.size(1)} is shorter than the period {self.period}")
        cycle = x[:, -self.period :, self.outputs]  # (B, period, n_out)
        reps = -(-self.horizon // self.period)
        return cycle.repeat(1, reps, 1)[:, : self.horizon]  # (B, H, n_out)


class MovingAverage(nn.Module):
    """Moving average over time with edge-replicated padding (keeps the length)."""

    def __init__(self, kernel: int) -> None:
        super().__init__()
        self.kernel = kernel

    def forward(self, x: Tensor) -> Tensor:
        front, back = (self.kernel - 1) // 2, self.kernel // 2
        padded = torch.cat([x[:, :1].expand(-1, front, -1), x, x[:, -1:].expand(-1, back, -1)], dim=1)
        return F.avg_pool1d(padded.transpose(1, 2), self.kernel, stride=1).transpose(1, 2)  # (B, L, n)


class DLinear(nn.Module):
    """DLinear (Zeng et al. 2023): trend = moving average, seasonal = rest; one linear map L -> H
    for each, shared across variables."""

    def __init__(self, seq_len: int, horizon: int, outputs: list[int], kernel: int = 25) -> None:
        super().__init__()
        self.decompose = MovingAverage(kernel)
        self.trend = nn.Linear(seq_len, horizon)
        self.seasonal = nn.Linear(seq_len, horizon)
        self.outputs = outputs

    def forward(self, x: Tensor, target: Tensor | None = None) -> Tensor:
        trend = self.decompose(x)  # (B, L, n)
        seasonal = x - trend
        y = self.trend(trend.transpose(1, 2)) + self.seasonal(seasonal.transpose(1, 2))  # (B, n, H)
        return y.transpose(1, 2)[..., self.outputs]  # (B, H, n_out)
