"""When a training run's memory grows: each training process's resident memory over time.

Runs a command (``aiayn train``, or ``torchrun ... -m aiayn train``), polls every 50 ms the resident
memory (VmRSS) and its peak so far (VmHWM) of each ``train`` process of its tree, with the number of
records in the run's ``metrics.jsonl`` (a train record lands after each step), and prints a line
whenever a process's memory has moved by ``--step-mib`` or a record has landed:

    python benchmarks/rss_timeline.py --metrics RUN/metrics.jsonl -- \\
        python -m torch.distributed.run --nproc-per-node 2 -m aiayn train ... --out RUN
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

from scale_data import _memory_kib, _tree


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=Path, required=True, help="the run's metrics.jsonl")
    parser.add_argument("--step-mib", type=int, default=50)
    parser.add_argument("--log", type=Path, default=Path("rss_timeline.log"), help="the command's output")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    return parser.parse_args()


def trainers(root: int) -> dict[int, tuple[int, int]]:
    """(VmRSS, VmHWM) in MiB of each training process under ``root`` (not torchrun's launcher)."""
    found = {}
    for pid in _tree(root):
        memory = _memory_kib(pid)
        if memory and " train " in memory[1] and "torch.distributed.run" not in memory[1]:
            found[pid] = (memory[0]["VmRSS"] // 1024, memory[0]["VmHWM"] // 1024)
    return found


def main() -> None:
    args = parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    started, last = time.perf_counter(), None
    with args.log.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        while process.poll() is None:
            memory = trainers(process.pid)
            records = len(args.metrics.read_text().splitlines()) if args.metrics.exists() else 0
            key = (records, tuple(rss // args.step_mib for rss, _ in memory.values()))
            if memory and key != last:
                shown = "  ".join(f"pid {pid}: {rss} MiB (peak {hwm})" for pid, (rss, hwm) in memory.items())
                print(f"{time.perf_counter() - started:7.2f} s  records {records:3d}  {shown}", flush=True)
                last = key
            time.sleep(0.05)
    print(f"exit {process.returncode}")


if __name__ == "__main__":
    main()
