"""`aiayn forecast ...` end to end: bad input (exit 2, one line), train/evaluate/predict/plot, resume."""

from __future__ import annotations

import csv
import datetime
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from aiayn import cli
from aiayn.checkpoint import MODEL_FILE, latest_checkpoint, list_checkpoints
from aiayn.errors import UserError
from aiayn.forecast import run as forecast_run
from aiayn.forecast.data import read_series
from aiayn.forecast.train import ForecastTrainConfig
from conftest import write_ett_like_csv

TINY_CONFIG = """
data: {target: OT, features: M, input_len: 32, label_len: 8, horizon: 16}
model: {d_model: 16, n_heads: 2, n_encoder_layers: 1, n_decoder_layers: 1, d_ff: 32, dropout: 0.0,
        channel_independent: true, patch_len: 4}
train: {batch_size: 64, lr: 0.003, max_epochs: 1, max_steps_per_epoch: 3, seed: 0}
"""

SHORT = "data: {input_len: 32, label_len: 8, horizon: 16}\n"  # fits the 600-row file


@pytest.fixture(autouse=True)
def _only_forecast_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Isolate from other parts' sub-commands (built in the same tree at the same time)."""
    monkeypatch.setattr(cli, "COMMAND_MODULES", ["aiayn.forecast.cli"])


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
    return cli.main(
        ["forecast", "train", "--config", str(config), "--data", str(data), "--out", str(out), *extra]
    )


