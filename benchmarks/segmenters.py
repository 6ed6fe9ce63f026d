"""Sentence segmenters compared: boundary accuracy on Multi30k paragraphs and on hard cases, speed.

The segmentation set: val and test2016 of Multi30k (one sentence a line) joined into paragraphs of
3-8 consecutive sentences (lengths drawn with ``--seed``, the same for every language) with a single
space; a sentence without terminal punctuation (. ! ? …, then any closing quotes) gets a final "."
so that the joins are real sentence ends, and the gold boundaries are the joins. Beside it, a
hand-written hard set per language (abbreviations, ordinals and dates, decimal numbers, quotes and
brackets after the full stop, ellipses, "?!", URLs and e-mail addresses, initials, a lowercase word
after a full stop) with its gold sentences.

Each candidate's sentences are located in the paragraph by ``aiayn.documents.segment.spans_of``
(the same mapping for all, whatever whitespace a library keeps or changes); a boundary is the start
of a sentence after the first. Reported per language: boundary precision, recall and F1, the
paragraphs segmented exactly, sentences/s (median of ``--rounds`` interleaved rounds over all the
paragraphs), and per candidate the time to import it and segment a first sentence (a fresh
interpreter, median of 5), and its time on one line of about 100,000 characters (and its halves, to
show how it grows). Writes ``--results`` (JSON).

    python benchmarks/segmenters.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Callable

import pysbd
import sentencex
from sentence_splitter import SentenceSplitter

from aiayn.documents.segment import neutral_spans, segmenter_for, spans_of
from common import command, versions

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("AIAYN_DATA", ROOT.parent / "shared" / "data")) / "multi30k"
LANGUAGES = ("de", "en", "fr", "cs")
TERMINAL = re.compile("[.!?\u2026][\"'\u201d\u201c\u2019\u00bb)\\]]*$")
Spans = Callable[[str], "list[tuple[int, int]]"]

# The hard set: each case is its gold sentences, joined by one space into the text segmented.
HARD = {
    "de": [
        ["Wir brauchen Obst, z. B. Äpfel und Birnen.", "Dann gehen wir heim."],
        ["Es gibt viele Tiere, z.B. Hunde und Katzen.", "Alle sind süß."],
        ["Dr. Müller ist heute nicht da.", "Fragen Sie bitte Prof. Schmidt."],
        ["Er kaufte Brot, Milch, Eier usw. und ging dann nach Hause."],
        ["Sie kaufte Brot, Milch, Eier usw.", "Dann ging sie nach Hause."],
        ["Das Projekt ist fertig, d. h. wir können beginnen.", "Alle freuen sich."],
        ["Das kostet ca. 20 Euro.", "Mehr nicht."],
        ["Am 3. Oktober ist Feiertag.", "Viele haben frei."],
        ["Er wurde am 1. Januar 1990 geboren.", "Seitdem lebt er in Bonn."],
        ["Der 1. FC Köln hat gestern gewonnen.", "Die Fans jubelten."],
        ["Sie wohnt im 2. Stock.", "Der Aufzug ist kaputt."],
        ["Der Preis stieg um 3,5 Prozent.", "Das ist viel."],
        ["Die Version 3.5 ist neu.", "Sie hat viele Fehler behoben."],
        ["„Komm her!“, rief er.", "Der Hund lief sofort los."],
        ["Sie sagte: „Ich komme morgen.“", "Dann legte sie auf."],
        ["(Das war nicht geplant.)", "Trotzdem ging alles gut."],
        ["Er zögerte...", "Dann sprach er weiter."],
        ["Das war alles … einfach zu viel für ihn."],
        ["Wie bitte?!", "Das glaube ich nicht."],
        ["Mehr Infos gibt es unter www.beispiel.de.", "Schreiben Sie uns an info@beispiel.de."],
        ["Alles steht auf https://example.com/a.b?c=d.", "Lesen Sie es."],
        ["Das Buch schrieb J. R. R. Tolkien.", "Es ist sehr lang."],
        ["Thomas M. Müller kam zu spät."],
        ["Ich habe ein neues Gerät.", "iPhones sind teuer."],
        ["Die Sitzung beginnt um 9 Uhr.", "7 Personen nehmen teil."],
        ["Er wohnt in der Hauptstr. 5 in Berlin."],
        ["Das Spiel endete 2:1.", "Die Fans feierten bis spät in die Nacht."],
    ],
    "en": [
        ["Mr. Smith went to Washington.", "He arrived on Monday."],
        ["Dr. Jones is not here today.", "Please ask Mrs. Brown instead."],
        ["Bring some fruit, e.g. apples or pears.", "Then come home."],
        ["Bring the tools, i.e. the hammer and the saw.", "We start at noon."],
        ["The U.S. Army is large.", "It has many bases."],
        ["She moved to the U.S.", "She likes it there."],
        ['He said "Stop."', "Then he left."],
        ['"Come here!" he shouted.', "The dog ran to him."],
        ["She said, 'I will come.'", "Then she hung up."],
        ["(This was not planned.)", "Still, it went well."],
        ["The price rose by 3.5 percent.", "That is a lot."],
        ["It costs $4.99 today.", "Tomorrow it costs more."],
        ["He hesitated...", "Then he went on."],
        ["Wait... what did you say?"],
        ["Are you serious?!", "I can't believe it."],
        ["Visit www.example.com for details.", "Write to info@example.com."],
        ["See https://example.org/a.html.", "It explains everything."],
        ["The book was written by J. R. R. Tolkien.", "It is very long."],
        ["John F. Kennedy was president."],
        ["I bought a new phone.", "iPhones are expensive."],
        ["We met at 5 p.m. on Friday."],
        ["There were 3 dogs.", "5 cats were there too."],
        ["He works for Acme Inc. in Boston."],
        ["See Fig. 3 for details.", "It shows the results."],
        ["No. 5 is my favourite.", "It always was."],
        ["The talk was given by Prof. Lee et al. last year."],
    ],
    "fr": [
        ["M. Dupont est arrivé hier.", "Il était fatigué."],
        ["« Viens ici ! » cria-t-il.", "Le chien accourut."],
        ["Il a dit : « Non. »", "Puis il est parti."],
        ["Il faut des fruits, p. ex. des pommes.", "Ensuite on rentre."],
        ["Le prix a augmenté de 3,5 %.", "C'est beaucoup."],
        ["Il a hésité...", "Puis il a continué."],
        ["Vraiment ?!", "Je ne te crois pas."],
        ["Le Dr Martin est là.", "Il vous attend."],
        ["Voir www.exemple.fr pour plus d'infos.", "Merci."],
        ["Il est né le 1er janvier 1990.", "Il vit à Lyon."],
    ],
    "cs": [
        ["Přišel např. Dr. Novák.", "Bylo pozdě."],
        ["Narodil se 3. října 1990.", "Žije v Praze."],
        ["Cena vzrostla o 3,5 procenta.", "To je hodně."],
        ["„Pojď sem!“ zavolal.", "Pes přiběhl."],
        ["Bydlí v ul. Dlouhá 5 v Brně."],
        ["Čekal...", "Pak odešel."],
        ["Opravdu?!", "Tomu nevěřím."],
        ["Mají ovoce, tj. jablka a hrušky.", "Pak jdou domů."],
    ],
}

# What installed metadata does not say: the last release on PyPI when this was run
LAST_RELEASE = {"pysbd": "2021-02", "sentencex": "2026-09", "sentence-splitter": "2019-01"}
LIBRARIES = {"pysbd": "pysbd", "sentencex": "sentencex", "sentence-splitter": "sentence_splitter"}


def candidates(language: str) -> dict[str, Spans | None]:
    """name -> spans function for ``language`` (None where the library has no rules for it)."""
    pysbd_one = (
        pysbd.Segmenter(language=language, clean=False)
        if language in pysbd.languages.LANGUAGE_CODES
        else None
    )
    splitter = SentenceSplitter(language=language)
    shipped = segmenter_for(language)
    return {
        "pysbd": (lambda text: spans_of(text, pysbd_one.segment(text))) if pysbd_one else None,
        "sentencex": lambda text: spans_of(text, sentencex.segment(language, text)),
        "sentence-splitter": lambda text: spans_of(text, splitter.split(text)),
        "neutral rule": neutral_spans,
        "aiayn Segmenter": shipped.spans,
    }


def paragraphs(data: Path, seed: int) -> tuple[dict[str, list[list[str]]], dict[str, int]]:
    """language -> paragraphs (lists of sentences), the same sentences' indices in every language;
    language -> how many sentences got a final full stop."""
    rng = random.Random(seed)
    lines = {lang: [] for lang in LANGUAGES}
    split_sizes = []
    for split in ("val", "test2016"):
        for lang in LANGUAGES:
            lines[lang].append((data / f"{split}.{lang}").read_text(encoding="utf-8").splitlines())
        split_sizes.append(len(lines[LANGUAGES[0]][-1]))
    cuts = [_cuts(size, rng) for size in split_sizes]
    sets = {
        lang: [[_terminated(s) for s in part[a:b]] for part, c in zip(lines[lang], cuts) for a, b in c]
        for lang in LANGUAGES
    }
    added = {
        lang: sum(not TERMINAL.search(s.strip()) for part in lines[lang] for s in part) for lang in LANGUAGES
    }
    return sets, added


def _cuts(size: int, rng: random.Random) -> list[tuple[int, int]]:
    cuts, start = [], 0
    while start < size:
        end = min(size, start + rng.randint(3, 8))
        cuts.append((start, end))
        start = end
    return cuts


def _terminated(sentence: str) -> str:
    sentence = sentence.strip()
    return sentence if TERMINAL.search(sentence) else sentence + "."


def gold(sentences: list[str]) -> tuple[str, set[int]]:
    """The text of sentences joined by spaces, and the offsets where sentences after the first start."""
    text, starts = "", set()
    for sentence in sentences:
        if text:
            text += " "
            starts.add(len(text))
        text += sentence
    return text, starts


def score(spans: Spans, cases: list[list[str]]) -> dict:
    """Boundary precision/recall/F1 over the cases pooled, and the cases segmented exactly."""
    right = found = wanted = exact = 0
    wrong = []
    for sentences in cases:
        text, starts = gold(sentences)
        predicted = {a for a, _ in spans(text)[1:]}
        right, found, wanted = right + len(predicted & starts), found + len(predicted), wanted + len(starts)
        exact += predicted == starts
        if predicted != starts:
            wrong.append(text)
    precision, recall = right / max(found, 1), right / max(wanted, 1)
    f1 = 2 * precision * recall / max(precision + recall, 1e-12)
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "exact": exact,
        "cases": len(cases),
        "wrong": wrong,
    }


def speeds(named: dict[str, Spans], texts: list[str], sentences: int, rounds: int) -> dict[str, float]:
    """Sentences/s of each candidate over all texts: median of interleaved rounds, each round
    running every candidate (in a rotated order) enough passes to take at least 0.3 s."""
    passes = {name: _passes(spans, texts) for name, spans in named.items()}
    seconds: dict[str, list[float]] = {name: [] for name in named}
    names = list(named)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            for _ in range(passes[name]):
                for text in texts:
                    named[name](text)
            seconds[name].append((time.perf_counter() - start) / passes[name])
    return {name: sentences / statistics.median(s) for name, s in seconds.items()}


def _passes(spans: Spans, texts: list[str]) -> int:
    start = time.perf_counter()
    for text in texts:
        spans(text)
    return max(1, int(0.3 / max(time.perf_counter() - start, 1e-6)))


def long_line(named: dict[str, Spans], sentences: list[str], chars: int, limit: float) -> dict:
    """Seconds (one run) and boundary F1 of each candidate on one line of about ``chars`` characters
    of sentences, and on its prefixes of 1/8, 1/4, 1/2; a candidate slower than ``limit`` seconds on
    a prefix is not run on the longer ones."""
    picked, total = [], 0
    for sentence in sentences * (chars // sum(map(len, sentences)) + 1):
        if total >= chars:
            break
        picked.append(sentence)
        total += len(sentence) + 1
    sizes = [len(picked) // 8, len(picked) // 4, len(picked) // 2, len(picked)]
    out = {}
    for name, spans in named.items():
        out[name] = []
        for size in sizes:
            start = time.perf_counter()
            result = score(spans, [picked[:size]])
            seconds = time.perf_counter() - start
            text_chars = len(gold(picked[:size])[0])
            out[name].append({"chars": text_chars, "sentences": size, "seconds": seconds, "f1": result["f1"]})
            if seconds > limit:
                break
    return out


def import_seconds(library: str, language: str, repeats: int = 5) -> float:
    """Median seconds to import the library in a fresh interpreter and segment one sentence."""
    first = {
        "pysbd": f"import pysbd; pysbd.Segmenter(language={language!r}, clean=False).segment('A b. C d.')",
        "sentencex": f"import sentencex; sentencex.segment({language!r}, 'A b. C d.')",
        "sentence-splitter": "import sentence_splitter; "
        f"sentence_splitter.SentenceSplitter({language!r}).split('A b. C d.')",
    }[library]
    code = f"import time; t = time.perf_counter(); {first}; print(time.perf_counter() - t)"
    runs = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
        for _ in range(repeats)
    ]
    return statistics.median(runs)


def cpu() -> dict:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return {
        "model_name": fields.get("Model name", "").strip(),
        "cores": os.cpu_count(),
        "avx512": any(flag.startswith("avx512") for flag in flags),
        "avx512_flags": sorted(flag for flag in flags if flag.startswith("avx512")),
    }


def library_info() -> dict:
    info = {}
    for name in LIBRARIES:
        meta = metadata.metadata(name)
        licence = meta.get("License-Expression") or meta.get("License") or ""
        info[name] = {
            "version": metadata.version(name),
            "licence": licence,
            "last_release": LAST_RELEASE[name],
        }
    return info


def print_table(language: str, rows: dict) -> None:
    print(
        f"\n{language}: candidate | Multi30k P / R / F1, paragraphs exact"
        " | hard P / R / F1, exact | sentences/s"
    )
    for name, row in rows.items():
        m, h = row["multi30k"], row["hard"]
        print(
            f"  {name:18s} | {m['precision']:.3f} / {m['recall']:.3f} / {m['f1']:.3f}, "
            f"{m['exact']}/{m['cases']}"
            f" | {h['precision']:.3f} / {h['recall']:.3f} / {h['f1']:.3f}, {h['exact']}/{h['cases']}"
            f" | {row['sentences_per_s']:,.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--long-chars", type=int, default=100_000)
    parser.add_argument("--long-language", default="de")
    parser.add_argument(
        "--long-limit", type=float, default=20.0, help="seconds; longer lines skipped beyond it"
    )
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "segmenters.json"))
    args = parser.parse_args()
    sets, added = paragraphs(Path(args.data_dir), args.seed)
    libraries = library_info()
    results = {
        "benchmark": "segmenters",
        "command": command(),
        "versions": versions(**{name: info["version"] for name, info in libraries.items()}),
        "libraries": libraries,
        "cpu": cpu(),
        "seed": args.seed,
        "rounds": args.rounds,
        "languages": {},
    }
    for lang in LANGUAGES:
        sentences = sum(map(len, sets[lang]))
        print(
            f"{lang}: {len(sets[lang])} paragraphs of {sentences} sentences; {added[lang]} sentences "
            "lacked terminal punctuation and got a final '.'"
        )
        results["languages"][lang] = evaluate(lang, sets[lang], args.rounds)
        results["languages"][lang].update(
            paragraphs=len(sets[lang]), sentences=sentences, full_stops_added=added[lang]
        )
        print_table(lang, results["languages"][lang]["candidates"])
    results["import_seconds"] = {
        name: {lang: import_seconds(name, lang) for lang in ("de", "en")} for name in LIBRARIES
    }
    print("\nimport and a first sentence (s):", json.dumps(results["import_seconds"]))
    named = {k: v for k, v in candidates(args.long_language).items() if v is not None}
    line = [s for p in sets[args.long_language] for s in p]
    results["long_line"] = {
        "language": args.long_language,
        **long_line(named, line, args.long_chars, args.long_limit),
    }
    for name, runs in results["long_line"].items():
        if name != "language":
            print(
                f"long line {name}: "
                + ", ".join(f"{r['chars']:,} chars {r['seconds']:.3f} s F1 {r['f1']:.3f}" for r in runs)
            )
    Path(args.results).write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.results}")


def evaluate(language: str, paragraphs_: list[list[str]], rounds: int) -> dict:
    named = {name: spans for name, spans in candidates(language).items() if spans is not None}
    texts = [gold(p)[0] for p in paragraphs_]
    per_second = speeds(named, texts, sum(map(len, paragraphs_)), rounds)
    rows = {
        name: {
            "multi30k": score(spans, paragraphs_),
            "hard": score(spans, HARD[language]),
            "sentences_per_s": per_second[name],
        }
        for name, spans in named.items()
    }
    return {
        "candidates": rows,
        "unsupported": [name for name, spans in candidates(language).items() if spans is None],
    }


if __name__ == "__main__":
    main()
