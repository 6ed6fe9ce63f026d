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
from aiayn.documents.files import FileLimits, TooLarge, read_file
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
    state, models = request.app.state, lt.models_of(request)
    upload, params = await _form(request)
    lt.check_key(request, params, state.limits.api_key)
    key = lt.given_key(request, params)
    await state.access.identify(request, key)  # a wrong key or a ban: before the file is read
    source, target = lt.required(params, "source"), lt.required(params, "target")
    if source == "auto":
        raise lt.error(
            400, "Invalid request: source auto is not supported for files; name the file's language"
        )
    route = lt.resolve(models, source, target, None)
    data = await upload.read()
    limits = FileLimits(max_bytes=state.limits.max_file_bytes, max_characters=state.limits.max_file_chars)
    try:
        found = await models.run(read_file, data, upload.filename or "", limits)
    except UserError as err:
        raise lt.error(_status(err), f"Invalid request: {err}") from None
    await state.access.admit(request, key, found.characters, 1)
    options = DecodeOptions(beam=lt.BEAM, alpha=lt.ALPHA)
    with state.admission.slot():
        async with models.use(route) as served:
            translated = await models.translate_file(route, served, found, options)
    token = await models.run(state.downloads.put, Stored(found.name, found.media_type, translated.data))
    url = str(request.url_for("download_file", filename=f"{token}.{found.name}"))
    answer = {"translatedFileUrl": url}
    return {**answer, "route": route.describe()} if route.pivoted else answer


async def download_file(filename: str, request: Request) -> Response:
    """The translated file (``TOKEN.NAME``, as ``translatedFileUrl`` named it), as an attachment."""
    token = filename.split(".", 1)[0]
    stored = await request.app.state.models.run(request.app.state.downloads.get, token)
    if stored is None:
        ttl = request.app.state.downloads.ttl_s
        kept = f"{ttl // 60} minutes" if ttl % 60 == 0 and ttl != 60 else f"{ttl} seconds"
        raise lt.error(
            404, f"no such file: a translated file can be downloaded for {kept} after its translation"
        )
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
    """413 for a file over a limit, else 400 (not what its name says, damaged, not supported)."""
    return 413 if isinstance(err, TooLarge) else 400


_FIELDS = {
    "file": {"type": "string", "format": "binary"},
    "source": {"type": "string", "description": "the file's language"},
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
