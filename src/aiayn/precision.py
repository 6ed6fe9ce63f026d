"""Which precision to compute in, decided by what the hardware does natively.

bf16 autocast is a large speed-up where bf16 matrix units exist (CUDA GPUs from Ampere on; CPUs
with AMX-BF16 or AVX512-BF16, Intel's and AMD's from Zen 4 on) and a large slow-down where bf16 is
emulated (``benchmarks/train_throughput.py`` measures both). ``"auto"`` picks bf16 only where it is
native. Softmax and loss stay in fp32 under autocast either way.
"""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("auto", "bf16", "fp32")


def native_bf16(device: torch.device) -> bool:
    """True when ``device`` has bf16 matrix hardware (not emulation)."""
    if device.type == "cuda":  # is_bf16_supported() also counts emulation (pre-Ampere cards)
        return torch.cuda.get_device_capability(device)[0] >= 8
    if device.type == "cpu":
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    return False


def resolve_precision(name: str, device: torch.device) -> str:
    """ "auto" -> "bf16" where native, else "fp32"; "bf16"/"fp32" are kept as asked."""
    if name not in PRECISIONS:
        raise ValueError(f"precision: unknown value {name!r}; valid: {', '.join(PRECISIONS)}")
    if name == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return name


def autocast(device: torch.device, precision: str):
    """bf16 autocast on ``device`` for "bf16", a no-op context for "fp32"."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
