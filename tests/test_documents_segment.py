"""Sentence segmentation (aiayn.documents.segment): the hard cases sentencex gets right, the
invariants of the spans on fuzzed text (nothing lost, whitespace only between), blank lines, the
neutral rule and its one warning, the mapping of a library's changed output, a 100,000-character line."""

from __future__ import annotations

import doctest
import random

import pytest

from aiayn.documents import segment
from aiayn.documents.segment import SUPPORTED, Segmenter, neutral_spans, segmenter_for, spans_of

# Cases of benchmarks/segmenters.py's hard set that sentencex segments exactly (the others are
# listed in benchmarks/README.md); each is its sentences, joined by one space.
HARD = {
    "de": [
        ["Wir brauchen Obst, z. B. Äpfel und Birnen.", "Dann gehen wir heim."],
        ["Es gibt viele Tiere, z.B. Hunde und Katzen.", "Alle sind süß."],
        ["Dr. Müller ist heute nicht da.", "Fragen Sie bitte Prof. Schmidt."],
        ["Er kaufte Brot, Milch, Eier usw. und ging dann nach Hause."],
        ["Das Projekt ist fertig, d. h. wir können beginnen.", "Alle freuen sich."],
        ["Das kostet ca. 20 Euro.", "Mehr nicht."],
        ["Am 3. Oktober ist Feiertag.", "Viele haben frei."],
        ["Er wurde am 1. Januar 1990 geboren.", "Seitdem lebt er in Bonn."],
        ["Der Preis stieg um 3,5 Prozent.", "Das ist viel."],
        ["Die Version 3.5 ist neu.", "Sie hat viele Fehler behoben."],
        ["„Komm her!“, rief er.", "Der Hund lief sofort los."],
        ["Sie sagte: „Ich komme morgen.“", "Dann legte sie auf."],
        ["Er zögerte...", "Dann sprach er weiter."],
        ["Das war alles … einfach zu viel für ihn."],
        ["Wie bitte?!", "Das glaube ich nicht."],
        ["Mehr Infos gibt es unter www.beispiel.de.", "Schreiben Sie uns an info@beispiel.de."],
        ["Alles steht auf https://example.com/a.b?c=d.", "Lesen Sie es."],
        ["Das Buch schrieb J. R. R. Tolkien.", "Es ist sehr lang."],
        ["Thomas M. Müller kam zu spät."],
        ["Er wohnt in der Hauptstr. 5 in Berlin."],
        ["Das Spiel endete 2:1.", "Die Fans feierten bis spät in die Nacht."],
    ],
    "en": [
        ["Mr. Smith went to Washington.", "He arrived on Monday."],
        ["Dr. Jones is not here today.", "Please ask Mrs. Brown instead."],
        ["Bring some fruit, e.g. apples or pears.", "Then come home."],
        ["Bring the tools, i.e. the hammer and the saw.", "We start at noon."],
        ["The U.S. Army is large.", "It has many bases."],
        ["She moved to the U.S.", "She likes it there."],
        ['He said "Stop."', "Then he left."],
        ['"Come here!" he shouted.', "The dog ran to him."],
        ["She said, 'I will come.'", "Then she hung up."],
        ["The price rose by 3.5 percent.", "That is a lot."],
        ["It costs $4.99 today.", "Tomorrow it costs more."],
        ["He hesitated...", "Then he went on."],
        ["Wait... what did you say?"],
        ["Visit www.example.com for details.", "Write to info@example.com."],
        ["See https://example.org/a.html.", "It explains everything."],
        ["The book was written by J. R. R. Tolkien.", "It is very long."],
        ["John F. Kennedy was president."],
        ["I bought a new phone.", "iPhones are expensive."],
        ["We met at 5 p.m. on Friday."],
        ["He works for Acme Inc. in Boston."],
        ["See Fig. 3 for details.", "It shows the results."],
        ["No. 5 is my favourite.", "It always was."],
        ["The talk was given by Prof. Lee et al. last year."],
    ],
    "fr": [
        ["« Viens ici ! » cria-t-il.", "Le chien accourut."],
        ["Il a dit : « Non. »", "Puis il est parti."],
        ["Il faut des fruits, p. ex. des pommes.", "Ensuite on rentre."],
        ["Le prix a augmenté de 3,5 %.", "C'est beaucoup."],
        ["Vraiment ?!", "Je ne te crois pas."],
        ["Voir www.exemple.fr pour plus d'infos.", "Merci."],
    ],
    "cs": [
        ["Přišel např. Dr. Novák.", "Bylo pozdě."],
        ["Cena vzrostla o 3,5 procenta.", "To je hodně."],
        ["„Pojď sem!“ zavolal.", "Pes přiběhl."],
        ["Bydlí v ul. Dlouhá 5 v Brně."],
        ["Opravdu?!", "Tomu nevěřím."],
        ["Mají ovoce, tj. jablka a hrušky.", "Pak jdou domů."],
    ],
}
CASES = [(lang, sentences) for lang, cases in HARD.items() for sentences in cases]

