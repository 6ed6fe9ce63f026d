"""A trained model from a checkpoint, whatever its task: ``model, tokenizer, config = aiayn.load(path)``.

:mod:`aiayn.checkpoint` reads and writes checkpoint directories and knows no task; this module sits
above it and above the task packages, and builds the model a checkpoint's ``kind`` names:
``translation`` (the :class:`~aiayn.model.Transformer` and its SentencePiece tokenizer) or
``forecast`` (the :class:`~aiayn.forecast.Forecaster`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from aiayn.checkpoint import (
    CONFIG_FILE,
    MODEL_FILE,
    TOKENIZER_FILE,
    Checkpoint,
    load_checkpoint,
    load_weights,
)
from aiayn.config import TransformerConfig
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.forecast.model import ForecastConfig, Forecaster
from aiayn.model import build_model


@dataclass(frozen=True)
class LoadedModel:
    """What :func:`load` returns; unpacks as ``model, tokenizer, config = aiayn.load(path)``."""

    model: nn.Module  #: in eval mode, on the requested device
    tokenizer: Tokenizer | None  #: None for a forecasting model
    config: Any  #: :class:`aiayn.TransformerConfig`, or :class:`aiayn.forecast.ForecastConfig`
    checkpoint: Checkpoint  #: where it came from, with the stored ``config.json`` (run settings, step)

    @property
    def kind(self) -> str:
        return self.checkpoint.kind

    def __iter__(self):
        return iter((self.model, self.tokenizer, self.config))


def load(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """A trained model from a checkpoint or run directory (a run's ``best/``, else its latest).

    Translation checkpoints give the :class:`~aiayn.model.Transformer` and its tokenizer,
    forecasting ones the :class:`~aiayn.forecast.Forecaster` (tokenizer None). Every file is
    checked against the checkpoint's checksums; a bad or missing file is a :class:`UserError`
    naming it.
    """
    ckpt = load_checkpoint(path, with_state=False)
    build = BUILDERS.get(ckpt.kind)
    if build is None:
        raise UserError(f"{ckpt.path / CONFIG_FILE}: unknown checkpoint kind {ckpt.kind!r}")
    model, tokenizer, config = build(ckpt)
    return LoadedModel(model.to(device).eval(), tokenizer, config, ckpt)


def load_translation_model(path: str | Path, device: str | torch.device = "cpu"):
    """``(model, tokenizer, checkpoint)`` from a checkpoint or run directory, model in eval mode."""
    loaded = load(path, device)
    if loaded.kind != "translation":
        raise UserError(f"{loaded.checkpoint.path} is a {loaded.kind!r} checkpoint, not a translation model")
    return loaded.model, loaded.tokenizer, loaded.checkpoint


def model_languages(path: str | Path) -> tuple[str | None, str | None]:
    """The source and target languages a translation checkpoint records (its run's ``data.src_lang``
    and ``data.tgt_lang``; an imported MarianMT model's), None where it records none."""
    data = load_checkpoint(path, with_state=False).config.get("run", {}).get("data", {})
    if not isinstance(data, dict):
        return None, None
    return data.get("src_lang") or None, data.get("tgt_lang") or None


def translation_model(ckpt: Checkpoint) -> tuple[nn.Module, Tokenizer, TransformerConfig]:
    """The Transformer, its tokenizer and config of a translation checkpoint."""
    try:
        config = TransformerConfig.from_dict(ckpt.config["model"])
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"corrupt checkpoint file {ckpt.path / CONFIG_FILE}: {err}") from None
    if ckpt.tokenizer_bytes is None:
        raise UserError(f"checkpoint file missing: {ckpt.path / TOKENIZER_FILE}")
    try:
        tokenizer = Tokenizer.from_bytes(ckpt.tokenizer_bytes)
    except UserError as err:
        raise UserError(f"corrupt checkpoint file {ckpt.path / TOKENIZER_FILE}: {err}") from None
    _check_vocabulary(ckpt.path, config, tokenizer)
    model = build_model(config)
    load_weights(model, ckpt.weights, ckpt.path / MODEL_FILE)
    return model, tokenizer, config


def forecast_model(ckpt: Checkpoint) -> tuple[nn.Module, None, ForecastConfig]:
    """The Forecaster and its config of a forecasting checkpoint (no tokenizer)."""
    try:
        config = ForecastConfig.from_dict(ckpt.config["model"])
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"corrupt checkpoint file {ckpt.path / CONFIG_FILE}: model: {err}") from None
    model = Forecaster(config)
    load_weights(model, ckpt.weights, ckpt.path / MODEL_FILE)
    return model, None, config


#: How each checkpoint ``kind`` becomes ``(model, tokenizer, config)``.
BUILDERS: dict[str, Callable[[Checkpoint], tuple[nn.Module, Any, Any]]] = {
    "translation": translation_model,
    "forecast": forecast_model,
}


def _check_vocabulary(path: Path, config: TransformerConfig, tokenizer: Tokenizer) -> None:
    """The tokenizer's ids must be the model's, on each side: more pieces overrun the embeddings,
    fewer cannot decode every output id."""
    for name, pieces in (
        ("src_vocab_size", tokenizer.vocab_size),
        ("tgt_vocab_size", tokenizer.target_vocab_size),
    ):
        if getattr(config, name) != pieces:
            raise UserError(
                f"{path}: {TOKENIZER_FILE} has {pieces} pieces but {CONFIG_FILE} says "
                f"{name}={getattr(config, name)}; they must be equal"
            )
