"""Translation jobs over files of any size: the input cut into chunks of lines, each chunk's output
committed atomically (the chunk's file is the record that it is done), resumed after a kill by the
same command, merged in order into one output.

* :mod:`aiayn.jobs.job`: :class:`JobSettings`, :class:`Job` (open or resume, pending, read, commit,
  complete, finish);
* :mod:`aiayn.jobs.records`: the input's formats (plain lines, a TSV column, a JSONL field);
* :mod:`aiayn.jobs.compression`: ``.gz``, ``.xz``, ``.zst`` by the file's name;
* :mod:`aiayn.jobs.progress`: a bar on a terminal, a line now and then in a log;
* :mod:`aiayn.jobs.run`: the in-process executor, shards of a torchrun launch;
* :mod:`aiayn.jobs.cli`: ``aiayn jobs merge|status OUTPUT``.

Jobs know no model: an executor is given the function that translates a chunk's texts.
"""

from aiayn.jobs.job import Job, JobSettings, checkpoint_identity, job_folder
from aiayn.jobs.progress import Progress
from aiayn.jobs.records import FORMATS, RecordFormat
from aiayn.jobs.run import chunk_seed, launched_shards, run_job, wait_complete

__all__ = [
    "FORMATS",
    "Job",
    "JobSettings",
    "Progress",
    "RecordFormat",
    "checkpoint_identity",
    "chunk_seed",
    "job_folder",
    "launched_shards",
    "run_job",
    "wait_complete",
]
