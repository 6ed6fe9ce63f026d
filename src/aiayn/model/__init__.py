"""The paper's boxes: embeddings, positional encoding, attention, layers, stacks, Transformer."""

from aiayn.model.attention import KVCache, MultiHeadAttention, scaled_dot_product_attention
from aiayn.model.embedding import PositionalEncoding, TokenEmbedding, positional_encoding
from aiayn.model.layers import DecoderLayer, EncoderLayer, PositionwiseFeedForward, Residual
from aiayn.model.masks import causal_mask, padding_mask, target_mask
from aiayn.model.transformer import (
    Decoder,
    DecoderCache,
    Encoder,
    Generator,
    Transformer,
    build_model,
    count_parameters,
)

__all__ = [
    "KVCache",
    "MultiHeadAttention",
    "scaled_dot_product_attention",
    "PositionalEncoding",
    "TokenEmbedding",
    "positional_encoding",
    "DecoderLayer",
    "EncoderLayer",
    "PositionwiseFeedForward",
    "Residual",
    "causal_mask",
    "padding_mask",
    "target_mask",
    "Decoder",
    "DecoderCache",
    "Encoder",
    "Generator",
    "Transformer",
    "build_model",
    "count_parameters",
]
