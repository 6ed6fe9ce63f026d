"""Greedy, beam and sampling search: exact beams and scores on a fake model of fixed probabilities
(fairseq's test_sequence_generator style), and the real model through the same code."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from aiayn import TransformerConfig, build_model
from aiayn.decode import (
    DecodeOptions,
    ModelStep,
    SearchPaths,
    beam_search,
    generate,
    greedy_search,
    length_penalty,
    max_output_lengths,
    sample_search,
)
from aiayn.decode.cache import GroupedDecoderCache, GroupedKVCache
from aiayn.decode.search import BLOCK, MIN_BLOCKS, _blocks, first_argmax, stable_topk
from aiayn.decode.step import _buckets, encode_by_length, source_lengths
from aiayn.errors import UserError
from aiayn.model import KVCache, MultiHeadAttention
from aiayn.model.masks import padding_mask

PAD, UNK, BOS, EOS, A, B = range(6)
V = 6


def dist(eos: float = 0.0, a: float = 0.0, b: float = 0.0, bos: float = 0.0) -> list[float]:
    """A next-token distribution over the vocabulary [pad, unk, bos, eos, a, b]."""
    return [0.0, 0.0, bos, eos, a, b]


class FakeStep:
    """A step function with fixed probabilities: ``tables[s][prefix]`` for sentence s, where the
    prefix is the tuple of tokens after BOS; a prefix not in the table gets ``default``.

    It also plays a key/value cache: each row remembers the prefix it has seen, and every call
    checks that the search reordered the rows correctly (the row's new prefix extends the old one).
    """

    vocab_size = V

    def __init__(self, tables: list[dict[tuple, list[float]]], default: list[float] | None = None) -> None:
        self.tables, self.default = tables, default or dist(eos=1.0)
        self.rows = list(range(len(tables)))  # the sentence of each row
        self.seen: list[tuple] = [() for _ in tables]  # what each row's "cache" holds
        self.calls = 0

    def __call__(self, prefix: torch.Tensor) -> torch.Tensor:
        assert prefix.shape[0] == len(self.rows)
        self.calls += 1
        out = []
        for row, s in enumerate(self.rows):
            tokens = tuple(prefix[row].tolist())
            assert tokens[:-1] == self.seen[row], "search did not reorder the cache correctly"
            self.seen[row] = tokens
            out.append(torch.tensor(self.tables[s].get(tokens[1:], self.default), dtype=torch.float64).log())
        return torch.stack(out).float()

    def reorder(self, new_order: torch.Tensor) -> None:
        self.rows = [self.rows[i] for i in new_order.tolist()]
        self.seen = [self.seen[i] for i in new_order.tolist()]


# Sentence 0: both beams end at step 2.
TABLE_0 = {
    (): dist(eos=0.1, a=0.6, b=0.3),
    (A,): dist(eos=0.5, a=0.3, b=0.2),
    (B,): dist(eos=0.9, a=0.05, b=0.05),
}
# Sentence 1: the empty output ends at step 1, "a" at step 2 with a lower log-prob.
TABLE_1 = {
    (): dist(eos=0.4, a=0.5, b=0.1),
    (A,): dist(eos=0.7, a=0.2, b=0.1),
    (B,): dist(eos=0.6, a=0.2, b=0.2),
}
NEVER_ENDS = dist(eos=0.01, a=0.59, b=0.4)


def tokens_and_scores(results):
    return [[(h.tokens, h.score) for h in hyps] for hyps in results]


# --- exact beams on the fake model -------------------------------------------------------------


def test_beam_exact_hypotheses_and_scores_without_length_penalty() -> None:
    step = FakeStep([TABLE_0, TABLE_1])
    results = beam_search(step, [10, 10], beam=2, alpha=0.0, nbest=2)
    # Sentence 0, step 1: a (.6), b (.3) live; step 2: a-eos .30 and b-eos .27 are the top 2 -> both end.
    assert results[0][0].tokens == [A] and results[0][0].score == pytest.approx(math.log(0.6 * 0.5), abs=1e-6)
    assert results[0][1].tokens == [B] and results[0][1].score == pytest.approx(math.log(0.3 * 0.9), abs=1e-6)
    # Sentence 1, step 1: eos (.4) among the top 2 ends; a, b live. Step 2: a-eos (.35) ends -> 2 done.
    assert results[1][0].tokens == [] and results[1][0].score == pytest.approx(math.log(0.4), abs=1e-6)
    assert results[1][1].tokens == [A] and results[1][1].score == pytest.approx(math.log(0.5 * 0.7), abs=1e-6)
    assert step.calls == 2  # both sentences stopped after 2 steps: beam=2 finished hypotheses each


# The best output "a a a" (.8 * .8 * .8 * .9 = .46) finishes at step 4, after "b" (.135, step 2) and
# "a b" (.072, step 3): stopping at `beam` finished hypotheses would return "b".
LATE_BEST = {
    (): dist(eos=0.05, a=0.8, b=0.15),
    (A,): dist(eos=0.1, a=0.8, b=0.1),
    (B,): dist(eos=0.9, a=0.05, b=0.05),
    (A, A): dist(eos=0.1, a=0.8, b=0.1),
    (A, B): dist(eos=0.9, a=0.05, b=0.05),
    (A, A, A): dist(eos=0.9, a=0.05, b=0.05),
}


def test_a_live_hypothesis_better_than_the_finished_ones_is_not_dropped() -> None:
    step = FakeStep([LATE_BEST])
    results = beam_search(step, [10], beam=2, alpha=0.0, nbest=2)
    assert [h.tokens for h in results[0]] == [[A, A, A], [B]]
    assert results[0][0].score == pytest.approx(math.log(0.8 * 0.8 * 0.8 * 0.9), abs=1e-6)
    assert results[0][1].score == pytest.approx(math.log(0.15 * 0.9), abs=1e-6)  # "a b" (.072) was replaced
    assert step.calls == 4  # after step 4 the best live (.512 * .05) cannot beat the worst finished (.135)


def test_length_penalty_divides_log_prob_and_can_reorder_the_nbest() -> None:
    results = beam_search(FakeStep([TABLE_1]), [10], beam=2, alpha=1.0, nbest=2)
    # |Y| counts EOS: "" has length 1 (lp = 1), "a" length 2 (lp = 7/6): -1.0498/(7/6) > -0.9163.
    assert [h.tokens for h in results[0]] == [[A], []]
    assert results[0][0].score == pytest.approx(math.log(0.35) / (7 / 6), abs=1e-6)
    assert results[0][0].log_prob == pytest.approx(math.log(0.35), abs=1e-6)
    assert results[0][1].score == pytest.approx(math.log(0.4), abs=1e-6)


def test_length_penalty_formula() -> None:
    assert length_penalty(1, 0.6) == 1.0
    assert length_penalty(7, 0.6) == pytest.approx(2.0**0.6)
    assert length_penalty(30, 0.0) == 1.0


def test_maximum_length_forces_eos() -> None:
    greedy = greedy_search(FakeStep([{}], default=NEVER_ENDS), [3])
    assert greedy[0][0].tokens == [A, A, A]
    assert greedy[0][0].log_prob == pytest.approx(3 * math.log(0.59) + math.log(0.01), abs=1e-6)
    step = FakeStep([{}], default=NEVER_ENDS)
    beams = beam_search(step, [3], beam=2, alpha=0.0, nbest=2)
    assert beams[0][0].tokens == [A, A, A] and all(len(h.tokens) == 3 for h in beams[0])
    assert step.calls == 4  # 3 tokens + the forced EOS


def test_zero_maximum_length_gives_the_empty_output() -> None:
    assert greedy_search(FakeStep([{}], default=NEVER_ENDS), [0])[0][0].tokens == []
    assert beam_search(FakeStep([{}], default=NEVER_ENDS), [0], beam=3)[0][0].tokens == []


def test_pad_and_bos_are_never_generated() -> None:
    table = {(): dist(bos=0.9, a=0.06, eos=0.04)}
    assert greedy_search(FakeStep([table]), [5])[0][0].tokens == [A]
    assert beam_search(FakeStep([table]), [5], beam=2)[0][0].tokens == [A]


def test_beam_one_equals_greedy_on_the_fake_model() -> None:
    tables = [TABLE_0, TABLE_1, {}]
    greedy = greedy_search(FakeStep(tables, NEVER_ENDS), [4, 4, 4], alpha=0.6)
    beam = beam_search(FakeStep(tables, NEVER_ENDS), [4, 4, 4], beam=1, alpha=0.6)
    assert tokens_and_scores(greedy) == tokens_and_scores(beam)


def test_sentences_do_not_interact_in_a_batch() -> None:
    tables, lens = [TABLE_0, {}, TABLE_1], [10, 3, 10]
    together = beam_search(FakeStep(tables, NEVER_ENDS), lens, beam=2, nbest=2)
    alone = [beam_search(FakeStep([t], NEVER_ENDS), [n], beam=2, nbest=2)[0] for t, n in zip(tables, lens)]
    assert tokens_and_scores(together) == tokens_and_scores(alone)


class CountingStep(FakeStep):
    """A :class:`FakeStep` that records the number of rows of each call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rows_per_call: list[int] = []

    def __call__(self, prefix: torch.Tensor) -> torch.Tensor:
        self.rows_per_call.append(prefix.shape[0])
        return super().__call__(prefix)


def test_beam_first_step_runs_once_per_sentence() -> None:
    """All beams start as BOS: the first step scores one row per sentence, later steps K rows each."""
    step = CountingStep([TABLE_0, TABLE_1, {}], NEVER_ENDS)
    beam_search(step, [5, 5, 3], beam=3, alpha=0.0)
    assert step.rows_per_call[0] == 3 and step.rows_per_call[1] == 9


def test_stable_topk_breaks_ties_by_lower_index() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [0.0, -1.0, 5.0, 4.0, 4.0]])
    values, index = stable_topk(x, 2)
    assert index.tolist() == [[1, 2], [2, 3]] and values.tolist() == [[3.0, 3.0], [5.0, 4.0]]
    values, index = stable_topk(x, 3)
    assert index.tolist() == [[1, 2, 4], [2, 3, 4]]


