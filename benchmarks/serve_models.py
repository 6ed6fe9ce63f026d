"""Many models in one ``aiayn serve``: pivots against references, memory under a cap, cold starts,
mixed-pair throughput, and real LibreTranslate clients through one server.

    python benchmarks/serve_models.py --de-en runs/de_en/avg5 --en-fr runs/en_fr/avg5 \\
        --en-cs runs/en_cs/avg5 [--de-fr runs/de_fr/avg5] --data-dir $AIAYN_DATA/multi30k --threads 1

Parts (``--parts``, all by default), each against real ``aiayn serve`` processes on loopback:

* **pivot**: one server of de->en, en->fr and en->cs translates test2016 de->fr and de->cs through
  English (``POST /v1/translate``, 32 lines a request, beam 4); sacreBLEU against the references,
  beside each leg alone (de->en on test2016.de, en->x on the reference English: the pivot's
  ceiling) and a direct model where one is given (``--de-fr``, served alone). The pivoted output is
  compared line by line with the two models run by hand one after the other (``Translator`` on the
  lines, then on its outputs: what ``aiayn translate`` twice gives).
* **memory**: 1, 3 and 6 models (the three, then the same three again under other pairs: each
  loaded on its own) with ``--max-loaded-models`` 1, 2 and none, under a bounded mixed-pair load
  (``--requests`` requests of 8 lines from 2 clients, round robin over the served pairs). The
  server's RSS: at start, its peak (VmHWM), and settled (2 s after the load).
* **cycles**: two models under ``--max-loaded-models 1`` asked in turn (each request a load and an
  unload): the settled RSS after 2, 10, 20 and 40 loads.
* **cold**: the first request to each model (its load included) against the same request warm.
* **throughput**: sentences/s of ``--requests`` requests of 16 lines from 4 clients: one model alone
  (de->en), against three models with every request another pair (no cap), in interleaved rounds.
* **clients**: ``libretranslatepy`` (de->fr, a pivot; and ``auto``) and a Mastodon-shaped JSON
  request (a list of HTML texts, ``source: auto``, ``api_key: null``) through one server.

Writes ``benchmarks/results/serve_models.json`` (``--results``) with the command, versions, machine.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import sacrebleu

from common import command, machine, versions

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
START_TIMEOUT_S = 180.0


class Server:
    """``aiayn serve`` with ``models`` (``--checkpoint`` values) and ``flags`` on a free port."""

    def __init__(self, models: list[str], *flags: str, threads: int = 1, log: Path | None = None) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "aiayn", "serve", "--port", str(self.port), "--device", "cpu"]
        argv += ["--threads", str(threads), *flags]
        for model in models:
            argv += ["--checkpoint", model]
        self.log = open(log or os.devnull, "w")
        self.process = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        self.client = httpx.Client(timeout=600.0)
        self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"serve_models: the server exited ({self.process.returncode})")
            try:
                if self.client.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        sys.exit("serve_models: the server did not start")

    def translate(self, lines: list[str], source: str, target: str, **options) -> dict:
        body = {"text": lines, "source": source, "target": target, "beam": 4, **options}
        answer = self.client.post(f"{self.url}/v1/translate", json=body)
        if answer.status_code != 200:
            sys.exit(f"serve_models: {answer.status_code} {answer.text}")
        return answer.json()

    def rss(self, field: str = "VmRSS") -> int:
        """The process's ``VmRSS`` (or ``VmHWM``, its peak) in bytes."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def _port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def read(data: Path, split: str, lang: str, limit: int | None) -> list[str]:
    lines = (data / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
    return lines[:limit] if limit else lines


def chunks(lines: list[str], size: int) -> list[list[str]]:
    return [lines[i : i + size] for i in range(0, len(lines), size)]


def served_translation(server: Server, lines: list[str], source: str, target: str) -> tuple[list[str], list]:
    out, route = [], None
    for chunk in chunks(lines, 32):
        answer = server.translate(chunk, source, target)
        out += [t["text"] for t in answer["translations"]]
        route = answer["route"]
    return out, route


def bleu(hypotheses: list[str], references: list[str]) -> float:
    return round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2)


# --- pivot ------------------------------------------------------------------------------------------


def by_hand(checkpoint: str, lines: list[str]) -> list[str]:
    from aiayn.decode import Translator
    from aiayn.loading import load

    model, tokenizer, _ = load(checkpoint)
    return [t.text for t in Translator(model, tokenizer, beam=4, alpha=0.6).translate(lines)]


