"""Parallel corpora: read, validate and filter aligned sentence pairs.

A corpus is either

- a directory of aligned plain-text files ``{split}.{lang}`` (the Multi30k layout: ``train.de`` and
  ``train.en``, line *i* of one is the translation of line *i* of the other), or
- one TSV file with two columns, ``source<TAB>target``.

Files are UTF-8 (a leading BOM is ignored), one sentence per line; each side is ``str.strip()``-ped
(this also removes U+00A0 at the ends; inner TABs and no-break spaces are kept). Lines are split on
LF only, so a U+2028 or form feed inside a sentence cannot break the alignment.

Nothing is dropped silently: :class:`CorpusStats` counts every pair that is skipped, and
``stats.summary()`` says so in one line. Bad input raises :class:`~aiayn.errors.UserError` naming
the file and the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from aiayn.errors import UserError

Pair = tuple[str, str]


@dataclass
class CorpusStats:
    """What happened to each pair of one corpus, for the one-line report of :meth:`summary`.

    ``n_read`` counts the lines read; the other counters are disjoint (a pair is counted under the
    first rule that drops it: empty, then too long, then length ratio).
    """

    source: str
    n_read: int = 0
    n_empty: int = 0
    n_too_long: int = 0
    n_bad_ratio: int = 0
    max_tokens: int | None = None  # set once length filtering ran
    max_ratio: float | None = None

    @property
    def n_kept(self) -> int:
        return self.n_read - self.n_empty - self.n_too_long - self.n_bad_ratio

    def summary(self) -> str:
        parts = [f"{self.n_empty} empty"]
        if self.max_tokens is not None:
            parts.append(f"{self.n_too_long} too long (>{self.max_tokens} tokens)")
        if self.max_ratio is not None:
            parts.append(f"{self.n_bad_ratio} length ratio > {self.max_ratio}")
        parts.append(f"kept {self.n_kept}")
        return f"read {self.n_read} pairs from {self.source}: " + ", ".join(parts)


# --- reading -------------------------------------------------------------------------------------


def read_parallel(
    path: str | Path, split: str | None = None, src_lang: str | None = None, tgt_lang: str | None = None
) -> tuple[list[Pair], CorpusStats]:
    """Read aligned ``(source, target)`` pairs and the stats of what was skipped.

    ``path`` is a corpus directory (then ``split``, ``src_lang`` and ``tgt_lang`` pick the files
    ``{split}.{src_lang}`` and ``{split}.{tgt_lang}``) or a two-column TSV file (then they are
    ignored). Pairs with an empty side are skipped and counted in ``stats.n_empty``.
    """
    path = Path(path)
    if path.is_file():
        src_lines, tgt_lines = read_tsv(path)
        source = str(path)
    else:
        src_lines, tgt_lines = _read_aligned_files(path, split, src_lang, tgt_lang)
        source = f"{path}/{split}.{{{src_lang},{tgt_lang}}}"
    pairs, stats = _drop_empty(src_lines, tgt_lines, source)
    return pairs, stats


def _read_aligned_files(directory: Path, split: str | None, src_lang: str | None, tgt_lang: str | None):
    if not directory.is_dir():
        raise UserError(f"corpus not found: {directory} is neither a directory nor a TSV file")
    if not (split and src_lang and tgt_lang):
        raise UserError(
            f"corpus directory {directory} needs a split and two languages ({describe_corpus(directory)})"
        )
    src_file, tgt_file = (_corpus_file(directory, split, lang) for lang in (src_lang, tgt_lang))
    src_lines, tgt_lines = read_lines(src_file), read_lines(tgt_file)
    if len(src_lines) != len(tgt_lines):
        raise UserError(
            f"{src_file} has {len(src_lines)} lines but {tgt_file} has {len(tgt_lines)}; aligned files "
            "need equal line counts"
        )
    return src_lines, tgt_lines


def _corpus_file(directory: Path, split: str, lang: str) -> Path:
    file = directory / f"{split}.{lang}"
    if not file.is_file():
        raise UserError(f"no file {file} ({describe_corpus(directory)})")
    return file


_NOT_LANGUAGES = {
    "md",
    "txt",
    "rst",
    "tsv",
    "csv",
    "json",
    "yaml",
    "yml",
    "gz",
    "zip",
    "tar",
    "model",
    "vocab",
    "log",
}


def list_corpus(directory: str | Path) -> dict[str, list[str]]:
    """The splits of a corpus directory and the languages of each: ``{"train": ["de", "en"], ...}``."""
    found: dict[str, list[str]] = {}
    for file in sorted(Path(directory).iterdir()):
        split, dot, lang = file.name.rpartition(".")
        if file.is_file() and dot and split and lang.isalpha() and lang.lower() not in _NOT_LANGUAGES:
            found.setdefault(split, []).append(lang)
    return found


def describe_corpus(directory: str | Path) -> str:
    """One phrase listing what a corpus directory holds, for error messages."""
    found = list_corpus(directory)
    if not found:
        return f"{directory} has no {{split}}.{{lang}} files"
    listed = "; ".join(f"{split}: {', '.join(langs)}" for split, langs in found.items())
    return f"available splits and languages: {listed}"


def read_lines(file: Path) -> list[str]:
    """The stripped lines of a UTF-8 file; invalid UTF-8 is a UserError with the 1-based line."""
    return [line.strip() for line in _split_lines(decode_utf8(file))]


def decode_utf8(file: Path) -> str:
    """The text of a UTF-8 file (a byte-order mark and one final newline dropped); invalid UTF-8 is
    a UserError naming the 1-based line."""
    data = file.read_bytes().removeprefix(b"\xef\xbb\xbf")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise UserError(f"{file}:{line}: invalid UTF-8 (byte {data[err.start]:#04x})") from None
    return text.removesuffix("\n")


def _split_lines(text: str) -> list[str]:
    return text.split("\n") if text else []  # an empty file has no lines, not one empty line


def read_tsv(file: Path) -> tuple[list[str], list[str]]:
    """Source and target columns of a ``source<TAB>target`` file (blank lines count as empty pairs)."""
    src, tgt = [], []
    for number, line in enumerate(_split_lines(decode_utf8(file)), start=1):
        columns = line.split("\t") if line.strip() else ["", ""]
        if len(columns) != 2:
            raise UserError(
                f"{file}:{number}: expected 2 tab-separated columns (source, target), found {len(columns)}"
            )
        src.append(columns[0].strip())
        tgt.append(columns[1].strip())
    return src, tgt


def _drop_empty(src_lines: list[str], tgt_lines: list[str], source: str) -> tuple[list[Pair], CorpusStats]:
    stats = CorpusStats(source, n_read=len(src_lines))
    pairs = [(s, t) for s, t in zip(src_lines, tgt_lines) if s and t]
    stats.n_empty = stats.n_read - len(pairs)
    if not pairs:
        raise UserError(f"empty corpus: {stats.summary()}")
    return pairs, stats


# --- filtering by subword length -----------------------------------------------------------------

#: Defaults of :func:`filter_by_length`.
MAX_TOKENS, MAX_RATIO, RATIO_MIN_TOKENS = 100, 3.0, 10


def filter_by_length(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    stats: CorpusStats,
    *,
    max_tokens: int = MAX_TOKENS,
    max_ratio: float = MAX_RATIO,
    ratio_min_tokens: int = RATIO_MIN_TOKENS,
) -> list[int]:
    """:func:`keep_by_length`, and a UserError when nothing is left."""
    limits = dict(max_tokens=max_tokens, max_ratio=max_ratio, ratio_min_tokens=ratio_min_tokens)
    keep = keep_by_length(src_ids, tgt_ids, stats, **limits)
    if not keep:
        raise UserError(f"empty corpus after filtering: {stats.summary()}")
    return keep


def keep_by_length(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    stats: CorpusStats,
    *,
    max_tokens: int = MAX_TOKENS,
    max_ratio: float = MAX_RATIO,
    ratio_min_tokens: int = RATIO_MIN_TOKENS,
) -> list[int]:
    """Indices of the pairs to keep after subword tokenization; ``stats`` counts the rest.

    A pair is dropped when either side has more than ``max_tokens`` tokens ("too long"), or when
    ``longer / shorter > max_ratio`` and the longer side has at least ``ratio_min_tokens`` tokens
    (short pairs such as "Yes." / "Ja, genau." naturally have large ratios, so they are kept; one
    word against ten is still caught). Lengths count subword ids without BOS/EOS (the decoder sees
    one more).
    """
    stats.max_tokens, stats.max_ratio = max_tokens, max_ratio
    stats.n_too_long = stats.n_bad_ratio = 0
    keep = []
    for i, (src, tgt) in enumerate(zip(src_ids, tgt_ids)):
        verdict = _length_verdict(len(src), len(tgt), max_tokens, max_ratio, ratio_min_tokens)
        if verdict == "too_long":
            stats.n_too_long += 1
        elif verdict == "bad_ratio":
            stats.n_bad_ratio += 1
        else:
            keep.append(i)
    return keep


def _length_verdict(n_src: int, n_tgt: int, max_tokens: int, max_ratio: float, ratio_min_tokens: int) -> str:
    longer, shorter = max(n_src, n_tgt), min(n_src, n_tgt)
    if longer > max_tokens:
        return "too_long"
    if longer >= ratio_min_tokens and longer > max_ratio * max(shorter, 1):
        return "bad_ratio"
    return "keep"


def encode_corpus(
    pairs: Sequence[Pair],
    stats: CorpusStats,
    encode_batch: Callable[[list[str]], list[list[int]]],
    max_tokens: int = MAX_TOKENS,
    max_ratio: float = MAX_RATIO,
    ratio_min_tokens: int = RATIO_MIN_TOKENS,
) -> list[tuple[list[int], list[int]]]:
    """Tokenize both sides once (e.g. ``tokenizer.encode_batch``) and filter by length.

    Returns ``(src_ids, tgt_ids)`` examples without BOS/EOS, ready for :mod:`aiayn.data.batching`.
    """
    src_ids = encode_batch([src for src, _ in pairs])
    tgt_ids = encode_batch([tgt for _, tgt in pairs])
    limits = dict(max_tokens=max_tokens, max_ratio=max_ratio, ratio_min_tokens=ratio_min_tokens)
    keep = filter_by_length(src_ids, tgt_ids, stats, **limits)
    return [(src_ids[i], tgt_ids[i]) for i in keep]
