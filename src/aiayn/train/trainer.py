"""The training loop: the paper's recipe, exact resume, validation, early stopping, DDP.

A run directory holds::

    checkpoints/step-NNNNNNNN/   the last ``keep_last`` checkpoints (see aiayn.checkpoint)
    best/                        the checkpoint with the best validation metric
    metrics.jsonl                one JSON record per log line / validation
    run.yaml                     the resolved run configuration

Exact resume: a checkpoint stores the weights, the optimizer, the step, the epoch and position in
the batch order, the RNG states (torch, Python, NumPy), the best score and the patience counter.
A run killed at any moment and restarted from its last checkpoint follows the trajectory of an
uninterrupted run (bit-identical weights on CPU in fp32). The one exception is a learning-rate
cool-down (``optim.cooldown``) measured against ``train.max_hours``: it follows the wall clock, so
no two such runs are identical, resumed or not.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import yaml
from torch import nn

from aiayn.checkpoint import (
    BEST_DIR,
    CHECKPOINTS_DIR,
    Checkpoint,
    checkpoint_name,
    latest_checkpoint,
    load_checkpoint,
    load_weights,
    prune_checkpoints,
    save_checkpoint,
)
from aiayn.data.batching import Batch, TokenBatchSampler, collate, padding_share
from aiayn.data.bpe_dropout import BpeDropout, EpochResampler
from aiayn.data.corpus import encode_corpus, read_parallel
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.malloc import bound_onednn_caches
from aiayn.model import Transformer, build_model, count_parameters
from aiayn.precision import autocast, resolve_precision
from aiayn.train import distributed as dist
from aiayn.train.config import RunConfig, check_cooldown, run_config_from_dict
from aiayn.train.loss import Seq2SeqObjective
from aiayn.train.schedule import cooldown_factor, learning_rate

METRICS_FILE, RUN_CONFIG_FILE = "metrics.jsonl", "run.yaml"


@dataclass
class TrainState:
    """Everything besides weights and optimizer that a resumed run needs."""

    step: int = 0
    metrics_lines: int = 0  # records in metrics.jsonl when the checkpoint was written
    best: float | None = None
    bad_validations: int = 0  # validations since the best one (patience)
    stopped_early: bool = False
    hours: float = 0.0  # training wall-clock time so far, summed over resumes (train.max_hours)
    validated_at: int = -1  # the step of the last validation (none twice at one step, resumed or not)


class Trainer:
    """Train a Transformer on a parallel corpus; see the module docstring for the run directory."""

    def __init__(
        self,
        config: RunConfig,
        out_dir: str | Path,
        log: Callable[[str], None] | None = None,
        progress: bool = True,
    ) -> None:
        self.out = Path(out_dir)
        self.rank, self.world_size = dist.setup()
        self.device = dist.pick_device(config.train.device)
        self.precision = resolve_precision(config.train.precision, self.device)
        if self.device.type == "cpu" and self.precision == "bf16":
            # before the first bf16 matmul: varying shapes would fill them (aiayn.malloc)
            bound_onednn_caches()
        self.log = (log or _write) if self.rank == 0 else (lambda _msg: None)
        self.progress = progress and self.rank == 0
        _seed_everything(config.train.seed)
        latest = latest_checkpoint(self.out)
        resumed = load_checkpoint(latest) if latest is not None else None  # read once, used thrice
        self.config = self._merge_resumed_config(config, resumed)
        self.state = TrainState()
        self.tokenizer = self._tokenizer(resumed)
        self.train_examples, self.valid_examples, self.valid_pairs = self._read_data()
        self.model = self._build_model()
        self.loss_fn = Seq2SeqObjective(
            self.model, self.config.optim.label_smoothing, self.model.config.pad_id
        )
        if self.config.train.compile:
            self.loss_fn.compile()  # in place: parameter names (and checkpoints) stay the same
        self.objective = dist.wrap(self.loss_fn, self.device)  # DDP-wrapped when several processes
        self.optimizer = self._build_optimizer()
        self.sampler = self._sampler()
        self._clock = time.perf_counter()  # state.hours counts from here (reset when the loop starts; _tick)
        self._tensorboard = None  # a SummaryWriter once the first record is written, if installed
        if resumed is not None:
            self._resume(resumed)
        self._hours = self.state.hours  # as rank 0 counts them (what the lr cool-down follows)

    # --- set-up ---------------------------------------------------------------------------------------
    def _merge_resumed_config(self, config: RunConfig, resumed: Checkpoint | None) -> RunConfig:
        """On resume the model, data and optim settings must be the saved ones; ``train`` (limits,
        cadences) and ``data.dir`` (where the corpus is now) may change."""
        if resumed is None:
            return config
        saved = run_config_from_dict(resumed.config["run"], str(resumed.path))
        changed = _changed_settings(saved, config)
        if changed:
            raise UserError(
                f"{self.out} holds a run with other settings ({'; '.join(changed)}): resume it with "
                "the same model, data and optim settings (train.* may change), or give a new --out"
            )
        saved.train, saved.data.dir = config.train, config.data.dir
        check_cooldown(saved, "the resumed run")  # the saved cool-down against the new budget
        self.log(f"resuming from {resumed.path}")
        return saved

    def _tokenizer(self, resumed: Checkpoint | None) -> Tokenizer:
        if resumed is not None:
            return Tokenizer.from_bytes(resumed.tokenizer_bytes)
        data = self.config.data
        pairs, _ = read_parallel(_data_path(data.dir), data.train_split, data.src_lang, data.tgt_lang)
        sentences = [s for pair in pairs for s in pair]
        tokenizer = Tokenizer.train(
            sentences,
            vocab_size=data.vocab_size,
            model_type=data.tokenizer,
            seed=self.config.train.seed,
            lowercase=data.lowercase,
        )
        self.log(
            f"trained a joint {data.tokenizer} tokenizer: {tokenizer.vocab_size} pieces"
            + (", lowercasing" if data.lowercase else "")
        )
        return tokenizer

    def _read_data(self) -> tuple[list, list, list]:
        data = self.config.data
        train = self._encoded(data.train_split, filter_long=True)[0]
        valid, valid_pairs = self._encoded(data.valid_split, filter_long=False)
        return train, valid, valid_pairs

    def _encoded(self, split: str, filter_long: bool) -> tuple[list, list]:
        data = self.config.data
        pairs, stats = read_parallel(_data_path(data.dir), split, data.src_lang, data.tgt_lang)
        limit = data.max_sentence_tokens if filter_long else self.config.model_config(64).max_len - 1
        ratio = data.max_ratio if filter_long else math.inf
        examples = encode_corpus(pairs, stats, self.tokenizer.encode_batch, limit, ratio)
        self.log(stats.summary())
        return examples, pairs

    def _build_model(self) -> Transformer:
        model = build_model(self.config.model_config(self.tokenizer.vocab_size)).to(self.device)
        self.log(
            f"model: {count_parameters(model):,} parameters, {model.config.n_encoder_layers}+"
            f"{model.config.n_decoder_layers} layers, d_model={model.config.d_model}"
        )
        return model

    def _build_optimizer(self) -> torch.optim.Optimizer:
        optim = self.config.optim
        # fused: one kernel for all parameters (3x faster than the default per-tensor loop on CPU)
        kwargs = dict(lr=0.0, betas=(optim.beta1, optim.beta2), eps=optim.eps, fused=True)
        params = self.objective.parameters()
        if optim.weight_decay > 0:
            return torch.optim.AdamW(params, weight_decay=optim.weight_decay, **kwargs)
        return torch.optim.Adam(params, **kwargs)

    def _sampler(self) -> TokenBatchSampler:
        data, seed = self.config.data, self.config.train.seed
        resample = None
        if data.bpe_dropout:  # a new segmentation of the training pairs each epoch
            resample = EpochResampler(self.train_examples, BpeDropout(self.tokenizer, data.bpe_dropout), seed)
        return TokenBatchSampler(
            self.train_examples,
            data.batch_tokens,
            seed=seed,
            rank=self.rank,
            world_size=self.world_size,
            batch_multiple=data.batch_multiple or self.world_size,
            resample=resample,
        )

    # --- checkpoints ----------------------------------------------------------------------------------
    def _resume(self, ckpt: Checkpoint) -> None:
        path = ckpt.path
        if ckpt.train_state is None:
            raise UserError(f"{path} holds no training state; cannot resume from it")
        load_weights(self.model, ckpt.weights, path)
        saved = ckpt.train_state
        self.optimizer.load_state_dict(saved["optimizer"])
        self.sampler.load_state_dict(saved["sampler"])
        if saved["sampler"].get("batch_multiple", self.sampler.batch_multiple) != self.sampler.batch_multiple:
            self.log(
                f"warning: batches were cut for a multiple of {saved['sampler']['batch_multiple']} "
                "sentences, "
                f"now {self.sampler.batch_multiple} (another number of processes): the rest of epoch "
                f"{self.sampler.epoch + 1} is cut differently, so some of its sentences may repeat or "
                "be skipped"
            )
        self.state = TrainState(**saved["trainer"])
        _set_rng_states(saved["rng"])  # rank 0's, as saved (ranks after 0 reseed at every step: _step)
        if self.rank == 0:
            _truncate_metrics(self.out / METRICS_FILE, self.state.metrics_lines)
        dist.barrier()  # no rank appends before the file is cut back
        self.log(
            f"resumed at step {self.state.step}, epoch {self.sampler.epoch + 1}, "
            f"batch {self.sampler.position} of {len(self.sampler)}"
        )

    def save(self, directory: Path | None = None) -> Path:
        """Write a checkpoint of the current state (rank 0 only), by default into checkpoints/."""
        path = directory or self.out / CHECKPOINTS_DIR / checkpoint_name(self.state.step)
        self._tick()  # the checkpoint carries the time spent up to now
        if self.rank == 0:
            self.state.metrics_lines = _count_lines(self.out / METRICS_FILE)
            train_state = {
                "optimizer": self.optimizer.state_dict(),
                "sampler": self.sampler.state_dict(),
                "trainer": vars(self.state).copy(),
                "rng": _rng_states(),
            }
            config = {
                "kind": "translation",
                "model": self.model.config.to_dict(),
                "run": self.config.to_dict(),
                "step": self.state.step,
            }
            save_checkpoint(path, self.model, config, self.tokenizer.to_bytes(), train_state)
            if directory is None:
                prune_checkpoints(self.out, self.config.train.keep_last)
        dist.barrier()
        return path

    # --- the loop -------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Run until max_steps / max_epochs / max_hours / early stopping; return the last validation
        metrics."""
        cfg = self.config.train
        if not (cfg.max_steps or cfg.max_epochs or cfg.max_hours):
            raise UserError(
                "set train.max_steps, train.max_epochs or train.max_hours "
                "(or --max-steps / --max-epochs / --max-hours)"
            )
        self.out.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            (self.out / RUN_CONFIG_FILE).write_text(yaml.safe_dump(self.config.to_dict(), sort_keys=False))
        self.log(
            f"{len(self.sampler)} batches per epoch, padding {self._padding():.1%}, "
            f"device {self.device}, {self.precision}, {self.world_size} process(es)"
        )
        metrics = self._loop()
        if self.state.validated_at != self.state.step:
            metrics = self._validate()
        self.save()
        return metrics

    def _loop(self) -> dict[str, Any]:
        cfg = self.config.train
        metrics: dict[str, Any] = {}
        meter = _Meter()
        bar = self._progress_bar()
        self._clock = time.perf_counter()
        while not self._done():
            epoch = self.sampler.epoch
            for batches in self._optimizer_steps():
                self._step(batches, meter)
                bar.update(1)
                bar.set_postfix_str(meter.postfix(self._lr()), refresh=False)
                if cfg.log_every and self.state.step % cfg.log_every == 0:
                    self._log_train(meter)
                if cfg.valid_every and self.state.step % cfg.valid_every == 0:
                    metrics = self._validate()
                if cfg.save_every and self.state.step % cfg.save_every == 0:
                    self.save()
                if self._done():
                    break
            epoch_ended = self.sampler.epoch != epoch
            if epoch_ended and cfg.valid_at_epoch_end and self.state.validated_at != self.state.step:
                metrics = self._validate()
        bar.close()
        return metrics

    def _done(self) -> bool:
        cfg = self.config.train
        return bool(
            self.state.stopped_early
            or (cfg.max_steps and self.state.step >= cfg.max_steps)
            or (cfg.max_epochs and self.sampler.epoch >= cfg.max_epochs)
            or self._out_of_time()
        )

    def _tick(self) -> None:
        """Add the time since the last tick to ``state.hours`` (steps, validations, checkpoints)."""
        now = time.perf_counter()
        self.state.hours += (now - self._clock) / 3600
        self._clock = now

    def _out_of_time(self) -> bool:
        """train.max_hours spent (rank 0's clock decides, so every rank stops at the same step)."""
        self._tick()
        hours = self.config.train.max_hours
        if hours:
            self._hours = dist.broadcast_float(self.state.hours)
        return bool(hours) and self._hours >= hours

    def _progress(self) -> float:
        """The fraction of the budget spent: the largest of steps/max_steps, hours/max_hours and
        epochs/max_epochs (the limit that will stop the run first)."""
        cfg = self.config.train
        spent = [self.state.step / cfg.max_steps] if cfg.max_steps else []
        if cfg.max_hours:
            spent.append(self._hours / cfg.max_hours)
        if cfg.max_epochs:
            spent.append((self.sampler.epoch + self.sampler.position / len(self.sampler)) / cfg.max_epochs)
        return max(spent, default=0.0)

    def _optimizer_steps(self) -> Iterator[list[Batch]]:
        """Groups of ``accum_steps`` batches for one optimizer step, to the end of the epoch."""
        group: list[Batch] = []
        for indices in self.sampler:
            examples = self.sampler.examples_of(self.sampler.epoch)  # this epoch's (BPE-dropout: resampled)
            group.append(collate([examples[i] for i in indices]))
            if len(group) == self.config.optim.accum_steps:
                yield group
                group = []
        if group:
            yield group

    def _step(self, batches: list[Batch], meter: "_Meter") -> None:
        """One optimizer step over ``accum_steps`` batches: gradients, normalisation, clipping, Adam."""
        _seed_dropout(self.config.train.seed, self.rank, self.state.step)
        loss_sum, nll_sum, n_tokens = self.accumulate_gradients(batches)
        if self.config.optim.clip_norm > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.clip_norm)
        self.state.step += 1
        for group in self.optimizer.param_groups:
            group["lr"] = self._lr()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        meter.add(loss_sum, nll_sum, n_tokens)

    def accumulate_gradients(self, batches: list[Batch]) -> tuple[float, float, float]:
        """Backward over ``batches``; leave the gradient of the mean loss per real target token
        of the whole (global) batch. Returns the global (loss sum, NLL sum, token count)."""
        self.objective.train()
        loss_sum = nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            batch = batch.to(self.device, non_blocking=True)
            with dist.no_sync(self.objective, enabled=i < len(batches) - 1), self._autocast():
                loss, nll = self.objective(batch.src, batch.tgt_in, batch.tgt_out)
            loss.backward()
            loss_sum, nll_sum = loss_sum + loss.detach(), nll_sum + nll.detach()
        n_local = torch.tensor(float(sum(b.n_tgt_tokens for b in batches)), device=self.device)
        totals = dist.all_reduce_sum(torch.stack([loss_sum, nll_sum, n_local])).tolist()  # over processes
        # DDP averages gradients over ranks; scaling by world/n gives the per-token mean of the global batch.
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        torch._foreach_mul_(grads, self.world_size / totals[2])
        return totals[0], totals[1], totals[2]

    def _lr(self) -> float:
        optim = self.config.optim
        lr = learning_rate(
            self.state.step,
            optim.lr_schedule,
            self.model.config.d_model,
            optim.warmup,
            optim.lr_factor,
            optim.peak_lr,
        )
        return lr * cooldown_factor(self._progress(), optim.cooldown)

    def _autocast(self):
        return autocast(self.device, self.precision)

    # --- validation -----------------------------------------------------------------------------------
    @torch.no_grad()
    def _validate(self) -> dict[str, Any]:
        self.model.eval()
        loss_sum = nll_sum = n_tokens = 0.0
        for start in range(0, len(self.valid_examples), 64):
            batch = collate(self.valid_examples[start : start + 64]).to(self.device)
            with self._autocast():
                loss, nll = self.loss_fn(batch.src, batch.tgt_in, batch.tgt_out)
            loss_sum, nll_sum, n_tokens = (
                loss_sum + loss.item(),
                nll_sum + nll.item(),
                n_tokens + batch.n_tgt_tokens,
            )
        metrics: dict[str, Any] = {
            "loss": loss_sum / n_tokens,
            "nll": nll_sum / n_tokens,
            "ppl": math.exp(min(nll_sum / n_tokens, 50.0)),
        }
        if self.config.train.valid_bleu and self.rank == 0:
            metrics.update(self._bleu())
        self.state.validated_at = self.state.step
        self._record(split="valid", **metrics)
        self._track_best(metrics)
        return metrics

    def _bleu(self) -> dict[str, float]:
        from aiayn.decode import Translator
        from aiayn.evaluate import sacrebleu_scores

        sources, references = [s for s, _ in self.valid_pairs], [t for _, t in self.valid_pairs]
        translator = Translator(self.model, self.tokenizer, self.device, beam=1)
        with self._autocast():
            hypotheses = translator.translate(sources)
        scores = sacrebleu_scores(hypotheses, references, lowercase=self.tokenizer.lowercases)
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    def _track_best(self, metrics: dict[str, Any]) -> None:
        """Keep best/ by the chosen metric and count validations without improvement."""
        name = self.config.train.best_metric
        if name not in metrics:
            name = "loss"
        score = -metrics[name] if name == "loss" else metrics[name]
        score = dist.broadcast_float(score)
        if self.state.best is None or score > self.state.best:
            self.state.best, self.state.bad_validations = score, 0
            self.save(self.out / BEST_DIR)
        else:
            self.state.bad_validations += 1
            patience = self.config.train.patience
            if patience and self.state.bad_validations >= patience:
                self.state.stopped_early = True
                self.log(f"early stop: {patience} validations without a better {name}")

    # --- reporting ------------------------------------------------------------------------------------
    def _padding(self) -> float:
        batches = self.sampler.batches(self.sampler.epoch)[:200]
        examples = self.sampler.examples_of(self.sampler.epoch)
        return padding_share(collate([examples[i] for i in b]) for b in batches)

    def _progress_bar(self):
        from tqdm import tqdm

        cfg = self.config.train
        steps_per_epoch = math.ceil(len(self.sampler) / self.config.optim.accum_steps)
        by_epochs = cfg.max_epochs * steps_per_epoch if cfg.max_epochs else None
        total = min(filter(None, (cfg.max_steps, by_epochs)), default=None)  # for the ETA
        return tqdm(
            total=total,
            initial=self.state.step,
            disable=not self.progress,
            unit="step",
            dynamic_ncols=True,
            leave=False,
        )

    def _log_train(self, meter: "_Meter") -> None:
        values = meter.flush()
        values["lr"] = self._lr()
        self._record(split="train", **values)

    def _record(self, split: str, **values: Any) -> None:
        record = {"step": self.state.step, "epoch": self.sampler.epoch, "split": split, **values}
        shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items())
        self.log(shown)
        if self.rank == 0:
            with open(self.out / METRICS_FILE, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
            self._write_tensorboard(split, values)

    def _write_tensorboard(self, split: str, values: dict[str, Any]) -> None:
        """TensorBoard events under RUN/tensorboard when the tensorboard package is installed."""
        if self._tensorboard is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self._tensorboard = False
                return
            self._tensorboard = SummaryWriter(str(self.out / "tensorboard"))
        if self._tensorboard:
            for key, value in values.items():
                self._tensorboard.add_scalar(f"{split}/{key}", value, self.state.step)
            self._tensorboard.flush()


class _Meter:
    """Running sums between two log lines; tokens/s counts real target tokens."""

    def __init__(self) -> None:
        self.loss = self.nll = self.tokens = 0.0
        self.start = time.perf_counter()

    def add(self, loss: float, nll: float, tokens: float) -> None:
        self.loss, self.nll, self.tokens = self.loss + loss, self.nll + nll, self.tokens + tokens

    def postfix(self, lr: float) -> str:
        if not self.tokens:
            return ""
        rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
        return f"loss={self.loss / self.tokens:.3f} lr={lr:.2e} tok/s={rate:,.0f}"

    def flush(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        tokens = max(self.tokens, 1.0)
        values = {
            "loss": self.loss / tokens,
            "ppl": math.exp(min(self.nll / tokens, 50.0)),
            "tokens_per_s": self.tokens / elapsed,
        }
        self.__init__()
        return values


# --- helpers -----------------------------------------------------------------------------------------


def _write(message: str) -> None:
    """Print a log line without tearing the progress bar."""
    from tqdm import tqdm

    tqdm.write(message)


def _changed_settings(saved: RunConfig, new: RunConfig) -> list[str]:
    """``section.key saved -> new`` for each model, data and optim setting that differs, data.dir aside."""
    old, now = saved.to_dict(), new.to_dict()
    old["model"], now["model"] = (
        c.model_config(vocab_size=64).to_dict() for c in (saved, new)
    )  # presets resolved
    keys = [
        (section, key)
        for section in ("model", "data", "optim")
        for key in sorted(set(old[section]) | set(now[section]))
        if (section, key) != ("data", "dir")
    ]
    return [
        f"{section}.{key} {old[section].get(key)!r} -> {now[section].get(key)!r}"
        for section, key in keys
        if old[section].get(key) != now[section].get(key)
    ]


def _data_path(directory: str) -> Path:
    if not directory:
        raise UserError("config data.dir is empty: give --data-dir or set data.dir")
    path = Path(directory).expanduser()
    if not path.exists():
        raise UserError(f"data directory not found: {path}")
    if not path.is_dir():  # one file is one split: validating on it would score the training data
        raise UserError(
            f"data.dir {path} is a file; training reads a directory with a {{split}}.{{lang}} file "
            "per split and language (train and validation kept apart)"
        )
    return path


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _seed_dropout(seed: int, rank: int, step: int) -> None:
    """Give each process of a multi-process run its own dropout masks, on the same initial weights.

    Rank 0 keeps the stream it has: a one-process run's, saved in checkpoints and restored exactly.
    The other ranks reseed before every optimizer step from (seed, rank, step), so that they draw
    other masks than rank 0 and than each other, and a resumed run draws the masks an
    uninterrupted one would (their streams are not in the checkpoint).
    """
    if rank > 0:
        torch.manual_seed(int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0]))


def _rng_states() -> dict[str, Any]:
    py_version, py_state, py_gauss = random.getstate()
    np_state = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(_plain, np_state[2:])],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    version, state, gauss = states["python"]
    random.setstate((version, tuple(state), gauss))
    name, keys, *rest = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])


def _count_lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines()) if path.is_file() else 0


def _truncate_metrics(path: Path, n_lines: int) -> None:
    """Drop the log records written after the checkpoint a run resumes from."""
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) > n_lines:  # rewritten aside, then renamed: a kill midway leaves the old log whole
        part = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        part.write_text("".join(line + "\n" for line in lines[:n_lines]), encoding="utf-8")
        os.replace(part, path)
