"""A LibreTranslate-compatible API beside aiayn's own, so that LibreTranslate's clients (Mastodon,
Akkoma, Discourse, Weblate, deep-translator, Dialect, ``libretranslatepy``) work unchanged.

Routes, fields and answers as LibreTranslate's (its ``app.py``):

* ``POST /translate``: ``q`` (a string or, in JSON, a list of strings: each a document, translated
  whole), ``source`` (the model's source language, or ``auto``), ``target``, ``format`` (``text``
  or ``html``), ``alternatives`` (how many other translations, at most 3), ``api_key``. The answer:
  ``{"translatedText": ...}`` (a list for a list), with ``alternatives`` when asked and, for
  ``auto``, ``detectedLanguage: {"confidence", "language"}`` (one per text for a list).
* ``POST /detect``: ``q`` -> ``[{"confidence", "language"}, ...]``, likeliest first.
* ``POST /translate_file`` and ``GET /download_file/NAME``: files (:mod:`aiayn.serve.files`).
* ``GET /languages``: ``[{"code", "name", "targets"}]``: the model's source language with its target
  (and the target, with no targets of its own); ``GET /frontend/settings``; ``GET /spec``.

Fields are read as LibreTranslate reads them: from a JSON object body (``Content-Type:
application/json``), else from the query string and a urlencoded or multipart form (the query string
first). With ``--api-key``, or a key of ``--api-keys``, ``/translate`` and ``/detect`` need the key,
as the ``api_key`` field or ``Authorization: Bearer KEY``; they count against the rate limits
(:mod:`aiayn.serve.quotas`). Errors are LibreTranslate's, ``{"error": "..."}``: 400 for a missing
or bad field or a language pair the model does not serve (naming the pair it serves), 403 for a
wrong key or a banned client, 413 beyond the server's limits, 429 when too many requests wait or
beyond a rate limit.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException

import aiayn
from aiayn.decode.search import DecodeOptions
from aiayn.documents.files import EXTENSIONS
from aiayn.errors import UserError
from aiayn.serve.langid import language_name
from aiayn.serve.quotas import KEY_NEEDED, bearer
from aiayn.service.languages import normalize

FORMATS = ("text", "html")
MAX_ALTERNATIVES = 3  # LibreTranslate's default --alternatives-limit
BEAM, ALPHA = 4, 0.6  # aiayn translate's defaults


def add_routes(app: FastAPI) -> None:
    tags = ["LibreTranslate"]
    app.post("/translate", summary="Translate text (LibreTranslate)", tags=tags, openapi_extra=_BODY)(
        translate
    )
    app.post("/detect", summary="Detect the language of a text (LibreTranslate)", tags=tags)(detect)
    app.get("/languages", summary="The language pair served (LibreTranslate)", tags=tags)(languages)
    app.get("/frontend/settings", summary="Settings of a LibreTranslate page", tags=tags)(settings)
    app.get("/spec", summary="LibreTranslate's API description", tags=tags)(spec)


# --- routes ---------------------------------------------------------------------------------------


async def translate(request: Request) -> dict[str, Any]:
    state, models = request.app.state, models_of(request)
    params = await _params(request)
    check_key(request, params, state.limits.api_key)
    texts, batch = _texts(params, request)
    await state.access.admit(request, given_key(request, params), sum(map(len, texts)), len(texts))
    source, target = required(params, "source"), required(params, "target")
    alternatives = _alternatives(params)
    _check_limits(texts, state.limits)
    fmt = params.get("format") or "text"
    detected = await detect_language(state, texts, fmt, target) if source == "auto" else None
    route = resolve(models, detected["language"] if detected else source, target, detected)
    if fmt not in FORMATS:
        raise error(400, f"{fmt} format is not supported")
    nbest = alternatives + 1 if fmt == "text" else 1  # as LibreTranslate: no alternatives for HTML
    options = DecodeOptions(beam=max(BEAM, nbest), alpha=ALPHA, nbest=nbest)
    with state.admission.slot():  # waiting for a model to load counts
        async with models.use(route) as served:
            results = await models.translate(route, served, texts, options, fmt=fmt)
    answer: dict[str, Any] = {"translatedText": [r.text for r in results]}
    if alternatives:
        answer["alternatives"] = [_unique(r.alternatives, r.text)[:alternatives] for r in results]
    if detected:
        answer["detectedLanguage"] = [detected] * len(texts)
    answer = answer if batch else {key: value[0] for key, value in answer.items()}
    return {**answer, "route": route.describe()} if route.pivoted else answer  # a pivot's models


async def detect(request: Request) -> list[dict[str, Any]]:
    """The served source languages, likeliest first (at most 3)."""
    models = models_of(request)
    params = await _params(request)
    check_key(request, params, request.app.state.limits.api_key)
    texts, _ = _texts(params, request)
    await request.app.state.access.admit(
        request, given_key(request, params), sum(map(len, texts)), len(texts)
    )
    _check_limits(texts, request.app.state.limits)
    ranked = await _identify(request.app.state, texts, "text", models.router.sources)
    return [{"confidence": confidence, "language": code} for code, confidence in ranked[:3]]


async def languages(request: Request) -> list[dict[str, Any]]:
    """Every source language served, with every target it reaches; ``pivots`` (beyond
    LibreTranslate's fields) names the languages a pivoted target goes through."""
    return models_of(request).languages()


async def settings(request: Request) -> dict[str, Any]:
    pair = next((lang for lang in models_of(request).languages() if lang["targets"]), None)
    source, target = (pair["code"], pair["targets"][0]) if pair else ("", "")
    limits, access = request.app.state.limits, request.app.state.access
    keyed = limits.api_key is not None or access.keys is not None
    return {
        "charLimit": min(limits.max_chars, access.quotas.char_limit or limits.max_chars),
        "frontendTimeout": 500,
        "apiKeys": keyed,
        "keyRequired": keyed,
        "suggestions": False,
        "filesTranslation": limits.files,
        "supportedFilesFormat": list(EXTENSIONS) if limits.files else [],
        "language": {
            "source": {"code": source, "name": language_name(source)},
            "target": {"code": target, "name": language_name(target)},
        },
    }


async def spec(request: Request) -> dict[str, Any]:
    """The description LibreTranslate serves at /spec (clients check its ``info.title``), holding
    the LibreTranslate routes of this server's OpenAPI description."""
    openapi = request.app.openapi()
    paths = {p: ops for p, ops in openapi["paths"].items() if not p.startswith(("/v1/", "/health"))}
    info = {
        "title": "LibreTranslate",
        "version": aiayn.__version__,
        "description": "aiayn serve's LibreTranslate-compatible API (aiayn's own is at /docs)",
    }
    return {"openapi": openapi["openapi"], "info": info, "paths": paths}


# --- the request's fields -----------------------------------------------------------------------------


async def _params(request: Request) -> dict[str, Any]:
    """The fields as LibreTranslate reads them: a JSON object body, else the query string and a
    urlencoded or multipart form (the query string first)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json")):
        try:
            body = json.loads(await request.body())
        except ValueError:  # UnicodeDecodeError included
            raise error(400, "Invalid JSON format") from None
        if not isinstance(body, dict):
            raise error(400, "Invalid JSON format")
        return body
    form = await request.form() if request.method == "POST" else None
    return fields(form, request)


def fields(form, request: Request) -> dict[str, Any]:
    """A form's text fields, each name's first value, and the query string's (first: as
    LibreTranslate reads them)."""
    found = {} if form is None else first((k, v) for k, v in form.multi_items() if isinstance(v, str))
    return {**found, **first(request.query_params.multi_items())}


def first(items) -> dict[str, str]:
    """Each name's first value."""
    found: dict[str, str] = {}
    for name, value in items:
        found.setdefault(name, value)
    return found


