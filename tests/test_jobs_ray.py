"""A job on Ray (:mod:`aiayn.jobs.ray`, the ray extra): on a local Ray that the module starts once
(``ray.init(num_cpus=2)``), a stand-in job translated by upper-casing actors: every chunk committed
and the output that of a local loop; an actor killed under its chunk, which is redone once; a chunk
that kills its actor every time, which stops the job with one line and keeps what was committed; a
rerun that sends only what is pending."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import test_jobs
from aiayn.errors import UserError
from aiayn.jobs.ray import NEEDS_RAY, run_on_ray

try:
    import ray
except ImportError:  # the ray extra is not installed: only the test of its message runs
    ray = None

checkpoint, source, translate = test_jobs.checkpoint, test_jobs.source, test_jobs.translate  # its fixtures
needs_ray = pytest.mark.skipif(ray is None, reason="ray is not installed: pip install -e '.[ray]'")
pytestmark = pytest.mark.xdist_group("ray")  # one worker starts the one local Ray

SRC = Path(__file__).resolve().parents[1] / "src"


class StandInJob:
    """The interface of :class:`aiayn.jobs.Job` over a folder: a chunk is committed by its file
    (written beside, then renamed), and ``finish`` concatenates the chunks in order."""

    def __init__(self, folder: Path, lines: list[str], size: int) -> None:
        self.folder, self.lines, self.size = folder, lines, size
        self.chunks = -(-len(lines) // size)
        self.committed: list[int] = []  # this object's commits, in order of arrival
        folder.mkdir(parents=True, exist_ok=True)

    def path(self, k: int) -> Path:
        return self.folder / f"chunk-{k}.txt"

    def pending(self) -> list[int]:
        return [k for k in range(self.chunks) if not self.path(k).exists()]

    def read(self, k: int) -> list[str]:
        return self.lines[k * self.size : (k + 1) * self.size]

    def commit(self, k: int, translations: list[str]) -> None:
        assert len(translations) == len(self.read(k))
        partial = self.path(k).with_suffix(".partial")
        partial.write_text("".join(f"{line}\n" for line in translations), encoding="utf-8")
        os.replace(partial, self.path(k))
        self.committed.append(k)

    def complete(self) -> bool:
        return not self.pending()

    def finish(self) -> None:
        text = "".join(self.path(k).read_text(encoding="utf-8") for k in range(self.chunks))
        (self.folder / "output.txt").write_text(text, encoding="utf-8")

    def output(self) -> str:
        return (self.folder / "output.txt").read_text(encoding="utf-8")


LINES = [f"line {i} of the job" for i in range(23)] + ["", "ünïcode ✓"]


def upper(lines: list[str]) -> list[str]:
    return [line.upper() for line in lines]


def local_output(tmp_path: Path) -> str:
    """The output of the same job run by a plain loop, without Ray."""
    job = StandInJob(tmp_path / "local", LINES, 3)
    for k in job.pending():
        job.commit(k, upper(job.read(k)))
    job.finish()
    return job.output()


def make_upper(
    folder: str,
    die_once: bool = False,
    dies_on: str | None = None,
    raises_on: str | None = None,
    pause: float = 0.05,
):
    """The fake ``make_translate``: run in an actor, a translator that upper-cases, slowly enough
    for a death to land mid-job. ``die_once``: the first call of any actor kills its process (a
    marker file makes it once); ``dies_on``: a chunk with this line kills its actor every time;
    ``raises_on``: a chunk with this line raises; ``pause``: each call's time. Each call leaves a
    file naming its chunk's first line, so that the test counts the attempts."""

    def translate(k: int, lines: list[str]) -> list[str]:
        attempts = Path(folder, "attempts")
        attempts.mkdir(parents=True, exist_ok=True)
        with open(attempts / f"{lines[0]}.{os.getpid()}.{time.monotonic_ns()}", "w"):
            pass
        time.sleep(pause)
        if die_once:
            marker = Path(folder, "died")
            try:
                marker.touch(exist_ok=False)
            except FileExistsError:
                pass
            else:
                os._exit(1)
        if dies_on in lines:
            os._exit(1)
        if raises_on in lines:
            raise ValueError(f"cannot translate {raises_on!r}\nsecond line of the message")
        return upper(lines)

    return translate


