"""Prefixes, per-token log-probabilities and lexically constrained beam search: the constraint state
after given tokens, exact beams and scores on a fake model of fixed probabilities (as
tests/test_search.py), with the alignment guide (a fake cross-attention) and the sentence ends, the
guide's state after given tokens, the bank allocation against its rule written as plain loops, and a
small real model."""

from __future__ import annotations

import math
import random

import pytest
import torch

from aiayn import TransformerConfig, build_model
from aiayn.decode import DecodeOptions, beam_search, generate, greedy_search, sample_search
from aiayn.decode import constraints as lexical
from aiayn.decode.constraints import Constraints, State, _borders, beam_for, stripes
from aiayn.decode.search import Controls, _Beams
from aiayn.model.masks import padding_mask

PAD, UNK, BOS, EOS, A, B, C, D = range(8)
INF = math.inf
T, F = True, False


def dist(**p: float) -> list[float]:
    """A distribution over [pad, unk, bos, eos, a, b, c, d]; unnamed tokens share what is left."""
    names = ["pad", "unk", "bos", "eos", "a", "b", "c", "d"]
    rest = (1.0 - sum(p.values())) / (len(names) - len(p))
    return [p.get(name, rest) for name in names]


class Step:
    """Fixed next-token probabilities, the same for every sentence: ``table[prefix]`` (prefix: the
    tokens after BOS), ``default`` for others; checks that rows are reordered as the search says."""

    vocab_size = 8

    def __init__(self, table: dict[tuple, list[float]], rows: int, default: list[float] | None = None):
        self.table, self.default = table, default or dist(eos=0.9)
        self.seen: list[tuple] = [() for _ in range(rows)]
        self.beams: list[list[tuple]] = []  # per call, each row's prefix (the tokens after BOS)

    def __call__(self, prefix: torch.Tensor) -> torch.Tensor:
        self.beams.append([tuple(row[1:]) for row in prefix.tolist()])
        out = []
        for row in range(prefix.size(0)):
            tokens = tuple(prefix[row].tolist())
            assert tokens[:-1] == self.seen[row]
            self.seen[row] = tokens
            out.append(torch.tensor(self.table.get(tokens[1:], self.default), dtype=torch.float64).log())
        return torch.stack(out).float()

    def reorder(self, new_order: torch.Tensor) -> None:
        self.seen = [self.seen[i] for i in new_order.tolist()]


# The model prefers "a a" (then EOS); "b" and "c" are unlikely everywhere.
TABLE = {
    (): dist(a=0.7, b=0.05, c=0.05, d=0.1, eos=0.05),
    (A,): dist(a=0.6, b=0.05, c=0.05, eos=0.2),
    (A, A): dist(eos=0.8, b=0.05, c=0.05),
}


def constraints(terms, continues=None) -> Constraints:
    return Constraints(terms, continues, torch.device("cpu"))


def test_token_log_probs_sum_to_the_log_prob_in_every_search() -> None:
    for search in (
        lambda: greedy_search(Step(TABLE, 1), [6], alpha=0.6),
        lambda: beam_search(Step(TABLE, 1), [6], beam=3, alpha=0.6),
        lambda: sample_search(Step(TABLE, 1), [6], alpha=0.6, seed=3),
    ):
        [[h]] = search()
        assert len(h.token_log_probs) == len(h.tokens) + 1  # EOS last
        assert sum(h.token_log_probs) == pytest.approx(h.log_prob, abs=1e-9)
    [[best]] = greedy_search(Step(TABLE, 1), [6])
    assert best.tokens == [A, A]
    assert best.token_log_probs == pytest.approx([math.log(0.7), math.log(0.6), math.log(0.8)], abs=1e-6)


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_a_prefix_is_kept_and_the_search_goes_on_from_it(search) -> None:
    run = {
        "greedy": lambda step, **kw: greedy_search(step, [6], **kw),
        "beam": lambda step, **kw: beam_search(step, [6], beam=3, **kw),
        "sample": lambda step, **kw: sample_search(step, [6], seed=1, **kw),
    }[search]
    [[free]] = run(Step(TABLE, 1))
    assert free.tokens[:1] != [D]
    if search != "sample":
        assert free.tokens == [A, A]
    table = {**TABLE, (D,): dist(b=0.3, eos=0.5), (D, B): dist(c=0.9)}
    [[h]] = run(Step(table, 1), prefixes=[[D, B]])
    assert h.tokens[:2] == [D, B] and len(h.tokens) > 2  # kept, then continued
    if search != "sample":
        assert h.tokens == [D, B, C]
    # the prefix's own log-probabilities count, as CTranslate2's target_prefix's do
    assert h.token_log_probs[:2] == pytest.approx([math.log(0.1), math.log(0.3)], abs=1e-6)


def test_without_constraints_a_term_is_absent_with_them_present_exactly_once() -> None:
    [[plain]] = beam_search(Step(TABLE, 1), [6], beam=3, alpha=0.0)
    assert plain.tokens == [A, A]
    [[held]] = beam_search(Step(TABLE, 1), [6], beam=3, alpha=0.0, constraints=constraints([[[B, C]]]))
    # K = 3 (given as it is), two constraint tokens: by_score 1, and it stops once one has ended.
    # After "a" the table's d/unk share .025, elsewhere every token but EOS .9 has 1/70.
    # t=0: a .7, d .1, b .05 [1], c .05, unk 1/60                   -> a; bank 1's b; bank 0's d
    # t=1: a a .42, a b .035 [1], a c .035, a unk .0175, a d .0175, d x .0014 each (d b [1]),
    #      b x .0007 each (b c [2], b b [1])                         -> a a; bank 2's b c, bank 1's a b
    # t=2: a a b .021 [1], a a c .021, a a unk .0084, ..., b c eos .00064 [2], a b x .0005 each
    #      (a b c [2]): b c eos is bank 2's best, placed second of K = 3: it ends
    #                                                                -> a a b [1]; a b c [2], a a c
    # t=3: a b c eos .00045 [2] ends (first by score), a a b x and a a c x .0003 each: one ended,
    #      and the best live .0003 is below its .00064: stop. "b c" + EOS: .05 * 1/70 * .9
    assert (held.tokens, held.met) == ([B, C], 1)
    assert held.log_prob == pytest.approx(math.log(0.05 / 70 * 0.9))
    # asked twice: twice. K = 5, by_score 3:
    # t=0: a .7, d .1, b .05, c .05 [1], unk 1/60                  -> a, d, b; c [1]; unk
    # t=1: a a .42, a b .035, a c .035 [1], a unk, a d .0175, d x .0014 (d c [1]), b x .0007,
    #      c x .0007 (c c [2]), unk x .00024                         -> a a, a b, a c [1]; c c [2]; d c [1]
    # t=2: a a b .021, a a c .021 [1], a a unk .0084, ..., c c eos .00064 [2] (bank 2's best: ends),
    #      a b x, a c x .0005 (a c c [2]), ...                       -> a a b, a a c, a a unk; a c c, d c c
    # t=3: a c c eos .00045 [2] ends; the best live .0003 is below .00064: stop
    [[twice]] = beam_search(
        Step(TABLE, 1), [8], beam=beam_for(3, [[C], [C]]), alpha=0.0, constraints=constraints([[[C], [C]]])
    )
    assert (twice.tokens, twice.met) == ([C, C], 2)
    assert twice.log_prob == pytest.approx(math.log(0.05 / 70 * 0.9))


def test_a_term_met_as_often_as_asked_is_not_completed_again() -> None:
    likes_c = {(): dist(c=0.9), (C,): dist(c=0.9), (C, C): dist(c=0.9)}  # "c c c ..." unconstrained
    [[h]] = beam_search(
        Step(likes_c, 1, dist(c=0.5, eos=0.4)), [5], beam=2, alpha=0.0, constraints=constraints([[[C]]])
    )
    # K = 2, by_score 1. t=0: c .9 [1], unk 1/70, ...                 -> c [1]; bank 0's unk
    # t=1: after "c" a second "c" is barred; unk, eos, a, b, d have 1/70 each, so c unk and c eos
    #      tie (.9/70) and c unk, the lower id, comes first: it is the best by score and bank 1's
    #      best, and c eos is neither: it does not end. unk c .0071 [1], unk unk .00024
    #                                                                -> c unk [1]; bank 0's unk unk
    # t=2: c unk eos (.9/70 * .4) ends; the best live .9/70 * 1/60 is below it: stop
    assert (h.tokens, h.met) == ([C, UNK], 1) and h.log_prob == pytest.approx(math.log(0.9 / 70 * 0.4))


