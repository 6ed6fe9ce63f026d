"""``aiayn serve --metrics``: ``GET /metrics`` in Prometheus' text format, parsed back with
``prometheus_client``'s parser: requests by route template, method and the status the client got
(error handlers' 4xx, the body limit's 413, admission's 429, a failure's 500, one label for every
unknown path), sentences and characters per model (each model of a pivot), models loaded, requests
admitted and waiting in a batcher, the process; the token; 404 without ``--metrics``.

The models are fakes (a backend that upper-cases): no model is trained or loaded, each test runs in
well under a second; one test starts a real server with the flags, over the tiny trained model.
"""

from __future__ import annotations

import argparse
import re
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from fastapi.testclient import TestClient  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from aiayn.decode.request import Translation as LineTranslation  # noqa: E402
from aiayn.decode.request import as_lines  # noqa: E402
from aiayn.errors import UserError  # noqa: E402
from aiayn.serve.app import Limits, create_app  # noqa: E402
from aiayn.serve.cli import make_metrics, register  # noqa: E402
from aiayn.serve.metrics import Metrics  # noqa: E402
from aiayn.serve.models import Models, Served  # noqa: E402
from aiayn.service.catalog import ModelSpec  # noqa: E402

NO_BATCHING = {"max_tokens": 0, "max_wait_s": 0.0}
BEARER = "Authorization: Bearer TOKEN"
OPENMETRICS = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"


class Tokenizer:
    def encode(self, text: str, target: bool = False) -> list[int]:
        return [1] * len(text.split())

    def encode_batch(self, texts, threads: int = -1, target: bool = False) -> list[list[int]]:
        return [self.encode(text) for text in texts]


class Upper:
    """A backend that upper-cases each line; ``gate``: each call waits for it (set to go on), and
    ``entered`` is set when a call starts; ``fail``: each call raises."""

    name = "torch"

    def __init__(self, gate: threading.Event | None = None, fail: bool = False) -> None:
        self.tokenizer, self.config = Tokenizer(), SimpleNamespace(max_len=64)
        self.progress = None
        self.gate, self.fail, self.entered = gate, fail, threading.Event()

    def translate(self, lines, options, wanted=None) -> list[LineTranslation]:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail:
            raise RuntimeError("the model broke")
        found = [line.text.upper() for line in as_lines(lines)]
        return [LineTranslation(text, (), -1.0, ((-1.0, text),) * options.nbest) for text in found]


def pivot_models(backend: Upper | None = None) -> Models:
    """first: aa->bb, second: bb->cc (aa->cc through bb)."""
    specs = [
        ModelSpec("first", Path("first"), ("aa",), ("bb",)),
        ModelSpec("second", Path("second"), ("bb",), ("cc",)),
    ]
    served = Served("translation", {}, backend=backend or Upper())
    return Models(specs, lambda spec: replace(served), log=lambda message: None)


