"""Training: the learning-rate schedules (noam, inverse-sqrt) and the cool-down."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from aiayn.train.config import run_config_from_dict
from aiayn.train.engine import start, train
from aiayn.train.schedule import cooldown_factor, inverse_sqrt_lr, noam_lr
from aiayn.train.translation import TranslationTask
from conftest import run_config


def test_noam_schedule_at_known_steps() -> None:
    assert noam_lr(1, 512, 4000) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert noam_lr(4000, 512, 4000) == pytest.approx(512**-0.5 * 4000**-0.5)  # the peak, ~7.0e-4
    assert noam_lr(4000, 512, 4000) == pytest.approx(6.988e-4, rel=1e-3)
    assert noam_lr(16000, 512, 4000) == pytest.approx(512**-0.5 / math.sqrt(16000))
    assert noam_lr(2000, 512, 4000) == pytest.approx(noam_lr(4000, 512, 4000) / 2)  # linear warm-up
    assert noam_lr(100, 512, 4000, factor=2.0) == pytest.approx(2 * noam_lr(100, 512, 4000))


def test_inverse_sqrt_schedule() -> None:
    assert inverse_sqrt_lr(2000, 5e-4, 4000) == pytest.approx(2.5e-4)
    assert inverse_sqrt_lr(4000, 5e-4, 4000) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(16000, 5e-4, 4000) == pytest.approx(2.5e-4)


def test_cooldown_factor() -> None:
    assert [cooldown_factor(p, 0.25) for p in (0.0, 0.75, 0.875, 1.0, 1.2)] == [1.0, 1.0, 0.5, 0.0, 0.0]
    assert cooldown_factor(0.99, 0.0) == 1.0  # off


def test_cooldown_takes_the_lr_to_zero_at_the_last_step(task_dir: Path, tmp_path: Path) -> None:
    values = run_config(
        task_dir,
        optim={"lr_schedule": "inverse_sqrt", "peak_lr": 1e-3, "warmup": 4, "cooldown": 0.5},
        train={"max_steps": 12, "valid_every": 0, "save_every": 0},
    )
    train(TranslationTask(run_config_from_dict(values)), tmp_path / "run", log=lambda _: None, progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lr = {r["step"]: r["lr"] for r in records if r["split"] == "train"}
    assert lr[6] == pytest.approx(inverse_sqrt_lr(6, 1e-3, 4))  # the cool-down starts after step 6 of 12
    assert lr[9] == pytest.approx(inverse_sqrt_lr(9, 1e-3, 4) * 0.5)
    assert lr[12] == 0.0


def test_cooldown_follows_max_epochs_when_it_binds_first(task_dir: Path, tmp_path: Path) -> None:
    values = run_config(
        task_dir,
        optim={"lr_schedule": "inverse_sqrt", "peak_lr": 1e-3, "warmup": 1, "cooldown": 1.0},
        train={"max_steps": 10_000, "max_epochs": 2, "valid_every": 0, "save_every": 0},
    )
    trainer = start(
        TranslationTask(run_config_from_dict(values)), tmp_path / "run", log=lambda _: None, progress=False
    )
    trainer.engine.run(trainer)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lr = [r["lr"] for r in records if r["split"] == "train"]
    assert len(lr) == trainer.state.step < 100 and lr[-1] == 0.0  # two epochs, ending cooled
    half = len(lr) // 2  # the lr is (1 - epochs done / 2) times the inverse-sqrt value
    assert lr[half - 1] == pytest.approx(inverse_sqrt_lr(half, 1e-3, 1) * 0.5, rel=0.05)
