"""Documents in, documents out: each document is parsed by its format into sentences, the sentences of
all the documents are translated in one stream of token-bounded batches (the backend sorts them by
length), and each document is rebuilt around its translations.

    >>> translator = DocumentTranslator(load_backend("runs/de_en"), language="de")  # doctest: +SKIP
    >>> translator.translate(["Ein Hund läuft. Zwei Männer spielen."], DecodeOptions())[0].text
    ... # doctest: +SKIP

Nothing is cut: a sentence longer than the model takes is split further (:mod:`aiayn.documents.fit`),
its pieces translated and joined with a space, and one warning names the place only when the split
had to fall outside clause punctuation. The model sees each sentence with its whitespace runs (line
breaks inside a sentence among them) as single spaces.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from aiayn.decode.search import DecodeOptions
from aiayn.decode.translator import Scored
from aiayn.documents.fit import fit, source_limit
from aiayn.documents.html import parse_html
from aiayn.documents.markdown import parse_markdown
from aiayn.documents.segment import Segmenter, segmenter_for
from aiayn.documents.text import TextDocument, parse_text, whole
from aiayn.documents.types import FORMATS, Aligned, Parsed, Warn, joined_alignment
from aiayn.errors import UserError

Pairs = tuple[tuple[int, int], ...]


def _warning(message: str) -> None:
    print(f"aiayn: warning: {message}", file=sys.stderr)


@dataclass
class DocumentResult:
    """One translated document."""

    text: str  #: the translated document (whitespace, structure and markup kept)
    score: float  #: the mean of its sentences' scores (NaN where none was computed, 0.0 when empty)
    #: text format: the n-best ``(score, text)``, best first: the k-th holds each sentence's k-th
    #: hypothesis (its last where it has fewer), as many as its sentence with the most has
    nbest: list[tuple[float, str]] = field(default_factory=list)
    sentences: list[tuple[str, str]] = field(default_factory=list)  #: (source sentence, its translation)
    alignment: Pairs = ()  #: text format with alignments: over ``document.split()`` / ``text.split()``
    #: with confidence: each sentence's translation and confidence (:class:`~aiayn.decode.translator.Scored`)
    scored: list[Scored] = field(default_factory=list)

    @property
    def confidence(self) -> float:
        """The mean log-probability of the document's tokens (with confidence; 0.0 when empty)."""
        return _weighted(self.scored)

    @property
    def words(self) -> list[tuple[str, float]]:
        """Each translated word with its probability, sentence after sentence (with confidence)."""
        return [word for scored in self.scored for word in scored.words]

    @property
    def alternatives(self) -> list[str]:
        """The 2nd..n-th best texts (text format)."""
        return [text for _, text in self.nbest[1:]]


@dataclass
class _Sentence:
    """A sentence of some document and what the stream gave it."""

    text: str  # whitespace runs as single spaces
    pieces: list[int]  # indices of its pieces in the stream
    nbest: list[tuple[float, str]] = field(default_factory=list)
    aligned: Aligned = Aligned("")
    scored: Scored | None = None


