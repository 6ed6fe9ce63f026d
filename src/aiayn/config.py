"""Typed configuration: the model's :class:`TransformerConfig`, and the one strict way to read any config.

Every hyper-parameter of the Transformer lives in :class:`TransformerConfig`. A wrong value raises
``ValueError`` naming the field; the config round-trips through JSON (it is stored inside every
checkpoint and read back without pickle).

Paper defaults (Vaswani et al. 2017, Table 3 "base") are the defaults here; every deviation is an
option documented on its field.

Every config dataclass of the project (this one, the training run's sections, the forecaster's) is
read the same way:

- a field states its type in its annotation and its choices or range once, with :func:`setting`
  (``warmup: int = setting(4000, gt=0)``);
- a :class:`Checked` dataclass checks every field on construction (:func:`check_fields`), then its
  cross-field rules (:meth:`Checked.check`); a failure is a :class:`ConfigError` (a ``ValueError``)
  whose message starts with the field's name;
- :func:`from_mapping` builds a dataclass, and its nested section dataclasses, from a mapping,
  refusing unknown keys; :func:`reported` turns its errors into one :class:`UserError` line that names
  the file and the dotted field (``configs/x.yaml: train.patience must be >= 1; got 0``);
- :func:`read_yaml` is the one YAML reader (``1e-6`` is a number).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import operator
import os
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import yaml

from aiayn.errors import UserError

POSITIONAL_KINDS = ("sinusoidal", "learned", "none")
TIE_KINDS = ("none", "decoder", "all")
ACTIVATIONS = ("relu", "gelu", "silu")

# Fixed special-token ids, shared by the tokenizer (aiayn.data) and the model.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3

#: The seed of every run that sets none (training, and the tokenizer's sample of prepared data).
DEFAULT_SEED = 1


# --- fields that state their rules ----------------------------------------------------------------


class ConfigError(ValueError):
    """A config value that breaks its field's rule: ``field`` (dotted within its file) and the problem.

    ``str()`` is ``"field: problem"`` (``ValueError`` naming the field); ``field`` is empty when the
    problem names its own keys (unknown keys).
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field, self.problem = field, problem

    def within(self, prefix: str) -> "ConfigError":
        """The same error for a field nested under ``prefix`` (e.g. ``"train."``)."""
        return ConfigError(prefix + self.field, self.problem) if self.field else self


@dataclass(frozen=True)
class Rule:
    """Choices or bounds of a field (besides its annotated type); ``says`` replaces the wording."""

    choices: tuple[Any, ...] | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    says: str | None = None

    def holds(self, value: Any) -> bool:
        if self.choices is not None:
            return value in self.choices
        return all(bound is None or compare(value, bound) for compare, bound in self._bounds())  # NaN fails

    def requirement(self) -> str:
        if self.says:
            return self.says
        if self.choices is not None:
            return f"must be one of {', '.join(map(str, self.choices))}"
        bounds = [(SIGNS[compare], bound) for compare, bound in self._bounds() if bound is not None]
        if len(bounds) == 1:
            return f"must be {bounds[0][0]} {bounds[0][1]}"
        (low_sign, low), (high_sign, high) = bounds
        return (
            f"must be in {'[' if low_sign == '>=' else '('}{low}, {high}{']' if high_sign == '<=' else ')'}"
        )

    def _bounds(self) -> tuple[tuple[Any, float | None], ...]:
        return (operator.ge, self.ge), (operator.gt, self.gt), (operator.le, self.le), (operator.lt, self.lt)


SIGNS = {operator.ge: ">=", operator.gt: ">", operator.le: "<=", operator.lt: "<"}


def setting(
    default: Any = dataclasses.MISSING,
    *,
    factory: Any = dataclasses.MISSING,
    choices: tuple[Any, ...] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    says: str | None = None,
) -> Any:
    """A dataclass field with its rule: ``choices``, or bounds ``ge``/``gt``/``le``/``lt``.

    ``says`` words the requirement in the error instead (``"is a probability below 1"``).
    """
    rule = Rule(choices=choices, ge=ge, gt=gt, le=le, lt=lt, says=says)
    return dataclasses.field(default=default, default_factory=factory, metadata={"rule": rule})


def seed_setting() -> Any:
    """The ``seed`` field of every config: :data:`DEFAULT_SEED`, within NumPy's 32-bit seeds."""
    return setting(DEFAULT_SEED, ge=0, le=2**32 - 1)


TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
ITEM_WORDS = {int: "integers", float: "numbers", str: "strings"}


