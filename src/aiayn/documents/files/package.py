"""What every zipped XML format shares: the zip read within limits and written back, its XML parsed
safely and serialized as it was, and the translation of its paragraphs in one stream.

A paragraph (:class:`Paragraph`) is a run of inline content: its :class:`~aiayn.documents.markup.Inline`
is built with private markers for markup (``\\x00o3\\x00`` opens element 3 of the paragraph,
``\\x00c3\\x00`` closes it, ``\\x00v3\\x00`` is zero-width item 3); after translation the markup
package puts each marker around the target words aligned to its source words, and the paragraph
rebuilds its XML from that string (:func:`tokens`). No XML text holds ``\\x00``, and the target text
is stripped of every character XML cannot hold, so the markers cannot be confused with text.

The zip is written back member by member in the same order, each with its name, time, attributes
and compression method; a member that no translation changed keeps its bytes, and a file in which
nothing changed comes back as it was, byte for byte.
"""

from __future__ import annotations

import io
import re
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from lxml import etree

from aiayn.documents.files.types import FileLimits, TooLarge, TranslatedFile, characters, squeezed
from aiayn.documents.markup import Inline, Run
from aiayn.errors import UserError

if TYPE_CHECKING:
    from aiayn.decode.search import DecodeOptions
    from aiayn.documents.translate import DocumentTranslator

MARK = "\x00"
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")
_DECLARATION = re.compile(rb"^(\xef\xbb\xbf)?<\?xml[^>]*\?>\s*")
_CHUNK = 1 << 20
#: A member this much larger than its compressed size (and over :data:`RATIO_FLOOR`), or a zip whose
#: members together are this much larger than the file (and over :data:`WHOLE_RATIO_FLOOR`), is taken
#: for a zip bomb.
MAX_RATIO = 200
RATIO_FLOOR = 64 * 1024
WHOLE_RATIO_FLOOR = 4_000_000


def xml_text(text: str) -> str:
    """Target text as XML can hold it (no control characters, no markers)."""
    return _INVALID_XML.sub("", text)


def tokens(written: str) -> Iterator[tuple[str, int | str]]:
    """A paragraph's translated string as ``("text", str)``, ``("o"|"c"|"v", index)`` tokens."""
    for k, part in enumerate(written.split(MARK)):
        if k % 2 == 0:
            if part:
                yield "text", part
        else:
            yield part[0], int(part[1:])


def opening(i: int) -> str:
    return f"{MARK}o{i}{MARK}"


def closing(i: int) -> str:
    return f"{MARK}c{i}{MARK}"


def void(i: int) -> str:
    return f"{MARK}v{i}{MARK}"


class Paragraph:
    """A run of inline content of some XML tree: its :class:`Inline`, and how to rebuild its XML from
    the translated string (:meth:`rebuild`, given :func:`tokens`)."""

    inline: Inline

    def rebuild(self, written: str) -> None:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# Zip


@dataclass
class Zip:
    """A zip read whole within the limits: its entries in order and their contents; the XML parsed
    from it (:meth:`xml`) is counted against ``max_xml_bytes``."""

    data: bytes
    infos: list[zipfile.ZipInfo]
    contents: dict[str, bytes]
    name: str = ""
    max_xml_bytes: int = FileLimits.max_xml_bytes
    xml_bytes: int = 0

    def names(self) -> list[str]:
        return [info.filename for info in self.infos]

    def xml(self, member: str) -> etree._ElementTree:
        """A member's XML (:func:`parse_xml`); a :class:`TooLarge` once the members parsed come to
        more than ``max_xml_bytes`` (a tree takes many times its XML's size in memory)."""
        data = self.contents[member]
        self.xml_bytes += len(data)
        if self.xml_bytes > self.max_xml_bytes:
            raise TooLarge(
                f"{self.name}: more than the {self.max_xml_bytes} bytes of XML allowed in its text parts"
            )
        return parse_xml(data, self.name, member)

    def written(self, changed: dict[str, bytes]) -> bytes:
        """The zip with the ``changed`` members' new contents (the original bytes when none)."""
        if not changed:
            return self.data
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as archive:
            for info in self.infos:
                entry = zipfile.ZipInfo(info.filename, info.date_time)
                entry.compress_type = info.compress_type
                entry.external_attr, entry.create_system = info.external_attr, info.create_system
                entry.comment = info.comment
                data = changed.get(info.filename, self.contents[info.filename])
                archive.writestr(entry, data)
        return out.getvalue()


