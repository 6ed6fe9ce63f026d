"""Subword tokenizer: a thin wrapper around SentencePiece with the project's fixed special ids.

The paper uses byte-pair encoding with a shared source-target vocabulary (§5.1); this is the
default here (``model_type="bpe"``, one joint model trained on source and target sentences of the
training split). ``"unigram"`` is the other SentencePiece model.

Choices that make ``decode(encode(s)) == s`` hold exactly:

- ``normalization_rule_name="identity"`` (SentencePiece's default NFKC would turn U+00A0 into a
  space, full-width letters into ASCII, ...);
- ``remove_extra_whitespaces=False`` (the default would squeeze runs of spaces and drop leading and
  trailing ones);
- ``byte_fallback=True``: a character never seen in training is encoded as its UTF-8 bytes
  (``<0xE2>`` ...) instead of ``<unk>``, so unseen scripts, emoji or U+200B survive.

One exception remains: the character U+2581 (``▁``, which SentencePiece uses to mark spaces)
decodes as a space. It does not occur in Multi30k.

``lowercase=True`` replaces the identity rule with one that lowercases every character (the
Multi30k literature trains on lowercased text): it lives in the SentencePiece model, so encoding
lowercases the input wherever the model goes (translation, the CTranslate2 export), and
``decode(encode(s))`` is ``s`` lowercased character by character (``s.lower()`` but for the Greek
final sigma, which ``str.lower`` chooses by context).

Digits are split into single pieces (``split_digits=True``), which keeps numbers compositional
(the built-in digits-to-words task relies on it).

Training is deterministic: one thread, the whole input (no sampling), a fixed random seed.

:class:`VocabTokenizer` is the other kind, for models trained elsewhere (an imported MarianMT
model): two SentencePiece models (source and target) that cut text into pieces, and a vocabulary
that gives each piece its id (a piece outside it is ``<unk>``), one for both sides or one for each.
:meth:`Tokenizer.from_bytes` reads either kind from a checkpoint's ``tokenizer.model``.

Both kinds answer for each side: ``encode(text, target=...)``, ``id_to_piece(i, target=...)``,
``vocab_size`` (the source's) and ``target_vocab_size``; ``decode`` reads target ids.
"""

from __future__ import annotations

import base64
import io
import json
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import sentencepiece as spm

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from aiayn.errors import UserError

MODEL_TYPES = ("bpe", "unigram")
SPECIAL_IDS = frozenset((PAD_ID, BOS_ID, EOS_ID))


