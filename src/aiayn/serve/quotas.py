"""Who may ask and how much: API keys, request rates, characters per request, bans.

:class:`Access` (``app.state.access``) is what each translation and detection route calls first::

    client = await request.app.state.access.admit(request, api_key, characters=..., texts=...)

It checks the key (with ``--api-keys``), counts the request against its client's rate limits and
checks its size, or raises a starlette ``HTTPException`` (answered as ``{"error": "..."}``):

* 400 ``Please contact the server operator to obtain an API key`` (no key), 403 ``Invalid API key``;
* 403 ``Too many request limits violations`` while a client is banned (``Retry-After``: the rest of
  the ban, :data:`BAN_SECONDS`);
* 429 ``Slowdown: N per 1 minute`` beyond a rate (``Retry-After``: the seconds to its window's end);
* 413 beyond ``--batch-limit`` texts or the characters of ``--char-limit`` (or the key's own);
* 503 when the key cannot be checked now (an unreachable Redis and a key this process never saw).

A client is its key (``key:ID``) or, unkeyed, its address (``ip:ADDRESS``: the peer, or behind a
trusted proxy the address it forwards, as uvicorn's ``--forwarded-allow-ips`` reads it). A key's
``req_limit`` replaces the server's three rates (as LibreTranslate's, whose hourly and daily limits
for a key are 60 and 1,440 times its per-minute one: what the per-minute one already implies), its
``char_limit`` the server's ``--char-limit``.

Rates are fixed windows that start at a client's first request (a minute, an hour, a day) and are
exact to the request across replicas: every window of a request is read and, when all admit it,
counted in one atomic step (a Lua script in Redis, a lock in one process). A refused request is not
counted; each refusal is a strike, and ``--req-flood-threshold`` strikes within :data:`BAN_SECONDS`
ban the client for :data:`BAN_SECONDS`.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request

from aiayn.serve.keys import Key, KeyStore, Shared, Unavailable, digest

KEY_NEEDED = "Please contact the server operator to obtain an API key"  # LibreTranslate's words
WINDOWS = (("minute", 60), ("hour", 3600), ("day", 86400))
BAN_SECONDS = 1800  # a ban lasts half an hour; so does the count of strikes towards one
UNAVAILABLE_RETRY = 5


@dataclass(frozen=True)
class Quotas:
    """The server's limits (None: none); a key's own replace ``req_limit`` (and the hourly and
    daily ones) and ``char_limit``."""

    req_limit: int | None = None  # requests per minute per client
    hourly_req_limit: int | None = None
    daily_req_limit: int | None = None
    char_limit: int | None = None  # characters per request (all its texts together)
    batch_limit: int | None = None  # texts per request
    req_flood_threshold: int | None = None  # refusals within BAN_SECONDS that ban the client

    @property
    def rates(self) -> list[tuple[int, int]]:
        """``(limit, window seconds)`` of each rate set."""
        limits = (self.req_limit, self.hourly_req_limit, self.daily_req_limit)
        return [(n, seconds) for n, (_, seconds) in zip(limits, WINDOWS) if n is not None]


@dataclass(frozen=True)
class Client:
    """Who asked: ``key:ID`` or ``ip:ADDRESS``; the key when there is one."""

    id: str
    key: Key | None = None


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    banned: bool = False
    retry_ms: int = 0
    window: int = 0  # the refusing rate's index among those asked


# --- counters ---------------------------------------------------------------------------------------


class MemoryCounters:
    """The windows, strikes and bans of one process, under a lock."""

    blocking = False  # a dictionary under a lock: called in the event loop

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock, self.lock = clock, threading.Lock()
        self.counts: dict[str, list[float]] = {}  # name -> [count, expiry]
        self._swept = float("-inf")

    def hit(self, client: str, rates: list[tuple[int, int]], threshold: int) -> Verdict:
        now = self.clock()
        with self.lock:
            self._forget(now)
            ban = self._live(f"ban:{client}", now)
            if ban:
                return Verdict(False, banned=True, retry_ms=_ms(ban[1] - now))
            names = [f"rate:{client}:{seconds}" for _, seconds in rates]
            for i, ((limit, _), name) in enumerate(zip(rates, names)):
                count = self._live(name, now)
                if count and count[0] >= limit:
                    if threshold:
                        self._strike(client, now, threshold)
                    return Verdict(False, retry_ms=_ms(count[1] - now), window=i)
            for (_, seconds), name in zip(rates, names):
                count = self._live(name, now)
                if count:
                    count[0] += 1
                else:
                    self.counts[name] = [1, now + seconds]
            return Verdict(True)

    def _strike(self, client: str, now: float, threshold: int) -> None:
        strikes = self._live(f"strikes:{client}", now)
        if strikes:
            strikes[0] += 1
        else:
            strikes = self.counts[f"strikes:{client}"] = [1, now + BAN_SECONDS]
        if strikes[0] >= threshold:
            self.counts[f"ban:{client}"] = [1, now + BAN_SECONDS]
            del self.counts[f"strikes:{client}"]

    def _live(self, name: str, now: float) -> list[float] | None:
        entry = self.counts.get(name)
        return entry if entry and entry[1] > now else None

    def _forget(self, now: float) -> None:
        """Expired windows go, once there are many, at most once a second (not at every request)."""
        if len(self.counts) > 10_000 and now >= self._swept + 1.0:
            self.counts = {name: entry for name, entry in self.counts.items() if entry[1] > now}
            self._swept = now


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


# KEYS: the ban, the strikes, then one counter per rate; ARGV: the flood threshold (0: no bans), the
# ban in ms, then each rate's limit and window in ms. Returns {0} admitted (every window counted),
# {1, ms left, rate index} refused by a rate (a strike), {2, ms left} banned.
HIT = """
local ban = redis.call('PTTL', KEYS[1])
if ban > 0 then return {2, ban, 0} end
local rates = #KEYS - 2
for i = 1, rates do
  local count = tonumber(redis.call('GET', KEYS[i + 2]) or '0')
  if count >= tonumber(ARGV[1 + 2 * i]) then
    local threshold = tonumber(ARGV[1])
    if threshold > 0 then
      local strikes = redis.call('INCR', KEYS[2])
      if strikes == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
      if strikes >= threshold then
        redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
        redis.call('DEL', KEYS[2])
      end
    end
    return {1, redis.call('PTTL', KEYS[i + 2]), i - 1}
  end
