"""The inference step (:mod:`aiayn.decode.fast_step`) against the reference, the model's own forward
on its key/value cache (:class:`~aiayn.decode.step.ModelStep`): step by step through reorders, and
whole searches (greedy, beam, sampling, prefixes, constraints) on models of every layout."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from aiayn import TransformerConfig, build_model
from aiayn.decode import DecodeOptions, ModelStep, SearchPaths, fast_step, generate, search
from aiayn.decode.fast_step import FastStep
from aiayn.decode.search import Controls

PAD, BOS, EOS = 0, 2, 3
REFERENCE = SearchPaths(fast_step=False)

LAYOUTS = {
    "paper": {},
    "pre-norm, gelu, learned positions, generator bias, untied": dict(
        norm_first=True, activation="gelu", positional="learned", generator_bias=True, tie_embeddings="none"
    ),
}


def model_of(**overrides):
    values = dict(
        src_vocab_size=40, tgt_vocab_size=1100, d_model=32, n_heads=4, n_encoder_layers=2,
        n_decoder_layers=2, d_ff=64, dropout=0.0, max_len=64,
    )  # fmt: skip
    torch.manual_seed(1)
    model = build_model(TransformerConfig.from_dict({**values, **overrides})).eval()
    with torch.no_grad():  # biases are zeros at initialisation: random ones, so that each one counts
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0.0, 0.1)
    return model


def sources(lengths: list[int], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(4, 40, (n - 1,), generator=g).tolist() + [EOS] for n in lengths]
    width = max(map(len, rows))
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


def both_steps(model, src, log_probs: bool = True):
    return FastStep(model, src, log_probs=log_probs), ModelStep(model, src, log_probs=log_probs)


@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
def test_each_step_equals_the_model_step_through_reorders(layout) -> None:
    """Outputs agree at every call while rows expand (beams), shuffle within a sentence, repeat,
    split into unequal groups and drop out."""
    model = model_of(**LAYOUTS[layout])
    src = sources([5, 9, 3, 7])
    fast, reference = both_steps(model, src)
    orders = [
        torch.arange(4).repeat_interleave(3),  # 3 rows per sentence: grouped memory
        torch.tensor([2, 1, 0, 3, 3, 5, 8, 7, 6, 11, 9, 9]),  # beams move within their sentence
        torch.tensor([0, 1, 2, 6, 7, 8, 9, 10, 11]),  # a sentence leaves
        torch.tensor([0, 1, 3, 4, 5, 6, 7]),  # unequal groups: one memory row per row
        (torch.tensor([6, 5, 0, 1]), torch.tensor([3, 0, 0])),  # two reorders between two steps
    ]
    prefix = torch.full((4, 1), BOS)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for order in [None, *orders]:
            for each in (order,) if isinstance(order, torch.Tensor) else order or ():
                fast.reorder(each)
                reference.reorder(each)
                prefix = prefix[each]
            ours, theirs = fast(prefix), reference(prefix)
            assert ours.shape == theirs.shape
            torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-5)
            prefix = torch.cat([prefix, torch.randint(4, 1100, (prefix.size(0), 1), generator=g)], dim=1)
    assert fast.group == 1 and len(fast.cross[0][0]) == 3


def test_rows_of_one_source_share_its_memory_keys() -> None:
    model, src = model_of(), sources([5, 9, 3, 7])
    with torch.inference_mode():
        step = FastStep(model, src)
        step(torch.full((4, 1), BOS))
        step.reorder(torch.arange(4).repeat_interleave(3))
    assert step.group == 3 and step.cross[0][0].size(0) == 4


def test_a_source_with_no_token_gives_what_the_model_gives() -> None:
    """A row whose source is all padding attends to nothing: a zero cross-attention output."""
    model = model_of()
    src = sources([5, 9])
    src[1] = PAD
    fast, reference = both_steps(model, src)
    with torch.inference_mode():
        torch.testing.assert_close(fast(torch.full((2, 1), BOS)), reference(torch.full((2, 1), BOS)))


OPTIONS = {
    "greedy": DecodeOptions(beam=1, alpha=0.0, max_len_b=12),
    "greedy, no scores": DecodeOptions(beam=1, max_len_b=12, scores=False),
    "beam": DecodeOptions(beam=4, alpha=0.6, nbest=3, max_len_b=12),
    "beam, memory per row": DecodeOptions(beam=3, max_len_b=12, paths=SearchPaths(group_rows=False)),
    "sampling": DecodeOptions(sample=True, seed=5, nbest=2, top_p=0.9, max_len_b=12),
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
@pytest.mark.parametrize("name", OPTIONS, ids=list(OPTIONS))
def test_searches_give_the_reference_hypotheses(layout, name) -> None:
    model, options = model_of(**LAYOUTS[layout]), OPTIONS[name]
    src = sources([5, 9, 3, 7, 12, 2], seed=3)
    reference = replace(options, paths=replace(options.paths, fast_step=False))
    _same(generate(model, src, options), generate(model, src, reference))


@pytest.mark.parametrize("beam", [1, 4])
def test_prefixes_and_constraints_give_the_reference_hypotheses(beam) -> None:
    model, src = model_of(), sources([5, 9, 3, 7], seed=4)
    controls = Controls(prefixes=[[5, 6], [], [7], [8, 9, 10]])
    if beam > 1:
        controls = replace(controls, terms=[[[17, 18]], [], [[21], [22, 23]], [[19]]])
    options = DecodeOptions(beam=beam, max_len_b=12)
    _same(
        generate(model, src, options, controls),
        generate(model, src, replace(options, paths=REFERENCE), controls),
    )


def test_both_steps_give_one_layer_s_cross_attention_through_reorders() -> None:
    """The alignment guide's attention (one decoder layer, heads averaged, a row per row): the
    same from both steps, with grouped memory and unequal groups."""
    model = model_of()
    src = sources([5, 9, 3, 7])
    fast = FastStep(model, src, attention_layer=1)
    reference = ModelStep(model, src, attention_layer=1)
    prefix = torch.full((4, 1), BOS)
    with torch.inference_mode():
        for order in [None, torch.arange(4).repeat_interleave(3), torch.tensor([0, 1, 3, 4, 5, 6, 7])]:
            if order is not None:
                fast.reorder(order)
                reference.reorder(order)
                prefix = prefix[order]
            fast(prefix), reference(prefix)
            assert fast.attention.shape == (prefix.size(0), src.size(1))
            torch.testing.assert_close(fast.attention, reference.attention, atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(fast.attention.sum(dim=-1), torch.ones(prefix.size(0)))
            prefix = torch.cat([prefix, torch.full((prefix.size(0), 1), 7)], dim=1)


def test_the_guided_search_gives_the_reference_hypotheses() -> None:
    model, src = model_of(), sources([5, 9, 3, 7], seed=4)
    words = [[0, 0, 1, 2, -1], [0, 1, 2, 3, 4, 5, 6, 7, -1], [0, 1, -1], [0, 1, 1, 2, 3, 4, -1]]
    controls = Controls(
        terms=[[[17, 18]], [], [[21], [22, 23]], [[19]]],
        places=[[[1]], [], [[0], [1]], [[3]]],
        source_words=words,
    )
    options = DecodeOptions(beam=3, max_len_b=12)
    guided = generate(model, src, options, controls)
    _same(guided, generate(model, src, replace(options, paths=REFERENCE), controls))
    # the guide acted: a term away from its place, and a translation the unguided search differs on
    unguided = generate(model, src, options, Controls(terms=controls.terms))
    assert any(h.misplaced for hyps in guided for h in hyps)
    assert [h.tokens for hyps in guided for h in hyps] != [h.tokens for hyps in unguided for h in hyps]


def test_packed_weights_follow_a_change_of_the_parameters() -> None:
    """Training-time validation decodes a model between optimizer steps: an in-place update of a
    weight makes the step pack it again (a stale packed generator would decode the old model)."""
    model, src = model_of(), sources([5, 9, 3], seed=2)
    options = DecodeOptions(beam=2, max_len_b=10)
    before = fast_step.weights(model)
    assert fast_step.weights(model) is before  # kept between batches
    generate(model, src, options)
    with torch.no_grad():
        model.generator.proj.weight.mul_(-1.5)  # an optimizer's in-place update (tied: the embeddings too)
    assert fast_step.weights(model) is not before
    _same(generate(model, src, options), generate(model, src, replace(options, paths=REFERENCE)))
    packed = fast_step.weights(model)
    model.generator.proj.weight.data.mul_(-1.0)  # through .data: no version counter sees it
    assert fast_step.weights(model) is not packed
    _same(generate(model, src, options), generate(model, src, replace(options, paths=REFERENCE)))


def test_a_model_in_training_mode_decodes_with_the_reference_step() -> None:
    model = model_of(dropout=0.0).train()
    assert not fast_step.supported(model)
    src = sources([5, 9])
    options = DecodeOptions(beam=2, max_len_b=8)
    _same(generate(model, src, options), generate(model, src, replace(options, paths=REFERENCE)))


def test_the_fast_step_is_the_default_on_the_cpu_only() -> None:
    """It was measured faster on CPUs only (issue 49): by default a model elsewhere (here: the meta
    device, standing for a GPU) decodes with the model's own step."""
    model, src, options = model_of(), sources([5, 9]), DecodeOptions(beam=2)
    assert isinstance(search._step(model, src, options, log_probs=True), fast_step.FastStep)
    forced = replace(options, paths=SearchPaths(fast_step=False))
    assert isinstance(search._step(model, src, forced, log_probs=True), ModelStep)
    assert fast_step.by_default(model) and not fast_step.by_default(model.to("meta"))


