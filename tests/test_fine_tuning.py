"""Fine-tuning (``aiayn train --init``): every setting is checked against the checkpoint before any
data is prepared or model built, each problem one line naming the setting and both values, all of
them listed at once. The checkpoints are made here, untrained (only their config and tokenizer
matter), on the built-in digits->words task."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from aiayn.checkpoint import save_checkpoint
from aiayn.cli import main
from aiayn.config import TransformerConfig
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import SettingError
from aiayn.model import build_model
from aiayn.train.config import run_config_from_dict
from conftest import TINY_MODEL, run_config

MAX_LEN = TINY_MODEL["max_len"]  # 64: below the default model's 1024


@pytest.fixture(scope="module")
def sentences(task_dir: Path) -> list[str]:
    return [
        line for lang in ("digits", "words") for line in (task_dir / f"train.{lang}").read_text().split("\n")
    ]


@pytest.fixture(scope="module")
def checkpoints(sentences: list[str], tmp_path_factory) -> dict[str, Path]:
    """Untrained tiny checkpoints of each tokenizer kind (BPE, unigram, lowercasing BPE), and one of
    a max_len above the default model's."""
    root = tmp_path_factory.mktemp("checkpoints")
    kinds = {"bpe": {}, "unigram": {"model_type": "unigram"}, "lowercase": {"lowercase": True}}
    made = {
        name: checkpoint(root / name, Tokenizer.train(sentences, vocab_size=400, **kw))
        for name, kw in kinds.items()
    }
    made["long"] = checkpoint(root / "long", Tokenizer.train(sentences, vocab_size=400), max_len=4096)
    return made


def checkpoint(path: Path, tokenizer: Tokenizer, **model) -> Path:
    vocab = {"src_vocab_size": tokenizer.vocab_size, "tgt_vocab_size": tokenizer.vocab_size}
    config = TransformerConfig(**{**TINY_MODEL, **vocab, **model})
    return save_checkpoint(
        path, build_model(config), {"kind": "translation", "model": config.to_dict()}, tokenizer.to_bytes()
    )


def fine_tuning(task_dir: Path, init: Path, model: dict | None = None, **data) -> dict:
    """A run config fine-tuning ``init``: no model section unless ``model``."""
    values = run_config(task_dir, data=data, train={"init": str(init)})
    values["model"] = model or {}
    return values


