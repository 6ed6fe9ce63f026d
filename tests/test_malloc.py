"""aiayn's glibc setting: a large block freed and allocated again is not page-faulted again."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from aiayn.malloc import keep_freed_memory

# In a fresh interpreter: optionally apply the setting, then allocate, write and free a 64 MiB tensor
# over and over, as training steps do, and report the minor page faults of the last ROUNDS rounds.
# The first rounds may grow the heap: PyTorch's aligned allocation needs a little more than the block
# it freed, so until two freed blocks lie side by side a new one can be carved from fresh pages.
ROUNDS = 8
PROBE = f"""
import json, resource, sys, torch
from aiayn.malloc import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
def faults_of_one_block():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(16 * 1024 * 1024)  # 64 MiB, written (faulted in), freed
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
warm_up = [faults_of_one_block() for _ in range({ROUNDS})]
print(json.dumps({{"applied": applied, "faults": sum(faults_of_one_block() for _ in range({ROUNDS}))}}))
"""

needs_glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not sys.platform.startswith("linux"),
                                 reason="the setting is glibc's (Linux)")


def probe(mode: str, **env: str) -> dict:
    environ = {key: value for key, value in os.environ.items() if key != "AIAYN_MALLOC"} | env
    done = subprocess.run([sys.executable, "-c", PROBE, mode], env=environ, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout)


@needs_glibc
def test_a_freed_large_block_is_reused_without_page_faults():
    kept = probe("keep")
    assert kept["applied"] is True
    # 64 MiB is 16,384 pages of 4 KiB: glibc's default mmaps and faults every one of them again
    assert kept["faults"] < 1000, kept  # against 8 x 16,384 under glibc's default


@needs_glibc
def test_glibc_default_faults_the_block_in_again():
    """The control: without the setting the second allocation is faulted in again (4 KiB pages, or
    2 MiB pages where the kernel's transparent huge pages are ``always``)."""
    default = probe("default")
    assert default["applied"] is False
    assert default["faults"] >= 32 * ROUNDS, default  # 64 MiB in pages of at most 2 MiB, every round


def test_aiayn_malloc_default_keeps_glibc_defaults(monkeypatch):
    monkeypatch.setenv("AIAYN_MALLOC", "default")
    assert keep_freed_memory() is False