def _one_line_error(capsys: pytest.CaptureFixture, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("aiayn: error: "), err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize(
    "case, change, line, needles",
    [
        ("non_numeric", lambda s: s.replace(s.split(",")[3], "abc", 1), 7, ["small.csv:7", "'MUFL'", "abc"]),
        ("empty_cell", lambda s: s.rsplit(",", 1)[0] + ",", 9, ["small.csv:9", "'OT'"]),
        (
            "missing_time",
            lambda s: "," + s.split(",", 1)[1],
            5,
            ["small.csv:5", "missing timestamp", "'date'"],
        ),
        ("nan", lambda s: s.rsplit(",", 1)[0] + ",NaN", 8, ["small.csv:8", "'OT'", "'NaN'"]),
        (
            "unparsable_date",
            lambda s: "30/06/2016 00:00," + s.split(",", 1)[1],
            6,
            ["small.csv:6", "'date'", "cannot read timestamp", "30/06/2016"],
        ),
        (
            "unsorted",
            lambda s: "2016-06-30 00:00:00," + s.split(",", 1)[1],
            11,
            ["small.csv:11", "not sorted"],
        ),
    ],
)
def test_bad_cells_exit_2_with_line(case, change, line, needles, tmp_path, small_csv, config, capsys) -> None:
    bad = _mutated(small_csv, tmp_path / "small.csv", line, change)
    assert _train(config, bad, tmp_path / "run") == 2
    _one_line_error(capsys, *needles)


def test_repeated_timestamps_and_gaps_warn_once_and_train(tmp_path, small_csv, config, capsys) -> None:
    """As in the published Weather file: a repeated timestamp and missing rows are one warning each
    (the first of each and their counts), and the rows are used as they are."""
    lines = small_csv.read_text().splitlines(keepends=True)
    dup = lines[30].split(",", 1)[0] + "," + lines[31].split(",", 1)[1]
    rows = lines[:20] + lines[21:31] + [dup] + lines[31:200] + lines[203:]  # gaps: 1 h and 3 h
    (tmp_path / "weather.csv").write_text("".join(rows))
    assert _train(config, tmp_path / "weather.csv", tmp_path / "run", "--max-epochs", "1") == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 2, warnings
    assert "weather.csv:31" in warnings[0] and "repeated (1 repeated in all)" in warnings[0]
    assert "weather.csv:21: column 'date': gap in time before 2016-07-01 20:00:00" in warnings[1]
    assert "(expected 2016-07-01 19:00:00, step 1:00:00; 2 gap(s) in all)" in warnings[1]
    assert read_series(tmp_path / "weather.csv").values.shape[0] == len(rows) - 1


def test_latin1_header_is_read_with_a_warning(tmp_path, small_csv, config, capsys) -> None:
    lines = small_csv.read_bytes().splitlines(keepends=True)
    lines[0] = lines[0].replace(b"HUFL", b"HUFL (W/m\xb2)")
    (tmp_path / "latin.csv").write_bytes(b"".join(lines))
    series = read_series(tmp_path / "latin.csv")
    assert series.columns[0] == "HUFL (W/m²)"
    assert "latin.csv:1: not UTF-8 (byte 0xb2); the file is read as Latin-1" in capsys.readouterr().err
    lines[3] = lines[3].replace(b"2016", b"20\xff6", 1)  # a Latin-1 byte where a timestamp must be
    (tmp_path / "latin.csv").write_bytes(b"".join(lines))
    assert _train(config, tmp_path / "latin.csv", tmp_path / "run") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "warning" in err[0] and err[1].startswith("aiayn: error: ") and len(err) == 2, err
    assert "latin.csv:4" in err[1] and "cannot read timestamp" in err[1], err


def test_equal_timestamps_everywhere_exit_2(tmp_path, capsys) -> None:
    (tmp_path / "same.csv").write_text("date,OT\n" + "2020-01-01 00:00:00,1\n" * 5)
    with pytest.raises(UserError, match="every timestamp is the same"):
        read_series(tmp_path / "same.csv")


def test_bom_and_trailing_blank_lines_are_accepted(tmp_path) -> None:
    rows = "OT,date,HUFL\n" + "".join(f"{i},2020-01-01 0{i}:00:00,{2 * i}\n" for i in range(5))
    (tmp_path / "bom.csv").write_text("\ufeff" + rows + "\n\n", encoding="utf-8")
    series = read_series(tmp_path / "bom.csv")
    assert series.columns == ["OT", "HUFL"] and series.values.shape == (5, 2)
    (tmp_path / "middle.csv").write_text(rows.replace("\n3,", "\n\n3,"), encoding="utf-8")
    with pytest.raises(UserError, match="middle.csv:5: 0 fields"):
        read_series(tmp_path / "middle.csv")


@pytest.mark.parametrize(
    "section, needles",
    [
        (
            "data: {horizn: 24}",
            ["unknown config field(s) data.horizn", "valid: path, target, features, input_len"],
        ),
        ("data: {input_len: '16'}", ["bad.yaml: data.input_len must be an integer; got '16'"]),
        ("data: {target: [OT]}", ["data.target must be a string"]),
        ("data: {features: X}", ["data.features must be one of M, S, MS; got 'X'"]),
        ("data: 5", ["bad.yaml: data must be a mapping"]),
        ("optim: {lr: 1}", ["unknown config field(s) optim; valid: data, model, train"]),
        ("train: {lr: 1", ["bad.yaml:2: not valid YAML"]),
        (SHORT + "train: {lr: abc}", ["train.lr must be a number; got 'abc'"]),
        (SHORT + "train: {max_epochs: '2'}", ["train.max_epochs must be an integer; got '2'"]),
        (SHORT + "train: {patience: -1}", ["train.patience must be >= 0; got -1"]),
        (SHORT + "model: {dropout: true}", ["model.dropout must be a number; got True"]),
        (SHORT + "model: {d_modle: 16}", ["unknown config field(s) model.d_modle"]),
        (SHORT + "model: {patch_len: 5}", ["model.seq_len must be a multiple of patch_len=5"]),
    ],
)
def test_bad_config_fields_exit_2_naming_the_field(section, needles, tmp_path, small_csv, capsys) -> None:
    (tmp_path / "bad.yaml").write_text(section + "\n")
    assert _train(tmp_path / "bad.yaml", small_csv, tmp_path / "run") == 2
    _one_line_error(capsys, "bad.yaml", *needles)
    assert not (tmp_path / "run").exists()


def test_exponents_in_the_config_are_numbers(tmp_path) -> None:
    """PyYAML (YAML 1.1) reads ``1e-3`` as a string; the config reads it as the number."""
    (tmp_path / "c.yaml").write_text("train: {lr: 1e-3, weight_decay: 1e-2, max_epochs: 2}\n")
    config = forecast_run.load_config(tmp_path / "c.yaml")
    assert config.train["lr"] == 1e-3
    train = ForecastTrainConfig.from_dict(config.train)
    assert train.lr == 1e-3 and train.weight_decay == 1e-2 and train.max_epochs == 2


def test_last_period_placeholders_take_a_day_of_the_files_steps(tmp_path, small_csv) -> None:
    """``period`` 0 becomes a day of the file's steps (24 hourly, 96 every 15 minutes), a period in
    the config is kept, and a day longer than the input is refused naming the field."""
    rows = small_csv.read_text().splitlines()
    start = datetime.datetime(2016, 7, 1)

    def stamped(minutes: int) -> Path:
        path = tmp_path / f"every-{minutes}.csv"
        dated = [
            f"{start + datetime.timedelta(minutes=minutes * i):%Y-%m-%d %H:%M:%S}" for i in range(len(rows))
        ]
        body = [f"{date},{row.split(',', 1)[1]}" for date, row in zip(dated, rows[1:])]
        path.write_text("\n".join([rows[0], *body]) + "\n")
        return path

    def period(path: Path, **model) -> int:
        model = {"placeholders": "last_period", "patch_len": 24, **model}
        config = {"data": {"input_len": 96, "label_len": 24, "horizon": 24}, "model": model}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
        config = forecast_run.load_config(tmp_path / "c.yaml", **{"data.path": str(path)})
        return forecast_run.build_training(config, tmp_path / "c.yaml").model.period

    assert period(small_csv) == 24
    assert period(stamped(15)) == 96
    assert period(stamped(15), period=48) == 48
    with pytest.raises(UserError, match=r"model.period must be in \[1, seq_len=96\] .*, got 1440 "):
        period(stamped(1))  # 1,440 steps a day


def test_shipped_recipe_is_the_benchmarked_one_and_fits_every_horizon(ett_dir: Path, etth1: Path) -> None:
    """benchmarks/forecast_ett.py runs configs/ett.yaml, and every point of its search is a model the
    standard horizons can train (none refused)."""
    from aiayn.forecast.tune import Tuner, points

    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo / "benchmarks"))  # forecast_ett imports its sibling `common`
    try:
        spec = importlib.util.spec_from_file_location("forecast_ett", repo / "benchmarks" / "forecast_ett.py")
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(repo / "benchmarks"))
    assert bench.CONFIG == repo / "configs" / "ett.yaml"
    assert bench.DATA_DIR.resolve() == ett_dir.resolve()
    for horizon in bench.HORIZONS:
        config = forecast_run.load_config(bench.CONFIG, **{"data.path": str(etth1), "data.horizon": horizon})
        tuner = Tuner(config, bench.CONFIG, Path("/nonexistent"))
        todo, refused = points(config, tuner.tune, tuner.check)
        grid = np.prod([len(values) for values in tuner.tune.space.values()])
        assert refused == 0 and len(todo) == grid and todo[0] == {}, (horizon, refused)


