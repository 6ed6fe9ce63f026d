"""Decoding speed on Multi30k test2016: aiayn against HuggingFace Marian and CTranslate2, same weights.

    .venv/bin/python benchmarks/decode_speed.py                    # runs/multi30k_en_de/averaged, all 1000
    .venv/bin/python benchmarks/decode_speed.py --checkpoint runs/de_en/checkpoints/step-00001000 \\
        --limit 100 --rounds 1 --threads 1 --results /tmp/decode_speed.json

Three systems decode the same test sentences in one process, with the same weights (fp32, CPU):

* **aiayn**: ``Translator(model, tokenizer, beam=B, alpha=...)``, key/value cache, batches of at most
  ``--batch-tokens`` padded source tokens, sentences sorted by length (its defaults).
* **transformers**: ``MarianMTModel`` with aiayn's weights (``hf_marian.to_marian``), ``generate()``
  with ``use_cache=True``, ``do_sample=False``, ``num_beams`` 1 or B, PAD and BOS suppressed
  (``suppress_tokens``), ``length_penalty=alpha``, ``early_stopping=False``.
* **ctranslate2**: the model exported by ``aiayn.export.export_ctranslate2`` (what ``aiayn export
  --format ctranslate2`` runs) to a temporary directory, ``compute_type="float32"``,
  ``intra_threads=--threads``, ``translate_batch(beam_size=1 or B, length_penalty=alpha,
  suppress_sequences=aiayn.export.SUPPRESS)``.

Fairness: the peers get exactly aiayn's batches (the same sentences together, in the same order) and
each batch the same length limit: aiayn allows ``floor(max_len_a * S + max_len_b)`` tokens before
EOS for a source of S tokens (EOS included), per sentence; the peers take one limit per batch, the
largest of the batch's, + 1 for the EOS (``max_new_tokens`` / ``max_decoding_length``; HF also
forces EOS at that last step, as aiayn does). Every timed run is text in, text out: tokenization
(``Translator.encode_source``), search, detokenization.

Checks before any timing, which stop the benchmark when they fail:

1. Teacher-forced logits of Marian equal aiayn's to ``--logits-tol`` on one padded batch (the first
   ``--logits-batch`` sentences of the first, longest, batch; small so that its (B, T, V) logits do
   not dominate the peak RSS), with aiayn's greedy outputs as targets; CTranslate2's per-token
   log-probs of the same targets
   (``score_batch``) are compared too (reported).
2. HF greedy token ids equal aiayn's for every sentence; sentences where aiayn stopped at its length
   limit and the peer (whose limit is the batch's) went on with the same prefix are counted apart;
   the benchmark fails when more than ``--max-differ`` (1%) of sentences differ for any reason. For the
   first differences, the aiayn log-prob gap between the two tokens at the first differing position
   is reported (a gap ~1e-6 is a float tie, not a mapping bug). CTranslate2's greedy agreement is
   reported the same way (a warning above 1%). Beam outputs are only counted: see caveats.

The process runs under :func:`aiayn.malloc.keep_freed_memory` (freed blocks stay in glibc's heap),
as the ``aiayn`` command does; it applies to all three systems (``AIAYN_MALLOC=default`` to compare).

Timing: one untimed warm-up run per system and search (the checks), then ``--rounds`` rounds; in each,
every search runs every system once, the system order rotating each round. Figures are medians:
target tokens/s, counting per sentence the output tokens + 1 (the EOS step; the same count for every
system, from its own outputs), and sentences/s. Ratios are aiayn / peer of the median sentences/s
(= peer time / aiayn time) and the median of the per-round ratios. Peak RSS is of the whole process
(all three models are loaded in it), snapshotted after each setup stage and at the end.

Caveats: beam outputs of the peers need not equal aiayn's. aiayn scores a hypothesis with GNMT's
``log P / ((5 + |Y|) / 6) ** alpha``; transformers and CTranslate2 divide by ``|Y| ** alpha``, and
their stopping rules differ (HF ``early_stopping=False`` is aiayn's heuristic; CTranslate2 stops once
``beam`` hypotheses have finished, patience 1). With ``--alpha 0`` HF's beam search should equal
aiayn's.

On a GPU (``--device cuda``): aiayn's model and Marian on the GPU (Marian is built from aiayn's
weights on the CPU, then moved), ``torch.cuda.synchronize()`` around every timed run, CTranslate2 with
``device="cuda"``, the same fp32 weights and checks. CTranslate2 is optional: when it cannot be
imported, or cannot translate on the device (its pip wheels load CUDA 12's ``libcublas.so.12``, which
a CUDA 13 machine may lack: tried first in a child process, which can fail without ending this one),
the results say why (``"ctranslate2": {"skipped": ...}``) and the other two systems are timed.
``--on-check-failure warn`` records failed checks in the results instead of stopping.

``--precision fp16|bf16`` puts all three systems in that type (aiayn's and Marian's weights, CTranslate2's
``compute_type``), the logits check's tolerance multiplied by 100 (fp16) or 1,000 (bf16).

Writes ``benchmarks/results/decode_speed.json`` (``--results``; ``decode_speed_gpu.json`` with
``--device cuda``): command, versions, machine, settings, the checks, figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import sacrebleu
import torch
import transformers
from transformers import GenerationConfig

from aiayn.data.batching import pad
from aiayn.data.corpus import read_parallel
from aiayn.decode.search import DecodeOptions, generate
from aiayn.decode.step import max_output_lengths
from aiayn.decode.translator import Translator
from aiayn.export import PAD_PIECE, SUPPRESS, export_ctranslate2
from aiayn.loading import load_translation_model
from aiayn.malloc import keep_freed_memory
from common import command, gpu, machine, peak_rss_mib, versions
from hf_marian import check_positions, to_marian

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("aiayn", "transformers", "ctranslate2")
PEERS = SYSTEMS[1:]
CPU = torch.device("cpu")
#: --precision: torch's dtype and CTranslate2's compute type, and the logits check's tolerance factor
PRECISIONS = {
    "fp32": (torch.float32, "float32", 1.0),
    "fp16": (torch.float16, "float16", 100.0),
    "bf16": (torch.bfloat16, "bfloat16", 1000.0),
}
# A child process translates one sentence with CTranslate2 on the device before this one relies on it.
CT2_PROBE = """
import sys, ctranslate2
model, device = sys.argv[1], sys.argv[2]
if device == "cuda" and ctranslate2.get_cuda_device_count() == 0:
    sys.exit("ctranslate2.get_cuda_device_count() == 0: this ctranslate2 sees no CUDA device")
