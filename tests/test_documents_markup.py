"""Inline markup carried through translation by word alignment (aiayn.documents.markup)."""

from __future__ import annotations

import html

import pytest

from aiayn.decode.request import Translation
from aiayn.documents.markup import Assembled, Inline, InlineBuilder, Run, transfer
from markup_fakes import identity, merge_and_drop, reverse, split_sentences, unaligned, upper


def build(*parts) -> Inline:
    """An Inline from text (a str) and ("open" | "close" | "void", markup) pairs."""
    builder = InlineBuilder()
    for part in parts:
        if isinstance(part, str):
            builder.text(part)
        else:
            getattr(builder, part[0])(*part[1:])
    return builder.build()


def write(inline: Inline, translator) -> str:
    spans = split_sentences(inline.text)
    return transfer(inline, spans, [translator(inline.text[s:e]) for s, e in spans], html.escape)


B, _B = ("open", "<b>"), ("close", "</b>")
EM, _EM = ("open", "<i>"), ("close", "</i>")
BR = ("void", "<br>")
# Click <a href="x">the <b>red</b> button</a> now.<br>Then H<sub>2</sub>O <code>ls -l</code> flows.
EXAMPLE = (
    "Click ",
    ("open", '<a href="x">'),
    "the ",
    B,
    "red",
    _B,
    " button",
    ("close", "</a>"),
    " now.",
    BR,
    "Then H",
    ("open", "<sub>"),
    "2",
    ("close", "</sub>"),
    "O ",
    ("void", "<code>ls -l</code>"),
    " flows.",
)


def test_the_text_to_translate_has_no_markup_and_untranslated_content_is_taken_out() -> None:
    inline = build(*EXAMPLE)
    assert inline.text == "Click the red button now. Then H2O flows."
    assert [inline.text[s:e] for s, e in split_sentences(inline.text)] == [
        "Click the red button now.",
        "Then H2O flows.",
    ]
    code = inline.elements[-1]
    assert (code.start, code.end, code.glue, code.lead) == (34, 34, "none", " ")  # after "H2O"


def test_the_identity_gives_the_source_back() -> None:
    expected = (
        'Click <a href="x">the <b>red</b> button</a> now.<br>Then H<sub>2</sub>O <code>ls -l</code> flows.'
    )
    assert write(build(*EXAMPLE), identity) == expected


def test_tags_follow_their_words_when_the_order_changes() -> None:
    # "Click the red button now." -> "now. button red the Click": the link keeps its three words, the
    # line break stays after "now." (in place of the space after it), the code after "H2O"
    assert write(build(*EXAMPLE), reverse) == (
        'now.<br><a href="x">button <b>red</b> the</a> Click flows. H<sub>2</sub>O <code>ls -l</code> Then'
    )


def test_nested_elements_stay_nested() -> None:
    inline = build(B, "very ", EM, "red", _EM, _B, " car")
    assert write(inline, reverse) == "car <b><i>red</i> very</b>"


def test_a_word_changed_by_the_translation_takes_the_tag_inside_it_whole() -> None:
    inline = build("h", ("open", "<sub>"), "2", ("close", "</sub>"), "o is water")
    assert write(inline, upper) == "<sub>H2O</sub> IS WATER"
    to_german = Translation("Wasser ist h2o", ((0, 2), (1, 1), (2, 0)))  # copied: the tag stays inside
    assert transfer(inline, [(0, len(inline.text))], [to_german]) == "Wasser ist h<sub>2</sub>o"


def test_merged_words_take_the_tag_and_a_tag_on_dropped_words_is_kept_empty() -> None:
    # "New York is very big" -> "NEWYORK VERY BIG" ("is" dropped)
    inline = build(B, "New", _B, " York is ", EM, "very", _EM, " big")
    assert write(inline, merge_and_drop) == "<b>NEWYORK</b> <i>VERY</i> BIG"
    # "I like really it" -> "ILIKE IT": <b> goes empty after the word aligned to "like"
    inline = build("I like ", B, "really", _B, " it")
    assert write(inline, merge_and_drop) == "ILIKE<b></b> IT"


def test_with_no_alignment_elements_go_to_the_end_of_their_sentence() -> None:
    inline = build("a ", B, "b", _B, ". c ", EM, "d", _EM, ".")
    assert write(inline, unaligned) == "A B.<b></b> C D.<i></i>"


def test_an_element_whose_word_a_sibling_took_takes_it_back_from_a_sibling_that_keeps_another() -> None:
    inline = build(B, "a b", _B, " ", EM, "c", _EM, " d")
    # "a" and "b" are aligned to the first and third words, so <b> would wrap all three; "c" to the
    # second word only, inside <b>'s span: <i> takes it, and <b> keeps the longest part left ("A")
    crossing = Translation("A C B D", ((0, 0), (1, 2), (2, 1), (3, 3)))
    assert transfer(inline, [(0, len(inline.text))], [crossing]) == "<b>A</b> <i>C</i> B D"
    # a sibling's only word is not taken: "a" and "b" merged into one word, <b> holds it
    merged = Translation("AB C D", ((0, 0), (1, 0), (2, 1), (3, 2)))
    inline = build(B, "a", _B, " ", EM, "b", _EM, " c d")
    assert transfer(inline, [(0, len(inline.text))], [merged]) == "<b>AB</b><i></i> C D"


