"""aiayn: the encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

>>> import aiayn
>>> config = aiayn.TransformerConfig.preset("small", src_vocab_size=8000, tgt_vocab_size=8000)
>>> model = aiayn.build_model(config)

A trained model: ``model, tokenizer, config = aiayn.load("runs/de_en")``.
"""

from aiayn.config import TransformerConfig
from aiayn.loading import LoadedModel, load
from aiayn.model import Transformer, build_model, count_parameters, positional_encoding
from aiayn.model.masks import causal_mask, padding_mask, target_mask

__version__ = "0.1.0"
__all__ = [
    "load",
    "LoadedModel",
    "TransformerConfig",
    "Transformer",
    "build_model",
    "count_parameters",
    "positional_encoding",
    "causal_mask",
    "padding_mask",
    "target_mask",
    "__version__",
]
