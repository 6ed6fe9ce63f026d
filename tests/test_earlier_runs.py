"""Run directories and configs written before the engine's settings were one vocabulary still work:
each renamed setting is read under its new name with one warning, and both tasks' runs resume."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import aiayn
from aiayn.checkpoint import list_checkpoints
from aiayn.cli import main
from aiayn.errors import UserError
from aiayn.forecast.run import build_training, load_config
from aiayn.train.config import load_run_config
from aiayn.train.engine import train
from aiayn.train.translation import TranslationTask

EARLIER = Path(__file__).parent / "fixtures" / "earlier"
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture()
def earlier(tmp_path: Path) -> Path:
    """A writable copy of the earlier runs and their configs."""
    return Path(shutil.copytree(EARLIER, tmp_path / "earlier"))


def warnings_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("aiayn: warning:")]


def test_an_earlier_translation_config_reads_its_renamed_settings_once_each(earlier, capsys) -> None:
    config = load_run_config(earlier / "translation.yaml")
    assert config.train.clip_norm == 1.0 and config.train.accum_steps == 2
    assert warnings_in(capsys.readouterr().err) == [
        f"aiayn: warning: {earlier / 'translation.yaml'}: optim.clip_norm is now train.clip_norm "
        "(read as train.clip_norm: 1.0)",
        f"aiayn: warning: {earlier / 'translation.yaml'}: optim.accum_steps is now train.accum_steps "
        "(read as train.accum_steps: 2)",
    ]
    with pytest.raises(UserError, match="optim.clip_norm is the former name of train.clip_norm"):
        load_run_config(earlier / "translation.yaml", ["train.clip_norm=2.0"])


def test_an_earlier_translation_run_resumes_and_loads(earlier, capsys) -> None:
    run = earlier / "translation_run"
    config = load_run_config(earlier / "translation.yaml", **{"train.max_steps": 6})
    logs: list[str] = []
    task = TranslationTask(config)
    train(task, run, log=logs.append, progress=False)
    assert any("resuming from" in line and "step-00000004" in line for line in logs), logs
    assert task.state.step == 6 and list_checkpoints(run)[-1].name == "step-00000006"
    err = capsys.readouterr().err
    renamed = [line for line in warnings_in(err) if "optim.clip_norm is now train.clip_norm" in line]
    assert len(renamed) == 1 and "translation.yaml" in renamed[0]  # not the checkpoint's: not the user's
    model, tokenizer, _ = aiayn.load(run)
    assert tokenizer.vocab_size == model.config.tgt_vocab_size


def test_an_earlier_forecasting_config_and_run(earlier, capsys) -> None:
    config = load_config(earlier / "forecast.yaml")
    training = build_training(config, earlier / "forecast.yaml")
    assert training.train.precision == "fp32" and training.train.clip_norm == 1.0
    assert warnings_in(capsys.readouterr().err) == [
        f"aiayn: warning: {earlier / 'forecast.yaml'}: train.grad_clip is now train.clip_norm "
        "(read as train.clip_norm: 1.0)",
        f"aiayn: warning: {earlier / 'forecast.yaml'}: train.bf16 is now train.precision "
        "(read as train.precision: 'fp32')",
    ]
    run = earlier / "forecast_run"
    args = ["forecast", "train", "--config", str(earlier / "forecast.yaml"), "--out", str(run)]
    assert main([*args, "--max-epochs", "3"]) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and "done after 3 epochs" in out, out
    assert (
        main(["forecast", "evaluate", "--checkpoint", str(run), "--data", str(earlier / "series.csv")]) == 0
    )
    assert "test: MSE" in capsys.readouterr().out


def test_a_search_space_under_former_names(earlier, capsys) -> None:
    config = earlier / "forecast.yaml"
    config.write_text(config.read_text() + "tune: {space: {train.bf16: [true, false], train.lr: [0.001]}}\n")
    space = load_config(config).tune["space"]
    assert space == {"train.precision": ["bf16", "fp32"], "train.lr": [0.001]}
    assert f"{config}: tune.space.train.bf16 is now tune.space.train.precision" in capsys.readouterr().err


def test_the_shipped_configs_load_without_a_warning(capsys) -> None:
    for path in sorted(CONFIGS.glob("*.yaml")):
        if path.name == "ett.yaml":
            config = load_config(path)
            from aiayn.forecast.train import ForecastTrainConfig

            ForecastTrainConfig.from_dict(config.train)
        else:
            load_run_config(path)
    assert warnings_in(capsys.readouterr().err) == []
