"""Documents on the server: :class:`~aiayn.documents.translate.DocumentTranslator` with the sentences
of every request decoded by the server's batcher (:class:`~aiayn.serve.batching.Batcher`).

A DocumentTranslator is synchronous: it parses the documents of a call, has all their sentences
translated by its backend in one call, and rebuilds the documents. Here it runs in a pool of
document threads (never in the event loop, never in the model's thread) over a
:class:`BatchedBackend`: the backend's one call, ``translate(lines, options, wanted)``, handed to the
batcher in the event loop, so the sentences of documents that arrive together are decoded in the
same token-bounded batches, in the model's one thread.

The routes (``POST /v1/translate``, the LibreTranslate API's ``POST /translate``) translate through
:meth:`aiayn.serve.models.Models.translate`; :class:`Admission` bounds the requests in the server at
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from typing import Callable, Sequence

from starlette.exceptions import HTTPException

from aiayn.decode.request import TEXT, Backend, LineLike, Translation, Wanted, as_lines
from aiayn.decode.search import DecodeOptions
from aiayn.serve.batching import Batcher

#: Document requests parsed, waiting for their sentences or rebuilt at once: each holds a thread
#: while its sentences are decoded, so this many requests' sentences can share a batch.
DOCUMENT_THREADS = 128


class BatchedBackend:
    """``backend`` (a :class:`~aiayn.decode.request.Backend`) for a DocumentTranslator in a document
    thread: :meth:`translate` hands the lines to ``batcher`` (on ``loop``) and waits for them."""

    def __init__(self, backend: Backend, batcher: Batcher, loop: asyncio.AbstractEventLoop) -> None:
        self.name, self.tokenizer, self.config = backend.name, backend.tokenizer, backend.config
        self._batcher, self._loop = batcher, loop
        self.progress: Callable[[int], None] | None = None  # the translator may set it; none is reported

    def translate(
        self, lines: Sequence[LineLike], options: DecodeOptions, wanted: Wanted = TEXT
    ) -> list[Translation]:
        submit = self._batcher.submit(as_lines(lines), options, wanted)
        return asyncio.run_coroutine_threadsafe(submit, self._loop).result()


_WARNED: set[str] = set()
_BATCH_LINE = re.compile(r"^line \d+: ")


def warn_once(message: str) -> None:
    """A document's warning on stderr, each message once (a server would repeat it per request)."""
    if message not in _WARNED and len(_WARNED) < 1000:
        _WARNED.add(message)
        print(f"aiayn serve: warning: {message}", file=sys.stderr, flush=True)


def backend_warning(message: str) -> None:
    """A backend's warning on the server, each once: its "line N" counts the lines of a batch of
    several requests, which names nothing to a client, so it says "a sentence" instead."""
    warn_once(_BATCH_LINE.sub("a sentence: ", message, count=1))


class Admission:
    """At most ``limit`` translation requests in the server at once (waiting or being decoded); one
    more is refused with a 429 at once, rather than queued for longer than any client waits. Used in
    the event loop only."""

    def __init__(self, limit: int) -> None:
        self.limit, self.count = limit, 0

    @contextlib.contextmanager
    def slot(self):
        if self.count >= self.limit:
            raise HTTPException(
                429,
                f"Slowdown: {self.limit} requests are already waiting for the model; try again shortly",
                headers={"Retry-After": "1"},
            )
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1
