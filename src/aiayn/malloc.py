"""glibc's allocator, set for tensors: keep freed memory in the heap instead of unmapping it.

Why it exists: on a CPU, a training step's large blocks are otherwise unmapped and zeroed anew by
the kernel at every step; keeping them cuts a step's CPU time by 1.21x on the tiny Multi30k shape
(``benchmarks/allocator.py``, ``benchmarks/results/allocator.json``).

glibc serves every block above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and gives it
back with ``munmap`` on free. A training step allocates many such blocks (the generator's logits,
tokens × vocabulary × 4 bytes, and their gradients). With ``mmap`` off and the heap never trimmed,
freed blocks stay in the heap and, once it has grown to a step's peak (a few steps), serve the next
steps' allocations without new page faults; the process keeps its peak footprint instead of
returning it between steps.

:func:`keep_freed_memory` is what the ``aiayn`` command calls at start-up; set ``AIAYN_MALLOC=default``
(or ``off``, ``0``) to keep glibc's defaults. It does nothing where ``malloc`` is not glibc's (macOS,
musl, or jemalloc/tcmalloc preloaded). Library users may call it themselves, before the first large
tensor. On a GPU the large tensors live in device memory and the setting gains nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

M_TRIM_THRESHOLD = -1  # mallopt parameters from glibc's <malloc.h>
M_MMAP_MAX = -4
_NEVER_TRIM = 2**31 - 1  # mallopt takes an int: trim only when 2 GiB at the heap's top are free
OPT_OUT = ("default", "off", "0", "false", "no")  # AIAYN_MALLOC values that keep glibc's defaults
ONEDNN_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0", "LRU_CACHE_CAPACITY": "1"}  # oneDNN's, ideep's


def keep_freed_memory() -> bool:
    """Turn glibc's ``mmap`` of large blocks and heap trimming off; True when it was applied."""
    if os.environ.get("AIAYN_MALLOC", "").strip().lower() in OPT_OUT:
        return False
    libc = _glibc()
    if libc is None or not _malloc_is_glibcs(libc):  # another allocator preloaded: mallopt would do nothing
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, _NEVER_TRIM))


def bound_onednn_caches() -> dict[str, str]:
    """Keep (almost) no oneDNN primitive per matmul shape: set two cache capacities the user has not set.

    On CPUs with native bf16, PyTorch computes bf16 matmuls with oneDNN, which caches a primitive
    for every new shape, and PyTorch's ideep layer caches again (1,024 entries each by default).
    Training batches take new shapes at nearly every step (the generator runs on the batch's real
    tokens), so both caches fill with entries that are never used again; interleaved with the
    step's large blocks in a heap that keeps freed memory, they fragment it and resident memory
    grows without bound (``benchmarks/memory_shapes.py``).

    The price: every oneDNN call builds its primitive anew, which costs little for the trainer's
    small shapes but slows kernels called again and again with one shape (decoding). So only
    training sets this, for bf16 on a CPU (it then holds for the whole process, validation decoding
    included), not ``translate`` or ``evaluate``. The capacities are read at oneDNN's first use:
    called after it, this changes nothing. Returns the variables it set.
    """
    applied = {name: value for name, value in ONEDNN_CACHES.items() if name not in os.environ}
    os.environ.update(applied)
    return applied


def _malloc_is_glibcs(libc: ctypes.CDLL) -> bool:
    """Whether the process's ``malloc`` (the first definition in symbol-lookup order) is glibc's own."""
    address = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
    return address == ctypes.cast(libc.malloc, ctypes.c_void_p).value


def give_back_freed_memory() -> bool:
    """Return the heap's free memory to the system now (glibc's ``malloc_trim(0)``: the free top of
    the heap and the free pages inside it), whatever :func:`keep_freed_memory` set; a server calls it
    after unloading a model. True where it was done (glibc), whether or not memory was returned."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def _glibc() -> ctypes.CDLL | None:
    """glibc's C library, None where the C library is another (macOS, musl)."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None
