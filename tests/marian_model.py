"""A tiny MarianMT model directory made offline, as the Hub leaves an opus-mt model.

Two unigram SentencePiece models (NFKC, as opus-mt's) trained on a few hundred synthetic lines, a
joint ``vocab.json`` (``</s>`` 0, ``<unk>`` 1, the pieces, a language code, ``<pad>`` last), a small
``MarianConfig`` with opus-mt's settings (swish, scaled embeddings, shared and tied embeddings,
decoding from ``<pad>``) and a random ``final_logits_bias``, saved with ``save_pretrained``.

``separate=True`` lays it out as the Tatoeba-Challenge models with two vocabularies are: ``vocab.json``
holds the source model's pieces (and the language code), ``target_vocab.json`` the target's, each
``</s>`` 0, ``<unk>`` 1 and ``<pad>`` last and filled up to the same size, as transformers' converter
requires; ``separate_vocabs`` in ``tokenizer_config.json``; untied source embeddings
(``share_encoder_decoder_embeddings: false``), the target's tied to the output projection.
"""

from __future__ import annotations

import io
import json
import random
import shutil
from pathlib import Path

import sentencepiece as spm

SOURCE_WORDS = (
    "der die das ein eine mann frau hund katze kind läuft spielt sitzt steht auf im park straße "
    "wiese grün rot blau groß klein junge mädchen ball wasser fährt fahrrad mit dem"
).split()
TARGET_WORDS = (
    "the the the a a man woman dog cat child runs plays sits stands on in park street meadow green "
    "red blue big small boy girl ball water rides bike with the"
).split()
WORDS = dict(zip(SOURCE_WORDS, TARGET_WORDS))  # word for word: a task the model can learn a bit of


def pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    """``n`` source sentences and their word-for-word translations."""
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        words = [rng.choice(SOURCE_WORDS) for _ in range(rng.randint(3, 10))]
        end = rng.choice([".", "!", "?", ""])
        src.append(" ".join(words).capitalize() + end)
        tgt.append(" ".join(WORDS[w] for w in words).capitalize() + end)
    return src, tgt


def sentences(words, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        lines.append(text[0].upper() + text[1:] + rng.choice([".", "!", "?", ""]))
    return lines


def train_spm(lines: list[str], vocab_size: int) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
        hard_vocab_limit=False,
    )
    return model.getvalue()


def make_marian(
    out: Path,
    *,
    d_model: int = 32,
    layers: int = 2,
    heads: int = 4,
    ffn: int = 64,
    seed: int = 0,
    activation: str = "swish",
    init_std: float = 0.2,
    steps: int = 150,
    separate: bool = False,
) -> Path:
    """Write the model directory ``out`` and return it."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    out.mkdir(parents=True, exist_ok=True)
    source_lines, target_lines = pairs(400, seed)
    protos = {"source.spm": train_spm(source_lines, 120), "target.spm": train_spm(target_lines, 110)}
    for name, proto in protos.items():
        (out / name).write_bytes(proto)
    vocabularies = write_vocabularies(out, list(protos.values()), separate)
    v = len(vocabularies[0])
    config = MarianConfig(
        vocab_size=v,
        decoder_vocab_size=v,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        activation_function=activation,
        max_position_embeddings=128,
        scale_embedding=True,
        pad_token_id=v - 1,
        eos_token_id=0,
        decoder_start_token_id=v - 1,
        forced_eos_token_id=0,
        init_std=init_std,
        share_encoder_decoder_embeddings=not separate,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    with torch.no_grad():
        model.final_logits_bias.copy_(0.2 * torch.randn(1, v))
        for module in model.modules():  # LayerNorms away from 1/0, so the d_model order matters
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.add_(0.1 * torch.randn_like(module.weight))
                module.bias.add_(0.1 * torch.randn_like(module.bias))
    tokenizer_config = {"source_lang": "de", "target_lang": "en", "tokenizer_class": "MarianTokenizer"}
    (out / "tokenizer_config.json").write_text(
        json.dumps({**tokenizer_config, **({"separate_vocabs": True} if separate else {})})
    )
    train(model, source_lines, target_lines, out, steps)
    model.eval().generation_config.bad_words_ids = [[v - 1]]
    model.save_pretrained(out)
    return out


def write_vocabularies(out: Path, protos: list[bytes], separate: bool) -> list[list[str]]:
    """``vocab.json`` (and with ``separate`` ``target_vocab.json``); returns their pieces in id order."""
    sides = (
        [pieces_of(protos) + [">>deu<<"]]
        if not separate
        else [pieces_of(protos[:1]) + [">>deu<<"], pieces_of(protos[1:])]
    )
    size = max(len(side) for side in sides)
    sides = [side + [f"▁filler{i}" for i in range(size - len(side))] + ["<pad>"] for side in sides]
    for name, side in zip(("vocab.json", "target_vocab.json"), sides):
        (out / name).write_text(json.dumps({p: i for i, p in enumerate(side)}, ensure_ascii=False))
    return sides


def pieces_of(protos: list[bytes]) -> list[str]:
    """``</s>``, ``<unk>``, then every piece of the SentencePiece models, once each."""
    pieces: list[str] = ["</s>", "<unk>"]
    for proto in protos:
        sp = spm.SentencePieceProcessor(model_proto=proto)
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if not (sp.is_control(i) or sp.is_unknown(i)) and piece not in pieces:
                pieces.append(piece)
    return pieces


def train(model, source_lines: list[str], target_lines: list[str], files: Path, steps: int) -> None:
    """A few Adam steps on the word-for-word task, so outputs depend on the input and end by EOS."""
    import torch
    from transformers import MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(str(files))
    data = tokenizer(source_lines, text_target=target_lines, padding=True, return_tensors="pt")
    data["labels"] = data["labels"].masked_fill(data["labels"] == tokenizer.pad_token_id, -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only wait on each other
    try:
        for step in range(steps):
            rows = torch.arange(step * 64, step * 64 + 64) % len(source_lines)
            loss = model(**{k: t[rows] for k, t in data.items()}).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)


def copy_model(source: Path, out: Path) -> Path:
    shutil.copytree(source, out)
    return out


def backends(checkpoint: Path, ct2_dir: Path):
    """The torch and CTranslate2 backends of an imported checkpoint (one export, in ``ct2_dir``)."""
    from aiayn.decode.backends import load_backend

    return load_backend(checkpoint, "torch"), load_backend(checkpoint, "ctranslate2", ct2_dir=ct2_dir)


def texts_of(translations) -> list[str]:
    return [translation.text for translation in translations]


def aligned(translations) -> list[tuple]:
    """Each translation's text and word alignment."""
    return [(translation.text, translation.alignment) for translation in translations]


