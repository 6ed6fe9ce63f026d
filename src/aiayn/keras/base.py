"""The base of the port's layers: weight shapes from the config, built top down."""

from __future__ import annotations

import keras


class BuiltLayer(keras.layers.Layer):
    """A Keras layer whose weight shapes come from the config, not from a first input.

    ``__init__`` makes the sublayers; ``build`` builds them (:func:`build_part`) and makes the
    layer's own weights, inside the layer's name scope, so that every weight has a path of its own
    (``transformer/encoder/layers_0/self_attn/in_proj/kernel``). :class:`~aiayn.keras.Transformer`
    builds itself, hence everything, at the end of its ``__init__``, so that a checkpoint's weights
    can be assigned before any call; a layer used on its own is built by Keras at its first call.
    Built the way Keras builds, the weights are also the PyTorch backend's module parameters, whose
    gradients ``fit`` clears before every step.
    """

    def build(self, input_shape=None) -> None:
        """Build the sublayers and make the weights (subclasses); ``input_shape`` is not needed."""


def build_part(layer: keras.layers.Layer, input_shape=None) -> None:
    """Build ``layer`` (once: a tied embedding is a part of two owners) for ``input_shape``."""
    if not layer.built:
        layer.build(input_shape)
