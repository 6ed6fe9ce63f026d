"""Where glossary terms are found in a sentence (aiayn.decode.glossary.find): their places, in
characters and words. No model: the translations that use them are tests/test_control.py's."""

from __future__ import annotations

from aiayn.decode.glossary import find, targets


def places(pairs, sentence: str, **kwargs) -> list[tuple[str, str, list[int]]]:
    """Each term found: its target, the sentence's text it covers, the indices of its words."""
    return [
        (f.target, sentence[f.start : f.end], list(f.words(sentence)))
        for f in find(pairs, sentence, **kwargs)
    ]


def test_a_term_covers_the_words_it_shares_with_punctuation() -> None:
    pairs = (("Hund", "dog"), ("New York", "NY"))
    sentence = "  In (New  York), der Hund."
    assert places(pairs, sentence) == [("NY", "New  York", [1, 2]), ("dog", "Hund", [4])]
    assert places(pairs, "Hund") == [("dog", "Hund", [0])]


# --- inflected forms (simplemma's lemmas) ---------------------------------------------------------

GERMAN = (("Hund", "dog"), ("springen", "jump"), ("Essen", "food"), ("New York", "NYC"), ("York", "York"))


def test_with_its_language_a_term_finds_its_inflected_forms_at_their_exact_places() -> None:
    sentence = "Die Hunde, den Hunden des Hundes: HUNDE springt."
    found = [
        ("dog", "Hunde", [1]),
        ("dog", "Hunden", [3]),
        ("dog", "Hundes", [5]),
        ("dog", "HUNDE", [6]),
        ("jump", "springt", [7]),
    ]
    assert places(GERMAN, sentence, language="de") == found
    assert places(GERMAN, sentence, language="de-AT") == found  # a region is ignored
    assert places(GERMAN, "Der Hund sprang.", language="de") == [
        ("dog", "Hund", [1]),
        ("jump", "sprang", [2]),
    ]


def test_without_a_language_or_with_one_simplemma_lacks_a_term_matches_its_own_form_only() -> None:
    sentence = "Die Hunde springen, der Hund springt."
    own_forms = [("jump", "springen", [2]), ("dog", "Hund", [4])]
    assert places(GERMAN, sentence) == own_forms
    assert places(GERMAN, sentence, language="xx") == own_forms
    assert places(GERMAN, sentence, language="de") == [
        ("dog", "Hunde", [1]),
        *own_forms,
        ("jump", "springt", [5]),
    ]


def test_lemmas_keep_their_case_the_noun_is_not_the_verb() -> None:
    """ "Essen" (food) finds its own form in any case, as always, but not "isst" (eats), whose
    lemma is the verb "essen"; a term in capitals is looked up as the word."""
    sentence = "Er isst das Essen, ESSEN, essen."
    assert places(GERMAN, sentence, language="de") == [
        ("food", "Essen", [3]),
        ("food", "ESSEN", [4]),
        ("food", "essen", [5]),
    ]
    assert targets((("HUND", "dog"),), "Zwei Hunde.", "de") == ["dog"]


def test_the_longest_term_wins_over_lemmas_too_and_a_listed_form_over_its_lemma() -> None:
    pairs = (("Hund", "dog"), ("Hund Katze", "dog-cat"), ("Hunde", "dogs"))
    sentence = "Hunden Katzen, Hund, Hunde  Katze; Hunde."
    assert places(pairs, sentence, language="de") == [
        ("dog-cat", "Hunden Katzen", [0, 1]),
        ("dog", "Hund", [2]),  # "Hunde" has this lemma too, but "Hund" is its own form
        ("dog-cat", "Hunde  Katze", [3, 4]),
        ("dogs", "Hunde", [5]),
    ]
    assert targets(GERMAN, "In New York, nicht Yorkshire; York.", "de") == ["NYC", "York"]
    assert targets((("Hund Katze", "dc"),), "Hunde, Katzen", "de") == []  # no comma in the term


def test_a_term_with_other_characters_at_its_ends_matches_its_own_form_only() -> None:
    pairs = (("C++", "C++"), ("E-Mail", "email"))
    assert places(pairs, "C++ und E-Mails, C, E-Mail.", language="de") == [
        ("C++", "C++", [0]),
        ("email", "E-Mails", [2]),
        ("email", "E-Mail", [4]),
    ]


def test_other_languages_have_their_lemmas() -> None:
    assert targets((("mouse", "Maus"), ("run", "rennen")), "Mice ran; the MICE are running.", "en") == [
        "Maus",
        "rennen",
        "Maus",
        "rennen",
    ]
    assert targets((("cheval", "horse"),), "Les chevaux.", "fr") == ["horse"]
