"""``aiayn translate`` and ``aiayn evaluate``.

translate
    Reads stdin (or ``--input``), writes stdout (or ``--output``): one detokenized line per input
    line, each line split into sentences (the source language's segmenter, :mod:`aiayn.documents`)
    and translated whole (``--no-split``: each line one sentence, for sentence-per-line test sets);
    a blank input line gives a blank output line. With ``--nbest K``: K lines per input line,
    each ``score<TAB>text`` (best first; the score is log P / lp, see :mod:`aiayn.decode.search`,
    the mean over a line's sentences); a blank input line gives K blank lines, and so do the places
    of hypotheses a line does not have (under a glossary an n-best list keeps only entries that
    place the terms as well as the best). ``--alignments``
    appends `` ||| `` and the line's word alignment in Moses' ``i-j`` format. ``--format text``
    takes a plain-text document (paragraphs, line breaks and indentation kept), ``html`` and
    ``markdown`` a document of that format (markup carried to the aligned words). Nothing is cut: a
    sentence longer than the model takes is split further. Invalid UTF-8 or a NUL byte is an error
    naming the line. ``--output`` (here and in evaluate) is checked before the model loads and
    replaced only by a complete result. ``--glossary FILE`` (``source<TAB>target`` lines,
    :mod:`aiayn.decode.glossary`) makes each source term's target term appear in the translation
    (constrained beam search; the torch engine); a source term is found in its inflected forms too
    where the source language (``--source-lang``, else the checkpoint's) has simplemma's lemmas.
    ``--prefix-file FILE``: line i holds the start of line i's translation (blank: none); the model
    completes it (a line split into sentences: its first sentence's).
    ``--scores`` appends `` ||| `` the line's confidence (the probability form, then the mean
    log-probability of its tokens) and `` ||| `` each word's probability (words of the translation,
    split at spaces). ``--file IN --out OUT`` translates a whole file of one of the kinds of
    :mod:`aiayn.documents.files` (from its extension; OUT has the same one) into OUT, its formatting
    carried to the translated words, all its sentences in one stream.
    ``--input FILE --output FILE`` (lines, not ``--format`` or ``--prefix-file``) runs as a job
    (:mod:`aiayn.jobs`): chunks of ``--chunk-lines`` committed in ``OUTPUT.job/``, the same command
    resumes after a kill; ``--num-shards/--shard-id`` or torchrun's ranks share the chunks out;
    ``--input-format tsv|jsonl`` translates a column or a field; ``.gz/.xz/.zst`` by the names.
evaluate
    Translates ``--src`` and scores it against ``--ref``: sacreBLEU BLEU and chrF (with
    signatures) on detokenized text, plus the Multi30k literature's tokenized lowercased BLEU,
    labelled as not comparable.

Both take ``--engine torch|ctranslate2`` (:mod:`aiayn.decode.backends`): ``ctranslate2`` translates
with the CTranslate2 export of the checkpoint (made on first use, reused while the checkpoint
stays the same; ``--ct2-dir``, ``--compute-type``). Options it cannot honour are refused.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Callable

from aiayn.decode.align import moses
from aiayn.decode.backends import (
    FLAGS,
    check_backend,
    check_ct2_options,
    check_torch_compute,
    load_backend,
    require_ctranslate2,
)
from aiayn.decode.glossary import read_glossary
from aiayn.decode.request import Wanted
from aiayn.decode.search import DecodeOptions
from aiayn.decode.translator import LINE_BREAKS
from aiayn.device import resolve_device
from aiayn.documents.types import FORMATS
from aiayn.errors import UserError, naming_flags
from aiayn.io import atomic_file, output_lines, read_lines, stdin_blocks
from aiayn.jobs import (
    Job,
    JobSettings,
    Progress,
    checkpoint_identity,
    chunk_seed,
    launched_shards,
    run_job,
    wait_complete,
)
from aiayn.jobs.records import FORMATS as RECORD_FORMATS
from aiayn.loading import model_languages


def register(subparsers) -> None:
    _register_translate(subparsers)
    _register_evaluate(subparsers)


# --- shared options and helpers -----------------------------------------------------------------


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="checkpoint or run directory")
    parser.add_argument(
        "--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto, the GPU if there is one)"
    )
    parser.add_argument("--beam", type=int, default=4, help="beam size; 1 = greedy (default: 4, the paper's)")
    parser.add_argument(
        "--alpha", type=float, default=0.6, help="length penalty alpha; 0 = none (default: 0.6)"
    )
    parser.add_argument("--batch-tokens", type=int, default=4096, help="padded source tokens per batch")
    parser.add_argument(
        "--max-len-a", type=float, default=1.0, help="max output length = a * source length + b"
    )
    parser.add_argument("--max-len-b", type=int, default=50, help="(default: a=1, b=50, the paper's)")
    parser.add_argument("--no-cache", action="store_true", help="recompute the decoder prefix at each step")
    parser.add_argument(
        "--engine",
        default="torch",
        help="torch, or ctranslate2: the CTranslate2 export of the checkpoint, made on first use "
        "(needs `pip install ctranslate2`; default: torch)",
    )
    parser.add_argument(
        "--ct2-dir",
        help="with --engine ctranslate2: where the export is (made there when missing or made from "
        "another checkpoint; default: RUN/ct2, or ct2-NAME beside a checkpoint directory NAME)",
    )
    parser.add_argument(
        "--compute-type",
        help="the arithmetic the engine runs: torch: int8 (weights quantized per row as they load, "
        "on the CPU), bfloat16 (where the CPU has AVX512-BF16 or AMX, or on an Ampere or newer GPU); "
        "ctranslate2: int8, float32 (on a GPU also float16, int8_float16), converting "
        "the stored weights as they load; default: the checkpoint's (torch), the type the export "
        "stores (ctranslate2: aiayn export --quantization; float32 for the export made on first use)",
    )


def _engine_loader(args, **overrides) -> tuple[DecodeOptions, Callable]:
    """Check the decoding options now; the returned function loads the backend."""
    device = resolve_device(args.device, "--device")
    if args.batch_tokens < 1:
        raise UserError("--batch-tokens: must be >= 1")
    options = DecodeOptions(
        beam=args.beam,
        alpha=args.alpha,
        max_len_a=args.max_len_a,
        max_len_b=args.max_len_b,
        use_cache=not args.no_cache,
        **overrides,
    )
    check_backend(args.engine, args.compute_type or "default")
    if args.engine == "torch" and args.compute_type == "int8" and args.no_cache:
        raise UserError("--compute-type int8 decodes on the key/value cache: drop --no-cache")
    if args.engine == "torch" and args.compute_type:
        check_torch_compute(args.compute_type, device)
    _check_engine_options(args, options)

    def load():
        return load_backend(
            args.checkpoint,
            args.engine,
            device=device,
            ct2_dir=args.ct2_dir,
            compute_type=args.compute_type or "default",
            batch_tokens=args.batch_tokens,
            warn=_once(),
        )

    return options, load


def _once() -> Callable[[str], None]:
    """A warning printer that says each message once (a run translates stdin block by block)."""
    said: set[str] = set()

    def warn(message: str) -> None:
        if message not in said:
            said.add(message)
            print(f"aiayn: warning: {message}", file=sys.stderr)

    return warn


def _check_engine_options(args, options: DecodeOptions) -> None:
    """Options for one engine only are refused with the other."""
    if args.engine == "torch":
        if args.ct2_dir is not None:
            raise UserError("--ct2-dir needs --engine ctranslate2")
        return
    require_ctranslate2()  # not installed: say how, before any work
    check_ct2_options(options)


def _run_with_progress(engine, lines: list[str], enabled, fn, total: int | None = None):
    """``fn(lines)`` with a progress bar of sentences (``total`` when known: lines split into
    sentences are counted as they are translated); ``enabled`` a function: told them instead."""
    if callable(enabled):
        engine.progress = enabled
        return fn(lines)
    from tqdm import tqdm  # here: only a run draws a bar, and `aiayn --help` stays fast

    with tqdm(total=total, unit="sent", file=sys.stderr, disable=not enabled) as bar:
        engine.progress = bar.update
        return fn(lines)


# --- translate ------------------------------------------------------------------------------------


def _register_translate(subparsers) -> None:
    p = subparsers.add_parser(
        "translate",
        help="translate text with a trained model",
        description="Translate lines of text (stdin -> stdout by default).",
    )
    _add_model_options(p)
    p.add_argument("--input", help="input file (default: stdin)")
    p.add_argument(
        "--file",
        help="translate a whole file, its kind from its extension (.txt, .html, .md, .docx, .pptx, .odt, "
        ".odp, .epub, .srt; formatting carried to the translated words), into --out",
    )
    p.add_argument("--out", help="with --file: the translated file (the same extension, not --file itself)")
    p.add_argument("--output", help="output file (default: stdout)")
    p.add_argument("--nbest", type=int, default=1, help="K hypotheses per line, as 'score<TAB>text'")
    p.add_argument(
        "--buffer-size",
        type=int,
        default=2000,
        help="stdin is translated as it arrives, in blocks of the lines already waiting, at most "
        "this many (default: 2000); with --sample all of stdin is read first",
    )
    p.add_argument("--sample", action="store_true", help="sample instead of beam search")
    # Sampling options default to None (= DecodeOptions' defaults), so that only given ones need --sample.
    p.add_argument("--temperature", type=float, help="with --sample: divide the log-probs by it (default: 1)")
    p.add_argument(
        "--top-k", type=int, help="with --sample: the k most probable tokens only (default: 0 = all)"
    )
    p.add_argument("--top-p", type=float, help="with --sample: nucleus sampling threshold (default: 1 = off)")
    p.add_argument("--seed", type=int, help="with --sample: random seed (default: a fresh one per run)")
    p.add_argument(
        "--format",
        help="translate a document: text (paragraphs, line breaks and indentation kept), html or "
        "markdown (markup carried to the translated words); default: one output line per input line",
    )
    p.add_argument(
        "--no-split",
        action="store_true",
        help="each input line is one sentence (sentence-per-line test sets); default: lines are split "
        "into sentences",
    )
    p.add_argument(
        "--alignments",
        action="store_true",
        help="append ' ||| ' and each line's word alignment, source-target word pairs in Moses' i-j format",
    )
    p.add_argument(
        "--glossary",
        help="a file of 'source term<TAB>target term' lines: where a source term occurs (whole words, any "
        "case, inflected forms in the source language), its target term appears in the translation "
        "(constrained beam search; torch engine)",
    )
    p.add_argument(
        "--prefix-file",
        help="line i holds the start of input line i's translation (blank: none); the model completes "
        "it (its first sentence's, where the line is split into sentences)",
    )
    p.add_argument(
        "--scores",
        action="store_true",
        help="append ' ||| ' each line's confidence (probability, then mean log-probability per token) "
        "and ' ||| ' each word's probability",
    )
    p.add_argument(
        "--source-lang",
        help="the source language for sentence splitting and glossary terms' inflected forms (default: "
        "the checkpoint's, else a language-neutral rule and each term's own form)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    jobs = p.add_argument_group(
        "jobs (--input FILE --output FILE: committed in chunks, resumed by the same command after a kill; "
        "docs/translating.md, 'Corpora of any size')"
    )
    jobs.add_argument(
        "--chunk-lines",
        type=int,
        help=f"input lines a chunk: the unit committed, resumed and shared out (default: {CHUNK_LINES:,})",
    )
    jobs.add_argument(
        "--num-shards",
        type=int,
        help="with --shard-id: translate only chunks k with k %% N == I (a SLURM job array's task), "
        "then `aiayn jobs merge OUTPUT` once every shard is done",
    )
    jobs.add_argument("--shard-id", type=int, help="this shard, from 0 to --num-shards - 1")
    jobs.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the job's chunks on a Ray cluster (the ray extra): auto (the cluster `ray start` made), "
        "local (one started in this process) or HOST:PORT; one model per actor",
    )
    jobs.add_argument(
        "--actors", type=int, help="with --ray: actors (default: one per node, or per GPU share)"
    )
    jobs.add_argument(
        "--gpus-per-actor",
        type=float,
        help="with --ray: GPUs each actor holds (default: 1 where the cluster has GPUs, else 0)",
    )
    jobs.add_argument(
        "--input-format",
        help=f"{', '.join(RECORD_FORMATS)}: plain lines (default); tsv: --column N translated, the other "
        "columns kept; jsonl: --field NAME translated, the other fields kept",
    )
    jobs.add_argument("--column", type=int, help="with --input-format tsv: the column to translate, from 1")
    jobs.add_argument("--field", help="with --input-format jsonl: the string field to translate")
    jobs.add_argument(
        "--output-field", help="with --input-format jsonl: write the translation here (default: --field)"
    )
    p.set_defaults(func=run_translate)


CHUNK_LINES = 10_000
#: The flags of a job (``--input FILE --output FILE``), with where they stand in ``args``.
JOB_FLAGS = {
    "--chunk-lines": "chunk_lines",
    "--num-shards": "num_shards",
    "--shard-id": "shard_id",
    "--input-format": "input_format",
    "--column": "column",
    "--field": "field",
    "--output-field": "output_field",
    "--ray": "ray",
    "--actors": "actors",
    "--gpus-per-actor": "gpus_per_actor",
}


SAMPLING_OPTIONS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}


def _sampling(args) -> dict:
    """The sampling options given on the command line; each needs ``--sample``."""
    given = {name: getattr(args, name) for name in SAMPLING_OPTIONS if getattr(args, name) is not None}
    if given and not args.sample:
        raise UserError(f"{SAMPLING_OPTIONS[next(iter(given))]} needs --sample")
    return {"sample": args.sample, **given}


@naming_flags(FLAGS)
def run_translate(args) -> int:
    if args.file is not None or args.out is not None:
        return _translate_file(args)
    _check_document_flags(args)
    if _job_mode(args):
        return _translate_job(args)
    controls = (
        {"glossary": read_glossary(args.glossary), "glossary_language": _source_language(args)}
        if args.glossary
        else {}
    )
    options, load = _engine_loader(args, nbest=args.nbest, **_sampling(args), **controls)
    prefixes = read_lines(args.prefix_file) if args.prefix_file is not None else None
    with output_lines(args.output) as write:
        if prefixes is not None:
            write(_prefixed(args, _documents(args, load), options, prefixes))
            return 0
        documents = _documents(args, load)
        if args.format in ("html", "markdown"):  # one document, read whole
            text = "\n".join(read_lines(args.input))
            write([documents.translate([text], options, fmt=args.format)[0].text])
        elif args.format == "text":
            for block in _paragraph_blocks(_input_blocks(args), args.buffer_size):
                write(documents.translate(["\n".join(block)], options)[0].text.split("\n"))
        # stdin is streamed; sampling reads all first: its batches stay fixed
        elif args.input is None and not args.sample:
            for first, lines in _numbered(stdin_blocks(args.buffer_size)):
                write(_translate_lines(documents, options, lines, first, args, progress=False))
        else:
            lines = read_lines(args.input)
            progress = args.input is not None and not args.quiet
            write(_translate_lines(documents, options, lines, 1, args, progress=progress))
    return 0


def _job_mode(args) -> bool:
    """Whether this run is a job (:mod:`aiayn.jobs`): ``--input`` and ``--output`` files, lines
    translated line by line (``--format`` documents and ``--prefix-file`` are read whole, as
    before); an output that is a device or a pipe (``/dev/stdout``) is written as before too.
    The job flags need a job."""
    output = Path(args.output).absolute() if args.output is not None else None
    job = (
        args.input is not None
        and output is not None
        and args.format is None
        and args.prefix_file is None
        and not str(output).startswith(("/dev/", "/proc/"))  # /dev/stdout: a file when stdout is one
        and (output.is_file() or not output.exists() or output.is_dir())
    )
    if not job:
        for flag, name in JOB_FLAGS.items():
            if getattr(args, name) is not None:
                why = (
                    f"not with --format {args.format}"
                    if args.format is not None
                    else "not with --prefix-file"
                    if args.prefix_file is not None
                    else "needs --input FILE and --output FILE (a job over files)"
                )
                raise UserError(f"{flag}: {why}")
    return job


def _translate_job(args) -> int:
    """``--input FILE --output FILE`` as a job: chunks committed in ``OUTPUT.job/``, the job resumed
    where a run was stopped, its shard only with ``--num-shards``/``--shard-id`` or under torchrun,
    the output written whole at the end (by rank 0 under torchrun; by `aiayn jobs merge` for shards)."""
    shards = _job_shards(args)
    launched = launched_shards()
    record = {
        "input_format": args.input_format or "plain",
        "column": args.column,
        "field": args.field,
        "output_field": args.output_field,
    }
    annotations = (("--nbest", args.nbest > 1), ("--scores", args.scores), ("--alignments", args.alignments))
    for flag, given in annotations:
        if given and record["input_format"] != "plain":
            raise UserError(f"{flag}: plain lines only; not with --input-format {record['input_format']}")
    if args.sample and args.seed is None:
        raise UserError(
            "--sample: a job needs --seed (each chunk samples from the seed and its number, so that a "
            "resumed job draws what an uninterrupted one would)"
        )
    options, load = _job_engine(args)
    settings = JobSettings(
        checkpoint=str(args.checkpoint),
        checkpoint_identity=checkpoint_identity(args.checkpoint),
        engine=args.engine,
        compute_type=args.compute_type or "default",
        decode=_decode_settings(args, options),
        chunk_lines=CHUNK_LINES if args.chunk_lines is None else args.chunk_lines,
        **record,
    )
    if args.ray is None and (args.actors is not None or args.gpus_per_actor is not None):
        raise UserError(f"{'--actors' if args.actors is not None else '--gpus-per-actor'}: needs --ray")
    if args.ray is not None and (shards is not None or launched):
        raise UserError("--ray: the cluster shares the chunks out; not with --num-shards or torchrun")
    job = Job.open(Path(args.input), Path(args.output), settings, shards=shards or launched or (1, 0))
    rank = launched[1] if launched else 0
    pending = job.pending()
    if pending:
        mine = [k for k in range(job.shards[1], job.chunks, job.shards[0])]
        todo = sum(job.lines_in(k) for k in pending)
        total = sum(job.lines_in(k) for k in mine)
        label = f"aiayn: shard {job.shards[1]} of {job.shards[0]}" if job.shards[0] > 1 else "aiayn"
        progress = Progress(total, total - todo, enabled=not args.quiet and rank == 0, label=label)
        try:
            if args.ray is not None:
                from aiayn.jobs.ray import run_on_ray  # the ray extra: only for a job on a cluster

                gpus = args.gpus_per_actor if args.gpus_per_actor is not None else 0.0
                on_ray = OnRay(args, job.chunk_lines)
                run_on_ray(
                    job, on_ray, args.ray, actors=args.actors, gpus_per_actor=gpus, progress=progress.lines
                )
                return 0
            documents = _documents(args, load)
            run_job(
                job, _chunk_translator(args, options, documents, job.first_line, progress.sentences), progress
            )
        finally:
            progress.close()
    if shards is not None:
        if not args.quiet:
            print(
                f"aiayn: shard {shards[1]} of {shards[0]} done; once every shard is: "
                f"aiayn jobs merge {args.output}",
                file=sys.stderr,
            )
        return 0
    if rank != 0:
        return 0
    if launched:
        wait_complete(job)
    job.finish()
    return 0


def _job_engine(args):
    """A job's decoding options and its engine's loader (the glossary read, the sampling checked)."""
    controls = (
        {"glossary": read_glossary(args.glossary), "glossary_language": _source_language(args)}
        if args.glossary
        else {}
    )
    return _engine_loader(args, nbest=args.nbest, **_sampling(args), **controls)


def _chunk_translator(args, options, documents, first_line, progress):
    """A job's chunk ``k`` translated as ``aiayn translate`` translates lines: ``(k, texts)`` ->
    output lines; sampling from a seed of its own (the same in a resumed run)."""

    def translate(k: int, texts: list[str]) -> list[str]:
        chunk_options = options
        if args.sample:
            chunk_options = dataclasses.replace(options, seed=chunk_seed(args.seed, k))
        return _translate_lines(documents, chunk_options, texts, first_line(k), args, progress=progress)

    return translate


@dataclasses.dataclass
class OnRay:
    """What a Ray actor runs once (``--ray``): the model loaded, then the job's chunks translated as
    in one process. Pickled to the actors by reference to this module (aiayn installed on every
    node); the chunks are ``chunk_lines`` long, so chunk ``k`` starts at line ``k * chunk_lines + 1``."""

    args: argparse.Namespace
    chunk_lines: int

    def __call__(self):
        options, load = _job_engine(self.args)
        documents = _documents(self.args, load)
        return _chunk_translator(self.args, options, documents, self._first_line, False)

    def _first_line(self, k: int) -> int:
        return k * self.chunk_lines + 1


def _job_shards(args) -> tuple[int, int] | None:
    """``(--num-shards, --shard-id)``, given together (None: not given)."""
    if (args.num_shards is None) != (args.shard_id is None):
        pair = ("--num-shards", "--shard-id")
        given, needed = pair if args.shard_id is None else pair[::-1]
        raise UserError(f"{given}: needs {needed}")
    if args.num_shards is None:
        return None
    if launched_shards() is not None:
        raise UserError("--num-shards: not under torchrun (its processes are the shards)")
    if args.num_shards < 1:
        raise UserError("--num-shards: must be >= 1")
    return args.num_shards, args.shard_id


def _decode_settings(args, options: DecodeOptions) -> dict:
    """What of the decoding decides a job's output (compared when the job is resumed)."""
    glossary = None
    if args.glossary:
        glossary = hashlib.sha256(Path(args.glossary).read_bytes()).hexdigest()
    return {
        "beam": options.beam,
        "alpha": options.alpha,
        "max_len_a": options.max_len_a,
        "max_len_b": options.max_len_b,
        "use_cache": options.use_cache,
        "batch_tokens": args.batch_tokens,
        "nbest": args.nbest,
        "sample": args.sample,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
        "glossary_sha256": glossary,
        "source_lang": _source_language(args),
        "split": not args.no_split,
        "scores": args.scores,
        "alignments": args.alignments,
    }


