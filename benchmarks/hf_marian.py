"""An aiayn translation ``Transformer`` as a HuggingFace ``transformers.MarianMTModel`` with the same weights.

    from hf_marian import to_marian
    hf = to_marian(model)            # model: aiayn Transformer (load_translation_model)

What ``aiayn export --format huggingface`` writes, made in memory: :func:`aiayn.marian.to_marian_config`
and :func:`aiayn.marian.marian_state_dict` (the weights renamed, the d_model axis permuted so that
Marian's own sinusoid table, all sines first, is aiayn's interleaved one; see :mod:`aiayn.marian`).
Pre-norm models and learned positions have no Marian twin (``UserError``).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import MarianMTModel
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

from aiayn.marian import marian_state_dict, to_marian_config


def to_marian(model: nn.Module) -> MarianMTModel:
    """A ``MarianMTModel`` (fp32, eval mode, CPU) computing what the aiayn ``model`` computes."""
    config = to_marian_config(model.config)
    config.dropout = config.attention_dropout = 0.0
    hf = MarianMTModel(config).eval()
    missing, unexpected = hf.load_state_dict(marian_state_dict(model), strict=False)
    missing = [k for k in missing if not k.endswith("embed_positions.weight")]
    if missing or unexpected:
        raise RuntimeError(f"weight names differ: missing {missing[:5]}, extra {unexpected[:5]}")
    check_positions(hf, model)
    return hf


def check_positions(hf: MarianMTModel, model: nn.Module) -> None:
    """Raise if Marian's position tables are not its own sinusoids (which the permuted axis needs)."""
    d, n = model.config.d_model, hf.config.max_position_embeddings
    table = MarianSinusoidalPositionalEmbedding(n, d).create_weight()
    for stack in (hf.model.encoder, hf.model.decoder):
        weight = stack.embed_positions.weight.detach().cpu()  # fp32, or the table cast (--precision)
        if not torch.equal(weight, table.to(weight.dtype)):
            raise RuntimeError("Marian's position table is not its sinusoid table")
