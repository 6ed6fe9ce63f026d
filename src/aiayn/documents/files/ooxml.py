"""Office Open XML paragraphs (Word's ``w:p``, PowerPoint's ``a:p``): text in formatted runs.

A paragraph's text sits in runs (``w:r``, ``a:r``), each with its properties (``w:rPr``, ``a:rPr``:
bold, italic, font, a PowerPoint hyperlink). The properties that hold most of the paragraph's
characters are its *base*: runs with them are plain text; every other stretch of neighbouring runs
with the same properties is one inline element around its words, and so is each container of runs
(Word's ``w:hyperlink``, ``w:ins``, ``w:smartTag``, ``w:customXml``). Everything else is zero-width
(a void) and moves whole: tabs, line breaks, drawings, footnote references, bookmarks, a complex
field from its ``begin`` to its ``end`` (its result is not translated), ``w:fldSimple``, ``a:fld``,
deleted text. After translation the paragraph is rebuilt: its properties (``w:pPr``, ``a:pPr``,
``a:endParaRPr``) stay, the elements go around their target words (a run keeps its first run's
attributes and properties), target text outside them goes into runs with the base properties, and
the voids are moved to their places (one of a run's own, outside any run, in a run of its properties).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lxml import etree

from aiayn.documents.files.package import (
    Member,
    Paragraph,
    Zip,
    closing,
    local,
    nearest_ancestor,
    opening,
    tokens,
    void,
)
from aiayn.documents.markup import InlineBuilder
from aiayn.errors import UserError

if TYPE_CHECKING:
    from aiayn.documents.markup import Inline

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
A = "http://schemas.openxmlformats.org/drawingml/2006/main"
_XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"


@dataclass(frozen=True)
class Dialect:
    ns: str
    leading: frozenset[str]  # paragraph properties kept first
    trailing: frozenset[str]  # kept last
    containers: frozenset[str]  # elements around runs
    container_properties: frozenset[str]  # their property children, kept with them
    joins: frozenset[str]  # voids that stand for no space between words
    one_text: bool  # a run holds exactly one text element (DrawingML)

    def tag(self, name: str) -> str:
        return f"{{{self.ns}}}{name}"


WORD = Dialect(
    W,
    frozenset({"pPr"}),
    frozenset(),
    frozenset({"hyperlink", "ins", "moveTo", "smartTag", "customXml", "dir", "bdo"}),
    frozenset({"smartTagPr", "customXmlPr"}),
    frozenset(
        "bookmarkStart bookmarkEnd proofErr commentRangeStart commentRangeEnd permStart permEnd "
        "softHyphen noBreakHyphen lastRenderedPageBreak moveFromRangeStart moveFromRangeEnd "
        "moveToRangeStart moveToRangeEnd del moveFrom annotationRef".split()
    ),
    False,
)
DRAWING = Dialect(
    A, frozenset({"pPr"}), frozenset({"endParaRPr"}), frozenset(), frozenset(), frozenset(), True
)


@dataclass
class _Void:
    nodes: list  # the elements, in order
    properties: etree._Element | None  # a void of a run: its run's properties
    in_run: bool
    template: etree._Element | None = None  # its run


@dataclass
class _Element:
    node: etree._Element  # the run (first of its stretch) or the container
    run: bool


class OfficeParagraph(Paragraph):
    def __init__(
        self, p: etree._Element, dialect: Dialect, base: tuple[bytes, etree._Element | None] | None = None
    ) -> None:
        self.p, self.d = p, dialect
        self.items: list[_Void | _Element] = []
        self.base, self.base_properties = _base(p, dialect) if base is None else base
        builder = InlineBuilder()
        self._content([c for c in p if local(c.tag) not in dialect.leading | dialect.trailing], builder)
        self.inline: Inline = builder.build()

    # --- reading ----------------------------------------------------------------------------------
    def _key(self, run: etree._Element) -> bytes:
        properties = run.find(self.d.tag("rPr"))
        return b"" if properties is None else etree.tostring(properties)

    def _content(self, children: list, builder: InlineBuilder) -> None:
        k = 0
        while k < len(children):
            child = children[k]
            name = local(child.tag)
            field_end = self._field_end(children, k) if name == "r" else None
            if field_end is not None:
                self._void(children[k : field_end + 1], builder, separates=True)
                k = field_end + 1
                continue
            if name == "r":
                key = self._key(child)
                stretch = [child]
                while (
                    k + len(stretch) < len(children)
                    and local(children[k + len(stretch)].tag) == "r"
                    and self._key(children[k + len(stretch)]) == key
                    and self._field_end(children, k + len(stretch)) is None
                ):
                    stretch.append(children[k + len(stretch)])
                if key == self.base:
                    for run in stretch:
                        self._run(run, builder)
                else:
                    self.items.append(_Element(child, True))
                    builder.open(opening(len(self.items) - 1))
                    index = len(self.items) - 1
                    for run in stretch:
                        self._run(run, builder)
                    builder.close(closing(index))
                k += len(stretch)
                continue
            if name in self.d.containers and etree.QName(child).namespace == self.d.ns:
                self.items.append(_Element(child, False))
                index = len(self.items) - 1
                builder.open(opening(index))
                inner = [c for c in child if local(c.tag) not in self.d.container_properties]
                self._content(inner, builder)
                builder.close(closing(index))
            else:
                self._void([child], builder, separates=name not in self.d.joins)
            k += 1

    def _field_end(self, children: list, k: int) -> int | None:
        """Where the complex field that run ``k`` begins ends (the last child when it runs on)."""
        if self.d is not WORD or _field_char(children[k]) != "begin":
            return None
        depth = 0
        for j in range(k, len(children)):
            kind = _field_char(children[j])
            depth += (kind == "begin") - (kind == "end")
            if depth == 0:
                return j
        return len(children) - 1

    def _run(self, run: etree._Element, builder: InlineBuilder) -> None:
        properties = run.find(self.d.tag("rPr"))
        for child in run:
            name = local(child.tag)
            if child is properties:
                continue
            if name == "t" and etree.QName(child).namespace == self.d.ns:
                builder.text(child.text or "")
                continue
            item = _Void([child], properties, True, run)
            self.items.append(item)
            builder.void(void(len(self.items) - 1), separates=name not in self.d.joins)

    def _void(self, nodes: list, builder: InlineBuilder, separates: bool) -> None:
        self.items.append(_Void(nodes, None, False))
        builder.void(void(len(self.items) - 1), separates=separates)

    # --- writing ----------------------------------------------------------------------------------
    def rebuild(self, written: str) -> None:
        p, d = self.p, self.d
        first = [c for c in p if local(c.tag) in d.leading]
        last = [c for c in p if local(c.tag) in d.trailing]
        for child in list(p):
            p.remove(child)
        for child in first:
            p.append(child)
        stack: list[tuple[int, etree._Element, bool]] = [(-1, p, False)]  # (item, element, is a run)
        plain: etree._Element | None = None  # the base run last made, while it is its parent's last child
        for kind, value in tokens(written):
            parent = stack[-1][1]
            if kind == "text":
                if stack[-1][2]:
                    self._text(parent, str(value))
                    continue
                if plain is None or plain.getparent() is not parent or parent[-1] is not plain:
                    plain = self._new_run(None, self.base_properties)
                    parent.append(plain)
                self._text(plain, str(value))
                continue
            item = self.items[int(value)]
            if kind == "o":
                assert isinstance(item, _Element)
                shell = self._shell(item)
                parent.append(shell)
                stack.append((int(value), shell, item.run))
            elif kind == "c":
                index, shell, is_run = stack.pop()
                if is_run:
                    self._finish_run(shell)
            else:
                assert isinstance(item, _Void)
                if item.in_run:
                    if stack[-1][2]:
                        parent.extend(item.nodes)
                    else:
                        holder = self._new_run(item.template, item.properties)
                        holder.extend(item.nodes)
                        parent.append(holder)
                    continue
                if stack[-1][2]:  # out of the run, and into a new one like it after the void
                    index, shell, _ = stack.pop()
                    self._finish_run(shell)
                    stack[-1][1].extend(item.nodes)
                    again = self._new_run(shell, shell.find(d.tag("rPr")))
                    stack[-1][1].append(again)
                    stack.append((index, again, True))
                else:
                    parent.extend(item.nodes)
        for child in last:
            p.append(child)

    def _shell(self, item: _Element) -> etree._Element:
        """The element emptied of its content (a run keeps its properties, a container its own)."""
        node = item.node
        keep = {"rPr"} if item.run else self.d.container_properties
        for child in list(node):
            if local(child.tag) not in keep:
                node.remove(child)
        node.text = node.tail = None
        return node

    def _new_run(self, template: etree._Element | None, properties: etree._Element | None) -> etree._Element:
        run = etree.Element(self.d.tag("r"), attrib=dict(template.attrib) if template is not None else {})
        if properties is not None:
            run.append(copy.deepcopy(properties))
        return run

    def _text(self, run: etree._Element, text: str) -> None:
        last = run[-1] if len(run) else None
        if last is not None and last.tag == self.d.tag("t"):
            last.text = (last.text or "") + text
        elif self.d.one_text and run.find(self.d.tag("t")) is not None:
            t = run.find(self.d.tag("t"))
            t.text = (t.text or "") + text
        else:
            last = etree.SubElement(run, self.d.tag("t"))
            last.text = text
        if self.d is WORD and last is not None and last.text and last.text != last.text.strip():
            last.set(_XML_SPACE, "preserve")

    def _finish_run(self, run: etree._Element) -> None:
        """A run left with nothing is dropped; DrawingML's run needs its text element."""
        if all(local(c.tag) == "rPr" for c in run):
            run.getparent().remove(run)