def _translate_file(args) -> int:
    """``--file IN --out OUT``: IN read and checked, translated whole, OUT written only when done."""
    from aiayn.documents.files import read_file  # here: its libraries load only for a file

    _check_file_flags(args)
    controls = (
        {"glossary": read_glossary(args.glossary), "glossary_language": _source_language(args)}
        if args.glossary
        else {}
    )
    options, load = _engine_loader(args, **_sampling(args), **controls)
    try:
        data = Path(args.file).read_bytes()
    except OSError as err:
        raise UserError(f"cannot read {args.file}: {err.strerror}") from None
    source = read_file(data, Path(args.file).name)
    with atomic_file(args.out, "wb") as handle:
        documents = _documents(args, load)
        result = source.translate(documents, options)
        handle.write(result.data)
    print(
        f"aiayn: {args.file} -> {args.out}: {result.sentences} sentences, {result.characters} characters",
        file=sys.stderr,
    )
    return 0


def _check_file_flags(args) -> None:
    """``--file`` and ``--out`` go together, with no flag of line-by-line translation."""
    if args.file is None:
        raise UserError("--out: needs --file (--output writes line-by-line translation)")
    if args.out is None:
        raise UserError("--file: needs --out, the translated file to write")
    given = [
        flag
        for flag, value in (
            ("--input", args.input is not None),
            ("--output", args.output is not None),
            ("--format", args.format is not None),
            ("--nbest", args.nbest != 1),
            ("--alignments", args.alignments),
            ("--scores", args.scores),
            ("--prefix-file", args.prefix_file is not None),
        )
        if value
    ]
    if given:
        raise UserError(f"{given[0]}: not with --file (a file is translated whole into --out)")
    source, out = Path(args.file), Path(args.out)
    if source.suffix.lower() != out.suffix.lower():
        raise UserError(
            f"--out: {args.out} must have the extension of {args.file} ({source.suffix or 'none'})"
        )
    if out.resolve() == source.resolve() or (out.exists() and source.exists() and out.samefile(source)):
        raise UserError(f"--out: {args.out} is --file itself; write the translation to another file")


