"""The ``data`` section of a translation run config: the corpus, its tokenizer, filtering and batching.

``aiayn data prepare`` reads this section (and the run's ``train.seed``, the tokenizer's seed) to
encode a corpus once; ``aiayn train`` reads the same section (:class:`aiayn.train.config.RunConfig`
holds a :class:`CorpusConfig`) and checks that a prepared directory was made with these settings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.config import (
    Checked,
    ConfigError,
    from_mapping,
    model_section_config,
    reported,
    require,
    seed_setting,
    setting,
)
from aiayn.data.prepared import PrepareSettings
from aiayn.errors import Setting, SettingError


@dataclass
class CorpusConfig(Checked):
    """A translation run's ``data`` section: where the corpus is, how it is encoded and batched."""

    dir: str = ""  #: corpus directory: {split}.{lang} files for train_split and valid_split
    src_lang: str = "de"
    tgt_lang: str = "en"
    train_split: str = "train"
    valid_split: str = "val"
    vocab_size: int = setting(8000, gt=0)  #: joint SentencePiece vocabulary (an upper bound on tiny corpora)
    #: pairs of the training split sampled (seeded) to train the tokenizer; 0 = every pair
    tokenizer_sample: int = setting(1_000_000, ge=0)
    tokenizer: str = setting("bpe", choices=("bpe", "unigram"))
    #: The tokenizer lowercases all text, so the model reads and writes lowercase (the Multi30k
    #: literature's preprocessing).
    lowercase: bool = False
    #: BPE-dropout (Provilkov et al., 2020): each epoch the training pairs are segmented anew, each
    #: merge skipped with this probability (0 = off; decoding always uses all merges).
    bpe_dropout: float = setting(0.0, ge=0, lt=1, says="is a probability below 1")
    #: pairs longer than this (subword tokens, either side) are dropped
    max_sentence_tokens: int = setting(100, gt=0)
    max_ratio: float = setting(
        3.0, gt=0
    )  #: pairs whose length ratio exceeds this are dropped (aiayn.data.corpus)
    #: padded tokens per batch, all processes together (per optimizer step: × accum_steps)
    batch_tokens: int = setting(4096, gt=0)
    batch_multiple: int = setting(0, ge=0)  #: sentences per batch a multiple of this (0 = the world size)

    def check(self) -> None:
        require(
            "bpe_dropout",
            not self.bpe_dropout or self.tokenizer == "bpe",
            f"needs data.tokenizer bpe (got {self.tokenizer!r})",
        )

    def directory(self) -> Path:
        """The corpus directory ``dir`` (``~`` expanded); a :class:`SettingError` when it is empty."""
        if not self.dir:
            raise SettingError("no corpus: ", Setting("data.dir"), " is empty")
        return Path(self.dir).expanduser()

    def check_max_len(self, max_len: int) -> None:
        """A kept sentence, with its BOS (target) or EOS (source), must fit the model's ``max_len``."""
        require(
            "data.max_sentence_tokens",
            max_len > self.max_sentence_tokens,
            f"{self.max_sentence_tokens} needs model.max_len >= {self.max_sentence_tokens + 1} "
            f"(got {max_len}); lower one or raise the other",
        )

    def prepare_settings(self, seed: int) -> PrepareSettings:
        """The settings a prepared directory is made with: this section's, and the tokenizer's ``seed``."""
        names = [f.name for f in dataclasses.fields(PrepareSettings) if f.name != "seed"]
        return PrepareSettings(**{name: getattr(self, name) for name in names}, seed=seed)


def prepare_settings_of(values: dict[str, Any], source: str | Path) -> tuple[CorpusConfig, PrepareSettings]:
    """The ``data`` section of a run config's ``values`` and what it prepares with (``train.seed`` the
    seed), checked with the ``model`` section it must fit; the ``optim`` and ``train`` sections are
    training's to check. Bad values are one line naming ``source``."""
    with reported(source):
        corpus = from_mapping(CorpusConfig, values.get("data") or {}, "data.")
        model = values.get("model") or {}
        if not isinstance(model, dict):
            raise ConfigError("model", f"must be a mapping of key: value; got {type(model).__name__}")
        corpus.check_max_len(model_section_config(model, vocab_size=64).max_len)
        train = values.get("train") or {}
        seed = train.get("seed") if isinstance(train, dict) else None
        seed = from_mapping(_Seed, {} if seed is None else {"seed": seed}, "train.").seed
        return corpus, corpus.prepare_settings(seed)


@dataclass
class _Seed(Checked):
    """``train.seed``, read by itself: the seed of the tokenizer's sample and training."""

    seed: int = seed_setting()
