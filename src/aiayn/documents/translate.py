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

from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from aiayn.decode.align import Pairs, joined_alignment
from aiayn.decode.request import TEXT, Backend, Line, Translation, Wanted
from aiayn.decode.search import DecodeOptions
from aiayn.documents.fit import fit, source_limit
from aiayn.documents.html import parse_html
from aiayn.documents.markdown import parse_markdown
from aiayn.documents.segment import Segmenter, segmenter_for
from aiayn.documents.text import parse_text, whole
from aiayn.documents.types import FORMATS, Parsed, Sentences
from aiayn.errors import UserError, Warn, warning


@dataclass
class DocumentResult:
    """One translated document."""

    text: str  #: the translated document (whitespace, structure and markup kept)
    score: float  #: the mean of its sentences' scores (NaN where none was computed, 0.0 when empty)
    #: the n-best ``(score, text)``, best first: the k-th holds each sentence's k-th hypothesis (its
    #: last where it has fewer), as many as its sentence with the most has
    nbest: list[tuple[float, str]] = field(default_factory=list)
    sentences: list[tuple[str, str]] = field(default_factory=list)  #: (source sentence, its translation)
    alignment: Pairs = ()  #: with alignments: over ``document.split()`` / ``text.split()`` (text format)
    #: each sentence's :class:`~aiayn.decode.request.Translation` (with confidence: its confidence and
    #: its words' probabilities)
    translations: list[Translation] = field(default_factory=list)

    @property
    def confidence(self) -> float:
        """The mean log-probability of the document's tokens (with confidence; 0.0 when empty)."""
        return _weighted(self.translations)

    @property
    def words(self) -> list[tuple[str, float]]:
        """Each translated word with its probability, sentence after sentence (with confidence)."""
        return [word for translation in self.translations for word in translation.words]

    @property
    def alternatives(self) -> list[str]:
        """The 2nd..n-th best texts (text format)."""
        return [text for _, text in self.nbest[1:]]


@dataclass
class _Sentence:
    """A sentence of some document and what the stream gave it."""

    text: str  # whitespace runs as single spaces
    pieces: list[int]  # indices of its pieces in the stream
    translation: Translation = Translation("")


