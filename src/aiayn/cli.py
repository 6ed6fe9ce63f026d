"""The ``aiayn`` command.

Each part of the library registers its own sub-commands (``register(subparsers)`` in its ``cli``
module). Expected failures (bad files, bad config, missing checkpoints) raise
:class:`aiayn.errors.UserError`: they are printed on one line (each of several problems on its own) and
exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from aiayn import __version__
from aiayn.errors import UserError
from aiayn.malloc import keep_freed_memory

#: Modules whose ``register(subparsers)`` adds sub-commands, in the order ``--help`` lists them.
COMMAND_MODULES = [
    "aiayn.demo",
    "aiayn.data.cli",
    "aiayn.train.cli",
    "aiayn.translate",
    "aiayn.jobs.cli",
    "aiayn.plots",
    "aiayn.export",
    "aiayn.marian",
    "aiayn.forecast.cli",
    "aiayn.serve.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiayn",
        description="The Transformer of 'Attention Is All You Need': train, translate, forecast.",
    )
    parser.add_argument("--version", action="version", version=f"aiayn {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def run() -> int:
    """The ``aiayn`` command (and ``python -m aiayn``): :func:`main` in a process that keeps freed memory.

    The allocator setting is process-wide and cannot be undone, so it is made here, at the command's
    entry point, and not in :func:`main`, which tests and notebooks call in their own process.
    """
    keep_freed_memory()  # before the first large tensor
    return main()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        for line in str(err).splitlines() or [""]:  # several problems found at once: one line each
            print(f"aiayn: error: {line}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `aiayn translate ... | head`
        return 0
    except OSError as err:  # a path the file system refuses (missing directory, no permission, ...)
        where = f"{err.filename}: " if err.filename else ""
        print(f"aiayn: error: {where}{err.strerror or err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("aiayn: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