class DocumentTranslator:
    """Translate whole documents with a backend (:mod:`aiayn.decode.backends`).

    ``language``: the source language, for its sentence segmenter (None or one it does not know: a
    language-neutral rule, said once through ``warn`` when it first splits a text). ``split=False``
    takes each document (each line, in ``aiayn translate``'s default mode) as one sentence, for
    sentence-per-line test sets.
    """

    def __init__(
        self,
        backend,
        *,
        language: str | None = None,
        split: bool = True,
        warn: Warn = _warning,
        segmenter: Segmenter | None = None,
    ) -> None:
        self.backend, self.language, self.split, self.warn = backend, language, split, warn
        notes: list[str] = []
        self.segmenter = segmenter if segmenter is not None else segmenter_for(language, notes.append)
        self._note = notes[0] if notes else None  # the fallback, said when it first splits a text

    @property
    def progress(self) -> Callable[[int], None] | None:
        return self.backend.progress

    @progress.setter
    def progress(self, value: Callable[[int], None] | None) -> None:
        self.backend.progress = value  # called with the number of pieces of each finished batch

    def translate(
        self,
        documents: Sequence[str],
        options: DecodeOptions,
        *,
        fmt: str = "text",
        alignments: bool = False,
        scores: bool = False,
        confidence: bool = False,
        prefixes: Sequence[str] | None = None,
        where: Callable[[int, int], str] | None = None,
    ) -> list[DocumentResult]:
        """One :class:`DocumentResult` per document of format ``fmt`` (:data:`FORMATS`).
        ``options.nbest`` > 1 gives the text format's alternatives; ``scores`` the mean scores (a
        search with ``alignments`` gives none); ``confidence`` each sentence's confidence and word
        probabilities (``DocumentResult.scored``); ``prefixes``: per document a target text its
        (first sentence's) translation starts with; ``where(document, line)`` names a place in
        warnings (default: "document D, line L", from 1)."""
        parsed = [self.parse(document, fmt) for document in documents]
        aligned = alignments or fmt != "text"
        if (aligned or confidence) and options.nbest > 1:
            raise UserError("nbest: alternatives are given for plain text without alignments or confidence")
        asked = _Asked(aligned, scores, confidence, prefixes)
        sentences = self._stream(parsed, options, asked, where=where)
        return [
            self._result(p, s, options.nbest, alignments and fmt == "text") for p, s in zip(parsed, sentences)
        ]

    def parse(self, document: str, fmt: str) -> Parsed:
        """``document`` parsed as ``fmt`` into the sentences to translate."""
        split = self._spans if self.split else whole
        if fmt == "text":
            return parse_text(document, split)
        if fmt == "html":
            return parse_html(document, split, self.warn)
        if fmt == "markdown":
            return parse_markdown(document, split, self.warn)
        raise UserError(f"format: unknown format {fmt!r}; valid: {', '.join(FORMATS)}")

    # --- internals ---------------------------------------------------------------------------------
    def _spans(self, text: str) -> list[tuple[int, int]]:
        spans = self.segmenter.spans(text)
        if self._note is not None and len(spans) > 1:
            self.warn(self._note)
            self._note = None
        return spans

    def _stream(self, parsed, options, asked: "_Asked", *, where) -> list[list[_Sentence]]:
        """Every document's sentences, translated together: pieces that fit the model, one call.
        (The sentences are counted in one batch; only those too long are split, counted again.)"""
        limit = source_limit(self.backend.config.max_len, options.max_len_a, options.max_len_b)
        texts = [[" ".join(text.split()) for text in document.sentences()] for document in parsed]
        counts = iter(
            len(ids) for ids in self.backend.tokenizer.encode_batch([t for doc in texts for t in doc])
        )
        pieces: list[str] = []
        documents: list[list[_Sentence]] = []
        for d, (document, sentences_of) in enumerate(zip(parsed, texts)):
            sentences = []
            for k, text in enumerate(sentences_of):
                parts, blind = ([text], False) if next(counts) <= limit else fit(text, self._count, limit)
                if blind:
                    self.warn(
                        f"{self._place(document, d, k, where)}: a sentence of more than {limit} tokens "
                        "without clause punctuation was split between words"
                    )
                sentences.append(_Sentence(text, list(range(len(pieces), len(pieces) + len(parts)))))
                pieces += parts
            documents.append(sentences)
        self._translate_pieces(pieces, documents, options, asked)
        return documents

    def _translate_pieces(self, pieces, documents, options, asked: "_Asked") -> None:
        starts = _piece_prefixes(documents, asked.prefixes, len(pieces))
        extra = (starts,) if starts is not None else ()  # backends that take no prefixes need none
        if asked.confidence:
            found = self.backend.translate_scored(pieces, options, starts, align=asked.aligned)
            for sentence in (s for doc in documents for s in doc):
                sentence.scored = _join_scored(
                    [pieces[i] for i in sentence.pieces], [found[i] for i in sentence.pieces]
                )
                sentence.aligned = Aligned(sentence.scored.text, sentence.scored.alignment)
                sentence.nbest = [(sentence.scored.score, sentence.scored.text)]
            return
        if asked.aligned:
            found = self.backend.translate_aligned(pieces, options, *extra)
            for sentence in (s for doc in documents for s in doc):
                sentence.aligned = _join_aligned(
                    [pieces[i] for i in sentence.pieces], [found[i] for i in sentence.pieces]
                )
                sentence.nbest = [(math.nan, sentence.aligned.text)]
            return
        if options.nbest == 1 and not asked.scores:
            texts = self.backend.translate(pieces, options, *extra)
            nbest = [[(math.nan, text)] for text in texts]
        else:
            searched = replace(options, scores=True) if asked.scores else options
            nbest = self.backend.translate_nbest(pieces, searched, *extra)
        for sentence in (s for doc in documents for s in doc):
            sentence.nbest = _join_nbest([nbest[i] for i in sentence.pieces], options.nbest)
            sentence.aligned = Aligned(sentence.nbest[0][1])

    def _result(
        self, parsed: Parsed, sentences: list[_Sentence], nbest: int, alignment: bool
    ) -> DocumentResult:
        translations = [s.aligned for s in sentences]
        text = parsed.rebuild(translations)
        score = _mean([s.nbest[0][0] for s in sentences])
        ranked = [(score, text)]
        if isinstance(parsed, TextDocument) and sentences:
            for k in range(1, min(nbest, max(len(s.nbest) for s in sentences))):
                chosen = [s.nbest[min(k, len(s.nbest) - 1)] for s in sentences]
                ranked.append(
                    (_mean([c[0] for c in chosen]), parsed.rebuild([Aligned(c[1]) for c in chosen]))
                )
        pairs = parsed.alignment(translations) if alignment and isinstance(parsed, TextDocument) else ()
        pairs_of = [(source, s.aligned.text) for source, s in zip(parsed.sentences(), sentences)]
        scored = [s.scored for s in sentences if s.scored is not None]
        return DocumentResult(text, score, ranked, pairs_of, pairs, scored)

    def _count(self, text: str) -> int:
        return len(self.backend.tokenizer.encode(text))

    @staticmethod
    def _place(document: Parsed, d: int, k: int, where) -> str:
        line = document.line_of(k) if isinstance(document, TextDocument) else 1
        return where(d, line) if where is not None else f"document {d + 1}, line {line}"


