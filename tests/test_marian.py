"""MarianMT in and out: `aiayn import marian` and `aiayn export --format huggingface`, against
transformers' own ``MarianMTModel``, ``MarianTokenizer`` and ``generate()``.

The Marian model is made here, offline (``marian_model.make_marian``): opus-mt's settings (swish,
scaled and tied embeddings, decoding from ``<pad>``), a random ``final_logits_bias`` and LayerNorms
away from 1/0, so that a wrong bias, activation or d_model order shows in the logits.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

# one worker builds the module-scoped models (the Marian model, its import, the native model, ~11 s of CPU)
pytestmark = pytest.mark.xdist_group("marian")
transformers = pytest.importorskip("transformers")  # the `test` extra installs it

from aiayn import load  # noqa: E402
from aiayn.cli import main  # noqa: E402
from aiayn.data.batching import pad  # noqa: E402
from aiayn.data.tokenizer import Tokenizer, VocabTokenizer  # noqa: E402
from aiayn.decode.request import Wanted  # noqa: E402
from aiayn.decode.search import DecodeOptions, generate  # noqa: E402
from aiayn.marian import residual_order  # noqa: E402
from marian_model import (  # noqa: E402
    SOURCE_WORDS,
    TARGET_WORDS,
    aligned,
    backends,
    check_control,
    import_marian,
    logits_gap,
    make_marian,
    sentences,
    texts_of,
)

MAX_OUT = 20  # tokens before EOS, both sides
UNSEEN = [
    "Ein ☃ Hund läuft über 3 Wiesen — “schön”",
    "x\u00a0y  z",
    "ÄÖÜ ß ﬁ Ω 漢字 🙂",
    "",
    " lead and trail ",
]


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    return make_marian(tmp_path_factory.mktemp("marian") / "opus-mt-tiny")


@pytest.fixture(scope="module")
def imported(marian_dir, tmp_path_factory) -> Path:
    return import_marian(marian_dir, tmp_path_factory.mktemp("imported") / "run")


@pytest.fixture(scope="module")
def hf(marian_dir):
    model = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
    return model, transformers.MarianTokenizer.from_pretrained(marian_dir)


def id_map(aiayn_tokenizer, hf_tokenizer) -> list[int]:
    pad = hf_tokenizer.pad_token_id
    return [
        pad if i == 2 else hf_tokenizer.convert_tokens_to_ids(aiayn_tokenizer.id_to_piece(i))
        for i in range(aiayn_tokenizer.vocab_size)
    ]


def test_positional_layouts_are_one_table_permuted() -> None:
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    from aiayn.model.embedding import positional_encoding

    for d in (32, 256, 512):
        marian = MarianSinusoidalPositionalEmbedding(64, d).create_weight()
        assert torch.equal(positional_encoding(64, d), marian[:, residual_order(d)])


def test_imported_logits_equal_marians(imported, hf) -> None:
    """In float64, so that the bound measures the mapping of the weights, not float32 rounding (which
    on this trained fixture's logits comes to ~1e-5 and varies with the kernels chosen)."""
    model, tokenizer, _ = load(imported)
    hf_model, hf_tok = hf
    assert hf_model.config.decoder_start_token_id == hf_tok.pad_token_id  # Marian starts from its pad
    order = id_map(tokenizer, hf_tok)
    gap, positions = logits_gap(model, hf_model, hf_tok, order, order)
    assert positions > 100 and gap < 1e-5
    assert model.config.activation == "silu" and model.config.generator_bias


def test_imported_tokenizer_gives_marian_tokenizers_ids_and_text(imported, hf) -> None:
    _, tokenizer, _ = load(imported)
    _, hf_tok = hf
    assert isinstance(tokenizer, VocabTokenizer)
    order = id_map(tokenizer, hf_tok)
    texts = sentences(SOURCE_WORDS, 300, 11) + UNSEEN + [">>deu<< der hund", ">>xx<< unknown code"]
    for text in texts:
        assert [order[i] for i in tokenizer.encode(text)] + [hf_tok.eos_token_id] == hf_tok(text)[
            "input_ids"
        ], text
    targets = sentences(TARGET_WORDS, 300, 12) + UNSEEN
    for text in targets:
        ids = hf_tok(text_target=text)["input_ids"]
        back = {m: a for a, m in enumerate(order) if a != 2}
        assert [order[i] for i in tokenizer.encode(text, target=True)] + [hf_tok.eos_token_id] == ids, text
        assert tokenizer.decode([back[i] for i in ids]) == hf_tok.decode(ids, skip_special_tokens=True), text
    assert Tokenizer.from_bytes(tokenizer.to_bytes()).to_bytes() == tokenizer.to_bytes()


def decode_both(imported, hf, texts, *, beam: int):
    """aiayn's and transformers' outputs as Marian ids, with the same length limit."""
    model, tokenizer, _ = load(imported)
    hf_model, hf_tok = hf
    order = id_map(tokenizer, hf_tok)
    options = DecodeOptions(beam=beam, alpha=0.0, max_len_a=0.0, max_len_b=MAX_OUT)
    ours, theirs = [], []
    for start in range(0, len(texts), 50):
        chunk = texts[start : start + 50]
        src = pad([tokenizer.encode(t) + [model.config.eos_id] for t in chunk], model.config.pad_id)
        ours += [[order[i] for i in hyps[0].tokens] for hyps in generate(model, src, options)]
        batch = hf_tok(chunk, padding=True, return_tensors="pt")
        with torch.no_grad():
            out = hf_model.generate(
                **batch,
                num_beams=beam,
                do_sample=False,
                max_new_tokens=MAX_OUT + 1,
                length_penalty=0.0,
                early_stopping=False,
                num_return_sequences=1,
            )
        for row in out.tolist():
            tokens = row[1:]  # the decoder start
            tokens = tokens[: tokens.index(hf_tok.eos_token_id)] if hf_tok.eos_token_id in tokens else tokens
            theirs.append([t for t in tokens if t != hf_tok.pad_token_id])
    return ours, theirs


def test_greedy_equals_transformers_generate(imported, hf) -> None:
    texts = sentences(SOURCE_WORDS, 300, 21) + UNSEEN[:-2]
    ours, theirs = decode_both(imported, hf, texts, beam=1)
    assert ours == theirs
    assert len({tuple(o) for o in ours}) > 50  # varied outputs, not one string


def test_beam_equals_transformers_beam_search(imported, hf) -> None:
    """num_beams 4, no length penalty on both sides (aiayn alpha 0, HF length_penalty 0),
    early_stopping=False (aiayn's stopping rule). Compared where the output ends before the length
    limit: at the limit both force EOS, but transformers scores the forced EOS as log 1 = 0 and
    aiayn with its real log-probability, so the two may rank hypotheses cut there differently."""
    texts = sentences(SOURCE_WORDS, 300, 31)
    ours, theirs = decode_both(imported, hf, texts, beam=4)
    ended = [(o, t) for o, t in zip(ours, theirs) if len(o) < MAX_OUT and len(t) < MAX_OUT]
    assert len(ended) > 200 and len({tuple(o) for o, _ in ended}) > 20
    differ = [(o, t) for o, t in ended if o != t]
    assert not differ, f"{len(differ)} of {len(ended)} differ, e.g. {differ[:2]}"


# --- export -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> Path:
    """A small aiayn model with its own SentencePiece tokenizer, trained a little on the
    word-for-word task (so its outputs vary), every bias and LayerNorm used."""
    from aiayn import TransformerConfig, build_model
    from aiayn.checkpoint import save_checkpoint
    from marian_model import pairs

    src, tgt = pairs(600, 5)
    tokenizer = Tokenizer.train(src + tgt, vocab_size=400)
    config = TransformerConfig.preset(
        "tiny",
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        d_model=32,
        d_ff=64,
        dropout=0.0,
        max_len=64,
        tie_embeddings="all",
    )
    torch.manual_seed(0)
    model = build_model(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = [
        (tokenizer.encode(s) + [3], [2, *tokenizer.encode(t)], [*tokenizer.encode(t), 3])
        for s, t in zip(src, tgt)
    ]
    for step in range(120):
        rows = [data[(step * 32 + i) % len(data)] for i in range(32)]
        logits = model(pad([r[0] for r in rows], 0), pad([r[1] for r in rows], 0))
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), pad([r[2] for r in rows], 0).flatten(), ignore_index=0
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    run = {"data": {"src_lang": "de", "tgt_lang": "en"}}
    return save_checkpoint(
        tmp_path_factory.mktemp("native") / "ckpt",
        model.eval(),
        {"kind": "translation", "model": config.to_dict(), "run": run},
        tokenizer.to_bytes(),
    )


def export_hf(checkpoint: Path, out: Path) -> Path:
    assert (
        main(["export", "--checkpoint", str(checkpoint), "--format", "huggingface", "--out", str(out)]) == 0
    )
    return out


def from_pretrained(directory: Path):
    model, info = transformers.MarianMTModel.from_pretrained(directory, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weight
    return model.eval(), transformers.MarianTokenizer.from_pretrained(directory)


def test_export_loads_in_transformers_and_translates_as_aiayn(native, tmp_path) -> None:
    from aiayn.decode import Translator

    hf_model, hf_tok = from_pretrained(export_hf(native, tmp_path / "hf"))
    model, tokenizer, _ = load(native)
    texts, _ = __import__("marian_model").pairs(200, 77)
    translator = Translator(model, tokenizer, options=DecodeOptions(beam=1, max_len_a=0.0, max_len_b=MAX_OUT))
    ours = [t.text for t in translator.translate(texts)]
    batch = hf_tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = hf_model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=MAX_OUT + 1)
    theirs = hf_tok.batch_decode(out, skip_special_tokens=True)
    assert [o.strip() for o in ours] == theirs  # MarianTokenizer strips the text's ends; aiayn keeps them
    assert [tokenizer.encode(o) for o in ours] == [
        [i for i in row[1:] if i not in (0, 3)] for row in out.tolist()
    ]  # the same tokens
    assert len(set(ours)) > 100 and sum(o != "" for o in ours) > 190


def test_export_survives_save_and_load_twice(native, tmp_path) -> None:
    first, _ = from_pretrained(export_hf(native, tmp_path / "one"))
    first.save_pretrained(tmp_path / "two")
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        shutil.copy(tmp_path / "one" / name, tmp_path / "two")
    second, _ = from_pretrained(tmp_path / "two")
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 11, 3, 0]])
    tgt = torch.tensor([[2, 12, 13, 14], [2, 15, 16, 0]])
    with torch.no_grad():
        a = first(input_ids=src, attention_mask=src != 0, decoder_input_ids=tgt).logits
        b = second(input_ids=src, attention_mask=src != 0, decoder_input_ids=tgt).logits
    assert torch.equal(a, b)
    model, _, _ = load(native)
    with torch.no_grad():
        ours = model(src, tgt)
    real = tgt != 0  # (transformers does not mask padded decoder inputs unless told)
    assert (ours - a).abs()[real].max() < 1e-5  # with transformers' own position table: the axis permuted


