"""A job's chunks translated on a Ray cluster (``aiayn translate ... --ray ADDRESS``; the ray extra).

Ray Data carries the chunks: a dataset of the job's *pending* chunks, one row each (its number and
its lines, so that the nodes need not see the driver's files), mapped by an actor pool in which
each actor loads the model once (``make_translate()`` in its constructor) and translates one chunk
a call. The translations stream back to the driver, which commits each chunk as it arrives: the
order of arrival does not matter (a commit is per chunk, and :meth:`Job.finish` concatenates them
in order), and a driver stopped at any point loses only the chunks in flight: a rerun sends only
what is still pending. The pending chunks' lines are read when the job starts, into Ray's object
store (which spills to disk past its share of memory).

Failures: an actor that dies (its process killed, its node lost) is restarted, and the chunk it
was translating is redone once, on the restarted actor (Ray's ``max_task_retries=1``; the actors
themselves restart without limit, ``max_restarts=-1``, so that a lost node does not shrink the
pool for good). A chunk whose actor dies twice, or whose translation raises, stops the job with
one line; what was committed stays, and the same command continues from there.

``ray`` is imported only when a job runs on it, so nothing else in aiayn needs the package.
"""

from __future__ import annotations

import socket
import warnings
from collections.abc import Callable
from typing import Any, Protocol

from aiayn.errors import UserError

NEEDS_RAY = "--ray needs Ray: pip install 'aiayn[ray]'"

#: How often a chunk is redone after its actor died under it.
RETRIES = 1


class Job(Protocol):
    """What :func:`run_on_ray` needs of a job (:class:`aiayn.jobs.Job`)."""

    chunks: int

    def pending(self) -> list[int]: ...
    def read(self, k: int) -> list[str]: ...
    def commit(self, k: int, translations: list[str]) -> None: ...
    def complete(self) -> bool: ...
    def finish(self) -> None: ...


class Translator:
    """The actor pool's callable class: one model per actor, one chunk per call. A model that does
    not load, or a chunk whose translation raises, comes back as an error (the row's ``error``, one
    line) rather than as an exception: the driver names it and stops, where Ray would retry the
    actor, or lose the message in its own."""

    def __init__(self, make_translate: Callable[[], Callable[[int, list[str]], list[str]]]) -> None:
        self.translate: Callable[[int, list[str]], list[str]] | None = None
        try:
            self.translate = make_translate()
        except Exception as raised:  # said for each chunk sent here: the driver stops on the first
            self.failed = f"the model did not load: {one_line(raised)}"

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        rows: dict[str, list] = {"chunk": [], "translations": [], "error": []}
        for k, lines in zip(batch["chunk"], batch["lines"]):
            k, lines = int(k), [str(line) for line in lines]
            translations, error = [], ""
            if self.translate is None:
                error = self.failed
            else:
                try:
                    translations = [str(line) for line in self.translate(k, lines)]
                except Exception as raised:  # the driver's to report, with the chunk's number
                    error = f"chunk {k}: {one_line(raised)}"
                if not error and len(translations) != len(lines):
                    translations, error = [], f"chunk {k}: {len(lines)} lines in, {len(translations)} out"
            rows["chunk"].append(k)
            rows["translations"].append(translations)
            rows["error"].append(error)
        return rows


def one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if isinstance(error, UserError):
        return lines[0] if lines else "UserError"
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def connect(address: str) -> bool:
    """Ray connected for ``address`` ("local", "auto" or a cluster's); True when this call started
    the connection (and so ends it). An already connected process (a test's) keeps its own."""
    try:
        import ray  # here: only a job on Ray needs the package (the ray extra)
    except ImportError:
        raise UserError(NEEDS_RAY) from None
    if ray.is_initialized():
        return False
    try:
        if address not in ("local", "auto"):
            probe(address)  # Ray itself would wait minutes for a cluster that is not there
        if address == "local":
            ray.init(include_dashboard=False)
        else:
            ray.init(address=address)
    except Exception as error:  # a ConnectionError, a timeout, a bad address: the user's to mend
        raise UserError(f"--ray {address}: cannot reach the Ray cluster ({one_line(error)})") from None
    return True