def attempts(folder: Path, first_line: str) -> int:
    return sum(1 for path in (folder / "attempts").iterdir() if path.name.startswith(f"{first_line}."))


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module (its start takes seconds). Its workers import aiayn from this
    tree and this module's functions by value."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), saved]))
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    if saved is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = saved


def test_without_ray_the_flag_says_what_to_install(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    job = StandInJob(tmp_path, LINES, 3)
    with pytest.raises(UserError) as raised:
        run_on_ray(job, functools.partial(make_upper, str(tmp_path)), "local")
    assert str(raised.value) == NEEDS_RAY == "--ray needs Ray: pip install 'aiayn[ray]'"


def test_nothing_but_a_job_on_ray_imports_ray() -> None:
    """The commands and the module itself import without Ray: it is imported when a job
    runs on it (where Ray is installed, that import takes seconds and starts threads)."""
    code = (
        "import sys, aiayn.cli, aiayn.translate, aiayn.jobs.ray\n"
        "print(sorted(name for name in sys.modules if name == 'ray' or name.startswith('ray.')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


@needs_ray
def test_an_address_without_a_cluster_is_one_line(tmp_path: Path) -> None:
    """In a process of its own (this module's Ray may be connected, and ``auto`` would find it):
    ``auto`` where no cluster runs, and a head's address that takes no connection (at once, where
    Ray itself would wait minutes)."""
    code = (
        "from aiayn.errors import UserError\n"
        "from aiayn.jobs.ray import connect\n"
        "for address in ('auto', '127.0.0.1:1'):\n"
        "    try:\n        connect(address)\n    except UserError as error:\n        print(error)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "TMPDIR": str(tmp_path), "RAY_TMPDIR": str(tmp_path)}
    env.pop("RAY_ADDRESS", None)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    auto, head = result.stdout.splitlines()  # a line each
    assert auto.startswith("--ray auto: cannot reach the Ray cluster (ConnectionError: "), result.stderr
    refused = "ConnectionRefusedError: [Errno 111] Connection refused"
    assert head == f"--ray 127.0.0.1:1: cannot reach the Ray cluster ({refused})"


@needs_ray
def test_every_chunk_is_committed_and_the_output_is_a_local_runs(local_ray, tmp_path: Path) -> None:
    job = StandInJob(tmp_path / "ray", LINES, 3)
    counted: list[int] = []
    run_on_ray(job, functools.partial(make_upper, str(tmp_path)), "local", actors=2, progress=counted.append)
    assert sorted(job.committed) == list(range(job.chunks)) and job.complete()
    assert job.output() == local_output(tmp_path)
    assert sum(counted) == len(LINES) and len(counted) == job.chunks


@needs_ray
def test_a_killed_actors_chunk_is_redone_once(local_ray, tmp_path: Path) -> None:
    job = StandInJob(tmp_path / "ray", LINES, 3)
    run_on_ray(job, functools.partial(make_upper, str(tmp_path), die_once=True), "local", actors=2)
    assert (tmp_path / "died").exists()
    assert sorted(job.committed) == list(range(job.chunks))
    assert job.output() == local_output(tmp_path)
    calls = len(list((tmp_path / "attempts").iterdir()))
    assert calls == job.chunks + 1  # every chunk once, and the one under the death once more


@needs_ray
def test_a_chunk_that_kills_its_actor_twice_stops_the_job_and_a_rerun_continues(
    local_ray, tmp_path: Path
) -> None:
    bad = LINES[3 * 4]  # the first line of chunk 4
    job = StandInJob(tmp_path / "ray", LINES, 3)
    with pytest.raises(UserError) as raised:
        run_on_ray(job, functools.partial(make_upper, str(tmp_path), dies_on=bad), "local", actors=2)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("on Ray: an actor died ("), message
    kept = sorted(job.committed)
    assert message.endswith(f"; {len(kept)} of {job.chunks} chunks are kept: the same command continues")
    assert 4 not in kept and 4 in job.pending() and all(job.path(k).exists() for k in kept)
    assert attempts(tmp_path, bad) == 2  # the chunk, and once more

    rerun = StandInJob(tmp_path / "ray", LINES, 3)
    pending = rerun.pending()
    run_on_ray(rerun, functools.partial(make_upper, str(tmp_path / "rerun")), "local", actors=2)
    assert sorted(rerun.committed) == pending  # only what was pending was sent
    assert rerun.output() == local_output(tmp_path)


@needs_ray
def test_a_chunk_that_raises_stops_the_job_with_its_line(local_ray, tmp_path: Path) -> None:
    bad = LINES[3 * 2 + 1]  # a line of chunk 2
    job = StandInJob(tmp_path / "ray", LINES, 3)
    with pytest.raises(UserError) as raised:
        run_on_ray(job, functools.partial(make_upper, str(tmp_path), raises_on=bad), "local", actors=1)
    assert str(raised.value) == (
        f"on Ray: chunk 2: ValueError: cannot translate {bad!r}; "
        f"{len(job.committed)} of {job.chunks} chunks are kept: the same command continues"
    )
    assert 2 in job.pending() and attempts(tmp_path, LINES[6]) == 1  # an error is not a death: not redone


DRIVER = """
import functools, sys
from pathlib import Path
import ray
sys.path.insert(0, {tests!r})
import test_jobs_ray as here
from aiayn.jobs.ray import run_on_ray
ray.cloudpickle.register_pickle_by_value(here)
job = here.StandInJob(Path({folder!r}), here.LINES, 3)
run_on_ray(job, functools.partial(here.make_upper, {attempts!r}, pause=0.5), {address!r}, actors=1)
"""


@needs_ray
def test_a_killed_driver_leaves_its_commits_and_a_rerun_sends_only_the_rest(
    local_ray, tmp_path: Path
) -> None:
    """A driver of its own, on this module's cluster by its address (``--ray HOST:PORT``), killed
    once two chunks are committed; the rerun commits only the others, and the output is whole."""
    folder, address = tmp_path / "ray", ray.get_runtime_context().gcs_address
    code = DRIVER.format(
        tests=str(Path(__file__).parent), folder=str(folder), attempts=str(tmp_path), address=address
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 90
        while (
            len(list(folder.glob("chunk-*.txt"))) < 2
            and driver.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
    finally:
        driver.kill()
        driver.wait()
    rerun = StandInJob(folder, LINES, 3)
    pending = rerun.pending()
    assert 2 <= rerun.chunks - len(pending) < rerun.chunks, "the driver was killed mid-job"
    run_on_ray(rerun, functools.partial(make_upper, str(tmp_path / "rerun")), "local", actors=2)
    assert sorted(rerun.committed) == pending
    assert rerun.output() == local_output(tmp_path)


def unloadable():
    raise UserError("checkpoint model.pt: no such file")


@needs_ray
def test_a_model_that_does_not_load_stops_the_job_with_its_line(local_ray, tmp_path: Path) -> None:
    job = StandInJob(tmp_path / "ray", LINES, 3)
    with pytest.raises(UserError) as raised:
        run_on_ray(job, unloadable, "local", actors=1)
    assert str(raised.value) == (
        "on Ray: the model did not load: checkpoint model.pt: no such file; "
        f"0 of {job.chunks} chunks are kept: the same command continues"
    )


@needs_ray
def test_the_command_on_ray_writes_what_one_process_writes(local_ray, checkpoint, source, tmp_path) -> None:
    """``aiayn translate --ray`` with the real job and model: two actors, each loading the model
    once, write the output of one process, byte for byte, and leave no job folder."""
    one, on_ray = tmp_path / "one.de", tmp_path / "ray.de"
    common = ["--input", str(source), "--chunk-lines", "3", "--quiet"]
    assert translate(checkpoint, *common, "--output", str(one)) == 0
    assert translate(checkpoint, *common, "--output", str(on_ray), "--ray", "local", "--actors", "2") == 0
    assert on_ray.read_bytes() == one.read_bytes() and not (tmp_path / "ray.de.job").exists()


def test_the_ray_flags_need_ray_and_a_job_of_one_process(checkpoint, source, tmp_path, capsys) -> None:
    out = str(tmp_path / "out.de")
    assert translate(checkpoint, "--input", str(source), "--output", out, "--actors", "2") != 0
    assert "--actors: needs --ray" in capsys.readouterr().err
    sharded = ["--num-shards", "2", "--shard-id", "0", "--ray", "local"]
    assert translate(checkpoint, "--input", str(source), "--output", out, *sharded) != 0
    assert "not with --num-shards or torchrun" in capsys.readouterr().err
