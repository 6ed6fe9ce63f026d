"""``aiayn export``: a trained translation model as a CTranslate2 model directory.

CTranslate2 (https://opennmt.net/CTranslate2) runs Transformers fast on CPUs and GPUs, with int8 /
float16 weights. The model is written through CTranslate2's own model-spec API
(:mod:`ctranslate2.specs`): each weight of the aiayn model is set on a ``TransformerSpec``, then
``validate()``, ``optimize(quantization)`` and ``save(out)``. How the aiayn parts map:

* ``MultiHeadAttention.in_proj`` (rows Q, K, V) is already CTranslate2's fused self-attention
  ``linear[0]``; for cross-attention rows ``[:d]`` are the query ``linear[0]`` and rows ``[d:]``
  the fused key/value ``linear[1]``; ``out_proj`` is ``linear[-1]``.
* ``Residual.norm`` is the ``layer_norm`` of the sub-layer it wraps; ``pre_norm`` follows
  ``norm_first`` (post-norm puts it after the residual sum, as aiayn does), and only pre-norm
  stacks have a final LayerNorm, in both libraries. The epsilon is exported.
* Token embeddings are scaled by sqrt(d_model) (``scale_embeddings``).
* Positions: aiayn's table is always exported as ``position_encodings.encodings`` (row 0 = the
  first token). CTranslate2's built-in sinusoids put all sines in the first half of the vector and
  all cosines in the second; aiayn interleaves them (PE(pos, 2i) = sin, PE(pos, 2i+1) = cos), so
  letting CTranslate2 compute its own would give a different model. Learned tables are exported
  the same way; ``positional: none`` becomes an all-zero table.
* The paper's generator has no bias: the ``projection`` gets an explicit zero bias (or the
  generator's, with ``generator_bias``). Tied weights are
  written as equal arrays; ``optimize()`` stores them once (aliases).
* ReLU -> ``Activation.RELU``; GELU (PyTorch's exact, erf form) -> ``Activation.GELU``; SiLU ->
  ``Activation.SWISH``.
* Special tokens: the vocabulary is the SentencePiece pieces in id order, with ``<pad>`` renamed
  to CTranslate2's padding name ``<blank>`` (id 0 in both). The decoder starts from ``<s>``
  and aiayn's source convention ``encode(text) + [EOS]`` is ``add_source_eos``: CTranslate2
  appends ``</s>`` itself, so the caller passes only the pieces.
* aiayn's search never generates PAD or BOS; CTranslate2 does not know that, so the README tells
  the caller to pass ``suppress_sequences=[["<blank>"], ["<s>"]]`` (:data:`SUPPRESS`).

The SentencePiece model is copied next to the weights as ``sentencepiece.model``, with a
``README.md`` and ``aiayn_export.json`` saying how to call the model.

``ctranslate2`` is an optional dependency (``pip install ctranslate2``, or the ``test``/``bench``
extras); it is imported only when an export runs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.checkpoint import CONFIG_FILE, MANIFEST_FILE, MODEL_FILE, TOKENIZER_FILE, resolve_checkpoint
from aiayn.data.tokenizer import vocabularies
from aiayn.errors import Setting, SettingError, UserError, naming_flags
from aiayn.io import check_output_dir, remove_abandoned_temporaries, replace_dir, temporary_path
from aiayn.loading import load_translation_model
from aiayn.marian import export_huggingface

FORMATS = ("ctranslate2", "huggingface")
QUANTIZATIONS = (
    "none",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
)
SPM_FILE, INFO_FILE, README_FILE = "sentencepiece.model", "aiayn_export.json", "README.md"
#: What ``return_attention`` gives in an export (recorded in its INFO_FILE; an export without it,
#: made before, returns one head's weights and is made again where alignments are needed)
ALIGNMENT = "last decoder layer, heads averaged"
PAD_PIECE = "<blank>"  # CTranslate2's name for the padding token
#: Tokens aiayn's search never generates; pass as ``suppress_sequences`` to CTranslate2.
SUPPRESS = [[PAD_PIECE], ["<s>"]]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a trained translation model in another runtime's format (CTranslate2, Hugging Face)",
        description="Export a translation checkpoint as a CTranslate2 model directory (model.bin, "
        "vocabulary, sentencepiece.model, README.md; needs `pip install ctranslate2`) or as a "
        "MarianMT directory that transformers' MarianMTModel and MarianTokenizer load (needs "
        "`pip install transformers`).",
    )
    parser.add_argument("--checkpoint", required=True, help="checkpoint or run directory")
    parser.add_argument(
        "--format", default="ctranslate2", choices=FORMATS, help="output format (default: ctranslate2)"
    )
    parser.add_argument(
        "--out",
        required=True,
        help="output directory, outside the checkpoint (must be new or empty unless --force)",
    )
    parser.add_argument(
        "--quantization",
        default="none",
        choices=QUANTIZATIONS,
        help="CTranslate2 only: the type its stored weights are converted to (default: none = float32 "
        "as trained)",
    )
    parser.add_argument("--force", action="store_true", help="replace an earlier export in --out")
    parser.set_defaults(func=_run)


#: The settings of :func:`export_ctranslate2` its errors name, and the flags of ``aiayn export``.
FLAGS = {"out": "--out", "quantization": "--quantization", "force": "--force"}


@naming_flags(FLAGS)
def _run(args) -> int:
    if args.format == "huggingface":
        if args.quantization != "none":
            raise SettingError(Setting("quantization"), " applies to --format ctranslate2 only")
        out = export_huggingface(args.checkpoint, args.out, force=args.force)
        print(f"wrote a MarianMT model (transformers) to {out}")
        return 0
    out = export_ctranslate2(args.checkpoint, args.out, args.quantization, force=args.force)
    print(f"wrote a CTranslate2 model to {out} (quantization: {args.quantization}); see {out / README_FILE}")
    return 0


# --- the export -----------------------------------------------------------------------------------


def export_ctranslate2(
    checkpoint: str | Path, out: str | Path, quantization: str = "none", force: bool = False
) -> Path:
    """Write the translation model of ``checkpoint`` as a CTranslate2 model directory ``out``.

    ``out`` must lie outside the checkpoint directory (a run directory's ``best/`` or ``averaged/``
    when a run is given: ``run/ct2`` is fine); ``force`` replaces only an earlier export, and only
    once the new export is complete.
    """
    if quantization not in QUANTIZATIONS:
        valid = ", ".join(QUANTIZATIONS)
        raise SettingError(Setting("quantization"), f": unknown value {quantization!r}; valid: {valid}")
    _ctranslate2()  # fail early, before any work, when it is not installed
    out = Path(out)
    source = resolve_checkpoint(checkpoint)  # once: a run may write a newer checkpoint meanwhile
    digest = checkpoint_digest(source)  # before loading: a checkpoint replaced meanwhile is re-exported
    check_output_dir(
        out,
        force,
        source=source,
        source_name="checkpoint",
        result="an export",
        earlier=("model.bin", SPM_FILE),
    )
    model, tokenizer, ckpt = load_translation_model(source)
    spec = build_spec(model, *vocabularies(tokenizer))
    spec.validate()
    spec.optimize(quantization=None if quantization == "none" else quantization)
    tmp = temporary_path(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    spec.save(str(tmp))
    (tmp / SPM_FILE).write_bytes(tokenizer.to_bytes())
    _write_docs(tmp, ckpt.path, digest, model.config, quantization)
    replace_dir(tmp, out)  # an existing export is moved aside, then deleted: never lost half-way
    remove_abandoned_temporaries(out.parent)
    return out


def _ctranslate2():
    try:
        import ctranslate2  # optional (pip install ctranslate2): imported where used
    except ImportError:
        raise UserError(
            "export to CTranslate2 needs the ctranslate2 package: pip install ctranslate2"
        ) from None
    return ctranslate2


def build_spec(model: nn.Module, pieces: list[str], target_pieces: list[str] | None = None):
    """A filled ``ctranslate2.specs.TransformerSpec`` for an aiayn ``Transformer`` (not yet validated).

    ``pieces``: the tokenizer's pieces in id order; ``target_pieces``: the target side's, when it has
    a vocabulary of its own (default: ``pieces`` serve both sides).
    """
    specs = _ctranslate2().specs
    config = model.config
    target_pieces = pieces if target_pieces is None else target_pieces
    _check_supported(config, pieces, target_pieces)
    activation = {
        "relu": specs.Activation.RELU,
        "gelu": specs.Activation.GELU,
        "silu": specs.Activation.SWISH,
    }[config.activation]
    encoder = specs.TransformerEncoderSpec(
        config.n_encoder_layers, config.n_heads, pre_norm=config.norm_first, activation=activation
    )
    decoder = specs.TransformerDecoderSpec(
        config.n_decoder_layers,
        config.n_heads,
        pre_norm=config.norm_first,
        activation=activation,
        # return_attention gives the last layer's cross-attention, every head averaged: the weights
        # aiayn.decode.align reads word alignments from
        alignment_layer=-1,
        alignment_heads=config.n_heads,
    )
    _set_encoder(encoder, model)
    _set_decoder(decoder, model)
    spec = specs.TransformerSpec(encoder, decoder)
    source, target = (
        [PAD_PIECE if i == config.pad_id else p for i, p in enumerate(v)] for v in (pieces, target_pieces)
    )
    spec.register_source_vocabulary(source)
    spec.register_target_vocabulary(target)
    _set_special_tokens(spec.config, config, target)
    return spec


def _check_supported(config, pieces: list[str], target_pieces: list[str]) -> None:
    """What CTranslate2 cannot express here: model vocabularies unlike the tokenizer's, and special
    tokens named differently on the two sides (its config names each once)."""
    for name, side in (("src_vocab_size", pieces), ("tgt_vocab_size", target_pieces)):
        if getattr(config, name) != len(side):
            raise UserError(
                f"{name}: the model has {getattr(config, name)} tokens but the tokenizer "
                f"{len(side)}; CTranslate2 needs one vocabulary entry per embedding row"
            )
        if len(set(side)) != len(side):
            raise UserError("tokenizer: duplicate pieces; CTranslate2 needs unique vocabulary entries")
    for name in ("unk_id", "eos_id"):
        i = getattr(config, name)
        if pieces[i] != target_pieces[i]:
            raise UserError(
                f"tokenizer: the {name[:3]} pieces differ ({pieces[i]!r}, {target_pieces[i]!r} on the "
                "target side); CTranslate2 names each special token once"
            )


def _set_special_tokens(ct2_config, config, vocabulary: list[str]) -> None:
    ct2_config.unk_token = vocabulary[config.unk_id]
    ct2_config.bos_token = vocabulary[config.bos_id]
    ct2_config.eos_token = vocabulary[config.eos_id]
    ct2_config.decoder_start_token = vocabulary[config.bos_id]
    ct2_config.add_source_bos = False
    ct2_config.add_source_eos = True  # aiayn feeds encode(text) + [EOS]
    ct2_config.layer_norm_epsilon = config.layer_norm_eps


def _set_encoder(spec, model: nn.Module) -> None:
    _set_inputs(spec, spec.embeddings[0], model.src_embed, model.src_pos, model.config)
    for layer_spec, layer in zip(spec.layer, model.encoder.layers):
        _set_attention(layer_spec.self_attention, layer.self_attn, layer.attn_block.norm, self_attention=True)
        _set_ffn(layer_spec.ffn, layer.feed_forward, layer.ff_block.norm)
    if model.config.norm_first:
        _set_layer_norm(spec.layer_norm, model.encoder.norm)


def _set_decoder(spec, model: nn.Module) -> None:
    _set_inputs(spec, spec.embeddings, model.tgt_embed, model.tgt_pos, model.config)
    for layer_spec, layer in zip(spec.layer, model.decoder.layers):
        _set_attention(layer_spec.self_attention, layer.self_attn, layer.self_block.norm, self_attention=True)
        _set_attention(layer_spec.attention, layer.cross_attn, layer.cross_block.norm, self_attention=False)
        _set_ffn(layer_spec.ffn, layer.feed_forward, layer.ff_block.norm)
    if model.config.norm_first:
        _set_layer_norm(spec.layer_norm, model.decoder.norm)
    weight, bias = model.generator.proj.weight, model.generator.proj.bias
    spec.projection.weight = _array(weight)
    # the paper's generator has no bias (an explicit zero one); imported Marian models have one
    spec.projection.bias = np.zeros(weight.shape[0], dtype=np.float32) if bias is None else _array(bias)


def _set_inputs(spec, embeddings_spec, embed: nn.Module, positions: nn.Module, config) -> None:
    embeddings_spec.weight = _array(embed.lut.weight)
    spec.scale_embeddings = True  # x sqrt(d_model), as TokenEmbedding
    spec.position_encodings.encodings = _position_table(positions, config)


def _position_table(positions: nn.Module, config) -> np.ndarray:
    """``(max_len, d_model)`` added to the scaled embeddings; row p = position p (from 0)."""
    if positions.kind == "none":
        return np.zeros((config.max_len, config.d_model), dtype=np.float32)
    return _array(positions.table)


def _set_attention(spec, attention: nn.Module, norm: nn.LayerNorm, self_attention: bool) -> None:
    """Self-attention: ``linear[0]`` = fused Q/K/V. Cross: ``linear[0]`` = Q, ``linear[1]`` = fused K/V."""
    weight, bias, d = attention.in_proj.weight, attention.in_proj.bias, attention.d_model
    if self_attention:
        _set_linear(spec.linear[0], weight, bias)  # rows Q, K, V: CTranslate2's fused layout
    else:
        _set_linear(spec.linear[0], weight[:d], bias[:d])
        _set_linear(spec.linear[1], weight[d:], bias[d:])
    _set_linear(spec.linear[-1], attention.out_proj.weight, attention.out_proj.bias)
    _set_layer_norm(spec.layer_norm, norm)


def _set_ffn(spec, feed_forward: nn.Module, norm: nn.LayerNorm) -> None:
    _set_linear(spec.linear_0, feed_forward.w_1.weight, feed_forward.w_1.bias)
    _set_linear(spec.linear_1, feed_forward.w_2.weight, feed_forward.w_2.bias)
    _set_layer_norm(spec.layer_norm, norm)


def _set_linear(spec, weight: Tensor, bias: Tensor | None) -> None:
    spec.weight = _array(weight)  # (out, in), as nn.Linear stores it
    if bias is not None:
        spec.bias = _array(bias)


def _set_layer_norm(spec, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _array(tensor: Tensor) -> np.ndarray:
    """A float32 copy (tied tensors become equal arrays, which ``optimize()`` aliases)."""
    return tensor.detach().to("cpu", torch.float32).contiguous().numpy().copy()


# --- how to use it --------------------------------------------------------------------------------


def checkpoint_digest(checkpoint: Path) -> str:
    """What identifies the checkpoint's contents: the SHA-256 of its ``manifest.json`` (which holds
    every file's SHA-256), or of its model, config and tokenizer files for a checkpoint without one."""
    names = (
        [MANIFEST_FILE]
        if (checkpoint / MANIFEST_FILE).is_file()
        else [MODEL_FILE, CONFIG_FILE, TOKENIZER_FILE]
    )
    digest = hashlib.sha256()
    for name in names:
        file = checkpoint / name
        digest.update(file.read_bytes() if file.is_file() else b"")
    return digest.hexdigest()


