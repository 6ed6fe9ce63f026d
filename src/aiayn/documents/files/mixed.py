"""XML with text in mixed content: OpenDocument (``text:p``, ``text:h``) and EPUB's XHTML.

A run is a stretch of inline content of one element: text and inline elements (ODF's ``text:span``,
``text:a``; XHTML's ``b``, ``em``, ``a``, ``span``, ...), cut at block children (XHTML: ``p``, ``div``,
``li``, ...; ODF's paragraphs hold none). Inline elements go around their target words; everything
else in a run is zero-width and moves whole, content and all (ODF: tabs, line breaks, ``text:s``,
frames, notes, fields, bookmarks; XHTML: ``br``, ``img``, and elements left untranslated: ``code``,
``script``, ``svg``, ``math``, ``translate="no"``, as in :mod:`aiayn.documents.html`). Paragraphs
inside a moved element (a note's, a text frame's) are runs of their own. Rebuilding a run empties
its inline elements (attributes kept) and writes the target text into the tree's text and tails.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from lxml import etree

from aiayn.documents.files.package import (
    Member,
    Paragraph,
    Zip,
    closing,
    local,
    namespace,
    opening,
    parse_xml,
    tokens,
    void,
)
from aiayn.documents.html import INLINE, INLINE_VOID, UNTRANSLATED
from aiayn.documents.markup import InlineBuilder
from aiayn.errors import UserError

if TYPE_CHECKING:
    from aiayn.documents.markup import Inline

TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
XHTML = "http://www.w3.org/1999/xhtml"
_ODF_INLINE = frozenset({"span", "a", "meta"})
_ODF_JOINS = frozenset(
    "bookmark bookmark-start bookmark-end reference-mark reference-mark-start reference-mark-end "
    "soft-page-break change change-start change-end toc-mark alphabetical-index-mark".split()
)


@dataclass(frozen=True)
class Kind:
    """What an element is in a run: ``inline`` (around words), a void (zero-width, moved whole;
    ``separates`` words; ``opaque``: nothing inside it is translated, else blocks inside it are), or a
    block (``block``: its content is a container of runs of its own)."""

    inline: bool = False
    separates: bool = True
    block: bool = False
    opaque: bool = False


class MixedRun(Paragraph):
    """Inline content of ``parent``: the text after ``anchor`` (``parent.text`` when None) and
    ``nodes``, each with its tail."""

    def __init__(self, parent, anchor, nodes: list, kind: Callable[[etree._Element], Kind]) -> None:
        self.parent, self.anchor, self.nodes, self.kind = parent, anchor, nodes, kind
        self.items: list[etree._Element] = []
        builder = InlineBuilder()
        builder.text(self._slot())
        for node in nodes:
            self._add(node, builder)
            builder.text(node.tail or "")
        self.inline: Inline = builder.build()

    def _slot(self) -> str:
        return (self.parent.text if self.anchor is None else self.anchor.tail) or ""

    def _add(self, node, builder: InlineBuilder) -> None:
        self.items.append(node)
        index = len(self.items) - 1
        what = self.kind(node)
        if not what.inline:
            builder.void(void(index), separates=what.separates)
            return
        builder.open(opening(index))
        builder.text(node.text or "")
        for child in node:
            self._add(child, builder)
            builder.text(child.tail or "")
        builder.close(closing(index))

    def rebuild(self, written: str) -> None:
        parent = self.parent
        position = 0 if self.anchor is None else parent.index(self.anchor) + 1
        if self.anchor is None:
            parent.text = None
        else:
            self.anchor.tail = None
        for node in self.nodes:
            parent.remove(node)
        # (element, next position in it or None to append, last node written in it)
        stack: list[list] = [[parent, position, self.anchor]]
        for kind, value in tokens(written):
            top = stack[-1]
            if kind == "text":
                if top[2] is None:
                    top[0].text = (top[0].text or "") + str(value)
                else:
                    top[2].tail = (top[2].tail or "") + str(value)
                continue
            if kind == "c":
                stack.pop()
                continue
            node = self.items[int(value)]
            node.tail = None
            if kind == "o":
                node.text = None
                for child in list(node):
                    node.remove(child)
            if top[1] is None:
                top[0].append(node)
            else:
                top[0].insert(top[1], node)
                top[1] += 1
            top[2] = node
            if kind == "o":
                stack.append([node, None, None])


def _runs(element: etree._Element, kind: Callable[[etree._Element], Kind], out: list[Paragraph]) -> None:
    """The runs of ``element``'s content, cut at its block children (and theirs, recursively)."""
    anchor, nodes = None, []
    for child in element:
        if kind(child).block:
            _run(element, anchor, nodes, kind, out)
            _runs(child, kind, out)
            anchor, nodes = child, []
        else:
            nodes.append(child)
    _run(element, anchor, nodes, kind, out)


def _run(parent, anchor, nodes, kind, out: list[Paragraph]) -> None:
    text = (parent.text if anchor is None else anchor.tail) or ""
    if not nodes and not text.strip():
        return
    run = MixedRun(parent, anchor, nodes, kind)
    if run.inline.text.strip():
        out.append(run)
    for node in nodes:  # paragraphs inside what the run carries whole
        _inner_blocks(node, kind, out)


