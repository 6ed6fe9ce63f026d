"""Where glossary terms are found in a sentence (aiayn.decode.glossary.find): their places, in
characters and words. No model: the translations that use them are tests/test_control.py's."""

from __future__ import annotations

from aiayn.decode.glossary import find


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
