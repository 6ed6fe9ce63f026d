"""Checkpoint averaging, as the paper did with the last 5 (base) or 20 (big) checkpoints (§6.1)."""

from __future__ import annotations

from pathlib import Path

import torch

from aiayn.checkpoint import Checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from aiayn.errors import Setting, SettingError, UserError


def average_checkpoints(inputs: list[Path], output: Path) -> Path:
    """Average the weights of ``inputs`` (same architecture) into a new checkpoint at ``output``.

    The config and tokenizer come from the last input; no training state is written (an averaged
    model is for decoding, not for resuming).
    """
    if not inputs:
        raise UserError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    first = None
    for path in inputs:
        checkpoint = load_checkpoint(path, with_state=False)
        first = first or checkpoint
        _check_same_model(checkpoint, first)
        for name, tensor in checkpoint.weights.items():
            total[name] = total.get(name, 0) + tensor.double()
    last = checkpoint
    averaged = {name: (t / len(inputs)).to(last.weights[name].dtype) for name, t in total.items()}
    config = {**last.config, "averaged_from": [str(p) for p in inputs]}
    config.pop("format", None)
    return save_checkpoint(output, averaged, config, last.tokenizer_bytes)


def _check_same_model(checkpoint: Checkpoint, first: Checkpoint) -> None:
    """Same model config, parameter names and shapes, and tokenizer as ``first``; else a UserError."""
    if checkpoint.config.get("model") != first.config.get("model") or _shapes(checkpoint) != _shapes(first):
        raise UserError(
            f"{checkpoint.path}: a different model from {first.path} (config or weight shapes); cannot "
            "average"
        )
    if checkpoint.tokenizer_bytes != first.tokenizer_bytes:
        raise UserError(f"{checkpoint.path}: a different tokenizer from {first.path}; cannot average")


def _shapes(checkpoint: Checkpoint) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in checkpoint.weights.items()}


def last_checkpoints(run_dir: Path, n: int) -> list[Path]:
    """The last ``n`` checkpoints of ``run_dir`` (``last`` in errors), oldest first."""
    if n < 1:
        raise SettingError(Setting("last"), f" must be at least 1, got {n}")
    found = list_checkpoints(run_dir)
    if len(found) < n:
        raise SettingError(f"{run_dir} holds {len(found)} checkpoint(s), fewer than ", Setting("last", n))
    return found[-n:]
