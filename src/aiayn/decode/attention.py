"""What the model attends to for one sentence: the search's translation (from a prefix, with a
glossary: the options' and :class:`~aiayn.decode.Translator`'s), then one forward pass with
``return_attention=True`` over the source and that translation (the model's own ``need_weights``
path), every layer and head of encoder self-, decoder self- and cross-attention, and the probability
the model gave each piece of the translation in that pass."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from aiayn.decode.request import Line
from aiayn.decode.search import DecodeOptions
from aiayn.decode.translator import Translator


@dataclass
class SentenceAttention:
    """Pieces and weights of one sentence; ``maps[kind][layer]`` is ``(H, T_q, T_k)``, rows queries.

    ``source_pieces`` are the encoder's input (EOS last), ``target_pieces`` the decoder's input
    (BOS first): the piece each target position reads; ``predicted_pieces`` the piece each target
    position predicts (the translation's pieces, EOS last), one place on. An alignment reads target
    rows by what they predict (:func:`aiayn.plots.plot_attention` labels them so by default).
    ``probabilities``: of each predicted piece, given the source and the pieces before it.
    """

    source_pieces: list[str]
    target_pieces: list[str]
    translation: str
    score: float
    maps: dict[str, list[Tensor]]
    predicted_pieces: list[str]
    probabilities: list[float] = field(default_factory=list)


def sentence_attention(
    model,
    tokenizer,
    text: str,
    options: DecodeOptions,
    *,
    device="cpu",
    target: str | None = None,
    prefix: str = "",
) -> SentenceAttention:
    """What each head attended to for ``text`` and its translation: the best hypothesis of a search
    with ``options`` (starting with ``prefix``), or ``target`` when given (then scored NaN: no search
    ran)."""
    translator = Translator(model, tokenizer, device, options=replace(options, nbest=1, scores=True))
    src_ids = translator.encode_source(text)
    if target is None and text.strip():
        best = translator.hypotheses([Line(text, prefix)])[0][0]
        tokens, translation, score = best.tokens, translator.text(best, prefix), best.score
    else:
        target = target or ""
        tokens, translation, score = tokenizer.encode(target, target=True), target, float("nan")
    tgt_ids = [model.config.bos_id, *tokens][: model.config.max_len]
    predicted = [*tokens, model.config.eos_id][: len(tgt_ids)]  # position t reads tgt_ids[t]
    with torch.inference_mode():
        src = torch.tensor([src_ids], device=device)  # (1, S)
        log_probs, maps = model(src, torch.tensor([tgt_ids], device=device), return_attention=True)
        chosen = (
            log_probs[0]
            .float()
            .log_softmax(dim=-1)
            .gather(-1, torch.tensor(predicted, device=device)[:, None])
        )
    source = [tokenizer.id_to_piece(i) for i in src_ids]
    target, after = ([tokenizer.id_to_piece(i, target=True) for i in ids] for ids in (tgt_ids, predicted))
    heads = {kind: [m[0].float().cpu() for m in layers] for kind, layers in maps.items()}  # (H, T_q, T_k)
    probabilities = chosen[:, 0].exp().cpu().tolist()
    return SentenceAttention(source, target, translation, score, heads, after, probabilities)