def part_pivot(args) -> dict:
    data, limit = Path(args.data_dir), args.limit
    german, english = read(data, "test2016", "de", limit), read(data, "test2016", "en", limit)
    server = Server(
        [f"de-en={args.de_en}", f"en-fr={args.en_fr}", f"en-cs={args.en_cs}"], threads=args.threads
    )
    try:
        bridge = served_translation(server, german, "de", "en")[0]
        figures = {"de-en": {"bleu": bleu(bridge, english)}}
        for target, checkpoint in (("fr", args.en_fr), ("cs", args.en_cs)):
            references = read(data, "test2016", target, limit)
            pivoted, route = served_translation(server, german, "de", target)
            leg = served_translation(server, english, "en", target)[0]
            hand = by_hand(checkpoint, by_hand(args.de_en, german))
            equal = sum(a == b for a, b in zip(pivoted, hand))
            figures[f"de-{target}"] = {
                "pivot_bleu": bleu(pivoted, references),
                "route": [step["model"] for step in route],
                f"en-{target}_on_reference_english_bleu": bleu(leg, references),
                "equal_to_by_hand": f"{equal}/{len(hand)}",
                "unequal_lines": [i for i, (a, b) in enumerate(zip(pivoted, hand)) if a != b][:20],
            }
            found = figures[f"de-{target}"]["pivot_bleu"]
            print(f"de->{target} via en: BLEU {found}, by hand equal {equal}/{len(hand)}")
    finally:
        server.stop()
    if args.de_fr:
        direct = Server([f"de-fr={args.de_fr}"], threads=args.threads)
        try:
            output = served_translation(direct, german, "de", "fr")[0]
            figures["de-fr"]["direct_bleu"] = bleu(output, read(data, "test2016", "fr", limit))
        finally:
            direct.stop()
    return figures


# --- memory and cold starts -------------------------------------------------------------------------

COPIES = {"de-en": "da-sv", "en-fr": "nl-it", "en-cs": "pl-ro"}  # the three again, under other pairs


def model_set(args, count: int) -> list[tuple[str, str]]:
    """(pair, --checkpoint value) of the first ``count`` of six models."""
    three = [("de-en", args.de_en), ("en-fr", args.en_fr), ("en-cs", args.en_cs)]
    six = three + [(COPIES[pair], path) for pair, path in three]
    return six[:count]


def mixed_load(
    server: Server, pairs: list[str], texts: dict, requests: int, size: int, clients: int
) -> float:
    """``requests`` requests of ``size`` lines, round robin over ``pairs``, from ``clients`` threads;
    the sentences per second."""
    jobs = [(pairs[k % len(pairs)], k) for k in range(requests)]

    def one(job):
        pair, k = job
        source, target = pair.split("-")
        lines = texts[source][(k * size) % 900 : (k * size) % 900 + size]
        server.translate(lines, source, target)
        return len(lines)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        done = sum(pool.map(one, jobs))
    return done / (time.perf_counter() - start)


def texts_by_language(args) -> dict:
    data = Path(args.data_dir)
    de, en = read(data, "test2016", "de", None), read(data, "test2016", "en", None)
    return {"de": de, "en": en, "da": de, "nl": en, "pl": en}


def part_memory(args) -> list[dict]:
    texts, rows = texts_by_language(args), []
    for count in (1, 3, 6):
        for cap in ("1", "2", None):
            models = model_set(args, count)
            flags = ["--max-loaded-models", cap] if cap else []
            server = Server([f"{pair}={path}" for pair, path in models], *flags, threads=args.threads)
            try:
                start = server.rss()
                rate = mixed_load(server, [p for p, _ in models], texts, args.requests, 8, 2)
                time.sleep(2.0)
                listed = server.client.get(f"{server.url}/v1/models").json()
                row = {
                    "models": count,
                    "max_loaded_models": cap or "none",
                    "rss_start_mib": round(start / 2**20, 1),
                    "rss_peak_mib": round(server.rss("VmHWM") / 2**20, 1),
                    "rss_settled_mib": round(server.rss() / 2**20, 1),
                    "loaded_at_end": len(listed["loaded"]),
                    "loads": sum(m["loads"] for m in listed["models"]),
                    "sentences_per_s": round(rate, 1),
                }
            finally:
                server.stop()
            print(row)
            rows.append(row)
    return rows


