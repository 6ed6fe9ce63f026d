"""Peak memory of ``aiayn import marian`` at opus-mt's size: this tree against a git revision.

    python benchmarks/marian_import_memory.py --rev 4b24177 --rounds 3

Builds MarianMT directories offline (transformers' ``MarianMTModel`` of opus-mt-de-en's shape:
d_model 512, 6+6 layers, 8 heads, FFN 2048, swish, ``--vocab`` pieces; random weights, seeded; saved
with ``save_pretrained``; SentencePiece models trained on a few synthetic lines, the vocabulary
filled up to its size with pieces they never produce):

* ``joint``: one vocabulary, shared and tied embeddings, ``model.safetensors``;
* ``joint-bin``: the same weights as ``pytorch_model.bin`` (``torch.save``);
* ``separate``: a source and a target vocabulary of ``--vocab`` pieces each (``target_vocab.json``,
  ``separate_vocabs``), untied source embeddings, ``model.safetensors``.

Each import runs in a child process (``python -m aiayn import marian``, this tree's code or, with
``--rev``, the revision's ``src/`` extracted with ``git archive``); its peak resident set comes from
``os.wait4`` (``ru_maxrss``). The child's baseline is the same command on a directory that does not
exist (Python, torch and aiayn imported, then a one-line error). Rounds alternate the order of the
two codes. Prints and records the medians: peak, baseline, what the import added (peak - baseline)
and that over the weights file's size; the weights both codes wrote are compared tensor by tensor.
Writes ``--results`` (JSON: command, versions, machine).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import sentencepiece as spm
import torch

from common import command, machine, versions

ROOT = Path(__file__).resolve().parents[1]
WORDS = "der die das mann frau hund katze kind läuft spielt sitzt auf im park straße grün rot groß".split()
LAYOUTS = ("joint", "joint-bin", "separate")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", help="git revision to compare against (its src/); none: this tree only")
    parser.add_argument("--vocab", type=int, default=58101, help="pieces per vocabulary (opus-mt-de-en's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument(
        "--results", default=str(ROOT / "benchmarks" / "results" / "marian_import_memory.json")
    )
    return parser.parse_args()


def spm_model(seed: int) -> bytes:
    import random

    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(300)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=60,
        model_type="unigram",
        num_threads=1,
        minloglevel=2,
        hard_vocab_limit=False,
    )
    return model.getvalue()


def vocabulary(proto: bytes, size: int, tag: str) -> dict[str, int]:
    """Marian's layout: </s> 0, <unk> 1, the model's pieces, filler pieces, <pad> last."""
    sp = spm.SentencePieceProcessor(model_proto=proto)
    pieces = ["</s>", "<unk>"]
    pieces += [
        sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))
    ]
    pieces += [f"▁{tag}{i}" for i in range(size - 1 - len(pieces))] + ["<pad>"]
    return {p: i for i, p in enumerate(pieces)}


def marian_dir(out: Path, layout: str, v: int) -> Path:
    from transformers import MarianConfig, MarianMTModel

    out.mkdir(parents=True)
    separate = layout == "separate"
    protos = {"source.spm": spm_model(1), "target.spm": spm_model(2)}
    for name, proto in protos.items():
        (out / name).write_bytes(proto)
    vocabs = {"vocab.json": vocabulary(protos["source.spm"], v, "src")}
    if separate:
        vocabs["target_vocab.json"] = vocabulary(protos["target.spm"], v, "tgt")
    for name, vocab in vocabs.items():
        (out / name).write_text(json.dumps(vocab, ensure_ascii=False))
    config = MarianConfig(
        vocab_size=v, decoder_vocab_size=v, d_model=512, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
        activation_function="swish", max_position_embeddings=512, scale_embedding=True,
        pad_token_id=v - 1, eos_token_id=0, decoder_start_token_id=v - 1, forced_eos_token_id=0,
        share_encoder_decoder_embeddings=not separate, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    model.save_pretrained(out)
    if layout == "joint-bin":
        from safetensors.torch import load_file

        torch.save(load_file(out / "model.safetensors"), out / "pytorch_model.bin")
        (out / "model.safetensors").unlink()
    tokenizer = {"source_lang": "de", "target_lang": "en", "separate_vocabs": separate}
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return out


def source_tree(rev: str, work: Path) -> Path:
    """The revision's ``src/`` extracted into ``work``."""
    archive = subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(work, filter="data")
    return work / "src"


