"""Training: the run config (YAML, overrides, validation that names the field) and the shipped configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.cli import main
from aiayn.errors import UserError
from aiayn.train.config import load_run_config, run_config_from_dict
from conftest import run_config


def test_unknown_keys_and_bad_values_name_the_field(task_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(
        UserError, match=r"^config: unknown config field\(s\) optim\.warmpu; valid: lr_schedule, warmup"
    ):
        load_run_config(None, ["optim.warmpu=10"])
    with pytest.raises(UserError, match=r"model\.d_modle.*valid:.*d_model"):
        run_config_from_dict({"model": {"d_modle": 3}})
    with pytest.raises(UserError, match=r"train\.precision must be one of auto, bf16, fp32; got 'fp8'"):
        load_run_config(None, ["train.precision=fp8"])
    with pytest.raises(UserError, match=r"^config: model\.d_model \(30\) must be divisible by n_heads"):
        run_config_from_dict({"model": {"d_model": 30, "n_heads": 4}})
    with pytest.raises(UserError, match=r"^config: train\.max_steps must be an integer; got 'many'"):
        load_run_config(None, ["train.max_steps=many"])
    with pytest.raises(UserError, match="config file not found"):
        load_run_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  patience: 0\n  log_every: -1\n")
    with pytest.raises(UserError, match=rf"^{bad}: train\.log_every must be >= 0; got -1$"):
        load_run_config(bad)
    bad.write_text("train:\n  patience: [1\n")
    with pytest.raises(UserError, match=rf"^{bad}:3: not valid YAML: "):
        load_run_config(bad)
    bad.write_text("- model\n")
    with pytest.raises(UserError, match=rf"^{bad}: must be a mapping of sections; got list$"):
        load_run_config(bad)
    bad.write_text("train: 5\n")
    with pytest.raises(UserError, match=rf"^{bad}: train must be a mapping of key: value; got int$"):
        load_run_config(bad)


def test_config_yaml_reads_exponents_as_numbers_and_rejects_zero_sizes(
    task_dir: Path, tmp_path: Path
) -> None:
    """PyYAML reads ``1e-6`` as a string (YAML 1.1); the run config reads it as the number it is."""
    config = tmp_path / "eps.yaml"
    config.write_text("model:\n  layer_norm_eps: 1e-6\noptim:\n  peak_lr: 5e-4\n  eps: 1.0e-9\n")
    loaded = load_run_config(config, ["optim.beta2=9.8e-1"])
    assert (
        loaded.model["layer_norm_eps"] == 1e-6 and loaded.optim.peak_lr == 5e-4 and loaded.optim.beta2 == 0.98
    )
    with pytest.raises(UserError, match=r"model\.layer_norm_eps must be a number; got 'tiny'"):
        run_config_from_dict({"model": {"layer_norm_eps": "tiny"}})
    for key in ("optim.warmup", "train.accum_steps", "data.batch_tokens"):
        with pytest.raises(UserError, match=rf"{key} must be > 0; got 0"):
            load_run_config(None, [f"{key}=0"])


def test_max_len_must_cover_the_longest_training_sentence(task_dir: Path) -> None:
    with pytest.raises(
        UserError, match=r"data\.max_sentence_tokens 100 needs model\.max_len >= 101 \(got 64\)"
    ):
        run_config_from_dict({"model": {"max_len": 64}, "data": {"max_sentence_tokens": 100}})
    run_config_from_dict({"model": {"max_len": 101}, "data": {"max_sentence_tokens": 100}})


def test_cooldown_needs_a_budget_and_is_a_fraction(task_dir: Path) -> None:
    with pytest.raises(UserError, match=r"optim\.cooldown is a fraction of the run, from 0 to 1; got 1\.5"):
        run_config_from_dict(run_config(task_dir, optim={"cooldown": 1.5}))
    with pytest.raises(UserError, match=r"optim\.cooldown is a fraction of the run, from 0 to 1; got nan"):
        run_config_from_dict(run_config(task_dir, optim={"cooldown": float("nan")}))
    with pytest.raises(
        UserError, match=r"optim\.cooldown needs train\.max_steps, train\.max_hours or train\.max_epochs"
    ):
        run_config_from_dict(run_config(task_dir, optim={"cooldown": 0.2}, train={"max_steps": 0}))


def test_cli_bad_config_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("model:\n  d_model: 30\n  n_heads: 4\n")
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("aiayn: error:") and "\n" not in err and "divisible by n_heads" in err


def test_shipped_configs_are_valid() -> None:
    configs = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
    translation = [c for c in configs if not c.name.startswith("ett")]
    assert {c.name for c in translation} >= {
        "demo.yaml",
        "multi30k_de_en.yaml",
        "multi30k_en_de.yaml",
        "wmt14_en_de_base.yaml",
        "wmt14_en_de_big.yaml",
    }
    for path in translation:
        load_run_config(path).model_config(vocab_size=1000)


@pytest.mark.parametrize("seed", [-3, 2**32])
def test_seeds_outside_numpys_range_are_refused(task_dir: Path, seed: int) -> None:
    from aiayn.forecast.train import ForecastTrainConfig

    with pytest.raises(UserError, match=f"train.seed must be in \\[0, {2**32 - 1}\\]; got {seed}"):
        run_config_from_dict(run_config(task_dir, train={"seed": seed}))
    with pytest.raises(ValueError, match="seed"):
        ForecastTrainConfig(seed=seed)
