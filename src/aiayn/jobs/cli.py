"""``aiayn jobs merge OUTPUT`` (the shards of a job, run one by one or as a SLURM job array with
``aiayn translate --num-shards N --shard-id I``, concatenated in order into OUTPUT) and ``aiayn jobs
status OUTPUT`` (how far the job writing OUTPUT is)."""

from __future__ import annotations

import sys

from aiayn.jobs.job import Job, ranges


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "jobs",
        help="the jobs of `aiayn translate --input --output`: merge shards, see progress",
        description="The jobs of `aiayn translate --input FILE --output FILE` (kept in OUTPUT.job/).",
    )
    commands = p.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    merge = commands.add_parser(
        "merge",
        help="concatenate the chunks of a finished job's shards in order into OUTPUT",
        description="Write OUTPUT from the chunks of its job (all shards done), then remove OUTPUT.job/.",
    )
    merge.add_argument("output", help="the --output of the shards' aiayn translate")
    merge.set_defaults(func=run_merge)
    status = commands.add_parser("status", help="chunks done and missing of the job writing OUTPUT")
    status.add_argument("output", help="the --output of the job's aiayn translate")
    status.set_defaults(func=run_status)


def run_merge(args) -> int:
    job = Job.existing(args.output)
    job.finish()
    print(f"aiayn: {args.output}: {job.chunks} chunks, {job.lines} lines merged", file=sys.stderr)
    return 0


def run_status(args) -> int:
    job = Job.existing(args.output)
    missing = job.missing()
    done = job.chunks - len(missing)
    print(f"{args.output}: {done} of {job.chunks} chunks done ({job.lines} lines, {job.chunk_lines} a chunk)")
    if missing:
        print(f"missing: {ranges(missing)}")
    return 0
