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
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from aiayn.documents.files.types import FileLimits, TooLarge, TranslatedFile, characters, squeezed
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
    """A file read and checked, not yet translated.

    It keeps what it read (its trees, its text) for its first translation, and the upload's bytes
    (in ``_reread``, the only reference to them it keeps) to read them again for another one: a
    translation rebuilds the trees in place.
    """

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

    def sample(self, limit: int = 2000) -> str:
        """The start of the text to translate, at most ``limit`` characters: its paragraphs' (or
        cues', or HTML's and Markdown's runs') texts as the model sees them, one a line; for telling
        the file's language (``source: auto``)."""
        content = self._content if self._content is not None else self._reread()
        return _sample(content.texts(), limit)

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
        try:
            return _content(kind, data, base, limits)
        except UserError:
            raise
        except Exception as err:  # noqa: BLE001 - the promise: whatever the bytes, one UserError line
            raise UserError(f"{base}: cannot be read as a {kind} file ({type(err).__name__})") from None

    content = reread()
    if content.characters > limits.max_characters:
        raise TooLarge(
            f"{base}: {content.characters} characters to translate, more than the "
            f"{limits.max_characters} allowed"
        )
    return SourceFile(base, kind, content.characters, content, reread)


def _sample(texts: Iterable[str], limit: int) -> str:
    """``texts`` one a line, cut at ``limit`` characters (only as many of them read as that needs)."""
    out: list[str] = []
    length = 0
    for text in texts:
        if length >= limit:
            break
        out.append(text)
        length += len(text) + 1
    return "\n".join(out)[: max(limit, 0)]


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


_BOM = b"\xef\xbb\xbf"


def _decoded(data: bytes, name: str) -> tuple[str, bool]:
    """UTF-8 text (without its byte order mark) and whether it had one."""
    bom = data.startswith(_BOM)
    try:
        text = data[3 if bom else 0 :].decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{name}: not UTF-8 text (byte {err.start} is invalid); save it as UTF-8") from None
    if "\x00" in text:
        raise UserError(f"{name}: binary data, not text (a NUL byte at character {text.index(chr(0))})")
    return text, bom


def _encoded(text: str, bom: bool) -> bytes:
    """UTF-8 text, with the byte order mark the source had (:func:`_decoded`)."""
    return (_BOM if bom else b"") + text.encode("utf-8")


class _Textual:
    """Plain text, HTML or Markdown, through :meth:`DocumentTranslator.translate`."""

    def __init__(self, kind: str, decoded: tuple[str, bool], name: str) -> None:
        self.fmt = kind
        self.text, self.bom = decoded
        self._runs: list[str] | None = None
        if kind == "text":
            self.characters = characters(self.text)
        else:
            parse = parse_html if kind == "html" else parse_markdown
            self._runs = parse(self.text, whole, lambda _: None).sentences()
            self.characters = sum(characters(s) for s in self._runs)

    def texts(self) -> Iterator[str]:
        """Plain text's lines, HTML's and Markdown's runs (as the model sees them; none empty)."""
        lines = self.text.splitlines() if self._runs is None else self._runs
        return (squeezed(line) for line in lines if not line.isspace() and line)

    def translate(self, translator: DocumentTranslator, options: DecodeOptions) -> TranslatedFile:
        result = translator.translate([self.text], options, fmt=self.fmt)[0]
        return TranslatedFile(_encoded(result.text, self.bom), len(result.sentences), self.characters)


class _Srt:
    def __init__(self, subtitles, bom: bool) -> None:
        self.subtitles, self.bom = subtitles, bom
        self.characters = subtitles.characters

    def texts(self) -> Iterator[str]:
        return (squeezed(run.inline.text) for run in self.subtitles.runs if run.inline.text.strip())

    def translate(self, translator: DocumentTranslator, options: DecodeOptions) -> TranslatedFile:
        text, sentences = self.subtitles.translate(translator, options)
        return TranslatedFile(_encoded(text, self.bom), sentences, self.characters)


class _Zipped:
    def __init__(self, archive, members, name: str, package) -> None:
        self.archive, self.members, self.name, self.package = archive, members, name, package
        self.characters = package.characters_of([p for m in members for p in m.paragraphs])

    def texts(self) -> Iterator[str]:
        return (squeezed(p.inline.text) for m in self.members for p in m.paragraphs)

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
