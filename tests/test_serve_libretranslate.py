"""The LibreTranslate API of ``aiayn serve`` with real clients, against a live server on loopback.

``libretranslatepy`` (its ``LibreTranslateAPI``: urlencoded form posts) and a JSON client shaped as
Mastodon's (``TranslationService::LibreTranslate``: a list of ``q``, ``format: "html"``, ``source:
"auto"``, ``api_key`` null, ``GET /languages``) against the tiny digits->words model served as a
de->en model (``--source-lang de --target-lang en``): what they read comes back as LibreTranslate
answers it; fields from JSON, forms and the query string; the key; LibreTranslate's errors, each one
line, the server alive after them.
"""

from __future__ import annotations

import json
import time
import urllib.error

import pytest

pytestmark = pytest.mark.xdist_group("served")  # on one worker with the other tests of the tiny served model
httpx = pytest.importorskip("httpx")
# one client for the module: CLIENT.post() makes a new one per call, ~60 ms (its SSL context) each
CLIENT = httpx.Client(timeout=60.0)
pytest.importorskip("fastapi")
libretranslatepy = pytest.importorskip("libretranslatepy")
pytest.importorskip("py3langid")

PAIR = ("--source-lang", "de", "--target-lang", "en")
SERVED = (*PAIR, "--max-chars", "5000")  # the server most tests share (a small limit, to test it cheaply)
GERMAN = ["Ein Mann fährt mit dem Fahrrad über die Straße.", "Zwei Hunde spielen im Park."]
FRENCH = "Un homme fait du vélo dans la rue."
SERVES = "this server translates German (de) to English (en)"


