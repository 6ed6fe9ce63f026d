"""Files on the server (issue 52): LibreTranslate's ``POST /translate_file`` answers a
``translatedFileUrl``, whose ``GET`` gives the translated file under the uploaded file's name.

The model is a fake that upper-cases each word (aligned to itself); documents are made here with
their formats' own libraries. Bad files (a PDF named .docx, a truncated docx, a zip bomb, one over
the limits, an extension not read) are one 4xx line each and the server goes on serving; downloads
are found by their random token only and expire; keys and quotas count file requests; with two
replicas sharing a Redis, a file translated by one is downloaded from the other.
"""

from __future__ import annotations

import io
import zipfile
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi")
docx = pytest.importorskip("docx")

from fastapi.testclient import TestClient  # noqa: E402

from aiayn.serve import downloads  # noqa: E402
from aiayn.serve.app import Limits, create_app  # noqa: E402
from aiayn.serve.downloads import LocalDownloads, SharedDownloads  # noqa: E402
from aiayn.serve.models import Served  # noqa: E402
from aiayn.serve.quotas import Access, Quotas  # noqa: E402
from test_documents_translate import FakeBackend  # noqa: E402

PAIR = {"source": "en", "target": "de"}


def app_of(limits: Limits | None = None, access: Access | None = None, downloads=None, metrics=None):
    info = {"languages": {"source": "en", "target": "de"}}
    served = Served("translation", info, backend=FakeBackend())
    no_batching = {"max_tokens": 0, "max_wait_s": 0}
    return create_app(
        served, limits or Limits(), no_batching, access=access, downloads=downloads, metrics=metrics
    )


def word_file() -> bytes:
    document = docx.Document()
    paragraph = document.add_paragraph("A man rides a ")
    paragraph.add_run("red").bold = True
    paragraph.add_run(" bike.")
    document.add_paragraph("Two dogs play.")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def upload(client: TestClient, name: str, data: bytes, **fields):
    return client.post("/translate_file", data={**PAIR, **fields}, files={"file": (name, data)})


def download(client: TestClient, answer) -> bytes:
    assert answer.status_code == 200, answer.text
    url = answer.json()["translatedFileUrl"]
    got = client.get(urlsplit(url).path)
    assert got.status_code == 200, got.text
    return got


def test_a_text_file_and_a_word_file_come_back_translated_under_their_names() -> None:
    with TestClient(app_of()) as client:
        answer = upload(client, "notes.txt", "A man rides.\n\nTwo dogs play.\n".encode())
        assert set(answer.json()) == {"translatedFileUrl"}
        assert answer.json()["translatedFileUrl"].startswith("http://testserver/download_file/")
        got = download(client, answer)
        assert got.content == "A MAN RIDES.\n\nTWO DOGS PLAY.\n".encode()
        assert got.headers["content-type"] == "text/plain; charset=utf-8"
        assert (
            got.headers["content-disposition"]
            == "attachment; filename=\"notes.txt\"; filename*=UTF-8''notes.txt"
        )

        answer = upload(client, 'Bericht "über" Räder.docx', word_file())
        assert answer.json()["translatedFileUrl"].endswith(".Bericht%20%22%C3%BCber%22%20R%C3%A4der.docx")
        got = download(client, answer)
        assert got.headers["content-disposition"] == (
            'attachment; filename="Bericht __ber_ R_der.docx"; '
            "filename*=UTF-8''Bericht%20%22%C3%BCber%22%20R%C3%A4der.docx"
        )
        document = docx.Document(io.BytesIO(got.content))
        first, second = document.paragraphs
        assert first.text == "A MAN RIDES A RED BIKE." and second.text == "TWO DOGS PLAY."
        assert [run.text for run in first.runs if run.bold] == ["RED"]  # the bold word's own

        detected = upload(client, "auto.txt", "A man rides a red bike in the city.".encode(), source="auto")
        assert detected.json()["detectedLanguage"]["language"] == "en"  # among the served sources
        assert download(client, detected).content == b"A MAN RIDES A RED BIKE IN THE CITY."

        settings = client.get("/frontend/settings").json()
        assert settings["filesTranslation"] is True
        assert {".txt", ".docx", ".odt", ".pptx", ".epub", ".srt", ".html", ".md"} <= set(
            settings["supportedFilesFormat"]
        )


