"""A translation job over a file: its input cut into chunks of lines, each chunk's output committed
atomically, the chunks concatenated in order into the output at the end.

The job's folder is ``OUTPUT.job/`` beside the output:

``manifest.json``
    The settings (:class:`JobSettings`: everything that decides the output), the input's identity
    and the chunks' byte offsets in the (decompressed) input. It is written once, by the first
    process to open the job (a temporary linked to its name, which fails where another was first);
    every later process, and every rerun, checks that its settings and input are the same, else a
    :class:`UserError` in one line names what differs.
``chunk-00000012``
    Chunk 12's output lines (compressed as the output's name says: one gzip member, xz stream or
    zstd frame). Written to ``chunk-00000012.tmp-PID``, fsync'ed, renamed, the folder fsync'ed: its
    presence is the record that the chunk is done. A temporary left by a killed process is ignored.

The input's identity is its decompressed size and the SHA-256 of all of it, computed in the same
pass that finds the chunks' line boundaries (a pass is needed anyway, and reading is far faster than
translating): a rerun over an input changed anywhere is refused, where a digest of its head and tail
would take an edit in the middle for the same file and mix two inputs in one output. The path is not
part of it: the same file copied elsewhere (a node's scratch disk) continues the job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aiayn.checkpoint import MANIFEST_FILE, MODEL_FILE, resolve_checkpoint
from aiayn.errors import UserError
from aiayn.io import atomic_file, decode_lines, fsync_dir
from aiayn.jobs.compression import check_codec, codec, compress, open_read
from aiayn.jobs.records import RecordFormat

MANIFEST = "manifest.json"
VERSION = 1
_BLOCK = 1 << 20


@dataclass(frozen=True)
class JobSettings:
    """Everything that decides a job's output (JSON-serialisable): a rerun with other settings is
    refused. ``decode``: the decoding options by name (beam, alpha, ..., sampling's seed), the
    annotations asked for (nbest, scores, alignments), sentence splitting and its language.
    ``checkpoint_identity``: :func:`checkpoint_identity` of ``checkpoint``."""

    checkpoint: str
    checkpoint_identity: str
    engine: str = "torch"
    compute_type: str = "default"
    decode: dict[str, Any] = field(default_factory=dict)
    input_format: str = "plain"
    column: int | None = None
    field: str | None = None
    output_field: str | None = None
    chunk_lines: int = 10_000

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self), sort_keys=True))

    @property
    def record_format(self) -> RecordFormat:
        return RecordFormat(self.input_format, self.column, self.field, self.output_field)


def checkpoint_identity(path: str | Path) -> str:
    """The identity of the checkpoint ``path`` (a run directory: the checkpoint it resolves to):
    the SHA-256 its manifest records of its files' digests where it has one (every checkpoint aiayn
    saves), else the size and modification time of its weights file."""
    directory = resolve_checkpoint(path)
    manifest = directory / MANIFEST_FILE
    if manifest.is_file():
        try:
            return "sha256:" + json.loads(manifest.read_text(encoding="utf-8"))["sha256"]
        except (ValueError, KeyError, TypeError):
            pass  # a damaged manifest: loading the checkpoint says so
    weights = directory / MODEL_FILE
    if weights.is_file():
        stat = weights.stat()
        return f"size:{stat.st_size},mtime_ns:{stat.st_mtime_ns}"
    return f"path:{directory.resolve()}"


def job_folder(output: str | Path) -> Path:
    """Where the job writing ``output`` keeps its record: ``OUTPUT.job`` beside it."""
    output = Path(output)
    return output.with_name(output.name + ".job")


class Job:
    """A job: open it (:meth:`open`), then for each of :meth:`pending` translate :meth:`read` and
    :meth:`commit`; when :meth:`complete`, :meth:`finish`. Several processes may work on one job at
    once, each on its shard (``shards=(N, I)``: the chunks k with k % N == I)."""

    def __init__(self, output: Path, manifest: dict[str, Any], input: Path | None, shards: tuple[int, int]):
        self.output, self.folder = output, job_folder(output)
        self.manifest, self.input, self.shards = manifest, input, shards
        self.offsets: list[int] = manifest["chunks"]
        self.chunks: int = max(len(self.offsets) - 1, 0)
        self.chunk_lines: int = manifest["settings"]["chunk_lines"]
        self.lines: int = manifest["input"]["lines"]
        self.format = RecordFormat(
            **{
                "name": manifest["settings"]["input_format"],
                **{k: manifest["settings"][k] for k in ("column", "field", "output_field")},
            }
        )
        self._reader: IO[bytes] | None = None
        self._position = 0
        self._read: dict[int, list[str]] = {}

    # --- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        input: Path,
        output: Path,
        settings: JobSettings,
        *,
        chunk_lines: int | None = None,
        shards: tuple[int, int] = (1, 0),
    ) -> "Job":
        """Create the job writing ``output`` from ``input``, or resume it. ``chunk_lines`` (default:
        ``settings.chunk_lines``) lines a chunk. A job there with other settings, or begun over
        another input, is a :class:`UserError` naming what differs."""
        input, output = Path(input), Path(output)
        if chunk_lines is not None:
            settings = dataclasses.replace(settings, chunk_lines=chunk_lines)
        settings.record_format  # noqa: B018 (checks the format's options)
        n, i = shards
        if n < 1 or not 0 <= i < n:
            raise UserError(f"--shard-id {i}: must be from 0 to {n - 1} (--num-shards {n})")
        if settings.chunk_lines < 1:
            raise UserError("--chunk-lines: must be >= 1")
        check_codec(input)
        check_codec(output)
        _check_output(output)
        folder = job_folder(output)
        try:
            folder.mkdir(exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot write {output}: {err.strerror}") from None
        identity, offsets = _scan(input, settings.chunk_lines)
        manifest = {"version": VERSION, "settings": settings.to_json(), "input": identity, "chunks": offsets}
        existing = _create_or_read(folder, manifest)
        _check_same(existing, manifest, output, folder)
        return cls(output, existing, input, shards)

    @classmethod
    def existing(cls, output: str | Path) -> "Job":
        """The job writing ``output`` as its manifest records it (to merge its chunks); a
        :class:`UserError` where there is none."""
        output = Path(output)
        file = job_folder(output) / MANIFEST
        try:
            manifest = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(f"{output}: no job writes it (no {file})") from None
        except (OSError, ValueError) as err:
            raise UserError(f"cannot read {file}: {getattr(err, 'strerror', None) or err}") from None
        return cls(output, manifest, None, (1, 0))

    # --- the work ------------------------------------------------------------------------------

    def chunk_file(self, k: int) -> Path:
        return self.folder / f"chunk-{k:08d}"

    def first_line(self, k: int) -> int:
        """The input's line number (from 1) of chunk ``k``'s first line."""
        return k * self.chunk_lines + 1

    def lines_in(self, k: int) -> int:
        return min(self.chunk_lines, self.lines - k * self.chunk_lines)

    def done(self) -> set[int]:
        """The chunks committed (by any process)."""
        names = os.listdir(self.folder) if self.folder.is_dir() else []
        return {int(name[6:]) for name in names if name.startswith("chunk-") and name[6:].isdigit()}

    def pending(self) -> list[int]:
        """This shard's chunks not committed yet, in order."""
        n, i = self.shards
        done = self.done()
        return [k for k in range(i, self.chunks, n) if k not in done]

    def read(self, k: int) -> list[str]:
        """Chunk ``k``'s texts to translate (the record format applied: the column or field)."""
        if self.input is None:
            raise ValueError("a job opened to merge reads no input")
        start, end = self.offsets[k], self.offsets[k + 1]
        data = self._bytes(start, end - start)
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        name, first = str(self.input), self.first_line(k)
        texts = decode_lines(lines, name, first)
        self._read[k] = texts
        return self.format.texts(texts, name, first)

    def _bytes(self, start: int, size: int) -> bytes:
        """``size`` bytes of the decompressed input from ``start`` (chunks are read in order: a
        compressed input is read on from where the last read stopped, opened again to go back)."""
        assert self.input is not None
        try:
            if self._reader is None or start < self._position:
                if self._reader is not None:
                    self._reader.close()
                self._reader, self._position = open_read(self.input), 0
            if codec(self.input) is None:
                self._reader.seek(start)
            else:
                while self._position < start:
                    skipped = len(self._reader.read(min(_BLOCK, start - self._position)))
                    if not skipped:
                        break
                    self._position += skipped
            data = self._reader.read(size)
        except OSError as err:
            raise UserError(f"cannot read {self.input}: {err.strerror or err}") from None
        self._position = start + len(data)
        if len(data) != size:
            raise UserError(f"{self.input}: changed while the job read it (chunk at byte {start} is short)")
        return data

    def commit(self, k: int, translations: list[str]) -> None:
        """Chunk ``k`` done: its output lines (``translations`` with the record format applied: the
        other columns or fields kept) written atomically to its file."""
        lines = self._read.pop(k, None)
        if lines is None and self.format.name != "plain":
            self.read(k)
            lines = self._read.pop(k)
        out = self.format.output(lines or [], translations)
        data = compress("".join(line + "\n" for line in out).encode("utf-8"), self.output)
        final = self.chunk_file(k)
        part = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        try:
            with open(part, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(part, final)
            fsync_dir(self.folder)
        except OSError as err:
            raise UserError(f"cannot write {final}: {err.strerror or err}") from None
        finally:
            part.unlink(missing_ok=True)

    def missing(self) -> list[int]:
        """The chunks of every shard not committed yet."""
        done = self.done()
        return [k for k in range(self.chunks) if k not in done]

    def complete(self) -> bool:
        """Every chunk of every shard committed."""
        return not self.missing()

    def finish(self) -> None:
        """The chunks concatenated in order into the output (replaced whole or not at all), then the
        job's folder removed. Not complete: a :class:`UserError` naming the chunks missing."""
        missing = self.missing()
        if missing:
            raise UserError(
                f"{self.output}: {len(missing)} of {self.chunks} chunks not done yet: "
                f"{ranges(missing)} (chunk k is shard k % N's; run those shards again)"
            )
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        with atomic_file(self.output, "wb") as handle:
            if not self.chunks:
                handle.write(compress(b"", self.output))
            for k in range(self.chunks):
                with open(self.chunk_file(k), "rb") as chunk:
                    shutil.copyfileobj(chunk, handle, _BLOCK)
        # renamed first, then deleted: a crash meanwhile never leaves chunks without their manifest
        doomed = self.folder.with_name(f".{self.folder.name}.done-{os.getpid()}")
        try:
            os.rename(self.folder, doomed)
        except FileNotFoundError:  # another process finished the same job meanwhile
            return
        shutil.rmtree(doomed, ignore_errors=True)


def _check_output(output: Path) -> None:
    if output.is_dir():
        raise UserError(f"cannot write {output}: Is a directory")
    if output.exists() and not output.is_file():
        raise UserError(f"cannot write {output}: not a regular file (a job writes a file it can replace)")


def _scan(input: Path, chunk_lines: int) -> tuple[dict[str, Any], list[int]]:
    """The input's identity (decompressed size, line count, SHA-256) and the byte offsets where its
    chunks begin, then its size (``[]`` for an empty input), in one pass."""
    digest, offsets, need, position, newlines, last = hashlib.sha256(), [0], chunk_lines, 0, 0, b""
    try:
        with open_read(input) as handle:
            while block := handle.read(_BLOCK):
                digest.update(block)
                left, at = block.count(b"\n"), -1
                while left >= need:
                    for _ in range(need):
                        at = block.index(b"\n", at + 1)
                    left -= need
                    newlines += need
                    offsets.append(position + at + 1)
                    need = chunk_lines
                need -= left
                newlines += left
                position += len(block)
                last = block[-1:]
    except OSError as err:
        raise UserError(f"cannot read {input}: {err.strerror or err}") from None
    except EOFError as err:  # a truncated .gz or .xz
        raise UserError(f"cannot read {input}: {err}") from None
    if offsets[-1] == position:
        offsets.pop()
    lines = newlines + (1 if last not in (b"", b"\n") else 0)  # a last line without its newline
    identity = {"size": position, "lines": lines, "sha256": digest.hexdigest()}
    return identity, (offsets + [position] if position else [])


def _create_or_read(folder: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The job's manifest: ``manifest`` written where there is none yet (linked into place, so that
    of processes opening the job at once one writes it and the others read that one), else the one
    there."""
    file = folder / MANIFEST
    if not file.exists():
        if any(name.startswith("chunk-") and name[6:].isdigit() for name in os.listdir(folder)):
            raise UserError(f"{folder} holds chunks but no {MANIFEST}: delete {folder} to start over")
        part = folder / f".{MANIFEST}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            with open(part, "w", encoding="utf-8") as handle:
                json.dump(manifest, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.link(part, file)  # fails where another process was first
            fsync_dir(folder)
            return manifest
        except FileExistsError:
            pass
        except OSError as err:
            raise UserError(f"cannot write {file}: {err.strerror or err}") from None
        finally:
            part.unlink(missing_ok=True)
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {file}: {getattr(err, 'strerror', None) or err}") from None


def _check_same(there: dict[str, Any], here: dict[str, Any], output: Path, folder: Path) -> None:
    """The job there was begun with these settings over this input, else one line saying what
    differs."""
    start_over = f"finish it as it was begun, or delete {folder} to start over"
    if there.get("version") != VERSION:
        raise UserError(f"{output}: the unfinished job there is of another aiayn version; delete {folder}")
    old, new = _flat(there["settings"]), _flat(here["settings"])
    # the checkpoint by its identity, not by the path it was named by (relative, a link, a copy)
    differ = [key for key in sorted((set(old) | set(new)) - {"checkpoint"}) if old.get(key) != new.get(key)]
    if differ:
        said = ", ".join(f"{key} {_show(new.get(key))} (begun with {_show(old.get(key))})" for key in differ)
        raise UserError(f"{output}: an unfinished job there has other settings: {said}; {start_over}")
    if there["input"] != here["input"]:
        was, now = there["input"], here["input"]
        raise UserError(
            f"{output}: the input changed since the job there began ({now['lines']} lines, "
            f"sha256 {now['sha256'][:12]}; begun over {was['lines']} lines, sha256 {was['sha256'][:12]}); "
            f"{start_over}"
        )


def _flat(settings: dict[str, Any]) -> dict[str, Any]:
    flat = {key: value for key, value in settings.items() if key != "decode"}
    flat.update({f"decode.{key}": value for key, value in settings.get("decode", {}).items()})
    return flat


def _show(value: Any) -> str:
    return "none" if value is None else json.dumps(value)


def ranges(numbers: list[int]) -> str:
    """``1, 3-5, 9`` for [1, 3, 4, 5, 9] (the first 20 runs, then how many more)."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    said = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:20]]
    return ", ".join(said) + (f" and {len(runs) - 20} more runs" if len(runs) > 20 else "")
