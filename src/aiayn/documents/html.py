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

import markupever
from markupever import dom

from aiayn.documents.markup import Assembled, InlineBuilder, Run
from aiayn.documents.types import SplitSentences, Warn

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
    walker.container(tree)
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


def _name(element: dom.Element) -> str:
    name = element.name
    return name.local if name.ns == _HTML else f"{name.ns} {name.local}"


def _untranslated(element: dom.Element) -> bool:
    if _name(element) in UNTRANSLATED or element.name.ns != _HTML:
        return True
    attrs = element.attrs
    if attrs.get("translate", "").strip().lower() == "no":
        return True
    return "notranslate" in attrs.get("class", "").split()


def _inline(node: dom.Node) -> bool:
    """Whether ``node`` belongs in a run: text, a comment, or an inline element with only inline
    content (an untranslated inline element with any content)."""
    if not isinstance(node, dom.Element):
        return not isinstance(node, dom.Doctype)
    name = _name(node)
    if name in INLINE_VOID:
        return True
    if _untranslated(node):
        return name not in _BLOCK_UNTRANSLATED
    return name in INLINE and all(_inline(child) for child in node.children())


_BLOCK_UNTRANSLATED = frozenset("pre script style template".split())


class _Walker:
    """Walks the tree in document order, collecting literal text and runs."""

    def __init__(self, split: SplitSentences) -> None:
        self.split = split
        self.parts: list[str | Run] = []
        self.literal: list[str] = []

    def finish(self) -> list[str | Run]:
        self._flush()
        return self.parts

    def _flush(self) -> None:
        if self.literal:
            self.parts.append("".join(self.literal))
            self.literal = []

    def container(self, node: dom.Node) -> None:
        """The children of ``node``: runs of inline children, and the block children between them."""
        run: list[dom.Node] = []
        for child in node.children():
            if _inline(child):
                run.append(child)
                continue
            self._run(run)
            run = []
            self._block(child)
        self._run(run)

    def _block(self, node: dom.Node) -> None:
        if not isinstance(node, dom.Element) or _untranslated(node) or _name(node) in _VOID:
            self.literal.append(serialize(node))
            return
        self.literal.append(start_tag(node))
        self.container(node)
        self.literal.append(end_tag(node))

    def _run(self, nodes: list[dom.Node]) -> None:
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
        self._flush()
        self.parts.append(Run(inline, spans, escape_text))


def _add(builder: InlineBuilder, node: dom.Node) -> None:
    if isinstance(node, dom.Text):
        builder.text(node.content)
    elif not isinstance(node, dom.Element):
        builder.void(serialize(node), separates=False)
    elif _name(node) in INLINE_VOID:
        builder.void(serialize(node), separates=_name(node) != "wbr")
    elif _untranslated(node):
        builder.void(serialize(node))
    else:
        builder.open(start_tag(node))
        for child in node.children():
            _add(builder, child)
        builder.close(end_tag(node))


# ---------------------------------------------------------------------------------------------
# Serializing (the HTML standard's algorithm, doctype identifiers kept)


def escape_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("\xa0", "&nbsp;").replace("<", "&lt;").replace(">", "&gt;")


def _escape_attribute(value: str) -> str:
    return value.replace("&", "&amp;").replace("\xa0", "&nbsp;").replace('"', "&quot;")


def start_tag(element: dom.Element) -> str:
    attrs = "".join(
        f' {f"{key.prefix}:" if key.prefix else ""}{key.local}="{_escape_attribute(value)}"'
        for key, value in element.attrs.items()
    )
    return f"<{element.name.local}{attrs}>"


def end_tag(element: dom.Element) -> str:
    return "" if element.name.ns == _HTML and element.name.local in _VOID else f"</{element.name.local}>"


def serialize(node: dom.Node) -> str:
    """``node`` and its content as HTML."""
    out: list[str] = []
    _serialize(node, out, raw=False)
    return "".join(out)


def _serialize(node: dom.Node, out: list[str], raw: bool) -> None:
    if isinstance(node, dom.Text):
        out.append(node.content if raw else escape_text(node.content))
    elif isinstance(node, dom.Element):
        _serialize_element(node, out)
    elif isinstance(node, dom.Comment):
        out.append(f"<!--{node.content}-->")
    elif isinstance(node, dom.Doctype):
        out.append(_doctype(node))
    elif isinstance(node, dom.ProcessingInstruction):
        out.append(f"<?{node.target} {node.data}>")
    else:  # the document
        for child in node.children():
            _serialize(child, out, raw=False)


def _serialize_element(element: dom.Element, out: list[str]) -> None:
    out.append(start_tag(element))
    name = element.name.local if element.name.ns == _HTML else ""
    if name in _VOID:
        return
    first = element.first_child
    if name in ("pre", "textarea", "listing") and isinstance(first, dom.Text) and first.content[:1] == "\n":
        out.append("\n")  # the parser drops one newline after the start tag
    for child in element.children():
        _serialize(child, out, raw=name in _RAW_TEXT)
    out.append(end_tag(element))


def _doctype(doctype: dom.Doctype) -> str:
    public, system = doctype.public_id, doctype.system_id
    if public:
        return f'<!DOCTYPE {doctype.name} PUBLIC "{public}"' + (f' "{system}">' if system else ">")
    if system:
        return f'<!DOCTYPE {doctype.name} SYSTEM "{system}">'
    return f"<!DOCTYPE {doctype.name}>"
