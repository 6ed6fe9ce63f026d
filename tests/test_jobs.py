"""Jobs (aiayn.jobs, `aiayn translate --input FILE --output FILE`): chunks committed atomically,
resumed after a SIGKILL to the byte of an uninterrupted run, refused with other settings or a
changed input; shards and their merge; torchrun ranks; TSV and JSONL records; compressed files;
progress. The engine-free tests translate with a stand-in function; the rest with a tiny model."""

from __future__ import annotations

import gzip
import io
import json
import lzma
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from aiayn import TransformerConfig, build_model
from aiayn.checkpoint import save_checkpoint
from aiayn.cli import main
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.jobs import Job, JobSettings, Progress, chunk_seed, job_folder, run_job
from aiayn.jobs.compression import open_read
from conftest import free_port

SETTINGS = JobSettings(checkpoint="m", checkpoint_identity="sha256:x", decode={"beam": 4})


def upper(k: int, texts: list[str]) -> list[str]:
    return [text.upper() for text in texts]


def run(input: Path, output: Path, settings: JobSettings = SETTINGS, **kwargs) -> Job:
    job = Job.open(input, output, settings, **kwargs)
    run_job(job, upper)
    return job


def read_text(path: Path) -> str:
    with open_read(path) as handle:
        return handle.read().decode("utf-8")


# --- the job without a model ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    ["a\nb\nc\nd\ne\n", "a\nb\nc\nd\ne", "a\r\nb\n\n\nc\n", "", "\n", "only\n", "x\n" * 6],
)
@pytest.mark.parametrize("chunk_lines", [1, 2, 3, 100])
def test_chunks_give_the_lines_once_and_in_order(tmp_path: Path, data: str, chunk_lines: int) -> None:
    (tmp_path / "in.txt").write_bytes(data.encode())
    job = run(tmp_path / "in.txt", tmp_path / "out.txt", chunk_lines=chunk_lines)
    assert job.complete()
    job.finish()
    lines = data.split("\n")
    if lines[-1] == "":
        lines.pop()
    assert (tmp_path / "out.txt").read_text() == "".join(line.rstrip("\r").upper() + "\n" for line in lines)
    assert not job_folder(tmp_path / "out.txt").exists()


