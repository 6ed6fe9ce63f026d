"""The FastAPI application of ``aiayn serve``: a JSON API over one trained model, and the web page.

Routes (``/docs`` is FastAPI's page documenting them):

* ``GET /health``; ``GET /v1/model``: kind, engine, config, parameters, languages, vocabulary.
* Translation runs: ``POST /v1/translate`` (documents in a ``format``, each split into sentences,
  translated whole and rebuilt, :mod:`aiayn.serve.documents`; the options and defaults of ``aiayn
  translate``: beam search or, with ``sample``, sampling with its rules; the sentences of requests
  that arrive together are decoded in one batch, :mod:`aiayn.serve.batching`, a sampling request's
  alone; a ``glossary`` of terms, a ``prefix`` per document, ``scores``: each translation's
  confidence and its words' probabilities), ``POST /v1/attention`` (one sentence, searched, from a
  prefix, with a glossary: pieces, translation, each piece's probability, every layer's and head's
  weights) and ``POST /v1/choices`` (the model's k most probable next pieces after a prefix of a
  sentence's translation); LibreTranslate's API beside them (:mod:`aiayn.serve.libretranslate`).
* Forecasting runs: ``POST /v1/forecast`` (the last ``input_len`` rows -> the next ``horizon``).
* ``GET /``: the page (``static/index.html``), its files under ``/static``.

Every error is a 4xx with one line, ``{"error": "field: what is wrong"}``; the model runs in one
worker thread, so a bad request never reaches it and never stops the server. Keys and quotas
(``--api-keys``, ``--req-limit``, ...) are ``app.state.access`` (:mod:`aiayn.serve.quotas`): each
route that translates or detects calls its ``admit`` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import swagger_ui
import torch
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from aiayn.decode.attention import sentence_attention
from aiayn.decode.choices import next_choices
from aiayn.decode.glossary import check_glossary
from aiayn.decode.request import Wanted
from aiayn.decode.search import DecodeOptions
from aiayn.decode.translator import LINE_BREAKS, word_probabilities
from aiayn.documents.translate import DocumentResult
from aiayn.documents.types import FORMATS
from aiayn.errors import UserError
from aiayn.forecast.data import Scaler
from aiayn.serve import files, libretranslate
from aiayn.serve.documents import Admission
from aiayn.serve.downloads import Downloads, LocalDownloads
from aiayn.serve.models import Models, Served
from aiayn.serve.quotas import Access, bearer, bears
from aiayn.service.router import Route

if TYPE_CHECKING:  # prometheus_client: imported only with --metrics
    from aiayn.serve.metrics import Metrics

STATIC = Path(__file__).resolve().parent / "static"
MAX_BEAM = 64  # a request's beam (and n-best) at most: a larger one would only tie up the model
ATTENTION_MAX_CHARS = 2000  # /v1/attention's one sentence: its maps grow with the square of its length
GLOSSARY_MAX_PAIRS = 1000  # a request's glossary: each term is matched against every sentence
GLOSSARY_MAX_CHARS = 200  # a glossary term, either side
MAX_CHOICES = 50  # /v1/choices' k at most
FILE_ROUTE = "/translate_file"
FORM_BYTES = 64 * 1024  # a file request's body beyond its file: the form's other fields and boundaries


@dataclass
class Limits:
    """What one request may ask for, and who may ask."""

    max_sentences: int = 256  # entries of text (documents) per request
    max_chars: int = 100_000  # characters per document
    max_body_bytes: int = 1_000_000
    api_key: str | None = None
    max_queue: int = 1024  # translation requests in the server at once; one more gets a 429
    max_file_bytes: int = 20_000_000  # a file sent to /translate_file (its body may be this much more)
    max_file_chars: int = 1_000_000  # the text of such a file to translate
    download_s: int = 30 * 60  # how long a translated file waits for its download
    files: bool = True  # POST /translate_file (False: --disable-files-translation, a 403)


# --- request bodies -------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class Pair(_Strict):
    source: str | None = Field(
        None,
        description="the source language (ISO 639-1, e.g. de), or auto: detected among the served "
        "ones; optional on a server of one model",
    )
    target: str | None = Field(None, description="the target language; optional on a server of one model")


class SearchOptions(Pair):
    beam: int = Field(4, description="beam size; 1 = greedy search (the paper: 4)")
    alpha: float = Field(0.6, description="GNMT length penalty alpha (the paper: 0.6)")
    max_len_a: float = Field(1.0, description="at most a * source length + b tokens")
    max_len_b: int = Field(50, description="(the paper's a = 1, b = 50: source length + 50)")
    engine: str | None = Field(None, description="optional: the engine this server runs")
    glossary: list[list[str]] | None = Field(
        None,
        description="[[source term, target term], ...] (at most 1000): where a source term occurs "
        "(whole words, any case, inflected forms in the model's source language), its target term "
        "appears in the translation, exactly as written, once per occurrence (constrained beam search; "
        "the torch engine, not with sample)",
    )


class TranslateRequest(SearchOptions):
    text: list[str] = Field(
        description="documents to translate: each is split into sentences (line breaks and blank lines "
        "kept), translated whole and rebuilt"
    )
    format: Literal[FORMATS] = Field("text", description="text, html or markdown: what each document is")
    alignments: bool = Field(
        False,
        description="text format: add each document's word alignment, [[source word, target word], ...]",
    )
    nbest: int = Field(
        1, description="hypotheses per sentence, best first (at most beam; with sample, samples)"
    )
    sample: bool = Field(False, description="sample instead of searching (beam is then unused)")
    temperature: float | None = Field(
        None, description="with sample: divide the log-probabilities by it (default: 1)"
    )
    top_k: int | None = Field(
        None, description="with sample: the k most probable tokens only (default: 0 = all)"
    )
    top_p: float | None = Field(
        None, description="with sample: nucleus sampling threshold (default: 1 = off)"
    )
    seed: int | None = Field(
        None,
        description="with sample: the same seed and the same text give the same samples (a sampling "
        "request is decoded alone); default: a new seed each request",
    )
    prefix: list[str] | None = Field(
        None,
        description='one per entry of text ("" for none): the translation of the document\'s first '
        "sentence starts with it, and the model continues from there",
    )
    scores: bool = Field(
        False,
        description="add each translation's confidence {log_prob: the mean log-probability of its "
        "tokens, probability} and sentence_scores, one per sentence: [{log_prob, probability, words: "
        "[[word, probability], ...], terms: [glossary terms met, asked]}] (not with nbest > 1)",
    )


#: The sampling fields of :class:`TranslateRequest`; each needs ``sample: true``, as each of
#: ``aiayn translate``'s sampling flags needs ``--sample``.
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "seed")


class AttentionRequest(SearchOptions):
    text: str = Field(description="one sentence")
    prefix: str = Field("", description="the start of the translation; the model continues from there")


class ChoicesRequest(Pair):
    text: str = Field(description="one sentence")
    prefix: str = Field(
        "", description="the start of its translation: the words before the place asked about"
    )
    k: int = Field(5, description="how many of the most probable next pieces (1 to 50)")


class ForecastRequest(_Strict):
    rows: list[list[float]] = Field(description="the last input_len rows, one value per input column")


class Hypothesis(BaseModel):
    text: str
    score: float | None  # log P / GNMT length penalty; None where an engine gives none


class Confidence(BaseModel):
    log_prob: float  # the mean log-probability of the tokens (EOS included)
    probability: float  # exp(log_prob)


class SentenceScore(Confidence):
    words: list[tuple[str, float]]  # each word of the sentence's translation, its probability
    terms: tuple[int, int]  # glossary terms met, asked


class Translation(Hypothesis):
    nbest: list[Hypothesis]
    sentences: list[tuple[str, str]]  # (source sentence, its translation), in order
    alignment: list[tuple[int, int]] | None = None  # with alignments: over text.split() of both sides
    confidence: Confidence | None = None  # with scores
    sentence_scores: list[SentenceScore] | None = None  # with scores: one per sentence


class Step(BaseModel):
    model: str  # the model's name (GET /v1/models)
    source: str | None
    target: str | None


class Detected(BaseModel):
    language: str
    confidence: float  # percent, among the served source languages


class TranslateResponse(BaseModel):
    translations: list[Translation]
    engine: str
    route: list[Step]  # the models it went through: one, or several for a pivot
    detected: Detected | None = None  # with source "auto"


# --- the application ------------------------------------------------------------------------------


def create_app(
    models: Models | Served,
    limits: Limits,
    batcher_settings: dict[str, Any],
    cors: str | None = None,
    metrics: Metrics | None = None,
    access: Access | None = None,
    downloads: Downloads | None = None,
):
    """The application over ``models`` (or one model, loaded: a :class:`Served`);
    ``batcher_settings``: ``max_tokens`` (0 = no batching across requests) and ``max_wait_s``;
    ``metrics``: ``GET /metrics`` and what it counts (:mod:`aiayn.serve.metrics`; one per app);
    ``access``: keys and quotas (:mod:`aiayn.serve.quotas`; default: none), ``app.state.access``;
    ``downloads``: where translated files wait (default: a temporary folder of the process)."""
    if isinstance(models, Served):
        models = Models.single(models)
    models.batching = batcher_settings

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await models.stop()  # requests still waiting (past the graceful shutdown) get an error
        await asyncio.to_thread(models.close)
        app.state.downloads.close()

    app = FastAPI(
        title="aiayn",
        summary="The Transformer of 'Attention Is All You Need'",
        lifespan=lifespan,
        docs_url=None,  # served by _docs from local files instead of a CDN
        redoc_url=None,
    )
    app.state.models, app.state.limits = models, limits
    app.state.admission = Admission(limits.max_queue)
    app.state.downloads = downloads if downloads is not None else LocalDownloads(limits.download_s)
    app.state.access = access or Access()  # every translation route: await access.admit(...)
    _errors(app)
    app.add_middleware(
        BodyLimit, limit=limits.max_body_bytes, larger={FILE_ROUTE: limits.max_file_bytes + FORM_BYTES}
    )
    if cors:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=[cors],
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    _routes(app, _key_check(limits.api_key))
    _docs(app)
    if metrics is not None:  # last: its middleware sees every answer, the body limit's too
        metrics.install(app)
    return app


def _docs(app: FastAPI) -> None:
    """FastAPI's Swagger UI page at ``/docs``, its script and style from the ``swagger-ui-py``
    package (Swagger UI 5, which reads OpenAPI 3.1) rather than a CDN: the page works offline."""
    assets = Path(swagger_ui.__file__).resolve().parent / "static"
    app.mount("/docs/assets", StaticFiles(directory=assets), name="docs-assets")

    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url,
            title="aiayn API",
            swagger_js_url="/docs/assets/swagger-ui-bundle.js",
            swagger_css_url="/docs/assets/swagger-ui.css",
            swagger_favicon_url="data:,",
        )

    app.get("/docs", include_in_schema=False)(docs)


def _routes(app: FastAPI, key) -> None:
    app.get("/health", summary="Liveness")(health)
    known = Depends(_stored_key)  # --api-keys: a key, not counted
    app.get("/v1/model", summary="A served model (its pair's)", dependencies=[key, known])(model_info)
    app.get(
        "/v1/models", summary="Every served model, its languages, whether loaded", dependencies=[key, known]
    )(models_info)
    app.post(
        "/v1/translate",
        summary="Translate documents",
        dependencies=[key],
        response_model=TranslateResponse,
        response_model_exclude_unset=True,  # "alignment" only when asked
    )(translate)
    app.post("/v1/attention", summary="What the model attends to for one sentence", dependencies=[key])(
        attention
    )
    app.post("/v1/choices", summary="The model's next choices after a prefix", dependencies=[key])(choices)
    app.post("/v1/forecast", summary="Forecast the next horizon steps", dependencies=[key])(forecast)
    libretranslate.add_routes(app)
    files.add_routes(app)
    app.get("/", include_in_schema=False)(page)
    if (STATIC / "index.html").is_file():
        app.mount("/static", StaticFiles(directory=STATIC), name="static")


async def health() -> dict[str, str]:
    return {"status": "ok"}


async def model_info(
    request: Request, source: str | None = None, target: str | None = None
) -> dict[str, Any]:
    """The model of a pair (its last model, for a pivot): loaded to be described."""
    models: Models = request.app.state.models
    route = models.resolve(source, target)
    async with models.use(Route(route.legs[-1:])) as (served,):
        return {**served.info, "name": route.legs[-1].model}


async def models_info(request: Request) -> dict[str, Any]:
    models: Models = request.app.state.models
    return {"models": models.listing(), "loaded": models.registry.loaded()}


async def page():
    if (STATIC / "index.html").is_file():
        return FileResponse(STATIC / "index.html")
    return HTMLResponse("<p>aiayn serve: the page is not installed; the API is documented at /docs.</p>")


async def translate(body: TranslateRequest, request: Request) -> dict[str, Any]:
    state, models = request.app.state, request.app.state.models
    await state.access.admit(request, bearer(request), sum(map(len, body.text)), len(body.text))
    _check_documents(body.text, state.limits)
    prefixes = _check_prefixes(body.prefix, body.text, state.limits)
    if body.scores and body.nbest > 1:
        raise _bad(422, "scores: for the best translation only; not with nbest > 1")
    route, detected = await _route(request, body, body.text, body.format)
    options = _options(body, models.engine, route, nbest=body.nbest, **_sampling(body))
    wanted = Wanted(scores=True, confidence=body.scores, alignment=body.alignments)
    with state.admission.slot():  # waiting for a model to load counts
        async with models.use(route) as served:
            results = await models.translate(
                route, served, body.text, options, fmt=body.format, wanted=wanted, prefixes=prefixes
            )
    translations = [_translation(result, body.alignments, body.scores) for result in results]
    answer = {"translations": translations, "engine": models.engine, "route": route.describe()}
    return {**answer, "detected": detected} if detected else answer


async def _route(
    request: Request, body: Pair, texts: list[str], fmt: str = "text"
) -> tuple[Route, dict | None]:
    """The request's route (with ``source: auto``, the language detected among those that reach the
    target, and the detection)."""
    models: Models = request.app.state.models
    _kind(models, "translation")
    if body.source != "auto":
        return models.resolve(body.source, body.target), None
    detected = await detect(request.app.state, texts, fmt, body.target)
    return models.resolve(detected["language"], body.target), detected


async def detect(state, texts: list[str], fmt: str, target: str | None) -> dict[str, Any]:
    """The language of the texts together among the served sources that reach ``target`` (all of
    them without a target): ``{"language", "confidence"}``."""
    models: Models = state.models
    candidates = models.sources_to(target)
    if not candidates:
        raise _bad(400, f"{target} is not served as a target: {models.serves()}")
    try:
        ranked = await models.identify(texts, fmt, candidates)
    except UserError as err:  # the identifier is not installed
        raise _bad(400, str(err)) from None
    return {"language": ranked[0][0], "confidence": ranked[0][1]}


def _check_engine(body: SearchOptions, route: Route, engine: str) -> None:
    if body.glossary and route.pivoted:
        raise _bad(
            422,
            f"glossary: not over a pivot ({'->'.join(route.languages)}): its source terms are not in "
            "the last model's source language; ask a pair that one model translates",
        )
    if body.glossary and engine != "torch":
        raise _bad(
            422, f"glossary: the {engine} engine has no lexical constraints; serve with --engine torch"
        )


async def attention(body: AttentionRequest, request: Request) -> dict[str, Any]:
    """One sentence's attention; over a pivot, the last model's, on the sentence the earlier ones
    made of it (``bridge``)."""
    await request.app.state.access.admit(request, bearer(request), len(body.text), 1)
    _check_sentence(body.text)
    _check_prefix(body.prefix)
    route, detected = await _route(request, body, [body.text])
    models: Models = request.app.state.models
    options = _options(body, models.engine, route, nbest=1)
    async with models.use(route) as served:
        text, bridge = await _bridge(models, route, served, body.text, options)
        last = served[-1]
        text = _tagged(text, route)
        run = functools.partial(
            sentence_attention, last.model, last.backend.tokenizer, text, options,
            device=last.device, prefix=body.prefix,
        )  # fmt: skip
        found = await models.run_model(run)
        eos = last.backend.tokenizer.id_to_piece(last.model.config.eos_id, target=True)
    pieces = found.predicted_pieces[:-1] if found.predicted_pieces[-1:] == [eos] else found.predicted_pieces
    log_probs = [math.log(p) if p > 0 else -math.inf for p in found.probabilities]
    answer = {
        "source_pieces": found.source_pieces,
        "target_pieces": found.target_pieces,  # what each target position reads (<s> first)
        "predicted_pieces": found.predicted_pieces,  # what each target position predicts (</s> last)
        "probabilities": found.probabilities,  # of each predicted piece
        "translation": found.translation,
        "words": [list(pair) for pair in word_probabilities(found.translation, pieces, log_probs)],
        "score": found.score,
        "attention": {kind: [m.tolist() for m in layers] for kind, layers in found.maps.items()},
        "route": route.describe(),
        "bridge": bridge,  # over a pivot: the sentence in each bridge language
    }
    return {**answer, "detected": detected} if detected else answer


async def _bridge(models: Models, route: Route, served: list[Served], text: str, options: DecodeOptions):
    """What the last model of ``route`` reads for ``text``: ``text`` itself, or over a pivot the
    earlier models' translation of it, one after the other (searched with ``options``); and the
    sentence in each bridge language, in order."""
    bridge = []
    for leg, model in zip(route.legs[:-1], served[:-1]):  # as a chain translates a sentence
        backend = models.backend(leg, model)
        text = (await models.run(backend.translate, [text], replace(options, nbest=1)))[0].text
        bridge.append(text)
    return text, bridge


def _tagged(text: str, route: Route) -> str:
    """The sentence as the last model reads it: a multi-target model's starts with its ``>>xx<<``."""
    token = route.legs[-1].token
    return f"{token} {text}" if token else text