def test_stable_topk_equals_a_full_stable_sort_row_by_row() -> None:
    """Rows with and without ties at the cut (only the tied rows take the full-sort path)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 50, generator=generator)
    x[::3] = torch.randint(0, 4, (22, 50), generator=generator).float()  # many ties
    x[5, :] = float("-inf")
    x[5, 7] = 0.0  # a forced row: one finite value, the rest tied at -inf
    for k in (1, 4, 8, 50):
        values, index = stable_topk(x, k)
        full_values, full_index = x.sort(dim=-1, descending=True, stable=True)
        assert torch.equal(index, full_index[:, :k]) and torch.equal(values, full_values[:, :k])


def test_two_stage_selection_over_a_vocabulary_equals_one_full_sort() -> None:
    """Rows long enough for the block-wise argmax/top-k: ties inside and across blocks, -inf rows."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(48, BLOCK * 20, generator=generator)
    x[::2] = torch.randint(0, 6, (24, BLOCK * 20), generator=generator).float()  # many ties
    x[3, :] = float("-inf")
    x[3, BLOCK * 7 + 5] = 0.0  # a forced row: one finite value
    x[5, :] = float("-inf")  # all tied
    x[7, [3, BLOCK + 1, BLOCK * 19 + 2]] = 50.0  # one maximum in three blocks
    assert _blocks(x) is not None  # the two-stage path is the one tested
    assert torch.equal(first_argmax(x), x.argmax(dim=-1))
    for k in (1, 4, 8, 21):
        values, index = stable_topk(x, k)
        full_values, full_index = x.sort(dim=-1, descending=True, stable=True)
        assert torch.equal(index, full_index[:, :k]) and torch.equal(values, full_values[:, :k])


