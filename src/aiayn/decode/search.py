"""Greedy search, beam search and sampling over a step function (the model's key/value cache).

Every search works on a *step function* (see :mod:`aiayn.decode.step`): ``step(prefix)`` gives
the next-token log-probabilities of each row, ``step.reorder(new_order)`` selects rows. The real
model goes through :class:`~aiayn.decode.step.ModelStep`; the tests use a fake one.

Exact speed-ups, each with its reference behind one switch of a :class:`SearchPaths` (the
``paths`` of the searches, of :class:`~aiayn.decode.step.ModelStep` and of :class:`DecodeOptions`), so
that tests and ``benchmarks/decode_paths.py`` compare the two: ``two_stage`` (block-wise argmax and
top-k over the vocabulary, against PyTorch's one-stage ones), ``shortlist`` (beam search scores each
row's best ``2 * beam`` tokens, not all of them), ``group_rows`` (see :mod:`aiayn.decode.cache`) and
``by_length`` (the encoder on buckets of similar length, see :mod:`aiayn.decode.step`).

Conventions, the same in every search:

* **Length** ``|Y|`` counts the generated tokens *including* the final EOS (not BOS).
* **Score** = ``log P(Y) / lp(Y)`` with the GNMT length penalty ``lp(Y) = ((5 + |Y|) / 6) ** alpha``
  (Wu et al. 2016; the paper uses alpha = 0.6, beam 4). ``alpha = 0`` gives the plain log-prob.
  ``log P`` sums the model's log-probabilities of the chosen tokens (temperature and top-k/top-p
  do not change it).
* **Maximum length**: sentence i may generate at most ``max_lens[i]`` tokens before its EOS; at
  that step EOS is forced. PAD and BOS are never generated.
* **Ties** are broken deterministically: the lower (beam, token) index wins, as ``argmax`` does.
* Sentences never interact: each has its own beam, maximum length and stopping rule, and a
  finished sentence is dropped from the batch. So, up to float rounding in the model's batched
  matmuls (about 1e-6), greedy and beam search give a sentence the same result alone or inside any
  batch. Sampling does not: one random stream feeds every row of the batch, so a sentence's samples
  depend on what else (and how much) is in its batch, even with a fixed seed.

Beam search: at each step the ``2 * beam`` best candidates (beam, token) of a sentence are taken in
score order; an EOS among the first ``beam`` of them finishes a hypothesis, and the sentence keeps
its ``beam`` best finished ones (a better one replaces the worst); the first ``beam`` non-EOS
candidates form the next beam. A sentence stops at its maximum length (where every live hypothesis
is forced to end), or once it has ``beam`` finished hypotheses **and** no live one can still beat
the worst of them: the best live log-prob, scored as if it ended at the next step, is no better.
That bound is exact for ``alpha = 0`` (log-probs only fall) and the usual heuristic for
``alpha > 0`` (HF transformers' ``early_stopping=False``). fairseq stops as soon as ``beam``
hypotheses have finished; with a confident model that can drop the best, still-live hypothesis
in favour of short ones that ended early.
The n-best list is the finished hypotheses sorted by score (ties: the earlier-finished first).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import Tensor

from aiayn.config import BOS_ID, EOS_ID, PAD_ID
from aiayn.decode.step import FAST_PATHS, ModelStep, SearchPaths, max_output_lengths, source_lengths
from aiayn.errors import UserError

NEG_INF = float("-inf")


class StepFunction(Protocol):
    vocab_size: int

    def __call__(self, prefix: Tensor) -> Tensor: ...  # (N, t) -> (N, V) fp32 log-probs, a new tensor

    def reorder(self, new_order: Tensor) -> None: ...


@dataclass(frozen=True)
class Hypothesis:
    """One output: ``tokens`` without BOS/EOS, ``score`` = ``log_prob / lp(len(tokens) + 1)``."""

    tokens: list[int]
    score: float
    log_prob: float


@dataclass(frozen=True)
class SpecialIds:
    bos: int = BOS_ID
    eos: int = EOS_ID
    pad: int = PAD_ID


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's ``((5 + length) / 6) ** alpha``; ``length`` counts tokens including EOS."""
    return ((5.0 + length) / 6.0) ** alpha