def test_a_rerun_continues_after_the_last_commit_and_ignores_a_temporary(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("".join(f"line {i}\n" for i in range(10)))
    output = tmp_path / "out.txt"
    job = Job.open(source, output, SETTINGS, chunk_lines=3)
    assert job.chunks == 4 and job.pending() == [0, 1, 2, 3]
    job.commit(0, upper(0, job.read(0)))
    job.commit(2, upper(2, job.read(2)))
    (job.chunk_file(1).with_name("chunk-00000001.tmp-99999")).write_text("half a chu")
    seen = []
    again = Job.open(source, output, SETTINGS, chunk_lines=3)
    assert again.pending() == [1, 3]
    run_job(again, lambda k, texts: seen.append(k) or upper(k, texts))
    assert seen == [1, 3]
    again.finish()
    assert output.read_text() == "".join(f"LINE {i}\n" for i in range(10))


def test_other_settings_or_a_changed_input_are_refused_in_one_line(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("a\nb\nc\n")
    output = tmp_path / "out.txt"
    Job.open(source, output, SETTINGS, chunk_lines=2).commit(0, ["A", "B"])
    other = JobSettings(checkpoint="m", checkpoint_identity="sha256:x", decode={"beam": 5})
    with pytest.raises(UserError, match=r"other settings: decode\.beam 5 \(begun with 4\)") as err:
        Job.open(source, output, other, chunk_lines=2)
    assert "\n" not in str(err.value) and "out.txt.job to start over" in str(err.value)
    with pytest.raises(UserError, match=r"chunk_lines 3 \(begun with 2\)"):
        Job.open(source, output, SETTINGS, chunk_lines=3)
    moved = JobSettings(checkpoint="elsewhere/m", checkpoint_identity="sha256:x", decode={"beam": 4})
    Job.open(source, output, moved, chunk_lines=2)  # the same checkpoint by another path: the same job
    source.write_text("a\nb\nC\n")
    with pytest.raises(UserError, match="the input changed since the job there began") as err:
        Job.open(source, output, SETTINGS, chunk_lines=2)
    assert "\n" not in str(err.value)


def test_processes_opening_a_job_at_once_share_one_manifest(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("".join(f"{i}\n" for i in range(50)))
    jobs, errors = [], []

    def open_one(i: int) -> None:
        try:
            jobs.append(Job.open(source, tmp_path / "out.txt", SETTINGS, chunk_lines=5, shards=(4, i)))
        except Exception as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(jobs) == 4
    assert sorted(k for job in jobs for k in job.pending()) == list(range(10))
    assert not any(p.name.startswith(".manifest") for p in job_folder(tmp_path / "out.txt").iterdir())


def test_shards_commit_their_chunks_and_the_merge_names_what_is_missing(tmp_path: Path, capsys) -> None:
    source = tmp_path / "in.txt"
    source.write_text("".join(f"s{i}\n" for i in range(7)))
    output = tmp_path / "out.txt"
    for shard in (0, 2):
        job = run(source, output, chunk_lines=1, shards=(3, shard))
    assert not job.complete()
    assert main(["jobs", "status", str(output)]) == 0
    assert "5 of 7 chunks done" in capsys.readouterr().out
    assert main(["jobs", "merge", str(output)]) == 2
    assert "2 of 7 chunks not done yet: 1, 4 " in capsys.readouterr().err
    run(source, output, chunk_lines=1, shards=(3, 1))
    assert main(["jobs", "merge", str(output)]) == 0
    assert output.read_text() == "".join(f"S{i}\n" for i in range(7))
    assert main(["jobs", "merge", str(output)]) == 2
    assert "no job writes it" in capsys.readouterr().err


@pytest.mark.parametrize("suffix", [".gz", ".xz", ".zst"])
def test_compressed_input_and_output_by_their_names(tmp_path: Path, suffix: str) -> None:
    pytest.importorskip("zstandard") if suffix == ".zst" else None
    text = "".join(f"zeile {i}\n" for i in range(25))
    source = tmp_path / f"in.txt{suffix}"
    if suffix == ".gz":
        source.write_bytes(gzip.compress(text.encode()))
    elif suffix == ".xz":
        source.write_bytes(lzma.compress(text.encode()))
    else:
        import zstandard

        source.write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    output = tmp_path / f"out.txt{suffix}"
    run(source, output, chunk_lines=4).finish()
    assert read_text(output) == text.upper()
    plain = tmp_path / "plain.txt"
    run(source, plain, chunk_lines=4).finish()
    assert plain.read_text() == text.upper()


def test_a_missing_zstandard_is_said_in_one_line(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "in.txt").write_text("a\n")
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(UserError, match=r"needs the zstandard package: pip install 'aiayn\[jobs\]'"):
        Job.open(tmp_path / "in.txt", tmp_path / "out.txt.zst", SETTINGS)


def test_tsv_and_jsonl_records_keep_what_is_not_translated(tmp_path: Path) -> None:
    tsv = tmp_path / "in.tsv"
    tsv.write_text("1\tgood day\tx\n2\tbye\t\n")
    settings = JobSettings(checkpoint="m", checkpoint_identity="i", input_format="tsv", column=2)
    run(tsv, tmp_path / "out.tsv", settings, chunk_lines=1).finish()
    assert (tmp_path / "out.tsv").read_text() == "1\tGOOD DAY\tx\n2\tBYE\t\n"
    rows = [{"id": 1, "src": "straße", "n": [1, 2]}, {"src": "b", "id": 2}]
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows))
    settings = JobSettings(checkpoint="m", checkpoint_identity="i", input_format="jsonl", field="src")
    run(jsonl, tmp_path / "same.jsonl", settings).finish()
    assert [json.loads(line) for line in (tmp_path / "same.jsonl").read_text().splitlines()] == [
        {"id": 1, "src": "STRASSE", "n": [1, 2]},
        {"src": "B", "id": 2},
    ]
    other = JobSettings(
        checkpoint="m", checkpoint_identity="i", input_format="jsonl", field="src", output_field="tgt"
    )
    run(jsonl, tmp_path / "tgt.jsonl", other).finish()
    out = (tmp_path / "tgt.jsonl").read_text().splitlines()
    assert json.loads(out[0]) == {**rows[0], "tgt": "STRASSE"} and "straße" in out[0]
    jsonl.write_text('{"src": "a"}\n{"id": 3}\n')
    with pytest.raises(UserError, match=r"in.jsonl: line 2: field 'src': no such field"):
        run(jsonl, tmp_path / "bad.jsonl", settings)
    tsv.write_text("1\ta\n2\n")
    with pytest.raises(UserError, match=r"in.tsv: line 2: 1 tab-separated field\(s\); --column 2"):
        run(
            tsv,
            tmp_path / "bad.tsv",
            JobSettings(checkpoint="m", checkpoint_identity="i", input_format="tsv", column=2),
        )


def test_progress_in_a_log_is_a_plain_line_now_and_then() -> None:
    stream = io.StringIO()
    progress = Progress(100, 20, stream=stream, every_s=0.0)
    progress.sentences(30)
    progress.lines(30)
    progress.close()
    said = stream.getvalue().splitlines()
    assert said and said[0].startswith("aiayn: 50/100 lines (50.0%), ") and "sent/s" in said[0]
    assert "left" in said[0]
    quiet = io.StringIO()
    silent = Progress(100, enabled=False, stream=quiet, every_s=0.0)
    silent.lines(100)
    silent.close()
    assert quiet.getvalue() == ""


def test_chunk_seeds_depend_on_the_seed_and_the_chunk_only() -> None:
    assert chunk_seed(7, 3) == chunk_seed(7, 3)
    assert len({chunk_seed(7, k) for k in range(100)} | {chunk_seed(8, 0)}) == 101


# --- aiayn translate on a tiny model --------------------------------------------------------------

FAST = ["--max-len-b", "4", "--quiet"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, parallel_dir: Path) -> Path:
    sentences = (parallel_dir / "val.en").read_text(encoding="utf-8").splitlines()[:200]
    tokenizer = Tokenizer.train(sentences, vocab_size=300)
    config = TransformerConfig.from_dict(
        dict(
            src_vocab_size=tokenizer.vocab_size,
            tgt_vocab_size=tokenizer.vocab_size,
            d_model=16,
            n_heads=2,
            n_encoder_layers=1,
            n_decoder_layers=1,
            d_ff=32,
            dropout=0.0,
            max_len=64,
        )
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "model"
    return save_checkpoint(
        path, build_model(config), {"kind": "translation", "model": config.to_dict()}, tokenizer.to_bytes()
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory, parallel_dir: Path) -> Path:
    lines = (parallel_dir / "test2016.en").read_text(encoding="utf-8").splitlines()[:11]
    lines.insert(4, "")
    path = tmp_path_factory.mktemp("input") / "in.en"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def translate(checkpoint: Path, *args: str) -> int:
    return main(["translate", "--checkpoint", str(checkpoint), *FAST, *args])


NUMBER = re.compile(r"-?\d+\.\d+")


def numbers_rounded(text: str) -> str:
    """``text`` with its decimal numbers (n-best scores, probabilities) to 4 places."""
    return NUMBER.sub(lambda m: f"{float(m.group()):.4f}", text)


@pytest.mark.parametrize("mode", [[], ["--beam", "1"], ["--nbest", "2"], ["--scores", "--alignments"]])
def test_a_job_writes_what_translating_the_whole_file_writes(
    checkpoint, source, tmp_path, capsys, mode
) -> None:
    """The path of before jobs (the whole file read and translated at once, to stdout) against jobs
    of small and large chunks: the same bytes. Scores (--nbest, --scores) are those of the sentences'
    batches: with chunks that cut the file's batches, the same to the float rounding."""
    assert translate(checkpoint, *mode, "--input", str(source)) == 0
    whole = capsys.readouterr().out
    assert len(whole.splitlines()) == 12 * (2 if "--nbest" in mode else 1)
    for chunk_lines in ("1000", "5", "1"):
        out = tmp_path / f"out{chunk_lines}.de"
        assert (
            translate(
                checkpoint, *mode, "--input", str(source), "--output", str(out), "--chunk-lines", chunk_lines
            )
            == 0
        )
        got = out.read_text(encoding="utf-8")
        if chunk_lines == "1000" or mode in ([], ["--beam", "1"]):
            assert got == whole, chunk_lines
        else:
            assert numbers_rounded(got) == numbers_rounded(whole), chunk_lines
        assert not job_folder(out).exists()


def test_a_killed_job_resumes_to_the_bytes_of_an_uninterrupted_run(
    checkpoint, tmp_path, capsys, parallel_dir
) -> None:
    lines = (parallel_dir / "train.en").read_text(encoding="utf-8").splitlines()[:300]
    source = tmp_path / "in.en"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    output = tmp_path / "out.de.gz"
    command = ["translate", "--checkpoint", str(checkpoint), *FAST, "--input", str(source)]
    victim = subprocess.Popen(
        [sys.executable, "-m", "aiayn", *command, "--output", str(output), "--chunk-lines", "2"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    folder, deadline = job_folder(output), time.time() + 120
    while victim.poll() is None and time.time() < deadline:
        if folder.is_dir() and len([p for p in folder.iterdir() if p.name[6:].isdigit()]) >= 3:
            break
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    _, err = victim.communicate()
    assert victim.returncode == -signal.SIGKILL, err.decode()[-2000:]
    done = len([p for p in folder.iterdir() if p.name.startswith("chunk-") and "tmp" not in p.name])
    assert 3 <= done < 150 and not output.exists()
    (folder / "chunk-00000149.tmp-1").write_bytes(b"a chunk cut short by the kill")

    assert main([*command, "--output", str(output), "--chunk-lines", "2", "--beam", "2"]) == 2
    assert "other settings: decode.beam 2 (begun with 4)" in capsys.readouterr().err
    assert main([*command, "--output", str(output), "--chunk-lines", "2"]) == 0
    assert (
        main(
            [
                *command,
            ]
        )
        == 0
    )
    assert gzip.decompress(output.read_bytes()).decode() == capsys.readouterr().out
    assert not folder.exists()

    main(
        [
            *command,
            "--output",
            str(tmp_path / "again.de"),
            "--chunk-lines",
            "100",
            "--num-shards",
            "3",
            "--shard-id",
            "0",
        ]
    )
    capsys.readouterr()
    source.write_text("changed\n" + "\n".join(lines[1:]) + "\n", encoding="utf-8")
    assert main([*command, "--output", str(tmp_path / "again.de"), "--chunk-lines", "100"]) == 2
    err = capsys.readouterr().err
    assert "the input changed since the job there began" in err and len(err.strip().splitlines()) == 1


def test_sampled_shards_merge_to_the_output_of_one_run(checkpoint, source, tmp_path, capsys) -> None:
    """Each chunk samples from (seed, chunk): the output does not depend on who translated what."""
    sample = ["--sample", "--seed", "5", "--input", str(source), "--chunk-lines", "3"]
    assert translate(checkpoint, *sample, "--output", str(tmp_path / "one.de")) == 0
    for shard in ("1", "0"):
        assert (
            translate(
                checkpoint,
                *sample,
                "--output",
                str(tmp_path / "two.de"),
                "--num-shards",
                "2",
                "--shard-id",
                shard,
            )
            == 0
        )
    assert not (tmp_path / "two.de").exists()
    assert main(["jobs", "merge", str(tmp_path / "two.de")]) == 0
    assert (tmp_path / "two.de").read_text() == (tmp_path / "one.de").read_text()
    assert translate(checkpoint, "--sample", "--input", str(source), "--output", str(tmp_path / "x")) == 2
    assert "--sample: a job needs --seed" in capsys.readouterr().err


def test_a_tsv_column_is_translated_as_plain_lines_are(checkpoint, source, tmp_path) -> None:
    texts = source.read_text(encoding="utf-8").splitlines()
    tsv = tmp_path / "in.tsv"
    tsv.write_text("".join(f"{i}\t{text}\tkeep\n" for i, text in enumerate(texts)), encoding="utf-8")
    assert (
        translate(
            checkpoint,
            "--input",
            str(tsv),
            "--output",
            str(tmp_path / "out.tsv"),
            "--input-format",
            "tsv",
            "--column",
            "2",
        )
        == 0
    )
    assert translate(checkpoint, "--input", str(source), "--output", str(tmp_path / "plain.de")) == 0
    plain = (tmp_path / "plain.de").read_text(encoding="utf-8").splitlines()
    rows = [line.split("\t") for line in (tmp_path / "out.tsv").read_text(encoding="utf-8").splitlines()]
    assert rows == [[str(i), text, "keep"] for i, text in enumerate(plain)]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--num-shards", "2", "--shard-id", "0"], "--num-shards: needs --input FILE and --output FILE"),
        (["--input", "IN", "--output", "OUT", "--num-shards", "2"], "--num-shards: needs --shard-id"),
        (
            ["--input", "IN", "--output", "OUT", "--shard-id", "2", "--num-shards", "2"],
            "--shard-id 2: must be from 0 to 1",
        ),
        (["--input", "IN", "--output", "OUT", "--column", "2"], "--column: needs --input-format tsv"),
        (
            ["--input", "IN", "--output", "OUT", "--input-format", "tsv"],
            "--input-format tsv: needs --column N",
        ),
        (
            ["--input", "IN", "--output", "OUT", "--input-format", "csv"],
            "--input-format: unknown format 'csv'",
        ),
        (
            ["--input", "IN", "--output", "OUT", "--input-format", "jsonl", "--field", "f", "--nbest", "2"],
            "--nbest: plain lines only",
        ),
        (
            ["--input", "IN", "--output", "OUT", "--format", "text", "--chunk-lines", "5"],
            "--chunk-lines: not with --format text",
        ),
    ],
)
def test_job_flags_are_checked_in_one_line(checkpoint, source, tmp_path, capsys, args, said) -> None:
    args = [str(source) if a == "IN" else str(tmp_path / "out") if a == "OUT" else a for a in args]
    assert translate(checkpoint, *args) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.xdist_group("torchrun")  # one launch of several processes at a time
def test_torchrun_ranks_write_the_output_of_one_process(checkpoint, source, tmp_path) -> None:
    assert (
        translate(
            checkpoint, "--input", str(source), "--output", str(tmp_path / "one.de"), "--chunk-lines", "2"
        )
        == 0
    )
    launch = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
    ]
    command = ["-m", "aiayn", "translate", "--checkpoint", str(checkpoint), *FAST, "--device", "cpu"]
    files = ["--input", str(source), "--output", str(tmp_path / "two.de"), "--chunk-lines", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*launch, *command, *files], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "two.de").read_text() == (tmp_path / "one.de").read_text()
    assert not job_folder(tmp_path / "two.de").exists()
