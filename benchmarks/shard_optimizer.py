"""Sharding the optimizer's state: 2-process training with `train.shard_optimizer` off and on.

    .venv/bin/python benchmarks/shard_optimizer.py --data /tmp/s26/multi30k_100000 --rounds 4

``--data``: a directory prepared with ``configs/wmt14_en_de_base.yaml``'s settings (the 37k
tokenizer), e.g. the Multi30k one ``scale_data.py --pairs 100000 --work /tmp/s26`` leaves behind.
Each round trains the base model ``--steps`` steps of ``--batch-tokens`` padded tokens per process
under ``torchrun --nproc-per-node 2`` (one thread each), unsharded and sharded, the order
alternating; the runs are ``scale_data.py``'s (the same settings, the final checkpoint included).
Prints and writes each run's peak RSS per process and tokens/s, and the per-round ratios of
tokens/s, sharded over unsharded, with their median (``benchmarks/results/shard_optimizer.json``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

import scale_data
from common import command, machine, versions

SETTINGS = {"unsharded": "train.shard_optimizer=false", "sharded": "train.shard_optimizer=true"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a prepared directory (37k tokenizer)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-tokens", type=int, default=1024, help="padded tokens per process and step")
    parser.add_argument("--work", type=Path, help="where the runs go (default: a temp dir)")
    parser.add_argument(
        "--results", type=Path, default=scale_data.ROOT / "benchmarks" / "results" / "shard_optimizer.json"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="aiayn-shard-"))
    work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for r in range(args.rounds):
        for name in list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]:
            settings = argparse.Namespace(
                steps=args.steps, batch_tokens=args.batch_tokens, set=[SETTINGS[name]]
            )
            run = work / f"run_{name}"
            shutil.rmtree(run, ignore_errors=True)
            m = scale_data.train(args.data, run, settings, work / f"{name}.log", processes=2)
            runs[name].append(
                {"peak_rss_gib": m["peak_rss_gib_per_process"], "tokens_per_s": m["tokens_per_s"]}
            )
            print(
                f"round {r + 1} {name}: peak {[round(x, 3) for x in m['peak_rss_gib_per_process']]} GiB, "
                f"{m['tokens_per_s']:.0f} tokens/s",
                flush=True,
            )
    ratios = [s["tokens_per_s"] / u["tokens_per_s"] for s, u in zip(runs["sharded"], runs["unsharded"])]
    summary = {"tokens_per_s_sharded_vs_unsharded": ratios, "median": statistics.median(ratios)}
    rounded = [round(x, 3) for x in ratios]
    print(f"tokens/s sharded / unsharded per round {rounded}, median {summary['median']:.3f}")
    report = {
        "command": command(),
        "versions": versions(),
        "machine": machine(),
        "settings": {
            "data": str(args.data),
            "steps": args.steps,
            "batch_tokens": args.batch_tokens,
            "processes": 2,
        },
        "runs": runs,
        "summary": summary,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
