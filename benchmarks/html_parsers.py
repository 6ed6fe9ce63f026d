"""HTML parsers for ``--format html``, and what the document formats cost per sentence.

The HTML format needs a parser that recovers malformed HTML as browsers do (the HTML5 parsing
algorithm), says when the input was malformed, and is cheap next to translation (~400 short
sentences/s on a 2-core CPU: documents mode may add at most a tenth, 0.25 ms a sentence). For each
installed candidate (html5lib, lxml, selectolax, BeautifulSoup over html5lib and lxml, markupever
over html5ever) this measures:

* the tree it builds from ``<p>a <b>b</p> c`` (a browser's: ``<p>a <b>b</b></p><b> c</b>``) and
  whether it reports parse errors;
* parse + its own serializer, on an article of 300 sentences with inline tags (and on ``--page``);
* for html5lib and markupever, the two that do both: parse + a walk over every node from Python (the
  work ``aiayn.documents.html`` does on top of parsing);

then the whole of ``parse_html`` + ``rebuild`` (and ``parse_markdown`` + ``rebuild`` on the same
article in Markdown) per sentence, on the article (inline markup in every sentence) and on the same
sentences with no markup, with a trivial sentence splitter and a translation that changes every
word (upper case) aligned word for word; process time, so that other processes' load counts less.
Best of ``--repeat`` runs; writes ``benchmarks/results/html_parsers.json``.

    .venv/bin/python benchmarks/html_parsers.py
    .venv/bin/python benchmarks/html_parsers.py --page some/page.html
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import time
import warnings
from pathlib import Path

import markupever

from aiayn.decode.request import Translation
from aiayn.documents.html import parse_html
from aiayn.documents.markdown import _parser, parse_markdown

MALFORMED = "<p>a <b>b</p> c"
SENTENCES = (
    "The <b>quick</b> brown fox jumps over the <a href='https://example.org/?a=1&amp;b=2'>lazy dog</a>.",
    "It was a <i>bright</i> cold day in April, and the clocks were striking thirteen.",
    "Call me <em>Ishmael</em> &amp; friends, said the man with <code>code()</code> in his hand.",
)
MARKDOWN = (
    "The **quick** brown fox jumps over the [lazy dog](https://example.org/?a=1&b=2).",
    "It was a *bright* cold day in April, and the clocks were striking thirteen.",
    "Call me *Ishmael* &amp; friends, said the man with `code()` in his hand.",
)


def article(paragraphs: int = 100, markup: bool = True) -> tuple[str, str, int]:
    """An HTML document and a Markdown one of ``paragraphs`` paragraphs of three sentences."""
    html_sentences = SENTENCES if markup else [_plain(s) for s in SENTENCES]
    markdown_sentences = MARKDOWN if markup else [_plain(s) for s in SENTENCES]
    html = "<!DOCTYPE html><html><head><title>T</title></head><body>\n"
    html += "".join(f"<p>{' '.join(html_sentences)}</p>\n" for _ in range(paragraphs)) + "</body></html>\n"
    markdown = "".join(f"{' '.join(markdown_sentences)}\n\n" for _ in range(paragraphs))
    return html, markdown, 3 * paragraphs


def _plain(sentence: str) -> str:
    """The sentence's text with no markup (its tags are only the ones written above)."""
    parser = markupever.Parser(markupever.HtmlOptions(full_document=False))
    parser.process(sentence)
    return parser.finish().into_dom().root().text()


def best(function, repeat: int, *args, clock=time.perf_counter) -> float:
    times = []
    for _ in range(repeat):
        start = clock()
        function(*args)
        times.append(clock() - start)
    return min(times)


def milliseconds(function, documents: dict[str, str], repeat: int) -> dict[str, float]:
    return {name: round(best(function, repeat, document) * 1e3, 2) for name, document in documents.items()}


def candidates() -> dict:
    """name -> (parse and serialize a document, the fragment's tree as HTML, parse errors or None)."""
    found = {}
    if importlib.util.find_spec("html5lib"):
        import html5lib

        def html5lib_errors(text):
            parser = html5lib.HTMLParser()
            parser.parseFragment(text)
            return [e[1] for e in parser.errors]

        found["html5lib"] = (
            lambda d: html5lib.serialize(html5lib.parse(d, treebuilder="etree"), tree="etree"),
            lambda d: html5lib.serialize(html5lib.parseFragment(d, treebuilder="etree"), tree="etree"),
            html5lib_errors,
        )
    if importlib.util.find_spec("lxml"):
        import lxml.html

        def lxml_fragment(text):
            parts = lxml.html.fragments_fromstring(text)
            return "".join(p if isinstance(p, str) else lxml.html.tostring(p, encoding=str) for p in parts)

        found["lxml"] = (lambda d: lxml.html.tostring(lxml.html.document_fromstring(d)), lxml_fragment, None)
    if importlib.util.find_spec("selectolax"):
        from selectolax.lexbor import LexborHTMLParser

        found["selectolax (lexbor)"] = (
            lambda d: LexborHTMLParser(d).html,
            lambda d: LexborHTMLParser(d, is_fragment=True).html,
            None,
        )
    if importlib.util.find_spec("bs4"):
        import bs4

        for builder in ("html5lib", "lxml"):
            if importlib.util.find_spec(builder):
                found[f"BeautifulSoup ({builder})"] = (
                    lambda d, b=builder: str(bs4.BeautifulSoup(d, b)),
                    lambda d, b=builder: "".join(str(c) for c in bs4.BeautifulSoup(d, b).body.contents),
                    None,
                )
    if importlib.util.find_spec("markupever"):
        import markupever

        def markupever_errors(text):
            parser = markupever.Parser(markupever.HtmlOptions(full_document=False))
            parser.process(text)
            return parser.finish().errors()

        found["markupever (html5ever)"] = (
            lambda d: markupever.parse(d).serialize(),
            lambda d: markupever.parse(d, markupever.HtmlOptions(full_document=False)).serialize(),
            markupever_errors,
        )
    return found


