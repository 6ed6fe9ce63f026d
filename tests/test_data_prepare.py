"""Prepared data: the same pairs as encoding the text, a sampled tokenizer, interrupted preparation,
files checked against the manifest, settings checked against the run, training on the memory map."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from aiayn.checkpoint import MODEL_FILE, list_checkpoints
from aiayn.cli import main
from aiayn.data.corpus import encode_corpus, read_parallel
from aiayn.data.prepare import PARTIAL, prepare, sample_sentences
from aiayn.data.prepared import MANIFEST, PrepareSettings, open_prepared
from aiayn.data.synthetic import write_task
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from conftest import free_port, launched, run_config, write_parallel_text

TASK = PrepareSettings("digits", "words", vocab_size=400, max_sentence_tokens=32)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("task")
    write_task(directory, seed=0, n_train=400, n_valid=40, n_test=40)
    return directory


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, parallel_dir: Path) -> Path:
    """The synthetic corpus's de-en train and val, with training pairs too long for 40 tokens (every
    97th) and of too unequal lengths for a ratio of 2 (every 89th) among them."""
    directory = tmp_path_factory.mktemp("corpus")
    read = lambda path: path.read_text(encoding="utf-8").splitlines()  # noqa: E731
    for split in ("train", "val"):
        de, en = (read(parallel_dir / f"{split}.{lang}") for lang in ("de", "en"))
        if split == "train":
            for i in range(0, len(de), 97):
                de[i], en[i] = " ".join([de[i]] * 6), " ".join([en[i]] * 6)
            for i in range(1, len(de), 89):
                en[i] = " ".join([en[i]] * 3)
        for lang, lines in (("de", de), ("en", en)):
            (directory / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def test_prepared_pairs_are_the_encoded_text_of_the_corpus(corpus: Path, tmp_path: Path) -> None:
    """Encoded in 5 chunks by 2 processes: the tokenizer, the kept pairs, their ids and the
    validation text are what reading, encoding and filtering the whole text in one process gives."""
    settings = PrepareSettings("de", "en", max_sentence_tokens=40, max_ratio=2.0)
    data = prepare(corpus, tmp_path / "bin", settings, workers=2, chunk_pairs=400, log=print)
    pairs, stats = read_parallel(corpus, "train", "de", "en")
    tokenizer = Tokenizer.train([s for pair in pairs for s in pair], vocab_size=8000, seed=1)
    assert data.tokenizer.to_bytes() == tokenizer.to_bytes()
    expected = encode_corpus(pairs, stats, tokenizer.encode_batch, 40, 2.0)
    train = data.split("train")
    assert len(train) == len(expected) == stats.n_kept and stats.n_too_long and stats.n_bad_ratio
    assert data.summary("train") == stats.summary()
    assert all(a.tolist() == s and b.tolist() == t for (a, b), (s, t) in zip(train, expected))
    assert train.src.dtype == np.uint16 and train[0][0].dtype == np.uint16
    assert data.texts("val") == read_parallel(corpus, "val", "de", "en")[0]
    assert not (tmp_path / "bin" / PARTIAL).exists()


def test_the_tokenizer_is_trained_on_a_seeded_sample_of_pairs(task_dir: Path, tmp_path: Path) -> None:
    files = (task_dir / "train.digits", task_dir / "train.words")
    sample = sample_sentences(files, 400, 50, seed=3)
    assert len(sample) == 100 and sample == sample_sentences(files, 400, 50, seed=3)
    assert sample != sample_sentences(files, 400, 50, seed=4)
    pairs = set(zip(*(f.read_text().splitlines() for f in files)))
    assert all((s, t) in pairs for s, t in zip(sample[::2], sample[1::2]))
    assert sample_sentences(files, 400, 0, seed=3) == sample_sentences(files, 400, 400, seed=3)
    settings = PrepareSettings("digits", "words", vocab_size=400, tokenizer_sample=50, seed=3)
    data = prepare(task_dir, tmp_path / "bin", settings, log=print)
    assert data.tokenizer.to_bytes() == Tokenizer.train(sample, vocab_size=400, seed=3).to_bytes()


def _prepare_command(config: Path, out: Path, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "aiayn",
        "data",
        "prepare",
        "--config",
        str(config),
        "--out",
        str(out),
        *flags,
    ]


def _config(tmp_path: Path, data_dir: Path, **data) -> Path:
    values = run_config(data_dir, data=data)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_a_killed_prepare_run_again_finishes_like_an_uninterrupted_one(tmp_path: Path, capsys) -> None:
    """The uninterrupted preparation and the one run again run in this process (``main``); only the
    killed one needs a process of its own."""
    corpus = write_parallel_text(tmp_path / "corpus", {"train": 12000, "val": 100}, seed=1)
    config = _config(tmp_path, corpus, src_lang="de", tgt_lang="en", vocab_size=2000)
    flags = ("--chunk-pairs", "500", "--workers", "1")  # 24 chunks, one at a time
    assert main(_prepare_command(config, tmp_path / "straight", *flags)[3:]) == 0
    victim = subprocess.Popen(
        _prepare_command(config, tmp_path / "killed", *flags), stdout=subprocess.DEVNULL
    )
    partial, deadline = tmp_path / "killed" / PARTIAL, time.time() + 120
    while len(list(partial.glob("chunk-*.npz"))) < 3 and victim.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL, "the preparation finished before it could be killed"
    assert not (tmp_path / "killed" / MANIFEST).exists()
    capsys.readouterr()
    assert main(_prepare_command(config, tmp_path / "killed", *flags)[3:]) == 0, capsys.readouterr().err
    encoded = [line for line in capsys.readouterr().out.splitlines() if line.startswith("encoded")][-1]
    assert int(encoded.split("/")[1].split()[0]) < 24, encoded  # the chunks written before the kill were kept
    straight = sorted(p.name for p in (tmp_path / "straight").iterdir())
    assert straight == sorted(p.name for p in (tmp_path / "killed").iterdir())
    for name in straight:
        assert (tmp_path / "straight" / name).read_bytes() == (tmp_path / "killed" / name).read_bytes(), name


@pytest.fixture()
def prepared(task_dir: Path, tmp_path: Path) -> Path:
    config = _config(tmp_path, task_dir)
    assert main(["data", "prepare", "--config", str(config), "--out", str(tmp_path / "bin")]) == 0
    return tmp_path / "bin"


def _train(config: Path, data_dir: Path, out: Path, *flags: str) -> int:
    return main(["train", "--config", str(config), "--data-dir", str(data_dir), "--out", str(out), *flags])


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda d: (d / "train.src.npy").write_bytes((d / "train.src.npy").read_bytes()[:-10]),
            "train.src.npy has",
        ),
        (lambda d: _flip_byte(d / "train.idx.npy"), "train.idx.npy does not match the SHA-256"),
        (lambda d: _flip_byte(d / "val.tgt.txt"), "val.tgt.txt does not match the SHA-256"),
        (
            lambda d: Tokenizer.train(["eins zwei drei"] * 20, vocab_size=300).save(d / "spm.model"),
            "spm.model has",
        ),
        (lambda d: (d / "val.src.npy").unlink(), "val.src.npy is missing"),
        (lambda d: (d / MANIFEST).write_text("{"), "manifest.json: not a valid manifest"),
    ],
    ids=["truncated", "edited-index", "edited-text", "another-tokenizer", "missing", "bad-manifest"],
)
def test_files_that_do_not_match_the_manifest_are_refused(
    prepared: Path, tmp_path: Path, capsys, damage, message
):
    damage(prepared)
    capsys.readouterr()
    assert _train(_config(tmp_path, prepared), prepared, tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "change, named",
    [
        ({"vocab_size": 300}, "data.vocab_size prepared 400, config 300"),
        ({"src_lang": "words", "tgt_lang": "digits"}, "data.src_lang prepared 'digits', config 'words'"),
        ({"max_ratio": 2.5}, "data.max_ratio prepared 3.0, config 2.5"),
        ({"lowercase": True}, "data.lowercase prepared False, config True"),
    ],
)
def test_training_with_other_data_settings_is_refused(
    prepared: Path, tmp_path: Path, capsys, change, named
) -> None:
    capsys.readouterr()
    assert _train(_config(tmp_path, prepared, **change), prepared, tmp_path / "run") == 2
    err = capsys.readouterr().err
    assert f"{prepared} was prepared with other data settings: {named}" in err and "Traceback" not in err
    # batching settings are not data settings: they may differ
    assert _train(_config(tmp_path, prepared, batch_tokens=300), prepared, tmp_path / "ok") == 0


def test_preparing_again_into_a_prepared_directory(
    prepared: Path, task_dir: Path, tmp_path: Path, capsys
) -> None:
    config = _config(tmp_path, task_dir)
    before = {p.name: p.stat().st_mtime_ns for p in prepared.iterdir()}
    assert main(["data", "prepare", "--config", str(config), "--out", str(prepared)]) == 0
    assert "prepared already" in capsys.readouterr().out
    assert before == {p.name: p.stat().st_mtime_ns for p in prepared.iterdir()}
    other = _config(tmp_path, task_dir, vocab_size=300)
    assert main(["data", "prepare", "--config", str(other), "--out", str(prepared)]) == 2
    assert "data.vocab_size prepared 400, config 300 (write to another directory" in capsys.readouterr().err


def test_training_on_prepared_data_equals_training_on_the_text(
    prepared: Path, task_dir: Path, tmp_path: Path
):
    """The memory map gives the batches the text gives: the same weights; the text is prepared into the
    run directory on first use and a resumed run does not read the corpus again."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for file in task_dir.iterdir():
        (corpus / file.name).write_bytes(file.read_bytes())
    config = _config(tmp_path, corpus)
    assert _train(config, prepared, tmp_path / "on_bin", "--max-steps", "8") == 0
    assert _train(config, corpus, tmp_path / "on_text", "--max-steps", "4") == 0
    assert open_prepared(tmp_path / "on_text" / "data").manifest["corpus"] == str(corpus.resolve())
    for file in corpus.iterdir():
        file.unlink()  # the resumed run reads its data/
    corpus.rmdir()
    assert _train(config, corpus, tmp_path / "on_text", "--max-steps", "8") == 0
    final = lambda run: load_file(str(list_checkpoints(run)[-1] / MODEL_FILE))  # noqa: E731
    on_bin, on_text = final(tmp_path / "on_bin"), final(tmp_path / "on_text")
    assert all(torch.equal(tensor, on_text[name]) for name, tensor in on_bin.items())