WHITESPACE = [
    " ",
    " ",
    " ",
    "  ",
    "\n",
    "\t",
    "\xa0",
    "\u2028",
    "\u3000",
    "\r\n",
    "\x1c",
    "\x85",
    "\n\n",
    "\n \t\n",
]
PIECES = [
    "Ein",
    "Hund",
    "läuft",
    "A",
    "man",
    "is",
    "dr",
    "Dr.",
    "z. B.",
    "U.S.",
    "e.g.",
    "3.",
    "3.5",
    "3,5",
    "1.",
    "...",
    "…",
    "?!",
    "!",
    "?",
    ".",
    ". .",
    "„Komm her!“,",
    '"Stop."',
    "(ok.)",
    "«",
    "»",
    "www.a.de.",
    "a@b.co.",
    "J.",
    "iPhone",
    "ß",
    "É",
    "日本語。",
    "שלום.",
    "-",
    "•",
    "\u200b",
    "\ufeff",
]


def _fuzzed(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(0, 40)):
        parts.append(rng.choice(PIECES) if rng.random() < 0.7 else "".join(rng.choices(".!?…\"'()", k=3)))
        parts.append(rng.choice(WHITESPACE) if rng.random() < 0.9 else "")
    text = "".join(parts)
    return rng.choice(WHITESPACE) + text if rng.random() < 0.3 else text


def check_invariants(text: str, spans: list[tuple[int, int]], blank_lines_end: bool = True) -> None:
    """In order, non-overlapping, stripped and non-empty, whitespace only between and around, and
    (for a segmenter, not for spans_of alone) a blank line never inside a sentence."""
    cursor = 0
    for start, end in spans:
        assert cursor <= start < end <= len(text), (text, spans)
        assert text[cursor:start].strip() == "", (text, spans)
        sentence = text[start:end]
        assert sentence == sentence.strip() and sentence, (text, spans)
        assert not blank_lines_end or segment._BLANK_LINE.search(sentence) is None, (text, sentence)
        cursor = end
    assert text[cursor:].strip() == "", (text, spans)


@pytest.mark.parametrize(
    ("language", "sentences"), CASES, ids=[f"{lang}-{i}" for i, (lang, _) in enumerate(CASES)]
)
def test_hard_cases_come_out_as_their_sentences(language: str, sentences: list[str]) -> None:
    text = " ".join(sentences)
    assert segmenter_for(language).split(text) == sentences


def test_the_docstring_example() -> None:
    assert doctest.testmod(segment).failed == 0


@pytest.mark.parametrize("language", ["de", "en", "fr", "cs", None])
def test_invariants_hold_on_fuzzed_text(language: str | None) -> None:
    rng = random.Random(42)
    segmenter = segmenter_for(language)
    for _ in range(600):
        text = _fuzzed(rng)
        spans = segmenter.spans(text)
        check_invariants(text, spans)
        assert segmenter.split(text) == [text[a:b] for a, b in spans]


