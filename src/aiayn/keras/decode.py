"""Greedy search on the key/value cache, in ``keras.ops``, and text in, text out.

The same conventions as :mod:`aiayn.decode` (``aiayn translate --beam 1``), so that the tokens are
the same: the source is ``ids + [EOS]``; sentence i may generate at most ``floor(a * S_i + b)``
tokens before its EOS (S_i counts its EOS; capped at ``max_len - 1``), where EOS is forced; PAD and
BOS are never generated; ties go to the lowest id (``argmax``); a finished sentence leaves the
batch. Each step feeds only the newest token: the decoder's self-attention keys/values grow in
:class:`~aiayn.keras.attention.KVCache` s, and the memory's are projected once.
(Beam search stays in :mod:`aiayn.decode`: translate a saved checkpoint with ``aiayn translate``.)
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from keras import ops

from aiayn.data.batching import pad, token_batches
from aiayn.decode.translator import LINE_BREAKS
from aiayn.errors import Warn, warning
from aiayn.keras.masks import padding_mask
from aiayn.keras.transformer import Transformer


def max_output_lengths(
    src_lengths: Sequence[int], max_len_a: float, max_len_b: float, max_len: int
) -> list[int]:
    """Most tokens each output may have before its EOS: ``floor(a * S + b)``, at most ``max_len - 1``."""
    return [int(min(max(math.floor(n * max_len_a + max_len_b), 0), max_len - 1)) for n in src_lengths]


def greedy_search(model: Transformer, src, max_len_a: float = 1.0, max_len_b: float = 50) -> list[list[int]]:
    """The argmax token at each step for a padded source batch ``src`` ``(B, S)`` (ids + EOS);
    returns each sentence's tokens without BOS and EOS."""
    config = model.config
    src = ops.convert_to_tensor(np.asarray(src), dtype="int32")
    src_mask = padding_mask(src, config.pad_id)  # (B, 1, 1, S)
    lengths = ops.convert_to_numpy(ops.sum(ops.cast(src_mask, "int32"), axis=(1, 2, 3))).tolist()
    max_lens = max_output_lengths(lengths, max_len_a, max_len_b, config.max_len)
    cache = model.init_cache(model.encode(src, src_mask), src_mask)
    never = np.zeros(config.tgt_vocab_size, dtype=bool)  # PAD and BOS are never generated
    never[[config.pad_id, config.bos_id]] = True
    not_eos = np.ones(config.tgt_vocab_size, dtype=bool)
    not_eos[config.eos_id] = False
    active = list(range(len(lengths)))  # sentences still decoding, in the cache's row order
    tokens: list[list[int]] = [[] for _ in active]
    last = ops.full((len(active), 1), config.bos_id, dtype="int32")  # (n, 1)
    while active:
        states = model.decode(last, None, cache=cache)  # (n, 1, D)
        logits = model.generator(states)[:, 0]  # (n, V)
        forced = np.array([len(tokens[i]) >= max_lens[i] for i in active])[:, None]  # (n, 1)
        blocked = ops.convert_to_tensor(never[None, :] | (forced & not_eos[None, :]))  # (n, V)
        chosen = ops.argmax(ops.where(blocked, float("-inf"), ops.cast(logits, "float32")), axis=-1)  # (n,)
        keep = []
        for row, (i, token) in enumerate(zip(active, ops.convert_to_numpy(chosen).tolist())):
            if token != config.eos_id:
                tokens[i].append(token)
                keep.append(row)
        if len(keep) < len(active):
            active = [active[row] for row in keep]
            if not active:
                break
            rows = ops.convert_to_tensor(np.array(keep, dtype=np.int32))
            cache.reorder(rows)
            chosen = ops.take(chosen, rows, axis=0)
        last = ops.cast(ops.expand_dims(chosen, 1), "int32")
    return tokens


def translate(
    model: Transformer,
    tokenizer,
    lines: Sequence[str],
    *,
    batch_tokens: int = 4096,
    max_len_a: float = 1.0,
    max_len_b: float = 50,
    warn: Warn = warning,
) -> list[str]:
    """Greedy translations of ``lines``, one per line, as :class:`aiayn.decode.Translator` with
    ``beam=1`` gives them: a blank line gives a blank line; a source longer than ``max_len`` is
    truncated with a warning naming its line; sentences are decoded in batches of at most
    ``batch_tokens`` padded source tokens, sorted by length; outputs keep the input order."""
    config, limit = model.config, model.config.max_len - 1
    sources = {}
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        ids = tokenizer.encode(line)
        if len(ids) > limit:
            warn(
                f"line {number + 1}: source has {len(ids) + 1} tokens, more than max_len={limit + 1}; "
                "truncated"
            )
            ids = ids[:limit]
        sources[number] = ids + [config.eos_id]
    outputs = ["" for _ in lines]
    for batch in token_batches({i: len(ids) for i, ids in sources.items()}, batch_tokens):
        src = pad([sources[i] for i in batch], config.pad_id).numpy()  # (B, S)
        for i, tokens in zip(batch, greedy_search(model, src, max_len_a, max_len_b)):
            outputs[i] = LINE_BREAKS.sub(" ", tokenizer.decode(tokens))
    return outputs
