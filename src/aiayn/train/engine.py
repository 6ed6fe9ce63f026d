"""One training engine for every task: the loop, gradient accumulation, clipping, precision, the
learning-rate hook, checkpoints, exact resume, early stopping with ``best/``, the metrics log, DDP.

A task (translation: :class:`aiayn.train.translation.TranslationTask`; forecasting:
:class:`aiayn.forecast.train.ForecastTask`) hands the engine a :class:`Task`: its settings (its
config's ``train`` section, an :class:`EngineConfig`), its model, its batches epoch by epoch, its
loss, its learning rate, its validation metrics (and which one picks ``best/``), and what a
checkpoint stores. Every task is built from its config and run the same way::

    task = TranslationTask(config)        # or ForecastTask.from_config(training): nothing built yet
    metrics = train(task, out)            # Engine(task.settings, out).run(task)

The engine sets up the processes, the device, the precision and the seeds, and finds the checkpoint
to resume; then the task builds itself on that device (:meth:`Task.setup`), the engine adds the
optimizer, DDP and the weight average and restores the checkpoint (:meth:`Engine.start`), and trains
until the budget is spent or patience runs out.

A run directory holds::

    checkpoints/step-NNNNNNNN/   the last ``keep_last`` checkpoints (see aiayn.checkpoint)
    best/                        the checkpoint with the best validation metric
    metrics.jsonl                one JSON record per log line / validation
    run.yaml                     the resolved run configuration
    data/                        a plain-text corpus prepared for the run (translation; aiayn.data.prepare)

Exact resume: a checkpoint stores the weights, the optimizer, the step, the epoch and position in
the batch order, the RNG states (torch, Python, NumPy), the best score, the patience counter, the
weight average and the task's own state. A run killed at any moment and restarted from its last
checkpoint follows the trajectory of an uninterrupted run (bit-identical weights on CPU in fp32), as
long as the task's batches depend only on (seed, epoch). The one exception is a learning rate that
follows ``max_hours``: it follows the wall clock, so no two such runs are identical, resumed or not.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np
import torch
import yaml
from torch import Tensor, nn

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
from aiayn.config import Checked, seed_setting, setting
from aiayn.errors import Setting, SettingError, UserError
from aiayn.io import atomic_write
from aiayn.precision import PRECISIONS, autocast, resolve_precision
from aiayn.train import distributed as dist

METRICS_FILE, RUN_CONFIG_FILE = "metrics.jsonl", "run.yaml"


@dataclass
class EngineConfig(Checked):
    """How the engine trains, whatever the task: the fields every task's ``train`` section shares, with
    one set of names and defaults. A task's section is a subclass that adds what is its own."""

    seed: int = seed_setting()
    device: str = "auto"  #: "auto" (a GPU when there is one), "cpu", "cuda", "cuda:N"
    #: "auto" (bf16 where the hardware has it natively), "bf16" or "fp32"
    precision: str = setting("auto", choices=PRECISIONS)
    max_steps: int = setting(0, ge=0)  #: stop after this many optimizer steps (0 = no limit)
    max_epochs: int = setting(0, ge=0)  #: stop after this many epochs (0 = no limit)
    #: stop after this much training time, summed over resumes (0 = no limit)
    max_hours: float = setting(0.0, ge=0)
    accum_steps: int = setting(1, gt=0)  #: batches accumulated per optimizer step
    clip_norm: float = setting(0.0, ge=0)  #: gradient-norm clipping (0 = off)
    #: validate (and keep as best) an exponential moving average of the weights, this decay per step; 0 = off
    ema: float = setting(0.0, ge=0, lt=1)
    log_every: int = setting(50, ge=0)  #: a train record every N steps (0 = none)
    valid_every: int = setting(1000, ge=0)  #: validate every N steps (0 = not on a step cadence)
    valid_at_epoch_end: bool = True  #: also validate when an epoch ends
    save_every: int = setting(1000, ge=0)  #: checkpoint every N steps (and at the end; 0: not on a cadence)
    save_at_epoch_end: bool = False  #: also checkpoint when an epoch ends
    keep_last: int = setting(5, ge=0)  #: checkpoints kept (0 = all)
    patience: int = setting(0, ge=0)  #: stop after this many validations without improvement (0 = off)
    #: with several processes, each keeps the optimizer's state (Adam's moments) for its share of the
    #: weights only (ZeRO stage 1): half that memory per process on two, the same updates, bit for bit
    shard_optimizer: bool = False

    def budget(self) -> bool:
        """Whether a limit is set (max_steps, max_epochs or max_hours): a run needs one."""
        return bool(self.max_steps or self.max_epochs or self.max_hours)