def _prefixed(args, documents, options: DecodeOptions, prefixes: list[str]) -> list[str]:
    """The input read whole, each line translated from its prefix (as many lines as prefixes)."""
    lines = read_lines(args.input)
    if len(prefixes) != len(lines):
        name = args.input or "the input"
        raise UserError(f"--prefix-file: {args.prefix_file} has {len(prefixes)} lines, {name} {len(lines)}")
    return _translate_lines(
        documents, options, lines, 1, args, progress=args.input is not None, prefixes=prefixes
    )


def _check_document_flags(args) -> None:
    if args.buffer_size < 1:
        raise UserError("--buffer-size: must be >= 1")
    if args.format is not None and args.format not in FORMATS:
        raise UserError(f"--format: unknown format {args.format!r}; valid: {', '.join(FORMATS)}")
    if args.format is not None and (args.alignments or args.nbest > 1):
        flag = "--alignments" if args.alignments else "--nbest"
        raise UserError(f"{flag}: one output line per input line only; not with --format {args.format}")
    for flag, given in (("--alignments", args.alignments), ("--scores", args.scores)):
        if given and args.nbest > 1:
            raise UserError(f"{flag}: for the best translation only; not with --nbest")
    for flag, given in (("--scores", args.scores), ("--prefix-file", args.prefix_file is not None)):
        if given and args.format is not None:
            raise UserError(f"{flag}: one output line per input line only; not with --format {args.format}")


