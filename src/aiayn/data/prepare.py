"""``aiayn data prepare``: encode a parallel corpus once into a prepared directory.

The layout it writes is described in :mod:`aiayn.data.prepared`. The steps, streaming the files:

1. Scan the training files for line counts (aligned files must agree) and the byte offset of
   every ``chunk_pairs``-th line, without decoding them.
2. Train the joint SentencePiece tokenizer on a seeded random sample of ``tokenizer_sample`` pairs
   (every pair when the corpus has no more), read in corpus order.
3. Encode the chunks in parallel (``workers`` processes; each reads its own byte ranges, strips,
   drops empty pairs, encodes both sides and filters by length as :mod:`aiayn.data.corpus` does)
   into one ``.npz`` per chunk, each written whole or not at all.
4. Concatenate the chunks into the flat arrays and the index; encode the validation split (not
   length-filtered: the model's ``max_len`` decides that when training); write the manifest last.

The tokenizer and the chunks live in ``OUT/.partial`` with the settings they were made with; the
arrays are written under temporary names and renamed into place, and the manifest comes last. A
run killed at any moment and started again reuses the tokenizer and the chunks already written
and finishes with the same files as an uninterrupted one. A finished directory is checked, not
rebuilt; one made with other settings is refused.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from aiayn.data.corpus import CorpusStats, describe_corpus, keep_by_length, read_parallel
from aiayn.data.prepared import (
    FORMAT,
    MANIFEST,
    TOKENIZER_FILE,
    VERSION,
    PreparedData,
    PrepareSettings,
    is_prepared,
    open_prepared,
)
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.io import atomic_file, atomic_write, file_sha256

PARTIAL = ".partial"
CHUNK_PAIRS = 100_000
BOM = b"\xef\xbb\xbf"
Log = Callable[[str], None]


def prepare(
    corpus: str | Path,
    out: str | Path,
    settings: PrepareSettings,
    workers: int = 0,
    chunk_pairs: int = CHUNK_PAIRS,
    tokenizer: Tokenizer | None = None,
    log: Log = print,
) -> PreparedData:
    """Prepare the corpus directory ``corpus`` (``{split}.{lang}`` files) into ``out``.

    ``workers``: encoding processes (0 = one per CPU). ``tokenizer``: use this one instead of
    training one (a resumed run keeps its own). Returns the prepared directory, opened.
    """
    corpus, out = Path(corpus), Path(out)
    if is_prepared(out):
        return _prepared_already(corpus, out, settings, log)
    started = time.perf_counter()
    if settings.train_split == settings.valid_split:
        raise UserError(
            f"data.train_split and data.valid_split are both {settings.train_split!r}: "
            "validate on a split kept apart from training"
        )
    files = _aligned(corpus, settings.train_split, settings)
    _aligned(corpus, settings.valid_split, settings)  # there, before hours of encoding
    n_pairs, starts = _scan(files, chunk_pairs)
    _remove_temporaries(out)
    work = _partial_dir(out, settings, files, chunk_pairs, tokenizer)
    tokenizer = tokenizer or _tokenizer(work, files, n_pairs, settings, log)
    _save_tokenizer(work, tokenizer)
    dtype = token_dtype(max(tokenizer.vocab_size, tokenizer.target_vocab_size))
    chunks = _encode_chunks(
        work,
        files,
        starts,
        n_pairs=n_pairs,
        chunk_pairs=chunk_pairs,
        settings=settings,
        dtype=dtype,
        workers=workers,
        log=log,
    )
    splits = {settings.train_split: _assemble(out, settings, chunks, files, dtype)}
    splits[settings.valid_split] = _write_valid(corpus, out, settings, tokenizer, dtype)
    shutil.copyfile(work / TOKENIZER_FILE, out / TOKENIZER_FILE)
    manifest = _write_manifest(out, corpus, settings, tokenizer=tokenizer, splits=splits, dtype=dtype)
    shutil.rmtree(work)
    log(f"prepared {out} in {time.perf_counter() - started:.0f} s")
    return PreparedData(out, manifest, tokenizer)  # its files were just hashed for the manifest


def _prepared_already(corpus: Path, out: Path, settings: PrepareSettings, log: Log) -> PreparedData:
    """``out``, checked; refused when made from another corpus or with other settings."""
    elsewhere = "write to another directory, or delete this one first"
    data = open_prepared(out, settings, remedy=elsewhere)
    if data.manifest["corpus"] != str(corpus.resolve()):
        raise UserError(f"{out} was prepared from {data.manifest['corpus']}, not {corpus} ({elsewhere})")
    shutil.rmtree(out / PARTIAL, ignore_errors=True)  # a run killed after its manifest was written
    log(f"{out}: prepared already (files checked against its manifest)")
    return data


def _remove_temporaries(out: Path) -> None:
    """Arrays a killed run left half-written (``.NAME.tmp-PID``)."""
    for part in out.glob(".*.tmp-*"):
        part.unlink(missing_ok=True)


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 for vocabularies that fit it (the paper's 37k do), int32 otherwise."""
    return np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32)