class Tokenizer:
    """Encode text to subword ids (no BOS/EOS added) and decode ids back to text."""

    separate = False  #: one vocabulary for both sides (see VocabTokenizer)

    def __init__(self, model_proto: bytes):
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self._proto = bytes(model_proto)
        _check_special_ids(self._sp)

    # --- training --------------------------------------------------------------------------------
    @classmethod
    def train(
        cls,
        sentences: Iterable[str],
        model_prefix: str | Path | None = None,
        vocab_size: int = 8000,
        model_type: str = "bpe",
        character_coverage: float = 1.0,
        split_digits: bool = True,
        seed: int = 0,
        lowercase: bool = False,
    ) -> "Tokenizer":
        """Train a model on ``sentences`` (pass source + target training sentences for a joint one).

        ``vocab_size`` is an upper bound: a corpus too small for it gets a smaller vocabulary.
        With ``model_prefix`` the model is also saved to ``{model_prefix}.model`` (a directory
        gets ``spm.model`` inside it).
        """
        if model_type not in MODEL_TYPES:
            raise UserError(f"unknown tokenizer model_type {model_type!r}; valid: {', '.join(MODEL_TYPES)}")
        sentences = [s for s in sentences if s]
        if not sentences:
            raise UserError("cannot train a tokenizer on no sentences")
        options = dict(
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            split_digits=split_digits,
        )
        proto = _train_proto(sentences, seed=seed, lowercase=lowercase, **options)
        tokenizer = cls(proto)
        if model_prefix is not None:
            tokenizer.save(_model_path(Path(model_prefix)))
        return tokenizer

    # --- encoding and decoding ---------------------------------------------------------------------
    def encode(self, text: str, target: bool = False) -> list[int]:
        """Ids of ``text`` (one model for both sides: ``target`` changes nothing here)."""
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str], threads: int = -1, target: bool = False) -> list[list[int]]:
        """Ids of each text, encoded by ``threads`` threads (-1: SentencePiece's default, all CPUs)."""
        return self._sp.encode(list(texts), num_threads=threads)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; PAD, BOS and EOS are ignored (UNK decodes as " ⁇ ")."""
        return self._sp.decode([int(i) for i in ids if int(i) not in SPECIAL_IDS])

    def decode_batch(self, batch: Iterable[Sequence[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def pieces(self, text: str) -> list[str]:
        """The subword pieces of ``text`` (labels for attention plots)."""
        return self._sp.encode(text, out_type=str)

    def merge_ranks(self) -> dict[str, tuple[int, float]]:
        """``piece -> (id, score)`` for the pieces BPE can build (no control, unknown, unused or
        byte pieces): a higher score is an earlier merge (see :mod:`aiayn.data.bpe_dropout`)."""
        sp = self._sp
        return {
            sp.id_to_piece(i): (i, sp.get_score(i))
            for i in range(sp.get_piece_size())
            if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) or sp.is_byte(i))
        }

    def id_to_piece(self, token_id: int, target: bool = False) -> str:
        """The piece of ``token_id`` (one vocabulary for both sides: ``target`` changes nothing here)."""
        return self._sp.id_to_piece(int(token_id))

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def target_vocab_size(self) -> int:
        return self.vocab_size

    @property
    def lowercases(self) -> bool:
        """Whether encoding lowercases text (a model trained with ``lowercase=True``)."""
        return self._sp.normalize("A").endswith("a")

    @property
    def model_type(self) -> str:
        """The SentencePiece model's type: "bpe", "unigram" (also protobuf's default), "word" or "char"."""
        spec = _proto_field(self._proto, TRAINER_SPEC)
        kind = _proto_field(spec, MODEL_TYPE) if isinstance(spec, bytes) else None
        return SPM_MODEL_TYPES.get(kind, "unigram")

    # --- persistence -------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The serialized SentencePiece model (store it in a checkpoint)."""
        return self._proto

    @classmethod
    def from_bytes(cls, data: bytes) -> "Tokenizer | VocabTokenizer":
        """The tokenizer stored in ``data``: a SentencePiece model, or a :class:`VocabTokenizer`."""
        if data.startswith(VocabTokenizer.MAGIC):
            return VocabTokenizer.from_bytes(data)
        try:
            return cls(data)
        except RuntimeError:
            raise UserError(f"not a SentencePiece model ({len(data)} bytes)") from None

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self._proto)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer | VocabTokenizer":
        path = Path(path)
        if path.is_dir():
            path = _model_path(path)
        if not path.is_file():
            raise UserError(f"tokenizer model not found: {path}")
        try:
            return Tokenizer.from_bytes(path.read_bytes())
        except UserError as err:
            raise UserError(f"{path}: {err}") from None

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size})"


def vocabularies(tokenizer: "Tokenizer | VocabTokenizer") -> tuple[list[str], list[str]]:
    """The tokenizer's source and target pieces in id order (equal lists for one vocabulary)."""
    source = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    return source, [tokenizer.id_to_piece(i, target=True) for i in range(tokenizer.target_vocab_size)]


def _model_path(prefix: Path) -> Path:
    if prefix.is_dir():
        return prefix / "spm.model"
    return prefix if prefix.suffix == ".model" else prefix.with_name(prefix.name + ".model")