def _texts(params: dict[str, Any], request: Request) -> tuple[list[str], bool]:
    """``q`` as a list of texts, and whether it was a list."""
    q = params.get("q")
    if not q:
        raise error(400, "Invalid request: missing q parameter")
    batch = isinstance(q, list)
    texts = q if batch else [q]
    if not all(isinstance(text, str) for text in texts):
        raise error(400, "Invalid request: q must be a string or a list of strings")
    if "json" not in request.headers.get("content-type", ""):  # a form's line breaks: \n only
        texts = [text.replace("\r\n", "\n").replace("\r", "\n") for text in texts]
    return texts, batch


def required(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not value or not isinstance(value, str):
        raise error(400, f"Invalid request: missing {name} parameter")
    return value


def _alternatives(params: dict[str, Any]) -> int:
    try:
        count = max(0, int(params.get("alternatives") or 0))
    except (TypeError, ValueError):
        raise error(400, "Invalid request: alternatives parameter is not a number") from None
    if count > MAX_ALTERNATIVES:
        raise error(400, f"Invalid request: alternatives parameter must be <= {MAX_ALTERNATIVES}")
    return count


def _check_limits(texts: list[str], limits) -> None:
    if len(texts) > limits.max_sentences:
        raise error(
            413, f"Invalid request: request ({len(texts)}) exceeds text limit ({limits.max_sentences})"
        )
    for text in texts:
        if len(text) > limits.max_chars:
            raise error(
                413, f"Invalid request: request ({len(text)}) exceeds character limit ({limits.max_chars})"
            )


def check_key(request: Request, params: dict[str, Any], api_key: str | None) -> None:
    """With a server key: the ``api_key`` field or ``Authorization: Bearer KEY`` must hold it."""
    if api_key is None:
        return
    given = given_key(request, params)
    if not given:
        raise error(400, KEY_NEEDED)
    if not secrets.compare_digest(str(given).encode(), api_key.encode()):
        raise error(403, "Invalid API key")


def given_key(request: Request, params: dict[str, Any]) -> str | None:
    """The ``api_key`` field, else the key of ``Authorization: Bearer KEY``."""
    given = params.get("api_key")
    return str(given) if given else bearer(request)


# --- languages ------------------------------------------------------------------------------------


def resolve(models, source: str, target: str, detected: dict | None):
    if not models.router.routes:
        raise error(
            400,
            "Invalid request: this server does not know its model's languages "
            "(start aiayn serve with --source-lang and --target-lang)",
        )
    route = models.router.route(normalize(source), normalize(target))
    if route is not None:
        return route
    if normalize(source) not in models.router.sources:
        how = f" (detected, confidence {detected['confidence']})" if detected else ""
        raise error(400, f"{source} is not supported{how}: {models.serves()}")
    raise error(400, f"{target} is not supported as a target language from {source}: {models.serves()}")


async def detect_language(state, texts: list[str], fmt: str, target: str) -> dict[str, Any]:
    """The language of all the texts together (as LibreTranslate detects a list: one language),
    among the served ones that reach ``target``."""
    candidates = state.models.sources_to(target)
    if not candidates:
        raise error(400, f"{target} is not supported as a target language: {state.models.serves()}")
    code, confidence = (await _identify(state, texts, fmt, candidates))[0]
    return {"confidence": confidence, "language": code}


async def _identify(state, texts: list[str], fmt: str, candidates: list[str]) -> list[tuple[str, float]]:
    if not candidates:
        raise error(400, "Invalid request: this server does not know its model's languages")
    try:
        return await state.models.identify(texts, fmt, candidates)
    except UserError as err:  # the identifier is not installed
        raise error(400, str(err)) from None


def _unique(alternatives: list[str], best: str) -> list[str]:
    """Alternatives other than the translation, each once, in order (as LibreTranslate's)."""
    seen = {best, ""}
    return [a for a in alternatives if not (a in seen or seen.add(a))]


def models_of(request: Request):
    models = request.app.state.models
    if models.kind != "translation":
        raise error(
            404, f"this server runs a {models.kind} model; the LibreTranslate API needs a translation model"
        )
    return models


def error(status: int, message: str) -> HTTPException:
    return HTTPException(status_code=status, detail=message)


_FIELDS = {
    "q": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "source": {"type": "string", "description": "the model's source language, or auto"},
    "target": {"type": "string"},
    "format": {"type": "string", "enum": list(FORMATS), "default": "text"},
    "alternatives": {"type": "integer", "default": 0, "maximum": MAX_ALTERNATIVES},
    "api_key": {"type": "string"},
}
_SCHEMA = {"type": "object", "properties": _FIELDS, "required": ["q", "source", "target"]}
_BODY = {
    "requestBody": {
        "content": {
            kind: {"schema": _SCHEMA}
            for kind in ("application/json", "application/x-www-form-urlencoded", "multipart/form-data")
        }
    }
}
