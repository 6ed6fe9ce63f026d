"""HTML documents and fragments: block by block, inline markup carried by alignment.

The document is parsed with html5ever (through markupever), which follows the HTML5 parsing
algorithm: malformed HTML is recovered as a browser would and reported once through ``warn``. The
output is the parsed tree serialized as the HTML standard serializes it (so entities and attribute
quotes come back in its spelling: ``&amp; &lt; &gt; &nbsp;`` as entities, other characters as
themselves), with the text of each block translated:

- the children of an element are cut into runs of inline content (text and inline elements such as
  ``b``, ``a``, ``span``, ``br``, ``img``) at every block element (``p``, ``li``, ``td``, ``h1``, ...,
  and any element not known to be inline); each run is split into sentences and written back by
  :func:`aiayn.documents.markup.transfer`, each inline element around the words aligned to its own;
- ``script``, ``style``, ``pre``, ``code``, ``kbd``, ``samp``, ``var``, ``textarea``, ``svg``,
  ``math`` and every element with ``translate="no"`` or the class ``notranslate`` stay as they are,
  with their content; inside a run they are carried as one zero-width element;
- attributes stay as they were (``title`` and ``alt`` are not translated).

A fragment (no ``<!DOCTYPE>``, ``<html>``, ``<head>`` or ``<body>`` before the first element) comes
back as a fragment; a document as a document, with its doctype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import markupever
from markupever import dom

from aiayn.documents.markup import Assembled, InlineBuilder, Run
from aiayn.documents.types import SplitSentences
from aiayn.errors import Warn

_HTML = "http://www.w3.org/1999/xhtml"
#: Elements that are part of the text around them (phrasing content that holds text).
INLINE = frozenset(
    "a abbr b bdi bdo big cite data del dfn em font i ins mark nobr q ruby s small span strike "
    "strong sub sup time tt u".split()
)
#: Empty elements inside the text: carried as zero-width elements.
INLINE_VOID = frozenset("br img input wbr".split())
#: Elements whose content is never translated; inside text they are carried whole.
UNTRANSLATED = frozenset(
    "code kbd samp var script style pre textarea svg math template iframe noembed noframes xmp "
    "plaintext rt rp audio video canvas object".split()
)
_VOID = frozenset(
    "area base basefont bgsound br col embed frame hr img input keygen link meta param source track "
    "wbr".split()
)
_RAW_TEXT = frozenset("style script xmp iframe noembed noframes plaintext".split())


def parse_html(document: str, split: SplitSentences, warn: Warn) -> Assembled:
    """Parse an HTML document or fragment into its runs of text to translate."""
    full = _is_document(document)
    parser = markupever.Parser(markupever.HtmlOptions(full_document=full))
    parser.process(document)
    parser.finish()
    errors = parser.errors()
    tree = parser.into_dom().root()
    if full and not any(isinstance(n, dom.Doctype) for n in tree.children()):
        errors = errors[1:]  # the first error of a document with no doctype says so; not malformed
    if errors:
        first = errors[0]
        warn(f"malformed HTML recovered as a browser would ({len(errors)} parse errors; the first: {first})")
    walker = _Walker(split)
    walker.container(_read(tree))
    return Assembled(walker.finish())


def _is_document(text: str) -> bool:
    """Whether the first thing in ``text`` after whitespace and comments is a doctype or an
    ``html``, ``head`` or ``body`` start tag."""
    pos = 0
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] == "\ufeff"):
            pos += 1
        if not text.startswith("<!--", pos):
            break
        end = text.find("-->", pos + 4)
        if end < 0:
            return False
        pos = end + 3
    head = text[pos : pos + 10].lower()
    if head.startswith("<!doctype"):
        return True
    for tag in ("<html", "<head", "<body"):
        after = head[len(tag) : len(tag) + 1]
        if head.startswith(tag) and (after in ("", ">", "/") or after.isspace()):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Reading the tree


_TEXT, _ELEMENT, _OTHER = 0, 1, 2
_BLOCK_UNTRANSLATED = frozenset("pre script style template".split())


@dataclass(slots=True)
class _Node:
    """A node of the parsed tree, read once from the parser's: an element with its start and end
    tags, text (``content``), or anything else with its markup (``content``)."""

    kind: int
    content: str = ""
    name: str = ""  # an element's local name, with its namespace unless HTML
    end: str = ""
    children: list[_Node] = field(default_factory=list)
    untranslated: bool = False
    inline: bool = True  # belongs in a run: text, a comment, an inline element with inline content
    raw_text: bool = False  # its text children are written as they are (script, style)


def _read(node: dom.Node) -> _Node:
    if isinstance(node, dom.Text):
        return _Node(_TEXT, node.content)
    if isinstance(node, dom.Element):
        return _read_element(node)
    if isinstance(node, dom.Comment):
        return _Node(_OTHER, f"<!--{node.content}-->")
    if isinstance(node, dom.Doctype):
        return _Node(_OTHER, _doctype(node), inline=False)
    if isinstance(node, dom.ProcessingInstruction):
        return _Node(_OTHER, f"<?{node.target} {node.data}>")
    return _Node(_OTHER, inline=False, children=_children(node))  # the document


def _children(node: dom.Node) -> list[_Node]:
    children, child = [], node.first_child
    while child is not None:
        children.append(_read(child))
        child = child.next_sibling
    return children


def _read_element(element: dom.Element) -> _Node:
    qualified = element.name
    html = qualified.ns == _HTML
    name = qualified.local if html else f"{qualified.ns} {qualified.local}"
    attrs = list(element.attrs.items())
    void = html and name in _VOID
    read = _Node(_ELEMENT, _start_tag(qualified.local, attrs), name, "" if void else f"</{qualified.local}>")
    read.untranslated = not html or name in UNTRANSLATED or any(_no_translate(k.local, v) for k, v in attrs)
    read.raw_text = html and name in _RAW_TEXT
    read.children = [] if void else _children(element)
    if name in INLINE_VOID:
        read.inline = True
    elif read.untranslated:
        read.inline = name not in _BLOCK_UNTRANSLATED
    else:
        read.inline = name in INLINE and all(child.inline for child in read.children)
    first = read.children[0] if read.children else None
    if name in ("pre", "textarea", "listing") and first and first.kind == _TEXT and first.content[:1] == "\n":
        read.content += "\n"  # the parser drops a newline right after the start tag
    return read


def _start_tag(name: str, attrs: list[tuple[markupever.QualName, str]]) -> str:
    return f"<{name}" + "".join(f' {_attribute_name(key)}="{_escape_attribute(v)}"' for key, v in attrs) + ">"


def _no_translate(name: str, value: str) -> bool:
    return (name == "translate" and value.strip().lower() == "no") or (
        name == "class" and "notranslate" in value.split()
    )


def _attribute_name(key: markupever.QualName) -> str:
    return f"{key.prefix}:{key.local}" if key.prefix else key.local


class _Walker:
    """Walks the tree in document order, collecting literal text and runs."""

    def __init__(self, split: SplitSentences) -> None:
        self.split = split
        self.parts: list[str | Run] = []
        self.literal: list[str] = []

    def finish(self) -> list[str | Run]:
        if self.literal:
            self.parts.append("".join(self.literal))
        return self.parts

    def container(self, node: _Node) -> None:
        """The children of ``node``: runs of inline children, and the block children between them."""
        run: list[_Node] = []
        for child in node.children:
            if child.inline:
                run.append(child)
                continue
            self._run(run)
            run = []
            self._block(child)
        self._run(run)

    def _block(self, node: _Node) -> None:
        if node.kind != _ELEMENT or node.untranslated or not node.end:
            self.literal.append(serialize(node))
            return
        self.literal.append(node.content)
        self.container(node)
        self.literal.append(node.end)

    def _run(self, nodes: list[_Node]) -> None:
        if not nodes:
            return
        builder = InlineBuilder()
        for node in nodes:
            _add(builder, node)
        inline = builder.build()
        spans = tuple(self.split(inline.text)) if inline.text.strip() else ()
        if not spans:
            self.literal.extend(serialize(node) for node in nodes)
            return
        if self.literal:
            self.parts.append("".join(self.literal))
            self.literal = []
        self.parts.append(Run(inline, spans, escape_text))


def _add(builder: InlineBuilder, node: _Node) -> None:
    if node.kind == _TEXT:
        builder.text(node.content)
    elif node.kind != _ELEMENT:
        builder.void(node.content, separates=False)
    elif node.name in INLINE_VOID:
        builder.void(serialize(node), separates=node.name != "wbr")
    elif node.untranslated:
        builder.void(serialize(node))
    else:
        builder.open(node.content)
        for child in node.children:
            _add(builder, child)
        builder.close(node.end)


# ---------------------------------------------------------------------------------------------
# Serializing (the HTML standard's algorithm, doctype identifiers kept)


def escape_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("\xa0", "&nbsp;").replace("<", "&lt;").replace(">", "&gt;")


def _escape_attribute(value: str) -> str:
    return value.replace("&", "&amp;").replace("\xa0", "&nbsp;").replace('"', "&quot;")


def serialize(node: _Node) -> str:
    """``node`` and its content as HTML."""
    out: list[str] = []
    _serialize(node, out, raw=False)
    return "".join(out)


def _serialize(node: _Node, out: list[str], raw: bool) -> None:
    if node.kind == _TEXT:
        out.append(node.content if raw else escape_text(node.content))
        return
    out.append(node.content)
    for child in node.children:
        _serialize(child, out, node.raw_text)
    out.append(node.end)


def _doctype(doctype: dom.Doctype) -> str:
    public, system = doctype.public_id, doctype.system_id
    if public:
        return f'<!DOCTYPE {doctype.name} PUBLIC "{public}"' + (f' "{system}">' if system else ">")
    if system:
        return f'<!DOCTYPE {doctype.name} SYSTEM "{system}">'
    return f"<!DOCTYPE {doctype.name}>"