def read_zip(data: bytes, name: str, what: str, limits: FileLimits) -> Zip:
    """``data`` as a zip, every member read; a :class:`UserError` naming ``name`` for anything that
    is not a sound zip within ``limits``."""
    if data[:8] == b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1":
        raise UserError(
            f"{name}: an OLE container, not a {what}: a password-protected (encrypted) Office file or "
            "an old binary one (.doc, .ppt); save it unprotected in the format its name says"
        )
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        ValueError,
        OSError,
        EOFError,
        IndexError,
        NotImplementedError,
    ):
        raise UserError(f"{name}: not a {what} (not a zip archive, or a damaged one)") from None
    if len(infos) > limits.max_members:
        raise TooLarge(f"{name}: {len(infos)} zip members, more than the {limits.max_members} allowed")
    declared = sum(info.file_size for info in infos)
    if declared > limits.max_unpacked_bytes:
        raise TooLarge(
            f"{name}: {declared} bytes unpacked, more than the {limits.max_unpacked_bytes} allowed"
        )
    if declared > WHOLE_RATIO_FLOOR and declared > MAX_RATIO * len(data):
        raise TooLarge(
            f"{name}: unpacks {declared // max(len(data), 1)} times its size: refused as a zip bomb"
        )
    contents: dict[str, bytes] = {}
    total = 0
    for info in infos:
        if info.flag_bits & 0x1:
            raise UserError(f"{name}: member {info.filename} is encrypted (password-protected)")
        if info.file_size > RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise TooLarge(
                f"{name}: member {info.filename} unpacks {info.file_size // max(info.compress_size, 1)} "
                "times its size: refused as a zip bomb"
            )
        if info.filename in contents:
            raise UserError(f"{name}: member {info.filename} is in the zip twice")
        chunks = []
        try:
            with archive.open(info) as member:
                while chunk := member.read(_CHUNK):
                    total += len(chunk)
                    if total > limits.max_unpacked_bytes:
                        raise TooLarge(
                            f"{name}: more than the {limits.max_unpacked_bytes} bytes unpacked allowed "
                            "(its directory understates its sizes)"
                        )
                    chunks.append(chunk)
        except UserError:
            raise
        except (
            zipfile.BadZipFile,
            zlib.error,
            EOFError,
            OSError,
            ValueError,
            NotImplementedError,
            RuntimeError,
        ) as err:
            raise UserError(f"{name}: member {info.filename} cannot be read ({_first_line(err)})") from None
        contents[info.filename] = b"".join(chunks)
    return Zip(data, infos, contents, name, limits.max_xml_bytes)


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


# ---------------------------------------------------------------------------------------------
# XML


def parse_xml(data: bytes, name: str, member: str) -> etree._ElementTree:
    """A member's XML, parsed without network, DTDs or entity expansion."""
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)
    try:
        return etree.ElementTree(etree.fromstring(data, parser))
    except (etree.LxmlError, ValueError) as err:
        raise UserError(f"{name}: {member} is not well-formed XML ({_first_line(err)})") from None


def serialize_xml(tree: etree._ElementTree, original: bytes) -> bytes:
    """The tree as XML between the original's own declaration and its whitespace at the end (both
    kept byte for byte)."""
    head = _DECLARATION.match(original)
    encoding = tree.docinfo.encoding or "UTF-8"
    body = etree.tostring(tree, encoding=encoding, xml_declaration=False).rstrip()
    end = original[len(original.rstrip()) :]
    return (head.group(0) if head else b"") + body + end


# ---------------------------------------------------------------------------------------------
# Translation


@dataclass
class Member:
    """One zip member to translate: its tree and its paragraphs."""

    name: str
    tree: etree._ElementTree
    paragraphs: list[Paragraph] = field(default_factory=list)


