"""``python -m aiayn`` (and ``torchrun -m aiayn``) run the CLI."""

import sys

from aiayn.cli import run

if __name__ == "__main__":  # not when a spawned worker process imports this module
    sys.exit(run())
