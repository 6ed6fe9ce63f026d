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


def test_successive_calls_draw_new_masks_from_the_global_generator() -> None:
    torch.manual_seed(4)
    x = torch.ones(4096)
    state = torch.get_rng_state()
    first, second = dropout(x, 0.5) != 0, dropout(x, 0.5) != 0
    assert not torch.equal(first, second) and not torch.equal(torch.get_rng_state(), state)


def test_odd_shapes_and_layouts() -> None:
    torch.manual_seed(5)
    x = torch.randn(300, 200).t()  # not contiguous
    y = dropout(x, 0.3)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.01
    torch.testing.assert_close(y[kept], x[kept] * (LEVELS / (LEVELS - round(0.3 * LEVELS))), atol=0, rtol=0)
    assert dropout(torch.ones(()), 0.3).shape == () and dropout(torch.ones(0, 5), 0.3).shape == (0, 5)


def test_probabilities_outside_the_unit_interval_are_refused_and_tiny_ones_not_rounded_away() -> None:
    with pytest.raises(ValueError, match="probability"):
        dropout(torch.ones(4), -0.1)
    torch.manual_seed(6)
    x = torch.ones(1_000_000)
    assert (dropout(x, 1e-5) == 0).sum().item() > 0  # rounds to 0/65536: F.dropout takes it


def test_a_bf16_input_stays_bf16() -> None:
    x = torch.randn(100, dtype=torch.bfloat16, requires_grad=True)
    assert dropout(x, 0.1).dtype == torch.bfloat16 and F.dropout(x, 0.1).dtype == torch.bfloat16
