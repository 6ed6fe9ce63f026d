"""`aiayn translate`, `aiayn evaluate`, `aiayn plot` end to end, and the Translator, on a tiny
random-weight model saved as a real checkpoint."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from aiayn import TransformerConfig, build_model
from aiayn.checkpoint import save_checkpoint, seal
from aiayn.cli import main
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode import Translator
from aiayn.device import resolve_device
from aiayn.documents.fit import fit, source_limit
from aiayn.errors import UserError
from aiayn.io import stdin_blocks
from aiayn.loading import load_translation_model

MAX_LEN = 24
FAST = ["--max-len-b", "4"]


@pytest.fixture(scope="module")
def sentences(parallel_dir: Path) -> list[str]:
    en = (parallel_dir / "val.en").read_text(encoding="utf-8").splitlines()[:200]
    de = (parallel_dir / "val.de").read_text(encoding="utf-8").splitlines()[:200]
    return en + de


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, sentences) -> Path:
    tokenizer = Tokenizer.train(sentences, vocab_size=400)
    config = TransformerConfig.from_dict(
        dict(
            src_vocab_size=tokenizer.vocab_size,
            tgt_vocab_size=tokenizer.vocab_size,
            d_model=32,
            n_heads=2,
            n_encoder_layers=1,
            n_decoder_layers=2,
            d_ff=64,
            dropout=0.0,
            max_len=MAX_LEN,
        )
    )
    torch.manual_seed(0)
    model = build_model(config)
    path = tmp_path_factory.mktemp("ckpt") / "model"
    return save_checkpoint(
        path, model, {"kind": "translation", "model": config.to_dict()}, tokenizer.to_bytes()
    )


def feed_stdin(monkeypatch, data: bytes) -> None:
    """``data`` on a pipe as stdin, as a shell would give it (a real file descriptor)."""
    read, write = os.pipe()
    with os.fdopen(write, "wb") as writer:  # small data: fits the pipe's buffer
        writer.write(data)
    stdin = os.fdopen(read, "r", encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


LINES = ["A man rides a bike.", "", "Two dogs play in the snow near a red house."]


# --- translate ---------------------------------------------------------------------------------


def test_translate_stdin_to_stdout_keeps_one_line_per_line(checkpoint, monkeypatch, capsys) -> None:
    feed_stdin(monkeypatch, "\n".join(LINES).encode() + b"\n")
    assert main(["translate", "--checkpoint", str(checkpoint), *FAST]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n") and len(out.splitlines()) == 3  # no line breaks inside an output
    assert out.splitlines()[1] == ""  # blank in, blank out


def next_within(blocks, seconds: float = 30):
    """``next(blocks)`` in a thread: a reader that waits for more input fails instead of hanging."""
    got: list = []
    reader = threading.Thread(target=lambda: got.append(next(blocks, None)), daemon=True)
    reader.start()
    reader.join(timeout=seconds)
    assert got, "stdin_blocks waited for more input than the lines already there"
    return got[0]


def test_stdin_blocks_come_as_lines_arrive() -> None:
    read, write = os.pipe()
    blocks = stdin_blocks(10, fd=read)
    os.write(write, b"a\nb\n")
    assert next_within(blocks) == ["a", "b"]  # without waiting for the end of the input
    os.write(write, b"c\r\nd")
    os.close(write)
    assert next_within(blocks) == ["c", "d"]  # CRLF, and a last line without its newline
    assert next_within(blocks) is None
    os.close(read)


def blocks_of(data: bytes, max_lines: int) -> list[list[str]]:
    read, write = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write, data), os.close(write)))
    writer.start()  # a pipe holds 64 KiB: the writer may block until the reader catches up
    try:
        return list(stdin_blocks(max_lines, fd=read))
    finally:
        writer.join()
        os.close(read)


def test_stdin_blocks_are_capped_and_count_lines_across_blocks() -> None:
    assert blocks_of(b"1\n2\n3\n4\n5\n", 2) == [["1", "2"], ["3", "4"], ["5"]]
    assert blocks_of(b"", 2) == [] and blocks_of(b"\n", 2) == [[""]] and blocks_of(b"x", 2) == [["x"]]
    with pytest.raises(UserError, match=r"<stdin>: line 4: invalid UTF-8"):
        blocks_of(b"1\n2\n3\n\xff\n", 2)


def test_a_piped_file_comes_in_whole_blocks(tmp_path) -> None:
    lines = [
        f"line {i} " + "x" * (i % 97) for i in range(8000)
    ]  # ~440 KB: many reads, none on a line boundary
    data = "".join(line + "\n" for line in lines).encode()
    fd = os.open(write(tmp_path / "in", lines), os.O_RDONLY)  # `< file`: a regular file as stdin
    try:
        from_file = list(stdin_blocks(2000, fd=fd))
    finally:
        os.close(fd)
    assert [len(b) for b in from_file] == [2000] * 4 and [line for b in from_file for line in b] == lines
    piped = blocks_of(data, 2000)  # a pipe: what is waiting when a block is taken, so timing decides
    assert max(len(b) for b in piped) == 2000 and [line for b in piped for line in b] == lines
    assert blocks_of(b"y" * 300_000, 5) == [["y" * 300_000]]  # one long line, read in many chunks


def test_translate_answers_each_line_before_stdin_ends(checkpoint) -> None:
    # An interactive user (or a program holding a pipe open) gets each translation as its line goes in.
    process = subprocess.Popen(
        [sys.executable, "-m", "aiayn", "translate", "--checkpoint", str(checkpoint), *FAST],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    answers: list[str] = []
    reader = threading.Thread(target=lambda: answers.append(process.stdout.readline().decode()), daemon=True)
    reader.start()
    process.stdin.write(b"A man rides a bike.\n")
    process.stdin.flush()
    reader.join(timeout=120)
    try:
        assert answers and answers[0].endswith("\n"), (
            process.stderr.read1().decode() if not reader.is_alive() else ""
        )
        model, tokenizer, _ = load_translation_model(checkpoint)
        expected = Translator(model, tokenizer, max_len_b=4).translate(["A man rides a bike."])
        assert answers[0] == expected[0].text + "\n"
    finally:
        process.stdin.close()
        assert process.wait(timeout=60) == 0


def test_translate_stdin_in_small_blocks_or_without_a_descriptor_is_the_same(
    checkpoint, monkeypatch, capsys
) -> None:
    lines = LINES * 3
    feed_stdin(monkeypatch, "\n".join(lines).encode() + b"\n")
    assert main(["translate", "--checkpoint", str(checkpoint), *FAST, "--buffer-size", "2"]) == 0
    streamed = capsys.readouterr().out
    monkeypatch.setattr(
        sys, "stdin", io.TextIOWrapper(io.BytesIO("\n".join(lines).encode()), encoding="utf-8")
    )
    assert main(["translate", "--checkpoint", str(checkpoint), *FAST]) == 0  # no fileno(): read whole
    assert capsys.readouterr().out == streamed and len(streamed.splitlines()) == len(lines)
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines)))  # not even a byte buffer
    assert main(["translate", "--checkpoint", str(checkpoint), *FAST]) == 0
    assert capsys.readouterr().out == streamed
    monkeypatch.setattr(sys, "stdin", None)  # file descriptor 0 closed at start-up
    assert main(["translate", "--checkpoint", str(checkpoint), *FAST]) == 2
    assert_user_error(capsys, "<stdin>", "closed")
    assert main(["translate", "--checkpoint", str(checkpoint), "--buffer-size", "0"]) == 2
    assert_user_error(capsys, "--buffer-size")


def test_translate_files_match_the_translator_and_no_cache(checkpoint, tmp_path, capsys) -> None:
    lines = [*LINES[:2], "Two dogs play."]  # each fits the model: none is split
    src = write(tmp_path / "in.txt", lines)
    for name, extra in (("cached.txt", []), ("uncached.txt", ["--no-cache"])):
        args = [
            "translate",
            "--checkpoint",
            str(checkpoint),
            "--input",
            str(src),
            "--output",
            str(tmp_path / name),
        ]
        assert main([*args, "--max-len-a", "0", *FAST, *extra]) == 0  # a = 0: no line is split to fit
    cached = (tmp_path / "cached.txt").read_text(encoding="utf-8")
    assert cached == (tmp_path / "uncached.txt").read_text(encoding="utf-8")
    model, tokenizer, _ = load_translation_model(checkpoint)
    expected = Translator(model, tokenizer, max_len_a=0, max_len_b=4).translate(lines)
    assert cached.splitlines() == [t.text for t in expected]


def test_unwritable_output_fails_before_any_decoding(checkpoint, tmp_path, monkeypatch, capsys) -> None:
    import aiayn.loading as loading_module

    def never(*_args, **_kwargs):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(loading_module, "load", never)  # every model load goes through it
    src = write(tmp_path / "in.txt", LINES)
    for out, reason in (
        (tmp_path / "no" / "such" / "dir.txt", "No such file or directory"),
        (tmp_path, "Is a directory"),
    ):
        for command in (
            ["translate", "--input", str(src)],
            ["evaluate", "--src", str(src), "--ref", str(src)],
        ):
            assert main([*command, "--checkpoint", str(checkpoint), "--output", str(out)]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"cannot write {out}: {reason}" in err, err


def test_output_through_a_symlink_or_to_a_device(checkpoint, tmp_path, capsys) -> None:
    src, real = write(tmp_path / "in.txt", LINES), write(tmp_path / "real.txt", ["old"])
    real.chmod(0o640)
    (tmp_path / "link.txt").symlink_to(real)
    args = ["translate", "--checkpoint", str(checkpoint), "--input", str(src), *FAST]
    assert main([*args, "--output", str(tmp_path / "link.txt")]) == 0
    assert (tmp_path / "link.txt").is_symlink() and len(real.read_text().splitlines()) == 3
    assert real.stat().st_mode & 0o777 == 0o640  # the file keeps its mode
    assert main([*args, "--output", "/dev/null"]) == 0 and Path("/dev/null").is_char_device()


def test_a_failed_translation_leaves_the_existing_output_as_it_was(
    checkpoint, tmp_path, monkeypatch, capsys
) -> None:
    src, out = write(tmp_path / "in.txt", LINES), write(tmp_path / "out.txt", ["an earlier translation"])

    def interrupted(self, lines, options=None, wanted=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(Translator, "translate", interrupted)
    assert (
        main(["translate", "--checkpoint", str(checkpoint), "--input", str(src), "--output", str(out), *FAST])
        == 130
    )
    assert "interrupted" in capsys.readouterr().err
    assert out.read_text() == "an earlier translation\n"
    # no temporary left behind; the job's record stays, for the same command to resume (no chunk done)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt", "out.txt.job"]
    assert [p.name for p in (tmp_path / "out.txt.job").iterdir()] == ["manifest.json"]


def test_translate_nbest_format(checkpoint, monkeypatch, capsys) -> None:
    feed_stdin(monkeypatch, "\n".join(LINES).encode())
    assert main(["translate", "--checkpoint", str(checkpoint), "--nbest", "3", *FAST]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 9
    assert out[3:6] == ["", "", ""]  # the blank line
    for group in (out[0:3], out[6:9]):
        scores = [float(line.split("\t", 1)[0]) for line in group]
        assert all("\t" in line for line in group) and scores == sorted(scores, reverse=True)


def test_sampling_with_a_seed_is_reproducible(checkpoint, monkeypatch, capsys) -> None:
    outputs = []
    for _ in range(2):
        feed_stdin(monkeypatch, "\n".join(LINES).encode())
        args = ["translate", "--checkpoint", str(checkpoint), "--sample", "--seed", "7", "--top-p", "0.9"]
        assert main([*args, *FAST]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]


def test_translator_restores_input_order_whatever_the_batching(checkpoint) -> None:
    model, tokenizer, _ = load_translation_model(checkpoint)
    lines = ["A dog.", "A man in a blue shirt is standing on a ladder.", "", "Kids play.", "Two women talk."]

    def texts(batch_tokens: int, lines: list[str]) -> list[str]:
        found = Translator(model, tokenizer, batch_tokens=batch_tokens, max_len_b=4).translate(lines)
        return [t.text for t in found]

    one_by_one, together = texts(1, lines), texts(10_000, lines)
    alone = [texts(4096, [line])[0] for line in lines]
    assert one_by_one == together == alone
    assert together[2] == ""


def test_a_line_too_long_is_split_and_translated_whole_with_a_warning_naming_it(
    checkpoint, tmp_path, capsys
) -> None:
    long_line = " ".join(["a man rides a big red bike down the busy street"] * 6)  # no clause punctuation
    src = write(tmp_path / "in.txt", ["A dog.", long_line, "A cat."])
    assert main(["translate", "--checkpoint", str(checkpoint), "--input", str(src), *FAST]) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert len(out) == 3
    assert (
        "line 2" in captured.err and "split between words" in captured.err and "truncated" not in captured.err
    )
    model, tokenizer, _ = load_translation_model(checkpoint)
    limit = source_limit(MAX_LEN, 1.0, 4)
    pieces, blind = fit(long_line, lambda text: len(tokenizer.encode(text)), limit)
    assert blind and len(pieces) > 1 and " ".join(pieces) == long_line
    assert all(len(tokenizer.encode(piece)) <= limit for piece in pieces)
    translations = Translator(model, tokenizer, max_len_b=4).translate(pieces)
    assert out[1] == " ".join(t.text for t in translations if t.text).strip()


# --- bad input: one line, non-zero exit, no traceback ------------------------------------------


def assert_user_error(capsys, *needles: str) -> None:
    err = capsys.readouterr().err
    assert err.startswith("aiayn: error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in err, err


def test_invalid_utf8_names_the_line(checkpoint, tmp_path, capsys) -> None:
    src = tmp_path / "bad.txt"
    src.write_bytes(b"A dog.\nA \xff cat.\n")
    assert main(["translate", "--checkpoint", str(checkpoint), "--input", str(src)]) == 2
    assert_user_error(capsys, "bad.txt", "line 2", "invalid UTF-8")


def test_missing_input_file(checkpoint, tmp_path, capsys) -> None:
    assert main(["translate", "--checkpoint", str(checkpoint), "--input", str(tmp_path / "nope.txt")]) == 2
    assert_user_error(capsys, "nope.txt")


def test_missing_and_corrupt_checkpoints(checkpoint, tmp_path, monkeypatch, capsys) -> None:
    feed_stdin(monkeypatch, b"A dog.\n")
    assert main(["translate", "--checkpoint", str(tmp_path / "missing")]) == 2
    assert_user_error(capsys, "missing")
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in checkpoint.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    feed_stdin(monkeypatch, b"A dog.\n")
    assert main(["translate", "--checkpoint", str(broken)]) == 2
    assert_user_error(capsys, "model.safetensors")


def test_bad_options_are_user_errors(checkpoint, capsys) -> None:
    assert main(["translate", "--checkpoint", str(checkpoint), "--beam", "2", "--nbest", "3"]) == 2
    assert_user_error(capsys, "nbest")
    assert main(["translate", "--checkpoint", str(checkpoint), "--device", "tpu"]) == 2
    assert_user_error(capsys, "--device")


def copy_checkpoint(checkpoint: Path, to: Path) -> Path:
    to.mkdir()
    for f in checkpoint.iterdir():
        (to / f.name).write_bytes(f.read_bytes())
    return to


def corrupt(path: Path, how: str, sentences: list[str]) -> str:
    """Make the copy ``path`` inconsistent in one of three ways, each file well-formed and the
    manifest resealed (as a hand-assembled checkpoint would be); returns a phrase the error must
    contain."""
    if how == "shapes":  # config.json disagrees with the weights
        config = json.loads((path / "config.json").read_text())
        config["model"]["d_ff"] = 128
        (path / "config.json").write_text(json.dumps(config))
        seal(path)
        return "wrong shape"
    if how == "not-an-object":
        (path / "config.json").write_text('["kind", "translation"]')
        seal(path)
        return "expected a JSON object"
    tokenizer = Tokenizer.train(sentences, vocab_size=450)  # more pieces than the model's 400 tokens
    assert tokenizer.vocab_size > 400
    (path / "tokenizer.model").write_bytes(tokenizer.to_bytes())
    seal(path)
    return f"tokenizer.model has {tokenizer.vocab_size} pieces"


@pytest.mark.parametrize("how", ["shapes", "not-an-object", "tokenizer"])
def test_corrupt_checkpoint_is_one_line_in_translate_evaluate_and_plot(
    checkpoint, sentences, tmp_path, capsys, how
) -> None:
    broken = copy_checkpoint(checkpoint, tmp_path / "broken")
    needle = corrupt(broken, how, sentences)
    src, ref = write(tmp_path / "s.en", ["A dog runs."]), write(tmp_path / "r.de", ["Ein Hund rennt."])
    commands = [
        ["translate", "--input", str(src), *FAST],
        ["evaluate", "--src", str(src), "--ref", str(ref), *FAST],
        ["plot", "attention", "--src", "A dog runs.", "--out", str(tmp_path / "a.png")],
    ]
    for command in commands:
        assert main([*command, "--checkpoint", str(broken)]) == 2, command
        assert_user_error(capsys, str(broken), needle)


def test_sampling_options_need_sample(checkpoint, monkeypatch, capsys) -> None:
    for flag, value in (("--top-k", "5"), ("--top-p", "0.9"), ("--temperature", "1.0"), ("--seed", "3")):
        feed_stdin(monkeypatch, b"A dog.\n")
        assert main(["translate", "--checkpoint", str(checkpoint), *FAST, flag, value]) == 2
        assert_user_error(capsys, f"{flag} needs --sample")
    feed_stdin(monkeypatch, b"A dog.\n")
    assert (
        main(["translate", "--checkpoint", str(checkpoint), *FAST, "--sample", "--top-k", "5", "--seed", "3"])
        == 0
    )


def test_device_names_and_indices_are_checked(checkpoint, monkeypatch, capsys) -> None:
    """One rule for --device and train.device (aiayn.device): auto, cpu, cuda or cuda:N."""
    from aiayn.train.distributed import pick_device

    assert resolve_device("cpu", "--device") == torch.device("cpu")
    for bad in ("cuda:abc", "cuda:", "cuda:-1", "cuda0", "gpu", "CPU", ""):
        with pytest.raises(UserError, match=f"--device '{bad}' is not a device name"):
            resolve_device(bad, "--device")
    assert main(["translate", "--checkpoint", str(checkpoint), "--device", "cuda:abc"]) == 2
    assert_user_error(capsys, "--device", "cuda:abc")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto", "--device") == torch.device("cpu")
    with pytest.raises(UserError, match="'cuda:0': CUDA is not available here"):
        resolve_device("cuda:0", "--device")
    with pytest.raises(UserError, match=r"train\.device 'cuda': CUDA is not available here"):
        pick_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")  # torchrun's second process on this machine
    for name in ("auto", "cuda", "cuda:1"):
        assert resolve_device(name, "--device") == torch.device("cuda", 1)
    monkeypatch.delenv("LOCAL_RANK")
    assert resolve_device("auto", "--device") == torch.device("cuda", 0)
    with pytest.raises(UserError, match=r"'cuda:7': this machine has 2 CUDA device\(s\)"):
        resolve_device("cuda:7", "--device")


# --- evaluate ------------------------------------------------------------------------------------


def test_evaluate_prints_signatures_and_the_labelled_tokenized_bleu(checkpoint, tmp_path, capsys) -> None:
    src = write(tmp_path / "test.en", ["A dog runs.", "A man sits."])
    ref = write(tmp_path / "test.de", ["Ein Hund rennt.", "Ein Mann sitzt."])
    hyps = tmp_path / "hyps.de"
    args = ["evaluate", "--checkpoint", str(checkpoint), "--src", str(src), "--ref", str(ref), *FAST]
    assert main([*args, "--json", "--output", str(hyps)]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert {"bleu", "chrf", "bleu_signature", "chrf_signature", "tokenized_bleu"} <= set(scores)
    assert scores["sentences"] == 2 and len(hyps.read_text(encoding="utf-8").splitlines()) == 2
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "BLEU = " in out and "nrefs:1|case:mixed" in out
    assert "tokenized lowercased BLEU (multi-bleu.perl style, not comparable to sacreBLEU) [de]" in out


def test_evaluate_line_count_mismatch(checkpoint, tmp_path, capsys) -> None:
    src = write(tmp_path / "a.en", ["one", "two", "three"])
    ref = write(tmp_path / "b.de", ["eins", "zwei"])
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--src", str(src), "--ref", str(ref)]) == 2
    assert_user_error(capsys, "a.en", "3 lines", "b.de", "2")


@pytest.mark.parametrize(
    "src_lines, ref_lines, named",
    [([], [], "a.en"), (["", " "], ["x", "y"], "a.en"), (["x", "y"], ["", "\t"], "b.de")],
    ids=["empty", "blank-src", "blank-ref"],
)
def test_evaluate_empty_or_blank_inputs(checkpoint, tmp_path, capsys, src_lines, ref_lines, named) -> None:
    src, ref = write(tmp_path / "a.en", src_lines), write(tmp_path / "b.de", ref_lines)
    assert (
        main(["evaluate", "--checkpoint", str(checkpoint), "--src", str(src), "--ref", str(ref), *FAST]) == 2
    )
    assert_user_error(capsys, named, "nothing to evaluate")


# --- plot ------------------------------------------------------------------------------------------


def test_plot_attention_with_and_without_target(checkpoint, tmp_path, capsys) -> None:
    base = ["plot", "attention", "--checkpoint", str(checkpoint), "--src", "A dog runs in the park."]
    assert main([*base, "--tgt", "Ein Hund rennt.", "--out", str(tmp_path / "a.png")]) == 0
    assert main([*base, "--out", str(tmp_path / "b.png")]) == 0
    for name in ("a.png", "b.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:4] == b"\x89PNG" and len(data) > 20_000


def test_plot_positional_encoding_and_curves(tmp_path, capsys) -> None:
    out = tmp_path / "pe.png"
    assert main(["plot", "positional-encoding", "--d-model", "32", "--max-len", "40", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG" and "wrote" in capsys.readouterr().err
    assert main(["plot", "curves", str(tmp_path / "no-run"), "--out", str(tmp_path / "c.png")]) == 2
    assert_user_error(capsys, "metrics.jsonl")


# --- documents: --format, --alignments, --no-split -------------------------------------------------

DOCUMENT = [
    "A man rides a bike. Two dogs play.",
    "",
    "    A red house.",
    "Two dogs play in the snow.",
    "",
    "",
]


def test_format_text_keeps_paragraphs_line_breaks_and_indentation(checkpoint, tmp_path, capsys) -> None:
    src = write(tmp_path / "doc.txt", DOCUMENT)
    assert (
        main(["translate", "--checkpoint", str(checkpoint), "--input", str(src), "--format", "text", *FAST])
        == 0
    )
    out = capsys.readouterr().out.split("\n")
    assert len(out) == len(DOCUMENT) + 1 and out[-1] == ""
    assert [line == "" for line in out[:-1]] == [line == "" for line in DOCUMENT]
    assert out[2].startswith("    ") and not out[2].startswith("     ")


def test_paragraph_blocks_end_at_blank_lines() -> None:
    from aiayn.translate import _paragraph_blocks

    lines = ["a", "b", "", "c", "d", "e", "", "f"]
    blocks = list(_paragraph_blocks(iter([lines[:3], lines[3:5], lines[5:]]), 2))
    assert blocks == [["a", "b", ""], ["c", "d", "e", ""], ["f"]]
    long = [f"s{k}." for k in range(50)]  # one paragraph: cut after a sentence's end past 10 * size
    assert [len(b) for b in _paragraph_blocks(iter([long]), 2)] == [50]
    assert [len(b) for b in _paragraph_blocks(iter([[f"w{k}" for k in range(50)]]), 2)] == [40, 10]


def test_alignments_follow_each_line_in_moses_format(checkpoint, tmp_path, capsys) -> None:
    src = write(tmp_path / "in.txt", ["A man rides a bike. Two dogs play.", "", "A red house."])
    assert (
        main(["translate", "--checkpoint", str(checkpoint), "--input", str(src), "--alignments", *FAST]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[1] == ""
    for source, line in ((0, out[0]), (2, out[2])):
        text, pairs = line.split(" ||| ")
        words = ["A man rides a bike. Two dogs play.", "", "A red house."][source].split()
        links = [tuple(map(int, pair.split("-"))) for pair in pairs.split()]
        assert links and all(0 <= i < len(words) and 0 <= j < len(text.split()) for i, j in links)


def test_format_html_keeps_every_tag(checkpoint, tmp_path, capsys) -> None:
    html = (
        '<p>A <b>man</b> rides a <a href="x.html?a=1&amp;b=2">bike</a>.<br>Two dogs play.</p><pre>a  b</pre>'
    )
    src = write(tmp_path / "doc.html", [html])
    assert (
        main(["translate", "--checkpoint", str(checkpoint), "--input", str(src), "--format", "html", *FAST])
        == 0
    )
    out = capsys.readouterr().out
    tags = re.compile(r"<[^>]+>")
    assert sorted(tags.findall(out)) == sorted(tags.findall(html))
    assert "<pre>a  b</pre>" in out


def test_format_markdown_keeps_structure_and_code(checkpoint, tmp_path, capsys) -> None:
    src = write(
        tmp_path / "doc.md",
        ["# A red house", "", "- A man rides a `bike --fast`.", "", "```", "two dogs", "```"],
    )
    assert (
        main(
            ["translate", "--checkpoint", str(checkpoint), "--input", str(src), "--format", "markdown", *FAST]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# ") and out[2].startswith("- ") and "`bike --fast`" in out[2]
    assert out[4:7] == ["```", "two dogs", "```"]


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--format", "pdf"], "valid: text, html, markdown"),
        (["--format", "html", "--alignments"], "--alignments"),
        (["--format", "text", "--nbest", "2"], "--nbest"),
        (["--alignments", "--nbest", "2"], "--alignments"),
    ],
)
def test_document_flags_refused_in_one_line(checkpoint, tmp_path, capsys, extra, needle) -> None:
    src = write(tmp_path / "in.txt", ["A dog."])
    assert main(["translate", "--checkpoint", str(checkpoint), "--input", str(src), *extra]) == 2
    assert_user_error(capsys, needle)


def test_binary_input_is_one_line_and_exit_2(checkpoint, tmp_path, capsys) -> None:
    src = tmp_path / "in.bin"
    src.write_bytes(b"A dog.\n\x00\x01\x02\n")
    for extra in ([], ["--format", "text"]):
        assert main(["translate", "--checkpoint", str(checkpoint), "--input", str(src), *extra]) == 2
        assert_user_error(capsys, "line 2", "binary")