def test_in_fp32_only_the_generator_is_packed_in_bf16_every_layer_where_native(monkeypatch) -> None:
    """fp32: the one weight packed for oneDNN (where PyTorch has it) is the vocabulary projection.
    bf16: every linear layer, where bf16 is native, else none."""
    model = model_of()
    packed = fast_step.weights(model)
    assert packed.generator.packed == fast_step._can_pack(model.generator.proj.weight)
    assert not any(
        linear.packed for layer in packed.layers for linear in (layer.qkv, layer.ff_in, layer.ff_out)
    )
    monkeypatch.setattr(fast_step, "native_bf16", lambda device: False)
    assert not fast_step.weights(model_of().to(torch.bfloat16)).generator.packed


def _same(ours, theirs) -> None:
    assert [[h.tokens for h in hyps] for hyps in ours] == [[h.tokens for h in hyps] for hyps in theirs]
    for a, b in zip(ours, theirs):
        for x, y in zip(a, b):
            assert x.score == pytest.approx(y.score, abs=1e-4, nan_ok=True)
            assert x.token_log_probs == pytest.approx(y.token_log_probs, abs=1e-4)


def test_an_int8_linear_is_within_int8_rounding_of_fp32() -> None:
    g = torch.Generator().manual_seed(0)
    weight, bias, x = (torch.randn(*shape, generator=g) for shape in ((96, 64), (96,), (10, 64)))
    exact = torch.nn.functional.linear(x, weight, bias)
    error = (fast_step.Int8Linear(weight, bias)(x) - exact).abs().max() / exact.abs().max()
    assert 0 < error < 0.02
    relu = fast_step.Int8Linear(weight, bias, relu=True)(x)
    assert (relu >= 0).all() and torch.allclose(relu, fast_step.Int8Linear(weight, bias)(x).relu())