def _with_columns(src: Path, dst: Path, order: list[str], extra: bool = False) -> Path:
    """``src`` with its columns in ``order`` (a subset allowed), plus a junk column if ``extra``."""
    rows = list(csv.DictReader(src.open()))
    with dst.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(order + ["junk"] * extra)
        writer.writerows([r[c] for c in order] + ["1.5"] * extra for r in rows)
    return dst


def test_other_data_file_matched_to_the_checkpoint_columns_by_name(
    tmp_path, small_csv, config, capsys
) -> None:
    """evaluate/predict --data: columns picked by name (order free, extras ignored), a missing one exits 2."""
    run = tmp_path / "run"
    assert _train(config, small_csv, run) == 0
    names = ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]
    order = ["OT", "date", *reversed(names[:-1])]
    files = {
        "same": small_csv,
        "reordered": _with_columns(small_csv, tmp_path / "reordered.csv", order),
        "extra": _with_columns(small_csv, tmp_path / "extra.csv", order, extra=True),
    }
    results = {}
    for name, path in files.items():
        capsys.readouterr()
        assert cli.main(["forecast", "evaluate", "--checkpoint", str(run), "--data", str(path)]) == 0
        pred = tmp_path / f"{name}.pred.csv"
        assert (
            cli.main(
                ["forecast", "predict", "--checkpoint", str(run), "--data", str(path), "--out", str(pred)]
            )
            == 0
        )
        results[name] = (capsys.readouterr().out.splitlines()[0], pred.read_text())
    assert results["reordered"] == results["extra"] == results["same"]
    assert results["same"][1].startswith("date," + ",".join(names))

    missing = _with_columns(small_csv, tmp_path / "missing.csv", ["date", *names[:5], "OT"])
    for command in (
        ["evaluate"],
        ["predict", "--out", str(tmp_path / "x.csv")],
        ["plot", "--out", str(tmp_path / "x.png")],
    ):
        assert cli.main(["forecast", *command, "--checkpoint", str(run), "--data", str(missing)]) == 2
        _one_line_error(capsys, "missing.csv", "'LULL' not found")


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
    assert sorted(p.name for p in run.iterdir()) == ["best", "checkpoints", "metrics.jsonl", "run.yaml"]
    assert [p.name for p in list_checkpoints(run)] == ["step-00000003"]  # 1 epoch of 3 steps
    assert (run / "best" / "model.safetensors").is_file()
    assert yaml.safe_load((run / "run.yaml").read_text())["train"]["max_steps_per_epoch"] == 3
    stored = json.loads((run / "best" / "config.json").read_text())
    assert stored["kind"] == "forecast" and len(stored["scaler"]["mean"]) == 7

    assert cli.main(["forecast", "evaluate", "--checkpoint", str(run), "--split", "test"]) == 0
    out = capsys.readouterr().out
    assert (
        "test: MSE" in out
        and "MAE" in out
        and "over every window of the split (105 windows, none dropped" in out
    )

    assert (
        cli.main(["forecast", "predict", "--checkpoint", str(run), "--out", str(tmp_path / "pred.csv")]) == 0
    )
    rows = list(csv.reader((tmp_path / "pred.csv").open()))
    assert rows[0] == ["date", "HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"] and len(rows) == 17
    last = small_csv.read_text().splitlines()[-1].split(",")[0]  # 2016-07-25 23:00:00
    assert (
        last == "2016-07-25 23:00:00"
        and rows[1][0] == "2016-07-26 00:00:00"
        and rows[16][0] == "2016-07-26 15:00:00"
    )
    ot = np.array([float(r[7]) for r in rows[1:]])
    assert np.all(np.isfinite(ot)) and 0 < ot.mean() < 60  # original units (degrees), not standardised

    assert cli.main(["forecast", "plot", "--checkpoint", str(run), "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    two = ["forecast", "plot", "--checkpoint", str(run), "--column", "OT", "HUFL", "--window", "0"]
    assert cli.main([*two, "--out", str(tmp_path / "two.png")]) == 0
    from PIL import Image

    tall, one = (Image.open(tmp_path / name).size[1] for name in ("two.png", "p.png"))
    assert tall > 1.5 * one  # a panel per column
    capsys.readouterr()
    assert cli.main([*two[:4], "--column", "XX", "--out", str(tmp_path / "x.png")]) == 2
    _one_line_error(capsys, "--column: 'XX' is not a forecast column")
    assert cli.main([*two[:4], "--window", "105", "--out", str(tmp_path / "x.png")]) == 2
    _one_line_error(capsys, "--window 105: the test split has 105 windows")

    capsys.readouterr()
    assert _train(config, small_csv, run, "--max-epochs", "2") == 0  # resume for one more epoch
    out = capsys.readouterr().out
    assert "resuming from" in out and "resumed at step 3, epoch 2," in out
    assert "epoch 2:" in out and "epoch 1:" not in out
    state = json.loads((latest_checkpoint(run) / "state.json").read_text())
    assert state["sampler"]["epoch"] == 2 and len(state["task"]["history"]) == 2
    assert [p.name for p in list_checkpoints(run)] == ["step-00000006"]  # keeps the last one
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["split"], r["step"]) for r in records] == [("valid", 3), ("valid", 6)]


