"""aiayn's glibc setting: a large block freed and allocated again is not page-faulted again."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import shutil
import subprocess
import sys

import pytest
import torch

from aiayn.malloc import ONEDNN_CACHES, bound_onednn_caches, keep_freed_memory
from aiayn.precision import native_bf16

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

needs_glibc = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc" or not sys.platform.startswith("linux"),
    reason="the setting is glibc's (Linux)",
)


# Variables that change which allocator runs, or how: the probes run without them.
ALLOCATOR_VARIABLES = ("AIAYN_MALLOC", "LD_PRELOAD", "GLIBC_TUNABLES")


def probe(mode: str, **env: str) -> dict:
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in ALLOCATOR_VARIABLES and not key.startswith("MALLOC_")
    } | env
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], env=environ, check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def kept() -> dict:
    """The probe with the setting applied, in a fresh interpreter: both tests below read it (and run
    on one worker, so that it is run once: each probe imports torch, ~3 s of CPU)."""
    return probe("keep")


@needs_glibc
@pytest.mark.xdist_group("malloc")
def test_a_freed_large_block_is_reused_without_page_faults(kept):
    """With the setting the block's pages are reused; without it (the control, which shows the probe
    sees the faults) every round faults the block in again: 4 KiB pages, or 2 MiB pages where the
    kernel's transparent huge pages are ``always``."""
    default = probe("default")
    assert kept["applied"] is True and default["applied"] is False
    assert default["faults"] >= 32 * ROUNDS, default  # 64 MiB in pages of at most 2 MiB, every round
    assert kept["faults"] < 1000, kept  # here 0, against 8 x 16,384 under glibc's default
    assert kept["faults"] * 10 < default["faults"]


@pytest.mark.parametrize("value", ["default", "off", "0"])
def test_aiayn_malloc_opts_out(monkeypatch, value):
    monkeypatch.setenv("AIAYN_MALLOC", value)
    assert keep_freed_memory() is False


@needs_glibc
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build a stand-in allocator")
@pytest.mark.xdist_group("malloc")
def test_a_preloaded_allocator_is_left_alone(tmp_path, kept):
    """Under another malloc (jemalloc, tcmalloc via LD_PRELOAD) mallopt succeeds and does nothing:
    the setting must say it was not applied. The stand-in defines ``malloc`` and forwards to glibc's."""
    source = tmp_path / "stand_in.c"
    source.write_text(
        "#include <stddef.h>\nextern void *__libc_malloc(size_t);\n"
        "void *malloc(size_t n) { return __libc_malloc(n); }\n"
    )
    library = tmp_path / "libstandin.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    assert probe("keep", LD_PRELOAD=str(library))["applied"] is False
    assert kept["applied"] is True  # the same probe without it


# In a fresh interpreter, as the aiayn command starts: keep freed memory, optionally bound oneDNN's
# caches, then bf16 matmuls of 150 shapes never seen before through the generator of shape (a) of
# train_throughput.py (d_model 256, 8,000 words: a training run's generator sees a new row count at
# nearly every step), and report how much the resident set grew and how much more memory malloc
# holds for live objects (glibc's mallinfo2: the cache entries themselves).
SHAPES_PROBE = """
import ctypes, json, sys, torch
from aiayn.malloc import bound_onednn_caches, keep_freed_memory
keep_freed_memory()
applied = bound_onednn_caches() if sys.argv[1] == "bound" else {}
class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost",
        )
    ]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
def held_mib():
    info = libc.mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20
def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
weight = torch.randn(8000, 256, dtype=torch.bfloat16)
def matmul(rows):
    torch.ones(rows, 256, dtype=torch.bfloat16) @ weight.t()
for rows in range(1000, 1010):
    matmul(rows)
rss, held = rss_mib(), [held_mib()]
for start in (1010, 1085):  # two halves of 75 shapes
    for rows in range(start, start + 75):
        matmul(rows)
    held.append(held_mib())
print(json.dumps({"applied": applied, "rss_growth_mib": rss_mib() - rss,
                  "held_growth_mib": [held[1] - held[0], held[2] - held[1]]}))
"""


