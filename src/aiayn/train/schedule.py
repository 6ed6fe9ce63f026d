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


def cooldown_factor(progress: float, cooldown: float) -> float:
    """Multiplier for a linear decay to 0 over the last ``cooldown`` fraction of the training budget.

    ``progress`` is the fraction of the budget spent (0 to 1). Before the cool-down the factor is 1;
    then it falls linearly and reaches 0 when the budget ends (the tail of a warm-up/stable/decay
    schedule). ``cooldown`` 0 turns it off.
    """
    if cooldown <= 0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - progress) / cooldown))


def learning_rate(
    step: int, schedule: str, *, d_model: int, warmup: int, factor: float, peak_lr: float
) -> float:
    """The learning rate of ``schedule`` ("noam" or "inverse_sqrt") at ``step``."""
    if schedule == "noam":
        return noam_lr(step, d_model, warmup, factor)
    return inverse_sqrt_lr(step, peak_lr, warmup)
