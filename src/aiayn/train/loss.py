"""Label-smoothed cross-entropy (§5.4), computed in fp32 on non-padding positions only."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.model.masks import padding_mask


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL over ``N`` positions.

    ``logits`` ``(N, V)`` (any dtype; computed in fp32), ``target`` ``(N,)``. The smoothed target
    puts 1 - ε on the reference and spreads ε uniformly over all V classes, exactly as
    ``F.cross_entropy(..., label_smoothing=ε)``:
    loss = (1 - ε) · (-log p_y) + ε · mean_v(-log p_v).

    One fused autograd function (:class:`_LabelSmoothedNLL`): the forward needs only ``logsumexp``,
    a gather and a row mean, and the backward writes the gradient ``softmax - smoothed target`` in
    one pass, instead of log-softmax's output, its backward and the gather's scatter (each a pass
    over ``N × V`` floats; together about a tenth of a small model's training step on a CPU).
    """
    return _LabelSmoothedNLL.apply(logits, target, epsilon)


class _LabelSmoothedNLL(torch.autograd.Function):
    """(loss sum, NLL sum) of :func:`label_smoothed_nll`, with a hand-written backward."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
        x = logits.float()  # (N, V); no copy when the logits are fp32
        lse = torch.logsumexp(x, dim=-1)  # (N,)
        nll = lse - x.gather(-1, target[:, None]).squeeze(-1)  # -log p_y, (N,)
        ctx.save_for_backward(x, lse, target)
        ctx.epsilon, ctx.dtype = epsilon, logits.dtype
        if epsilon == 0:  # no 0 * inf where a logit is -inf
            return nll.sum(), nll.sum()
        smooth = lse - x.mean(dim=-1)  # mean_v(-log p_v), (N,)
        return ((1.0 - epsilon) * nll + epsilon * smooth).sum(), nll.sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor, None, None]:
        x, lse, target = ctx.saved_tensors
        eps, vocab = ctx.epsilon, x.size(-1)
        # d loss / dx = softmax(x) - (1 - ε)·onehot(y) - ε / V ;  d nll / dx = softmax(x) - onehot(y)
        grad = torch.exp(x - lse[:, None]).mul_(grad_loss + grad_nll).sub_(grad_loss * eps / vocab)
        at_target = (-(grad_loss * (1.0 - eps) + grad_nll)).reshape(1, 1).expand(target.size(0), 1)
        grad.scatter_add_(-1, target[:, None], at_target)
        return grad.to(ctx.dtype), None, None


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

