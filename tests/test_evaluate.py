"""Metrics: sacreBLEU BLEU/chrF with signatures, and the labelled tokenized lowercased BLEU."""

from __future__ import annotations

import math

import pytest
import sacrebleu

from aiayn.errors import UserError
from aiayn.evaluate import TOKENIZED_LABEL, moses_lowercase, sacrebleu_scores, tokenized_bleu

HYPS = ["The cat sat on the mat.", "A man is riding a bicycle down the street!", "Two dogs play in the snow."]
REFS = [
    "The cat is sitting on the mat.",
    "A man rides a bike down the street.",
    "Two dogs are playing in snow.",
]


def test_identical_hypotheses_score_100() -> None:
    scores = sacrebleu_scores(REFS, REFS)
    assert scores["bleu"] == pytest.approx(100.0) and scores["chrf"] == pytest.approx(100.0)
    assert tokenized_bleu(REFS, REFS, "en") == pytest.approx(100.0)


def test_sacrebleu_scores_match_sacrebleu_directly() -> None:
    scores = sacrebleu_scores(HYPS, REFS)
    direct = sacrebleu.corpus_bleu(HYPS, [REFS])
    assert scores["bleu"] == pytest.approx(direct.score)
    assert scores["brevity_penalty"] == pytest.approx(direct.bp)
    assert scores["length_ratio"] == pytest.approx(direct.sys_len / direct.ref_len)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert 0 < scores["bleu"] < 100
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert scores["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:")


def test_lowercase_scores_case_insensitively_like_sacrebleu_lc() -> None:
    upper = [h.upper() for h in HYPS]
    scores = sacrebleu_scores(upper, REFS, lowercase=True)
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(upper, [REFS], lowercase=True).score)
    assert scores["chrf"] == pytest.approx(
        sacrebleu.metrics.CHRF(lowercase=True).corpus_score(upper, [REFS]).score
    )
    # HYPS and REFS capitalise the same words, so case-insensitive scores of the upper-cased
    # hypotheses equal the case-sensitive scores of the originals.
    assert scores["bleu"] == pytest.approx(sacrebleu_scores(HYPS, REFS)["bleu"])
    assert scores["bleu_signature"].startswith("nrefs:1|case:lc|")
    assert scores["chrf_signature"].startswith("nrefs:1|case:lc|")
    assert sacrebleu_scores(upper, REFS)["bleu"] < 5  # case-sensitive: only the punctuation matches


def test_hand_checkable_bleu() -> None:
    # The hypothesis is the first 4 of the 5 reference words: every n-gram precision is 1, so BLEU is
    # the brevity penalty alone, exp(1 - r/c) = exp(1 - 5/4).
    hyp, ref = ["a b c d"], ["a b c d e"]
    scores = sacrebleu_scores(hyp, ref)
    assert scores["bleu"] == pytest.approx(100 * math.exp(1 - 5 / 4), abs=1e-4)
    assert scores["brevity_penalty"] == pytest.approx(math.exp(1 - 5 / 4), abs=1e-6)
    assert scores["length_ratio"] == pytest.approx(4 / 5)


def test_tokenized_bleu_lowercases_and_moses_tokenizes() -> None:
    assert moses_lowercase(["Hello, World!"], "en") == ["hello , world !"]
    # Case and punctuation attachment differ only: tokenized lowercased BLEU is 100, sacreBLEU is not.
    hyps, refs = ["A DOG RUNS, FAST."], ["a dog runs, fast."]
    assert tokenized_bleu(hyps, refs, "en") == pytest.approx(100.0)
    assert sacrebleu_scores(hyps, refs)["bleu"] < 100
    expected = sacrebleu.corpus_bleu(
        moses_lowercase(HYPS, "en"), [moses_lowercase(REFS, "en")], tokenize="none", force=True
    ).score
    assert tokenized_bleu(HYPS, REFS, "en") == pytest.approx(expected)
    assert "not comparable to sacreBLEU" in TOKENIZED_LABEL


def test_length_mismatch_is_a_user_error() -> None:
    with pytest.raises(UserError, match="2 hypotheses but 3 references"):
        sacrebleu_scores(HYPS[:2], REFS)
    with pytest.raises(UserError):
        tokenized_bleu(HYPS, REFS[:1], "de")


def test_no_sentences_is_a_user_error() -> None:
    with pytest.raises(UserError, match="no sentences"):
        sacrebleu_scores([], [])
    with pytest.raises(UserError, match="no sentences"):
        tokenized_bleu([], [], "de")


def test_blank_references_give_a_zero_length_ratio_not_a_division_by_zero() -> None:
    scores = sacrebleu_scores(["", ""], ["", " "])
    assert scores["length_ratio"] == 0.0 and scores["bleu"] == 0.0
    assert sacrebleu_scores(["a b c"], [""])["length_ratio"] == 0.0  # sacreBLEU's own convention
