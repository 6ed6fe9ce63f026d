"""``aiayn train`` and ``aiayn average``.

The training package is imported when a command runs, not when ``aiayn --help`` builds the parser.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from aiayn.config import add_training_flags, training_flags
from aiayn.device import apply_device_flags
from aiayn.errors import UserError, naming_flags

#: How a library error names the settings these commands set by flags.
FLAGS = {
    "run_dir": "--out",
    "data.dir": "data.dir (--data-dir)",
    "last": "--last",
    "train.max_steps": "train.max_steps (--max-steps)",
    "train.max_epochs": "train.max_epochs (--max-epochs)",
    "train.max_hours": "train.max_hours (--max-hours)",
    "train.init": "train.init (--init)",
}


def register(subparsers) -> None:
    train = subparsers.add_parser(
        "train", help="train a translation model (resumes when --out holds a checkpoint)"
    )
    train.add_argument("--config", required=True, help="run config YAML (see configs/)")
    train.add_argument("--data-dir", help="corpus directory ({split}.{lang} files); overrides data.dir")
    train.add_argument("--src-lang")
    train.add_argument("--tgt-lang")
    train.add_argument("--out", required=True, help="run directory (checkpoints, best/, metrics.jsonl)")
    train.add_argument(
        "--init",
        metavar="CHECKPOINT",
        help="start from this checkpoint's weights, model and tokenizer (fine-tuning: a fresh optimizer "
        "and schedule on this run's data; the model section may be left out) (train.init)",
    )
    add_training_flags(train)  # --set, --device, --threads, --max-steps/-epochs/-hours: as every trainer
    train.add_argument("--save-every", type=int)
    train.add_argument("--seed", type=int)
    train.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    train.set_defaults(func=run_train)

    average = subparsers.add_parser("average", help="average checkpoints (the paper averaged the last 5)")
    group = average.add_mutually_exclusive_group(required=True)
    group.add_argument("--inputs", nargs="+", type=Path, metavar="CKPT")
    group.add_argument("--last", nargs=2, metavar=("N", "RUN_DIR"), help="the last N checkpoints of RUN_DIR")
    average.add_argument("--output", required=True, type=Path)
    average.set_defaults(func=run_average)


@naming_flags(FLAGS)
def run_train(args: argparse.Namespace) -> int:
    # lazily: the training package (torch, the engine) is loaded only for this command
    from aiayn.train import distributed
    from aiayn.train.config import load_run_config
    from aiayn.train.engine import train
    from aiayn.train.translation import TranslationTask

    apply_device_flags(args)
    config = load_run_config(
        args.config,
        args.set,
        **{
            "data.dir": args.data_dir,
            "data.src_lang": args.src_lang,
            "data.tgt_lang": args.tgt_lang,
            **training_flags(args),
            "train.save_every": args.save_every,
            "train.seed": args.seed,
            "train.init": args.init,
        },
    )
    try:
        train(TranslationTask(config), args.out, progress=not args.no_progress)
    finally:
        distributed.cleanup()
    return 0


@naming_flags(FLAGS)
def run_average(args: argparse.Namespace) -> int:
    from aiayn.train.average import average_checkpoints, last_checkpoints  # lazily, as run_train

    if args.last:
        try:
            n = int(args.last[0])
        except ValueError:
            raise UserError(f"--last expects N RUN_DIR, got {' '.join(args.last)}") from None
        inputs = last_checkpoints(Path(args.last[1]), n)
    else:
        inputs = args.inputs
    path = average_checkpoints(inputs, args.output)
    print(f"averaged {len(inputs)} checkpoints into {path}")
    return 0
