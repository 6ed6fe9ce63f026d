"""``python -m aiayn.keras.parity``: this port against :mod:`aiayn.model` on whatever backend Keras
runs on (``KERAS_BACKEND``), for every combination of the model's options, printed as JSON.

For each combination (post/pre-norm, each activation, each kind of positions, each tying mode) a
small PyTorch model is built with random weights, copied into the Keras model, and both are run on
the same padded batch: the logits (the plain call and the one returning attention), every layer's
and head's attention weights, and the greedy tokens (the KV-cache search of each side, up to the
source's length, so that the sentences end at different steps).
The suite runs :func:`check` on the torch backend in its own process and this command under JAX
and TensorFlow in subprocesses when they are installed; ``benchmarks/keras_backends.py`` records it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from typing import Any

import keras
import numpy as np
import torch
from keras import ops

from aiayn.config import ACTIVATIONS, POSITIONAL_KINDS, TIE_KINDS, TransformerConfig
from aiayn.decode import DecodeOptions, generate
from aiayn.keras.decode import greedy_search
from aiayn.keras.weights import from_torch
from aiayn.model import build_model as build_torch_model

#: Every option of aiayn.model's config that changes the computation, with every value it takes.
OPTIONS: dict[str, tuple] = {
    "norm_first": (False, True),
    "activation": tuple(ACTIVATIONS),
    "positional": tuple(POSITIONAL_KINDS),
    "tie_embeddings": tuple(TIE_KINDS),
    **({"generator_bias": (False, True)} if "generator_bias" in TransformerConfig.field_names() else {}),
}
VOCAB = 40


def combinations() -> list[dict[str, Any]]:
    """Every combination of :data:`OPTIONS`."""
    return [dict(zip(OPTIONS, values)) for values in itertools.product(*OPTIONS.values())]


def _pairs(options: dict[str, Any]) -> set[tuple]:
    return {((a, options[a]), (b, options[b])) for a, b in itertools.combinations(options, 2)}


def pairwise_combinations() -> list[dict[str, Any]]:
    """A few combinations in which every value of every option meets every value of every other
    option at least once (chosen greedily, always the same): what the suite checks in-process; the
    command checks them all."""
    todo = set().union(*(_pairs(c) for c in combinations()))
    chosen = []
    while todo:
        best = max(combinations(), key=lambda c: len(_pairs(c) & todo))  # the first of the best
        chosen.append(best)
        todo -= _pairs(best)
    return chosen


def tiny_config(**options: Any) -> TransformerConfig:
    """1 encoder and 2 decoder layers of width 16, 2 heads, no dropout, a 40-token vocabulary."""
    return TransformerConfig(
        src_vocab_size=VOCAB,
        tgt_vocab_size=VOCAB,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=2,
        d_ff=32,
        dropout=0.0,
        max_len=32,
        **options,
    )


def batch(config: TransformerConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded source batch (ids + EOS) and a padded target batch (BOS + ids), 3 sentences."""
    rng = np.random.default_rng(seed)
    src = rng.integers(4, VOCAB, (3, 7))
    src[:, -1], src[0, 4], src[0, 5:] = config.eos_id, config.eos_id, config.pad_id
    tgt = rng.integers(4, VOCAB, (3, 5))
    tgt[:, 0], tgt[1, 3:] = config.bos_id, config.pad_id
    return torch.from_numpy(src), torch.from_numpy(tgt)


def _difference(a, b: torch.Tensor) -> float:
    return float(np.max(np.abs(np.asarray(ops.convert_to_numpy(a)) - b.detach().numpy())))


def check(options: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """The largest differences between the two models for one combination of ``options``."""
    config = tiny_config(**options)
    torch.manual_seed(seed)
    reference = build_torch_model(config).eval()
    with torch.no_grad():  # biases 0 and LayerNorm's (1, 0) would hide a weight put in the wrong place
        for name, weight in reference.named_parameters():
            if weight.dim() == 1:
                weight.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.5)
    model = from_torch(reference)
    src, tgt = batch(config, seed)
    with torch.no_grad():
        logits = reference(src, tgt)  # PyTorch's fused attention
        logits_maps, maps = reference(src, tgt, return_attention=True)  # the written-out formula
        # at most S tokens: sentence 0 (5 source tokens) ends first and leaves the batch (the cache's rows)
        greedy = generate(reference, src, DecodeOptions(beam=1, max_len_a=1.0, max_len_b=0))
    ours = model(src.numpy(), tgt.numpy())
    ours_maps_logits, ours_maps = model(src.numpy(), tgt.numpy(), return_attention=True)
    attention = max(
        _difference(a, b) for kind in maps for a, b in zip(ours_maps[kind], maps[kind], strict=True)
    )
    tokens = greedy_search(model, src.numpy(), max_len_a=1.0, max_len_b=0)
    return {
        **options,
        "logits": _difference(ours, logits),
        "logits_with_attention": _difference(ours_maps_logits, logits_maps),
        "attention": attention,
        "maps": {kind: len(layers) for kind, layers in ours_maps.items()},
        "greedy_equal": tokens == [h[0].tokens for h in greedy],
    }


def report(seed: int = 0, pairwise: bool = False) -> dict[str, Any]:
    """:func:`check` for every combination (``pairwise``: for :func:`pairwise_combinations`), with
    the backend and its version."""
    results = [check(options, seed) for options in (pairwise_combinations() if pairwise else combinations())]
    return {
        "backend": keras.backend.backend(),
        "backend_version": _backend_version(keras.backend.backend()),
        "keras": keras.__version__,
        "combinations": len(results),
        "max_logits_difference": max(max(r["logits"], r["logits_with_attention"]) for r in results),
        "max_attention_difference": max(r["attention"] for r in results),
        "greedy_equal": all(r["greedy_equal"] for r in results),
        "results": results,
    }


def _backend_version(name: str) -> str:
    module = {"torch": "torch", "jax": "jax", "tensorflow": "tensorflow"}.get(name, name)
    return getattr(sys.modules.get(module), "__version__", "unknown")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aiayn.keras.parity", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pairwise", action="store_true", help="only the pairwise combinations")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # tiny models: one thread is the fastest
    print(json.dumps(report(args.seed, args.pairwise), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