@dataclass(frozen=True)
class _Asked:
    """What a call wants besides the texts."""

    aligned: bool
    scores: bool
    confidence: bool
    prefixes: Sequence[str] | None


def _piece_prefixes(documents: list[list[_Sentence]], prefixes, count: int) -> list[str] | None:
    """Each piece's prefix: a document's goes to its first piece; None when no document has one."""
    if not prefixes or not any(prefixes):
        return None
    out = [""] * count
    for sentences, prefix in zip(documents, prefixes):
        if sentences and prefix:
            out[sentences[0].pieces[0]] = prefix
    return out


def _weighted(scored: Sequence[Scored]) -> float:
    """The mean log-probability per token over translations, each weighing its tokens."""
    tokens = sum(s.length for s in scored)
    return sum(s.confidence * s.length for s in scored) / tokens if tokens else 0.0


def _join_scored(pieces: list[str], found: list[Scored]) -> Scored:
    """The pieces' scored translations as one: texts joined by spaces (alignments shifted), words in
    order, confidence over all their tokens, score the mean."""
    if len(found) == 1:
        return found[0]
    aligned = _join_aligned(pieces, [(s.text, s.alignment) for s in found])
    terms = (sum(s.terms[0] for s in found), sum(s.terms[1] for s in found))
    words = tuple(word for s in found for word in s.words)
    length = sum(s.length for s in found)
    score = _mean([s.score for s in found])
    return Scored(aligned.text, score, _weighted(found), words, aligned.alignment, terms, length)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _join_aligned(pieces: list[str], found: list[tuple[str, Pairs]]) -> Aligned:
    """The pieces' translations joined by spaces, their alignments shifted to the joined words."""
    translations = [Aligned(text, alignment) for text, alignment in found]
    return Aligned(" ".join(t.text for t in translations if t.text), joined_alignment(pieces, translations))


def _join_nbest(found: list[list[tuple[float, str]]], nbest: int) -> list[tuple[float, str]]:
    """The k-th hypothesis of a split sentence: each piece's k-th (its last when it has fewer) joined;
    its score the pieces' mean."""
    if len(found) == 1:
        return found[0] or [(0.0, "")]
    out = []
    for k in range(max(1, min(nbest, max(len(f) for f in found)))):
        chosen = [f[min(k, len(f) - 1)] for f in found if f]
        out.append((_mean([s for s, _ in chosen]), " ".join(text for _, text in chosen if text)))
    return out