end
for i = 1, rates do
  if redis.call('INCR', KEYS[i + 2]) == 1 then redis.call('PEXPIRE', KEYS[i + 2], ARGV[2 + 2 * i]) end
end
return {0, 0, 0}
"""


class RedisCounters:
    """The windows, strikes and bans of every replica, in Redis (one script call a request); this
    process's own (:class:`MemoryCounters`) while Redis is unreachable."""

    blocking = True  # a network round trip: called in a worker thread

    def __init__(self, shared: Shared) -> None:
        self.shared, self.local = shared, MemoryCounters()
        self.script = shared.client.register_script(HIT)

    def hit(self, client: str, rates: list[tuple[int, int]], threshold: int) -> Verdict:
        names = [f"aiayn:ban:{client}", f"aiayn:strikes:{client}"]
        names += [f"aiayn:rate:{client}:{seconds}" for _, seconds in rates]
        args = [threshold, BAN_SECONDS * 1000] + [n for limit, s in rates for n in (limit, s * 1000)]

        def ask(_) -> Verdict:
            status, ms, window = self.script(keys=names, args=args)
            return Verdict(status == 0, banned=status == 2, retry_ms=max(1, int(ms)), window=int(window))

        return self.shared.call(ask, lambda: self.local.hit(client, rates, threshold))


# --- admission ----------------------------------------------------------------------------------------


