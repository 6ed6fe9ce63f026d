"""The model's other choices at one place of a translation: the ``k`` most probable next pieces
after a target prefix (the words before that place), with their probabilities, for a person who
picks one and has the rest decoded again from there (``prefix`` of the searches).

One teacher-forced pass of the decoder over ``[BOS] + prefix``; the probabilities are the softmax
over the whole vocabulary at the last position, so the ``k`` shown and ``rest`` (everything else,
PAD and BOS included: they are never produced) sum to one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aiayn.decode.align import WORD_START
from aiayn.decode.translator import Translator, with_prefix
from aiayn.model.masks import padding_mask


@dataclass(frozen=True)
class Choice:
    """One next piece: its id and piece, ``text`` (the piece as it reads: a word start as a space),
    ``probability``, and ``prefix``: the given prefix continued by it (send it back as the prefix to
    have the rest decoded; "" with ``end``)."""

    token: int
    piece: str
    text: str
    probability: float
    prefix: str
    end: bool = False  # the piece is EOS: the translation ends here


@dataclass(frozen=True)
class Choices:
    choices: list[Choice]
    rest: float  # the probability of every other piece


def next_choices(model, tokenizer, text: str, prefix: str, k: int = 5, device="cpu") -> Choices:
    """The ``k`` most probable pieces after ``prefix`` in the translation of ``text`` (one sentence),
    most probable first (ties: the lower id)."""
    config = model.config
    translator = Translator(model, tokenizer, device)
    ids = tokenizer.encode(prefix, target=True)[: config.max_len - 1] if prefix.strip() else []
    src = torch.tensor([translator.encode_source(text)], device=device)  # (1, S)
    tgt = torch.tensor([[config.bos_id, *ids]], device=device)  # (1, T)
    with torch.inference_mode():
        mask = padding_mask(src, config.pad_id)
        states = model.decode(tgt, model.encode(src, mask), mask)[:, -1:]  # (1, 1, D)
        probs = model.generator(states, log_probs=True)[0, 0].float().exp().cpu()  # (V,)
    chosen = probs.clone()
    chosen[[config.pad_id, config.bos_id]] = -1.0  # never produced: left to the rest
    values, tokens = torch.sort(chosen, descending=True, stable=True)
    picks = [
        _choice(tokenizer, config, ids, prefix, int(t), float(p)) for t, p in zip(tokens[:k], values[:k])
    ]
    return Choices(picks, max(0.0, 1.0 - sum(c.probability for c in picks)))


def _choice(tokenizer, config, ids: list[int], prefix: str, token: int, probability: float) -> Choice:
    piece = tokenizer.id_to_piece(token, target=True)
    if token == config.eos_id:
        return Choice(token, piece, "", probability, prefix, end=True)
    continued = with_prefix(tokenizer.decode([*ids, token]), prefix, tokenizer)
    return Choice(token, piece, piece.replace(WORD_START, " "), probability, continued)
