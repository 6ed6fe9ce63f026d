"""`aiayn forecast ...` end to end: bad input (exit 2, one line), train/evaluate/predict/plot, resume."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn import cli

TINY_CONFIG = """
data: {target: OT, features: M, input_len: 32, label_len: 8, horizon: 16}
model: {d_model: 16, n_heads: 2, n_encoder_layers: 1, n_decoder_layers: 1, d_ff: 32, dropout: 0.0,
        channel_independent: true, patch_len: 4}
train: {batch_size: 64, lr: 0.003, max_epochs: 1, max_steps_per_epoch: 3, seed: 0}
"""



@pytest.fixture(autouse=True)
def _only_forecast_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Isolate from other parts' sub-commands (built in the same tree at the same time)."""
    monkeypatch.setattr(cli, "COMMAND_MODULES", ["aiayn.forecast.cli"])


@pytest.fixture(scope="module")
def small_csv(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """The first 600 rows of ETTh1 (a non-ETT name: 70/10/20 % splits)."""
    lines = (data_dir / "ett" / "ETTh1.csv").read_text().splitlines(keepends=True)[:601]
    path = tmp_path_factory.mktemp("series") / "small.csv"
    path.write_text("".join(lines))
    return path


@pytest.fixture()
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_CONFIG)
    return path


def _mutated(src: Path, dst: Path, line: int, change) -> Path:
    lines = src.read_text().splitlines()
    lines[line - 1] = change(lines[line - 1])
    dst.write_text("\n".join(lines) + "\n")
    return dst


def _train(config: Path, data: Path, out: Path, *extra: str) -> int:
    return cli.main(["forecast", "train", "--config", str(config), "--data", str(data), "--out", str(out), *extra])


def _one_line_error(capsys: pytest.CaptureFixture, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("aiayn: error: "), err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize("case, change, line, needles", [
    ("non_numeric", lambda s: s.replace(s.split(",")[3], "abc", 1), 7, ["small.csv:7", "'MUFL'", "abc"]),
    ("empty_cell", lambda s: s.rsplit(",", 1)[0] + ",", 9, ["small.csv:9", "'OT'"]),
    ("missing_time", lambda s: "," + s.split(",", 1)[1], 5, ["small.csv:5", "missing timestamp", "'date'"]),
    ("unsorted", lambda s: "2016-06-30 00:00:00," + s.split(",", 1)[1], 11, ["small.csv:11", "not sorted"]),
])
def test_bad_cells_exit_2_with_line(case, change, line, needles, tmp_path, small_csv, config, capsys) -> None:
    bad = _mutated(small_csv, tmp_path / "small.csv", line, change)
    assert _train(config, bad, tmp_path / "run") == 2
    _one_line_error(capsys, *needles)


def test_gap_in_timestamps(tmp_path, small_csv, config, capsys) -> None:
    lines = small_csv.read_text().splitlines(keepends=True)
    (tmp_path / "gap.csv").write_text("".join(lines[:20] + lines[21:]))
    assert _train(config, tmp_path / "gap.csv", tmp_path / "run") == 2
    _one_line_error(capsys, "gap.csv:21", "missing timestamps")


def test_missing_column(tmp_path, small_csv, config, capsys) -> None:
    assert _train(config, small_csv, tmp_path / "run", "--target", "TEMP") == 2
    _one_line_error(capsys, "'TEMP'", "not found")


def test_series_too_short(tmp_path, small_csv, config, capsys) -> None:
    assert _train(config, small_csv, tmp_path / "run", "--input-len", "96", "--horizon", "80") == 2
    _one_line_error(capsys, "fewer than input length + horizon", "96 + 80")


def test_missing_file_and_checkpoint(tmp_path, config, capsys) -> None:
    assert _train(config, tmp_path / "nope.csv", tmp_path / "run") == 2
    _one_line_error(capsys, "nope.csv")
    assert cli.main(["forecast", "evaluate", "--checkpoint", str(tmp_path / "none")]) == 2
    _one_line_error(capsys, "checkpoint not found")


def test_train_evaluate_predict_plot_and_resume(tmp_path, small_csv, config, capsys) -> None:
    run = tmp_path / "run"
    assert _train(config, small_csv, run) == 0
    assert (run / "best" / "model.safetensors").is_file() and (run / "last" / "state.json").is_file()
    stored = json.loads((run / "best" / "config.json").read_text())
    assert stored["kind"] == "forecast" and len(stored["scaler"]["mean"]) == 7

    assert cli.main(["forecast", "evaluate", "--checkpoint", str(run), "--split", "test"]) == 0
    out = capsys.readouterr().out
    assert "test: MSE" in out and "MAE" in out

    assert cli.main(["forecast", "predict", "--checkpoint", str(run), "--out", str(tmp_path / "pred.csv")]) == 0
    rows = list(csv.reader((tmp_path / "pred.csv").open()))
    assert rows[0] == ["date", "HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"] and len(rows) == 17
    last = small_csv.read_text().splitlines()[-1].split(",")[0]  # 2016-07-25 23:00:00
    assert last == "2016-07-25 23:00:00" and rows[1][0] == "2016-07-26 00:00:00" and rows[16][0] == "2016-07-26 15:00:00"
    ot = np.array([float(r[7]) for r in rows[1:]])
    assert np.all(np.isfinite(ot)) and 0 < ot.mean() < 60  # original units (degrees), not standardised

    assert cli.main(["forecast", "plot", "--checkpoint", str(run), "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    capsys.readouterr()
    assert _train(config, small_csv, run, "--max-epochs", "2") == 0  # resume for one more epoch
    out = capsys.readouterr().out
    assert "resuming from" in out and "after epoch 1" in out and "epoch 2:" in out and "epoch 1:" not in out
    state = json.loads((run / "last" / "state.json").read_text())
    assert state["epoch"] == 2 and len(state["history"]) == 2


def test_resume_with_the_weight_average_switched_exits_2(tmp_path, small_csv, config, capsys) -> None:
    """best_val and best/ were measured on the average (or on the raw weights): no silent switch."""
    plain = config.read_text()
    assert _train(config, small_csv, tmp_path / "run", "--max-epochs", "1") == 0
    config.write_text(plain.replace("seed: 0}", "seed: 0, ema: 0.5}"))
    capsys.readouterr()
    assert _train(config, small_csv, tmp_path / "run", "--max-epochs", "2") == 2
    _one_line_error(capsys, "without a weight average (train.ema)", "new --out")
    state = json.loads((tmp_path / "run" / "last" / "state.json").read_text())
    assert state["epoch"] == 1  # nothing trained, nothing overwritten


@pytest.mark.parametrize("ema", [0.0, 0.5])
def test_resume_is_exact(tmp_path, small_csv, config, ema) -> None:
    """Two epochs in one go = one epoch, then resume for the second (same weights, same average)."""
    from safetensors.torch import load_file

    config.write_text(config.read_text().replace("seed: 0}", f"seed: 0, ema: {ema}}}"))
    assert _train(config, small_csv, tmp_path / "a", "--max-epochs", "2") == 0
    assert _train(config, small_csv, tmp_path / "b", "--max-epochs", "1") == 0
    assert _train(config, small_csv, tmp_path / "b", "--max-epochs", "2") == 0
    for kind in ("last", "best"):
        wa, wb = (load_file(str(tmp_path / run / kind / "model.safetensors")) for run in ("a", "b"))
        assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
    if ema:  # best/ holds the average, which differs from the trained weights
        best, last = (load_file(str(tmp_path / "a" / kind / "model.safetensors")) for kind in ("best", "last"))
        assert any(not torch.equal(best[k], last[k]) for k in best)
