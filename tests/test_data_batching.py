"""Token-bounded batches: padding on Multi30k, determinism, exact resume, sharding, collation."""

from __future__ import annotations

import json

import pytest
import torch

from aiayn.config import BOS_ID, EOS_ID, PAD_ID
from aiayn.data.batching import (
    TokenBatchSampler,
    _cut,
    collate,
    example_sizes,
    iterate_batches,
    padding_share,
)
from aiayn.data.corpus import encode_corpus, read_parallel
from aiayn.errors import UserError
from test_data_tokenizer import multi30k_tokenizer  # the session's one Multi30k BPE


@pytest.fixture(scope="module")
def train_examples(multi30k_dir):
    pairs, stats = read_parallel(multi30k_dir, "train", "de", "en")
    return encode_corpus(pairs, stats, multi30k_tokenizer(multi30k_dir).encode_batch)


def toy_examples(n: int = 103, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 30, (n, 2), generator=g).tolist()
    return [([5] * s, [6] * t) for s, t in lengths]


def test_multi30k_padding_under_ten_percent(train_examples):
    sampler = TokenBatchSampler(train_examples, max_tokens=4096, seed=0)
    batches = list(iterate_batches(train_examples, sampler))
    share = padding_share(batches)
    assert share < 0.10, f"padding share {share:.3f}"
    assert all(len(b) * max(b.src.shape[1], b.tgt_out.shape[1]) <= 4096 for b in batches)
    assert sum(len(b) for b in batches) == len(train_examples)


def test_every_example_once_per_epoch_and_batches_within_budget():
    examples = toy_examples()
    sampler = TokenBatchSampler(examples, max_tokens=120, seed=1)
    sizes = example_sizes(examples)
    for _ in range(2):
        batches = list(sampler)
        assert sorted(i for b in batches for i in b) == list(range(len(examples)))
        assert all(len(b) * max(sizes[i] for i in b) <= 120 for b in batches)
    assert sampler.epoch == 2


def test_same_seed_same_batches_each_epoch_differs():
    examples = toy_examples()
    a, b = TokenBatchSampler(examples, 120, seed=3), TokenBatchSampler(examples, 120, seed=3)
    listed = lambda sampler, epoch: [batch.tolist() for batch in sampler.batches(epoch)]  # noqa: E731
    assert listed(a, 0) == listed(b, 0) and listed(a, 1) == listed(b, 1)
    assert listed(a, 0) != listed(a, 1)
    assert listed(TokenBatchSampler(examples, 120, seed=4), 0) != listed(a, 0)


def greedy_cut(sizes, max_tokens: int, multiple: int) -> list[list[int]]:
    """The batching rule written as one loop over the examples (the reference of ``_cut``)."""
    batches, current = [], []
    for i, size in enumerate(sizes):
        if len(current) >= multiple and (len(current) + 1) * size > max_tokens:
            k = len(current) // multiple * multiple
            batches.append(current[:k])
            current = current[k:]
        current.append(i)
    return batches + [current] if current else batches


def test_cutting_batch_by_batch_equals_the_loop_over_examples():
    g = torch.Generator().manual_seed(0)
    for _ in range(500):
        n, multiple = (
            int(torch.randint(1, 300, (1,), generator=g)),
            int(torch.randint(1, 9, (1,), generator=g)),
        )
        sizes = torch.randint(1, 40, (n,), generator=g).sort().values.numpy()
        top = multiple * int(sizes.max())
        max_tokens = int(torch.randint(top, 8 * top + 1, (1,), generator=g))
        cut = [list(range(start, end)) for start, end in _cut(sizes, max_tokens, multiple)]
        assert cut == greedy_cut(sizes.tolist(), max_tokens, multiple), (n, multiple, max_tokens)


def test_no_shuffle_serves_sorted_batches():
    examples = toy_examples()
    sizes = example_sizes(examples)
    batches = TokenBatchSampler(examples, 120, shuffle=False).batches(0)
    maxima = [max(sizes[i] for i in b) for b in batches]
    assert maxima == sorted(maxima)


