"""`--engine ctranslate2` (aiayn.decode.backends): the CTranslate2 export of a checkpoint gives the
torch engine's outputs, is made once and made again when the checkpoint changes.

The model is a tiny random one whose EOS logit is raised by a constant (its generator row gets a
multiple of the last LayerNorm's bias direction), so that outputs end by themselves after ~10
tokens, all different lengths, far from their maximum length: there aiayn and CTranslate2 search
the same way (see the backends module for where they differ).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aiayn import TransformerConfig, build_model
from aiayn.checkpoint import save_checkpoint
from aiayn.cli import main
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode import DecodeOptions, Translator
from aiayn.decode.backends import CTranslate2Backend, load_backend
from aiayn.decode.request import Wanted
from aiayn.errors import UserError
from aiayn.precision import native_bf16

N_SENTENCES = 200
EOS_BONUS = 0.7  # mean output ~10 tokens, none at its limit, ~66 distinct outputs of 200


@pytest.fixture(scope="module")
def tokenizer(parallel_dir: Path) -> Tokenizer:
    lines = []
    for lang in ("de", "en"):
        lines += (parallel_dir / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:2000]
    return Tokenizer.train(lines, vocab_size=1000)


@pytest.fixture(scope="module")
def sources(parallel_dir: Path, tmp_path_factory) -> Path:
    """The first val sentences (English) of the synthetic corpus, a blank line among them."""
    lines = (parallel_dir / "val.en").read_text(encoding="utf-8").splitlines()[:N_SENTENCES]
    path = tmp_path_factory.mktemp("data") / "val.en"
    path.write_text("\n".join(lines[:10] + [""] + lines[10:]) + "\n", encoding="utf-8")
    return path


def ending_model(tokenizer: Tokenizer, seed: int = 0):
    config = TransformerConfig.from_dict(
        dict(
            src_vocab_size=tokenizer.vocab_size,
            tgt_vocab_size=tokenizer.vocab_size,
            d_model=64,
            n_heads=4,
            n_encoder_layers=2,
            n_decoder_layers=2,
            d_ff=128,
            dropout=0.0,
            max_len=64,
        )
    )
    torch.manual_seed(seed)
    model = build_model(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:  # biases and LayerNorms away from 0 and 1: each one matters
                param.add_(torch.randn_like(param) * 0.3)
        beta = model.decoder.layers[-1].ff_block.norm.bias  # added to every decoder output
        model.generator.proj.weight[config.eos_id] += EOS_BONUS * beta / beta.norm() ** 2
    return model, config


def save_run(run: Path, model, config, tokenizer: Tokenizer) -> Path:
    meta = {"kind": "translation", "model": config.to_dict()}
    return save_checkpoint(run / "best", model, meta, tokenizer.to_bytes())


@pytest.fixture(scope="module")
def run(tmp_path_factory, tokenizer) -> Path:
    model, config = ending_model(tokenizer)
    run = tmp_path_factory.mktemp("run")
    save_run(run, model, config, tokenizer)
    return run


@pytest.fixture(scope="module")
def engines(run) -> tuple[Translator, CTranslate2Backend]:
    return load_backend(run, "torch"), load_backend(run, "ctranslate2")


SCORES = Wanted(scores=True)


def translate(*args: str) -> int:
    return main(["translate", *args])


def test_cli_greedy_output_equals_torch_engines(run, sources, tmp_path, capsys) -> None:
    outputs = {}
    for engine in ("torch", "ctranslate2"):
        out = tmp_path / f"{engine}.txt"
        args = ["--checkpoint", str(run), "--input", str(sources), "--output", str(out), "--beam", "1"]
        assert translate(*args, "--engine", engine) == 0
        outputs[engine] = out.read_text(encoding="utf-8").splitlines()
    assert outputs["ctranslate2"] == outputs["torch"]
    assert len(outputs["torch"]) == N_SENTENCES + 1 and outputs["torch"][10] == ""
    assert len(set(outputs["torch"])) > 30  # the outputs depend on the input
    assert "exported" in capsys.readouterr().err


def test_beam_search_equals_torch(engines, sources) -> None:
    """Beam 4, alpha 0 and 0.6: both searches take the same candidates at each step, but this
    random model's next-token log-probs are nearly flat (all about -5.9), so candidates of
    different beams tie to within float rounding (CTranslate2's and PyTorch's kernels differ by
    ~1e-5) and a tie at the beam's edge can send a sentence another way: measured 198 of 200 equal
    (val lines 12 and 111) for both alphas. Where the texts agree, so do the scores (GNMT's,
    recomputed from CTranslate2's), n-best lists included, to 0.1%: CTranslate2 renormalises the
    log-probs over the tokens it may generate (PAD and BOS suppressed), here ~0.002 per token."""
    lines = sources.read_text(encoding="utf-8").splitlines()
    for options in (DecodeOptions(beam=4, alpha=0.0, nbest=2), DecodeOptions(beam=4, alpha=0.6, nbest=2)):
        ours, theirs = ([t.nbest for t in e.translate(lines, options, SCORES)] for e in engines)
        same = [(a, b) for a, b in zip(ours, theirs) if [t for _, t in a] == [t for _, t in b]]
        assert len(same) >= 0.97 * N_SENTENCES, (options, len(same))
        assert [s for _, b in same for s, _ in b] == pytest.approx(
            [s for a, _ in same for s, _ in a], rel=1e-3
        )
        assert theirs[10] == () and all(len(b) == 2 for b in theirs if b)


def test_word_alignments_match(engines, sources) -> None:
    """Both engines read alignments off the last decoder layer's cross-attention, heads averaged
    (the export asks CTranslate2 for those weights): the same pairs on greedy outputs that agree.
    This random model's near-ties (see the beam test) let a few outputs differ."""
    lines = sources.read_text(encoding="utf-8").splitlines()
    ours, theirs = (
        [
            (t.text, t.alignment)
            for t in engine.translate(lines, DecodeOptions(beam=1), Wanted(alignment=True))
        ]
        for engine in engines
    )
    same_text = [(a, b) for a, b in zip(ours, theirs) if a[0] == b[0]]
    assert len(same_text) >= 0.97 * N_SENTENCES and ours[10] == theirs[10] == ("", ())
    agree = sum(a[1] == b[1] for a, b in same_text)
    assert agree >= 0.95 * len(same_text), (agree, len(same_text))
    assert sum(len(pairs) for _, pairs in ours) > N_SENTENCES  # words were aligned


def test_text_conventions_match(engines) -> None:
    """Blank lines, a truncated long source (the same warning), sampling's n-best shape."""
    warnings = {}
    long_line = "A man in a blue shirt is riding a bike down the street. " * 8
    for engine in engines:
        seen: list[str] = []
        engine.warn = seen.append
        got = [t.text for t in engine.translate(["  ", long_line, "Two dogs play."], DecodeOptions(beam=1))]
        warnings[engine.name] = (seen, got)
    assert warnings["ctranslate2"] == warnings["torch"]
    assert warnings["torch"][1][0] == "" and "truncated" in warnings["torch"][0][0]
    ct2, sampling = engines[1], DecodeOptions(sample=True, nbest=3, seed=7)
    sampled = [t.nbest for t in ct2.translate(["A dog runs.", ""], sampling, SCORES)]
    assert len(sampled[0]) == 3 and sampled[1] == ()
    assert [t.nbest for t in ct2.translate(["A dog runs."], sampling, SCORES)] == sampled[:1]


def test_export_reused_then_redone_when_the_checkpoint_changes(tmp_path, tokenizer, sources, capsys) -> None:
    run = tmp_path / "run"
    save_run(run, *ending_model(tokenizer), tokenizer)
    args = ["--checkpoint", str(run), "--input", str(sources), "--engine", "ctranslate2", "--beam", "1"]
    assert translate(*args, "--output", str(tmp_path / "a.txt")) == 0
    info = json.loads((run / "ct2" / "aiayn_export.json").read_text())
    assert "exported" in capsys.readouterr().err
    made = (run / "ct2" / "model.bin").stat().st_mtime_ns

    assert translate(*args, "--output", str(tmp_path / "b.txt"), "--compute-type", "int8") == 0
    assert "exported" not in capsys.readouterr().err
    assert (run / "ct2" / "model.bin").stat().st_mtime_ns == made

    save_run(run, *ending_model(tokenizer, seed=1), tokenizer)  # a new best/
    assert translate(*args, "--output", str(tmp_path / "c.txt")) == 0
    assert "exported" in capsys.readouterr().err
    assert (
        json.loads((run / "ct2" / "aiayn_export.json").read_text())["checkpoint_sha256"]
        != (info["checkpoint_sha256"])
    )
    assert (tmp_path / "c.txt").read_text() != (tmp_path / "a.txt").read_text()


def test_checkpoint_directory_and_ct2_dir(tmp_path, tokenizer, sources) -> None:
    best = save_run(tmp_path / "run", *ending_model(tokenizer), tokenizer)
    assert translate("--checkpoint", str(best), "--input", str(sources), "--engine", "ctranslate2") == 0
    assert (tmp_path / "run" / "ct2-best" / "model.bin").is_file()  # beside the checkpoint, not in it
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    args = ["--checkpoint", str(best), "--input", str(sources), "--engine", "ctranslate2", "--ct2-dir"]
    assert translate(*args, str(mine)) == 2  # not an export: never replaced
    assert translate(*args, str(tmp_path / "elsewhere")) == 0
    assert (tmp_path / "elsewhere" / "model.bin").is_file()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--engine", "onnx"], "--engine: unknown engine 'onnx'"),
        (["--engine", "ctranslate2", "--compute-type", "int4"], "--compute-type: unknown value 'int4'"),
        (["--engine", "ctranslate2", "--no-cache"], "--no-cache"),
        (["--compute-type", "int8_float16"], "--compute-type: 'int8_float16' needs --engine ctranslate2"),
        (["--compute-type", "int8", "--no-cache"], "--compute-type int8 decodes on the key/value cache"),
        (["--ct2-dir", "x"], "--ct2-dir needs --engine ctranslate2"),
    ],
)
def test_bad_engine_options_are_one_line_exit_2(run, sources, extra, message, capsys) -> None:
    assert translate("--checkpoint", str(run), "--input", str(sources), *extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert (
        main(["evaluate", "--checkpoint", str(run), "--src", str(sources), "--ref", str(sources), *extra])
        == 2
    )
    assert message in capsys.readouterr().err


def test_evaluate_with_ctranslate2(run, parallel_dir, tmp_path, capsys) -> None:
    src, ref = tmp_path / "val.en", tmp_path / "val.de"
    for lang, path in (("en", src), ("de", ref)):
        lines = (parallel_dir / f"val.{lang}").read_text(encoding="utf-8").splitlines()[:50]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    scores = {}
    for engine in ("torch", "ctranslate2"):
        args = ["--checkpoint", str(run), "--src", str(src), "--ref", str(ref), "--beam", "1", "--json"]
        assert main(["evaluate", *args, "--engine", engine]) == 0
        scores[engine] = json.loads(capsys.readouterr().out)
    assert scores["ctranslate2"] == scores["torch"]


def test_without_ctranslate2_says_how_to_install(run, sources, monkeypatch, capsys) -> None:
    monkeypatch.setitem(__import__("sys").modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    assert translate("--checkpoint", str(run), "--input", str(sources), "--engine", "ctranslate2") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install ctranslate2" in err


def test_the_torch_engine_translates_in_int8(run, sources, tmp_path) -> None:
    """``--compute-type int8`` with the torch engine decodes the model's int8 copy (not the fp32
    model: this random model's near ties move; tests/test_fast_step.py checks int8 against fp32);
    on a GPU it is one line saying int8 runs on the CPU."""
    out = {}
    for kind in ("default", "int8"):
        path = tmp_path / f"{kind}.txt"
        args = ["--input", str(sources), "--output", str(path), "--beam", "1", "--compute-type", kind]
        assert translate("--checkpoint", str(run), *args) == 0
        out[kind] = path.read_text().splitlines()
    assert len(out["int8"]) == len(out["default"]) == len(sources.read_text().splitlines())
    assert out["int8"] != out["default"]
    with pytest.raises(UserError, match="int8 runs on the CPU with the torch engine .device cpu"):
        load_backend(run, device="meta", batch_tokens=64, warn=print, compute_type="int8")


def test_the_server_decodes_in_int8_with_the_torch_engine(run) -> None:
    """``aiayn serve --compute-type int8``: the torch backend holds the int8 copy, the attention page
    the checkpoint's model."""
    from aiayn.cli import build_parser
    from aiayn.decode import fast_step
    from aiayn.serve.cli import load_served

    pytest.importorskip("fastapi")
    args = build_parser().parse_args(
        ["serve", "--checkpoint", str(run), "--device", "cpu", "--compute-type", "int8"]
    )
    served = load_served(args)
    assert fast_step.is_int8(served.backend.model) and not fast_step.is_int8(served.model)


def test_the_torch_engine_translates_in_bf16_where_it_is_native(
    run, sources, tmp_path, monkeypatch, capsys
) -> None:
    """``--compute-type bfloat16``: the model's bf16 copy where the CPU has AVX512-BF16 or AMX; one
    line elsewhere (emulated bf16 is many times slower), before any model is loaded."""
    from aiayn.decode import backends

    path = tmp_path / "bf16.txt"
    args = [
        "--checkpoint",
        str(run),
        "--input",
        str(sources),
        "--output",
        str(path),
        "--compute-type",
        "bfloat16",
    ]
    if native_bf16(torch.device("cpu")):
        assert translate(*args) == 0
        assert len(path.read_text().splitlines()) == len(sources.read_text().splitlines())
        backend = load_backend(run, batch_tokens=64, warn=print, compute_type="bfloat16")
        assert next(backend.model.parameters()).dtype == torch.bfloat16
    monkeypatch.setattr(backends, "native_bf16", lambda device: False)
    capsys.readouterr()
    assert translate(*args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--compute-type: bfloat16 needs native bf16" in err, err
    with pytest.raises(UserError, match="bfloat16 needs native bf16"):
        load_backend(run, batch_tokens=64, warn=print, compute_type="bfloat16")


def test_the_server_decodes_in_bf16_with_the_torch_engine(run, monkeypatch) -> None:
    """``aiayn serve --compute-type bfloat16``: the backend holds the bf16 copy, the attention page the
    checkpoint's model; refused at start in one line where bf16 is not native."""
    from aiayn.cli import build_parser
    from aiayn.decode import backends
    from aiayn.serve.cli import load_served

    pytest.importorskip("fastapi")
    args = build_parser().parse_args(
        ["serve", "--checkpoint", str(run), "--device", "cpu", "--compute-type", "bfloat16"]
    )
    if native_bf16(torch.device("cpu")):
        served = load_served(args)
        assert next(served.backend.model.parameters()).dtype == torch.bfloat16
        assert next(served.model.parameters()).dtype == torch.float32
    monkeypatch.setattr(backends, "native_bf16", lambda device: False)
    with pytest.raises(UserError, match="bfloat16 needs native bf16"):
        load_served(args)