@dataclass
class Access:
    """The server's keys (None: no ``--api-keys``), limits and counters: see the module."""

    quotas: Quotas = field(default_factory=Quotas)
    keys: KeyStore | None = None
    counters: MemoryCounters | RedisCounters = field(default_factory=MemoryCounters)

    @property
    def active(self) -> bool:
        q = self.quotas
        return self.keys is not None or bool(q.rates or q.char_limit or q.batch_limit)

    async def admit(
        self, request: Request, api_key: str | None, characters: int = 0, texts: int = 0
    ) -> Client:
        """The client, its key checked and this request counted (``characters``: of all its texts
        together; ``texts``: how many), or an HTTPException saying why not."""
        if not self.active:
            return Client(f"ip:{peer(request)}")
        client = await self._client(request, api_key)
        rates = self._rates(client)
        if rates:
            threshold = self.quotas.req_flood_threshold or 0
            _refuse(await self._hit(client.id, rates, threshold), rates)
        self._check_size(client, characters, texts)
        return client

    async def identify(self, request: Request, api_key: str | None) -> Client:
        """The client, its key checked (and whether it is banned), nothing counted: for the routes
        that describe the server."""
        if self.keys is None:
            return Client(f"ip:{peer(request)}")
        client = await self._client(request, api_key)
        if self.quotas.req_flood_threshold:
            _refuse(await self._hit(client.id, [], 0), [])
        return client

    async def _hit(self, client: str, rates: list[tuple[int, int]], threshold: int) -> Verdict:
        if self.counters.blocking:
            return await asyncio.to_thread(self.counters.hit, client, rates, threshold)
        return self.counters.hit(client, rates, threshold)

    async def _client(self, request: Request, api_key: str | None) -> Client:
        if self.keys is None:
            return Client(f"ip:{peer(request)}")
        if not api_key:
            raise HTTPException(400, KEY_NEEDED)
        try:
            key = await asyncio.to_thread(self.keys.find, digest(api_key))
        except Unavailable as err:
            raise HTTPException(
                503,
                f"API keys cannot be checked now ({err}): try again later",
                headers={"Retry-After": str(UNAVAILABLE_RETRY)},
            ) from None
        if key is None:
            raise HTTPException(403, "Invalid API key")
        return Client(f"key:{key.id}", key)

    def _rates(self, client: Client) -> list[tuple[int, int]]:
        if client.key is not None and client.key.req_limit is not None:
            return [(client.key.req_limit, WINDOWS[0][1])]
        return self.quotas.rates

    def _check_size(self, client: Client, characters: int, texts: int) -> None:
        batch = self.quotas.batch_limit
        if batch is not None and texts > batch:
            raise HTTPException(413, f"Invalid request: request ({texts}) exceeds text limit ({batch})")
        chars = self.quotas.char_limit
        if client.key is not None and client.key.char_limit is not None:
            chars = client.key.char_limit
        if chars is not None and characters > chars:
            raise HTTPException(
                413, f"Invalid request: request ({characters}) exceeds character limit ({chars})"
            )


def _refuse(verdict: Verdict, rates: list[tuple[int, int]]) -> None:
    if verdict.admitted:
        return
    retry = {"Retry-After": str(math.ceil(verdict.retry_ms / 1000))}
    if verdict.banned:
        raise HTTPException(403, "Too many request limits violations", headers=retry)
    limit, seconds = rates[verdict.window]
    unit = next(name for name, length in WINDOWS if length == seconds)
    raise HTTPException(429, f"Slowdown: {limit} per 1 {unit}", headers=retry)


def peer(request: Request) -> str:
    """The client's address: the peer's, or behind a proxy trusted by uvicorn's
    ``--forwarded-allow-ips`` (``aiayn serve --forwarded-allow-ips``), the one it forwards."""
    return request.client.host if request.client else "unknown"


def bearer(request: Request) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header (the scheme in any case, as RFC 9110)."""
    header = request.headers.get("authorization", "")
    return (header[7:].strip() or None) if header[:7].lower() == "bearer " else None


def bears(request: Request, secret: str) -> bool:
    """Whether the request's ``Authorization: Bearer`` holds ``secret`` (in constant time)."""
    return secrets.compare_digest((bearer(request) or "").encode(), secret.encode())
