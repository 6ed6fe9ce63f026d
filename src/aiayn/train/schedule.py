"""Learning-rate schedules (§5.3), as plain functions of the step (nothing to save on resume)."""

from __future__ import annotations

import math


def noam_lr(step: int, d_model: int, warmup: int = 4000, factor: float = 1.0) -> float:
    """lrate = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)  (Eq. 3).

    Rises linearly for ``warmup`` steps, then decays with the inverse square root of the step.
    Steps count from 1 (step 0 is treated as 1).
    """
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt_lr(step: int, peak_lr: float, warmup: int = 4000) -> float:
    """fairseq's ``inverse_sqrt``: linear warm-up to ``peak_lr``, then peak_lr · sqrt(warmup / step)."""
    step = max(step, 1)
    return peak_lr * min(step / warmup, math.sqrt(warmup / step))


def learning_rate(step: int, schedule: str, d_model: int, warmup: int, factor: float, peak_lr: float) -> float:
    """The learning rate of ``schedule`` ("noam" or "inverse_sqrt") at ``step``."""
    if schedule == "noam":
        return noam_lr(step, d_model, warmup, factor)
    return inverse_sqrt_lr(step, peak_lr, warmup)
