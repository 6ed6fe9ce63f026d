"""A corpus of any size: a job of ``--lines`` lines (Multi30k's German sentences, cycled and
shuffled) killed at random points and resumed, against the same job uninterrupted; the work a kill
loses; throughput with 1 and 2 workers; the cost of chunking against a plain run.

    python benchmarks/jobs.py --checkpoint runs/jobs_small --data-dir $AIAYN_DATA/multi30k

Parts (``--parts``, all by default), each with ``aiayn translate`` run as a user runs it:

* **kills**: ``--input IN --output OUT`` uninterrupted (the reference; kept and reused with
  ``--work``), then the same command on another output SIGKILLed ``--kills`` times at random points
  (after a random number of chunks, then a random part of the next one's time) and run again each
  time, the last run to the end; the finished output against the reference (SHA-256), and per kill
  the chunks committed and the time since the last commit (the work lost: the chunk in flight).
* **workers**: ``--subset`` lines with 1 worker (one process, ``--threads`` threads), 2 workers
  through ``torchrun --nproc-per-node 2`` (each ``--threads / 2``), and with ``--ray local`` where
  Ray is installed (2 actors); outputs compared with the 1-worker one.
* **chunking**: the same subset without a job (``--input`` to stdout, read whole; and streamed
  from stdin) against a job with ``--chunk-lines`` and with 1,000-line chunks.

Writes ``benchmarks/results/jobs.json`` (``--results``) with the command, versions, machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import command, machine, versions

ROOT = Path(__file__).resolve().parents[1]


def aiayn(*args: str) -> list[str]:
    return [sys.executable, "-m", "aiayn", *args]


def digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            sha.update(block)
    return sha.hexdigest()


def make_input(data: Path, lines: int, out: Path) -> None:
    source = (data / "train.de").read_text(encoding="utf-8").splitlines()
    rng = random.Random(0)
    with open(out, "w", encoding="utf-8") as handle:
        written = 0
        while written < lines:
            block = source[:]
            rng.shuffle(block)
            block = block[: lines - written]
            handle.write("\n".join(block) + "\n")
            written += len(block)


def job_folder(output: Path) -> Path:
    return output.with_name(output.name + ".job")


def translate_args(args, source: Path, output: Path, *extra: str) -> list[str]:
    return aiayn(
        "translate", "--checkpoint", args.checkpoint, "--input", str(source), "--output", str(output),
        "--beam", str(args.beam), "--chunk-lines", str(args.chunk_lines),
        "--quiet", *extra,
    )  # fmt: skip


def threads(n: int) -> dict:
    """The environment of a process with ``n`` torch threads (what torchrun gives each rank)."""
    return {**os.environ, "OMP_NUM_THREADS": str(max(1, n))}


def timed(argv: list[str], env: dict | None = None) -> float:
    started = time.monotonic()
    subprocess.run(argv, check=True, cwd=ROOT, env=env)
    return time.monotonic() - started


def committed(output: Path) -> list[float]:
    """The commit times of the chunks in the job's folder (not the temporary files of a commit)."""
    times = []
    for path in job_folder(output).glob("chunk-*"):
        if ".tmp" not in path.name:
            try:
                times.append(path.stat().st_mtime)
            except FileNotFoundError:  # the job finished meanwhile
                pass
    return sorted(times)


