"""Every training command (``train``, ``forecast train``, ``forecast tune``, ``demo``) takes the same
flags, spelled and meaning the same: ``--set``, ``--device``, ``--threads`` and the budget flags
(``--max-steps``, ``--max-epochs``, ``--max-hours``) where the command has that budget; a bad value
is one line and exit status 2 before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from aiayn.checkpoint import list_checkpoints
from aiayn.cli import build_parser, main
from conftest import _write_config, run_config

TRAINERS = {
    ("train",): ("steps", "epochs", "hours"),
    ("forecast", "train"): ("steps", "epochs", "hours"),
    ("forecast", "tune"): ("steps", "epochs", "hours"),
    ("demo",): ("steps",),  # the demo's task is fixed: a number of steps, reused when reached
}
FORECAST_CONFIG = """
data: {target: OT, features: M, input_len: 32, label_len: 8, horizon: 16}
model: {d_model: 16, n_heads: 2, n_encoder_layers: 1, n_decoder_layers: 1, d_ff: 32, dropout: 0.0,
        channel_independent: true, patch_len: 4}
train: {batch_size: 64, lr: 0.003, max_epochs: 1, max_steps_per_epoch: 3, seed: 0}
"""


def _subcommand(path: tuple[str, ...]):
    parser = build_parser()
    for name in path:
        parser = next(a for a in parser._actions if a.dest in ("command", "forecast_command")).choices[name]
    return parser


def _helps(path: tuple[str, ...]) -> dict[str, str]:
    return {o: a.help for a in _subcommand(path)._actions for o in a.option_strings}


def test_every_training_command_takes_the_same_flags_with_the_same_meaning() -> None:
    reference = _helps(("train",))
    for path, budgets in TRAINERS.items():
        helps = _helps(path)
        flags = ["--set", "--device", "--threads", *(f"--max-{b}" for b in budgets)]
        missing = [f for f in flags if f not in helps]
        assert not missing, f"aiayn {' '.join(path)} lacks {missing}"
        assert {f: helps[f] for f in flags} == {f: reference[f] for f in flags}, path
        assert not {"--max-epochs", "--max-hours"} - set(helps) or path == ("demo",)


@pytest.fixture()
def threads():
    """Restores torch's thread count (the suite runs on one) after a test that sets it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_train_flags_reach_the_run_config(tmp_path: Path, task_dir: Path, threads) -> None:
    config = _write_config(
        tmp_path / "c.yaml", run_config(task_dir, train={"max_steps": 50, "save_every": 2})
    )
    out = tmp_path / "run"
    flags = ["--device", "cpu", "--threads", "2", "--max-steps", "2", "--set", "optim.warmup=7"]
    assert main(["train", "--config", str(config), "--out", str(out), "--no-progress", *flags]) == 0
    stored = yaml.safe_load((out / "run.yaml").read_text())
    assert (stored["train"]["device"], stored["train"]["max_steps"], stored["optim"]["warmup"]) == (
        "cpu",
        2,
        7,
    )
    assert [p.name for p in list_checkpoints(out)] == ["step-00000002"]
    assert torch.get_num_threads() == 2


def test_forecast_train_flags_reach_the_run_config(tmp_path: Path, small_csv: Path, threads) -> None:
    config = tmp_path / "f.yaml"
    config.write_text(FORECAST_CONFIG)
    out = tmp_path / "run"
    flags = [
        "--device",
        "cpu",
        "--threads",
        "2",
        "--max-steps",
        "2",
        "--max-hours",
        "1",
        "--set",
        "train.lr=0.002",
    ]
    command = ["forecast", "train", "--config", str(config), "--data", str(small_csv), "--out", str(out)]
    assert main([*command, *flags]) == 0
    stored = yaml.safe_load((out / "run.yaml").read_text())["train"]
    assert (stored["device"], stored["max_steps"], stored["max_hours"], stored["lr"]) == (
        "cpu",
        2,
        1.0,
        0.002,
    )
    assert [p.name for p in list_checkpoints(out)] == ["step-00000002"]  # 2 steps, not the epoch's 3
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("path", list(TRAINERS))
@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--threads", "0", "--threads: must be >= 1; got 0"),
        ("--device", "tpu", "--device 'tpu' is not a device name"),
        ("--set", "warmup=7", "--set must read section.key=value"),
    ],
)
def test_a_bad_flag_is_one_line_before_any_work(path, flag, value, message, tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(FORECAST_CONFIG)
    required = {
        ("train",): ["--config", str(config), "--out", str(tmp_path / "run")],
        ("forecast", "train"): ["--config", str(config), "--data", str(tmp_path / "none.csv")],
        ("forecast", "tune"): ["--config", str(config), "--out", str(tmp_path / "tune")],
        ("demo",): ["--out", str(tmp_path / "demo")],
    }[path]
    assert main([*path, *required, flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    if flag != "--set" or path != ("demo",):  # the demo writes its task before it reads the config
        assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]