class DocumentTranslator:
    """Translate whole documents with a backend (:class:`~aiayn.decode.request.Backend`).

    ``language``: the source language, for its sentence segmenter (None or one it does not know: a
    language-neutral rule, said once through ``warn`` when it first splits a text). ``split=False``
    takes each document (each line, in ``aiayn translate``'s default mode) as one sentence, for
    sentence-per-line test sets.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        language: str | None = None,
        split: bool = True,
        warn: Warn = warning,
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
        wanted: Wanted = TEXT,
        prefixes: Sequence[str] | None = None,
        where: Callable[[int, int], str] | None = None,
    ) -> list[DocumentResult]:
        """One :class:`DocumentResult` per document of format ``fmt`` (:data:`FORMATS`).
        ``options.nbest`` > 1 gives the alternatives; ``wanted``: the mean ``scores``, each
        sentence's ``confidence`` and word probabilities, the document's word ``alignment``;
        ``prefixes``: per document a target text its (first sentence's) translation starts with;
        ``where(document, line)`` names a place in warnings (default: "document D, line L", from 1)."""
        parsed = [self.parse(document, fmt) for document in documents]
        asked = replace(wanted, alignment=wanted.alignment or fmt != "text")  # markup goes by alignment
        if (asked.alignment or asked.confidence) and options.nbest > 1:
            raise UserError("nbest: alternatives are given for plain text without alignments or confidence")
        sentences = self._stream(parsed, options, asked, prefixes, where)
        return [self._result(p, s, options.nbest, wanted.alignment) for p, s in zip(parsed, sentences)]

    def translate_parsed(
        self,
        documents: Sequence[Sentences],
        options: DecodeOptions,
        *,
        wanted: Wanted = TEXT,
        where: Callable[[int, int], str] | None = None,
    ) -> list[list[Translation]]:
        """The translations of the sentences of documents already parsed (a format of
        :mod:`aiayn.documents.files`, whose markup goes by alignment), all in one stream: per
        document, ``translations[k]`` of ``sentences()[k]`` (a sentence split further: its pieces'
        joined)."""
        if options.nbest > 1:
            raise UserError("nbest: alternatives are given for plain text without alignments or confidence")
        found = self._stream(documents, options, replace(wanted, alignment=True), None, where)
        return [[sentence.translation for sentence in document] for document in found]

    def sentence_spans(self, text: str) -> list[tuple[int, int]]:
        """The spans of ``text``'s sentences as this translator splits it (the whole text, stripped,
        without splitting)."""
        return self._spans(text) if self.split else whole(text)

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

    def _stream(self, parsed, options, wanted: Wanted, prefixes, where) -> list[list[_Sentence]]:
        """Every document's sentences, translated together: pieces that fit the model, one call.
        (The sentences are counted in one batch; only those too long are split, counted again.)"""
        limit = source_limit(self.backend.config.max_len, options.max_len_a, options.max_len_b)
        texts = [[" ".join(text.split()) for text in document.sentences()] for document in parsed]
        counts = iter(
            len(ids) for ids in self.backend.tokenizer.encode_batch([t for doc in texts for t in doc])
        )
        pieces: list[Line] = []
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
                prefix = prefixes[d] if prefixes and not sentences[1:] else ""  # the first piece's
                pieces += [Line(part, prefix if j == 0 else "") for j, part in enumerate(parts)]
            documents.append(sentences)
        found = self.backend.translate(pieces, options, wanted)
        for sentence in (s for document in documents for s in document):
            parts = [pieces[i].text for i in sentence.pieces]
            sentence.translation = _joined(parts, [found[i] for i in sentence.pieces], options.nbest)
        return documents

    def _result(
        self, parsed: Parsed, sentences: list[_Sentence], nbest: int, alignment: bool
    ) -> DocumentResult:
        translations = [s.translation for s in sentences]
        text = parsed.rebuild(translations)
        score = _mean([t.score for t in translations])
        ranked = [(score, text)]
        for k in range(1, min(nbest, max((len(t.nbest) for t in translations), default=0))):
            chosen = [t.nbest[min(k, len(t.nbest) - 1)] for t in translations]
            ranked.append(
                (_mean([c[0] for c in chosen]), parsed.rebuild([Translation(c[1]) for c in chosen]))
            )
        pairs = parsed.alignment(translations) if alignment else ()
        pairs_of = [(source, t.text) for source, t in zip(parsed.sentences(), translations)]
        return DocumentResult(text, score, ranked, pairs_of, pairs, translations)

    def _count(self, text: str) -> int:
        return len(self.backend.tokenizer.encode(text))

    @staticmethod
    def _place(document: Parsed, d: int, k: int, where) -> str:
        line = document.line_of(k)
        return where(d, line) if where is not None else f"document {d + 1}, line {line}"


def _weighted(translations: Sequence[Translation]) -> float:
    """The mean log-probability per token over translations, each weighing its tokens."""
    tokens = sum(t.length for t in translations)
    return sum(t.confidence * t.length for t in translations) / tokens if tokens else 0.0


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _joined(pieces: list[str], found: list[Translation], nbest: int) -> Translation:
    """The translations of a split sentence's pieces as one: texts joined by spaces (alignments
    shifted), the k-th hypothesis each piece's k-th (its last when it has fewer), words in order,
    confidence over all their tokens, scores the pieces' means."""
    if len(found) == 1:
        return found[0]
    ranked = []
    for k in range(max(1, min(nbest, max(len(f.nbest) for f in found)))):
        chosen = [f.nbest[min(k, len(f.nbest) - 1)] for f in found if f.nbest]
        ranked.append((_mean([s for s, _ in chosen]), " ".join(text for _, text in chosen if text)))
    return Translation(
        " ".join(f.text for f in found if f.text),
        joined_alignment(pieces, found),
        _mean([f.score for f in found]),
        tuple(ranked),
        _weighted(found),
        tuple(word for f in found for word in f.words),
        (sum(f.terms[0] for f in found), sum(f.terms[1] for f in found)),
        sum(f.length for f in found),
    )