def check_control(torch_backend, ct2_backend, max_out: int) -> list[str]:
    """Terminology, prefixes and confidence on an imported model, as on a native one: a target word
    the model did not write appears with the glossary (whole words, as often as its source term);
    a prefix starts the greedy output alike on both engines; the engines' confidence agrees.
    Returns the sentences it translated."""
    import re
    from dataclasses import replace

    import pytest

    from aiayn.decode.request import Line, Wanted
    from aiayn.decode.search import DecodeOptions

    def count(word: str, text: str) -> int:  # whole words (punctuation may follow a term)
        return len(re.findall(rf"(?<!\w){word}(?!\w)", text))

    texts = sentences(SOURCE_WORDS, 12, 47)
    beam = DecodeOptions(beam=4, alpha=0.0, max_len_a=0.0, max_len_b=max_out)
    plain = torch_backend.translate(texts[:1], beam)[0].text
    term, target = texts[0].split()[0], next(word for word in TARGET_WORDS if not count(word, plain))
    constrained = torch_backend.translate(texts[:1], replace(beam, glossary=((term, target),)))[0].text
    assert count(target, constrained) == texts[0].split().count(term) >= 1
    greedy = DecodeOptions(beam=1, max_len_a=0.0, max_len_b=max_out)
    lines = [Line(texts[0], "the big"), *texts[1:]]
    ours = texts_of(torch_backend.translate(lines, greedy))
    assert ours[0].startswith("the big") and ours == texts_of(ct2_backend.translate(lines, greedy))
    confidence = Wanted(confidence=True)
    for a, b in zip(
        torch_backend.translate(texts, greedy, confidence), ct2_backend.translate(texts, greedy, confidence)
    ):
        assert a.text == b.text and a.confidence == pytest.approx(b.confidence, abs=1e-3)
        assert len(a.words) == len(a.text.split())
    return texts


def import_marian(marian_dir: Path, out: Path) -> Path:
    """``aiayn import marian marian_dir --out out``, which must succeed."""
    from aiayn.cli import main

    assert main(["import", "marian", str(marian_dir), "--out", str(out)]) == 0
    return out


def logits_gap(
    model, hf_model, hf_tok, source_order: list[int], target_order: list[int]
) -> tuple[float, int]:
    """Teacher-forced logits of the imported ``model`` against Marian's own on 16 sentence pairs, in
    float64 (so that the gap measures the mapping of the weights, not float32 rounding): the largest
    absolute difference over the real target positions, and how many there are. ``*_order``: Marian's
    id of each aiayn id on each side (aiayn's BOS is Marian's decoder start)."""
    import copy

    import torch

    model, hf_model = model.double(), copy.deepcopy(hf_model).double()
    batch = hf_tok(
        sentences(SOURCE_WORDS, 16, 3),
        text_target=sentences(TARGET_WORDS, 16, 4),
        padding=True,
        return_tensors="pt",
    )
    start = hf_model.config.decoder_start_token_id
    labels = batch["labels"].masked_fill(batch["labels"] == -100, start)
    decoder_in = torch.cat([torch.full((len(labels), 1), start), labels[:, :-1]], 1)

    def back(order: list[int]):
        return {m: a for a, m in enumerate(order) if a != 2}.__getitem__

    with torch.no_grad():
        expected = hf_model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_in
        ).logits
        src = batch["input_ids"].clone().apply_(back(source_order))
        tgt = decoder_in.clone().apply_(back(target_order))
        tgt[:, 0] = model.config.bos_id
        logits = model(src, tgt)
    real = decoder_in != start
    real[:, 0] = True
    return float((logits - expected[:, :, target_order]).abs()[real].max()), int(real.sum())
