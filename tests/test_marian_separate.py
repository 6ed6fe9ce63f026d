"""MarianMT models with a source and a target vocabulary (MarianTokenizer's ``separate_vocabs``, as
some Tatoeba-Challenge opus-mt models are built): `aiayn import marian`, decoding and
`aiayn export --format huggingface`, against transformers' own ``MarianMTModel``, ``MarianTokenizer``
and ``generate()``, as ``test_marian.py`` checks the joint layout.

The model is made here, offline (``marian_model.make_marian(separate=True)``): the two vocabularies
list different pieces in different orders, so a source id read as a target id (or the reverse)
shows in the ids, the logits and the text.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")  # the `test` extra installs it

from aiayn import load  # noqa: E402
from aiayn.cli import main  # noqa: E402
from aiayn.data.batching import pad  # noqa: E402
from aiayn.data.tokenizer import Tokenizer  # noqa: E402
from aiayn.decode.request import Wanted  # noqa: E402
from aiayn.decode.search import DecodeOptions, generate  # noqa: E402
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

pytestmark = pytest.mark.xdist_group("marian_separate")  # one worker builds the model, once

MAX_OUT = 20  # tokens before EOS, both sides
UNSEEN = ["Ein ☃ Hund läuft über 3 Wiesen — “schön”", "ÄÖÜ ß ﬁ Ω 漢字 🙂", " lead and trail "]
GREEDY = DecodeOptions(beam=1, max_len_a=0.0, max_len_b=MAX_OUT)


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    return make_marian(tmp_path_factory.mktemp("marian") / "opus-mt-tc-tiny", separate=True)


@pytest.fixture(scope="module")
def imported(marian_dir, tmp_path_factory) -> Path:
    return import_marian(marian_dir, tmp_path_factory.mktemp("imported") / "run")


@pytest.fixture(scope="module")
def hf(marian_dir):
    model = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(marian_dir)
    assert tokenizer.separate_vocabs and not model.config.share_encoder_decoder_embeddings
    return model, tokenizer


def id_map(tokenizer, hf_tok, target: bool) -> list[int]:
    """Marian's id of each aiayn id on one side (aiayn's BOS: Marian's decoder start, its pad)."""
    vocab = hf_tok.target_encoder if target else hf_tok.encoder  # (its get_tgt_vocab() raises TypeError)
    size = tokenizer.target_vocab_size if target else tokenizer.vocab_size
    return [vocab["<pad>" if i == 2 else tokenizer.id_to_piece(i, target=target)] for i in range(size)]


def back_map(order: list[int]) -> dict[int, int]:
    return {m: a for a, m in enumerate(order) if a != 2}


def test_the_layout_is_separate_and_imports_untied(imported, capsys) -> None:
    _, tokenizer, config = load(imported)
    assert tokenizer.separate and config.tie_embeddings == "decoder"
    source = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    target = [tokenizer.id_to_piece(i, target=True) for i in range(tokenizer.target_vocab_size)]
    assert source[:4] == target[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert ">>deu<<" in source and ">>deu<<" not in target
    differ = sum(a != b for a, b in zip(source, target))
    assert differ > len(source) // 2  # the same id is mostly another piece on the other side
    assert (config.src_vocab_size, config.tgt_vocab_size) == (len(source), len(target))
    assert Tokenizer.from_bytes(tokenizer.to_bytes()).to_bytes() == tokenizer.to_bytes()


def test_imported_logits_equal_marians(imported, hf) -> None:
    """In float64, as the joint test (the bound measures the mapping, not float32 rounding)."""
    model, tokenizer, _ = load(imported)
    hf_model, hf_tok = hf
    source_order, target_order = id_map(tokenizer, hf_tok, False), id_map(tokenizer, hf_tok, True)
    gap, positions = logits_gap(model, hf_model, hf_tok, source_order, target_order)
    assert positions > 100 and gap < 1e-5


def test_imported_tokenizer_gives_marian_tokenizers_ids_and_text(imported, hf) -> None:
    _, tokenizer, _ = load(imported)
    _, hf_tok = hf
    source_order, target_order = id_map(tokenizer, hf_tok, False), id_map(tokenizer, hf_tok, True)
    eos = hf_tok.eos_token_id
    for text in sentences(SOURCE_WORDS, 200, 11) + UNSEEN + [">>deu<< der hund"]:
        assert [source_order[i] for i in tokenizer.encode(text)] + [eos] == hf_tok(text)["input_ids"], text
    back = back_map(target_order)
    for text in sentences(TARGET_WORDS, 200, 12) + UNSEEN:
        ids = hf_tok(text_target=text)["input_ids"]
        assert [target_order[i] for i in tokenizer.encode(text, target=True)] + [eos] == ids, text
        assert tokenizer.decode([back[i] for i in ids]) == hf_tok.decode(ids, skip_special_tokens=True), text


def hf_greedy(hf, texts: list[str]) -> tuple[list[list[int]], list[str]]:
    """transformers' greedy outputs: the tokens (Marian's target ids) and the text."""
    hf_model, hf_tok = hf
    batch = hf_tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = hf_model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=MAX_OUT + 1)
    tokens = []
    for row in out.tolist():
        row = row[1:]  # the decoder start
        row = row[: row.index(hf_tok.eos_token_id)] if hf_tok.eos_token_id in row else row
        tokens.append([t for t in row if t != hf_tok.pad_token_id])
    return tokens, hf_tok.batch_decode(out, skip_special_tokens=True)


