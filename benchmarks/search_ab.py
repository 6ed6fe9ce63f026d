"""Before/after for decoding changes: this tree's search and cache against a git revision's, in one process.

The revision's ``aiayn/decode/search.py`` and ``aiayn/model/attention.py`` are loaded as separate
modules; for its turns, its ``generate`` and its ``KVCache`` class (the self-attention cache that
``aiayn.decode.cache`` builds) are swapped in (a revision's cache without ``KVCache.attend`` gets this
tree's). Everything else, ``MultiHeadAttention``, ``ModelStep`` and the grouped cross-attention cache
included, is this tree's on both sides: compare changes there with ``benchmarks/decode_paths.py``.
Model, tokenizer and sentences are shared. After an untimed warm-up of each side, rounds alternate
the order and are timed in process CPU time (less sensitive to other work on a shared machine than
wall time). Prints the per-round times, the median of the per-round ratios, and whether the outputs
are identical; writes ``--results`` (JSON).

    python benchmarks/search_ab.py --rev a18eaf8 --beam 4 --sentences 300 --threads 1
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import aiayn.decode.cache as decode_cache
import aiayn.decode.search as current_search
import aiayn.decode.translator as translator_module
import aiayn.model.attention as attention
from aiayn.decode.translator import Translator
from aiayn.loading import load_translation_model
from aiayn.malloc import keep_freed_memory
from common import command, machine, versions

ROOT = Path(__file__).resolve().parents[1]


def module_at(rev: str, path: str, name: str, workdir: Path):
    """The file ``src/<path>`` at git revision ``rev``, imported as module ``name``."""
    source = subprocess.run(
        ["git", "show", f"{rev}:src/{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    file = workdir / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", required=True, help="git revision to compare against")
    parser.add_argument("--checkpoint", default=str(ROOT / "runs" / "multi30k_en_de" / "averaged"))
    parser.add_argument("--source", default=str(ROOT.parent / "shared" / "data" / "multi30k" / "test2016.en"))
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "search_ab.json"))
    args = parser.parse_args()
    keep_freed_memory()  # as the aiayn command does
    torch.set_num_threads(args.threads)
    model, tokenizer, _ = load_translation_model(args.checkpoint)
    lines = Path(args.source).read_text(encoding="utf-8").splitlines()[: args.sentences]
    with tempfile.TemporaryDirectory() as tmp:
        old_search = module_at(args.rev, "aiayn/decode/search.py", "old_search", Path(tmp))
        old_attention = module_at(args.rev, "aiayn/model/attention.py", "old_attention", Path(tmp))
    if not hasattr(old_attention.KVCache, "attend"):  # called by this tree's MultiHeadAttention
        old_attention.KVCache.attend = attention.KVCache.attend
    variants = {
        args.rev: (with_controls(old_search.generate), old_attention.KVCache),
        "this tree": (current_search.generate, attention.KVCache),
    }
    translator = Translator(model, tokenizer, beam=args.beam)
    outputs, seconds = {}, {name: [] for name in variants}

    def run(name: str) -> float:
        translator_module.generate, decode_cache.KVCache = variants[name]
        start = time.process_time()
        outputs[name] = [t.text for t in translator.translate(lines)]
        return time.process_time() - start

    names = list(variants)
    for name in names:  # untimed warm-up: first-call costs fall on neither side
        run(name)
    for r in range(args.rounds):
        for name in names[r % 2 :] + names[: r % 2]:  # alternating order
            seconds[name].append(run(name))
    ratios = [old / new for old, new in zip(seconds[args.rev], seconds["this tree"])]
    for name, times in seconds.items():
        print(
            f"{name:>10}: "
            + " ".join(f"{t:.2f}" for t in times)
            + f" s CPU (median {statistics.median(times):.2f})"
        )
    identical = outputs[args.rev] == outputs["this tree"]
    print(
        f"beam {args.beam}, {len(lines)} sentences, {args.threads} thread(s): "
        f"{statistics.median(ratios):.2f}x "
        f"(median of per-round ratios; {min(ratios):.2f}-{max(ratios):.2f}); outputs identical: {identical}"
    )
    results = {
        "benchmark": "search_ab",
        "command": command(),
        "versions": versions(),
        "machine": machine(),
        "rev": args.rev,
        "beam": args.beam,
        "sentences": len(lines),
        "threads": args.threads,
        "cpu_seconds": seconds,
        "speedup_median": statistics.median(ratios),
        "speedup_min": min(ratios),
        "speedup_max": max(ratios),
        "outputs_identical": identical,
    }
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    Path(args.results).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.results}")


def with_controls(generate):
    """A revision's ``generate`` from before per-sentence controls (prefixes, glossaries) as this
    tree's Translator calls it: with its controls, which hold none here (no prefix, no glossary)."""
    if "controls" in inspect.signature(generate).parameters:
        return generate
    return lambda model, src, options, controls=None: generate(model, src, options)


if __name__ == "__main__":
    main()
