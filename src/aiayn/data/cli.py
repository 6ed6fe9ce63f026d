"""The ``aiayn data`` command: ``multi30k`` (download), ``synthetic`` (the built-in task) and
``prepare`` (encode a corpus once into token arrays and an index for ``aiayn train``).

The main CLI calls :func:`register` with its sub-parsers and then ``args.func(args)``; it catches
:class:`~aiayn.errors.UserError` and prints its one-line message.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from aiayn.config import read_config
from aiayn.data.config import prepare_settings_of
from aiayn.data.download import DEFAULT_URL, LANGUAGES, download_multi30k
from aiayn.data.prepare import CHUNK_PAIRS, prepare
from aiayn.data.synthetic import N_TEST, N_TRAIN, N_VALID, write_task
from aiayn.errors import UserError, naming_flags


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Add ``data`` with its sub-commands; returns the ``data`` parser."""
    data = subparsers.add_parser(
        "data", help="download Multi30k, write the built-in task, or prepare a corpus for training"
    )
    commands = data.add_subparsers(dest="data_command", metavar="{multi30k,synthetic,prepare}", required=True)
    _add_multi30k(commands)
    _add_synthetic(commands)
    _add_prepare(commands)
    return data


def _add_multi30k(commands) -> None:
    parser = commands.add_parser("multi30k", help="download Multi30k task 1 and verify its checksums")
    parser.add_argument("--out", required=True, help="directory for {split}.{lang} files")
    parser.add_argument("--url", default=DEFAULT_URL, help="base URL of the {split}.{lang}.gz files")
    parser.add_argument(
        "--langs", default=",".join(LANGUAGES), help="comma-separated languages (default: %(default)s)"
    )
    parser.set_defaults(func=run_multi30k)


def _add_synthetic(commands) -> None:
    parser = commands.add_parser("synthetic", help="write the digits-to-words task ({split}.digits / .words)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=N_TRAIN)
    parser.add_argument("--n-valid", type=int, default=N_VALID)
    parser.add_argument("--n-test", type=int, default=N_TEST)
    parser.set_defaults(func=run_synthetic)


def _add_prepare(commands) -> None:
    parser = commands.add_parser(
        "prepare",
        help="encode a corpus once (sampled tokenizer, parallel encoding) into token arrays and an index",
        description="Train the tokenizer on a seeded sample, encode the training and validation splits "
        "in parallel, filter by length and write token arrays and a lengths index with a checksummed "
        "manifest. Pass the output as `aiayn train --data-dir`. The data section of --config (and "
        "train.seed) decides every setting; training checks the other sections, and that these still agree.",
    )
    parser.add_argument("--config", required=True, help="the run config YAML that will train on it")
    parser.add_argument("--data-dir", help="corpus directory ({split}.{lang} files); overrides data.dir")
    parser.add_argument("--src-lang")
    parser.add_argument("--tgt-lang")
    parser.add_argument("--out", required=True, help="the prepared directory to write")
    parser.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config field"
    )
    parser.add_argument("--workers", type=int, default=0, help="encoding processes (default: one per CPU)")
    parser.add_argument(
        "--chunk-pairs", type=int, default=CHUNK_PAIRS, help="pairs per encoded chunk (default: %(default)s)"
    )
    parser.set_defaults(func=run_prepare)


def run_multi30k(args: argparse.Namespace) -> int:
    languages = [lang.strip() for lang in args.langs.split(",") if lang.strip()]
    paths = download_multi30k(args.out, base_url=args.url, languages=languages)
    print(f"wrote {len(paths)} verified files to {args.out}")
    return 0


def run_synthetic(args: argparse.Namespace) -> int:
    counts = write_task(
        args.out, seed=args.seed, n_train=args.n_train, n_valid=args.n_valid, n_test=args.n_test
    )
    listed = ", ".join(f"{split} {n}" for split, n in counts.items())
    print(f"wrote digits->words task to {args.out}: {listed} pairs")
    return 0


@naming_flags({"data.dir": "data.dir (--data-dir)"})
def run_prepare(args: argparse.Namespace) -> int:
    if args.workers < 0 or args.chunk_pairs < 1:
        raise UserError("--workers must be >= 0 and --chunk-pairs >= 1")
    flags = {"data.dir": args.data_dir, "data.src_lang": args.src_lang, "data.tgt_lang": args.tgt_lang}
    corpus, settings = prepare_settings_of(read_config(args.config, args.set, flags), args.config)
    prepared = prepare(
        corpus.directory(),
        Path(args.out),
        settings,
        workers=args.workers,
        chunk_pairs=args.chunk_pairs,
    )
    for split in (corpus.train_split, corpus.valid_split):
        print(prepared.summary(split))
    return 0