# --- 1. the files ------------------------------------------------------------------------------------


def _aligned(corpus: Path, split: str, settings: PrepareSettings) -> tuple[Path, Path]:
    """The split's two files (read_parallel's checks: a directory, both files there)."""
    if not corpus.is_dir():
        raise UserError(f"corpus not found: {corpus} is not a directory of {{split}}.{{lang}} files")
    files = tuple(corpus / f"{split}.{lang}" for lang in (settings.src_lang, settings.tgt_lang))
    for file in files:
        if not file.is_file():
            raise UserError(f"no file {file} ({describe_corpus(corpus)})")
    return files


def _scan(files: tuple[Path, Path], every: int) -> tuple[int, list[list[int]]]:
    """The number of pairs and, per file, the byte offsets where lines 0, every, 2 every, ... start
    (then the file's end)."""
    (n_src, src_starts), (n_tgt, tgt_starts) = (_line_starts(file, every) for file in files)
    if n_src != n_tgt:
        raise UserError(
            f"{files[0]} has {n_src} lines but {files[1]} has {n_tgt}; aligned files need equal line counts"
        )
    if n_src == 0:
        raise UserError(f"empty corpus: {files[0]} and {files[1]} have no lines")
    return n_src, [src_starts, tgt_starts]


def _line_starts(file: Path, every: int) -> tuple[int, list[int]]:
    size = file.stat().st_size
    with file.open("rb") as handle:
        starts = [len(BOM) if handle.read(len(BOM)) == BOM else 0]
        handle.seek(0)
        newlines, position, last = 0, 0, b""
        while block := handle.read(1 << 24):
            found = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)  # LF only, as read_parallel
            numbers = newlines + np.arange(1, len(found) + 1)  # the line each newline ends, 1-based
            starts += (position + found[numbers % every == 0] + 1).tolist()
            newlines, position, last = newlines + len(found), position + len(block), block[-1:]
    starts = [s for s in starts if s < size] + [size]
    n_lines = newlines + (1 if size > starts[0] and last != b"\n" else 0)
    return n_lines, starts


def _partial_dir(
    out: Path, settings: PrepareSettings, files: tuple[Path, Path], chunk_pairs: int, tokenizer
) -> Path:
    """``out/.partial``, kept from an interrupted run with the same settings, files and given
    tokenizer, else new."""
    work = out / PARTIAL
    state = {
        "settings": settings.to_dict(),
        "tokenizer": hashlib.sha256(tokenizer.to_bytes()).hexdigest() if tokenizer is not None else None,
        "chunk_pairs": chunk_pairs,
        "files": [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files],
    }
    state_file = work / "state.json"
    if state_file.is_file() and json.loads(state_file.read_text()) != state:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    if not state_file.is_file():
        atomic_write(state_file, json.dumps(state))
    return work


# --- 2. the tokenizer ----------------------------------------------------------------------------------


