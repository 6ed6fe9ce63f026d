"""Encoder and decoder stacks, the generator, the Transformer, and :func:`build_model` (§3), in Keras.

The PyTorch boxes are :mod:`aiayn.model.transformer`; :func:`build_model` takes the same
:class:`~aiayn.TransformerConfig` and initialises as :func:`aiayn.build_model` does. Masks: bool,
True = may attend; when ``call``/``encode`` get no mask, they build them from ``config.pad_id``.
"""

from __future__ import annotations

import dataclasses

import keras
from keras import ops

from aiayn.config import TransformerConfig
from aiayn.errors import UserError
from aiayn.keras.attention import KVCache
from aiayn.keras.base import BuiltLayer, build_part
from aiayn.keras.embedding import PositionalEncoding, TokenEmbedding
from aiayn.keras.layers import ACTIVATIONS, DecoderLayer, EncoderLayer
from aiayn.keras.masks import padding_mask, target_mask

#: TransformerConfig fields this port builds from; any other field must keep its default
#: (:func:`check_supported`), so a model setting added to aiayn later is refused, not ignored.
PORTED_FIELDS = frozenset(
    "src_vocab_size tgt_vocab_size d_model n_heads n_encoder_layers n_decoder_layers d_ff dropout "
    "attention_dropout max_len norm_first positional tie_embeddings activation layer_norm_eps "
    "generator_bias pad_id unk_id bos_id eos_id".split()
)


def check_supported(config: TransformerConfig) -> None:
    """A :class:`~aiayn.errors.UserError` (one line naming the setting) for a config this port
    cannot build: an activation it does not know, or a newer model setting away from its default."""
    if config.activation not in ACTIVATIONS:
        raise UserError(
            f"aiayn.keras: activation {config.activation!r} is not ported; valid: {', '.join(ACTIVATIONS)}"
        )
    for field in dataclasses.fields(config):
        if field.name in PORTED_FIELDS:
            continue
        default = (
            field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        )
        value = getattr(config, field.name)
        if value != default:
            raise UserError(f"aiayn.keras: the model setting {field.name}={value!r} is not ported")


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


def _final_norm(config: TransformerConfig):
    """Pre-norm stacks end with a LayerNorm (their layers' outputs are un-normalised)."""
    if not config.norm_first:
        return None
    return keras.layers.LayerNormalization(epsilon=config.layer_norm_eps, name="norm")


def _build_stack(stack) -> None:
    for layer in stack.blocks:
        build_part(layer)
    if stack.norm is not None:
        build_part(stack.norm, (None, stack.d_model))


class Encoder(BuiltLayer):
    """N identical :class:`EncoderLayer` s over already-embedded inputs ``(B, S, D)``."""

    def __init__(self, config: TransformerConfig, **kwargs) -> None:
        super().__init__(**kwargs)
        self.blocks = [
            EncoderLayer(**_layer_kwargs(config), name=f"layers_{i}") for i in range(config.n_encoder_layers)
        ]
        self.norm, self.d_model = _final_norm(config), config.d_model

    def build(self, input_shape=None) -> None:
        _build_stack(self)

    def call(self, x, src_mask=None, training=None):
        """Returns ``memory`` ``(B, S, D)`` and each layer's self-attention weights."""
        maps = []
        for layer in self.blocks:
            x, weights = layer(x, src_mask=src_mask, training=training)
            maps.append(weights)
        return (self.norm(x) if self.norm is not None else x), maps


class DecoderCache:
    """Everything incremental decoding keeps between steps: per decoder layer a growing
    self-attention :class:`KVCache` and a static cross-attention one; the memory and its mask; the
    number of target positions decoded. ``reorder`` selects batch rows."""

    def __init__(self, n_layers: int, memory, src_mask) -> None:
        self.layers = [(KVCache(static=False), KVCache(static=True)) for _ in range(n_layers)]
        self.memory, self.src_mask = memory, src_mask  # (B, S, D), (B, 1, 1, S)
        self.length = 0  # target positions already decoded

    def reorder(self, rows) -> None:
        """Row i of every cached tensor becomes old row ``rows[i]``."""
        for self_cache, cross_cache in self.layers:
            self_cache.reorder(rows)
            cross_cache.reorder(rows)
        self.memory = ops.take(self.memory, rows, axis=0)
        if self.src_mask is not None:
            self.src_mask = ops.take(self.src_mask, rows, axis=0)


