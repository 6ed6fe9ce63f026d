"""Forecasting as a task of the training engine (:mod:`aiayn.train.engine`).

:func:`fit` trains with AdamW at a learning rate decayed once per epoch, on the training windows in
an order seeded by (seed, epoch); it validates the MSE after every epoch (on an exponential moving
average of the weights with ``ema``), keeps the best weights in ``best/``, stops after ``patience``
epochs without a better validation MSE and leaves the best weights in the model. With a run directory
it writes the engine's layout (a checkpoint in ``checkpoints/`` after every epoch, ``best/``,
``metrics.jsonl``, ``run.yaml``) and resumes from it, exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

from aiayn.config import Checked, from_mapping, setting
from aiayn.forecast.data import Windows
from aiayn.forecast.metrics import evaluate
from aiayn.train.engine import (
    Engine,
    EpochBatches,
    Loss,
    Settings,
    Task,
    WeightAverage,
    refuse_other_run,
)

__all__ = ["FitState", "TrainConfig", "WeightAverage", "evaluate", "fit"]

LOSSES = ("mse", "mae")


@dataclass
class TrainConfig(Checked):
    """Optimisation settings (AdamW, constant or per-epoch decayed learning rate)."""

    batch_size: int = setting(128, ge=1)
    lr: float = setting(1e-4, gt=0)
    lr_decay: float = setting(1.0, gt=0)  #: multiply the learning rate by this after every epoch
    weight_decay: float = setting(0.0, ge=0)
    max_epochs: int = setting(10, ge=1)
    patience: int = setting(3, ge=1)  #: stop after this many epochs without a better validation MSE
    seed: int = setting(0, ge=0, le=2**32 - 1)  # NumPy's seeds are 32-bit
    bf16: bool = False  #: bf16 autocast for the forward pass; the loss stays fp32
    #: "cpu", "cuda", "cuda:N" or "auto" (a GPU when there is one); not part of the recipe: a run
    #: may resume on another device
    device: str = "cpu"
    max_steps_per_epoch: int = setting(0, ge=0)  #: 0 = every training window once per epoch
    #: With a channel-independent model: each step trains on a random subset of at most this many
    #: variables (the same for the batch's windows), so that a wide file (hundreds of variables)
    #: costs per step what a narrow one does; 0 = every variable. Validation always scores them all.
    channels_per_step: int = setting(0, ge=0)
    grad_clip: float = setting(0.0, ge=0)  #: 0 = no clipping
    #: Validate (and keep as best) an exponential moving average of the weights, this decay per step; 0 = off.
    ema: float = setting(0.0, ge=0, lt=1)
    #: The training loss: "mse" (squared error) or "mae" (absolute error: a large error weighs in
    #: proportion, not squared). Validation, early stopping and the reported scores are MSE either way.
    loss: str = setting("mse", choices=LOSSES)
    log_every: int = setting(50, ge=0)  #: a train record every N steps (0 = none)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        return from_mapping(cls, values)


@dataclass
class FitState:
    """What :func:`fit` reports: epochs done, the best validation MSE, epochs since it, a record per epoch."""

    epoch: int = 0
    best_val: float = math.inf
    bad_epochs: int = 0
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)


def engine_settings(cfg: TrainConfig) -> Settings:
    """The engine's settings for forecasting: an epoch is the unit of validation, saving and patience."""
    return Settings(
        seed=cfg.seed,
        device=cfg.device,
        precision="bf16" if cfg.bf16 else "fp32",
        max_epochs=cfg.max_epochs,
        clip_norm=cfg.grad_clip,
        ema=cfg.ema,
        log_every=cfg.log_every,
        valid_every=0,
        valid_at_epoch_end=True,
        save_every=0,
        save_at_epoch_end=True,
        keep_last=1,
        patience=cfg.patience,
        restore_best=True,
    )


