"""``aiayn translate``, ``aiayn evaluate`` and ``aiayn plot``.

translate
    Reads stdin (or ``--input``), writes stdout (or ``--output``): one detokenized line per input
    line; a blank input line gives a blank output line. With ``--nbest K``: K lines per input line,
    each ``score<TAB>text`` (best first; the score is log P / lp, see :mod:`aiayn.decode.search`);
    a blank input line gives K blank lines. Invalid UTF-8 is an error naming the line; a source
    longer than the model's max_len is truncated with a warning naming the line. ``--output`` (here
    and in evaluate) is checked before the model loads and replaced only by a complete result.
evaluate
    Translates ``--src`` and scores it against ``--ref``: sacreBLEU BLEU and chrF (with
    signatures) on detokenized text, plus the Multi30k literature's tokenized lowercased BLEU,
    labelled as not comparable.
plot
    ``attention``, ``positional-encoding`` and ``curves`` pictures (see :mod:`aiayn.plots`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import torch

from aiayn.device import resolve_device
from aiayn.errors import UserError

if TYPE_CHECKING:
    from aiayn.decode.translator import Translator


def register(subparsers) -> None:
    _register_translate(subparsers)
    _register_evaluate(subparsers)
    _register_plot(subparsers)


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


def _translator_loader(args, **overrides) -> Callable[[], "Translator"]:
    """Check the decoding options now; the returned function loads the model into a Translator."""
    from aiayn.checkpoint import load_translation_model
    from aiayn.decode.search import DecodeOptions
    from aiayn.decode.translator import Translator

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

    def load() -> Translator:
        model, tokenizer, _ = load_translation_model(args.checkpoint, device=device)
        return Translator(model, tokenizer, device, args.batch_tokens, options)

    return load


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
    return _decode_lines(lines, name)


def stdin_blocks(max_lines: int, fd: int | None = None) -> Iterator[list[str]]:
    """Lines of stdin (or of the file descriptor ``fd``) in blocks, as they arrive: wait for one whole
    line, then take the lines already waiting behind it, up to ``max_lines`` per block. Typed or
    piped one at a time, each line is a block of its own and is translated at once; a file given as
    stdin (``< file``) comes in blocks of exactly ``max_lines`` (the last one shorter), a pipe in
    blocks of what it holds when the block is taken (at most ``max_lines``). Invalid UTF-8 names the line,
    counted from the first. A ``sys.stdin`` without a file descriptor (replaced by a library user)
    is read whole, one block."""
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
        yield _decode_lines(lines, "<stdin>", first=number + 1)
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


def _decode_lines(lines: list[bytes], name: str, first: int = 1) -> list[str]:
    """UTF-8 text of ``lines`` (a CR before the newline dropped), numbered from ``first`` for errors."""
    return [_decode_line(line.rstrip(b"\r"), name, number) for number, line in enumerate(lines, first)]


def _decode_line(line: bytes, name: str, number: int) -> str:
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
        with _open_for_writing(given, path) as handle:
            yield _writer(handle)
        return
    target = given.resolve() if given.is_file() else given
    part = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with _open_for_writing(part, path) as handle:
            yield _writer(handle)
        if target.is_file():
            shutil.copymode(target, part)
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)


def _open_for_writing(file: Path, name: str):
    try:
        return open(file, "w", encoding="utf-8")
    except OSError as err:
        raise UserError(f"cannot write {name}: {err.strerror}") from None


def _writer(handle) -> Callable[[list[str]], None]:
    def write(lines: list[str]) -> None:
        handle.write("".join(line + "\n" for line in lines))
        handle.flush()  # a streamed block reaches the reader at once

    return write


def _run_with_progress(translator, lines: list[str], enabled: bool, fn):
    from tqdm import tqdm

    with tqdm(
        total=sum(1 for line in lines if line.strip()), unit="sent", file=sys.stderr, disable=not enabled
    ) as bar:
        translator.progress = bar.update
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
    p.set_defaults(func=run_translate)


SAMPLING_OPTIONS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}


def _sampling(args) -> dict:
    """The sampling options given on the command line; each needs ``--sample``."""
    given = {name: getattr(args, name) for name in SAMPLING_OPTIONS if getattr(args, name) is not None}
    if given and not args.sample:
        raise UserError(f"{SAMPLING_OPTIONS[next(iter(given))]} needs --sample")
    return {"sample": args.sample, **given}


def run_translate(args) -> int:
    load = _translator_loader(args, nbest=args.nbest, **_sampling(args))
    if args.buffer_size < 1:
        raise UserError("--buffer-size: must be >= 1")
    with output_lines(args.output) as write:
        if args.input is None and not args.sample:  # stream; sampling reads all first: its batches stay fixed
            translator = load()
            for lines in stdin_blocks(args.buffer_size):
                write(_translate_lines(translator, lines, args.nbest, progress=False))
        else:
            lines = read_lines(args.input)
            write(_translate_lines(load(), lines, args.nbest, progress=args.input is not None))
    return 0


def _translate_lines(translator, lines: list[str], nbest: int, progress: bool) -> list[str]:
    """Output lines for ``lines``: one translation each, or ``nbest`` "score<TAB>text" lines each."""
    if nbest == 1:
        return _run_with_progress(translator, lines, progress, translator.translate)
    hypotheses = _run_with_progress(translator, lines, progress, translator.translate_nbest)
    return [_nbest_line(hyps, k) for hyps in hypotheses for k in range(nbest)]


def _nbest_line(hyps: list[tuple[float, str]], k: int) -> str:
    return f"{hyps[k][0]:.6f}\t{hyps[k][1]}" if k < len(hyps) else ""


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


def run_evaluate(args) -> int:
    from aiayn.evaluate import TOKENIZED_LABEL, sacrebleu_scores, tokenized_bleu

    src, ref = read_lines(args.src), read_lines(args.ref)
    if len(src) != len(ref):
        raise UserError(f"{args.src} has {len(src)} lines but {args.ref} has {len(ref)}")
    for path, lines in ((args.src, src), (args.ref, ref)):
        if not any(line.strip() for line in lines):
            raise UserError(f"{path}: nothing to evaluate ({'only blank lines' if lines else 'empty file'})")
    load = _translator_loader(args)
    with output_lines(args.output) if args.output else contextlib.nullcontext(lambda _: None) as write:
        translator = load()
        hyps = _run_with_progress(translator, src, True, translator.translate)
        write(hyps)
    scores = sacrebleu_scores(
        hyps, ref, lowercase=translator.tokenizer.lowercases
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


# --- plot -----------------------------------------------------------------------------------------


def _register_plot(subparsers) -> None:
    p = subparsers.add_parser("plot", help="draw attention maps, the positional encoding or training curves")
    kinds = p.add_subparsers(dest="plot", required=True, metavar="WHAT")
    att = kinds.add_parser("attention", help="attention heatmaps of one sentence, per layer and head")
    att.add_argument("--checkpoint", required=True)
    att.add_argument("--src", required=True, help="source sentence")
    att.add_argument("--tgt", help="target sentence (default: the model's greedy translation)")
    att.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    att.add_argument("--out", required=True, help="PNG file to write")
    att.set_defaults(func=run_plot_attention)
    pe = kinds.add_parser("positional-encoding", help="the sinusoidal positional-encoding table")
    pe.add_argument("--d-model", type=int, default=512)
    pe.add_argument("--max-len", type=int, default=100)
    pe.add_argument("--out", required=True)
    pe.set_defaults(func=lambda a: _plot_done(_plots().plot_positional_encoding(a.d_model, a.max_len, a.out)))
    cur = kinds.add_parser("curves", help="loss, learning rate and BLEU from RUN_DIR/metrics.jsonl")
    cur.add_argument("run_dir")
    cur.add_argument("--out", required=True)
    cur.set_defaults(func=lambda a: _plot_done(_plots().plot_curves(a.run_dir, a.out)))


def _plots():
    import aiayn.plots

    return aiayn.plots


def _plot_done(path: Path) -> int:
    print(f"wrote {path}", file=sys.stderr)
    return 0


def run_plot_attention(args) -> int:
    from aiayn.checkpoint import load_translation_model

    device = resolve_device(args.device, "--device")
    model, tokenizer, _ = load_translation_model(args.checkpoint, device=device)
    return _plot_done(draw_attention(model, tokenizer, args.src, args.tgt, args.out, device))


def draw_attention(model, tokenizer, src_text: str, tgt_text: str | None, out, device="cpu") -> Path:
    """Heatmaps of every layer's and head's attention for one sentence pair (greedy target if None)."""
    from aiayn.decode.search import DecodeOptions
    from aiayn.decode.translator import Translator

    config = model.config
    translator = Translator(model, tokenizer, device, options=DecodeOptions(beam=1, alpha=0.0))
    src_ids = translator.encode_source(src_text)
    tgt_text = tgt_text if tgt_text is not None else translator.translate([src_text])[0]
    tgt_ids = [config.bos_id] + tokenizer.encode(tgt_text)[: config.max_len - 1]
    with torch.inference_mode():
        src, tgt = (torch.tensor([ids], device=device) for ids in (src_ids, tgt_ids))
        _, maps = model(src, tgt, return_attention=True)
    labels = [tokenizer.id_to_piece(i) for i in src_ids], [tokenizer.id_to_piece(i) for i in tgt_ids]
    return _plots().plot_attention(maps, *labels, out)