class Decoder(BuiltLayer):
    """N identical :class:`DecoderLayer` s over already-embedded target inputs ``(B, T, D)``."""

    def __init__(self, config: TransformerConfig, **kwargs) -> None:
        super().__init__(**kwargs)
        self.blocks = [
            DecoderLayer(**_layer_kwargs(config), name=f"layers_{i}") for i in range(config.n_decoder_layers)
        ]
        self.norm, self.d_model = _final_norm(config), config.d_model

    def build(self, input_shape=None) -> None:
        _build_stack(self)

    def call(self, x, memory, src_mask=None, tgt_mask=None, cache: DecoderCache | None = None, training=None):
        """Returns ``(B, T, D)`` and each layer's self- and cross-attention weights."""
        self_maps, cross_maps = [], []
        for i, layer in enumerate(self.blocks):
            layer_cache = cache.layers[i] if cache is not None else None
            x, self_w, cross_w = layer(
                x, memory, src_mask=src_mask, tgt_mask=tgt_mask, cache=layer_cache, training=training
            )
            self_maps.append(self_w)
            cross_maps.append(cross_w)
        return (self.norm(x) if self.norm is not None else x), self_maps, cross_maps


class Generator(BuiltLayer):
    """The pre-softmax linear projection to the target vocabulary (§3.4), without bias unless ``bias``.

    ``tied``: the target :class:`TokenEmbedding` whose ``(V, D)`` table it shares (§3.4), or None
    for a weight of its own (a ``Dense`` kernel ``(D, V)``). ``bias`` (``generator_bias``: imported
    MarianMT models have one) is the generator's own either way.
    """

    def __init__(
        self, d_model: int, vocab_size: int, tied: TokenEmbedding | None = None, bias: bool = False, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.tied, self.bias, self.has_bias = tied, None, bias
        self.d_model, self.vocab_size = d_model, vocab_size
        self.proj = keras.layers.Dense(vocab_size, use_bias=bias, name="proj") if tied is None else None

    def build(self, input_shape=None) -> None:
        if self.proj is not None:
            build_part(self.proj, (None, self.d_model))
        elif self.has_bias:
            self.bias = self.add_weight(shape=(self.vocab_size,), initializer="zeros", name="bias")

    def call(self, x, log_probs: bool = False):
        """``(B, T, D)`` -> logits (or float32 log-probabilities) ``(B, T, V)``."""
        if self.tied is None:
            logits = self.proj(x)
        else:
            logits = ops.matmul(x, ops.transpose(self.tied.embeddings))
            if self.bias is not None:
                logits = logits + self.bias
        return ops.log_softmax(ops.cast(logits, "float32"), axis=-1) if log_probs else logits


class Transformer(keras.Model):
    """The encoder-decoder Transformer as a Keras model. Build it with :func:`build_model`.

    ``model(src, tgt)`` gives the logits ``(B, T, V)``; ``model(src, tgt, return_attention=True)``
    also every layer's attention weights, ``{"encoder_self" | "decoder_self" | "cross": [one
    (B, H, T_q, T_k) tensor per layer]}``. ``model((src, tgt))`` is the same call (what ``fit`` makes).
    """

    def __init__(self, config: TransformerConfig, **kwargs) -> None:
        super().__init__(**kwargs)
        check_supported(config)
        self.config = config
        d, tie = config.d_model, config.tie_embeddings
        embed_init = "glorot_uniform" if tie == "none" else keras.initializers.RandomNormal(0.0, d**-0.5)
        pad = config.pad_id
        self.tgt_embed = TokenEmbedding(config.tgt_vocab_size, d, pad, embed_init, name="tgt_embed")
        if tie == "all":
            self.src_embed = self.tgt_embed  # one table (§3.4): one shared vocabulary
        else:
            self.src_embed = TokenEmbedding(config.src_vocab_size, d, pad, embed_init, name="src_embed")
        self.src_pos = PositionalEncoding(
            d, config.max_len, config.positional, config.dropout, name="src_pos"
        )
        self.tgt_pos = PositionalEncoding(
            d, config.max_len, config.positional, config.dropout, name="tgt_pos"
        )
        self.encoder = Encoder(config, name="encoder")
        self.decoder = Decoder(config, name="decoder")
        tied = self.tgt_embed if tie in ("decoder", "all") else None
        bias = getattr(config, "generator_bias", False)  # a field of newer configs (MarianMT imports)
        self.generator = Generator(d, config.tgt_vocab_size, tied, bias, name="generator")
        self.build()  # every weight now, in its place (see BuiltLayer)

    def build(self, input_shape=None) -> None:
        parts = (self.tgt_embed, self.src_embed, self.src_pos, self.tgt_pos, self.encoder, self.decoder)
        for part in (*parts, self.generator):
            build_part(part)

    def encode(self, src, src_mask=None, training=None, return_attention: bool = False):
        """``src`` ``(B, S)`` ids -> ``memory`` ``(B, S, D)`` (and the encoder's weights)."""
        if src_mask is None:
            src_mask = padding_mask(src, self.config.pad_id)
        x = self.src_pos(self.src_embed(src), training=training)
        memory, maps = self.encoder(x, src_mask=src_mask, training=training)
        return (memory, maps) if return_attention else memory

    def decode(
        self,
        tgt,
        memory,
        src_mask=None,
        tgt_mask=None,
        cache: DecoderCache | None = None,
        training=None,
        return_attention: bool = False,
    ):
        """Decoder states ``(B, T, D)`` for target inputs ``tgt`` ``(B, T)``.

        Without ``cache``: ``tgt`` is the whole prefix; the default ``tgt_mask`` is padding & causal.
        With ``cache``: ``tgt`` holds the new positions only (one per step); ``memory``/``src_mask``
        come from the cache.
        """
        offset = cache.length if cache is not None else 0
        if cache is not None:
            memory, src_mask = cache.memory, cache.src_mask
            if tgt_mask is None and ops.shape(tgt)[1] != 1:
                raise ValueError("decoding on a cache feeds one new position per call")
        elif tgt_mask is None:
            tgt_mask = target_mask(tgt, self.config.pad_id)
        x = self.tgt_pos(self.tgt_embed(tgt), offset=offset, training=training)
        out, self_maps, cross_maps = self.decoder(
            x, memory, src_mask=src_mask, tgt_mask=tgt_mask, cache=cache, training=training
        )
        if cache is not None:
            cache.length += ops.shape(tgt)[1]
        return (out, self_maps, cross_maps) if return_attention else out

    def call(
        self, src, tgt=None, src_mask=None, tgt_mask=None, return_attention: bool = False, training=None
    ):
        """``src`` ``(B, S)``, ``tgt`` ``(B, T)`` ids -> logits ``(B, T, V_tgt)`` (see the class)."""
        if tgt is None:  # model((src, tgt)), as fit calls it
            if not isinstance(src, (tuple, list)) or len(src) != 2:
                raise ValueError("the model takes source and target ids: model(src, tgt), model((src, tgt))")
            src, tgt = src
        if src_mask is None:
            src_mask = padding_mask(src, self.config.pad_id)
        memory, enc_maps = self.encode(src, src_mask, training=training, return_attention=True)
        out, self_maps, cross_maps = self.decode(
            tgt, memory, src_mask, tgt_mask, training=training, return_attention=True
        )
        logits = self.generator(out)
        if not return_attention:
            return logits
        return logits, {"encoder_self": enc_maps, "decoder_self": self_maps, "cross": cross_maps}

    def init_cache(self, memory, src_mask) -> DecoderCache:
        """A fresh :class:`DecoderCache` for incremental decoding over ``memory``."""
        return DecoderCache(self.config.n_decoder_layers, memory, src_mask)


def build_model(config: TransformerConfig) -> Transformer:
    """The Transformer of ``config``, initialised as :func:`aiayn.build_model` initialises it:
    Xavier-uniform weight matrices and zero biases, tied embeddings N(0, d_model^-0.5), untied ones
    Xavier-uniform, learned positions N(0, d_model^-0.5), the padding rows of the embeddings zero.
    (``keras.utils.set_random_seed`` makes it repeat.)"""
    model = Transformer(config)
    for embed in {id(e): e for e in (model.src_embed, model.tgt_embed)}.values():
        table = embed.embeddings
        rows = ops.expand_dims(ops.arange(ops.shape(table)[0]) != config.pad_id, 1)
        table.assign(ops.where(rows, table, ops.zeros_like(table)))
    return model


def count_parameters(model: keras.Model) -> int:
    """Number of distinct trainable parameters (tied weights counted once)."""
    return int(sum(int(ops.size(w)) for w in model.trainable_weights))