async def choices(body: ChoicesRequest, request: Request) -> dict[str, Any]:
    """The ``k`` most probable next pieces after ``prefix`` in the translation of ``text`` (over a
    pivot: of its bridge sentence, made with the default search), most probable first, and ``rest``:
    the probability of every other piece (they sum to one)."""
    await request.app.state.access.admit(request, bearer(request), len(body.text), 1)
    _check_sentence(body.text)
    _check_prefix(body.prefix)
    if not 1 <= body.k <= MAX_CHOICES:
        raise _bad(422, f"k: must be in 1..{MAX_CHOICES}, got {body.k}")
    route, _ = await _route(request, body, [body.text])
    models: Models = request.app.state.models
    async with models.use(route) as served:
        text, bridge = await _bridge(models, route, served, body.text, DecodeOptions())
        last = served[-1]
        run = functools.partial(
            next_choices, last.model, last.backend.tokenizer, _tagged(text, route), body.prefix, body.k,
            last.device,
        )  # fmt: skip
        found = await models.run_model(run)
    return {
        "choices": [asdict(choice) for choice in found.choices],
        "rest": found.rest,
        "route": route.describe(),
        "bridge": bridge,
    }


async def forecast(body: ForecastRequest, request: Request) -> dict[str, Any]:
    models: Models = request.app.state.models
    await request.app.state.access.admit(request, bearer(request), 0, 1)
    _kind(models, "forecast")
    async with models.use(models.resolve(None, None)) as (served,):
        info = served.info
        rows = np.asarray(body.rows, dtype=np.float64)
        expected = (info["input_len"], len(info["input_columns"]))
        if rows.ndim != 2 or rows.shape != expected:
            raise _bad(
                422,
                f"rows: expected {expected[0]} rows of {expected[1]} values "
                f"({', '.join(info['input_columns'])}), got shape {list(rows.shape)}",
            )
        if not np.isfinite(rows).all():
            raise _bad(422, "rows: every value must be a finite number")
        values = await models.run_model(functools.partial(_forecast, served, rows))
    return {"columns": info["output_columns"], "horizon": info["horizon"], "forecast": values.tolist()}


