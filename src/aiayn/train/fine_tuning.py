"""Fine-tuning (``train.init``, ``aiayn train --init CHECKPOINT``): a new run that starts from a
translation checkpoint's weights, model and tokenizer, with a fresh optimizer and schedule.

:func:`load_init` reads the checkpoint and checks every setting of the run against it before any
data is prepared or model built. Each problem is one line naming the setting and both values, and
all of them are refused at once (one :class:`~aiayn.errors.SettingError`, a line each):

- ``train.init``: a translation checkpoint, not a forecasting one (the other checks need one);
- ``model.<field>``: the model section (and its preset) may set the dropouts unlike the checkpoint,
  no other field (the weights depend on them);
- ``data.max_sentence_tokens``: a kept sentence, with its BOS or EOS, fits the checkpoint's
  ``max_len`` (not the default model's, which the run config alone is checked against);
- ``data.lowercase``: says what the checkpoint's tokenizer does (it encodes the data, and lowercases
  it or not whatever the setting says);
- ``data.bpe_dropout``: needs a BPE tokenizer (Marian's and unigram models have no merges to drop);
- ``data.dir``: a prepared corpus was encoded with the checkpoint's tokenizer.

``data.vocab_size``, ``data.tokenizer`` and ``data.tokenizer_sample`` say how to train a new
tokenizer, which a fine-tuning run does not: they are not compared (their defaults would contradict
most checkpoints, a setting left out cannot be told from one given).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from aiayn.config import PRESETS, TransformerConfig, reported
from aiayn.data.config import CorpusConfig
from aiayn.data.prepared import TOKENIZER_FILE, is_prepared
from aiayn.data.tokenizer import Tokenizer, VocabTokenizer
from aiayn.errors import Setting, SettingError, UserError, joined
from aiayn.loading import LoadedModel, load
from aiayn.train.config import RunConfig

#: Model settings a fine-tuning run may set unlike its --init checkpoint (no weight depends on them).
MAY_CHANGE = ("dropout", "attention_dropout")
KEEPS_MODEL = (
    "a fine-tuning run keeps the checkpoint's model (leave the model section out, or set only dropout)"
)


def load_init(config: RunConfig) -> tuple[LoadedModel, TransformerConfig]:
    """The checkpoint of ``config.train.init`` and the model config of the run (the checkpoint's, with
    the dropouts the model section sets); every setting that contradicts the checkpoint is refused."""
    init = load(config.train.init)
    found = problems(config, init)
    if found:
        raise joined(found)
    return init, fine_tuned_config(config.model, init.config)


def problems(config: RunConfig, init: LoadedModel) -> list[SettingError]:
    """Each setting of ``config`` that contradicts the checkpoint ``init``, one error each."""
    if init.kind != "translation":
        where = f": {init.checkpoint.path} is a {init.kind!r} checkpoint, not a translation one"
        return [SettingError(Setting("train.init"), where)]
    return [
        *model_problems(config.model, init.config),
        *length_problems(config.data, init.config.max_len),
        *tokenizer_problems(config.data, init.tokenizer),
    ]


def model_problems(section: dict[str, Any], init: TransformerConfig) -> list[SettingError]:
    """``model.<field>`` for each field the model section (or its preset) sets unlike the checkpoint,
    the dropouts aside."""
    return [
        SettingError(
            Setting(f"model.{name}"),
            f" {value!r}{origin} differs from the --init checkpoint's {getattr(init, name)!r}: {KEEPS_MODEL}",
        )
        for name, (value, origin) in section_values(section).items()
        if name not in MAY_CHANGE and value != getattr(init, name)
    ]


def section_values(section: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """The model fields ``section`` sets, each with where its value comes from (its preset, or "")."""
    values = dict(section)
    preset = values.pop("preset", None)  # a known one: the run config checks it
    origin = f" (model.preset {preset!r})"
    return {
        **{name: (value, origin) for name, value in PRESETS.get(preset, {}).items()},
        **{name: (value, "") for name, value in values.items()},
    }


def length_problems(data: CorpusConfig, max_len: int) -> list[SettingError]:
    """A kept sentence, with its BOS (target) or EOS (source), must fit the checkpoint's positions."""
    if data.max_sentence_tokens < max_len:
        return []
    needs = f"needs model.max_len >= {data.max_sentence_tokens + 1}"
    return [
        SettingError(
            Setting("data.max_sentence_tokens"),
            f" {data.max_sentence_tokens} {needs}, but the --init checkpoint's model.max_len is {max_len}: "
            f"lower it to {max_len - 1} or less",
        )
    ]


def tokenizer_problems(data: CorpusConfig, tokenizer: Tokenizer | VocabTokenizer) -> list[SettingError]:
    """The data settings the checkpoint's tokenizer (which encodes the data) cannot follow."""
    found = [
        lowercase_problem(data.lowercase, tokenizer.lowercases),
        bpe_dropout_problem(data, tokenizer),
        prepared_problem(data, tokenizer),
    ]
    return [problem for problem in found if problem is not None]


def lowercase_problem(lowercase: bool, lowercases: bool) -> SettingError | None:
    """data.lowercase must say what the checkpoint's tokenizer does (the data is encoded with it)."""
    if lowercase == lowercases:
        return None
    does = "lowercases" if lowercases else "keeps case"
    return SettingError(
        Setting("data.lowercase"),
        f" {_yaml(lowercase)}, but the --init checkpoint's tokenizer {does} (it encodes the data): "
        f"set data.lowercase {_yaml(lowercases)}",
    )


def bpe_dropout_problem(data: CorpusConfig, tokenizer: Tokenizer | VocabTokenizer) -> SettingError | None:
    """BPE-dropout drops merges: the checkpoint's tokenizer must be a SentencePiece BPE model (the run's
    data.tokenizer, bpe by default, says nothing of it)."""
    if not data.bpe_dropout or (isinstance(tokenizer, Tokenizer) and tokenizer.model_type == "bpe"):
        return None
    kind = f"a {tokenizer.model_type} model" if isinstance(tokenizer, Tokenizer) else "Marian's"
    return SettingError(
        Setting("data.bpe_dropout"),
        f" {data.bpe_dropout} needs a BPE tokenizer, but the --init checkpoint's is {kind}: set it to 0",
    )


def prepared_problem(data: CorpusConfig, tokenizer: Tokenizer | VocabTokenizer) -> SettingError | None:
    """A prepared data.dir is trained on as it is: it must hold the checkpoint's tokenizer (a plain-text
    corpus is prepared with it)."""
    directory = Path(data.dir).expanduser()
    if not data.dir or not is_prepared(directory):
        return None
    try:
        prepared = Tokenizer.load(directory / TOKENIZER_FILE)
    except UserError:
        return None  # opening the prepared data names the file
    if prepared.to_bytes() == tokenizer.to_bytes():
        return None
    return SettingError(
        Setting("data.dir"),
        f" {directory} was prepared with another tokenizer than the --init checkpoint's: give the "
        "plain-text corpus (it is prepared with the checkpoint's tokenizer)",
    )


def _yaml(flag: bool) -> str:
    return "true" if flag else "false"


def fine_tuned_config(section: dict[str, Any], init: TransformerConfig) -> TransformerConfig:
    """The checkpoint's model config with the dropouts ``section`` (or its preset) sets."""
    dropouts = {name: value for name, (value, _) in section_values(section).items() if name in MAY_CHANGE}
    with reported("config"):
        return dataclasses.replace(init, **dropouts)