def zip_bomb() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        with archive.open("word/document.xml", "w", force_zip64=True) as member:
            for _ in range(64):
                member.write(b"\0" * (1 << 20))  # 64 MB of zeros, 64 KB packed
    return out.getvalue()


@pytest.mark.parametrize(
    "name, data, status, words",
    [
        ("report.docx", b"%PDF-1.7\n" + bytes(500), 400, "report.docx"),
        ("cut.docx", word_file()[:3000], 400, "cut.docx"),
        ("bomb.docx", zip_bomb(), 413, "bomb.docx"),
        ("big.txt", b"A man rides. " * 400, 413, "characters"),
        ("slides.key", b"PK\x03\x04", 400, "supported:"),
        ("binary.txt", b"\x00\x01\x02 not text", 400, "binary.txt"),
        ("latin1.txt", "Straße".encode("latin-1"), 400, "UTF-8"),
    ],
)
def test_bad_files_are_one_4xx_line_and_the_server_goes_on(name, data, status, words) -> None:
    with TestClient(app_of(Limits(max_file_chars=2000, max_file_bytes=200_000))) as client:
        answer = upload(client, name, data)
        assert answer.status_code == status, answer.text
        message = answer.json()["error"]
        assert list(answer.json()) == ["error"] and "\n" not in message and words in message
        assert message.startswith("Invalid request: ")
        assert download(client, upload(client, "ok.txt", b"A dog.")).content == b"A DOG."


def test_bad_requests_for_files_are_one_line_each() -> None:
    limits = Limits(max_file_bytes=1000)
    with TestClient(app_of(limits)) as client:
        cases = [
            (client.post("/translate_file", data=PAIR), 400, "multipart/form-data"),
            (client.post("/translate_file", data=PAIR, files={"text": ("a.txt", b"x")}), 400, "missing file"),
            (client.post("/translate_file", json={**PAIR, "file": "x"}), 400, "multipart/form-data"),
            (upload(client, "a.txt", b"A dog.", target="xx"), 400, "not supported"),
            (
                client.post("/translate_file", data={"source": "en"}, files={"file": ("a.txt", b"x")}),
                400,
                "target",
            ),
            (upload(client, "big.txt", b"x" * 70_000), 413, "larger than the limit"),  # the body
            (upload(client, "a.txt", b"x" * 1500), 413, "bytes, more than the 1000"),  # the file
        ]
        for answer, status, words in cases:
            assert answer.status_code == status and words in answer.json()["error"], answer.text


