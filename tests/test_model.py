"""The model's behaviour: shapes, masks, causality, padding, cache, precision, gradients, config."""

from __future__ import annotations

import json
import math

import pytest
import torch

import aiayn
import aiayn.model.attention as attention_module
from aiayn import TransformerConfig, build_model, positional_encoding
from aiayn.model.attention import MultiHeadAttention, attention_weights, scaled_dot_product_attention
from aiayn.model.masks import causal_mask, padding_mask

PAD = 0


def tiny_config(**overrides) -> TransformerConfig:
    values = dict(
        src_vocab_size=50,
        tgt_vocab_size=60,
        d_model=32,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=64,
        dropout=0.0,
        max_len=64,
    )
    return TransformerConfig.from_dict({**values, **overrides})


def tiny_model(**overrides):
    return build_model(tiny_config(**overrides)).eval()


@pytest.fixture(params=["formula", "fused"])
def attention_path(request) -> str:
    """Run a model test on both attention paths: the ``path`` to give the model with :func:`on_path`."""
    return request.param


def on_path(model, path: str):
    """``model`` with every attention module set to ``path``."""
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.path = path
    return model


def tokens(lengths: list[int], total: int, vocab: int = 50) -> torch.Tensor:
    out = torch.randint(4, vocab, (len(lengths), total))
    for row, n in enumerate(lengths):
        out[row, n:] = PAD
    return out


# --- the build_transformer write-up's shape walkthrough ---------------------------------------


def test_base_shape_walkthrough() -> None:
    config = TransformerConfig.preset("base", src_vocab_size=10000, tgt_vocab_size=10000)
    model = build_model(config).eval()
    src, tgt = torch.randint(4, 10000, (2, 20)), torch.randint(4, 10000, (2, 20))
    with torch.no_grad():
        memory = model.encode(src)
        decoded = model.decode(tgt, memory)
        logits = model.generator(decoded)
    assert memory.shape == (2, 20, 512)
    assert decoded.shape == (2, 20, 512)
    assert logits.shape == (2, 20, 10000)


def test_base_parameter_count_with_shared_vocabulary() -> None:
    config = TransformerConfig.preset(
        "base", src_vocab_size=37000, tgt_vocab_size=37000, tie_embeddings="all"
    )
    count = aiayn.count_parameters(build_model(config))
    assert count == 63_082_496  # the paper reports 65M; README states this figure
    untied = aiayn.count_parameters(
        build_model(TransformerConfig.preset("base", src_vocab_size=37000, tgt_vocab_size=37000))
    )
    assert untied == count + 2 * 37000 * 512


# --- positional encoding and attention --------------------------------------------------------


def test_positional_encoding_equals_formula() -> None:
    table = positional_encoding(50, 16)
    assert table.shape == (50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_positional_encoding_is_a_buffer_not_a_parameter() -> None:
    model = tiny_model()
    assert not any("table" in name for name, _ in model.named_parameters())
    learned = tiny_model(positional="learned")
    assert any(name.endswith("src_pos.table") for name, _ in learned.named_parameters())


def test_positional_encoding_none_changes_nothing() -> None:
    model = tiny_model(positional="none")
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(model.src_pos(x), x)


def test_fast_and_reference_attention_agree() -> None:
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8)
    mask = padding_mask(tokens([9, 3], 9), PAD)
    fast, none = scaled_dot_product_attention(q, k, v, mask, path="fused")
    ref, weights = scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    assert none is None
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 6))
    assert (weights[1, :, :, 3:] == 0).all()


@pytest.mark.parametrize("path, fused_calls", [("auto", 6), ("fused", 6), ("formula", 0)])
def test_path_chooses_the_kernel_of_every_attention_module(path: str, fused_calls: int, monkeypatch) -> None:
    """Without gradients "auto" is the fused kernel; the path can be forced on a built model."""
    fused, calls = attention_module.F.scaled_dot_product_attention, []

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return fused(*args, **kwargs)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", counting)
    model = on_path(tiny_model(), path)
    with torch.no_grad():
        model(tokens([5, 3], 5), tokens([4, 4], 4, 60))
    assert len(calls) == fused_calls  # 2 encoder self, 2 decoder self, 2 cross
    with pytest.raises(ValueError, match="path: unknown value 'fast'"):
        MultiHeadAttention(16, 4, path="fast")


