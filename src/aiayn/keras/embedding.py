"""Token embeddings scaled by sqrt(d_model) (§3.4) and positional encodings (§3.5), as Keras layers.

The PyTorch boxes are :mod:`aiayn.model.embedding`; the weights have the same shapes (an embedding
``(V, D)``, a learned table ``(max_len, D)``).
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from aiayn.keras.base import BuiltLayer, build_part

POSITIONAL_KINDS = ("sinusoidal", "learned", "none")


def positional_encoding(max_len: int, d_model: int):
    """The sinusoidal table ``(max_len, d_model)``, float32.

    PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).
    Computed once in float64 (NumPy: JAX has no float64 unless asked) and cast, as
    :func:`aiayn.positional_encoding` does, so that both tables are the same numbers.
    """
    position = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)  # (ceil(d/2),)
    angle = position / 10000.0 ** (two_i / d_model)  # (max_len, ceil(d/2))
    table = np.zeros((max_len, d_model), dtype=np.float64)
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return ops.convert_to_tensor(table.astype(np.float32))


class TokenEmbedding(BuiltLayer):
    """Embedding lookup multiplied by sqrt(d_model), as in §3.4.

    ``initializer``: the table's initialiser (:func:`aiayn.keras.build_model` gives the paper's
    choices and zeroes the padding row ``pad_id``).
    """

    def __init__(
        self, vocab_size: int, d_model: int, pad_id: int | None = None, initializer="glorot_uniform", **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.lut = keras.layers.Embedding(vocab_size, d_model, embeddings_initializer=initializer, name="lut")
        self.scale, self.pad_id = math.sqrt(d_model), pad_id

    def build(self, input_shape=None) -> None:
        build_part(self.lut)

    @property
    def embeddings(self):
        """The ``(V, D)`` table (what :class:`~aiayn.keras.transformer.Generator` shares when tied)."""
        return self.lut.embeddings

    def call(self, tokens):
        """``(B, T)`` ids -> ``(B, T, D)``. Like PyTorch's ``padding_idx``, a ``pad_id`` token's
        lookup passes no gradient to its row (which stays as it is unless the row is tied)."""
        vectors = self.lut(tokens)
        if self.pad_id is not None:
            pad = ops.expand_dims(ops.equal(tokens, self.pad_id), -1)
            vectors = ops.where(pad, ops.stop_gradient(vectors), vectors)
        return vectors * self.scale


class PositionalEncoding(BuiltLayer):
    """Adds position information, then dropout (§5.4: "to the sums of the embeddings and the
    positional encodings").

    ``kind``: "sinusoidal" (a constant table, the paper), "learned" (a trained table, the paper's
    Table 3 row E), or "none" (identity apart from dropout).
    """

    def __init__(
        self, d_model: int, max_len: int, kind: str = "sinusoidal", dropout: float = 0.0, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        if kind not in POSITIONAL_KINDS:
            raise ValueError(f"positional: unknown value {kind!r}; valid: {', '.join(POSITIONAL_KINDS)}")
        self.kind, self.max_len, self.d_model = kind, max_len, d_model
        self.dropout = keras.layers.Dropout(dropout)
        self.table = positional_encoding(max_len, d_model) if kind == "sinusoidal" else None  # a constant

    def build(self, input_shape=None) -> None:
        if self.kind == "learned":
            init = keras.initializers.RandomNormal(0.0, self.d_model**-0.5)
            self.table = self.add_weight(shape=(self.max_len, self.d_model), initializer=init, name="table")

    def call(self, x, offset: int = 0, training=None):
        """``x`` ``(B, T, D)`` holding positions ``offset .. offset+T-1``."""
        if self.table is not None:
            end = offset + ops.shape(x)[1]
            if isinstance(end, int) and end > self.max_len:
                raise ValueError(f"sequence of {end} positions exceeds max_len={self.max_len}")
            x = x + ops.cast(self.table[offset:end], x.dtype)
        return self.dropout(x, training=training)
