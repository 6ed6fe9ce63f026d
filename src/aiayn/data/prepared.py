"""Prepared data: a parallel corpus encoded once into memory-mapped token arrays.

``aiayn data prepare`` (:mod:`aiayn.data.prepare`) writes a directory, like ``fairseq-preprocess``
or Megatron-LM's indexed datasets (token ids in one flat array, an index of offsets)::

    manifest.json         written last: the data settings, counts and filtering statistics per split,
                          and the size and SHA-256 of every file below
    spm.model             the joint SentencePiece tokenizer
    {split}.src.npy       the source token ids of every kept pair, one flat array (no BOS/EOS),
    {split}.tgt.npy       uint16 when the vocabulary fits (int32 otherwise); the target ids alike
    {split}.idx.npy       (pairs + 1, 2) int64: where pair i starts in the source and target arrays
    {split}.len.npy       (pairs, 2) int32: the source and target lengths (what batching reads)
    {split}.src.txt       validation split only: the pairs' text (references for BLEU)
    {split}.tgt.txt

Training maps the lengths (``numpy.load(mmap_mode="r")``) and cuts batches from them; a pair's ids
are read from the files only when a batch holds it (:class:`PreparedSplit`). Resident memory does
not grow with the corpus, and processes on one machine share the page cache.

Opening checks every file against the manifest (size and SHA-256): a truncated, edited or swapped
file is a :class:`UserError` naming it. :func:`settings_differences` names each data setting that
differs from what a run asks for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.config import DEFAULT_SEED
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.io import file_sha256

FORMAT, VERSION = "aiayn-prepared", 1
MANIFEST, TOKENIZER_FILE = "manifest.json", "spm.model"


@dataclass(frozen=True)
class PrepareSettings:
    """The data settings a prepared directory is made with (the ``data`` section of a run config)."""

    src_lang: str
    tgt_lang: str
    train_split: str = "train"
    valid_split: str = "val"
    vocab_size: int = 8000
    tokenizer: str = "bpe"
    lowercase: bool = False
    max_sentence_tokens: int = 100
    max_ratio: float = 3.0
    #: pairs sampled (seeded) from the training split to train the tokenizer; 0 = every pair
    tokenizer_sample: int = 1_000_000
    #: the tokenizer's and the sample's seed (not compared: another seed may reuse the data)
    seed: int = DEFAULT_SEED

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def settings_differences(prepared: dict[str, Any], wanted: PrepareSettings) -> list[str]:
    """``data.key prepared X, config Y`` for each compared setting that differs (the seed is not)."""
    return [
        f"data.{key} prepared {prepared.get(key)!r}, config {value!r}"
        for key, value in wanted.to_dict().items()
        if key != "seed" and prepared.get(key) != value
    ]


def is_prepared(directory: Path) -> bool:
    """Whether ``directory`` holds a finished prepared corpus (its manifest is written last)."""
    return (directory / MANIFEST).is_file()


class PreparedSplit(Sequence):
    """One split's pairs as ``(source ids, target ids)``, read from the files a pair at a time.

    ``lengths`` ((pairs, 2) int32: source and target lengths, memory-mapped) is all the batching
    needs. The ids and offsets are read with ``pread`` rather than through a memory map: on recent
    kernels the page cache holds files in large folios and a fault maps a whole folio, so a batch
    of 50 random pairs would map ~100 MiB of neighbours into the process's resident memory. Read
    this way, resident memory stays flat and every process shares the one page cache.
    """

    def __init__(self, directory: Path, split: str) -> None:
        self.src, self.tgt = (_Rows(directory / f"{split}.{side}.npy") for side in ("src", "tgt"))
        self.offsets = _Rows(directory / f"{split}.idx.npy")  # (N + 1, 2): pair i starts at row i
        self.lengths = np.load(directory / f"{split}.len.npy", mmap_mode="r")  # (N, 2), read in one go

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i):
        """Pair ``i`` as ``(source ids, target ids)``; a slice gives a list of pairs."""
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i) + len(self) if i < 0 else int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"pair {i} of {len(self)}")
        (src_start, tgt_start), (src_end, tgt_end) = self.offsets.read(i, i + 2)
        return self.src.read(src_start, src_end), self.tgt.read(tgt_start, tgt_end)


class _Rows:
    """Rows ``start:stop`` of a ``.npy`` file, read with ``os.pread`` (see :class:`PreparedSplit`)."""

    def __init__(self, path: Path) -> None:
        header = np.load(path, mmap_mode="r")  # the header only: no data page is touched
        self.dtype, self.start, self.shape = header.dtype, header.offset, header.shape
        self.row_bytes = self.dtype.itemsize * int(np.prod(self.shape[1:]))
        del header
        self.fd = os.open(path, os.O_RDONLY)
        weakref.finalize(self, os.close, self.fd)

    def read(self, start: int, stop: int) -> np.ndarray:
        data = os.pread(self.fd, (stop - start) * self.row_bytes, self.start + start * self.row_bytes)
        return np.frombuffer(data, self.dtype).reshape(-1, *self.shape[1:])


@dataclass
class PreparedData:
    """An opened, checked prepared directory."""

    directory: Path
    manifest: dict[str, Any]
    tokenizer: Tokenizer

    @property
    def settings(self) -> dict[str, Any]:
        return self.manifest["settings"]

    def split(self, name: str) -> PreparedSplit:
        return PreparedSplit(self.directory, name)

    def texts(self, name: str) -> list[tuple[str, str]]:
        """The text of a split's pairs (written for the validation split)."""
        src, tgt = (self._lines(self.directory / f"{name}.{side}.txt") for side in ("src", "tgt"))
        pairs = self.manifest["splits"][name]["pairs"]
        if not len(src) == len(tgt) == pairs:
            raise UserError(f"{self.directory}: the text of {name} does not hold its {pairs} pairs")
        return list(zip(src, tgt))

    def summary(self, name: str) -> str:
        return self.manifest["splits"][name]["summary"]

    @staticmethod
    def _lines(path: Path) -> list[str]:
        text = path.read_bytes().decode("utf-8")  # split on LF only: a CR inside a sentence stays
        return text.split("\n")[:-1] if text else []


