"""`aiayn demo` end to end on a short schedule: it trains, reports, draws, and reuses its run."""

from __future__ import annotations

import re
from pathlib import Path

from aiayn.cli import main
from aiayn.demo import demo_config_path
from aiayn.train.config import load_run_config


def test_demo_config_is_the_shipped_one() -> None:
    shipped = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
    assert shipped.read_text() == demo_config_path().read_text()
    config = load_run_config(demo_config_path())
    assert config.train.max_steps > 0 and config.data.src_lang == "digits"


def test_demo_trains_reports_draws_and_reuses(tmp_path: Path, capsys) -> None:
    # 120 steps: after 40 the model wrote ~60 pieces for 907042, and drawing their attention (twice)
    # and decoding such outputs cost more than the 80 more steps
    args = ["demo", "--out", str(tmp_path), "--max-steps", "120", "--beam", "2", "--no-progress"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "wrote the digits->words task" in first
    assert re.search(r"exact match on 1000 held-out test numbers: \d+/1000", first)
    assert first.count(" -> ") == 8  # the sample translations
    assert f"aiayn serve --checkpoint {tmp_path / 'run'}" in first  # the next steps, on this run
    for name in ("attention.png", "positional_encoding.png", "curves.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (
            tmp_path / name
        ).stat().st_size > 10_000
    assert main(args) == 0
    second = capsys.readouterr().out
    assert "reusing the trained model" in second and "trained a joint" not in second
    accuracy = lambda out: re.search(r"exact match (\d+\.\d+)%", out).group(1)  # noqa: E731
    assert accuracy(first) == accuracy(second)


def test_a_bad_beam_fails_before_training(tmp_path: Path, capsys) -> None:
    assert main(["demo", "--beam", "0", "--out", str(tmp_path / "demo")]) == 2
    assert "beam: must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()
