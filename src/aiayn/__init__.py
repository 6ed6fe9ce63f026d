"""aiayn: the encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017)."""

from aiayn.config import TransformerConfig

__version__ = "0.1.0"
__all__ = ["TransformerConfig", "__version__"]