def _hypothesis(tokens: list[int], log_prob: float, alpha: float) -> Hypothesis:
    return Hypothesis(tokens, log_prob / length_penalty(len(tokens) + 1, alpha), log_prob)


# --- shared helpers -------------------------------------------------------------------------------

BLOCK = 64  # elements per block in the two-stage row reductions below
MIN_BLOCKS = 16  # rows shorter than BLOCK * MIN_BLOCKS take PyTorch's one-stage kernels


def _blocks(x: Tensor, *, two_stage: bool = True) -> Tensor | None:
    """``x`` ``(N, M)`` viewed as ``(N, M // BLOCK, BLOCK)``, or None when that is not worth it
    (short rows, or not ``two_stage``) or not possible (M not a multiple of BLOCK, or rows not
    contiguous)."""
    n, m = x.shape
    if not two_stage or m % BLOCK or m < BLOCK * MIN_BLOCKS or x.stride(-1) != 1:
        return None
    return x.as_strided((n, m // BLOCK, BLOCK), (x.stride(0), BLOCK, 1))


def first_argmax(x: Tensor, *, two_stage: bool = True) -> Tensor:
    """``x.argmax(dim=-1)`` of ``(N, M)`` -> ``(N,)``: the first (lowest) index of each row's maximum.

    Over a vocabulary PyTorch's CPU ``argmax`` is slow (it does not vectorise). Two stages give the
    same index: the block maxima (a vectorised ``amax``), the first block holding the row's maximum,
    then the first maximum inside that block. ``two_stage=False``: PyTorch's ``argmax``.
    """
    blocks = _blocks(x, two_stage=two_stage)
    if blocks is None:
        return x.argmax(dim=-1)
    block = blocks.amax(dim=-1).argmax(dim=-1)  # (N,) first block with the maximum
    rows = torch.arange(x.size(0), device=x.device)
    return block * BLOCK + blocks[rows, block].argmax(dim=-1)


def _topk(x: Tensor, k: int, *, two_stage: bool = True) -> tuple[Tensor, Tensor]:
    """``x.topk(k, dim=-1)`` of ``(N, M)``: the same values; indices of ties may differ, as topk's may.

    Two stages over a vocabulary: the ``k`` blocks with the largest maxima hold the top ``k`` values
    (a block left out has a maximum no larger than ``k`` elements of the chosen blocks, so none of its
    elements can be needed), then ``topk`` over those ``k * BLOCK`` candidates.
    """
    blocks = _blocks(x, two_stage=two_stage)
    if blocks is None or k > blocks.size(1):
        return x.topk(k, dim=-1)
    n = x.size(0)
    chosen = blocks.amax(dim=-1).topk(k, dim=-1).indices  # (N, k) block ids
    candidates = blocks.gather(1, chosen[:, :, None].expand(n, k, BLOCK)).reshape(n, k * BLOCK)
    values, position = candidates.topk(k, dim=-1)  # (N, k)
    return values, chosen.gather(1, position // BLOCK) * BLOCK + position % BLOCK


def stable_topk(x: Tensor, k: int, *, two_stage: bool = True) -> tuple[Tensor, Tensor]:
    """Top ``k`` of each row of ``x`` ``(N, M)``, descending; equal values: lower index first.

    ``torch.topk`` leaves the order of ties unspecified; this makes it deterministic. It costs one
    ``topk`` of ``k + 1`` (:func:`_topk`) plus a sort of ``k`` elements per row, and a full stable
    sort of only the rows with a tie across the cut (their k-th and (k+1)-th largest values are equal).
    ``two_stage=False``: one ``torch.topk`` over the whole row instead of :func:`_topk`'s two stages.
    """
    top_values, top_index = _topk(x, min(k + 1, x.size(-1)), two_stage=two_stage)
    index = top_index[:, :k].sort(dim=-1).values  # (N, k), ascending index
    values, perm = x.gather(-1, index).sort(dim=-1, descending=True, stable=True)
    index = index.gather(-1, perm)
    if top_values.size(-1) > k:
        tied = (top_values[:, k - 1] == top_values[:, k]).nonzero()[:, 0]  # rows with ties across the cut
        if tied.numel():
            tied_values, tied_index = x[tied].sort(dim=-1, descending=True, stable=True)
            values[tied], index[tied] = tied_values[:, :k], tied_index[:, :k]
    return values, index


def _restrict(log_probs: Tensor, forced_eos: Tensor, ids: SpecialIds) -> Tensor:
    """In place: never PAD or BOS; rows where ``forced_eos`` ``(N,)`` is True may only end (EOS).

    The searches own the step function's output (a new tensor each call), so no copy is made; the
    entries changed are never chosen, so the log-probability of a chosen token is unchanged.
    """
    log_probs[:, [ids.pad, ids.bos]] = NEG_INF  # (N, V)
    rows = forced_eos.nonzero()[:, 0]
    if rows.numel():
        eos = log_probs[rows, ids.eos]
        log_probs[rows] = NEG_INF
        log_probs[rows, ids.eos] = eos
    return log_probs


def _check_lengths(batch_size: int, max_lens: list[int]) -> None:
    if len(max_lens) != batch_size:
        raise ValueError(f"max_lens has {len(max_lens)} entries for a batch of {batch_size}")


# --- greedy search and sampling (one path per row) ------------------------------------------------

Chooser = Callable[[Tensor], Tensor]  # (N, V) restricted log-probs -> (N,) token ids


def greedy_search(
    step: StepFunction,
    max_lens: list[int],
    *,
    alpha: float = 0.0,
    ids: SpecialIds = SpecialIds(),
    scores: bool = True,
    paths: SearchPaths = FAST_PATHS,
) -> list[list[Hypothesis]]:
    """The most probable next token at each step (argmax; ties: the lowest id). One hypothesis per row.

    The step may return logits (a step whose ``log_probs`` attribute is False, as
    ``ModelStep(..., log_probs=False)``): the argmax is taken over them as they are, and the chosen
    token's log-probability comes from their ``log_softmax``. ``scores=False`` skips that, as
    CTranslate2 does when no scores are asked for: the tokens are the same, ``score`` and
    ``log_prob`` are NaN. ``paths.two_stage``: see :func:`first_argmax`.
    """
    logits = not getattr(step, "log_probs", True)
    choose = functools.partial(first_argmax, two_stage=paths.two_stage)
    return _single_path(step, max_lens, choose, alpha=alpha, ids=ids, normalise=logits, scores=scores)


def sample_search(
    step: StepFunction,
    max_lens: list[int],
    *,
    alpha: float = 0.0,
    nbest: int = 1,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    ids: SpecialIds = SpecialIds(),
) -> list[list[Hypothesis]]:
    """``nbest`` samples per sentence from softmax(log_probs / temperature), optionally restricted
    to the ``top_k`` tokens (0 = all) and to the smallest set with probability >= ``top_p``
    (nucleus). The same ``seed`` with the same input and batching gives the same samples (the draws
    are shared by the rows of a batch, so a sentence's samples depend on its batch). ``seed=None``
    draws a seed from PyTorch's global generator: each call samples anew, and ``torch.manual_seed``
    still makes a whole program repeat. Samples of a sentence are returned best score first.
    """
    _need_log_probs(step, "sampling")
    seed = fresh_seed() if seed is None else seed
    generator: list[torch.Generator] = []  # made on first use, on the device of the log-probs

    def choose(log_probs: Tensor) -> Tensor:
        if not generator:
            generator.append(torch.Generator(device=log_probs.device))
            generator[0].manual_seed(seed)
        return _sample(log_probs, temperature, top_k, top_p, generator[0])

    rows = torch.arange(len(max_lens), device=_device_of(step))
    step.reorder(rows.repeat_interleave(nbest))  # nbest copies of each row
    flat = _single_path(step, [n for n in max_lens for _ in range(nbest)], choose, alpha=alpha, ids=ids)
    groups = [[h[0] for h in flat[i * nbest : (i + 1) * nbest]] for i in range(len(max_lens))]
    return [sorted(g, key=lambda h: -h.score) for g in groups]


def fresh_seed() -> int:
    """A seed drawn from PyTorch's global (CPU) generator: new at each call, fixed by
    ``torch.manual_seed``."""
    return int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))


def _sample(
    log_probs: Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator
) -> Tensor:
    """Draw one token per row of ``log_probs`` ``(N, V)`` -> ``(N,)``."""
    logits = log_probs / temperature  # (N, V)
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, NEG_INF)
    if top_p < 1.0:
        logits = _nucleus(logits, top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]