@pytest.mark.parametrize("which", ["native", "imported"])
def test_import_of_an_export_is_the_model_bit_for_bit(which, native, imported, tmp_path) -> None:
    checkpoint = {"native": native, "imported": imported}[which]
    again = tmp_path / "again"
    assert main(["import", "marian", str(export_hf(checkpoint, tmp_path / "hf")), "--out", str(again)]) == 0
    before, after = load(checkpoint), load(again)
    assert before.config == after.config
    old, new = before.model.state_dict(), after.model.state_dict()
    assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old)
    texts = sentences(SOURCE_WORDS, 50, 3) + UNSEEN
    assert [before.tokenizer.encode(t) for t in texts] == [after.tokenizer.encode(t) for t in texts]
    if which == "imported":
        assert after.tokenizer.to_bytes() == before.tokenizer.to_bytes()


def test_what_marian_cannot_express_is_refused_naming_the_setting(native, tmp_path, capsys) -> None:
    from aiayn import TransformerConfig, build_model
    from aiayn.checkpoint import save_checkpoint

    _, tokenizer, config = load(native)
    for field, value in (("norm_first", True), ("positional", "learned")):
        changed = TransformerConfig.from_dict({**config.to_dict(), field: value})
        ckpt = save_checkpoint(
            tmp_path / field,
            build_model(changed),
            {"kind": "translation", "model": changed.to_dict()},
            tokenizer.to_bytes(),
        )
        code = main(
            [
                "export",
                "--checkpoint",
                str(ckpt),
                "--format",
                "huggingface",
                "--out",
                str(tmp_path / f"{field}-hf"),
            ]
        )
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and f"model.{field}" in err, err
        assert not (tmp_path / f"{field}-hf").exists()