def _tokenizer(
    work: Path, files: tuple[Path, Path], n_pairs: int, settings: PrepareSettings, log: Log
) -> Tokenizer:
    if (work / TOKENIZER_FILE).is_file():  # trained before an interruption
        return Tokenizer.load(work / TOKENIZER_FILE)
    started = time.perf_counter()
    sentences = sample_sentences(files, n_pairs, settings.tokenizer_sample, settings.seed)
    if not sentences:
        sampled = " sampled" if 0 < settings.tokenizer_sample < n_pairs else ""
        raise UserError(
            f"empty corpus: no{sampled} pair of {files[0]} and {files[1]} has two non-empty sides"
        )
    tokenizer = Tokenizer.train(
        sentences,
        vocab_size=settings.vocab_size,
        model_type=settings.tokenizer,
        seed=settings.seed,
        lowercase=settings.lowercase,
    )
    log(
        f"trained a joint {settings.tokenizer} tokenizer on {len(sentences) // 2} pairs"
        f"{' (a seeded sample)' if len(sentences) // 2 < n_pairs else ''}: {tokenizer.vocab_size} pieces"
        f"{', lowercasing' if settings.lowercase else ''} ({time.perf_counter() - started:.0f} s)"
    )
    return tokenizer


def _save_tokenizer(work: Path, tokenizer: Tokenizer) -> None:
    if not (work / TOKENIZER_FILE).is_file():
        atomic_write(work / TOKENIZER_FILE, tokenizer.to_bytes())


def sample_sentences(files: tuple[Path, Path], n_pairs: int, sample: int, seed: int) -> list[str]:
    """Source and target sentences of the non-empty pairs among ``sample`` pairs drawn without
    replacement (seeded), in corpus order: ``[src, tgt, src, tgt, ...]``; every pair when
    ``sample`` is 0 or not below ``n_pairs``."""
    chosen = None
    if 0 < sample < n_pairs:
        chosen = np.zeros(n_pairs, dtype=bool)
        chosen[np.random.default_rng(seed).choice(n_pairs, size=sample, replace=False)] = True
    sentences = []
    with files[0].open("rb") as src_file, files[1].open("rb") as tgt_file:
        for number, (src, tgt) in enumerate(zip(src_file, tgt_file)):
            if chosen is None or chosen[number]:
                src, tgt = (_decode(line, file, number) for line, file in ((src, files[0]), (tgt, files[1])))
                if src and tgt:
                    sentences += (src, tgt)
    return sentences


def _decode(line: bytes, file: Path, number: int) -> str:
    """A stripped line; invalid UTF-8 is a UserError naming the 1-based line."""
    if number == 0:
        line = line.removeprefix(BOM)
    try:
        return line.decode("utf-8").strip()
    except UnicodeDecodeError as err:
        raise UserError(f"{file}:{number + 1}: invalid UTF-8 (byte {line[err.start]:#04x})") from None


# --- 3. encoding in chunks ------------------------------------------------------------------------------


def _encode_chunks(work, files, starts, *, n_pairs, chunk_pairs, settings, dtype, workers, log) -> list[Path]:
    """Every chunk's ``.npz`` (those already in ``work`` are kept), encoded by ``workers`` processes."""
    chunks = [work / f"chunk-{k:06d}.npz" for k in range(len(starts[0]) - 1)]
    tasks = [
        (chunk, files, (starts[0][k], starts[0][k + 1]), (starts[1][k], starts[1][k + 1]), k * chunk_pairs,
         min(chunk_pairs, n_pairs - k * chunk_pairs), settings, dtype)
        for k, chunk in enumerate(chunks)
        if not chunk.is_file()
    ]  # fmt: skip
    workers = min(workers or os.cpu_count() or 1, len(tasks))
    started = time.perf_counter()
    proto = (work / TOKENIZER_FILE).read_bytes()
    for done, _ in enumerate(_run(tasks, workers, proto), start=1):
        if done % 10 == 0 or done == len(tasks):
            seconds, processes = time.perf_counter() - started, f"{workers} process{'es' * (workers > 1)}"
            log(f"encoded {done}/{len(tasks)} chunks ({seconds:.0f} s, {processes})")
    return chunks