def scrape(client: TestClient, **headers: str) -> dict[str, dict[frozenset, float]]:
    """The samples of ``GET /metrics``: name -> {labels: value}."""
    answer = client.get("/metrics", headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parsed(answer.text)


def parsed(text: str) -> dict[str, dict[frozenset, float]]:
    samples: dict[str, dict[frozenset, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return samples


def by(samples: dict, name: str, *keys: str) -> dict:
    """``name``'s values by the labels ``keys`` (one key: by its value)."""
    found = {}
    for labels, value in samples.get(name, {}).items():
        labels = dict(labels)
        key = tuple(labels[k] for k in keys)
        found[key[0] if len(keys) == 1 else key] = value
    return found


def test_requests_are_counted_by_route_template_method_and_the_status_the_client_got() -> None:
    app = create_app(pivot_models(), Limits(max_body_bytes=2000), NO_BATCHING, metrics=Metrics())
    pair = {"source": "aa", "target": "bb"}
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        assert client.post("/v1/translate", json={"text": ["one two"], **pair}).status_code == 200
        assert client.post("/v1/translate", json={"text": ["one"], "source": "aa"}).status_code == 400
        assert client.post("/v1/translate", json={"text": "one", **pair}).status_code == 422
        too_large = {"text": ["x" * 3000], **pair}
        assert client.post("/v1/translate", json=too_large).status_code == 413  # BodyLimit's
        assert client.get("/v1/translate").status_code == 405
        assert client.request("BREW", "/health").status_code == 405
        for scanned in ("/wp-admin/setup.php", "/.env", "/v1/translate/../../etc/passwd"):
            assert client.get(scanned).status_code == 404
        assert client.post("/translate", json={"q": "one", **pair}).status_code == 200  # LibreTranslate's
        assert client.post("/translate", json={"q": "one"}).status_code == 400
        assert client.get("/static/index.html").status_code == 200
        samples = scrape(client)
        again = scrape(client)
    assert by(samples, "aiayn_http_requests_total", "route", "method", "status") == {
        ("/health", "GET", "200"): 1,
        ("/v1/translate", "POST", "200"): 1,
        ("/v1/translate", "POST", "400"): 1,
        ("/v1/translate", "POST", "422"): 1,
        ("/v1/translate", "POST", "413"): 1,
        ("/v1/translate", "GET", "405"): 1,
        ("/health", "other", "405"): 1,
        ("unmatched", "GET", "404"): 3,
        ("/translate", "POST", "200"): 1,
        ("/translate", "POST", "400"): 1,
        ("/static/{path}", "GET", "200"): 1,
    }  # the scrape itself is counted once it is answered:
    assert by(again, "aiayn_http_requests_total", "route", "status")[("/metrics", "200")] == 1
    assert by(samples, "aiayn_http_request_duration_seconds_count", "route") == {
        "/health": 2,
        "/v1/translate": 5,
        "unmatched": 3,
        "/translate": 2,
        "/static/{path}": 1,
    }
    buckets = by(samples, "aiayn_http_request_duration_seconds_bucket", "route", "le")
    assert {le for route, le in buckets if route == "/health"} == {
        "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "30.0",
        "60.0", "+Inf",
    }  # fmt: skip
    assert samples["aiayn_http_requests_in_flight"] == {frozenset(): 1.0}  # the scrape


def test_sentences_and_characters_per_model_each_model_of_a_pivot_counted() -> None:
    app = create_app(pivot_models(), Limits(), NO_BATCHING, metrics=Metrics())
    with TestClient(app) as client:
        samples = scrape(client)
        assert samples["aiayn_models_loaded"] == {frozenset(): 0.0}
        assert by(samples, "aiayn_model_loads_total", "model") == {"first": 0, "second": 0}
        direct = client.post("/v1/translate", json={"text": ["One two. Three four five.", "", "Six."],
                                                    "source": "aa", "target": "bb"})  # fmt: skip
        assert direct.status_code == 200, direct.text
        assert [len(t["sentences"]) for t in direct.json()["translations"]] == [2, 0, 1]
        pivot = client.post("/v1/translate", json={"text": ["Seven eight."], "source": "aa", "target": "cc"})
        assert pivot.json()["translations"][0]["text"] == "SEVEN EIGHT."
        libre = client.post("/translate", json={"q": ["Nine.", "Ten ten."], "source": "bb", "target": "cc"})
        assert libre.json()["translatedText"] == ["NINE.", "TEN TEN."]
        client.post("/v1/translate", json={"text": ["x"], "source": "aa", "target": "cc", "beam": 999})
        samples = scrape(client)
    # first: "One two." 8 + "Three four five." 16 + "Six." 4, and the pivot's "Seven eight." 12
    # second: the pivot's sentence (its bridge "SEVEN EIGHT.", as long), LibreTranslate's 5 + 8
    assert by(samples, "aiayn_translated_sentences_total", "model") == {"first": 4, "second": 3}
    assert by(samples, "aiayn_translated_characters_total", "model") == {"first": 40, "second": 25}
    assert samples["aiayn_models_loaded"] == {frozenset(): 2.0}
    assert by(samples, "aiayn_model_loads_total", "model") == {"first": 1, "second": 1}
    assert by(samples, "aiayn_batcher_queue_length", "model") == {"first": 0, "second": 0}


def test_queue_admission_429_and_in_flight_while_the_model_decodes() -> None:
    """One request decoding (held in the backend), one waiting in the model's batcher, one more
    refused: admitted 2 of --max-queue 2, one in the batcher's queue, three in flight while scraped."""
    gate = threading.Event()
    backend = Upper(gate)
    app = create_app(pivot_models(backend), Limits(max_queue=2), NO_BATCHING, metrics=Metrics())
    body = {"text": ["one"], "source": "aa", "target": "bb"}
    with TestClient(app) as client:
        answers: list = []

        def post() -> None:
            answers.append(client.post("/v1/translate", json=body))

        threads = [threading.Thread(target=post), threading.Thread(target=post)]
        threads[0].start()
        assert backend.entered.wait(10)  # the first is decoding
        threads[1].start()
        deadline = time.monotonic() + 10
        while by(samples := scrape(client), "aiayn_batcher_queue_length", "model") != {"first": 1}:
            assert time.monotonic() < deadline, samples.get("aiayn_batcher_queue_length")
            time.sleep(0.01)
        refused = client.post("/v1/translate", json=body)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert samples["aiayn_requests_admitted"] == {frozenset(): 2.0}
        assert samples["aiayn_requests_admitted_limit"] == {frozenset(): 2.0}
        assert samples["aiayn_http_requests_in_flight"] == {frozenset(): 3.0}  # two translations, the scrape
        gate.set()
        for thread in threads:
            thread.join(10)
        assert [a.status_code for a in answers] == [200, 200]
        after = scrape(client)
    assert by(after, "aiayn_http_requests_total", "route", "status")[("/v1/translate", "429")] == 1
    assert by(after, "aiayn_http_requests_total", "route", "status")[("/v1/translate", "200")] == 2
    assert after["aiayn_requests_admitted"] == {frozenset(): 0.0}
    assert after["aiayn_http_requests_in_flight"] == {frozenset(): 1.0}
    assert by(after, "aiayn_translated_sentences_total", "model") == {"first": 2}


def test_a_failure_is_counted_as_the_500_the_client_got() -> None:
    app = create_app(Served("translation", {}, backend=Upper(fail=True)), Limits(), NO_BATCHING,
                     metrics=Metrics())  # fmt: skip
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.post("/v1/translate", json={"text": ["one"]}).status_code == 500
        samples = scrape(client)
    assert by(samples, "aiayn_http_requests_total", "route", "status") == {("/v1/translate", "500"): 1}
    assert by(samples, "aiayn_translated_sentences_total", "model") == {}  # nothing was translated
    assert samples["aiayn_models_loaded"] == {frozenset(): 1.0}  # loaded at start (one model)
    assert by(samples, "aiayn_model_loads_total", "model") == {"model": 1}


def test_the_token_is_required_when_set() -> None:
    app = create_app(pivot_models(), Limits(api_key="api"), NO_BATCHING, metrics=Metrics("s3cret"))
    with TestClient(app) as client:
        for headers in ({}, {"Authorization": "Bearer api"}, {"Authorization": "s3cret"}):
            refused = client.get("/metrics", headers=headers)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
            assert refused.json() == {"error": f"missing or wrong metrics token: send {BEARER}"}
            assert "\n" not in refused.text
        samples = scrape(client, Authorization="Bearer s3cret")
    assert by(samples, "aiayn_http_requests_total", "route", "status") == {("/metrics", "401"): 3}
    assert samples["process_resident_memory_bytes"][frozenset()] > 1_000_000  # the process's RSS
    assert samples["process_open_fds"][frozenset()] > 0
    assert "python_info" in samples
    with TestClient(app) as client:  # what Prometheus asks for first
        answer = client.get("/metrics", headers={"Authorization": "Bearer s3cret", "Accept": OPENMETRICS})
    assert answer.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert answer.text.endswith("# EOF\n")


def test_off_unless_asked_and_each_app_has_its_own_registry() -> None:
    with TestClient(create_app(pivot_models(), Limits(), NO_BATCHING)) as client:
        answer = client.get("/metrics")
        assert answer.status_code == 404 and answer.json() == {"error": "Not Found"}
    counts = []
    for _ in range(2):  # a second app in the same process starts from zero
        with TestClient(create_app(pivot_models(), Limits(), NO_BATCHING, metrics=Metrics())) as client:
            client.get("/health")
            counts.append(by(scrape(client), "aiayn_http_requests_total", "route"))
    assert counts == [{"/health": 1}, {"/health": 1}]
    schema = create_app(pivot_models(), Limits(), NO_BATCHING, metrics=Metrics()).openapi()
    assert "/metrics" not in schema["paths"]


def test_the_flags(monkeypatch) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    base = ["serve", "--checkpoint", "run"]
    assert make_metrics(parser.parse_args(base)) is None
    assert make_metrics(parser.parse_args([*base, "--metrics"])).token is None
    assert make_metrics(parser.parse_args([*base, "--metrics", "--metrics-auth-token", "t"])).token == "t"
    monkeypatch.setenv("AIAYN_METRICS_AUTH_TOKEN", "from-env")
    assert make_metrics(parser.parse_args([*base, "--metrics"])).token == "from-env"
    with pytest.raises(UserError, match=re.escape("--metrics-auth-token: needs --metrics")):
        make_metrics(parser.parse_args([*base, "--metrics-auth-token", "t"]))


@pytest.mark.xdist_group("served")  # on one worker with the other tests of the tiny served model
def test_a_real_server_with_the_flags(tiny_translation_run, live_server) -> None:
    """``aiayn serve --metrics --metrics-auth-token``, a real process: the sentences the model
    translated, its one load, the process's memory."""
    httpx = pytest.importorskip("httpx")
    url = live_server(tiny_translation_run, "--metrics", "--metrics-auth-token", "t0k")
    with httpx.Client(base_url=url, timeout=60.0) as client:
        assert client.get("/metrics").status_code == 401
        answer = client.post("/v1/translate", json={"text": ["907042", "13\n\n500"]})
        assert answer.status_code == 200, answer.text
        metrics = client.get("/metrics", headers={"Authorization": "Bearer t0k"})
    assert metrics.status_code == 200
    samples = parsed(metrics.text)
    model = str(tiny_translation_run)  # as GET /v1/models names it
    assert by(samples, "aiayn_translated_sentences_total", "model") == {model: 3}
    assert by(samples, "aiayn_translated_characters_total", "model") == {model: 11}
    assert by(samples, "aiayn_model_loads_total", "model") == {model: 1}
    assert samples["aiayn_models_loaded"] == {frozenset(): 1.0}
    assert by(samples, "aiayn_http_requests_total", "route", "status") == {
        ("/health", "200"): 1,  # the fixture's wait until the server is up
        ("/metrics", "401"): 1,
        ("/v1/translate", "200"): 1,
    }
    assert samples["process_resident_memory_bytes"][frozenset()] > 10_000_000
