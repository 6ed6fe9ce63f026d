"""Inference backends: the same text in, text out, run by PyTorch or by CTranslate2 (the user's
``engine`` setting, ``--engine`` on the command line, picks one).

    >>> backend = load_backend("runs/de_en", engine="ctranslate2", compute_type="int8")  # doctest: +SKIP
    >>> backend.translate(["Ein Mann fährt Fahrrad."], DecodeOptions(beam=4))[0].text   # doctest: +SKIP

Each is a :class:`~aiayn.decode.request.Backend`: one call, ``translate(lines, options, wanted)``,
one :class:`~aiayn.decode.request.Translation` per line. Both keep
:class:`~aiayn.decode.Translator`'s text conventions: blank line -> blank output, a source longer
than ``max_len`` truncated with the same warning, line breaks in an output replaced by spaces.

``torch`` is :class:`~aiayn.decode.Translator` on the model of the checkpoint.

``ctranslate2`` runs the CTranslate2 export of the checkpoint (:mod:`aiayn.export`), made on first
use into ``RUN/ct2`` for a run directory, ``ct2-NAME`` beside a checkpoint directory ``NAME``, or
``ct2_dir``; it is reused while its ``aiayn_export.json`` records the checkpoint's SHA-256
(:func:`~aiayn.export.checkpoint_digest`) and made again when the checkpoint changed. The export
holds float32 weights; ``compute_type`` (e.g. ``int8``) is applied when CTranslate2 loads them.
How it differs from the torch backend's search (:mod:`aiayn.decode.search`):

* **Greedy search** gives the same tokens (up to float rounding: near-ties may break differently).
* **Batches** are the torch backend's (at most ``batch_tokens`` padded source tokens, sorted by
  length). **Maximum length**: CTranslate2 has one ``max_decoding_length`` per call, so a batch
  decodes up to its largest limit ``floor(a * S + b)`` plus one step for the EOS, and a longer
  output is cut to its own limit. aiayn forces (and scores) an EOS there instead, so greedy
  tokens are the same, but beam search may choose differently among hypotheses that reach their
  limit, and the score of a cut output keeps the log-prob of the whole one.
* **Length penalty**: CTranslate2 divides by ``|Y| ** alpha`` (``|Y|`` with the EOS, as asked
  with ``return_end_token``), not by GNMT's ``((5 + |Y|) / 6) ** alpha``. The backend undoes
  CTranslate2's division and scores every finished hypothesis as aiayn does
  (``log P / ((5 + |Y|) / 6) ** alpha``), then ranks them by that score; scores are therefore
  comparable with the torch backend's.
* **Beam search** takes the same candidates at each step (the ``2 * beam`` best, an EOS among the
  first ``beam`` finishes a hypothesis). It stops differently: with ``alpha = 0`` once the best
  candidate is an EOS (the same best hypothesis as aiayn's, whose bound is exact then); with
  ``alpha > 0`` once ``beam`` hypotheses have finished, where aiayn goes on while a live one can
  still beat its worst finished one. So beam outputs are equal for ``alpha = 0`` (outputs within
  their limit, near-ties apart) and may differ on some sentences for ``alpha > 0``.
* **Scores**: CTranslate2 suppresses PAD and BOS before its log-softmax, so its log-probs are
  renormalised over the other tokens; aiayn's are not (it masks them after). Each token's
  log-prob is higher by ``-log(1 - p(PAD) - p(BOS))``: ~0 for a trained model, ~0.002 for a
  random one. Near-ties may therefore break differently in beam search.
* **Sampling** draws from CTranslate2's own random stream (``seed`` sets it through
  ``ctranslate2.set_random_seed``, on a new translator: its threads seed themselves once), and its
  scores are CTranslate2's, converted as above (not checked against the model's log-probs).
* ``use_cache=False`` (the uncached reference) does not exist there and is refused, as is a
  ``glossary`` (CTranslate2 has no lexical constraints).
* **Prefixes** go to CTranslate2's ``target_prefix``; greedy search gives the same tokens as the torch
  backend's. **Confidence** (``Wanted.confidence``): the best hypothesis is scored again with
  ``score_batch`` for its tokens' log-probabilities.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path
from typing import Callable, Sequence

import torch

from aiayn.checkpoint import resolve_checkpoint
from aiayn.config import TransformerConfig
from aiayn.data.batching import token_batches
from aiayn.data.tokenizer import Tokenizer, vocabularies
from aiayn.decode import fast_step
from aiayn.decode.align import clamp_pairs, word_alignment
from aiayn.decode.request import TEXT, Line, LineLike, Translation, Wanted, as_lines
from aiayn.decode.search import DecodeOptions, length_penalty
from aiayn.decode.step import max_output_lengths
from aiayn.decode.translator import LINE_BREAKS, Translator, source_ids, with_prefix, word_probabilities
from aiayn.errors import Setting, SettingError, Warn, warning
from aiayn.export import (
    ALIGNMENT,
    INFO_FILE,
    QUANTIZATIONS,
    SPM_FILE,
    SUPPRESS,
    checkpoint_digest,
    export_ctranslate2,
)
from aiayn.loading import load_translation_model
from aiayn.precision import native_bf16

ENGINES = ("torch", "ctranslate2")
#: CTranslate2's compute types: "default" keeps the export's (float32) weights, "auto" lets
#: CTranslate2 choose, the others are the export's quantizations.
COMPUTE_TYPES = ("default", "auto", *(q for q in QUANTIZATIONS if q != "none"))
#: The torch engine's: the checkpoint's weights, int8 ones on the CPU
#: (:func:`aiayn.decode.fast_step.int8`), or bf16 where the device has it natively
#: (:func:`aiayn.decode.fast_step.bfloat16`).
TORCH_COMPUTE_TYPES = ("default", "int8", "bfloat16")
EOS_PIECE = "</s>"
#: The settings the backends' errors name, and the command-line flags that set them (the export
#: directory ``out`` of :func:`aiayn.export.export_ctranslate2` is ``--ct2-dir``).
FLAGS = {
    "engine": "--engine",
    "compute_type": "--compute-type",
    "ct2_dir": "--ct2-dir",
    "out": "--ct2-dir",
    "device": "--device",
    "use_cache": "--no-cache",
    "glossary": "--glossary",
}


def _note(message: str) -> None:
    print(f"aiayn: {message}", file=sys.stderr)


def check_backend(engine: str, compute_type: str = "default") -> None:
    """One-line errors for an unknown engine or compute type."""
    if engine not in ENGINES:
        raise SettingError(Setting("engine"), f": unknown engine {engine!r}; valid: {', '.join(ENGINES)}")
    if compute_type not in COMPUTE_TYPES:
        valid = ", ".join(COMPUTE_TYPES)
        raise SettingError(Setting("compute_type"), f": unknown value {compute_type!r}; valid: {valid}")
    if engine == "torch" and compute_type not in TORCH_COMPUTE_TYPES:
        valid = ", ".join(TORCH_COMPUTE_TYPES)
        raise SettingError(
            Setting("compute_type"),
            f": {compute_type!r} needs ",
            Setting("engine"),
            f" ctranslate2; torch runs {valid}",
        )


def check_torch_compute(compute_type: str, device) -> None:
    """One line when the torch engine cannot run ``compute_type`` on ``device`` (int8: the CPU only;
    bfloat16: where bf16 is native, :func:`aiayn.precision.native_bf16`)."""
    device = torch.device(device)
    if compute_type == "int8" and device.type != "cpu":
        raise SettingError(
            Setting("compute_type"),
            ": int8 runs on the CPU with the torch engine (",
            Setting("device"),
            " cpu)",
        )
    if compute_type == "bfloat16" and not native_bf16(device):
        where = (
            "this CPU has neither AVX512-BF16 nor AMX"
            if device.type == "cpu"
            else f"{device} has no bf16 units"
        )
        raise SettingError(
            Setting("compute_type"),
            f": bfloat16 needs native bf16 and {where} (emulated bf16 is many times slower); "
            "use default (float32) or int8",
        )


def torch_model(model, compute_type: str):
    """The model the torch engine decodes with: ``model``, or its int8 or bf16 copy for
    ``compute_type`` "int8" or "bfloat16" (:func:`aiayn.decode.fast_step.int8`,
    :func:`~aiayn.decode.fast_step.bfloat16`; check the device first, :func:`check_torch_compute`)."""
    if compute_type == "int8":
        return fast_step.int8(model)
    if compute_type == "bfloat16":
        return fast_step.bfloat16(model)
    return model


def load_backend(
    checkpoint: str | Path,
    engine: str = "torch",
    *,
    device: str | torch.device = "cpu",
    ct2_dir: str | Path | None = None,
    compute_type: str = "default",
    batch_tokens: int = 4096,
    warn: Warn = warning,
):
    """The backend of ``engine`` for the translation model of ``checkpoint`` (checkpoint or run
    directory): a :class:`~aiayn.decode.Translator` (torch) or a :class:`CTranslate2Backend`."""
    check_backend(engine, compute_type)
    if engine == "torch":
        check_torch_compute(compute_type, device)
        model, tokenizer, _ = load_translation_model(checkpoint, device=device)
        model = torch_model(model, compute_type)
        return Translator(model, tokenizer, device, batch_tokens=batch_tokens, warn=warn)
    return CTranslate2Backend.load(
        checkpoint,
        device=device,
        ct2_dir=ct2_dir,
        compute_type=compute_type,
        batch_tokens=batch_tokens,
        warn=warn,
    )


# --- CTranslate2 ----------------------------------------------------------------------------------


def require_ctranslate2():
    try:
        import ctranslate2  # optional (pip install ctranslate2): imported where used
    except ImportError:
        raise SettingError(
            Setting("engine", "ctranslate2"), " needs the ctranslate2 package: pip install ctranslate2"
        ) from None
    return ctranslate2


def default_ct2_dir(checkpoint: str | Path) -> Path:
    """``RUN/ct2`` for a run directory; ``ct2-NAME`` beside a checkpoint directory ``NAME`` (not
    ``NAME-ct2``: a name starting with ``step-`` would pass for a checkpoint of the run)."""
    given = Path(checkpoint)
    if resolve_checkpoint(given).resolve() == given.resolve():
        return given.parent / f"ct2-{given.name}"
    return given / "ct2"


def ensure_export(checkpoint: str | Path, ct2_dir: str | Path | None = None, note: Warn = _note) -> Path:
    """The CTranslate2 export of ``checkpoint``: the one in ``ct2_dir`` (default
    :func:`default_ct2_dir`) when it was made from the same checkpoint contents, else a new one."""
    require_ctranslate2()
    source = resolve_checkpoint(checkpoint)
    out = Path(ct2_dir) if ct2_dir is not None else default_ct2_dir(checkpoint)
    digest = checkpoint_digest(source)
    info = _export_info(out)
    if info.get("checkpoint_sha256") == digest and info.get("alignment") == ALIGNMENT:
        return out
    _check_replaceable(out, INFO_FILE)
    try:
        export_ctranslate2(source, out, force=True)
    except OSError as err:
        raise SettingError(
            f"cannot write the CTranslate2 export to {out}: {err}; choose ", Setting("ct2_dir")
        ) from None
    note(f"exported {source} to CTranslate2 in {out} (reused while the checkpoint stays the same)")
    return out


def _export_info(out: Path) -> dict:
    """``aiayn_export.json`` of a complete export in ``out``, else ``{}``."""
    if not all((out / name).is_file() for name in ("model.bin", SPM_FILE, INFO_FILE)):
        return {}
    try:
        info = json.loads((out / INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _check_replaceable(out: Path, info_file: str) -> None:
    """Only an earlier export (or nothing) may be replaced by a new one."""
    if out.is_dir() and any(out.iterdir()) and not (out / "model.bin").is_file():
        raise SettingError(
            Setting("ct2_dir"), f": {out} holds something other than a CTranslate2 export ({info_file})"
        )


class CTranslate2Backend:
    """A ``ctranslate2.Translator`` on an aiayn export, with aiayn's options, scores and text rules."""

    name = "ctranslate2"

    def __init__(
        self, open_translator, tokenizer, config, *, batch_tokens: int = 4096, warn: Warn = warning
    ) -> None:
        self.open_translator = open_translator  # () -> a new ctranslate2.Translator on the export
        self.translator = open_translator()
        self.tokenizer, self.config = tokenizer, config
        self.batch_tokens, self.warn = batch_tokens, warn
        self.progress: Callable[[int], None] | None = None
        self.pieces, self.target_pieces = vocabularies(tokenizer)  # the pieces CTranslate2 reads, writes
        self.piece_ids = {piece: i for i, piece in enumerate(self.target_pieces)}  # its outputs' ids

    @classmethod
    def load(cls, checkpoint, *, device, ct2_dir, compute_type: str, batch_tokens: int, warn: Warn):
        out = ensure_export(checkpoint, ct2_dir)
        open_translator = _ct2_opener(out, torch.device(device), compute_type)
        tokenizer = Tokenizer.from_bytes((out / SPM_FILE).read_bytes())
        config = TransformerConfig.from_dict(_export_info(out)["model"])
        return cls(open_translator, tokenizer, config, batch_tokens=batch_tokens, warn=warn)

    def translate(
        self, lines: Sequence[LineLike], options: DecodeOptions, wanted: Wanted = TEXT
    ) -> list[Translation]:
        """One :class:`~aiayn.decode.request.Translation` per line: alignments read off the attention
        CTranslate2 returns (the export's last layer, heads averaged: as the torch backend's), the
        tokens' log-probabilities for confidence from ``score_batch``."""
        lines = as_lines(lines)
        found, sources = self._translate(lines, options, attention=wanted.alignment)
        best = {i: hypotheses[0] for i, hypotheses in enumerate(found) if hypotheses}
        log_probs = self._token_log_probs(sources, best) if wanted.confidence else {}
        scored = wanted.scores or wanted.confidence
        results = [Translation("") for _ in lines]
        for i, (_, text, pieces, weights) in best.items():
            pairs = word_alignment(torch.tensor(weights), sources[i], pieces) if weights else ()
            nbest = tuple((s if scored else math.nan, t) for s, t, _, _ in found[i])
            lps = log_probs.get(i, [])
            results[i] = Translation(
                text,
                clamp_pairs(pairs, len(lines[i].text.split()), len(text.split())),
                nbest[0][0],
                nbest,
                sum(lps) / len(lps) if lps else 0.0,
                word_probabilities(text, pieces, lps[: len(pieces)]) if lps else (),
                length=len(lps),
            )
        return results

    def _token_log_probs(
        self, sources: dict[int, list[str]], best: dict[int, tuple]
    ) -> dict[int, list[float]]:
        """Each best hypothesis's token log-probabilities (its EOS last), scored by CTranslate2."""
        order = list(best)
        scored = self.translator.score_batch(
            [sources[i] for i in order], [best[i][2] for i in order], max_batch_size=self.batch_tokens
        )
        return {i: list(result.log_probs) for i, result in zip(order, scored)}

    def _translate(
        self, lines: Sequence[Line], options: DecodeOptions, attention: bool
    ) -> tuple[list[list], dict[int, list[str]]]:
        """Per line its n-best ``(score, text, pieces, attention rows or None)``, best first; and
        each non-blank line's source pieces."""
        check_ct2_options(options)
        translator = self._translator_for(options)
        results: list[list] = [[] for _ in lines]
        sources = {
            i: self.encode_source(line.text, i + 1) for i, line in enumerate(lines) if line.text.strip()
        }
        starts = self._prefixes(sources, lines)
        limits = self._limits(sources, options, starts)
        for batch in token_batches({i: len(pieces) + 1 for i, pieces in sources.items()}, self.batch_tokens):
            found = self._search(
                translator,
                [sources[i] for i in batch],
                [limits[i] for i in batch],
                options,
                attention,
                [starts[i] for i in batch] if starts else None,
            )
            for i, hypotheses in zip(batch, found):
                results[i] = [
                    (score, with_prefix(text, lines[i].prefix, self.tokenizer), *rest)
                    for score, text, *rest in hypotheses
                ]
            if self.progress is not None:
                self.progress(len(batch))
        return results, sources

    def encode_source(self, text: str, line_number: int | None = None) -> list[str]:
        """The source's pieces (CTranslate2 appends EOS), truncated as the torch backend does."""
        return [self.pieces[i] for i in source_ids(self.tokenizer, self.config, text, self.warn, line_number)]

    # --- internals ---------------------------------------------------------------------------------
    def _limits(self, sources: dict[int, list[str]], options: DecodeOptions, starts) -> dict[int, int]:
        """Each sentence's maximum output length before EOS, as aiayn's (S counts the EOS; at least
        its prefix's, within ``max_len``)."""
        lengths = torch.tensor([len(pieces) + 1 for pieces in sources.values()], dtype=torch.long)
        limits = max_output_lengths(lengths, options.max_len_a, options.max_len_b, self.config.max_len)
        if starts:
            limits = [min(max(n, len(starts[i])), self.config.max_len - 1) for n, i in zip(limits, sources)]
        return dict(zip(sources, limits))

    def _prefixes(self, sources: dict[int, list[str]], lines: Sequence[Line]) -> dict[int, list[str]]:
        """Each line's prefix as target pieces (cut to what an output may hold), or {} for none."""
        if not any(line.prefix for line in lines):
            return {}
        room = self.config.max_len - 1
        return {
            i: [self.target_pieces[t] for t in self.tokenizer.encode(lines[i].prefix, target=True)][:room]
            for i in sources
        }

    def _translator_for(self, options: DecodeOptions):
        """The translator; for seeded sampling a new one, seeded first. (CTranslate2's worker threads
        seed their random generator once, on first use, from the global seed: a translator that has
        sampled before would ignore a new seed.)"""
        if not (options.sample and options.seed is not None):
            return self.translator
        require_ctranslate2().set_random_seed(options.seed)
        return self.open_translator()

    def _search(
        self,
        translator,
        sources: list[list[str]],
        limits: list[int],
        options: DecodeOptions,
        attention: bool,
        starts: list[list[str]] | None = None,
    ) -> list[list]:
        """One batch, decoded up to its largest limit (+ 1 step for the EOS); longer outputs are cut."""
        if max(limits) == 0:  # aiayn ends such outputs at once: only the EOS, scored
            return [
                [(score, text, [], None)] for [(score, text)] in self._empty_outputs(sources, options.alpha)
            ]
        results = translator.translate_batch(
            sources,
            [start or None for start in starts] if starts else None,
            max_decoding_length=max(limits) + 1,
            min_decoding_length=0,  # CTranslate2's default 1 forbids the empty output aiayn allows
            max_input_length=0,  # sources are already truncated (with a warning)
            return_scores=True,
            return_end_token=True,  # the length CTranslate2 divides by then counts the EOS, as aiayn's
            suppress_sequences=SUPPRESS,
            return_attention=attention,
            **search_arguments(options),
        )
        return [self._rescore(r, n, options) for r, n in zip(results, limits)]

    def _rescore(self, result, limit: int, options: DecodeOptions) -> list:
        """aiayn's n-best ``(score, text, pieces, attention)``: CTranslate2's ``log P / |Y| ** alpha``
        undone, cut to ``limit`` tokens, GNMT's penalty applied, best first (ties: CTranslate2's order)."""
        ranked = []
        attention = result.attention if result.attention else [None] * len(result.hypotheses)
        for pieces, score, weights in zip(result.hypotheses, result.scores, attention):
            log_prob = score * len(pieces) ** options.alpha if options.alpha else score
            tokens = pieces[:-1] if pieces and pieces[-1] == EOS_PIECE else pieces
            tokens = tokens[:limit]  # a cut output keeps the log P of the whole one (no forced EOS)
            score = log_prob / length_penalty(len(tokens) + 1, options.alpha)
            ranked.append((score, self._text(tokens), tokens, weights))
        ranked.sort(key=lambda entry: -entry[0])
        return ranked[: options.nbest]

    def _empty_outputs(self, sources: list[list[str]], alpha: float) -> list[list[tuple[float, str]]]:
        scored = self.translator.score_batch(sources, [[] for _ in sources], max_batch_size=self.batch_tokens)
        return [[(sum(r.log_probs) / length_penalty(1, alpha), "")] for r in scored]

    def _text(self, pieces: list[str]) -> str:
        ids = [self.piece_ids.get(piece, self.config.unk_id) for piece in pieces]
        return LINE_BREAKS.sub(" ", self.tokenizer.decode(ids))