def _write_docs(out: Path, checkpoint: Path, digest: str, config, quantization: str) -> None:
    info: dict[str, Any] = {
        "format": "ctranslate2",
        "ctranslate2_version": _ctranslate2().__version__,
        "checkpoint": str(checkpoint),
        "checkpoint_sha256": digest,  # checkpoint_digest(): backends reuse an export of the same checkpoint
        "quantization": quantization,
        "tokenizer": SPM_FILE,
        "source": "SentencePiece pieces of the text; CTranslate2 appends </s> itself (add_source_eos)",
        "suppress_sequences": SUPPRESS,
        "max_positions": config.max_len,
        "alignment": ALIGNMENT,
        "model": config.to_dict(),
    }
    (out / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    (out / README_FILE).write_text(
        README.format(quantization=quantization, max_len=config.max_len), encoding="utf-8"
    )


README = """\
# aiayn translation model for CTranslate2

Exported by `aiayn export` (weights: {quantization}). Files: `model.bin`, `config.json`,
`shared_vocabulary.json` or a source and a target one (CTranslate2), `sentencepiece.model` (the
tokenizer), `aiayn_export.json`.

```python
import ctranslate2, sentencepiece as spm

sp = spm.SentencePieceProcessor(model_file="sentencepiece.model")
translator = ctranslate2.Translator(".", device="cpu")  # or "cuda"
pieces = sp.encode(["A man rides a bike."], out_type=str)  # no </s>: CTranslate2 adds it
results = translator.translate_batch(
    pieces,
    beam_size=4, length_penalty=0.6,          # aiayn's defaults (beam 1 = greedy)
    max_decoding_length=50,
    min_decoding_length=0,                     # aiayn allows an empty output (EOS first)
    suppress_sequences=[["<blank>"], ["<s>"]],  # aiayn never generates PAD or BOS
)
print(sp.decode(results[0].hypotheses[0]))
```

Sources and outputs longer than {max_len} positions (the model's `max_len`) do not fit the
position table. Beam search and length penalties follow CTranslate2's rules, which differ in
detail from aiayn's; greedy search (`beam_size=1`) gives the same tokens as
`aiayn translate --beam 1`.
"""