def _run(tasks: list, workers: int, proto: bytes) -> Iterator[None]:
    if workers <= 1:
        _start_worker(proto)
        yield from map(_encode_chunk, tasks)
        return
    # spawned, not forked: rank 0 of a training run has communication (and maybe CUDA) threads
    with multiprocessing.get_context("spawn").Pool(workers, _start_worker, (proto,)) as pool:
        yield from pool.imap_unordered(_encode_chunk, tasks)


_WORKER_TOKENIZER: Tokenizer | None = None  # each encoding process's own copy


def _start_worker(proto: bytes) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = Tokenizer.from_bytes(proto)


def _encode_chunk(task) -> None:
    chunk, files, src_range, tgt_range, first, n_lines, settings, dtype = task
    src = _read_range(files[0], src_range, first, n_lines)
    tgt = _read_range(files[1], tgt_range, first, n_lines)
    stats = CorpusStats(str(chunk), n_read=n_lines)
    pairs = [(s, t) for s, t in zip(src, tgt) if s and t]
    stats.n_empty = n_lines - len(pairs)
    encode = _WORKER_TOKENIZER.encode_batch
    src_ids = encode([s for s, _ in pairs], threads=1)
    tgt_ids = encode([t for _, t in pairs], threads=1, target=True)
    keep = keep_by_length(
        src_ids, tgt_ids, stats, max_tokens=settings.max_sentence_tokens, max_ratio=settings.max_ratio
    )
    src_ids, tgt_ids = [src_ids[i] for i in keep], [tgt_ids[i] for i in keep]
    counts = [stats.n_read, stats.n_empty, stats.n_too_long, stats.n_bad_ratio]
    with atomic_file(chunk, "wb") as handle:
        np.savez(
            handle,
            src=_flat(src_ids, dtype),
            tgt=_flat(tgt_ids, dtype),
            lengths=np.array([[len(s), len(t)] for s, t in zip(src_ids, tgt_ids)], np.int64).reshape(-1, 2),
            counts=np.array(counts, np.int64),
        )


def _read_range(file: Path, byte_range: tuple[int, int], first: int, n_lines: int) -> list[str]:
    """The stripped lines ``first, ..., first + n_lines - 1`` of ``file``, which fill ``byte_range``."""
    with file.open("rb") as handle:
        handle.seek(byte_range[0])
        data = handle.read(byte_range[1] - byte_range[0])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = first + data[: err.start].count(b"\n") + 1
        raise UserError(f"{file}:{line}: invalid UTF-8 (byte {data[err.start]:#04x})") from None
    lines = text.removesuffix("\n").split("\n")
    if len(lines) != n_lines:
        raise UserError(f"{file} changed while it was being prepared (lines {first + 1}-{first + n_lines})")
    return [line.strip() for line in lines]


def _flat(ids: list[list[int]], dtype: np.dtype) -> np.ndarray:
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=sum(map(len, ids)))


# --- 4. the arrays, the validation split, the manifest -----------------------------------------------


def _assemble(
    out: Path, settings: PrepareSettings, chunks: list[Path], files: tuple[Path, Path], dtype
) -> dict:
    """Concatenate the chunks into the training split's ``.src/.tgt/.idx.npy``; its counts."""
    split = settings.train_split
    sizes = np.zeros(3, np.int64)  # source tokens, target tokens, pairs
    counts = np.zeros(4, np.int64)
    for chunk in chunks:
        with np.load(chunk) as part:
            sizes += (len(part["src"]), len(part["tgt"]), len(part["lengths"]))
            counts += part["counts"]
    source = f"{files[0].parent}/{split}.{{{files[0].suffix[1:]},{files[1].suffix[1:]}}}"
    stats = CorpusStats(source, *map(int, counts), settings.max_sentence_tokens, settings.max_ratio)
    if not sizes[2]:
        raise UserError(f"empty corpus after filtering: {stats.summary()}")
    with (
        _filled(out / f"{split}.src.npy", dtype, (sizes[0],)) as src,
        _filled(out / f"{split}.tgt.npy", dtype, (sizes[1],)) as tgt,
        _filled(out / f"{split}.idx.npy", np.int64, (sizes[2] + 1, 2)) as idx,
        _filled(out / f"{split}.len.npy", np.int32, (sizes[2], 2)) as lengths_out,
    ):
        at = np.zeros(3, np.int64)  # where the next chunk goes: source, target, pair
        idx[0] = 0
        for chunk in chunks:
            with np.load(chunk) as part:
                lengths = part["lengths"]
                src[at[0] : at[0] + len(part["src"])] = part["src"]
                tgt[at[1] : at[1] + len(part["tgt"])] = part["tgt"]
                idx[at[2] + 1 : at[2] + 1 + len(lengths)] = at[:2] + np.cumsum(lengths, axis=0)
                lengths_out[at[2] : at[2] + len(lengths)] = lengths
                at += (len(part["src"]), len(part["tgt"]), len(lengths))
    return _split_record(stats, sizes)


