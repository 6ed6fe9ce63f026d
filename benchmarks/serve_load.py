"""Load on `aiayn serve`: concurrent clients, batching across requests on and off, against offline.

    .venv/bin/python benchmarks/serve_load.py --checkpoint runs/de_en            # test2016, 1 16 128 clients
    .venv/bin/python benchmarks/serve_load.py --checkpoint /tmp/serve_de_en --limit 200 --clients 1 16 \\
        --rounds 1 --results /tmp/serve_load.json                                  # a smoke run

Three systems translate the same Multi30k sentences (``--split``, source language from the
checkpoint's run config, ``--limit`` first ones) with the same search (``--beam``, ``--alpha``):

* **batched**: ``python -m aiayn serve --checkpoint RUN --host 127.0.0.1 --port FREE`` (its defaults:
  requests that arrive together are decoded together, under a token budget and a short wait);
* **unbatched**: the same server with ``--no-batching`` (one request at a time);
* **offline**: what ``aiayn translate --input FILE`` runs (``load_backend`` + ``backend.translate``,
  its default 4,096-token batches, sentences sorted by length), in a child process with the same
  threads, timed without the process start and model load (the servers' are not timed either).

``--engine ctranslate2`` runs all three on aiayn's CTranslate2 engine (``aiayn serve --engine``).

Clients: ``C`` asyncio tasks with one ``aiohttp.ClientSession`` (at most C connections) on loopback take
the sentences in order from a shared queue and send each as its own request
(``POST /v1/translate {"text": [sentence], "beam": B, "alpha": A}``) until all are done or
``--max-seconds`` passed (a measurement cut short says so: ``complete: false``). Per request: its
latency, from sending to the whole answer. Only one system runs at a time; a server idles meanwhile.

Rounds: ``--rounds`` interleaved rounds; in each, every client count runs every server (the order
rotating each round) and offline runs once. Figures are medians over rounds: sentences/s and p50 /
p99 latency (p99 = the 99th percentile of that round's requests, nearest rank). Ratios: batched /
unbatched and batched / offline sentences/s, medians of the per-round ratios, against the targets
of the issue: >= 4x unbatched at 16 clients, >= 0.8x offline at 128 clients.

Writes ``benchmarks/results/serve_load.json`` (``--results``): command, versions, machine, settings,
the per-round measurements, figures and targets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import httpx

from common import command, machine, versions

ROOT = Path(__file__).resolve().parents[1]
SERVERS = ("batched", "unbatched")
TARGETS = {"batched_vs_unbatched": (16, 4.0), "batched_vs_offline": (128, 0.8)}
START_TIMEOUT_S = 180.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkpoint", default=str(ROOT / "runs" / "de_en"), help="checkpoint or run directory"
    )
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--split", default="test2016")
    parser.add_argument("--src", help="source language (default: the checkpoint's run config)")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (default: all)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 128], help="concurrent clients")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--threads", type=int, default=0, help="torch threads, all systems (default: cores)")
    parser.add_argument(
        "--max-seconds", type=float, default=600.0, help="stop sending after this long, per measurement"
    )
    parser.add_argument("--request-timeout", type=float, default=300.0, help="seconds, per request")
    parser.add_argument(
        "--engine",
        default="torch",
        help="translation engine of all systems (aiayn's --engine; default torch)",
    )
    parser.add_argument(
        "--server-args",
        default="",
        help="more `aiayn serve` flags for both servers, e.g. '--engine ctranslate2'",
    )
    parser.add_argument(
        "--device",
        default="auto",
        help="device of all systems (aiayn's --device; default auto: the GPU when there is one)",
    )
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "serve_load.json"))
    parser.add_argument("--offline-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.offline_worker:
        return offline_worker(args)
    threads = args.threads or os.cpu_count() or 1
    lines = read_sources(args)
    log(
        f"{len(lines)} sentences of {args.split}, clients {args.clients}, beam {args.beam}, {threads} threads"
    )
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve_load-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "input.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    servers = {}
    try:
        for name in SERVERS:
            servers[name] = Server(
                args, threads, no_batching=name == "unbatched", log_file=workdir / f"{name}.log"
            )
        runs = measure(args, servers, lines, threads, workdir / "input.txt")
    finally:
        for server in servers.values():
            server.stop()
    figures = summarise(runs, args.clients)
    results = {
        "benchmark": "serve_load",
        "command": command(),
        "versions": versions(aiohttp=aiohttp.__version__),
        "machine": machine(),
        "settings": {
            "checkpoint": str(Path(args.checkpoint).resolve()),
            "split": args.split,
            "sentences": len(lines),
            "clients": args.clients,
            "rounds": args.rounds,
            "beam": args.beam,
            "alpha": args.alpha,
            "threads": threads,
            "max_seconds": args.max_seconds,
            "engine": args.engine,
            "device": args.device,
            "server_args": args.server_args,
        },
        "runs": runs,
        "figures": figures,
    }
    path = Path(args.results)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print_table(figures)
    log(f"wrote {path}")


def log(message: str) -> None:
    print(f"serve_load: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- data


def read_sources(args: argparse.Namespace) -> list[str]:
    src = args.src or source_language(args.checkpoint)
    path = Path(args.data_dir) / f"{args.split}.{src}"
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if line]
    return lines[: args.limit] if args.limit > 0 else lines


def source_language(checkpoint: str) -> str:
    from aiayn.checkpoint import load_checkpoint

    config = load_checkpoint(checkpoint, with_state=False).config
    src = config.get("run", {}).get("data", {}).get("src_lang")
    if not src:
        sys.exit("serve_load: the checkpoint names no source language; pass --src")
    return src


# ----------------------------------------------------------------------------- systems


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m aiayn serve`` in a child process on a free loopback port, ready when it answers."""

    def __init__(self, args: argparse.Namespace, threads: int, no_batching: bool, log_file: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "aiayn", "serve", "--checkpoint", args.checkpoint]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--device", args.device]
        argv += args.server_args.split()
        argv += ["--engine", args.engine] if args.engine != "torch" else []
        argv += ["--no-batching"] if no_batching else []
        self.log_file = log_file
        with open(log_file, "wb") as out:
            self.process = subprocess.Popen(
                argv, env=child_env(threads), stdout=out, stderr=subprocess.STDOUT
            )
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"serve_load: the server exited ({self.process.returncode}); see {self.log_file}")
            try:
                if httpx.get(f"{self.url}/v1/model", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        sys.exit(f"serve_load: the server did not answer within {START_TIMEOUT_S:.0f} s; see {self.log_file}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def child_env(threads: int) -> dict:
    """The children's environment: this checkout's aiayn, ``threads`` threads for torch."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return env


async def load(url: str, lines: list[str], clients: int, args: argparse.Namespace) -> dict:
    """``clients`` concurrent clients sending one sentence per request until done or out of time.

    aiohttp, not httpx: at 128 concurrent requests httpx's connection pool took ~13 ms of CPU per
    request (5.2 CPU-s for 400 requests, on the cores the server needs), aiohttp a fraction of it.
    """
    queue = iter(range(len(lines)))
    latencies: list[float] = []
    failures: list[str] = []
    deadline = time.monotonic() + args.max_seconds

    async def client(http: aiohttp.ClientSession) -> None:
        for i in queue:  # shared: each sentence goes to one client
            if time.monotonic() > deadline:
                return
            body = {"text": [lines[i]], "beam": args.beam, "alpha": args.alpha}
            sent = time.perf_counter()
            try:
                async with http.post(f"{url}/v1/translate", json=body) as response:
                    response.raise_for_status()
                    (await response.json())["translations"][0]["text"]
                latencies.append(time.perf_counter() - sent)
            except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError) as err:
                failures.append(f"{type(err).__name__}: {err}"[:200])

    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        seconds = time.perf_counter() - start
    return measurement(latencies, failures, seconds, len(lines))


def measurement(latencies: list[float], failures: list[str], seconds: float, total: int) -> dict:
    ordered = sorted(latencies)
    return {
        "sentences": len(latencies),
        "complete": len(latencies) == total,
        "seconds": seconds,
        "sentences_per_s": len(latencies) / seconds if seconds > 0 else 0.0,
        "p50_s": percentile(ordered, 50),
        "p99_s": percentile(ordered, 99),
        "failures": len(failures),
        "first_failures": failures[:3],
    }


def percentile(ordered: list[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted values."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def offline(args: argparse.Namespace, threads: int, input_file: Path) -> dict:
    """``aiayn translate``'s engine on all sentences, timed in a child process (see offline_worker)."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--offline-worker", "--input", str(input_file)]
    argv += ["--checkpoint", args.checkpoint, "--beam", str(args.beam), "--alpha", str(args.alpha)]
    argv += ["--threads", str(threads), "--engine", args.engine, "--device", args.device]
    done = subprocess.run(
        argv,
        env=child_env(threads),
        capture_output=True,
        text=True,
        timeout=args.max_seconds + START_TIMEOUT_S,
    )
    if done.returncode != 0:
        sys.exit(f"serve_load: the offline run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def offline_worker(args: argparse.Namespace) -> None:
    """Child: load the engine as `aiayn translate` does, translate --input, print the timing as JSON."""
    import torch

    from aiayn.decode.backends import load_backend
    from aiayn.decode.search import DecodeOptions
    from aiayn.device import resolve_device
    from aiayn.malloc import keep_freed_memory

    keep_freed_memory()  # as the aiayn command does
    torch.set_num_threads(args.threads)
    lines = Path(args.input).read_text(encoding="utf-8").splitlines()
    device = resolve_device(args.device, "--device")
    engine = load_backend(args.checkpoint, args.engine, device=device, batch_tokens=4096)
    options = DecodeOptions(beam=args.beam, alpha=args.alpha)
    if device.type == "cuda":  # CUDA's first calls (context, kernels): untimed, as the servers' warm-up
        engine.translate(lines[:16], options)
    start = time.perf_counter()
    engine.translate(lines, options)
    seconds = time.perf_counter() - start
    result = measurement([], [], seconds, len(lines))
    result.update(sentences=len(lines), complete=True, sentences_per_s=len(lines) / seconds)
    print(json.dumps(result))


# ----------------------------------------------------------------------------- rounds and figures


def measure(args, servers: dict, lines: list[str], threads: int, input_file: Path) -> list[dict]:
    runs = []
    for server in servers.values():  # untimed warm-up: first requests, allocator, threads
        asyncio.run(load(server.url, lines[:16], 4, args))
    for r in range(args.rounds):
        order = list(SERVERS[r % len(SERVERS) :] + SERVERS[: r % len(SERVERS)])
        for clients in args.clients:
            for name in order:
                before = cpu_seconds(servers[name].process.pid)
                result = asyncio.run(load(servers[name].url, lines, clients, args))
                spent = [after - b for after, b in zip(cpu_seconds(servers[name].process.pid), before)]
                result.update(client_cpu_s=spent[0], server_cpu_s=spent[1])
                runs.append({"round": r, "system": name, "clients": clients, **result})
                log_run(runs[-1])
        runs.append({"round": r, "system": "offline", "clients": None, **offline(args, threads, input_file)})
        log_run(runs[-1])
    return runs


def cpu_seconds(server_pid: int) -> tuple[float, float]:
    """CPU time (user + system) so far of this process (the clients) and of the server."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    fields = Path(f"/proc/{server_pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return usage.ru_utime + usage.ru_stime, (int(fields[11]) + int(fields[12])) / ticks


def log_run(run: dict) -> None:
    latency = f", p50 {run['p50_s']:.3f} s, p99 {run['p99_s']:.3f} s" if run["p50_s"] is not None else ""
    clients = f" x{run['clients']}" if run["clients"] else ""
    log(
        f"round {run['round']}: {run['system']}{clients}: {run['sentences']} sentences in "
        f"{run['seconds']:.1f} s = {run['sentences_per_s']:.2f}/s{latency}"
        + ("" if run["complete"] else " (cut short)")
        + (f", {run['failures']} failed" if run.get("failures") else "")
        + (
            f"; CPU s: clients {run['client_cpu_s']:.1f}, server {run['server_cpu_s']:.1f}"
            if "client_cpu_s" in run
            else ""
        )
    )


def summarise(runs: list[dict], clients: list[int]) -> dict:
    offline_rate = {r["round"]: r["sentences_per_s"] for r in runs if r["system"] == "offline"}
    figures: dict = {"offline_sentences_per_s": statistics.median(offline_rate.values())}
    for c in clients:
        row = {}
        for name in SERVERS:
            mine = [r for r in runs if r["system"] == name and r["clients"] == c]
            row[name] = {key: median([r[key] for r in mine]) for key in ("sentences_per_s", "p50_s", "p99_s")}
            row[name]["complete"] = all(r["complete"] for r in mine)
        rate = {(r["system"], r["round"]): r["sentences_per_s"] for r in runs if r["clients"] == c}
        rounds = sorted({r for _, r in rate})
        row["batched_vs_unbatched"] = median(
            [ratio(rate["batched", r], rate["unbatched", r]) for r in rounds]
        )
        row["batched_vs_offline"] = median([ratio(rate["batched", r], offline_rate[r]) for r in rounds])
        figures[str(c)] = row
    figures["targets"] = {name: target_check(figures, name, c, goal) for name, (c, goal) in TARGETS.items()}
    return figures


def target_check(figures: dict, name: str, clients: int, goal: float) -> dict:
    row = figures.get(str(clients))
    if row is None:
        return {"clients": clients, "goal": goal, "ratio": None, "met": None}
    ratio = row[name]
    return {"clients": clients, "goal": goal, "ratio": ratio, "met": None if ratio is None else ratio >= goal}


def ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def median(values: list) -> float | None:
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return statistics.median(values) if values else None


def print_table(figures: dict) -> None:
    print(f"offline `aiayn translate`: {figures['offline_sentences_per_s']:.2f} sentences/s")
    print(f"{'clients':>7}  {'system':<9}  {'sent/s':>7}  {'p50 s':>7}  {'p99 s':>7}")
    for key, row in figures.items():
        if not key.isdigit():
            continue
        for name in SERVERS:
            rate, p50, p99 = (row[name][k] or 0 for k in ("sentences_per_s", "p50_s", "p99_s"))
            print(f"{key:>7}  {name:<9}  {rate:7.2f}  {p50:7.3f}  {p99:7.3f}")
        vs_unbatched, vs_offline = row["batched_vs_unbatched"] or 0, row["batched_vs_offline"] or 0
        print(f"{'':>7}  batched / unbatched {vs_unbatched:.2f}x, / offline {vs_offline:.2f}x")
    for name, check in figures["targets"].items():
        if check["ratio"] is not None:
            verdict = "met" if check["met"] else "NOT met"
            goal = f"{name} at {check['clients']} clients >= {check['goal']}"
            print(f"target {goal}: {check['ratio']:.2f} ({verdict})")


if __name__ == "__main__":
    main()
