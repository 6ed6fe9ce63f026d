"""Forecast errors, computed in fp64 on the standardised scale (the literature's convention), and
:func:`evaluate`, the scores of a model on a split (inference code: nothing from training here)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.forecast.data import Windows
from aiayn.precision import autocast


def mse(prediction: Tensor, truth: Tensor) -> float:
    """Mean squared error over every element."""
    return float(((prediction.double() - truth.double()) ** 2).mean())


def mae(prediction: Tensor, truth: Tensor) -> float:
    """Mean absolute error over every element."""
    return float((prediction.double() - truth.double()).abs().mean())


def model_device(model: nn.Module) -> torch.device:
    """Where ``model``'s weights are (the CPU for a model without any, such as repeat-last)."""
    tensor = next(model.parameters(), None)
    return tensor.device if tensor is not None else torch.device("cpu")


class Running:
    """Accumulates squared and absolute error sums over batches."""

    def __init__(self) -> None:
        self.sq, self.abs, self.count = 0.0, 0.0, 0

    def update(self, prediction: Tensor, truth: Tensor) -> None:
        diff = prediction.double() - truth.double()
        self.sq += float((diff**2).sum())
        self.abs += float(diff.abs().sum())
        self.count += diff.numel()

    def result(self) -> dict[str, float]:
        return {"mse": self.sq / max(self.count, 1), "mae": self.abs / max(self.count, 1)}


#: At most this many series per forward when scoring a channel-independent model, which reads each
#: window's variables as that many series: a wide file (hundreds of variables) is scored in batches of
#: fewer windows, so memory stays that of a narrow one (256 windows of ETT's 7 variables: 1,792).
SERIES_PER_BATCH = 2048


def windows_per_batch(model: nn.Module, n_variables: int, batch_size: int) -> int:
    """``batch_size``, or fewer windows for a channel-independent model of a wide file."""
    if not getattr(getattr(model, "config", None), "channel_independent", False):
        return batch_size
    return max(1, min(batch_size, SERIES_PER_BATCH // n_variables))


@torch.no_grad()
def evaluate(
    model: nn.Module,
    windows: Windows,
    outputs: list[int],
    batch_size: int = 256,
    bf16: bool = False,
    limit: int | None = None,
) -> dict[str, float]:
    """MSE and MAE over every window of a split (standardised scale), or over its first ``limit``."""
    model.eval()
    device = model_device(model)
    windows = windows.to(device)
    running = Running()
    if limit is not None and limit < 1:
        raise ValueError(f"evaluate: limit must be >= 1 (got {limit}); no windows would score a perfect 0")
    count = len(windows) if limit is None else min(limit, len(windows))
    batch_size = windows_per_batch(model, windows.data.size(-1), batch_size)
    for start in range(0, count, batch_size):
        idx = torch.arange(start, min(start + batch_size, count))
        with autocast(device, "bf16" if bf16 else "fp32"):
            pred = model(windows.inputs(idx))
        running.update(pred.float(), windows.targets(idx)[..., outputs])
    return running.result()
