"""Terminology on Multi30k test2016 (de->en): lexically constrained beam search against plain beam search.

    python benchmarks/terminology.py --checkpoint RUN [--data-dir $AIAYN_DATA/multi30k] [--threads 2] \
        [--rounds 3] [--results benchmarks/results/terminology.json]

* **Terms from the references** (Dinu et al., 2019's oracle setting): a word list of de-en pairs one
  can check (``documents.py``'s nouns and colours, each with the English words that translate it);
  a sentence's terms are the list's source words it holds whose translation its reference uses, in
  the reference's form ("Fahrrad" -> "bicycle" where the reference says bicycle, "bike" where it
  says bike). The sentences are decoded in groups of the same glossary (one ``--glossary`` each),
  the same groups without a glossary for the plain figures. The model says most of these terms by
  itself: they show what a glossary costs where it is not needed.
* **Hard terms** (:data:`HARD`): what a glossary exists for, terms the model does not choose by itself
  (rarer synonyms of test2016's frequent nouns and verbs, "Hund" -> "canine", "sitzt" -> "seated"; each
  form listed, each checked: the model's plain output holds it in none of the lines whose source has
  its source word, ``hard_check`` in the results). One glossary of all of them over the 1,000
  sentences, against plain beam search and against the *oracle*: the plain output with the model's
  own word for each term replaced by the term by hand ("the right word replaced"). Figures: terms
  met, lines with a term after the sentence's end (a term after the first ``.``/``!``/``?`` that
  more words follow), lines more than 1.5x the plain output's length in words, lines with a term
  beside the model's own word for it ("canine dog": the term added, not put in its place), BLEU.
* **Met**: the share of sentences with terms whose every term appears in the output (whole words,
  as often as asked), and of the terms; BLEU (sacreBLEU, detokenized) of all 1,000 sentences and
  of those with terms, with and without the glossaries.
* **Cost**: one glossary over all the sentences, one call, against plain beam search of the same
  width: the hard list, and the reference list's every pair (each source word -> its first
  translation); sentences per second of the process's CPU time, rounds alternating which goes first,
  medians and the median of the per-round ratios; and how many sentences had their beam widened.
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
        kept = json.loads(earlier.read_text(encoding="utf-8"))
        quality, hard = kept["quality"], kept["hard"]
    else:
        quality = compare(backend, sources, references, oracle, options)
        hard = hard_terms(backend, sources, references, options)
    everything = tuple((word, translations[0]) for word, translations in WORDS.items())
    cost = {
        "hard": speed(backend, sources, options, args.rounds, tokenizer, HARD_PAIRS),
        "reference_words": speed(backend, sources, options, args.rounds, tokenizer, everything),
    }
    results = {
        "command": command(),
        "machine": machine(),
        "versions": versions(sacrebleu=sacrebleu.__version__),
        "threads": args.threads,
        "beam": args.beam,
        "quality": quality,
        "hard": hard,
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


#: source word -> (the term a glossary asks for, the words the model says for it by itself): rarer
#: synonyms of frequent nouns and verbs of test2016, each form listed (no lemma matching).
HARD = {
    "Mann": ("gentleman", ["man"]),
    "Männer": ("gentlemen", ["men"]),
    "Frau": ("lady", ["woman"]),
    "Frauen": ("ladies", ["women"]),
    "Hund": ("canine", ["dog"]),
    "Hunde": ("canines", ["dogs"]),
    "Kind": ("youngster", ["child", "kid"]),
    "Kinder": ("youngsters", ["children", "kids"]),
    "Straße": ("roadway", ["street", "road"]),
    "Gebäude": ("edifice", ["building"]),
    "Gehsteig": ("pavement", ["sidewalk"]),
    "Hemd": ("tunic", ["shirt"]),
    "Personen": ("individuals", ["people", "persons"]),
    "Leute": ("folks", ["people"]),
    "sitzt": ("seated", ["sitting", "sits"]),
    "springt": ("leaping", ["jumping", "jumps"]),
    "hält": ("clutching", ["holding", "holds"]),
    "blickt": ("gazing", ["looking", "looks"]),
}
HARD_PAIRS = tuple((source, term) for source, (term, _) in HARD.items())
SENTENCE_END = re.compile(r"[.!?](?=\s+\S)")  # an end that more words follow


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


def hand_substitution(plain: str, source: str) -> str:
    """The oracle: ``plain`` with the model's own word for each hard term its source asks for replaced
    by the term (its first occurrence not yet replaced, whole words)."""
    out = plain
    for found in targets(HARD_PAIRS, source):
        own = next(words for term, words in HARD.values() if term == found)
        for word in own:
            out, n = re.subn(rf"(?<!\w){re.escape(word)}(?!\w)", found, out, count=1)
            if n:
                break
    return out


def term_after_end(text: str, terms) -> bool:
    """A term after the first sentence end that more words follow ("... water. TERM.")."""
    end = SENTENCE_END.search(text)
    return bool(end) and any(whole(term, text[end.end() :]) for term in terms)


def beside_own_word(text: str, terms) -> bool:
    """A term next to a word the model says for it by itself ("canine dog", "building edifice"): the
    term added, the model's word kept."""
    own = {term: words for term, words in HARD.values()}
    return any(
        re.search(rf"(?<!\w){re.escape(a)}\s+{re.escape(b)}(?!\w)", text)
        for term in terms
        for word in own[term]
        for a, b in ((term, word), (word, term))
    )


