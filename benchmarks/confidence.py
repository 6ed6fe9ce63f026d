"""Does the confidence mean something? Sentence confidence against sentence quality on Multi30k test2016.

    python benchmarks/confidence.py --checkpoint RUN [--data-dir $AIAYN_DATA/multi30k] [--threads 2] \
        [--results benchmarks/results/confidence.json]

Each sentence is translated with beam 4 (``Wanted(confidence=True)``: what ``aiayn translate --scores`` and
the API's ``scores`` give): its confidence is the mean log-probability of its tokens (EOS included),
its probability form ``exp`` of that. Its quality is sentence chrF and sentence BLEU (sacreBLEU,
detokenized, against its one reference). Reported: Spearman's rank correlation of confidence with
each, the mean chrF of each fifth of the sentences by confidence, and for thresholds on the probability
the share of sentences below them and the mean chrF of those below and above (a threshold for "have
a human look at this"). The GNMT-normalised score of the n-best lists is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import sacrebleu
import torch

from aiayn.decode import Translator
from aiayn.decode.request import Wanted
from aiayn.decode.search import DecodeOptions
from aiayn.loading import load_translation_model
from common import command, machine, test2016_arguments, versions

THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer, _ = load_translation_model(args.checkpoint)
    backend = Translator(model, tokenizer)
    data = Path(args.data_dir)
    sources = (data / "test2016.de").read_text(encoding="utf-8").splitlines()
    references = (data / "test2016.en").read_text(encoding="utf-8").splitlines()
    scored = backend.translate(sources, DecodeOptions(beam=4, alpha=0.6), Wanted(confidence=True))
    chrf = [sacrebleu.sentence_chrf(s.text, [r]).score for s, r in zip(scored, references)]
    bleu = [sacrebleu.sentence_bleu(s.text, [r]).score for s, r in zip(scored, references)]
    confidence = [s.confidence for s in scored]
    probability = [math.exp(c) for c in confidence]
    results = {
        "command": command(),
        "machine": machine(),
        "versions": versions(sacrebleu=sacrebleu.__version__),
        "sentences": len(sources),
        "corpus_bleu": round(sacrebleu.corpus_bleu([s.text for s in scored], [references]).score, 2),
        "spearman": {
            "confidence_vs_sentence_chrf": round(spearman(confidence, chrf), 3),
            "confidence_vs_sentence_bleu": round(spearman(confidence, bleu), 3),
            "score_vs_sentence_chrf": round(spearman([s.score for s in scored], chrf), 3),
        },
        "fifths_by_confidence": fifths(probability, chrf),
        "thresholds": [threshold(t, probability, chrf) for t in THRESHOLDS],
    }
    print(json.dumps(results, indent=2))
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


def parse_args() -> argparse.Namespace:
    parser = test2016_arguments(__doc__.split("\n\n")[0], "benchmarks/results/confidence.json")
    return parser.parse_args()


def ranks(values: list[float]) -> np.ndarray:
    """Ranks from 1, ties given the mean of the ranks they span."""
    x = np.asarray(values, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    out = np.empty(len(x))
    sorted_x = x[order]
    start = 0
    while start < len(x):
        end = start
        while end + 1 < len(x) and sorted_x[end + 1] == sorted_x[start]:
            end += 1
        out[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation: Pearson's of the ranks."""
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def fifths(probability: list[float], chrf: list[float]) -> list[dict]:
    order = np.argsort(probability, kind="stable")
    out = []
    for part in np.array_split(order, 5):
        out.append(
            {
                "probability_from": round(float(min(probability[i] for i in part)), 3),
                "probability_to": round(float(max(probability[i] for i in part)), 3),
                "mean_chrf": round(float(np.mean([chrf[i] for i in part])), 2),
            }
        )
    return out


def threshold(t: float, probability: list[float], chrf: list[float]) -> dict:
    below = [c for p, c in zip(probability, chrf) if p < t]
    above = [c for p, c in zip(probability, chrf) if p >= t]
    return {
        "probability_below": t,
        "share_below": round(len(below) / len(chrf), 3),
        "mean_chrf_below": round(float(np.mean(below)), 2) if below else None,
        "mean_chrf_above": round(float(np.mean(above)), 2) if above else None,
    }


if __name__ == "__main__":
    main()
