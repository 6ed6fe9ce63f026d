"""An aiayn translation ``Transformer`` as a HuggingFace ``transformers.MarianMTModel`` with the same weights.

    from hf_marian import to_marian
    hf = to_marian(model)            # model: aiayn Transformer (load_translation_model)

Marian is the post-norm encoder-decoder of the paper, so only a renaming is needed:

* ``MultiHeadAttention.in_proj`` (rows Q, K, V, each ``d_model``) -> ``q_proj``/``k_proj``/``v_proj``;
  ``out_proj`` -> ``out_proj``. (Marian scales q by ``head_dim**-0.5`` before ``QK^T``; aiayn
  divides the scores by ``sqrt(d_k)``: the same up to float rounding.)
* ``feed_forward.w_1``/``w_2`` -> ``fc1``/``fc2``; ReLU or (exact, erf) GELU -> ``"relu"``/``"gelu"``.
* Norms: encoder ``attn_block.norm`` -> ``self_attn_layer_norm``, ``ff_block.norm`` ->
  ``final_layer_norm``; decoder ``self_block.norm`` -> ``self_attn_layer_norm``, ``cross_block.norm``
  -> ``encoder_attn_layer_norm``, ``ff_block.norm`` -> ``final_layer_norm``. The epsilon is copied.
* Embeddings x sqrt(d_model): ``scale_embedding=True``. Tying: ``tie_embeddings: all`` ->
  ``share_encoder_decoder_embeddings`` + ``tie_word_embeddings``; ``decoder`` -> only
  ``tie_word_embeddings``; ``none`` -> neither. The generator (no bias) -> ``lm_head`` with
  ``final_logits_bias`` zero.
* Positions: Marian's ``MarianSinusoidalPositionalEmbedding`` is an ``nn.Embedding`` table of
  ``max_position_embeddings`` rows whose built-in values put all sines in the first half of the vector
  and all cosines in the second; aiayn interleaves them (PE(pos, 2i) = sin, PE(pos, 2i+1) = cos).
  aiayn's table (sinusoidal or learned; zeros for ``positional: none``) is copied over Marian's.
  transformers 5 fills that table in ``_init_weights`` (``create_weight``), which runs inside the
  constructor's ``post_init``; the copy is made afterwards, and nothing at inference re-initialises
  it (:func:`to_marian` checks the copy, and ``decode_speed.py`` checks the logits after generating).
* Special tokens: PAD 0, EOS 3, decoder start = BOS 2 (aiayn's ids from its config).

Unsupported (raises ``ValueError``): pre-norm models (``norm_first``; Marian has no final LayerNorms).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import MarianConfig, MarianMTModel


def marian_config(config) -> MarianConfig:
    """The ``MarianConfig`` of the same architecture as an aiayn ``TransformerConfig`` (dropout 0)."""
    if config.norm_first:
        raise ValueError("norm_first: Marian is post-norm only; a pre-norm aiayn model has no Marian twin")
    tie = config.tie_embeddings
    return MarianConfig(
        vocab_size=config.src_vocab_size,
        decoder_vocab_size=config.tgt_vocab_size,
        d_model=config.d_model,
        encoder_layers=config.n_encoder_layers,
        decoder_layers=config.n_decoder_layers,
        encoder_attention_heads=config.n_heads,
        decoder_attention_heads=config.n_heads,
        encoder_ffn_dim=config.d_ff,
        decoder_ffn_dim=config.d_ff,
        activation_function=config.activation,
        max_position_embeddings=config.max_len,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=True,
        pad_token_id=config.pad_id,
        eos_token_id=config.eos_id,
        bos_token_id=config.bos_id,
        decoder_start_token_id=config.bos_id,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=tie == "all",
        tie_word_embeddings=tie in ("decoder", "all"),
    )


def marian_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """aiayn's weights under Marian's names (every name of ``MarianMTModel.state_dict()``, tied ones too)."""
    config = model.config
    out: dict[str, Tensor] = {}
    for prefix, embed in (("model.encoder", model.src_embed), ("model.decoder", model.tgt_embed)):
        out[f"{prefix}.embed_tokens.weight"] = embed.lut.weight
    if config.tie_embeddings == "all":
        out["model.shared.weight"] = model.tgt_embed.lut.weight
    for prefix, positions in (("model.encoder", model.src_pos), ("model.decoder", model.tgt_pos)):
        out[f"{prefix}.embed_positions.weight"] = position_table(positions, config)
    for i, layer in enumerate(model.encoder.layers):
        p = f"model.encoder.layers.{i}"
        out.update(_attention(f"{p}.self_attn", layer.self_attn))
        out.update(_norm(f"{p}.self_attn_layer_norm", layer.attn_block.norm))
        out.update(_ffn(p, layer.feed_forward))
        out.update(_norm(f"{p}.final_layer_norm", layer.ff_block.norm))
    for i, layer in enumerate(model.decoder.layers):
        p = f"model.decoder.layers.{i}"
        out.update(_attention(f"{p}.self_attn", layer.self_attn))
        out.update(_norm(f"{p}.self_attn_layer_norm", layer.self_block.norm))
        out.update(_attention(f"{p}.encoder_attn", layer.cross_attn))
        out.update(_norm(f"{p}.encoder_attn_layer_norm", layer.cross_block.norm))
        out.update(_ffn(p, layer.feed_forward))
        out.update(_norm(f"{p}.final_layer_norm", layer.ff_block.norm))
    out["lm_head.weight"] = model.generator.proj.weight
    out["final_logits_bias"] = torch.zeros(1, config.tgt_vocab_size)
    return {name: tensor.detach().float().contiguous() for name, tensor in out.items()}


def position_table(positions: nn.Module, config) -> Tensor:
    """``(max_len, d_model)`` added to the scaled embeddings; row p = position p (aiayn's, interleaved)."""
    if positions.kind == "none":
        return torch.zeros(config.max_len, config.d_model)
    return positions.table


def _attention(prefix: str, attention: nn.Module) -> dict[str, Tensor]:
    d = attention.d_model
    weight, bias = attention.in_proj.weight, attention.in_proj.bias  # rows Q, K, V
    out = {}
    for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
        out[f"{prefix}.{name}.weight"] = weight[j * d : (j + 1) * d]
        out[f"{prefix}.{name}.bias"] = bias[j * d : (j + 1) * d]
    out[f"{prefix}.out_proj.weight"] = attention.out_proj.weight
    out[f"{prefix}.out_proj.bias"] = attention.out_proj.bias
    return out


def _ffn(prefix: str, feed_forward: nn.Module) -> dict[str, Tensor]:
    return {
        f"{prefix}.fc1.weight": feed_forward.w_1.weight,
        f"{prefix}.fc1.bias": feed_forward.w_1.bias,
        f"{prefix}.fc2.weight": feed_forward.w_2.weight,
        f"{prefix}.fc2.bias": feed_forward.w_2.bias,
    }


def _norm(prefix: str, norm: nn.LayerNorm) -> dict[str, Tensor]:
    return {f"{prefix}.weight": norm.weight, f"{prefix}.bias": norm.bias}


def to_marian(model: nn.Module) -> MarianMTModel:
    """A ``MarianMTModel`` (fp32, eval mode, CPU) computing what the aiayn ``model`` computes."""
    config = model.config
    hf = MarianMTModel(marian_config(config)).eval()
    weights = marian_state_dict(model)
    expected = set(hf.state_dict())
    if set(weights) != expected:
        raise RuntimeError(
            f"weight names differ: missing {sorted(expected - set(weights))[:5]}, "
            f"extra {sorted(set(weights) - expected)[:5]}"
        )
    with torch.no_grad():
        for name, tensor in hf.state_dict(keep_vars=True).items():
            tensor.copy_(weights[name])  # tied names alias one tensor: the same values are copied again
    for module in hf.modules():
        if isinstance(module, nn.LayerNorm):
            module.eps = config.layer_norm_eps
    check_positions(hf, model)
    return hf


def check_positions(hf: MarianMTModel, model: nn.Module) -> None:
    """Raise if Marian's position tables are not aiayn's (e.g. re-initialised by transformers)."""
    for stack, positions in ((hf.model.encoder, model.src_pos), (hf.model.decoder, model.tgt_pos)):
        table = position_table(positions, model.config).detach().float()
        if not torch.equal(stack.embed_positions.weight.detach(), table):
            raise RuntimeError("Marian's position table is not aiayn's (re-initialised?)")