def _documents(args, load):
    """The backend (loaded now) behind a document translator for the checkpoint's source language."""
    # here: the formats' parsers (markupever, markdown-it) would slow every `aiayn` start-up
    from aiayn.documents.translate import DocumentTranslator

    return DocumentTranslator(load(), language=_source_language(args), split=not args.no_split)


def _source_language(args) -> str | None:
    """``--source-lang``, else the checkpoint's source language (None where it records none)."""
    return args.source_lang or model_languages(args.checkpoint)[0]


def _numbered(blocks):
    """``(first line number, lines)`` for each block."""
    first = 1
    for lines in blocks:
        yield first, lines
        first += len(lines)


def _input_blocks(args):
    """The input's lines in blocks, as they come (a file is read as a stream too)."""
    if args.input is None:
        yield from stdin_blocks(args.buffer_size)
        return
    try:
        handle = open(args.input, "rb")
    except OSError as err:
        raise UserError(f"cannot read {args.input}: {err.strerror}") from None
    with handle:
        yield from stdin_blocks(args.buffer_size, fd=handle.fileno(), name=args.input)


def _paragraph_blocks(blocks, size: int):
    """Lines regrouped into blocks that end at a blank line (or at the input's end), so that no
    paragraph is cut between two blocks; a paragraph of more than 10 * ``size`` lines is cut after a
    line that ends a sentence, or after 20 * ``size`` lines at the latest."""
    pending: list[str] = []
    for lines in blocks:
        pending += lines
        while len(pending) >= size:
            cut = _block_end(pending, size)
            if cut is None:
                break
            yield pending[:cut]
            pending = pending[cut:]
    if pending:
        yield pending


