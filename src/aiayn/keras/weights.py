"""aiayn checkpoints in and out of Keras: the PyTorch model's weight names mapped onto the Keras
model's variables, :func:`load` (a trained checkpoint as a Keras model, every file checked against
its checksums) and :func:`save` (a Keras model as a checkpoint ``aiayn translate`` reads).

The only difference of layout: a Keras ``Dense`` kernel is ``(in, out)``, a PyTorch ``Linear``
weight ``(out, in)``; everything else (embeddings, learned positions, LayerNorm) has the same shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import keras
import numpy as np
import torch
from keras import ops

from aiayn.checkpoint import Checkpoint, save_checkpoint
from aiayn.config import TransformerConfig
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.keras.transformer import Transformer
from aiayn.loading import load_translation_model
from aiayn.model import Transformer as TorchTransformer
from aiayn.model import build_model as build_torch_model


def weight_map(model: Transformer) -> dict[str, tuple[Any, bool]]:
    """``{aiayn weight name: (Keras variable, transposed)}`` for every name in the state dict of
    :func:`aiayn.build_model` with the same config (tied names map to the one shared variable)."""
    names: dict[str, tuple[Any, bool]] = {}

    def dense(prefix: str, layer) -> None:
        names[f"{prefix}.weight"] = (layer.kernel, True)
        if layer.use_bias:
            names[f"{prefix}.bias"] = (layer.bias, False)

    def norm(prefix: str, layer) -> None:
        names[f"{prefix}.weight"], names[f"{prefix}.bias"] = (layer.gamma, False), (layer.beta, False)

    names["src_embed.lut.weight"] = (model.src_embed.embeddings, False)
    names["tgt_embed.lut.weight"] = (model.tgt_embed.embeddings, False)
    if model.config.positional == "learned":
        names["src_pos.table"], names["tgt_pos.table"] = (
            (model.src_pos.table, False),
            (model.tgt_pos.table, False),
        )
    for stack, prefix in ((model.encoder, "encoder"), (model.decoder, "decoder")):
        for i, layer in enumerate(stack.blocks):
            at = f"{prefix}.layers.{i}"
            attention = ["self_attn"] + (["cross_attn"] if prefix == "decoder" else [])
            for name in attention:
                dense(f"{at}.{name}.in_proj", getattr(layer, name).in_proj)
                dense(f"{at}.{name}.out_proj", getattr(layer, name).out_proj)
            dense(f"{at}.feed_forward.w_1", layer.feed_forward.w_1)
            dense(f"{at}.feed_forward.w_2", layer.feed_forward.w_2)
            blocks = (
                ["self_block", "cross_block", "ff_block"]
                if prefix == "decoder"
                else ["attn_block", "ff_block"]
            )
            for name in blocks:
                norm(f"{at}.{name}.norm", getattr(layer, name).norm)
        if stack.norm is not None:
            norm(f"{prefix}.norm", stack.norm)
    if model.generator.tied is not None:
        names["generator.proj.weight"] = (model.generator.tied.embeddings, False)
        if model.generator.bias is not None:
            names["generator.proj.bias"] = (model.generator.bias, False)
    else:
        dense("generator.proj", model.generator.proj)
    return names


def set_aiayn_weights(model: Transformer, state: Mapping[str, Any], source: str = "weights") -> None:
    """Assign the weights of an aiayn state dict (names -> tensors or arrays) to ``model``; every
    name must be there and have its shape (a :class:`~aiayn.errors.UserError` naming it if not)."""
    names = weight_map(model)
    missing, unexpected = sorted(set(names) - set(state)), sorted(set(state) - set(names))
    if missing or unexpected:
        raise UserError(
            f"{source}: weights do not fit the Keras model "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    for name, (variable, transposed) in names.items():
        value = state[name]
        array = value.detach().cpu().float().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        array = array.T if transposed else array
        if tuple(array.shape) != tuple(variable.shape):
            raise UserError(
                f"{source}: {name} has shape {list(array.shape)}, the model's {list(variable.shape)}"
            )
        variable.assign(array.astype(np.float32))


def aiayn_weights(model: Transformer) -> dict[str, np.ndarray]:
    """The model's weights under aiayn's names, in aiayn's layout (float32 arrays)."""
    arrays = {}
    for name, (variable, transposed) in weight_map(model).items():
        array = np.asarray(ops.convert_to_numpy(variable), dtype=np.float32)
        arrays[name] = np.ascontiguousarray(array.T if transposed else array)
    return arrays


def from_torch(torch_model: TorchTransformer) -> Transformer:
    """A Keras :class:`Transformer` with the weights of a PyTorch :class:`aiayn.model.Transformer`."""
    model = Transformer(torch_model.config)
    set_aiayn_weights(model, torch_model.state_dict(), "the PyTorch model")
    return model


def to_torch(model: Transformer) -> TorchTransformer:
    """A PyTorch :class:`aiayn.model.Transformer` (eval mode) with the Keras model's weights."""
    torch_model = build_torch_model(model.config)
    state = {name: torch.from_numpy(array) for name, array in aiayn_weights(model).items()}
    torch_model.load_state_dict(state, strict=True)
    return torch_model.eval()


@dataclass(frozen=True)
class KerasLoaded:
    """What :func:`load` returns; unpacks as ``model, tokenizer, config = aiayn.keras.load(path)``."""

    model: Transformer
    tokenizer: Tokenizer
    config: TransformerConfig
    checkpoint: Checkpoint  #: where it came from, with the stored ``config.json``

    def __iter__(self):
        return iter((self.model, self.tokenizer, self.config))


def load(path: str | Path) -> KerasLoaded:
    """A trained translation checkpoint or run directory (its ``best/``, else its latest) as a Keras
    :class:`Transformer` with its tokenizer and config.

    The files are read and checked as :func:`aiayn.load` reads them (SHA-256 against the manifest,
    the tokenizer against the vocabulary, every weight's name and shape); a bad or missing file, a
    forecasting checkpoint, or a model setting the port does not have is one :class:`UserError` line.
    """
    torch_model, tokenizer, checkpoint = load_translation_model(path)
    model = Transformer(torch_model.config)
    set_aiayn_weights(model, torch_model.state_dict(), str(checkpoint.path))
    return KerasLoaded(model, tokenizer, torch_model.config, checkpoint)


def save(model: Transformer, path: str | Path, tokenizer: Tokenizer, step: int | None = None) -> Path:
    """Write ``model`` (and its tokenizer) as an aiayn checkpoint directory at ``path``: the same
    files, names and checksums as a checkpoint written by ``aiayn train`` (no training state), so
    ``aiayn translate --checkpoint PATH``, ``aiayn.load`` and :func:`load` read it.

    ``step``: recorded as the checkpoint's step (default: the optimizer's iterations, 0 without one).
    """
    for name, pieces in (
        ("src_vocab_size", tokenizer.vocab_size),
        ("tgt_vocab_size", tokenizer.target_vocab_size),
    ):
        if getattr(model.config, name) != pieces:
            raise UserError(
                f"the tokenizer has {pieces} pieces but the model's {name} is "
                f"{getattr(model.config, name)}; save the tokenizer the model was trained with"
            )
    if step is None:
        optimizer = getattr(model, "optimizer", None)
        step = int(ops.convert_to_numpy(optimizer.iterations)) if optimizer is not None else 0
    meta = {
        "kind": "translation",
        "model": model.config.to_dict(),
        "step": step,
        "trained_with": f"keras {keras.__version__} ({keras.backend.backend()} backend)",
    }
    return save_checkpoint(path, to_torch(model), meta, tokenizer.to_bytes())
