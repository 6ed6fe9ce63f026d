"""API keys: made by ``aiayn keys add``, stored hashed, found by ``aiayn serve --api-keys``.

A key is 32 random bytes (``aiayn-`` and 43 URL-safe characters), printed once by ``aiayn keys add``
and never stored: a store holds its SHA-256 digest, its ``id`` (the digest's first 12 hexadecimal
digits, what ``aiayn keys list`` shows and ``aiayn keys remove`` takes) and its own limits. A fast
hash is enough for a key of 256 random bits (no dictionary to try, unlike a password), and every
request looks its key up: bcrypt's deliberate slowness would cost each request tens of
milliseconds of CPU.

Two stores, one protocol (:class:`KeyStore`):

* :class:`SQLiteKeys`, the default: one file (``--keys-db``, by default
  ``$XDG_DATA_HOME/aiayn/keys.db``, ``~/.local/share/aiayn/keys.db``) in WAL mode, so that several
  processes of one machine read it while ``aiayn keys`` writes it; a key added or removed counts at
  the next request.
* :class:`RedisKeys` (``--shared-storage redis://HOST:PORT/DB``): the keys of every replica, in the
  Redis that also holds their counters (:mod:`aiayn.serve.quotas`). :class:`Shared` is that Redis,
  told apart from its absence: while it is unreachable each process serves on its own (the keys it
  has already seen, its own counters), says so once on stderr, tries again every few seconds, and
  says so once more when it is back.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import sqlite3
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

from aiayn.errors import UserError

KEY_PREFIX = "aiayn-"
ID_DIGITS = 12
SHARED_STORAGE_VARIABLE = "AIAYN_SHARED_STORAGE"  # keeps a Redis password out of the process list
REDIS_KEYS = "aiayn:keys"  # a hash: digest -> the key's record (JSON)
REDIS_SCHEMES = ("redis", "rediss", "unix")
TIMEOUT_S = 0.5  # a dead Redis never holds a request longer than this
RETRY_S = 5.0  # an unreachable Redis is tried again at most this often

T = TypeVar("T")


def default_keys_db() -> Path:
    data = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data) / "aiayn" / "keys.db"


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Key:
    """A stored key: never the key itself."""

    id: str
    digest: str
    req_limit: int | None = None  # requests per minute; None: the server's limits
    char_limit: int | None = None  # characters per request; None: the server's
    created: float = 0.0  # Unix time

    @classmethod
    def make(cls, key: str, req_limit: int | None = None, char_limit: int | None = None) -> Key:
        hashed = digest(key)
        return cls(hashed[:ID_DIGITS], hashed, req_limit, char_limit, round(time.time(), 3))

    def describe(self) -> str:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.created))
        return (
            f"{self.id}  req-limit: {_limit(self.req_limit, 'per minute')}  "
            f"char-limit: {_limit(self.char_limit, 'per request')}  created {created} UTC"
        )


def _limit(n: int | None, unit: str) -> str:
    return f"{n} {unit}" if n is not None else "server default"


class Unavailable(Exception):
    """The store cannot answer now (an unreachable Redis, an unreadable file)."""


class KeyStore(Protocol):
    def add(self, key: Key) -> None: ...
    def find(self, hashed: str) -> Key | None: ...  # raises Unavailable
    def all(self) -> list[Key]: ...
    def remove(self, key: Key) -> None: ...


def resolve(store: KeyStore, key_or_id: str) -> Key:
    """The stored key that ``key_or_id`` is (the key itself), or whose id it is or starts."""
    found = store.find(digest(key_or_id))
    if found:
        return found
    matches = [key for key in store.all() if len(key_or_id) >= 4 and key.id.startswith(key_or_id.lower())]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UserError(f"{key_or_id}: the id of {len(matches)} keys; give more of it")
    raise UserError(f"{key_or_id}: no such key or key id (aiayn keys list shows the ids)")


# --- SQLite -----------------------------------------------------------------------------------------


class SQLiteKeys:
    """The keys in one SQLite file (WAL mode: several processes read it while one writes)."""

    def __init__(self, path: Path | str, create: bool = False) -> None:
        self.path, self.lock = Path(path), threading.Lock()
        if not create and not self.path.is_file():
            raise UserError(
                f"--keys-db {self.path}: no such file; add a key first: aiayn keys add --keys-db {self.path}"
            )
        try:
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.path.touch(mode=0o600, exist_ok=True)  # digests only, but nobody else's business
            self.db = sqlite3.connect(self.path, timeout=5.0, check_same_thread=False, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS keys (digest TEXT PRIMARY KEY, id TEXT NOT NULL, "
                "req_limit INTEGER, char_limit INTEGER, created REAL NOT NULL)"
            )
            self.db.execute("SELECT count(*) FROM keys").fetchone()
        except sqlite3.Error as err:
            raise UserError(f"--keys-db {self.path}: {err}") from None

    def add(self, key: Key) -> None:
        with self.lock:
            self.db.execute("INSERT INTO keys VALUES (?, ?, ?, ?, ?)", _row(key))

    def find(self, hashed: str) -> Key | None:
        try:
            with self.lock:
                row = self.db.execute("SELECT * FROM keys WHERE digest = ?", (hashed,)).fetchone()
        except sqlite3.Error as err:
            raise Unavailable(f"the keys database {self.path}: {err}") from None
        return _key(row) if row else None

    def all(self) -> list[Key]:
        with self.lock:
            return [_key(row) for row in self.db.execute("SELECT * FROM keys ORDER BY created")]

    def remove(self, key: Key) -> None:
        with self.lock:
            self.db.execute("DELETE FROM keys WHERE digest = ?", (key.digest,))


def _row(key: Key) -> tuple:
    return key.digest, key.id, key.req_limit, key.char_limit, key.created


def _key(row: tuple) -> Key:
    hashed, id_, req_limit, char_limit, created = row
    return Key(id_, hashed, req_limit, char_limit, created)


# --- Redis ------------------------------------------------------------------------------------------


def _warn(message: str) -> None:
    print(f"aiayn serve: warning: {message}", file=sys.stderr, flush=True)


class Shared:
    """One Redis server (``--shared-storage URL``) and whether it answers: :meth:`call` runs a
    command on it or, while it is unreachable, the fallback; the first failure and the first
    success after failures are said once each (``warn``); a failed Redis is tried again at most
    every :data:`RETRY_S` seconds, each try at most :data:`TIMEOUT_S` seconds."""

    def __init__(self, url: str, warn: Callable[[str], None] = _warn) -> None:
        self.where = redacted(url)
        if urlsplit(url).scheme not in REDIS_SCHEMES:
            raise UserError(f"--shared-storage {self.where}: not a Redis URL (redis://HOST:PORT/DB)")
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise UserError("--shared-storage needs the redis package: pip install 'aiayn[serve]'") from None
        # any error of Redis (unreachable, out of memory, read-only after a failover, a refused
        # command): serve on without it rather than answer 500s
        self.errors = (redis.RedisError,)
        try:
            self.client = redis.Redis.from_url(
                url,
                socket_timeout=TIMEOUT_S,
                socket_connect_timeout=TIMEOUT_S,
                # one retry on a broken connection (a restarted Redis), none on a timeout
                retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
                decode_responses=True,
            )
        except ValueError as err:
            raise UserError(f"--shared-storage {self.where}: {err}") from None
        self.warn, self.up, self.retry_at, self.lock = warn, True, 0.0, threading.Lock()
        self.retry_s = RETRY_S

    def binary(self, timeout_s: float) -> Any:
        """Another client of the same Redis, its answers bytes (files), not text, each call at most
        ``timeout_s`` seconds (a file takes longer to send than a counter)."""
        import redis

        pool = self.client.connection_pool
        kwargs = {**pool.connection_kwargs, "decode_responses": False, "socket_timeout": timeout_s}
        return redis.Redis(
            connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
        )

    def check(self) -> None:
        """At start: Redis answers, or one line (an operator's typo must not silently unshare)."""
        try:
            self.client.ping()
        except self.errors as err:
            raise UserError(f"--shared-storage {self.where}: cannot reach Redis: {_line(err)}") from None
        except Exception as err:  # a refused password, a wrong database number, ...
            raise UserError(f"--shared-storage {self.where}: {_line(err)}") from None

    def call(self, command: Callable[[Any], T], fallback: Callable[[], T]) -> T:
        if not self.up and time.monotonic() < self.retry_at:
            return fallback()
        try:
            result = command(self.client)
        except self.errors as err:
            with self.lock:
                self.retry_at = time.monotonic() + self.retry_s
                if self.up:
                    self.up = False
                    self.warn(
                        f"Redis at {self.where} is unreachable or failing ({_line(err)}): serving on this "
                        f"process's own limits and the keys it knows, trying again every {self.retry_s:g} s"
                    )
            return fallback()
        if not self.up:
            with self.lock:
                if not self.up:
                    self.up = True
                    self.warn(f"Redis at {self.where} is back: limits and keys are shared again")
        return result


def redacted(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _line(err: Exception) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0]


class RedisKeys:
    """The keys in Redis, one hash (:data:`REDIS_KEYS`) for every replica. Each key found is
    remembered, so that it keeps working while Redis is unreachable; a key this process has not
    seen is then :class:`Unavailable` (a 503: neither admitted unchecked nor refused as wrong)."""

    def __init__(self, shared: Shared) -> None:
        self.shared, self.seen = shared, {}

    def add(self, key: Key) -> None:
        self._strict(lambda r: r.hset(REDIS_KEYS, key.digest, json.dumps(asdict(key))))

    def find(self, hashed: str) -> Key | None:
        def ask(r) -> Key | None:
            found = r.hget(REDIS_KEYS, hashed)
            if found is None:
                self.seen.pop(hashed, None)  # removed
                return None
            key = self.seen[hashed] = Key(**json.loads(found))
            return key

        def remembered() -> Key | None:
            if hashed in self.seen:
                return self.seen[hashed]
            raise Unavailable(f"Redis at {self.shared.where} is unreachable")

        return self.shared.call(ask, remembered)

    def all(self) -> list[Key]:
        found = self._strict(lambda r: r.hgetall(REDIS_KEYS))
        return sorted((Key(**json.loads(v)) for v in found.values()), key=lambda k: k.created)

    def remove(self, key: Key) -> None:
        self._strict(lambda r: r.hdel(REDIS_KEYS, key.digest))

    def _strict(self, command: Callable[[Any], T]) -> T:
        try:
            return command(self.shared.client)
        except self.shared.errors as err:
            raise UserError(
                f"--shared-storage {self.shared.where}: cannot reach Redis: {_line(err)}"
            ) from None


def open_keys(keys_db: str | None, shared: Shared | None, create: bool = False) -> KeyStore:
    """The key store: Redis's with shared storage, else the SQLite file (``keys_db`` or the
    default)."""
    if shared is not None:
        if keys_db is not None:
            raise UserError("--keys-db: with --shared-storage the keys are in Redis; give one of them")
        return RedisKeys(shared)
    return SQLiteKeys(keys_db or default_keys_db(), create=create)


def open_shared(url: str | None, warn: Callable[[str], None] = _warn) -> Shared | None:
    """The Redis of ``--shared-storage`` (or :data:`SHARED_STORAGE_VARIABLE`), checked; None without."""
    url = url or os.environ.get(SHARED_STORAGE_VARIABLE) or None
    if url is None:
        return None
    shared = Shared(url, warn)
    shared.check()
    return shared


# --- aiayn keys ---------------------------------------------------------------------------------------


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "keys",
        help="API keys of aiayn serve --api-keys: add, list, remove",
        description="The API keys of aiayn serve --api-keys, in a SQLite file (--keys-db) or the "
        "Redis of several replicas (--shared-storage). A key is printed once, when added, and stored "
        "only as its SHA-256 digest.",
    )
    commands = p.add_subparsers(dest="keys_command", metavar="ACTION")
    add = commands.add_parser("add", help="make a key and print it (shown once)")
    add.add_argument("--req-limit", type=int, help="its requests per minute (default: the server's limits)")
    add.add_argument("--char-limit", type=int, help="its characters per request (default: the server's)")
    listing = commands.add_parser("list", help="each key's id, limits and creation (never the key)")
    remove = commands.add_parser("remove", help="remove a key, given itself or its id")
    remove.add_argument("key", metavar="KEY_OR_ID")
    for parser in (p, add, listing, remove):
        parser.add_argument(
            "--keys-db",
            default=argparse.SUPPRESS,
            metavar="PATH",
            help=f"the keys' SQLite file (default: {default_keys_db()})",
        )
        parser.add_argument(
            "--shared-storage",
            default=argparse.SUPPRESS,
            metavar="URL",
            help=f"the Redis of several replicas, redis://HOST:PORT/DB (or ${SHARED_STORAGE_VARIABLE})",
        )
    p.set_defaults(func=run_keys)


def run_keys(args: argparse.Namespace) -> int:
    action = getattr(args, "keys_command", None) or "list"
    for name in ("req_limit", "char_limit"):
        if getattr(args, name, None) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')}: must be >= 1")
    shared = open_shared(getattr(args, "shared_storage", None))
    store = open_keys(getattr(args, "keys_db", None), shared, create=action == "add")
    if action == "add":
        key = new_key()
        stored = Key.make(key, args.req_limit, args.char_limit)
        store.add(stored)
        print(key)  # the only place it is ever shown
        print(f"aiayn keys: added {stored.describe()}", file=sys.stderr)
    elif action == "remove":
        found = resolve(store, args.key)
        store.remove(found)
        print(f"aiayn keys: removed {found.id}", file=sys.stderr)
    else:
        for key in store.all():
            print(key.describe())
    return 0
