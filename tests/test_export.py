"""`aiayn export --format ctranslate2`: the exported model computes what the aiayn model computes.

Tiny random-weight models (every weight perturbed so that biases, LayerNorms and positions all
matter) are exported through the CLI, loaded with ``ctranslate2.Translator`` and checked on
sentences of a synthetic parallel corpus: greedy outputs token for token, and per-token
log-probabilities of the reference translations (``score_batch``) against the model's own.
"""

from __future__ import annotations

import json
from pathlib import Path

import ctranslate2  # a `test` extra: this file never skips
import pytest
import torch

from aiayn import TransformerConfig, build_model
from aiayn.checkpoint import save_checkpoint, seal
from aiayn.cli import main
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode import Translator
from aiayn.decode.search import generate
from aiayn.decode.translator import LINE_BREAKS

MAX_OUT = 20  # generated tokens before EOS
N_SENTENCES = 20
SUPPRESS = [["<blank>"], ["<s>"]]  # aiayn never generates PAD or BOS


@pytest.fixture(scope="module")
def tokenizer(parallel_dir: Path) -> Tokenizer:
    lines = []
    for lang in ("de", "en"):
        lines += (parallel_dir / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:2000]
    return Tokenizer.train(lines, vocab_size=1000)


@pytest.fixture(scope="module")
def val(parallel_dir: Path) -> tuple[list[str], list[str]]:
    """(English sources, German references): the first val sentences."""

    def read(lang: str) -> list[str]:
        return (parallel_dir / f"val.{lang}").read_text(encoding="utf-8").splitlines()[:N_SENTENCES]

    return read("en"), read("de")


def random_model(tokenizer: Tokenizer, **overrides):
    """A tiny model whose every weight matters: matrices x3 (sharper attention), biases and
    LayerNorm parameters perturbed (they start at 0 and 1, where a missing one would go unseen)."""
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
            **overrides,
        )
    )
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():
        for param in model.parameters():  # tied weights appear once
            if param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.3)
            else:
                param.mul_(3.0)
    return model, config


def export(tmp_path: Path, model, config, tokenizer, *extra: str) -> Path:
    checkpoint = save_checkpoint(
        tmp_path / "ckpt", model, {"kind": "translation", "model": config.to_dict()}, tokenizer.to_bytes()
    )
    out = tmp_path / "ct2"
    assert (
        main(
            ["export", "--checkpoint", str(checkpoint), "--format", "ctranslate2", "--out", str(out), *extra]
        )
        == 0
    )
    return out


def pieces(tokenizer: Tokenizer, text: str) -> list[str]:
    return [tokenizer.id_to_piece(i) for i in tokenizer.encode(text)]


def piece_ids(tokenizer: Tokenizer, tokens: list[str]) -> list[int]:
    vocabulary = {tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
    return [vocabulary["<pad>" if t == "<blank>" else t] for t in tokens]


def aiayn_log_probs(model, tokenizer: Tokenizer, source: str, target: str) -> list[float]:
    """log P(y_t | y_<t, x) of ``target`` + EOS, teacher-forced from BOS."""
    src = torch.tensor([tokenizer.encode(source) + [model.config.eos_id]])
    tgt = tokenizer.encode(target) + [model.config.eos_id]
    with torch.no_grad():
        logits = model(src, torch.tensor([[model.config.bos_id] + tgt[:-1]]))  # (1, T, V)
    return logits.float().log_softmax(-1)[0].gather(-1, torch.tensor(tgt)[:, None])[:, 0].tolist()


CASES = [
    dict(norm_first=False, tie_embeddings="none"),
    dict(norm_first=False, tie_embeddings="all", activation="gelu"),
    dict(norm_first=True, tie_embeddings="none", positional="learned"),
    dict(norm_first=True, tie_embeddings="all"),
    dict(norm_first=False, tie_embeddings="decoder", activation="silu", generator_bias=True),
]


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_ctranslate2_matches_aiayn(tmp_path, tokenizer, val, overrides) -> None:
    model, config = random_model(tokenizer, **overrides)
    out = export(tmp_path, model, config, tokenizer)
    sources, references = val
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)

    # greedy search, token for token, and the detokenized strings
    ours = Translator(model, tokenizer, beam=1, alpha=0.0, max_len_a=0.0, max_len_b=MAX_OUT)
    expected = [
        generate(model, torch.tensor([ours.encode_source(s)]), ours.options)[0][0].tokens for s in sources
    ]
    results = translator.translate_batch(
        [pieces(tokenizer, s) for s in sources],
        beam_size=1,
        max_decoding_length=MAX_OUT,
        suppress_sequences=SUPPRESS,
    )
    got = [piece_ids(tokenizer, r.hypotheses[0]) for r in results]
    assert got == expected
    # (the Translator turns line breaks that byte-fallback pieces can spell into spaces)
    translations = [t.text for t in ours.translate(sources)]
    assert [LINE_BREAKS.sub(" ", tokenizer.decode(ids)) for ids in got] == translations
    assert len({tuple(ids) for ids in expected}) > 1  # the outputs depend on the input

    # every position of the reference translations: same log-probabilities
    scored = translator.score_batch(
        [pieces(tokenizer, s) for s in sources], [pieces(tokenizer, r) for r in references]
    )
    for source, reference, result in zip(sources, references, scored):
        want = aiayn_log_probs(model, tokenizer, source, reference)
        assert result.tokens == pieces(tokenizer, reference) + ["</s>"]
        assert result.log_probs == pytest.approx(want, abs=1e-4)  # measured: <= 3e-5


