"""`aiayn forecast tune`: a seeded search on the validation split that a training reproduces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from aiayn import cli
from aiayn.forecast.data import ForecastData

TUNE_CONFIG = """
data: {target: OT, features: M, input_len: 32, label_len: 8, horizon: 16}
model: {d_model: 16, n_heads: 2, n_encoder_layers: 1, n_decoder_layers: 1, d_ff: 32, dropout: 0.0,
        channel_independent: true, patch_len: 4}
train: {batch_size: 64, lr: 0.003, max_epochs: 2, max_steps_per_epoch: 3, seed: 0}
tune:
  trials: 4
  seed: 3
  space:
    data.input_len: [32, 30, 48]     # 30 is not a multiple of the patch length: refused
    train.lr: [0.003, 0.01]
"""


@pytest.fixture(autouse=True)
def _only_forecast_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "COMMAND_MODULES", ["aiayn.forecast.cli"])


@pytest.fixture()
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tune.yaml"
    path.write_text(TUNE_CONFIG)
    return path


def _tune(config: Path, data: Path, out: Path, *extra: str) -> int:
    args = ["forecast", "tune", "--config", str(config), "--data", str(data), "--out", str(out)]
    return cli.main([*args, *extra])


def _trials(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]


def test_tune_never_reads_the_test_split_and_its_choice_trains_to_its_score(
    tmp_path, small_csv, config, capsys, monkeypatch
) -> None:
    windows = ForecastData.windows

    def no_test(self, split, *args):
        assert split != "test", "tune read the test split"
        return windows(self, split, *args)

    monkeypatch.setattr(ForecastData, "windows", no_test)
    out = tmp_path / "tune"
    assert _tune(config, small_csv, out) == 0
    printed = capsys.readouterr().out
    assert "4 points to try (2 refused by the model), up to 4 trials" in printed
    trials = _trials(out)
    assert [t["trial"] for t in trials] == [0, 1, 2, 3] and trials[0]["settings"] == {}
    assert all(t["settings"].get("data.input_len") != 30 for t in trials)
    assert len({json.dumps(t["settings"], sort_keys=True) for t in trials}) == 4
    best = min(trials, key=lambda t: t["val_mse"])
    chosen = yaml.safe_load((out / "best.yaml").read_text())
    assert chosen["data"]["input_len"] == best["settings"].get("data.input_len", 32)
    assert chosen["train"]["lr"] == best["settings"].get("train.lr", 0.003)
    assert "tune" not in chosen and Path(chosen["data"]["path"]).is_absolute()

    # what the user runs next trains to the trial's validation score
    monkeypatch.setattr(ForecastData, "windows", windows)
    run = tmp_path / "run"
    assert cli.main(["forecast", "train", "--config", str(out / "best.yaml"), "--out", str(run)]) == 0
    assert f"best val MSE {best['val_mse']:.4f}" in capsys.readouterr().out


def test_a_rerun_goes_on_and_another_search_is_refused(tmp_path, small_csv, config, capsys) -> None:
    out = tmp_path / "tune"
    assert _tune(config, small_csv, out, "--trials", "2") == 0
    first = (out / "trials.jsonl").read_text()
    assert _tune(config, small_csv, out, "--trials", "3") == 0
    assert "2 already in" in capsys.readouterr().out
    text = (out / "trials.jsonl").read_text()
    assert text.startswith(first) and len(text.splitlines()) == 3  # only the third trial trained
    config.write_text(TUNE_CONFIG.replace("lr: 0.003, max_epochs", "lr: 0.004, max_epochs"))
    assert _tune(config, small_csv, out) == 2
    assert "holds trials of another search" in capsys.readouterr().err


def test_minutes_budget_stops_after_the_first_trial(tmp_path, small_csv, config, capsys) -> None:
    out = tmp_path / "tune"
    assert _tune(config, small_csv, out, "--minutes", "0.000001") == 0
    assert (
        len(_trials(out)) == 1
        and "time budget of 1e-06 minutes spent after 1 trials" in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "space, needle",
    [
        ("{data.horizon: [16, 32]}", "tune.space.data.horizon is not a setting a search may vary"),
        ("{model.dropout: []}", "tune.space.model.dropout must be a non-empty list"),
        ("{train.nope: [1]}", "tune.space.train.nope is not a setting"),
    ],
)
def test_bad_space_exit_2_naming_the_key(space, needle, tmp_path, small_csv, config, capsys) -> None:
    config.write_text(TUNE_CONFIG.split("tune:")[0] + f"tune: {{space: {space}}}\n")
    assert _tune(config, small_csv, tmp_path / "tune") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