class _filled:
    """A new ``.npy`` file as a writable memory map, renamed into place when the block ends cleanly."""

    def __init__(self, path: Path, dtype, shape) -> None:
        self.path, self.part = path, path.with_name(f".{path.name}.tmp-{os.getpid()}")
        self.array = np.lib.format.open_memmap(
            self.part, mode="w+", dtype=dtype, shape=tuple(map(int, shape))
        )

    def __enter__(self) -> np.ndarray:
        return self.array

    def __exit__(self, kind, *_) -> None:
        self.array.flush()
        del self.array
        if kind is None:
            os.replace(self.part, self.path)
        else:
            self.part.unlink(missing_ok=True)


def _split_record(stats: CorpusStats, sizes) -> dict:
    return {
        "source": stats.source,
        "pairs": int(sizes[2]),
        "src_tokens": int(sizes[0]),
        "tgt_tokens": int(sizes[1]),
        "read": stats.n_read,
        "empty": stats.n_empty,
        "too_long": stats.n_too_long,
        "bad_ratio": stats.n_bad_ratio,
        "summary": stats.summary(),
    }


def _write_valid(corpus: Path, out: Path, settings: PrepareSettings, tokenizer: Tokenizer, dtype) -> dict:
    """The validation split, every non-empty pair (not length-filtered), with its text."""
    split = settings.valid_split
    pairs, stats = read_parallel(corpus, split, settings.src_lang, settings.tgt_lang)
    src_ids = tokenizer.encode_batch([s for s, _ in pairs])
    tgt_ids = tokenizer.encode_batch([t for _, t in pairs], target=True)
    lengths = np.array([[len(s), len(t)] for s, t in zip(src_ids, tgt_ids)], np.int32).reshape(-1, 2)
    offsets = np.concatenate([np.zeros((1, 2), np.int64), np.cumsum(lengths, axis=0, dtype=np.int64)])
    arrays = {"src": _flat(src_ids, dtype), "tgt": _flat(tgt_ids, dtype), "idx": offsets, "len": lengths}
    for name, array in arrays.items():
        with atomic_file(out / f"{split}.{name}.npy", "wb") as handle:
            np.save(handle, array)
    for side, texts in (("src", [s for s, _ in pairs]), ("tgt", [t for _, t in pairs])):
        atomic_write(out / f"{split}.{side}.txt", "".join(f"{text}\n" for text in texts))
    sizes = (int(offsets[-1, 0]), int(offsets[-1, 1]), len(pairs))
    return _split_record(stats, sizes)


def _write_manifest(out, corpus, settings, *, tokenizer, splits, dtype) -> dict:
    names = [TOKENIZER_FILE] + [
        f"{split}.{part}.npy" for split in splits for part in ("src", "tgt", "idx", "len")
    ] + [f"{settings.valid_split}.{side}.txt" for side in ("src", "tgt")]  # fmt: skip
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "settings": settings.to_dict(),
        "corpus": str(corpus.resolve()),
        "tokenizer": {"pieces": tokenizer.vocab_size, "lowercases": tokenizer.lowercases},
        "dtype": dtype.name,
        "splits": splits,
        "files": {
            name: {"bytes": (out / name).stat().st_size, "sha256": file_sha256(out / name)} for name in names
        },
    }
    atomic_write(out / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return manifest
