"""Word alignments from the model's own cross-attention (as Garg et al., 2019, "Jointly Learning to
Align and Translate with Transformer Models", read them: one decoder layer's attention, its heads
averaged). The layer is the last: on a Multi30k de->en model (3 decoder layers) it placed inline tags
best of the three (``benchmarks/documents.py --layers``; the record is in ``benchmarks/README.md``).

After the search, the source and its translation go through the model once more (teacher-forced,
the decoder with ``need_weights=True``, no generator: the logits over the vocabulary would cost as
much as the rest). Target piece ``t`` is aligned by the cross-attention row of the step that
*predicted* it (the decoder reading the piece before it), as CTranslate2's ``return_attention``
gives it, so that both engines align alike. Pieces are merged into words as SentencePiece marks
them: a piece starting with ``▁`` starts a word. A target word's rows are summed, as are a source
word's columns (the source's EOS column is left out), and each target word is linked to the source
word it attends to most: one ``(source word, target word)`` pair per target word, sorted.
``benchmarks/documents.py`` measures the layer on where inline tags land.

Words are ``str.split()`` words on both sides: a pair ``(i, j)`` says that source word ``i`` is
aligned to target word ``j`` (Moses' ``i-j``, :func:`moses`). This module holds the alignment's
vocabulary for every layer: pairs, their bounds (:func:`clamp_pairs`), their shift over joined
texts (:func:`joined_alignment`) and their text form.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch
from torch import Tensor

from aiayn.model.masks import padding_mask

WORD_START = "\u2581"  # SentencePiece's "▁": the piece starts a new word
Pairs = tuple[tuple[int, int], ...]


class Aligned(Protocol):
    """A translated text and its word alignment (as :class:`aiayn.decode.request.Translation`)."""

    text: str
    alignment: Pairs


def word_starts(pieces: Sequence[str]) -> list[int]:
    """The word index of each piece (a piece starting with ``▁`` starts a word; the first piece
    starts one in any case)."""
    index, out = -1, []
    for k, piece in enumerate(pieces):
        if k == 0 or piece.startswith(WORD_START):
            index += 1
        out.append(index)
    return out


def alignment_layer(n_layers: int) -> int:
    """The decoder layer whose cross-attention aligns: the last (CTranslate2's default too)."""
    return n_layers - 1


def word_alignment(weights: Tensor, source_pieces: Sequence[str], target_pieces: Sequence[str]) -> Pairs:
    """``(source word, target word)`` pairs from ``weights`` ``(T, S)``: row ``t`` the attention of
    the step that predicted ``target_pieces[t]``, column ``s`` source piece ``s`` (no EOS column)."""
    if not source_pieces or not target_pieces:
        return ()
    src_words, tgt_words = word_starts(source_pieces), word_starts(target_pieces)
    weights = weights[: len(target_pieces), : len(source_pieces)].double()
    by_source = torch.zeros(weights.size(0), src_words[-1] + 1, dtype=weights.dtype)
    by_source.index_add_(1, torch.tensor(src_words), weights)  # (T, source words)
    by_word = torch.zeros(tgt_words[-1] + 1, by_source.size(1), dtype=weights.dtype)
    by_word.index_add_(0, torch.tensor(tgt_words), by_source)  # (target words, source words)
    best = by_word.argmax(dim=1).tolist()
    return tuple(sorted((i, j) for j, i in enumerate(best)))


@torch.inference_mode()
def cross_attention(model, src: Tensor, outputs: Sequence[Sequence[int]], layer: int) -> list[Tensor]:
    """For each row of ``src`` ``(B, S)`` (ids with EOS, right-padded) and its output tokens (no
    BOS/EOS): the heads' mean of ``layer``'s cross-attention, ``(len(tokens), S)``, row ``t`` the step
    that predicted token ``t``."""
    config = model.config
    length = min(max((len(tokens) for tokens in outputs), default=0) + 1, config.max_len)
    tgt = torch.full((len(outputs), length), config.pad_id, dtype=torch.long)
    for row, tokens in enumerate(outputs):
        ids = [config.bos_id, *tokens][:length]
        tgt[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    src_mask = padding_mask(src, config.pad_id)
    memory = model.encode(src, src_mask)  # the fused path: only the decoder's weights are read
    model.decode(tgt.to(src.device), memory, src_mask, need_weights=True)  # no generator: no logits
    mean = model.attention_maps()["cross"][layer].float().mean(dim=1).cpu()  # (B, T, S)
    return [mean[row, : min(len(tokens), length)] for row, tokens in enumerate(outputs)]


def clamp_pairs(pairs: Pairs, source_words: int, target_words: int) -> Pairs:
    """``pairs`` within the texts' words: pieces and ``str.split()`` words can disagree at the edges
    (a normalised character, an unknown piece decoded with spaces), so an index past the last word
    is read as the last word."""
    if not source_words or not target_words:
        return ()
    return tuple(sorted({(min(i, source_words - 1), min(j, target_words - 1)) for i, j in pairs}))


def joined_alignment(sources: Sequence[str], translations: Sequence[Aligned]) -> Pairs:
    """The alignment of ``sources`` and of their ``translations``, each joined with whitespace: every
    pair shifted by the words of the texts before it."""
    pairs, source, target = [], 0, 0
    for text, translation in zip(sources, translations):
        pairs.extend((source + i, target + j) for i, j in translation.alignment)
        source, target = source + len(text.split()), target + len(translation.text.split())
    return tuple(pairs)


def moses(pairs: Pairs) -> str:
    """An alignment in Moses' format: ``0-0 1-2 ...``."""
    return " ".join(f"{i}-{j}" for i, j in pairs)
