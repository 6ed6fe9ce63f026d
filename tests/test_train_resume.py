"""Training: exact resume after SIGKILL, corrupt checkpoints, and what a resumed run keeps or refuses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aiayn.checkpoint import MODEL_FILE, list_checkpoints, load_checkpoint, seal
from aiayn.cli import main
from aiayn.errors import UserError
from aiayn.train.config import run_config_from_dict
from aiayn.train.engine import start, train
from aiayn.train.translation import TranslationTask
from conftest import _train_command, _write_config, run_config


@pytest.mark.parametrize(
    "bpe_dropout", [0.0, 0.1]
)  # with BPE-dropout: the 40 steps span 3 epochs, each resampled
def test_sigkill_then_resume_is_bit_identical(
    task_dir: Path, tmp_path: Path, bpe_dropout: float, kill_after_checkpoints, capsys
) -> None:
    """The uninterrupted run and the resumed one run in this process (``aiayn train`` as ``main``,
    on one thread as the killed process is); only the killed run needs a process of its own."""
    values = run_config(
        task_dir,
        optim={"cooldown": 0.5},  # a cool-down over max_steps is deterministic too
        data={"bpe_dropout": bpe_dropout},
        train={"max_steps": 40, "save_every": 3, "valid_every": 7},
    )
    config = _write_config(tmp_path / "run.yaml", values)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    assert main(_train_command(config, tmp_path / "straight")[3:]) == 0

    killed_at = kill_after_checkpoints(
        _train_command(config, tmp_path / "killed"), tmp_path / "killed", 3, env
    )
    capsys.readouterr()
    assert main(_train_command(config, tmp_path / "killed")[3:]) == 0, capsys.readouterr().err
    assert "resuming from" in capsys.readouterr().out

    final = lambda run: load_file(str(list_checkpoints(run)[-1] / MODEL_FILE))  # noqa: E731
    straight, again = final(tmp_path / "straight"), final(tmp_path / "killed")
    assert list_checkpoints(tmp_path / "killed")[-1].name == "step-00000040" != killed_at
    for name, tensor in straight.items():
        assert torch.equal(tensor, again[name]), name

    def log(run: Path) -> list[dict]:  # every record but the timing must match
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in records]

    assert log(tmp_path / "killed") == log(tmp_path / "straight")


def test_corrupt_latest_checkpoint_is_a_clear_error(task_dir: Path, tmp_path: Path, capsys) -> None:
    config = _write_config(tmp_path / "run.yaml", run_config(task_dir, train={"max_steps": 8}))
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    *_, previous, latest = list_checkpoints(tmp_path / "run")
    (latest / MODEL_FILE).write_bytes(b"\x00garbage")
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--max-steps", "12"]) == 2
    err = capsys.readouterr().err
    assert f"corrupt checkpoint file {latest / MODEL_FILE}" in err and "Traceback" not in err
    assert load_checkpoint(previous).train_state["trainer"]["step"] == 4


def test_a_resumed_run_never_validates_twice_at_one_step(task_dir: Path, tmp_path: Path) -> None:
    values = run_config(task_dir, train={"max_steps": 6, "valid_every": 6, "save_every": 6})
    for _ in range(2):  # the second run resumes at its end: nothing left to do, nothing validated again
        train(
            TranslationTask(run_config_from_dict(values)),
            tmp_path / "run",
            log=lambda _: None,
            progress=False,
        )
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "valid"] == [6]


def test_resuming_with_other_model_data_or_optim_settings_is_refused(task_dir: Path, tmp_path: Path) -> None:
    values = run_config(task_dir, train={"max_steps": 4, "save_every": 4, "valid_every": 0})
    train(TranslationTask(run_config_from_dict(values)), tmp_path / "run", log=lambda _: None, progress=False)
    changed = run_config(
        task_dir,
        model={"d_model": 48},
        optim={"warmup": 99},
        train={"max_steps": 8, "save_every": 4, "valid_every": 0},
    )
    with pytest.raises(
        UserError,
        match=r"holds a run with other settings \(model\.d_model 32 -> 48; "
        r"optim\.warmup 10 -> 99\): resume it with the same",
    ):
        start(
            TranslationTask(run_config_from_dict(changed)),
            tmp_path / "run",
            log=lambda _: None,
            progress=False,
        )
    # train.* may change (a longer run), and data.dir (the corpus moved)
    moved = tmp_path / "moved"
    moved.mkdir()
    for file in task_dir.iterdir():
        (moved / file.name).write_bytes(file.read_bytes())
    longer = run_config(moved, train={"max_steps": 8, "save_every": 4, "valid_every": 0})
    longer["model"]["positional"] = "sinusoidal"  # spelled out, the default: the same model
    # a run saved by another number of processes (batch_multiple 2) resumes, with a warning
    state_file = list_checkpoints(tmp_path / "run")[-1] / "state.json"
    state = json.loads(state_file.read_text())
    state["sampler"]["batch_multiple"] = 2
    state_file.write_text(json.dumps(state))
    seal(state_file.parent)
    logs: list[str] = []
    trainer = start(
        TranslationTask(run_config_from_dict(longer)), tmp_path / "run", log=logs.append, progress=False
    )
    assert trainer.state.step == 4 and trainer.config.data.dir == str(moved)
    assert any("batches were cut for a multiple of 2 sentences, now 1" in line for line in logs), logs
    trainer.engine.run(trainer)
    assert trainer.state.step == 8


def test_resume_truncates_the_metrics_log_by_renaming_a_whole_file(
    task_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    values = run_config(task_dir, train={"max_steps": 4, "save_every": 4, "valid_every": 0})
    train(TranslationTask(run_config_from_dict(values)), tmp_path / "run", log=lambda _: None, progress=False)
    log = tmp_path / "run" / "metrics.jsonl"
    kept = log.read_text()
    log.write_text(kept + '{"written": "after the checkpoint"}\n')
    replaced = []
    monkeypatch.setattr(
        os, "replace", lambda a, b: (replaced.append((Path(a).parent, Path(b))), os.rename(a, b))
    )
    start(TranslationTask(run_config_from_dict(values)), tmp_path / "run", log=lambda _: None, progress=False)
    assert log.read_text() == kept and replaced == [(log.parent, log)]
    assert [p.name for p in log.parent.iterdir() if ".tmp-" in p.name] == []


def test_max_hours_stops_the_run_and_carries_over_resumes(task_dir: Path, tmp_path: Path) -> None:
    config = _write_config(
        tmp_path / "run.yaml", run_config(task_dir, train={"max_steps": 0, "max_hours": 1e-7})
    )
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    state = load_checkpoint(list_checkpoints(tmp_path / "run")[-1]).train_state["trainer"]
    assert state["step"] == 1 and state["hours"] > 1e-7  # one step already spends 0.36 ms
    # resumed with a larger budget: the hours already spent count, and the run goes on from there
    assert (
        main(
            [
                "train",
                "--config",
                str(config),
                "--out",
                str(tmp_path / "run"),
                "--no-progress",
                "--max-hours",
                str(state["hours"] + 1e-7),
            ]
        )
        == 0
    )
    again = load_checkpoint(list_checkpoints(tmp_path / "run")[-1]).train_state["trainer"]
    assert again["step"] == 2 and again["hours"] > state["hours"]
