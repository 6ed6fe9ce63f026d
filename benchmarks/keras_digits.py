"""The demo's task trained with Keras: ``model.fit`` of ``aiayn.keras`` on the digits -> words task.

    KERAS_BACKEND=torch .venv/bin/python benchmarks/keras_digits.py

Writes the task as ``aiayn demo`` does (``aiayn.data.synthetic``, seed 0: 20,000 training numbers,
1,000 held-out test numbers), trains a SentencePiece tokenizer on the training split (vocabulary
bound 1,000, as the demo's config), builds the model of the demo's config (``configs/demo.yaml``:
the ``tiny`` preset, 2+2 layers, d_model 128, three-way tying) with ``aiayn.keras.build_model`` and
trains it with ``model.fit`` for the demo's steps and batch size, with the demo's schedule
(``NoamSchedule(peak_lr=optim.peak_lr, warmup=optim.warmup)``: fairseq's inverse-sqrt curve, Eq. 3
with its factor set by the peak), Adam (0.9, 0.98, 1e-9) and label smoothing 0.1. Then:

- greedy exact match on the 1,000 test numbers with ``aiayn.keras.translate`` (the target: >= 95%);
- the model saved with ``aiayn.keras.save``, translated by ``aiayn translate --beam 1`` (how many
  lines equal the Keras greedy output) and ``--beam 4`` (the demo's exact match);

and writes ``benchmarks/results/keras_digits.json`` (times, losses, figures, versions, machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from common import command, machine, peak_rss_mib, versions

os.environ.setdefault("KERAS_BACKEND", "torch")
import keras  # noqa: E402  (after the backend is chosen)

import aiayn.keras as ak  # noqa: E402
from aiayn.config import model_section_config, read_yaml  # noqa: E402
from aiayn.data.corpus import read_parallel  # noqa: E402
from aiayn.data.synthetic import SRC_LANG, TGT_LANG, write_task  # noqa: E402
from aiayn.data.tokenizer import Tokenizer  # noqa: E402
from aiayn.demo import demo_config_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/aiayn_keras_digits"))
    parser.add_argument("--steps", type=int, help="training steps (default: the demo config's)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "keras_digits.json")
    return parser.parse_args()


def translate_with_aiayn(checkpoint: Path, src_file: Path, beam: int) -> tuple[list[str], float]:
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "aiayn", "translate", "--checkpoint", str(checkpoint), "--beam", str(beam)]
        + ["--input", str(src_file)],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.splitlines(), time.perf_counter() - started


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    keras.utils.set_random_seed(args.seed)
    demo = read_yaml(demo_config_path())
    data, optim, train = demo["data"], demo["optim"], demo["train"]
    steps = args.steps or train["max_steps"]

    data_dir = args.work / "data"
    write_task(data_dir)
    train_pairs, _ = read_parallel(data_dir, "train", SRC_LANG, TGT_LANG)
    test_pairs, _ = read_parallel(data_dir, "test", SRC_LANG, TGT_LANG)
    tokenizer = Tokenizer.train(
        [side for pair in train_pairs for side in pair], vocab_size=data["vocab_size"]
    )
    examples = [(tokenizer.encode(s), tokenizer.encode(t)) for s, t in train_pairs]
    config = model_section_config(demo["model"], tokenizer.vocab_size)

    model = ak.build_model(config)
    schedule = ak.NoamSchedule(config.d_model, warmup=optim["warmup"], peak_lr=optim["peak_lr"])
    model.compile(
        optimizer=ak.paper_adam(schedule),
        loss=ak.LabelSmoothedCrossEntropy(optim["label_smoothing"], config.pad_id),
    )
    batches = ak.TranslationBatches(examples, batch_tokens=data["batch_tokens"], seed=args.seed)
    epochs = 20
    started = time.perf_counter()
    history = model.fit(batches, epochs=epochs, steps_per_epoch=steps // epochs, shuffle=False, verbose=2)
    fit_s = time.perf_counter() - started

    sources, references = [s for s, _ in test_pairs], [t for _, t in test_pairs]
    started = time.perf_counter()
    greedy = ak.translate(model, tokenizer, sources)
    decode_s = time.perf_counter() - started
    exact = sum(h == r for h, r in zip(greedy, references))
    print(f"keras greedy exact match: {exact}/{len(references)} in {decode_s:.1f} s")

    checkpoint = ak.save(model, args.work / "checkpoint", tokenizer)
    src_file = data_dir / f"test.{SRC_LANG}"
    aiayn_greedy, aiayn_greedy_s = translate_with_aiayn(checkpoint, src_file, beam=1)
    aiayn_beam, aiayn_beam_s = translate_with_aiayn(checkpoint, src_file, beam=4)
    same = sum(a == b for a, b in zip(aiayn_greedy, greedy))
    beam_exact = sum(h == r for h, r in zip(aiayn_beam, references))
    print(f"aiayn translate --beam 1 equal to the Keras greedy output: {same}/{len(greedy)} lines")
    print(f"aiayn translate --beam 4 exact match: {beam_exact}/{len(references)}")

    results = {
        "command": command(),
        "versions": versions(keras=keras.__version__, keras_backend=keras.backend.backend()),
        "machine": machine(),
        "settings": {
            "model": config.to_dict(),
            "steps": steps,
            "batch_tokens": data["batch_tokens"],
            "schedule": {"warmup": optim["warmup"], "peak_lr": optim["peak_lr"], "factor": schedule.factor},
            "label_smoothing": optim["label_smoothing"],
            "seed": args.seed,
            "threads": args.threads,
            "vocab_size": tokenizer.vocab_size,
            "parameters": ak.count_parameters(model),
        },
        "fit_seconds": round(fit_s, 1),
        "seconds_per_step": round(fit_s / steps, 4),
        "loss_per_epoch": [round(x, 4) for x in history.history["loss"]],
        "test_numbers": len(references),
        "keras_greedy_exact_match": exact,
        "keras_greedy_exact_match_share": exact / len(references),
        "keras_greedy_decode_seconds": round(decode_s, 1),
        "aiayn_translate_beam1_equal_lines": same,
        "aiayn_translate_beam1_seconds": round(aiayn_greedy_s, 1),
        "aiayn_translate_beam4_exact_match": beam_exact,
        "aiayn_translate_beam4_seconds": round(aiayn_beam_s, 1),
        "peak_rss_mib": round(peak_rss_mib(), 1),
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