# --- helpers ----------------------------------------------------------------------------------------


def _kind(models: Models, kind: str) -> None:
    if models.kind != kind:
        raise _bad(404, f"this server runs a {models.kind} model; this route needs a {kind} model")


def _check_documents(documents: list[str], limits: Limits) -> None:
    if not documents:
        raise _bad(422, "text: must hold at least one document")
    if len(documents) > limits.max_sentences:
        raise _bad(413, f"text: at most {limits.max_sentences} entries per request, got {len(documents)}")
    for i, document in enumerate(documents):
        if len(document) > limits.max_chars:
            raise _bad(
                413, f"text[{i}]: at most {limits.max_chars} characters per document, got {len(document)}"
            )


def _check_sentence(text: str) -> None:
    if not text.strip():
        raise _bad(422, "text: must not be blank")
    if len(text) > ATTENTION_MAX_CHARS:
        raise _bad(422, f"text: at most {ATTENTION_MAX_CHARS} characters (one sentence), got {len(text)}")
    if "\n" in text or "\r" in text:
        raise _bad(422, "text: one sentence (no line breaks)")


def _check_prefixes(prefixes: list[str] | None, documents: list[str], limits: Limits) -> list[str] | None:
    """One prefix per document, each one line within the documents' size limit; None for none."""
    if prefixes is None:
        return None
    if len(prefixes) != len(documents):
        raise _bad(422, f"prefix: one per entry of text ({len(documents)}), got {len(prefixes)}")
    for i, prefix in enumerate(prefixes):
        if len(prefix) > limits.max_chars:
            raise _bad(413, f"prefix[{i}]: at most {limits.max_chars} characters, got {len(prefix)}")
        if LINE_BREAKS.search(prefix):
            raise _bad(422, f"prefix[{i}]: one line (no line breaks)")
    return prefixes if any(prefixes) else None


