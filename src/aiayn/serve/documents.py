"""Documents on the server: :class:`~aiayn.documents.translate.DocumentTranslator` with the sentences
of every request decoded by the server's batchers (:class:`~aiayn.serve.batching.Batcher`).

A DocumentTranslator is synchronous: it parses the documents of a call, has all their sentences
translated by its backend in one call, and rebuilds the documents. Here it runs in a pool of
document threads (never in the event loop, never in the model's thread) over a
:class:`BatchedBackend`, the backend's interface whose decoding goes to a batcher in the event loop:
the sentences of documents that arrive together are decoded in the same token-bounded batches, in the
model's one thread. There are three batchers: one searches (``translate_nbest``, and ``translate``
through it), one searches and aligns (``translate_aligned``: alignments, HTML, Markdown), one
searches, scores and aligns (``translate_scored``: confidence; its alignment is used where the
request needs one). Each line's target prefix travels with it through its batcher. Any other method
the translator calls on the backend runs in the model's thread too (one model, one thread).

The routes (``POST /v1/translate``, the LibreTranslate API's ``POST /translate``) call
:meth:`Documents.translate`; :class:`Admission` bounds the requests in the server at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import re
import sys
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Sequence

from starlette.exceptions import HTTPException

from aiayn.decode.search import DecodeOptions
from aiayn.decode.translator import AlignedLines, NBest, Scored
from aiayn.documents.translate import DocumentResult, DocumentTranslator
from aiayn.errors import UserError
from aiayn.serve.batching import Batcher

#: Document requests parsed, waiting for their sentences or rebuilt at once: each holds a thread
#: while its sentences are decoded, so this many requests' sentences can share a batch.
DOCUMENT_THREADS = 128


class BatchedBackend:
    """``backend``'s interface for a DocumentTranslator in a document thread: ``translate_nbest``
    (``translate`` through it), ``translate_aligned`` and ``translate_scored`` hand the lines (and
    their prefixes) to their batcher of ``batchers`` (``"nbest"``, ``"aligned"``, ``"scored"``; on
    ``loop``) and wait for the results; every other method of the backend runs in ``model_thread``;
    other attributes (``tokenizer``, ``config``, ``name``) are the backend's."""

    def __init__(
        self, backend, batchers: dict[str, Batcher], loop: asyncio.AbstractEventLoop, model_thread: Executor
    ) -> None:
        self._backend, self._batchers, self._loop, self._model_thread = backend, batchers, loop, model_thread
        self.progress = None  # the translator may set it; the batchers report no progress

    def translate_nbest(self, lines: Sequence[str], options: DecodeOptions, prefixes=None) -> NBest:
        return self._batched("nbest", lines, options, prefixes)

    def translate(self, lines: Sequence[str], options: DecodeOptions, prefixes=None) -> list[str]:
        return [hyps[0][1] if hyps else "" for hyps in self.translate_nbest(lines, options, prefixes)]

    def translate_aligned(self, lines: Sequence[str], options: DecodeOptions, prefixes=None) -> AlignedLines:
        return self._batched("aligned", lines, options, prefixes)

    def translate_scored(
        self, lines: Sequence[str], options: DecodeOptions, prefixes=None, *, align: bool = False
    ) -> list[Scored]:
        """As the backend's; the alignment comes with every answer (the batcher's decoding aligns
        always, so that requests with and without alignments share its batches)."""
        return self._batched("scored", lines, options, prefixes)

    def _batched(self, kind: str, lines: Sequence[str], options: DecodeOptions, prefixes):
        submit = self._batchers[kind].submit(list(lines), options, list(prefixes) if prefixes else None)
        return asyncio.run_coroutine_threadsafe(submit, self._loop).result()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._backend, name)
        if inspect.ismethod(value):
            return functools.partial(self._in_model_thread, value)
        return value

    def _in_model_thread(self, method, *args, **kwargs):
        return self._model_thread.submit(method, *args, **kwargs).result()


class Documents:
    """The server's document translator; made in the running event loop, with the batchers."""

    def __init__(
        self, backend, batchers: dict[str, Batcher], model_thread: Executor, language: str | None
    ) -> None:
        self.pool = ThreadPoolExecutor(DOCUMENT_THREADS, thread_name_prefix="aiayn-documents")
        batched = BatchedBackend(backend, batchers, asyncio.get_running_loop(), model_thread)
        self.translator = DocumentTranslator(batched, language=language, split=True, warn=warn_once)

    async def translate(
        self,
        documents: list[str],
        options: DecodeOptions,
        fmt: str,
        alignments: bool,
        scores: bool,
        *,
        confidence: bool = False,
        prefixes: list[str] | None = None,
    ) -> list[DocumentResult]:
        """The documents translated; ``scores``: with the mean scores of their sentences, where the
        search gives them (not with alignments, HTML or Markdown); ``confidence``: with each
        sentence's confidence and word probabilities; ``prefixes``: per document, the target text
        its (first sentence's) translation starts with."""
        run = functools.partial(
            self.translator.translate,
            documents,
            options,
            fmt=fmt,
            alignments=alignments,
            scores=scores,
            confidence=confidence,
            prefixes=prefixes,
        )
        try:
            return await self.run(run)
        except UserError as err:  # what a user can act on: one line, 422
            raise HTTPException(422, str(err)) from None

    async def run(self, function, *args):
        """``function(*args)`` in a document thread (work too long for the event loop)."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, function, *args)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


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
