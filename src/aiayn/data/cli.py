"""The ``aiayn data`` command: ``aiayn data multi30k --out DIR`` and ``aiayn data synthetic --out DIR``.

The main CLI calls :func:`register` with its sub-parsers and then ``args.func(args)``; it catches
:class:`~aiayn.errors.UserError` and prints its one-line message.
"""

from __future__ import annotations

import argparse

from aiayn.data.download import DEFAULT_URL, LANGUAGES, download_multi30k
from aiayn.data.synthetic import N_TEST, N_TRAIN, N_VALID, write_task


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Add ``data`` with its sub-commands ``multi30k`` and ``synthetic``; returns the ``data`` parser."""
    data = subparsers.add_parser("data", help="download Multi30k or write the built-in digits-to-words task")
    commands = data.add_subparsers(dest="data_command", metavar="{multi30k,synthetic}", required=True)
    _add_multi30k(commands)
    _add_synthetic(commands)
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