def type_problem(value: Any, kind: Any) -> str | None:
    """Why ``value`` is not of the annotated type ``kind`` (None when it is). YAML's true is not 1."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return type_problem(value, next(a for a in args if a is not type(None)))
    if kind is Any:
        return None
    if origin is list:
        ok = isinstance(value, list) and all(type_problem(v, args[0]) is None for v in value)
        return None if ok else f"must be a list of {ITEM_WORDS[args[0]]}"
    if origin is dict or kind is dict:
        return None if isinstance(value, dict) else "must be a mapping of key: value"
    if dataclasses.is_dataclass(kind):
        return None if isinstance(value, kind) else f"must be a {kind.__name__}"
    if isinstance(value, bool) and kind is not bool:
        return f"must be {TYPE_WORDS[kind]}"
    ok = isinstance(value, (int, float)) if kind is float else isinstance(value, kind)
    return None if ok else f"must be {TYPE_WORDS[kind]}"


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """The annotated type of each field of dataclass ``cls`` (string annotations resolved)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def check_fields(obj: Any) -> None:
    """Check each field of a dataclass instance against its type and rule; :class:`ConfigError` if not."""
    for name, kind in field_types(type(obj)).items():
        value = getattr(obj, name)
        problem = type_problem(value, kind)
        rule = type(obj).__dataclass_fields__[name].metadata.get("rule")
        if problem is None and rule is not None and value is not None and not rule.holds(value):
            problem = rule.requirement()
        if problem is not None:
            raise ConfigError(name, f"{problem}; got {value!r}")


def require(field: str, ok: bool, problem: str) -> None:
    """A cross-field rule: :class:`ConfigError` naming ``field`` unless ``ok``."""
    if not ok:
        raise ConfigError(field, problem)


class Checked:
    """Base of the config dataclasses: fields checked on construction, then :meth:`check`."""

    def __post_init__(self) -> None:
        check_fields(self)
        self.check()

    def check(self) -> None:
        """Rules between fields (subclasses override); raise :class:`ConfigError` via :func:`require`."""


# --- building from a mapping ------------------------------------------------------------------------


def from_mapping(cls: type, values: Any, prefix: str = "") -> Any:
    """``cls(**values)`` for a dataclass, sections (fields typed as dataclasses) built recursively.

    Unknown keys, wrong types and values out of range raise :class:`ConfigError` naming the dotted
    field (``prefix`` + name). A section given as ``None`` (an empty YAML section) is its defaults.
    """
    if not isinstance(values, dict):
        raise ConfigError(prefix.rstrip("."), f"must be a mapping of key: value; got {type(values).__name__}")
    kinds = field_types(cls)
    unknown = sorted(map(str, set(values) - set(kinds)))
    if unknown:
        names = ", ".join(prefix + name for name in unknown)
        raise ConfigError("", f"unknown config field(s) {names}; valid: {', '.join(kinds)}")
    built = {name: _section(kinds[name], value, f"{prefix}{name}.") for name, value in values.items()}
    try:
        return cls(**built)
    except ConfigError as err:
        raise err.within(prefix) from None


def _section(kind: Any, value: Any, prefix: str) -> Any:
    if dataclasses.is_dataclass(kind):
        return from_mapping(kind, {} if value is None else value, prefix)
    if (kind is dict or typing.get_origin(kind) is dict) and value is None:
        return {}
    return value


def assign(values: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``values[section][key]`` for ``dotted`` = ``"section.key"`` (an override from the command line)."""
    section, _, key = dotted.partition(".")
    if values.get(section) is None:  # absent, or an empty section in the file
        values[section] = {}
    if isinstance(values[section], dict):  # else the loader reports the section, naming the file
        values[section][key] = value


def read_config(path: str | Path | None, overrides: Sequence[str] = (), flags: dict[str, Any] | None = None):
    """A YAML config's values (``{}`` without a file) with ``overrides`` (``section.key=value``, the
    value read as YAML) applied, then ``flags`` (``"section.key"``: value; None = not given)."""
    values: dict[str, Any] = read_yaml(path) if path else {}
    return assign_flags(apply_overrides(values, overrides), flags or {})


def apply_overrides(values: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``values`` with each of ``overrides`` (``section.key=value`` from ``--set``, the value read as
    YAML) assigned in place."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or "." not in key:
            raise UserError(f"--set must read section.key=value; got {item!r}")
        try:
            value = parse_yaml(raw)
        except yaml.YAMLError:
            raise UserError(f"--set {item!r}: the value is not valid YAML") from None
        assign(values, key, value)
    return values


#: The budget flags of the training commands: flag suffix -> (setting, type, help).
BUDGET_FLAGS = {
    "steps": ("train.max_steps", int, "stop after this many optimizer steps"),
    "epochs": ("train.max_epochs", int, "stop after this many epochs"),
    "hours": ("train.max_hours", float, "stop after this much training time, summed over resumes"),
}


def add_training_flags(parser, budgets: Sequence[str] = ("steps", "epochs", "hours")) -> None:
    """The flags every training command takes, spelled and meaning the same everywhere: ``--set``
    (repeatable), ``--device``, ``--threads`` and the budget flags ``--max-`` each of ``budgets``.
    :func:`training_flags` gives the settings they set."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config field, e.g. --set train.precision=fp32 (repeatable)",
    )
    parser.add_argument(
        "--device", help="auto (the default: the GPU when there is one), cpu, cuda or cuda:N (train.device)"
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: one per core)")
    for name in budgets:
        setting, kind, text = BUDGET_FLAGS[name]
        parser.add_argument(f"--max-{name}", type=kind, help=f"{text} ({setting}; 0 = no limit)")


