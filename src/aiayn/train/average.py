"""Checkpoint averaging, as the paper did with the last 5 (base) or 20 (big) checkpoints (§6.1)."""

from __future__ import annotations

from pathlib import Path

import torch

from aiayn.errors import UserError
from aiayn.train.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint


def average_checkpoints(inputs: list[Path], output: Path) -> Path:
    """Average the weights of ``inputs`` (same architecture) into a new checkpoint at ``output``.

    The config and tokenizer come from the last input; no training state is written (an averaged
    model is for decoding, not for resuming).
    """
    if not inputs:
        raise UserError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    for path in inputs:
        weights = load_checkpoint(path, with_state=False).weights
        if total and set(weights) != set(total):
            raise UserError(f"{path}: its weights differ in names from {inputs[0]}; cannot average")
        for name, tensor in weights.items():
            total[name] = total.get(name, 0) + tensor.double()
    last = load_checkpoint(inputs[-1], with_state=False)
    averaged = {name: (t / len(inputs)).to(last.weights[name].dtype) for name, t in total.items()}
    config = {**last.config, "averaged_from": [str(p) for p in inputs]}
    config.pop("format", None)
    return save_checkpoint(output, averaged, config, last.tokenizer_bytes)


def last_checkpoints(run_dir: Path, n: int) -> list[Path]:
    found = list_checkpoints(run_dir)
    if len(found) < n:
        raise UserError(f"{run_dir} holds {len(found)} checkpoint(s), fewer than --last {n}")
    return found[-n:]