@dataclass
class TrainState:
    """Everything besides weights, optimizer and batch position that a resumed run needs."""

    step: int = 0
    metrics_lines: int = 0  # records in metrics.jsonl when the checkpoint was written
    best: float | None = None  # the best validation score, signed so that higher is better
    bad_validations: int = 0  # validations since the best one (patience)
    stopped_early: bool = False
    hours: float = 0.0  # training wall-clock time so far, summed over resumes (max_hours)
    validated_at: int = -1  # the step of the last validation (none twice at one step, resumed or not)


@dataclass
class Loss:
    """One batch's loss: ``value`` to backpropagate, summed values to log, and the batch's ``weight``.

    A step's gradient is that of its batches' summed values divided by their summed weights over
    every process: the per-token mean for a summed token loss weighted by its token count, the mean
    of the batches' means for a mean loss of weight 1.
    """

    value: Tensor
    logged: dict[str, Tensor] = field(default_factory=dict)
    weight: float = 1.0


class Batches(Protocol):
    """A task's training batches, epoch after epoch, resumable from a position within an epoch."""

    epoch: int
    position: int  # batches of this epoch already served

    def __len__(self) -> int: ...  # batches in the current epoch

    def __iter__(self) -> Iterator[Any]: ...  # the rest of this epoch; then the next one begins

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class EpochBatches:
    """:class:`Batches` from ``batches_of(epoch)``, which must depend only on the epoch (and a seed)."""

    def __init__(self, batches_of: Callable[[int], Sequence[Any]]) -> None:
        self.batches_of = batches_of
        self.epoch, self.position = 0, 0
        self._cache: tuple[int, Sequence[Any]] | None = None

    def _current(self) -> Sequence[Any]:
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = (self.epoch, self.batches_of(self.epoch))
        return self._cache[1]

    def __len__(self) -> int:
        return len(self._current())

    def __iter__(self) -> Iterator[Any]:
        batches = self._current()
        while self.position < len(batches):
            self.position += 1
            yield batches[self.position - 1]
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class Task:
    """What a task gives the :class:`Engine`.

    A subclass sets ``kind`` and ``settings``; its :meth:`setup` builds ``model`` (trained, validated,
    stored), ``objective`` (the module :meth:`loss` calls, usually the model or a loss around it;
    several processes wrap it in DDP) and ``batches`` on the engine's device. It implements the
    methods that raise ``NotImplementedError``; the others have defaults.
    """

    kind: str  #: the checkpoint kind ("translation", "forecast"): another kind's run directory is refused
    settings: EngineConfig  #: how the engine trains it (the task config's ``train`` section)
    restore_best: bool = False  #: the model holds the best validated weights when the run ends
    engine: "Engine"  #: set by :meth:`Engine.start`, before :meth:`setup`
    model: nn.Module
    objective: nn.Module
    batches: Batches
    tokenizer_bytes: bytes | None = None  # stored in each checkpoint when set

    def setup(self, engine: "Engine") -> None:
        """Build what the task trains on ``engine``'s device (``engine.resumed``: the checkpoint the run
        resumes, or None): ``model``, ``objective``, ``batches``."""
        raise NotImplementedError

    @property
    def state(self) -> "TrainState":
        """The engine's step, best score and patience counter."""
        return self.engine.state

    def make_optimizer(self, parameters: Iterator[nn.Parameter]) -> torch.optim.Optimizer:
        raise NotImplementedError

    def loss(self, objective: nn.Module, batch: Any) -> Loss:
        """Forward one batch (the engine sets train mode, autocast and DDP's no_sync around it)."""
        raise NotImplementedError

    def learning_rate(self, step: int, epoch: int, progress: float) -> float:
        """The rate for optimizer step ``step`` (from 1) in ``epoch``; ``progress``: the budget's spent
        fraction."""
        raise NotImplementedError

    def validate(self) -> dict[str, float]:
        raise NotImplementedError

    def selection(self, metrics: dict[str, float]) -> tuple[str, bool]:
        """The metric that picks ``best/``, and whether higher is better."""
        raise NotImplementedError

    def checkpoint_config(self) -> dict[str, Any]:
        """config.json of a checkpoint: ``kind``, ``model`` (its config) and the run's settings."""
        raise NotImplementedError

    def run_config(self) -> dict[str, Any]:
        """What run.yaml holds."""
        raise NotImplementedError

    def describe(self) -> str:
        """Facts about the data for the first log line (may be empty)."""
        return ""

    def train_record(self, loss: float, logged: dict[str, float], weight: float, seconds: float) -> dict:
        """The logged train values from the sums since the last record."""
        return {"loss": loss / max(weight, 1.0)}

    def validated(self, metrics: dict[str, float], improved: bool) -> None:
        """Called after each validation (``improved``: it made a new best/)."""

    def state_dict(self) -> dict[str, Any] | None:
        """The task's own resumable state (JSON values and tensors), if any."""
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict` (None: the checkpoint holds none)."""


class Engine:
    """Trains a :class:`Task`; see the module docstring for the run directory and exact resume."""

    def __init__(
        self,
        settings: EngineConfig,
        out: str | Path | None,
        log: Callable[[str], None] | None = None,
        progress: bool = True,
    ) -> None:
        """Processes, device, precision and seeds; ``resumed`` is the run's latest checkpoint (or None).

        ``out`` None: nothing is written (no checkpoints, no log file). ``progress``: a progress bar
        when stderr is a terminal.
        """
        self.settings, self.out = settings, Path(out) if out is not None else None
        self.rank, self.world_size = dist.setup()
        self.device = dist.pick_device(settings.device)
        self.precision = resolve_precision(settings.precision, self.device)
        self.log = (log or _write) if self.rank == 0 else _silent
        self.progress = progress and self.rank == 0 and sys.stderr.isatty()
        seed_everything(settings.seed)
        latest = latest_checkpoint(self.out) if self.out is not None else None
        self.resumed: Checkpoint | None = load_checkpoint(latest) if latest is not None else None
        self.state = TrainState()
        self.meter = _Meter()  # the train record's sums since the last one (kept in checkpoints)
        self.task: Task | None = None
        self.average: WeightAverage | None = None
        self._best_weights: dict[str, Tensor] | None = None  # with the task's restore_best
        self._saved_at: tuple[int, int] | None = None  # (step, validated_at) of the last checkpoint
        self._clock = time.perf_counter()  # state.hours counts from here (reset when the loop starts)
        self._hours = 0.0  # state.hours as rank 0 counts them (what max_hours and the lr follow)
        self._tensorboard = None  # a SummaryWriter once the first record is written, if installed

    def start(self, task: Task) -> Task:
        """Let ``task`` build itself here, then build the optimizer (over the DDP-wrapped objective) and
        restore the checkpoint to resume. A run directory holding another kind of run is refused first."""
        if self.out is not None:
            _check_run_dir(self.out, self.resumed, task.kind)
        self.task, task.engine = task, self
        task.setup(self)
        self.objective = dist.wrap(task.objective, self.device)
        self.optimizer = task.make_optimizer(self.objective.parameters())
        if self.settings.shard_optimizer and self.world_size > 1:
            self.optimizer = dist.shard(self.optimizer)
            self.log(f"optimizer state split between the {self.world_size} processes (ZeRO stage 1)")
        saved: dict[str, Any] = {}
        if self.resumed is not None:
            saved = self._resume(self.resumed)
        if self.settings.ema:
            self.average = WeightAverage(
                task.model, self.settings.ema, saved.get("average"), saved.get("average_updates", 0)
            )
        self._hours = self.state.hours
        return task

    # --- resume ---------------------------------------------------------------------------------------
    def _resume(self, ckpt: Checkpoint) -> dict[str, Any]:
        path, saved = ckpt.path, ckpt.train_state
        self.log(f"resuming from {path}")
        if saved is None:
            raise UserError(f"{path} holds no training state; cannot resume from it")
        self._check_average(saved, path)
        load_weights(self.task.model, ckpt.weights, path)
        self.optimizer.load_state_dict(saved["optimizer"])
        self.task.batches.load_state_dict(saved["sampler"])
        self.task.load_state_dict(saved.get("task"))
        self.state = TrainState(**saved["trainer"])
        self.meter.load_state_dict(saved.get("meter"))
        set_rng_states(saved["rng"])  # rank 0's, as saved (ranks after 0 reseed at every step: _step)
        if self.task.restore_best and self.state.best is not None:
            self._best_weights = load_checkpoint(self.out / BEST_DIR, with_state=False).weights
        if self.rank == 0:
            truncate_lines(self.out / METRICS_FILE, self.state.metrics_lines)
        dist.barrier()  # no rank appends before the file is cut back
        batches = self.task.batches
        self.log(
            f"resumed at step {self.state.step}, epoch {batches.epoch + 1}, "
            f"batch {batches.position} of {len(batches)}"
        )
        return saved

    def _check_average(self, saved: dict[str, Any], path: Path) -> None:
        """best/ and its score were measured on the average (or on the weights): no silent switch."""
        had = saved.get("average") is not None
        if had != bool(self.settings.ema):
            raise SettingError(
                f"{path} was trained {'with' if had else 'without'} a weight average (train.ema); "
                "resume with the same setting, or train into a new ",
                Setting("run_dir"),
            )

    # --- checkpoints ----------------------------------------------------------------------------------
    def save(self, directory: Path | None = None) -> Path | None:
        """Write a checkpoint of the current state (rank 0 only), by default into checkpoints/."""
        if self.out is None:
            return None
        path = directory or self.out / CHECKPOINTS_DIR / checkpoint_name(self.state.step)
        self._tick()  # the checkpoint carries the time spent up to now
        optimizer = dist.optimizer_state(self.optimizer)  # every rank takes part; rank 0 gets it whole
        if self.rank == 0:
            self.state.metrics_lines = _count_lines(self.out / METRICS_FILE)
            config = {**self.task.checkpoint_config(), "step": self.state.step}
            state = self._train_state(optimizer)
            save_checkpoint(path, self.task.model, config, self.task.tokenizer_bytes, state)
            if directory is None:
                prune_checkpoints(self.out, self.settings.keep_last)
        dist.barrier()
        if directory is None:
            self._saved_at = (self.state.step, self.state.validated_at)
        return path

    def _train_state(self, optimizer: dict[str, Any]) -> dict[str, Any]:
        state = {
            "optimizer": optimizer,
            "sampler": self.task.batches.state_dict(),
            "trainer": vars(self.state).copy(),
            "meter": self.meter.state_dict(),
            "rng": rng_states(),
        }
        if self.average is not None:
            state.update(average=self.average.average, average_updates=self.average.updates)
        task_state = self.task.state_dict()
        if task_state is not None:
            state["task"] = task_state
        return state

    # --- the loop -------------------------------------------------------------------------------------
    def run(self, task: Task) -> dict[str, Any]:
        """Train ``task`` (started here unless :meth:`start` was called) until a budget is spent or
        patience runs out; return the last validation metrics."""
        if not self.settings.budget():
            steps, epochs, hours = (
                Setting(f"train.{name}") for name in ("max_steps", "max_epochs", "max_hours")
            )
            raise SettingError("a run needs a budget: set ", steps, ", ", epochs, " or ", hours)
        if self.task is not task:
            self.start(task)
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            if self.rank == 0:
                run_yaml = yaml.safe_dump(self.task.run_config(), sort_keys=False)
                (self.out / RUN_CONFIG_FILE).write_text(run_yaml, encoding="utf-8")
        about = self.task.describe()
        self.log(
            f"{len(self.task.batches)} batches per epoch{', ' + about if about else ''}, "
            f"device {self.device}, {self.precision}, {self.world_size} process(es)"
        )
        metrics = self._loop()
        if self.state.validated_at != self.state.step:
            metrics = self._validate()
        if self._saved_at != (self.state.step, self.state.validated_at):
            self.save()
        if self._best_weights is not None:
            load_weights(self.task.model, self._best_weights)
        return metrics

    def _loop(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        meter = self.meter
        meter.start = time.perf_counter()
        bar = self._progress_bar()
        self._clock = time.perf_counter()
        while not self._done():
            epoch = self.task.batches.epoch
            for batches in self._optimizer_steps():
                self._step(batches, meter)
                bar.update(1)
                if self.progress:
                    bar.set_postfix_str(self._postfix(meter), refresh=False)
                metrics = self._after_step(meter) or metrics
                if self._done():
                    break
            if self.task.batches.epoch != epoch:
                metrics = self._after_epoch() or metrics
        bar.close()
        return metrics

    def _after_step(self, meter: "_Meter") -> dict[str, Any] | None:
        """The step cadences: a train record, a validation, a checkpoint."""
        settings, step, metrics = self.settings, self.state.step, None
        if settings.log_every and step % settings.log_every == 0:
            self._record("train", **self._train_values(meter, reset=True))
        if settings.valid_every and step % settings.valid_every == 0:
            metrics = self._validate()
        if settings.save_every and step % settings.save_every == 0:
            self.save()
        return metrics

    def _after_epoch(self) -> dict[str, Any] | None:
        metrics = None
        if self.settings.valid_at_epoch_end and self.state.validated_at != self.state.step:
            metrics = self._validate()
        if self.settings.save_at_epoch_end and self._saved_at != (self.state.step, self.state.validated_at):
            self.save()
        return metrics

    def _done(self) -> bool:
        settings = self.settings
        return bool(
            self.state.stopped_early
            or (settings.max_steps and self.state.step >= settings.max_steps)
            or (settings.max_epochs and self.task.batches.epoch >= settings.max_epochs)
            or self._out_of_time()
        )

    def _tick(self) -> None:
        """Add the time since the last tick to ``state.hours`` (steps, validations, checkpoints)."""
        now = time.perf_counter()
        self.state.hours += (now - self._clock) / 3600
        self._clock = now

    def _out_of_time(self) -> bool:
        """max_hours spent (rank 0's clock decides, so every rank stops at the same step)."""
        self._tick()
        hours = self.settings.max_hours
        if hours:
            self._hours = dist.broadcast_float(self.state.hours)
        return bool(hours) and self._hours >= hours

    def _progress(self) -> float:
        """The fraction of the budget spent: the largest of steps/max_steps, hours/max_hours and
        epochs/max_epochs (the limit that will stop the run first)."""
        settings, batches = self.settings, self.task.batches
        spent = [self.state.step / settings.max_steps] if settings.max_steps else []
        if settings.max_hours:
            spent.append(self._hours / settings.max_hours)
        if settings.max_epochs:
            spent.append((batches.epoch + batches.position / len(batches)) / settings.max_epochs)
        return max(spent, default=0.0)

    def _optimizer_steps(self) -> Iterator[list[Any]]:
        """Groups of ``accum_steps`` batches for one optimizer step, to the end of the epoch."""
        group: list[Any] = []
        for batch in self.task.batches:
            group.append(batch)
            if len(group) == self.settings.accum_steps:
                yield group
                group = []
        if group:
            yield group

    def _step(self, batches: list[Any], meter: "_Meter") -> None:
        """One optimizer step over ``accum_steps`` batches: gradients, normalisation, clipping, update."""
        seed_dropout(self.settings.seed, self.rank, self.state.step)
        meter.add(*self.accumulate_gradients(batches))
        if self.settings.clip_norm > 0:
            nn.utils.clip_grad_norm_(self.task.model.parameters(), self.settings.clip_norm)
        self.state.step += 1
        for group in self.optimizer.param_groups:
            group["lr"] = self._lr()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.average is not None:
            self.average.update()

    def accumulate_gradients(self, batches: list[Any]) -> tuple[float, dict[str, float], float]:
        """Backward over ``batches``; leave the gradient of the summed losses divided by the summed
        weights of the whole (global) batch. Returns the global (loss sum, logged sums, weight sum)."""
        self.objective.train()
        loss_sum = torch.zeros((), device=self.device)
        logged: dict[str, Tensor] = {}
        weight = 0.0
        for i, batch in enumerate(batches):
            with dist.no_sync(self.objective, enabled=i < len(batches) - 1), self.autocast():
                loss = self.task.loss(self.objective, batch)
            loss.value.backward()
            loss_sum = loss_sum + loss.value.detach()
            for name, value in loss.logged.items():
                logged[name] = logged.get(name, torch.zeros((), device=self.device)) + value.detach()
            weight += loss.weight
        local = torch.stack([loss_sum, *logged.values(), torch.tensor(weight, device=self.device)])
        totals = dist.all_reduce_sum(local).tolist()  # over processes
        # DDP averages gradients over ranks; scaling by world/weight gives the mean of the global batch.
        scale = self.world_size / totals[-1]
        if scale != 1.0:
            grads = [p.grad for p in self.task.model.parameters() if p.grad is not None]
            torch._foreach_mul_(grads, scale)
        return totals[0], dict(zip(logged, totals[1:-1])), totals[-1]

    def _lr(self) -> float:
        return self.task.learning_rate(self.state.step, self.task.batches.epoch, self._progress())

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast when the run's precision is bf16, else nothing."""
        return autocast(self.device, self.precision)

    # --- validation -----------------------------------------------------------------------------------
    @torch.no_grad()
    def _validate(self) -> dict[str, Any]:
        """The task's metrics, on the weight average when there is one; best/ and patience follow."""
        with self.average.swapped_in() if self.average is not None else contextlib.nullcontext():
            metrics = self.task.validate()
            self.state.validated_at = self.state.step
            self._record("valid", **metrics)
            improved = self._track_best(metrics)
        self.task.validated(metrics, improved)
        return metrics

    def _track_best(self, metrics: dict[str, Any]) -> bool:
        """Keep best/ by the task's metric and count validations without improvement."""
        name, higher_is_better = self.task.selection(metrics)
        score = dist.broadcast_float(metrics[name] if higher_is_better else -metrics[name])
        if self.state.best is None or score > self.state.best:
            self.state.best, self.state.bad_validations = score, 0
            if self.out is not None:
                self.save(self.out / BEST_DIR)
            if self.task.restore_best:
                self._best_weights = {k: v.detach().clone() for k, v in self.task.model.state_dict().items()}
            return True
        self.state.bad_validations += 1
        patience = self.settings.patience
        if patience and self.state.bad_validations >= patience:
            self.state.stopped_early = True
            self.log(f"early stop: {patience} validations without a better {name}")
        return False

    # --- reporting ------------------------------------------------------------------------------------
    def _progress_bar(self):
        from tqdm import tqdm

        settings = self.settings
        steps_per_epoch = math.ceil(len(self.task.batches) / settings.accum_steps)
        by_epochs = settings.max_epochs * steps_per_epoch if settings.max_epochs else None
        total = min(filter(None, (settings.max_steps, by_epochs)), default=None)  # for the ETA
        return tqdm(
            total=total,
            initial=self.state.step,
            disable=not self.progress,
            unit="step",
            dynamic_ncols=True,
            leave=False,
        )

    def _train_values(self, meter: "_Meter", reset: bool) -> dict[str, Any]:
        values = self.task.train_record(meter.loss, meter.logged, meter.weight, meter.seconds())
        values["lr"] = self._lr()
        if reset:
            meter.reset()
        return values

    def _postfix(self, meter: "_Meter") -> str:
        if not meter.weight:
            return ""
        values = self._train_values(meter, reset=False)
        return " ".join(f"{k}={v:.3g}" for k, v in values.items())

    def _record(self, split: str, **values: Any) -> None:
        record = {"step": self.state.step, "epoch": self.task.batches.epoch, "split": split, **values}
        shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items())
        self.log(shown)
        if self.rank == 0 and self.out is not None:
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
    """Running sums between two train records."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss, self.logged, self.weight = 0.0, {}, 0.0
        self.start = time.perf_counter()

    def add(self, loss: float, logged: dict[str, float], weight: float) -> None:
        self.loss, self.weight = self.loss + loss, self.weight + weight
        self.logged = {k: self.logged.get(k, 0.0) + v for k, v in logged.items()}

    def seconds(self) -> float:
        return max(time.perf_counter() - self.start, 1e-9)

    def state_dict(self) -> dict[str, Any]:
        """The sums (a resumed run's first record covers the same steps as an uninterrupted one's)."""
        return {"loss": self.loss, "logged": self.logged, "weight": self.weight}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            self.loss, self.logged, self.weight = state["loss"], dict(state["logged"]), state["weight"]


class WeightAverage:
    """An exponential moving average of a model's floating-point weights: avg <- d·avg + (1-d)·w per step.

    The decay warms up as min(decay, (1 + t) / (10 + t)) at update t, so that the first epochs'
    average is not dominated by the random initial weights.
    """

    def __init__(
        self, model: nn.Module, decay: float, average: dict[str, Tensor] | None = None, updates: int = 0
    ) -> None:
        self.model, self.decay, self.updates = model, decay, updates
        state = model.state_dict()
        self.average = {  # a restored average (read on the CPU) joins the weights' device
            k: (average[k] if average else v.detach()).to(v.device, copy=not average)
            for k, v in state.items()
        }
        self._pairs = [(self.average[k], v) for k, v in state.items() if v.is_floating_point()]

    @torch.no_grad()
    def update(self) -> None:
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        averages, weights = zip(*self._pairs)
        torch._foreach_lerp_(list(averages), list(weights), 1.0 - decay)
        self.updates += 1

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model holds the average inside the block, its own weights again after it."""
        own = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(self.average)
        try:
            yield
        finally:
            self.model.load_state_dict(own)


LEGACY_LAST_DIR = "last"  # forecasting runs before the one run-directory layout kept their state here


def _check_run_dir(out: Path, resumed: Checkpoint | None, kind: str) -> None:
    """Refuse to train into a directory holding another kind of run, or an old-layout run."""
    if resumed is not None and resumed.kind != kind:
        raise SettingError(
            f"{out} holds a {resumed.kind} run, not a {kind} run: give a new ", Setting("run_dir")
        )
    if resumed is None and (out / LEGACY_LAST_DIR).is_dir():
        raise SettingError(
            f"{out / LEGACY_LAST_DIR} is a run in aiayn's earlier forecasting layout, which cannot be "
            "resumed (evaluate, predict and plot still read its best/): train into a new ",
            Setting("run_dir"),
        )


def train(
    task: Task, out: str | Path | None, log: Callable[[str], None] | None = None, progress: bool = True
) -> dict[str, Any]:
    """Run ``task`` into the run directory ``out`` (``run_dir`` in errors; None: write nothing) on an
    engine of its settings;
    the last validation metrics. The task holds the trained model, ``task.engine`` the run's state."""
    return Engine(task.settings, out, log, progress).run(task)


def start(
    task: Task, out: str | Path | None, log: Callable[[str], None] | None = None, progress: bool = True
) -> Task:
    """``task`` set up on an engine of its settings, resumed where ``out`` holds a run, not yet trained
    (``task.engine.run(task)`` trains it)."""
    Engine(task.settings, out, log, progress).start(task)
    return task


def refuse_other_run(out: Path, changes: list[str], may_change: str) -> None:
    """The resume check of every task: ``changes`` (``"section.key old -> new"``) refuse the resume."""
    if changes:
        raise SettingError(
            f"{out} holds a run with other settings ({'; '.join(changes)}): resume it with the same "
            f"{may_change}, or give a new ",
            Setting("run_dir"),
        )


# --- helpers -----------------------------------------------------------------------------------------


def _write(message: str) -> None:
    """Print a log line without tearing the progress bar."""
    from tqdm import tqdm

    tqdm.write(message)


def _silent(_message: str) -> None:
    """The log of processes after rank 0."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def seed_dropout(seed: int, rank: int, step: int) -> None:
    """Give each process of a multi-process run its own dropout masks, on the same initial weights.

    Rank 0 keeps the stream it has: a one-process run's, saved in checkpoints and restored exactly.
    The other ranks reseed before every optimizer step from (seed, rank, step), so that they draw
    other masks than rank 0 and than each other, and a resumed run draws the masks an
    uninterrupted one would (their streams are not in the checkpoint).
    """
    if rank > 0:
        torch.manual_seed(int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0]))


def rng_states() -> dict[str, Any]:
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


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    version, state, gauss = states["python"]
    random.setstate((version, tuple(state), gauss))
    name, keys, *rest = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])


def _count_lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines()) if path.is_file() else 0


def truncate_lines(path: Path, n_lines: int) -> None:
    """Drop the records a log got after the checkpoint a run resumes from (the file replaced whole)."""
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) > n_lines:
        atomic_write(path, "".join(line + "\n" for line in lines[:n_lines]))
