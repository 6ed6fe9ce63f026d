"""What each of aiayn's decoding fast paths buys, measured against the path it replaces, same process.

    .venv/bin/python benchmarks/decode_paths.py          # runs/multi30k_en_de/averaged, test2016

Each variant turns one fast path off (the rest stay on), or takes the alternative to a library
primitive, and translates the same sentences with ``Translator.translate`` (text in, text out, the
Translator's own batches):

* ``one-stage selection``: PyTorch's ``argmax``/``topk`` over the whole vocabulary instead of the
  block-wise two-stage ones (``SearchPaths(two_stage=False)``);
* ``one encoder batch``: the encoder run on the whole padded batch at once instead of on buckets
  of sources of similar length (``SearchPaths(by_length=False)``);
* ``the other step``: on the CPU, the decoder step run by the model's modules on their key/value
  cache (:class:`~aiayn.decode.step.ModelStep`, ``SearchPaths(fast_step=False)``) instead of the
  inference step of :mod:`aiayn.decode.fast_step`, the CPU's default; on a GPU (``--device cuda``),
  where the model's own step is the default, the inference step (``SearchPaths(fast_step=True)``):
  the figure that decides the GPU's default;
* ``written-out attention formula``: attention computed by the formula written out (two batched
  matmuls around an fp32 softmax) instead of the fused ``F.scaled_dot_product_attention``
  (``path = "formula"`` on every ``MultiHeadAttention`` of the model: since the inference step
  writes out its own decoder attention, this moves the encoder only);
* ``memory per row`` (beam search): the encoder memory and cross-attention keys/values copied for
  every beam instead of kept once per sentence (``SearchPaths(group_rows=False)``);
* ``scores`` (greedy search): hypotheses scored (a log-softmax per step), as ``Wanted(scores=True)``
  needs, where the texts alone skip it (``DecodeOptions(scores=True)``);
* ``all off``: every fast path above off at once (attention as shipped).

Timing is interleaved at the finest grain that keeps the search unchanged: for every batch, every
round runs every variant once, in rotating order; a variant's round time sums its batches. The
figure is the paired speedup, shipped / variant of each round's times (median, min, max), so slow
spells of this shared machine hit both sides of a ratio alike. Every variant's output must equal
the shipped path's (checked on the first round; reported).

Writes ``benchmarks/results/decode_paths.json`` (``--results``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from aiayn.data.corpus import read_parallel
from aiayn.decode import fast_step
from aiayn.decode.request import Wanted
from aiayn.decode.search import DecodeOptions, SearchPaths
from aiayn.decode.translator import Translator
from aiayn.loading import load_translation_model
from aiayn.malloc import keep_freed_memory
from aiayn.model import MultiHeadAttention
from common import command, machine, peak_rss_mib, versions

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {  # SearchPaths fields (DecodeOptions.paths)
    "one-stage selection": "two_stage",
    "memory per row": "group_rows",
    "one encoder batch": "by_length",
    "the other step": "fast_step",
}
FORMULA = "written-out attention formula"  # MultiHeadAttention.path, on the model


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=str(ROOT / "runs" / "multi30k_en_de" / "averaged"))
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--split", default="test2016")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (default: all)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "decode_paths.json"))
    return parser.parse_args()


def variants(greedy: bool) -> dict[str, tuple[set[str], bool]]:
    """name -> (changes from the shipped paths, scores) for one search; greedy search has no beams
    to group."""
    fast_paths = [name for name in OPTIONS if not (greedy and name == "memory per row")]
    cases = {"shipped": (set(), False), **{name: ({name}, False) for name in [*fast_paths, FORMULA]}}
    if greedy:
        cases["scores"] = (set(), True)
    cases["all off"] = (set(fast_paths), greedy)
    return cases


def set_attention_path(model, path: str) -> None:
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.path = path


def run(translator: Translator, lines: list[str], off: set[str], scores: bool) -> list[str]:
    shipped = translator.options
    try:
        paths = SearchPaths(
            **{OPTIONS[name]: _off(OPTIONS[name], translator) for name in off if name in OPTIONS}
        )
        translator.options = replace(shipped, paths=paths)
        set_attention_path(translator.model, "formula" if FORMULA in off else "auto")
        if scores:  # what translate() returns, through the scored search
            return [t.text for t in translator.translate(lines, wanted=Wanted(scores=True))]
        return [t.text for t in translator.translate(lines)]
    finally:
        translator.options = shipped
        set_attention_path(translator.model, "auto")


def _off(path: str, translator: Translator) -> bool:
    """A path's value in a variant that turns it: off, but for the step, the other one than the
    device's default."""
    return path == "fast_step" and not fast_step.by_default(translator.model)