def fit(
    model: nn.Module,
    train: Windows,
    val: Windows,
    outputs: list[int],
    cfg: TrainConfig,
    run_dir: str | Path | None = None,
    run_config: dict[str, Any] | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> FitState:
    """Train with early stopping on ``val``; with ``run_dir``, checkpoint every epoch and resume.

    ``run_config`` (``model``, ``data``, ``scaler``, ``train``) is stored in each checkpoint; a
    resumed run must have the stored ``model``. At the end the model holds the best validation weights.
    """
    engine = Engine(engine_settings(cfg), run_dir, log, progress, kind="forecast")
    run_config = run_config or {"train": dataclasses.asdict(cfg)}
    if engine.resumed is not None:
        changes = _changed_model(engine.resumed.config.get("model"), run_config.get("model"))
        refuse_other_run(engine.out, changes, "model settings (train.* may change)")
    model.to(engine.device)
    train, val = train.to(engine.device), val.to(engine.device)
    task = ForecastTask(model, train, val, outputs, cfg, run_config, engine.log)
    engine.attach(task)
    engine.run()
    best = -engine.state.best if engine.state.best is not None else math.inf
    return FitState(task.batches.epoch, best, engine.state.bad_validations, task.history)


def _changed_model(saved: dict[str, Any] | None, new: dict[str, Any] | None) -> list[str]:
    if new is None:  # fit() without a run config: the model is the caller's to match
        return []
    saved = saved if isinstance(saved, dict) else {}
    keys = [k for k in [*saved, *new] if saved.get(k) != new.get(k)]
    return [f"model.{k} {saved.get(k)!r} -> {new.get(k)!r}" for k in dict.fromkeys(keys)]


class ForecastTask(Task):
    """Forecasting for the engine: window batches, the MSE/MAE loss, per-epoch decay, validation MSE."""

    def __init__(
        self,
        model: nn.Module,
        train: Windows,
        val: Windows,
        outputs: list[int],
        cfg: TrainConfig,
        run_config: dict[str, Any],
        log: Callable[[str], None],
    ) -> None:
        self.model = self.objective = model
        self.train, self.val, self.outputs, self.cfg = train, val, outputs, cfg
        self.batches = EpochBatches(functools.partial(epoch_batches, len(train), cfg))
        self.stored, self.log = run_config, log
        self.history: list[dict[str, float]] = []
        self._teacher_forced = _takes_target(type(model))
        self._losses: list[Tensor] = []  # this epoch's batch losses
        self._clock: float | None = None  # the epoch's first batch: set-up is not in its seconds

    def make_optimizer(self, parameters: Iterator[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(parameters, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)

    def loss(self, objective: nn.Module, idx: Tensor) -> Loss:
        """The mean error of the windows ``idx`` (weight 1: a step's gradient is this batch's)."""
        self._clock = self._clock or time.perf_counter()
        x, y = self.train.inputs(idx), self.train.targets(idx)  # (B, L, n), (B, H, n)
        outputs = self.outputs
        channels = self._channels(x.size(2))
        if channels is not None:  # a channel-independent model forecasts whichever variables it reads
            x, y, outputs = x[..., channels], y[..., channels], slice(None)  # (B, L, k), (B, H, k)
        pred = objective(x, y) if self._teacher_forced else objective(x)  # (B, H, n_out)
        value = batch_error(pred, y[..., outputs], self.cfg.loss)
        self._losses.append(value.detach())
        return Loss(value)

    def _channels(self, n: int) -> Tensor | None:
        """This step's variables (``channels_per_step`` of ``n``), drawn from (seed, epoch, batch of
        the epoch) so a resumed run draws the same; None: every variable."""
        k = self.cfg.channels_per_step
        if not k or n <= k or not getattr(self.model.config, "channel_independent", False):
            return None
        seed = (self.cfg.seed * 100_003 + self.batches.epoch) * 1_000_003 + self.batches.position
        return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k].to(self.train.data.device)

    def learning_rate(self, step: int, epoch: int, progress: float) -> float:
        return self.cfg.lr * self.cfg.lr_decay**epoch

    def validate(self) -> dict[str, float]:
        return evaluate(self.model, self.val, self.outputs, bf16=self.cfg.bf16)

    def selection(self, metrics: dict[str, float]) -> tuple[str, bool]:
        return "mse", False

    def validated(self, metrics: dict[str, float], improved: bool) -> None:
        """One history record and one line per epoch."""
        train_loss = sum(loss.item() for loss in self._losses) / max(len(self._losses), 1)
        seconds = time.perf_counter() - (self._clock or time.perf_counter())
        epoch = self.batches.epoch
        record = {
            "epoch": epoch,
            "train_loss": train_loss,
            "val_mse": metrics["mse"],
            "val_mae": metrics["mae"],
        }
        self.history.append({**record, "seconds": seconds})
        self.log(
            f"epoch {epoch}: train loss {train_loss:.4f}  val MSE {metrics['mse']:.4f}  MAE "
            f"{metrics['mae']:.4f}{'  (best)' if improved else ''}  {seconds:.1f}s"
        )
        self._losses, self._clock = [], None

    def checkpoint_config(self) -> dict[str, Any]:
        return {"kind": "forecast", **self.stored}

    def run_config(self) -> dict[str, Any]:
        return self.stored

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.history = list((state or {}).get("history", []))


def epoch_batches(n_windows: int, cfg: TrainConfig, epoch: int) -> list[Tensor]:
    """The window indices of each batch of ``epoch``: a permutation seeded by (seed, epoch), cut."""
    generator = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
    batches = list(torch.randperm(n_windows, generator=generator).split(cfg.batch_size))
    return batches[: cfg.max_steps_per_epoch] if cfg.max_steps_per_epoch else batches


def batch_error(pred: Tensor, truth: Tensor, loss: str = "mse") -> Tensor:
    """fp32 mean squared ("mse") or absolute ("mae") error."""
    error = pred.float() - truth
    return error.abs().mean() if loss == "mae" else error.square().mean()


@functools.cache
def _takes_target(cls: type) -> bool:
    """Whether ``cls.forward`` has a ``target`` parameter: models that teacher-force take it, the
    baselines do not (looked up once per class, not per batch)."""
    return "target" in inspect.signature(cls.forward).parameters
