"""The models behind the server's routes: a :class:`~aiayn.service.registry.Registry` of models
loaded on first use within a budget, a :class:`~aiayn.service.router.Router` from each language
pair to the models that reach it, and per loaded model its batcher (:mod:`aiayn.serve.batching`),
its requests decoded in the server's one model thread.

A request names its pair (``source``, ``target``); a server of one model takes requests without
one. :meth:`Models.resolve` finds the route or answers 400 naming the pairs served; :meth:`Models.
documents` holds the route's models while their documents are translated (the sentences of every
request for a model share its batches, whatever pair asked for them).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from starlette.exceptions import HTTPException

from aiayn.documents.translate import DocumentResult, DocumentTranslator
from aiayn.errors import UserError
from aiayn.serve.batching import Batcher
from aiayn.serve.documents import DOCUMENT_THREADS, BatchedBackend, warn_once
from aiayn.serve.langid import LanguageIdentifier, html_text, language_name
from aiayn.service.catalog import ModelSpec
from aiayn.service.chain import Chain, Tagged
from aiayn.service.languages import normalize
from aiayn.service.registry import Budget, Registry, Unavailable
from aiayn.service.router import Leg, Route, Router

SHOWN = 12  # pairs named in an error


@dataclass
class Served:
    """A loaded model: a translation backend (and the torch model for attention), or a forecaster;
    while loaded in a running server, its batcher."""

    kind: str  # "translation" or "forecast"
    info: dict[str, Any]  # GET /v1/model
    backend: Any = None  # an aiayn.decode.request.Backend (translation)
    model: Any = None  # the torch model: attention (translation) or the forecaster
    stored: dict[str, Any] | None = None  # the checkpoint's config.json (forecast: data, scaler)
    device: Any = None
    batcher: Batcher | None = field(default=None, repr=False)
    task: asyncio.Task | None = field(default=None, repr=False)


def spec_of(served: Served, name: str = "model") -> ModelSpec:
    """The spec of a model loaded by the caller (its languages from ``info``, where known)."""
    languages = served.info.get("languages") or {}
    source, target = languages.get("source"), languages.get("target")
    return ModelSpec(
        name, Path(name), (source,) if source else (), (target,) if target else (), kind=served.kind
    )


class Models:
    """The server's models; ``load(spec)`` makes a :class:`Served` (in the loader thread)."""

    def __init__(
        self,
        specs: list[ModelSpec],
        load: Callable[[ModelSpec], Served],
        *,
        budget: Budget | None = None,
        batching: dict[str, Any] | None = None,
        log: Callable[[str], None] | None = None,
        engine: str = "torch",
    ) -> None:
        self.engine = engine  #: the engine every translation model runs on (torch or ctranslate2)
        self.specs = {spec.name: spec for spec in specs}
        self.kind = specs[0].kind
        self.batching = batching or {"max_tokens": 0, "max_wait_s": 0.0}
        self.model_thread = ThreadPoolExecutor(1, thread_name_prefix="aiayn-model")  # torch: one thread
        self.loader = ThreadPoolExecutor(1, thread_name_prefix="aiayn-loader")
        self.pool = ThreadPoolExecutor(DOCUMENT_THREADS, thread_name_prefix="aiayn-documents")
        self.registry: Registry[Served] = Registry(
            specs,
            load,
            self.loader,
            budget=budget or Budget(),
            opened=self._open,
            closed=self._close,
            log=log or _log,
        )
        self.router = Router([s for s in specs if s.kind == "translation" and s.sources and s.targets])
        self.translators: dict[tuple[Leg, ...], DocumentTranslator] = {}
        self.langid = LanguageIdentifier()  # source "auto": loaded at its first text
        #: told what each model translated, ``observer(model, sentences, characters)``, by
        #: :meth:`translated` (the metrics' counters, :mod:`aiayn.serve.metrics`); None: no one
        self.observer: Callable[[str, int, int], None] | None = None

    @classmethod
    def single(cls, served: Served, batching: dict[str, Any] | None = None) -> "Models":
        """A server of one model, loaded by the caller."""
        engine = served.backend.name if served.backend is not None else "torch"
        models = cls([spec_of(served)], lambda spec: served, batching=batching, engine=engine)
        models.registry.preload("model")
        return models

    @property
    def only(self) -> str | None:
        """The name of the one model of a server of one model."""
        return next(iter(self.specs)) if len(self.specs) == 1 else None

    # --- routes -------------------------------------------------------------------------------------
    def resolve(self, source: str | None, target: str | None) -> Route:
        """The route of a pair; without one, a server of one model's model (else a 400)."""
        if source is None and target is None and self.only is not None:
            spec = self.specs[self.only]
            if len(spec.pairs) == 1:  # its one pair (a multi-target model's piece included)
                return self.router.route(*spec.pairs[0]) or Route((Leg(spec.name, *spec.pairs[0]),))
            if not spec.pairs:  # languages unknown: the model as it is
                return Route((Leg(spec.name, _first(spec.sources), _first(spec.targets)),))
        if not (source and target):
            raise HTTPException(400, f"{'target' if source else 'source'}: needed: {self.serves()}")
        route = self.router.route(normalize(source), normalize(target))
        if route is None:
            raise HTTPException(400, f"{source}->{target} is not served: {self.serves()}")
        return route

    def sources_to(self, target: str | None) -> list[str]:
        """The served source languages that reach ``target`` (all of them without a target)."""
        if target is None:
            return self.router.sources
        return [s for s in self.router.sources if self.router.route(s, normalize(target))]

    async def identify(self, texts: list[str], fmt: str, sources: list[str]) -> list[tuple[str, float]]:
        """``sources`` ranked by how likely the texts together are in each (HTML by its text), best
        first, with the identifier's confidence in percent; a :class:`UserError` without py3langid."""
        text = "\n".join(html_text(t) if fmt == "html" else t for t in texts)
        return await self.run(self.langid.rank_among, text, sources)

    def serves(self) -> str:
        """The pairs served, for an error saying what is (the first :data:`SHOWN` of them)."""
        pairs = sorted(self.router.routes)
        if not pairs:
            return (
                "this server does not know its model's languages "
                "(serve it with --source-lang and --target-lang)"
            )
        shown = ", ".join(f"{_named(s)} to {_named(t)}" for s, t in pairs[:SHOWN])
        more = f" and {len(pairs) - SHOWN} more pairs (GET /languages)" if len(pairs) > SHOWN else ""
        return f"this server translates {shown}{more}"

    # --- using models -------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def use(self, route: Route):
        """The route's loaded models (each a :class:`Served`), held while the block runs; a model
        that cannot load is a 503."""
        try:
            async with self.registry.use_all(route.models) as served:
                yield served
        except Unavailable as err:
            raise HTTPException(503, str(err)) from None

    def translator(self, route: Route, served: list[Served]) -> DocumentTranslator:
        """The document translator of a route whose models ``served`` are held."""
        found = self.translators.get(route.legs)
        if found is None:
            backends = [self.backend(leg, s) for leg, s in zip(route.legs, served)]
            backend = backends[0] if len(backends) == 1 else Chain(backends)
            language = route.legs[0].source
            found = DocumentTranslator(backend, language=language, split=True, warn=warn_once)
            self.translators[route.legs] = found
        return found

    async def translate(
        self, route: Route, served: list[Served], documents: list[str], options, **kwargs
    ) -> list[DocumentResult]:
        """The documents translated along ``route`` (:meth:`DocumentTranslator.translate
        <aiayn.documents.translate.DocumentTranslator.translate>`); a :class:`UserError` is a 422."""
        run = functools.partial(self.translator(route, served).translate, documents, options, **kwargs)
        results = await self._translating(run)
        sentences = [source for result in results for source, _ in result.sentences]
        self.translated(route, len(sentences), sum(len(sentence) for sentence in sentences))
        return results

    async def translate_file(self, route: Route, served: list[Served], found, options) -> Any:
        """A file read by :func:`aiayn.documents.files.read_file` translated along ``route``: its
        :class:`~aiayn.documents.files.TranslatedFile`; a :class:`UserError` is a 422."""
        translated = await self._translating(
            functools.partial(found.translate, self.translator(route, served), options)
        )
        self.translated(route, translated.sentences, translated.characters)
        return translated

    async def _translating(self, run):
        try:
            return await self.run(run)
        except UserError as err:  # what a user can act on: one line, 422
            raise HTTPException(422, str(err)) from None

    def translated(self, route: Route, sentences: int, characters: int) -> None:
        """Tell :attr:`observer` that ``sentences`` source sentences of ``characters`` characters
        were translated along ``route``: each model of the route translated each of them (a pivot's
        bridge models too). What translates without :meth:`translate` calls it where its
        translation ends."""
        if self.observer is not None:
            for leg in route.legs:
                self.observer(leg.model, sentences, characters)

    def backend(self, leg: Leg, served: Served):
        """The leg's model as a backend of its batcher (for a document thread: it waits there)."""
        batched = BatchedBackend(served.backend, served.batcher, asyncio.get_running_loop())
        return Tagged(batched, leg.token) if leg.token else batched

    async def run(self, function, *args):
        """``function(*args)`` in a document thread (work too long for the event loop). A request
        cancelled meanwhile waits for the thread to finish: its models stay held until then."""
        done = asyncio.get_running_loop().run_in_executor(self.pool, function, *args)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            await asyncio.wait([done])
            raise

    async def run_model(self, function, *args):
        """``function(*args)`` in the model thread (one model runs at a time)."""
        return await asyncio.get_running_loop().run_in_executor(self.model_thread, function, *args)

    # --- loading and unloading ------------------------------------------------------------------------
    def _open(self, served: Served) -> None:
        """Start a loaded translation model's batcher (in the event loop)."""
        if served.kind != "translation":
            return
        count = _token_counter(served.backend.tokenizer)
        served.batcher = Batcher(served.backend.translate, count, self.model_thread, **self.batching)
        served.task = asyncio.get_running_loop().create_task(served.batcher.run())

    def _close(self, served: Served):
        """Stop an unloaded model's batcher; the task, which ends once cancelled (the model is held
        until then)."""
        task = served.task
        if task is not None:
            task.cancel()
            served.batcher.close("the model was unloaded")
        self.translators.clear()  # they hold the batchers of the models they were made with
        served.batcher = served.task = None
        return task

    async def stop(self) -> None:
        """Unload every model, stopping its batcher (requests still waiting get an error); then
        :meth:`close` in a thread."""
        await self.registry.unload_all()

    def close(self) -> None:
        """Stop the threads (after :meth:`stop`)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.loader.shutdown(wait=True)
        self.model_thread.shutdown(wait=True)

    def listing(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: every model, its languages, whether it is loaded."""
        return [
            {
                "name": spec.name,
                "kind": spec.kind,
                "path": str(spec.path),
                "languages": {"source": list(spec.sources), "target": list(spec.targets)},
                "bytes": spec.size,
                **self.registry.status(spec.name),
            }
            for spec in self.specs.values()
        ]

    def languages(self) -> list[dict[str, Any]]:
        """Every source language with every target it reaches (LibreTranslate's ``GET /languages``),
        and for the pivoted ones the languages they go through (``pivots``)."""
        codes = sorted({c for pair in self.router.routes for c in pair})
        return [self._language(code) for code in codes]

    def _language(self, code: str) -> dict[str, Any]:
        targets = self.router.targets(code)
        routes = [self.router.route(code, t) for t in targets]
        pivots = {r.legs[-1].target: r.languages[1:-1] for r in routes if r is not None and r.pivoted}
        listed = {"code": code, "name": language_name(code), "targets": targets}
        return {**listed, "pivots": pivots} if pivots else listed


def _named(code: str) -> str:
    return f"{language_name(code)} ({code})"


def _first(codes: tuple[str, ...]) -> str | None:
    return codes[0] if codes else None


def _token_counter(tokenizer):
    def count(line: str) -> int:
        return len(tokenizer.encode(line)) + 1  # + EOS

    return count


def _log(message: str) -> None:
    print(f"aiayn serve: {message}", file=sys.stderr, flush=True)
