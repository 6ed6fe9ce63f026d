"""aiayn's decoding steps, int8 and bf16 against CTranslate2's fp32 and int8: speed and BLEU, same batches.

    .venv/bin/python benchmarks/decode_int8.py --checkpoint /work/models/avg5 --rounds 5

Five systems (six where the CPU has native bf16) translate test2016 (text in, text out) in one
process, with the batches of aiayn's ``Translator`` (``--batch-tokens``), greedy and beam 4 (α 0.6):

* ``aiayn``: the shipped path (:mod:`aiayn.decode.fast_step`, fp32);
* ``aiayn model step``: the model's own step on its key/value cache (``SearchPaths(fast_step=False)``,
  the reference the inference step replaced);
* ``aiayn int8``: the model's int8 copy (``aiayn.decode.fast_step.int8``: weights per row, activations
  per call, PyTorch's dynamic quantization), what ``aiayn translate --compute-type int8`` runs;
* ``aiayn bf16`` (only where the CPU has AVX512-BF16 or AMX): the model's bf16 copy
  (``aiayn.decode.fast_step.bfloat16``), what ``aiayn translate --compute-type bfloat16`` runs;
  CTranslate2 has no bf16 on CPUs, so its peer is CTranslate2's fastest type there, int8;
* ``ctranslate2`` and ``ctranslate2 int8``: aiayn's export (``aiayn export --format ctranslate2``),
  ``compute_type`` float32 and int8 (CTranslate2's int8 on the CPU: weights per row, activations per row).

Rounds interleave the systems in rotating order; figures are medians of sentences/s and the median
of the per-round ratios against ``aiayn`` (paired, so slow spells of a shared machine hit both sides).
BLEU (sacreBLEU, detokenized, against the references) of each system's first run. Writes
``benchmarks/results/decode_speed_int8.json`` (``--results``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import sacrebleu
import torch

from aiayn.decode import fast_step
from aiayn.decode.search import DecodeOptions, SearchPaths
from aiayn.decode.translator import Translator
from aiayn.export import export_ctranslate2
from aiayn.loading import load_translation_model
from aiayn.malloc import keep_freed_memory
from aiayn.precision import native_bf16
from common import command, machine, versions
from decode_speed import Aiayn, CTranslate2, languages, read_split

ROOT = Path(__file__).resolve().parents[1]
#: the systems and their compute types (aiayn's: what ``--compute-type`` names; default is fp32)
SYSTEMS = {
    "aiayn": "default",
    "aiayn model step": "default",
    "aiayn int8": "int8",
    "aiayn bf16": "bfloat16",
    "ctranslate2": "float32",
    "ctranslate2 int8": "int8",
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=str(ROOT / "runs" / "multi30k_en_de" / "averaged"))
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--split", default="test2016")
    parser.add_argument("--src")
    parser.add_argument("--tgt")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (default: all)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "decode_speed_int8.json"))
    parser.add_argument(
        "--alone", action="store_true", help="each system in a process of its own, once a round (see alone())"
    )
    parser.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)  # --alone's processes
    parser.add_argument("--ct2-model", help=argparse.SUPPRESS)  # the export --alone made
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    import ctranslate2

    model, tokenizer, ckpt = load_translation_model(args.checkpoint)
    src, tgt = languages(args, ckpt.config)
    lines, refs = read_split(Path(args.data_dir), args.split, src, tgt, args.limit)
    searches = {"greedy": 1, f"beam{args.beam}": args.beam}
    options = {name: DecodeOptions(beam=beam, alpha=args.alpha) for name, beam in searches.items()}
    aiayn = Aiayn(model, tokenizer, options, args.batch_tokens)
    batches, limits = aiayn.plan(lines)
    names = [n for n in SYSTEMS if n != "aiayn bf16" or native_bf16(torch.device("cpu"))]

    def make(name: str, export: Path) -> dict:
        """``name``'s translate function per search."""
        if name.startswith("ctranslate2"):
            peer = CTranslate2(ctranslate2, export, tokenizer, aiayn, batches, limits, options, args.threads)
            peer.translator = ctranslate2.Translator(
                str(export), compute_type=SYSTEMS[name], intra_threads=args.threads
            )
            return {search: peer_translate(peer, search) for search in searches}
        decoded = {"int8": fast_step.int8, "bfloat16": fast_step.bfloat16}.get(SYSTEMS[name], lambda m: m)(
            model
        )
        paths = SearchPaths(fast_step=False) if name == "aiayn model step" else SearchPaths()
        return {search: translator(decoded, replace(o, paths=paths)) for search, o in options.items()}

    def translator(m, o):
        translator = Translator(m, tokenizer, batch_tokens=args.batch_tokens, options=o)
        return lambda texts: [t.text for t in translator.translate(texts)]

    with tempfile.TemporaryDirectory(prefix="aiayn-ct2-") as tmp:
        export = Path(args.ct2_model) if args.ct2_model else Path(tmp) / "model"
        if not args.ct2_model:
            export_ctranslate2(ckpt.path, export)
        if args.child:  # one system in this process: a warm-up (its outputs), then one timed run a search
            systems = make(args.child, export)
            report = {}
            for search, translate in systems.items():
                outputs = translate(lines)
                start = time.perf_counter()
                translate(lines)
                report[search] = {"seconds": time.perf_counter() - start, "outputs": outputs}
            print(json.dumps(report))
            return
        if args.alone:
            figures = alone(args, names, export, lines, refs, searches)
        else:
            systems = {name: make(name, export) for name in names}
            figures = {
                search: run(
                    {name: s[search] for name, s in systems.items()}, lines, refs, args.rounds, search
                )
                for search in searches
            }
    results = {
        "benchmark": "decode_int8",
        "command": command(),
        "versions": versions(ctranslate2=ctranslate2.__version__, sacrebleu=sacrebleu.__version__),
        "machine": machine(),
        "settings": {
            "checkpoint": str(ckpt.path),
            "model": model.config.to_dict(),
            "split": args.split,
            "src": src,
            "tgt": tgt,
            "sentences": len(lines),
            "batches": len(batches),
            "batch_tokens": args.batch_tokens,
            "threads": args.threads,
            "rounds": args.rounds,
            "alpha": args.alpha,
            "systems": {name: SYSTEMS[name] for name in names},
            "processes": "one per system and round (--alone)" if args.alone else "one, every system in it",
        },
        "figures": figures,
    }
    path = Path(args.results)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)