def _block_end(lines: list[str], size: int) -> int | None:
    """Where a block of at least ``size`` lines may end: after its last blank line, else (a long
    paragraph) after a line ending a sentence, else at 20 * ``size`` lines; None: read on."""
    for end in range(len(lines), size - 1, -1):
        if not lines[end - 1].strip():
            return end
    if len(lines) >= 10 * size:
        for end in range(len(lines), size - 1, -1):
            if lines[end - 1].rstrip().endswith((".", "!", "?", "\u3002")):
                return end
    return 20 * size if len(lines) >= 20 * size else None


def _translate_lines(
    documents, options: DecodeOptions, lines: list[str], first: int, args, progress, prefixes=None
) -> list[str]:
    """Output lines for ``lines`` (the first is line ``first``): one translation each (with
    `` ||| i-j ...`` for ``--alignments``, `` ||| `` confidence and word probabilities for
    ``--scores``), or ``nbest`` "score<TAB>text" lines each. ``progress``: a bar of sentences, or a
    function told the sentences of each batch."""
    results = _run_with_progress(
        documents,
        lines,
        progress,
        lambda todo: documents.translate(
            todo,
            options,
            wanted=Wanted(scores=options.nbest > 1, confidence=args.scores, alignment=args.alignments),
            prefixes=prefixes,
            where=lambda d, _: f"line {first + d}",
        ),
    )
    if args.alignments or args.scores:
        return [_annotated_line(r, line, args.alignments, args.scores) for r, line in zip(results, lines)]
    if options.nbest == 1:
        return [_one_line(r.text) for r in results]
    return [_nbest_line(r, line, k) for r, line in zip(results, lines) for k in range(options.nbest)]