def part_kills(args, work: Path) -> dict:
    source, reference = work / "input.de", work / "reference.en"
    timing = work / "reference.json"  # a reference kept in --work is not translated again
    if not (reference.exists() and timing.exists()):
        make_input(Path(args.data_dir), args.lines, source)
        seconds = timed(translate_args(args, source, reference), threads(args.threads))
        timing.write_text(json.dumps({"seconds": seconds}))
    seconds = json.loads(timing.read_text())["seconds"]
    chunks = -(-args.lines // args.chunk_lines)
    per_chunk = seconds / chunks
    killed = work / "killed.en"
    killed.unlink(missing_ok=True)
    shutil.rmtree(job_folder(killed), ignore_errors=True)
    rng = random.Random(args.seed)
    # kill points: after a random number of chunks (in order), then a random part of the next one
    targets = sorted(rng.sample(range(1, chunks - 1), args.kills))
    kills = []
    for target in targets:
        process = subprocess.Popen(translate_args(args, source, killed), cwd=ROOT, env=threads(args.threads))
        while len(committed(killed)) < target and process.poll() is None:
            time.sleep(0.05)
        time.sleep(rng.uniform(0, 1) * per_chunk)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        times = committed(killed)
        since = time.time() - times[-1] if times else None
        kills.append(
            {
                "chunks_committed": len(times),
                "seconds_since_last_commit": round(since, 1) if since is not None else None,
                "lines_lost_estimate": min(args.chunk_lines, round(since / per_chunk * args.chunk_lines))
                if since is not None
                else None,
            }
        )
    resumed = timed(translate_args(args, source, killed), threads(args.threads))
    return {
        "lines": args.lines,
        "chunk_lines": args.chunk_lines,
        "uninterrupted_s": round(seconds, 1),
        "lines_per_s": round(args.lines / seconds, 1),
        "kills": kills,
        "last_run_s": round(resumed, 1),
        "identical": digest(killed) == digest(reference),
        "sha256": digest(reference),
        "job_folder_left": job_folder(killed).exists(),
    }


def part_workers(args, work: Path) -> dict:
    source = work / "subset.de"
    make_input(Path(args.data_dir), args.subset, source)
    runs = {}
    one = work / "one.en"
    runs["1 process"] = timed(translate_args(args, source, one), threads(args.threads))
    two = work / "torchrun.en"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29533"]
    argv += translate_args(args, source, two)[1:]  # -m aiayn translate ...
    runs["torchrun, 2 processes"] = timed(argv, threads(args.threads // 2))
    same = {"torchrun, 2 processes": digest(two) == digest(one)}
    try:
        import ray  # noqa: F401

        on_ray = work / "ray.en"
        ray_argv = translate_args(args, source, on_ray, "--ray", "local")
        runs["ray local, 2 actors"] = timed(ray_argv, threads(args.threads // 2))
        same["ray local, 2 actors"] = digest(on_ray) == digest(one)
    except ImportError:
        runs["ray local, 2 actors"] = None
    return {
        "lines": args.subset,
        "seconds": {k: (round(v, 1) if v else v) for k, v in runs.items()},
        "lines_per_s": {k: (round(args.subset / v, 1) if v else v) for k, v in runs.items()},
        "identical_to_one_process": same,
    }


def part_chunking(args, work: Path) -> dict:
    source = work / "subset.de"
    if not source.exists():
        make_input(Path(args.data_dir), args.subset, source)
    plain, streamed = work / "plain.en", work / "streamed.en"
    whole = aiayn(
        "translate", "--checkpoint", args.checkpoint, "--beam", str(args.beam), "--input", str(source)
    )
    stream = aiayn("translate", "--checkpoint", args.checkpoint, "--beam", str(args.beam))
    rounds: dict[str, list[float]] = {
        "no job (--input, stdout)": [],
        "no job, streamed (stdin, stdout)": [],
        f"job, {args.chunk_lines}-line chunks": [],
        "job, 1000-line chunks": [],
    }
    for _ in range(args.rounds):  # interleaved
        for name, argv, into, stdin_from in (
            ("no job (--input, stdout)", whole, plain, None),
            ("no job, streamed (stdin, stdout)", stream, streamed, source),
        ):
            with open(stdin_from or os.devnull, "rb") as stdin, open(into, "wb") as stdout:
                started = time.monotonic()
                subprocess.run(
                    argv, stdin=stdin, stdout=stdout, check=True, cwd=ROOT, env=threads(args.threads)
                )
                rounds[name].append(time.monotonic() - started)
        big = work / "chunked.en"
        big.unlink(missing_ok=True)
        rounds[f"job, {args.chunk_lines}-line chunks"].append(
            timed(translate_args(args, source, big), threads(args.threads))
        )
        small = work / "small.en"
        small.unlink(missing_ok=True)
        argv = translate_args(args, source, small)
        argv[argv.index("--chunk-lines") + 1] = "1000"
        rounds["job, 1000-line chunks"].append(timed(argv, threads(args.threads)))
    medians = {k: round(sorted(v)[len(v) // 2], 2) for k, v in rounds.items()}
    base = medians["no job (--input, stdout)"]
    return {
        "lines": args.subset,
        "rounds": args.rounds,
        "median_s": medians,
        "ratio_to_no_job": {k: round(v / base, 3) for k, v in medians.items()},
        "identical": digest(big) == digest(plain) == digest(small) == digest(streamed),
    }


PARTS = {"kills": part_kills, "workers": part_workers, "chunking": part_chunking}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data-dir", default=os.environ.get("AIAYN_DATA", "../shared/data") + "/multi30k")
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--subset", type=int, default=50_000)
    parser.add_argument("--chunk-lines", type=int, default=10_000)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all (OMP_NUM_THREADS)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    parser.add_argument("--work", help="scratch folder (default: a temporary one, removed)")
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "jobs.json"))
    args = parser.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="aiayn-jobs-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        figures = {}
        for part in args.parts:
            figures[part] = PARTS[part](args, work)
            print(part, json.dumps(figures[part]), flush=True)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    record = {
        "command": command(),
        "versions": versions(),
        "machine": machine(),
        "settings": vars(args),
        **figures,
    }
    Path(args.results).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