def test_resume_with_the_weight_average_switched_exits_2(tmp_path, small_csv, config, capsys) -> None:
    """best_val and best/ were measured on the average (or on the raw weights): no silent switch."""
    plain = config.read_text()
    assert _train(config, small_csv, tmp_path / "run", "--max-epochs", "1") == 0
    config.write_text(plain.replace("seed: 0}", "seed: 0, ema: 0.5}"))
    capsys.readouterr()
    assert _train(config, small_csv, tmp_path / "run", "--max-epochs", "2") == 2
    _one_line_error(capsys, "without a weight average (train.ema)", "new --out")
    state = json.loads((latest_checkpoint(tmp_path / "run") / "state.json").read_text())
    assert state["sampler"]["epoch"] == 1  # nothing trained, nothing overwritten


def test_resume_with_another_model_exits_2(tmp_path, small_csv, config, capsys) -> None:
    assert _train(config, small_csv, tmp_path / "run", "--max-epochs", "1") == 0
    config.write_text(config.read_text().replace("d_model: 16", "d_model: 32"))
    capsys.readouterr()
    assert _train(config, small_csv, tmp_path / "run", "--max-epochs", "2") == 2
    _one_line_error(capsys, "holds a run with other settings (model.d_model 16 -> 32)", "new --out")
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step-00000003"]


