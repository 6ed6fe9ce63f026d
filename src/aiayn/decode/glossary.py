"""Glossaries: ``(source term, target term)`` pairs; where a source term occurs in a sentence, its
target term must appear in the translation (:mod:`aiayn.decode.constraints` enforces it).

* **Whole words**: a source term matches where no letter, digit or underscore touches either end
  ("cat" is not found in "category"); terms may hold several words.
* **Case**: source terms match in any case ("Hund" finds "hund" and "HUND"); the target term is
  produced exactly as written.
* **Inflection**: none; a term matches its own form only, so list each form a text may hold ("Hund",
  "Hunde", "Hunden") with the target form it should get.
* **Overlaps**: the longest term wins where terms overlap ("New York" before "York"); each
  occurrence asks for its target term once, so a term found twice must be produced twice.

A glossary file (``aiayn translate --glossary``) is UTF-8, one ``source term<TAB>target term`` a
line; blank lines and lines starting with ``#`` are skipped; anything else is an error naming the line.
"""

from __future__ import annotations

import functools
import re
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


def find(pairs: Pairs, sentence: str) -> list[Found]:
    """Each source term occurrence in ``sentence``, in order: its target term and its place."""
    if not pairs:
        return []
    pattern, by_source = _matcher(pairs)
    found = ((by_source.get(_key(m.group(0))), m.start(), m.end()) for m in pattern.finditer(sentence))
    return [Found(target, start, end) for target, start, end in found if target is not None]


def targets(pairs: Pairs, sentence: str) -> list[str]:
    """The target term of each source term occurrence in ``sentence``, in order."""
    return [found.target for found in find(pairs, sentence)]


def _key(term: str) -> str:
    return " ".join(term.split()).casefold()
