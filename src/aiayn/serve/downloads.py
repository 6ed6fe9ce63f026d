"""Translated files kept for their download (LibreTranslate's ``GET /download_file/NAME``).

A translated file is stored under a random token (128 bits, from :mod:`secrets`) and found by it
only: the name a client gave is never a path here, only the name the download is saved as. Files
expire ``ttl_s`` seconds after they were stored (LibreTranslate sweeps its upload folder the same
way); an expired or unknown token is a 404.

:class:`LocalDownloads` keeps them in a private temporary folder of the process (removed at close),
within a number of files and of bytes (the oldest go first). :class:`SharedDownloads` keeps them in
the Redis that replicas share (``--shared-storage``), each with Redis' own expiry, so a download
may reach any replica behind the proxy.
"""

from __future__ import annotations

import re
import secrets
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

TOKEN = re.compile(r"[0-9a-f]{32}")
TTL_S = 30 * 60  # how long a translated file waits for its download (default)
MAX_FILES = 1000  # kept at once in a process (the oldest go first)
MAX_BYTES = 2_000_000_000  # and their bytes
REDIS_TIMEOUT_S = 10.0  # a file sent to or read from Redis at most (20 MB on a slow link)


@dataclass(frozen=True)
class Stored:
    """A translated file waiting for its download."""

    name: str  # the name it is saved as (the uploaded file's)
    media_type: str
    data: bytes


class Downloads(Protocol):
    ttl_s: int

    def put(self, stored: Stored) -> str:
        """Keep ``stored``; its token."""
        ...

    def get(self, token: str) -> Stored | None:
        """The file of ``token``, or None (unknown or expired)."""
        ...

    def close(self) -> None: ...


class LocalDownloads:
    """Translated files in a private temporary folder of this process (thread-safe)."""

    def __init__(self, ttl_s: int = TTL_S, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> None:
        self.ttl_s, self.max_files, self.max_bytes = ttl_s, max_files, max_bytes
        self._folder: Path | None = None  # made at the first file (mode 0700)
        self._files: OrderedDict[str, tuple[float, str, str, int]] = OrderedDict()  # oldest first
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def folder(self) -> Path:
        with self._lock:
            if self._folder is None:
                self._folder = Path(tempfile.mkdtemp(prefix="aiayn-downloads-"))
            return self._folder

    def put(self, stored: Stored) -> str:
        token = secrets.token_hex(16)
        path = self.folder / token
        try:
            path.write_bytes(stored.data)
        except OSError:
            path.unlink(missing_ok=True)  # a full disk: no half file left behind
            raise
        with self._lock:
            self._files[token] = (
                time.monotonic() + self.ttl_s,
                stored.name,
                stored.media_type,
                len(stored.data),
            )
            self._bytes += len(stored.data)
            self._sweep()
        return token

    def get(self, token: str) -> Stored | None:
        if not TOKEN.fullmatch(token):
            return None
        with self._lock:
            self._sweep()
            found = self._files.get(token)
        if found is None:
            return None
        try:
            data = (self._folder / token).read_bytes()
        except OSError:  # swept meanwhile
            return None
        return Stored(found[1], found[2], data)

    def _sweep(self) -> None:
        """Remove the expired files, then the oldest beyond the count or the bytes."""
        now = time.monotonic()
        while self._files:
            token, (expires, *_, size) = next(iter(self._files.items()))
            if expires > now and len(self._files) <= self.max_files and self._bytes <= self.max_bytes:
                break
            del self._files[token]
            self._bytes -= size
            (self._folder / token).unlink(missing_ok=True)

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


class SharedDownloads:
    """Translated files in the Redis that replicas share (that of a :class:`aiayn.serve.keys.Shared`),
    each with Redis' own expiry, through a client of their own (bytes, and :data:`REDIS_TIMEOUT_S`
    a call: a file takes longer than a counter, and its failure does not mark the shared counters'
    Redis down). While Redis fails (unreachable, out of memory), in ``local``: the replica that
    translated the file serves its download; said once, and once when Redis takes files again."""

    PREFIX = "aiayn:download:"

    def __init__(self, shared: Any, local: LocalDownloads) -> None:
        import redis  # the serve extra, as Shared's

        self.local, self.ttl_s, self.where, self.warn = local, local.ttl_s, shared.where, shared.warn
        self.redis, self.errors = shared.binary(REDIS_TIMEOUT_S), (redis.RedisError,)
        self.failing = False

    def put(self, stored: Stored) -> str:
        token, key = secrets.token_hex(16), None
        try:
            key = self.PREFIX + token
            with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping={"name": stored.name, "type": stored.media_type, "data": stored.data})
                pipe.expire(key, self.ttl_s)
                pipe.execute()
        except self.errors as err:
            self._failed(err)
            return self.local.put(stored)
        self._worked()
        return token

    def get(self, token: str) -> Stored | None:
        found = self.local.get(token)
        if found is not None or not TOKEN.fullmatch(token):
            return found
        try:
            stored = self.redis.hgetall(self.PREFIX + token)
        except self.errors as err:
            self._failed(err)
            return None
        self._worked()
        if not stored:
            return None
        return Stored(stored[b"name"].decode(), stored[b"type"].decode(), stored[b"data"])

    def _failed(self, err: Exception) -> None:
        if not self.failing:
            self.failing = True
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            self.warn(
                f"Redis at {self.where} does not take translated files ({first}): "
                "each replica keeps its own until it does"
            )

    def _worked(self) -> None:
        if self.failing:
            self.failing = False
            self.warn(f"Redis at {self.where} takes translated files again")

    def close(self) -> None:
        self.local.close()
        self.redis.close()
