"""A soak of two ``aiayn serve`` replicas sharing one Redis: mixed good and bad requests over every
route (files included), quotas across the replicas, RSS over time, and Redis going away.

    python benchmarks/serve_soak.py --checkpoint runs/de_en/avg5 --seconds 120 --threads 1

What it does, against real processes on loopback:

1. starts Debian's ``redis-server`` on a free port (append-only persistence, as a deployment
   needs: a restart keeps the keys), makes two API keys with
   ``aiayn keys add --shared-storage`` (one for the load, one limited to ``--quota`` requests a
   minute), and starts two replicas with ``--shared-storage``, ``--api-keys``, ``--metrics`` (behind
   a token), ``--req-limit`` for unkeyed clients and a small ``--max-file-bytes``;
2. **quota**: the limited key sends ``--quota`` + 10 requests, 4 at once over both replicas:
   exactly ``--quota`` must pass, every other one a 429 with ``Retry-After``;
3. **soak**: ``--clients`` threads for ``--seconds`` send requests drawn from a fixed mix of good
   ones (aiayn's routes, LibreTranslate's, a file of each format and its download from the other
   replica, the metrics) and bad ones (a wrong key, malformed JSON, an unknown pair, a body over the
   limit, a PDF named .docx, a zip bomb, a truncated docx, an unknown download), each answer checked
   against the status it must have; every 5xx is counted. Each replica's RSS every 2 s;
4. **redis away**: Redis is stopped; both replicas must go on answering (on their own limits) and
   say so once on stderr; Redis is started again and shared once more.

Writes ``benchmarks/results/serve_soak.json`` (``--results``) with the command, versions, machine.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import io
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import httpx

from common import command, machine, versions
from serve_models import ROOT, Server, _port

GERMAN = [
    "Ein Mann fährt mit dem Fahrrad durch die Stadt.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau liest ein Buch in einem Café.",
    "Kinder laufen über eine grüne Wiese.",
]
MAX_FILE_BYTES = 2_000_000
METRICS_TOKEN = "soak-metrics-token"


# --- documents -----------------------------------------------------------------------------------


def docx_file() -> bytes:
    import docx

    document = docx.Document()
    paragraph = document.add_paragraph("Ein Mann fährt mit dem ")
    paragraph.add_run("Fahrrad").bold = True
    paragraph.add_run(" durch die Stadt.")
    document.add_paragraph(GERMAN[1])
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = GERMAN[2], GERMAN[3]
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def pptx_file() -> bytes:
    import pptx

    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = GERMAN[0]
    slide.placeholders[1].text = GERMAN[1]
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def odt_file() -> bytes:
    from odf.opendocument import OpenDocumentText
    from odf.text import P

    document = OpenDocumentText()
    for line in GERMAN[:2]:
        document.text.addElement(P(text=line))
    out = io.BytesIO()
    document.write(out)
    return out.getvalue()


def epub_file() -> bytes:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("soak")
    book.set_title("Soak")
    book.set_language("de")
    chapter = epub.EpubHtml(title="Eins", file_name="eins.xhtml", lang="de")
    chapter.content = "<html><body><h1>Eins</h1><p>" + " ".join(GERMAN) + "</p></body></html>"
    book.add_item(chapter)
    book.toc = [chapter]
    book.spine = ["nav", chapter]
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    path = Path(tempfile.mkdtemp()) / "soak.epub"
    epub.write_epub(str(path), book)
    data = path.read_bytes()
    shutil.rmtree(path.parent)
    return data


def srt_file() -> bytes:
    cues = [f"{k + 1}\n00:00:0{k},000 --> 00:00:0{k},900\n{line}\n" for k, line in enumerate(GERMAN)]
    return "\n".join(cues).encode()


def zip_bomb() -> bytes:
    """A .docx whose one member unpacks to 300 MB of zeros (about 300 KB packed)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("word/document.xml", "w", force_zip64=True) as member:
            block = b"\0" * (1 << 20)
            for _ in range(300):
                member.write(block)
    return out.getvalue()