def hard_terms(backend, sources, references, options: DecodeOptions) -> dict:
    """The hard list: one glossary over every sentence, against plain beam search and the oracle."""
    plain = [t.text for t in backend.translate(sources, options)]
    constrained = [t.text for t in backend.translate(sources, replace(options, glossary=HARD_PAIRS))]
    oracle = [hand_substitution(p, s) for p, s in zip(plain, sources)]
    rows = [i for i, s in enumerate(sources) if targets(HARD_PAIRS, s)]
    asked = {i: targets(HARD_PAIRS, sources[i]) for i in rows}
    check = {}
    for source, (term, _) in HARD.items():
        lines = [i for i in rows if term in asked[i]]
        check[source] = {"lines": len(lines), "term_in_plain": sum(whole(term, plain[i]) > 0 for i in lines)}
    after = [i for i in rows if term_after_end(constrained[i], set(asked[i]))]
    doubled = [i for i in rows if beside_own_word(constrained[i], set(asked[i]))]
    longer = [i for i in rows if len(constrained[i].split()) > 1.5 * len(plain[i].split())]
    bleu = {
        name: sacrebleu.corpus_bleu(out, [references]).score
        for name, out in (("plain", plain), ("oracle", oracle), ("glossary", constrained))
    }
    subset = {
        name: round(sacrebleu.corpus_bleu([out[i] for i in rows], [[references[i] for i in rows]]).score, 2)
        for name, out in (("plain", plain), ("oracle", oracle), ("glossary", constrained))
    }
    met = scores(constrained, references, [HARD_PAIRS] * len(sources), sources, rows)
    return {
        "pairs": len(HARD),
        "hard_check": check,
        "sentences_with_terms": len(rows),
        "terms": sum(len(a) for a in asked.values()),
        "terms_met": met["terms_met"],
        "sentences_all_terms_met": met["sentences_all_terms_met"],
        "lines_term_after_end": len(after),
        "lines_over_1_5x_plain": len(longer),
        "lines_term_beside_own_word": len(doubled),
        "bleu": {name: round(b, 2) for name, b in bleu.items()},
        "bleu_sentences_with_terms": subset,
        "ratio_to_plain": round(bleu["glossary"] / bleu["plain"], 3),
        "ratio_to_oracle": round(bleu["glossary"] / bleu["oracle"], 3),
        "examples": [
            {"source": sources[i], "plain": plain[i], "oracle": oracle[i], "glossary": constrained[i]}
            for i in (sorted(set(after) | set(longer)) or rows)[:8]
        ],
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


def speed(backend, sources, options: DecodeOptions, rounds: int, tokenizer, pairs) -> dict:
    """Sentences/s of plain beam search and of one glossary ``pairs`` over the same sentences."""
    constrained = replace(options, glossary=pairs)
    widened = sum(
        beam_for(options.beam, [tokenizer.encode(t, target=True) for t in targets(pairs, s)]) > options.beam
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
        "glossary_pairs": len(pairs),
        "sentences_with_terms": sum(bool(targets(pairs, s)) for s in sources),
        "sentences_widened": widened,
        "sentences_per_cpu_s": {name: round(r, 1) for name, r in rate.items()},
        "ratio_glossary_to_plain": round(statistics.median(ratios), 3),
        "ratio_range": [round(ratios[0], 3), round(ratios[-1], 3)],
        "cpu_seconds": {name: [round(x, 2) for x in t] for name, t in cpu.items()},
    }


if __name__ == "__main__":
    main()
