"""WMT-sized data on one machine: `aiayn data prepare`, then `aiayn train` on the memory map.

    .venv/bin/python benchmarks/scale_data.py                       # N = 1M and 4.5M pairs (~25 min)
    .venv/bin/python benchmarks/scale_data.py --pairs 100000 --steps 4 --results /tmp/scale.json  # smoke

For each N, a synthetic corpus of N pairs (``scale_corpus.py``: joined Multi30k pairs with words
replaced from a pool of made-up words, about as varied as news text) is written into ``--work``
(a temporary directory unless given; never committed), then, each a child process whose peak
resident memory (VmHWM of every process of its tree, polled) and wall time are measured:

* **prepare**: ``aiayn data prepare --config configs/wmt14_en_de_base.yaml`` (vocabulary 37k, a
  sampled tokenizer, one encoding process per CPU);
* **train, 1 process**: ``aiayn train`` on the prepared directory with the paper's base model, its
  precision ``auto``, ``--steps`` steps of ``--batch-tokens`` padded tokens per process (1,024: the
  activations of the base model with its 37k vocabulary take ~0.45 GiB per 1k tokens on CPU, so
  more would not fit the 2 GiB target whatever the data); validation by loss only, at the end;
  time to the first step = from the start of the command to the first train record (the first
  step included); tokens/s = median of the records after the first two;
* **train, 2 processes**: the same under ``torchrun --nproc-per-node 2`` (one thread each,
  ``--batch-tokens`` each): time to the first step and the peak memory of each training process;
* **Multi30k**: the same model (the same 37k tokenizer: Multi30k prepared with it) trained the same
  way on Multi30k, with 1 and 2 processes: the reference for memory and tokens/s.

The four training runs go in ``--rounds`` interleaved rounds (the order rotating); figures are
medians over rounds (tokens/s ratios: the median of the per-round ratios).

Targets (issue 26) at 4.5M pairs: training peak RSS <= 2 GiB per process and within 10% of the
Multi30k figure; first step <= 30 s after prepare; prepare <= 15 min. Writes
``benchmarks/results/scale_data.json``: command, versions, machine, every measurement, the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import command, machine, versions

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "wmt14_en_de_base.yaml"
MULTI30K = Path(os.environ.get("AIAYN_DATA") or ROOT.parent / "shared" / "data") / "multi30k"
GIB = 2**30


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[1_000_000, 4_500_000])
    parser.add_argument(
        "--work", type=Path, help="where corpora, prepared data and runs go (default: a temp dir)"
    )
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the four training runs")
    parser.add_argument("--batch-tokens", type=int, default=1024, help="padded tokens per process and step")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a config override for every training run (repeatable), e.g. train.shard_optimizer=false",
    )
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "scale_data.json")
    return parser.parse_args()


# --- measuring a process tree ----------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    pids, i = [pid], 0
    while i < len(pids):
        for task in Path(f"/proc/{pids[i]}/task").glob("*"):
            try:
                pids += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        i += 1
    return pids


def _memory_kib(pid: int) -> tuple[dict[str, int], str] | None:
    """VmHWM (the peak resident set), VmRSS (the resident set now), RssAnon (private memory) and
    RssFile (mapped files, shared with other processes and dropped by the kernel under pressure) of
    ``pid``, and its command."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    keys = ("VmHWM", "VmRSS", "RssAnon", "RssFile")
    values = {key: int(fields[key].split()[0]) for key in keys if key in fields}
    return (values, cmdline) if "VmHWM" in values else None


