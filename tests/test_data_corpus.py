"""Reading, validating and filtering parallel corpora (real Multi30k, a synthetic corpus in its layout,
small broken files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.data.corpus import CorpusStats, encode_corpus, filter_by_length, list_corpus, read_parallel
from aiayn.errors import UserError


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def test_reads_multi30k_val_aligned_and_stripped(multi30k_dir):
    pairs, stats = read_parallel(multi30k_dir, "val", "de", "en")
    assert len(pairs) == 1014 and stats.n_read == 1014 and stats.n_kept == 1014
    assert pairs[0][1] == (multi30k_dir / "val.en").read_text().split("\n")[0]
    assert all(s == s.strip() and t == t.strip() and s and t for s, t in pairs)
    assert stats.summary() == f"read 1014 pairs from {multi30k_dir}/val.{{de,en}}: 0 empty, kept 1014"


def test_train_quirks_survive_reading(multi30k_dir):
    pairs, stats = read_parallel(multi30k_dir, "train", "de", "en")
    assert stats.n_kept == 29000
    assert "einer \tWasserfontäne" in pairs[7365][0]  # the TAB inside line 7366 is kept
    assert (
        pairs[5908][0] == "Ein junger Mann springt mitten in der Luft auf einem Trampolin."
    )  # trailing space stripped
    assert sum("\u00a0" in s for s, _ in pairs) > 0  # inner no-break spaces are kept


def test_empty_pairs_are_skipped_and_counted(tmp_path):
    write(tmp_path / "train.xx", "a\n\n  \nb\nc\n")
    write(tmp_path / "train.yy", "A\nB\nC\n\u00a0\nE\n")
    pairs, stats = read_parallel(tmp_path, "train", "xx", "yy")
    assert pairs == [("a", "A"), ("c", "E")]
    assert stats.summary() == f"read 5 pairs from {tmp_path}/train.{{xx,yy}}: 3 empty, kept 2"


def test_crlf_and_bom_are_tolerated(tmp_path):
    write(tmp_path / "t.xx", b"\xef\xbb\xbfone\r\ntwo\r\n")
    write(tmp_path / "t.yy", "eins\r\nzwei\r\n")
    assert read_parallel(tmp_path, "t", "xx", "yy")[0] == [("one", "eins"), ("two", "zwei")]


def test_different_line_counts_name_both_files(tmp_path):
    write(tmp_path / "train.xx", "a\nb\nc\n")
    write(tmp_path / "train.yy", "A\nB\n")
    with pytest.raises(UserError, match=r"train\.xx has 3 lines but .*train\.yy has 2"):
        read_parallel(tmp_path, "train", "xx", "yy")


def test_invalid_utf8_names_file_and_line(tmp_path):
    write(tmp_path / "train.xx", "a\nb\nc\n")
    write(tmp_path / "train.yy", b"A\nB \xff\xfe\nC\n")
    with pytest.raises(UserError, match=r"train\.yy:2: invalid UTF-8"):
        read_parallel(tmp_path, "train", "xx", "yy")


def test_missing_language_lists_what_exists(parallel_dir):
    with pytest.raises(UserError) as err:
        read_parallel(parallel_dir, "val", "de", "xx")
    message = str(err.value)
    assert "val.xx" in message and "val: cs, de, en, fr" in message and "test2016: cs, de, en, fr" in message
    with pytest.raises(UserError, match="no file .*nosplit.de"):
        read_parallel(parallel_dir, "nosplit", "de", "en")


def test_missing_corpus_path(tmp_path):
    with pytest.raises(UserError, match="corpus not found"):
        read_parallel(tmp_path / "nope", "train", "de", "en")


def test_list_corpus(parallel_dir):
    assert list_corpus(parallel_dir) == {s: ["cs", "de", "en", "fr"] for s in ("test2016", "train", "val")}


def test_empty_corpus_is_an_error(tmp_path):
    write(tmp_path / "train.xx", "a\n\n")
    write(tmp_path / "train.yy", "\nb\n")
    with pytest.raises(UserError, match="empty corpus: read 2 pairs .* 2 empty, kept 0"):
        read_parallel(tmp_path, "train", "xx", "yy")


def test_tsv(tmp_path):
    tsv = write(tmp_path / "pairs.tsv", " hello \t hallo\n\nx\t\nbye\ttschüss\n")
    pairs, stats = read_parallel(tsv)
    assert pairs == [("hello", "hallo"), ("bye", "tschüss")]
    assert stats.summary() == f"read 4 pairs from {tsv}: 2 empty, kept 2"


@pytest.mark.parametrize("line", ["only one column", "a\tb\tc"])
def test_tsv_needs_two_columns(tmp_path, line):
    tsv = write(tmp_path / "pairs.tsv", f"a\tb\n{line}\n")
    with pytest.raises(UserError, match=r"pairs\.tsv:2: expected 2 tab-separated columns"):
        read_parallel(tsv)


def test_filter_by_length_counts_each_reason():
    ids = lambda n: list(range(4, 4 + n))  # noqa: E731
    src = [ids(5), ids(101), ids(5), ids(30), ids(1), ids(13), ids(100)]
    tgt = [ids(6), ids(5), ids(120), ids(9), ids(3), ids(4), ids(100)]
    stats = CorpusStats("X", n_read=7)
    keep = filter_by_length(src, tgt, stats, max_tokens=100, max_ratio=3.0, ratio_min_tokens=10)
    # 30 vs 9 and 13 vs 4 (12 vs 4 would be exactly 3.0: kept) exceed the ratio;
    # 1 vs 3 is short, so its ratio is not checked
    assert keep == [0, 4, 6]
    assert (
        stats.summary()
        == "read 7 pairs from X: 0 empty, 2 too long (>100 tokens), 2 length ratio > 3.0, kept 3"
    )


def test_filter_to_nothing_is_an_error():
    stats = CorpusStats("X", n_read=1)
    with pytest.raises(UserError, match="empty corpus after filtering: .*1 too long"):
        filter_by_length([[5] * 10], [[5]], stats, max_tokens=5)


def test_encode_corpus_tokenizes_once_and_filters(tmp_path):
    pairs = [("a b", "x y z"), ("a " * 20, "b"), ("c", "d")]
    calls = []

    def encode_batch(texts):
        calls.append(len(texts))
        return [[7] * len(t.split()) for t in texts]

    stats = CorpusStats("X", n_read=3)
    examples = encode_corpus(pairs, stats, encode_batch, max_tokens=10)
    assert examples == [([7, 7], [7, 7, 7]), ([7], [7])]
    assert calls == [3, 3] and stats.n_too_long == 1 and stats.n_kept == 2
