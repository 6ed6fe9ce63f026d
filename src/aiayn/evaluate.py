"""Translation quality: sacreBLEU's BLEU and chrF on detokenized text, with their signatures.

:func:`sacrebleu_scores` is the number to report: BLEU and chrF computed by sacreBLEU on plain
(detokenized) hypotheses and references, with the signature that says exactly how.

:func:`tokenized_bleu` reproduces the figure most Multi30k papers print: BLEU on lowercased,
Moses-tokenized text, as ``multi-bleu.perl`` computes it. It is usually higher than sacreBLEU and
is **not comparable** to it; it is labelled as such wherever it is shown (:data:`TOKENIZED_LABEL`).
"""

from __future__ import annotations

from typing import Sequence

from sacrebleu.metrics import BLEU, CHRF

from aiayn.errors import UserError

TOKENIZED_LABEL = "tokenized lowercased BLEU (multi-bleu.perl style, not comparable to sacreBLEU)"


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise UserError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not refs:
        raise UserError("nothing to score: no sentences")


def length_ratio(sys_len: int, ref_len: int) -> float:
    """Hypothesis over reference length; 0 when the references are empty (sacreBLEU's convention)."""
    return sys_len / ref_len if ref_len else 0.0


def sacrebleu_scores(hyps: Sequence[str], refs: Sequence[str], lowercase: bool = False) -> dict:
    """Corpus BLEU and chrF of detokenized ``hyps`` against one reference each.

    ``lowercase`` scores case-insensitively (sacreBLEU's ``-lc``; the signatures then say ``case:lc``),
    for a model that writes lowercase text.

    Returns ``{"bleu", "chrf", "bleu_signature", "chrf_signature", "brevity_penalty", "length_ratio"}``
    (scores on a 0-100 scale; the length ratio is hypothesis over reference length in BLEU's tokens,
    0 when the references are all blank). No sentences at all is a :class:`UserError`.
    """
    _check(hyps, refs)
    bleu, chrf = BLEU(lowercase=lowercase), CHRF(lowercase=lowercase)
    bleu_score = bleu.corpus_score(list(hyps), [list(refs)])
    chrf_score = chrf.corpus_score(list(hyps), [list(refs)])
    return {
        "bleu": bleu_score.score,
        "chrf": chrf_score.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "brevity_penalty": bleu_score.bp,
        "length_ratio": length_ratio(bleu_score.sys_len, bleu_score.ref_len),
    }


def moses_lowercase(lines: Sequence[str], lang: str) -> list[str]:
    """Lowercase and Moses-tokenize (sacremoses, no HTML escaping), one string per line."""
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line.lower(), escape=False, return_str=True) for line in lines]


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str], lang: str) -> float:
    """BLEU on lowercased, Moses-tokenized text (``multi-bleu.perl``-style); see :data:`TOKENIZED_LABEL`."""
    _check(hyps, refs)
    bleu = BLEU(tokenize="none", force=True)
    return bleu.corpus_score(moses_lowercase(hyps, lang), [moses_lowercase(refs, lang)]).score