def v1(url: str, texts: list[str], **options) -> list[dict]:
    answer = CLIENT.post(f"{url}/v1/translate", json={"text": texts, **options}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["translations"]


def test_libretranslatepy_translates_detects_and_lists_languages(tiny_translation_run, shared_server) -> None:
    url = shared_server(tiny_translation_run, *SERVED)
    lt = libretranslatepy.LibreTranslateAPI(url)
    assert lt.translate("907042", "de", "en", timeout=60) == v1(url, ["907042"])[0]["text"]
    detected = lt.detect(GERMAN[0], timeout=60)
    assert detected[0]["language"] == "de" and 50 < detected[0]["confidence"] <= 100
    assert [d["confidence"] for d in detected] == sorted((d["confidence"] for d in detected), reverse=True)
    assert lt.languages(timeout=60) == [
        {"code": "de", "name": "German", "targets": ["en"]},
        {"code": "en", "name": "English", "targets": []},
    ]
    with pytest.raises(urllib.error.HTTPError) as refused:
        lt.translate("907042", "fr", "en", timeout=60)
    assert refused.value.code == 400
    assert json.load(refused.value) == {"error": f"fr is not supported: {SERVES}"}


def test_a_mastodon_shaped_json_client(tiny_translation_run, shared_server) -> None:
    """Mastodon posts JSON with a list of HTML texts, source auto and api_key null, reads
    translatedText[i] and detectedLanguage[i].language, and builds its language map from /languages."""
    url = shared_server(tiny_translation_run, *SERVED)
    headers = {"Content-Type": "application/json"}
    texts = [f"<p>{GERMAN[0]}</p>", f"<p>{GERMAN[1]} <b>907042</b></p>"]
    body = {"q": texts, "source": "auto", "target": "en", "format": "html", "api_key": None}
    answer = CLIENT.post(f"{url}/translate", content=json.dumps(body), headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["translatedText"] == [t["text"] for t in v1(url, texts, format="html")]
    assert [d["language"] for d in data["detectedLanguage"]] == ["de", "de"]
    assert all(50 < d["confidence"] <= 100 for d in data["detectedLanguage"])
    languages = CLIENT.get(f"{url}/languages", headers=headers, timeout=60).json()
    mapped = {lang["code"]: [t for t in lang["targets"] if t != lang["code"]] for lang in languages}
    assert mapped == {"de": ["en"], "en": []}
    french = {**body, "q": [FRENCH]}  # detected among the served sources only: de, with a low confidence
    found = CLIENT.post(f"{url}/translate", content=json.dumps(french), headers=headers, timeout=60)
    assert found.status_code == 200 and found.json()["detectedLanguage"][0]["language"] == "de"
    assert found.json()["detectedLanguage"][0]["confidence"] < 5
    refused = CLIENT.post(
        f"{url}/translate", content=json.dumps({**body, "target": "cs"}), headers=headers, timeout=60
    )
    assert refused.status_code == 400
    assert refused.json()["error"].startswith("cs is not supported as a target")
    assert refused.json()["error"].endswith(SERVES)


def test_fields_from_json_form_multipart_and_query_string_alike(tiny_translation_run, shared_server) -> None:
    """The same request as JSON, as a urlencoded form, as a multipart form and in the query string
    gets the same answer; alternatives come best first after the translation, none equal to it; the
    query string wins over the form, as in LibreTranslate (Flask's request.values)."""
    url = shared_server(tiny_translation_run, *SERVED)
    fields = {"q": "907042", "source": "de", "target": "en", "alternatives": "2"}
    answers = [
        CLIENT.post(f"{url}/translate", json={**fields, "alternatives": 2}, timeout=60),
        CLIENT.post(f"{url}/translate", data=fields, timeout=60),
        CLIENT.post(f"{url}/translate", files={k: (None, v) for k, v in fields.items()}, timeout=60),
        CLIENT.post(f"{url}/translate", params=fields, timeout=60),
    ]
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    assert all(a.json() == answers[0].json() for a in answers)
    expected = v1(url, ["907042"], nbest=3)[0]
    assert answers[0].json() == {
        "translatedText": expected["text"],
        "alternatives": [h["text"] for h in expected["nbest"][1:] if h["text"] != expected["text"]],
    }
    overridden = CLIENT.post(f"{url}/translate", params={"source": "fr"}, data=fields, timeout=60)
    assert overridden.status_code == 400 and overridden.json()["error"].startswith("fr is not supported")
    lines = CLIENT.post(f"{url}/translate", data={**fields, "q": "907042\r\n\r\n13"}, timeout=60).json()
    assert lines["translatedText"] == v1(url, ["907042\n\n13"])[0]["text"]  # a form's \r\n read as \n


def test_the_key_as_field_or_bearer_header(tiny_translation_run, shared_server) -> None:
    url = shared_server(tiny_translation_run, *PAIR, "--api-key", "s3cret")
    lt = libretranslatepy.LibreTranslateAPI(url, api_key="s3cret")
    assert lt.translate("907042", "de", "en", timeout=60) == v1_with_key(url)
    fields = {"q": "907042", "source": "de", "target": "en"}
    bearer = CLIENT.post(f"{url}/translate", json=fields, headers={"Authorization": "Bearer s3cret"})
    assert bearer.status_code == 200 and bearer.json()["translatedText"] == v1_with_key(url)
    for wrong in ({"api_key": "nope"}, {}):
        for route in ("/translate", "/detect"):
            answer = CLIENT.post(f"{url}{route}", json={**fields, **wrong}, timeout=60)
            expected = (403, "Invalid API key") if wrong else (400, "Please contact the server operator")
            assert answer.status_code == expected[0] and answer.json()["error"].startswith(expected[1])
    header = CLIENT.post(f"{url}/translate", json=fields, headers={"Authorization": "Bearer nope"})
    assert header.status_code == 403
    assert CLIENT.get(f"{url}/languages").status_code == 200
    settings = CLIENT.get(f"{url}/frontend/settings").json()
    assert settings["keyRequired"] is True and settings["apiKeys"] is True


def v1_with_key(url: str) -> str:
    answer = CLIENT.post(
        f"{url}/v1/translate", json={"text": ["907042"]}, headers={"Authorization": "Bearer s3cret"}
    )
    return answer.json()["translations"][0]["text"]


BAD = [  # (body or (content, content-type), status, the error's start)
    ({"source": "de", "target": "en"}, 400, "Invalid request: missing q parameter"),
    ({"q": "", "source": "de", "target": "en"}, 400, "Invalid request: missing q parameter"),
    ({"q": "1", "target": "en"}, 400, "Invalid request: missing source parameter"),
    ({"q": "1", "source": "de"}, 400, "Invalid request: missing target parameter"),
    ({"q": "1", "source": "cs", "target": "en"}, 400, f"cs is not supported: {SERVES}"),
    ({"q": "1", "source": "de", "target": "fr"}, 400, "fr is not supported as a target language from de"),
    ({"q": "1", "source": "de", "target": "en", "format": "xml"}, 400, "xml format is not supported"),
    ({"q": "1", "source": "de", "target": "en", "alternatives": "x"}, 400, "Invalid request: alternatives"),
    ({"q": "1", "source": "de", "target": "en", "alternatives": 4}, 400, "Invalid request: alternatives"),
    ({"q": 7, "source": "de", "target": "en"}, 400, "Invalid request: q must be a string or a list"),
    ({"q": ["1", 2], "source": "de", "target": "en"}, 400, "Invalid request: q must be a string or a list"),
    ({"q": "1" * 5_001, "source": "de", "target": "en"}, 413, "Invalid request: request (5001) exceeds"),
    ({"q": ["1"] * 257, "source": "de", "target": "en"}, 413, "Invalid request: request (257) exceeds text"),
    ((b"{not json", "application/json"), 400, "Invalid JSON format"),
    ((b'{"q": "\xff"}', "application/json"), 400, "Invalid JSON format"),
    ((b"[1, 2]", "application/json"), 400, "Invalid JSON format"),
    ((b"q=1&source=de", "application/x-www-form-urlencoded"), 400, "Invalid request: missing target"),
    ((b"\x00\x01", "application/octet-stream"), 400, "Invalid request: missing q parameter"),
]


def test_bad_requests_get_libretranslates_errors_and_the_server_lives(
    tiny_translation_run, shared_server
) -> None:
    url = shared_server(tiny_translation_run, *SERVED)
    deadline = time.time() + 60
    for _ in range(5):  # 5 x 18 requests, bounded in time too
        for body, status, start in BAD:
            if isinstance(body, tuple):
                content, kind = body
                answer = CLIENT.post(f"{url}/translate", content=content, headers={"Content-Type": kind})
            else:
                answer = CLIENT.post(f"{url}/translate", json=body, timeout=60)
            assert answer.status_code == status, (body if len(str(body)) < 200 else start, answer.text)
            error = answer.json()["error"]
            assert "\n" not in error and error.startswith(start), error
        assert time.time() < deadline, "the bad requests took too long"
    assert CLIENT.post(f"{url}/detect", data={}).json() == {"error": "Invalid request: missing q parameter"}
    big = CLIENT.post(f"{url}/translate", data={"q": "1" * 1_000_001, "source": "de", "target": "en"})
    assert big.status_code == 413 and big.json()["error"].startswith("body: larger than the limit")
    good = CLIENT.post(f"{url}/translate", data={"q": "907042", "source": "de", "target": "en"})
    assert good.status_code == 200 and good.json()["translatedText"]


def test_settings_and_spec_say_what_clients_read(tiny_translation_run, shared_server) -> None:
    """Dialect checks /spec's info.title and reads /frontend/settings' charLimit and key flags;
    /v1/model shows the languages named by the flags."""
    url = shared_server(tiny_translation_run, *SERVED)
    spec = CLIENT.get(f"{url}/spec").json()
    assert spec["info"]["title"] == "LibreTranslate"
    assert {"/translate", "/detect", "/languages"} <= set(spec["paths"]) and "/v1/translate" not in spec[
        "paths"
    ]
    settings = CLIENT.get(f"{url}/frontend/settings").json()
    assert settings["charLimit"] == 5000 and settings["keyRequired"] is False
    assert settings["language"] == {
        "source": {"code": "de", "name": "German"},
        "target": {"code": "en", "name": "English"},
    }
    assert CLIENT.get(f"{url}/v1/model").json()["languages"] == {"source": "de", "target": "en"}
