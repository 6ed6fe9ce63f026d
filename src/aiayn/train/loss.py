"""Label-smoothed cross-entropy (§5.4), computed in fp32 on non-padding positions only.

Why a hand-written loss instead of ``F.cross_entropy(label_smoothing=ε)``: on a CPU, its forward
and backward over blocks of rows are 7.2x (bf16 logits) and 4.2x (fp32) faster than PyTorch's for
the same two sums and gradients, with every round's ratio far above 1 (``benchmarks/loss_chunks.py``,
``benchmarks/results/loss_chunks_xeon_amx.json``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.model.masks import padding_mask


def label_smoothed_nll(
    logits: Tensor, target: Tensor, epsilon: float, chunk_elements: int | None = None
) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL over ``N`` positions.

    ``logits`` ``(N, V)`` (any dtype; computed in fp32), ``target`` ``(N,)``. The smoothed target
    puts 1 - ε on the reference and spreads ε uniformly over all V classes, exactly as
    ``F.cross_entropy(..., label_smoothing=ε)``:
    loss = (1 - ε) · (-log p_y) + ε · mean_v(-log p_v).

    One fused autograd function (:class:`_LabelSmoothedNLL`): the forward needs only ``logsumexp``,
    a gather and a row mean, and the backward writes the gradient ``softmax - smoothed target`` in
    one pass, instead of log-softmax's output, its backward and the gather's scatter (each a pass
    over ``N × V`` floats). On a
    CPU both go over blocks of rows (``chunk_elements`` logits each, default :data:`CHUNK_ELEMENTS`),
    so that a block's fp32 temporaries are still in cache for the next operation on them instead of
    streaming the whole ``N × V`` through memory once per operation; only the logits, in their own
    dtype (half the memory in bf16), are kept for the backward. Under ``torch.compile`` and on GPUs,
    one block.
    """
    return _LabelSmoothedNLL.apply(logits, target, epsilon, chunk_elements or CHUNK_ELEMENTS)


#: Logits per block of rows on a CPU (1 MiB in fp32): ``python benchmarks/loss_chunks.py`` compares
#: block sizes with the whole logits and with ``F.cross_entropy``.
CHUNK_ELEMENTS = 1 << 18


def _row_blocks(logits: Tensor, chunk_elements: int) -> list[slice]:
    """Row slices of ``logits`` ``(N, V)``: blocks of about ``chunk_elements`` on a CPU; one slice
    of all rows on a GPU and under ``torch.compile`` (a loop over N would specialise the graph on
    N, and the compiler fuses the whole-tensor passes itself)."""
    if logits.device.type != "cpu" or torch.compiler.is_compiling():
        return [slice(None)]
    n, vocab = logits.shape
    rows = max(1, chunk_elements // max(1, vocab))
    return [slice(i, i + rows) for i in range(0, n, rows)]


class _LabelSmoothedNLL(torch.autograd.Function):
    """(loss sum, NLL sum) of :func:`label_smoothed_nll`, with a hand-written backward."""

    @staticmethod
    def forward(
        ctx, logits: Tensor, target: Tensor, epsilon: float, chunk_elements: int
    ) -> tuple[Tensor, Tensor]:
        lse = logits.new_empty(logits.size(0), dtype=torch.float32)  # (N,)
        mean = torch.empty_like(lse)  # mean_v(x_v), (N,); only with smoothing
        for block in _row_blocks(logits, chunk_elements):
            x = logits[block].float()  # (n, V); no copy when the logits are fp32
            lse[block] = torch.logsumexp(x, dim=-1)
            if epsilon != 0:
                mean[block] = x.mean(dim=-1)
        nll = lse - logits.gather(-1, target[:, None]).squeeze(-1).float()  # -log p_y, (N,)
        ctx.save_for_backward(logits, lse, target)
        ctx.epsilon, ctx.chunk_elements = epsilon, chunk_elements
        if epsilon == 0:  # no 0 * inf where a logit is -inf
            return nll.sum(), nll.sum()
        smooth = lse - mean  # mean_v(-log p_v), (N,)
        return ((1.0 - epsilon) * nll + epsilon * smooth).sum(), nll.sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor, None, None, None]:
        logits, lse, target = ctx.saved_tensors
        eps, vocab = ctx.epsilon, logits.size(-1)
        grad = torch.empty_like(logits)
        # d loss / dx = softmax(x) - (1 - ε)·onehot(y) - ε / V ;  d nll / dx = softmax(x) - onehot(y)
        scale, offset = grad_loss + grad_nll, grad_loss * eps / vocab
        at_target = (-(grad_loss * (1.0 - eps) + grad_nll)).reshape(1, 1)
        for block in _row_blocks(logits, ctx.chunk_elements):
            if logits.dtype == torch.float32:  # computed in place in the gradient: no temporary
                block_grad = torch.sub(logits[block], lse[block, None], out=grad[block])
            else:  # bf16/fp16 minus fp32 promotes to fp32: one temporary, cast when written back
                block_grad = torch.sub(logits[block], lse[block, None])
            block_grad.exp_().mul_(scale).sub_(offset)
            block_grad.scatter_add_(-1, target[block, None], at_target.expand(block_grad.size(0), 1))
            if logits.dtype != torch.float32:
                grad[block] = block_grad  # cast to the logits' dtype
        return grad, None, None, None


class Seq2SeqObjective(nn.Module):
    """The training forward: encode, decode, and the loss on real target tokens only.

    The generator (the vocabulary projection, the largest matmul) runs only on non-padding
    positions. Wrapping this module (not the bare model) in DistributedDataParallel keeps the
    gradient hooks on the path the loss takes.
    """

    def __init__(self, model: nn.Module, epsilon: float, pad_id: int) -> None:
        super().__init__()
        self.model, self.epsilon, self.pad_id = model, epsilon, pad_id

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor]:
        """Summed (label-smoothed loss, NLL) over the non-pad tokens of ``tgt_out`` ``(B, T)``."""
        src_mask = padding_mask(src, self.pad_id)  # (B, 1, 1, S), True = may attend
        hidden = self.model.decode(tgt_in, self.model.encode(src, src_mask), src_mask)  # (B, T, D)
        real = tgt_out != self.pad_id  # (B, T)
        logits = self.model.generator(hidden[real])  # (N, V)
        return label_smoothed_nll(logits, tgt_out[real], self.epsilon)