def measured(cmd: list[str], log: Path, metrics: Path | None = None, env: dict | None = None) -> dict:
    """Run ``cmd``; its wall time, every process's peak RSS and peak private (anonymous) and
    file-backed RSS (GiB), and the time to the first train record in ``metrics`` (when given)."""
    started = time.perf_counter()
    first = None
    peaks: dict[int, dict] = {}
    with log.open("w") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        while process.poll() is None:
            for pid in _tree(process.pid):
                found = _memory_kib(pid)
                if found:
                    peak = peaks.setdefault(pid, {})
                    peak["command"] = found[1][:160]  # the latest: a child's first look may precede its exec
                    for key, kib in found[0].items():
                        peak[key] = max(peak.get(key, 0), kib)
            if first is None and metrics is not None and _train_records(metrics):
                first = time.perf_counter() - started
            time.sleep(0.1)
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({process.returncode}); see {log}")
    processes = [
        {
            "command": p["command"],
            "peak_rss_gib": p["VmHWM"] * 1024 / GIB,
            "peak_anon_gib": p.get("RssAnon", 0) * 1024 / GIB,
            "peak_file_gib": p.get("RssFile", 0) * 1024 / GIB,
        }
        for p in peaks.values()
        if "VmHWM" in p
    ]
    return {"seconds": seconds, "first_step_s": first, "processes": processes}


def _train_records(metrics: Path) -> list[dict]:
    if not metrics.is_file():
        return []
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("split") == "train"]


# --- the runs ---------------------------------------------------------------------------------------


def prepare(corpus: Path, out: Path, log: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "aiayn",
        "data",
        "prepare",
        "--config",
        str(CONFIG),
        "--data-dir",
        str(corpus),
    ]
    result = measured([*cmd, "--out", str(out)], log)
    result["peak_rss_gib"] = max(p["peak_rss_gib"] for p in result["processes"])
    result["log_tail"] = log.read_text().splitlines()[-6:]
    return result


def train(data: Path, run: Path, args: argparse.Namespace, log: Path, processes: int = 1) -> dict:
    launcher = [sys.executable, "-m", "aiayn"]
    env = dict(os.environ)
    if processes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes)]
        launcher += ["--master-port", str(29400 + os.getpid() % 500), "-m", "aiayn"]
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // processes))
    sets = {
        "data.batch_tokens": args.batch_tokens * processes,
        "data.batch_multiple": processes,
        "train.log_every": 1,
        "train.valid_every": 0,
        "train.valid_at_epoch_end": "false",
        "train.valid_bleu": "false",  # greedy decoding of val by an untrained model: not the data path
        "train.save_every": 0,
        "train.keep_last": 1,
    }
    cmd = [*launcher, "train", "--config", str(CONFIG), "--data-dir", str(data), "--out", str(run)]
    cmd += ["--max-steps", str(args.steps), "--no-progress"]
    cmd += [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    cmd += [arg for override in args.set for arg in ("--set", override)]
    result = measured(cmd, log, run / "metrics.jsonl", env)
    trainers = [
        p
        for p in result["processes"]
        if " train " in p["command"] and "torch.distributed.run" not in p["command"]
    ]
    records = _train_records(run / "metrics.jsonl")
    result.update(
        processes_count=processes,
        peak_rss_gib_per_process=[p["peak_rss_gib"] for p in trainers],
        peak_anon_gib_per_process=[p["peak_anon_gib"] for p in trainers],
        tokens_per_s=statistics.median(r["tokens_per_s"] for r in records[2:]) if len(records) > 2 else None,
        steps=len(records),
    )
    return result


def multi30k_with(tokenizer_dir: Path, out: Path) -> Path:
    """Multi30k en->de prepared with the big corpus's tokenizer and settings: the same model."""
    from aiayn.data.prepare import prepare as prepare_corpus
    from aiayn.data.prepared import PrepareSettings, open_prepared

    if not (out / "manifest.json").is_file():
        data = open_prepared(tokenizer_dir)
        prepare_corpus(MULTI30K, out, PrepareSettings(**data.settings), tokenizer=data.tokenizer, log=print)
    return out


def run_size(n: int, work: Path, args: argparse.Namespace) -> dict:
    corpus, data = work / f"corpus_{n}", work / f"bin_{n}"
    if not (corpus / "train.de").is_file():
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "scale_corpus.py"),
                "--pairs",
                str(n),
                "--out",
                str(corpus),
                "--multi30k",
                str(MULTI30K),
            ],
            check=True,
        )
    size_mib = sum(f.stat().st_size for f in corpus.iterdir()) / 2**20
    print(f"N={n}: corpus {size_mib:.0f} MiB", flush=True)
    result = {"pairs": n, "corpus_mib": size_mib}
    result["prepare"] = prepare(corpus, data, work / f"prepare_{n}.log")
    print(
        f"  prepare {result['prepare']['seconds']:.0f} s, peak {result['prepare']['peak_rss_gib']:.2f} GiB",
        flush=True,
    )
    reference = multi30k_with(data, work / f"multi30k_{n}")
    runs = [
        ("train", data, 1),
        ("multi30k", reference, 1),
        ("train_2proc", data, 2),
        ("multi30k_2proc", reference, 2),
    ]
    rounds: dict[str, list[dict]] = {name: [] for name, _, _ in runs}
    for r in range(args.rounds):
        for name, directory, processes in runs[r % len(runs) :] + runs[: r % len(runs)]:  # rotated
            run = work / f"run_{name}_{n}"
            shutil.rmtree(run, ignore_errors=True)
            rounds[name].append(train(directory, run, args, work / f"{name}_{n}.log", processes))
            m = rounds[name][-1]
            peaks = [round(x, 3) for x in m["peak_rss_gib_per_process"]]
            print(
                f"  round {r + 1} {name}: first step {m['first_step_s']:.1f} s, peak {peaks} GiB, "
                f"{m['tokens_per_s']:.0f} tokens/s",
                flush=True,
            )
    result["rounds"] = rounds
    result.update({name: _summary(measurements) for name, measurements in rounds.items()})

    def paired(a: str, b: str) -> float:  # the median of the per-round ratios
        return statistics.median(x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(rounds[a], rounds[b]))

    result["ratios"] = {
        "rss_vs_multi30k": result["train"]["peak_rss_gib"] / result["multi30k"]["peak_rss_gib"],
        "anon_vs_multi30k": result["train"]["peak_anon_gib"] / result["multi30k"]["peak_anon_gib"],
        "rss_2proc_vs_multi30k_2proc": result["train_2proc"]["peak_rss_gib"]
        / result["multi30k_2proc"]["peak_rss_gib"],
        "tokens_per_s_vs_multi30k": paired("train", "multi30k"),
        "tokens_per_s_2proc_vs_multi30k_2proc": paired("train_2proc", "multi30k_2proc"),
    }
    return result


