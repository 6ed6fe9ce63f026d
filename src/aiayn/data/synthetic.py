"""The built-in task: numbers written in digits → the same numbers in English words.

``4213`` → ``four thousand two hundred thirteen``. It reads like translation (a source and a
target language, reordering-free but with variable fertility: one digit gives zero to three words)
and a 2+2-layer ``d_model=128`` model learns it on a CPU in minutes, so the whole pipeline can be
tried without downloading anything.

Design:

- One number per line, 0 ≤ n ≤ 999,999. Source: plain digits (``4213``); the tokenizer splits
  digits into single pieces (``Tokenizer.train(split_digits=True)``, the default), so each digit is
  one token whatever the vocabulary size. Target: American English without "and", hyphenated
  tens (``forty-two``), e.g. ``nine hundred seven thousand forty-two``.
- Splits ``train``/``val``/``test`` never share a number. All of 0–99 (the words every longer
  number is built from) are in ``train``; the rest of each split is drawn from the 3-, 4-, 5- and
  6-digit numbers in equal shares (as far as the 900 three-digit numbers allow), so ``val`` and
  ``test`` measure composition, not memory.
- Deterministic from ``seed``. Written in the corpus layout ``{split}.{lang}`` with languages
  ``digits`` and ``words``, so it is read like any other corpus.
"""

from __future__ import annotations

import random
from pathlib import Path

from aiayn.errors import UserError

SRC_LANG, TGT_LANG = "digits", "words"
SPLITS = ("train", "val", "test")
MAX_NUMBER = 999_999
N_TRAIN, N_VALID, N_TEST = 20_000, 1_000, 1_000

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**9, "billion"), (10**6, "million"), (10**3, "thousand"))


def number_to_words(n: int) -> str:
    """English words for ``0 <= n < 10**12``: ``1042`` → ``one thousand forty-two``."""
    if not isinstance(n, int) or not 0 <= n < 10**12:
        raise ValueError(f"number_to_words needs an integer in [0, 10**12), got {n!r}")
    if n == 0:
        return "zero"
    words = []
    for scale, name in _SCALES:
        if n >= scale:
            words += [_below_thousand(n // scale), name]
            n %= scale
    if n:
        words.append(_below_thousand(n))
    return " ".join(words)


def _below_thousand(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    words = [f"{_ONES[hundreds]} hundred"] if hundreds else []
    if rest:
        words.append(_below_hundred(rest))
    return " ".join(words)


def _below_hundred(n: int) -> str:
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")


# --- the data set -------------------------------------------------------------------------------


def make_task(
    seed: int = 0, n_train: int = N_TRAIN, n_valid: int = N_VALID, n_test: int = N_TEST
) -> dict[str, list[tuple[str, str]]]:
    """``{"train": [(digits, words), ...], "val": ..., "test": ...}`` with disjoint numbers."""
    if n_train < 100 or n_valid < 0 or n_test < 0:
        raise UserError(
            f"synthetic task needs n_train >= 100 (for 0-99) and n_valid, n_test >= 0; got {n_train}, "
            f"{n_valid}, {n_test}"
        )
    rng = random.Random(seed)
    drawn = _draw_numbers(rng, n_train - 100 + n_valid + n_test)
    numbers = {"val": drawn[:n_valid], "test": drawn[n_valid : n_valid + n_test]}
    numbers["train"] = list(range(100)) + drawn[n_valid + n_test :]
    rng.shuffle(numbers["train"])
    return {split: [(str(n), number_to_words(n)) for n in numbers[split]] for split in SPLITS}


def _draw_numbers(rng: random.Random, count: int) -> list[int]:
    """``count`` distinct numbers in [100, MAX_NUMBER], equal shares of 3 to 6 digits where possible."""
    ranges = [range(10 ** (d - 1), 10**d) for d in (3, 4, 5, 6)]
    if count > sum(map(len, ranges)):
        raise UserError(f"synthetic task: cannot draw {count} distinct numbers from 100..{MAX_NUMBER}")
    drawn: list[int] = []
    for i, numbers in enumerate(ranges):
        share = -(-(count - len(drawn)) // (len(ranges) - i))  # ceil of what is left / lengths left
        drawn += rng.sample(numbers, min(share, len(numbers)))
    rng.shuffle(drawn)
    return drawn


def write_task(
    out_dir: str | Path, seed: int = 0, n_train: int = N_TRAIN, n_valid: int = N_VALID, n_test: int = N_TEST
) -> dict[str, int]:
    """Write ``{split}.digits`` / ``{split}.words`` under ``out_dir``; returns lines per split."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    task = make_task(seed, n_train, n_valid, n_test)
    for split, pairs in task.items():
        for lang, column in ((SRC_LANG, 0), (TGT_LANG, 1)):
            text = "".join(pair[column] + "\n" for pair in pairs)
            (out_dir / f"{split}.{lang}").write_text(text, encoding="utf-8")
    return {split: len(pairs) for split, pairs in task.items()}
