"""Encoder and decoder stacks, the generator, the Transformer, and :func:`build_model` (§3).

Masks: bool, True = may attend (see :mod:`aiayn.model.masks`). When ``forward``/``encode`` get no
mask, they build them from ``config.pad_id``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import TransformerConfig
from aiayn.model.attention import KVCache
from aiayn.model.embedding import PositionalEncoding, TokenEmbedding
from aiayn.model.layers import DecoderLayer, EncoderLayer
from aiayn.model.masks import padding_mask, target_mask


def _layer_kwargs(config: TransformerConfig) -> dict:
    return dict(
        d_model=config.d_model,
        n_heads=config.n_heads,
        d_ff=config.d_ff,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation=config.activation,
        norm_first=config.norm_first,
        eps=config.layer_norm_eps,
    )


def _final_norm(config: TransformerConfig) -> nn.Module:
    """Pre-norm stacks end with a LayerNorm (their layers' outputs are un-normalised)."""
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else nn.Identity()


class Encoder(nn.Module):
    """N identical :class:`EncoderLayer` s over already-embedded inputs ``(B, S, D)``."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(**_layer_kwargs(config)) for _ in range(config.n_encoder_layers)
        )
        self.norm = _final_norm(config)

    def forward(self, x: Tensor, src_mask: Tensor | None = None, need_weights: bool = False) -> Tensor:
        """``src_mask`` ``(B, 1, 1, S)``, True = may attend. Returns ``memory`` ``(B, S, D)``."""
        for layer in self.layers:
            x = layer(x, src_mask, need_weights)
        return self.norm(x)


class DecoderCache:
    """Everything incremental decoding keeps between steps.

    Per decoder layer: a growing self-attention :class:`KVCache` and a static cross-attention one
    (the memory's keys/values, projected once per source); the memory and its mask; the number of
    target positions decoded. ``reorder`` selects batch rows, as beam search needs after each step.
    """

    def __init__(self, n_layers: int, memory: Tensor, src_mask: Tensor | None) -> None:
        self.layers = [(KVCache(static=False), KVCache(static=True)) for _ in range(n_layers)]
        self.memory, self.src_mask = memory, src_mask  # (B, S, D), (B, 1, 1, S)
        self.length = 0  # target positions already decoded

    def reorder(self, new_order: Tensor) -> None:
        """Row i of every cached tensor becomes old row ``new_order[i]`` (rows may repeat or go)."""
        for self_cache, cross_cache in self.layers:
            self_cache.reorder(new_order)
            cross_cache.reorder(new_order)
        self.memory = self.memory.index_select(0, new_order)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, new_order)


class Decoder(nn.Module):
    """N identical :class:`DecoderLayer` s over already-embedded target inputs ``(B, T, D)``."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(**_layer_kwargs(config)) for _ in range(config.n_decoder_layers)
        )
        self.norm = _final_norm(config)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        """``memory`` ``(B, S, D)``; masks bool, True = may attend. Returns ``(B, T, D)``."""
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, src_mask, tgt_mask, cache.layers[i] if cache else None, need_weights)
        return self.norm(x)


class Generator(nn.Module):
    """The pre-softmax linear projection to the target vocabulary (§3.4), without bias unless
    ``bias`` (``generator_bias``: imported MarianMT models have one)."""

    def __init__(self, d_model: int, vocab_size: int, bias: bool = False) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size, bias=bias)

    def forward(self, x: Tensor, log_probs: bool = False) -> Tensor:
        """``(B, T, D)`` -> logits (or fp32 log-probabilities) ``(B, T, V)``."""
        logits = self.proj(x)
        return F.log_softmax(logits.float(), dim=-1) if log_probs else logits