def test_a_blank_line_ends_a_sentence_and_a_single_line_break_does_not() -> None:
    german = segmenter_for("de")
    assert german.split("Ein Satz ohne\nPunkt geht weiter.") == ["Ein Satz ohne\nPunkt geht weiter."]
    assert german.split("Ein Titel ohne Punkt\n\nDer Text. Noch ein Satz.") == [
        "Ein Titel ohne Punkt",
        "Der Text.",
        "Noch ein Satz.",
    ]
    text = "  erste Zeile\r\n \t\r\nzweite Zeile\n\n\n\ndritte\n"
    assert german.split(text) == ["erste Zeile", "zweite Zeile", "dritte"]
    assert german.spans(text) == [(2, 13), (19, 31), (35, 41)]
    assert segmenter_for(None).split("kein Punkt\n\nauch keiner") == ["kein Punkt", "auch keiner"]


def test_empty_and_whitespace_only_text_has_no_sentences() -> None:
    for language in ("de", None):
        for text in ("", " ", "\n\n", "\xa0\t\u3000"):
            assert segmenter_for(language).spans(text) == []


def test_an_unknown_language_gets_the_neutral_rule_and_one_warning() -> None:
    warnings: list[str] = []
    neutral = segmenter_for("xx", warn=warnings.append)
    assert neutral.language is None
    assert neutral.split('He said "Stop." Then he left. Dr. Smith came.') == [
        'He said "Stop."',
        "Then he left.",
        "Dr.",
        "Smith came.",
    ]
    neutral.split("Noch ein Text. Und noch einer.")
    assert len(warnings) == 1 and "\n" not in warnings[0] and "'xx'" in warnings[0], warnings
    assert "language-neutral rule" in warnings[0]
    segmenter_for(None, warn=warnings.append)
    assert len(warnings) == 2 and "no source language" in warnings[1]
    segmenter_for("xx")  # no warn given: nothing to call


def test_a_known_language_gives_no_warning_and_its_code() -> None:
    warnings: list[str] = []
    assert segmenter_for("de", warn=warnings.append).language == "de"
    assert segmenter_for("DE-at", warn=warnings.append).language == "de"
    assert segmenter_for("pt_BR", warn=warnings.append).language == "pt"
    assert segmenter_for("cs", warn=warnings.append).language == "cs"  # sentencex: Slovak's rules
    assert warnings == []
    assert {"de", "en", "fr", "cs"} <= SUPPORTED and "xx" not in SUPPORTED
    with pytest.raises(ValueError, match="segmenter_for"):
        Segmenter("xx")


def test_the_neutral_rule() -> None:
    cases = {
        "„Komm her!“, rief er. Der Hund kam.": ["„Komm her!“, rief er.", "Der Hund kam."],
        "Wirklich?! Ja… 3 Hunde. (Klar.) „Gut.“ Ende": [
            "Wirklich?!",
            "Ja…",
            "3 Hunde.",
            "(Klar.)",
            "„Gut.“",
            "Ende",
        ],
        "Es kostet 3.5 oder 3,5 Euro. ok. so": ["Es kostet 3.5 oder 3,5 Euro. ok. so"],
        "שלום. מה שלומך?": ["שלום.", "מה שלומך?"],
        "Ende.\nNeue Zeile": ["Ende.", "Neue Zeile"],
        "« Viens ici ! » cria-t-il. Il a dit : « Non. » Puis": [
            "« Viens ici ! » cria-t-il.",
            "Il a dit : « Non. »",
            "Puis",
        ],
        'Er sagte Stop. »Komm her«, rief er. "Ja." "Nein?" Gut': [
            "Er sagte Stop.",
            "»Komm her«, rief er.",
            '"Ja."',
            '"Nein?"',
            "Gut",
        ],
    }
    for text, sentences in cases.items():
        assert [text[a:b] for a, b in neutral_spans(text)] == sentences


