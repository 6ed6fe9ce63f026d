"""Files on the server, as LibreTranslate translates them: ``POST /translate_file`` (a multipart form:
``file``, ``source``, ``target``, ``api_key``) answers ``{"translatedFileUrl": URL}``, and ``GET URL``
(``/download_file/TOKEN.NAME``) gives the translated file, saved under the uploaded file's name.

The file is read and checked by :func:`aiayn.documents.files.read_file` (its kind by its extension,
then its contents: a file that is not what its name says, a corrupt or encrypted one, a zip bomb, or
one over the limits is one 4xx line, before any model is used), translated whole by the route's
models (its sentences in the batches of every other request), and kept for its download by
:mod:`aiayn.serve.downloads` under a random token. Nothing is written where a client names.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.responses import Response

from aiayn.decode.search import DecodeOptions
from aiayn.documents.files import FileLimits, TooLarge, read_file
from aiayn.errors import UserError
from aiayn.serve import libretranslate as lt
from aiayn.serve.downloads import Stored

MAX_FIELDS = 16  # form fields of a file request besides the file
FILE_READS = 2  # files read and checked at once (CPU work: the rest wait their turn)


def add_routes(app: FastAPI) -> None:
    tags = ["LibreTranslate"]
    app.state.file_reads = asyncio.Semaphore(FILE_READS)
    app.post("/translate_file", summary="Translate a file (LibreTranslate)", tags=tags, openapi_extra=_BODY)(
        translate_file
    )
    app.get("/download_file/{filename}", summary="Download a translated file", tags=tags)(download_file)


async def translate_file(request: Request) -> dict[str, Any]:
    state, models = request.app.state, lt.models_of(request)
    if not state.limits.files:
        raise lt.error(403, "Files translation are disabled on this server.")
    name, data, params = await _form(request)
    lt.check_key(request, params, state.limits.api_key)
    key = lt.given_key(request, params)
    source, target = lt.required(params, "source"), lt.required(params, "target")
    route = None if source == "auto" else lt.resolve(models, source, target, None)
    await state.access.admit(request, key, 0, 1)  # its key, bans and rates: before the file is read
    limits = FileLimits(max_bytes=state.limits.max_file_bytes, max_characters=state.limits.max_file_chars)
    async with state.file_reads:
        try:
            found = await models.run(read_file, data, name, limits)
        except UserError as err:
            raise lt.error(_status(err), f"Invalid request: {err}") from None
    detected = None
    if route is None:  # auto: the language of the file's first sentences
        detected = await lt.detect_language(state, [found.sample()], "text", target)
        route = lt.resolve(models, detected["language"], target, detected)
    options = DecodeOptions(beam=lt.BEAM, alpha=lt.ALPHA)
    with state.admission.slot():
        async with models.use(route) as served:
            translated = await models.translate_file(route, served, found, options)
    token = await models.run(state.downloads.put, Stored(found.name, found.media_type, translated.data))
    url = str(request.url_for("download_file", filename=f"{token}.{quote(found.name, safe='')}"))
    answer: dict[str, Any] = {"translatedFileUrl": url}
    if detected:
        answer["detectedLanguage"] = detected
    return {**answer, "route": route.describe()} if route.pivoted else answer


async def download_file(filename: str, request: Request) -> Response:
    """The translated file (``TOKEN.NAME``, as ``translatedFileUrl`` named it), as an attachment
    under the uploaded file's name."""
    token = filename.split(".", 1)[0]
    stored = await request.app.state.models.run(request.app.state.downloads.get, token)
    if stored is None:
        ttl = request.app.state.downloads.ttl_s
        kept = f"{ttl // 60} minutes" if ttl % 60 == 0 and ttl != 60 else f"{ttl} seconds"
        raise lt.error(
            404, f"no such file: a translated file can be downloaded for {kept} after its translation"
        )
    return Response(
        stored.data, media_type=stored.media_type, headers={"Content-Disposition": _attachment(stored.name)}
    )


def _attachment(name: str) -> str:
    """``Content-Disposition`` of a download: the name in UTF-8 (RFC 6266), and an ASCII one for
    the clients that read only ``filename`` (curl -OJ)."""
    plain = "".join(c if " " <= c < "\x7f" and c not in '"\\' else "_" for c in name)
    return f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(name, safe='')}"


async def _form(request: Request) -> tuple[str, bytes, dict[str, Any]]:
    """The uploaded ``file``'s name and bytes, and the other fields (the query string first, as
    LibreTranslate); the form's temporary file closed."""
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise lt.error(400, "Invalid request: send the file as multipart/form-data (field file)")
    try:
        async with request.form(max_files=1, max_fields=MAX_FIELDS) as form:
            upload, params = form.get("file"), lt.fields(form, request)
            named = isinstance(upload, UploadFile) and bool(upload.filename)
            data = await upload.read() if named else b""
    except HTTPException as err:  # starlette's: a malformed body, too many fields or files
        raise lt.error(400, f"Invalid request: {err.detail}") from None
    if not isinstance(upload, UploadFile):
        raise lt.error(400, "Invalid request: missing file parameter")
    if not upload.filename:
        raise lt.error(400, "Invalid request: empty file")
    return _name(upload.filename), data, params


def _name(sent: str) -> str:
    """The uploaded file's name: the quote and line breaks a browser escapes (HTML's multipart
    encoding: %22, %0A, %0D) back, control characters as ``_`` (the name reaches logs)."""
    unescaped = sent.replace("%22", '"').replace("%0A", "\n").replace("%0D", "\r")
    return "".join("_" if ord(c) < 32 or ord(c) == 127 else c for c in unescaped)


def _status(err: UserError) -> int:
    """413 for a file over a limit, else 400 (not what its name says, damaged, not supported)."""
    return 413 if isinstance(err, TooLarge) else 400


_FIELDS = {
    "file": {"type": "string", "format": "binary"},
    "source": {"type": "string", "description": "the file's language, or auto"},
    "target": {"type": "string"},
    "api_key": {"type": "string"},
}
_BODY = {
    "requestBody": {
        "content": {
            "multipart/form-data": {
                "schema": {"type": "object", "properties": _FIELDS, "required": ["file", "source", "target"]}
            }
        }
    }
}
