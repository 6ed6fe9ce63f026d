"""Whole files translated: plain text, HTML, Markdown, Word (.docx), OpenDocument text and
presentations (.odt, .odp), PowerPoint (.pptx), EPUB and SubRip subtitles (.srt).

    >>> source = read_file(Path("report.docx").read_bytes(), "report.docx")  # doctest: +SKIP
    >>> source.characters                                        # for quotas  # doctest: +SKIP
    >>> Path("bericht.docx").write_bytes(source.translate(translator, DecodeOptions()).data)  # doctest: +SKIP

:func:`read_file` reads and checks a file (its kind from its name's extension) within
:class:`FileLimits`; anything wrong with it is a :class:`~aiayn.errors.UserError` of one line, and
nothing else is raised whatever the bytes. :meth:`SourceFile.translate` puts all of its sentences
through one call of the translator's backend and gives the translated file.

- text, HTML and Markdown (UTF-8, with or without a byte order mark, kept) go through the document
  formats of :mod:`aiayn.documents`;
- the zipped XML formats (:mod:`.package`) translate the paragraphs of their text parts (docx:
  ``word/document.xml``, headers, footers, foot- and endnotes; pptx: slides and notes; odt, odp:
  ``content.xml``; EPUB: the XHTML documents of its manifest) with their inline formatting carried
  by word alignment (:mod:`.ooxml`, :mod:`.mixed`); every other member comes back byte for byte;
- SubRip subtitles (:mod:`.subtitles`): cue by cue.

The formats' libraries (lxml, srt) are the ``files`` extra, imported only when a file needs them.
"""

from __future__ import annotations

import importlib
import posixpath
from typing import TYPE_CHECKING, Any

from aiayn.documents.files.types import FileLimits, TooLarge, TranslatedFile
from aiayn.documents.html import parse_html
from aiayn.documents.markdown import parse_markdown
from aiayn.documents.text import whole
from aiayn.errors import UserError

if TYPE_CHECKING:
    from aiayn.decode.search import DecodeOptions
    from aiayn.documents.translate import DocumentTranslator

#: The extensions read (lower case) and their kinds.
EXTENSIONS: dict[str, str] = {
    ".txt": "text",
    ".html": "html",
    ".htm": "html",
    ".md": "markdown",
    ".markdown": "markdown",
    ".docx": "docx",
    ".pptx": "pptx",
    ".odt": "odt",
    ".odp": "odp",
    ".epub": "epub",
    ".srt": "srt",
}
#: Each kind's media type (the download's Content-Type).
MEDIA_TYPES: dict[str, str] = {
    "text": "text/plain; charset=utf-8",
    "html": "text/html; charset=utf-8",
    "markdown": "text/markdown; charset=utf-8",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "odt": "application/vnd.oasis.opendocument.text",
    "odp": "application/vnd.oasis.opendocument.presentation",
    "epub": "application/epub+zip",
    "srt": "application/x-subrip",
}
#: The limits of a :func:`read_file` given none (frozen: shared safely)
DEFAULT_LIMITS = FileLimits()
_NAMES = {
    "docx": "Word document (.docx)",
    "pptx": "PowerPoint presentation (.pptx)",
    "odt": "OpenDocument text (.odt)",
    "odp": "OpenDocument presentation (.odp)",
    "epub": "EPUB",
}


class SourceFile:
    """A file read and checked, not yet translated."""

    def __init__(self, name: str, kind: str, characters: int, content: Any, reread) -> None:
        self.name, self.kind, self.characters = name, kind, characters
        self.media_type = MEDIA_TYPES[kind]
        self._content, self._reread = content, reread

    def translate(self, translator: DocumentTranslator, options: DecodeOptions) -> TranslatedFile:
        """The file translated: all its sentences through one call of ``translator``'s backend."""
        content, self._content = self._content, None  # a tree is rebuilt in place: once only
        if content is None:
            content = self._reread()
        return content.translate(translator, options)

    def __repr__(self) -> str:
        return f"SourceFile({self.name!r}, kind={self.kind!r}, characters={self.characters})"