def test_export_files_and_int8(tmp_path, tokenizer, val) -> None:
    model, config = random_model(tokenizer)
    out = export(tmp_path, model, config, tokenizer, "--quantization", "int8")
    assert (out / "sentencepiece.model").read_bytes() == tokenizer.to_bytes()
    info = json.loads((out / "aiayn_export.json").read_text())
    assert info["quantization"] == "int8" and info["model"] == config.to_dict()
    assert "translate_batch" in (out / "README.md").read_text()
    results = ctranslate2.Translator(str(out), device="cpu", intra_threads=1).translate_batch(
        [pieces(tokenizer, val[0][0])], beam_size=1, max_decoding_length=5, suppress_sequences=SUPPRESS
    )
    assert 1 <= len(results[0].hypotheses[0]) <= 5


def test_missing_checkpoint_is_one_line_exit_2(tmp_path, capsys) -> None:
    code = main(["export", "--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert (
        code == 2 and err.count("\n") == 1 and "checkpoint not found" in err and str(tmp_path / "nope") in err
    )


def test_non_empty_out_needs_force(tmp_path, tokenizer, capsys) -> None:
    model, config = random_model(tokenizer)
    checkpoint = save_checkpoint(
        tmp_path / "ckpt", model, {"kind": "translation", "model": config.to_dict()}, tokenizer.to_bytes()
    )
    args = ["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "ct2")]
    assert main(args) == 0
    (tmp_path / "ct2" / "stale.txt").write_text("x")
    assert main(args) == 2 and "--force" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0 and not (tmp_path / "ct2" / "stale.txt").exists()
    assert (tmp_path / "ct2" / "model.bin").is_file()


def test_without_ctranslate2_says_how_to_install(tmp_path, tokenizer, monkeypatch, capsys) -> None:
    model, config = random_model(tokenizer)
    checkpoint = save_checkpoint(
        tmp_path / "ckpt", model, {"kind": "translation", "model": config.to_dict()}, tokenizer.to_bytes()
    )
    monkeypatch.setitem(__import__("sys").modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "ct2")]) == 2
    assert "pip install ctranslate2" in capsys.readouterr().err
    assert not (tmp_path / "ct2").exists()


def test_out_overlapping_the_checkpoint_is_refused_and_deletes_nothing(tmp_path, tokenizer, capsys) -> None:
    model, config = random_model(tokenizer)
    run = tmp_path / "run"
    best = save_checkpoint(
        run / "best", model, {"kind": "translation", "model": config.to_dict()}, tokenizer.to_bytes()
    )
    (run / "metrics.jsonl").write_text("{}\n")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    # out = an ancestor of the checkpoint, the checkpoint itself, inside it (the run directory given or not)
    cases = [(best, run), (best, best), (best, best / "ct2"), (run, run), (run, best), (run, tmp_path)]
    for checkpoint, out in cases:
        assert main(["export", "--checkpoint", str(checkpoint), "--out", str(out), "--force"]) == 2, (
            checkpoint,
            out,
        )
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "overlaps the checkpoint" in err, err
    # --force replaces an earlier export only, never another directory (here: the run's metrics)
    (run / "logs").mkdir()
    (run / "logs" / "notes.txt").write_text("keep me\n")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert main(["export", "--checkpoint", str(run), "--out", str(run / "logs"), "--force"]) == 2
    assert "holds something other than an export" in capsys.readouterr().err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_checkpoint_config_disagreeing_with_its_weights_is_one_line(tmp_path, tokenizer, capsys) -> None:
    model, config = random_model(tokenizer)
    checkpoint = save_checkpoint(
        tmp_path / "ckpt", model, {"kind": "translation", "model": config.to_dict()}, tokenizer.to_bytes()
    )
    stored = json.loads((checkpoint / "config.json").read_text())
    stored["model"]["d_ff"] = 64
    (checkpoint / "config.json").write_text(json.dumps(stored))
    seal(checkpoint)  # well-formed files that disagree, as a hand-assembled checkpoint's could
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "ct2")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(checkpoint / "model.safetensors") in err and "wrong shape" in err


def test_both_engines_agree_where_the_best_first_token_is_eos(tmp_path, tokenizer, val) -> None:
    """CTranslate2's default min_decoding_length (1) forbids the empty output that aiayn's searches
    allow; the backend passes 0. The EOS bias is set so that about half the sources start with EOS."""
    from aiayn.decode.backends import load_backend
    from aiayn.decode.search import DecodeOptions

    model, config = random_model(tokenizer, generator_bias=True)
    sources = val[0]
    with torch.no_grad():
        first = torch.stack(
            [model(torch.tensor([tokenizer.encode(s) + [3]]), torch.tensor([[2]]))[0, 0] for s in sources]
        )  # (N, V): the first step's logits
        others = first.clone()
        others[:, [config.pad_id, config.bos_id, config.eos_id]] = -torch.inf
        margin = others.max(-1).values - first[:, config.eos_id]
        low, high = margin.sort().values[len(sources) // 2 - 1 : len(sources) // 2 + 1]
        assert high - low > 0.05  # every source's choice at step 1 is clear of float noise
        model.generator.proj.bias[config.eos_id] += (low + high) / 2  # no source left at a tie
    checkpoint = save_checkpoint(
        tmp_path / "ckpt", model, {"kind": "translation", "model": config.to_dict()}, tokenizer.to_bytes()
    )
    torch_backend = load_backend(checkpoint, "torch")
    ct2_backend = load_backend(checkpoint, "ctranslate2", ct2_dir=tmp_path / "ct2")
    engines = (torch_backend, ct2_backend)
    for beam in (1, 4):
        options = DecodeOptions(beam=beam, max_len_a=0.0, max_len_b=MAX_OUT)
        ours, theirs = ([t.text for t in engine.translate(sources, options)] for engine in engines)
        assert ours == theirs, beam
        assert 0 < ours.count("") < len(sources), ours  # some outputs empty, some not