def test_nbest_must_not_exceed_beam() -> None:
    with pytest.raises(ValueError, match="nbest"):
        beam_search(FakeStep([TABLE_0]), [5], beam=2, nbest=3)
    with pytest.raises(UserError, match="nbest"):
        DecodeOptions(beam=2, nbest=3)
    with pytest.raises(UserError, match="top_p"):
        DecodeOptions(top_p=0.0)


def test_sampling_with_top_k_one_is_greedy_on_the_fake_model() -> None:
    tables = [TABLE_0, TABLE_1]
    greedy = greedy_search(FakeStep(tables, NEVER_ENDS), [4, 4])
    sampled = sample_search(FakeStep(tables, NEVER_ENDS), [4, 4], top_k=1, seed=3, temperature=2.0)
    assert tokens_and_scores(greedy) == tokens_and_scores(sampled)


def test_max_output_lengths() -> None:
    lengths = torch.tensor([1, 7, 40])
    assert max_output_lengths(lengths, 1.0, 50, 64) == [51, 57, 63]  # capped at max_len - 1
    assert max_output_lengths(lengths, 1.5, 2, 1024) == [3, 12, 62]


# --- the real model through the same code ---------------------------------------------------------


def tiny_model(**overrides):
    values = dict(
        src_vocab_size=40,
        tgt_vocab_size=30,
        d_model=32,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=64,
        dropout=0.0,
        max_len=64,
    )
    torch.manual_seed(1)
    return build_model(TransformerConfig.from_dict({**values, **overrides})).eval()


