"""Training with early stopping on the validation split, checkpoints and exact resume.

A run directory holds ``last/`` (weights + training state, written after every epoch) and ``best/``
(the weights with the lowest validation MSE so far), both through
:mod:`aiayn.checkpoint` (safetensors + JSON, atomic directory writes, no pickle). Training
from a directory whose ``last/`` exists resumes: weights, optimizer, epoch, patience, the best
score and the RNG state come back, and each epoch's data order depends only on (seed, epoch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn
from tqdm import tqdm

from aiayn.checkpoint import load_checkpoint, load_weights, save_checkpoint
from aiayn.config import strict_from_dict
from aiayn.errors import UserError
from aiayn.forecast.data import Windows
from aiayn.forecast.metrics import Running

LAST_DIR, BEST_DIR = "last", "best"
LOSSES = ("mse", "mae")


@dataclass
class TrainConfig:
    """Optimisation settings (AdamW, constant or per-epoch decayed learning rate)."""

    batch_size: int = 128
    lr: float = 1e-4
    lr_decay: float = 1.0  # multiply the learning rate by this after every epoch
    weight_decay: float = 0.0
    max_epochs: int = 10
    patience: int = 3  # stop after this many epochs without a better validation MSE
    seed: int = 0
    bf16: bool = False  # bf16 autocast for the forward pass on CPU; the loss stays fp32
    max_steps_per_epoch: int = 0  # 0 = every training window once per epoch
    grad_clip: float = 0.0  # 0 = no clipping
    #: Validate (and keep as best) an exponential moving average of the weights, this decay per step; 0 = off.
    ema: float = 0.0
    #: The training loss: "mse" (squared error) or "mae" (absolute error: a large error weighs in
    #: proportion, not squared). Validation, early stopping and the reported scores are MSE either way.
    loss: str = "mse"

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_epochs"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}: must be an integer >= 1")
        if not isinstance(self.patience, int) or self.patience < 1:
            raise ValueError("patience: must be an integer >= 1")
        for name in ("lr", "lr_decay"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be positive")
        for name in ("weight_decay", "grad_clip", "max_steps_per_epoch"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: must be >= 0")
        if not 0 <= self.ema < 1:
            raise ValueError("ema: must be in [0, 1)")
        if self.loss not in LOSSES:
            raise ValueError(f"loss: unknown value {self.loss!r}; valid: {', '.join(LOSSES)}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        return strict_from_dict(cls, values, "train")


def autocast(enabled: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on CPU when enabled, else nothing."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def _call(model: nn.Module, x: Tensor, target: Tensor | None) -> Tensor:
    """Models that teacher-force take ``target``; the baselines do not."""
    return model(x, target) if _takes_target(type(model)) else model(x)


@functools.cache
def _takes_target(cls: type) -> bool:
    """Whether ``cls.forward`` has a ``target`` parameter (looked up once per class, not per batch)."""
    return "target" in inspect.signature(cls.forward).parameters


def loss_on_batch(
    model: nn.Module, windows: Windows, idx: Tensor, outputs: list[int], bf16: bool, loss: str = "mse"
) -> Tensor:
    """fp32 mean squared ("mse") or absolute ("mae") error of the model's forecast on windows ``idx``."""
    x, y = windows.inputs(idx), windows.targets(idx)  # (B, L, n), (B, H, n)
    with autocast(bf16):
        pred = _call(model, x, y)  # (B, H, n_out)
    error = pred.float() - y[..., outputs]
    return error.abs().mean() if loss == "mae" else error.square().mean()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    windows: Windows,
    outputs: list[int],
    batch_size: int = 256,
    bf16: bool = False,
    limit: int | None = None,
) -> dict[str, float]:
    """MSE and MAE over every window of a split (standardised scale), or over its first ``limit``."""
    model.eval()
    running = Running()
    if limit is not None and limit < 1:
        raise ValueError(f"evaluate: limit must be >= 1 (got {limit}); no windows would score a perfect 0")
    count = len(windows) if limit is None else min(limit, len(windows))
    for start in range(0, count, batch_size):
        idx = torch.arange(start, min(start + batch_size, count))
        with autocast(bf16):
            pred = model(windows.inputs(idx))
        running.update(pred.float(), windows.targets(idx)[..., outputs])
    return running.result()


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
        self.average = average or {k: v.detach().clone() for k, v in state.items()}
        self._pairs = [(self.average[k], v) for k, v in state.items() if v.is_floating_point()]

    @torch.no_grad()
    def update(self) -> None:
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        averages, weights = zip(*self._pairs)
        torch._foreach_lerp_(list(averages), list(weights), 1.0 - decay)
        self.updates += 1

    @contextlib.contextmanager
    def swapped_in(self):
        """The model holds the average inside the block, its own weights again after it."""
        own = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(self.average)
        try:
            yield
        finally:
            self.model.load_state_dict(own)


@dataclass
class FitState:
    epoch: int = 0  # epochs finished
    best_val: float = math.inf
    bad_epochs: int = 0
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)


def _epoch_order(n: int, seed: int, epoch: int) -> Tensor:
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n, generator=generator)


