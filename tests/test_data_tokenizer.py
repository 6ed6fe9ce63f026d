"""SentencePiece wrapper: fixed special ids, exact round trip on Multi30k, determinism, persistence
(on a synthetic corpus where Multi30k's own lines are not the point)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from aiayn.data.corpus import read_parallel
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError


@functools.lru_cache(maxsize=1)
def multi30k_tokenizer(multi30k_dir: Path) -> Tokenizer:
    """The 8k joint BPE on Multi30k train de+en, trained once per session (test_data_batching reuses it)."""
    pairs, _ = read_parallel(multi30k_dir, "train", "de", "en")
    return Tokenizer.train([s for pair in pairs for s in pair], vocab_size=8000)


@pytest.fixture(scope="module")
def tok(multi30k_dir: Path) -> Tokenizer:
    return multi30k_tokenizer(multi30k_dir)


def raw_lines(directory: Path, name: str) -> list[str]:
    return (directory / name).read_text(encoding="utf-8").split("\n")[:-1]


def test_special_ids_and_vocab(tok):
    assert tok.vocab_size == 8000
    assert [tok.id_to_piece(i) for i in (PAD_ID, UNK_ID, BOS_ID, EOS_ID)] == ["<pad>", "<unk>", "<s>", "</s>"]


@pytest.mark.parametrize("name", ["val.en", "val.de", "test2016.de", "test2016.fr", "train.cs"])
def test_round_trip_every_line(tok, multi30k_dir, name):
    # fr and cs were not in training: byte fallback keeps their unseen characters (U+200B in train.cs)
    lines = [line.strip() for line in raw_lines(multi30k_dir, name)]
    assert [tok.decode(ids) for ids in tok.encode_batch(lines)] == lines


def test_round_trip_train_de_quirks_unstripped(tok, multi30k_dir):
    lines = raw_lines(multi30k_dir, "train.de")
    quirky = [line for line in lines if "\t" in line or "\u00a0" in line or line != line.strip()]
    assert len(quirky) >= 80  # TAB line, 47 with U+00A0, 40 with edge spaces
    assert [tok.decode(tok.encode(line)) for line in quirky] == quirky
    for text in ["two  spaces", "  leading", "trailing  ", "emoji 😀 and ünïcödé", "x\u200by"]:
        assert tok.decode(tok.encode(text)) == text


def test_lowercase_tokenizer_lowercases_and_otherwise_round_trips(tok, multi30k_dir):
    lines = raw_lines(multi30k_dir, "val.de") + raw_lines(multi30k_dir, "val.en")
    lower = Tokenizer.train(lines, vocab_size=1000, lowercase=True)
    assert lower.lowercases and not tok.lowercases
    assert [lower.decode(lower.encode(line)) for line in lines] == [line.lower() for line in lines]
    # beyond ASCII, in the rule (not in training), and two-character lowercases (U+0130)
    for text in ["ÄÖÜ ẞ Ÿ", "İstanbul", "Ein  Mann\u00a0Läuft ", "x\u200bY 😀"]:
        assert lower.decode(lower.encode(text)) == text.lower()
    assert Tokenizer.from_bytes(lower.to_bytes()).lowercases  # the rule travels in the model
    assert lower.pieces("Ein Hund") == lower.pieces("ein hund")


def test_documented_exception_lower_one_eighth_block(tok):
    assert tok.decode(tok.encode("a\u2581b")) == "a b"  # SentencePiece's space marker decodes as a space


def test_encode_has_no_bos_eos_and_decode_ignores_specials(tok):
    ids = tok.encode("Ein Mann fährt Fahrrad.")
    assert BOS_ID not in ids and EOS_ID not in ids and PAD_ID not in ids and UNK_ID not in ids
    assert tok.decode([BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]) == "Ein Mann fährt Fahrrad."
    assert tok.encode_batch(["a dog", "Ein Hund"]) == [tok.encode("a dog"), tok.encode("Ein Hund")]
    assert tok.decode_batch([tok.encode("a dog"), [BOS_ID]]) == ["a dog", ""]
    assert "".join(tok.pieces("a dog")).replace("\u2581", " ").strip() == "a dog"


def test_digits_are_single_pieces(tok):
    assert tok.pieces("4213") == ["\u2581", "4", "2", "1", "3"]


def test_training_is_deterministic_and_quiet(parallel_dir, capfd):
    sentences = raw_lines(parallel_dir, "val.en") + raw_lines(parallel_dir, "val.de")
    a = Tokenizer.train(sentences, vocab_size=1000)
    b = Tokenizer.train(sentences, vocab_size=1000)
    assert a.to_bytes() == b.to_bytes()
    assert capfd.readouterr() == ("", "")


def test_unigram(parallel_dir, capfd):
    tok = Tokenizer.train(raw_lines(parallel_dir, "val.en"), vocab_size=300, model_type="unigram")
    assert tok.vocab_size == 300 and tok.decode(tok.encode("A man rides a bike.")) == "A man rides a bike."
    assert tok.model_type == "unigram"  # read from the model itself, as a checkpoint's tokenizer is


def test_model_type_is_read_from_the_model(parallel_dir):
    lines = raw_lines(parallel_dir, "val.en")
    assert Tokenizer.train(lines, vocab_size=300).model_type == "bpe"
    assert Tokenizer.train(lines, vocab_size=300, lowercase=True).model_type == "bpe"


def test_tiny_corpus_gets_a_smaller_vocabulary():
    tok = Tokenizer.train(["one two three", "forty-two"] * 5, vocab_size=8000)
    assert 260 < tok.vocab_size < 8000  # 4 specials + 256 bytes + characters + a few merges
    assert tok.decode(tok.encode("two three")) == "two three"


def test_bad_training_arguments():
    with pytest.raises(UserError, match="vocab_size=50: Vocabulary size is smaller"):
        Tokenizer.train(["abc"], vocab_size=50)
    with pytest.raises(UserError, match="unknown tokenizer model_type 'wordpiece'"):
        Tokenizer.train(["abc"], model_type="wordpiece")
    with pytest.raises(UserError, match="no sentences"):
        Tokenizer.train(["", ""])


def test_save_load_and_bytes(tok, tmp_path):
    path = tok.save(tmp_path / "sub" / "spm.model")
    for other in (
        Tokenizer.load(path),
        Tokenizer.load(tmp_path / "sub"),
        Tokenizer.from_bytes(tok.to_bytes()),
    ):
        assert other.vocab_size == tok.vocab_size
        assert other.encode("Zwei Hunde spielen.") == tok.encode("Zwei Hunde spielen.")


def test_train_with_model_prefix_writes_the_model(parallel_dir, tmp_path):
    Tokenizer.train(raw_lines(parallel_dir, "val.en"), tmp_path / "m", vocab_size=500)
    Tokenizer.train(raw_lines(parallel_dir, "val.en"), tmp_path, vocab_size=500)
    assert (tmp_path / "m.model").is_file() and (tmp_path / "spm.model").is_file()


def test_load_errors(tmp_path):
    with pytest.raises(UserError, match="tokenizer model not found"):
        Tokenizer.load(tmp_path / "missing.model")
    (tmp_path / "bad.model").write_bytes(b"not a model")
    with pytest.raises(UserError, match="bad.model: not a SentencePiece model"):
        Tokenizer.load(tmp_path / "bad.model")
    with pytest.raises(UserError, match="not a SentencePiece model"):
        Tokenizer.from_bytes(b"\x00garbage")