def stream(sampler, n):
    """The next ``n`` batches of ``sampler``, across epochs, as a training loop would take them."""
    out = []
    while len(out) < n:
        for batch in sampler:
            out.append(batch)
            if len(out) == n:
                break
    return out


@pytest.mark.parametrize("stop", ["start", "mid", "end_of_epoch", "next_epoch"])
def test_resume_is_exact(stop):
    examples = toy_examples()
    n_epoch = len(TokenBatchSampler(examples, 120, seed=5))
    n_stop = {"start": 0, "mid": 3, "end_of_epoch": n_epoch, "next_epoch": n_epoch + 2}[stop]
    expected = stream(TokenBatchSampler(examples, 120, seed=5), 2 * n_epoch)
    first = TokenBatchSampler(examples, 120, seed=5)
    served = stream(first, n_stop)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = TokenBatchSampler(examples, 120, seed=5)
    resumed.load_state_dict(state)
    assert served + stream(resumed, 2 * n_epoch - n_stop) == expected


def test_state_must_match_the_run():
    examples = toy_examples()
    state = TokenBatchSampler(examples, 120, seed=5).state_dict()
    with pytest.raises(UserError, match="max_tokens=120, but this run has max_tokens=200"):
        TokenBatchSampler(examples, 200, seed=5).load_state_dict(state)
    with pytest.raises(UserError, match="n_examples=103, but this run has n_examples=50"):
        TokenBatchSampler(examples[:50], 120, seed=5).load_state_dict(state)
    # another process count (batch_multiple) loads: the trainer warns that the epoch is cut differently
    assert state["batch_multiple"] == 1
    TokenBatchSampler(examples, 120, seed=5, rank=0, world_size=2).load_state_dict(state)


def test_sharding_splits_the_single_process_batches():
    examples = toy_examples(n=200)
    single = TokenBatchSampler(examples, 240, seed=2, batch_multiple=4)
    ranks = [TokenBatchSampler(examples, 240, seed=2, rank=r, world_size=4) for r in range(4)]
    assert ranks[0].batch_multiple == 4
    for glob, *shares in zip(single, *ranks):
        assert len(glob) % 4 == 0 and all(len(s) == len(glob) // 4 for s in shares)
        assert sorted(i for s in shares for i in s) == sorted(glob)


def test_skipped_examples_vary_per_epoch():
    examples = toy_examples(n=103)
    sampler = TokenBatchSampler(examples, 240, seed=0, world_size=2, rank=0, batch_multiple=4)
    assert sampler.n_skipped_per_epoch == 3
    served = [sorted(i for b in sampler.batches(e) for i in b) for e in (0, 1)]
    assert all(len(s) == 100 for s in served) and served[0] != served[1]


def test_bad_sampler_arguments():
    examples = toy_examples()
    with pytest.raises(UserError, match="max_tokens=50 is too small: batch_multiple 2 × longest example 30"):
        TokenBatchSampler(examples, 50, world_size=2)
    with pytest.raises(UserError, match="batch_multiple 3 must be a multiple of world_size 2"):
        TokenBatchSampler(examples, 500, world_size=2, batch_multiple=3)
    with pytest.raises(UserError, match="rank 2 is outside world_size 2"):
        TokenBatchSampler(examples, 500, world_size=2, rank=2)
    with pytest.raises(UserError, match="no examples"):
        TokenBatchSampler([], 500)


def test_collate_pads_and_shifts():
    batch = collate([([10, 11, 12], [20]), ([13], [21, 22, 23])])
    P, B, E = PAD_ID, BOS_ID, EOS_ID
    assert batch.src.tolist() == [[10, 11, 12, E], [13, E, P, P]]
    assert batch.tgt_in.tolist() == [[B, 20, P, P], [B, 21, 22, 23]]
    assert batch.tgt_out.tolist() == [[20, E, P, P], [21, 22, 23, E]]
    assert batch.src.dtype == torch.long and len(batch) == 2
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (6, 6)
    moved = batch.to("cpu")
    assert torch.equal(moved.src, batch.src) and moved.n_tgt_tokens == 6
    assert padding_share([batch]) == pytest.approx((2 + 2) / (8 + 8))