def training_flags(args: Any) -> dict[str, Any]:
    """The settings (``"section.key"``: value, None = not given) of :func:`add_training_flags`'s flags."""
    flags = {"train.device": args.device}
    for name, (setting, _, _) in BUDGET_FLAGS.items():
        flags[setting] = getattr(args, f"max_{name}", None)
    return flags


def assign_flags(values: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """``values`` with each of ``flags`` (``"section.key"``: value from a command line; None = not
    given) assigned in place."""
    for key, value in flags.items():
        if value is not None:
            assign(values, key, value)
    return values


@dataclass(frozen=True)
class Renamed:
    """A setting read under its former name ``old`` (``"section.key"``) as ``new``, ``convert`` applied
    to its value."""

    old: str
    new: str
    convert: Callable[[Any], Any] = lambda value: value


def upgrade(
    values: dict[str, Any], renamed: Sequence[Renamed], source: str | Path, warn: bool = True
) -> dict[str, Any]:
    """``values`` (a config's sections) with each former name in ``renamed`` moved to its new name, and
    with ``warn`` one warning line on stderr for each (from the first process of a torchrun only);
    ``values`` itself is left as it was. Both names given is an error."""
    values = {k: dict(v) if isinstance(v, dict) else v for k, v in values.items()}
    for rename in renamed:
        (old_section, old_key), (new_section, new_key) = (n.split(".", 1) for n in (rename.old, rename.new))
        section = values.get(old_section)
        if not isinstance(section, dict) or old_key not in section:
            continue
        if values.get(new_section) is None:
            values[new_section] = {}
        target = values[new_section]
        if not isinstance(target, dict):
            continue  # the loader names the malformed section
        if new_key in target:
            raise UserError(
                f"{source}: {rename.old} is the former name of {rename.new}: give only {rename.new}"
            )
        target[new_key] = rename.convert(section.pop(old_key))
        if warn and os.environ.get("RANK", "0") == "0":
            read = f"read as {rename.new}: {target[new_key]!r}"
            print(f"aiayn: warning: {source}: {rename.old} is now {rename.new} ({read})", file=sys.stderr)
    return values


@contextlib.contextmanager
def reported(source: str | Path) -> Iterator[None]:
    """Turn a :class:`ConfigError` inside the block into one :class:`UserError` line naming ``source``."""
    try:
        yield
    except ConfigError as err:
        where = f"{err.field} " if err.field else ""
        raise UserError(f"{source}: {where}{err.problem}") from None


# --- YAML --------------------------------------------------------------------------------------------


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e-6`` as a float (YAML 1.2) rather than a string (YAML 1.1)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"), list("-+0123456789.")
)


