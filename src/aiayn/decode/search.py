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
* **Prefixes** (``prefixes[i]``, target ids): sentence i's first tokens are forced to them (their
  log-probabilities count in its score, as CTranslate2's ``target_prefix``'s do) and the search goes
  on from there; a prefix fits its maximum length (the caller's duty, :func:`generate` widens it).
* **Token log-probabilities**: each hypothesis carries those of its tokens (EOS last), the
  per-token confidence; their sum is its ``log_prob``, except under a glossary's alignment guide,
  where ``log_prob`` (and so the score) also loses
  :data:`~aiayn.decode.constraints.PLACE_PENALTY` for each term placed away from its source words.
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
from typing import Callable, Protocol, Sequence

import torch
from torch import Tensor

from aiayn.config import BOS_ID, EOS_ID, PAD_ID
from aiayn.decode import constraints as lexical
from aiayn.decode import fast_step
from aiayn.decode.align import alignment_layer
from aiayn.decode.constraints import Constraints, State, Terms
from aiayn.decode.step import FAST_PATHS, ModelStep, SearchPaths, max_output_lengths, source_lengths
from aiayn.errors import UserError

NEG_INF = float("-inf")


class StepFunction(Protocol):
    vocab_size: int

    def __call__(self, prefix: Tensor) -> Tensor: ...  # (N, t) -> (N, V) fp32 log-probs, a new tensor

    def reorder(self, new_order: Tensor) -> None: ...


@dataclass(frozen=True)
class Hypothesis:
    """One output: ``tokens`` without BOS/EOS, ``score`` = ``log_prob / lp(len(tokens) + 1)``;
    ``token_log_probs``: each token's log-probability, EOS last (empty when not scored), which sum
    to ``log_prob`` but for the alignment guide's penalties; ``met``: the constraint occurrences it
    meets, ``misplaced``: the terms it places away from their source words, each
    :data:`~aiayn.decode.constraints.PLACE_PENALTY` off ``log_prob`` (constrained search; both rank
    before the score, :attr:`rank`)."""

    tokens: list[int]
    score: float
    log_prob: float
    token_log_probs: tuple[float, ...] = ()
    met: int = 0
    misplaced: int = 0

    @property
    def rank(self) -> tuple[int, int, float]:
        """What orders hypotheses: the constraints met, then those away from their place (fewer
        first), then the score."""
        return self.met, -self.misplaced, self.score


@dataclass(frozen=True)
class SpecialIds:
    bos: int = BOS_ID
    eos: int = EOS_ID
    pad: int = PAD_ID


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's ``((5 + length) / 6) ** alpha``; ``length`` counts tokens including EOS."""
    return ((5.0 + length) / 6.0) ** alpha


def _hypothesis(
    tokens: list[int],
    log_prob: float,
    alpha: float,
    token_log_probs: Sequence[float] = (),
    met: int = 0,
    misplaced: int = 0,
) -> Hypothesis:
    score = log_prob / length_penalty(len(tokens) + 1, alpha)
    return Hypothesis(tokens, score, log_prob, tuple(token_log_probs), met, misplaced)


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
    rows = torch.arange(n, device=x.device)[:, None]
    candidates = blocks[rows, chosen].reshape(n, k * BLOCK)  # (N, k * BLOCK): faster than a gather
    values, position = candidates.topk(k, dim=-1)  # (N, k)
    return values, chosen.gather(1, position // BLOCK) * BLOCK + position % BLOCK


def stable_topk(x: Tensor, k: int, *, two_stage: bool = True) -> tuple[Tensor, Tensor]:
    """Top ``k`` of each row of ``x`` ``(N, M)``, descending; equal values: lower index first.

    ``torch.topk`` leaves the order of ties unspecified; this makes it deterministic. It costs one
    ``topk`` of ``k + 1`` (:func:`_topk`) plus a sort of ``k`` elements per row; a row with a tie
    across the cut (its k-th and (k+1)-th largest values equal, frequent in bf16) takes, of the
    values equal to the k-th, the lowest indices (one pass over the row, no sort of the row).
    ``two_stage=False``: one ``torch.topk`` over the whole row instead of :func:`_topk`'s two stages.
    """
    top_values, top_index = _topk(x, min(k + 1, x.size(-1)), two_stage=two_stage)
    if top_values.size(-1) > k:
        tied = (top_values[:, k - 1] == top_values[:, k]).nonzero()[:, 0]  # rows with ties across the cut
        if tied.numel():
            top_index = top_index.clone()
            top_index[tied, :k] = _first_at_cut(x[tied], top_values[tied, k - 1 : k], k)
    index = top_index[:, :k].sort(dim=-1).values  # (N, k), ascending index
    values, perm = x.gather(-1, index).sort(dim=-1, descending=True, stable=True)
    return values, index.gather(-1, perm)


def _first_at_cut(rows: Tensor, cut: Tensor, k: int) -> Tensor:
    """The indices ``(T, k)`` (ascending) of the top ``k`` of ``rows`` ``(T, M)`` whose k-th largest
    value is ``cut`` ``(T, 1)``: every value above the cut, then the lowest indices of those at it."""
    above, at = rows > cut, rows == cut
    room = k - above.sum(dim=-1, keepdim=True)  # places left for values at the cut (>= 1)
    take = above | (at & (at.cumsum(dim=-1) <= room))  # exactly k per row
    return take.nonzero()[:, 1].view(-1, k)


def _restrict(log_probs: Tensor, forced: Tensor, ids: SpecialIds) -> Tensor:
    """In place: never PAD or BOS; a row whose ``forced`` ``(N,)`` token is not -1 may only produce
    that token (EOS at its maximum length, a prefix's next token).

    The searches own the step function's output (a new tensor each call), so no copy is made; the
    entries changed are never chosen, so the log-probability of a chosen token is unchanged.
    """
    log_probs[:, [ids.pad, ids.bos]] = NEG_INF  # (N, V)
    rows = (forced >= 0).nonzero()[:, 0]
    if rows.numel():
        tokens = forced[rows]
        kept = log_probs[rows, tokens]
        log_probs[rows] = NEG_INF
        log_probs[rows, tokens] = kept
    return log_probs


def _forced(
    t: int,
    sentences: list[int],
    max_lens: list[int],
    prefixes: Sequence[Sequence[int]] | None,
    eos: int,
    device,
) -> Tensor:
    """``(n,)`` the token each sentence must produce at step ``t`` (its EOS at its maximum length, its
    prefix's ``t``-th token), -1 where the search chooses."""

    def one(s: int) -> int:
        if t >= max_lens[s]:
            return eos
        return prefixes[s][t] if prefixes is not None and t < len(prefixes[s]) else -1

    return torch.tensor([one(s) for s in sentences], dtype=torch.long, device=device)


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
    prefixes: Sequence[Sequence[int]] | None = None,
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
    return _single_path(
        step, max_lens, choose, alpha=alpha, ids=ids, normalise=logits, scores=scores, prefixes=prefixes
    )


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
    prefixes: Sequence[Sequence[int]] | None = None,
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
    repeated = [p for p in prefixes for _ in range(nbest)] if prefixes is not None else None
    lens = [n for n in max_lens for _ in range(nbest)]
    flat = _single_path(step, lens, choose, alpha=alpha, ids=ids, prefixes=repeated)
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
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[list[Hypothesis]]:
    """Extend each row by ``choose`` until EOS or its maximum length; finished rows leave the batch.

    ``normalise``: the step's outputs are logits; the chosen tokens' log-probs come from their
    ``log_softmax``. ``scores=False``: no log-probs at all (NaN in the hypotheses).
    """
    device = _device_of(step)
    active = list(range(len(max_lens)))
    prefix = torch.full((len(active), 1), ids.bos, dtype=torch.long, device=device)  # (n, t)
    token_lps = torch.zeros((len(active), 0), dtype=torch.float64, device=device)  # (n, t)
    results: list[list[Hypothesis]] = [[] for _ in active]
    t = 0
    while active:
        forced = _forced(t, active, max_lens, prefixes, ids.eos, device)  # (n,)
        outputs = step(prefix)  # (n, V) log-probs, or logits when ``normalise``
        log_probs = outputs.log_softmax(dim=-1) if normalise and scores else outputs  # before _restrict
        token = choose(_restrict(outputs, forced, ids))  # (n,)
        if scores:
            token_lps = torch.cat([token_lps, log_probs.gather(-1, token[:, None]).double()], dim=1)
        done = (token == ids.eos).tolist()
        for row, i in enumerate(active):
            if done[row]:
                results[i] = [_path_hypothesis(prefix[row, 1:].tolist(), token_lps[row], scores, alpha)]
        keep = torch.tensor([r for r, d in enumerate(done) if not d], dtype=torch.long, device=device)
        active = [i for i, d in zip(active, done) if not d]
        if active:
            step.reorder(keep)
        prefix = torch.cat([prefix, token[:, None]], dim=1)[keep]
        token_lps, t = token_lps[keep], t + 1
    return results


def _path_hypothesis(tokens: list[int], token_lps: Tensor, scores: bool, alpha: float) -> Hypothesis:
    if not scores:
        return _hypothesis(tokens, math.nan, alpha)
    values = token_lps.tolist()
    return _hypothesis(tokens, sum(values), alpha, values)


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
    prefixes: Sequence[Sequence[int]] | None = None,
    constraints: Constraints | None = None,
) -> list[list[Hypothesis]]:
    """Beam search (stopping rule in the module docstring). Returns ``nbest`` hypotheses per row,
    best first. ``step`` holds one row per sentence on entry; it is expanded to ``beam`` rows.

    ``paths.shortlist``: score only each row's best ``2 * beam`` tokens (exact, see
    ``_Beams.advance``); False scores all ``beam * V`` candidates. ``paths.two_stage``: see
    :func:`stable_topk`. ``constraints``: the lexically constrained search of
    :mod:`aiayn.decode.constraints` (hypotheses ranked by :attr:`Hypothesis.rank`: the constraints
    they meet, those away from their place, then the score); its n-best list holds only hypotheses
    that meet as many and place as many away as the best (it may be shorter than ``nbest``).
    """
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest ({nbest}) must be between 1 and beam ({beam})")
    _need_log_probs(step, "beam search")
    kind = _Beams if constraints is None else _ConstrainedBeams
    state = kind(step, max_lens, beam=beam, alpha=alpha, ids=ids, paths=paths, prefixes=prefixes)
    if constraints is not None:
        state.constrain(constraints, nbest)
    while state.active:
        state.advance()
    ranked = [sorted(f, key=lambda h: h.rank, reverse=True)[:nbest] for f in state.finished]
    if constraints is None:
        return ranked
    # under a glossary, an n-best entry is as good as the best on the terms, or left out
    return [[h for h in hyps if h.rank[:2] == hyps[0].rank[:2]] for hyps in ranked]


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
        prefixes: Sequence[Sequence[int]] | None = None,
    ) -> None:
        self.step, self.max_lens, self.beam, self.alpha, self.ids = step, max_lens, beam, alpha, ids
        self.paths, self.prefixes = paths, prefixes
        device = _device_of(step)
        n = len(max_lens)
        self.active = list(range(n))  # sentence ids still searching
        self.finished: list[list[Hypothesis]] = [[] for _ in range(n)]
        self.prefix = torch.full((n * beam, 1), ids.bos, dtype=torch.long, device=device)  # (n*K, t)
        self.token_lps = torch.zeros((n * beam, 0), dtype=torch.float64, device=device)  # (n*K, t)
        self.cum = torch.full((n, beam), NEG_INF, dtype=torch.float64, device=device)  # (n, K)
        self.cum[:, 0] = 0.0  # one live hypothesis (BOS) at the start
        self.t = 0  # tokens generated so far (BOS not counted)
        # The step holds one row per sentence until the first step is scored (t = 0): all K beams
        # start as the same BOS, so the first step runs once per sentence, not K times.

    def _log_probs(self) -> tuple[Tensor, Tensor, int]:
        """This step's restricted log-probs ``(n * rows, V)``, the forced tokens ``(n,)``, and the
        rows per sentence (1 at the first step)."""
        K = self.beam
        forced = _forced(self.t, self.active, self.max_lens, self.prefixes, self.ids.eos, self.prefix.device)
        rows = 1 if self.t == 0 else K
        log_probs = _restrict(self.step(self.prefix[:: K // rows]), forced.repeat_interleave(rows), self.ids)
        return log_probs, forced, rows

    def advance(self) -> None:
        """One step: expand, finish EOS candidates, choose the next beams, drop finished sentences."""
        K = self.beam
        log_probs, forced, rows = self._log_probs()
        # A sentence's best 2K candidates are among the best 2K tokens of each of its K rows (ties
        # included: both selections prefer the lower beam, then the lower token id), so only those
        # K * 2K candidates per sentence are scored, not K * V.
        per_row = min(2 * K, log_probs.size(-1)) if self.paths.shortlist else log_probs.size(-1)
        two_stage = self.paths.two_stage
        row_scores, row_tokens = stable_topk(log_probs, per_row, two_stage=two_stage)  # (n*rows, per_row)
        if rows == 1:  # beams 1..K-1 are copies of beam 0 with log-prob -inf
            row_scores, row_tokens = row_scores.repeat_interleave(K, 0), row_tokens.repeat_interleave(K, 0)
        n = len(self.active)
        step_lps = row_scores.double().reshape(n, K * per_row)
        cand = (self.cum.reshape(-1, 1) + row_scores.double()).reshape(n, K * per_row)
        scores, flat = stable_topk(cand, 2 * K, two_stage=two_stage)  # (n, 2K)
        origin = flat // per_row  # beam index of each candidate
        token = row_tokens.reshape(n, K * per_row).gather(-1, flat)  # (n, 2K)
        step_lps = step_lps.gather(-1, flat)
        is_eos = (token == self.ids.eos) & torch.isfinite(scores)  # (n, 2K)
        self._finish(scores, origin, is_eos, step_lps)
        live = torch.sort(is_eos.int(), dim=-1, stable=True).indices[:, :K]  # first K non-EOS, (n, K)
        new_cum = scores.gather(-1, live).masked_fill(is_eos.gather(-1, live), NEG_INF)  # (n, K)
        chosen = (origin.gather(-1, live), token.gather(-1, live), step_lps.gather(-1, live))
        self._select(*chosen, new_cum, forced == self.ids.eos)

    def _finish(
        self,
        scores: Tensor,
        origin: Tensor,
        is_eos: Tensor,
        step_lps: Tensor,
        met=None,
        misplaced=None,
        ending: Tensor | None = None,
    ) -> None:
        """EOS among the first ``beam`` candidates ends a hypothesis (``ending`` ``(n, candidates)``:
        the EOS candidates that end one); the best ``beam`` are kept. ``met``, ``misplaced`` ``(n,
        candidates)``: the constraints each meets, and places away from their source words."""
        ending = is_eos[:, : self.beam] if ending is None else ending
        hits = ending.nonzero()  # (hits, 2): (row, candidate), row-major order
        if not hits.numel():
            return
        rows, cands = hits[:, 0], hits[:, 1]
        old = rows * self.beam + origin[rows, cands]
        prefixes, lps = self.prefix[old, 1:].tolist(), self.token_lps[old].tolist()
        eos_lps = step_lps[rows, cands].tolist()
        counts = met[rows, cands].tolist() if met is not None else [0] * len(eos_lps)
        away = misplaced[rows, cands].tolist() if misplaced is not None else [0] * len(eos_lps)
        for row, tokens, score, lp, eos_lp, k, a in zip(
            rows.tolist(), prefixes, scores[rows, cands].tolist(), lps, eos_lps, counts, away
        ):
            self._keep(
                self.finished[self.active[row]], _hypothesis(tokens, score, self.alpha, [*lp, eos_lp], k, a)
            )

    def _keep(self, finished: list[Hypothesis], hypothesis: Hypothesis) -> None:
        if len(finished) == self.beam:
            worst = min(finished, key=lambda h: h.rank)
            if hypothesis.rank <= worst.rank:
                return
            finished.remove(worst)
        finished.append(hypothesis)

    def _all_settled(self, cum: Tensor) -> list[bool]:
        """Whether each active sentence is settled, its live hypotheses' log-probs ``cum`` ``(n, K)``."""
        best_live = cum.max(dim=-1).values.tolist()  # (n,) one transfer, not one per sentence
        return [self._settled(s, b) for s, b in zip(self.active, best_live)]

    def _settled(self, sentence: int, best_live: float) -> bool:
        """``beam`` finished, and the best live hypothesis (log-prob ``best_live``) cannot beat the
        worst of them."""
        finished = self.finished[sentence]
        if len(finished) < self.beam:
            return False
        bound = best_live / length_penalty(self.t + 2, self.alpha)  # if it ended next step
        return bound <= min(h.score for h in finished)

    def _select(self, origin: Tensor, token: Tensor, step_lps: Tensor, cum: Tensor, ended: Tensor) -> Tensor:
        """Keep the unfinished sentences (``ended``: forced to end); their rows become the chosen
        (origin, token) pairs. Returns the indices of the sentences kept."""
        K, first = self.beam, self.t == 0
        done = [f or settled for f, settled in zip(ended.tolist(), self._all_settled(cum))]
        keep = torch.tensor([r for r, d in enumerate(done) if not d], dtype=torch.long, device=origin.device)
        rows = (keep[:, None] * K + origin[keep]).reshape(-1)  # (n'*K,) rows of the old prefix
        self.prefix = torch.cat([self.prefix[rows], token[keep].reshape(-1, 1)], dim=1)  # (n'*K, t+1)
        self.token_lps = torch.cat([self.token_lps[rows], step_lps[keep].reshape(-1, 1)], dim=1)
        self.cum, self.t = cum[keep], self.t + 1
        self.active = [s for s, d in zip(self.active, done) if not d]
        if self.active:
            self.step.reorder(rows // K if first else rows)  # after the first step: row s*K+b was row s
        return keep


class _ConstrainedBeams(_Beams):
    """Beam search with lexical constraints: dynamic beam allocation (:mod:`aiayn.decode.constraints`)."""

    def constrain(self, constraints: Constraints, nbest: int = 1) -> None:
        self.constraints, self.nbest = constraints, nbest  # one row per active sentence
        rows, terms = len(self.active) * self.beam, constraints.terms.size(1)
        self.state = State.start(rows, terms, self.prefix.device)  # one row per beam

    def advance(self) -> None:
        """One step: the beams' best tokens and the tokens that advance their constraints, in banks."""
        K, n = self.beam, len(self.active)
        log_probs, forced, rows = self._log_probs()
        if rows == 1:
            log_probs = log_probs.repeat_interleave(K, 0)  # (n*K, V)
        c = self.constraints.rows(torch.arange(n, device=log_probs.device).repeat_interleave(K))
        penalty = self._guide(c, rows)
        offered = lexical.candidates(c, self.state)  # (n*K, 2C) the terms' tokens, -1: none
        lexical.restrict(c, self.state, log_probs, forced.repeat_interleave(K) < 0, self.ids.eos, offered)
        tokens, step_lps = self._candidates(log_probs, offered)  # (n*K, M)
        m = tokens.size(1)
        after = lexical.advance(c, self.state, tokens)  # n*K*M rows
        per_candidate = c.rows(torch.arange(n * K, device=tokens.device).repeat_interleave(m))
        misplaced = penalty(tokens)  # (n*K, M) terms each candidate places away from their place
        after.misplaced = (self.state.misplaced[:, None] + misplaced).reshape(-1)
        cand = (self.cum.reshape(-1, 1) + step_lps - lexical.PLACE_PENALTY * misplaced).reshape(n, K * m)
        order = cand.argsort(dim=-1, descending=True, stable=True)  # (n, K*m) ties: lower beam, token
        scores, token = cand.gather(-1, order), tokens.reshape(n, -1).gather(-1, order)
        step_lps, origin = step_lps.reshape(n, -1).gather(-1, order), order // m
        met = lexical.met(per_candidate, after).reshape(n, -1).gather(-1, order)
        is_eos = (token == self.ids.eos) & torch.isfinite(scores)
        misplaced = after.misplaced.reshape(n, -1).gather(-1, order)
        n_banks = self.constraints.banks
        banks = lexical.bank(per_candidate, after).reshape(n, -1).gather(-1, order)
        by_score = (K - self.constraints.tokens).clamp(min=1)  # the user's beam: see constraints.beam_for
        # an EOS ends a hypothesis where the allocation would give it one of the K places: a bank's
        # best may end although K hypotheses that have met fewer terms score better
        placed = lexical.stripes(banks, torch.isfinite(scores), n_banks, by_score)
        first_k = placed.argsort(dim=-1, stable=True)[:, :K]
        ending = torch.zeros_like(is_eos).scatter(1, first_k, True) & is_eos
        self._finish(scores, origin, is_eos, step_lps, met, misplaced, ending)
        valid = ~is_eos & torch.isfinite(scores)
        live = lexical.stripes(banks, valid, n_banks, by_score).argsort(dim=-1, stable=True)[:, :K]
        new_cum = scores.gather(-1, live).masked_fill(~valid.gather(-1, live), NEG_INF)
        chosen = (origin.gather(-1, live), token.gather(-1, live), step_lps.gather(-1, live))
        state = after.select(
            (torch.arange(n, device=order.device)[:, None] * K * m + order.gather(-1, live)).reshape(-1)
        )
        self._live_misplaced = state.misplaced.reshape(n, K)
        keep = self._select(*chosen, new_cum, forced == self.ids.eos)
        self.state = state.select((keep[:, None] * K + torch.arange(K, device=keep.device)).reshape(-1))
        self.constraints = self.constraints.rows(keep)

    def _all_settled(self, cum: Tensor) -> list[bool]:
        """As plain beam search, with the user's beam (not the banks') of finished hypotheses, and
        the order of :attr:`Hypothesis.rank`: a live hypothesis that has placed more terms away from
        their place than the worst of them cannot beat it, so it does not keep the search going."""
        users = (self.beam - self.constraints.tokens).clamp(min=1).clamp(max=self.nbest).tolist()
        away = self._live_misplaced.tolist()
        out = []
        for row, (sentence, need, cums) in enumerate(zip(self.active, users, cum.tolist())):
            finished = sorted(self.finished[sentence], key=lambda h: h.rank, reverse=True)
            if len(finished) < need:
                out.append(False)
                continue
            worst = finished[need - 1]
            live = [(c, a) for c, a in zip(cums, away[row]) if c > NEG_INF]
            if worst.met == int(self.constraints.need[row].sum()):  # the rank's next key decides first
                if any(a < worst.misplaced for _, a in live):
                    out.append(False)
                    continue
                live = [(c, a) for c, a in live if a == worst.misplaced]
            best = max((c for c, _ in live), default=NEG_INF)
            out.append(best / length_penalty(self.t + 2, self.alpha) <= worst.score)
        return out

    def _guide(self, c: Constraints, rows: int) -> Callable[[Tensor], Tensor]:
        """The alignment guide (:func:`~aiayn.decode.constraints.guide`) at this step: a function of
        the candidate tokens ``(N, M)`` that counts the terms each would place away from their place
        (passed by its row just now, or begun early)."""
        if c.places is None:
            return lambda tokens: torch.zeros(tokens.shape, dtype=torch.long, device=tokens.device)
        attention = self.step.attention  # (n * rows, S)
        if rows == 1:
            attention = attention.repeat_interleave(self.beam, 0)
        left, early = lexical.guide(c, self.state, attention)
        first = c.terms[:, :, 0]  # (N, C)

        def penalty(tokens: Tensor) -> Tensor:
            begins = ((tokens[:, :, None] == first[:, None, :]) & early[:, None, :]).any(dim=-1)
            return left[:, None] + begins

        return penalty

    def _candidates(self, log_probs: Tensor, extra: Tensor) -> tuple[Tensor, Tensor]:
        """Each row's ``2 * beam`` best tokens and ``extra`` ``(N, 2C)``, the tokens that advance its
        constraints (:func:`~aiayn.decode.constraints.candidates`; given once: a repeat gets -inf),
        with their log-probs ``(N, M)`` float64."""
        top_scores, top_tokens = stable_topk(log_probs, min(2 * self.beam, log_probs.size(-1)))
        repeated = (extra[:, :, None] == top_tokens[:, None, :]).any(dim=-1) | (extra < 0)
        extra_scores = log_probs.gather(1, extra.clamp(min=0)).masked_fill(repeated, NEG_INF)
        tokens = torch.cat([top_tokens, extra.clamp(min=0)], dim=1)
        return tokens, torch.cat([top_scores, extra_scores], dim=1).double()


# --- options and the model entry point -----------------------------------------------------------


#: The largest sampling seed (CTranslate2's seeds are 32-bit; one rule for both engines).
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode. ``beam=1`` is greedy search; ``sample=True`` samples instead of searching.

    ``max_len_a``/``max_len_b``: at most ``floor(a * S + b)`` tokens before EOS for a source of S
    tokens (its EOS included); the paper's "input length + 50" is a=1, b=50.
    ``scores=False``: the caller needs no scores, so a search that does not need them to choose
    (greedy) skips them; its hypotheses' ``score``/``log_prob`` are NaN. (The engines' ``translate``
    sets it from what the call wants, :class:`~aiayn.decode.request.Wanted`.)
    ``paths``: the exact speed-ups (:class:`SearchPaths`, module docstring); a switch set to False
    gives its reference path, the same output. ``glossary``: ``(source term, target term)`` pairs
    whose target terms a translation must contain where the source term occurs
    (:mod:`aiayn.decode.glossary`; beam search only). ``glossary_language``: the source language
    whose lemmas glossary terms match in (inflected forms); None: each term's own form only.
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
    glossary: tuple[tuple[str, str], ...] = ()
    glossary_language: str | None = None

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
            ("glossary", not (self.glossary and self.sample), "constrains a search, not sampling"),
        ]
        for name, ok, message in checks:
            if not ok:
                raise UserError(f"{name}: {message}")


@dataclass(frozen=True)
class Controls:
    """Per-sentence controls of a batch: ``prefixes`` (the target ids each output starts with),
    ``terms`` (each sentence's constraints, :mod:`aiayn.decode.constraints`; searched with beam
    search, at the options' beam), ``continues`` (``(V,)`` bool, the pieces that continue a word:
    none may follow a term), ``ends`` (``(V,)`` bool, the pieces that end a sentence: none before the
    terms are met), and the alignment guide's ``places`` (per sentence, per term: the source words
    where its source term is) and ``source_words`` (per sentence, the word of each source id, its EOS
    -1; :class:`~aiayn.decode.constraints.Constraints`)."""

    prefixes: Sequence[Sequence[int]] | None = None
    terms: Sequence[Terms] | None = None
    continues: Tensor | None = None
    ends: Tensor | None = None
    places: Sequence[Sequence[Sequence[int]]] | None = None
    source_words: Sequence[Sequence[int]] | None = None


def generate(
    model, src: Tensor, options: DecodeOptions = DecodeOptions(), controls: Controls = Controls()
) -> list[list[Hypothesis]]:
    """Decode a padded source batch ``src`` ``(B, S)`` with ``model`` (put it in eval mode first).

    Returns, per sentence, ``options.nbest`` hypotheses (one for greedy search), best first. A
    sentence's maximum length is at least its prefix's (within the model's ``max_len``).
    """
    config = model.config
    ids = SpecialIds(config.bos_id, config.eos_id, config.pad_id)
    max_lens = max_output_lengths(
        source_lengths(src, config.pad_id), options.max_len_a, options.max_len_b, config.max_len
    )
    prefixes = controls.prefixes
    if prefixes is not None:
        max_lens = [min(max(n, len(p)), config.max_len - 1) for n, p in zip(max_lens, prefixes)]
    constrained = controls.terms is not None and any(controls.terms)
    greedy = options.beam == 1 and not options.sample and not constrained
    with torch.inference_mode():
        # greedy: argmax of the logits
        guided = constrained and controls.places is not None and controls.source_words is not None
        layer = alignment_layer(config.n_decoder_layers) if guided else None
        step = _step(model, src, options, log_probs=not greedy, attention_layer=layer)
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
                prefixes=prefixes,
            )
        if greedy:
            return greedy_search(
                step,
                max_lens,
                alpha=options.alpha,
                ids=ids,
                scores=options.scores,
                paths=options.paths,
                prefixes=prefixes,
            )
        constraints = None
        if constrained:
            words = None
            if guided:
                words = torch.full(src.shape, -1, dtype=torch.long)
                for row, found in enumerate(controls.source_words):
                    words[row, : len(found)] = torch.tensor(found, dtype=torch.long)
            constraints = Constraints(
                controls.terms,
                controls.continues,
                src.device,
                ends=controls.ends,
                places=controls.places if guided else None,
                words=words,
            )
        return beam_search(
            step,
            max_lens,
            beam=options.beam,
            alpha=options.alpha,
            nbest=options.nbest,
            ids=ids,
            paths=options.paths,
            prefixes=prefixes,
            constraints=constraints,
        )


def _step(
    model, src: Tensor, options: DecodeOptions, *, log_probs: bool, attention_layer: int | None = None
) -> StepFunction:
    """The step function ``generate`` decodes with: :class:`~aiayn.decode.fast_step.FastStep` where
    ``options.paths.fast_step`` takes it (by default: on the CPU), with the cache, for a model in eval
    mode; else :class:`~aiayn.decode.step.ModelStep` (the reference)."""
    paths = options.paths
    fast = fast_step.by_default(model) if paths.fast_step is None else paths.fast_step
    if fast and options.use_cache and fast_step.supported(model):
        return fast_step.FastStep(
            model,
            src,
            log_probs=log_probs,
            group_rows=paths.group_rows,
            by_length=paths.by_length,
            attention_layer=attention_layer,
        )
    return ModelStep(
        model,
        src,
        use_cache=options.use_cache,
        log_probs=log_probs,
        paths=paths,
        attention_layer=attention_layer,
    )
