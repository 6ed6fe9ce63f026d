"""Training: the label-smoothed loss, against torch's cross-entropy, and under torch.compile."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.data.batching import collate
from aiayn.train import loss as loss_module
from aiayn.train.config import run_config_from_dict
from aiayn.train.engine import start
from aiayn.train.loss import label_smoothed_nll
from aiayn.train.translation import TranslationTask
from conftest import run_config


def test_label_smoothing_hand_computed() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))  # log-probs of a known distribution
    loss, nll = label_smoothed_nll(logits, torch.tensor([0]), epsilon=0.3)
    expected_nll = -math.log(0.5)
    smooth = -(math.log(0.5) + 2 * math.log(0.25)) / 3
    assert nll.item() == pytest.approx(expected_nll)
    assert loss.item() == pytest.approx(0.7 * expected_nll + 0.3 * smooth)
    assert math.isfinite(label_smoothed_nll(torch.tensor([[0.0, -1e4]]), torch.tensor([0]), 0.1)[0].item())


def test_label_smoothing_matches_torch_cross_entropy() -> None:
    logits, target = torch.randn(50, 37), torch.randint(0, 37, (50,))
    loss, nll = label_smoothed_nll(logits.bfloat16(), target, epsilon=0.1)
    reference = F.cross_entropy(logits.bfloat16().float(), target, label_smoothing=0.1, reduction="sum")
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(nll, F.cross_entropy(logits.bfloat16().float(), target, reduction="sum"))


@pytest.mark.parametrize(
    "chunk_elements", [1 << 18, 3 * 29]
)  # one block of rows; blocks of 3 rows (the last of 1)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_label_smoothing_gradient_matches_torch_cross_entropy(dtype, chunk_elements) -> None:
    """The hand-written forward and backward against autograd through F.cross_entropy, for both
    outputs, in one block of rows and in many."""
    blocks = loss_module._row_blocks(torch.empty(40, 29), chunk_elements)
    assert len(blocks) == (1 if chunk_elements > 40 * 29 else 14)
    logits, target = torch.randn(40, 29, dtype=torch.float64), torch.randint(0, 29, (40,))
    weights = torch.tensor(0.7), torch.tensor(-1.3)  # an arbitrary mix of the two outputs' gradients
    ours = logits.to(dtype).requires_grad_()
    loss, nll = label_smoothed_nll(ours, target, epsilon=0.1, chunk_elements=chunk_elements)
    (weights[0] * loss + weights[1] * nll).backward()
    theirs = logits.to(dtype).float().requires_grad_()
    ref = weights[0] * F.cross_entropy(theirs, target, label_smoothing=0.1, reduction="sum") + weights[
        1
    ] * F.cross_entropy(theirs, target, reduction="sum")
    ref.backward()
    torch.testing.assert_close(weights[0] * loss + weights[1] * nll, ref.detach())
    assert ours.grad.dtype == dtype
    tolerance = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(ours.grad.float(), theirs.grad.to(dtype).float(), **tolerance)


@pytest.mark.parametrize(
    "epsilon, masked", [(0.0, -math.inf), (0.1, -1e4)]
)  # smoothing gives -inf a loss of inf
def test_label_smoothing_in_blocks_of_rows_equals_one_block(epsilon, masked) -> None:
    """Strided logits (a transpose) with a masked logit: blocks of 3 rows give one block's loss and
    gradient."""
    logits, target = torch.randn(29, 40).t(), torch.randint(0, 29, (40,))
    logits[3, 5] = masked
    target[3] = 6

    def loss_and_grad(chunk_elements: int) -> tuple[Tensor, Tensor, Tensor]:
        leaf = logits.clone().t().contiguous().t().requires_grad_()  # strided like ``logits``
        loss, nll = label_smoothed_nll(leaf, target, epsilon, chunk_elements)
        (loss + 0.5 * nll).backward()
        return loss.detach(), nll.detach(), leaf.grad

    one, blocks = loss_and_grad(1 << 18), loss_and_grad(3 * 29)
    assert all(torch.isfinite(t).all() for t in one)
    for a, b in zip(one, blocks):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert one[2][3, 5] == pytest.approx(-epsilon / 29)  # no probability: only the smoothing target ε / V


def test_the_loss_compiles_once_for_any_number_of_tokens() -> None:
    """The number of real target tokens changes at every step: the compiled loss must not
    specialise on it (a graph for the first call, then one dynamic graph; the CPU path's loop
    over row blocks would make one per N)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(label_smoothed_nll, backend="eager")
    for n in (5, 6, 7, 9, 12):
        logits, target = torch.randn(n, 11, requires_grad=True), torch.randint(0, 11, (n,))
        loss, _ = compiled(logits, target, 0.1)
        loss.backward()
        torch.testing.assert_close(loss, label_smoothed_nll(logits, target, 0.1)[0])
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])
    torch._dynamo.reset()


def test_objective_traces_under_torch_compile(task_dir: Path) -> None:
    """The hand-written loss backward goes through dynamo/AOTAutograd (train.compile: true).

    ``aot_eager`` traces exactly what inductor would get, without a C++ build (seconds, not minutes).
    """
    config = run_config_from_dict(run_config(task_dir, model={"dropout": 0.0}))
    trainer = start(TranslationTask(config), task_dir / "compiled", log=lambda _: None)
    batch = collate(trainer.train_examples[:8])
    eager = [trainer.loss_fn(batch.src, batch.tgt_in, batch.tgt_out)[0]]
    eager[0].backward()
    expected = {name: p.grad.clone() for name, p in trainer.loss_fn.named_parameters()}
    trainer.loss_fn.zero_grad(set_to_none=True)
    compiled = torch.compile(trainer.loss_fn, backend="aot_eager", fullgraph=False)
    loss, _ = compiled(batch.src, batch.tgt_in, batch.tgt_out)
    loss.backward()
    torch.testing.assert_close(loss, eager[0])
    for name, p in trainer.loss_fn.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], atol=1e-6, rtol=1e-5, msg=name)