def read_file(data: bytes, name: str, limits: FileLimits = DEFAULT_LIMITS) -> SourceFile:
    """``data``, the file called ``name``, read and checked: a :class:`UserError` of one line for an
    extension not supported, a file that is not what its name says, one damaged or over ``limits``."""
    base = posixpath.basename(name.replace("\\", "/")) or name
    extension = posixpath.splitext(base)[1].lower()
    kind = EXTENSIONS.get(extension)
    if kind is None:
        shown = extension or "no extension"
        raise UserError(f"{base}: {shown} files are not translated; supported: {', '.join(EXTENSIONS)}")
    if not isinstance(data, (bytes, bytearray)):
        raise UserError(f"{base}: no file content")
    data = bytes(data)
    if len(data) > limits.max_bytes:
        raise TooLarge(f"{base}: {len(data)} bytes, more than the {limits.max_bytes} allowed")

    def reread():
        return _content(kind, data, base, limits)

    content = reread()
    if content.characters > limits.max_characters:
        raise TooLarge(
            f"{base}: {content.characters} characters to translate, more than the "
            f"{limits.max_characters} allowed"
        )
    return SourceFile(base, kind, content.characters, content, reread)


def _content(kind: str, data: bytes, name: str, limits: FileLimits):
    if kind in ("text", "html", "markdown"):
        return _Textual(kind, _decoded(data, name), name)
    if kind == "srt":
        subtitles = _library("aiayn.documents.files.subtitles")
        text, bom = _decoded(data, name)
        return _Srt(subtitles.Subtitles(text.replace("\r\n", "\n"), name), bom)
    package = _library("aiayn.documents.files.package")
    archive = package.read_zip(data, name, _NAMES[kind], limits)
    if kind in ("docx", "pptx"):
        ooxml = _library("aiayn.documents.files.ooxml")
        members = (ooxml.docx_members if kind == "docx" else ooxml.pptx_members)(archive, name)
    elif kind == "epub":
        members = _library("aiayn.documents.files.mixed").epub_members(archive, name)
    else:
        members = _library("aiayn.documents.files.mixed").odf_members(archive, name, kind)
    return _Zipped(archive, members, name, package)


def _library(module: str):
    """A format's module; its library missing: how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise UserError(
            f"translating this file needs {err.name or 'a library'}: pip install 'aiayn[files]'"
        ) from None


def _decoded(data: bytes, name: str) -> tuple[str, bool]:
    """UTF-8 text (without its byte order mark) and whether it had one."""
    bom = data.startswith(b"\xef\xbb\xbf")
    try:
        text = data[3 if bom else 0 :].decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{name}: not UTF-8 text (byte {err.start} is invalid); save it as UTF-8") from None
    if "\x00" in text:
        raise UserError(f"{name}: binary data, not text (a NUL byte at character {text.index(chr(0))})")
    return text, bom


class _Textual:
    """Plain text, HTML or Markdown, through :meth:`DocumentTranslator.translate`."""

    def __init__(self, kind: str, decoded: tuple[str, bool], name: str) -> None:
        self.fmt = kind
        self.text, self.bom = decoded
        if kind == "text":
            self.characters = len(" ".join(self.text.split()))
        else:
            parse = parse_html if kind == "html" else parse_markdown
            sentences = parse(self.text, whole, lambda _: None).sentences()
            self.characters = sum(len(" ".join(s.split())) for s in sentences)

    def translate(self, translator: DocumentTranslator, options: DecodeOptions) -> TranslatedFile:
        result = translator.translate([self.text], options, fmt=self.fmt)[0]
        data = (b"\xef\xbb\xbf" if self.bom else b"") + result.text.encode("utf-8")
        return TranslatedFile(data, len(result.sentences), self.characters)


class _Srt:
    def __init__(self, subtitles, bom: bool) -> None:
        self.subtitles, self.bom = subtitles, bom
        self.characters = subtitles.characters

    def translate(self, translator: DocumentTranslator, options: DecodeOptions) -> TranslatedFile:
        text, sentences = self.subtitles.translate(translator, options)
        data = (b"\xef\xbb\xbf" if self.bom else b"") + text.encode("utf-8")
        return TranslatedFile(data, sentences, self.characters)


class _Zipped:
    def __init__(self, archive, members, name: str, package) -> None:
        self.archive, self.members, self.name, self.package = archive, members, name, package
        self.characters = package.characters_of([p for m in members for p in m.paragraphs])

    def translate(self, translator: DocumentTranslator, options: DecodeOptions) -> TranslatedFile:
        return self.package.translate_members(
            translator, options, self.archive, self.members, self.name, self.characters
        )


__all__ = [
    "DEFAULT_LIMITS",
    "EXTENSIONS",
    "MEDIA_TYPES",
    "FileLimits",
    "TooLarge",
    "SourceFile",
    "TranslatedFile",
    "read_file",
]
