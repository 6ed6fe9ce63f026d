"""Batching across requests: a queue, a bound in tokens, a wait of a few milliseconds.

Requests are queued as they arrive. The batcher takes the oldest, then the requests behind it that
have the same decoding options, while their source tokens stay within ``max_tokens``; the others
are held for the next batches, in their order, and a batch takes the held requests that fit before
any that arrived after them. It takes those already queued at once, and waits up to
``max_wait_s`` for more only while requests come in together (a recent batch held several), and
only until the batch holds as many as the largest of the last few batches (clients that each wait
for their answer send their next requests together; once they are all in, waiting more only idles
the model): a lone client's request is decoded without waiting. The batch is decoded in the one
worker thread that runs the model (the event loop never waits on it), and each request gets its own
sentences' results. Greedy and beam search give a sentence the same output whatever it is batched
with (:mod:`aiayn.decode.search`), so batching changes how fast, not what. Sampling draws depend on
the batch, so a sampling request is decoded alone: a seed gives the same samples for the same text.
A request is :class:`~aiayn.decode.request.Line` s (each with its prefix), the search's options and
what it wants (:class:`~aiayn.decode.request.Wanted`). Requests whose options differ (a glossary
among them) never share a batch; those that want different things do, and the batch computes what
any of them wants (scores and alignments change no text; each caller reads what it asked for).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import operator
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Callable

from aiayn.decode.request import Line, Translation, Wanted
from aiayn.decode.search import DecodeOptions

RECENT_BATCHES = 4  # how many batches' sizes set how many requests a batch waits for
#: ``decode(lines, options, wanted)``: a backend's :meth:`~aiayn.decode.request.Backend.translate`
Decode = Callable[[list[Line], DecodeOptions, Wanted], list[Translation]]


@dataclass
class Job:
    lines: list[Line]
    options: DecodeOptions
    wanted: Wanted
    tokens: int
    future: asyncio.Future = field(repr=False)


class Batcher:
    """Decodes queued requests in batches (``max_tokens`` 0: each request alone, no waiting)."""

    def __init__(
        self,
        decode: Decode,
        count_tokens: Callable[[str], int],
        executor: Executor,
        max_tokens: int,
        max_wait_s: float,
    ) -> None:
        self.decode, self.count_tokens, self.executor = decode, count_tokens, executor
        self.max_tokens, self.max_wait_s = max_tokens, max_wait_s
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.held: collections.deque[Job] = collections.deque()  # other options: the next batches
        #: requests in each of the last batches: several = concurrent clients, worth a wait
        self.recent: collections.deque[int] = collections.deque([1], maxlen=RECENT_BATCHES)
        self.taken: list[Job] = []  # the batch being gathered or decoded
        self.closed: str | None = None  # why no job is taken any more

    def close(self, reason: str = "the server is shutting down") -> None:
        """Answer every job not yet answered (taken, held or queued) with an error: after the
        batcher's task is cancelled, nothing else would, and a caller waiting in another thread
        (:mod:`aiayn.serve.documents`) would wait forever; so is every job submitted after."""
        self.closed = reason
        pending = [*self.taken, *self.held]
        while not self.queue.empty():
            pending.append(self.queue.get_nowait())
        for job in pending:
            if not job.future.done():
                job.future.set_exception(RuntimeError(reason))

    async def submit(self, lines: list[Line], options: DecodeOptions, wanted: Wanted) -> list[Translation]:
        """The translation of each of ``lines``, decoded with whatever else arrives meanwhile."""
        if self.closed is not None:
            raise RuntimeError(self.closed)
        tokens = sum(self.count_tokens(line.text) for line in lines)
        future = asyncio.get_running_loop().create_future()
        job = Job(lines, options, wanted, tokens, future)
        await self.queue.put(job)
        return await job.future

    async def run(self) -> None:
        """Forever: take a batch, decode it in the worker thread, hand each job its results."""
        while True:
            batch = await self._next_batch()
            await self._decode(batch)

    async def _next_batch(self) -> list[Job]:
        first = self.held.popleft() if self.held else await self.queue.get()
        batch, tokens = [first], first.tokens
        self.taken = batch  # appended to below
        if not self.max_tokens or first.options.sample:  # a sample depends on its batch: alone
            return batch
        for job in self._held_joining(first.options, self.max_tokens - tokens):
            batch.append(job)
            tokens += job.tokens
        expected = max(self.recent)
        deadline = time.monotonic() + (self.max_wait_s if expected > 1 else 0.0)
        while tokens < self.max_tokens:
            job = await self._arrival(deadline if len(batch) < expected else 0.0)  # 0: queued ones only
            if job is None:
                break
            if job.options != first.options or tokens + job.tokens > self.max_tokens:
                self.held.append(job)  # decoded in a later batch, in its turn
                if job.options == first.options:
                    break  # this batch is full
                continue
            batch.append(job)
            tokens += job.tokens
        self.recent.append(len(batch))
        return batch

    def _held_joining(self, options: DecodeOptions, room: int) -> list[Job]:
        """The held jobs, oldest first, with ``options`` that fit in ``room`` tokens (taken out of
        ``held``); the others stay held, in their order."""
        joining, staying = [], collections.deque()
        for job in self.held:
            if job.options == options and job.tokens <= room:
                joining.append(job)
                room -= job.tokens
            else:
                staying.append(job)
        self.held = staying
        return joining

    async def _arrival(self, deadline: float) -> Job | None:
        """A job already queued, else the next to arrive before ``deadline``, or None."""
        if not self.queue.empty():
            return self.queue.get_nowait()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            return await asyncio.wait_for(self.queue.get(), remaining)
        except asyncio.TimeoutError:
            return None

    async def _decode(self, batch: list[Job]) -> None:
        lines = [line for job in batch for line in job.lines]
        wanted = functools.reduce(operator.or_, (job.wanted for job in batch))
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self.executor, self.decode, lines, batch[0].options, wanted)
        except Exception as err:  # the jobs' requests answer with it; the batcher goes on
            self.taken = []
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(err)
            return
        self.taken, start = [], 0
        for job in batch:
            if not job.future.done():  # a client that went away cancelled its future
                job.future.set_result(results[start : start + len(job.lines)])
            start += len(job.lines)
