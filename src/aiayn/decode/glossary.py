"""Glossaries: ``(source term, target term)`` pairs; where a source term occurs in a sentence, its
target term must appear in the translation (:mod:`aiayn.decode.constraints` enforces it).

* **Whole words**: a source term matches where no letter, digit or underscore touches either end
  ("cat" is not found in "category"); terms may hold several words.
* **Case**: source terms match in any case ("Hund" finds "hund" and "HUND"); the target term is
  produced exactly as written.
* **Inflection**: given the sentence's language (``language``: ``DecodeOptions.glossary_language``,
  which ``aiayn translate`` and the server set to the model's source language), a term also matches
  where the sentence's words have its words' lemmas: "Hund" finds "Hunde", "Hunden", "Hundes" and
  "HUNDE", "springen" finds "springt" and "sprang". The lemmas are simplemma's, a word at a time
  (dictionaries for 54 languages, de, en, fr, es, cs among them; a region or script after "-" or
  "_" is ignored); two words match where their lemmas are one or one's lemma is the other's form.
  Lemmas keep their case (German nouns are capitalised: "Essen", food, does not find "isst", eats),
  so write a term as running text has it. The target term is produced exactly as given,
  uninflected; to have an inflected form translated otherwise, list it with its own target: a
  term's own form wins over a lemma match of the same words. A dictionary has its limits: homographs
  share a lemma ("Bank" finds the benches of "Bänke" as well as "Banken"), and a form it gives
  another lemma is not found ("Bergen", a town to it, is not "Berg"'s). Without a language, or with
  one simplemma has no dictionary for, and for a term that starts or ends with a character other
  than a letter or digit ("C++"), a term matches its own form only.
* **Overlaps**: where terms overlap, the one that starts first wins, and of those starting at one
  word the longest ("New York" before "York"); each occurrence asks for its target term once, so a
  term found twice must be produced twice.

A glossary file (``aiayn translate --glossary``) is UTF-8, one ``source term<TAB>target term`` a
line; blank lines and lines starting with ``#`` are skipped; anything else is an error naming the line.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from aiayn.errors import UserError

Pairs = tuple[tuple[str, str], ...]


def read_glossary(path: str | Path) -> Pairs:
    """The pairs of a glossary file, in order (an error names the file and line)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"--glossary: cannot read {path}: {err}") from None
    pairs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            raise UserError(f"{path}, line {number}: expected 'source term<TAB>target term'")
        pairs.append((fields[0].strip(), fields[1].strip()))
    if not pairs:
        raise UserError(f"{path}: the glossary has no terms")
    return tuple(pairs)


def check_glossary(pairs) -> Pairs:
    """``pairs`` (from a request) as a glossary: a list of two non-empty strings each."""
    out = []
    for k, pair in enumerate(pairs):
        if len(pair) != 2 or not all(isinstance(t, str) and t.strip() for t in pair):
            raise UserError(f"glossary: entry {k + 1} is not a pair of non-empty terms")
        out.append((pair[0].strip(), pair[1].strip()))
    return tuple(out)


@functools.lru_cache(maxsize=16)
def _matcher(pairs: Pairs) -> tuple[re.Pattern, dict[str, str]]:
    targets = {_key(source): target for source, target in pairs}
    terms = sorted({source for source, _ in pairs}, key=len, reverse=True)  # the longest first
    words = "|".join(r"\s+".join(map(re.escape, term.split())) for term in terms)
    return re.compile(rf"(?<!\w)(?:{words})(?!\w)", re.IGNORECASE), targets


@dataclass(frozen=True)
class Found:
    """A source term found in a sentence: its target term and where it is (``sentence[start:end]``)."""

    target: str
    start: int
    end: int

    def words(self, sentence: str) -> range:
        """The indices of the ``str.split()`` words of ``sentence`` the source term covers (a word
        it shares with punctuation, "(Hund)," too)."""
        joined = self.start > 0 and not sentence[self.start - 1].isspace()  # its word began before
        first = len(sentence[: self.start].split()) - joined
        return range(first, len(sentence[: self.end].split()))


def find(pairs: Pairs, sentence: str, language: str | None = None) -> list[Found]:
    """Each source term occurrence in ``sentence``, in order: its target term and its place.
    ``language``: the sentence's, whose lemmas the terms also match in (module docstring)."""
    if not pairs:
        return []
    code = _lemma_language(language)
    if code is not None:
        return _found_with_lemmas(pairs, sentence, code)
    pattern, by_source = _matcher(pairs)
    found = ((by_source.get(_key(m.group(0))), m.start(), m.end()) for m in pattern.finditer(sentence))
    return [Found(target, start, end) for target, start, end in found if target is not None]


def targets(pairs: Pairs, sentence: str, language: str | None = None) -> list[str]:
    """The target term of each source term occurrence in ``sentence``, in order (``language``:
    :func:`find`'s)."""
    return [found.target for found in find(pairs, sentence, language)]


# --- lemmas ---------------------------------------------------------------------------------------