def test_an_element_whose_word_has_no_alignment_takes_its_neighbours_spare_word() -> None:
    # "b" is aligned to nothing; "B" was aligned to "a", which has "A" too: <b> takes "B"
    inline = build("a ", B, "b", _B, " c.")
    assert transfer(inline, [(0, 6)], [Translation("A B C.", ((0, 0), (0, 1), (2, 2)))]) == "A <b>B</b> C."
    # with no word before it, the first word of the word after it
    inline = build(B, "a", _B, " b c.")
    assert transfer(inline, [(0, 6)], [Translation("A B C.", ((1, 0), (1, 1), (2, 2)))]) == "<b>A</b> B C."
    # no spare word: "b" was dropped, <b> stays empty next to its neighbour's word
    inline = build("a ", B, "b", _B, " c.")
    assert transfer(inline, [(0, 6)], [Translation("A C.", ((0, 0), (2, 1)))]) == "A<b></b> C."
    # a word another element holds is not spare: <i> keeps "B", <b> stays empty
    inline = build(EM, "a", _EM, " ", B, "b", _B, " c.")
    aligned = Translation("A B C.", ((0, 0), (0, 1), (2, 2)))
    assert transfer(inline, [(0, 6)], [aligned]) == "<i>A B</i><b></b> C."


def test_line_breaks_and_images_go_after_the_word_before_them() -> None:
    assert write(build("one", BR, "two three"), reverse) == "three two one<br>"
    assert write(build("one ", BR, " two three"), reverse) == "three two one <br>"
    # an image glued to the word after it goes before that word
    assert write(build(("void", "<img>"), "caption text"), reverse) == "text <img>caption"
    assert write(build("one", BR, "two"), identity) == "one<br>two"
    assert write(build("a <img> b"[:2], ("void", "<img>"), " b"), identity) == "a <img> b"


def test_every_element_is_written_exactly_once() -> None:
    inline = build(*EXAMPLE)
    markups = [e.open for e in inline.elements] + [e.close for e in inline.elements if e.close]
    for translator in (identity, reverse, upper, merge_and_drop, unaligned):
        out = write(inline, translator)
        assert all(out.count(markup) == 1 for markup in markups), (translator, out)
        assert out.index('<a href="x">') < out.index("<b>") < out.index("</b>") < out.index("</a>")


def test_source_spellings_are_kept_for_words_that_come_back_unchanged() -> None:
    builder = InlineBuilder()
    builder.text("5 ", "5 ")
    builder.text("*", "\\*")
    builder.text(" 3 < 4", " 3 < 4")
    inline = builder.build()
    assert inline.text == "5 * 3 < 4"
    escape = lambda text: text.replace("*", "\\*").replace("<", "&lt;")  # noqa: E731
    assert transfer(inline, [(0, 9)], [identity(inline.text)], escape) == "5 \\* 3 < 4"
    assert transfer(inline, [(0, 9)], [Translation("< *", ((3, 0), (1, 1)))], escape) == "< \\*"
    assert transfer(inline, [(0, 9)], [Translation("x<y", ())], escape) == "x&lt;y"


def test_an_element_across_two_sentences_spans_both_translations() -> None:
    inline = build(B, "One two. Three", _B, " four.")
    assert write(inline, reverse) == "<b>two. One four. Three</b>"
    assert write(inline, identity) == "<b>One two. Three</b> four."


def test_whitespace_between_sentences_and_around_the_run_is_kept() -> None:
    inline = build("\n  One. ", B, "Two", _B, ".\n\n  Three.\n")
    assert write(inline, upper) == "\n  ONE. <b>TWO</b>.\n\n  THREE.\n"


def test_punctuation_outside_an_element_stays_outside_in_a_translated_word() -> None:
    """The source's "." after the element goes after the target word's letters, not inside the tag;
    punctuation inside the element stays inside."""
    outside = build("Eine ", B, "grüne Wiese", _B, ".")
    assert write(outside, lambda text: Translation("A green field.", ((0, 0), (1, 1), (2, 2)))) == (
        "A <b>green field</b>."
    )
    inside = build("Eine ", B, "grüne Wiese.", _B)
    assert write(inside, lambda text: Translation("A green field.", ((0, 0), (1, 1), (2, 2)))) == (
        "A <b>green field.</b>"
    )
    before = build("Er rief ", B, "„", _B, "Hallo!“")
    assert write(before, lambda text: Translation('He called "Hello!"', ((0, 0), (1, 1), (2, 2)))) == (
        "He called <b>&quot;</b>Hello!&quot;"
    )


def test_a_run_and_a_document_check_their_counts() -> None:
    inline = build("One. Two.")
    with pytest.raises(ValueError, match="2 sentences but 1 translations"):
        transfer(inline, [(0, 4), (5, 9)], [identity("One.")])
    document = Assembled(["<p>", Run(inline, ((0, 4), (5, 9))), "</p>"])
    assert document.sentences() == ["One.", "Two."]
    assert document.rebuild([upper("One."), upper("Two.")]) == "<p>ONE. TWO.</p>"
    with pytest.raises(ValueError, match="2 sentences but 3 translations"):
        document.rebuild([upper("One.")] * 3)


def test_a_run_writes_its_line_breaks_with_the_containers_markers() -> None:
    inline = build("One\ntwo. Three\nfour.")
    run = Run(inline, tuple(split_sentences(inline.text)), breaks=("\n> ", "\r\n> "))
    assert run.write([identity("One\ntwo."), identity("Three\nfour.")]) == "One\n> two. Three\r\n> four."
