"""Markdown documents translated in place: only the text of paragraphs, headings and table cells
changes, with emphasis and links carried by alignment."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from aiayn.decode.request import Translation
from aiayn.documents.markdown import escape_markdown, parse_markdown
from markup_fakes import identity, merge_and_drop, reverse, split_sentences, translate, unaligned, upper

SAMPLE = (Path(__file__).parent / "fixtures" / "documents_sample.md").read_text(encoding="utf-8")
TRANSLATORS = [identity, reverse, upper, merge_and_drop, unaligned]
# the parts of SAMPLE that no translation may touch
KEPT = [
    "---\ntitle: Front *matter* stays\ntags: [a, b]\n---\n\n# ",
    "\n------------\n\n> ",
    "\n  1. ",
    "\n  2. ",
    "\n\n3) ",
    "\n4) ",
    "\n|:-----|-------------:|:----:|\n| ",
    " | `a\\|b` |\n| ",
    '\n\n    indented code\n    stays\n\n~~~python\nfenced = "code"  # stays\n~~~\n\n'
    '<div class="raw">\nHTML block stays.\n</div>\n\n'
    '[ref]: https://ref.example "Ref title"\n[collapsed]: https://collapsed.example\n'
    "[shortcut]: <https://shortcut.example>\n",
    "`ls -l`",
    '![image *alt*](i.png "Title")',
    "<https://auto.link>",
    "<me@example.org>",
]


def parse(document: str):
    warnings: list[str] = []
    return parse_markdown(document, split_sentences, warnings.append), warnings


def test_a_document_translated_as_itself_comes_back_byte_for_byte() -> None:
    parsed, warnings = parse(SAMPLE)
    assert warnings == []
    assert translate(parsed, identity) == SAMPLE
    crlf = SAMPLE.replace("\n", "\r\n")
    assert translate(parse(crlf)[0], identity) == crlf


def test_only_the_text_of_paragraphs_headings_and_cells_is_sent() -> None:
    parsed, _ = parse(SAMPLE)
    assert parsed.sentences() == [
        "A short title",
        "The quick brown fox.",
        "It jumps over the lazy old dog.",
        "Entities & © and escapes * _ [ stay.",
        "Run now.",
        "A hard break above, and one with a backslash here.",
        "See and, an and inline html.",
        "A struck word, a reference, a collapsed one and a shortcut.",
        "Setext title",
        "A quoted line\ngoes on here.",
        "Second sentence.",
        "Nested quote.",
        "First item.",
        "Second item\ncontinues here.",
        "Nested one.",
        "Nested two.",
        "Star item with.",
        "Third.",
        "Fourth.",
        "Name",
        "Value | pipe",
        "Code",
        "Apples",
        "three",
        "Pears",
        "four",
        "x",
    ]


@pytest.mark.parametrize("translator", TRANSLATORS, ids=lambda t: t.__name__)
def test_code_front_matter_html_blocks_definitions_and_table_rules_stay_byte_for_byte(translator) -> None:
    out = translate(parse(SAMPLE)[0], translator)
    for kept in KEPT:
        assert kept in out, (kept, out)
    assert out.count("\n") <= SAMPLE.count("\n")


def test_words_move_with_their_emphasis_and_links_keep_their_destination() -> None:
    out = translate(parse(SAMPLE)[0], reverse)
    assert "\n# title *short* A #\n" in out
    assert (
        '\nfox. brown **quick** The [dog. *old* lazy](https://example.org/?a=1&b=2 "A dog") the over' in out
    )
    assert "\n[shortcut]. a and one [collapsed][] a [reference][ref], a word, ~~struck~~ A\n" in out


def test_containers_keep_their_markers_and_table_cells_their_pipes() -> None:
    out = translate(parse(SAMPLE)[0], reverse)
    assert "\n> here. on goes line quoted A sentence. Second\n>\n> > quote. Nested\n" in out
    assert "\n- item. First\n- here. continues item Second\n  1. one. Nested\n" in out
    assert "\n| Name | pipe \\| Value | Code |\n" in out
    # a translation that keeps the line break of a paragraph gets the container's marker on it
    parsed, _ = parse("> One\n> two.\n")
    assert parsed.rebuild([Translation("Eins\nzwei.", ((0, 0), (1, 1)))]) == "> Eins\n> zwei.\n"


def test_an_element_left_with_no_word_is_left_out_rather_than_written_as_text() -> None:
    parsed, _ = parse("Some **very** good [text](http://x) here.\n")
    assert translate(parsed, unaligned) == "SOME VERY GOOD TEXT HERE.\n"
    # "very" merged into the first word takes its emphasis along; "good" dropped
    assert translate(parsed, merge_and_drop) == "**SOMEVERY** [TEXT](http://x) HERE.\n"


def test_translated_text_is_escaped_where_it_would_become_markup() -> None:
    parsed, _ = parse("A b c.\n")
    assert parsed.rebuild([Translation("*x* [y] # - a_b |", ())]) == "\\*x\\* \\[y\\] \\# \\- a\\_b \\|\n"
    assert escape_markdown("1 # 2 -- x-y") == "1 \\# 2 \\-- x-y"


def test_a_run_that_cannot_be_matched_with_the_source_stays_as_it_was_with_a_warning() -> None:
    # the parser expands the tab of a list item's continuation line: the line is not the source's
    document = "- item\n\tcontinued here.\n\nNext paragraph.\n"
    parsed, warnings = parse(document)
    assert warnings == ["1 Markdown block(s) left untranslated: their text was not found in the source"]
    assert parsed.sentences() == ["Next paragraph."]
    assert translate(parsed, upper) == "- item\n\tcontinued here.\n\nNEXT PARAGRAPH.\n"


def test_code_in_emphasis_and_in_links_stays_with_its_markup() -> None:
    parsed, _ = parse("Use **`--force`** now, see [`parse()`](api.md).\n")
    assert parsed.sentences() == ["Use now, see."]
    assert translate(parsed, upper) == "USE **`--force`** NOW, SEE [`parse()`](api.md).\n"
    # the link stood between "see" and its full stop: it stays there
    assert translate(parsed, reverse) == "see [`parse()`](api.md). now, Use **`--force`**\n"
    parsed, _ = parse("A line  \n**`x`** and more.\n")
    assert translate(parsed, identity) == "A line  \n**`x`** and more.\n"
    assert translate(parsed, upper) == "A LINE  \n**`x`** AND MORE.\n"


PIECES = ["word", "two.", "x_y", "\\*", "&amp;", "`co de`", "<b>", "</b>", "![i](s.png)", "<http://a.b>"]
PIECES += ["[l](u)", "[r][]", "end.", "**`flag`**", "[`code`](u)", "see ![i](s.png)"]


def _inline(rng: random.Random, depth: int = 0) -> str:
    parts = []
    for _ in range(rng.randint(1, 6)):
        if depth < 2 and rng.random() < 0.3:
            marker = rng.choice(["*", "**", "_", "~~"])
            parts.append(marker + _inline(rng, depth + 1) + marker)
        else:
            parts.append(rng.choice(PIECES))
    joints = [" ", " ", "  \n", "\n", "\\\n"] if depth == 0 else [" "]
    return "".join(part + rng.choice(joints) for part in parts[:-1]) + parts[-1]


def _document(rng: random.Random) -> str:
    blocks = {
        "p": lambda text: text,
        "h": lambda text: "## " + text.replace("\n", " "),
        "li": lambda text: "- " + text.replace("\n", "\n  "),
        "ol": lambda text: "1. " + text.replace("\n", "\n   "),
        "quote": lambda text: "> " + text.replace("\n", "\n> "),
        "cell": lambda text: (
            "| a | b |\n|---|---|\n| " + text.replace("\n", " ").replace("|", "\\|") + " | c |"
        ),
    }
    chosen = [rng.choice(list(blocks.values()))(_inline(rng)) for _ in range(rng.randint(1, 5))]
    return "\n\n".join(chosen) + "\n\n[r]: http://r\n"


def test_random_documents_translated_as_themselves_come_back_byte_for_byte() -> None:
    rng = random.Random(0)
    for _ in range(150):
        document = _document(rng)
        parsed, warnings = parse(document)
        assert warnings == [] and translate(parsed, identity) == document, document
        for translator in (reverse, merge_and_drop, unaligned):
            translate(parsed, translator)  # no error