def _inner_blocks(node: etree._Element, kind: Callable[[etree._Element], Kind], out: list[Paragraph]) -> None:
    what = kind(node)
    if what.inline:
        for child in node:
            _inner_blocks(child, kind, out)
    elif what.block:
        _runs(node, kind, out)
    elif isinstance(node.tag, str) and not what.opaque:
        for child in node:
            if kind(child).block:
                _runs(child, kind, out)
            else:
                _inner_blocks(child, kind, out)


# ---------------------------------------------------------------------------------------------
# OpenDocument


def _odf_kind(node) -> Kind:
    if not isinstance(node.tag, str):
        return Kind(separates=False, opaque=True)
    name, ns = local(node.tag), namespace(node.tag)
    if ns == TEXT and name in ("p", "h"):
        return Kind(block=True)
    if ns == TEXT and name in _ODF_INLINE:
        return Kind(inline=True)
    return Kind(separates=not (ns == TEXT and name in _ODF_JOINS))


def odf_paragraphs(tree: etree._ElementTree) -> list[Paragraph]:
    """The paragraphs and headings of an ODF document's body, each one run (notes and frames inside
    them: runs of their own)."""
    out: list[Paragraph] = []
    for block in tree.iter(f"{{{TEXT}}}p", f"{{{TEXT}}}h"):
        if any(_odf_kind(a).block for a in block.iterancestors()):
            continue  # inside another paragraph: reached through it
        _runs_of_paragraph(block, out)
    return out


def _runs_of_paragraph(block: etree._Element, out: list[Paragraph]) -> None:
    _run(block, None, list(block), _odf_kind, out)


_ODF_MIMETYPES = {
    "odt": b"application/vnd.oasis.opendocument.text",
    "odp": b"application/vnd.oasis.opendocument.presentation",
}


def odf_members(archive: Zip, name: str, kind: str) -> list[Member]:
    mimetype = archive.contents.get("mimetype", b"").strip()
    if mimetype != _ODF_MIMETYPES[kind] or "content.xml" not in archive.contents:
        raise UserError(
            f"{name}: not an OpenDocument {'text' if kind == 'odt' else 'presentation'} (.{kind}): "
            f"its mimetype member is {mimetype.decode('ascii', 'replace')!r}"
            + ("" if "content.xml" in archive.contents else ", and it has no content.xml")
        )
    manifest = archive.contents.get("META-INF/manifest.xml", b"")
    if b"encryption-data" in manifest:
        raise UserError(f"{name}: the document is encrypted (password-protected)")
    tree = parse_xml(archive.contents["content.xml"], name, "content.xml")
    if tree.getroot().tag != f"{{{OFFICE}}}document-content":
        raise UserError(f"{name}: content.xml is not an OpenDocument content document")
    return [Member("content.xml", tree, odf_paragraphs(tree))]


# ---------------------------------------------------------------------------------------------
# XHTML (EPUB)


def _no_translate(node: etree._Element) -> bool:
    return node.get("translate", "").strip().lower() == "no" or "notranslate" in node.get("class", "").split()


def _xhtml_kind(node) -> Kind:
    if not isinstance(node.tag, str):
        return Kind(separates=False, opaque=True)
    name, ns = local(node.tag), namespace(node.tag)
    if ns != XHTML or name in UNTRANSLATED or _no_translate(node):
        return Kind(opaque=True)
    if name in INLINE_VOID:
        return Kind(separates=name != "wbr")
    if name in INLINE:
        return Kind(inline=True)
    return Kind(block=True)


def xhtml_paragraphs(tree: etree._ElementTree) -> list[Paragraph]:
    out: list[Paragraph] = []
    _runs(tree.getroot(), _xhtml_kind, out)
    return out


_CONTAINER = "urn:oasis:names:tc:opendocument:xmlns:container"
_OPF = "http://www.idpf.org/2007/opf"


def epub_members(archive: Zip, name: str) -> list[Member]:
    if archive.contents.get("mimetype", b"").strip() != b"application/epub+zip":
        raise UserError(f"{name}: not an EPUB: its first member is not the mimetype application/epub+zip")
    if "META-INF/encryption.xml" in archive.contents:
        raise UserError(f"{name}: the EPUB has encrypted (DRM) resources")
    if "META-INF/container.xml" not in archive.contents:
        raise UserError(f"{name}: not an EPUB: no META-INF/container.xml")
    container = parse_xml(archive.contents["META-INF/container.xml"], name, "META-INF/container.xml")
    rootfile = container.find(f".//{{{_CONTAINER}}}rootfile")
    package = rootfile.get("full-path") if rootfile is not None else None
    if not package or package not in archive.contents:
        raise UserError(f"{name}: META-INF/container.xml names no package document in the zip")
    opf = parse_xml(archive.contents[package], name, package)
    folder = posixpath.dirname(package)
    documents = set()
    for item in opf.iter(f"{{{_OPF}}}item"):
        if item.get("media-type") == "application/xhtml+xml" and item.get("href"):
            href = item.get("href", "").split("#")[0]
            documents.add(posixpath.normpath(posixpath.join(folder, _unquote(href))))
    members = []
    for member in archive.names():
        if member in documents:
            tree = parse_xml(archive.contents[member], name, member)
            members.append(Member(member, tree, xhtml_paragraphs(tree)))
    return members


def _unquote(href: str) -> str:
    from urllib.parse import unquote

    return unquote(href)