def test_downloads_are_found_by_their_token_only_and_expire(monkeypatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(downloads.time, "monotonic", lambda: now[0])
    with TestClient(app_of(Limits(download_s=60))) as client:
        url = urlsplit(upload(client, "a.txt", b"A dog.").json()["translatedFileUrl"]).path
        token = url.rsplit("/", 1)[1].split(".")[0]
        assert len(token) == 32
        assert client.get(url).content == b"A DOG."
        assert client.get(url).content == b"A DOG."  # as often as asked, until it expires
        for other in ("/download_file/" + "0" * 32 + ".a.txt", "/download_file/..%2F..%2Fetc%2Fpasswd"):
            assert client.get(other).status_code == 404
        now[0] += 61
        gone = client.get(url)
        assert gone.status_code == 404 and "for 60 seconds after" in gone.json()["error"]
        folder = client.app.state.downloads.folder
        assert list(folder.iterdir()) == []  # swept
    assert not folder.exists()  # removed at shutdown


def test_local_downloads_keep_the_newest_within_their_count_and_bytes() -> None:
    kept = LocalDownloads(ttl_s=60, max_files=2, max_bytes=10)
    stored = [kept.put(downloads.Stored(f"{k}.txt", "text/plain", b"abcd")) for k in range(3)]
    assert kept.get(stored[0]) is None and kept.get(stored[2]).name == "2.txt"
    big = kept.put(downloads.Stored("big.txt", "text/plain", b"x" * 9))
    assert kept.get(stored[1]) is None and kept.get(stored[2]) is None and kept.get(big).data == b"x" * 9
    kept.close()


def test_files_can_be_turned_off() -> None:
    with TestClient(app_of(Limits(files=False))) as client:
        refused = upload(client, "a.txt", b"A dog.")
        assert refused.status_code == 403
        assert refused.json() == {"error": "Files translation are disabled on this server."}
        settings = client.get("/frontend/settings").json()
        assert settings["filesTranslation"] is False and settings["supportedFilesFormat"] == []


def test_file_requests_need_a_key_and_count_against_the_limits(tmp_path, capsys) -> None:
    from aiayn.cli import main
    from aiayn.serve.keys import open_keys

    assert main(["keys", "add", "--keys-db", str(tmp_path / "k.db"), "--req-limit", "2"]) == 0
    key = capsys.readouterr().out.strip()
    # --char-limit bounds a text request's characters, not a file's (--max-file-chars does)
    access = Access(Quotas(req_limit=100, char_limit=3), open_keys(str(tmp_path / "k.db"), None))
    with TestClient(app_of(access=access)) as client:
        assert upload(client, "a.txt", b"A dog.").status_code == 400  # no key
        assert upload(client, "a.txt", b"A dog.", api_key="aiayn-wrong").status_code == 403
        answers = [upload(client, "a.txt", b"A dog.", api_key=key) for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 429]
        assert 1 <= int(answers[2].headers["retry-after"]) <= 60


def test_files_are_counted_in_the_metrics() -> None:
    pytest.importorskip("prometheus_client")
    from aiayn.serve.metrics import Metrics
    from test_serve_metrics import by, scrape

    with TestClient(app_of(metrics=Metrics())) as client:
        download(client, upload(client, "a.docx", word_file()))
        samples = scrape(client)
    assert by(samples, "aiayn_translated_sentences_total", "model") == {"model": 2.0}
    assert by(samples, "aiayn_translated_characters_total", "model") == {"model": 37.0}
    counted = by(samples, "aiayn_http_requests_total", "route", "status")
    assert counted[("/translate_file", "200")] == 1 and counted[("/download_file/{filename}", "200")] == 1


def test_replicas_sharing_a_redis_download_each_others_files(tmp_path) -> None:
    pytest.importorskip("redis")
    from aiayn.serve.keys import Shared
    from test_quotas_redis import RedisServer

    server = RedisServer(tmp_path)
    server.start()
    warnings: list[list[str]] = [[], []]
    try:
        shared = [Shared(server.url, warn=warnings[k].append) for k in range(2)]
        for s in shared:
            s.retry_s = 0.2
        apps = [app_of(downloads=SharedDownloads(s, LocalDownloads())) for s in shared]
        with TestClient(apps[0]) as a, TestClient(apps[1]) as b:
            answer = upload(a, "a.txt", b"A dog.")
            assert download(b, answer).content == b"A DOG."  # translated by a, downloaded from b
            server.stop()  # Redis away: a keeps the file itself, and says so once
            away = upload(a, "b.txt", b"Two cats.")
            assert download(a, away).content == b"TWO CATS."
            assert b.get(urlsplit(away.json()["translatedFileUrl"]).path).status_code == 404
            assert [len(w) for w in warnings] == [1, 1] and "translated files" in warnings[0][0]  # once each
    finally:
        server.stop()
