"""The built-in digits-to-words task: exact number words, disjoint deterministic splits."""

from __future__ import annotations

import pytest

from aiayn.data.corpus import read_parallel
from aiayn.data.synthetic import make_task, number_to_words, write_task
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError

KNOWN = {
    0: "zero",
    7: "seven",
    13: "thirteen",
    20: "twenty",
    21: "twenty-one",
    99: "ninety-nine",
    100: "one hundred",
    101: "one hundred one",
    110: "one hundred ten",
    999: "nine hundred ninety-nine",
    1000: "one thousand",
    1042: "one thousand forty-two",
    4213: "four thousand two hundred thirteen",
    90017: "ninety thousand seventeen",
    100000: "one hundred thousand",
    907042: "nine hundred seven thousand forty-two",
    999999: "nine hundred ninety-nine thousand nine hundred ninety-nine",
    1000000: "one million",
    1234567: "one million two hundred thirty-four thousand five hundred sixty-seven",
    2000000001: "two billion one",
}


@pytest.mark.parametrize("n", sorted(KNOWN))
def test_number_to_words(n):
    assert number_to_words(n) == KNOWN[n]


@pytest.mark.parametrize("bad", [-1, 10**12, 1.5, "12"])
def test_number_to_words_rejects(bad):
    with pytest.raises(ValueError):
        number_to_words(bad)


def test_task_is_deterministic_disjoint_and_correct():
    task = make_task(seed=0, n_train=2000, n_valid=300, n_test=300)
    assert task == make_task(seed=0, n_train=2000, n_valid=300, n_test=300)
    assert task != make_task(seed=1, n_train=2000, n_valid=300, n_test=300)
    numbers = {split: {int(src) for src, _ in pairs} for split, pairs in task.items()}
    assert [len(numbers[s]) for s in ("train", "val", "test")] == [2000, 300, 300]
    assert not (
        numbers["train"] & numbers["val"]
        or numbers["train"] & numbers["test"]
        or numbers["val"] & numbers["test"]
    )
    assert set(range(100)) <= numbers["train"] and min(numbers["val"] | numbers["test"]) >= 100
    assert all(
        words == number_to_words(int(src)) and src == str(int(src)) for p in task.values() for src, words in p
    )


def test_digit_lengths_share_equally_where_possible():
    task = make_task(seed=0, n_train=100 + 7000, n_valid=500, n_test=500)
    drawn = [src for split in ("train", "val", "test") for src, _ in task[split] if int(src) >= 100]
    counts = {d: sum(len(s) == d for s in drawn) for d in (3, 4, 5, 6)}
    assert counts[3] == 900 and abs(counts[4] - counts[6]) <= 1 and abs(counts[5] - counts[6]) <= 1


def test_bad_sizes():
    with pytest.raises(UserError, match="n_train >= 100"):
        make_task(n_train=50)
    with pytest.raises(UserError, match="cannot draw"):
        make_task(n_train=1_000_000)


def test_written_task_reads_as_a_corpus_and_digits_are_tokens(tmp_path):
    counts = write_task(tmp_path, seed=0, n_train=1000, n_valid=100, n_test=100)
    assert counts == {"train": 1000, "val": 100, "test": 100}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{s}.{line}" for s in ("test", "train", "val") for line in ("digits", "words")
    ]
    pairs, stats = read_parallel(tmp_path, "train", "digits", "words")
    assert stats.n_kept == 1000
    tok = Tokenizer.train([s for pair in pairs for s in pair], vocab_size=8000)
    assert tok.pieces("907042") == ["\u2581", "9", "0", "7", "0", "4", "2"]
    assert all(tok.decode(tok.encode(words)) == words for _, words in pairs)
