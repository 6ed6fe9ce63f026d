"""Device names, one rule for every command: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""

from __future__ import annotations

import os
import re

import torch

from aiayn.errors import UserError

_NAME = re.compile(r"auto|cpu|cuda(?::(\d+))?")


def resolve_device(name: str, option: str) -> torch.device:
    """The device ``name`` means on this machine, or a :class:`UserError` naming ``option``.

    ``auto`` is the GPU when CUDA is there, else the CPU. ``auto`` and ``cuda`` mean this process's
    GPU: ``LOCAL_RANK`` under torchrun, else cuda:0. ``option`` is how the user set it
    (``--device``, ``train.device``).
    """
    match = _NAME.fullmatch(name)
    if match is None:
        raise UserError(f"{option} {name!r} is not a device name (auto, cpu, cuda or cuda:N)")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError(f"{option} {name!r}: CUDA is not available here (use auto or cpu)")
    index = int(match.group(1) or os.environ.get("LOCAL_RANK", "0"))
    count = torch.cuda.device_count()
    if index >= count:
        raise UserError(
            f"{option} {name!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
        )
    return torch.device("cuda", index)


def apply_device_flags(args) -> None:
    """A training command's ``--device`` checked and ``--threads`` applied, before any work
    (:func:`aiayn.config.add_training_flags`)."""
    if args.device is not None:
        resolve_device(args.device, "--device")
    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads: must be >= 1; got {args.threads}")
        torch.set_num_threads(args.threads)
