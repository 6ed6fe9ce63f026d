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

from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.responses import Response

from aiayn.decode.search import DecodeOptions
from aiayn.errors import UserError
from aiayn.serve import libretranslate as lt
from aiayn.serve.downloads import Stored

MAX_FIELDS = 16  # form fields of a file request besides the file


def add_routes(app: FastAPI) -> None:
    tags = ["LibreTranslate"]
    app.post("/translate_file", summary="Translate a file (LibreTranslate)", tags=tags, openapi_extra=_BODY)(
        translate_file
    )
    app.get("/download_file/{filename}", summary="Download a translated file", tags=tags)(download_file)


async def translate_file(request: Request) -> dict[str, Any]:
    from aiayn.documents.files import read_file  # the files extra

    state, models = request.app.state, lt.models_of(request)
    upload, params = await _form(request)
    lt.check_key(request, params, state.limits.api_key)
    source, target = lt.required(params, "source"), lt.required(params, "target")
    data = await upload.read()
    try:
        found = await models.run(read_file, data, upload.filename or "", state.file_limits)
    except UserError as err:
        raise lt.error(_status(err), f"Invalid request: {err}") from None
    detected = None
    if source == "auto":
        detected = await lt.detect_language(state, [found.text(lt.DETECT_CHARS)], "text", target)
    route = lt.resolve(models, detected["language"] if detected else source, target, detected)
    options = DecodeOptions(beam=lt.BEAM, alpha=lt.ALPHA)
    with state.admission.slot():
        async with models.use(route) as served:
            translated = await models.translate_file(route, served, found, options)
    token = await models.run(state.downloads.put, Stored(found.name, found.media_type, translated.data))
    url = str(request.url_for("download_file", filename=f"{token}.{found.name}"))
    answer: dict[str, Any] = {"translatedFileUrl": url}
    if detected:
        answer["detectedLanguage"] = detected
    return {**answer, "route": route.describe()} if route.pivoted else answer


async def download_file(filename: str, request: Request) -> Response:
    """The translated file (``TOKEN.NAME``, as ``translatedFileUrl`` named it), as an attachment."""
    token = filename.split(".", 1)[0]
    stored = await request.app.state.models.run(request.app.state.downloads.get, token)
    if stored is None:
        minutes = request.app.state.downloads.ttl_s // 60
        raise lt.error(404, f"no such file: translated files can be downloaded for {minutes} minutes")
    disposition = f"attachment; filename*=UTF-8''{quote(stored.name, safe='')}"
    return Response(stored.data, media_type=stored.media_type, headers={"Content-Disposition": disposition})


async def _form(request: Request) -> tuple[UploadFile, dict[str, Any]]:
    """The uploaded ``file`` and the other fields (the query string first, as LibreTranslate)."""
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise lt.error(400, "Invalid request: send the file as multipart/form-data (field file)")
    try:
        form = await request.form(max_files=1, max_fields=MAX_FIELDS)
    except HTTPException as err:  # starlette's: too many files or fields, a malformed body
        raise lt.error(400, f"Invalid request: {err.detail}") from None
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise lt.error(400, "Invalid request: missing file parameter")
    if not upload.filename:
        raise lt.error(400, "Invalid request: empty file")
    fields = lt.first((k, v) for k, v in form.multi_items() if isinstance(v, str))
    return upload, {**fields, **lt.first(request.query_params.multi_items())}


def _status(err: UserError) -> int:
    """413 for a file over a limit, else 400 (not what its name says, corrupt, unsupported)."""
    return 413 if getattr(err, "too_large", False) else 400


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
