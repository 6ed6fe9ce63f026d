"""``aiayn demo``: the whole pipeline on the built-in task, in a few minutes on a CPU.

Writes the digits -> English words task, trains the Transformer on it with a progress bar (reusing
a finished run unless ``--retrain``), translates the held-out test split with beam search, prints
samples and the exact-match accuracy, and draws the attention and positional-encoding pictures.
"""

from __future__ import annotations

import argparse
import shutil
import time
from importlib import resources
from pathlib import Path

import torch

from aiayn.checkpoint import latest_checkpoint, load_checkpoint
from aiayn.config import add_training_flags, training_flags
from aiayn.data.corpus import read_parallel
from aiayn.data.synthetic import SRC_LANG, TGT_LANG, write_task
from aiayn.decode.search import DecodeOptions
from aiayn.decode.translator import Translator
from aiayn.device import apply_device_flags
from aiayn.errors import naming_flags
from aiayn.loading import load_translation_model
from aiayn.plots import draw_attention, plot_curves, plot_positional_encoding

N_SAMPLES = 8


def register(subparsers) -> None:
    demo = subparsers.add_parser("demo", help="train and evaluate on the built-in digits->words task")
    demo.add_argument(
        "--out", type=Path, default=Path("aiayn_demo"), help="working directory (default: ./aiayn_demo)"
    )
    demo.add_argument("--retrain", action="store_true", help="train again even if a finished run is there")
    add_training_flags(demo, budgets=("steps",))  # --set, --device, --threads, --max-steps: as every trainer
    demo.add_argument("--beam", type=int, default=4)
    demo.add_argument("--no-progress", action="store_true")
    demo.set_defaults(func=run_demo)


def demo_config_path() -> Path:
    return Path(str(resources.files("aiayn") / "resources" / "demo.yaml"))


@naming_flags({"run_dir": "--out"})  # the demo's run is OUT/run
def run_demo(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    DecodeOptions(beam=args.beam)  # a bad --beam fails now, not after minutes of training
    apply_device_flags(args)  # so do a bad --device and --threads
    data_dir, run_dir = args.out / "data", args.out / "run"
    if args.retrain:
        shutil.rmtree(run_dir, ignore_errors=True)
    if not (data_dir / f"test.{TGT_LANG}").is_file():
        counts = write_task(data_dir)
        print(f"wrote the digits->words task to {data_dir}: {counts}")
    _train(data_dir, run_dir, args)
    accuracy = _evaluate(data_dir, run_dir, args.beam)
    _pictures(run_dir, args.out)
    print(f"demo finished in {time.perf_counter() - started:.0f} s; exact match {accuracy:.2%}")
    print(
        f"next: echo 907042 | aiayn translate --checkpoint {run_dir} --nbest 3\n"
        f"      aiayn serve --checkpoint {run_dir}   # the attention page (pip install -e '.[serve]')"
    )
    return 0


def _train(data_dir: Path, run_dir: Path, args: argparse.Namespace) -> None:
    # training is imported here, when the demo trains: `aiayn --help` and inference stay without it
    from aiayn.train.config import load_run_config
    from aiayn.train.engine import train
    from aiayn.train.translation import TranslationTask

    config = load_run_config(
        demo_config_path(), args.set, **{**training_flags(args), "data.dir": str(data_dir)}
    )
    latest = latest_checkpoint(run_dir)
    if (
        latest is not None
        and load_checkpoint(latest, with_state=False).config["step"] >= config.train.max_steps
    ):
        print(f"reusing the trained model in {run_dir} (--retrain to train again)")
        return
    train(TranslationTask(config), run_dir, progress=not args.no_progress)


def _evaluate(data_dir: Path, run_dir: Path, beam: int) -> float:
    model, tokenizer, ckpt = load_translation_model(run_dir)
    pairs, _ = read_parallel(data_dir, "test", SRC_LANG, TGT_LANG)
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    with torch.inference_mode():
        hypotheses = [t.text for t in Translator(model, tokenizer, beam=beam).translate(sources)]
    correct = [h == r for h, r in zip(hypotheses, references)]
    print(f"\nsample translations ({ckpt.path}, beam {beam}):")
    for src, hyp, ok in list(zip(sources, hypotheses, correct))[:N_SAMPLES]:
        print(f"  {src:>8} -> {hyp}{'' if ok else '   (wrong)'}")
    accuracy = sum(correct) / len(correct)
    print(
        f"exact match on {len(correct)} held-out test numbers: {sum(correct)}/{len(correct)} = {accuracy:.2%}"
    )
    return accuracy


def _pictures(run_dir: Path, out: Path) -> None:
    model, tokenizer, _ = load_translation_model(run_dir)
    paths = [
        draw_attention(model, tokenizer, "907042", None, out / "attention.png"),
        plot_positional_encoding(128, 64, out / "positional_encoding.png"),
        plot_curves(run_dir, out / "curves.png"),
    ]
    print("wrote " + ", ".join(str(p) for p in paths))