def part_cycles(args) -> list[dict]:
    """Two models under ``--max-loaded-models 1``, asked in turn: each request loads one and unloads
    the other. The settled RSS after 2, 10, 20 and 40 loads: memory given back, or kept?"""
    texts, rows = texts_by_language(args), []
    models = model_set(args, 2)
    server = Server(
        [f"{pair}={path}" for pair, path in models], "--max-loaded-models", "1", threads=args.threads
    )
    try:
        for k in range(40):
            source, target = models[k % 2][0].split("-")
            server.translate(texts[source][:4], source, target)
            if k + 1 in (2, 10, 20, 40):
                time.sleep(1.0)
                rows.append({"loads": k + 1, "rss_settled_mib": round(server.rss() / 2**20, 1)})
                print(rows[-1])
    finally:
        server.stop()
    return rows


def part_cold(args) -> list[dict]:
    texts, rows = texts_by_language(args), []
    models = model_set(args, 3)
    server = Server([f"{pair}={path}" for pair, path in models], threads=args.threads)
    try:
        for pair, _ in models:
            source, target = pair.split("-")
            lines = texts[source][:8]
            start = time.perf_counter()
            server.translate(lines, source, target)
            cold = time.perf_counter() - start
            warm = []
            for _ in range(5):
                start = time.perf_counter()
                server.translate(lines, source, target)
                warm.append(time.perf_counter() - start)
            rows.append(
                {"pair": pair, "cold_s": round(cold, 3), "warm_median_s": round(statistics.median(warm), 3)}
            )
            print(rows[-1])
    finally:
        server.stop()
    return rows


def part_throughput(args) -> dict:
    texts, alone, mixed = texts_by_language(args), [], []
    for _ in range(args.rounds):
        for kind in ("alone", "mixed"):
            models = model_set(args, 1 if kind == "alone" else 3)
            server = Server([f"{pair}={path}" for pair, path in models], threads=args.threads)
            try:
                pairs = [p for p, _ in models]
                mixed_load(server, pairs, texts, len(pairs), 16, 1)  # every model loaded first
                rate = mixed_load(server, pairs, texts, args.requests, 16, 4)
            finally:
                server.stop()
            (alone if kind == "alone" else mixed).append(rate)
            print(kind, round(rate, 1))
    a, m = statistics.median(alone), statistics.median(mixed)
    return {"alone_sentences_per_s": alone, "mixed_sentences_per_s": mixed, "mixed_vs_alone": round(m / a, 3)}


# --- real clients -----------------------------------------------------------------------------------


def part_clients(args) -> dict:
    import libretranslatepy

    german = read(Path(args.data_dir), "test2016", "de", 3)
    server = Server(
        [f"de-en={args.de_en}", f"en-fr={args.en_fr}", f"en-cs={args.en_cs}"], threads=args.threads
    )
    try:
        lt = libretranslatepy.LibreTranslateAPI(server.url)
        pivot = lt.translate(german[0], "de", "fr", timeout=120)
        auto = lt.translate(german[1], "auto", "cs", timeout=120)
        languages = lt.languages(timeout=60)
        body = {"q": [f"<p>{german[0]}</p>", f"<p>{german[2]}</p>"], "source": "auto", "target": "fr",
                "format": "html", "api_key": None}  # fmt: skip
        mastodon = server.client.post(f"{server.url}/translate", json=body).json()
    finally:
        server.stop()
    return {
        "libretranslatepy_de_fr": {"source": german[0], "translation": pivot},
        "libretranslatepy_auto_cs": {"source": german[1], "translation": auto},
        "languages": languages,
        "mastodon_auto_fr": {"request": body, "answer": mastodon},
    }


PARTS = {
    "pivot": part_pivot,
    "memory": part_memory,
    "cycles": part_cycles,
    "cold": part_cold,
    "throughput": part_throughput,
    "clients": part_clients,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for name in ("de-en", "en-fr", "en-cs"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--de-fr", help="a direct de->fr model, to compare the pivot with")
    parser.add_argument("--data-dir", default=os.environ.get("AIAYN_DATA", "../shared/data") + "/multi30k")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, help="test2016's first lines only (pivot)")
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "serve_models.json"))
    args = parser.parse_args()
    figures = {part: PARTS[part](args) for part in args.parts}
    record = {
        "command": command(),
        "versions": versions(),
        "machine": machine(),
        "settings": vars(args),
        **figures,
    }
    Path(args.results).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
