"""Language identifiers for ``source: "auto"`` of aiayn serve's LibreTranslate API, compared.

    .venv/bin/pip install py3langid lingua-language-detector pycld2
    .venv/bin/python benchmarks/langid.py                     # Multi30k val in de, en, fr, cs

Each identifier names one language for each text among all the languages it knows (an open set, as
the server asks it: a text in a language the model does not translate must be recognised as such):

* **py3langid** (``py3langid.classify``; 97 languages, a naive Bayes model over byte n-grams);
* **lingua** (``lingua-language-detector``: all 75 languages, high-accuracy mode, models preloaded);
* **lingua-low** (the same in its low-accuracy mode: trigrams only, for short texts less exact);
* **pycld2** (Chromium's CLD2; ``un`` when it finds no language).

Texts: Multi30k's val sentences in German, English, French and Czech (1,014 each, ``--data-dir``), and
the first three words of each (short texts, as a post's title or a chat line). Figures: accuracy per
language and over all, texts per second on one thread (the sentences, after one warm-up pass), the
time to import and load, the resident memory it adds, and the size of the installed package. Each
identifier runs in its own child process, one after the other, so memory and load times are its own.

Writes ``benchmarks/results/langid.json`` (``--results``): command, versions, machine, figures.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import command, machine, versions

ROOT = Path(__file__).resolve().parents[1]
LANGS = ("de", "en", "fr", "cs")
IDENTIFIERS = {  # name -> (distribution, the import packages whose files are its install size)
    "py3langid": ("py3langid", ["py3langid"]),
    "lingua": ("lingua-language-detector", ["lingua"]),
    "lingua-low": ("lingua-language-detector", ["lingua"]),
    "pycld2": ("pycld2", ["pycld2"]),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--split", default="val")
    parser.add_argument("--identifiers", nargs="+", default=list(IDENTIFIERS), choices=list(IDENTIFIERS))
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "langid.json"))
    parser.add_argument("--child", choices=list(IDENTIFIERS), help=argparse.SUPPRESS)
    return parser.parse_args()


# --- one identifier, in a child process -----------------------------------------------------------


def rss_mib() -> float:
    """This process's resident set size now (Linux), in MiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def load(name: str):
    """A function text -> ISO 639-1 code (or "un") for identifier ``name``."""
    if name == "py3langid":
        import py3langid

        py3langid.classify("warm")  # loads its model
        return lambda text: py3langid.classify(text)[0]
    if name == "pycld2":
        import pycld2

        return lambda text: pycld2.detect(text)[2][0][1]
    from lingua import LanguageDetectorBuilder

    builder = LanguageDetectorBuilder.from_all_languages().with_preloaded_language_models()
    detector = (builder.with_low_accuracy_mode() if name == "lingua-low" else builder).build()

    def detect(text: str) -> str:
        language = detector.detect_language_of(text)
        return language.iso_code_639_1.name.lower() if language is not None else "un"

    return detect


def child(name: str, texts: dict[str, dict[str, list[str]]]) -> dict:
    before, started = rss_mib(), time.perf_counter()
    identify = load(name)
    load_s, added = time.perf_counter() - started, rss_mib() - before
    figures = {"load_s": round(load_s, 3), "rss_added_mib": round(added, 1)}
    for kind, by_lang in texts.items():
        correct = {lang: sum(identify(t) == lang for t in items) for lang, items in by_lang.items()}
        total = sum(len(items) for items in by_lang.values())
        figures[kind] = {
            "accuracy": round(sum(correct.values()) / total, 4),
            "per_language": {lang: round(correct[lang] / len(by_lang[lang]), 4) for lang in by_lang},
        }
    sentences = [t for items in texts["sentences"].values() for t in items]
    started = time.perf_counter()
    for text in sentences:
        identify(text)
    figures["sentences_per_s"] = round(len(sentences) / (time.perf_counter() - started), 1)
    return figures


# --- the comparison ---------------------------------------------------------------------------------


def read_texts(data_dir: Path, split: str) -> dict[str, dict[str, list[str]]]:
    sentences = {
        lang: (data_dir / f"{split}.{lang}").read_text(encoding="utf-8").splitlines() for lang in LANGS
    }
    words = {lang: [" ".join(s.split()[:3]) for s in items] for lang, items in sentences.items()}
    return {"sentences": sentences, "three_words": words}


def install_mib(packages: list[str]) -> float:
    import importlib.util

    size = 0
    for package in packages:
        spec = importlib.util.find_spec(package)
        root = Path(spec.origin).parent if spec and spec.origin else None
        size += sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root else 0
    return round(size / 2**20, 1)


def run_child(name: str, args: argparse.Namespace) -> dict:
    extra = ["--data-dir", args.data_dir, "--split", args.split]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1"}  # one thread each
    out = subprocess.run(
        [sys.executable, __file__, "--child", name, *extra], capture_output=True, text=True, env=env
    )
    if out.returncode != 0:
        raise SystemExit(f"{name}: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    args = parse_args()
    texts = read_texts(Path(args.data_dir), args.split)
    if args.child:
        print(json.dumps(child(args.child, texts)))
        return
    figures = {}
    for name in args.identifiers:
        distribution, packages = IDENTIFIERS[name]
        figures[name] = {
            "version": importlib.metadata.version(distribution),
            "install_mib": install_mib(packages),
            **run_child(name, args),
        }
        print(name, json.dumps(figures[name]), flush=True)
    result = {
        "benchmark": "langid",
        "command": command(),
        "versions": versions(),
        "machine": machine(),
        "settings": {"data": f"Multi30k {args.split}", "languages": LANGS, "threads": 1},
        "texts": {kind: sum(len(v) for v in by_lang.values()) for kind, by_lang in texts.items()},
        "figures": figures,
    }
    Path(args.results).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
