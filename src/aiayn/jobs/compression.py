"""Compressed files by their names: ``.gz`` (gzip), ``.xz`` (lzma), ``.zst`` (Zstandard, the
``zstandard`` package: ``pip install 'aiayn[jobs]'``); any other name is read and written as is.

Output is compressed chunk by chunk (:func:`compress`): each chunk one gzip member, xz stream or
zstd frame, and the output their concatenation, which every decompressor reads as one stream. So a
merge is a plain copy of bytes, and the chunks are compressed by the workers, in parallel.
"""

from __future__ import annotations

import gzip
import lzma
from pathlib import Path
from typing import IO

from aiayn.errors import UserError

#: The suffixes read and written compressed.
SUFFIXES = (".gz", ".xz", ".zst")
ZSTD_LEVEL = 3  # zstd's own default


def codec(path: str | Path) -> str | None:
    """``"gz"``, ``"xz"``, ``"zst"`` from the name's suffix (any case), else None."""
    suffix = Path(path).suffix.lower()
    return suffix[1:] if suffix in SUFFIXES else None


def _zstandard():
    try:
        import zstandard
    except ImportError:
        raise UserError(
            "reading or writing .zst needs the zstandard package: pip install 'aiayn[jobs]' "
            "(or pip install zstandard)"
        ) from None
    return zstandard


def open_read(path: str | Path) -> IO[bytes]:
    """``path`` opened for reading bytes, decompressed by its name (all members/frames of it)."""
    kind = codec(path)
    if kind == "zst":
        zstandard = _zstandard()  # before the file: a missing package is said first
        raw = open(path, "rb")
        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
    if kind == "gz":
        return gzip.open(path, "rb")
    if kind == "xz":
        return lzma.open(path, "rb")
    return open(path, "rb")


def check_codec(path: str | Path) -> None:
    """A :class:`UserError` now (before any work) when ``path``'s compression cannot be done here."""
    if codec(path) == "zst":
        _zstandard()


def compress(data: bytes, path: str | Path) -> bytes:
    """``data`` as one member of the compressed file ``path`` (by its name; as is for other names).
    Deterministic: the same data gives the same bytes (gzip's time stamp is 0)."""
    kind = codec(path)
    if kind == "gz":
        return gzip.compress(data, compresslevel=6, mtime=0)
    if kind == "xz":
        return lzma.compress(data)
    if kind == "zst":
        return _zstandard().ZstdCompressor(level=ZSTD_LEVEL).compress(data)
    return data