def _summary(measurements: list[dict]) -> dict:
    """Medians over rounds: the largest training process's peak RSS and private memory, the time to
    the first step, tokens/s."""
    median = lambda key: statistics.median(key(m) for m in measurements)  # noqa: E731
    return {
        "peak_rss_gib": median(lambda m: max(m["peak_rss_gib_per_process"])),
        "peak_anon_gib": median(lambda m: max(m["peak_anon_gib_per_process"])),
        "first_step_s": median(lambda m: m["first_step_s"]),
        "tokens_per_s": median(lambda m: m["tokens_per_s"]),
    }


def targets(result: dict) -> dict:
    return {
        "train_peak_rss_le_2gib": result["train"]["peak_rss_gib"] <= 2.0,
        "train_2proc_peak_rss_le_2gib": result["train_2proc"]["peak_rss_gib"] <= 2.0,
        "rss_within_10pct_of_multi30k": result["ratios"]["rss_vs_multi30k"] <= 1.10,
        "rss_2proc_within_10pct_of_multi30k_2proc": result["ratios"]["rss_2proc_vs_multi30k_2proc"] <= 1.10,
        "first_step_le_30s": max(result[n]["first_step_s"] for n in ("train", "train_2proc")) <= 30.0,
        "prepare_le_15min": result["prepare"]["seconds"] <= 15 * 60,
        "tokens_per_s_within_10pct_of_multi30k": result["ratios"]["tokens_per_s_vs_multi30k"] >= 0.90,
    }


def main() -> None:
    args = parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="aiayn-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    sizes = [run_size(n, work, args) for n in args.pairs]
    for result in sizes:
        result["targets_met"] = targets(result)
    report = {
        "command": command(),
        "versions": versions(),
        "machine": machine(),
        "settings": {
            "config": str(CONFIG.relative_to(ROOT)),
            "steps": args.steps,
            "batch_tokens": args.batch_tokens,
        },
        "sizes": sizes,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps([{"pairs": r["pairs"], **r["targets_met"], **r["ratios"]} for r in sizes], indent=1))


if __name__ == "__main__":
    main()