def _train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    train: Windows,
    outputs: list[int],
    cfg: TrainConfig,
    epoch: int,
    progress: bool,
    average: WeightAverage | None = None,
) -> float:
    model.train()
    order = _epoch_order(len(train), cfg.seed, epoch)
    batches = list(order.split(cfg.batch_size))
    if cfg.max_steps_per_epoch:
        batches = batches[: cfg.max_steps_per_epoch]
    total = 0.0
    bar = tqdm(batches, desc=f"epoch {epoch + 1}", disable=not progress, leave=False, dynamic_ncols=True)
    for idx in bar:
        loss = loss_on_batch(model, train, idx, outputs, cfg.bf16, cfg.loss)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        if average is not None:
            average.update()
        total += loss.item()
        bar.set_postfix(loss=f"{loss.item():.4f}")
    return total / max(len(batches), 1)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def fit(
    model: nn.Module,
    train: Windows,
    val: Windows,
    outputs: list[int],
    cfg: TrainConfig,
    run_dir: str | Path | None = None,
    run_config: dict[str, Any] | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> FitState:
    """Train with early stopping on ``val``; with ``run_dir``, checkpoint every epoch and resume.

    At the end the model holds the best validation weights.
    """
    torch.manual_seed(cfg.seed)
    optimizer = make_optimizer(model, cfg)
    state = FitState()
    best_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    averaged: tuple[dict[str, Tensor] | None, int] = (None, 0)
    if run_dir is not None and (Path(run_dir) / LAST_DIR).is_dir():
        state, best_weights, averaged = _resume(model, optimizer, Path(run_dir), cfg)
        log(
            f"resuming from {Path(run_dir) / LAST_DIR} after epoch {state.epoch} (best val MSE "
            f"{state.best_val:.4f})"
        )
    average = WeightAverage(model, cfg.ema, *averaged) if cfg.ema else None
    while state.epoch < cfg.max_epochs and state.bad_epochs < cfg.patience:
        _set_lr(optimizer, cfg.lr * cfg.lr_decay**state.epoch)
        t0 = time.perf_counter()
        train_loss = _train_epoch(model, optimizer, train, outputs, cfg, state.epoch, progress, average)
        with (
            average.swapped_in() if average else contextlib.nullcontext()
        ):  # the average is what is validated
            scores = evaluate(model, val, outputs, bf16=cfg.bf16)
            improved = scores["mse"] < state.best_val
            if improved:
                best_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if improved:
            state.best_val, state.bad_epochs = scores["mse"], 0
        else:
            state.bad_epochs += 1
        state.epoch += 1
        state.history.append(
            {
                "epoch": state.epoch,
                "train_loss": train_loss,
                "val_mse": scores["mse"],
                "val_mae": scores["mae"],
                "seconds": time.perf_counter() - t0,
            }
        )
        log(
            f"epoch {state.epoch}: train loss {train_loss:.4f}  val MSE {scores['mse']:.4f}  MAE "
            f"{scores['mae']:.4f}"
            f"{'  (best)' if improved else ''}  {time.perf_counter() - t0:.1f}s"
        )
        if run_dir is not None:
            _save(model, optimizer, state, best_weights, Path(run_dir), run_config or {}, improved, average)
    model.load_state_dict(best_weights)
    return state


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _save(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: FitState,
    best: dict[str, Tensor],
    run_dir: Path,
    run_config: dict[str, Any],
    improved: bool,
    average: WeightAverage | None,
) -> None:
    config = {"kind": "forecast", **run_config, "fit": {"epoch": state.epoch, "best_val_mse": state.best_val}}
    if improved:
        save_checkpoint(run_dir / BEST_DIR, best, config)
    train_state = {
        "epoch": state.epoch,
        "best_val": state.best_val,
        "bad_epochs": state.bad_epochs,
        "history": state.history,
        "optimizer": optimizer.state_dict(),
        "rng": torch.get_rng_state(),
        "best_weights": best,
        "average": average.average if average else None,
        "average_updates": average.updates if average else 0,
    }
    save_checkpoint(run_dir / LAST_DIR, model, config, train_state=train_state)


def _resume(
    model: nn.Module, optimizer: torch.optim.Optimizer, run_dir: Path, cfg: TrainConfig
) -> tuple[FitState, dict[str, Tensor], tuple[dict[str, Tensor] | None, int]]:
    ckpt = load_checkpoint(run_dir / LAST_DIR)
    load_weights(model, ckpt.weights, ckpt.path)
    ts = ckpt.train_state or {}
    if (ts.get("average") is not None) != bool(
        cfg.ema
    ):  # best_val and best/ were measured on the other weights
        had = "with" if ts.get("average") is not None else "without"
        raise UserError(
            f"{ckpt.path} was trained {had} a weight average (train.ema); resume with the same "
            f"setting, or train into a new --out"
        )
    optimizer.load_state_dict(ts["optimizer"])
    torch.set_rng_state(ts["rng"])
    state = FitState(ts["epoch"], ts["best_val"], ts["bad_epochs"], ts["history"])
    return state, ts["best_weights"], (ts.get("average"), ts.get("average_updates", 0))