def _train_proto(sentences, *, seed, lowercase, **options) -> bytes:
    """A SentencePiece model trained on ``sentences`` (``options``: the trainer's vocab_size,
    model_type, character_coverage, split_digits)."""
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rule = {"normalization_rule_name": "identity"}
            if lowercase:
                rule = {"normalization_rule_tsv": str(_write_lowercase_rules(Path(tmp) / "lowercase.tsv"))}
            _run_trainer(sentences, model, rule, **options)
    except RuntimeError as err:  # e.g. a vocab_size below the number of characters + 256 bytes
        reason = str(err).split("] ", 1)[-1]  # drop SentencePiece's source-location prefix
        raise UserError(
            f"cannot train a {options['model_type']} tokenizer with vocab_size={options['vocab_size']}: "
            f"{reason}"
        ) from None
    return model.getvalue()


def _write_lowercase_rules(path: Path) -> Path:
    """SentencePiece's rule file mapping each character that ``str.lower`` changes to its lowercase."""
    with path.open("w", encoding="ascii") as rules:
        for code in range(0x110000):
            if 0xD800 <= code <= 0xDFFF:  # surrogates are not characters
                continue
            lower = chr(code).lower()
            if lower != chr(code):
                rules.write(f"{code:X}\t{' '.join(f'{ord(c):X}' for c in lower)}\n")
    return path


def _run_trainer(sentences, model, rule, *, vocab_size, model_type, character_coverage, split_digits) -> None:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        **rule,  # identity, or the lowercasing rules
        remove_extra_whitespaces=False,
        byte_fallback=True,
        split_digits=split_digits,
        hard_vocab_limit=False,  # a small corpus gets a smaller vocabulary instead of an error
        input_sentence_size=0,  # use every sentence: no sampling
        num_threads=1,
        minloglevel=2,  # quiet
    )


#: SentencePiece's ModelProto holds its TrainerSpec in field 2, whose field 3 is the model type (an enum).
TRAINER_SPEC, MODEL_TYPE = 2, 3
SPM_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