def refused(values: dict, tmp_path: Path, capsys) -> list[str]:
    """The error lines of ``aiayn train`` on ``values`` (exit status 2, no traceback, no work done)."""
    config = tmp_path / "fine_tune.yaml"
    config.write_text(yaml.safe_dump(values))
    out = tmp_path / "run"
    code = main(["train", "--config", str(config), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert not (out / "data").exists() and not (out / "checkpoints").exists()  # before any work
    lines = err.splitlines()
    assert all(line.startswith("aiayn: error: ") for line in lines), err
    return [line.removeprefix("aiayn: error: ") for line in lines]


def problems(values: dict) -> list[str]:
    """The problem lines :func:`load_init` finds in ``values`` against its train.init checkpoint."""
    from aiayn.train.fine_tuning import load_init

    try:
        load_init(run_config_from_dict(values))
    except SettingError as err:
        return str(err).splitlines()
    return []


def test_max_sentence_tokens_above_the_checkpoints_max_len_is_one_line_not_a_traceback(
    task_dir, checkpoints, tmp_path, capsys
) -> None:
    """100 tokens fit the default model's max_len (1024), so the config itself passes; the
    checkpoint's 64 do not."""
    lines = refused(fine_tuning(task_dir, checkpoints["bpe"], max_sentence_tokens=100), tmp_path, capsys)
    assert len(lines) == 1 and lines[0].startswith("data.max_sentence_tokens 100 "), lines
    assert f"the --init checkpoint's model.max_len is {MAX_LEN}" in lines[0], lines
    assert f"{MAX_LEN - 1} or less" in lines[0], lines  # what to do


def test_the_limit_is_the_checkpoints_max_len_not_the_default_models(task_dir, checkpoints) -> None:
    """2000 tokens are more than the default model's max_len (1024) takes, not more than a 4096 one's."""
    assert problems(fine_tuning(task_dir, checkpoints["long"], max_sentence_tokens=2000)) == []
    assert problems(fine_tuning(task_dir, checkpoints["bpe"], max_sentence_tokens=MAX_LEN - 1)) == []
    assert len(problems(fine_tuning(task_dir, checkpoints["bpe"], max_sentence_tokens=MAX_LEN))) == 1


def test_every_problem_is_listed_one_line_each(task_dir, checkpoints, tmp_path, capsys) -> None:
    model = {"d_model": 64, "n_heads": 2, "dropout": 0.3}  # the dropout may differ
    values = fine_tuning(task_dir, checkpoints["unigram"], model, max_sentence_tokens=100, lowercase=True)
    values["data"]["bpe_dropout"] = 0.1
    lines = refused(values, tmp_path, capsys)
    assert [line.split(" ")[0] for line in lines] == [
        "model.d_model",
        "model.n_heads",
        "data.max_sentence_tokens",
        "data.lowercase",
        "data.bpe_dropout",
    ], lines
    assert "model.d_model 64 differs from the --init checkpoint's 32" in lines[0], lines
    assert "model.n_heads 2 differs from the --init checkpoint's 4" in lines[1], lines


def test_a_preset_names_the_fields_it_sets_unlike_the_checkpoint(task_dir, checkpoints) -> None:
    found = problems(fine_tuning(task_dir, checkpoints["bpe"], {"preset": "tiny"}))
    assert found[0].startswith(
        "model.d_model 128 (model.preset 'tiny') differs from the --init checkpoint's 32"
    ), found
    fields = [line.split(" ")[0] for line in found]
    assert all("(model.preset 'tiny')" in line for line in found) and "model.dropout" not in fields, found
    same = {name: TINY_MODEL[name] for name in ("d_model", "n_heads", "max_len", "tie_embeddings")}
    assert problems(fine_tuning(task_dir, checkpoints["bpe"], {**same, "attention_dropout": 0.2})) == []


def test_lowercase_must_be_the_checkpoint_tokenizers(task_dir, checkpoints) -> None:
    """The checkpoint's tokenizer encodes the data: data.lowercase cannot say otherwise."""
    (line,) = problems(fine_tuning(task_dir, checkpoints["lowercase"]))
    assert line.startswith("data.lowercase false, but the --init checkpoint's tokenizer lowercases"), line
    assert "set data.lowercase true" in line, line
    assert problems(fine_tuning(task_dir, checkpoints["lowercase"], lowercase=True)) == []
    (line,) = problems(fine_tuning(task_dir, checkpoints["bpe"], lowercase=True))
    assert line.startswith("data.lowercase true, but the --init checkpoint's tokenizer keeps case"), line


def test_bpe_dropout_needs_a_bpe_checkpoint(task_dir, checkpoints) -> None:
    """A unigram model has no merges to drop: the default data.tokenizer (bpe) does not hide that."""
    (line,) = problems(fine_tuning(task_dir, checkpoints["unigram"], bpe_dropout=0.1))
    assert line.startswith("data.bpe_dropout 0.1 needs a BPE tokenizer, but the --init checkpoint's is a ")
    assert "unigram" in line, line
    assert problems(fine_tuning(task_dir, checkpoints["bpe"], bpe_dropout=0.1)) == []


def test_a_prepared_data_dir_must_hold_the_checkpoints_tokenizer(
    task_dir, checkpoints, tmp_path, capsys
) -> None:
    from aiayn.data.prepare import prepare
    from aiayn.loading import load

    values = fine_tuning(task_dir, checkpoints["bpe"])
    settings = run_config_from_dict(values).prepare_settings()
    prepared = tmp_path / "prepared"
    prepare(
        task_dir, prepared, settings, tokenizer=load(checkpoints["unigram"]).tokenizer, log=lambda _: None
    )
    (line,) = problems({**values, "data": {**values["data"], "dir": str(prepared)}})
    assert line.startswith(f"data.dir {prepared} was prepared with another tokenizer"), line
    prepare(
        task_dir,
        tmp_path / "same",
        settings,
        tokenizer=load(checkpoints["bpe"]).tokenizer,
        log=lambda _: None,
    )
    assert problems({**values, "data": {**values["data"], "dir": str(tmp_path / "same")}}) == []
    # the run directory's own data/, left by a run begun with another --init: refused when opened
    shutil.copytree(prepared, tmp_path / "run" / "data")
    config = tmp_path / "fine_tune.yaml"
    config.write_text(yaml.safe_dump(values))
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "was prepared with another tokenizer than the --init checkpoint's" in line, line
    assert line.endswith("delete it, or give a new --out"), line


def test_a_forecasting_checkpoint_is_refused_alone(task_dir, tmp_path, capsys) -> None:
    from aiayn.forecast.model import ForecastConfig, Forecaster

    config = ForecastConfig(d_model=8, n_heads=2, d_ff=8)
    path = save_checkpoint(
        tmp_path / "forecast", Forecaster(config), {"kind": "forecast", "model": config.to_dict()}
    )
    (line,) = refused(fine_tuning(task_dir, path, {"d_model": 64}, max_sentence_tokens=100), tmp_path, capsys)
    assert line.startswith("train.init (--init): ") and "'forecast' checkpoint, not a translation one" in line


def test_a_fine_tuning_run_resumes_without_init_and_refuses_another(
    task_dir, checkpoints, tmp_path, capsys
) -> None:
    """Resumed, the run's model is its checkpoint's whether --init is given again or not (without it,
    the default model was built and the weights did not fit); another --init is refused."""
    values = fine_tuning(task_dir, checkpoints["bpe"])
    values["train"].update(max_steps=1, save_every=1, valid_every=0, log_every=0)
    config, out = tmp_path / "fine_tune.yaml", tmp_path / "run"
    command = ["train", "--config", str(config), "--out", str(out), "--no-progress"]
    config.write_text(yaml.safe_dump(values))
    assert main(command) == 0
    del values["train"]["init"]
    config.write_text(yaml.safe_dump({**values, "train": {**values["train"], "max_steps": 2}}))
    assert main(command) == 0 and "resumed at step 1" in capsys.readouterr().out
    assert main([*command, "--max-steps", "3", "--init", str(checkpoints["unigram"])]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"aiayn: error: train.init (--init) {checkpoints['unigram']}, but {out} holds a run"
    )
    assert f"began from {checkpoints['bpe']}: resume it without train.init (--init)" in line, line
