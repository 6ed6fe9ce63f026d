"""The run configuration of ``aiayn train``: a YAML file with four sections.

``model`` holds :class:`aiayn.TransformerConfig` fields (plus an optional ``preset``; the
vocabulary sizes come from the tokenizer), ``data``, ``optim`` and ``train`` the fields of the
dataclasses below. Unknown keys and bad values are one :class:`UserError` naming the field and
listing the valid names. ``--set section.key=value`` overrides any field (the value parsed as YAML).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from aiayn.config import PRESETS, TransformerConfig
from aiayn.errors import UserError


@dataclass
class DataConfig:
    dir: str = ""  #: corpus directory: {split}.{lang} files for train_split and valid_split
    src_lang: str = "de"
    tgt_lang: str = "en"
    train_split: str = "train"
    valid_split: str = "val"
    vocab_size: int = 8000  #: joint SentencePiece vocabulary (an upper bound on tiny corpora)
    tokenizer: str = "bpe"  #: "bpe" or "unigram"
    #: The tokenizer lowercases all text, so the model reads and writes lowercase (the Multi30k
    #: literature's preprocessing).
    lowercase: bool = False
    #: BPE-dropout (Provilkov et al., 2020): each epoch the training pairs are segmented anew, each
    #: merge skipped with this probability (0 = off; decoding always uses all merges).
    bpe_dropout: float = 0.0
    max_sentence_tokens: int = 100  #: pairs longer than this (subword tokens, either side) are dropped
    max_ratio: float = 3.0  #: pairs whose length ratio exceeds this are dropped (see aiayn.data.corpus)
    batch_tokens: int = (
        4096  #: padded tokens per batch, all processes together (per optimizer step: × accum_steps)
    )
    batch_multiple: int = 0  #: sentences per batch a multiple of this (0 = the world size)


@dataclass
class OptimConfig:
    lr_schedule: str = "noam"  #: "noam" (the paper's Eq. 3) or "inverse_sqrt" (peak_lr)
    warmup: int = 4000
    lr_factor: float = 1.0  #: multiplies the noam schedule
    peak_lr: float = 5e-4  #: for inverse_sqrt
    cooldown: float = (
        0.0  #: decay the lr linearly to 0 over this last fraction of the run (train.max_steps/hours/epochs)
    )
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-9
    weight_decay: float = 0.0  #: decoupled (AdamW) when > 0
    label_smoothing: float = 0.1
    clip_norm: float = 0.0  #: gradient-norm clipping (0 = off)
    accum_steps: int = 1  #: batches accumulated per optimizer step


@dataclass
class TrainSection:
    seed: int = 1
    device: str = "auto"  #: "auto", "cpu", "cuda", "cuda:N"
    precision: str = "auto"  #: "auto" (bf16 where the hardware has it natively), "bf16" or "fp32"
    compile: bool = False  #: torch.compile the model
    max_steps: int = 0  #: stop after this many optimizer steps (0 = no limit)
    max_epochs: int = 0  #: stop after this many epochs (0 = no limit)
    max_hours: float = 0.0  #: stop after this much training time, summed over resumes (0 = no limit)
    save_every: int = 1000  #: checkpoint every N steps (and at the end)
    keep_last: int = 5  #: checkpoints kept (0 = all)
    valid_every: int = 1000  #: validate every N steps (and at each epoch's end)
    valid_at_epoch_end: bool = True  #: also validate when an epoch ends
    valid_bleu: bool = True  #: greedy-decode the validation set for BLEU/chrF
    best_metric: str = "bleu"  #: "bleu", "chrf" or "loss": which validation metric picks best/
    patience: int = 0  #: stop after this many validations without improvement (0 = off)
    log_every: int = 50


@dataclass
class RunConfig:
    model: dict[str, Any] = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainSection = field(default_factory=TrainSection)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def model_config(self, vocab_size: int) -> TransformerConfig:
        """The TransformerConfig of this run for a (shared) vocabulary of ``vocab_size``."""
        values = dict(self.model)
        preset = values.pop("preset", None)
        values.update(src_vocab_size=vocab_size, tgt_vocab_size=vocab_size)
        try:
            return (
                TransformerConfig.preset(preset, **values) if preset else TransformerConfig.from_dict(values)
            )
        except ValueError as err:
            raise UserError(f"config model.{err}") from None


SECTIONS = {"data": DataConfig, "optim": OptimConfig, "train": TrainSection}
CHOICES = {
    ("optim", "lr_schedule"): ("noam", "inverse_sqrt"),
    ("train", "precision"): ("auto", "bf16", "fp32"),
    ("train", "best_metric"): ("bleu", "chrf", "loss"),
    ("data", "tokenizer"): ("bpe", "unigram"),
}
MODEL_KEYS = {"preset", *TransformerConfig.field_names()} - {"src_vocab_size", "tgt_vocab_size"}
POSITIVE = {
    ("optim", "warmup"),
    ("optim", "accum_steps"),
    ("data", "batch_tokens"),
    ("data", "vocab_size"),
    ("data", "max_sentence_tokens"),
    ("data", "max_ratio"),
}  # 0 would divide by zero or drop everything


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e-6`` as a float (YAML 1.2) rather than a string (YAML 1.1)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"), list("-+0123456789.")
)


def load_yaml(text: str) -> Any:
    """Parse YAML as the run and forecast configs do (``1e-6`` is a number)."""
    return yaml.load(text, Loader=_YamlLoader)  # a SafeLoader: plain data only


def run_config_from_dict(values: dict[str, Any], source: str = "config") -> RunConfig:
    """Validate sections, keys, types and choices; every error names ``section.key``."""
    unknown = sorted(set(values) - {"model", *SECTIONS})
    if unknown:
        raise UserError(
            f"{source}: unknown section(s) {', '.join(unknown)}; valid: model, {', '.join(SECTIONS)}"
        )
    model = dict(values.get("model") or {})
    bad = sorted(set(model) - MODEL_KEYS)
    if bad:
        raise UserError(
            f"{source}: unknown key(s) model.{', model.'.join(bad)}; valid: {', '.join(sorted(MODEL_KEYS))}"
        )
    if model.get("preset") is not None and model["preset"] not in PRESETS:
        raise UserError(f"{source}: model.preset {model['preset']!r} unknown; valid: {', '.join(PRESETS)}")
    sections = {name: _section(cls, values.get(name) or {}, name, source) for name, cls in SECTIONS.items()}
    config = RunConfig(model=model, **sections)
    check_cooldown(config, source)
    _check_bpe_dropout(config.data, source)
    max_len = config.model_config(
        vocab_size=64
    ).max_len  # validates the model fields now, not after hours of data work
    if max_len <= config.data.max_sentence_tokens:  # + BOS (target) or EOS (source)
        raise UserError(
            f"{source}: data.max_sentence_tokens {config.data.max_sentence_tokens} needs model.max_len >= "
            f"{config.data.max_sentence_tokens + 1} (got {max_len}); lower one or raise the other"
        )
    return config


def check_cooldown(config: RunConfig, source: str) -> None:
    """optim.cooldown is a fraction of a budget that must exist (max_steps, max_hours or max_epochs)."""
    cooldown, train = config.optim.cooldown, config.train
    if not 0 <= cooldown <= 1:
        raise UserError(f"{source}: optim.cooldown is a fraction of the run, from 0 to 1; got {cooldown!r}")
    if cooldown and not (train.max_steps or train.max_hours or train.max_epochs):
        raise UserError(
            f"{source}: optim.cooldown needs train.max_steps, train.max_hours or train.max_epochs "
            "(the budget it ends with)"
        )


def _check_bpe_dropout(data: DataConfig, source: str) -> None:
    if not 0 <= data.bpe_dropout < 1:
        raise UserError(f"{source}: data.bpe_dropout is a probability below 1; got {data.bpe_dropout!r}")
    if data.bpe_dropout and data.tokenizer != "bpe":
        raise UserError(f"{source}: data.bpe_dropout needs data.tokenizer bpe (got {data.tokenizer!r})")


def _section(cls: type, values: dict[str, Any], name: str, source: str) -> Any:
    if not isinstance(values, dict):
        raise UserError(f"{source}: section {name} must be a mapping")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise UserError(
            f"{source}: unknown key(s) {name}.{f', {name}.'.join(unknown)}; valid: {', '.join(fields)}"
        )
    for key, value in values.items():
        _check_value(name, key, value, type(getattr(cls(), key)), source)
    return cls(**values)


def _check_value(section: str, key: str, value: Any, expected: type, source: str) -> None:
    ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise UserError(f"{source}: {section}.{key} must be {expected.__name__}, got {value!r}")
    if (section, key) in CHOICES and value not in CHOICES[(section, key)]:
        raise UserError(
            f"{source}: {section}.{key} {value!r} unknown; valid: {', '.join(CHOICES[(section, key)])}"
        )
    if expected in (int, float) and value < 0:
        raise UserError(f"{source}: {section}.{key} must be >= 0, got {value!r}")
    if (section, key) in POSITIVE and value <= 0:
        raise UserError(f"{source}: {section}.{key} must be > 0, got {value!r}")


def load_run_config(path: str | Path | None, overrides: list[str] = (), **cli: Any) -> RunConfig:
    """Read a YAML run config, apply ``--set section.key=value`` overrides, then CLI flags.

    ``cli`` maps ``"section.key"`` to a value (None = not given).
    """
    values: dict[str, Any] = _read_yaml(Path(path)) if path else {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or "." not in key:
            raise UserError(f"--set expects section.key=value, got {item!r}")
        _assign(values, key, load_yaml(raw))
    for key, value in cli.items():
        if value is not None:
            _assign(values, key, value)
    return run_config_from_dict(values, str(path or "config"))


def _assign(values: dict[str, Any], dotted: str, value: Any) -> None:
    section, _, key = dotted.partition(".")
    values.setdefault(section, {})
    if not isinstance(values[section], dict):
        raise UserError(f"config section {section} must be a mapping")
    values[section][key] = value


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        values = load_yaml(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"config file not found: {path}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise UserError(f"cannot parse config {path}: {str(err).splitlines()[0]}") from None
    if not isinstance(values, dict):
        raise UserError(f"config {path} must be a mapping of sections (model, data, optim, train)")
    return values