class _Sentences:
    """All the sentences of a file's runs, as one document of the stream (``line_of``: the paragraph)."""

    def __init__(self, runs: list[Run]) -> None:
        self.runs = runs
        self.starts: list[int] = []
        self.texts: list[str] = []
        for p, run in enumerate(runs):
            for s, e in run.spans:
                self.texts.append(run.inline.text[s:e])
                self.starts.append(p)

    def sentences(self) -> list[str]:
        return self.texts

    def line_of(self, k: int) -> int:
        return self.starts[k] + 1


def translate_runs(
    translator: DocumentTranslator,
    options: DecodeOptions,
    paragraphs: Sequence[Paragraph],
    name: str,
    escape: Callable[[str], str] = xml_text,
) -> tuple[list[str | None], int]:
    """Each paragraph's translated string (None where the translation changed none of its
    sentences), all sentences in one call; and the number of sentences."""
    runs = [Run(p.inline, tuple(translator.sentence_spans(p.inline.text)), escape) for p in paragraphs]
    document = _Sentences(runs)
    [found] = translator.translate_parsed(
        [document], options, where=lambda _d, line: f"{name}, paragraph {line}"
    )
    out: list[str | None] = []
    k = 0
    for run in runs:
        mine = found[k : k + len(run.spans)]
        k += len(run.spans)
        sources = [squeezed(run.inline.text[s:e]) for s, e in run.spans]
        same = all(t.text == source for t, source in zip(mine, sources))
        out.append(None if same or not run.spans else run.write(mine))
    return out, len(document.texts)


def translate_members(
    translator: DocumentTranslator,
    options: DecodeOptions,
    archive: Zip,
    members: list[Member],
    name: str,
    characters: int,
) -> TranslatedFile:
    """The members' paragraphs translated in one call, the changed members serialized, the zip written."""
    paragraphs = [p for member in members for p in member.paragraphs]
    written, sentences = translate_runs(translator, options, paragraphs, name)
    changed_members: set[str] = set()
    k = 0
    for member in members:
        for paragraph in member.paragraphs:
            if written[k] is not None:
                paragraph.rebuild(written[k])
                changed_members.add(member.name)
            k += 1
    changed = {
        m.name: serialize_xml(m.tree, archive.contents[m.name]) for m in members if m.name in changed_members
    }
    return TranslatedFile(archive.written(changed), sentences, characters)


def characters_of(paragraphs: Sequence[Paragraph]) -> int:
    """The characters to translate: each paragraph's text with its whitespace runs as single spaces."""
    return sum(characters(p.inline.text) for p in paragraphs)


def nearest_ancestor(
    node: etree._Element, test: Callable[[etree._Element], bool], known: dict
) -> etree._Element | None:
    """``node``'s nearest ancestor that passes ``test`` (None when none). ``known`` (one dict for all
    the calls on a tree) remembers the answer for every ancestor walked through, so that all the
    calls together walk each node of the tree once: not once for each node under it."""
    chain = []
    node = node.getparent()
    while node is not None and not test(node):
        if node in known:
            found = known[node]
            break
        chain.append(node)
        node = node.getparent()
    else:
        found = node
    for walked in chain:
        known[walked] = found
    return found


def with_text(root: etree._Element) -> set[etree._Element]:
    """The elements under ``root`` (itself included) with text that is not whitespace in them: in
    their own text or their descendants' text and tails (one pass; libxml2 finds the text)."""
    out: set[etree._Element] = set()
    for text in root.xpath(".//text()[normalize-space()]"):
        node = text.getparent()
        if node is not None and text.is_tail:
            node = node.getparent()
        while node is not None and node not in out:
            out.add(node)
            node = node.getparent()
    return out


def local(tag: object) -> str:
    """An element's local name ('' for comments, processing instructions, entities)."""
    return etree.QName(tag).localname if isinstance(tag, str) else ""


def namespace(tag: object) -> str:
    return etree.QName(tag).namespace or "" if isinstance(tag, str) else ""