def _proto_field(message: bytes, number: int) -> bytes | int | None:
    """The first value of field ``number`` in a serialized protobuf ``message`` (a varint or the bytes of
    a length-delimited field), or None: enough of the wire format to read a model's type without the
    protobuf package."""
    at = 0
    while at < len(message):
        key, at = _varint(message, at)
        if key & 7 == 0:
            value, at = _varint(message, at)
        elif key & 7 == 2:
            size, at = _varint(message, at)
            value, at = message[at : at + size], at + size
        else:  # fixed 64 or 32 bits (SentencePiece's messages have no groups)
            value, at = None, at + (8 if key & 7 == 1 else 4)
        if key >> 3 == number:
            return value
    return None


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at ``data[at:]`` and where it ends."""
    value = shift = 0
    while True:
        byte = data[at]
        value, at, shift = value | (byte & 0x7F) << shift, at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _check_special_ids(sp: spm.SentencePieceProcessor) -> None:
    found = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if found != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise UserError(
            f"tokenizer has special ids pad/unk/bos/eos={found}; "
            f"aiayn needs {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}"
        )


class VocabTokenizer:
    """Marian's tokenization: SentencePiece pieces looked up in a vocabulary (a piece outside it is
    ``<unk>``), a source and a target SentencePiece model, a leading ``>>xx<<`` language code split
    off first. Gives MarianTokenizer's ids and text (``skip_special_tokens=True``).

    ``pieces`` lists the vocabulary in id order; ``target_pieces``, when given, the target side's
    own (MarianTokenizer's ``separate_vocabs``; else ``pieces`` serve both sides). The pieces at the
    pad/unk/bos/eos ids are the special tokens, which encoding never produces from text and
    decoding drops.
    """

    MAGIC = b'{"aiayn_tokenizer": "vocab"'

    def __init__(
        self,
        source_spm: bytes,
        target_spm: bytes,
        pieces: Sequence[str],
        decode_with_source: bool,
        target_pieces: Sequence[str] | None = None,
    ):
        self._source = _processor(source_spm, "source")
        self._target = _processor(target_spm, "target")
        self._protos = (bytes(source_spm), bytes(target_spm))
        self._pieces = _unique(pieces, "vocabulary")
        self._target_pieces = (
            self._pieces if target_pieces is None else _unique(target_pieces, "target vocabulary")
        )
        self.separate = target_pieces is not None  #: a vocabulary of its own for the target side
        self._ids = {piece: i for i, piece in enumerate(self._pieces)}
        self._target_ids = {piece: i for i, piece in enumerate(self._target_pieces)}
        self._specials = {PAD_ID, UNK_ID, BOS_ID, EOS_ID}
        #: MarianTokenizer decodes with the source model when the vocabulary is shared (its default)
        self.decode_with_source = decode_with_source

    # --- encoding and decoding ---------------------------------------------------------------------
    def encode(self, text: str, target: bool = False) -> list[int]:
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:  # a language code, as Marian
            code, text = [text[: end + 2]], text[end + 2 :]
        model, ids = (self._target, self._target_ids) if target else (self._source, self._ids)
        return [ids.get(piece, UNK_ID) for piece in [*code, *model.encode(text, out_type=str)]]

    def encode_batch(self, texts: Sequence[str], threads: int = -1, target: bool = False) -> list[list[int]]:
        return [self.encode(text, target) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of the target ``ids`` without the special tokens (PAD, UNK, BOS, EOS)."""
        model = self._source if self.decode_with_source else self._target
        pieces = [self._target_pieces[int(i)] for i in ids if int(i) not in self._specials]
        return model.decode_pieces(pieces).replace("\u2581", " ").strip()

    def decode_batch(self, batch: Iterable[Sequence[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def pieces(self, text: str) -> list[str]:
        return [self._pieces[i] for i in self.encode(text)]

    def id_to_piece(self, token_id: int, target: bool = False) -> str:
        return (self._target_pieces if target else self._pieces)[int(token_id)]

    @property
    def vocab_size(self) -> int:
        """The source vocabulary's size (the target's too unless :attr:`separate`)."""
        return len(self._pieces)

    @property
    def target_vocab_size(self) -> int:
        return len(self._target_pieces)

    @property
    def spm_models(self) -> tuple[bytes, bytes]:
        """The serialized source and target SentencePiece models."""
        return self._protos

    @property
    def lowercases(self) -> bool:
        return self._source.normalize("A").endswith("a")

    # --- persistence -------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """A JSON document: the two SentencePiece models (base64) and the pieces in id order (and
        the target's, ``target_pieces``, when it has its own)."""
        document = {
            "source_spm": base64.b64encode(self._protos[0]).decode("ascii"),
            "target_spm": base64.b64encode(self._protos[1]).decode("ascii"),
            "decode_with_source": self.decode_with_source,
            "pieces": self._pieces,
        }
        if self.separate:
            document["target_pieces"] = self._target_pieces
        return self.MAGIC + b", " + json.dumps(document, ensure_ascii=False).encode("utf-8")[1:]

    @classmethod
    def from_bytes(cls, data: bytes) -> "VocabTokenizer":
        try:
            document = json.loads(data.decode("utf-8"))
            return cls(
                base64.b64decode(document["source_spm"]),
                base64.b64decode(document["target_spm"]),
                document["pieces"],
                bool(document["decode_with_source"]),
                document.get("target_pieces"),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise UserError(f"not a vocabulary tokenizer: {err}") from None

    def __repr__(self) -> str:
        sizes = f", target_vocab_size={self.target_vocab_size}" if self.separate else ""
        return f"VocabTokenizer(vocab_size={self.vocab_size}{sizes})"


def _unique(pieces: Sequence[str], name: str) -> list[str]:
    pieces = list(pieces)
    if len(set(pieces)) != len(pieces):
        raise UserError(f"{name}: the same piece has two ids")
    return pieces


def _processor(proto: bytes, side: str) -> spm.SentencePieceProcessor:
    try:
        return spm.SentencePieceProcessor(model_proto=proto)
    except RuntimeError:
        raise UserError(f"{side}: not a SentencePiece model ({len(proto)} bytes)") from None