def files() -> dict[str, bytes]:
    good = {
        "a.txt": "\n\n".join(GERMAN).encode(),
        "a.html": f"<p>{GERMAN[0]} <b>{GERMAN[1]}</b></p>".encode(),
        "a.md": f"# Titel\n\n{GERMAN[0]} *{GERMAN[1]}*\n".encode(),
        "a.docx": docx_file(),
        "a.pptx": pptx_file(),
        "a.odt": odt_file(),
        "a.epub": epub_file(),
        "a.srt": srt_file(),
    }
    return good


# --- the servers ---------------------------------------------------------------------------------


class Redis:
    """Debian's redis-server on a free port, its data in a temporary folder."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            sys.exit("serve_soak: redis-server is not installed (apt-get install redis-server)")
        self.port, self.folder = _port(), tempfile.mkdtemp(prefix="soak-redis-")
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.argv = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",  # persisted, synced each write, as a deployment's must be: a Redis
            "yes",  # restarted without its data would have lost the keys
            "--appendfsync",
            "always",
        ]
        self.argv += ["--dir", self.folder]
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return
            except redis.RedisError:
                time.sleep(0.1)
        sys.exit("serve_soak: redis-server did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=20)


def add_key(storage: str, *flags: str) -> str:
    argv = [sys.executable, "-m", "aiayn", "keys", "add", "--shared-storage", storage, *flags]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=True)
    return done.stdout.strip().splitlines()[-1]


def rss(server: Server) -> float:
    return round(server.rss() / 2**20, 1)


# --- the mix ---------------------------------------------------------------------------------------


class Mix:
    """The requests of the soak: each a name, how to send it, and the statuses it may get."""

    def __init__(self, servers: list[Server], key: str, documents: dict[str, bytes]) -> None:
        self.servers, self.key, self.documents = servers, key, documents
        self.bomb, self.docx = zip_bomb(), documents["a.docx"]
        self.auth = {"Authorization": f"Bearer {key}"}
        self.requests = [
            ("v1/translate", 4, self.v1_translate, {200}),
            ("v1/translate html", 2, self.v1_html, {200}),
            ("v1/attention", 1, self.v1_attention, {200}),
            ("v1/choices", 1, self.v1_choices, {200}),
            ("translate (form)", 3, self.lt_form, {200}),
            ("translate (json list)", 3, self.lt_json, {200}),
            ("detect", 1, self.detect, {200}),
            ("languages", 1, lambda c, s: c.get(f"{s.url}/languages"), {200}),
            ("v1/models", 1, lambda c, s: c.get(f"{s.url}/v1/models", headers=self.auth), {200}),
            ("metrics", 1, self.metrics, {200}),
            ("translate_file + download", 6, self.file_round_trip, {200}),
            ("wrong key", 1, self.wrong_key, {403}),
            ("no key", 1, self.no_key, {400}),
            ("malformed json", 1, self.malformed, {422}),
            ("unknown pair", 1, self.unknown_pair, {400}),
            ("body over the limit", 1, self.too_big, {413}),
            ("pdf named .docx", 1, self.pdf_as_docx, {400}),
            ("zip bomb", 1, self.zip_bomb, {400, 413}),
            ("truncated docx", 1, self.truncated, {400}),
            ("file over the limit", 1, self.file_too_big, {413}),
            ("unknown download", 1, self.unknown_download, {404}),
            ("metrics without token", 1, lambda c, s: c.get(f"{s.url}/metrics"), {401}),
        ]
        self.names = [r[0] for r in self.requests]
        self.weights = [r[1] for r in self.requests]

    def pick(self, rng: random.Random):
        return rng.choices(self.requests, self.weights)[0]

    def v1_translate(self, client, server):
        body = {"text": GERMAN[:2], "source": "de", "target": "en", "beam": 2}
        return client.post(f"{server.url}/v1/translate", json=body, headers=self.auth)

    def v1_html(self, client, server):
        body = {
            "text": [f"<p>{GERMAN[0]} <b>{GERMAN[1]}</b></p>"],
            "format": "html",
            "source": "de",
            "target": "en",
        }
        return client.post(f"{server.url}/v1/translate", json=body, headers=self.auth)

    def v1_attention(self, client, server):
        body = {"text": GERMAN[3], "source": "de", "target": "en"}
        return client.post(f"{server.url}/v1/attention", json=body, headers=self.auth)

    def v1_choices(self, client, server):
        body = {"text": GERMAN[2], "prefix": "A woman", "source": "de", "target": "en"}
        return client.post(f"{server.url}/v1/choices", json=body, headers=self.auth)

    def lt_form(self, client, server):
        form = {"q": GERMAN[0], "source": "de", "target": "en", "api_key": self.key}
        return client.post(f"{server.url}/translate", data=form)

    def lt_json(self, client, server):
        body = {"q": GERMAN[:3], "source": "auto", "target": "en", "api_key": self.key}
        return client.post(f"{server.url}/translate", json=body)

    def detect(self, client, server):
        return client.post(f"{server.url}/detect", data={"q": GERMAN[1], "api_key": self.key})

    def metrics(self, client, server):
        return client.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})

    def upload(self, client, server, name: str, data: bytes, **fields):
        form = {"source": "de", "target": "en", "api_key": self.key, **fields}
        return client.post(f"{server.url}/translate_file", data=form, files={"file": (name, data)})

    def file_round_trip(self, client, server):
        """A file of a random format translated by one replica, downloaded from the other."""
        name = random.choice(sorted(self.documents))
        answer = self.upload(client, server, name, self.documents[name])
        if answer.status_code != 200:
            return answer
        url = answer.json()["translatedFileUrl"]
        other = self.servers[1] if server is self.servers[0] else self.servers[0]
        download = client.get(url.replace(server.url, other.url))
        if download.status_code == 200 and not download.content:
            return httpx.Response(599, text="an empty download")
        return download

    def wrong_key(self, client, server):
        return client.post(
            f"{server.url}/translate", data={"q": "Hallo", "source": "de", "target": "en", "api_key": "nope"}
        )

    def no_key(self, client, server):
        return client.post(f"{server.url}/translate", data={"q": "Hallo", "source": "de", "target": "en"})

    def malformed(self, client, server):
        headers = {**self.auth, "Content-Type": "application/json"}
        return client.post(f"{server.url}/v1/translate", content=b'{"text": ["Hallo"', headers=headers)

    def unknown_pair(self, client, server):
        body = {"text": ["Hallo"], "source": "de", "target": "xx"}
        return client.post(f"{server.url}/v1/translate", json=body, headers=self.auth)

    def too_big(self, client, server):
        body = {"text": ["Hallo " * 400_000], "source": "de", "target": "en"}
        return client.post(f"{server.url}/v1/translate", json=body, headers=self.auth)

    def pdf_as_docx(self, client, server):
        return self.upload(client, server, "report.docx", b"%PDF-1.7\n" + bytes(2000))

    def zip_bomb(self, client, server):
        return self.upload(client, server, "bomb.docx", self.bomb)

    def truncated(self, client, server):
        return self.upload(client, server, "cut.docx", self.docx[: len(self.docx) // 2])

    def file_too_big(self, client, server):
        return self.upload(client, server, "big.txt", b"Hallo Welt. " * (MAX_FILE_BYTES // 12 + 10))

    def unknown_download(self, client, server):
        return client.get(f"{server.url}/download_file/{'0' * 32}.a.docx")


# --- the parts ---------------------------------------------------------------------------------------


def quota(servers: list[Server], key: str, limit: int) -> dict:
    """``limit`` + 10 requests of a key limited to ``limit`` a minute, 4 at once over both replicas
    (its window starts at its first request)."""
    started = time.monotonic()

    def send(k: int) -> httpx.Response:
        form = {"q": GERMAN[k % 4], "source": "de", "target": "en", "api_key": key}
        with httpx.Client(timeout=120) as client:
            return client.post(f"{servers[k % 2].url}/translate", data=form)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # 4 at once, 2 on each replica
        answers = list(pool.map(send, range(limit + 10)))
    statuses = [a.status_code for a in answers]
    retry_after = [a.headers.get("retry-after") for a in answers if a.status_code == 429]
    passed = statuses.count(200)
    return {
        "limit_per_minute": limit,
        "sent": len(statuses),
        "passed": passed,
        "refused_429": statuses.count(429),
        "other": len(statuses) - passed - statuses.count(429),
        "exact": passed == limit,
        "retry_after_headers": sorted(set(retry_after)),
        "seconds": round(time.monotonic() - started, 1),
    }


def soak(servers: list[Server], mix: Mix, seconds: float, clients: int) -> dict:
    deadline = time.monotonic() + seconds
    outcomes: dict[str, collections.Counter] = {name: collections.Counter() for name in mix.names}
    wrong: list[str] = []
    samples: list[dict] = []
    lock = threading.Lock()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=300) as http:
            while time.monotonic() < deadline:
                name, _, send, allowed = mix.pick(rng)
                server = servers[rng.randrange(2)]
                try:
                    status = send(http, server).status_code
                except httpx.HTTPError as err:
                    status = f"{type(err).__name__}"
                with lock:
                    outcomes[name][status] += 1
                    if status not in allowed and len(wrong) < 50:
                        wrong.append(f"{name}: {status}")

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        samples.append({"t": round(time.monotonic() - started, 1), "rss_mib": [rss(s) for s in servers]})
        time.sleep(2)
    for thread in threads:
        thread.join()
    total = sum(sum(c.values()) for c in outcomes.values())
    fives = sum(
        n for c in outcomes.values() for status, n in c.items() if isinstance(status, int) and status >= 500
    )
    third = max(1, len(samples) // 3)
    settled = [
        {
            "middle_third_median_mib": statistics.median(s["rss_mib"][i] for s in samples[third : 2 * third]),
            "last_third_median_mib": statistics.median(s["rss_mib"][i] for s in samples[-third:]),
            "peak_mib": max(s["rss_mib"][i] for s in samples),
        }
        for i in range(len(servers))
    ]
    return {
        "seconds": seconds,
        "clients": clients,
        "requests": total,
        "responses_5xx": fives,
        "unexpected": wrong,
        "by_request": {name: dict(c) for name, c in outcomes.items()},
        "rss": settled,
        "rss_samples": samples,
    }


def redis_away(servers: list[Server], redis: Redis, mix: Mix) -> dict:
    """Redis stopped: both replicas answer; started again: shared again."""
    redis.stop()
    answers = []
    with httpx.Client(timeout=120) as client:
        for k in range(6):
            answers.append(mix.lt_form(client, servers[k % 2]).status_code)
        redis.start()
        time.sleep(6)  # the replicas try Redis again at most every few seconds
        again = [mix.lt_form(client, servers[k % 2]).status_code for k in range(4)]
    logs = [Path(s.log.name).read_text(errors="replace") for s in servers]
    return {
        "statuses_without_redis": answers,
        "statuses_with_redis_back": again,
        "warnings": [[line for line in log.splitlines() if "redis" in line.lower()] for log in logs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True, help="a de->en model")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--quota", type=int, default=30, help="the limited key's requests a minute")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "serve_soak.json"))
    args = parser.parse_args()
    redis = Redis()
    logs = Path(tempfile.mkdtemp(prefix="soak-logs-"))
    load_key = add_key(redis.url, "--req-limit", "1000000")
    limited_key = add_key(redis.url, "--req-limit", str(args.quota))
    flags = [
        "--shared-storage", redis.url, "--api-keys", "--req-limit", "5",
        "--metrics", "--metrics-auth-token", METRICS_TOKEN, "--max-file-bytes", str(MAX_FILE_BYTES),
    ]  # fmt: skip
    servers = [
        Server([args.checkpoint], *flags, threads=args.threads, log=logs / f"replica{k}.log")
        for k in range(2)
    ]
    try:
        mix = Mix(servers, load_key, files())
        record = {
            "command": command(),
            "versions": versions(),
            "machine": machine(),
            "settings": vars(args),
            "rss_at_start_mib": [rss(s) for s in servers],
            "quota": quota(servers, limited_key, args.quota),
            "soak": soak(servers, mix, args.seconds, args.clients),
            "redis_away": redis_away(servers, redis, mix),
        }
    finally:
        for server in servers:
            server.stop()
        redis.stop()
    Path(args.results).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    summary = {k: record["soak"][k] for k in ("requests", "responses_5xx", "unexpected", "rss")}
    print(json.dumps({"quota": record["quota"], **summary}, indent=2))
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