def test_greedy_and_the_translate_command_equal_transformers(imported, hf, tmp_path, capsys) -> None:
    model, tokenizer, _ = load(imported)
    texts = sentences(SOURCE_WORDS, 150, 21) + UNSEEN
    src = pad([tokenizer.encode(t) + [model.config.eos_id] for t in texts], model.config.pad_id)
    order = id_map(tokenizer, hf[1], True)
    ours = [[order[i] for i in hyps[0].tokens] for hyps in generate(model, src, GREEDY)]
    theirs, text = hf_greedy(hf, texts)
    assert ours == theirs and len({tuple(o) for o in ours}) > 50
    (tmp_path / "in.txt").write_text("".join(f"{t}\n" for t in texts), encoding="utf-8")
    args = ["translate", "--checkpoint", str(imported), "--beam", "1", "--max-len-a", "0"]
    args += ["--max-len-b", str(MAX_OUT), "--input", str(tmp_path / "in.txt"), "--device", "cpu"]
    assert main(args) == 0
    assert capsys.readouterr().out.splitlines() == text


@pytest.fixture(scope="module")
def engines(imported, tmp_path_factory):
    """The imported model's torch and CTranslate2 backends (one export for the module's tests)."""
    return backends(imported, tmp_path_factory.mktemp("imported") / "ct2")


def test_ctranslate2_decodes_and_aligns_as_torch(engines) -> None:
    """The CTranslate2 export registers the two vocabularies; both engines read target pieces."""
    texts = sentences(SOURCE_WORDS, 100, 41) + UNSEEN
    torch_backend, ct2_backend = engines
    assert ct2_backend.pieces != ct2_backend.target_pieces
    ours = texts_of(torch_backend.translate(texts, GREEDY))
    assert ours == texts_of(ct2_backend.translate(texts, GREEDY)) and len(set(ours)) > 50
    found = aligned(torch_backend.translate(texts[:30], GREEDY, Wanted(alignment=True)))
    assert found == aligned(ct2_backend.translate(texts[:30], GREEDY, Wanted(alignment=True)))
    assert sum(len(pairs) for _, pairs in found) > 30


def test_a_glossary_a_prefix_confidence_and_choices_read_the_target_vocabulary(imported, engines) -> None:
    """A glossary term and a prefix are encoded as target pieces and kept, alike on both engines;
    the confidence agrees; the model's next choices are target pieces."""
    from aiayn.decode.choices import next_choices

    texts = check_control(*engines, MAX_OUT)
    model, tokenizer, _ = load(imported)
    choices = next_choices(model, tokenizer, texts[0], "the", k=5).choices
    assert [c.piece for c in choices] == [tokenizer.id_to_piece(c.token, target=True) for c in choices]
    assert any(c.piece != tokenizer.id_to_piece(c.token) for c in choices)


def test_attention_labels_target_rows_with_target_pieces(imported) -> None:
    from aiayn.decode.attention import sentence_attention

    model, tokenizer, _ = load(imported)
    text = sentences(SOURCE_WORDS, 1, 5)[0]
    found = sentence_attention(model, tokenizer, text, GREEDY)
    tokens = [*generate(model, torch.tensor([[*tokenizer.encode(text), 3]]), GREEDY)[0][0].tokens, 3]
    assert found.predicted_pieces == [tokenizer.id_to_piece(i, target=True) for i in tokens]
    assert found.predicted_pieces != [tokenizer.id_to_piece(i) for i in tokens]  # the source's reading
    assert found.source_pieces == [tokenizer.id_to_piece(i) for i in [*tokenizer.encode(text), 3]]