def test_the_int8_copy_decodes_close_to_the_model_and_leaves_it_alone() -> None:
    model, src = model_of(), sources([5, 9, 3, 7], seed=6)
    before = {name: p.clone() for name, p in model.state_dict().items()}
    quantized = fast_step.int8(model)
    assert fast_step.is_int8(quantized) and not fast_step.is_int8(model)
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())
    assert isinstance(model.encoder.layers[0].feed_forward.w_1, torch.nn.Linear)
    assert isinstance(fast_step.weights(quantized).generator, fast_step.Int8Linear)
    prefix = torch.full((4, 1), BOS)
    with torch.inference_mode():
        ours, theirs = FastStep(quantized, src)(prefix), FastStep(model, src)(prefix)
    assert (ours - theirs).abs().max() < 0.1 and not torch.equal(ours, theirs)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    with pytest.raises(ValueError, match="runs on the CPU"):
        fast_step.int8(model.to("meta"))


NATIVE_BF16 = pytest.mark.skipif(
    not fast_step.native_bf16(torch.device("cpu")), reason="this CPU has no native bf16 (AVX512-BF16 or AMX)"
)


@NATIVE_BF16
def test_the_bf16_copy_decodes_close_to_the_model_and_leaves_it_alone() -> None:
    """Weights in bf16, packed for oneDNN (the decoder's, the generator's, the encoder's linear
    layers); its step agrees with the bf16 model's own step and with fp32 to bf16 rounding."""
    model, src = model_of(), sources([5, 9, 3, 7], seed=6)
    before = {name: p.clone() for name, p in model.state_dict().items()}
    half = fast_step.bfloat16(model)
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())
    assert next(half.parameters()).dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.float32
    packed = fast_step.weights(half)
    assert packed.generator.packed and packed.layers[0].qkv.packed and packed.layers[0].ff_out.packed
    assert not isinstance(half.encoder.layers[0].feed_forward.w_1, torch.nn.Linear)
    fast, own, exact = FastStep(half, src), ModelStep(half, src), FastStep(model, src)
    prefix = torch.full((4, 1), BOS)
    with torch.inference_mode():
        for t, token in enumerate((5, 9, 11)):
            ours, theirs, fp32 = fast(prefix), own(prefix), exact(prefix)
            assert ours.dtype == torch.float32
            assert (ours - theirs).abs().max() < 0.1 and (ours - fp32).abs().max() < 0.1, t
            assert not torch.equal(ours, fp32)
            prefix = torch.cat([prefix, torch.full((4, 1), token)], dim=1)
    options = DecodeOptions(beam=3, max_len_b=6)
    assert [len(h) for h in generate(half, src, options)] == [1, 1, 1, 1]


