"""Training: the trainer and its engine (devices, gradient accumulation, logs, early stopping, run kinds)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import load_checkpoint
from aiayn.cli import main
from aiayn.data.batching import collate
from aiayn.errors import UserError
from aiayn.malloc import ONEDNN_CACHES
from aiayn.train.config import run_config_from_dict
from aiayn.train.engine import Engine, start
from aiayn.train.translation import TranslationTask
from conftest import _write_config, run_config


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_trainer_bounds_onednn_caches_for_bf16_on_cpu_only(
    task_dir: Path, tmp_path: Path, precision: str, monkeypatch
) -> None:
    for name in ONEDNN_CACHES:  # set first, so that monkeypatch restores the variable's absence afterwards
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    start(
        TranslationTask(run_config_from_dict(run_config(task_dir, train={"precision": precision}))),
        tmp_path / "run",
        log=lambda _: None,
        progress=False,
    )
    expected = ONEDNN_CACHES if precision == "bf16" else {}
    assert {name: os.environ[name] for name in ONEDNN_CACHES if name in os.environ} == expected


def test_accumulating_small_batches_equals_one_big_batch(task_dir: Path, tmp_path: Path) -> None:
    config = run_config_from_dict(run_config(task_dir, model={"dropout": 0.0}))
    small, big = (
        start(TranslationTask(config), tmp_path / "a", log=lambda _: None),
        start(TranslationTask(config), tmp_path / "b", log=lambda _: None),
    )
    examples = small.train_examples[:24]
    parts = [collate(examples[i : i + 8]) for i in range(0, 24, 8)]
    totals_small = small.engine.accumulate_gradients(parts)
    totals_big = big.engine.accumulate_gradients([collate(examples)])
    assert totals_small[2] == totals_big[2] == sum(len(t) + 1 for _, t in examples)
    assert totals_small[0] == pytest.approx(totals_big[0], rel=1e-5)
    for (name, a), b in zip(small.model.named_parameters(), big.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_training_refuses_a_single_corpus_file(task_dir: Path, tmp_path: Path) -> None:
    """One TSV file is one split: training on it would also validate on it."""
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("1 2\tone two\n")
    values = run_config(task_dir, data={"dir": str(tsv)})
    with pytest.raises(UserError, match=r"pairs\.tsv is a file; training reads a directory"):
        start(
            TranslationTask(run_config_from_dict(values)),
            tmp_path / "run",
            log=lambda _: None,
            progress=False,
        )


def test_training_on_a_missing_cuda_device_is_a_clear_error(task_dir: Path, tmp_path: Path) -> None:
    for device, message in [("cuda:x", "is not a device name"), ("gpu", "is not a device name")]:
        values = run_config(task_dir, train={"device": device})
        with pytest.raises(UserError, match=rf"train\.device '{device}' {message}"):
            start(
                TranslationTask(run_config_from_dict(values)),
                tmp_path / "run",
                log=lambda _: None,
                progress=False,
            )
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match=r"train\.device 'cuda': CUDA is not available here"):
            start(
                TranslationTask(run_config_from_dict(run_config(task_dir, train={"device": "cuda"}))),
                tmp_path / "run",
                log=lambda _: None,
                progress=False,
            )


def test_a_log_gets_plain_lines_and_no_progress_bar(task_dir: Path, tmp_path: Path, capsys) -> None:
    """The progress bar is drawn only on a terminal: a log file gets a line every log_every steps."""
    config = _write_config(
        tmp_path / "run.yaml", run_config(task_dir, train={"max_steps": 4, "log_every": 2})
    )
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err and "it/s" not in captured.err, captured.err
    assert "step=2 epoch=0 split=train loss=" in captured.out and "step=4 epoch=0 split=train" in captured.out


def test_early_stopping_after_patience_validations_without_improvement(
    task_dir: Path, tmp_path: Path
) -> None:
    # An untrained model's greedy BLEU stays 0: the first validation sets the best, the next two
    # do not beat it, so patience 2 stops the run at the third validation (step 6 of 100).
    values = run_config(
        task_dir,
        model={"dropout": 0.0},
        optim={"lr_schedule": "inverse_sqrt", "peak_lr": 1e-9},
        train={
            "max_steps": 100,
            "valid_every": 2,
            "save_every": 50,
            "valid_bleu": True,
            "best_metric": "bleu",
            "patience": 2,
            "log_every": 0,
        },
    )
    trainer = start(
        TranslationTask(run_config_from_dict(values)), tmp_path / "run", log=lambda _: None, progress=False
    )
    trainer.valid_pairs = trainer.valid_pairs[:8]  # BLEU on a few sentences keeps the test short
    trainer.engine.run(trainer)
    assert trainer.state.step == 6 and trainer.state.stopped_early and trainer.state.bad_validations == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "valid"] == [2, 4, 6]
    assert load_checkpoint(tmp_path / "run" / "best").config["step"] == 2


def test_a_run_directory_of_another_kind_or_layout_is_refused(tmp_path: Path) -> None:
    """Both tasks share one layout, so training into the other task's run is one clear line; so is
    a forecasting run of the layout before it (``last/``), which cannot be resumed."""
    from aiayn import TransformerConfig, build_model
    from aiayn.checkpoint import save_checkpoint
    from aiayn.train.engine import EngineConfig, Task

    class SetUp(Exception):
        """The task was let build itself: the run directory was not refused."""

    class Stub(Task):
        settings = EngineConfig(device="cpu")

        def __init__(self, kind: str) -> None:
            self.kind = kind

        def setup(self, engine: Engine) -> None:
            raise SetUp

    model = build_model(TransformerConfig(src_vocab_size=8, tgt_vocab_size=8, d_model=8, n_heads=2, d_ff=8))
    save_checkpoint(tmp_path / "fc" / "checkpoints" / "step-00000001", model, {"kind": "forecast"})
    with pytest.raises(UserError, match="holds a forecast run, not a translation run: give a new run_dir"):
        Engine(Stub.settings, tmp_path / "fc").start(Stub("translation"))
    with pytest.raises(SetUp):  # its own kind resumes
        Engine(Stub.settings, tmp_path / "fc").start(Stub("forecast"))
    save_checkpoint(tmp_path / "old" / "last", model, {"kind": "forecast"})
    with pytest.raises(UserError, match=r"old/last is a run in aiayn's earlier forecasting layout"):
        Engine(Stub.settings, tmp_path / "old").start(Stub("forecast"))