def test_no_piece_continues_the_last_word_of_a_term() -> None:
    continues = torch.zeros(8, dtype=torch.bool)
    continues[D] = True  # "d" continues a word (no word-start mark)
    after_b = {(): dist(a=0.9), (A,): dist(eos=0.9), (B,): dist(d=0.9), (A, B): dist(d=0.9)}
    [[loose]] = beam_search(Step(after_b, 1), [4], beam=3, alpha=0.0, constraints=constraints([[[B]]]))
    [[whole]] = beam_search(
        Step(after_b, 1), [4], beam=3, alpha=0.0, constraints=constraints([[[B]]], continues)
    )
    # the model's "b d": "a b d" + EOS (.9 * 1/70 * .9 * .9)
    assert loose.tokens == [A, B, D] and loose.log_prob == pytest.approx(math.log(0.9 / 70 * 0.9 * 0.9))
    # "d" barred after "b": "a unk b" + EOS (.9 * 1/70 * 1/70 * .9). ("a b" + EOS, .9 * 1/70 * 1/70,
    # ties at t=2 with every extension of "a unk" and "a a", which come first: it does not end.)
    assert whole.tokens == [A, UNK, B] and whole.log_prob == pytest.approx(math.log(0.9 / 70 / 70 * 0.9))


def test_terms_that_do_not_fit_end_at_the_maximum_length_with_as_many_as_fit() -> None:
    [[h]] = beam_search(
        Step(TABLE, 1), [2], beam=4, alpha=0.0, constraints=constraints([[[B, C], [D]]]), nbest=1
    )
    # "d b" (.1 * 1/70, then the forced EOS's .9) meets "d" and begins "b c"; "b c" (.05 * 1/70 * .9)
    # meets one term too, with a lower score
    assert (h.tokens, h.met) == ([D, B], 1) and h.log_prob == pytest.approx(math.log(0.1 / 70 * 0.9))


def test_the_automaton_follows_terms_that_overlap_themselves() -> None:
    # "a a b" inside "a a a b": after "a a a" the match is "a a", so the final "b" completes it
    borders = _borders([A, A, B], 3)
    assert borders[2] == [True, True, True]
    table = {(): dist(a=0.9), (A,): dist(a=0.9), (A, A): dist(a=0.9), (A, A, A): dist(b=0.9)}
    [[h]] = beam_search(Step(table, 1), [6], beam=4, alpha=0.0, constraints=constraints([[[A, A, B]]]))
    assert (h.tokens, h.met) == ([A, A, A, B], 1) and h.log_prob == pytest.approx(5 * math.log(0.9))


def _count(tokens: list[int], term: list[int]) -> int:
    return sum(tokens[i : i + len(term)] == term for i in range(len(tokens) - len(term) + 1))


# --- the constraint state after given tokens (Sockeye's allowed/met tables) -------------------------