_WORD = re.compile(r"(\w+)")  # a word to lemmatise (a group: split keeps them); between two, a gap

Key = tuple[bool, str]  # what a word matches by: (False, its form casefolded), (True, a lemma)


@dataclass(frozen=True)
class _Term:
    """A source term as lemma matching reads it: each word's keys, the gaps between its words."""

    words: tuple[frozenset[Key], ...]
    gaps: tuple[str, ...]
    length: int  # characters: the longer term wins where two start at one word
    rank: int  # its place in the glossary: the first of two alike wins
    target: str


@dataclass(frozen=True)
class _LemmaMatcher:
    anywhere: re.Pattern  # each place a term's own form starts, with the longest there
    by_source: dict[str, str]
    by_first_word: dict[Key, tuple[_Term, ...]]  # each term under each key of its first word


@functools.lru_cache(maxsize=16)
def _lemma_matcher(pairs: Pairs, code: str) -> _LemmaMatcher:
    pattern, by_source = _matcher(pairs)
    by_first_word: dict[Key, list[_Term]] = {}
    for rank, source in enumerate(dict.fromkeys(source for source, _ in pairs)):  # as written, once
        parts = _WORD.split(source)  # gap, word, gap, ..., word, gap
        if parts[0] or parts[-1]:  # a term like "C++": its own form only
            continue
        words = tuple(_keys(code, word) for word in parts[1::2])
        term = _Term(words, tuple(map(_gap, parts[2:-1:2])), len(source), rank, by_source[_key(source)])
        for key in words[0]:
            by_first_word.setdefault(key, []).append(term)
    return _LemmaMatcher(
        re.compile(f"(?=({pattern.pattern}))", re.IGNORECASE),
        by_source,
        {key: tuple(terms) for key, terms in by_first_word.items()},
    )


def _found_with_lemmas(pairs: Pairs, sentence: str, code: str) -> list[Found]:
    """:func:`find` with lemmas: every place a term matches, by its own form or by lemmas; then,
    from the start, the first to start, the longest there (its own form before lemmas), and the
    next that starts after it ends (as the regular expression alone finds its own forms)."""
    matcher = _lemma_matcher(pairs, code)
    places = []  # (start, -end, by lemmas, -term length, glossary rank, target): the best first
    for m in matcher.anywhere.finditer(sentence):
        target = matcher.by_source.get(_key(m.group(1)))
        if target is not None:
            places.append((m.start(1), -m.end(1), False, 0, 0, target))
    words = list(_WORD.finditer(sentence))
    keys = [_keys(code, word.group()) for word in words]
    gaps = [_gap(sentence[a.end() : b.start()]) for a, b in zip(words, words[1:])]
    for i, word_keys in enumerate(keys):
        terms = {term.rank: term for key in word_keys for term in matcher.by_first_word.get(key, ())}
        for term in terms.values():
            last = i + len(term.words) - 1
            if (
                last < len(words)
                and all(term.words[j] & keys[i + j] for j in range(1, len(term.words)))
                and term.gaps == tuple(gaps[i:last])
            ):
                place = (words[i].start(), -words[last].end(), True, -term.length, term.rank, term.target)
                places.append(place)
    found, end = [], 0
    for start, minus_end, *_, target in sorted(places):
        if start >= end:
            found.append(Found(target, start, -minus_end))
            end = -minus_end
    return found


@functools.lru_cache(maxsize=64)
def _lemma_language(language: str | None) -> str | None:
    """simplemma's code for ``language`` (an ISO 639-1 code; a region or script after "-" or "_"
    is ignored), None where it has no dictionary for it."""
    if language is None:
        return None
    code = re.split(r"[-_]", language.strip().lower(), maxsplit=1)[0]
    try:
        _lemma("a", code)  # loads the language's dictionary, once
    except ValueError:  # simplemma: "Unsupported language"
        return None
    return code


@functools.lru_cache(maxsize=1 << 16)
def _keys(code: str, word: str) -> frozenset[Key]:
    """What ``word`` matches by: its form in any case, and, in their case, its form and its lemma
    (a word in capitals is looked up capitalised: "HUNDE" as "Hunde"). Lemmas keep their case: in
    German a noun's is capitalised, so "Essen" (food) is not the lemma of "isst" (eats)."""
    word = unicodedata.normalize("NFC", word)
    lemma = _lemma(word.capitalize() if word.isupper() else word, code)
    return frozenset({(False, word.casefold()), (True, word), (True, lemma)})


def _lemma(word: str, code: str) -> str:
    import simplemma  # here: its import (60-100 ms) would slow every `aiayn` start-up

    # low_memory: a language's dictionary takes 20 MB, not 110 MB (and 0.6 s to load, not 1.4 s);
    # a lookup 30 us, not 8 (each word once: _keys is cached)
    return simplemma.lemmatize(word, lang=code, low_memory=True)


def _gap(text: str) -> str:
    """What lies between two words, any whitespace as one space (as in a term's own form)."""
    return re.sub(r"\s+", " ", text)


def _key(term: str) -> str:
    return " ".join(term.split()).casefold()
