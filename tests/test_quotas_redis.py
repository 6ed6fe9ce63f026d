"""Replicas sharing keys, counters and bans through a real Redis (issue 52): a ``redis-server``
started here on 127.0.0.1 and a free port, in a temporary directory, without persistence (skipped,
saying why, where ``redis-server`` is missing or cannot start). Two apps over a fake model stand for
two replicas: a key added once is known to both, a limit of N admits exactly N requests across both,
a ban made on one holds on the other; Redis killed, each serves on its own and says so once; Redis
back, they share again and say so once."""

from __future__ import annotations

import concurrent.futures
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
redis = pytest.importorskip("redis")

from fastapi.testclient import TestClient  # noqa: E402

from aiayn.cli import build_parser, main  # noqa: E402
from aiayn.serve.cli import make_access  # noqa: E402
from aiayn.serve.keys import REDIS_KEYS, Key, RedisKeys, Shared, digest, open_shared  # noqa: E402
from aiayn.serve.quotas import Access, Quotas, RedisCounters  # noqa: E402
from conftest import free_port  # noqa: E402
from test_keys import LT, app_with  # noqa: E402


class RedisServer:
    """A ``redis-server`` of this test on 127.0.0.1: started, killed and started again on one port."""

    def __init__(self, directory: Path) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
        self.port, self.directory, self.process = free_port(), directory, None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no", "--dir", str(self.directory)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.02)
        self.stop()
        pytest.skip(f"redis-server did not start on 127.0.0.1:{self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture()
def redis_server(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


def replica(url: str, quotas: Quotas, warnings: list[str] | None = None, keys: bool = True):
    """The app of one replica: its own connection to the shared Redis."""
    shared = Shared(url, warn=(warnings if warnings is not None else []).append)
    shared.retry_s = 0.2
    access = Access(quotas, RedisKeys(shared) if keys else None, RedisCounters(shared))
    return TestClient(app_with(access))


def statuses(clients: list[TestClient], n: int, **body) -> list[int]:
    """``n`` requests at once, spread over ``clients``, two at a time; their statuses in order."""

    def post(i: int) -> int:
        return clients[i % len(clients)].post("/translate", json={**LT, **body}).status_code

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return list(pool.map(post, range(n)))


def test_two_replicas_share_keys_counters_and_bans_exactly(redis_server, capsys) -> None:
    code = main(["keys", "add", "--shared-storage", redis_server.url, "--req-limit", "7"])
    key = capsys.readouterr().out.strip()
    assert code == 0 and key.startswith("aiayn-")
    stored = redis.Redis(port=redis_server.port).hgetall(REDIS_KEYS)
    assert list(stored) == [digest(key).encode()] and key.encode() not in b"".join(stored.values())
    assert main(["keys", "list", "--shared-storage", redis_server.url]) == 0
    assert capsys.readouterr().out.startswith(digest(key)[:12])

    quotas = Quotas(req_limit=1, req_flood_threshold=3)  # the key's 7 a minute replace the 1
    with replica(redis_server.url, quotas) as a, replica(redis_server.url, quotas) as b:
        answers = statuses([a, b], 20, api_key=key)
        assert answers.count(200) == 7, answers  # exactly, across both
        assert answers.count(429) == 3 and answers.count(403) == 10, answers  # the third refusal bans
        for client in (a, b):
            banned = client.post("/detect", json={"q": "a man", "api_key": key})
            assert banned.status_code == 403 and int(banned.headers["retry-after"]) > 1700
            assert client.post("/translate", json={**LT, "api_key": "aiayn-nope"}).status_code == 403
        assert main(["keys", "remove", key, "--shared-storage", redis_server.url]) == 0
        assert b.post("/translate", json={**LT, "api_key": key}).json() == {"error": "Invalid API key"}


def test_unkeyed_clients_are_counted_across_replicas(redis_server) -> None:
    quotas = Quotas(req_limit=10, hourly_req_limit=50)
    with (
        replica(redis_server.url, quotas, keys=False) as a,
        replica(redis_server.url, quotas, keys=False) as b,
    ):
        answers = statuses([a, b], 16)
        assert answers.count(200) == 10 and answers.count(429) == 6, answers
        refused = b.post("/v1/translate", json={"text": ["a man"]})
        assert refused.status_code == 429 and refused.json() == {"error": "Slowdown: 10 per 1 minute"}
        assert 1 <= int(refused.headers["retry-after"]) <= 60
    args = build_parser().parse_args(["serve", "--checkpoint", "x", "--shared-storage", redis_server.url])
    shared = open_shared(args.shared_storage)
    assert isinstance(make_access(args, None, shared).counters, RedisCounters)  # what aiayn serve builds


def test_redis_going_away_and_coming_back(redis_server) -> None:
    """Killed: a key seen before still works, a key never seen is a 503, each replica counts on its
    own (3 each), each says so once, and no request waits for the dead Redis; back: shared again
    (3 across both), said once."""
    key = "aiayn-" + "k" * 43
    RedisKeys(Shared(redis_server.url)).add(Key.make(key, req_limit=3))
    warned_a, warned_b = [], []
    quotas = Quotas()
    with replica(redis_server.url, quotas, warned_a) as a, replica(redis_server.url, quotas, warned_b) as b:
        assert a.post("/translate", json={**LT, "api_key": key}).status_code == 200  # A has seen it
        redis_server.stop()
        started = time.monotonic()
        answers = statuses([a], 4, api_key=key)  # two at a time: which one is refused varies
        assert sorted(answers) == [200, 200, 200, 429], answers  # A's own counters
        unknown = b.post("/translate", json={**LT, "api_key": key})
        assert unknown.status_code == 503 and unknown.headers["retry-after"] == "5"
        assert "cannot be checked now" in unknown.json()["error"]
        assert time.monotonic() - started < 3, "a request waited for the dead Redis"
        time.sleep(0.25)  # past the retry interval: Redis is tried again, and still dead
        assert a.post("/translate", json={**LT, "api_key": key}).status_code == 429
        assert len(warned_a) == len(warned_b) == 1 and "unreachable" in warned_a[0]

        redis_server.start()  # empty (no persistence): the operator adds the key again
        RedisKeys(Shared(redis_server.url)).add(Key.make(key, req_limit=3))
        time.sleep(0.25)
        answers = statuses([a, b], 6, api_key=key)
        assert answers.count(200) == 3 and answers.count(429) == 3, answers  # shared again, exactly
        assert [w.split(" is ")[1][:4] for w in warned_a] == ["unre", "back"], warned_a
        assert len(warned_b) == 2 and "shared again" in warned_b[1]

        redis_server.stop()  # restarted between two requests: the broken connection is made again
        redis_server.start()
        RedisKeys(Shared(redis_server.url)).add(Key.make(key, req_limit=3))
        assert a.post("/translate", json={**LT, "api_key": key}).status_code == 200
        assert len(warned_a) == 2, warned_a  # no warning: Redis never failed a request
