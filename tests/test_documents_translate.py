"""The document translator: sentences of many documents in one stream, structure kept exactly,
nothing cut at any length, alignments shifted to the document's words, n-best composed; and the
word alignments read off cross-attention (decode.align), the same on both engines."""

from __future__ import annotations

import random
import re
from types import SimpleNamespace
from typing import Callable, Sequence

import pytest
import torch

from aiayn.decode.align import word_alignment, word_starts
from aiayn.decode.request import TEXT, LineLike, Translation, Wanted, as_lines
from aiayn.decode.search import DecodeOptions
from aiayn.documents.fit import fit, source_limit
from aiayn.documents.segment import segmenter_for
from aiayn.documents.text import parse_text
from aiayn.documents.translate import DocumentTranslator


class WordTokenizer:
    """One token per character class run: letters, digits, any other character (a stand-in with
    counts that grow with the text, as a real tokenizer's)."""

    def encode(self, text: str, target: bool = False) -> list[int]:
        return [1] * len(re.findall(r"[^\W\d_]{1,4}|\d|[^\w\s]", text))

    def encode_batch(self, texts, threads: int = -1, target: bool = False) -> list[list[int]]:
        return [self.encode(text) for text in texts]


class FakeBackend:
    """Translates by upper-casing each word (so every word is aligned to itself), the k-th hypothesis
    with k "!" and score -1 - k; records its calls. A :class:`~aiayn.decode.request.Backend`."""

    name = "fake"

    def __init__(self, max_len: int = 32) -> None:
        self.tokenizer, self.config = WordTokenizer(), SimpleNamespace(max_len=max_len)
        self.progress: Callable[[int], None] | None = None
        self.calls: list[list[str]] = []

    def _one(self, line: str) -> str:
        assert len(self.tokenizer.encode(line)) <= self.config.max_len - 1, "a piece longer than the model"
        return line.upper()

    def translate(
        self, lines: Sequence[LineLike], options: DecodeOptions, wanted: Wanted = TEXT
    ) -> list[Translation]:
        lines = as_lines(lines)
        self.calls.append([line.text for line in lines])
        found = []
        for line in lines:
            nbest = tuple(
                (-1.0 - k, line.prefix + self._one(line.text) + "!" * k) for k in range(options.nbest)
            )
            pairs = tuple((i, i) for i in range(len(line.text.split()))) if wanted.alignment else ()
            found.append(Translation(nbest[0][1], pairs, nbest[0][0], nbest))
        return found


def translator(max_len: int = 32, **kwargs) -> tuple[DocumentTranslator, FakeBackend]:
    backend = FakeBackend(max_len)
    return DocumentTranslator(backend, language="en", **kwargs), backend


DOCUMENT = "  A man rides. Two dogs play!\n\n\tThe cat sleeps\non the mat.   \n\n\n"


def test_whitespace_around_sentences_is_kept_exactly() -> None:
    documents, _ = translator()
    result = documents.translate([DOCUMENT], DecodeOptions(beam=1))[0]
    assert result.text == "  A MAN RIDES. TWO DOGS PLAY!\n\n\tTHE CAT SLEEPS ON THE MAT.   \n\n\n"
    assert [s for s, _ in result.sentences] == [
        "A man rides.",
        "Two dogs play!",
        "The cat sleeps\non the mat.",
    ]


def test_the_sentences_of_all_documents_go_in_one_call() -> None:
    documents, backend = translator()
    results = documents.translate([DOCUMENT, "", "One. Two."], DecodeOptions(beam=1))
    assert len(backend.calls) == 1 and len(backend.calls[0]) == 5
    assert [r.text for r in results[1:]] == ["", "ONE. TWO."]


def test_without_splitting_a_document_is_one_sentence() -> None:
    documents, backend = translator(split=False)
    assert documents.translate(["  One. Two.  "], DecodeOptions())[0].text == "  ONE. TWO.  "
    assert backend.calls == [["One. Two."]]


def test_alignments_are_shifted_to_the_documents_words() -> None:
    documents, _ = translator()
    result = documents.translate([DOCUMENT], DecodeOptions(), wanted=Wanted(alignment=True))[0]
    words = len(DOCUMENT.split())
    assert result.alignment == tuple((i, i) for i in range(words))
    assert len(result.text.split()) == words


