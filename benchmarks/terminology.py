"""Terminology on Multi30k test2016 (de->en): lexically constrained beam search against plain beam search.

    python benchmarks/terminology.py --checkpoint RUN [--data-dir $AIAYN_DATA/multi30k] [--threads 2] \
        [--rounds 3] [--results benchmarks/results/terminology.json]

* **Terms from the references** (Dinu et al., 2019's oracle setting): a word list of de-en pairs one
  can check (``documents.py``'s nouns and colours, each with the English words that translate it);
  a sentence's terms are the list's source words it holds whose translation its reference uses, in
  the reference's form ("Fahrrad" -> "bicycle" where the reference says bicycle, "bike" where it
  says bike). The sentences are decoded in groups of the same glossary (one ``--glossary`` each),
  the same groups without a glossary for the plain figures.
* **Met**: the share of sentences with terms whose every term appears in the output (whole words,
  as often as asked), and of the terms; BLEU (sacreBLEU, detokenized) of all 1,000 sentences and
  of those with terms, with and without the glossaries.
* **Cost**: one glossary of every pair (each source word -> its first translation) over all the
  sentences, one call, against plain beam search of the same width: sentences per second of the
  process's CPU time (both threads), rounds alternating which goes first, medians and the median of
  the per-round ratios; and how many sentences had their beam widened.
  ``--speed-only`` measures it again and keeps the quality figures of the results file.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import sacrebleu
import torch

from aiayn.decode import Translator
from aiayn.decode.constraints import beam_for
from aiayn.decode.glossary import targets
from aiayn.decode.search import DecodeOptions
from aiayn.loading import load_translation_model
from common import command, machine, test2016_arguments, versions
from documents import WORDS


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer, _ = load_translation_model(args.checkpoint)
    warnings: list[str] = []
    backend = Translator(model, tokenizer, warn=warnings.append)
    data = Path(args.data_dir)
    sources = (data / "test2016.de").read_text(encoding="utf-8").splitlines()
    references = (data / "test2016.en").read_text(encoding="utf-8").splitlines()
    options = DecodeOptions(beam=args.beam, alpha=0.6)
    oracle = oracle_terms(sources, references)
    earlier = Path(args.results)
    if args.speed_only and earlier.is_file():  # the quality figures are deterministic: kept
        quality = json.loads(earlier.read_text(encoding="utf-8"))["quality"]
    else:
        quality = compare(backend, sources, references, oracle, options)
    cost = speed(backend, sources, options, args.rounds, tokenizer)
    results = {
        "command": command(),
        "machine": machine(),
        "versions": versions(sacrebleu=sacrebleu.__version__),
        "threads": args.threads,
        "beam": args.beam,
        "quality": quality,
        "speed": cost,
    }
    print(json.dumps(results, indent=2))
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


def parse_args() -> argparse.Namespace:
    parser = test2016_arguments(__doc__.split("\n\n")[0], "benchmarks/results/terminology.json")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument(
        "--speed-only", action="store_true", help="measure the speed again, keep the results file's quality"
    )
    return parser.parse_args()


def whole(word: str, text: str) -> int:
    """How often ``word`` occurs in ``text`` as a whole word (case-sensitive)."""
    return len(re.findall(rf"(?<!\w){re.escape(word)}(?!\w)", text))


def oracle_terms(sources: list[str], references: list[str]) -> list[tuple[tuple[str, str], ...]]:
    """Each sentence's glossary: the list's source words it holds whose translation its reference
    uses (in the reference's form: its case as written there), each once."""
    found = []
    for source, reference in zip(sources, references):
        pairs = []
        for word, translations in WORDS.items():
            if not whole(word, source):
                continue
            used = [
                m.group(0) for t in translations for m in re.finditer(rf"(?<!\w){t}(?!\w)", reference, re.I)
            ]
            if used:
                pairs.append((word, used[0]))
        found.append(tuple(pairs))
    return found


def compare(backend, sources, references, oracle, options: DecodeOptions) -> dict:
    """Plain and constrained translations of the same groups of sentences, scored."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, pairs in enumerate(oracle):
        groups[pairs].append(i)
    plain, constrained = [""] * len(sources), [""] * len(sources)
    for pairs, rows in groups.items():
        texts = [sources[i] for i in rows]
        for i, text in zip(rows, (t.text for t in backend.translate(texts, options))):
            plain[i] = text
        for i, text in zip(
            rows, (t.text for t in backend.translate(texts, replace(options, glossary=pairs)))
        ):
            constrained[i] = text
    with_terms = [i for i, pairs in enumerate(oracle) if pairs]
    return {
        "sentences": len(sources),
        "sentences_with_terms": len(with_terms),
        "terms": sum(len(targets(oracle[i], sources[i])) for i in with_terms),
        "plain": scores(plain, references, oracle, sources, with_terms),
        "glossary": scores(constrained, references, oracle, sources, with_terms),
        "examples": [
            {"source": sources[i], "terms": oracle[i], "plain": plain[i], "glossary": constrained[i]}
            for i in with_terms
            if plain[i] != constrained[i]
        ][:8],
    }


def scores(outputs, references, oracle, sources, with_terms) -> dict:
    """Terms met (sentences whose every term appears as often as asked; terms) and BLEU."""
    met_sentences, met_terms, terms = 0, 0, 0
    for i in with_terms:
        asked = targets(oracle[i], sources[i])
        counts = {term: asked.count(term) for term in asked}
        met = {term: min(whole(term, outputs[i]), n) for term, n in counts.items()}
        met_terms += sum(met.values())
        terms += len(asked)
        met_sentences += all(met[term] == n for term, n in counts.items())
    subset = [outputs[i] for i in with_terms], [references[i] for i in with_terms]
    return {
        "sentences_all_terms_met": round(met_sentences / len(with_terms), 4),
        "terms_met": round(met_terms / terms, 4),
        "bleu": round(sacrebleu.corpus_bleu(outputs, [references]).score, 2),
        "bleu_sentences_with_terms": round(sacrebleu.corpus_bleu(subset[0], [subset[1]]).score, 2),
    }


def speed(backend, sources, options: DecodeOptions, rounds: int, tokenizer) -> dict:
    """Sentences/s of plain beam search and of one glossary of every pair, on the same sentences."""
    everything = tuple((word, translations[0]) for word, translations in WORDS.items())
    constrained = replace(options, glossary=everything)
    widened = sum(
        beam_for(options.beam, [tokenizer.encode(t, target=True) for t in targets(everything, s)])
        > options.beam
        for s in sources
    )
    backend.translate(sources[:64], options)  # warm up
    cpu: dict[str, list[float]] = {"plain": [], "glossary": []}
    for k in range(rounds):
        order = (("plain", options), ("glossary", constrained))
        for name, opts in order if k % 2 == 0 else order[::-1]:
            start = time.process_time()  # CPU time: the machine's other work moves wall time by 5x
            backend.translate(sources, opts)
            cpu[name].append(time.process_time() - start)
            print(f"{name}: {len(sources) / cpu[name][-1]:.1f} sentences per CPU second", file=sys.stderr)
    rate = {name: len(sources) / statistics.median(t) for name, t in cpu.items()}
    ratios = sorted(p / g for p, g in zip(cpu["plain"], cpu["glossary"]))
    return {
        "glossary_pairs": len(everything),
        "sentences_with_terms": sum(bool(targets(everything, s)) for s in sources),
        "sentences_widened": widened,
        "sentences_per_cpu_s": {name: round(r, 1) for name, r in rate.items()},
        "ratio_glossary_to_plain": round(statistics.median(ratios), 3),
        "ratio_range": [round(ratios[0], 3), round(ratios[-1], 3)],
        "cpu_seconds": {name: [round(x, 2) for x in t] for name, t in cpu.items()},
    }


if __name__ == "__main__":
    main()
