"""Download Multi30k task 1 (raw text) and verify it byte for byte.

Source: the public GitHub repository ``multi30k/dataset``, files ``data/task1/raw/{split}.{lang}.gz``
(upstream split names ``train``, ``val``, ``test_2016_flickr``; written here as ``train``, ``val``,
``test2016``). Each file is gunzipped and its SHA-256 compared with the table below (the checksums of
the uncompressed files, commit ``a3d2e0d26b56f3846f66a952536ffed4e401d05a``).

A file is written to a temporary name in the output directory and renamed into place only after its
checksum matched, so a broken download (HTTP error, refused connection, truncated body, bad gzip,
wrong checksum) raises :class:`~aiayn.errors.UserError` naming the file and leaves no half-written
file behind. Files already present with the right checksum are not downloaded again.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Sequence

from aiayn.errors import UserError
from aiayn.io import atomic_write

DEFAULT_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
LANGUAGES = ("en", "de", "fr", "cs")
#: local split name → upstream split name
SPLITS = {"train": "train", "val": "val", "test2016": "test_2016_flickr"}
TIMEOUT_S = 60

#: SHA-256 of the uncompressed files, ``{split}.{lang}`` (local names).
SHA256 = {
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.fr": "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d",
    "train.cs": "2be68b38c8d586ff4f54eb13cc6e1baaaa053695b3f070d3038303a47f2268da",
    "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "val.fr": "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc",
    "val.cs": "d53827e469b0a1ca8d57e9e26b2b64c4bc4b33f5479c7b03ae87ae5c882c3e33",
    "test2016.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "test2016.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test2016.fr": "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6",
    "test2016.cs": "45adb85f688de8407fddcbe1b36dca15d12aab868149b337e2576f2d6d2ff8d8",
}


def download_multi30k(
    out_dir: str | Path,
    base_url: str = DEFAULT_URL,
    languages: Sequence[str] = LANGUAGES,
    splits: Sequence[str] = tuple(SPLITS),
) -> list[Path]:
    """Download, gunzip and verify ``{split}.{lang}`` for each split and language; returns the paths."""
    _check_choice("language", languages, LANGUAGES)
    _check_choice("split", splits, tuple(SPLITS))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for split in splits:
        for lang in languages:
            url = f"{base_url.rstrip('/')}/{SPLITS[split]}.{lang}.gz"
            paths.append(fetch_verified(url, out_dir / f"{split}.{lang}", SHA256[f"{split}.{lang}"]))
    return paths


def _check_choice(kind: str, chosen: Sequence[str], valid: Sequence[str]) -> None:
    unknown = [c for c in chosen if c not in valid]
    if unknown or not chosen:
        raise UserError(
            f"unknown Multi30k {kind}(s) {', '.join(unknown) or '(none given)'}; valid: {', '.join(valid)}"
        )


def fetch_verified(url: str, target: Path, sha256: str) -> Path:
    """Download the gzip at ``url`` into ``target`` if its content hashes to ``sha256``."""
    if target.is_file() and _sha256(target.read_bytes()) == sha256:
        return target
    data = _gunzip(_get(url, target), url, target)
    digest = _sha256(data)
    if digest != sha256:
        raise UserError(f"{target.name}: checksum mismatch for {url} (sha256 {digest}, expected {sha256})")
    atomic_write(target, data)
    return target


def _get(url: str, target: Path) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return response.read()  # raises IncompleteRead on a body shorter than Content-Length
    except urllib.error.HTTPError as err:
        raise UserError(f"{target.name}: download failed, HTTP {err.code} {err.reason} for {url}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise UserError(f"{target.name}: download failed for {url}: {reason}") from None
    except http.client.HTTPException as err:  # IncompleteRead, a malformed response
        raise UserError(f"{target.name}: download failed for {url}: {type(err).__name__}: {err}") from None


def _gunzip(data: bytes, url: str, target: Path) -> bytes:
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:  # BadGzipFile is an OSError; EOFError = truncated
        raise UserError(f"{target.name}: {url} is not a complete gzip file ({err})") from None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