def test_nbest_composes_each_sentences_kth_hypothesis() -> None:
    documents, _ = translator()
    result = documents.translate(["One. Two."], DecodeOptions(beam=3, nbest=3), wanted=Wanted(scores=True))[0]
    assert result.nbest == [(-1.0, "ONE. TWO."), (-2.0, "ONE.! TWO.!"), (-3.0, "ONE.!! TWO.!!")]
    assert result.alternatives == ["ONE.! TWO.!", "ONE.!! TWO.!!"]


@pytest.mark.parametrize("punctuation", [True, False])
def test_nothing_is_cut_at_any_length(punctuation: bool) -> None:
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 9))) for _ in range(17_000)]
    if punctuation:
        words = [w + ("," if k % 7 == 6 else "") for k, w in enumerate(words)]
    line = " ".join(words)[:100_000]
    warnings: list[str] = []
    documents, backend = translator(max_len=64, warn=warnings.append)
    options = DecodeOptions(beam=1, max_len_b=5)  # pieces of at most 57 tokens
    result = documents.translate([line], options, where=lambda d, n: f"line {n}")[0]
    assert result.text.split() == line.upper().split()  # every word, in order
    assert len(backend.calls[0]) > 100
    assert warnings == ([] if punctuation else [warnings[0]])
    assert punctuation or "line 1" in warnings[0]


def test_a_word_longer_than_the_model_is_cut_between_characters() -> None:
    count = WordTokenizer().encode
    pieces, blind = fit("x" * 5000 + " y", lambda text: len(count(text)), 10)
    assert blind and "".join(pieces).replace(" ", "") == "x" * 5000 + "y"
    assert all(len(count(p)) <= 10 for p in pieces)


def test_pieces_break_after_clause_punctuation_first() -> None:
    count = WordTokenizer().encode
    sentence = "one two three, four five six; seven eight nine: ten eleven twelve"
    pieces, blind = fit(sentence, lambda text: len(count(text)), 10)  # clauses of 5, 4, 6 and 5 tokens
    assert not blind and pieces == ["one two three, four five six;", "seven eight nine:", "ten eleven twelve"]


def test_the_source_limit_leaves_room_for_the_output() -> None:
    assert source_limit(256, 1.0, 50) == 204  # a * (S + 1) + b <= 255
    assert source_limit(256, 0.0, 50) == 255
    assert source_limit(24, 1.0, 100) == 8


def test_the_neutral_rule_is_said_once_when_it_splits() -> None:
    warnings: list[str] = []
    documents = DocumentTranslator(FakeBackend(), language=None, warn=warnings.append)
    documents.translate(["907042"], DecodeOptions())
    assert warnings == []
    documents.translate(["One. Two.", "Three. Four."], DecodeOptions())
    documents.translate(["Five. Six."], DecodeOptions())
    assert len(warnings) == 1 and "language-neutral" in warnings[0]


def test_an_unknown_format_names_the_choices() -> None:
    documents, _ = translator()
    with pytest.raises(Exception, match="valid: text, html, markdown"):
        documents.translate(["x"], DecodeOptions(), fmt="pdf")


def test_text_documents_rebuild_line_numbers() -> None:
    parsed = parse_text("a.\n\nThe cat.\nThe dog.", segmenter_for("en").spans)
    assert parsed.sentences() == ["a.", "The cat.", "The dog."]
    assert [parsed.line_of(k) for k in range(3)] == [1, 3, 4]


# --- word alignments --------------------------------------------------------------------------


def test_pieces_merge_into_words_at_their_marks() -> None:
    assert word_starts(["▁A", "▁sm", "all", "▁dog", "▁", "3", "."]) == [0, 1, 1, 2, 3, 3, 3]
    assert word_starts(["x", "y", "▁z"]) == [0, 0, 1]


def test_each_target_word_is_linked_to_the_source_word_it_attends_to_most() -> None:
    source = ["▁ein", "▁klein", "er", "▁Hund"]  # words: ein kleiner Hund
    target = ["▁a", "▁sm", "all", "▁dog"]  # words: a small dog
    weights = torch.tensor(
        [
            [0.7, 0.1, 0.1, 0.1],
            [0.1, 0.3, 0.2, 0.4],  # "sm": Hund alone, but kleiner's two pieces together win
            [0.1, 0.5, 0.3, 0.1],
            [0.0, 0.1, 0.1, 0.8],
        ]
    )
    assert word_alignment(weights, source, target) == ((0, 0), (1, 1), (2, 2))
