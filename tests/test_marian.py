"""MarianMT in and out: `aiayn import marian` and `aiayn export --format huggingface`, against
transformers' own ``MarianMTModel``, ``MarianTokenizer`` and ``generate()``.

The Marian model is made here, offline (``marian_model.make_marian``): opus-mt's settings (swish,
scaled and tied embeddings, decoding from ``<pad>``), a random ``final_logits_bias`` and LayerNorms
away from 1/0, so that a wrong bias, activation or d_model order shows in the logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")  # the `test` extra installs it

from aiayn import load  # noqa: E402
from aiayn.cli import main  # noqa: E402
from aiayn.data.batching import pad  # noqa: E402
from aiayn.data.tokenizer import Tokenizer, VocabTokenizer  # noqa: E402
from aiayn.decode.search import DecodeOptions, generate  # noqa: E402
from aiayn.marian import residual_order  # noqa: E402
from marian_model import SOURCE_WORDS, TARGET_WORDS, make_marian, sentences  # noqa: E402

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
    out = tmp_path_factory.mktemp("imported") / "run"
    assert main(["import", "marian", str(marian_dir), "--out", str(out)]) == 0
    return out


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
    model, tokenizer, _ = load(imported)
    hf_model, hf_tok = hf
    order = id_map(tokenizer, hf_tok)
    back = {m: a for a, m in enumerate(order) if a != 2}
    batch = hf_tok(
        sentences(SOURCE_WORDS, 16, 3),
        text_target=sentences(TARGET_WORDS, 16, 4),
        padding=True,
        return_tensors="pt",
    )
    pad = hf_tok.pad_token_id
    labels = batch["labels"].masked_fill(batch["labels"] == -100, pad)
    decoder_in = torch.cat([torch.full((len(labels), 1), pad), labels[:, :-1]], 1)
    with torch.no_grad():
        expected = hf_model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_in
        ).logits
        src = batch["input_ids"].clone().apply_(back.__getitem__)
        tgt = decoder_in.clone().apply_(back.__getitem__)
        tgt[:, 0] = model.config.bos_id
        logits = model(src, tgt)
    real = decoder_in != pad
    real[:, 0] = True
    assert real.sum() > 100
    assert (logits - expected[:, :, order]).abs()[real].max() < 1e-5
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
