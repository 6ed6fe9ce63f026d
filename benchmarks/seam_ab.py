"""Before/after for changes at the seam between callers and engines: ``aiayn translate`` of this tree
and of a git revision, run on the same model, inputs and flags, their outputs compared byte for byte.

    python benchmarks/seam_ab.py --rev 9e0e311 --checkpoint runs/de_en --data-dir data/multi30k

The revision is checked out into a temporary git worktree; each side runs as ``python -m aiayn
translate`` with ``PYTHONPATH`` on its own ``src``, so the whole path is compared: the command, the
documents layer, the backends and the searches. The cases are what the seam carries: greedy search,
beam 4, a 3-best list with scores, a glossary, prefixes, confidence (``--scores``), alignments and an
HTML document (one ``<b>`` on the second word of every sentence), each on the torch engine and, where
it has the option, on CTranslate2. For HTML the text without its tags is compared too (a change in
where markup goes keeps the words). The sides alternate per case. Prints one line per case (identical
or the first differing line) and writes ``--results`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import command, machine, versions

ROOT = Path(__file__).resolve().parents[1]
TAG = re.compile(r"<[^>]*>")
GLOSSARY = [  # German nouns of the test set, each to a rarer English word than the model's own
    ("Hund", "hound"),
    ("Mann", "gentleman"),
    ("Frau", "lady"),
    ("Straße", "roadway"),
    ("Kinder", "youngsters"),
]
CASES = {  # name -> (flags, engines)
    "greedy": (["--beam", "1"], ("torch", "ctranslate2")),
    "beam4": (["--beam", "4"], ("torch", "ctranslate2")),
    "nbest3": (["--beam", "4", "--nbest", "3"], ("torch", "ctranslate2")),
    "glossary": (["--beam", "4", "--glossary", "{glossary}"], ("torch",)),
    "prefixes": (["--beam", "4", "--prefix-file", "{prefixes}"], ("torch", "ctranslate2")),
    "scores": (["--beam", "4", "--scores"], ("torch", "ctranslate2")),
    "alignments": (["--beam", "4", "--alignments"], ("torch", "ctranslate2")),
    "html": (["--beam", "4", "--format", "html", "--input", "{html}"], ("torch", "ctranslate2")),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", required=True, help="the git revision to compare against")
    parser.add_argument("--checkpoint", required=True, help="checkpoint or run directory")
    parser.add_argument("--data-dir", required=True, help="Multi30k (aiayn data multi30k)")
    parser.add_argument("--split", default="test2016")
    parser.add_argument("--src-lang", default="de")
    parser.add_argument("--tgt-lang", default="en")
    parser.add_argument("--limit", type=int, default=300, help="the first N sentences")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "seam_ab.json"))
    return parser.parse_args()


def inputs(args, work: Path) -> dict[str, Path]:
    data = Path(args.data_dir)
    sources = (data / f"{args.split}.{args.src_lang}").read_text(encoding="utf-8").splitlines()[: args.limit]
    refs = (data / f"{args.split}.{args.tgt_lang}").read_text(encoding="utf-8").splitlines()[: args.limit]
    files = {"sources": work / "sources.txt", "glossary": work / "glossary.tsv"}
    files["sources"].write_text("\n".join(sources) + "\n", encoding="utf-8")
    files["glossary"].write_text("".join(f"{s}\t{t}\n" for s, t in GLOSSARY), encoding="utf-8")
    prefixes = [" ".join(ref.split()[:2]) if k % 3 == 0 else "" for k, ref in enumerate(refs)]
    files["prefixes"] = work / "prefixes.txt"
    files["prefixes"].write_text("\n".join(prefixes) + "\n", encoding="utf-8")
    paragraphs = [" ".join(_bold_second(s) for s in sources[k : k + 4]) for k in range(0, len(sources), 4)]
    files["html"] = work / "document.html"
    files["html"].write_text("".join(f"<p>{p}</p>\n" for p in paragraphs), encoding="utf-8")
    return files


def _bold_second(sentence: str) -> str:
    words = sentence.split()
    if len(words) > 1:
        words[1] = f"<b>{words[1]}</b>"
    return " ".join(words)


def translate(tree: Path, args, flags: list[str], engine: str, files: dict, out: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    flags = [flag.format(**{k: str(v) for k, v in files.items()}) for flag in flags]
    given = ["--input", str(files["sources"])] if "--input" not in flags else []
    cmd = [sys.executable, "-m", "aiayn", "translate", "--checkpoint", args.checkpoint, "--device", "cpu"]
    cmd += [*given, *flags, "--engine", engine, "--output", str(out)]
    if engine == "ctranslate2":
        cmd += ["--ct2-dir", str(out.parent / "ct2")]
    env["OMP_NUM_THREADS"] = str(args.threads)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(cmd)}\n{done.stderr}")
    return time.perf_counter() - start


def first_difference(a: str, b: str) -> str | None:
    for k, (x, y) in enumerate(zip(a.splitlines(), b.splitlines())):
        if x != y:
            return f"line {k + 1}: {x!r} != {y!r}"
    return None if a == b else "lengths differ"


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="seam_ab_") as tmp:
        work = Path(tmp)
        before = work / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), args.rev], cwd=ROOT, check=True)
        try:
            files = inputs(args, work)
            cases = run_cases(args, {"before": before, "after": ROOT}, files, work)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=True)
    results = {
        "command": command(),
        "machine": machine(),
        "versions": versions(),
        "rev": args.rev,
        "checkpoint": args.checkpoint,
        "sentences": args.limit,
        "cases": cases,
        "identical": all(c["identical"] for c in cases.values()),
    }
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"all identical: {results['identical']}; wrote {args.results}")


def run_cases(args, trees: dict[str, Path], files: dict, work: Path) -> dict:
    cases = {}
    for k, (name, (flags, engines)) in enumerate(CASES.items()):
        for engine in engines:
            outputs, seconds = {}, {}
            order = list(trees) if k % 2 == 0 else list(reversed(trees))  # alternate which side runs first
            for side in order:
                out = work / f"{side}_{name}_{engine}.txt"
                seconds[side] = translate(trees[side], args, flags, engine, files, out)
                outputs[side] = out.read_text(encoding="utf-8")
            difference = first_difference(outputs["before"], outputs["after"])
            words = [TAG.sub("", outputs[side]) for side in ("before", "after")]
            cases[f"{name}/{engine}"] = {
                "flags": flags,
                "identical": difference is None,
                "first_difference": difference,
                "identical_without_tags": words[0] == words[1],
                "lines": len(outputs["after"].splitlines()),
                "seconds": seconds,
            }
            same = "identical" if difference is None else difference
            if difference is not None and name == "html":
                same += f" (without tags: {'identical' if words[0] == words[1] else 'different'})"
            print(f"{name:>10} {engine:<11} {same}", flush=True)
    return cases


if __name__ == "__main__":
    main()