# (terms, tokens produced, tokens offered (each unmet term's next token, then each one's first, once),
#  occurrences met, bank (constraint tokens produced), tokens barred in id order (unk continues a word))
STATES = {
    "no terms": ([], [A], [], 0, 0, []),
    "nothing produced": ([[C]], [], [C], 0, 0, [EOS]),
    "a one-token term met": ([[C]], [C], [], 1, 1, [UNK, C]),
    "a term under way: its next token, or its start again": ([[C, D]], [C], [D, C], 0, 1, [EOS]),
    "a term broken off": ([[C, D]], [C, A], [C], 0, 0, [EOS]),
    "a term met, its start produced again: its end is barred": ([[C, D]], [C, D, C], [], 1, 2, [D]),
    "a term asked twice, met once": ([[C], [C]], [C], [C], 1, 1, [UNK, EOS]),
    "a term asked twice, met twice": ([[C], [C]], [C, C], [], 2, 2, [UNK, C]),
    "the automaton: after a a a, a a b is two tokens in": ([[A, A, B]], [A, A, A], [B, A], 0, 2, [EOS]),
    "one term met, the next under way": ([[B, C], [C, D]], [B, C], [D, C], 1, 3, [UNK, EOS]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(STATES))
def test_the_constraint_state_after_given_tokens(case) -> None:
    terms, produced, offered, met_count, in_bank, barred = STATES[case]
    continues = torch.zeros(8, dtype=torch.bool)
    continues[UNK] = True
    c = constraints([terms], continues)
    state = State.start(1, c.terms.size(1), "cpu")
    for token in produced:
        state = lexical.advance(c, state, torch.tensor([[token]]))
    assert [t for t in lexical.candidates(c, state)[0].tolist() if t >= 0] == offered
    assert int(lexical.met(c, state)[0]) == met_count
    assert int(lexical.bank(c, state)[0]) == in_bank
    assert bool(lexical.unmet(c, state)[0]) == (met_count < len(terms))
    log_probs = lexical.restrict(c, state, torch.zeros(1, 8), torch.tensor([True]), EOS)
    assert (log_probs[0] == -INF).nonzero()[:, 0].tolist() == barred


# --- exact constrained beams and scores on a fixed table (traced by hand) ----------------------------


def only(**p: float) -> list[float]:
    """A distribution over [pad, unk, bos, eos, a, b, c, d]: the named tokens' probabilities, none
    for the others (log-prob -inf: never a valid candidate)."""
    assert math.isclose(sum(p.values()), 1.0)
    return [p.get(name, 0.0) for name in ["pad", "unk", "bos", "eos", "a", "b", "c", "d"]]


# The model writes "a b" (.5 * .6 * .9 = .27, greedy and beam search alike); "d" is its last choice
# after every prefix. No two candidates below tie where the trace depends on their order.
WRITES_AB = {
    (): only(a=0.5, b=0.2, unk=0.15, c=0.1, d=0.05),
    (A,): only(b=0.6, eos=0.2, c=0.1, unk=0.07, d=0.03),
    (A, B): only(eos=0.9, c=0.07, d=0.03),
    (C,): only(a=0.7, eos=0.12, unk=0.11, d=0.07),
}
ELSE = only(eos=0.9, unk=0.05, c=0.03, d=0.02)  # after any other prefix

# How the traces read. The beam is K = beam + one slot per constraint token (beam_for). A row offers
# its 2K best tokens and, for each unmet term, its next token and its first token where they are not
# among them; EOS is barred while a term is unmet, and a met term's last token once it is met as often
# as asked. Candidates are listed best first by their product of probabilities (alpha = 0: a score is
# its log), with [n] their bank (constraint tokens produced) where n > 0. They fill the beam in this
# order: the by_score = K - (constraint tokens) = beam best by score, then each bank's best (the
# fullest first), then each bank's second best, ... (a candidate placed by score uses its bank's
# turn). An EOS candidate among the first K of that order ends a hypothesis, so a bank's best that
# ends is kept whatever scores better, and an EOS beyond the by_score best that is not its bank's
# turn does not end. The next beams: the first K of the same order over the candidates that are not
# EOS. K finished hypotheses are kept; the search stops once min(beam, nbest) have ended (here
# nbest = K: beam) and no live one can outrank the last of those: where that one meets every term
# (and, unguided, none is misplaced), once the best live product is no better than its.


def constrained(terms, beam: int = 1, alpha: float = 0.0, nbest: int | None = None):
    """Beam search on WRITES_AB with one sentence's ``terms`` at the width a Translator gives them
    (K = ``beam`` + one per constraint token), ``nbest`` K unless given (it stops once
    ``min(beam, nbest)`` have ended and no live one can beat them): its finished hypotheses (up to
    ``nbest``), best first, and the beams of each step (each row's tokens after BOS)."""
    k = beam_for(beam, terms)
    step = Step(WRITES_AB, 1, ELSE)
    [hyps] = beam_search(step, [6], beam=k, alpha=alpha, nbest=nbest or k, constraints=constraints([terms]))
    return hyps, step.beams


def found(hyps) -> list[tuple[list[int], float, int]]:
    return [(h.tokens, h.log_prob, h.met) for h in hyps]


def test_the_plain_search_on_the_table_writes_a_b() -> None:
    for search in (greedy_search, lambda *a, **kw: beam_search(*a, beam=3, **kw)):
        [[h]] = search(Step(WRITES_AB, 1, ELSE), [6], alpha=0.0)
        assert (h.tokens, h.met) == ([A, B], 0) and h.score == pytest.approx(math.log(0.27), abs=1e-6)


def test_a_one_token_term_exactly() -> None:
    # "c", K = 2, by_score 1; it stops once one has ended:
    # t=0: a .5, b .2, unk .15, c .1 [1]                                        -> a; bank 1's c
    # t=1: a b .30, c a .07 [1], a c .05 [1], a unk .035, a d .015, c eos .012 [1], c unk .011 [1],
    #      c d .007 [1]: c eos is neither the best nor bank 1's best (c a)    -> a b; bank 1's c a
    # t=2: c a eos .063 [1], a b c .021 [1], a b d .009, c a unk .0035 [1], c a d .0014 [1]
    #      -> c a eos by score: it ends; the beams: a b c [1] by score, bank 1's best is a b c
    #      itself, then bank 0's a b d. One ended, the best live .021 < .063: stop
    hyps, beams = constrained([[C]])
    assert found(hyps) == [([C, A], pytest.approx(math.log(0.063)), 1)]
    assert beams == [[()], [(A,), (C,)], [(A, B), (C, A)]]
    # beam 2: K = 3, by_score 2; it stops once two have ended:
    # t=0: a .5, b .2, unk .15, c .1 [1], d .05                                 -> a, b; c [1]
    # t=1: a b .30, c a .07 [1], a c .05 [1], a unk .035, a d .015, c eos .012 [1], c unk .011 [1],
    #      b unk .01, ...                                                       -> a b, c a [1]; a c [1]
    # t=2: c a eos .063 [1], a c eos .045 [1], a b c .021 [1], a b d .009, c a unk .0035 [1], ...
    #      -> the two best end; the beams: a b c, a b d by score, then bank 1's second, c a unk.
    #      Two ended, the best live .021 < .045: stop
    hyps, beams = constrained([[C]], beam=2)
    assert found(hyps) == [
        ([C, A], pytest.approx(math.log(0.063)), 1),
        ([A, C], pytest.approx(math.log(0.045)), 1),
    ]
    assert beams == [[()], [(A,), (B,), (C,)], [(A, B), (C, A), (A, C)]]


def test_a_term_the_model_ranks_last_ends_as_its_bank_s_best_exactly() -> None:
    # "d", K = 2: at t=0 "d" is not among the 4 best tokens; it comes in as the term's candidate.
    # t=0: a .5, b .2, unk .15, c .1 (the 4 best), d .05 [1] (the term)        -> a; bank 1's d
    # t=1: a b .30, a c .05, d eos .045 [1], a unk .035, a d .015 [1], d unk .0025 [1], d c .0015 [1]
    #      "d" + EOS (.045, the best the search returns) is third by score but bank 1's best: it is
    #      placed second of K = 2 and ends                                     -> a b; bank 1's a d
    #      one ended, the best live .30 is above it: on
    # t=2: a b c .021, a d eos .0135 [1], a b d .009 [1], a d unk .00075 [1], a d c .00045 [1]
    #      -> a d eos, bank 1's best, ends; the beams a b c, and bank 1's a b d. The best live
    #      .021 < .045: stop
    hyps, beams = constrained([[D]])
    assert found(hyps) == [
        ([D], pytest.approx(math.log(0.045)), 1),
        ([A, D], pytest.approx(math.log(0.0135)), 1),
    ]
    assert beams == [[()], [(A,), (D,)], [(A, B), (A, D)]]
    # beam 2: K = 3, by_score 2, it stops once two have ended.
    # t=0 -> a, b; d [1]
    # t=1: a b .30, a c .05, d eos .045 [1] (bank 1's best: ends), a unk .035, a d .015 [1], b unk .01,
    #      ...                                                                 -> a b, a c; a d [1]
    # t=2: a b c .021, a d eos .0135 [1] (second by score: ends), a b d .009 [1], a c unk .0025,
    #      a c c .0015, a c d .001 [1], ...: the beams a b c, a b d [1] by score, then bank 1's
    #      second, a c d [1]. Two ended; the best live .021 > .0135: on
    # t=3: a b d eos .0081 [1], a b c unk .00105, a c d eos .0009 [1], ...: both EOS are among the
    #      first 3 and end, a c d's is worse than the three kept. Best live .00105 < .0135: stop
    hyps, beams = constrained([[D]], beam=2)
    assert found(hyps) == [
        ([D], pytest.approx(math.log(0.045)), 1),
        ([A, D], pytest.approx(math.log(0.0135)), 1),
        ([A, B, D], pytest.approx(math.log(0.0081)), 1),
    ]
    assert beams == [[()], [(A,), (B,), (D,)], [(A, B), (A, C), (A, D)], [(A, B, C), (A, B, D), (A, C, D)]]
    # nbest 1 with beam 2: one ended is enough, so at t=2 (.021 < .045) it stops a step earlier
    hyps, beams = constrained([[D]], beam=2, nbest=1)
    assert found(hyps) == [([D], pytest.approx(math.log(0.045)), 1)] and len(beams) == 3
    # alpha = 0.6 orders candidates by log-prob as before; the scores are divided by
    # ((5 + |Y|) / 6) ** 0.6, and the bound at t=2 (log .021 / (9/6) ** .6 = -3.03 > log .0135 / (8/6)
    # ** .6 = -3.62) still goes on, at t=3 (-5.05) stops
    hyps, _ = constrained([[D]], beam=2, alpha=0.6)
    assert [h.tokens for h in hyps] == [[D], [A, D], [A, B, D]]
    products = [0.045, 0.0135, 0.0081]
    assert [h.score for h in hyps] == pytest.approx(
        [math.log(p) / ((5 + n) / 6) ** 0.6 for p, n in zip(products, [2, 3, 4])]
    )


def test_a_term_of_two_tokens_exactly() -> None:
    # "c d", K = 3 (two constraint tokens), by_score 1: [1] after "c", [2] once met; it stops once
    # one has ended.
    # t=0: a .5, b .2, unk .15, c .1 [1], d .05         -> a; round 0: c [1] (bank 0's a is placed);
    #                                                      round 1: bank 0's b
    # t=1: a b .30, c a .07, a c .05 [1], a unk .035, a d .015, c unk .011, b unk .01, c d .007 [2],
    #      b c .006 [1], b d .004                        -> a b; round 0: c d [2], a c [1]
    # t=2: a b c .021 [1], a b d .009, c d eos .0063 [2], a c unk .0025, a c c .0015 [1],
    #      a c d .001 [2], c d unk .00035 [2], ...
    #      -> c d eos, bank 2's best, is placed second: it ends. The beams: a b c [1]; round 0:
    #      a c d [2], (bank 1's best is a b c) bank 0's a b d. One ended, the best live .021 is
    #      above it: on
    # t=3: a b c unk .00105, a c d eos .0009 [2], a b c c .00063 [1], a b d unk .00045,
    #      a b c d .00042 [2], ...
    #      -> a c d eos, bank 2's best, ends; the beams a b c unk; a b c d [2], a b c c [1]. The best
    #      live .00105 < .0063: stop
    hyps, beams = constrained([[C, D]])
    assert found(hyps) == [
        ([C, D], pytest.approx(math.log(0.0063)), 1),
        ([A, C, D], pytest.approx(math.log(0.0009)), 1),
    ]
    assert beams == [
        [()],
        [(A,), (C,), (B,)],
        [(A, B), (C, D), (A, C)],
        [(A, B, C), (A, C, D), (A, B, D)],
    ]


def test_two_terms_exactly() -> None:
    # "c" and "d", K = 3, by_score 1: [1] one met, [2] both.
    # t=0: a .5, b .2, unk .15, c .1 [1], d .05 [1]     -> a; round 0: c [1]; round 1: d [1] before b
    # t=1: a b .30, c a .07 [1], a c .05 [1], a unk .035, a d .015 [1], c unk .011 [1], c d .007 [2],
    #      d unk .0025 [1], d c .0015 [2]                -> a b; round 0: c d [2], c a [1]
    # t=2: a b c .021 [1], a b d .009 [1], c d eos .0063 [2], c a unk .0035 [1], c a d .0014 [2],
    #      c d unk .00035 [2]
    #      -> c d eos, bank 2's best, ends; the beams a b c [1]; round 0: c a d [2] (bank 2's best
    #      that is not EOS; bank 1's is a b c); round 1: c d unk [2] (before bank 1's a b d)
    #      one ended, the best live .021 is above it: on
    # t=3: c a d eos .00126 [2], a b c unk .00105 [1], a b c d .00042 [2], c d unk eos .000315 [2], ...
    #      -> c a d eos by score: it ends. The best live .00105 < .0063: stop
    hyps, beams = constrained([[C], [D]])
    assert found(hyps) == [
        ([C, D], pytest.approx(math.log(0.0063)), 2),
        ([C, A, D], pytest.approx(math.log(0.00126)), 2),
    ]
    assert beams == [
        [()],
        [(A,), (C,), (D,)],
        [(A, B), (C, D), (C, A)],
        [(A, B, C), (C, A, D), (C, D, UNK)],
    ]


# --- the alignment guide and the sentence ends (exact, on fixed tables) ------------------------------


class GuidedStep(Step):
    """A :class:`Step` that also exposes ``attention`` ``(rows, S)`` after each call, as ModelStep
    and FastStep do with an ``attention_layer``: all of a row's attention on the source position
    ``looks(prefix)`` (prefix: the tokens after BOS); by default the t-th token attends to position
    t, the last (EOS) once past it: a monotone alignment."""

    def __init__(self, table, words: list[int], looks=None, default: list[float] | None = None):
        super().__init__(table, 1, default or ELSE)
        self.width = len(words)
        self.looks = looks or (lambda prefix: min(len(prefix), self.width - 1))
        self.attention: torch.Tensor | None = None

    def __call__(self, prefix: torch.Tensor) -> torch.Tensor:
        out = super().__call__(prefix)
        self.attention = torch.zeros(prefix.size(0), self.width)
        for row, tokens in enumerate(prefix.tolist()):
            self.attention[row, self.looks(tuple(tokens[1:]))] = 1.0
        return out


def guided(table, terms, places, words, *, beam=1, max_len=6, looks=None, ends=None, nbest=None, alpha=0.0):
    """Constrained beam search on ``table`` (ELSE for other prefixes) with one sentence's ``terms``,
    their ``places`` (a list of source words per term; None: no guide), the source's ``words`` (its
    EOS -1) and the end pieces ``ends`` (tokens), at K = beam_for(beam, terms): its hypotheses (up to
    ``nbest``, K unless given), best first, and each step's beams."""
    k = beam_for(beam, terms)
    mask = torch.zeros(8, dtype=torch.bool)
    mask[list(ends or [])] = True
    c = Constraints(
        [terms],
        None,
        "cpu",
        ends=mask,
        places=None if places is None else [places],
        words=torch.tensor([words]),
    )
    step = GuidedStep(table, words, looks)
    [hyps] = beam_search(step, [max_len], beam=k, alpha=alpha, nbest=nbest or k, constraints=c)
    return hyps, step.beams


def placed(hyps) -> list[tuple[list[int], float, int, int]]:
    return [(h.tokens, h.log_prob, h.met, h.misplaced) for h in hyps]


P = lexical.PLACE_PENALTY  # what a term away from its place costs (log-prob)

# How the guided traces read: as the traces above, with each row's attended source word at each
# step ("@w", the monotone alignment unless said), the term's place, and *P for each term placed away
# from it (a factor e^-10 on the product: P). With the guide, a term is due where its place is
# attended (the k-th occurrence's place once the term is met k times). A row is away from the place
# of a term it has not begun when the term is not due now but was due at the last step or has been
# away since, or when the row attends a word BEYOND = 3 or more words after the place's last; at
# its PATIENCE = 3rd step away in a row it has passed the term (*P on all its candidates, once), and
# being due again before that starts the count anew. Beginning the term while neither due nor
# passed is early (*P on that candidate), one or two steps after its place too. {m}: misplaced
# m > 0; (away n): the row's steps away so far.

# The model writes "a b"; the term "c" translates source word 1, attended when the second token is
# chosen. Source: words 0, 1, 2, EOS.
IN_PLACE = {
    (): only(a=0.6, b=0.25, c=0.1, d=0.05),
    (A,): only(b=0.7, c=0.2, eos=0.1),
    (A, B): only(eos=0.6, c=0.3, d=0.1),
    (A, C): only(b=0.5, eos=0.4, d=0.1),
}
SOURCE = [0, 1, 2, -1]


def test_a_term_where_its_source_word_is_attended_beats_it_tacked_on_at_the_end() -> None:
    # Unguided, K = 2, by_score 1:
    # t=0: a .6, b .25, c .1 [1], d .05                                        -> a; bank 1's c
    # t=1: a b .42, a c .12 [1], c eos .09 [1], c unk .005 [1], c d .002 [1]   -> a b; a c [1]
    # t=2: a b c .126 [1], a c b .06 [1], a c eos .048 [1], a b d .042        -> a b c; bank 0's a b d
    # t=3: a b c eos .1134 ends (.6 * .7 * .3 * .9); best live .0063: stop
    hyps, beams = guided(IN_PLACE, [[C]], None, SOURCE)
    assert placed(hyps) == [([A, B, C], pytest.approx(math.log(0.1134)), 1, 0)]
    assert beams[2:] == [[(A, B), (A, C)], [(A, B, C), (A, B, D)]]
    # Guided, "c" at word 1:
    # t=0 @0: a .6, b .25, d .05, c .1*P [1]{1} (early)                        -> a; bank 1's c{1}
    # t=1 @1, due: a b .42, a c .12 [1] (not early), c eos .09*P [1]{1}, ...   -> a b; a c [1]
    # t=2 @2: a b was due, is not now: away 1 (not passed: that takes PATIENCE = 3 steps), and "c"
    #      begun now is early: *P on a b c only.
    #      a c b .06 [1], a c eos .048 [1], a b d .042, a c d .012 [1], a b c .126*P [1]{1}
    #      -> a c b by score; bank 1's best is a c b itself, bank 0's is a b d: a c eos, second by
    #      score, is not placed and does not end                              -> a c b; a b d (away 1)
    # t=3 @EOS: a c b eos .054 [1] (.6 * .2 * .5 * .9 < .1134, but "c" in place) ends; a c b unk
    #      .003 [1], a b d unk .0021 (away 2: not passed, nothing misplaced), ...; the best live
    #      .003 < .054: stop
    hyps, beams = guided(IN_PLACE, [[C]], [[1]], SOURCE)
    assert placed(hyps) == [([A, C, B], pytest.approx(math.log(0.054)), 1, 0)]
    assert beams[2:] == [[(A, B), (A, C)], [(A, C, B), (A, B, D)]]


# Reordering, as "a big city street" for "Straße ... Stadt": the term "c" translates source word 0;
# the model attends it for its first token "a", leaves it for word 2 for its next two, "b b", and
# comes back to it for "c".
REORDER = {
    (): only(a=0.8, c=0.2),
    (A,): only(b=0.7, c=0.3),
    (A, B): only(b=0.6, c=0.4),
    (A, B, B): only(c=0.9, eos=0.1),
}


def test_a_term_whose_place_the_attention_leaves_and_comes_back_to_is_in_place() -> None:
    # "c" at word 0, K = 2, by_score 1; @EOS wherever not said.
    # t=0 @0, due: a .8, c .2 [1] (in place)                                  -> a; bank 1's c
    # t=1 @2: a is away 1 (not passed), beginning "c" now is early.
    #      a b .56, c eos .18 [1] (bank 1's best: ends), c unk .01 [1], c d .004 [1], a c .24*P [1]{1}
    #      -> a b; bank 1's c unk. One ended, none misplaced; a b, none misplaced, is above it: on
    # t=2 @2: a b is away 2, not passed: a b b .336, c unk eos .009 [1] (bank 1's best: ends),
    #      c unk unk .0005 [1], c unk d .0002 [1], a b c .224*P [1]{1}     -> a b b; c unk unk
    # t=3 @0: due again (away 0): a b b c .3024 [1] (in place), c unk unk eos .00045 [1] (bank 1's
    #      second: as bank 0 is empty, placed and ends, below the K kept), ...
    #                                                                          -> a b b c; c unk unk unk
    #      the best live, a b b c, is above c's .18: on
    # t=4: a b b c eos .27216 [1] ends, the K kept's best; the best live .01512 is below it: stop.
    # (Passed at its first or second step away, "c" would be misplaced in a b b c: ranked after "c".)
    hyps, beams = guided(
        REORDER, [[C]], [[0]], SOURCE, looks=lambda p: {(): 0, (A,): 2, (A, B): 2, (A, B, B): 0}.get(p, 3)
    )
    assert placed(hyps) == [
        ([A, B, B, C], pytest.approx(math.log(0.8 * 0.7 * 0.6 * 0.9 * 0.9)), 1, 0),
        ([C], pytest.approx(math.log(0.2 * 0.9)), 1, 0),
    ]
    assert beams == [
        [()],
        [(A,), (C,)],
        [(A, B), (C, UNK)],
        [(A, B, B), (C, UNK, UNK)],
        [(A, B, B, C), (C, UNK, UNK, UNK)],
    ]


def test_a_term_whose_place_is_never_attended_is_still_met_once_misplaced() -> None:
    # "c" at word 2, which nothing attends: @0 at t=0, @1 at t=1, then @EOS. The term is never due,
    # so never away (nor BEYOND: EOS is no word, words 0 and 1 come before word 2) and never passed:
    # beginning it is always early.
    # K = 2, at most 4 tokens (the 5th forced EOS).
    # t=0: a .6, b .25, d .05, c .1*P [1]{1}                                    -> a; bank 1's c
    # t=1: a b .42, a c .12*P [1]{1}, c eos .09*P [1]{1}, ...                    -> a b; a c{1}
    # t=2: a b d .042, a b c .126*P [1]{1}, a c b .06*P [1]{1}, a c eos .048*P [1]{1}, ...
    #                                                                           -> a b d; a b c{1}
    # t=3: a b d unk .0021, a b d d .00084, a b c eos .1134*P [1]{1} (bank 1's best: ends), ...
    #      -> a b d unk; a b c unk{1}. One ended with a term misplaced, and a b d unk has none
    #      misplaced (it has not begun the term): it might still outrank it, the search goes on
    # t=4: forced EOS: a b d unk eos .00189 (meets no term), a b c unk eos .00567*P [1]{1}: both
    #      end, and the second replaces the first among the K kept
    hyps, beams = guided(
        IN_PLACE, [[C]], [[2]], SOURCE, max_len=4, looks=lambda p: {(): 0, (A,): 1}.get(p, 3)
    )
    assert placed(hyps) == [
        ([A, B, C], pytest.approx(math.log(0.1134) - P), 1, 1),
        ([A, B, C, UNK], pytest.approx(math.log(0.00567) - P), 1, 1),
    ]
    assert beams[3:] == [[(A, B, D), (A, B, C)], [(A, B, D, UNK), (A, B, C, UNK)]]
    # the penalty is in the score and the log-prob, not in the tokens' own log-probabilities
    assert sum(hyps[0].token_log_probs) == pytest.approx(hyps[0].log_prob + P)


# The model likes "c c"; "c" is asked twice, for source words 0 and 2.
TWICE = {
    (): only(c=0.6, a=0.3, b=0.1),
    (C,): only(c=0.5, a=0.4, eos=0.1),
    (C, C): only(eos=0.6, a=0.3, b=0.1),
    (C, A): only(eos=0.5, c=0.3, b=0.2),
}


def test_a_term_asked_twice_is_due_the_second_time_at_its_second_place() -> None:
    # Unguided, K = 3 (two constraint tokens: "c" twice), by_score 1:
    # t=0: c .6 [1], a .3, b .1                                                -> c; a; b
    # t=1: c c .3 [2], c a .24 [1], a unk .015, a c .009 [1], ...              -> c c; c a [1]; a unk
    # t=2: c c eos .18 [2] ends; c c a .09 [2]: the best live .09 < .18: stop
    hyps, _ = guided(TWICE, [[C], [C]], None, SOURCE)
    assert placed(hyps) == [([C, C], pytest.approx(math.log(0.18)), 2, 0)]
    # Guided, the first "c" at word 0, the second at word 2:
    # t=0 @0, the first due: c .6 [1], a .3, b .1                              -> c; a; b
    # t=1 @1: the second "c" is not due: c c is early; a and b were due and are not: away 1, and
    #      beginning "c" there is early
    #      c a .24 [1], a unk .015, a d .006, b unk .005, b d .002, c c .3*P [2]{1},
    #      a c .009*P [1]{1}, ...                                              -> c a; c c{1}; a unk
    # t=2 @2, the second due: c a c .072 [2] (not early), c a b .048 [1], a unk unk .00075 (away 2),
    #      a unk d .0003, c c eos .18*P [2]{1}, ...
    #      -> c a c by score; bank 1's c a b; bank 0's a unk unk: c c eos (bank 2's second) does not
    #      end
    # t=3 @EOS: c a c eos .0648 [2] ends; c a c unk .0036 [2], c a b unk .0024 [1] (away 1 from the
    #      second place), ...; a unk unk, at its third step away from the first place, passes it:
    #      *P on its candidates. The best live not misplaced .0036 < .0648: stop
    hyps, beams = guided(TWICE, [[C], [C]], [[0], [2]], SOURCE)
    assert placed(hyps) == [([C, A, C], pytest.approx(math.log(0.0648)), 2, 0)]
    assert beams == [
        [()],
        [(C,), (A,), (B,)],
        [(C, A), (C, C), (A, UNK)],
        [(C, A, C), (C, A, B), (A, UNK, UNK)],
    ]


# The model writes "a d", "d" an end piece (as "."), and puts "c" after it.
ENDS = {
    (): only(a=0.8, c=0.12, d=0.08),
    (A,): only(d=0.7, c=0.2, eos=0.1),
    (A, D): only(eos=0.6, c=0.3, unk=0.1),
    (A, C): only(d=0.8, eos=0.2),
    (C,): only(a=0.5, d=0.3, eos=0.2),
}


def test_no_sentence_end_before_a_term_unless_it_is_the_term_s_own_piece() -> None:
    # Without ends, K = 2, by_score 1:
    # t=0: a .8, c .12 [1], d .08                                              -> a; bank 1's c
    # t=1: a d .56, a c .16 [1], c a .06 [1], c d .036 [1], c eos .024 [1]     -> a d; a c [1]
    # t=2: a d c .168 [1], a c d .128 [1], a d unk .056, a c eos .032 [1]      -> a d c; a d unk
    # t=3: a d c eos .1512 ends; best live .0084: stop
    hyps, beams = guided(ENDS, [[C]], None, [0, -1])
    assert placed(hyps) == [([A, D, C], pytest.approx(math.log(0.1512)), 1, 0)]
    # "d" an end: barred while "c" is unmet (and EOS is).
    # t=0: a .8, c .12 [1]                                                     -> a; c [1]
    # t=1: a c .16 [1] (a d barred), c a .06 [1], c d .036 [1] (c met: d free), c eos .024 [1]
    #      -> a c by score, bank 1's best; then bank 1's second: c a
    # t=2: a c d .128 [1], c a eos .054 [1], a c eos .032 [1], c a unk .003 [1], c a d .0012 [1]
    #      -> a c d; c a eos, bank 1's second, ends; the beams a c d, c a unk. Best live .128: on
    # t=3: a c d eos .1152 ends; best live .0064: stop
    hyps, beams = guided(ENDS, [[C]], None, [0, -1], ends=[D])
    assert placed(hyps) == [
        ([A, C, D], pytest.approx(math.log(0.1152)), 1, 0),
        ([C, A], pytest.approx(math.log(0.054)), 1, 0),
    ]
    assert beams == [[()], [(A,), (C,)], [(A, C), (C, A)], [(A, C, D), (C, A, UNK)]]
    # the term "c d": "d" is its own next piece after "c", so it is not barred there. K = 3 (two
    # constraint tokens), by_score 1.
    # t=0: a .8, c .12 [1] (d barred: not the term's next piece)  -> a; c [1]; the third slot empty
    # t=1: a c .16 [1], c a .06, c d .036 [2] (a d barred)         -> a c; round 0: c d [2], c a
    # t=2: a c d .128 [2], c d eos .0324 [2], c a unk .003, c d unk .0018 [2], c a c .0018 [1], ...
    #      (c a d barred) -> a c d by score, bank 2's turn; round 0: bank 1's c a c, bank 0's c a unk:
    #      c d eos, bank 2's second, is not placed and does not end
    # t=3: a c d eos .1152 [2] ends; the best live .0064: stop
    hyps, beams = guided(ENDS, [[C, D]], None, [0, -1], ends=[D])
    assert placed(hyps) == [([A, C, D], pytest.approx(math.log(0.1152)), 1, 0)]
    assert beams[1][:2] == [(A,), (C,)]  # the third row holds no hypothesis
    assert beams[2:] == [[(A, C), (C, D), (C, A)], [(A, C, D), (C, A, C), (C, A, UNK)]]


# (terms, tokens produced, tokens barred in id order), "d" an end piece
ENDS_BARRED = {
    "a term unmet: no end piece": ([[C]], [], [EOS, D]),
    "an end piece that begins an unmet term": ([[D]], [], [EOS]),
    "an end piece that continues a term under way": ([[C, D]], [C], [EOS]),
    "an end piece that is not the term's next piece": ([[C, D]], [], [EOS, D]),
    "every term met: the end pieces are free": ([[C]], [C], [C]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(ENDS_BARRED))
def test_the_end_pieces_barred_after_given_tokens(case) -> None:
    terms, produced, barred = ENDS_BARRED[case]
    ends = torch.zeros(8, dtype=torch.bool)
    ends[D] = True
    c = Constraints([terms], None, "cpu", ends=ends)
    state = State.start(1, c.terms.size(1), "cpu")
    for token in produced:
        state = lexical.advance(c, state, torch.tensor([[token]]))
    log_probs = lexical.restrict(c, state, torch.zeros(1, 8), torch.tensor([True]), EOS)
    assert (log_probs[0] == -INF).nonzero()[:, 0].tolist() == barred


# The model starts with "c" and ends at once, where "c" (for word 1) comes early; in its place,
# after "a", "c" is 1/9999 as likely as the model's "b"
RANK = {
    (): only(c=0.9, a=0.1),
    (C,): only(eos=0.9, a=0.1),
    (A,): only(b=0.9999, c=0.0001),
}


def test_a_hypothesis_with_its_terms_in_place_ranks_before_a_better_scored_misplaced_one(monkeypatch) -> None:
    ended = []  # every hypothesis that ends, in order, whether the K kept take it or not
    keep = _Beams._keep
    monkeypatch.setattr(_Beams, "_keep", lambda self, kept, h: (ended.append(h), keep(self, kept, h)))
    # "c" at word 1, K = 2, by_score 1 (log-probs: c eos is log .81 - 10 = -10.21, a c eos log 9e-6
    # = -11.62):
    # t=0 @0: a .1, c .9*P [1]{1} (early)                                      -> a; bank 1's c{1}
    # t=1 @1: a b .09999, c eos .81*P [1]{1} (bank 1's best: ends), a c .00001 [1], c a .09*P [1]{1}
    #      -> a b; bank 1's a c. One ended, misplaced, and a b has none misplaced: on
    # t=2 @2: a b is away 1, not passed: a b unk .005, a b d .002, a c eos .000009 [1] (bank 1's
    #      best: ends), a c unk .0000005 [1], ..., a b c .003*P [1]{1} (early)
    #      -> a b unk; bank 1's a c unk. The first by rank, a c, meets the term with none
    #      misplaced; a b unk has none misplaced either, and .005 is above a c's .000009: on
    # t=3 @EOS: a b unk away 2: a b unk unk .00025, a b unk d .0001, a c unk eos .00000045 [1] (bank
    #      1's best: ends, and takes the place of c{1}, the K kept's last by rank although its score
    #      is the best), ...                                             -> a b unk unk; a c unk unk
    # t=4 @EOS: a b unk unk passes "c" at its third step away: *P on all its candidates.
    #      a c unk unk eos .0000000225 [1] (ends, below the K kept), a c unk unk unk .00000000125 [1],
    #      a b unk unk unk .0000125*P{1}, ...: the best live with none misplaced, .00000000125, is
    #      below a c's .000009: stop
    hyps, beams = guided(RANK, [[C]], [[1]], SOURCE)
    assert placed(ended) == [
        ([C], pytest.approx(math.log(0.81) - P), 1, 1),
        ([A, C], pytest.approx(math.log(0.1 * 0.0001 * 0.9)), 1, 0),
        ([A, C, UNK], pytest.approx(math.log(0.1 * 0.0001 * 0.05 * 0.9)), 1, 0),
        ([A, C, UNK, UNK], pytest.approx(math.log(0.1 * 0.0001 * 0.05 * 0.05 * 0.9)), 1, 0),
    ]
    assert ended[0].score > ended[1].score > ended[2].score
    # the n-best list: the two in place; "c" (ranked after them) would be left out anyway, as worse
    # on the terms than the best
    assert placed(hyps) == placed(ended[1:3])
    assert beams == [
        [()],
        [(A,), (C,)],
        [(A, B), (A, C)],
        [(A, B, UNK), (A, C, UNK)],
        [(A, B, UNK, UNK), (A, C, UNK, UNK)],
    ]


@pytest.mark.parametrize("beam", [1, 2, 3])
@pytest.mark.parametrize(
    "terms, places", [([[A]], [[0]]), ([[B]], [[1]]), ([[A], [B]], [[0], [1]]), ([[A, B]], [[0, 1]])]
)
def test_a_term_the_plain_search_writes_in_its_place_changes_nothing(beam, terms, places) -> None:
    """Metamorphic: the plain search writes "a b", "a" attending to source word 0, "b" to word 1;
    terms asked there, guided, give the same tokens and the same score as the plain search at the
    user's beam (the constrained one is wider: beam + one per term token), alpha 0.6."""
    [[plain]] = beam_search(Step(WRITES_AB, 1, ELSE), [6], beam=beam, alpha=0.6)
    assert plain.tokens == [A, B]
    hyps, _ = guided(WRITES_AB, terms, places, [0, 1, -1], beam=beam, nbest=1, alpha=0.6)
    [held] = hyps
    assert (held.tokens, held.met, held.misplaced) == (plain.tokens, len(terms), 0)
    assert held.score == pytest.approx(plain.score) and held.log_prob == pytest.approx(plain.log_prob)


# --- the alignment guide's state (constraints.guide) after given tokens -------------------------------

SRC_EOS = 7  # the source: words 0-6, then its EOS (no word)

# (terms, places, [(source word attended, token produced)], the word attended now, then after the
#  guide: due, passed, passed just now (left), early, away (the steps away in a row)). A is no term's
#  token: the histories move the attention without producing a term. PATIENCE = 3, BEYOND = 3.
GUIDES = {
    "due where its word is attended": ([[C]], [[1]], [], 1, [T], [F], 0, [F], [0]),
    "elsewhere not due, and beginning it is early": ([[C]], [[1]], [], 0, [F], [F], 0, [T], [0]),
    # due, then not: away; the term is passed at the third step away in a row
    "away one step after its place: not passed, beginning it now is early": (
        [[C]], [[1]], [(1, A)], 2, [F], [F], 0, [T], [1],
    ),
    "away two steps: not yet passed": ([[C]], [[1]], [(1, A), (2, A)], 2, [F], [F], 0, [T], [2]),
    "passed at the third step away": ([[C]], [[1]], [(1, A), (2, A), (2, A)], 2, [F], [T], 1, [F], [3]),
    "away is anywhere but its place, before it too": (
        [[C]], [[1]], [(1, A), (2, A), (0, A)], 0, [F], [T], 1, [F], [3],
    ),
    "passed once, counted once": ([[C]], [[1]], [(1, A), (2, A), (2, A), (2, A)], 2, [F], [T], 0, [F], [4]),
    "passed, due again: not early (its cost is paid)": (
        [[C]], [[1]], [(1, A), (2, A), (2, A), (2, A)], 1, [T], [T], 0, [F], [0],
    ),
    # reordering ("a city street" for "Straße ... Stadt"): the attention leaves and comes back
    "away two steps, then due again: not passed": (
        [[C]], [[1]], [(1, A), (2, A), (3, A)], 1, [T], [F], 0, [F], [0],
    ),
    "due again, then away: the count starts anew": (
        [[C]], [[1]], [(1, A), (2, A), (3, A), (1, A)], 2, [F], [F], 0, [T], [1],
    ),
    # BEYOND: attending a word 3 or more after the place's last is away, even if never due
    "two words after its place is not beyond": ([[C]], [[1]], [], 3, [F], [F], 0, [T], [0]),
    "BEYOND, never due: one step away, not passed": ([[C]], [[1]], [], 4, [F], [F], 0, [T], [1]),
    "BEYOND twice: not yet passed": ([[C]], [[1]], [(4, A)], 5, [F], [F], 0, [T], [2]),
    "BEYOND three steps in a row: passed": ([[C]], [[1]], [(4, A), (5, A)], 6, [F], [T], 1, [F], [3]),
    "BEYOND once, then its place: not passed": ([[C]], [[1]], [(4, A)], 1, [T], [F], 0, [F], [0]),
    "a place of two words: moving from one to the other is not leaving it": (
        [[C]], [[1, 2]], [(1, A)], 2, [T], [F], 0, [F], [0],
    ),
    "a place of two words: beyond counts from its last": ([[C]], [[1, 2]], [], 4, [F], [F], 0, [T], [0]),
    "a place of two words: three after its last is beyond": ([[C]], [[1, 2]], [], 5, [F], [F], 0, [T], [1]),
    "a place of two words, passed by BEYOND": (
        [[C]], [[1, 2]], [(5, A), (5, A)], 5, [F], [T], 1, [F], [3],
    ),
    "EOS is no word: never beyond": ([[C]], [[1]], [], SRC_EOS, [F], [F], 0, [T], [0]),
    "EOS after its place is leaving it: passed at the third step": (
        [[C]], [[6]], [(6, A), (SRC_EOS, A), (SRC_EOS, A)], SRC_EOS, [F], [T], 1, [F], [3],
    ),
    "a term under way is neither away, passed nor early": (
        [[C, D]], [[1]], [(1, C), (2, C), (3, C)], 4, [F], [F], 0, [F], [0],
    ),
    "two terms passed at one step: left counts both": (
        [[C], [D]], [[1], [1]], [(1, A), (2, A), (2, A)], 2, [F, F], [T, T], 2, [F, F], [3, 3],
    ),
    "the second occurrence due at its own place": (
        [[C], [C]], [[0], [2]], [(0, C)], 2, [T], [F], 0, [F], [0],
    ),
    "the second occurrence not at the first's": ([[C], [C]], [[0], [2]], [(0, C)], 0, [F], [F], 0, [T], [0]),
    "met, the next occurrence's place is fresh": ([[C], [C]], [[0], [2]], [(2, C)], 1, [F], [F], 0, [T], [0]),
    "met after a step away: the next occurrence's count starts at 0": (
        [[C], [C]], [[0], [2]], [(0, A), (1, C)], 1, [F], [F], 0, [T], [0],
    ),
    "a term met as often as asked: nothing": ([[C]], [[1]], [(1, C)], 4, [F], [F], 0, [F], [0]),
    # "c d" begun at its place, broken off by "a": not under way any more, so away from then on (it
    # was due), step by step: away 1 after "c a", 2 now (beginning it now is early); and passed at
    # the third step away
    "begun at its place and broken off: away from then on": (
        [[C, D]], [[1]], [(1, C), (2, A), (3, A)], 4, [F], [F], 0, [T], [2],
    ),
    "begun at its place and broken off: passed at the third step away": (
        [[C, D]], [[1]], [(1, C), (2, A), (3, A), (4, A)], 5, [F], [T], 1, [F], [3],
    ),
}  # fmt: skip


def attend(position: int, width: int = SRC_EOS + 1) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor([position]), width).float()


@pytest.mark.parametrize("case", list(GUIDES))
def test_the_guide_after_given_tokens(case) -> None:
    terms, places, history, now, due, passed, left, early, away = GUIDES[case]
    words = torch.tensor([[*range(SRC_EOS), -1]])
    c = Constraints([terms], None, "cpu", places=[places], words=words)
    state = State.start(1, c.terms.size(1), "cpu")
    for position, token in history:  # as the search: the guide at the step, then the token
        lexical.guide(c, state, attend(position))
        state = lexical.advance(c, state, torch.tensor([[token]]))
    now_left, now_early = lexical.guide(c, state, attend(now))
    assert state.due[0].tolist() == due and state.passed[0].tolist() == passed
    assert int(now_left[0]) == left and now_early[0].tolist() == early
    assert state.away[0].tolist() == away


def test_the_guide_sums_the_attention_of_a_word_s_pieces() -> None:
    # source pieces: word 0 in two pieces, word 1, EOS; .3 + .3 on word 0 outweighs .4 on word 1
    c = Constraints([[[C], [D]]], None, "cpu", places=[[[0], [1]]], words=torch.tensor([[0, 0, 1, -1]]))
    state = State.start(1, c.terms.size(1), "cpu")
    lexical.guide(c, state, torch.tensor([[0.3, 0.3, 0.4, 0.0]]))
    assert state.due[0].tolist() == [T, F]
    lexical.guide(c, state, torch.tensor([[0.3, 0.0, 0.4, 0.3]]))  # word 1 now, EOS .3 is no word
    # "c" left its place: one step away (passed only at the third), "d" is due
    assert state.due[0].tolist() == [F, T] and state.away[0].tolist() == [1, 0]
    assert state.passed[0].tolist() == [F, F]


# --- the bank allocation (constraints.stripes, as _ConstrainedBeams.advance uses it) ----------------


def filled_by_rule(scores, banks, valid, n_banks: int, by_score: int) -> list[int]:
    """The order in which one sentence's candidates fill its beam, written from the docstrings of
    constraints.stripes and constraints (plain loops, no keys): the candidates by score (ties: the
    earlier one); the ``by_score`` best valid ones; then rounds r = 0, 1, ...: each bank, the fullest
    (n_banks - 1) first, gives its r-th best valid candidate, unless that one is placed already (a
    bank's best taken by score uses that bank's turn); the invalid candidates last, by score."""
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i])  # sorted() is stable
    good = [i for i in ranked if valid[i]]
    order = good[:by_score]
    members = [[i for i in good if banks[i] == b] for b in range(n_banks)]
    for r in range(len(good)):
        for b in reversed(range(n_banks)):
            if r < len(members[b]) and members[b][r] not in order:
                order.append(members[b][r])
    return order + [i for i in ranked if not valid[i]]