# --- export -----------------------------------------------------------------------------------------


def test_export_round_trip_keeps_the_two_vocabularies(imported, hf, tmp_path) -> None:
    """Exported: transformers loads it (separate_vocabs) and translates as the original; imported
    again: the same checkpoint, bit for bit."""
    out = tmp_path / "hf"
    args = ["export", "--checkpoint", str(imported), "--format", "huggingface", "--out", str(out)]
    assert main(args) == 0
    assert json.loads((out / "tokenizer_config.json").read_text())["separate_vocabs"] is True
    model, info = transformers.MarianMTModel.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    assert not model.config.share_encoder_decoder_embeddings
    exported = (model.eval(), transformers.MarianTokenizer.from_pretrained(out))
    texts = sentences(SOURCE_WORDS, 100, 61) + UNSEEN
    assert hf_greedy(exported, texts)[1] == hf_greedy(hf, texts)[1]
    again = tmp_path / "again"
    assert main(["import", "marian", str(out), "--out", str(again)]) == 0
    before, after = load(imported), load(again)
    assert before.config == after.config
    old, new = before.model.state_dict(), after.model.state_dict()
    assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old)
    assert after.tokenizer.to_bytes() == before.tokenizer.to_bytes()


# --- bad input ----------------------------------------------------------------------------------------


def edit_json(file: Path, change) -> None:
    file.write_text(json.dumps(change(json.loads(file.read_text())), ensure_ascii=False))


def without(vocab: dict, piece: str) -> dict:
    """``vocab`` with ``piece``'s id given to another piece (the ids stay 0..V-1)."""
    return {("<gone>" if p == piece else p): i for p, i in vocab.items()}


BAD = {
    "target_vocab.json but not separate_vocabs": (
        lambda d: edit_json(d / "tokenizer_config.json", lambda c: {**c, "separate_vocabs": False}),
        "does not set separate_vocabs",
    ),
    "separate_vocabs but no target_vocab.json": (
        lambda d: (d / "target_vocab.json").unlink(),
        "target_vocab.json missing",
    ),
    "target vocabulary unlike the weights": (
        lambda d: edit_json(d / "target_vocab.json", lambda v: dict(list(v.items())[:-3])),
        "decoder_vocab_size",
    ),
    "no <unk> in the target vocabulary": (
        lambda d: edit_json(d / "target_vocab.json", lambda v: without(v, "<unk>")),
        "target_vocab.json: has no <unk> piece",
    ),
    "no <pad> in the source vocabulary": (
        lambda d: edit_json(d / "vocab.json", lambda v: without(v, "<pad>")),
        "vocab.json: has no '<pad>' piece (the target vocabulary's pad)",
    ),
    "pad id out of range": (
        lambda d: edit_json(d / "config.json", lambda c: {**c, "pad_token_id": 10**6}),
        "pad_token_id: 1000000 is not an id",
    ),
    "target embeddings of another size": (
        lambda d: smaller_target(d, 3),
        "the weights do not match the config",
    ),
}


def smaller_target(d: Path, fewer: int) -> None:
    """A target vocabulary and decoder_vocab_size ``fewer`` pieces short of the weights' rows."""
    size = len(json.loads((d / "target_vocab.json").read_text())) - fewer
    edit_json(
        d / "target_vocab.json", lambda v: {p: i for p, i in v.items() if i < size - 1} | {"<pad>": size - 1}
    )
    ids = dict.fromkeys(("pad_token_id", "decoder_start_token_id"), size - 1)
    edit_json(d / "config.json", lambda c: {**c, "decoder_vocab_size": size, **ids})


@pytest.mark.parametrize("case", BAD)
def test_bad_separate_layouts_get_one_line_and_exit_2(case, marian_dir, tmp_path, capsys) -> None:
    spoil, words = BAD[case]
    source = shutil.copytree(marian_dir, tmp_path / "model")
    spoil(source)
    out = tmp_path / "run"
    code = main(["import", "marian", str(source), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and words in err, err
    assert not out.exists()