def test_spans_of_places_a_library_s_changed_output_and_loses_nothing() -> None:
    text = "Yes…  No.   Hi there. Bye"
    assert spans_of(text, ["Yes… No.", "Hi there.", "Bye"]) == [(0, 9), (12, 21), (22, 25)]  # collapsed
    assert spans_of(text, ["Yes…  No.", "Bye"]) == [(0, 9), (12, 25)]  # a sentence dropped
    assert spans_of(text, ["Yes…  No."]) == [(0, 25)]  # the end dropped
    assert spans_of(text, ["YES…  NO.", "hi THERE.", "Bye"]) == [(0, 9), (12, 21), (22, 25)]  # changed
    assert spans_of(text, []) == [(0, 25)]
    assert spans_of("  ", ["x"]) == []


def test_spans_of_keeps_the_invariants_whatever_the_library_returns() -> None:
    rng = random.Random(7)
    library = segmenter_for("en")
    for _ in range(400):
        text = _fuzzed(rng)
        pieces = [text[a:b] for a, b in library.spans(text)]
        changed = [_changed(piece, rng) for piece in pieces if rng.random() < 0.8]
        check_invariants(text, spans_of(text, changed + [_fuzzed(rng)] * (rng.random() < 0.2)), False)


def _changed(piece: str, rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.25:
        return " ".join(piece.split())
    if roll < 0.5:
        return piece[: rng.randint(0, len(piece))]
    if roll < 0.6:
        return piece.upper()
    return f"  {piece}\n"


def test_a_100000_character_line() -> None:
    sentences = [
        "Ein kleiner Hund läuft über eine grüne Wiese.",
        "Zwei Männer spielen Gitarre auf einer Bühne, z. B. am 3. Oktober.",
        "Warum?!",
        "„Komm her!“, rief er.",
        "Der Preis stieg um 3,5 Prozent...",
    ]
    line = [sentences[i % len(sentences)] for i in range(2900)]
    text = " ".join(line)
    assert len(text) > 100_000 and "\n" not in text
    assert segmenter_for("de").split(text) == line
    assert neutral_spans("x" * 100_000) == [(0, 100_000)]
    no_punctuation = " ".join(["wort"] * 25_000)
    assert segmenter_for("de").spans(no_punctuation) == [(0, len(no_punctuation))]
    short = "Ja. " * 30_000  # 30,000 sentences on one line
    assert segmenter_for("de").spans(short) == [(4 * i, 4 * i + 3) for i in range(30_000)]
    initials = "A. " * 40_000  # initials to sentencex: one sentence
    assert segmenter_for("de").spans(initials) == [(0, len(initials) - 1)]


def test_non_ascii_whitespace_does_not_crash_sentencex_and_a_panic_falls_back(monkeypatch) -> None:
    wide = [chr(c) for c in range(0x80, 0x3001) if chr(c).isspace()]
    assert [c for c in wide if not segment._WIDE_SPACE.fullmatch(c)] == []  # all plain to sentencex
    german = segmenter_for("de")
    text = "A\xa0. B\u3000. Ein\u2028Satz.\xa0Noch einer."
    check_invariants(text, german.spans(text))  # raw, "A\xa0." panics inside sentencex 1.0.32
    assert german.split("Ein Hund.\xa0Zwei Katzen.") == ["Ein Hund.", "Zwei Katzen."]

    class PanicException(BaseException):  # pyo3's, as sentencex raises it
        pass

    def panics(language: str, text: str) -> list[str]:
        raise PanicException("byte index 2 is not a char boundary")

    monkeypatch.setattr(segment.sentencex, "segment", panics)
    assert german.split("Dr. Müller kam. Er ging.") == ["Dr.", "Müller kam.", "Er ging."]  # the neutral rule