def filled_by_search(scores, banks, valid, n_banks: int, by_score: list[int]) -> list[list[int]]:
    """The same for a batch ``(n, M)`` through the search's code: sorted by score (stable, as the
    search sorts its candidates), ``stripes``' keys, a stable argsort; the beam keeps the first K."""
    scores = torch.tensor(scores, dtype=torch.float64)
    order = scores.argsort(dim=-1, descending=True, stable=True)
    keys = stripes(
        torch.tensor(banks).gather(-1, order),
        torch.tensor(valid).gather(-1, order),
        n_banks,
        torch.tensor(by_score),
    )
    return order.gather(-1, keys.argsort(dim=-1, stable=True)).tolist()


# (scores, banks, valid, banks in the batch, by_score, the order they fill the beam)
ALLOCATIONS = {
    "no constraints: the plain beam's order": ([-3, -1, -2, -4], [0, 0, 0, 0], [T] * 4, 1, 2, [1, 2, 0, 3]),
    # first 0; round 0: bank 2's best 3, bank 1's 2 (bank 0's best is 0); round 1: 5, 4, 1
    "the best of each bank, the fullest first, then the second best of each": (
        [-1, -2, -3, -4, -5, -6], [0, 0, 1, 2, 1, 2], [T] * 6, 3, 1, [0, 3, 2, 5, 4, 1],
    ),
    # by score: 1, 3 (-1), then 0, 2, 4 (-2); first 1; round 0: bank 1's 3 (bank 0's best is 1);
    # round 1: bank 1's 0, bank 0's 4; round 2: bank 1's 2
    "equal scores: the earlier candidate first": (
        [-2, -1, -2, -1, -2], [1, 0, 1, 1, 0], [T] * 5, 2, 1, [1, 3, 0, 4, 2],
    ),
    # 0 is an EOS (finished elsewhere), 2 and 5 are -inf: the first valid one is 1, then bank 1's 3,
    # bank 0's 4; the invalid ones last, by score
    "invalid candidates take no place and no turn": (
        [-1, -2, -INF, -3, -4, -INF], [1, 0, 1, 1, 0, 0], [F, T, F, T, T, F], 2, 1, [1, 3, 4, 0, 2, 5],
    ),
    # five banks for a beam of 3: the two fullest get the slots after the one kept by score
    "more banks than slots: the fullest first": (
        [-1, -2, -3, -4, -5], [0, 1, 2, 3, 4], [T] * 5, 5, 1, [0, 4, 3, 2, 1],
    ),
    # banks 4, 2, 1 have no candidate (the batch's other sentences have more constraint tokens)
    "empty banks are skipped": ([-1, -2, -3, -4], [0, 0, 3, 0], [T] * 4, 5, 1, [0, 2, 1, 3]),
    # bank 0's best (0) is kept by score and counts as bank 0's turn of round 0: a beam of 3 keeps
    # 0, 2, 3 (not 0, 2, 1, as re-ranking the banks without 0 would)
    "a candidate kept by score uses its bank's turn": (
        [-1, -2, -3, -4], [0, 0, 1, 1], [T] * 4, 2, 1, [0, 2, 3, 1],
    ),
    # first 0 (bank 2), 1 (bank 0); round 0: bank 1's 2; round 1: bank 2's 4, bank 1's 5, bank 0's 3
    "by_score > 1, from any bank": (
        [-1, -2, -3, -4, -5, -6], [2, 0, 1, 0, 2, 1], [T] * 6, 3, 2, [0, 1, 2, 4, 5, 3],
    ),
    "by_score beyond the valid candidates": (
        [-4, -INF, -1, -3], [1, 0, 0, 1], [T, F, T, T], 2, 5, [2, 3, 0, 1],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(ALLOCATIONS))
def test_the_bank_allocation_on_hand_made_tables(case) -> None:
    scores, banks, valid, n_banks, by_score, expected = ALLOCATIONS[case]
    assert filled_by_rule(scores, banks, valid, n_banks, by_score) == expected
    assert filled_by_search([scores], [banks], [valid], n_banks, [by_score]) == [expected]


def test_the_bank_allocation_of_a_batch_is_each_sentence_s_own() -> None:
    width = max(len(case[0]) for case in ALLOCATIONS.values())
    n_banks = max(case[3] for case in ALLOCATIONS.values())

    def padded(values, fill):
        return list(values) + [fill] * (width - len(values))

    cases = list(ALLOCATIONS.values())
    out = filled_by_search(
        [padded(c[0], -INF) for c in cases],
        [padded(c[1], 0) for c in cases],
        [padded(c[2], F) for c in cases],
        n_banks,
        [c[4] for c in cases],
    )
    for (scores, *_, expected), row in zip(cases, out):
        assert row == expected + list(range(len(scores), width))  # the padding: invalid, last


@pytest.mark.parametrize("slots", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("tokens", [0, 1, 2, 4, 7])
def test_the_bank_allocation_over_beams_and_constraint_tokens(slots, tokens) -> None:
    """Tables shaped as the search's for a beam of ``slots`` (2 * slots + 2 candidates per row):
    a batch of sentences with ``tokens``, half as many and no constraint tokens (the batch's fullest
    banks are empty for the others), ``by_score`` as the search sets it, scores with many ties, EOS
    and -inf candidates, some banks with no candidate; every candidate's place as the rule states it."""
    rng = random.Random(f"{slots}/{tokens}")
    own = sorted({tokens, tokens // 2, 0}, reverse=True)  # each sentence's constraint tokens
    tables = []
    for t in own:
        m = slots * (2 * slots + 2)
        used = rng.sample(range(t + 1), rng.randint(1, t + 1))  # the banks that have candidates
        scores = [rng.choice([-1.0, -1.5, -2.0, -3.0, -INF]) for _ in range(m)]
        valid = [s > -INF and rng.random() > 0.1 for s in scores]  # a tenth of the finite ones: EOS
        tables.append((scores, [rng.choice(used) for _ in range(m)], valid))
    by_score = [max(slots - t, 1) for t in own]  # the search's (K - tokens).clamp(min=1)
    out = filled_by_search(*zip(*tables), tokens + 1, by_score)
    for (scores, banks, valid), k, row in zip(tables, by_score, out):
        assert row == filled_by_rule(scores, banks, valid, tokens + 1, k)


# --- the real model ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = TransformerConfig(
        src_vocab_size=40, tgt_vocab_size=40, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
        n_decoder_layers=2, dropout=0.0, max_len=32,
    )  # fmt: skip
    return build_model(config).eval()


def _sources():
    torch.manual_seed(1)
    rows = [torch.randint(4, 40, (n,)).tolist() + [3] for n in (5, 9, 3, 7)]
    width = max(map(len, rows))
    return torch.tensor([r + [0] * (width - len(r)) for r in rows])


def test_constrained_search_is_batch_invariant_and_meets_its_terms(model) -> None:
    src = _sources()
    terms = [[[7, 8]], [], [[11], [12, 13]], [[9]]]
    options = DecodeOptions(beam=4, alpha=0.6, max_len_b=12)
    batched = generate(model, src, options, Controls(terms=terms))
    for i in range(len(terms)):
        one = src[i : i + 1, : int((src[i] != 0).sum())]
        [alone] = generate(model, one, options, Controls(terms=[terms[i]]))
        assert alone[0].tokens == batched[i][0].tokens
        assert alone[0].score == pytest.approx(batched[i][0].score, abs=1e-4)
        for term in terms[i]:
            assert _count(batched[i][0].tokens, term) == 1
    plain = generate(model, src[1:2, :10], options)  # no terms: the plain search's result
    assert plain[0][0].tokens == batched[1][0].tokens


def test_prefix_on_the_model_matches_the_search_with_the_prefix_forced(model) -> None:
    src = _sources()
    options = DecodeOptions(beam=1, max_len_b=10)
    prefixes = [[5, 6], [], [7], [8, 9, 10]]
    out = generate(model, src, options, Controls(prefixes=prefixes))
    for p, hyps in zip(prefixes, out):
        assert hyps[0].tokens[: len(p)] == p
    # after the prefix greedy search continues as the model's argmax does
    src_mask = padding_mask(src[:1], 0)
    with torch.inference_mode():
        memory = model.encode(src[:1], src_mask)
    with torch.inference_mode():
        tgt = torch.tensor([[2, 5, 6]])  # BOS, the prefix
        log_probs = model.generator(model.decode(tgt, memory, src_mask)[:, -1:], log_probs=True)[0, 0]
    log_probs = log_probs.clone()
    log_probs[[0, 2]] = -math.inf  # never PAD or BOS
    assert (out[0][0].tokens[2:3] or [3])[0] == int(log_probs.argmax())  # the next token, or EOS
