"""BPE-dropout: SentencePiece's own segmentation at p = 0, its own sampled lengths at p > 0, seeded epochs
(a joint BPE on 4,000 synthetic en-de pairs)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from aiayn.data.batching import TokenBatchSampler
from aiayn.data.bpe_dropout import BpeDropout, EpochResampler
from aiayn.data.corpus import encode_corpus, read_parallel
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.train.config import run_config_from_dict
from conftest import write_parallel_text


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_parallel_text(tmp_path_factory.mktemp("corpus"), {"train": 4000}, seed=2)


@pytest.fixture(scope="module")
def tok(corpus: Path) -> Tokenizer:
    """A joint BPE of 8,000 pieces at most on the corpus's train en+de."""
    pairs, _ = read_parallel(corpus, "train", "en", "de")
    return Tokenizer.train([s for pair in pairs for s in pair], vocab_size=8000)


@pytest.fixture(scope="module")
def examples(corpus: Path, tok: Tokenizer) -> list:
    pairs, stats = read_parallel(corpus, "train", "en", "de")
    return encode_corpus(pairs[:4000], stats, tok.encode_batch)


def test_without_dropout_it_is_sentencepieces_bpe(examples, tok) -> None:
    """Re-merging every word from its characters gives SentencePiece's pieces, on 8,000 sentences."""
    resampled = EpochResampler(examples, BpeDropout(tok, 0.0), seed=1)(0)
    assert resampled == [(list(s), list(t)) for s, t in examples]


def test_a_word_with_a_byte_piece_keeps_its_ids(tok) -> None:
    dropout = BpeDropout(tok, 0.9)
    ids = tok.encode("Ein Hund\u4e2d läuft.")  # a character the vocabulary lacks: byte pieces inside a word
    byte_word = [w for w in dropout.words(ids) if any(tok._sp.is_byte(i) for i in w)]
    assert len(byte_word) == 1 and len(byte_word[0]) > 3
    sample = dropout.sample(ids, random.Random(0))
    assert tok.decode(sample) == tok.decode(ids) and len(sample) > len(ids)  # the other words split
    start = sample.index(byte_word[0][0])
    assert tuple(sample[start : start + len(byte_word[0])]) == byte_word[0]


def test_sampled_lengths_match_sentencepieces_own_bpe_dropout(examples, tok, corpus) -> None:
    """The peer: SentencePiece's sampling mode (enable_sampling, alpha = p) on the same sentences."""
    pairs, _ = read_parallel(corpus, "train", "en", "de")
    texts = [s for s, _ in pairs[:4000]]
    for p in (0.05, 0.1):
        dropout, rng = BpeDropout(tok, p), random.Random(0)
        ours = [dropout.sample(ids, rng) for ids in tok.encode_batch(texts)]
        theirs = tok._sp.encode(texts, enable_sampling=True, alpha=p)
        full = np.mean([len(tok.encode(t)) for t in texts])
        mine, peer = np.mean([len(x) for x in ours]), np.mean([len(x) for x in theirs])
        assert mine > full * (1 + 2 * p)  # p = 0.1 makes Multi30k's segmentations ~40% longer
        assert mine == pytest.approx(peer, rel=0.02), (p, mine, peer)
        assert [tok.decode(x) for x in ours] == [tok.decode(tok.encode(t)) for t in texts]


def test_epochs_are_seeded_and_capped(examples, tok) -> None:
    resampler = EpochResampler(examples, BpeDropout(tok, 0.1), seed=3)
    first, again, second = resampler(0), resampler(0), resampler(1)
    assert first == again != second
    assert EpochResampler(examples, BpeDropout(tok, 0.1), seed=4)(0) != first
    assert max(max(len(s), len(t)) for s, t in first + second) <= resampler.cap
    assert resampler.cap == max(max(len(s), len(t)) for s, t in examples)
    kept_full = sum(a == (list(s), list(t)) for a, (s, t) in zip(first, examples))
    assert kept_full < len(examples) // 4  # most pairs change at p = 0.1


def test_the_sampler_batches_each_epochs_resampled_examples(examples, tok) -> None:
    resampler = EpochResampler(examples, BpeDropout(tok, 0.1), seed=1)
    sampler = TokenBatchSampler(examples, 2048, seed=1, resample=resampler)
    plain = TokenBatchSampler(examples, 2048, seed=1)
    for epoch in (0, 1):
        used = sampler.examples_of(epoch)
        assert used == resampler(epoch)
        for batch in sampler.batches(epoch):
            assert len(batch) * max(max(len(used[i][0]), len(used[i][1])) + 1 for i in batch) <= 2048
        assert sorted(i for b in sampler.batches(epoch) for i in b) == list(range(len(examples)))
        assert len(sampler.batches(epoch)) > 1.2 * len(plain.batches(epoch))  # longer sequences, more batches


@pytest.mark.parametrize(
    "values, message",
    [
        ({"bpe_dropout": 1.0}, r"data\.bpe_dropout is a probability below 1; got 1\.0"),
        (
            {"bpe_dropout": 0.1, "tokenizer": "unigram"},
            r"data\.bpe_dropout needs data\.tokenizer bpe \(got 'unigram'\)",
        ),
    ],
)
def test_config_refuses_bad_bpe_dropout(values, message) -> None:
    with pytest.raises(UserError, match=message):
        run_config_from_dict({"data": values})
