"""aiayn's dropout: Bernoulli masks from 16-bit slices of 64-bit draws (CPU), checked statistically."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from aiayn.model.dropout import LEVELS, Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_each_of_the_four_slices_of_a_draw_drops_with_probability_p(p: float) -> None:
    torch.manual_seed(0)
    n = 4 * 250_000
    kept = dropout(torch.ones(n), p) != 0
    rate = 1 - round(p * LEVELS) / LEVELS
    sigma = math.sqrt(rate * (1 - rate) / (n // 4))
    for lane in range(4):  # a biased slice (a draw with fewer than 64 random bits) would show here
        assert abs(kept[lane::4].float().mean().item() - rate) < 6 * sigma, lane
    neighbours = (kept[1:] == kept[:-1]).float().mean().item()  # independent: rate^2 + (1-rate)^2
    assert abs(neighbours - (rate**2 + (1 - rate) ** 2)) < 0.005


def test_kept_values_are_scaled_so_the_expectation_is_unchanged_and_gradients_follow_the_mask() -> None:
    torch.manual_seed(1)
    x = torch.randn(64, 7, 33, requires_grad=True)  # not a multiple of 4 elements per row
    y = dropout(x, 0.1)
    kept = y != 0
    scale = LEVELS / (LEVELS - round(0.1 * LEVELS))
    torch.testing.assert_close(y[kept], x[kept] * scale, atol=0, rtol=0)
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() * scale, atol=0, rtol=0)


def test_seeded_eval_zero_and_one() -> None:
    x = torch.randn(1000)
    torch.manual_seed(3)
    first = dropout(x, 0.3)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.3), first)
    module = Dropout(0.3).eval()
    assert module(x) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    with pytest.raises(ValueError, match="probability"):
        Dropout(1.5)


def test_a_bf16_input_stays_bf16() -> None:
    x = torch.randn(100, dtype=torch.bfloat16, requires_grad=True)
    assert dropout(x, 0.1).dtype == torch.bfloat16 and F.dropout(x, 0.1).dtype == torch.bfloat16
