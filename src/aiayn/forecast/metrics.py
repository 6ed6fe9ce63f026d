"""Forecast errors, computed in fp64 on the standardised scale (the literature's convention)."""

from __future__ import annotations

from torch import Tensor


def mse(prediction: Tensor, truth: Tensor) -> float:
    """Mean squared error over every element."""
    return float(((prediction.double() - truth.double()) ** 2).mean())


def mae(prediction: Tensor, truth: Tensor) -> float:
    """Mean absolute error over every element."""
    return float((prediction.double() - truth.double()).abs().mean())


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