#: Runs the command it is given and prints its peak RSS (``ru_maxrss`` from ``os.wait4``), the
#: peaks of its private and file-backed memory (``RssAnon``, ``RssFile``, polled every 10 ms), its
#: seconds and exit status as JSON. A launcher this small forks the command: a child's ``ru_maxrss``
#: starts at its parent's resident set at the fork, which the benchmark's own (transformers, the
#: models it built) would exceed.
LAUNCHER = """
import json, os, subprocess, sys, time
start, peaks = time.perf_counter(), {"RssAnon": 0, "RssFile": 0}
process = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
while not (ended := os.wait4(process.pid, os.WNOHANG))[0]:
    try:
        lines = open(f"/proc/{process.pid}/status").read().splitlines()
    except OSError:
        lines = []
    for key, _, value in (line.partition(":") for line in lines):
        if key in peaks:
            peaks[key] = max(peaks[key], int(value.split()[0]))
    time.sleep(0.01)
_, status, usage = ended
process.returncode = os.waitstatus_to_exitcode(status)
print(json.dumps({"maxrss_kib": usage.ru_maxrss, "peaks_kib": peaks,
                  "seconds": time.perf_counter() - start, "exit": process.returncode}))
"""


def child(src: Path, args: list[str]) -> dict:
    """``python -m aiayn ARGS`` with ``src`` first on the path, run by :data:`LAUNCHER`: its peak
    RSS, peak RssAnon and RssFile (MiB), seconds and exit status."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    launched = subprocess.run(
        [sys.executable, "-c", LAUNCHER, sys.executable, "-m", "aiayn", *args],
        env=env,
        capture_output=True,
        text=True,
    )
    run = json.loads(launched.stdout)
    if run["exit"] not in (0, 2):
        raise SystemExit(f"{args}: exit {run['exit']}: {launched.stderr[-2000:]}")
    return {
        "peak_mib": run["maxrss_kib"] / 1024,
        "anon_peak_mib": run["peaks_kib"]["RssAnon"] / 1024,
        "file_peak_mib": run["peaks_kib"]["RssFile"] / 1024,
        "seconds": run["seconds"],
        "exit": run["exit"],
        **({"error": launched.stderr.strip().splitlines()[-1]} if run["exit"] else {}),
    }


def measure(codes: dict[str, Path], sources: dict[str, Path], work: Path, rounds: int) -> dict:
    """Per code and layout: every round's import, with the baseline measured before it."""
    samples = {code: {layout: [] for layout in sources} for code in codes}
    for r in range(rounds):
        for code in list(codes) if r % 2 == 0 else list(codes)[::-1]:
            nowhere = ["import", "marian", str(work / "nowhere"), "--out", str(work / "x")]
            baseline = child(codes[code], nowhere)
            for layout, source in sources.items():
                out = work / "imports" / code / layout
                run = child(codes[code], ["import", "marian", str(source), "--out", str(out), "--force"])
                run["baseline_mib"], run["baseline_anon_mib"] = (
                    baseline["peak_mib"],
                    baseline["anon_peak_mib"],
                )
                samples[code][layout].append(run)
                print(
                    f"round {r + 1} {code:>10} {layout:>9}: peak {run['peak_mib']:6.0f} MiB "
                    f"(RssAnon {run['anon_peak_mib']:.0f}, RssFile {run['file_peak_mib']:.0f}; "
                    f"baseline {run['baseline_mib']:.0f}), {run['seconds']:.1f} s, exit {run['exit']}",
                    flush=True,
                )
    return samples