def _check_prefix(prefix: str) -> None:
    if len(prefix) > ATTENTION_MAX_CHARS:
        raise _bad(422, f"prefix: at most {ATTENTION_MAX_CHARS} characters, got {len(prefix)}")
    if LINE_BREAKS.search(prefix):
        raise _bad(422, "prefix: one line (no line breaks)")


def _glossary(pairs: list[list[str]] | None) -> tuple[tuple[str, str], ...]:
    """The request's glossary, checked: at most :data:`GLOSSARY_MAX_PAIRS` pairs of non-empty terms
    of one line and at most :data:`GLOSSARY_MAX_CHARS` characters each."""
    if not pairs:
        return ()
    if len(pairs) > GLOSSARY_MAX_PAIRS:
        raise _bad(422, f"glossary: at most {GLOSSARY_MAX_PAIRS} pairs, got {len(pairs)}")
    try:
        glossary = check_glossary(pairs)
    except UserError as err:
        raise _bad(422, str(err)) from None
    for k, pair in enumerate(glossary):
        if any(len(term) > GLOSSARY_MAX_CHARS or LINE_BREAKS.search(term) for term in pair):
            raise _bad(
                422, f"glossary: entry {k + 1}: terms of one line, at most {GLOSSARY_MAX_CHARS} characters"
            )
    return glossary


