"""Shared file I/O: files and directories replaced whole or not at all, and lines in and out.

* :func:`atomic_file` / :func:`atomic_write`: a file is written as a temporary beside its target and
  renamed over it only when complete, so a crash or an error leaves the previous file as it was.
* :func:`replace_dir`: the same for a directory (checkpoints, exports), with :func:`temporary_path`
  naming the temporary and :func:`remove_abandoned_temporaries` cleaning up after dead writers.
* :func:`read_lines`, :func:`stdin_blocks`, :func:`output_lines`: UTF-8 lines from a file or stdin
  (streamed as they arrive) and to a file or stdout, one clear error naming the line for bad input.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import IO, Callable, Iterator, Sequence

from aiayn.errors import Setting, SettingError, UserError

# --- files ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """Open a temporary beside ``path`` for writing (``mode`` "w" text or "wb"); on a clean exit it is
    flushed, fsync'ed and renamed over ``path`` (through a symlink: over the file it points to,
    keeping an existing file's mode). On an exception the temporary is deleted and ``path`` is
    untouched. A directory that cannot be written is a :class:`UserError` naming ``path``."""
    given = Path(path)
    target = given.resolve() if given.is_file() else given
    part = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with _open_for_writing(part, mode, given) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if target.is_file():
            shutil.copymode(target, part)
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)


def _open_for_writing(file: Path, mode: str, name: Path) -> IO:
    try:
        return open(file, mode, **({} if "b" in mode else {"encoding": "utf-8"}))
    except OSError as err:
        raise UserError(f"cannot write {name}: {err.strerror}") from None


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Replace ``path`` by ``data`` (bytes, or text written as UTF-8) whole or not at all."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w") as handle:
        handle.write(data)


def fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(directory: Path) -> None:
    """fsync every file of ``directory`` (not recursive), then the directory itself."""
    for file in directory.iterdir():
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())
    fsync_dir(directory)


# --- directories ----------------------------------------------------------------------------------

ABANDONED_AFTER_S = 3600.0  # a temporary untouched this long, its writer gone, is deleted by the next write


def temporary_path(final: Path) -> Path:
    """Where this process builds ``final`` before renaming it: ``.tmp-{name}@{host}+{pid}`` beside it."""
    return final.parent / f".tmp-{final.name}@{socket.gethostname()}+{os.getpid()}"


def remove_abandoned_temporaries(directory: Path) -> None:
    """Delete the :func:`temporary_path` directories that writers on this host abandoned.

    Abandoned: untouched for :data:`ABANDONED_AFTER_S` and its process gone. The age matters as much
    as the pid: a container on this host (same hostname, its own pid namespace) may be writing under
    a pid this process cannot see. Each is renamed to a private name before it is deleted, so a
    writer that renames its temporary into place meanwhile keeps it whole. Off POSIX nothing is
    deleted (no harmless way to ask whether a process exists), and no error here fails a write.
    """
    if os.name != "posix":
        return
    host, now = socket.gethostname(), time.time()
    for tmp in directory.glob(".tmp-*@*+*"):
        rest, _, pid = tmp.name.rpartition("+")
        try:
            if (
                rest.rpartition("@")[2] != host
                or not pid.isdigit()
                or _process_exists(int(pid))
                or now - tmp.stat().st_mtime < ABANDONED_AFTER_S
            ):
                continue
            doomed = tmp.with_name(f".del-{tmp.name}@{host}+{os.getpid()}")
            os.rename(tmp, doomed)
        except (OSError, OverflowError):  # gone meanwhile, renamed into place, or an absurd pid
            continue
        shutil.rmtree(doomed, ignore_errors=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks (POSIX)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


#: A file every complete directory written through :func:`replace_dir` holds (checkpoints and
#: CTranslate2 exports both have one): an interrupted replacement's copy without it is partial.
COMPLETE_MARKER = "config.json"


def replace_dir(tmp: Path, final: Path) -> None:
    """Move ``tmp`` to ``final``; an existing ``final`` is moved aside first, then deleted.

    A crash between the two renames leaves no ``final`` but its previous version in ``.old-*``:
    readers fall back to that copy (:func:`in_place`), and the next write here first moves
    it back (:func:`recover_replaced`). Readers never rename: a writer may be between the renames.
    """
    recover_replaced(final)
    old = final.parent / f".old-{final.name}-{os.getpid()}"
    if final.exists():
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def recover_replaced(final: Path) -> None:
    """Undo an interrupted :func:`replace_dir`: put back the previous ``final``, drop stale copies.

    When ``final`` is missing, the newest complete ``.old-{name}-*`` beside it (the version that was
    being replaced) is renamed back. ``.old-*`` copies left once ``final`` exists are deleted.
    """
    if not final.exists() and (copy := replaced_copy(final)) is not None:
        os.rename(copy, final)
        fsync_dir(final.parent)
    if final.exists():
        for stale in final.parent.glob(f".old-{final.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)


def replaced_copy(final: Path) -> Path | None:
    """The newest complete ``.old-*`` copy of ``final`` an interrupted replacement left, if any."""
    if not final.parent.is_dir():
        return None
    complete = [p for p in final.parent.glob(f".old-{final.name}-*") if (p / COMPLETE_MARKER).is_file()]
    return max(complete, key=_mtime, default=None)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile by the writer
        return 0.0


def in_place(path: Path) -> Path:
    """``path``, or when it is missing the copy an interrupted replacement left (read-only fallback)."""
    return path if path.exists() else (replaced_copy(path) or path)


# --- lines in and out -----------------------------------------------------------------------------


def read_lines(path: str | None) -> list[str]:
    """Lines of ``path`` (stdin when None) without their newline; invalid UTF-8 names the line."""
    name = path or "<stdin>"
    try:
        data = Path(path).read_bytes() if path else _stdin_bytes()
    except OSError as err:
        raise UserError(f"cannot read {name}: {err.strerror}") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return decode_lines(lines, name)


def stdin_blocks(max_lines: int, fd: int | None = None, name: str = "<stdin>") -> Iterator[list[str]]:
    """Lines of stdin (or of the file descriptor ``fd``) in blocks, as they arrive: wait for one whole
    line, then take the lines already waiting behind it, up to ``max_lines`` per block. Typed or
    piped one at a time, each line is a block of its own and is translated at once; a file given as
    stdin (``< file``) comes in blocks of exactly ``max_lines`` (the last one shorter), a pipe in
    blocks of what it holds when the block is taken (at most ``max_lines``). Invalid UTF-8 names the line,
    counted from the first. A ``sys.stdin`` without a file descriptor (replaced by a library user)
    is read whole, one block. ``name`` is what errors call the input."""
    fd = _stdin_fd() if fd is None else fd
    if fd is None:
        lines = read_lines(None)
        if lines:
            yield lines
        return
    pending, ended, number = bytearray(), False, 0
    while True:
        ended = ended or _read_lines_into(pending, fd, max_lines)
        lines = _take_lines(pending, max_lines)
        if ended and len(lines) < max_lines and pending:  # a last line without its newline
            lines.append(bytes(pending))
            pending.clear()
        if not lines:
            return
        yield decode_lines(lines, name, first=number + 1)
        number += len(lines)


def _read_lines_into(pending: bytearray, fd: int, max_lines: int) -> bool:
    """Read ``fd`` into ``pending`` until it holds ``max_lines`` whole lines, or at least one and
    nothing more is waiting; True at the end of the input."""
    lines = pending.count(b"\n")
    while lines < max_lines and (lines == 0 or _waiting(fd)):
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError as err:
            raise UserError(f"cannot read <stdin>: {err.strerror}") from None
        if not chunk:
            return True
        pending += chunk
        lines += chunk.count(b"\n")
    return False


def _take_lines(pending: bytearray, max_lines: int) -> list[bytes]:
    """Remove up to ``max_lines`` whole lines from the front of ``pending`` (without their newlines)."""
    lines, start = [], 0
    while len(lines) < max_lines:
        end = pending.find(b"\n", start)
        if end < 0:
            break
        lines.append(bytes(pending[start:end]))
        start = end + 1
    del pending[:start]
    return lines


def _stdin_fd() -> int | None:
    try:
        return sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
        return None


def _waiting(fd: int) -> bool:
    """Whether reading ``fd`` would return at once (data or the end are there). Where ``select``
    cannot tell (pipes on Windows), False: blocks are then what each read brings."""
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return False


def _stdin_bytes() -> bytes:
    if sys.stdin is None:  # started with its file descriptor 0 closed
        raise UserError("cannot read <stdin>: it is closed")
    buffer = getattr(sys.stdin, "buffer", None)  # a text stream without one (io.StringIO): its text
    return buffer.read() if buffer is not None else sys.stdin.read().encode("utf-8")


def decode_lines(lines: list[bytes], name: str, first: int = 1) -> list[str]:
    """UTF-8 text of ``lines`` (a CR before the newline dropped), numbered from ``first`` for errors."""
    return [_decode_line(line.rstrip(b"\r"), name, number) for number, line in enumerate(lines, first)]


def _decode_line(line: bytes, name: str, number: int) -> str:
    if b"\x00" in line:
        raise UserError(f"{name}: line {number}: a NUL byte: binary data, not text")
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{name}: line {number}: invalid UTF-8 (byte {err.start + 1})") from None


@contextlib.contextmanager
def output_lines(path: str | None) -> Iterator[Callable[[list[str]], None]]:
    """A writer of lines to stdout or to ``path``. A regular file (or a new one) is written as a
    temporary beside it, opened before any decoding so that an unwritable path fails at once, and
    renamed over it (through a symlink: over the file it points to, keeping its mode) only when
    everything is written: a failed or interrupted run leaves an existing file as it was. A device
    or a pipe (``/dev/stdout``, ``/dev/null``) is written directly."""
    if path is None:
        yield _writer(sys.stdout)
        sys.stdout.flush()
        return
    given = Path(path)
    if given.is_dir():
        raise UserError(f"cannot write {path}: Is a directory")
    if given.exists() and not given.is_file():
        with _open_for_writing(given, "w", given) as handle:
            yield _writer(handle)
        return
    with atomic_file(given) as handle:
        yield _writer(handle)


def _writer(handle) -> Callable[[list[str]], None]:
    def write(lines: list[str]) -> None:
        handle.write("".join(line + "\n" for line in lines))
        handle.flush()  # a streamed block reaches the reader at once

    return write


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in blocks (a large file never sits in memory whole)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def check_output_dir(
    out: Path, force: bool, *, source: Path, source_name: str, result: str, earlier: Sequence[str]
) -> None:
    """Before writing ``result`` (e.g. "an export") into ``out``: ``out`` may not be, contain or lie
    inside ``source`` (its ``source_name``; ``--force`` would replace it), must be new or empty, or
    with ``force`` hold an earlier ``result`` (the files ``earlier`` name). Its parent is created.
    Errors name the settings ``out`` and ``force``."""
    target, origin = out.resolve(), source.resolve()
    if target == origin or origin in target.parents or target in origin.parents:
        raise SettingError(
            Setting("out"),
            f": {out} overlaps the {source_name} {source}; write {result} to a directory outside it",
        )
    if out.exists() and not out.is_dir():
        raise SettingError(Setting("out"), f": {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise SettingError(
                Setting("out"), f": {out} is not empty (use ", Setting("force", True), " to replace it)"
            )
        if not all((out / name).is_file() for name in earlier):
            raise SettingError(
                Setting("out"),
                f": {out} holds something other than {result} (no {' and '.join(earlier)}); ",
                Setting("force", True),
                f" replaces only an earlier {result.split(' ', 1)[-1]}",
            )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SettingError(Setting("out"), f": cannot create {out.parent}: {err.strerror}") from None