def summary(samples: dict, sources: dict[str, Path], work: Path) -> dict:
    """Medians per code and layout: what the import added over the baseline, against the weights file."""
    out = {}
    for code, layouts in samples.items():
        out[code] = {}
        for layout, runs in layouts.items():
            if any(run["exit"] for run in runs):
                out[code][layout] = {"refused": runs[0].get("error", "")}
                continue
            weights = next(f for f in sources[layout].iterdir() if f.name in WEIGHT_FILES)
            written = work / "imports" / code / layout / "model.safetensors"
            out[code][layout] = medians(runs, weights.stat().st_size / 2**20, written.stat().st_size / 2**20)
    return out


def medians(runs: list[dict], weights_mib: float, written_mib: float) -> dict:
    def median(key: str) -> float:
        return statistics.median(run[key] for run in runs)

    added, added_anon = (
        median("peak_mib") - median("baseline_mib"),
        median("anon_peak_mib") - median("baseline_anon_mib"),
    )
    return {
        "peak_mib": median("peak_mib"),
        "baseline_mib": median("baseline_mib"),
        "added_mib": added,
        "anon_peak_mib": median("anon_peak_mib"),
        "file_peak_mib": median("file_peak_mib"),
        "added_anon_mib": added_anon,
        "weights_file_mib": weights_mib,
        "checkpoint_weights_mib": written_mib,
        "added_over_weights": added / weights_mib,
        "added_anon_over_weights": added_anon / weights_mib,
        "seconds": median("seconds"),
        "samples": runs,
    }


def same_weights(work: Path, codes: list[str], layout: str) -> bool | None:
    """Whether the two codes wrote the same tensors for ``layout`` (None: one of them refused)."""
    from safetensors.torch import load_file

    files = [work / "imports" / code / layout / "model.safetensors" for code in codes]
    if len(files) < 2 or not all(f.is_file() for f in files):
        return None
    a, b = (load_file(f) for f in files)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main() -> None:
    args = parse_args()
    import transformers

    results = {
        "benchmark": "marian_import_memory",
        "command": command(),
        "versions": versions(transformers=transformers.__version__),
        "machine": machine(),
        "rev": args.rev,
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sources = {
            layout: marian_dir(work / "models" / layout, layout, args.vocab) for layout in args.layouts
        }
        codes = {"this tree": ROOT / "src"}
        if args.rev:
            codes = {args.rev: source_tree(args.rev, work / "rev"), **codes}
        samples = measure(codes, sources, work, args.rounds)
        results["layouts"] = summary(samples, sources, work)
        results["same_weights"] = {layout: same_weights(work, list(codes), layout) for layout in sources}
    report(results, args.rev)
    Path(args.results).write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.results}")


def report(results: dict, rev: str | None) -> None:
    for code, layouts in results["layouts"].items():
        for layout, row in layouts.items():
            if "refused" in row:
                print(f"{code:>10} {layout:>9}: refused ({row['refused']})")
                continue
            print(
                f"{code:>10} {layout:>9}: peak {row['peak_mib']:.0f} MiB "
                f"(baseline {row['baseline_mib']:.0f}): "
                f"+{row['added_mib']:.0f} = {row['added_over_weights']:.2f}x the weights file "
                f"({row['weights_file_mib']:.0f} MiB); RssAnon +{row['added_anon_mib']:.0f} = "
                f"{row['added_anon_over_weights']:.2f}x; {row['seconds']:.1f} s"
            )
    if rev:
        for layout, after in results["layouts"]["this tree"].items():
            before = results["layouts"][rev][layout]
            if "refused" not in before:
                ratio = after["added_mib"] / before["added_mib"]
                same = results["same_weights"][layout]
                print(f"{layout}: added memory after / before {ratio:.2f}, same weights: {same}")


if __name__ == "__main__":
    sys.exit(main())
