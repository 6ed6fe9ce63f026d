"""``python -m aiayn`` (and ``torchrun -m aiayn``) run the CLI."""

import sys

from aiayn.cli import run

sys.exit(run())
