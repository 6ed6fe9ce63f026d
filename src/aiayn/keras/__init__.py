"""The paper's model in Keras 3: the boxes of :mod:`aiayn.model` as Keras layers, weight for weight.

Written with ``keras.ops`` only, so the same layers run on PyTorch, JAX or TensorFlow (the backend
is Keras's choice: ``KERAS_BACKEND`` before ``import keras``). Install with ``pip install -e '.[keras]'``.

    >>> import aiayn.keras as ak
    >>> model, tokenizer, config = ak.load("aiayn_demo/run")               # doctest: +SKIP
    >>> logits, maps = model(src, tgt, return_attention=True)              # doctest: +SKIP
    >>> ak.translate(model, tokenizer, ["907042"])                          # doctest: +SKIP

``docs/keras.md`` walks through it beside the PyTorch boxes of ``docs/paper.md``.
"""

from aiayn.keras.attention import KVCache, MultiHeadAttention, scaled_dot_product_attention
from aiayn.keras.decode import greedy_search, translate
from aiayn.keras.embedding import PositionalEncoding, TokenEmbedding, positional_encoding
from aiayn.keras.layers import DecoderLayer, EncoderLayer, PositionwiseFeedForward, Residual
from aiayn.keras.masks import causal_mask, padding_mask, target_mask
from aiayn.keras.plots import plot_positional_encoding
from aiayn.keras.train import LabelSmoothedCrossEntropy, NoamSchedule, TranslationBatches, paper_adam
from aiayn.keras.transformer import (
    Decoder,
    DecoderCache,
    Encoder,
    Generator,
    Transformer,
    build_model,
    check_supported,
    count_parameters,
)
from aiayn.keras.weights import KerasLoaded, from_torch, load, save, to_torch

__all__ = [
    "KVCache",
    "MultiHeadAttention",
    "scaled_dot_product_attention",
    "greedy_search",
    "translate",
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
    "plot_positional_encoding",
    "LabelSmoothedCrossEntropy",
    "NoamSchedule",
    "TranslationBatches",
    "paper_adam",
    "Decoder",
    "DecoderCache",
    "Encoder",
    "Generator",
    "Transformer",
    "build_model",
    "check_supported",
    "count_parameters",
    "KerasLoaded",
    "from_torch",
    "load",
    "save",
    "to_torch",
]