def _options(body: SearchOptions, engine: str, route: Route, nbest: int, **sampling: Any) -> DecodeOptions:
    """The request's search, checked before any model is loaded for it."""
    for name, value in (("beam", body.beam), ("nbest", nbest)):
        if value > MAX_BEAM:  # DecodeOptions checks the lower bounds
            raise _bad(422, f"{name}: must be <= {MAX_BEAM}")
    if body.engine is not None and body.engine != engine:
        raise _bad(422, f"engine: this server runs {engine!r}; valid: {engine}")
    _check_engine(body, route, engine)
    glossary = _glossary(body.glossary)
    try:
        return DecodeOptions(
            beam=body.beam,
            alpha=body.alpha,
            nbest=nbest,
            max_len_a=body.max_len_a,
            max_len_b=body.max_len_b,
            glossary=glossary,
            glossary_language=route.legs[0].source if glossary else None,
            **sampling,
        )
    except UserError as err:
        raise _bad(422, str(err)) from None


def _sampling(body: TranslateRequest) -> dict[str, Any]:
    """The request's sampling options; each of :data:`SAMPLING_FIELDS` needs ``sample: true``."""
    given = {name: getattr(body, name) for name in SAMPLING_FIELDS if getattr(body, name) is not None}
    if given and not body.sample:
        raise _bad(422, f"{next(iter(given))}: needs sample: true")
    return {"sample": body.sample, **given}