def _annotated_line(result, line: str, alignments: bool, scores: bool) -> str:
    """``translation ||| i-j ...`` (Marian's layout) and/or ``||| probability log-prob ||| word
    probabilities``; a blank line for a blank input line."""
    if not line.strip():
        return ""
    fields = [_one_line(result.text)]
    if alignments:
        fields.append(moses(result.alignment))
    if scores:
        confidence = result.confidence
        fields.append(f"{math.exp(confidence):.4f} {confidence:.4f}")
        fields.append(" ".join(f"{p:.4f}" for _, p in result.words))
    return " ||| ".join(fields)


def _one_line(text: str) -> str:
    """A line's translation as one line (a line break character among its gaps becomes a space)."""
    return LINE_BREAKS.sub(" ", text).strip()


def _nbest_line(result, line: str, k: int) -> str:
    """The k-th "score<TAB>text" line of ``line``'s n-best (blank past the hypotheses found)."""
    if not line.strip() or k >= len(result.nbest):
        return ""
    score, text = result.nbest[k]
    return f"{score:.6f}\t{_one_line(text)}"


# --- evaluate -------------------------------------------------------------------------------------


def _register_evaluate(subparsers) -> None:
    p = subparsers.add_parser(
        "evaluate",
        help="translate a test set and score it with sacreBLEU",
        description="BLEU and chrF (sacreBLEU, detokenized) of translations of --src against --ref.",
    )
    _add_model_options(p)
    p.add_argument("--src", required=True, help="source sentences, one per line")
    p.add_argument("--ref", required=True, help="reference translations, one per line")
    p.add_argument(
        "--lang",
        default=None,
        help="target language for Moses tokenization (default: --ref's extension, e.g. 'de' for test.de)",
    )
    p.add_argument("--json", action="store_true", help="print the scores as one JSON object")
    p.add_argument("--output", help="also write the translations to this file")
    p.set_defaults(func=run_evaluate)


