"""MarianMT models in and out: ``aiayn import marian`` and ``aiayn export --format huggingface``.

The opus-mt models of the Hugging Face Hub are MarianMT models: the paper's post-norm
encoder-decoder with sinusoidal positions, embeddings x sqrt(d_model) and one shared vocabulary
(some, e.g. among the Tatoeba-Challenge ones, a source and a target vocabulary).
An imported model is an ordinary aiayn checkpoint (translate, evaluate, serve, plot, export to
CTranslate2, fine-tune with ``aiayn train --init``); an exported one is a directory that
``MarianMTModel.from_pretrained`` and ``MarianTokenizer.from_pretrained`` load.

An import reads a MarianMT directory or a Hugging Face Hub model id such as
``Helsinki-NLP/opus-mt-de-en``, which :func:`hub_snapshot` downloads into huggingface_hub's cache:
only the files an import reads, at ``--revision``, into ``--cache-dir``; with ``HF_HUB_OFFLINE=1``
from the cache alone (``pip install 'aiayn[hub]'``).

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
* **Separate vocabularies.** Where ``tokenizer_config.json`` sets ``separate_vocabs`` (MarianTokenizer
  then reads the target's ids from ``target_vocab.json``; the config has
  ``share_encoder_decoder_embeddings: false`` and a ``decoder_vocab_size``), each side is reordered
  on its own: the target as above, the source with the target's pad, unk and eos pieces found by
  name (its BOS, never fed to the encoder, is the pad's row again). The model's embeddings are
  then untied (``tie_embeddings: decoder``), the tokenizer a VocabTokenizer with ``target_pieces``,
  and an export writes ``target_vocab.json`` with ``separate_vocabs: true``.
* **Activation and bias.** ``activation_function: swish`` is aiayn's ``silu``; ``final_logits_bias``
  is the generator's bias (``generator_bias``; off when the bias is all zero, as the paper's).
* **Tokenizer.** Marian's two SentencePiece models and ``vocab.json`` become a
  :class:`~aiayn.data.tokenizer.VocabTokenizer`; an aiayn SentencePiece model is written as both
  ``source.spm`` and ``target.spm`` with its pieces as ``vocab.json``.
* **Memory.** The weights are read one tensor at a time from the memory-mapped file
  (:class:`MarianWeights`) and each aiayn tensor is made in one copy, so an import's peak memory is
  about the checkpoint's weights (``benchmarks/marian_import_memory.py``).

Refused, with one line naming the setting: pre-norm, learned or no positions (exports); unscaled
embeddings, a final LayerNorm or embedding LayerNorm (imports). Weights are read with safetensors or
``torch.load(weights_only=True)``, nothing else. ``transformers`` is needed only to export
(``pip install transformers``).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import sys
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from aiayn.checkpoint import resolve_checkpoint, save_checkpoint
from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, TransformerConfig
from aiayn.data.tokenizer import VocabTokenizer, vocabularies
from aiayn.errors import Setting, SettingError, UserError, naming_flags
from aiayn.io import check_output_dir, remove_abandoned_temporaries, replace_dir, temporary_path
from aiayn.loading import load_translation_model

CONFIG, SOURCE_SPM, TARGET_SPM = "config.json", "source.spm", "target.spm"
VOCAB, TARGET_VOCAB = "vocab.json", "target_vocab.json"  # the target's: MarianTokenizer's separate_vocabs
TOKENIZER_CONFIG = "tokenizer_config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}  # Marian's -> aiayn's
MARIAN_ACTIVATIONS = {"silu": "swish", "relu": "relu", "gelu": "gelu"}
BOS_PIECE = "<s>"  # aiayn's BOS when the Marian model starts decoding from <pad> (its row: pad's)


# --- the command ----------------------------------------------------------------------------------


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "import",
        help="turn a model trained elsewhere (a MarianMT / opus-mt directory or Hub model id) into an aiayn "
        "checkpoint",
        description="Import a MarianMT model directory (config.json, model.safetensors or "
        "pytorch_model.bin, source.spm, target.spm, vocab.json) or a Hugging Face Hub model id such as "
        "Helsinki-NLP/opus-mt-de-en (downloaded into huggingface_hub's cache; HF_HUB_OFFLINE=1: from the "
        "cache alone) as an aiayn checkpoint that translate, evaluate, serve, plot, export and train --init "
        "read.",
    )
    parser.add_argument("format", choices=("marian",), help="the model's format")
    parser.add_argument("source", help="the MarianMT model directory, or a Hub model id (owner/name)")
    parser.add_argument("--out", required=True, help="the checkpoint directory to write (new or empty)")
    parser.add_argument("--force", action="store_true", help="replace an earlier import in --out")
    parser.add_argument(
        "--revision", metavar="REV", help="a Hub model's branch, tag or commit (default: its main branch)"
    )
    parser.add_argument(
        "--cache-dir", metavar="DIR", help="where Hub models are kept (default: huggingface_hub's, HF_HOME)"
    )
    parser.set_defaults(func=_run)


FLAGS = {
    "source": "SOURCE",
    "out": "--out",
    "force": "--force",
    "revision": "--revision",
    "cache_dir": "--cache-dir",
}


@naming_flags(FLAGS)
def _run(args) -> int:
    out = import_marian(
        args.source, args.out, force=args.force, revision=args.revision, cache_dir=args.cache_dir
    )
    stored = json.loads((out / "config.json").read_text())
    hub = stored["imported"].get("hub")
    origin = f"{args.source} (commit {hub['revision']})" if hub else args.source
    config = TransformerConfig.from_dict(stored["model"])
    vocabulary = (
        f"vocabularies {config.src_vocab_size} (source) and {config.tgt_vocab_size} (target)"
        if stored["imported"]["separate_vocabs"]
        else f"vocabulary {config.tgt_vocab_size}"
    )
    print(
        f"imported {origin} to {out}: d_model {config.d_model}, {config.n_encoder_layers}+"
        f"{config.n_decoder_layers} layers, {config.n_heads} heads, {vocabulary}"
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

    def columns(self, t: Tensor) -> Tensor:  # (*, D): projections that read it
        return t[:, self.index]

    def table(self, t: Tensor, order: Tensor) -> Tensor:  # (V, D) embeddings: rows ``order``, one copy
        return t[order[:, None], self.index]


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


def import_marian(
    source: str | Path,
    out: str | Path,
    *,
    force: bool = False,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
) -> Path:
    """Write the MarianMT model ``source`` as an aiayn checkpoint directory ``out``: a directory, or a
    Hugging Face Hub model id, downloaded at ``revision`` into ``cache_dir`` (:func:`hub_snapshot`)."""
    out = Path(out)
    if not Path(source).exists():  # a Hub model id: --out checked before the download
        _check_out(out, force, Path(source))
    source, hub = _located(source, revision, cache_dir)
    marian = read_marian_config(source)
    _check_out(out, force, source)  # before the work
    files = _tokenizer_files(source)
    weights = MarianWeights(source)
    plan = _plan(source, marian, weights, files)
    state = _to_aiayn(weights, plan, source)
    tmp = temporary_path(out)
    shutil.rmtree(tmp, ignore_errors=True)
    save_checkpoint(tmp, state, _checkpoint_config(source, plan, hub), plan.tokenizer.to_bytes())
    replace_dir(tmp, out)
    remove_abandoned_temporaries(out.parent)
    return out


def _checkpoint_config(source: Path, plan: _Plan, hub: dict[str, str] | None = None) -> dict[str, Any]:
    """The checkpoint's config: the model's, its languages (opus-mt's tokenizer_config.json) and
    where it came from (a Hub model: also its id and commit, ``hub``)."""
    extra = _tokenizer_config(source)
    languages = (("src_lang", extra.get("source_lang")), ("tgt_lang", extra.get("target_lang")))
    info = {
        "format": "marian",
        "source": str(source.resolve()),
        "files": sorted(p.name for p in source.iterdir()),
        "separate_vocabs": plan.tokenizer.separate,
        **({"hub": hub} if hub else {}),
    }
    run = {"data": {k: v for k, v in languages if v}}
    return {"kind": "translation", "model": plan.config.to_dict(), "run": run, "imported": info}


# --- the Hugging Face Hub -------------------------------------------------------------------------

#: The files an import reads besides the weights (generation_config.json comes along, as in the
#: directory a clone makes)
HUB_FILES = (CONFIG, SOURCE_SPM, TARGET_SPM, VOCAB, TARGET_VOCAB, TOKENIZER_CONFIG, "generation_config.json")
_HUB_NAME = r"\w(?:[\w.-]{0,94}\w)?"  # huggingface_hub's rule: ASCII letters, digits, _ - . inside
HUB_ID = re.compile(rf"(?:{_HUB_NAME}/)?{_HUB_NAME}", re.ASCII)


def is_hub_id(name: str) -> bool:
    """Whether ``name`` is a Hub model id: ``owner/name`` or ``name`` (no ``--``, ``..`` or ``.git``)."""
    odd = "--" in name or ".." in name or name.endswith(".git")
    return bool(HUB_ID.fullmatch(name)) and not odd


def _check_out(out: Path, force: bool, source: Path) -> None:
    check_output_dir(
        out,
        force,
        source=source,
        source_name="model directory",
        result="an import",
        earlier=("manifest.json",),
    )


def _located(
    source: str | Path, revision: str | None, cache_dir: str | Path | None
) -> tuple[Path, dict[str, str] | None]:
    """The model directory of ``source`` and, for a Hub model id (not an existing path), the Hub's
    record of it: ``{"repo": id, "revision": commit}``."""
    path = Path(source)
    if not path.exists() and is_hub_id(str(source)):
        snapshot = hub_snapshot(str(source), revision, cache_dir)
        return snapshot, {"repo": str(source), "revision": snapshot.name}
    if not path.exists():
        raise SettingError(
            Setting("source"), f": {source}: no such directory (nor a Hugging Face Hub model id, owner/name)"
        )
    if revision is not None or cache_dir is not None:
        raise SettingError(
            Setting("revision"), " and ", Setting("cache_dir"), f" are for a Hub model id; {source} is a path"
        )
    return path, None


def hub_snapshot(repo: str, revision: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """The directory of the Hub model ``repo`` at ``revision`` (a branch, tag or commit; default: the
    main branch), downloaded with ``huggingface_hub`` into ``cache_dir`` (default: its cache, HF_HOME
    or HF_HUB_CACHE): only :data:`HUB_FILES` and ``model.safetensors``, or where the model lacks it
    (a second pass, at the first's commit) ``pytorch_model.bin``. With HF_HUB_OFFLINE=1 (or no
    network) from the cache alone. The directory's name is the commit (huggingface_hub's layout)."""
    hub = _huggingface_hub()

    def download(revision: str | None, patterns: list[str]) -> Path:
        return Path(
            hub.snapshot_download(
                repo,
                revision=revision,
                cache_dir=cache_dir,
                allow_patterns=patterns,
                # read now: huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE once, at its import,
                # which may come before they are set (a notebook, a test, transformers imported first)
                endpoint=os.environ.get("HF_ENDPOINT") or None,
                local_files_only=_offline(hub),
            )
        )

    with _hub_errors(hub, repo, revision, cache_dir or hub.constants.HF_HUB_CACHE):
        snapshot = download(revision, [*HUB_FILES, WEIGHT_FILES[0]])
        if not (snapshot / WEIGHT_FILES[0]).is_file():
            download(snapshot.name, [WEIGHT_FILES[1]])
    return snapshot


def _huggingface_hub():
    try:  # optional (pip install 'aiayn[hub]'): imported where a Hub model id is given
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.utils
    except ImportError:
        raise UserError(
            "importing a Hub model needs the huggingface_hub package: pip install 'aiayn[hub]'"
        ) from None
    return huggingface_hub


def _offline(hub) -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as set now, or as huggingface_hub read it."""
    now = (os.environ.get(name, "").upper() for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(value in ("1", "ON", "YES", "TRUE") for value in now) or bool(hub.constants.HF_HUB_OFFLINE)


@contextmanager
def _hub_errors(hub, repo: str, revision: str | None, cache):
    """huggingface_hub's errors (and its HTTP library's) as one line each."""
    errors = hub.utils
    try:
        yield
    except errors.GatedRepoError:
        raise UserError(f"{repo}: a gated model: accept its terms on the Hub, then hf auth login") from None
    except errors.RepositoryNotFoundError:
        raise UserError(
            f"{repo}: no such directory, and no model {repo} on the Hugging Face Hub (a private one needs "
            "hf auth login)"
        ) from None
    except errors.RevisionNotFoundError:
        raise UserError(f"{repo}: the Hugging Face Hub has no revision {revision or 'main'!r}") from None
    except errors.LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if _offline(hub) else "the Hugging Face Hub cannot be reached"
        raise UserError(f"{repo}: not in the cache {cache} (or only in part), and {why}") from None
    except (errors.HfHubHTTPError, *_connection_errors()) as err:
        raise UserError(f"{repo}: cannot download it from the Hugging Face Hub: {_first_line(err)}") from None


def _connection_errors() -> tuple[type[BaseException], ...]:
    """OSError (requests' errors are OSErrors) and the transport errors of httpx or httpx2, whichever
    the installed huggingface_hub uses."""
    modules = (sys.modules.get(name) for name in ("httpx", "httpx2"))
    return (OSError, *(m.TransportError for m in modules if m is not None and hasattr(m, "TransportError")))


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


# --- reading a MarianMT directory -----------------------------------------------------------------


class MarianWeights:
    """The weights of a MarianMT directory, read one tensor at a time.

    ``model.safetensors`` is memory-mapped with ``safetensors.safe_open``, opened anew for each
    tensor: the pages a tensor was read from are let go with it, so an import holds the aiayn weights
    made so far and the tensor in hand, not the file besides. ``pytorch_model.bin`` is mapped once
    with ``torch.load(mmap=True, weights_only=True)`` (which unpickles tensors and plain containers,
    never code; loading it again for each tensor would parse its whole pickle each time, minutes at
    opus-mt's size): torch maps the file as one storage, so the pages read stay mapped until the
    import ends (file pages, which the kernel may drop and read again). A ``pytorch_model.bin`` in
    torch's legacy format, which cannot be mapped, is read whole.
    """

    def __init__(self, source: Path) -> None:
        self.file = next((source / name for name in WEIGHT_FILES if (source / name).is_file()), None)
        if self.file is None:
            raise UserError(f"{source}: no weights ({' or '.join(WEIGHT_FILES)})")
        self._loaded = self._load() if self.file.suffix == ".bin" else None
        self.names = _model_names(self._loaded if self._loaded is not None else self._safetensors_names())

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def first(self, *names: str) -> str:
        """The first of ``names`` the file has (else the first: reading it says it is missing)."""
        return next((name for name in names if name in self.names), names[0])

    def get(self, name: str) -> Tensor:
        """The tensor ``name`` (MarianMTModel's name) as stored, mapped from the file."""
        if name not in self.names:
            raise UserError(f"{self.file.parent}: weights missing: {name}; the weights do not match {CONFIG}")
        if self._loaded is not None:
            return self._loaded[self.names[name]]
        with _reading(self.file), safe_open(self.file, framework="pt") as weights:
            return weights.get_tensor(self.names[name])

    def _safetensors_names(self) -> list[str]:
        with _reading(self.file), safe_open(self.file, framework="pt") as weights:
            return list(weights.keys())

    def _load(self) -> dict[str, Tensor]:
        mmap = zipfile.is_zipfile(self.file)  # torch's legacy format cannot be mapped
        with _reading(self.file):
            weights = torch.load(self.file, map_location="cpu", weights_only=True, mmap=mmap)
        if not isinstance(weights, dict) or not all(isinstance(t, Tensor) for t in weights.values()):
            raise UserError(f"{self.file}: not a mapping of weight names to tensors")
        return weights


@contextmanager
def _reading(file: Path):
    """Errors reading the weights file as one line naming it."""
    try:
        yield
    except (SafetensorError, OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"{file}: cannot read the weights: {reason}") from None


def _model_names(stored) -> dict[str, str]:
    """MarianMTModel's name of each stored tensor (a MarianModel's lack the ``model.`` prefix)."""
    if not stored or any(k.startswith("model.") for k in stored):
        return {k: k for k in stored}
    return {(k if k in ("final_logits_bias", "lm_head.weight") else f"model.{k}"): k for k in stored}


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


def _tokenizer_files(source: Path) -> dict[str, Any]:
    """The two SentencePiece models (bytes) and the vocabularies: ``vocab`` and, where
    ``tokenizer_config.json`` sets ``separate_vocabs`` (as MarianTokenizer reads it), ``target_vocab``
    (else None)."""
    separate = _tokenizer_config(source).get("separate_vocabs") is True
    if not separate and (source / TARGET_VOCAB).is_file():
        raise UserError(
            f"{source}: has {TARGET_VOCAB} but tokenizer_config.json does not set separate_vocabs: true "
            "(MarianTokenizer would not read it); set it or remove the file"
        )
    names = {"source": SOURCE_SPM, "target": TARGET_SPM, "vocab": VOCAB}
    names.update({"target_vocab": TARGET_VOCAB} if separate else {})
    files: dict[str, Any] = {"target_vocab": None}
    for key, name in names.items():
        if not (source / name).is_file():
            raise UserError(f"{source}: {name} missing (a MarianMT model has {', '.join(names.values())})")
        files[key] = (source / name).read_bytes()
    for key in ("vocab", "target_vocab") if separate else ("vocab",):
        files[key] = _vocabulary(source / names[key], files[key])
    return files


def _vocabulary(file: Path, data: bytes) -> dict[str, int]:
    try:
        vocab = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{file}: not valid JSON: {err}") from None
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise UserError(f"{file}: must map pieces to integer ids")
    return vocab


def _tokenizer_config(source: Path) -> dict[str, Any]:
    try:
        values = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return values if isinstance(values, dict) else {}


# --- the plan of an import ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """What an import makes: aiayn's config and tokenizer, and for each side the Marian row of each
    aiayn id (``*_order``) and the number of rows of Marian's embeddings (``*_rows``)."""

    config: TransformerConfig
    tokenizer: VocabTokenizer
    source_order: Tensor
    target_order: Tensor
    source_rows: int
    target_rows: int


def _plan(source: Path, marian: dict[str, Any], weights: MarianWeights, files: dict[str, Any]) -> _Plan:
    activation = _check_architecture(source / CONFIG, marian)
    rows = _marian_sizes(marian)
    (source_order, source_pieces), (target_order, target_pieces) = _sides(source, marian, files, rows)
    separate = files["target_vocab"] is not None
    tokenizer = VocabTokenizer(
        files["source"],
        files["target"],
        source_pieces,
        decode_with_source=not separate,  # MarianTokenizer's choice
        target_pieces=target_pieces if separate else None,
    )
    share = bool(marian.get("share_encoder_decoder_embeddings", True))
    tie_word = bool(marian.get("tie_word_embeddings", True))
    tie = "all" if share and tie_word and not separate else "decoder" if tie_word else "none"
    bias = weights.get("final_logits_bias") if "final_logits_bias" in weights else None
    sizes = (len(source_order), len(target_order))
    config = _config(marian, activation, sizes, tie, bias is not None and bool(bias.abs().sum() > 0))
    return _Plan(config, tokenizer, torch.tensor(source_order), torch.tensor(target_order), *rows)


def _check_architecture(file: Path, marian: dict[str, Any]) -> str:
    """What aiayn's Transformer cannot be, refused naming the setting; returns aiayn's activation."""

    def need(key: str, ok: bool, why: str) -> None:
        if not ok:
            raise UserError(f"{file}: {key}: {why}")

    get = marian.get
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
    choices = ", ".join(ACTIVATIONS)
    need(
        "activation_function",
        activation is not None,
        f"{get('activation_function')!r} is not one of {choices}",
    )
    d = int(get("d_model", 0))
    need("d_model", d > 0 and d % 2 == 0, "must be a positive even number")
    return activation


def _marian_sizes(marian: dict[str, Any]) -> tuple[int, int]:
    """The rows of Marian's source and target embeddings (one shared matrix: ``vocab_size`` both)."""
    source = int(marian.get("vocab_size", 0))
    if marian.get("share_encoder_decoder_embeddings", True):
        return source, source
    return source, int(marian.get("decoder_vocab_size") or source)


def _sides(source: Path, marian: dict[str, Any], files: dict[str, Any], rows: tuple[int, int]):
    """``(order, pieces)`` of the source side and of the target side (see :func:`_side`)."""
    joint = files["target_vocab"] is None
    target_file = source / (VOCAB if joint else TARGET_VOCAB)
    target_vocab = files["vocab"] if joint else files["target_vocab"]
    _check_ids(source / VOCAB, files["vocab"], rows[0], "vocab_size")
    _check_ids(target_file, target_vocab, rows[1], "vocab_size" if joint else "decoder_vocab_size")
    specials = _target_specials(source / CONFIG, target_file, marian, target_vocab)
    target = _side(target_vocab, specials)
    if joint:
        return target, target
    return _side(
        files["vocab"], _source_specials(source / VOCAB, files["vocab"], target_vocab, specials)
    ), target


def _check_ids(file: Path, vocab: dict[str, int], size: int, key: str) -> None:
    ids = sorted(vocab.values())
    if ids != list(range(size)):
        raise UserError(
            f"{file}: has {len(vocab)} pieces with ids {ids[:1]}..{ids[-1:]} but the model has "
            f"{key}={size}; the vocabulary does not match the weights"
        )


def _target_specials(config: Path, file: Path, marian: dict[str, Any], vocab: dict[str, int]) -> list[int]:
    """Marian's ids of aiayn's pad, unk, bos (the decoder's start) and eos on the target side."""

    def setting(key: str, default: int) -> int:
        value = int(marian[key]) if marian.get(key) is not None else default
        if not 0 <= value < len(vocab):
            raise UserError(
                f"{config}: {key}: {value} is not an id of the {len(vocab)} pieces of {file.name}"
            )
        return value

    pad = setting("pad_token_id", len(vocab) - 1)
    eos, start = setting("eos_token_id", 0), setting("decoder_start_token_id", pad)
    if "<unk>" not in vocab:
        raise UserError(f"{file}: has no <unk> piece")
    return [pad, vocab["<unk>"], start, eos]


def _source_specials(
    file: Path, vocab: dict[str, int], target: dict[str, int], specials: list[int]
) -> list[int]:
    """The source vocabulary's ids of the target side's pad, unk and eos pieces, found by name; its
    bos (which aiayn never feeds the encoder) is the decoder start's piece where the source has it
    (an aiayn export's ``<s>``), else the pad's row."""
    piece_of = {i: p for p, i in target.items()}
    ids = []
    for role, i in (("pad", specials[PAD_ID]), ("unk", specials[UNK_ID]), ("eos", specials[EOS_ID])):
        if piece_of[i] not in vocab:
            raise UserError(f"{file}: has no {piece_of[i]!r} piece (the target vocabulary's {role})")
        ids.append(vocab[piece_of[i]])
    pad, unk, eos = ids
    start = specials[BOS_ID]
    bos = vocab.get(piece_of[start], pad) if start != specials[PAD_ID] else pad
    return [pad, unk, bos, eos]


def _side(vocab: dict[str, int], specials: list[int]) -> tuple[list[int], list[str]]:
    """The Marian id of each aiayn id (``specials``, Marian's pad, unk, bos and eos, at aiayn's ids
    0-3, then every other piece in Marian's order) and aiayn's pieces. A bos that is the pad's row
    serves twice and is named apart (aiayn's searches generate neither)."""
    piece_of = {i: p for p, i in vocab.items()}
    order = specials + [i for i in range(len(vocab)) if i not in set(specials)]
    pieces = [piece_of[i] for i in order]
    if specials[BOS_ID] == specials[PAD_ID]:
        bos = BOS_PIECE
        while bos in vocab:
            bos = f"<{bos}>"
        pieces[BOS_ID] = bos
    return order, pieces


def _config(marian: dict[str, Any], activation: str, sizes: tuple[int, int], tie: str, bias: bool):
    get = marian.get
    return TransformerConfig(
        src_vocab_size=sizes[0],
        tgt_vocab_size=sizes[1],
        d_model=int(get("d_model")),
        n_heads=int(get("encoder_attention_heads")),
        n_encoder_layers=int(get("encoder_layers")),
        n_decoder_layers=int(get("decoder_layers")),
        d_ff=int(get("encoder_ffn_dim")),
        dropout=float(get("dropout", 0.1)),
        attention_dropout=float(get("attention_dropout", 0.0)),
        max_len=int(get("max_position_embeddings", 512)),
        tie_embeddings=tie,
        activation=activation,
        generator_bias=bias,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
    )


# --- the weights ----------------------------------------------------------------------------------

#: How an aiayn tensor is made: the Marian tensors it is made of, the function making it of them,
#: and its shape
Recipe = tuple[tuple[str, ...], Callable[..., Tensor], tuple[int, ...]]


def _to_aiayn(weights: MarianWeights, plan: _Plan, source: Path) -> dict[str, Tensor]:
    """aiayn's weights, made one at a time, each stored once (tied ones under their first name, as
    a checkpoint keeps them)."""
    config = plan.config
    recipes = {**_embedding_recipes(weights, plan), **_layer_recipes(config)}
    tied = {"all": ("tgt_embed.lut.weight", "generator.proj.weight"), "decoder": ("generator.proj.weight",)}
    skipped = {
        *tied.get(config.tie_embeddings, ()),
        *(() if config.generator_bias else ("generator.proj.bias",)),
    }
    return {name: _made(weights, *recipe, source) for name, recipe in recipes.items() if name not in skipped}


def _made(
    weights: MarianWeights, names: tuple[str, ...], make, shape: tuple[int, ...], source: Path
) -> Tensor:
    """One aiayn tensor of ``shape`` (float32, in memory of its own), made by ``make`` of the Marian
    tensors ``names``; Marian tensors of other shapes are a :class:`UserError`."""
    tensors = [weights.get(name) for name in names]
    try:
        made = make(*(t.float() for t in tensors))
    except (IndexError, RuntimeError, ValueError):
        made = None
    if made is None or tuple(made.shape) != shape:
        raise UserError(
            f"{source}: {names[0]} has shape {list(tensors[0].shape)}: the weights do not match the config "
            f"({CONFIG})"
        )
    return made.contiguous()


def _embedding_recipes(weights: MarianWeights, plan: _Plan) -> dict[str, Recipe]:
    """The embeddings, the generator and its bias, their rows in aiayn's order."""
    axis, d = _Axis(plan.config.d_model, to_aiayn=True), plan.config.d_model
    source_shape, target_shape = (len(plan.source_order), d), (len(plan.target_order), d)

    def table(order: Tensor, rows: int):
        return lambda t: axis.table(_shaped(t, (rows, d)), order)

    source, target = table(plan.source_order, plan.source_rows), table(plan.target_order, plan.target_rows)
    encoder = weights.first("model.encoder.embed_tokens.weight", "model.shared.weight")
    decoder = weights.first("model.decoder.embed_tokens.weight", "model.shared.weight")
    return {
        "src_embed.lut.weight": ((encoder,), source, source_shape),
        "tgt_embed.lut.weight": ((decoder,), target, target_shape),
        "generator.proj.weight": (("lm_head.weight",), target, target_shape),  # read when not tied
        "generator.proj.bias": (
            ("final_logits_bias",),
            lambda t: _shaped(t, (1, plan.target_rows))[0, plan.target_order],
            target_shape[:1],
        ),
    }


def _shaped(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    if tuple(t.shape) != shape:
        raise ValueError(f"shape {list(t.shape)}, not {list(shape)}")
    return t


def _layer_recipes(config: TransformerConfig) -> dict[str, Recipe]:
    """Each encoder and decoder layer's weights: Q, K and V fused, the d_model axis permuted."""
    axis, d, ff, out = _Axis(config.d_model, to_aiayn=True), config.d_model, config.d_ff, {}
    for a, m, kind in _layer_names(config.n_encoder_layers, config.n_decoder_layers):
        if kind == "norm":
            out[f"{a}.weight"] = (f"{m}.weight",), axis.vector, (d,)
            out[f"{a}.bias"] = (f"{m}.bias",), axis.vector, (d,)
        elif kind == "attention":
            q_k_v = tuple(f"{m}.{p}_proj" for p in "qkv")
            out[f"{a}.in_proj.weight"] = tuple(f"{n}.weight" for n in q_k_v), _fused(axis), (3 * d, d)
            out[f"{a}.in_proj.bias"] = tuple(f"{n}.bias" for n in q_k_v), lambda *b: torch.cat(b), (3 * d,)
            out[f"{a}.out_proj.weight"] = (f"{m}.out_proj.weight",), axis.rows, (d, d)
            out[f"{a}.out_proj.bias"] = (f"{m}.out_proj.bias",), axis.vector, (d,)
        else:
            out[f"{a}.w_1.weight"] = (f"{m}.fc1.weight",), axis.columns, (ff, d)
            out[f"{a}.w_1.bias"] = (f"{m}.fc1.bias",), torch.clone, (ff,)
            out[f"{a}.w_2.weight"] = (f"{m}.fc2.weight",), axis.rows, (d, ff)
            out[f"{a}.w_2.bias"] = (f"{m}.fc2.bias",), axis.vector, (d,)
    return out


def _fused(axis: _Axis):
    """Q, K and V weights as aiayn's one input projection (rows Q, K, V; columns permuted)."""
    return lambda q, k, v: axis.columns(torch.cat([q, k, v]))


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
    pieces, target_pieces = vocabularies(tokenizer)
    (out / SOURCE_SPM).write_bytes(source_spm)
    (out / TARGET_SPM).write_bytes(target_spm)
    files = {VOCAB: pieces, **({TARGET_VOCAB: target_pieces} if tokenizer.separate else {})}
    for name, side in files.items():
        (out / name).write_text(
            json.dumps({p: i for i, p in enumerate(side)}, ensure_ascii=False, indent=1), encoding="utf-8"
        )
    tokenizer_config = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": data.get("src_lang"),
        "target_lang": data.get("tgt_lang"),
        "unk_token": pieces[config.unk_id],
        "eos_token": pieces[config.eos_id],
        "pad_token": pieces[config.pad_id],
        "model_max_length": config.max_len,
        "separate_vocabs": tokenizer.separate,
        "sp_model_kwargs": {},
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")
