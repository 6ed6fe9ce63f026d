"""The in-process executor of a job, and what the processes of one job launched by torchrun share.

torchrun (``torchrun --nproc-per-node N -m aiayn translate ... --output F``) sets ``WORLD_SIZE``
and ``RANK`` in each process: rank r works on shard r of ``WORLD_SIZE`` (:func:`launched_shards`);
after its chunks, rank 0 waits until the folder holds every chunk (:func:`wait_complete`: polling
the job's folder, no process group: nothing to time out after 30 minutes, and it works the same on
a shared file system across machines), then finishes. A rank that fails stops them all (torchrun
ends the others); the same command again continues the job.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Callable

from aiayn.errors import UserError
from aiayn.jobs.job import Job
from aiayn.jobs.progress import Progress

#: ``translate(k, texts) -> output lines`` for chunk ``k`` (one per text, or a block per text).
Translate = Callable[[int, list[str]], list[str]]


def run_job(job: Job, translate: Translate, progress: Progress | None = None) -> int:
    """Translate and commit each of this shard's pending chunks in order; the number done."""
    done = 0
    for k in job.pending():
        texts = job.read(k)
        job.commit(k, translate(k, texts))
        done += 1
        if progress is not None:
            progress.lines(len(texts))
    return done


def chunk_seed(seed: int, k: int) -> int:
    """The sampling seed of chunk ``k`` of a job sampled with ``seed``: the same whichever process
    translates the chunk, and whether or not the job was resumed."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{k}".encode()).digest()[:4], "big")


def launched_shards() -> tuple[int, int] | None:
    """``(WORLD_SIZE, RANK)`` in a process of a torchrun launch of more than one, else None."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
    except ValueError:
        raise UserError("WORLD_SIZE and RANK must be whole numbers (torchrun sets them)") from None
    if world <= 1:
        return None
    if not 0 <= rank < world:
        raise UserError(f"RANK {rank}: must be from 0 to {world - 1} (WORLD_SIZE {world})")
    return world, rank


def wait_complete(job: Job, poll_s: float = 0.5, timeout_s: float | None = None) -> None:
    """Until every chunk of the job is committed (by any process); past ``timeout_s`` a
    :class:`UserError` naming the chunks missing."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not job.complete():
        if deadline is not None and time.monotonic() > deadline:
            job.finish()  # says which are missing
        time.sleep(poll_s)
