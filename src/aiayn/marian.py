"""MarianMT models in and out: ``aiayn import marian`` and ``aiayn export --format huggingface``.

The opus-mt models of the Hugging Face Hub are MarianMT models: the paper's post-norm
encoder-decoder with sinusoidal positions, embeddings x sqrt(d_model) and one shared vocabulary.
An imported model is an ordinary aiayn checkpoint (translate, evaluate, serve, plot, export to
CTranslate2, fine-tune with ``aiayn train --init``); an exported one is a directory that
``MarianMTModel.from_pretrained`` and ``MarianTokenizer.from_pretrained`` load.

What differs, and how it is bridged:

* **Positions.** Marian's sinusoid table puts all sines in the first half of the vector and all
  cosines in the second; aiayn interleaves them (PE(pos, 2i) = sin, PE(pos, 2i+1) = cos). It is the
  same table with the d_model axis permuted, so permuting every weight's d_model axis the same way
  (embedding and LayerNorm vectors, the inputs of every projection that reads the residual stream,
  the outputs of every one that writes it) gives an exactly equivalent model: LayerNorm and the
  residual sums do not care about the order of the axis, and attention heads and the feed-forward's
  inner axis are not permuted. No positional option is needed on either side, and transformers,
  which does not store the position table and rebuilds its own on load, gets its own layout.
* **Special ids.** aiayn fixes pad/unk/bos/eos at 0-3; Marian has ``</s>`` = 0, ``<unk>`` = 1,
  ``<pad>`` = V-1 and starts decoding from ``<pad>``. An import reorders the vocabulary: aiayn's
  ids 0-3 are Marian's pad, unk, decoder start and eos, then every other piece in Marian's order.
  When the decoder starts from ``<pad>``, its row serves twice (aiayn's PAD and BOS; the searches
  never generate either), so the vocabulary grows by one. An export keeps aiayn's ids.
* **Activation and bias.** ``activation_function: swish`` is aiayn's ``silu``; ``final_logits_bias``
  is the generator's bias (``generator_bias``; off when the bias is all zero, as the paper's).
* **Tokenizer.** Marian's two SentencePiece models and ``vocab.json`` become a
  :class:`~aiayn.data.tokenizer.VocabTokenizer`; an aiayn SentencePiece model is written as both
  ``source.spm`` and ``target.spm`` with its pieces as ``vocab.json``.

Refused, with one line naming the setting: pre-norm, learned or no positions (exports); separate
source and target vocabularies, unscaled embeddings, a final LayerNorm or embedding LayerNorm
(imports). Weights are read with safetensors or ``torch.load(weights_only=True)``, nothing else.
``transformers`` is needed only to export (``pip install transformers``).
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from aiayn.checkpoint import load_weights, resolve_checkpoint, save_checkpoint
from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, TransformerConfig
from aiayn.data.tokenizer import VocabTokenizer
from aiayn.errors import Setting, SettingError, UserError, naming_flags
from aiayn.io import check_output_dir, remove_abandoned_temporaries, replace_dir, temporary_path
from aiayn.loading import load_translation_model
from aiayn.model import build_model

CONFIG, VOCAB, SOURCE_SPM, TARGET_SPM = "config.json", "vocab.json", "source.spm", "target.spm"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}  # Marian's -> aiayn's
MARIAN_ACTIVATIONS = {"silu": "swish", "relu": "relu", "gelu": "gelu"}
BOS_PIECE = "<s>"  # aiayn's BOS when the Marian model starts decoding from <pad> (its row: pad's)


# --- the command ----------------------------------------------------------------------------------


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "import",
        help="turn a model trained elsewhere (a MarianMT / opus-mt directory) into an aiayn checkpoint",
        description="Import a MarianMT model directory (config.json, model.safetensors or "
        "pytorch_model.bin, source.spm, target.spm, vocab.json), e.g. an opus-mt model cloned from the "
        "Hugging Face Hub, as an aiayn checkpoint that translate, evaluate, serve, plot, export and "
        "train --init read.",
    )
    parser.add_argument("format", choices=("marian",), help="the model's format")
    parser.add_argument("source", help="the MarianMT model directory")
    parser.add_argument("--out", required=True, help="the checkpoint directory to write (new or empty)")
    parser.add_argument("--force", action="store_true", help="replace an earlier import in --out")
    parser.set_defaults(func=_run)


FLAGS = {"source": "SOURCE", "out": "--out", "force": "--force"}


@naming_flags(FLAGS)
def _run(args) -> int:
    out = import_marian(args.source, args.out, force=args.force)
    config = TransformerConfig.from_dict(json.loads((out / "config.json").read_text())["model"])
    print(
        f"imported {args.source} to {out}: d_model {config.d_model}, {config.n_encoder_layers}+"
        f"{config.n_decoder_layers} layers, {config.n_heads} heads, vocabulary {config.tgt_vocab_size}"
    )
    return 0


# --- the d_model axis -----------------------------------------------------------------------------


def residual_order(d_model: int) -> Tensor:
    """``order[k]``: the Marian index of aiayn's d_model index k (aiayn = marian[..., order])."""
    half = d_model // 2
    return torch.tensor([k // 2 if k % 2 == 0 else half + k // 2 for k in range(d_model)])


class _Axis:
    """Permutes the d_model axis between the two layouts (``to_aiayn`` / ``to_marian``)."""

    def __init__(self, d_model: int, to_aiayn: bool) -> None:
        order = residual_order(d_model)
        self.index = order if to_aiayn else torch.argsort(order)

    def vector(self, t: Tensor) -> Tensor:  # (D,): LayerNorm weight/bias, biases of outputs
        return t[self.index]

    def rows(self, t: Tensor) -> Tensor:  # (D, *): projections that write the residual stream
        return t[self.index]

    def columns(self, t: Tensor) -> Tensor:  # (*, D): embeddings, projections that read it
        return t[:, self.index]


def _layer_names(n_encoder: int, n_decoder: int):
    """``(aiayn prefix, marian prefix, kind)`` per sub-layer; kind: attention, norm or ffn."""
    for i in range(n_encoder):
        a, m = f"encoder.layers.{i}", f"model.encoder.layers.{i}"
        yield f"{a}.self_attn", f"{m}.self_attn", "attention"
        yield f"{a}.attn_block.norm", f"{m}.self_attn_layer_norm", "norm"
        yield f"{a}.feed_forward", m, "ffn"
        yield f"{a}.ff_block.norm", f"{m}.final_layer_norm", "norm"
    for i in range(n_decoder):
        a, m = f"decoder.layers.{i}", f"model.decoder.layers.{i}"
        yield f"{a}.self_attn", f"{m}.self_attn", "attention"
        yield f"{a}.self_block.norm", f"{m}.self_attn_layer_norm", "norm"
        yield f"{a}.cross_attn", f"{m}.encoder_attn", "attention"
        yield f"{a}.cross_block.norm", f"{m}.encoder_attn_layer_norm", "norm"
        yield f"{a}.feed_forward", m, "ffn"
        yield f"{a}.ff_block.norm", f"{m}.final_layer_norm", "norm"


def _layers_to_aiayn(marian: dict[str, Tensor], config: TransformerConfig) -> dict[str, Tensor]:
    axis, out = _Axis(config.d_model, to_aiayn=True), {}
    for a, m, kind in _layer_names(config.n_encoder_layers, config.n_decoder_layers):
        if kind == "norm":
            out[f"{a}.weight"], out[f"{a}.bias"] = (
                axis.vector(marian[f"{m}.weight"]),
                axis.vector(marian[f"{m}.bias"]),
            )
        elif kind == "attention":
            q, k, v = (marian[f"{m}.{p}_proj.weight"] for p in "qkv")
            out[f"{a}.in_proj.weight"] = axis.columns(torch.cat([q, k, v]))
            out[f"{a}.in_proj.bias"] = torch.cat([marian[f"{m}.{p}_proj.bias"] for p in "qkv"])
            out[f"{a}.out_proj.weight"] = axis.rows(marian[f"{m}.out_proj.weight"])
            out[f"{a}.out_proj.bias"] = axis.vector(marian[f"{m}.out_proj.bias"])
        else:
            out[f"{a}.w_1.weight"], out[f"{a}.w_1.bias"] = (
                axis.columns(marian[f"{m}.fc1.weight"]),
                marian[f"{m}.fc1.bias"],
            )
            out[f"{a}.w_2.weight"] = axis.rows(marian[f"{m}.fc2.weight"])
            out[f"{a}.w_2.bias"] = axis.vector(marian[f"{m}.fc2.bias"])
    return out


def _layers_to_marian(aiayn: dict[str, Tensor], config: TransformerConfig) -> dict[str, Tensor]:
    axis, d, out = _Axis(config.d_model, to_aiayn=False), config.d_model, {}
    for a, m, kind in _layer_names(config.n_encoder_layers, config.n_decoder_layers):
        if kind == "norm":
            out[f"{m}.weight"], out[f"{m}.bias"] = (
                axis.vector(aiayn[f"{a}.weight"]),
                axis.vector(aiayn[f"{a}.bias"]),
            )
        elif kind == "attention":
            weight, bias = axis.columns(aiayn[f"{a}.in_proj.weight"]), aiayn[f"{a}.in_proj.bias"]
            for j, p in enumerate("qkv"):
                out[f"{m}.{p}_proj.weight"] = weight[j * d : (j + 1) * d]
                out[f"{m}.{p}_proj.bias"] = bias[j * d : (j + 1) * d]
            out[f"{m}.out_proj.weight"] = axis.rows(aiayn[f"{a}.out_proj.weight"])
            out[f"{m}.out_proj.bias"] = axis.vector(aiayn[f"{a}.out_proj.bias"])
        else:
            out[f"{m}.fc1.weight"], out[f"{m}.fc1.bias"] = (
                axis.columns(aiayn[f"{a}.w_1.weight"]),
                aiayn[f"{a}.w_1.bias"],
            )
            out[f"{m}.fc2.weight"] = axis.rows(aiayn[f"{a}.w_2.weight"])
            out[f"{m}.fc2.bias"] = axis.vector(aiayn[f"{a}.w_2.bias"])
    return out


# --- import ---------------------------------------------------------------------------------------


def import_marian(source: str | Path, out: str | Path, *, force: bool = False) -> Path:
    """Write the MarianMT model in directory ``source`` as an aiayn checkpoint directory ``out``."""
    source, out = Path(source), Path(out)
    marian = read_marian_config(source)
    check_output_dir(  # before the work
        out,
        force,
        source=source,
        source_name="model directory",
        result="an import",
        earlier=("manifest.json",),
    )
    tokenizer_files = _tokenizer_files(source)
    weights = read_marian_weights(source)
    config, order, pieces, bias = _plan(source, marian, weights, tokenizer_files["vocab"])
    tokenizer = VocabTokenizer(
        tokenizer_files["source"], tokenizer_files["target"], pieces, decode_with_source=True
    )
    model = build_model(config)
    state = _to_aiayn(weights, marian, config, order, bias, source)
    load_weights(model, state, source)
    extra = _tokenizer_config(source)
    run = {
        "data": {
            k: v
            for k, v in (("src_lang", extra.get("source_lang")), ("tgt_lang", extra.get("target_lang")))
            if v
        }
    }
    info = {
        "format": "marian",
        "source": str(source.resolve()),
        "files": sorted(p.name for p in source.iterdir()),
    }
    tmp = temporary_path(out)
    shutil.rmtree(tmp, ignore_errors=True)
    save_checkpoint(
        tmp,
        model,
        {"kind": "translation", "model": config.to_dict(), "run": run, "imported": info},
        tokenizer.to_bytes(),
    )
    replace_dir(tmp, out)
    remove_abandoned_temporaries(out.parent)
    return out


def read_marian_config(source: Path) -> dict[str, Any]:
    if not source.is_dir():
        raise SettingError(Setting("source"), f": {source} is not a directory")
    file = source / CONFIG
    if not file.is_file():
        raise UserError(f"{source}: not a MarianMT model directory (no {CONFIG})")
    try:
        values = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{file}: not valid JSON: {err}") from None
    if not isinstance(values, dict) or values.get("model_type") != "marian":
        kind = values.get("model_type") if isinstance(values, dict) else type(values).__name__
        raise UserError(f"{file}: not a MarianMT model (model_type {kind!r}, expected 'marian')")
    return values


def read_marian_weights(source: Path) -> dict[str, Tensor]:
    """The weights, from ``model.safetensors`` or else ``pytorch_model.bin`` (``weights_only``)."""
    for name in WEIGHT_FILES:
        file = source / name
        if not file.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                weights = load_file(file)
            else:
                weights = torch.load(file, map_location="cpu", weights_only=True)
        except (SafetensorError, OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise UserError(f"{file}: cannot read the weights: {reason}") from None
        if not isinstance(weights, dict) or not all(isinstance(t, Tensor) for t in weights.values()):
            raise UserError(f"{file}: not a mapping of weight names to tensors")
        if weights and not any(k.startswith("model.") for k in weights):  # saved from MarianModel
            weights = {
                (k if k in ("final_logits_bias", "lm_head.weight") else f"model.{k}"): t
                for k, t in weights.items()
            }
        return {k: t.float() for k, t in weights.items()}
    raise UserError(f"{source}: no weights ({' or '.join(WEIGHT_FILES)})")


def _tokenizer_files(source: Path) -> dict[str, Any]:
    if (source / "target_vocab.json").is_file():
        raise UserError(
            f"{source}: separate source and target vocabularies (target_vocab.json) are not supported"
        )
    files = {}
    for key, name in (("source", SOURCE_SPM), ("target", TARGET_SPM), ("vocab", VOCAB)):
        file = source / name
        if not file.is_file():
            raise UserError(
                f"{source}: {name} missing (a MarianMT model has {SOURCE_SPM}, {TARGET_SPM}, {VOCAB})"
            )
        files[key] = file.read_bytes()
    try:
        vocab = json.loads(files["vocab"].decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{source / VOCAB}: not valid JSON: {err}") from None
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise UserError(f"{source / VOCAB}: must map pieces to integer ids")
    files["vocab"] = vocab
    return files


def _tokenizer_config(source: Path) -> dict[str, Any]:
    try:
        values = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return values if isinstance(values, dict) else {}


def _plan(source: Path, marian: dict[str, Any], weights: dict[str, Tensor], vocab: dict[str, int]):
    """aiayn's config, the vocabulary order (aiayn id -> Marian id), the pieces and whether a bias."""
    file = source / CONFIG

    def need(key: str, ok: bool, why: str) -> None:
        if not ok:
            raise UserError(f"{file}: {key}: {why}")

    get = marian.get
    v = int(get("vocab_size", 0))
    need(
        "decoder_vocab_size",
        get("decoder_vocab_size") in (None, v),
        "separate target vocabularies are not supported",
    )
    need(
        "scale_embedding",
        bool(get("scale_embedding", False)),
        "aiayn scales embeddings by sqrt(d_model); this model does not",
    )
    for key in ("normalize_before", "normalize_embedding", "add_final_layer_norm"):
        need(key, not get(key, False), "not the paper's post-norm layout; not supported")
    need(
        "static_position_embeddings",
        get("static_position_embeddings", True),
        "learned positions are not supported",
    )
    heads = get("encoder_attention_heads")
    need(
        "decoder_attention_heads",
        get("decoder_attention_heads") == heads,
        "must equal encoder_attention_heads",
    )
    need("decoder_ffn_dim", get("decoder_ffn_dim") == get("encoder_ffn_dim"), "must equal encoder_ffn_dim")
    activation = ACTIVATIONS.get(str(get("activation_function")))
    need(
        "activation_function",
        activation is not None,
        f"{get('activation_function')!r} is not one of {', '.join(ACTIVATIONS)}",
    )
    d = int(get("d_model", 0))
    need("d_model", d > 0 and d % 2 == 0, "must be a positive even number")
    ids = sorted(vocab.values())
    if ids != list(range(v)):
        raise UserError(
            f"{source / VOCAB}: has {len(vocab)} pieces with ids {ids[:1]}..{ids[-1:]} but the model has "
            f"vocab_size={v}; the vocabulary does not match the weights"
        )
    piece_of = {i: p for p, i in vocab.items()}
    pad, eos = int(get("pad_token_id", v - 1)), int(get("eos_token_id", 0))
    start = int(get("decoder_start_token_id", pad) if get("decoder_start_token_id") is not None else pad)
    unk = vocab.get("<unk>")
    need("vocab.json", unk is not None, "has no <unk> piece")
    specials = [pad, unk, start, eos]
    order = specials + [i for i in range(v) if i not in set(specials)]
    pieces = [piece_of[i] for i in order]
    if start == pad:
        bos = BOS_PIECE
        while bos in vocab:
            bos = f"<{bos}>"
        pieces[BOS_ID] = bos
    share = bool(get("share_encoder_decoder_embeddings", True))
    tie_word = bool(get("tie_word_embeddings", True))
    tie = "all" if share and tie_word else "decoder" if tie_word else "none"
    bias = weights.get("final_logits_bias")
    has_bias = bias is not None and bool(bias.abs().sum() > 0)
    config = TransformerConfig(
        src_vocab_size=len(order),
        tgt_vocab_size=len(order),
        d_model=d,
        n_heads=int(heads),
        n_encoder_layers=int(get("encoder_layers")),
        n_decoder_layers=int(get("decoder_layers")),
        d_ff=int(get("encoder_ffn_dim")),
        dropout=float(get("dropout", 0.1)),
        attention_dropout=float(get("attention_dropout", 0.0)),
        max_len=int(get("max_position_embeddings", 512)),
        tie_embeddings=tie,
        activation=activation,
        generator_bias=has_bias,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
    )
    return config, torch.tensor(order), pieces, has_bias


def _to_aiayn(weights, marian, config: TransformerConfig, order: Tensor, bias: bool, source: Path):
    def weight(*names: str) -> Tensor:
        for name in names:
            if name in weights:
                return weights[name]
        raise UserError(f"{source}: weights missing: {names[0]}; the weights do not match {CONFIG}")

    axis = _Axis(config.d_model, to_aiayn=True)
    shared = weight("model.shared.weight", "model.encoder.embed_tokens.weight")
    enc = weight("model.encoder.embed_tokens.weight", "model.shared.weight")
    dec = weight("model.decoder.embed_tokens.weight", "model.shared.weight")
    head = weights.get("lm_head.weight", dec if config.tie_embeddings != "none" else None)
    if head is None:
        raise UserError(f"{source}: weights missing: lm_head.weight (tie_word_embeddings is false)")
    v = int(marian.get("vocab_size"))
    for name, t in (("embeddings", shared), ("lm_head.weight", head)):
        if tuple(t.shape) != (v, config.d_model):
            raise UserError(
                f"{source}: {name} has shape {list(t.shape)}, not [{v}, {config.d_model}] "
                f"(vocab_size, d_model in {CONFIG}); the weights do not match the config"
            )
    state = {
        "src_embed.lut.weight": axis.columns(enc[order]),
        "tgt_embed.lut.weight": axis.columns(dec[order]),
        "generator.proj.weight": axis.columns(head[order]),
    }
    if bias:
        state["generator.proj.bias"] = weights["final_logits_bias"].reshape(-1)[order]
    try:
        state.update(_layers_to_aiayn(weights, config))
    except KeyError as err:
        raise UserError(
            f"{source}: weights missing: {err.args[0]}; the weights do not match {CONFIG}"
        ) from None
    return {k: t.contiguous() for k, t in state.items()}


# --- export ---------------------------------------------------------------------------------------


def export_huggingface(checkpoint: str | Path, out: str | Path, *, force: bool = False) -> Path:
    """Write the translation model of ``checkpoint`` as a MarianMT directory ``out`` (transformers)."""
    transformers = _transformers()
    out = Path(out)
    source = resolve_checkpoint(checkpoint)
    model, tokenizer, ckpt = load_translation_model(source)
    config = model.config
    marian_config = to_marian_config(config)
    check_output_dir(
        out,
        force,
        source=source,
        source_name="checkpoint",
        result="an export",
        earlier=(CONFIG, SOURCE_SPM, VOCAB),
    )
    state = marian_state_dict(model)
    hf = transformers.MarianMTModel(marian_config)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("embed_positions.weight")]
    if missing or unexpected:
        raise RuntimeError(
            f"weight names differ from MarianMTModel's: missing {missing[:3]}, extra {unexpected[:3]}"
        )
    hf.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=config.bos_id,
        eos_token_id=config.eos_id,
        pad_token_id=config.pad_id,
        forced_eos_token_id=config.eos_id,
        bad_words_ids=[[config.pad_id], [config.bos_id]],  # aiayn's searches never generate them
        max_length=config.max_len,
        num_beams=4,
    )
    tmp = temporary_path(out)
    shutil.rmtree(tmp, ignore_errors=True)
    hf.save_pretrained(tmp)
    _write_tokenizer(tmp, tokenizer, config, ckpt.config.get("run", {}).get("data", {}))
    replace_dir(tmp, out)
    remove_abandoned_temporaries(out.parent)
    return out


def _transformers():
    try:
        import transformers  # optional (pip install transformers): imported where used
    except ImportError:
        raise UserError(
            "export to Hugging Face needs the transformers package: pip install transformers"
        ) from None
    return transformers


def to_marian_config(config: TransformerConfig):
    """The ``transformers.MarianConfig`` of an aiayn model config; what Marian cannot express is a
    :class:`UserError` naming the setting."""
    transformers = _transformers()
    refuse = [
        (
            "model.norm_first",
            config.norm_first,
            "pre-norm models have no MarianMT twin (Marian is post-norm)",
        ),
        (
            "model.positional",
            config.positional != "sinusoidal",
            f"{config.positional!r} positions: MarianMT has sinusoidal ones only",
        ),
        ("model.d_model", config.d_model % 2, "must be even for MarianMT's sinusoids"),
    ]
    for name, bad, why in refuse:
        if bad:
            raise UserError(f"{name}: {why}")
    return transformers.MarianConfig(
        vocab_size=config.src_vocab_size,
        decoder_vocab_size=config.tgt_vocab_size,
        d_model=config.d_model,
        encoder_layers=config.n_encoder_layers,
        decoder_layers=config.n_decoder_layers,
        encoder_attention_heads=config.n_heads,
        decoder_attention_heads=config.n_heads,
        encoder_ffn_dim=config.d_ff,
        decoder_ffn_dim=config.d_ff,
        activation_function=MARIAN_ACTIVATIONS[config.activation],
        max_position_embeddings=config.max_len,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=0.0,
        scale_embedding=True,
        pad_token_id=config.pad_id,
        eos_token_id=config.eos_id,
        decoder_start_token_id=config.bos_id,
        forced_eos_token_id=config.eos_id,
        share_encoder_decoder_embeddings=config.tie_embeddings == "all",
        tie_word_embeddings=config.tie_embeddings in ("decoder", "all"),
    )


def marian_state_dict(model) -> dict[str, Tensor]:
    """The aiayn ``model``'s weights under MarianMTModel's names and layout (its d_model axis
    permuted; no position tables: transformers makes its own)."""
    config = model.config
    if abs(config.layer_norm_eps - 1e-5) > 1e-12:
        raise UserError(f"model.layer_norm_eps: {config.layer_norm_eps}; MarianMT's LayerNorms use 1e-5")
    axis = _Axis(config.d_model, to_aiayn=False)
    aiayn = {k: t.detach().float().cpu() for k, t in model.state_dict().items()}
    out = {
        "model.encoder.embed_tokens.weight": axis.columns(aiayn["src_embed.lut.weight"]),
        "model.decoder.embed_tokens.weight": axis.columns(aiayn["tgt_embed.lut.weight"]),
        "lm_head.weight": axis.columns(aiayn["generator.proj.weight"]),
        "final_logits_bias": aiayn.get("generator.proj.bias", torch.zeros(config.tgt_vocab_size))[None],
    }
    if config.tie_embeddings == "all":
        out["model.shared.weight"] = out["model.decoder.embed_tokens.weight"]
    out.update(_layers_to_marian(aiayn, config))
    return {k: t.contiguous() for k, t in out.items()}


def _write_tokenizer(out: Path, tokenizer, config: TransformerConfig, data: dict) -> None:
    if isinstance(tokenizer, VocabTokenizer):
        source_spm, target_spm = tokenizer.spm_models
    else:
        source_spm = target_spm = tokenizer.to_bytes()
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    (out / SOURCE_SPM).write_bytes(source_spm)
    (out / TARGET_SPM).write_bytes(target_spm)
    (out / VOCAB).write_text(
        json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False, indent=1), encoding="utf-8"
    )
    tokenizer_config = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": data.get("src_lang"),
        "target_lang": data.get("tgt_lang"),
        "unk_token": pieces[config.unk_id],
        "eos_token": pieces[config.eos_id],
        "pad_token": pieces[config.pad_id],
        "model_max_length": config.max_len,
        "separate_vocabs": False,
        "sp_model_kwargs": {},
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")