def _base(p: etree._Element, d: Dialect) -> tuple[bytes, etree._Element | None]:
    """The run properties that hold most of the paragraph's characters (the first run's when none)."""
    return _bases(p, d)[0].get(p, (b"", None))


def _bases(
    root: etree._Element, d: Dialect
) -> tuple[dict[etree._Element, tuple[bytes, etree._Element | None]], set[etree._Element]]:
    """:func:`_base` of every paragraph under ``root`` (itself included) with runs, and those of them
    with text, in one pass over the runs: a run belongs to its nearest paragraph (not to those around
    a text box's)."""
    counts: dict[etree._Element, dict[bytes, int]] = {}
    first: dict[etree._Element, dict[bytes, etree._Element | None]] = {}
    texts: set[etree._Element] = set()
    owners: dict[etree._Element, etree._Element | None] = {}
    p_tag, t_tag = d.tag("p"), d.tag("t")
    for run in root.iter(d.tag("r")):
        p = _owner(run, p_tag, owners)
        if p is None:
            continue
        properties = run.find(d.tag("rPr"))
        key = b"" if properties is None else etree.tostring(properties)
        chars = 0
        for t in run.iterchildren(t_tag):
            chars += len(t.text or "")
            if t.text and not t.text.isspace():
                texts.add(p)
        mine = counts.setdefault(p, {})
        mine[key] = mine.get(key, 0) + chars
        first.setdefault(p, {}).setdefault(key, properties)
    out = {}
    for p, mine in counts.items():
        key = max(mine, key=lambda k: mine[k])  # the first of the most
        out[p] = key, first[p][key]
    return out, texts