def _translation(result: DocumentResult, alignments: bool, scores: bool) -> dict[str, Any]:
    """A document's answer: its text and score, its n-best list (none for a blank document), its
    sentence pairs and, when asked, its word alignment and its confidence, sentence by sentence."""
    nbest = [{"text": text, "score": _finite(score)} for score, text in result.nbest]
    translation = {
        "text": result.text,
        "score": _finite(result.score),
        "nbest": nbest if result.sentences else [],
        "sentences": [list(pair) for pair in result.sentences],
    }
    if alignments:
        translation["alignment"] = [list(pair) for pair in result.alignment]
    if scores:
        translation["confidence"] = _confidence(result.confidence)
        translation["sentence_scores"] = [
            {
                **_confidence(sentence.confidence),
                "words": [list(pair) for pair in sentence.words],
                "terms": list(sentence.terms),
            }
            for sentence in result.translations
        ]
    return translation


def _confidence(log_prob: float) -> dict[str, float]:
    return {"log_prob": log_prob, "probability": math.exp(log_prob)}


def _finite(score: float) -> float | None:
    return score if np.isfinite(score) else None


@torch.no_grad()
def _forecast(served: Served, rows: np.ndarray) -> np.ndarray:
    scaler = Scaler.from_dict(served.stored["scaler"])
    x = torch.from_numpy(scaler.transform(rows)).float()[None]  # (1, L, n)
    pred = served.model(x)[0].double().numpy()  # (H, n_out)
    return scaler.inverse(pred, served.info["outputs"])


