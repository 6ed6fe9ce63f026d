"""Training: averaging the last checkpoints of a run (`aiayn average`)."""

from __future__ import annotations

from pathlib import Path

import torch

from aiayn.checkpoint import list_checkpoints, load_checkpoint
from aiayn.cli import main
from conftest import _write_config, run_config


def test_average_checkpoints(task_dir: Path, tmp_path: Path, capsys) -> None:
    config = _write_config(tmp_path / "run.yaml", run_config(task_dir, train={"max_steps": 12}))
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    checkpoints = list_checkpoints(tmp_path / "run")[-3:]
    assert main(["average", "--last", "3", str(tmp_path / "run"), "--output", str(tmp_path / "avg")]) == 0
    averaged = load_checkpoint(tmp_path / "avg")
    weights = [load_checkpoint(c).weights for c in checkpoints]
    for name, tensor in averaged.weights.items():
        torch.testing.assert_close(tensor, sum(w[name] for w in weights) / 3)
    assert (
        averaged.train_state is None
        and averaged.tokenizer_bytes == load_checkpoint(checkpoints[-1]).tokenizer_bytes
    )
    assert (
        main(
            [
                "translate",
                "--checkpoint",
                str(tmp_path / "avg"),
                "--input",
                str(task_dir / "test.digits"),
                "--output",
                str(tmp_path / "out.txt"),
            ]
        )
        == 0
    )
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 40
    assert main(["average", "--last", "30", str(tmp_path / "run"), "--output", str(tmp_path / "x")]) == 2
    assert "fewer than --last 30" in capsys.readouterr().err
    assert main(["average", "--last", "0", str(tmp_path / "run"), "--output", str(tmp_path / "x")]) == 2
    assert "--last must be at least 1, got 0" in capsys.readouterr().err
    # a checkpoint of another model (other shapes) is refused by name, not with a traceback
    other = _write_config(
        tmp_path / "other.yaml", run_config(task_dir, model={"d_ff": 48}, train={"max_steps": 4})
    )
    assert main(["train", "--config", str(other), "--out", str(tmp_path / "other"), "--no-progress"]) == 0
    foreign = list_checkpoints(tmp_path / "other")[-1]
    assert (
        main(["average", "--inputs", str(checkpoints[-1]), str(foreign), "--output", str(tmp_path / "x")])
        == 2
    )
    err = capsys.readouterr().err
    assert f"{foreign}: a different model from {checkpoints[-1]}" in err and "Traceback" not in err