@pytest.mark.parametrize("ema", [0.0, 0.5])
def test_resume_is_exact(tmp_path, small_csv, config, ema) -> None:
    """Two epochs in one go = one epoch, then resume for the second (same weights, same average).

    Dropout is on, so the weights only match if the RNG state is saved and restored."""
    text = (
        config.read_text()
        .replace("seed: 0}", f"seed: 0, ema: {ema}}}")
        .replace("dropout: 0.0", "dropout: 0.1")
    )
    assert "dropout: 0.1" in text
    config.write_text(text)
    assert _train(config, small_csv, tmp_path / "a", "--max-epochs", "2") == 0
    assert _train(config, small_csv, tmp_path / "b", "--max-epochs", "1") == 0
    assert _train(config, small_csv, tmp_path / "b", "--max-epochs", "2") == 0
    for kind in ("checkpoints/step-00000006", "best"):
        wa, wb = (load_file(str(tmp_path / run / kind / "model.safetensors")) for run in ("a", "b"))
        assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
    if ema:  # best/ holds the average, which differs from the trained weights
        best, last = (
            load_file(str(tmp_path / "a" / kind / "model.safetensors"))
            for kind in ("best", "checkpoints/step-00000006")
        )
        assert any(not torch.equal(best[k], last[k]) for k in best)


def _train_command(config: Path, data: Path, out: Path) -> list[str]:
    forecast = ["forecast", "train", "--config", str(config), "--data", str(data), "--out", str(out)]
    return [sys.executable, "-m", "aiayn", *forecast, "--threads", "1"]


def test_sigkill_then_resume_is_bit_identical(tmp_path, kill_after_checkpoints, capfd) -> None:
    """A run killed after its first checkpoint and resumed ends with the uninterrupted run's weights,
    best/ and log (dropout and the weight average on: the RNG state and the average are restored).
    The uninterrupted and the resumed runs run in this process (``main``, on one thread as the
    killed process is, their output on files as a log's: capfd); only the killed one needs its own."""
    data = write_ett_like_csv(tmp_path / "series.csv", rows=1000)
    config = tmp_path / "run.yaml"
    config.write_text(
        TINY_CONFIG.replace("dropout: 0.0", "dropout: 0.1")
        .replace("batch_size: 64", "batch_size: 128")
        .replace(
            "max_epochs: 1, max_steps_per_epoch: 3, seed: 0",
            "max_epochs: 5, patience: 5, lr_decay: 0.9, ema: 0.5, log_every: 4, seed: 0",
        )
    )
    assert "ema: 0.5" in config.read_text()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    assert cli.main(_train_command(config, data, tmp_path / "straight")[3:]) == 0
    straight = capfd.readouterr()
    assert "\r" not in straight.err and "split=train" in straight.out  # no bar in a log: lines

    killed_at = kill_after_checkpoints(
        _train_command(config, data, tmp_path / "killed"), tmp_path / "killed", 1, env
    )
    resumed = cli.main(_train_command(config, data, tmp_path / "killed")[3:])
    assert resumed == 0, capfd.readouterr().err[-2000:]
    assert "resuming from" in capfd.readouterr().out

    final = [p.name for p in list_checkpoints(tmp_path / "straight")]
    assert [p.name for p in list_checkpoints(tmp_path / "killed")] == final and final[-1] != killed_at
    for kind in (f"checkpoints/{final[-1]}", "best"):
        wa, wb = (load_file(str(tmp_path / run / kind / MODEL_FILE)) for run in ("straight", "killed"))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), kind
    logs = [(tmp_path / run / "metrics.jsonl").read_text() for run in ("straight", "killed")]
    assert logs[0] == logs[1] and logs[0].count('"valid"') == 5


def test_inference_never_imports_the_training_package() -> None:
    code = (
        "import sys, aiayn.forecast, aiayn.forecast.cli; aiayn.forecast.evaluate; "
        "assert not [m for m in sys.modules if m.startswith('aiayn.train')], sorted(sys.modules); "
        "import aiayn.forecast.train; assert 'aiayn.train.engine' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