def test_the_bf16_copy_is_refused_without_native_bf16(monkeypatch) -> None:
    monkeypatch.setattr(fast_step, "native_bf16", lambda device: False)
    with pytest.raises(ValueError, match="needs native bf16"):
        fast_step.bfloat16(model_of())


def test_a_model_built_under_inference_mode_decodes_and_follows_a_loaded_state() -> None:
    """Its parameters keep no version counter: a state loaded in place is seen all the same."""
    with torch.inference_mode():
        model = model_of()
    src = sources([5, 9, 3], seed=7)
    options = DecodeOptions(beam=2, max_len_b=8)
    _same(generate(model, src, options), generate(model, src, replace(options, paths=REFERENCE)))
    with torch.inference_mode():
        model.load_state_dict(
            model_of(positional="sinusoidal", dropout=0.0, d_ff=64).state_dict()
            | {"generator.proj.weight": -model.generator.proj.weight.clone()}
        )
    _same(generate(model, src, options), generate(model, src, replace(options, paths=REFERENCE)))


def test_a_bf16_model_decodes_close_to_its_fp32_self() -> None:
    """On a GPU the step runs in fp16/bf16 (``F.linear``; the attention's softmax in fp32)."""
    model, src = model_of(), sources([5, 9, 3], seed=8)
    prefix = torch.full((3, 1), BOS)
    with torch.inference_mode():
        half = FastStep(model_of().to(torch.bfloat16), src)(prefix)
        exact = FastStep(model, src)(prefix)
    assert half.dtype == torch.float32 and (half - exact).abs().max() < 0.25


def test_an_fp16_model_gives_zeros_not_nan_for_a_source_with_no_token() -> None:
    model = model_of().half()
    src = sources([5, 9])
    src[1] = PAD
    with torch.inference_mode():
        ours = FastStep(model, src)(torch.full((2, 1), BOS))
    assert torch.isfinite(ours).all()
