"""Training on Multi30k: a smoke run whose loss falls; and a lowercasing run (on synthetic text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aiayn.checkpoint import MODEL_FILE, load_checkpoint
from aiayn.cli import main
from aiayn.train.config import run_config_from_dict
from aiayn.train.engine import start
from aiayn.train.translation import TranslationTask
from conftest import run_config


def test_multi30k_smoke_run_loss_falls(multi30k_dir: Path, tmp_path: Path) -> None:
    values = run_config(
        multi30k_dir,
        model={"dropout": 0.0, "d_model": 64, "d_ff": 128},
        data={
            "src_lang": "de",
            "tgt_lang": "en",
            "vocab_size": 2000,
            "batch_tokens": 2048,
            "max_sentence_tokens": 60,
        },
        optim={"warmup": 30, "lr_factor": 2.0},
        train={"max_steps": 30, "save_every": 30, "valid_every": 30, "log_every": 5},
    )
    logs: list[str] = []
    trainer = start(
        TranslationTask(run_config_from_dict(values)), tmp_path / "run", log=logs.append, progress=False
    )
    trainer.valid_examples = trainer.valid_examples[:200]  # keep the smoke run short
    trainer.engine.run(trainer)
    assert any(line.startswith("read 29000 pairs") for line in logs)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in records if r["split"] == "train"]
    assert len(train) == 6 and train[-1] < train[0] - 1.0, train
    assert (tmp_path / "run" / "best" / MODEL_FILE).is_file()


def test_lowercase_run_reads_and_writes_lowercase_and_scores_case_insensitively(
    parallel_dir: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, count in (("train", 300), ("val", 6)):
        for lang in ("en", "de"):
            lines = (parallel_dir / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            (corpus / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    values = run_config(
        corpus,
        data={"src_lang": "en", "tgt_lang": "de", "vocab_size": 600, "lowercase": True},
        train={"max_steps": 2, "save_every": 2, "valid_every": 0},
    )
    trainer = start(
        TranslationTask(run_config_from_dict(values)), tmp_path / "run", log=lambda _: None, progress=False
    )
    trainer.engine.run(trainer)
    assert trainer.tokenizer.lowercases
    assert load_checkpoint(tmp_path / "run").tokenizer_bytes == trainer.tokenizer.to_bytes()
    # Validation BLEU ignores case: a lowercasing model cannot write the references' capitals.
    from aiayn.decode import Translation, Translator

    references = [t for _, t in trainer.valid_pairs]
    lowered = [Translation(r.lower()) for r in references]
    monkeypatch.setattr(Translator, "translate", lambda self, sources: lowered)
    assert trainer._bleu()["bleu"] == pytest.approx(100.0)
    monkeypatch.undo()
    src, ref = corpus / "val.en", corpus / "val.de"
    assert (
        main(["evaluate", "--checkpoint", str(tmp_path / "run"), "--src", str(src), "--ref", str(ref)]) == 0
    )
    assert "BLEU = " in (out := capsys.readouterr().out) and "|case:lc|" in out