translator = ctranslate2.Translator(model, device=device, compute_type="float32")
translator.translate_batch([["\u2581a"]], max_decoding_length=3)
print("ctranslate2 translates on", device)
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkpoint",
        default=str(ROOT / "runs" / "multi30k_en_de" / "averaged"),
        help="checkpoint or run directory (default runs/multi30k_en_de/averaged)",
    )
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--split", default="test2016")
    parser.add_argument("--src", help="source language (default: the checkpoint's run config)")
    parser.add_argument("--tgt", help="target language (default: the checkpoint's run config)")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (default: all)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds")
    parser.add_argument(
        "--threads", type=int, default=2, help="torch.set_num_threads and CTranslate2 intra_threads"
    )
    parser.add_argument("--beam", type=int, default=4, help="beam size of the beam-search runs")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty (aiayn: GNMT's)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="padded source tokens per batch")
    parser.add_argument("--logits-tol", type=float, default=1e-4, help="max |logit difference| aiayn vs HF")
    parser.add_argument(
        "--logits-batch", type=int, default=16, help="sentences in the teacher-forced logits check"
    )
    parser.add_argument(
        "--max-differ", type=float, default=0.01, help="fail above this fraction of greedy differences"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--precision",
        choices=tuple(PRECISIONS),
        default="fp32",
        help="the weights' and arithmetic's type of all three systems (fp16/bf16: on a GPU, or bf16 on a "
        "CPU that has it natively); the logits check's tolerance grows with it",
    )
    parser.add_argument(
        "--on-check-failure",
        choices=("exit", "warn"),
        default="exit",
        help="exit: a failed check stops the benchmark; warn: it is recorded and the timing goes on",
    )
    parser.add_argument(
        "--results", help="default benchmarks/results/decode_speed.json (_gpu.json with --device cuda)"
    )
    args = parser.parse_args()
    if args.results is None:
        name = "decode_speed_gpu.json" if args.device == "cuda" else "decode_speed.json"
        args.results = str(ROOT / "benchmarks" / "results" / name)
    return args


def on_gpu(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA device (one place to ask, for the GPU-only steps)."""
    return device.type == "cuda"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU): before every clock reading."""
    if on_gpu(device):
        torch.cuda.synchronize(device)


def import_ctranslate2():
    """The ctranslate2 module, or the reason it cannot be imported (a string)."""
    try:
        import ctranslate2
    except Exception as error:  # noqa: BLE001 - ImportError, or a broken native library
        return f"import ctranslate2 failed: {error!r}"
    return ctranslate2


def probe_ctranslate2(model_dir: Path, device: torch.device) -> tuple[str | None, dict]:
    """(None, notes) when CTranslate2 translates a sentence on ``device`` in a child process, else
    (why not: its exit status and the end of its output, notes).

    Where ``AIAYN_CT2_CUBLAS_SHIM`` names a folder on ``LD_LIBRARY_PATH`` that holds links named
    ``libcublas.so.12`` to CUDA 13's libraries (``benchmarks/gpu_run.sh`` makes it where no
    ``libcublas.so.12`` exists), the notes say how the probe went without it and with it; this process
    was started with it, so it uses it when the probe with it succeeds.
    """
    notes: dict = {}
    shim = os.environ.get("AIAYN_CT2_CUBLAS_SHIM")
    if shim:
        paths = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d and d != shim]
        notes["cublas_shim"] = shim
        notes["without_shim"] = _probe(model_dir, device, {**os.environ, "LD_LIBRARY_PATH": ":".join(paths)})
    reason = _probe(model_dir, device, None)
    if shim:
        notes["with_shim"] = reason or "ok"
        notes["without_shim"] = notes["without_shim"] or "ok"
    return reason, notes


def _probe(model_dir: Path, device: torch.device, env: dict | None) -> str | None:
    try:
        child = subprocess.run(
            [sys.executable, "-c", CT2_PROBE, str(model_dir), device.type],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return "the CTranslate2 probe ran past 120 s"
    if child.returncode == 0:
        return None
    return f"exit status {child.returncode}: " + (child.stderr + child.stdout).strip()[-1500:]


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    malloc_kept = keep_freed_memory()  # as the aiayn command does; process-wide, so for all three systems
    if not on_gpu(device):
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    model, tokenizer, ckpt = load_translation_model(args.checkpoint)  # on the CPU: Marian is built there
    src, tgt = languages(args, ckpt.config)
    lines, refs = read_split(Path(args.data_dir), args.split, src, tgt, args.limit)
    searches = {"greedy": 1, f"beam{args.beam}": args.beam}
    options = {name: DecodeOptions(beam=beam, alpha=args.alpha) for name, beam in searches.items()}
    rss = {"after_loading_aiayn": peak_rss_mib()}
    dtype, compute_type, tolerance = PRECISIONS[args.precision]
    args.logits_tol *= tolerance
    marian = to_marian(model).to(device, dtype)  # from aiayn's weights while both are on the CPU
    aiayn = Aiayn(model.to(dtype), tokenizer, options, args.batch_tokens, device)
    batches, limits = aiayn.plan(lines)
    log(
        f"{ckpt.path}: {src}->{tgt}, {len(lines)} sentences of {args.split} in {len(batches)} batches, "
        f"{'device ' + str(device) if on_gpu(device) else str(args.threads) + ' thread(s)'}"
    )
    peers = {"transformers": HuggingFace(marian, tokenizer, aiayn, batches, limits, options)}
    rss["after_building_marian"] = peak_rss_mib()
    ctranslate2 = import_ctranslate2()
    ct2_status: dict = {}
    with tempfile.TemporaryDirectory(prefix="aiayn-ct2-") as tmp:  # kept while CTranslate2 runs
        if isinstance(ctranslate2, str):
            ct2_status["skipped"] = ctranslate2
        else:
            ct2_status["version"] = ctranslate2.__version__
            try:
                export_ctranslate2(ckpt.path, Path(tmp) / "model")
                reason, notes = (
                    probe_ctranslate2(Path(tmp) / "model", device) if on_gpu(device) else (None, {})
                )
                ct2_status.update(notes)
                if reason is None:
                    peers["ctranslate2"] = CTranslate2(
                        ctranslate2,
                        Path(tmp) / "model",
                        tokenizer,
                        aiayn,
                        batches,
                        limits,
                        options,
                        args.threads,
                        device,
                        compute_type,
                    )
                else:
                    ct2_status["skipped"] = reason
            except Exception as error:  # noqa: BLE001 - recorded; the other systems are timed
                ct2_status["skipped"] = repr(error)
            rss["after_loading_ctranslate2"] = peak_rss_mib()
        if "skipped" in ct2_status:
            log(f"CTranslate2 skipped: {ct2_status['skipped']}")
        if os.environ.get("LD_LIBRARY_PATH"):
            ct2_status["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
        systems = {"aiayn": aiayn, **peers}
        outputs = warm_up_and_check(systems, lines, batches, limits, searches, args, rss)
        rss["after_checks"] = peak_rss_mib()
        seconds, texts = time_rounds(systems, lines, searches, args.rounds, device)
        rss["at_end"] = peak_rss_mib()
    figures = summarise(seconds, outputs["ids"], texts, refs, len(lines))
    card = gpu(device) if on_gpu(device) else None
    results = {
        "benchmark": "decode_speed",
        "command": command(),
        "versions": versions(
            transformers=transformers.__version__,
            ctranslate2=ct2_status.get("version"),
            sacrebleu=sacrebleu.__version__,
        ),
        "machine": {**machine(), **({"gpu": card} if card is not None else {})},
        "settings": settings(args, ckpt, src, tgt, lines, batches, options, peers),
        "checks": outputs["checks"],
        "figures": figures,
        "peak_rss_mib": rss,
        "malloc_kept": malloc_kept,
    }
    if "ctranslate2" not in peers or on_gpu(device):  # why it did not run; on a GPU, how it was loaded
        results["ctranslate2"] = ct2_status
    if on_gpu(device):
        results["cuda_peak_allocated_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    path = Path(args.results)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print_table(figures, rss)
    log(f"wrote {path}")


# ----------------------------------------------------------------------------- data


def languages(args: argparse.Namespace, config: dict) -> tuple[str, str]:
    data = config.get("run", {}).get("data", {})
    src, tgt = args.src or data.get("src_lang"), args.tgt or data.get("tgt_lang")
    if not src or not tgt:
        sys.exit("decode_speed: the checkpoint names no languages; pass --src and --tgt")
    return src, tgt


def read_split(data: Path, split: str, src: str, tgt: str, limit: int) -> tuple[list[str], list[str]]:
    pairs, _ = read_parallel(data, split, src, tgt)  # stripped lines, checked UTF-8 and line counts
    pairs = pairs[:limit] if limit > 0 else pairs
    return [s for s, _ in pairs], [t for _, t in pairs]


# ----------------------------------------------------------------------------- systems


class Aiayn:
    """aiayn's ``Translator`` (timed) and, for the checks, its token ids (same batches, untimed)."""

    def __init__(
        self,
        model,
        tokenizer,
        options: dict[str, DecodeOptions],
        batch_tokens: int,
        device: torch.device = CPU,
    ) -> None:
        self.model, self.tokenizer, self.device = model.to(device), tokenizer, device
        self.translators = {
            name: Translator(model, tokenizer, device, batch_tokens=batch_tokens, options=o)
            for name, o in options.items()
        }
        self.first = next(iter(self.translators.values()))

    def pad(self, rows: list[list[int]]) -> torch.Tensor:
        """Right-padded ``(B, S)`` ids on the Translator's device, as it feeds ``generate``."""
        return pad(rows, self.model.config.pad_id).to(self.first.device)

    def encode(self, line: str) -> list[int]:
        """``encode(text) + [EOS]``, truncated to ``max_len``: what the Translator feeds the encoder."""
        return self.first.encode_source(line)

    def plan(self, lines: list[str]) -> tuple[list[list[int]], list[int]]:
        """The Translator's batches (sentence indices, longest first) and each sentence's length limit."""
        sources = {i: self.encode(line) for i, line in enumerate(lines) if line.strip()}
        batches = self.first.batches(sources)  # the very grouping translate() uses
        lengths = torch.tensor([len(sources.get(i, [])) for i in range(len(lines))])
        o = self.first.options
        return batches, max_output_lengths(lengths, o.max_len_a, o.max_len_b, self.model.config.max_len)

    def translate(self, lines: list[str], search: str) -> tuple[list[str], None]:
        return [t.text for t in self.translators[search].translate(lines)], None

    def token_ids(self, lines: list[str], search: str, batches: list[list[int]]) -> list[list[int]]:
        """The best hypothesis' tokens (no BOS/EOS) per sentence, through ``generate`` with the options
        ``Translator.translate`` (the timed call) uses: one hypothesis, no scores."""
        translator = self.translators[search]
        options = replace(translator.options, nbest=1, scores=False)
        out: list[list[int]] = [[] for _ in lines]
        for batch in batches:
            src = self.pad([self.encode(lines[i]) for i in batch])
            for i, hypotheses in zip(batch, generate(self.model, src, options)):
                out[i] = hypotheses[0].tokens
        return out


class HuggingFace:
    """``MarianMTModel.generate`` over aiayn's batches."""

    def __init__(
        self, hf, tokenizer, aiayn: Aiayn, batches, limits, options: dict[str, DecodeOptions]
    ) -> None:
        self.model, self.tokenizer, self.aiayn, self.batches = hf, tokenizer, aiayn, batches
        c = aiayn.model.config
        self.pad, self.eos = c.pad_id, c.eos_id
        self.configs = {
            name: [self.generation_config(max(limits[i] for i in b) + 1, o, c) for b in batches]
            for name, o in options.items()
        }

    @staticmethod
    def generation_config(max_new_tokens: int, options: DecodeOptions, c) -> GenerationConfig:
        beam = (
            dict(num_beams=options.beam, length_penalty=options.alpha, early_stopping=False)
            if options.beam > 1
            else dict(num_beams=1)
        )
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            use_cache=True,
            num_return_sequences=1,
            pad_token_id=c.pad_id,
            eos_token_id=c.eos_id,
            bos_token_id=c.bos_id,
            decoder_start_token_id=c.bos_id,
            forced_eos_token_id=c.eos_id,
            suppress_tokens=[c.pad_id, c.bos_id],
            **beam,
        )

    def translate(self, lines: list[str], search: str) -> tuple[list[str], list[list[int]]]:
        out: list[list[int]] = [[] for _ in lines]
        for batch, config in zip(self.batches, self.configs[search]):
            sources = [self.aiayn.encode(lines[i]) for i in batch]
            width = max(len(s) for s in sources)
            src = torch.tensor([s + [self.pad] * (width - len(s)) for s in sources], device=self.aiayn.device)
            with torch.inference_mode():
                sequences = self.model.generate(
                    input_ids=src, attention_mask=(src != self.pad).long(), generation_config=config
                )
            for i, row in zip(batch, sequences.tolist()):
                out[i] = self.strip(row)
        return [self.tokenizer.decode(ids) for ids in out], out

    def strip(self, row: list[int]) -> list[int]:
        """Drop the decoder start, cut at the first EOS (padding follows it)."""
        tokens = row[1:]
        return (
            tokens[: tokens.index(self.eos)] if self.eos in tokens else [t for t in tokens if t != self.pad]
        )


class CTranslate2:
    """``ctranslate2.Translator.translate_batch`` over aiayn's batches (pieces in, pieces out)."""

    def __init__(
        self,
        ctranslate2,
        directory: Path,
        tokenizer,
        aiayn: Aiayn,
        batches,
        limits,
        options,
        threads: int,
        device: torch.device = CPU,
        compute_type: str = "float32",
    ) -> None:
        self.translator = ctranslate2.Translator(
            str(directory), device=device.type, compute_type=compute_type, intra_threads=threads
        )
        self.tokenizer, self.aiayn, self.batches, self.options = tokenizer, aiayn, batches, options
        c = aiayn.model.config
        self.pieces = [
            PAD_PIECE if i == c.pad_id else tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)
        ]
        self.ids = {piece: i for i, piece in enumerate(self.pieces)}
        self.max_lengths = [max(limits[i] for i in b) + 1 for b in batches]

    def source_pieces(self, line: str) -> list[str]:
        """aiayn's source ids without the EOS (CTranslate2 appends ``</s>`` itself), as pieces."""
        return [self.pieces[t] for t in self.aiayn.encode(line)[:-1]]

    def translate(self, lines: list[str], search: str) -> tuple[list[str], list[list[int]]]:
        o = self.options[search]
        out: list[list[int]] = [[] for _ in lines]
        for batch, max_length in zip(self.batches, self.max_lengths):
            results = self.translator.translate_batch(
                [self.source_pieces(lines[i]) for i in batch],
                beam_size=o.beam,
                length_penalty=o.alpha,
                max_decoding_length=max_length,
                max_input_length=0,
                suppress_sequences=SUPPRESS,
            )
            for i, result in zip(batch, results):
                out[i] = [self.ids[p] for p in result.hypotheses[0]]
        return [self.tokenizer.decode(ids) for ids in out], out


# ----------------------------------------------------------------------------- checks


def warm_up_and_check(
    systems: dict, lines, batches, limits, searches: dict[str, int], args, rss: dict
) -> dict:
    """One untimed run of every system and search (peak RSS after each system's runs into ``rss``);
    the equality checks; exit on a failed HF check."""
    aiayn, peers = systems["aiayn"], [name for name in systems if name != "aiayn"]
    ids: dict = {search: {} for search in searches}
    for name in systems:
        for search in searches:
            ids[search][name] = (
                aiayn.token_ids(lines, search, batches)
                if name == "aiayn"
                else systems[name].translate(lines, search)[1]
            )
        rss[f"after_warmup_{name}"] = peak_rss_mib()
    first = batches[0][: args.logits_batch]
    checks = {"logits": logits_check(systems, lines, first, ids["greedy"]["aiayn"]), "outputs": {}}
    for search in searches:
        checks["outputs"][search] = {
            name: compare(
                ids[search]["aiayn"],
                ids[search][name],
                limits,
                diagnose=aiayn if search == "greedy" else None,
                lines=lines,
            )
            for name in peers
        }
    report_checks(checks)
    failures = []
    if checks["logits"]["transformers_max_abs_diff"] > args.logits_tol:
        failures.append(
            f"Marian logits differ from aiayn's by {checks['logits']['transformers_max_abs_diff']:.2e} "
            f"> {args.logits_tol:g}"
        )
    greedy = checks["outputs"]["greedy"]
    if greedy["transformers"]["fraction_differ"] > args.max_differ:
        failures.append(
            f"HF greedy outputs differ from aiayn's for {greedy['transformers']['fraction_differ']:.1%} "
            f"of sentences (> {args.max_differ:.0%})"
        )
    if "ctranslate2" in greedy and greedy["ctranslate2"]["fraction_differ"] > args.max_differ:
        log(f"WARNING: CTranslate2 greedy outputs differ for {greedy['ctranslate2']['fraction_differ']:.1%}")
    if failures and args.on_check_failure == "exit":
        sys.exit("decode_speed: check failed: " + "; ".join(failures))
    if failures:
        checks["failures"] = failures
        log("WARNING: check failed (--on-check-failure warn, timing goes on): " + "; ".join(failures))
    return {"ids": ids, "checks": checks}


def logits_check(systems: dict, lines, batch: list[int], greedy: list[list[int]]) -> dict:
    """Teacher-forced on one batch (targets: aiayn's greedy outputs + EOS): Marian's logits and
    CTranslate2's per-token log-probs (``score_batch``, EOS included) against aiayn's."""
    aiayn, hf, ct2 = systems["aiayn"], systems["transformers"], systems.get("ctranslate2")
    c = aiayn.model.config
    src = aiayn.pad([aiayn.encode(lines[i]) for i in batch])
    targets = [greedy[i] + [c.eos_id] for i in batch]
    tgt_in = aiayn.pad([[c.bos_id] + t[:-1] for t in targets])  # (B, T)
    real = tgt_in != c.pad_id  # right-padded: row r's first len(targets[r]) positions
    with torch.inference_mode():
        ours = aiayn.model(src, tgt_in)[real].float()  # (N, V), real positions only
        theirs = (
            hf.model(
                input_ids=src,
                attention_mask=(src != c.pad_id).long(),
                decoder_input_ids=tgt_in,
                decoder_attention_mask=real.long(),
            )
            .logits[real]
            .float()
        )
        logits_diff, logits_max = float((ours - theirs).abs().max()), float(ours.abs().max())
        chosen = ours.log_softmax(-1).gather(
            -1, torch.tensor([t for ts in targets for t in ts], device=ours.device)[:, None]
        )[:, 0]
    check_positions(hf.model, aiayn.model)  # still aiayn's table after generate()
    result = {
        "sentences": len(batch),
        "target_positions": int(real.sum()),
        "transformers_max_abs_diff": logits_diff,
        "max_abs_logit": logits_max,
    }
    if ct2 is None:
        return result
    scored = ct2.translator.score_batch(
        [ct2.source_pieces(lines[i]) for i in batch],
        [[ct2.pieces[t] for t in target[:-1]] for target in targets],
        max_input_length=0,
    )
    theirs_lp = torch.tensor([lp for target, r in zip(targets, scored) for lp in r.log_probs[: len(target)]])
    if theirs_lp.numel() != chosen.numel():
        sys.exit(
            f"decode_speed: CTranslate2 scored {theirs_lp.numel()} target positions, aiayn {chosen.numel()}"
        )
    return {**result, "ctranslate2_logprob_max_abs_diff": float((chosen.cpu() - theirs_lp).abs().max())}


def compare(
    reference: list[list[int]],
    other: list[list[int]],
    limits: list[int],
    diagnose: Aiayn | None,
    lines: list[str],
    show: int = 5,
) -> dict:
    """Count equal outputs; aiayn hitting its own (per-sentence) length limit is counted apart."""
    equal, at_limit, differ = 0, [], []
    for i, (a, b) in enumerate(zip(reference, other)):
        if a == b:
            equal += 1
        elif len(a) >= limits[i] and b[: len(a)] == a:
            at_limit.append(i)
        else:
            differ.append(i)
    n = len(reference)
    out = {
        "sentences": n,
        "equal": equal,
        "differ_past_aiayn_length_limit": len(at_limit),
        "differ": len(differ),
        "fraction_differ": (len(at_limit) + len(differ)) / max(n, 1),
    }
    if diagnose is not None:
        out["first_differences"] = [
            divergence(diagnose, lines[i], reference[i], other[i], i) for i in differ[:show]
        ]
    return out


def divergence(aiayn: Aiayn, line: str, ours: list[int], theirs: list[int], index: int) -> dict:
    """Where two greedy outputs first part, and aiayn's log-prob gap between the two choices there."""
    eos = aiayn.model.config.eos_id
    a, b = ours + [eos], theirs + [eos]
    k = next(j for j in range(min(len(a), len(b))) if a[j] != b[j])
    src = torch.tensor([aiayn.encode(line)], device=aiayn.device)
    prefix = torch.tensor([[aiayn.model.config.bos_id] + a[:k]], device=aiayn.device)
    with torch.inference_mode():
        log_probs = aiayn.model(src, prefix)[0, -1].float().log_softmax(-1)
    return {
        "sentence": index,
        "position": k,
        "aiayn_token": a[k],
        "peer_token": b[k],
        "aiayn_logprob_gap": float(log_probs[a[k]] - log_probs[b[k]]),
    }


def report_checks(checks: dict) -> None:
    lg = checks["logits"]
    ct2 = lg.get("ctranslate2_logprob_max_abs_diff")
    log(
        f"teacher-forced on {lg['sentences']} sentences ({lg['target_positions']} positions): Marian "
        "logits max "
        f"|diff| {lg['transformers_max_abs_diff']:.2e} (max |logit| {lg['max_abs_logit']:.1f}); CTranslate2 "
        + (f"log-probs max |diff| {ct2:.2e}" if ct2 is not None else "not run")
    )
    for search, per_peer in checks["outputs"].items():
        for name, c in per_peer.items():
            log(
                f"{search} {name}: {c['equal']}/{c['sentences']} equal to aiayn's, "
                f"{c['differ_past_aiayn_length_limit']} differ only past aiayn's length limit, "
                f"{c['differ']} differ"
            )
            for d in c.get("first_differences", []):
                log(
                    f"  sentence {d['sentence']}: position {d['position']}, aiayn {d['aiayn_token']} vs "
                    f"{d['peer_token']}, aiayn log-prob gap {d['aiayn_logprob_gap']:.2e}"
                )


# ----------------------------------------------------------------------------- timing


def time_rounds(
    systems: dict, lines, searches: dict[str, int], rounds: int, device: torch.device = CPU
) -> tuple[dict, dict]:
    """Seconds per (search, system) and round; the texts of each system's first timed run."""
    seconds = {search: {name: [] for name in systems} for search in searches}
    texts: dict = {search: {} for search in searches}
    names = list(systems)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for search in searches:
            for name in order:
                synchronize(device)
                started = time.perf_counter()
                out, _ = systems[name].translate(lines, search)
                synchronize(device)
                seconds[search][name].append(time.perf_counter() - started)
                texts[search].setdefault(name, out)
            log(
                f"round {r + 1}/{rounds} {search}: "
                + "  ".join(f"{n} {len(lines) / s[-1]:.1f} sent/s" for n, s in seconds[search].items())
            )
    return seconds, texts


def summarise(seconds: dict, ids: dict, texts: dict, refs: list[str], n: int) -> dict:
    figures = {}
    for search, per_system in seconds.items():
        rows = {}
        for name, times in per_system.items():
            tokens = sum(len(t) + 1 for t in ids[search][name])  # output tokens + the EOS step
            rows[name] = {
                "seconds": times,
                "median_seconds": statistics.median(times),
                "target_tokens": tokens,
                "target_tokens_per_s": tokens / statistics.median(times),
                "sentences_per_s": n / statistics.median(times),
                "bleu": sacrebleu.corpus_bleu(texts[search][name], [refs]).score,
            }
        for peer in [name for name in per_system if name != "aiayn"]:
            rows[f"ratio_aiayn_over_{peer}"] = (
                rows["aiayn"]["sentences_per_s"] / rows[peer]["sentences_per_s"]
            )
            rows[f"paired_ratio_aiayn_over_{peer}"] = statistics.median(
                p / a for a, p in zip(per_system["aiayn"], per_system[peer])
            )
        figures[search] = rows
    return figures


def settings(args, ckpt, src: str, tgt: str, lines, batches, options, peers) -> dict:
    hf = peers["transformers"].model
    out = {
        "checkpoint": str(ckpt.path),
        "model": ckpt.config["model"],
        "split": args.split,
        "src": src,
        "tgt": tgt,
        "sentences": len(lines),
        "batches": len(batches),
        "batch_sizes": [len(b) for b in batches],
        "batch_tokens": args.batch_tokens,
        "threads": args.threads,
        "rounds": args.rounds,
        "precision": args.precision,
        "aiayn_options": {name: asdict(o) for name, o in options.items()},
        "aiayn_timed": "Translator.translate: text only, so scores=False (greedy skips the log-softmax)",
        "transformers": {
            "attn_implementation": hf.config._attn_implementation,
            "generate": "num_beams 1|B, do_sample False, use_cache True, length_penalty alpha, "
            "early_stopping False, suppress_tokens [PAD, BOS], forced_eos_token_id EOS, "
            "max_new_tokens = batch's largest aiayn limit + 1",
        },
        "ctranslate2": {
            **({"device": args.device} if args.device != "cpu" else {}),
            "compute_type": PRECISIONS[args.precision][1],
            "intra_threads": args.threads,
            "translate_batch": "beam_size 1|B, length_penalty alpha, suppress_sequences "
            f"{SUPPRESS}, max_decoding_length = batch's largest aiayn limit + 1, "
            "one call per aiayn batch",
        },
        "tokens_counted": "output tokens + 1 (the EOS step) per sentence, from each system's own outputs",
    }
    if args.device != "cpu":
        out["device"] = args.device
        out["on_check_failure"] = args.on_check_failure
    return out


def print_table(figures: dict, rss: dict) -> None:
    print(
        f"\n{'search':<8}{'system':<14}{'tok/s':>10}{'sent/s':>10}{'BLEU':>7}{'aiayn/peer':>12}{'paired':>8}"
    )
    for search, rows in figures.items():
        for name in [name for name in SYSTEMS if name in rows]:
            row = rows[name]
            ratio = (
                f"{rows[f'ratio_aiayn_over_{name}']:>12.2f}{rows[f'paired_ratio_aiayn_over_{name}']:>8.2f}"
                if name in PEERS
                else ""
            )
            print(
                f"{search:<8}{name:<14}{row['target_tokens_per_s']:>10,.0f}{row['sentences_per_s']:>10.1f}"
                f"{row['bleu']:>7.2f}{ratio}"
            )
    print(
        "(medians; tokens = output tokens + EOS step; aiayn/peer = ratio of median sentences/s, paired "
        "= median "
        "of per-round ratios)"
    )
    print("peak RSS MiB (whole process): " + ", ".join(f"{k} {v:,.0f}" for k, v in rss.items()))


def log(message: str) -> None:
    print(f"[decode_speed {time.strftime('%H:%M:%S')}] {message}", flush=True)


if __name__ == "__main__":
    main()