def _nucleus(logits: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most probable tokens whose probability reaches ``top_p``."""
    probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True, stable=True)  # (N, V)
    before = probs.cumsum(dim=-1) - probs  # probability mass strictly before each token
    drop = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before >= top_p)
    return logits.masked_fill(drop, NEG_INF)


def _single_path(
    step: StepFunction,
    max_lens: list[int],
    choose: Chooser,
    *,
    alpha: float,
    ids: SpecialIds,
    normalise: bool = False,
    scores: bool = True,
) -> list[list[Hypothesis]]:
    """Extend each row by ``choose`` until EOS or its maximum length; finished rows leave the batch.

    ``normalise``: the step's outputs are logits; the chosen tokens' log-probs come from their
    ``log_softmax``. ``scores=False``: no log-probs at all (NaN in the hypotheses).
    """
    device = _device_of(step)
    active = list(range(len(max_lens)))
    prefix = torch.full((len(active), 1), ids.bos, dtype=torch.long, device=device)  # (n, t)
    log_prob = torch.full((len(active),), 0.0 if scores else float("nan"), dtype=torch.float64, device=device)
    results: list[list[Hypothesis]] = [[] for _ in active]
    t = 0
    while active:
        forced = torch.tensor([t >= max_lens[i] for i in active], device=device)  # (n,)
        outputs = step(prefix)  # (n, V) log-probs, or logits when ``normalise``
        log_probs = outputs.log_softmax(dim=-1) if normalise and scores else outputs  # before _restrict
        token = choose(_restrict(outputs, forced, ids))  # (n,)
        if scores:
            log_prob = log_prob + log_probs.gather(-1, token[:, None])[:, 0].double()
        done = (token == ids.eos).tolist()
        for row, i in enumerate(active):
            if done[row]:
                results[i] = [_hypothesis(prefix[row, 1:].tolist(), float(log_prob[row]), alpha)]
        keep = torch.tensor([r for r, d in enumerate(done) if not d], dtype=torch.long, device=device)
        active = [i for i, d in zip(active, done) if not d]
        if active:
            step.reorder(keep)
        prefix = torch.cat([prefix, token[:, None]], dim=1)[keep]
        log_prob, t = log_prob[keep], t + 1
    return results


def _need_log_probs(step: StepFunction, search: str) -> None:
    """Only greedy search takes logits: the others sum and compare the step's outputs as log-probs."""
    if not getattr(step, "log_probs", True):
        raise ValueError(f"{search} needs log-probabilities: a step with log_probs=True")


def _device_of(step: StepFunction) -> torch.device:
    return getattr(step, "device", torch.device("cpu"))


# --- beam search ----------------------------------------------------------------------------------


def beam_search(
    step: StepFunction,
    max_lens: list[int],
    *,
    beam: int = 4,
    alpha: float = 0.6,
    nbest: int = 1,
    ids: SpecialIds = SpecialIds(),
    paths: SearchPaths = FAST_PATHS,
) -> list[list[Hypothesis]]:
    """Beam search (stopping rule in the module docstring). Returns ``nbest`` hypotheses per row,
    best score first. ``step`` holds one row per sentence on entry; it is expanded to ``beam`` rows.

    ``paths.shortlist``: score only each row's best ``2 * beam`` tokens (exact, see
    ``_Beams.advance``); False scores all ``beam * V`` candidates. ``paths.two_stage``: see
    :func:`stable_topk`.
    """
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest ({nbest}) must be between 1 and beam ({beam})")
    _need_log_probs(step, "beam search")
    state = _Beams(step, max_lens, beam=beam, alpha=alpha, ids=ids, paths=paths)
    while state.active:
        state.advance()
    return [sorted(f, key=lambda h: -h.score)[:nbest] for f in state.finished]


class _Beams:
    """The live beams of the unfinished sentences and the finished hypotheses of every sentence."""

    def __init__(
        self,
        step: StepFunction,
        max_lens: list[int],
        *,
        beam: int,
        alpha: float,
        ids: SpecialIds,
        paths: SearchPaths,
    ) -> None:
        self.step, self.max_lens, self.beam, self.alpha, self.ids = step, max_lens, beam, alpha, ids
        self.paths = paths
        device = _device_of(step)
        n = len(max_lens)
        self.active = list(range(n))  # sentence ids still searching
        self.finished: list[list[Hypothesis]] = [[] for _ in range(n)]
        self.prefix = torch.full((n * beam, 1), ids.bos, dtype=torch.long, device=device)  # (n*K, t)
        self.cum = torch.full((n, beam), NEG_INF, dtype=torch.float64, device=device)  # (n, K)
        self.cum[:, 0] = 0.0  # one live hypothesis (BOS) at the start
        self.t = 0  # tokens generated so far (BOS not counted)
        # The step holds one row per sentence until the first step is scored (t = 0): all K beams
        # start as the same BOS, so the first step runs once per sentence, not K times.

    def advance(self) -> None:
        """One step: expand, finish EOS candidates, choose the next beams, drop finished sentences."""
        K, device = self.beam, self.prefix.device
        forced = torch.tensor([self.t >= self.max_lens[s] for s in self.active], device=device)  # (n,)
        rows = 1 if self.t == 0 else K  # step rows per sentence
        log_probs = _restrict(self.step(self.prefix[:: K // rows]), forced.repeat_interleave(rows), self.ids)
        # A sentence's best 2K candidates are among the best 2K tokens of each of its K rows (ties
        # included: both selections prefer the lower beam, then the lower token id), so only those
        # K * 2K candidates per sentence are scored, not K * V.
        per_row = min(2 * K, log_probs.size(-1)) if self.paths.shortlist else log_probs.size(-1)
        two_stage = self.paths.two_stage
        row_scores, row_tokens = stable_topk(log_probs, per_row, two_stage=two_stage)  # (n*rows, per_row)
        if rows == 1:  # beams 1..K-1 are copies of beam 0 with log-prob -inf
            row_scores, row_tokens = row_scores.repeat_interleave(K, 0), row_tokens.repeat_interleave(K, 0)
        cand = (self.cum.reshape(-1, 1) + row_scores.double()).reshape(len(self.active), K * per_row)
        scores, flat = stable_topk(cand, 2 * K, two_stage=two_stage)  # (n, 2K)
        origin = flat // per_row  # beam index of each candidate
        token = row_tokens.reshape(len(self.active), K * per_row).gather(-1, flat)  # (n, 2K)
        is_eos = (token == self.ids.eos) & torch.isfinite(scores)  # (n, 2K)
        self._finish(scores, origin, is_eos)
        live = torch.sort(is_eos.int(), dim=-1, stable=True).indices[:, :K]  # first K non-EOS, (n, K)
        new_cum = scores.gather(-1, live).masked_fill(is_eos.gather(-1, live), NEG_INF)  # (n, K)
        self._select(origin.gather(-1, live), token.gather(-1, live), new_cum, forced)

    def _finish(self, scores: Tensor, origin: Tensor, is_eos: Tensor) -> None:
        """EOS among the first ``beam`` candidates ends a hypothesis; the best ``beam`` are kept."""
        hits = is_eos[:, : self.beam].nonzero()  # (hits, 2): (row, candidate), row-major order
        if not hits.numel():
            return
        rows, cands = hits[:, 0], hits[:, 1]
        prefixes = self.prefix[rows * self.beam + origin[rows, cands], 1:].tolist()
        for row, tokens, score in zip(rows.tolist(), prefixes, scores[rows, cands].tolist()):
            self._keep(self.finished[self.active[row]], _hypothesis(tokens, score, self.alpha))

    def _keep(self, finished: list[Hypothesis], hypothesis: Hypothesis) -> None:
        if len(finished) == self.beam:
            worst = min(finished, key=lambda h: h.score)
            if hypothesis.score <= worst.score:
                return
            finished.remove(worst)
        finished.append(hypothesis)

    def _settled(self, sentence: int, best_live: float) -> bool:
        """``beam`` finished, and the best live hypothesis (log-prob ``best_live``) cannot beat the
        worst of them."""
        finished = self.finished[sentence]
        if len(finished) < self.beam:
            return False
        bound = best_live / length_penalty(self.t + 2, self.alpha)  # if it ended next step
        return bound <= min(h.score for h in finished)

    def _select(self, origin: Tensor, token: Tensor, cum: Tensor, forced: Tensor) -> None:
        """Keep the unfinished sentences; their rows become the chosen (origin, token) pairs."""
        K, first = self.beam, self.t == 0
        best_live = cum.max(dim=-1).values.tolist()  # (n,) one transfer, not one per sentence
        done = [f or self._settled(s, b) for s, f, b in zip(self.active, forced.tolist(), best_live)]
        keep = torch.tensor([r for r, d in enumerate(done) if not d], dtype=torch.long, device=origin.device)
        rows = (keep[:, None] * K + origin[keep]).reshape(-1)  # (n'*K,) rows of the old prefix
        self.prefix = torch.cat([self.prefix[rows], token[keep].reshape(-1, 1)], dim=1)  # (n'*K, t+1)
        self.cum, self.t = cum[keep], self.t + 1
        self.active = [s for s, d in zip(self.active, done) if not d]
        if self.active:
            self.step.reorder(rows // K if first else rows)  # after the first step: row s*K+b was row s


# --- options and the model entry point -----------------------------------------------------------


#: The largest sampling seed (CTranslate2's seeds are 32-bit; one rule for both engines).
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode. ``beam=1`` is greedy search; ``sample=True`` samples instead of searching.

    ``max_len_a``/``max_len_b``: at most ``floor(a * S + b)`` tokens before EOS for a source of S
    tokens (its EOS included); the paper's "input length + 50" is a=1, b=50.
    ``scores=False``: the caller needs no scores (``Translator.translate``), so a search that does
    not need them to choose (greedy) skips them; its hypotheses' ``score``/``log_prob`` are NaN.
    ``paths``: the exact speed-ups (:class:`SearchPaths`, module docstring); a switch set to False
    gives its reference path, the same output.
    """

    beam: int = 4
    alpha: float = 0.6
    nbest: int = 1
    max_len_a: float = 1.0
    max_len_b: int = 50
    use_cache: bool = True
    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    scores: bool = True
    paths: SearchPaths = FAST_PATHS

    def __post_init__(self) -> None:
        checks = [
            ("beam", self.beam >= 1, "must be >= 1"),
            ("alpha", self.alpha >= 0, "must be >= 0"),
            ("nbest", self.nbest >= 1, "must be >= 1"),
            ("max_len_a", math.isfinite(self.max_len_a) and self.max_len_a >= 0, "must be finite and >= 0"),
            ("max_len_b", math.isfinite(self.max_len_b) and self.max_len_b >= 0, "must be finite and >= 0"),
            ("temperature", self.temperature > 0, "must be > 0"),
            ("top_k", self.top_k >= 0, "must be >= 0"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("seed", self.seed is None or 0 <= self.seed <= MAX_SEED, f"must be in 0..{MAX_SEED}"),
            (
                "nbest",
                self.sample or self.nbest <= self.beam,
                f"({self.nbest}) must not exceed beam ({self.beam})",
            ),
        ]
        for name, ok, message in checks:
            if not ok:
                raise UserError(f"{name}: {message}")


def generate(model, src: Tensor, options: DecodeOptions = DecodeOptions()) -> list[list[Hypothesis]]:
    """Decode a padded source batch ``src`` ``(B, S)`` with ``model`` (put it in eval mode first).

    Returns, per sentence, ``options.nbest`` hypotheses (one for greedy search), best first.
    """
    config = model.config
    ids = SpecialIds(config.bos_id, config.eos_id, config.pad_id)
    max_lens = max_output_lengths(
        source_lengths(src, config.pad_id), options.max_len_a, options.max_len_b, config.max_len
    )
    greedy = options.beam == 1 and not options.sample
    with torch.inference_mode():
        # greedy: argmax of the logits
        step = ModelStep(model, src, use_cache=options.use_cache, log_probs=not greedy, paths=options.paths)
        if options.sample:
            return sample_search(
                step,
                max_lens,
                alpha=options.alpha,
                nbest=options.nbest,
                temperature=options.temperature,
                top_k=options.top_k,
                top_p=options.top_p,
                seed=options.seed,
                ids=ids,
            )
        if greedy:
            return greedy_search(
                step, max_lens, alpha=options.alpha, ids=ids, scores=options.scores, paths=options.paths
            )
        return beam_search(
            step,
            max_lens,
            beam=options.beam,
            alpha=options.alpha,
            nbest=options.nbest,
            ids=ids,
            paths=options.paths,
        )