def alone(args, names: list[str], export: Path, lines, refs, searches) -> dict:
    """Each system in a process of its own, once a round, the order rotating: a user's process holds
    one model (in one process six models' kernels and caches compete: bf16 lost about a fifth there)."""
    seconds = {search: {name: [] for name in names} for search in searches}
    outputs: dict = {search: {} for search in searches}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            argv = [a for a in sys.argv[1:] if a != "--alone"]
            child = [sys.executable, __file__, *argv, "--child", name, "--ct2-model", str(export)]
            done = subprocess.run(child, check=True, capture_output=True, text=True)
            report = json.loads(done.stdout.strip().splitlines()[-1])
            for search, row in report.items():
                seconds[search][name].append(row["seconds"])
                outputs[search].setdefault(name, row["outputs"])
            print(
                f"round {r + 1} {name}: " + ", ".join(f"{s} {v['seconds']:.2f} s" for s, v in report.items())
            )
    return {search: summarise(seconds[search], outputs[search], lines, refs, search) for search in searches}


def peer_translate(peer: CTranslate2, search: str):
    return lambda texts: peer.translate(texts, search)[0]


def run(systems: dict, lines: list[str], refs: list[str], rounds: int, search: str) -> dict:
    outputs = {name: translate(lines) for name, translate in systems.items()}  # warm-up, BLEU
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    names = list(systems)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            systems[name](lines)
            seconds[name].append(time.perf_counter() - start)
    return summarise(seconds, outputs, lines, refs, search)


def summarise(seconds: dict, outputs: dict, lines: list[str], refs: list[str], search: str) -> dict:
    out = {}
    for name in seconds:
        paired = [a / s for a, s in zip(seconds["aiayn"], seconds[name])]  # name's speed / aiayn's
        out[name] = {
            "seconds": seconds[name],
            "sentences_per_s": len(lines) / statistics.median(seconds[name]),
            "paired_speed_over_aiayn": statistics.median(paired),
            "bleu": sacrebleu.corpus_bleu(outputs[name], [refs]).score,
            "same_output_as_aiayn": sum(a == b for a, b in zip(outputs[name], outputs["aiayn"])),
        }
        print(
            f"{search} {name}: {out[name]['sentences_per_s']:.1f} sent/s, "
            f"{out[name]['paired_speed_over_aiayn']:.3f}x aiayn's speed, BLEU {out[name]['bleu']:.2f}",
            file=sys.stderr,
        )
    return out


if __name__ == "__main__":
    main()