def sources(lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 40, (n - 1,), generator=g).tolist() + [EOS] for n in lengths]


def pad(rows: list[list[int]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


def assert_same(a, b) -> None:
    assert [[h.tokens for h in hyps] for hyps in a] == [[h.tokens for h in hyps] for hyps in b]
    for hyps_a, hyps_b in zip(a, b):
        for x, y in zip(hyps_a, hyps_b):
            assert x.score == pytest.approx(y.score, abs=1e-5)


OPTION_SETS = [
    DecodeOptions(beam=1, alpha=0.0, max_len_b=8),
    DecodeOptions(beam=4, alpha=0.6, nbest=3, max_len_b=8),
    DecodeOptions(sample=True, seed=5, nbest=2, top_p=0.9, max_len_b=8),
]


@pytest.mark.parametrize("options", OPTION_SETS, ids=["greedy", "beam", "sample"])
def test_cached_and_uncached_decoding_agree(options: DecodeOptions) -> None:
    model, src = tiny_model(), pad(sources([5, 9, 3]))
    cached = generate(model, src, options)
    uncached = generate(model, src, DecodeOptions(**{**options.__dict__, "use_cache": False}))
    assert_same(cached, uncached)


def test_greedy_search_on_logits_equals_greedy_search_on_log_probs() -> None:
    """generate()'s greedy search takes the argmax of the logits and normalises only the chosen
    tokens' scores; with ``scores=False`` it skips that: same tokens, NaN scores."""
    model, src = tiny_model(), pad(sources([5, 9, 3, 7], seed=3))
    with torch.inference_mode():
        on_log_probs = greedy_search(ModelStep(model, src), [8] * 4, alpha=0.6)
    on_logits = generate(model, src, DecodeOptions(beam=1, alpha=0.6, max_len_a=0.0, max_len_b=8))
    assert_same(on_logits, on_log_probs)
    unscored = generate(
        model, src, DecodeOptions(beam=1, alpha=0.6, max_len_a=0.0, max_len_b=8, scores=False)
    )
    assert [h[0].tokens for h in unscored] == [h[0].tokens for h in on_log_probs]
    assert all(math.isnan(h[0].score) and math.isnan(h[0].log_prob) for h in unscored)


@pytest.mark.parametrize("options", OPTION_SETS[:2], ids=["greedy", "beam"])
def test_decoding_over_a_vocabulary_large_enough_for_the_two_stage_selection(options: DecodeOptions) -> None:
    model, src = tiny_model(tgt_vocab_size=BLOCK * MIN_BLOCKS), pad(sources([5, 9, 3]))
    cached = generate(model, src, options)
    uncached = generate(model, src, DecodeOptions(**{**options.__dict__, "use_cache": False}))
    assert_same(cached, uncached)
    with torch.inference_mode():  # the one-stage reference: PyTorch's argmax and topk
        step = ModelStep(model, src)
        max_lens = max_output_lengths(source_lengths(src, PAD), options.max_len_a, options.max_len_b, 64)
        if options.beam == 1:
            reference = greedy_search(step, max_lens, alpha=options.alpha, paths=SearchPaths(two_stage=False))
        else:
            reference = beam_search(
                step,
                max_lens,
                beam=options.beam,
                alpha=options.alpha,
                nbest=options.nbest,
                paths=SearchPaths(two_stage=False),
            )
    assert_same(cached, reference)
    assert_same(cached, generate(model, src, replace(options, paths=SearchPaths(two_stage=False))))


def test_only_greedy_search_takes_logits() -> None:
    model, src = tiny_model(), pad(sources([5, 4]))
    with torch.inference_mode():
        with pytest.raises(ValueError, match="log-probabilities"):
            beam_search(ModelStep(model, src, log_probs=False), [4, 4], beam=2)
        with pytest.raises(ValueError, match="log-probabilities"):
            sample_search(ModelStep(model, src, log_probs=False), [4, 4])


@pytest.mark.parametrize("options", OPTION_SETS[:2], ids=["greedy", "beam"])
def test_output_does_not_depend_on_batch_composition(options: DecodeOptions) -> None:
    model, rows = tiny_model(), sources([6, 2, 11, 4], seed=2)
    together = generate(model, pad(rows), options)
    alone = [generate(model, pad([r]), options)[0] for r in rows]
    assert_same(together, alone)
    reversed_batch = generate(model, pad(rows[::-1]), options)[::-1]
    assert_same(reversed_batch, alone)


def test_beam_one_equals_greedy_on_the_real_model() -> None:
    model, src = tiny_model(), pad(sources([5, 8]))
    greedy = generate(model, src, DecodeOptions(beam=1, alpha=0.6, max_len_b=8))
    with torch.inference_mode():
        beam = beam_search(
            ModelStep(model, src), max_output_lengths(torch.tensor([5, 8]), 1.0, 8, 64), beam=1, alpha=0.6
        )
    assert_same(greedy, beam)


def test_nbest_is_sorted_and_starts_with_the_one_best() -> None:
    model, src = tiny_model(), pad(sources([5, 8, 3]))
    nbest = generate(model, src, DecodeOptions(beam=5, nbest=5, max_len_b=8))
    best = generate(model, src, DecodeOptions(beam=5, nbest=1, max_len_b=8))
    for hyps, one in zip(nbest, best):
        assert len(hyps) == 5
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert hyps[0] == one[0]
        assert len({tuple(h.tokens) for h in hyps}) == 5  # distinct hypotheses


def test_sampling_is_reproducible_with_a_seed_and_top_k_one_is_greedy() -> None:
    model, src = tiny_model(), pad(sources([5, 8]))
    options = DecodeOptions(sample=True, seed=11, temperature=1.5, max_len_b=8)
    first, second = generate(model, src, options), generate(model, src, options)
    assert [h.tokens for hyps in first for h in hyps] == [h.tokens for hyps in second for h in hyps]
    other = generate(model, src, DecodeOptions(**{**options.__dict__, "seed": 12}))
    assert [h.tokens for hyps in first for h in hyps] != [h.tokens for hyps in other for h in hyps]
    greedy = generate(model, src, DecodeOptions(beam=1, alpha=0.6, max_len_b=8))
    top1 = generate(model, src, DecodeOptions(sample=True, top_k=1, seed=0, alpha=0.6, max_len_b=8))
    nucleus = generate(model, src, DecodeOptions(sample=True, top_p=1e-6, seed=0, alpha=0.6, max_len_b=8))
    assert_same(top1, greedy)
    assert_same(nucleus, greedy)


def test_output_length_is_capped_by_the_model_max_len() -> None:
    model = tiny_model(max_len=12)
    hyps = generate(model, pad(sources([10])), DecodeOptions(beam=2, max_len_b=50))
    assert len(hyps[0][0].tokens) <= 11  # BOS + 11 tokens = the 12 positions


class RoundedStep(ModelStep):
    """The real model with log-probs rounded to 0.5: many exact ties between tokens and beams."""

    def __call__(self, prefix: torch.Tensor) -> torch.Tensor:
        return (super().__call__(prefix) * 2).round() / 2


@pytest.mark.parametrize("step_class", [ModelStep, RoundedStep], ids=["model", "ties"])
def test_beam_shortlist_equals_scoring_every_token(step_class) -> None:
    """Scoring each row's best 2K tokens gives exactly the beams of scoring all K * V candidates."""
    model, src = tiny_model(), pad(sources([5, 9, 3, 7], seed=4))
    max_lens = [12] * 4

    def run(shortlist: bool):
        paths = SearchPaths(shortlist=shortlist)
        with torch.no_grad():
            return beam_search(step_class(model, src), max_lens, beam=4, alpha=0.6, nbest=4, paths=paths)

    assert_same(run(shortlist=True), run(shortlist=False))
    options = DecodeOptions(beam=4, nbest=4, max_len_b=8)
    no_shortlist = replace(options, paths=SearchPaths(shortlist=False))
    assert_same(generate(model, src, options), generate(model, src, no_shortlist))


def test_sampling_without_a_seed_differs_between_calls_and_follows_torch_manual_seed() -> None:
    def sample() -> list:  # 4 sentences x 20 steps of a 0.59 / 0.4 choice: a repeat has odds ~1e-23
        return tokens_and_scores(sample_search(FakeStep([{}] * 4, NEVER_ENDS), [20] * 4))

    assert sample() != sample()
    torch.manual_seed(7)
    first = sample()
    torch.manual_seed(7)
    assert sample() == first


def test_huge_or_infinite_max_len_gives_the_cap_and_options_refuse_non_finite_values() -> None:
    lengths = torch.tensor([1, 7])
    for a, b in ((1e30, 50), (float("inf"), 50), (1.0, 1e30), (1.0, float("inf"))):
        assert max_output_lengths(lengths, a, b, 64) == [63, 63], (a, b)
    for field in ("max_len_a", "max_len_b"):
        for value in (float("inf"), float("nan"), -1):
            with pytest.raises(UserError, match=f"{field}: must be finite and >= 0"):
                DecodeOptions(**{field: value})
    assert DecodeOptions(max_len_a=1e30).max_len_a == 1e30  # huge but finite: the cap applies


# --- the decoding cache: rows of one source share its memory -------------------------------------


def targets(rows: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 30, (rows, length), generator=torch.Generator().manual_seed(seed))


def grouped_cache(model, sentences: torch.Tensor, group_rows: bool = True) -> GroupedDecoderCache:
    src_mask = padding_mask(sentences, PAD)
    return GroupedDecoderCache(
        len(model.decoder.layers), model.encode(sentences, src_mask), src_mask, group_rows
    )


def test_cache_reorder_copies_only_what_changes() -> None:
    """Shuffling rows that hold the same source keeps the source-only tensors, stored once per group
    of rows; results stay exact."""
    model = tiny_model()
    sentences, tgt = pad(sources([7, 3])), targets(4, 6)
    src = sentences[[0, 0, 1, 1]]  # two beams per sentence, as beam search expands them
    with torch.no_grad():
        cache = grouped_cache(model, sentences)
        cache.reorder(torch.tensor([0, 0, 1, 1]))
        assert cache.group == 2 and cache.memory.size(0) == 2  # each source once, read by 2 rows
        model.decode(tgt[:, :3], None, cache=cache)
        memory, self_k = cache.memory, cache.layers[0][0].k
        cache.reorder(torch.arange(4))  # identity: nothing is copied
        assert cache.memory is memory and cache.layers[0][0].k is self_k
        order = torch.tensor([1, 1, 3, 2])  # beams move within their sentence
        cache.reorder(order)
        assert cache.memory is memory and cache.layers[0][0].k is not self_k
        step = model.generator(model.decode(tgt[order, 3:4], None, cache=cache))
        cache.reorder(torch.tensor([2, 3]))  # the first sentence leaves the batch
        assert cache.memory.size(0) == 1 and torch.equal(cache.sources, torch.tensor([0, 0]))
        last = model.generator(model.decode(tgt[order][[2, 3], 4:5], None, cache=cache))
        full = model(src[order], tgt[order, :5])
    torch.testing.assert_close(step[:, 0], full[:, 3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last[:, 0], full[[2, 3], 4], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", ["formula", "fused"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_grouped_cross_attention_equals_one_memory_row_per_query_row(need_weights: bool, path: str) -> None:
    """A grouped cache with group g (rows i*g .. i*g+g-1 read cached row i) gives what copying the
    memory for every row into a plain cache gives, outputs and weights, with a padded source; on
    both attention paths."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 4, path=path).eval()
    memory, query = torch.randn(2, 5, 16), torch.randn(6, 2, 16)  # 2 sources, 3 rows each, 2 new positions
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])[:, None, None]  # (2, 1, 1, 5)
    grouped, copied = GroupedKVCache(), KVCache(static=True)
    with torch.no_grad():
        attention(query[::3], memory, mask, cache=grouped)  # fills the cache, one row per source
        grouped.group = 3
        out, weights = attention(query, memory, mask, cache=grouped, need_weights=need_weights)
        rows = torch.tensor([0, 0, 0, 1, 1, 1])
        expected, expected_weights = attention(
            query, memory[rows], mask[rows], cache=copied, need_weights=True
        )
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)
        assert weights.shape == (6, 4, 2, 5) and bool((weights[3:, :, :, 2:] == 0).all())


def test_cache_reorder_into_unequal_groups() -> None:
    """Runs of unequal length (sampling's copies of a sentence after one finished) fall back to one
    memory row per row; grouped and ungrouped steps give the full forward's logits."""
    model = tiny_model()
    sentences, tgt = pad(sources([7, 3])), targets(5, 6)
    with torch.no_grad():
        cache = grouped_cache(model, sentences)
        cache.reorder(torch.tensor([0, 0, 0, 1, 1, 1]))
        assert cache.group == 3 and cache.memory.size(0) == 2
        model.decode(tgt[[0, 0, 0, 1, 1, 1], :3], None, cache=cache)
        grouped = model.generator(model.decode(tgt[[0, 0, 0, 1, 1, 1], 3:4], None, cache=cache))
        order = torch.tensor([0, 2, 3, 4, 5])  # one copy of the first sentence has finished
        cache.reorder(order)
        assert cache.group == 1 and cache.memory.size(0) == 5
        last = model.generator(model.decode(tgt[[0, 0, 1, 1, 1], 4:5], None, cache=cache))
        full = model(sentences[[0, 0, 1, 1, 1]], tgt[[0, 0, 1, 1, 1], :5])
    torch.testing.assert_close(grouped[:, 0], full[[0, 0, 0, 2, 2, 2], 3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last[:, 0], full[:, 4], atol=1e-5, rtol=1e-5)
    cache.reorder(torch.tensor([], dtype=torch.long))  # every row finished
    assert cache.memory.size(0) == 0 and cache.layers[0][0].k.size(0) == 0


def test_without_group_rows_every_row_keeps_its_own_memory_row() -> None:
    model = tiny_model()
    with torch.no_grad():
        cache = grouped_cache(model, pad(sources([7, 3])), group_rows=False)
        cache.reorder(torch.tensor([0, 0, 0, 1, 1, 1]))
        model.decode(targets(6, 1), None, cache=cache)
    assert cache.group == 1 and cache.memory.size(0) == 6
    assert all(cross.group == 1 and cross.k.size(0) == 6 for _, cross in cache.layers)


@pytest.mark.parametrize(
    "options",
    [DecodeOptions(beam=4, nbest=4, max_len_b=8), DecodeOptions(sample=True, seed=3, nbest=3, max_len_b=8)],
    ids=["beam", "sample"],
)
def test_grouped_and_per_row_memory_give_the_same_hypotheses(options: DecodeOptions) -> None:
    model, src = tiny_model(), pad(sources([5, 9, 3, 7], seed=5))
    grouped = generate(model, src, options)
    per_row = replace(options, paths=SearchPaths(group_rows=False))
    assert_same(grouped, generate(model, src, per_row))
    assert [h.tokens for hyps in grouped for h in hyps] == [
        h.tokens for hyps in generate(model, src, per_row) for h in hyps
    ]
    with torch.no_grad():  # the grouped path was taken: one memory row per sentence after expansion
        step = ModelStep(model, src)
        step.reorder(torch.arange(4).repeat_interleave(3))
    assert step.cache.group == 3 and step.cache.memory.size(0) == 4


def test_encoding_by_length_gives_each_source_its_own_memory_and_zeros_beyond_it() -> None:
    model, lengths = tiny_model(), [9, 3, 8, 2, 7]
    src = pad(sources(lengths, seed=2))
    with torch.no_grad():
        memory = encode_by_length(model, src, padding_mask(src, model.config.pad_id))
        for i, n in enumerate(lengths):  # each source alone, with no padding at all
            alone = model.encode(src[i : i + 1, :n])[0]
            torch.testing.assert_close(memory[i, :n], alone, atol=1e-5, rtol=1e-5)
            assert not memory[i, n:].any()
    buckets = [(rows.tolist(), width) for rows, width in _buckets(torch.tensor(lengths), 0.8)]
    assert buckets == [([0, 2], 9), ([4], 7), ([1], 3), ([3], 2)]  # 8 >= 0.8 * 9; 7 < 0.8 * 9


def test_sources_not_padded_on_the_right_are_encoded_whole() -> None:
    model, src = tiny_model(), pad(sources([6, 4], seed=1))
    src[1] = torch.cat([src[1, 4:], src[1, :4]])  # padding first
    mask = padding_mask(src, model.config.pad_id)
    with torch.no_grad():
        torch.testing.assert_close(encode_by_length(model, src, mask), model.encode(src, mask))


@pytest.mark.parametrize("options", OPTION_SETS[:2], ids=["greedy", "beam"])
def test_encoding_by_length_and_as_one_batch_give_the_same_hypotheses(options: DecodeOptions) -> None:
    model, src = tiny_model(), pad(sources([12, 3, 9, 2, 5, 11], seed=4))
    whole = replace(options, paths=SearchPaths(by_length=False))
    assert_same(generate(model, src, options), generate(model, src, whole))
    with torch.no_grad():  # the bucketed path zeros the memory at padding; one batch does not
        assert not ModelStep(model, src).memory[src == PAD].any()
        assert ModelStep(model, src, paths=SearchPaths(by_length=False)).memory[src == PAD].any()
