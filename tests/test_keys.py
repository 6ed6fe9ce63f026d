"""API keys and quotas in one process (issue 52): ``aiayn keys`` on a SQLite file (the key shown
once, stored hashed), ``aiayn serve --api-keys``, the rate, character and batch limits, bans, and the
start refused in one line on a bad configuration. The Redis shared by replicas: test_quotas_redis.py.

The server is an app over a fake model (:class:`FakeBackend`) driven through starlette's TestClient:
no model is trained or loaded."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from aiayn.cli import build_parser, main  # noqa: E402
from aiayn.errors import UserError  # noqa: E402
from aiayn.serve.app import Limits, Served, create_app  # noqa: E402
from aiayn.serve.keys import Key, SQLiteKeys, digest  # noqa: E402
from aiayn.serve.quotas import BAN_SECONDS, KEY_NEEDED, Access, MemoryCounters, Quotas  # noqa: E402
from test_documents_translate import FakeBackend  # noqa: E402

LT = {"q": "a man", "source": "en", "target": "de"}


def app_with(access: Access, limits: Limits | None = None):
    info = {"languages": {"source": "en", "target": "de"}}
    served = Served("translation", info, backend=FakeBackend())
    return create_app(served, limits or Limits(), {"max_tokens": 0, "max_wait_s": 0}, access=access)


def keys_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["keys", *args])
    out, err = capsys.readouterr()
    return code, out, err


def added(capsys, db: Path, *limits: str) -> str:
    code, out, err = keys_cli(capsys, "add", "--keys-db", str(db), *limits)
    assert code == 0, err
    return out.strip()


def test_keys_add_list_remove_and_the_key_is_never_stored(tmp_path, capsys) -> None:
    db = tmp_path / "keys" / "keys.db"
    first = added(capsys, db, "--req-limit", "5", "--char-limit", "100")
    second = added(capsys, db)
    assert first.startswith("aiayn-") and len(first) == 49 and first != second
    code, out, err = keys_cli(capsys, "list", "--keys-db", str(db))
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2 and first not in out and second not in out
    assert (
        lines[0].startswith(digest(first)[:12])
        and "5 per minute" in lines[0]
        and "100 per request" in lines[0]
    )
    assert "server default" in lines[1]
    stored = b"".join(path.read_bytes() for path in db.parent.iterdir())  # the file, its WAL
    for key in (first, second):
        assert key.encode() not in stored and key[6:20].encode() not in stored
        assert digest(key).encode() in stored
    assert db.stat().st_mode & 0o077 == 0  # the owner's only
    code, _, err = keys_cli(capsys, "remove", digest(first)[:8], "--keys-db", str(db))  # by id
    assert code == 0 and "removed" in err
    code, _, _ = keys_cli(capsys, "remove", second, "--keys-db", str(db))  # by the key itself
    assert code == 0 and keys_cli(capsys, "list", "--keys-db", str(db))[1] == ""
    code, _, err = keys_cli(capsys, "remove", second, "--keys-db", str(db))
    assert code == 2 and err.count("\n") == 1 and "no such key" in err


@pytest.mark.parametrize(
    "args, expected",
    [
        (["list", "--keys-db", "{missing}"], "no such file; add a key first"),
        (["list", "--keys-db", "{junk}"], "file is not a database"),
        (["list", "--shared-storage", "http://127.0.0.1:6379"], "not a Redis URL"),
        (["list", "--shared-storage", "redis://127.0.0.1:{port}"], "cannot reach Redis"),
        (["add", "--req-limit", "0", "--keys-db", "{missing}"], "--req-limit: must be >= 1"),
    ],
)
def test_bad_keys_configuration_is_one_line(tmp_path, capsys, args, expected) -> None:
    from conftest import free_port

    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database, " * 100)
    values = {"missing": tmp_path / "none.db", "junk": junk, "port": free_port()}
    code, out, err = keys_cli(capsys, *(arg.format(**values) for arg in args))
    assert code == 2 and out == "" and err.count("\n") == 1 and expected in err, err


def test_a_stored_key_is_needed_and_its_own_limits_replace_the_defaults(tmp_path, capsys) -> None:
    """--api-keys: no key is LibreTranslate's 400, a wrong one its 403, on LibreTranslate's routes and
    aiayn's alike; a key with --req-limit 2 gets two requests a minute where the server's default is 5,
    then a 429 with Retry-After; its --char-limit replaces --char-limit; /languages stays open."""
    db = tmp_path / "keys.db"
    limited, plain = added(capsys, db, "--req-limit", "2", "--char-limit", "8"), added(capsys, db)
    access = Access(Quotas(req_limit=5, char_limit=100), SQLiteKeys(db))
    with TestClient(app_with(access)) as client:
        for route, body in [("/translate", LT), ("/detect", {"q": "a man"})]:
            missing = client.post(route, json=body)
            assert missing.status_code == 400 and missing.json() == {"error": KEY_NEEDED}
            wrong = client.post(route, json={**body, "api_key": "aiayn-nope"})
            assert wrong.status_code == 403 and wrong.json() == {"error": "Invalid API key"}
        assert client.post("/v1/translate", json={"text": ["a"]}).status_code == 400
        bearer = {"Authorization": "Bearer aiayn-nope"}
        assert client.post("/v1/translate", json={"text": ["a"]}, headers=bearer).status_code == 403
        assert client.get("/v1/models", headers=bearer).status_code == 403
        assert client.get("/v1/models", headers={"Authorization": f"Bearer {plain}"}).status_code == 200
        assert client.get("/languages").status_code == 200
        assert client.get("/frontend/settings").json()["keyRequired"] is True

        too_long = client.post("/translate", json={**LT, "q": "a" * 9, "api_key": limited})
        assert too_long.status_code == 413
        assert too_long.json()["error"] == "Invalid request: request (9) exceeds character limit (8)"
        ok = client.post("/translate", json={**LT, "api_key": limited})
        assert ok.status_code == 200 and ok.json()["translatedText"] == "A MAN"
        refused = client.post("/translate", json={**LT, "api_key": limited})  # the third: 413 counted
        assert refused.status_code == 429 and refused.json() == {"error": "Slowdown: 2 per 1 minute"}
        assert 55 <= int(refused.headers["retry-after"]) <= 60
        as_v1 = client.post(
            "/v1/translate", json={"text": ["a"]}, headers={"Authorization": f"Bearer {limited}"}
        )
        assert as_v1.status_code == 429  # one client, whatever the route

        answers = [client.post("/translate", json={**LT, "api_key": plain}).status_code for _ in range(6)]
        assert answers == [200] * 5 + [429]  # the server's 5 a minute (GET /v1/models is not counted)
        assert client.post("/translate", json={**LT, "q": "a" * 101, "api_key": plain}).status_code == 429


def test_unkeyed_clients_are_limited_by_address_and_banned_after_the_flood_threshold() -> None:
    quotas = Quotas(req_limit=3, hourly_req_limit=100, batch_limit=2, char_limit=10, req_flood_threshold=3)
    with TestClient(app_with(Access(quotas))) as client:
        assert client.get("/frontend/settings").json()["charLimit"] == 10
        batch = client.post("/translate", json={**LT, "q": ["a", "b", "c"]})
        assert batch.status_code == 413
        assert batch.json()["error"] == "Invalid request: request (3) exceeds text limit (2)"
        assert client.post("/v1/translate", json={"text": ["a" * 11]}).status_code == 413
        assert client.post("/v1/translate", json={"text": ["a man"]}).status_code == 200  # the third
        assert [client.post("/translate", json=LT).status_code for _ in range(3)] == [429] * 3  # 3 strikes
        banned = client.post("/detect", json={"q": "a man"})
        assert banned.status_code == 403 and banned.json() == {"error": "Too many request limits violations"}
        assert BAN_SECONDS - 5 <= int(banned.headers["retry-after"]) <= BAN_SECONDS
        assert client.get("/v1/models").status_code == 200  # no keys: nothing to identify
        assert client.get("/health").status_code == 200


def test_windows_start_at_the_first_request_and_bans_expire() -> None:
    now = [1000.0]
    counters = MemoryCounters(clock=lambda: now[0])
    rates = [(2, 60), (3, 3600)]
    assert [counters.hit("c", rates, 0).admitted for _ in range(3)] == [True, True, False]
    now[0] += 59.5
    refused = counters.hit("c", rates, 0)
    assert not refused.admitted and refused.retry_ms == 500 and refused.window == 0
    now[0] += 1
    assert counters.hit("c", rates, 0).admitted  # a new minute: the hour's third
    refused = counters.hit("c", rates, 0)
    assert not refused.admitted and refused.window == 1 and refused.retry_ms == int((3600 - 60.5) * 1000)
    assert counters.hit("other", rates, 0).admitted  # each client its own
    strikes = [counters.hit("c", rates, 2) for _ in range(3)]  # the second refusal bans
    assert [v.banned for v in strikes] == [False, False, True] and strikes[2].retry_ms == BAN_SECONDS * 1000
    now[0] += BAN_SECONDS + 1
    assert not counters.hit("c", rates, 2).banned  # the ban is over, not the hour
    now[0] += 3600
    assert counters.hit("c", rates, 2).admitted


def test_the_static_api_key_works_as_before_beside_quotas() -> None:
    with TestClient(app_with(Access(Quotas(req_limit=1)), Limits(api_key="s3cret"))) as client:
        assert client.post("/v1/translate", json={"text": ["a"]}).status_code == 401  # not counted
        ok = client.post("/v1/translate", json={"text": ["a"]}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert client.post("/translate", json={**LT, "api_key": "s3cret"}).status_code == 429


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--api-keys", "--keys-db", "{junk}"], "--keys-db {junk}: file is not a database"),
        (["--api-keys", "--keys-db", "{missing}"], "no such file; add a key first"),
        (["--keys-db", "{junk}"], "--keys-db: needs --api-keys"),
        (["--api-keys", "--api-key", "x"], "--api-key and --api-keys"),
        (["--shared-storage", "memcached://127.0.0.1:1"], "not a Redis URL"),
        (["--shared-storage", "redis://127.0.0.1:{port}/0"], "cannot reach Redis"),
        (["--req-limit", "0"], "--req-limit: must be >= 1"),
    ],
)
def test_serve_refuses_to_start_on_a_bad_access_configuration(tmp_path, capsys, flags, expected) -> None:
    """One line, exit status 2, before any model is loaded (the checkpoint does not exist)."""
    from conftest import free_port

    junk = tmp_path / "junk.db"
    junk.write_bytes(b"\x00" * 4096)
    values = {"missing": tmp_path / "none.db", "junk": junk, "port": free_port()}
    port = str(free_port())
    argv = ["serve", "--checkpoint", str(tmp_path / "no-run"), "--port", port]
    code = main(argv + [flag.format(**values) for flag in flags])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and expected.format(**values) in err, err


def test_a_key_removed_is_refused_at_the_next_request(tmp_path, capsys) -> None:
    db = tmp_path / "keys.db"
    key = added(capsys, db)
    with TestClient(app_with(Access(keys=SQLiteKeys(db)))) as client:
        assert client.post("/translate", json={**LT, "api_key": key}).status_code == 200
        assert keys_cli(capsys, "remove", key, "--keys-db", str(db))[0] == 0  # another connection
        assert client.post("/translate", json={**LT, "api_key": key}).status_code == 403
        with sqlite3.connect(db) as other:  # another process's writer, as aiayn keys add
            stored = Key.make("aiayn-by-hand", req_limit=1)
            other.execute("INSERT INTO keys VALUES (?, ?, ?, ?, ?)", (stored.digest, stored.id, 1, None, 1.0))
        statuses = [
            client.post("/translate", json={**LT, "api_key": "aiayn-by-hand"}).status_code for _ in "ab"
        ]
        assert statuses == [200, 429]


def test_serve_parses_every_access_flag() -> None:
    args = build_parser().parse_args(
        ["serve", "--checkpoint", "x", "--api-keys", "--req-limit", "1", "--hourly-req-limit", "2"]
        + ["--daily-req-limit", "3", "--char-limit", "4", "--batch-limit", "5", "--req-flood-threshold", "6"]
        + ["--forwarded-allow-ips", "10.0.0.1"]
    )
    assert (args.req_limit, args.hourly_req_limit, args.daily_req_limit) == (1, 2, 3)
    assert (args.char_limit, args.batch_limit, args.req_flood_threshold) == (4, 5, 6)
    assert args.forwarded_allow_ips == "10.0.0.1" and args.api_keys and args.shared_storage is None
    with pytest.raises(UserError, match="--keys-db"):
        from aiayn.serve.cli import make_access

        make_access(build_parser().parse_args(["serve", "--checkpoint", "x", "--keys-db", "k"]), None)


def test_an_unreachable_redis_is_said_once_on_stderr_and_never_holds_a_request(capsys) -> None:
    from aiayn.serve.keys import Shared
    from conftest import free_port

    shared = Shared(f"redis://:secret@127.0.0.1:{free_port()}/0")  # nothing listens there
    started = time.monotonic()
    answers = [shared.call(lambda r: r.ping(), lambda: "local") for _ in range(5)]
    assert answers == ["local"] * 5 and time.monotonic() - started < 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("aiayn serve: warning: Redis at redis://:***@127.0.0.1:")
    assert "secret" not in err and "serving on this process's own limits" in err


def test_behind_a_trusted_proxy_each_forwarded_address_is_a_client() -> None:
    """What aiayn serve runs: uvicorn's proxy headers, trusting --forwarded-allow-ips (here any)."""
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    app = ProxyHeadersMiddleware(app_with(Access(Quotas(req_limit=1))), trusted_hosts="*")
    with TestClient(app) as client:
        for address in ("203.0.113.7", "198.51.100.2"):
            forwarded = {"X-Forwarded-For": address}
            assert client.post("/translate", json=LT, headers=forwarded).status_code == 200
            assert client.post("/translate", json=LT, headers=forwarded).status_code == 429
