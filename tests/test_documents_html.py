"""HTML documents and fragments translated block by block, markup carried by alignment."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import markupever
import pytest
from markupever import dom

from aiayn.documents.html import parse_html
from markup_fakes import identity, merge_and_drop, reverse, split_sentences, translate, unaligned, upper

FRAGMENT = (Path(__file__).parent / "fixtures" / "documents_fragment.html").read_text(encoding="utf-8")
TRANSLATORS = [identity, reverse, upper, merge_and_drop, unaligned]


def parse(document: str):
    warnings: list[str] = []
    return parse_html(document, split_sentences, warnings.append), warnings


def elements(html: str, full: bool = False) -> Counter:
    """The elements of a parsed HTML text: (name, attributes) with their counts; and no parse error."""
    parser = markupever.Parser(markupever.HtmlOptions(full_document=full))
    parser.process(html)
    parser.finish()
    assert parser.errors() == [], html
    found = Counter()
    for node in parser.into_dom().root().descendants():
        if isinstance(node, dom.Element):
            found[node.name.local, tuple((k.local, v) for k, v in node.attrs.items())] += 1
    return found


def test_a_fragment_translated_as_itself_comes_back_byte_for_byte() -> None:
    parsed, warnings = parse(FRAGMENT)
    assert warnings == []
    assert translate(parsed, identity) == FRAGMENT


def test_only_the_text_of_blocks_is_sent_and_untranslated_elements_are_taken_out() -> None:
    parsed, _ = parse(FRAGMENT)
    sentences = parsed.sentences()
    assert sentences[:4] == [
        "A short title",
        "The quick brown fox.",
        "It jumps over the lazy old dog.",
        "Entities: & < > and\xa0a non-breaking space.",
    ]
    assert "Run and press, see and." in sentences and "Keep and as they are." in sentences
    assert sentences[-3:] == ["One", "Two", "Text with a wbr: supercalifragilistic."]
    for kept in ("preformatted", "run(", "color", "Some text", "Not translated", "Brand"):
        assert not any(kept in sentence for sentence in sentences)


@pytest.mark.parametrize("translator", TRANSLATORS, ids=lambda t: t.__name__)
def test_the_output_has_exactly_the_elements_of_the_input_and_parses_cleanly(translator) -> None:
    parsed, _ = parse(FRAGMENT)
    assert elements(translate(parsed, translator)) == elements(FRAGMENT)


@pytest.mark.parametrize("translator", TRANSLATORS, ids=lambda t: t.__name__)
def test_untranslated_elements_and_the_layout_between_blocks_are_kept(translator) -> None:
    out = translate(parse(FRAGMENT)[0], translator)
    for kept in (
        "<pre>  preformatted   text\n  stays</pre>\n",
        '<script>if (a < b && c > d) { run("x"); }</script>\n<style>p > b { color: red; }</style>\n',
        '<textarea name="t">Some text here</textarea>\n',
        '<div translate="no"><p>Not translated at all.</p></div>',
        "<code>ls -l</code>",
        "<kbd>Enter</kbd>",
        '<span translate="no">Brand Name</span>',
        '<span class="notranslate big">Other Brand</span>',
        "\n  <li>",
        '\n    <ol start="3">\n      <li>',
    ):
        assert kept in out, (kept, out)


def test_tags_land_on_the_words_they_covered() -> None:
    out = translate(parse(FRAGMENT)[0], reverse)
    assert '<h1 id="top">title <em>short</em> A</h1>' in out
    link = '<a href="https://example.org/?a=1&amp;b=2" title="a &quot;dog&quot;">dog. <i>old</i> lazy</a>'
    assert f"<p>fox. brown <b>quick</b> The {link} the over jumps It</p>" in out
    assert "is x<sup>2</sup> H<sub>2</sub>O, is Water</p>" in out  # copied words keep tags inside
    assert '<li><a href="/x">link. a</a> with item Second\n    <ol' in out


def test_line_breaks_and_images_go_after_the_word_before_them() -> None:
    out = translate(parse(FRAGMENT)[0], reverse)
    assert 'here. two <img src="x.png" alt="An image"> line one<br>Line</p>' in out
    assert "<p>super<wbr>califragilistic. wbr: a with Text</p>" in out


def test_entities_round_trip() -> None:
    parsed, warnings = parse("<p>&amp; &lt; &gt; &nbsp;&#169; &copy; x.</p>")
    assert warnings == [] and parsed.sentences() == ["& < > \xa0© © x."]
    # the serializer's spelling: &amp; &lt; &gt; &nbsp; as entities, other characters as themselves
    assert translate(parsed, identity) == "<p>&amp; &lt; &gt; &nbsp;© © x.</p>"
    assert translate(parsed, upper) == "<p>&amp; &lt; &gt; © © X.</p>"
    parsed, _ = parse('<p>a <a href="?x=1&amp;y=&quot;2&quot;" title="&lt;t&gt;">b</a>.</p>')
    assert translate(parsed, reverse) == '<p><a href="?x=1&amp;y=&quot;2&quot;" title="<t>">b</a>. a</p>'


def test_malformed_html_is_recovered_as_a_browser_would_with_one_warning() -> None:
    parsed, warnings = parse("<p>a <b>b</p> c")
    assert len(warnings) == 1 and "\n" not in warnings[0] and warnings[0].startswith("malformed HTML")
    # as a browser: the <b> left open is closed with the paragraph and opened again after it
    assert translate(parsed, identity) == "<p>a <b>b</b></p><b> c</b>"
    assert translate(parsed, reverse) == "<p><b>b</b> a</p><b> c</b>"


def test_a_fragment_stays_a_fragment_and_a_document_a_document() -> None:
    parsed, warnings = parse("<p>One <b>two</b>.</p>\n")
    assert warnings == [] and translate(parsed, upper) == "<p>ONE <b>TWO</b>.</p>\n"
    document = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>The title.</title>\n'
        "</head>\n<body>\n<p>Hello <b>bold</b> world.</p>\n</body>\n</html>\n"
    )
    parsed, warnings = parse(document)
    assert warnings == []
    # the doctype kept; the whitespace after </body> moves into the body, as the standard parses it
    assert translate(parsed, reverse) == (
        '<!DOCTYPE html><html lang="en"><head>\n<meta charset="utf-8">\n<title>title. The</title>\n'
        "</head>\n<body>\n<p>world. <b>bold</b> Hello</p>\n\n\n</body></html>"
    )
    parsed, warnings = parse("<!-- c --><html><body><p>No doctype.</p></body></html>")
    assert warnings == []  # a document with no doctype is not malformed for this purpose
    assert translate(parsed, reverse) == "<!-- c --><html><head></head><body><p>doctype. No</p></body></html>"


def test_a_document_with_no_text_has_no_sentences_and_comes_back_as_it_was() -> None:
    parsed, _ = parse('<div>\n  <img src="a.png">\n  <br>\n</div>')
    assert parsed.sentences() == []
    assert parsed.rebuild([]) == '<div>\n  <img src="a.png">\n  <br>\n</div>'


WORDS = ["alpha", "beta.", "gamma,", "delta", "x2", "&amp;", "&lt;", "a&nbsp;b", "end."]
INLINE = ["b", "i", "a", "span", "em", "sub", "code", "kbd"]


def _fragment(rng: random.Random, depth: int = 0) -> str:
    out = []
    for _ in range(rng.randint(1, 6)):
        draw = rng.random()
        if draw < 0.45:
            out.append(rng.choice(WORDS) + rng.choice([" ", "", "  ", "\n"]))
        elif draw < 0.75 and depth < 3:
            tag = rng.choice(INLINE)
            attrs = ' href="u?a=1&amp;b"' if tag == "a" else ""
            out.append(f"<{tag}{attrs}>{_fragment(rng, depth + 1)}</{tag}>" + rng.choice([" ", ""]))
        elif draw < 0.85:
            out.append(rng.choice(["<br>", '<img src="x">', "<wbr>", "<!-- c -->"]))
        elif depth == 0:
            out.append(rng.choice(["<p>", "</p>", "<div>", "</div>", "<li>"]))  # malformed at times
    return "".join(out)


def test_random_fragments_keep_their_elements_and_their_serialization_is_stable() -> None:
    rng = random.Random(0)
    for _ in range(100):
        parsed, _ = parse("<p>" + _fragment(rng) + "</p>" + _fragment(rng))
        once = translate(parsed, identity)
        for translator in TRANSLATORS[1:]:
            assert elements(translate(parsed, translator)) == elements(once)
        again, warnings = parse(once)
        assert warnings or translate(again, identity) == once  # a clean serialization is a fixed point