def test_auto_path_takes_the_formula_only_for_a_small_bf16_backward() -> None:
    """ "auto": the formula when gradients flow through bf16/fp16 attention over at most 64 x 64 scores
    per (row, head); the fused kernel for inference, fp32 and larger score matrices."""
    faster = attention_module.formula_is_faster

    def qk(t_q: int, t_k: int, grad: bool = False, dtype=torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(1, 1, t_q, 4, dtype=dtype, requires_grad=grad), torch.zeros(
            1, 1, t_k, 4, dtype=dtype
        )

    assert faster(*qk(64, 64, grad=True)) and faster(*qk(1, 4096, grad=True))
    assert not faster(*qk(65, 64, grad=True)) and not faster(*qk(1, 5000, grad=True))
    assert faster(*qk(8, 8, grad=True, dtype=torch.float16))
    assert not faster(*qk(8, 8, grad=True, dtype=torch.float32))  # an fp32 backward: the fused kernel
    assert not faster(*qk(1, 8)) and not faster(*qk(8, 8)) and not faster(*qk(8, 8, dtype=torch.float32))
    with torch.no_grad():
        assert not faster(*qk(8, 8, grad=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_formula_and_fused_kernel_give_the_same_gradients(dtype: torch.dtype) -> None:
    """bf16 training takes the formula for short sequences (and any precision with weights asked for):
    its backward through the padding mask must equal the fused kernel's, in fp32 and under bf16 autocast."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 4)
    x, memory = torch.randn(3, 5, 16), torch.randn(3, 7, 16)
    mask = padding_mask(tokens([7, 4, 2], 7), PAD)
    grads = {}
    for path in ("formula", "fused"):
        attention.path = path
        attention.zero_grad()
        query = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            out, _ = attention(query, memory, mask)
        out.float().square().sum().backward()
        grads[path] = [query.grad] + [p.grad.clone() for p in attention.parameters()]
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for ours, fused in zip(grads["formula"], grads["fused"]):
        torch.testing.assert_close(ours, fused, atol=tol, rtol=tol)


@pytest.mark.parametrize("path", ["formula", "fused"])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fully_padded_row_gives_zeros_not_nan(need_weights: bool, dtype: torch.dtype, path: str) -> None:
    q, k, v = torch.randn(2, 2, 3, 8), torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8)
    mask = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    mask[1] = False
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        out, _ = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights, path=path)
    assert torch.isfinite(out).all()
    assert (out[1] == 0).all()


def test_model_on_all_padding_source_is_finite_in_fp32_and_bf16(attention_path: str) -> None:
    model = on_path(tiny_model(), attention_path)
    src = tokens([5, 0], 5)  # second sentence is all padding
    tgt = tokens([4, 1], 4, 60)
    for enabled in (False, True):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            assert torch.isfinite(model(src, tgt)).all()


def test_attention_maps_rows_sum_to_one_and_zero_on_masked_keys() -> None:
    model = tiny_model()
    src, tgt = tokens([7, 4], 7), tokens([5, 3], 5, 60)
    with torch.no_grad():
        logits, maps = model(src, tgt, return_attention=True)
    torch.testing.assert_close(logits, model(src, tgt), atol=1e-5, rtol=1e-5)
    assert [len(maps[k]) for k in ("encoder_self", "decoder_self", "cross")] == [2, 2, 2]
    enc, dec, cross = maps["encoder_self"][0], maps["decoder_self"][1], maps["cross"][0]
    assert enc.shape == (2, 4, 7, 7) and dec.shape == (2, 4, 5, 5) and cross.shape == (2, 4, 5, 7)
    torch.testing.assert_close(cross.sum(-1), torch.ones(2, 4, 5))
    assert (cross[1, :, :, 4:] == 0).all() and (enc[1, :, :, 4:] == 0).all()
    assert (dec[0].triu(1) == 0).all()  # causal: nothing above the diagonal


# --- causality, padding invariance, cache -------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_is_causal(norm_first: bool) -> None:
    model = tiny_model(norm_first=norm_first)
    src, tgt = tokens([6], 6), tokens([8], 8, 60)
    changed = tgt.clone()
    changed[0, 5:] = torch.randint(4, 60, (3,))
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_padding_invariance(attention_path: str) -> None:
    model = on_path(tiny_model(), attention_path)
    src, tgt = tokens([5], 5), tokens([4], 4, 60)
    with torch.no_grad():
        alone = model(src, tgt)
        padded_src = torch.cat([src, torch.zeros(1, 6, dtype=torch.long)], 1)
        extra_padding = model(padded_src, tgt)
        other_src, other_tgt = tokens([11], 11), tokens([9], 9, 60)
        batch_src = torch.cat([padded_src, other_src])
        batch_tgt = torch.cat([torch.cat([tgt, torch.zeros(1, 5, dtype=torch.long)], 1), other_tgt])
        in_batch = model(batch_src, batch_tgt)
    torch.testing.assert_close(extra_padding, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(in_batch[:1, :4], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decoding_equals_full_forward(norm_first: bool, attention_path: str) -> None:
    model = on_path(tiny_model(norm_first=norm_first), attention_path)
    src, tgt = tokens([7, 3], 7), tokens([6, 6], 6, 60)
    with torch.no_grad():
        full = model(src, tgt)
        src_mask = padding_mask(src, PAD)
        cache = model.init_cache(model.encode(src, src_mask), src_mask)
        steps = [model.generator(model.decode(tgt[:, t : t + 1], None, cache=cache)) for t in range(6)]
        chunked_cache = model.init_cache(model.encode(src, src_mask), src_mask)
        first = model.decode(tgt[:, :2], None, cache=chunked_cache)
        rest = model.decode(tgt[:, 2:], None, cache=chunked_cache)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.generator(torch.cat([first, rest], 1)), full, atol=1e-5, rtol=1e-5)


def test_cache_reorder_selects_batch_rows() -> None:
    model = tiny_model()
    src, tgt = tokens([7, 3], 7), tokens([5, 5], 5, 60)
    with torch.no_grad():
        src_mask = padding_mask(src, PAD)
        cache = model.init_cache(model.encode(src, src_mask), src_mask)
        model.decode(tgt[:, :3], None, cache=cache)
        cache.reorder(torch.tensor([1, 1, 0]))
        step = model.generator(model.decode(tgt[[1, 1, 0], 3:4], None, cache=cache))
        full = model(src[[1, 1, 0]], tgt[[1, 1, 0], :4])
    torch.testing.assert_close(step[:, 0], full[:, 3], atol=1e-5, rtol=1e-5)


def test_attention_weights_stay_fp32_under_autocast() -> None:
    """The written-out formula (the reference, and bf16 training's path for small score matrices)
    scores in fp32."""
    q, k = torch.randn(2, 4, 1, 8), torch.randn(2, 4, 5, 8)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])[:, None, None]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        weights = attention_weights(q, k, mask)
        out, _ = scaled_dot_product_attention(q, k, k, mask, path="formula")
    assert weights.dtype == torch.float32
    torch.testing.assert_close(weights, attention_weights(q, k, mask), atol=0, rtol=0)
    # the product with V is autocast's bf16 matmul, as the fused kernel's would be
    fused, _ = scaled_dot_product_attention(q, k, k, mask, path="fused")
    torch.testing.assert_close(out.float(), fused, atol=2e-2, rtol=2e-2)


# --- precision and gradients --------------------------------------------------------------------


def test_bf16_autocast_is_close_to_fp32(attention_path: str) -> None:
    model = on_path(tiny_model(), attention_path)
    src, tgt = tokens([7, 5], 7), tokens([6, 4], 6, 60)
    with torch.no_grad():
        ref = model(src, tgt)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(src, tgt)
    assert low.dtype == torch.bfloat16
    assert (low.float() - ref).abs().max() < 0.1 * ref.abs().max()
    assert (low.float().argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


@pytest.mark.parametrize("tie", ["none", "decoder", "all"])
def test_gradients_reach_every_parameter(tie: str) -> None:
    model = tiny_model(src_vocab_size=60, tie_embeddings=tie, positional="learned").train()
    src, tgt = tokens([7, 5], 7, 60), tokens([6, 4], 6, 60)
    model(src, tgt).float().logsumexp(-1).sum().backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_weight_tying() -> None:
    none, decoder, full = (
        tiny_model(src_vocab_size=60, tie_embeddings=t) for t in ("none", "decoder", "all")
    )
    assert none.generator.proj.weight is not none.tgt_embed.weight
    assert decoder.generator.proj.weight is decoder.tgt_embed.weight
    assert decoder.src_embed.weight is not decoder.tgt_embed.weight
    assert full.src_embed.weight is full.tgt_embed.weight is full.generator.proj.weight
    std = full.tgt_embed.weight[1:].std().item()
    assert std == pytest.approx(32**-0.5, rel=0.1)  # N(0, d^-0.5) when tied
    assert (full.tgt_embed.weight[PAD] == 0).all()


def test_embeddings_scaled_by_sqrt_d_model() -> None:
    model = tiny_model()
    ids = torch.tensor([[5, 6]])
    torch.testing.assert_close(model.src_embed(ids), model.src_embed.lut(ids) * math.sqrt(32))


def test_generator_log_probs_are_fp32_log_softmax() -> None:
    model = tiny_model()
    x = torch.randn(2, 3, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        log_probs = model.generator(x, log_probs=True)
    assert log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 3))


def test_position_past_max_len_is_a_clear_error() -> None:
    model = tiny_model(max_len=8)
    with pytest.raises(ValueError, match="max_len=8"):
        model(tokens([9], 9), tokens([3], 3, 60))


# --- config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(d_model=30, n_heads=4), "d_model"),
        (dict(d_model=0), "d_model"),
        (dict(n_encoder_layers=0), "n_encoder_layers"),
        (dict(dropout=1.5), "dropout"),
        (dict(positional="rotary"), "positional"),
        (dict(tie_embeddings="both"), "tie_embeddings"),
        (dict(activation="swish"), "activation"),
        (dict(tie_embeddings="all"), "tie_embeddings"),  # src 50 != tgt 60
        (dict(pad_id=1), "pad_id"),  # collides with unk
        (dict(src_vocab_size=-3), "src_vocab_size"),
        (dict(n_heads=True), "n_heads"),  # YAML's true is not 1
        (dict(max_len=True), "max_len"),
        (dict(layer_norm_eps="1e-6"), "layer_norm_eps"),
    ],
)
def test_config_validation_names_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}"):
        tiny_config(**overrides)


def test_config_json_round_trip_and_unknown_keys() -> None:
    config = tiny_config(norm_first=True, activation="gelu")
    assert TransformerConfig.from_json(config.to_json()) == config
    values = json.loads(config.to_json())
    values["d_modle"] = 3
    with pytest.raises(ValueError, match="unknown config field.*d_modle.*valid:.*d_model"):
        TransformerConfig.from_dict(values)


def test_presets() -> None:
    base = TransformerConfig.preset("base")
    assert (base.n_encoder_layers, base.d_model, base.n_heads, base.d_ff, base.dropout) == (
        6,
        512,
        8,
        2048,
        0.1,
    )
    assert base.d_k == 64 and not base.norm_first and base.positional == "sinusoidal"
    big = TransformerConfig.preset("big", src_vocab_size=100, tgt_vocab_size=100)
    assert (big.n_decoder_layers, big.d_model, big.n_heads, big.d_ff, big.dropout) == (6, 1024, 16, 4096, 0.3)
    assert big.src_vocab_size == 100
    small = TransformerConfig.preset("small")
    assert (small.d_model, small.n_heads, small.d_ff, small.n_encoder_layers) == (256, 4, 1024, 3)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        TransformerConfig.preset("huge")


def test_causal_mask_shape_and_values() -> None:
    mask = causal_mask(3)
    assert mask.shape == (1, 1, 3, 3) and mask.dtype == torch.bool
    assert mask[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_auto_precision_takes_bf16_only_where_it_is_native(monkeypatch) -> None:
    """CUDA: compute capability 8 (Ampere) and up; torch.cuda.is_bf16_supported() also counts
    pre-Ampere emulation, so it must not decide."""
    from aiayn.precision import resolve_precision

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    for capability, expected in (((7, 0), "fp32"), ((7, 5), "fp32"), ((8, 0), "bf16"), ((9, 0), "bf16")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert resolve_precision("auto", torch.device("cuda:0")) == expected, capability
    assert resolve_precision("fp32", torch.device("cuda:0")) == "fp32"