def test_a_corpus_with_a_bom_crlf_and_no_final_newline(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.de").write_bytes(b"\xef\xbb\xbfein Hund\r\n\nzwei Katzen  \ndrei")
    (corpus / "train.en").write_bytes(b"a dog\r\nnothing\ntwo cats\nthree")
    for lang, text in (("de", b"ein\rHund\n"), ("en", b"a dog\n")):  # a CR inside a sentence stays in it
        (corpus / f"val.{lang}").write_bytes(text)
    settings = PrepareSettings("de", "en", vocab_size=300, max_ratio=9.0)
    # chunks of 2 pairs, encoded in this process (the parallel encoding is tested above; a pool would
    # spawn 2 processes, ~2 s of CPU each to import aiayn)
    data = prepare(corpus, tmp_path / "bin", settings, workers=1, chunk_pairs=2, log=print)
    pairs, _ = read_parallel(corpus, "train", "de", "en")
    decoded = [tuple(data.tokenizer.decode(ids) for ids in pair) for pair in data.split("train")]
    assert decoded == pairs == [("ein Hund", "a dog"), ("zwei Katzen", "two cats"), ("drei", "three")]
    assert data.manifest["splits"]["train"]["empty"] == 1
    assert data.texts("val") == read_parallel(corpus, "val", "de", "en")[0] == [("ein\rHund", "a dog")]


def test_bad_corpora_are_one_line(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.de").write_bytes(b"eins\nzwei\n" * 3 + b"\xff\n")
    (corpus / "train.en").write_bytes(b"one\ntwo\n" * 3 + b"x\n")
    settings = PrepareSettings("de", "en", vocab_size=300)
    with pytest.raises(UserError, match=r"no file .*val\.de"):  # found before the training split is encoded
        prepare(corpus, tmp_path / "bin", settings, log=print)
    (corpus / "val.de").write_text("eins\n")
    (corpus / "val.en").write_text("one\n")
    with pytest.raises(UserError, match=r"train\.de:7: invalid UTF-8"):
        prepare(corpus, tmp_path / "bin", settings, chunk_pairs=2, log=print)
    (corpus / "train.en").write_bytes(b"one\n")
    with pytest.raises(UserError, match=r"train\.de has 7 lines but .*train\.en has 1"):
        prepare(corpus, tmp_path / "bin", settings, log=print)
    with pytest.raises(UserError, match="no file .*train.fr"):
        prepare(corpus, tmp_path / "bin", PrepareSettings("de", "fr"), log=print)
    with pytest.raises(UserError, match="train_split and data.valid_split are both 'train'"):
        prepare(corpus, tmp_path / "bin", PrepareSettings("de", "en", valid_split="train"), log=print)


# --- several machines ------------------------------------------------------------------------------


@pytest.mark.xdist_group("torchrun")  # one launch of several processes at a time
def test_two_nodes_with_c10d_rendezvous_match_one_process(prepared: Path, tmp_path: Path) -> None:
    """Two torchrun launchers (two "machines", one process each) meet at a c10d rendezvous on
    127.0.0.1 and train with gloo: the weights are those of one process with the same global batch."""
    values = run_config(
        prepared, model={"dropout": 0.0}, data={"batch_multiple": 2}, train={"max_steps": 4, "save_every": 4}
    )
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(values))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    train = ["-m", "aiayn", "train", "--config", str(config), "--no-progress"]
    assert main([*train[2:], "--out", str(tmp_path / "one")]) == 0  # one process: this one
    codes, outputs = launched(lambda: _two_nodes(train, tmp_path / "two", env), tmp_path / "two")
    assert all(code == 0 for code in codes), "\n".join(o[-2000:] for o in outputs)
    one = load_file(str(list_checkpoints(tmp_path / "one")[-1] / MODEL_FILE))
    two = load_file(str(list_checkpoints(tmp_path / "two")[-1] / MODEL_FILE))
    assert list_checkpoints(tmp_path / "two")[-1].name == "step-00000004"
    d_model = values["model"]["d_model"]
    for name, tensor in one.items():
        if name.endswith("in_proj.bias"):  # the key bias's gradient is 0 but for rounding, which Adam
            tensor, two[name] = _without(tensor, d_model), _without(two[name], d_model)  # scales up
        torch.testing.assert_close(two[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    records = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["split"] == "train" for r in records) == 4


def _two_nodes(train: list[str], out: Path, env: dict) -> tuple[list[int], list[str]]:
    """Two torchrun launchers of ``train`` into ``out`` at one c10d rendezvous on 127.0.0.1: their exit
    codes and outputs."""
    endpoint = f"127.0.0.1:{free_port()}"
    launcher = [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"),
        *("--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "aiayn-test"),
        *("--local-addr", "127.0.0.1", "--max-restarts", "0"),
    ]
    nodes = [
        subprocess.Popen(
            [*launcher, *train, "--out", str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    return [node.returncode for node in nodes], outputs


def _without(in_proj_bias: torch.Tensor, d_model: int) -> torch.Tensor:
    """The query and value parts of an attention's packed (query, key, value) bias."""
    return torch.cat([in_proj_bias[:d_model], in_proj_bias[2 * d_model :]])