def probe(address: str, timeout: float = 10) -> None:
    """Raises OSError where ``HOST:PORT`` (a cluster's head) takes no connection."""
    if "://" in address:
        return  # a Ray Client address (ray://): Ray's own client says what is wrong
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
        pass


def default_gpus() -> float:
    """Each actor's GPUs when none were asked: one where the cluster has GPUs (an actor per GPU),
    else none."""
    import ray  # here: see connect

    return 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0


def default_actors(gpus_per_actor: float) -> int:
    """One actor per GPU share the cluster has, or on CPUs one per node (a model uses a node's cores)."""
    import ray  # here: see connect

    if gpus_per_actor > 0:
        gpus = ray.cluster_resources().get("GPU", 0)
        if gpus < gpus_per_actor:
            raise UserError(f"--ray: the cluster has {gpus:g} GPUs, each actor asks for {gpus_per_actor:g}")
        return int(gpus // gpus_per_actor)
    return max(1, sum(1 for node in ray.nodes() if node.get("Alive")))


def stopped(job: Job, what: str) -> UserError:
    """The one line for a job stopped on Ray, with what was kept."""
    done = job.chunks - len(job.pending())
    return UserError(f"on Ray: {what}; {done} of {job.chunks} chunks are kept: the same command continues")


def run_on_ray(
    job: Job,
    make_translate: Callable[[], Callable[[int, list[str]], list[str]]],
    address: str,
    *,
    actors: int | None = None,
    gpus_per_actor: float | None = None,
    progress: Callable[[int], object] | None = None,
) -> None:
    """Translate ``job``'s pending chunks on the Ray cluster at ``address``, commit each on arrival,
    then :meth:`~Job.finish` it. ``actors``: the pool's size (by default one per GPU share, or one
    per node); ``gpus_per_actor``: by default one where the cluster has GPUs, else none;
    ``progress``: called with each committed chunk's number of lines."""
    if actors is not None and actors < 1:
        raise UserError(f"--ray: {actors} actors: at least 1")
    started = connect(address)
    import ray.data  # here: see connect (which has imported ray)

    if gpus_per_actor is None:
        gpus_per_actor = default_gpus()

    try:
        pending = job.pending()
        if pending:
            size = actors or default_actors(gpus_per_actor)
            context = ray.data.DataContext.get_current()
            saved = context.enable_progress_bars, context.print_on_execution_start
            context.enable_progress_bars = context.print_on_execution_start = False
            try:
                rows = [{"chunk": k, "lines": job.read(k)} for k in pending]
                dataset = ray.data.from_items(rows, override_num_blocks=len(rows))  # a task per chunk
                with warnings.catch_warnings():
                    # max_task_retries has no named parameter yet: Ray 2.60 calls **ray_remote_args
                    # deprecated, for removal in 2.64
                    warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
                    translated = dataset.map_batches(
                        Translator,
                        fn_constructor_args=(make_translate,),
                        batch_size=1,
                        compute=ray.data.ActorPoolStrategy(
                            size=min(size, len(rows)),
                            # a chunk at a time: a dying actor takes only its own chunk's retry with it
                            max_tasks_in_flight_per_actor=1,
                        ),
                        num_gpus=gpus_per_actor or None,
                        max_restarts=-1,
                        max_task_retries=RETRIES,
                    )
                try:
                    for row in translated.iter_rows():
                        k = int(row["chunk"])
                        if row["error"]:
                            raise stopped(job, row["error"])
                        translations = [str(line) for line in row["translations"]]
                        job.commit(k, translations)
                        if progress is not None:
                            progress(len(translations))
                except ray.exceptions.RayActorError as error:  # its chunk was redone once already
                    raise stopped(job, f"an actor died ({one_line(error)})") from None
                except ray.exceptions.RayError as error:
                    raise stopped(job, f"Ray failed ({one_line(error)})") from None
            finally:
                context.enable_progress_bars, context.print_on_execution_start = saved
        if job.complete():
            job.finish()
    finally:
        if started:
            ray.shutdown()
