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
    nearest_ancestor,
    opening,
    tokens,
    void,
    with_text,
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


class _Runs:
    """The runs found (``out``), and what finding them needs: what each element is (``kind``), and
    the elements with text in them (:func:`~.package.with_text`): content without text is no run,
    and holds none."""

    def __init__(self, kind: Callable[[etree._Element], Kind], root: etree._Element) -> None:
        self.kind, self.texts = kind, with_text(root)
        self.out: list[Paragraph] = []


def _runs(element: etree._Element, found: _Runs) -> None:
    """The runs of ``element``'s content, cut at its block children (and theirs, recursively)."""
    if element not in found.texts:
        return
    anchor, nodes = None, []
    for child in element:
        if found.kind(child).block:
            _run(element, anchor, nodes, found)
            _runs(child, found)
            anchor, nodes = child, []
        else:
            nodes.append(child)
    _run(element, anchor, nodes, found)


def _run(parent, anchor, nodes, found: _Runs) -> None:
    text = (parent.text if anchor is None else anchor.tail) or ""
    if not text.strip() and not any(n in found.texts or (n.tail and n.tail.strip()) for n in nodes):
        return  # neither the run nor anything it carries has text
    run = MixedRun(parent, anchor, nodes, found.kind)
    if run.inline.text.strip():
        found.out.append(run)
    for node in nodes:  # paragraphs inside what the run carries whole
        _inner_blocks(node, found)


def _inner_blocks(node: etree._Element, found: _Runs) -> None:
    if node not in found.texts:
        return
    what = found.kind(node)
    if what.inline:
        for child in node:
            _inner_blocks(child, found)
    elif what.block:
        _runs(node, found)
    elif isinstance(node.tag, str) and not what.opaque:
        for child in node:
            if found.kind(child).block:
                _runs(child, found)
            else:
                _inner_blocks(child, found)


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
    found = _Runs(_odf_kind, tree.getroot())
    known: dict = {}
    for block in tree.iter(f"{{{TEXT}}}p", f"{{{TEXT}}}h"):
        if block not in found.texts:
            continue
        if nearest_ancestor(block, lambda a: _odf_kind(a).block, known) is not None:
            continue  # inside another paragraph: reached through it
        _run(block, None, list(block), found)
    return found.out


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
    tree = archive.xml("content.xml")
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
    found = _Runs(_xhtml_kind, tree.getroot())
    _runs(tree.getroot(), found)
    return found.out


_CONTAINER = "urn:oasis:names:tc:opendocument:xmlns:container"
_OPF = "http://www.idpf.org/2007/opf"


def epub_members(archive: Zip, name: str) -> list[Member]:
    if archive.contents.get("mimetype", b"").strip() != b"application/epub+zip":
        raise UserError(f"{name}: not an EPUB: its first member is not the mimetype application/epub+zip")
    if "META-INF/encryption.xml" in archive.contents:
        raise UserError(f"{name}: the EPUB has encrypted (DRM) resources")
    if "META-INF/container.xml" not in archive.contents:
        raise UserError(f"{name}: not an EPUB: no META-INF/container.xml")
    container = archive.xml("META-INF/container.xml")
    rootfile = container.find(f".//{{{_CONTAINER}}}rootfile")
    package = rootfile.get("full-path") if rootfile is not None else None
    if not package or package not in archive.contents:
        raise UserError(f"{name}: META-INF/container.xml names no package document in the zip")
    opf = archive.xml(package)
    folder = posixpath.dirname(package)
    documents = set()
    for item in opf.iter(f"{{{_OPF}}}item"):
        if item.get("media-type") == "application/xhtml+xml" and item.get("href"):
            href = item.get("href", "").split("#")[0]
            documents.add(posixpath.normpath(posixpath.join(folder, _unquote(href))))
    members = []
    for member in archive.names():
        if member in documents:
            tree = archive.xml(member)
            members.append(Member(member, tree, xhtml_paragraphs(tree)))
    return members


def _unquote(href: str) -> str:
    from urllib.parse import unquote

    return unquote(href)
