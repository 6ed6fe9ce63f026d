"""Prometheus metrics of ``aiayn serve --metrics``: ``GET /metrics`` in Prometheus' text format
(``pip install 'aiayn[serve]'`` brings ``prometheus_client``).

* Requests: :class:`RequestMetrics`, a pure ASGI middleware outside every other, sees the status
  each client got (4xx from the error handlers, 413 from the body limit, 429 from admission, 500),
  labelled by the route's template (``/v1/translate``, not the raw URL: a path no route serves is
  ``unmatched``, so a scanner cannot grow the label set) and the method (an unusual one is ``other``).
* Translations: each model counts the sentences and characters it translated, told by
  :attr:`aiayn.serve.models.Models.observer` (:meth:`Metrics.translated`).
* At scrape time, from the server's state: models loaded, model loads, requests admitted, requests
  waiting in each loaded model's batcher; and the process (memory, CPU, open files) and platform.

Each application has its own :class:`Metrics` and its own registry (never ``prometheus_client``'s
global one). One process per replica: no multiprocess mode.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request, Response
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from starlette.exceptions import HTTPException
from starlette.routing import Match, Mount

from aiayn.serve.quotas import bears

#: Request latency buckets, in seconds: a cached page to a long document (or a cold model's load).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
UNMATCHED = "unmatched"  #: the route label of a path no route serves
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class Metrics:
    """The metrics of one application; ``token``: ``GET /metrics`` then needs ``Authorization:
    Bearer TOKEN``. :meth:`install` it on the application (once: it registers the app's state)."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "aiayn_http_requests",
            "HTTP requests answered, by route template, method and the status the client got",
            ["route", "method", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "aiayn_http_request_duration_seconds",
            "Time from a request's arrival to its answer's end, by route template",
            ["route"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "aiayn_http_requests_in_flight", "HTTP requests being answered now", registry=registry
        )
        self.sentences = Counter(
            "aiayn_translated_sentences",
            "Source sentences translated, by model (over a pivot, by each model of the route)",
            ["model"],
            registry=registry,
        )
        self.characters = Counter(
            "aiayn_translated_characters",
            "Characters of the source sentences translated, by model (over a pivot, by each model)",
            ["model"],
            registry=registry,
        )
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)

    def translated(self, model: str, sentences: int, characters: int) -> None:
        """``model`` translated ``sentences`` sentences of ``characters`` characters (the
        :attr:`~aiayn.serve.models.Models.observer`)."""
        self.sentences.labels(model).inc(sentences)
        self.characters.labels(model).inc(characters)

    def install(self, app: FastAPI) -> None:
        """Count ``app``'s requests and translations, collect its state at scrape time, and serve
        ``GET /metrics``: called last, so that the middleware is outside every other."""
        state = app.state
        self.registry.register(_ServerState(state.models, state.admission))
        state.models.observer = self.translated
        app.add_middleware(RequestMetrics, metrics=self, routes=app.router.routes)
        app.get("/metrics", include_in_schema=False)(self.scrape)

    async def scrape(self, request: Request) -> Response:
        """``GET /metrics``, in the format the scraper accepts (Prometheus' text format, or
        OpenMetrics), collected in the event loop, where the state it reads changes."""
        if self.token is not None:
            if not bears(request, self.token):
                raise HTTPException(
                    401,
                    "missing or wrong metrics token: send Authorization: Bearer TOKEN",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(self.registry), headers={"Content-Type": content_type})


class RequestMetrics:
    """ASGI middleware: each HTTP request counted with the status sent to the client (500 when the
    application failed before answering: the server's error page), timed, and in flight meanwhile."""

    def __init__(self, app, metrics: Metrics, routes: list) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def sending(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        metrics, start = self.metrics, time.perf_counter()
        route = route_template(scope, self.routes)
        metrics.in_flight.inc()
        try:
            await self.app(scope, receive, sending)
        finally:
            metrics.in_flight.dec()
            method = scope["method"] if scope["method"] in METHODS else "other"
            metrics.requests.labels(route, method, str(status)).inc()
            metrics.latency.labels(route).observe(time.perf_counter() - start)


def route_template(scope, routes: list) -> str:
    """The path template of the route that serves the request, found as the router finds it (the
    first full match, else the first partial one: a method not allowed), before the application
    sees the request (the body limit may answer first); a mount's with ``/{path}``; :data:`UNMATCHED`
    for none."""
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            break
        if match is Match.PARTIAL and partial is None:
            partial = route
    else:
        route = partial
    if route is None:
        return UNMATCHED
    if isinstance(route, Mount):
        return f"{route.path}/{{path}}"
    return getattr(route, "path", UNMATCHED)


class _ServerState:
    """What the server holds now, collected at each scrape: models loaded and their loads, requests
    admitted, requests waiting in each loaded model's batcher."""

    def __init__(self, models, admission) -> None:
        self.models, self.admission = models, admission

    def collect(self):
        slots = self.models.registry.slots
        yield GaugeMetricFamily(
            "aiayn_models_loaded",
            "Models in memory now",
            value=sum(slot.value is not None for slot in slots.values()),
        )
        loads = CounterMetricFamily("aiayn_model_loads", "Times each model was loaded", labels=["model"])
        waiting = GaugeMetricFamily(
            "aiayn_batcher_queue_length",
            "Requests waiting in a loaded model's batcher, not yet in the batch being decoded",
            labels=["model"],
        )
        for name, slot in slots.items():
            loads.add_metric([name], slot.loads)
            batcher = getattr(slot.value, "batcher", None)
            if batcher is not None:
                waiting.add_metric([name], batcher.queue.qsize() + len(batcher.held))
        yield loads
        yield waiting
        yield GaugeMetricFamily(
            "aiayn_requests_admitted",
            "Translation requests in the server now (waiting for a model, in a batcher or decoded), "
            "as --max-queue bounds them",
            value=self.admission.count,
        )
        yield GaugeMetricFamily(
            "aiayn_requests_admitted_limit",
            "--max-queue: one more translation request is refused (429)",
            value=self.admission.limit,
        )