def check_ct2_options(options: DecodeOptions) -> None:
    if options.glossary:
        raise SettingError(
            Setting("glossary"),
            ": the ctranslate2 engine has no lexical constraints; use ",
            Setting("engine", "torch"),
        )
    if not options.use_cache:
        raise SettingError(
            Setting("use_cache", False),
            ": the ctranslate2 engine always decodes with its cache; use ",
            Setting("engine", "torch"),
        )


def search_arguments(options: DecodeOptions) -> dict:
    """``translate_batch`` arguments for aiayn's search options (length and output ones apart)."""
    if options.sample:
        return dict(
            beam_size=1,
            num_hypotheses=options.nbest,
            length_penalty=options.alpha,
            sampling_topk=options.top_k,  # 0: the whole vocabulary, as aiayn's top_k=0
            sampling_topp=options.top_p,
            sampling_temperature=options.temperature,
        )
    # alpha > 0: all `beam` finished hypotheses come back, so that GNMT's penalty can rank them
    wanted = options.beam if options.alpha else options.nbest
    return dict(beam_size=options.beam, num_hypotheses=wanted, length_penalty=options.alpha)


def _ct2_opener(out: Path, device: torch.device, compute_type: str) -> Callable[[], object]:
    """A function opening ``ctranslate2.Translator`` on ``out`` (checked once here); CPU threads as
    PyTorch's (``torch.set_num_threads``)."""
    ctranslate2 = require_ctranslate2()
    if device.type not in ("cpu", "cuda"):
        raise SettingError(Setting("device"), f": the ctranslate2 engine runs on cpu or cuda, not {device}")
    if device.type == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        raise SettingError(
            Setting("device"), ": this ctranslate2 build sees no CUDA device; use ", Setting("device", "cpu")
        )
    if compute_type not in (
        "default",
        "auto",
    ) and compute_type not in ctranslate2.get_supported_compute_types(device.type, device.index or 0):
        raise SettingError(
            Setting("compute_type"), f": {compute_type} is not supported on {device} by this ctranslate2"
        )
    settings = dict(
        device=device.type,
        device_index=device.index or 0,
        compute_type=compute_type,
        intra_threads=torch.get_num_threads() if device.type == "cpu" else 0,
    )
    return functools.partial(ctranslate2.Translator, str(out), **settings)