def walks() -> dict:
    """Parse + visit every node from Python, for the parsers that recover as browsers and report errors."""
    found = {}
    if importlib.util.find_spec("html5lib"):
        import html5lib

        def html5lib_walk(text):
            stack = [html5lib.parse(text, treebuilder="etree", namespaceHTMLElements=False)]
            while stack:
                node = stack.pop()
                _ = (node.tag, dict(node.attrib), node.text, node.tail)
                stack.extend(node)

        found["html5lib"] = html5lib_walk
    if importlib.util.find_spec("markupever"):
        import markupever
        from markupever import dom

        def markupever_walk(text):
            stack = [markupever.parse(text).root()]
            while stack:
                node = stack.pop()
                if isinstance(node, dom.Element):
                    _ = (node.name.local, list(node.attrs.items()))
                elif isinstance(node, dom.Text):
                    _ = node.content
                child = node.first_child
                while child is not None:
                    stack.append(child)
                    child = child.next_sibling

        found["markupever (html5ever)"] = markupever_walk
    return found


def split(text: str) -> list[tuple[int, int]]:
    """Sentences ending in ". " (the segmenter's cost is measured in benchmarks/segmenters.py)."""
    spans, start = [], 0
    while start < len(text):
        while start < len(text) and text[start].isspace():
            start += 1
        end = text.find(". ", start)
        end = len(text) if end < 0 else end + 1
        if start < end:
            spans.append((start, len(text[:end].rstrip())))
        start = end
    return spans


def changed(sentence: str) -> Translation:
    """Every word changed (no word copied), each aligned to its source word."""
    return Translation(sentence.upper(), tuple((i, i) for i in range(len(sentence.split()))))


def document_mode(parse, document: str, repeat: int) -> dict:
    """Process time of parse + rebuild per sentence, and its share of translation at 400 sentences/s."""
    sentences = parse(document, split, lambda line: None).sentences()
    translations = [changed(s) for s in sentences]
    work = lambda: parse(document, split, lambda line: None).rebuild(translations)  # noqa: E731
    seconds = best(work, repeat, clock=time.process_time)
    return {
        "sentences": len(sentences),
        "ms": round(seconds * 1e3, 2),
        "ms_per_sentence": round(seconds / len(sentences) * 1e3, 4),
        "share_of_translation_at_400_sentences_per_s": round(seconds / len(sentences) * 400, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--page", type=Path, help="also time the parsers on this HTML page")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "html_parsers.json")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    html, markdown, sentences = article()
    documents = {f"article ({sentences} sentences, {len(html)} chars)": html}
    if args.page:
        page = args.page.read_text(encoding="utf-8")
        documents[f"{args.page.name} ({len(page)} chars)"] = page
    result = {"machine": platform.processor() or platform.machine(), "parsers": {}, "walk_ms": {}}
    for name, (serialize, fragment, errors) in candidates().items():
        entry = {
            "malformed_tree": fragment(MALFORMED),
            "reports_errors": (errors is not None and len(errors(MALFORMED)) > 0),
            "parse_serialize_ms": milliseconds(serialize, documents, args.repeat),
        }
        result["parsers"][name] = entry
        print(f"{name:26s} {entry}")
    for name, walk in walks().items():
        result["walk_ms"][name] = milliseconds(walk, documents, args.repeat)
        print(f"{name:26s} parse + walk ms {result['walk_ms'][name]}")
    plain_html, plain_markdown, _ = article(markup=False)
    runs = (
        ("html, markup in every sentence", parse_html, html),
        ("html, no inline markup", parse_html, plain_html),
        ("markdown, markup in every sentence", parse_markdown, markdown),
        ("markdown, no inline markup", parse_markdown, plain_markdown),
    )
    result["document_mode"] = {}
    for name, parse, document in runs:
        result["document_mode"][name] = document_mode(parse, document, args.repeat)
        print(f"{name}: parse + rebuild {result['document_mode'][name]}")
    start = time.process_time()
    _parser().parse(markdown, {})
    result["markdown_it_parse_alone_ms"] = round((time.process_time() - start) * 1e3, 2)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
