"""What every benchmark records beside its figures: versions, the machine, peak memory, the command."""

from __future__ import annotations

import os
import platform
import resource
import shlex
import subprocess
import sys
from pathlib import Path

import torch


def command() -> str:
    """The command line that produced a results file, as it can be pasted back into a shell."""
    return shlex.join(["python", Path(sys.argv[0]).as_posix(), *sys.argv[1:]])


def versions(**others: str) -> dict:
    import aiayn

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "aiayn": aiayn.__version__,
        "aiayn_git": STARTED_AT,
        **others,
    }


def git_revision() -> str | None:
    """The checkout's commit, with "+changes" when the tracked files differ from it; None outside git."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+changes" if dirty else "")


def machine() -> dict:
    cpuinfo = Path("/proc/cpuinfo")
    names = (
        [
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("model name")
        ]
        if cpuinfo.exists()
        else []
    )
    return {
        "platform": platform.platform(),
        "cpu_model": names[0] if names else platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "amx_tile": bool(torch.cpu._is_amx_tile_supported()),
        "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def gpu(device: torch.device | str | None = None) -> dict | None:
    """The CUDA device a benchmark ran on (name, memory, capability) and the CUDA stack; None without one."""
    if not torch.cuda.is_available():
        return None
    device = torch.device(device if device is not None else "cuda")
    props = torch.cuda.get_device_properties(device)
    return {
        "name": torch.cuda.get_device_name(device),
        "memory_gib": props.total_memory / 2**30,
        "capability": list(torch.cuda.get_device_capability(device)),
        "multiprocessors": props.multi_processor_count,
        "device_count": torch.cuda.device_count(),
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
    }


def peak_rss_mib(children: bool = False) -> float:
    """Peak resident set size so far of this process (or of its waited-for children), in MiB."""
    peak = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


# The checkout's commit when the benchmark started (this module is imported first): a long run
# (Multi30k, ~2 h) records the code it ran, not the commit the checkout has moved on to by its end.
STARTED_AT = git_revision()


def test2016_arguments(description: str, results: str):
    """An argument parser with what the test2016 benchmarks share: ``--checkpoint``, ``--data-dir``
    (default ``$AIAYN_DATA/multi30k``, ``AIAYN_DATA`` defaulting to ``../shared/data``), ``--threads``
    and ``--results``."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--checkpoint", required=True)
    data = Path(os.environ.get("AIAYN_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--data-dir", default=str(data / "multi30k"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", default=results)
    return parser