# --- bad input ----------------------------------------------------------------------------------------


def spoil_config(d: Path, **changes) -> None:
    values = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**values, **changes}))


BAD = {
    "not a Marian model": (lambda d: spoil_config(d, model_type="bart"), "not a MarianMT model"),
    "no config": (lambda d: (d / "config.json").unlink(), "no config.json"),
    "no source.spm": (lambda d: (d / "source.spm").unlink(), "source.spm missing"),
    "no vocab": (lambda d: (d / "vocab.json").unlink(), "vocab.json missing"),
    "vocab unlike the weights": (
        lambda d: (d / "vocab.json").write_text(
            json.dumps(dict(list(json.loads((d / "vocab.json").read_text()).items())[:-5]))
        ),
        "does not match the weights",
    ),
    "unsupported setting": (lambda d: spoil_config(d, scale_embedding=False), "scale_embedding"),
    "unsupported activation": (
        lambda d: spoil_config(d, activation_function="gelu_new"),
        "activation_function",
    ),
    "corrupt weights": (
        lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:5000]),
        "model.safetensors: cannot read the weights",
    ),
    "weights of another shape": (
        lambda d: spoil_config(d, d_model=64, encoder_ffn_dim=64),
        "the weights do not match the config",
    ),
    "not a SentencePiece model": (
        lambda d: (d / "target.spm").write_bytes(b"not a model"),
        "target: not a SentencePiece model",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_marian_directories_get_one_line_and_exit_2(case, marian_dir, tmp_path, capsys) -> None:
    spoil, words = BAD[case]
    source = shutil.copytree(marian_dir, tmp_path / "model")
    spoil(source)
    out = tmp_path / "run"
    code = main(["import", "marian", str(source), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and words in err, err
    assert not out.exists()


def test_pickles_are_never_unpickled(marian_dir, tmp_path, capsys) -> None:
    """pytorch_model.bin is read with weights_only=True: a pickle that would run code is refused."""
    source = shutil.copytree(marian_dir, tmp_path / "model")
    (source / "model.safetensors").unlink()

    class Boom:
        def __reduce__(self):
            return (print, ("unpickled!",))

    torch.save({"model.shared.weight": Boom()}, source / "pytorch_model.bin")
    code = main(["import", "marian", str(source), "--out", str(tmp_path / "run")])
    captured = capsys.readouterr()
    assert code == 2 and "unpickled!" not in captured.out and "cannot read the weights" in captured.err


def test_pytorch_model_bin_imports_like_safetensors(marian_dir, imported, tmp_path) -> None:
    from safetensors.torch import load_file

    source = shutil.copytree(marian_dir, tmp_path / "model")
    torch.save(load_file(source / "model.safetensors"), source / "pytorch_model.bin")
    (source / "model.safetensors").unlink()
    assert main(["import", "marian", str(source), "--out", str(tmp_path / "run")]) == 0
    old, new = load(imported).model.state_dict(), load(tmp_path / "run").model.state_dict()
    assert all(torch.equal(old[k], new[k]) for k in old)


@pytest.fixture(scope="module")
def imported_engines(imported, tmp_path_factory):
    """The imported model's torch and CTranslate2 backends (one export for the module's tests)."""
    return backends(imported, tmp_path_factory.mktemp("imported") / "ct2")


def test_an_imported_model_decodes_alike_with_ctranslate2(imported_engines) -> None:
    texts = sentences(SOURCE_WORDS, 200, 41) + UNSEEN
    torch_backend, ct2_backend = imported_engines
    greedy = DecodeOptions(beam=1, max_len_a=0.0, max_len_b=MAX_OUT)
    ours = texts_of(torch_backend.translate(texts, greedy))
    assert ours == texts_of(ct2_backend.translate(texts, greedy)) and len(set(ours)) > 100
    # beam 4 without length penalty: equal where the output ends before the length limit. (CTranslate2
    # ranks hypotheses cut at the limit by its own rules, and with alpha > 0 normalises by |Y| ** alpha
    # inside its search, which keeps other hypotheses than GNMT's penalty would: see decode.backends)
    beam = DecodeOptions(beam=4, alpha=0.0, max_len_a=0.0, max_len_b=MAX_OUT)
    ours, theirs = (
        texts_of(torch_backend.translate(texts, beam)),
        texts_of(ct2_backend.translate(texts, beam)),
    )
    ended = [
        i
        for i, text in enumerate(ours)
        if len(torch_backend.tokenizer.encode(text, target=True)) < MAX_OUT - 2
    ]
    assert len(ended) > 150 and [ours[i] for i in ended] == [theirs[i] for i in ended]


def test_an_imported_model_aligns_and_translates_documents_on_both_engines(
    imported, imported_engines
) -> None:
    """Its source language comes from the import (opus-mt's tokenizer_config.json); alignments are
    read as for a native model, alike on both engines; HTML keeps its tags."""
    from aiayn.documents.translate import DocumentTranslator
    from aiayn.loading import model_languages

    assert model_languages(imported) == ("de", "en")
    texts = sentences(SOURCE_WORDS, 40, 43)
    greedy = DecodeOptions(beam=1, max_len_a=0.0, max_len_b=MAX_OUT)
    torch_backend, ct2_backend = imported_engines
    ours = aligned(torch_backend.translate(texts, greedy, Wanted(alignment=True)))
    theirs = aligned(ct2_backend.translate(texts, greedy, Wanted(alignment=True)))
    assert ours == theirs and sum(len(pairs) for _, pairs in ours) > len(texts)
    html = "<p>" + " ".join(f"<b>{text}</b>" for text in texts[:3]) + "</p>"
    documents = DocumentTranslator(torch_backend, language="de", warn=lambda message: None)
    out = documents.translate([html], greedy, fmt="html")[0].text
    assert out.startswith("<p>") and out.endswith("</p>") and out.count("<b>") == out.count("</b>") == 3


# --- fine-tuning: aiayn train --init -------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_corpus(tmp_path_factory) -> Path:
    """Another corpus for the imported model: the same words, the translation's word order reversed."""
    from marian_model import WORDS

    directory = tmp_path_factory.mktemp("reversed")
    for split, n, seed in (("train", 400, 50), ("val", 60, 51)):
        src, _ = __import__("marian_model").pairs(n, seed)
        tgt = [" ".join(WORDS.get(w.lower(), w) for w in reversed(s.rstrip(".!?").split())) for s in src]
        (directory / f"{split}.de").write_text("".join(line + "\n" for line in src), encoding="utf-8")
        (directory / f"{split}.en").write_text("".join(line + "\n" for line in tgt), encoding="utf-8")
    return directory


def fine_tuning(data: Path, init: Path, **train) -> dict:
    return {
        "data": {
            "dir": str(data),
            "src_lang": "de",
            "tgt_lang": "en",
            "batch_tokens": 400,
            "max_sentence_tokens": 40,
        },
        "optim": {"lr_schedule": "inverse_sqrt", "peak_lr": 3e-3, "warmup": 5},
        "train": {
            "init": str(init),
            "precision": "fp32",
            "device": "cpu",
            "max_steps": 20,
            "save_every": 10,
            "valid_every": 0,
            "valid_at_epoch_end": False,
            "log_every": 5,
            "valid_bleu": False,
            **train,
        },
    }


def test_init_starts_from_the_checkpoint_and_fine_tuning_lowers_the_validation_loss(
    imported, other_corpus, tmp_path
) -> None:
    from aiayn.train.config import run_config_from_dict
    from aiayn.train.engine import start
    from aiayn.train.translation import TranslationTask

    task = start(
        TranslationTask(run_config_from_dict(fine_tuning(other_corpus, imported))),
        tmp_path / "run",
        progress=False,
    )
    checkpoint = load(imported)
    weights = checkpoint.model.state_dict()
    assert task.model.config == checkpoint.config
    assert all(torch.equal(t, weights[k]) for k, t in task.model.state_dict().items())  # step 0
    assert task.tokenizer.to_bytes() == checkpoint.tokenizer.to_bytes()  # the data encoded with it
    before = task.validate()["loss"]
    task.engine.run(task)
    after = task.validate()["loss"]
    assert after < before - 0.3, (before, after)


def test_init_runs_resume_bit_for_bit(imported, other_corpus, tmp_path) -> None:
    import yaml

    def train(out: Path, steps: int) -> None:
        config = tmp_path / "fine_tune.yaml"
        config.write_text(yaml.safe_dump(fine_tuning(other_corpus, imported, max_steps=steps)))
        assert main(["train", "--config", str(config), "--out", str(out), "--no-progress"]) == 0

    train(tmp_path / "straight", 20)
    train(tmp_path / "resumed", 10)
    train(tmp_path / "resumed", 20)  # the same command, resumed from its step-10 checkpoint
    a = load_checkpoint_weights(tmp_path / "straight")
    b = load_checkpoint_weights(tmp_path / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def load_checkpoint_weights(run: Path) -> dict:
    from aiayn.checkpoint import latest_checkpoint, load_checkpoint

    return load_checkpoint(latest_checkpoint(run), with_state=False).weights


def test_init_refuses_another_model_naming_the_field(imported, other_corpus, tmp_path, capsys) -> None:
    import yaml

    values = fine_tuning(other_corpus, imported)
    config = tmp_path / "c.yaml"
    for section, lines in (({"d_model": 64}, 1), ({"preset": "tiny"}, 2)):  # tiny: d_model, d_ff
        config.write_text(yaml.safe_dump({**values, "model": section}))
        code = main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--no-progress"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == lines and "model.d_model" in err[0], err
        assert all(line.startswith("aiayn: error: model.") and "--init" in line for line in err), err
    config.write_text(yaml.safe_dump({**values, "model": {"dropout": 0.3}}))  # dropout may differ
    args = [
        "train",
        "--config",
        str(config),
        "--out",
        str(tmp_path / "ok"),
        "--no-progress",
        "--max-steps",
        "1",
    ]
    assert main(args) == 0
    code = main(
        ["train", "--config", str(config), "--out", str(tmp_path / "x"), "--init", str(tmp_path / "nowhere")]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "nowhere" in err, err


def test_out_is_never_the_source_and_force_replaces_only_an_earlier_result(
    imported, marian_dir, tmp_path, capsys
) -> None:
    code = main(
        [
            "export",
            "--checkpoint",
            str(imported),
            "--format",
            "huggingface",
            "--out",
            str(imported),
            "--force",
        ]
    )
    assert code == 2 and "overlaps" in capsys.readouterr().err
    assert load(imported).config  # untouched
    code = main(["import", "marian", str(marian_dir), "--out", str(marian_dir / "run")])
    assert code == 2 and "overlaps" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    for args in (
        ["import", "marian", str(marian_dir)],
        ["export", "--checkpoint", str(imported), "--format", "huggingface"],
    ):
        assert main([*args, "--out", str(other)]) == 2 and "--force" in capsys.readouterr().err
        assert (
            main([*args, "--out", str(other), "--force"]) == 2
            and "something other than" in capsys.readouterr().err
        )
        assert (other / "notes.txt").read_text() == "mine"
    again = tmp_path / "again"
    assert main(["import", "marian", str(marian_dir), "--out", str(again)]) == 0
    assert main(["import", "marian", str(marian_dir), "--out", str(again), "--force"]) == 0


def test_an_imported_model_takes_a_glossary_a_prefix_and_gives_its_confidence(imported_engines) -> None:
    check_control(*imported_engines, MAX_OUT)
