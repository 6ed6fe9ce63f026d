"""Translation training: the paper's recipe as a :class:`~aiayn.train.engine.Task` of the engine.

:class:`TranslationTask` (``train(TranslationTask(config), out)``) opens the prepared corpus
(:mod:`aiayn.data.prepared`: ``data.dir`` prepared with ``aiayn data prepare``, or a plain-text corpus
directory that rank 0 prepares into the run directory's ``data/`` on first use while the other
processes wait), builds the Transformer and its label-smoothed objective, and hands the engine
token-bounded batches (:class:`~aiayn.data.batching.TokenBatchSampler`, seeded by (seed, epoch)), the
per-token loss, the paper's learning-rate schedule (with an optional cool-down) and validation by loss
and greedy BLEU/chrF. The engine (:mod:`aiayn.train.engine`) runs the loop, checkpoints, exact resume,
early stopping and DDP; its module docstring describes the run directory.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from aiayn.checkpoint import Checkpoint
from aiayn.config import TransformerConfig, reported
from aiayn.data.batching import Batch, TokenBatchSampler, collate, padding_share
from aiayn.data.bpe_dropout import BpeDropout, EpochResampler
from aiayn.data.config import CorpusConfig
from aiayn.data.corpus import CorpusStats
from aiayn.data.prepare import prepare
from aiayn.data.prepared import PreparedData, PreparedSplit, is_prepared, open_prepared
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode import Translator
from aiayn.errors import Setting, SettingError, UserError
from aiayn.evaluate import sacrebleu_scores
from aiayn.loading import LoadedModel
from aiayn.malloc import bound_onednn_caches
from aiayn.model import Transformer, build_model, count_parameters
from aiayn.train import distributed as dist
from aiayn.train import schedule
from aiayn.train.config import RunConfig, run_config_from_dict
from aiayn.train.engine import Engine, Loss, Task, refuse_other_run
from aiayn.train.fine_tuning import load_init
from aiayn.train.loss import Seq2SeqObjective

DATA_DIR = "data"  # where a plain-text corpus is prepared inside the run directory


class TranslationTask(Task):
    """A Transformer trained on a parallel corpus: ``train(TranslationTask(config), out)``."""

    kind = "translation"

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.settings = config.train

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def tokenizer_bytes(self) -> bytes:
        return self.tokenizer.to_bytes()

    def setup(self, engine: Engine) -> None:
        """The data (prepared on first use), the model and its objective, the batches."""
        self.out, self.log = engine.out, engine.log
        if self.device.type == "cpu" and engine.precision == "bf16":
            # before the first bf16 matmul: varying shapes would fill them (aiayn.malloc)
            bound_onednn_caches()
        resumed = engine.resumed
        self.config = self._merge_resumed_config(self.config, resumed)
        self.init = self._init(resumed)
        self.data = self._prepared(resumed)
        self.tokenizer = self.data.tokenizer
        self.train_examples, self.valid_examples, self.valid_pairs = self._read_data()
        self.model = self._build_model()
        self.loss_fn = Seq2SeqObjective(
            self.model, self.config.optim.label_smoothing, self.model.config.pad_id
        )
        if self.config.train.compile:
            self.loss_fn.compile()  # in place: parameter names (and checkpoints) stay the same
        self.objective = self.loss_fn
        self.sampler = self._sampler()
        self.batches = _CollatedBatches(self.sampler, self.log)

    # --- set-up ---------------------------------------------------------------------------------------
    def _merge_resumed_config(self, config: RunConfig, resumed: Checkpoint | None) -> RunConfig:
        """On resume the model, data and optim settings and the train settings of
        :data:`RECIPE_TRAIN_KEYS` must be the saved ones, and train.init the saved one where given;
        the rest of ``train`` (limits, cadences) and ``data.dir`` (where the corpus is now) may change."""
        if resumed is None:
            return config
        saved = run_config_from_dict(resumed.config["run"], str(resumed.path), warn=False)  # not the user's
        may_change = (
            "model, data and optim settings and train.clip_norm/accum_steps (the rest of train.* may change)"
        )
        refuse_other_run(self.out, _changed_settings(saved, config), may_change)
        train = dataclasses.replace(
            config.train, init=_resumed_init(saved.train.init, config.train.init, self.out)
        )
        with reported("the resumed run"):  # checks the saved cool-down against the new budget
            return dataclasses.replace(
                saved, train=train, data=dataclasses.replace(saved.data, dir=config.data.dir)
            )

    def _init(self, resumed: Checkpoint | None) -> LoadedModel | None:
        """The checkpoint a new run starts from (``train.init``), every setting checked against it
        (:mod:`aiayn.train.fine_tuning`); None on resume (the run's own checkpoint has the weights) or
        without one."""
        if not self.config.train.init or resumed is not None:
            return None
        init, self._init_model_config = load_init(self.config)
        self.log(
            f"init: the weights, model and tokenizer of {init.checkpoint.path} "
            "(a fresh optimizer and schedule)"
        )
        return init

    def _prepared(self, resumed: Checkpoint | None) -> PreparedData:
        """The prepared data, checked against the config's data settings (and the resumed run's or the
        --init checkpoint's tokenizer)."""
        path = self._data_directory(resumed)
        data = open_prepared(path, self.config.prepare_settings())
        if resumed is not None and resumed.tokenizer_bytes != data.tokenizer.to_bytes():
            raise UserError(f"{path} was prepared with another tokenizer than the run in {self.out} resumes")
        if self.init is not None and self.init.tokenizer.to_bytes() != data.tokenizer.to_bytes():
            raise SettingError(  # the run directory's own: a prepared data.dir was checked before
                f"{path} was prepared with another tokenizer than the --init checkpoint's (by a run begun "
                "with another --init, stopped before its first checkpoint): delete it, or give a new ",
                Setting("run_dir"),
            )
        self.log(f"data: {path} ({data.manifest['dtype']} token ids, read as batches need them)")
        return data

    def _data_directory(self, resumed: Checkpoint | None) -> Path:
        """Where rank 0 finds (or makes) the prepared data; every other process takes the same one."""
        own, given = self.out / DATA_DIR, Path(self.config.data.dir).expanduser()
        # the other ranks' own view stands in for rank 0's answer only without a process group
        view = 1 if self.config.data.dir and is_prepared(given) else 0
        where = self._on_rank_0(lambda: self._find_or_prepare(resumed, own), view)
        path = own if where == 0 else given
        if not is_prepared(path):  # only on a rank after 0
            raise SettingError(
                f"rank {self.engine.rank} cannot see {path}, the prepared data rank 0 trains on: the run "
                "directory must be on storage every machine shares, or prepare the corpus on each machine "
                "with `aiayn data prepare` and give that directory (at the same path) as ",
                Setting("data.dir"),
            )
        return path

    def _find_or_prepare(self, resumed: Checkpoint | None, own: Path) -> int:
        """0: the run directory's ``data/`` (a resumed run's is kept, the corpus is not read again;
        else a plain-text data.dir is prepared into it); 1: data.dir, prepared already."""
        if resumed is not None and is_prepared(own):
            return 0
        path = _data_path(self.config.data)
        if is_prepared(path):
            return 1
        tokenizer = Tokenizer.from_bytes(resumed.tokenizer_bytes) if resumed is not None else None
        if self.init is not None:
            tokenizer = self.init.tokenizer
        prepare(path, own, self.config.prepare_settings(), tokenizer=tokenizer, log=self.log)
        return 0

    def _on_rank_0(self, work: Callable[[], int], answer: int = 0) -> int:
        """``work()`` run by rank 0 while the other processes wait, its answer (>= 0) sent to all
        (replacing theirs); its failure stops them all."""
        if self.engine.rank == 0:
            try:
                answer = work()
            except BaseException:
                dist.broadcast_float(-1.0)
                raise
        answer = int(dist.broadcast_float(float(answer)))
        if answer < 0:
            raise UserError("rank 0 could not prepare the data (its error is in its log)")
        return answer

    def _read_data(self) -> tuple[PreparedSplit, list, list]:
        """The training pairs (read from the files as batches need them), the validation pairs the
        model can take, and the text of every validation pair (BLEU's sources and references)."""
        train, valid = self.config.data.train_split, self.config.data.valid_split
        self.log(self.data.summary(train))
        return self.data.split(train), self._valid_examples(), self.data.texts(valid)

    def _valid_examples(self) -> list:
        """The validation pairs of at most max_len - 1 tokens a side (+ BOS or EOS), counted in the log."""
        name = self.config.data.valid_split
        valid, record = self.data.split(name), self.data.manifest["splits"][name]
        limit = self._model_config(64).max_len - 1
        keep = np.flatnonzero(valid.lengths.max(axis=1, initial=0) <= limit)
        if not len(keep):
            raise UserError(f"no validation pair fits model.max_len {limit + 1}: {record['summary']}")
        stats = CorpusStats(
            record["source"], record["read"], record["empty"], len(valid) - len(keep), max_tokens=limit
        )
        self.log(stats.summary())
        return [valid[i] for i in keep]

    def _model_config(self, vocab_size: int) -> TransformerConfig:
        """The model section's config; with train.init the checkpoint's (dropout as the section says),
        on resume of such a run the resumed checkpoint's."""
        if self.init is not None:
            return self._init_model_config
        if self.config.train.init and self.engine.resumed is not None:
            return TransformerConfig.from_dict(self.engine.resumed.config["model"])
        return self.config.model_config(vocab_size)

    def _build_model(self) -> Transformer:
        model = build_model(self._model_config(self.tokenizer.vocab_size))
        if self.init is not None:
            model.load_state_dict(self.init.model.state_dict())  # step 0 is the checkpoint's weights
        model = model.to(self.device)
        self.log(
            f"model: {count_parameters(model):,} parameters, {model.config.n_encoder_layers}+"
            f"{model.config.n_decoder_layers} layers, d_model={model.config.d_model}"
        )
        return model

    def _sampler(self) -> TokenBatchSampler:
        data, seed = self.config.data, self.config.train.seed
        resample = None
        if data.bpe_dropout:  # a new segmentation of the training pairs each epoch
            resample = EpochResampler(self.train_examples, BpeDropout(self.tokenizer, data.bpe_dropout), seed)
        return TokenBatchSampler(
            self.train_examples,
            data.batch_tokens,
            seed=seed,
            rank=self.engine.rank,
            world_size=self.engine.world_size,
            batch_multiple=data.batch_multiple or self.engine.world_size,
            resample=resample,
        )

    # --- the task -------------------------------------------------------------------------------------
    def make_optimizer(self, parameters: Iterator[torch.nn.Parameter]) -> torch.optim.Optimizer:
        optim = self.config.optim
        # fused: one kernel for all parameters, not a loop over them
        kwargs = dict(lr=0.0, betas=(optim.beta1, optim.beta2), eps=optim.eps, fused=True)
        if optim.weight_decay > 0:
            return torch.optim.AdamW(parameters, weight_decay=optim.weight_decay, **kwargs)
        return torch.optim.Adam(parameters, **kwargs)

    def loss(self, objective: torch.nn.Module, batch: Batch) -> Loss:
        """Summed label-smoothed loss over the batch's target tokens, weighted by their number."""
        batch = batch.to(self.device, non_blocking=True)
        loss, nll = objective(batch.src, batch.tgt_in, batch.tgt_out)
        return Loss(loss, {"nll": nll}, float(batch.n_tgt_tokens))

    def learning_rate(self, step: int, epoch: int, progress: float) -> float:
        optim = self.config.optim
        lr = schedule.learning_rate(
            step,
            optim.lr_schedule,
            d_model=self.model.config.d_model,
            warmup=optim.warmup,
            factor=optim.lr_factor,
            peak_lr=optim.peak_lr,
        )
        return lr * schedule.cooldown_factor(progress, optim.cooldown)

    def train_record(self, loss: float, logged: dict[str, float], weight: float, seconds: float) -> dict:
        """Per-token loss and perplexity since the last record; tokens/s counts real target tokens."""
        tokens = max(weight, 1.0)
        return {
            "loss": loss / tokens,
            "ppl": math.exp(min(logged["nll"] / tokens, 50.0)),
            "tokens_per_s": weight / seconds,
        }

    @torch.no_grad()
    def validate(self) -> dict[str, Any]:
        self.model.eval()
        loss_sum = nll_sum = n_tokens = 0.0
        for start in range(0, len(self.valid_examples), 64):
            batch = collate(self.valid_examples[start : start + 64]).to(self.device)
            with self.engine.autocast():
                loss, nll = self.loss_fn(batch.src, batch.tgt_in, batch.tgt_out)
            loss_sum, nll_sum = loss_sum + loss.item(), nll_sum + nll.item()
            n_tokens += batch.n_tgt_tokens
        metrics: dict[str, Any] = {
            "loss": loss_sum / n_tokens,
            "nll": nll_sum / n_tokens,
            "ppl": math.exp(min(nll_sum / n_tokens, 50.0)),
        }
        if self.config.train.valid_bleu and self.engine.rank == 0:
            metrics.update(self._bleu())
        return metrics

    def _bleu(self) -> dict[str, float]:
        sources, references = [s for s, _ in self.valid_pairs], [t for _, t in self.valid_pairs]
        translator = Translator(self.model, self.tokenizer, self.device, beam=1)
        with self.engine.autocast():
            hypotheses = [translation.text for translation in translator.translate(sources)]
        scores = sacrebleu_scores(hypotheses, references, lowercase=self.tokenizer.lowercases)
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    def selection(self, metrics: dict[str, Any]) -> tuple[str, bool]:
        """train.best_metric; the loss when the metric was not computed (valid_bleu off)."""
        name = self.config.train.best_metric if self.config.train.best_metric in metrics else "loss"
        return name, name != "loss"

    def checkpoint_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": self.model.config.to_dict(), "run": self.config.to_dict()}

    def run_config(self) -> dict[str, Any]:
        return self.config.to_dict()

    def describe(self) -> str:
        """The share of padding in the first 200 batches of the current epoch."""
        batches = self.sampler.batches(self.sampler.epoch)[:200]
        examples = self.sampler.examples_of(self.sampler.epoch)
        return f"padding {padding_share(collate([examples[i] for i in b]) for b in batches):.1%}"


class _CollatedBatches:
    """The sampler's batches of example indices as collated :class:`Batch` es (the engine's Batches)."""

    def __init__(self, sampler: TokenBatchSampler, log: Callable[[str], None]) -> None:
        self.sampler, self.log = sampler, log

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    @property
    def position(self) -> int:
        return self.sampler.position

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Batch]:
        for indices in self.sampler:
            examples = self.sampler.examples_of(self.sampler.epoch)  # this epoch's (BPE-dropout: resampled)
            yield collate([examples[i] for i in indices])

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the position; warn when the epoch was cut for another number of processes."""
        self.sampler.load_state_dict(state)
        if state.get("batch_multiple", self.sampler.batch_multiple) != self.sampler.batch_multiple:
            self.log(
                f"warning: batches were cut for a multiple of {state['batch_multiple']} sentences, "
                f"now {self.sampler.batch_multiple} (another number of processes): the rest of epoch "
                f"{self.sampler.epoch + 1} is cut differently, so some of its sentences may repeat or "
                "be skipped"
            )


# --- helpers -----------------------------------------------------------------------------------------


#: The train settings that change what a step computes: a resumed run keeps them like the optim section.
RECIPE_TRAIN_KEYS = ("clip_norm", "accum_steps")


def _changed_settings(saved: RunConfig, new: RunConfig) -> list[str]:
    """``section.key saved -> new`` for each model, data and optim setting (and the train settings of
    :data:`RECIPE_TRAIN_KEYS`) that differs, data.dir aside."""
    old, now = saved.to_dict(), new.to_dict()
    old["model"], now["model"] = (c.model_config(vocab_size=64).to_dict() for c in (saved, new))  # presets
    keys = [
        (section, key)
        for section in ("model", "data", "optim")
        for key in sorted(set(old[section]) | set(now[section]))
        if (section, key) != ("data", "dir")
    ] + [("train", key) for key in RECIPE_TRAIN_KEYS]
    return [
        f"{section}.{key} {old[section].get(key)!r} -> {now[section].get(key)!r}"
        for section, key in keys
        if old[section].get(key) != now[section].get(key)
    ]


def _resumed_init(saved: str, given: str, out: Path) -> str:
    """A resumed run's train.init is its own (a fine-tuning run's model is its checkpoint's, not the
    model section's): --init may be left out on resume, not changed."""
    if given and (not saved or _resolved(given) != _resolved(saved)):
        began = f"from {saved}" if saved else "from scratch (no train.init)"
        raise SettingError(
            Setting("train.init"),
            f" {given}, but {out} holds a run that began {began}: resume it without ",
            Setting("train.init"),
            ", or give a new ",
            Setting("run_dir"),
        )
    return saved


def _resolved(path: str) -> Path:
    return Path(path).expanduser().resolve()


def _data_path(data: CorpusConfig) -> Path:
    path = data.directory()
    if not path.exists():
        raise UserError(f"data directory not found: {path}")
    if not path.is_dir():  # one file is one split: validating on it would score the training data
        raise UserError(
            f"data.dir {path} is a file; training reads a directory with a {{split}}.{{lang}} file "
            "per split and language (train and validation kept apart)"
        )
    return path