def parse_yaml(text: str) -> Any:
    """Plain data from YAML text (``1e-6`` is a number); ``yaml.YAMLError`` if it does not parse."""
    return yaml.load(text, Loader=_YamlLoader)  # a SafeLoader: plain data only


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML config file as a mapping (empty file: ``{}``); a :class:`UserError` line when it is missing,
    does not parse, or is not a mapping."""
    path = Path(path)
    try:
        values = parse_yaml(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"config file not found: {path}") from None
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"{where}: not valid YAML: {problem}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise UserError(f"{path}: must be a mapping of sections; got {type(values).__name__}")
    return values


# --- the model ---------------------------------------------------------------------------------------


@dataclass
class TransformerConfig(Checked):
    """Hyper-parameters of the encoder-decoder Transformer.

    Paper names throughout: ``d_model`` (model width), ``n_heads`` (h), ``d_ff`` (inner width of the
    position-wise feed-forward network), ``n_encoder_layers`` / ``n_decoder_layers`` (N).
    """

    src_vocab_size: int = setting(37000, gt=0)
    tgt_vocab_size: int = setting(37000, gt=0)
    d_model: int = setting(512, gt=0)
    n_heads: int = setting(8, gt=0)
    n_encoder_layers: int = setting(6, ge=1)
    n_decoder_layers: int = setting(6, ge=1)
    d_ff: int = setting(2048, gt=0)
    dropout: float = setting(0.1, ge=0, lt=1)
    #: Dropout on attention weights. The paper applies none (0.0); tensor2tensor later added it.
    attention_dropout: float = setting(0.0, ge=0, lt=1)
    #: Longest sequence the positional table covers (source or target, in tokens).
    max_len: int = setting(1024, gt=0)
    #: False = post-norm, LayerNorm(x + Sublayer(x)) as in the paper. True = pre-norm,
    #: x + Sublayer(LayerNorm(x)), with a final LayerNorm on each stack (more stable when deep).
    norm_first: bool = False
    #: "sinusoidal" (paper §3.5), "learned" (the paper's Table 3 row E), or "none".
    positional: str = setting("sinusoidal", choices=POSITIONAL_KINDS)
    #: Weight tying (§3.4): "none"; "decoder" shares the target embedding with the pre-softmax
    #: projection; "all" also shares it with the source embedding (needs one shared vocabulary).
    #: The paper ties all three (its shared BPE vocabulary); the default is "none" because it cannot
    #: assume one vocabulary: the shipped configs set "all", as the paper does.
    tie_embeddings: str = setting("none", choices=TIE_KINDS)
    #: Feed-forward activation: "relu" (paper), "gelu" or "silu" (x * sigmoid(x), Marian's "swish").
    activation: str = setting("relu", choices=ACTIVATIONS)
    #: A bias on the pre-softmax projection. The paper's generator has none (False); imported
    #: MarianMT models have one (their ``final_logits_bias``).
    generator_bias: bool = False
    #: LayerNorm epsilon (the paper does not state one; PyTorch's default).
    layer_norm_eps: float = setting(1e-5, gt=0)
    pad_id: int = setting(PAD_ID, ge=0)
    unk_id: int = setting(UNK_ID, ge=0)
    bos_id: int = setting(BOS_ID, ge=0)
    eos_id: int = setting(EOS_ID, ge=0)

    def check(self) -> None:
        require(
            "d_model",
            self.d_model % self.n_heads == 0,
            f"({self.d_model}) must be divisible by n_heads ({self.n_heads})",
        )
        if self.tie_embeddings == "all":
            require(
                "tie_embeddings",
                self.src_vocab_size == self.tgt_vocab_size,
                f"'all' needs one shared vocabulary, got src_vocab_size={self.src_vocab_size} "
                f"and tgt_vocab_size={self.tgt_vocab_size}",
            )
        ids = {"pad_id": self.pad_id, "unk_id": self.unk_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        limit = min(self.src_vocab_size, self.tgt_vocab_size)
        for name, value in ids.items():
            require(name, value < limit, f"must be in [0, {limit}); got {value}")
        require("pad_id", len(set(ids.values())) == 4, f"special ids must differ, got {ids}")

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
        return from_mapping(cls, values)

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
            raise ConfigError("preset", f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides})


def model_section_config(section: dict[str, Any], vocab_size: int) -> "TransformerConfig":
    """The TransformerConfig of a run config's ``model`` section (TransformerConfig fields but the
    vocabulary sizes, or a ``preset`` and overrides) for one shared vocabulary of ``vocab_size``; a
    :class:`ConfigError` names ``model.<field>``."""
    keys = [
        "preset",
        *(n for n in TransformerConfig.field_names() if n not in ("src_vocab_size", "tgt_vocab_size")),
    ]
    unknown = sorted(map(str, set(section) - set(keys)))
    if unknown:
        names = ", ".join(f"model.{name}" for name in unknown)
        raise ConfigError("", f"unknown config field(s) {names}; valid: {', '.join(keys)}")
    values = dict(section)
    preset = values.pop("preset", None)
    require(
        "model.preset",
        preset is None or preset in PRESETS,
        f"must be one of {', '.join(PRESETS)}; got {preset!r}",
    )
    values.update(src_vocab_size=vocab_size, tgt_vocab_size=vocab_size)
    try:
        return TransformerConfig.preset(preset, **values) if preset else TransformerConfig.from_dict(values)
    except ConfigError as err:
        raise err.within("model.") from None


#: Named presets. "base" and "big" are the paper's Table 3 rows; the others are CPU-sized.
PRESETS: dict[str, dict[str, Any]] = {
    "base": dict(d_model=512, n_heads=8, n_encoder_layers=6, n_decoder_layers=6, d_ff=2048, dropout=0.1),
    "big": dict(d_model=1024, n_heads=16, n_encoder_layers=6, n_decoder_layers=6, d_ff=4096, dropout=0.3),
    # 3+3 layers, d=256: the benchmark shape and a good size for Multi30k on a CPU.
    "small": dict(d_model=256, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, d_ff=1024, dropout=0.1),
    # 2+2 layers, d=128: the built-in demo task and quick experiments.
    "tiny": dict(d_model=128, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=512, dropout=0.1),
}