@naming_flags(FLAGS)
def run_evaluate(args) -> int:
    from aiayn.evaluate import TOKENIZED_LABEL, sacrebleu_scores, tokenized_bleu  # sacrebleu: slow to import

    src, ref = read_lines(args.src), read_lines(args.ref)
    if len(src) != len(ref):
        raise UserError(f"{args.src} has {len(src)} lines but {args.ref} has {len(ref)}")
    for path, lines in ((args.src, src), (args.ref, ref)):
        if not any(line.strip() for line in lines):
            raise UserError(f"{path}: nothing to evaluate ({'only blank lines' if lines else 'empty file'})")
    options, load = _engine_loader(args)
    with output_lines(args.output) if args.output else contextlib.nullcontext(lambda _: None) as write:
        engine = load()
        total = sum(1 for line in src if line.strip())
        found = _run_with_progress(engine, src, True, lambda todo: engine.translate(todo, options), total)
        hyps = [translation.text for translation in found]
        write(hyps)
    scores = sacrebleu_scores(
        hyps, ref, lowercase=engine.tokenizer.lowercases
    )  # a lowercasing model: case:lc
    lang = args.lang or Path(args.ref).suffix.lstrip(".") or "en"
    scores["tokenized_bleu"] = tokenized_bleu(hyps, ref, lang)
    scores["sentences"] = len(hyps)
    print(json.dumps(scores, indent=2) if args.json else _report(scores, TOKENIZED_LABEL, lang))
    return 0


def _report(scores: dict, label: str, lang: str) -> str:
    return "\n".join(
        [
            f"BLEU = {scores['bleu']:.2f}   {scores['bleu_signature']}",
            f"chrF = {scores['chrf']:.2f}   {scores['chrf_signature']}",
            f"{label} [{lang}] = {scores['tokenized_bleu']:.2f}",
            f"({scores['sentences']} sentences)",
        ]
    )