def measure(translator: Translator, lines: list[str], rounds: int, greedy: bool) -> dict:
    sources = {i: translator.encode_source(line) for i, line in enumerate(lines)}
    batches = [[lines[i] for i in batch] for batch in translator.batches(sources)]
    cases = variants(greedy)
    names = list(cases)
    seconds = {name: [0.0] * rounds for name in names}
    outputs: dict[str, list[str]] = {name: [] for name in names}
    for batch in batches:
        for name in names:  # warm-up
            run(translator, batch, *cases[name])
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                start = time.perf_counter()
                out = run(translator, batch, *cases[name])
                seconds[name][r] += time.perf_counter() - start
                if r == 0:
                    outputs[name] += out
    result = {}
    for name in names:
        ratios = [v / s for s, v in zip(seconds["shipped"], seconds[name])]  # variant time / shipped time
        result[name] = {
            "off": sorted(cases[name][0]),
            "scores": cases[name][1],
            "seconds_per_round": seconds[name],
            "median_s": statistics.median(seconds[name]),
            "speedup_of_shipped": {
                "median": statistics.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
            },
            "same_output_as_shipped": outputs[name] == outputs["shipped"],
        }
    return result


def main() -> None:
    args = parse_args()
    malloc_kept = keep_freed_memory()
    torch.set_num_threads(args.threads)
    model, tokenizer, ckpt = load_translation_model(args.checkpoint, device=args.device)
    data = ckpt.config.get("run", {}).get("data", {})
    pairs, _ = read_parallel(Path(args.data_dir), args.split, data["src_lang"], data["tgt_lang"])
    lines = [source for source, _ in pairs][: args.limit or None]
    figures = {}
    for search_name, beam in (("greedy", 1), (f"beam{args.beam}", args.beam)):
        options = DecodeOptions(beam=beam, alpha=args.alpha)
        translator = Translator(model, tokenizer, args.device, options=options)
        figures[search_name] = measure(translator, lines, args.rounds, beam == 1)
        for name, f in figures[search_name].items():
            s = f["speedup_of_shipped"]
            print(
                f"{search_name:7s} {name:30s} {f['median_s']:6.2f} s/round  shipped is {s['median']:.3f}x "
                f"[{s['min']:.3f}-{s['max']:.3f}]  same output: {f['same_output_as_shipped']}",
                flush=True,
            )
    results = {
        "benchmark": "decode_paths",
        "command": command(),
        "versions": versions(),
        "machine": machine(),
        "settings": {
            "checkpoint": str(ckpt.path),
            "split": args.split,
            "sentences": len(lines),
            "rounds": args.rounds,
            "threads": args.threads,
            "device": args.device,
            "alpha": args.alpha,
            "malloc_kept": malloc_kept,
        },
        "figures": figures,
        "peak_rss_mib": peak_rss_mib(),
    }
    Path(args.results).write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.results}")
    if not all(
        f["same_output_as_shipped"] for search_figures in figures.values() for f in search_figures.values()
    ):
        sys.exit("decode_paths: a variant's output differs from the shipped path's")


if __name__ == "__main__":
    main()