def test_bound_onednn_caches_sets_only_what_the_user_has_not(monkeypatch):
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "")  # set first, so that monkeypatch restores its absence
    monkeypatch.delenv("LRU_CACHE_CAPACITY")
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")  # the user's choice stays
    lru = ONEDNN_CACHES["LRU_CACHE_CAPACITY"]
    assert bound_onednn_caches() == {"LRU_CACHE_CAPACITY": lru}
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "64" and os.environ["LRU_CACHE_CAPACITY"] == lru
    assert bound_onednn_caches() == {}


def has_mallinfo2() -> bool:
    """glibc 2.33 and later."""
    return platform.libc_ver()[0] == "glibc" and hasattr(ctypes.CDLL(None), "mallinfo2")


@needs_glibc
@pytest.mark.skipif(
    not native_bf16(torch.device("cpu")), reason="oneDNN computes bf16 matmuls only where bf16 is native"
)
@pytest.mark.skipif(not has_mallinfo2(), reason="needs glibc's mallinfo2 (2.33 or later)")
def test_new_matmul_shapes_do_not_grow_memory_once_the_caches_are_bounded():
    """Here (AMD EPYC with AVX512-BF16) the control's cache entries held 80 MiB more after the 150
    shapes (40 MiB per half of 75), the bound's none. The control's resident set grew by 90 MiB in one
    process and by 2,484 MiB in another (after 100 shapes: 53, 1,339 or 1,618 MiB; it depends on
    where freed blocks land, so on the address layout: 1,618 in 4 runs of 4 with ASLR off), the
    bound's by 3-18 MiB. So the control is checked on what malloc holds, which is deterministic, and
    the bound on both. Other CPUs' kernels may keep entries of other sizes, so the control must
    grow in both halves (as a cache without a bound does), with a floor of 8 MiB (0.1 MiB a shape)."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in (*ALLOCATOR_VARIABLES, *ONEDNN_CACHES) and not key.startswith("MALLOC_")
    }
    runs = {
        mode: json.loads(
            subprocess.run(
                [sys.executable, "-c", SHAPES_PROBE, mode],
                env=environ,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        for mode in ("bound", "none")
    }
    assert runs["bound"]["applied"] == ONEDNN_CACHES
    assert runs["bound"]["rss_growth_mib"] < 100, runs
    assert sum(runs["bound"]["held_growth_mib"]) < 4, runs
    # the control: without the bound every shape is kept, so what malloc holds grows in both halves
    first, second = runs["none"]["held_growth_mib"]
    assert first > 8 and second > first / 2, runs


# In a fresh interpreter with freed memory kept: many small tensors (as a model's weights, each below
# any mmap threshold) written, then freed; the resident memory after freeing, then after giving back.
GIVE_BACK = """
import gc, json, torch
from aiayn.malloc import give_back_freed_memory, keep_freed_memory
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
keep_freed_memory()
weights = [torch.ones(256 * 1024) for _ in range(256)]  # 256 MiB in 1 MiB tensors
loaded = rss()
del weights
gc.collect()
freed = rss()
given = give_back_freed_memory()
print(json.dumps({"loaded": loaded, "freed": freed, "back": rss(), "given": given}))
"""


@needs_glibc
def test_an_unloaded_models_memory_is_given_back() -> None:
    """With freed memory kept in the heap (the aiayn command's setting), freeing a model's weights
    leaves the process as large as before; :func:`give_back_freed_memory` returns the pages."""
    environ = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_VARIABLES}
    done = subprocess.run(
        [sys.executable, "-c", GIVE_BACK], env=environ, check=True, capture_output=True, text=True
    )
    found = json.loads(done.stdout)
    mib = 2**20
    assert found["given"] and found["freed"] > found["loaded"] - 32 * mib  # kept: nothing returned
    assert found["back"] < found["freed"] - 200 * mib  # given back: most of the 256 MiB
