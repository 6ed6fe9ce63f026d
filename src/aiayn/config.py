"""One typed configuration for the model, validated on construction.

Every hyper-parameter of the Transformer lives in :class:`TransformerConfig`. A wrong value raises
``ValueError`` naming the field; the config round-trips through JSON (it is stored inside every
checkpoint and read back without pickle).

Paper defaults (Vaswani et al. 2017, Table 3 "base") are the defaults here; every deviation is an
option documented on its field.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

POSITIONAL_KINDS = ("sinusoidal", "learned", "none")
TIE_KINDS = ("none", "decoder", "all")
ACTIVATIONS = ("relu", "gelu")

# Fixed special-token ids, shared by the tokenizer (aiayn.data) and the model.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


@dataclass
class TransformerConfig:
    """Hyper-parameters of the encoder-decoder Transformer.

    Paper names throughout: ``d_model`` (model width), ``n_heads`` (h), ``d_ff`` (inner width of the
    position-wise feed-forward network), ``n_encoder_layers`` / ``n_decoder_layers`` (N).
    """

    src_vocab_size: int = 37000
    tgt_vocab_size: int = 37000
    d_model: int = 512
    n_heads: int = 8
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    #: Dropout on attention weights. The paper applies none (0.0); tensor2tensor later added it.
    attention_dropout: float = 0.0
    #: Longest sequence the positional table covers (source or target, in tokens).
    max_len: int = 1024
    #: False = post-norm, LayerNorm(x + Sublayer(x)) as in the paper. True = pre-norm,
    #: x + Sublayer(LayerNorm(x)), with a final LayerNorm on each stack (more stable when deep).
    norm_first: bool = False
    #: "sinusoidal" (paper §3.5), "learned" (the paper's Table 3 row E), or "none".
    positional: str = "sinusoidal"
    #: Weight tying (§3.4): "none"; "decoder" shares the target embedding with the pre-softmax
    #: projection; "all" also shares it with the source embedding (needs one shared vocabulary).
    #: The paper ties all three (its shared BPE vocabulary); the default is "none" because it cannot
    #: assume one vocabulary: the shipped configs set "all", as the paper does.
    tie_embeddings: str = "none"
    #: Feed-forward activation: "relu" (paper) or "gelu".
    activation: str = "relu"
    #: LayerNorm epsilon (the paper does not state one; PyTorch's default).
    layer_norm_eps: float = 1e-5
    pad_id: int = PAD_ID
    unk_id: int = UNK_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            _require(
                name, _is_int(getattr(self, name)) and getattr(self, name) > 0, "must be a positive integer"
            )
        for name in ("n_encoder_layers", "n_decoder_layers"):
            _require(
                name, _is_int(getattr(self, name)) and getattr(self, name) >= 1, "must be an integer >= 1"
            )
        _require(
            "d_model",
            self.d_model % self.n_heads == 0,
            f"({self.d_model}) must be divisible by n_heads ({self.n_heads})",
        )
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            _require(name, isinstance(value, (int, float)) and 0.0 <= value < 1.0, "must be in [0, 1)")
        eps = self.layer_norm_eps
        _require(
            "layer_norm_eps",
            isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps > 0,
            "must be a positive number",
        )
        _choice("positional", self.positional, POSITIONAL_KINDS)
        _choice("tie_embeddings", self.tie_embeddings, TIE_KINDS)
        _choice("activation", self.activation, ACTIVATIONS)
        _require("norm_first", isinstance(self.norm_first, bool), "must be true or false")
        if self.tie_embeddings == "all":
            _require(
                "tie_embeddings",
                self.src_vocab_size == self.tgt_vocab_size,
                f"'all' needs one shared vocabulary, got src_vocab_size={self.src_vocab_size} "
                f"and tgt_vocab_size={self.tgt_vocab_size}",
            )
        ids = {"pad_id": self.pad_id, "unk_id": self.unk_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        for name, value in ids.items():
            limit = min(self.src_vocab_size, self.tgt_vocab_size)
            _require(name, _is_int(value) and 0 <= value < limit, f"must be in [0, {limit})")
        _require("pad_id", len(set(ids.values())) == 4, f"special ids must differ, got {ids}")

    @property
    def d_k(self) -> int:
        """Width of one attention head (d_k = d_v = d_model / h)."""
        return self.d_model // self.n_heads

    # --- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TransformerConfig":
        """Build from a mapping; an unknown key is a ``ValueError`` listing the valid names."""
        return strict_from_dict(cls, values, "config")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TransformerConfig":
        return cls.from_dict(json.loads(text))

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    # --- presets -------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "TransformerConfig":
        """A named preset with optional overrides, e.g. ``preset("base", src_vocab_size=8000)``."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides})


def strict_from_dict(cls: type, values: dict[str, Any], what: str) -> Any:
    """``cls(**values)`` for a dataclass, refusing unknown keys with a ``ValueError`` listing the valid
    ones."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(f"unknown {what} field(s) {', '.join(unknown)}; valid: {', '.join(names)}")
    return cls(**values)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # YAML's true is not 1


def _require(field: str, ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"{field}: {message}")


def _choice(field: str, value: str, options: tuple[str, ...]) -> None:
    _require(field, value in options, f"unknown value {value!r}; valid: {', '.join(options)}")


#: Named presets. "base" and "big" are the paper's Table 3 rows; the others are CPU-sized.
PRESETS: dict[str, dict[str, Any]] = {
    "base": dict(d_model=512, n_heads=8, n_encoder_layers=6, n_decoder_layers=6, d_ff=2048, dropout=0.1),
    "big": dict(d_model=1024, n_heads=16, n_encoder_layers=6, n_decoder_layers=6, d_ff=4096, dropout=0.3),
    # 3+3 layers, d=256: the benchmark shape and a good size for Multi30k on a CPU.
    "small": dict(d_model=256, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, d_ff=1024, dropout=0.1),
    # 2+2 layers, d=128: the built-in demo task and quick experiments.
    "tiny": dict(d_model=128, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=512, dropout=0.1),
}
