"""Parity with PyTorch's own modules, weights copied across, eval mode, 1e-5."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aiayn.model import DecoderLayer, EncoderLayer, MultiHeadAttention
from aiayn.model.masks import causal_mask, padding_mask, to_torch_mha_mask

D, H, FF = 32, 4, 64


def _copy_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        ours.in_proj.weight.copy_(theirs.in_proj_weight)
        ours.in_proj.bias.copy_(theirs.in_proj_bias)
        ours.out_proj.weight.copy_(theirs.out_proj.weight)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)


def _copy_ff_and_norms(ours, theirs, blocks) -> None:
    with torch.no_grad():
        ours.feed_forward.w_1.load_state_dict(theirs.linear1.state_dict())
        ours.feed_forward.w_2.load_state_dict(theirs.linear2.state_dict())
        for block, norm in zip(blocks, (theirs.norm1, theirs.norm2, getattr(theirs, "norm3", None))):
            block.norm.load_state_dict(norm.state_dict())


def _randomise_norms(module: nn.Module) -> None:
    """LayerNorms start at (1, 0); make them non-trivial so a swapped norm would show."""
    for m in module.modules():
        if isinstance(m, nn.LayerNorm):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)


def _lengths_tokens(lengths: list[int], total: int) -> torch.Tensor:
    tokens = torch.randint(1, 9, (len(lengths), total))
    for row, n in enumerate(lengths):
        tokens[row, n:] = 0
    return tokens


@pytest.mark.parametrize("use_mask", ["none", "padding", "causal"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_attention_matches_torch(use_mask: str, need_weights: bool) -> None:
    theirs = nn.MultiheadAttention(D, H, batch_first=True).eval()
    ours = MultiHeadAttention(D, H).eval()
    _copy_attention(ours, theirs)
    q, kv = torch.randn(3, 5, D), torch.randn(3, 7, D)
    if use_mask == "padding":
        mask = padding_mask(_lengths_tokens([7, 4, 2], 7), 0)  # (B, 1, 1, S)
        ref, ref_w = theirs(q, kv, kv, key_padding_mask=to_torch_mha_mask(mask[:, 0, 0]))
        out, w = ours(q, kv, mask=mask, need_weights=need_weights)
    elif use_mask == "causal":
        x = torch.randn(3, 6, D)
        mask = causal_mask(6)
        ref, ref_w = theirs(x, x, x, attn_mask=to_torch_mha_mask(mask[0, 0]))
        out, w = ours(x, mask=mask, need_weights=need_weights)
    else:
        ref, ref_w = theirs(q, kv, kv)
        out, w = ours(q, kv, need_weights=need_weights)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    if need_weights:  # torch averages heads by default
        torch.testing.assert_close(w.mean(dim=1), ref_w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_torch(norm_first: bool) -> None:
    theirs = nn.TransformerEncoderLayer(D, H, FF, dropout=0.1, batch_first=True, norm_first=norm_first).eval()
    ours = EncoderLayer(D, H, FF, dropout=0.1, norm_first=norm_first).eval()
    _randomise_norms(theirs)
    _copy_attention(ours.self_attn, theirs.self_attn)
    _copy_ff_and_norms(ours, theirs, (ours.attn_block, ours.ff_block))
    x = torch.randn(3, 7, D)
    mask = padding_mask(_lengths_tokens([7, 5, 3], 7), 0)
    ref = theirs(x, src_key_padding_mask=to_torch_mha_mask(mask[:, 0, 0]))
    out = ours(x, mask)
    keep = mask[:, 0, 0]  # torch's fast path may leave padded query rows as zeros: compare real ones
    torch.testing.assert_close(out[keep], ref[keep], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch(norm_first: bool) -> None:
    theirs = nn.TransformerDecoderLayer(D, H, FF, dropout=0.1, batch_first=True, norm_first=norm_first).eval()
    ours = DecoderLayer(D, H, FF, dropout=0.1, norm_first=norm_first).eval()
    _randomise_norms(theirs)
    _copy_attention(ours.self_attn, theirs.self_attn)
    _copy_attention(ours.cross_attn, theirs.multihead_attn)
    _copy_ff_and_norms(ours, theirs, (ours.self_block, ours.cross_block, ours.ff_block))
    x, memory = torch.randn(3, 6, D), torch.randn(3, 8, D)
    src_mask = padding_mask(_lengths_tokens([8, 5, 2], 8), 0)
    tgt_mask = causal_mask(6)
    ref = theirs(
        x,
        memory,
        tgt_mask=to_torch_mha_mask(tgt_mask[0, 0]),
        memory_key_padding_mask=to_torch_mha_mask(src_mask[:, 0, 0]),
    )
    out = ours(x, memory, src_mask, tgt_mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_mask_polarity_conversion_is_the_opposite() -> None:
    mask = padding_mask(torch.tensor([[5, 6, 0]]), 0)
    assert mask[0, 0, 0].tolist() == [True, True, False]
    assert to_torch_mha_mask(mask)[0, 0, 0].tolist() == [False, False, True]
