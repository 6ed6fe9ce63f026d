"""Forecasting as a task of the training engine (:mod:`aiayn.train.engine`).

:class:`ForecastTask` trains with AdamW at a learning rate decayed once per epoch, on the training
windows in an order seeded by (seed, epoch); it validates the MSE after every epoch (on an exponential
moving average of the weights with ``ema``), keeps the best weights in ``best/``, stops after
``patience`` epochs without a better validation MSE and leaves the best weights in the model. It is
built and run like every task: ``task = ForecastTask.from_config(training)`` (or from a model and
windows of your own), then ``train(task, out)``. With a run directory it writes the engine's layout (a
checkpoint in ``checkpoints/`` after every epoch, ``best/``, ``metrics.jsonl``, ``run.yaml``) and
resumes from it, exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import time
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from aiayn.config import Renamed, from_mapping, setting
from aiayn.forecast.data import Windows
from aiayn.forecast.metrics import evaluate
from aiayn.forecast.model import Forecaster
from aiayn.train.engine import Engine, EngineConfig, EpochBatches, Loss, Task, refuse_other_run

LOSSES = ("mse", "mae")


@dataclass
class ForecastTrainConfig(EngineConfig):
    """The ``train`` section of a forecasting config: the engine's settings, and what forecasting adds
    (AdamW with a per-epoch decayed learning rate, window batches, the loss).

    Forecasting's unit is the epoch, so six engine settings default to it here: a budget of 10
    epochs (``max_epochs``), ``patience`` 3 validations, a validation and a checkpoint after every epoch
    and none on a step cadence (``valid_every`` and ``save_every`` 0, ``save_at_epoch_end``), and one
    checkpoint kept (``keep_last``).
    """

    max_epochs: int = setting(10, ge=0)
    valid_every: int = setting(0, ge=0)
    save_every: int = setting(0, ge=0)
    save_at_epoch_end: bool = True
    keep_last: int = setting(1, ge=0)
    patience: int = setting(3, ge=0)  #: epochs without a better validation MSE before stopping (0 = off)
    batch_size: int = setting(128, ge=1)
    lr: float = setting(1e-4, gt=0)
    lr_decay: float = setting(1.0, gt=0)  #: multiply the learning rate by this after every epoch
    weight_decay: float = setting(0.0, ge=0)
    max_steps_per_epoch: int = setting(0, ge=0)  #: 0 = every training window once per epoch
    #: With a channel-independent model: each step trains on a random subset of at most this many
    #: variables (the same for the batch's windows), so that a wide file (hundreds of variables)
    #: costs per step what a narrow one does; 0 = every variable. Validation always scores them all.
    channels_per_step: int = setting(0, ge=0)
    #: The training loss: "mse" (squared error) or "mae" (absolute error: a large error weighs in
    #: proportion, not squared). Validation, early stopping and the reported scores are MSE either way.
    loss: str = setting("mse", choices=LOSSES)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ForecastTrainConfig":
        return from_mapping(cls, values)


def _precision_of(bf16: Any) -> Any:
    """The precision the former ``train.bf16`` asked for (a value not true or false is left for the
    check of ``train.precision`` to name)."""
    return ("bf16" if bf16 else "fp32") if isinstance(bf16, bool) else bf16


#: Settings of a forecasting config read under their former names, with one warning.
RENAMED = (
    Renamed("train.grad_clip", "train.clip_norm"),
    Renamed("train.bf16", "train.precision", _precision_of),
)


@dataclass
class FitState:
    """What :meth:`ForecastTask.result` reports: epochs done, the best validation MSE, epochs since it, a
    record per epoch."""

    epoch: int = 0
    best_val: float = math.inf
    bad_epochs: int = 0
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)


def _changed_model(saved: dict[str, Any] | None, new: dict[str, Any] | None) -> list[str]:
    if new is None:  # a task without a run config: the model is the caller's to match
        return []
    saved = saved if isinstance(saved, dict) else {}
    keys = [k for k in [*saved, *new] if saved.get(k) != new.get(k)]
    return [f"model.{k} {saved.get(k)!r} -> {new.get(k)!r}" for k in dict.fromkeys(keys)]


class ForecastTask(Task):
    """Forecasting for the engine: window batches, the MSE/MAE loss, per-epoch decay, validation MSE.

    ``model`` is trained on the ``train`` windows and validated on ``val`` (the MSE of the ``outputs``
    variables); ``run_config`` (``model``, ``data``, ``scaler``, ``train``), when given, is stored in each
    checkpoint, and a resumed run must have the stored ``model``. After the run the model holds the best
    validation weights.
    """

    kind = "forecast"
    restore_best = True

    def __init__(
        self,
        model: nn.Module,
        train: Windows,
        val: Windows,
        outputs: list[int],
        config: ForecastTrainConfig,
        *,
        run_config: dict[str, Any] | None = None,
    ) -> None:
        self.model = self.objective = model
        self.train, self.val, self.outputs, self.settings = train, val, outputs, config
        self.batches = EpochBatches(functools.partial(epoch_batches, len(train), config))
        self.run_settings = run_config
        self.log = _silent
        self.history: list[dict[str, float]] = []
        self._teacher_forced = _takes_target(type(model))
        self._losses: list[Tensor] = []  # this epoch's batch losses
        self._clock: float | None = None  # the epoch's first batch: set-up is not in its seconds
        self._bf16 = False  # validation in bf16: the engine's precision, known at set-up

    @classmethod
    def from_config(cls, training: Any) -> "ForecastTask":
        """The Forecaster of a :class:`~aiayn.forecast.run.Training` (initialised from its
        ``train.seed``) on its windows, its run config stored in every checkpoint."""
        torch.manual_seed(training.train.seed)
        model = Forecaster(training.model)
        windows = training.windows
        return cls(
            model,
            windows["train"],
            windows["val"],
            training.data.outputs,
            training.train,
            run_config=training.run_config,
        )

    def setup(self, engine: Engine) -> None:
        """The model and windows on the engine's device; a resumed run must have this model."""
        if engine.resumed is not None:
            changes = _changed_model(
                engine.resumed.config.get("model"), (self.run_settings or {}).get("model")
            )
            refuse_other_run(engine.out, changes, "model settings (train.* may change)")
        self.log, self._bf16 = engine.log, engine.precision == "bf16"
        self.model.to(engine.device)
        self.train, self.val = self.train.to(engine.device), self.val.to(engine.device)

    def result(self) -> FitState:
        """Epochs done, the best validation MSE, validations since it, and the history."""
        best = -self.state.best if self.state.best is not None else math.inf
        return FitState(self.batches.epoch, best, self.state.bad_validations, self.history)

    def make_optimizer(self, parameters: Iterator[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(parameters, lr=self.settings.lr, weight_decay=self.settings.weight_decay)

    def loss(self, objective: nn.Module, idx: Tensor) -> Loss:
        """The mean error of the windows ``idx`` (weight 1: a step's gradient is this batch's)."""
        self._clock = self._clock or time.perf_counter()
        x, y = self.train.inputs(idx), self.train.targets(idx)  # (B, L, n), (B, H, n)
        outputs = self.outputs
        channels = self._channels(x.size(2))
        if channels is not None:  # a channel-independent model forecasts whichever variables it reads
            x, y, outputs = x[..., channels], y[..., channels], slice(None)  # (B, L, k), (B, H, k)
        pred = objective(x, y) if self._teacher_forced else objective(x)  # (B, H, n_out)
        value = batch_error(pred, y[..., outputs], self.settings.loss)
        self._losses.append(value.detach())
        return Loss(value)

    def _channels(self, n: int) -> Tensor | None:
        """This step's variables (``channels_per_step`` of ``n``), drawn from (seed, epoch, batch of
        the epoch) so a resumed run draws the same; None: every variable."""
        k = self.settings.channels_per_step
        if not k or n <= k or not getattr(self.model.config, "channel_independent", False):
            return None
        seed = (self.settings.seed * 100_003 + self.batches.epoch) * 1_000_003 + self.batches.position
        return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k].to(self.train.data.device)

    def learning_rate(self, step: int, epoch: int, progress: float) -> float:
        return self.settings.lr * self.settings.lr_decay**epoch

    def validate(self) -> dict[str, float]:
        return evaluate(self.model, self.val, self.outputs, bf16=self._bf16)

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
        return {"kind": self.kind, **self.run_config()}

    def run_config(self) -> dict[str, Any]:
        return self.run_settings or {"train": dataclasses.asdict(self.settings)}

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.history = list((state or {}).get("history", []))


def epoch_batches(n_windows: int, cfg: ForecastTrainConfig, epoch: int) -> list[Tensor]:
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


def _silent(_message: str) -> None:
    """The log of a task not yet set up on an engine."""
