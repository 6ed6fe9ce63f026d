"""The run configuration of ``aiayn train``: a YAML file with four sections.

``model`` holds :class:`aiayn.TransformerConfig` fields (plus an optional ``preset``; the
vocabulary sizes come from the tokenizer), ``data``, ``optim`` and ``train`` the fields of the
dataclasses below, each with its type and rule on the field (:func:`aiayn.config.setting`). Unknown
keys and bad values are one :class:`UserError` naming the file and the field and listing the valid
names. ``--set section.key=value`` overrides any field (the value parsed as YAML).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiayn.config import (
    Checked,
    Renamed,
    TransformerConfig,
    from_mapping,
    model_section_config,
    read_config,
    reported,
    require,
    setting,
    upgrade,
)
from aiayn.data.config import CorpusConfig
from aiayn.data.prepared import PrepareSettings
from aiayn.train.engine import EngineConfig


@dataclass
class OptimConfig(Checked):
    lr_schedule: str = setting("noam", choices=("noam", "inverse_sqrt"))  #: inverse_sqrt uses peak_lr
    warmup: int = setting(4000, gt=0)
    lr_factor: float = setting(1.0, ge=0)  #: multiplies the noam schedule
    peak_lr: float = setting(5e-4, ge=0)  #: for inverse_sqrt
    #: decay the lr linearly to 0 over this last fraction of the run (train.max_steps/hours/epochs)
    cooldown: float = setting(0.0, ge=0, le=1, says="is a fraction of the run, from 0 to 1")
    beta1: float = setting(0.9, ge=0)
    beta2: float = setting(0.98, ge=0)
    eps: float = setting(1e-9, ge=0)
    weight_decay: float = setting(0.0, ge=0)  #: decoupled (AdamW) when > 0
    label_smoothing: float = setting(0.1, ge=0)


@dataclass
class TranslationTrainConfig(EngineConfig):
    """The ``train`` section: the engine's settings, and what translation adds to them."""

    compile: bool = False  #: torch.compile the model
    valid_bleu: bool = True  #: greedy-decode the validation set for BLEU/chrF
    #: which validation metric picks best/
    best_metric: str = setting("bleu", choices=("bleu", "chrf", "loss"))
    #: start from this checkpoint's weights, model config and tokenizer (fine-tuning; ``--init``):
    #: a fresh optimizer and schedule on the run's data, encoded with that tokenizer
    init: str = ""


#: Settings read under their former names, with one warning (run configs and run directories of
#: earlier versions).
RENAMED = (
    Renamed("optim.clip_norm", "train.clip_norm"),
    Renamed("optim.accum_steps", "train.accum_steps"),
)


@dataclass
class RunConfig(Checked):
    model: dict[str, Any] = field(default_factory=dict)
    data: CorpusConfig = field(default_factory=CorpusConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TranslationTrainConfig = field(default_factory=TranslationTrainConfig)

    def check(self) -> None:
        """The model section's keys and values, and the rules between sections."""
        model = self.transformer_config(vocab_size=64)  # the model fields now, not after the data work
        check_cooldown(self)
        if not self.train.init:  # a fine-tuning run's sentences must fit the checkpoint's max_len instead
            self.data.check_max_len(model.max_len)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def transformer_config(self, vocab_size: int) -> TransformerConfig:
        """The TransformerConfig of this run for a (shared) vocabulary; :class:`ConfigError` naming
        ``model.<field>``."""
        return model_section_config(self.model, vocab_size)

    def prepare_settings(self) -> PrepareSettings:
        """The settings data.dir must be prepared with: the data section (the seed is train.seed)."""
        return self.data.prepare_settings(self.train.seed)

    def model_config(self, vocab_size: int) -> TransformerConfig:
        """The TransformerConfig of this run for a (shared) vocabulary of ``vocab_size``."""
        with reported("config"):
            return self.transformer_config(vocab_size)


def check_cooldown(config: RunConfig) -> None:
    """optim.cooldown is a fraction of a budget that must exist (max_steps, max_hours or max_epochs)."""
    train = config.train
    require(
        "optim.cooldown",
        not config.optim.cooldown or bool(train.max_steps or train.max_hours or train.max_epochs),
        "needs train.max_steps, train.max_hours or train.max_epochs (the budget it ends with)",
    )


def run_config_from_dict(
    values: dict[str, Any], source: str | Path = "config", warn: bool = True
) -> RunConfig:
    """Validate sections, keys, types, choices and the rules between them; an error names ``section.key``."""
    values = upgrade(values, RENAMED, source, warn)
    with reported(source):
        return from_mapping(RunConfig, values)


def load_run_config(path: str | Path | None, overrides: list[str] = (), **cli: Any) -> RunConfig:
    """Read a YAML run config, apply ``section.key=value`` overrides, then ``cli``'s values
    (``"section.key"``: value, None = not given)."""
    return run_config_from_dict(read_config(path, overrides, cli), str(path or "config"))