class Transformer(nn.Module):
    """The encoder-decoder Transformer. Build it with :func:`build_model`."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        d, pad = config.d_model, config.pad_id
        self.src_embed = TokenEmbedding(config.src_vocab_size, d, pad)
        self.tgt_embed = TokenEmbedding(config.tgt_vocab_size, d, pad)
        self.src_pos = PositionalEncoding(d, config.max_len, config.positional, config.dropout)
        self.tgt_pos = PositionalEncoding(d, config.max_len, config.positional, config.dropout)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.generator = Generator(d, config.tgt_vocab_size, config.generator_bias)

    def encode(self, src: Tensor, src_mask: Tensor | None = None, need_weights: bool = False) -> Tensor:
        """``src`` ``(B, S)`` ids -> ``memory`` ``(B, S, D)``. Default mask: ``src != pad_id``."""
        if src_mask is None:
            src_mask = padding_mask(src, self.config.pad_id)
        return self.encoder(self.src_pos(self.src_embed(src)), src_mask, need_weights)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        """Decoder states ``(B, T, D)`` for target inputs ``tgt`` ``(B, T)``.

        Without ``cache``: ``tgt`` is the whole prefix; the default ``tgt_mask`` is padding & causal.
        With ``cache``: ``tgt`` holds only the new positions; they attend to everything cached
        before them and causally among themselves; ``memory``/``src_mask`` come from the cache.
        ``src_mask=None`` lets every memory position be attended: pass the source's padding mask
        (``padding_mask(src, pad_id)``, as :meth:`forward` does) when the sources are padded.
        """
        offset = cache.length if cache is not None else 0
        if cache is not None:
            memory, src_mask = cache.memory, cache.src_mask
            tgt_mask = tgt_mask if tgt_mask is not None else _step_mask(tgt.size(1), offset, tgt.device)
        elif tgt_mask is None:
            tgt_mask = target_mask(tgt, self.config.pad_id)
        x = self.tgt_pos(self.tgt_embed(tgt), offset)
        out = self.decoder(x, memory, src_mask, tgt_mask, cache, need_weights)
        if cache is not None:
            cache.length += tgt.size(1)
        return out

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, dict[str, list[Tensor]]]:
        """``src`` ``(B, S)``, ``tgt`` ``(B, T)`` ids -> logits ``(B, T, V_tgt)``.

        With ``return_attention=True`` also returns every layer's attention weights, a dict with
        lists (one ``(B, H, T_q, T_k)`` tensor per layer) under "encoder_self", "decoder_self", "cross".
        """
        if src_mask is None:
            src_mask = padding_mask(src, self.config.pad_id)
        memory = self.encode(src, src_mask, need_weights=return_attention)
        logits = self.generator(self.decode(tgt, memory, src_mask, tgt_mask, need_weights=return_attention))
        return (logits, self.attention_maps()) if return_attention else logits

    def init_cache(self, memory: Tensor, src_mask: Tensor | None) -> DecoderCache:
        """A fresh :class:`DecoderCache` for incremental decoding over ``memory``."""
        return DecoderCache(len(self.decoder.layers), memory, src_mask)

    def attention_maps(self) -> dict[str, list[Tensor]]:
        """The weights kept by the last forward pass run with ``need_weights=True``."""
        return {
            "encoder_self": [layer.last_attention for layer in self.encoder.layers],
            "decoder_self": [layer.last_self_attention for layer in self.decoder.layers],
            "cross": [layer.last_cross_attention for layer in self.decoder.layers],
        }


def _step_mask(new: int, offset: int, device: torch.device) -> Tensor | None:
    """Mask for ``new`` target positions after ``offset`` cached ones: ``(1, 1, new, offset+new)``."""
    if new == 1:
        return None  # a single new position may attend to all earlier ones
    return torch.ones(new, offset + new, dtype=torch.bool, device=device).tril(offset)[None, None]


def _tie_weights(model: Transformer, tie: str) -> None:
    """§3.4: share the target embedding with the generator ("decoder") and the source one ("all")."""
    if tie in ("decoder", "all"):
        model.generator.proj.weight = model.tgt_embed.lut.weight
    if tie == "all":
        model.src_embed.lut.weight = model.tgt_embed.lut.weight


def _init_weights(model: Transformer, config: TransformerConfig) -> None:
    """Xavier uniform on every weight matrix; tied embeddings N(0, d_model^-0.5); pad rows zero."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for embedding in (model.src_embed.lut, model.tgt_embed.lut):
        if config.tie_embeddings == "none":
            nn.init.xavier_uniform_(embedding.weight)
        else:
            nn.init.normal_(embedding.weight, 0.0, config.d_model**-0.5)
        with torch.no_grad():
            embedding.weight[config.pad_id].zero_()


def build_model(config: TransformerConfig) -> Transformer:
    """Assemble the Transformer from the paper's parts, tie weights and initialise them."""
    model = Transformer(config)
    _tie_weights(model, config.tie_embeddings)
    _init_weights(model, config)
    return model


def count_parameters(model: nn.Module) -> int:
    """Number of distinct trainable parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