# --- errors, keys and limits ------------------------------------------------------------------------


def _bad(status: int, message: str) -> HTTPException:
    return HTTPException(status_code=status, detail=message)


def _errors(app: FastAPI) -> None:
    """Every error as ``{"error": one line}``: validation errors name the first bad field."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": _first_error(exc.errors())}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 400 and "parsing the body" in message:  # FastAPI's words for bad bytes
            message = "body: not valid JSON (UTF-8)"
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)


def _first_error(errors: list[dict[str, Any]]) -> str:
    if not errors:
        return "invalid request"
    error = errors[0]
    if error.get("type") == "json_invalid":
        return "body: not valid JSON (UTF-8)"
    where = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
    return f"{where}: {error.get('msg', 'invalid')}".splitlines()[0]


def _key_check(api_key: str | None):
    async def check(request: Request) -> None:
        if api_key is None:
            return
        if not bears(request, api_key):
            raise HTTPException(
                401,
                "missing or wrong API key: send Authorization: Bearer KEY",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return Depends(check)


async def _stored_key(request: Request) -> None:
    await request.app.state.access.identify(request, bearer(request))


class BodyLimit:
    """ASGI middleware: a body over ``limit`` bytes (``larger[path]`` for the paths there) is a 413
    before the application sees it. A declared ``Content-Length`` is checked at once; a chunked body
    is read (at most the limit + one chunk, never more) and handed on only when it fits."""

    def __init__(self, app, limit: int, larger: dict[str, int] | None = None) -> None:
        self.app, self.limit, self.larger = app, limit, larger or {}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.larger.get(scope["path"], self.limit)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit() or int(declared) > limit:
                return await self._refuse(scope, receive, send, limit)
            return await self.app(scope, receive, send)
        messages, size = [], 0
        while True:  # chunked: buffer up to the limit
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if size > limit:
                return await self._refuse(scope, receive, send, limit)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        return await self.app(scope, _replay(messages, receive), send)

    async def _refuse(self, scope, receive, send, limit: int) -> None:
        answer = JSONResponse({"error": f"body: larger than the limit of {limit} bytes"}, status_code=413)
        await answer(scope, receive, send)


def _replay(messages: list[dict], receive):
    """A ``receive`` that gives ``messages`` first, then what the client sends next."""
    pending = list(messages)

    async def replayed() -> dict:
        return pending.pop(0) if pending else await receive()

    return replayed