RETRAIN = "prepare again with this config, or train with the settings it was made with"


def open_prepared(
    directory: Path, wanted: PrepareSettings | None = None, remedy: str = RETRAIN
) -> PreparedData:
    """Open ``directory`` after checking every file against its manifest and, with ``wanted``, its
    data settings against a run's; a mismatch is one :class:`UserError` naming the file or setting
    (and ``remedy``)."""
    manifest = read_manifest(directory)
    check_files(directory, manifest)
    if wanted is not None:
        differences = settings_differences(manifest["settings"], wanted)
        if differences:
            raise UserError(
                f"{directory} was prepared with other data settings: {'; '.join(differences)} ({remedy})"
            )
    tokenizer = Tokenizer.load(directory / TOKENIZER_FILE)
    return PreparedData(directory, manifest, tokenizer)


def read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    if not path.is_file():
        raise UserError(
            f"{directory} holds no {MANIFEST}: not a prepared corpus (or its preparation was cut short)"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: not a valid manifest ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"{path}: not the manifest of an aiayn prepared corpus")
    if manifest.get("version") != VERSION:
        raise UserError(
            f"{path}: prepared-data version {manifest.get('version')}, this aiayn reads {VERSION}"
        )
    return manifest


def check_files(directory: Path, manifest: dict[str, Any]) -> None:
    """Each file the manifest lists exists with its size and SHA-256."""
    for name, expected in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            raise UserError(f"{path} is missing (listed in {directory / MANIFEST}); prepare again")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise UserError(
                f"{path} has {size} bytes, its manifest says {expected['bytes']} (truncated or replaced); "
                "prepare again"
            )
        if file_sha256(path) != expected["sha256"]:
            raise UserError(
                f"{path} does not match the SHA-256 in its manifest (edited or replaced); prepare again"
            )
