"""Label-smoothed cross-entropy (§5.4), computed in fp32 on non-padding positions only."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.model.masks import padding_mask


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL over ``N`` positions.

    ``logits`` ``(N, V)`` (any dtype; computed in fp32), ``target`` ``(N,)``. The smoothed target
    puts 1 - ε on the reference and spreads ε uniformly over all V classes, exactly as
    ``F.cross_entropy(..., label_smoothing=ε)``:
    loss = (1 - ε) · (-log p_y) + ε · mean_v(-log p_v).
    """
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (N, V)
    nll = -log_probs.gather(-1, target[:, None]).squeeze(-1)  # (N,)
    smooth = -log_probs.mean(dim=-1)  # (N,)
    loss = (1.0 - epsilon) * nll + epsilon * smooth
    return loss.sum(), nll.sum()


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