def _owner(node: etree._Element, tag: str, known: dict) -> etree._Element | None:
    """``node``'s nearest ancestor ``tag`` (None when none)."""
    return nearest_ancestor(node, lambda a: a.tag == tag, known)


def _field_char(run: etree._Element) -> str | None:
    if local(run.tag) != "r":
        return None
    char = run.find(f"{{{W}}}fldChar")
    return None if char is None else char.get(f"{{{W}}}fldCharType")


def _paragraphs(tree: etree._ElementTree, dialect: Dialect) -> list[Paragraph]:
    """The paragraphs with text (those without, often most of a hostile file's, are never built)."""
    out: list[Paragraph] = []
    bases, texts = _bases(tree.getroot(), dialect)
    for p in tree.iter(dialect.tag("p")):
        if p not in texts:
            continue
        paragraph = OfficeParagraph(p, dialect, bases[p])
        if paragraph.inline.text.strip():
            out.append(paragraph)
    return out


# ---------------------------------------------------------------------------------------------
# The formats

_WORD_PARTS = re.compile(r"word/(document|header\d*|footer\d*|footnotes|endnotes)\.xml")
_SLIDE_PARTS = re.compile(r"ppt/(slides/slide|notesSlides/notesSlide)\d+\.xml")


def docx_members(archive: Zip, name: str) -> list[Member]:
    if "word/document.xml" not in archive.contents:
        raise UserError(f"{name}: not a Word document (.docx): the zip has no word/document.xml")
    return _members(archive, name, _WORD_PARTS, WORD, f"{{{W}}}document")


def pptx_members(archive: Zip, name: str) -> list[Member]:
    if "ppt/presentation.xml" not in archive.contents:
        raise UserError(f"{name}: not a PowerPoint presentation (.pptx): the zip has no ppt/presentation.xml")
    return _members(archive, name, _SLIDE_PARTS, DRAWING, None)


def _members(archive: Zip, name: str, parts: re.Pattern, dialect: Dialect, root: str | None) -> list[Member]:
    members = []
    for member in archive.names():
        if not parts.fullmatch(member):
            continue
        tree = archive.xml(member)
        if root is not None and member == "word/document.xml" and tree.getroot().tag != root:
            raise UserError(f"{name}: word/document.xml is not a WordprocessingML document")
        members.append(Member(member, tree, _paragraphs(tree, dialect)))
    return members
