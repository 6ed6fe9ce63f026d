"""Bad corpora through the real command: one line naming the file, exit status 2, no traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aiayn.cli import main

CONFIG = """model: {d_model: 16, n_heads: 2, n_encoder_layers: 1, n_decoder_layers: 1, d_ff: 32}
data: {src_lang: de, tgt_lang: en, vocab_size: 300}
train: {max_steps: 1, device: cpu, precision: fp32}
"""


def _corpus(directory: Path, de: bytes, en: bytes) -> Path:
    directory.mkdir()
    (directory / "train.de").write_bytes(de)
    (directory / "train.en").write_bytes(en)
    (directory / "val.de").write_bytes(b"ein Hund\n")
    (directory / "val.en").write_bytes(b"a dog\n")
    return directory


@pytest.mark.parametrize(
    "de, en, message",
    [
        (b"ein\nzwei\ndrei\n", b"one\ntwo\n", r"train\.de has 3 lines but .*train\.en has 2"),
        (b"gut\n\xff\xfe kaputt\n", b"good\nbroken\n", r"train\.de:2: invalid UTF-8"),
        (b"\n  \n", b"\n\n", r"empty"),
    ],
    ids=["mismatched-lines", "invalid-utf8", "empty-corpus"],
)
def test_bad_corpus_is_one_clear_line(tmp_path: Path, capsys, de: bytes, en: bytes, message: str) -> None:
    corpus = _corpus(tmp_path / "corpus", de, en)
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG)
    code = main(["train", "--config", str(config), "--data-dir", str(corpus), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("aiayn: error:") and "\n" not in err and "Traceback" not in err
    assert re.search(message, err), err


def test_missing_language_lists_what_exists(tmp_path: Path, capsys) -> None:
    corpus = _corpus(tmp_path / "corpus", b"ein\n", b"one\n")
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG)
    code = main(
        [
            "train",
            "--config",
            str(config),
            "--data-dir",
            str(corpus),
            "--tgt-lang",
            "fr",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "train.fr" in err and "en" in err and "Traceback" not in err


def test_missing_data_directory(tmp_path: Path, capsys) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG)
    code = main(
        ["train", "--config", str(config), "--data-dir", str(tmp_path / "nope"), "--out", str(tmp_path / "r")]
    )
    assert code == 2 and "data directory not found" in capsys.readouterr().err
