"""Language codes as the service names them: ISO 639-1 where the language has one (``de``), else the
code as given, lower case. opus-mt's multi-target models name their targets ``>>xx<<`` with ISO
639-1 or 639-3 codes (``>>fr<<``, ``>>fra<<``); both are read as ``fr``.
"""

from __future__ import annotations

import re

ENGLISH = "en"  #: the bridge language tried first

#: ISO 639-3 (and 639-2/B) codes of the languages with an ISO 639-1 code that opus-mt names
ISO_639_3 = {
    "afr": "af", "amh": "am", "ara": "ar", "aze": "az", "bel": "be", "bul": "bg", "ben": "bn",
    "bos": "bs", "cat": "ca", "ces": "cs", "cze": "cs", "cym": "cy", "wel": "cy", "dan": "da",
    "deu": "de", "ger": "de", "ell": "el", "gre": "el", "eng": "en", "epo": "eo", "spa": "es",
    "est": "et", "eus": "eu", "baq": "eu", "fas": "fa", "per": "fa", "fin": "fi", "fra": "fr",
    "fre": "fr", "gle": "ga", "glg": "gl", "guj": "gu", "heb": "he", "hin": "hi", "hrv": "hr",
    "hun": "hu", "hye": "hy", "arm": "hy", "ind": "id", "isl": "is", "ice": "is", "ita": "it",
    "jpn": "ja", "kat": "ka", "geo": "ka", "kaz": "kk", "khm": "km", "kan": "kn", "kor": "ko",
    "kir": "ky", "lat": "la", "ltz": "lb", "lit": "lt", "lav": "lv", "mkd": "mk", "mac": "mk",
    "mal": "ml", "mon": "mn", "mar": "mr", "msa": "ms", "may": "ms", "mlt": "mt", "mya": "my",
    "bur": "my", "nob": "nb", "nep": "ne", "nld": "nl", "dut": "nl", "nno": "nn", "nor": "no",
    "pan": "pa", "pol": "pl", "pus": "ps", "por": "pt", "ron": "ro", "rum": "ro", "rus": "ru",
    "sin": "si", "slk": "sk", "slo": "sk", "slv": "sl", "sqi": "sq", "alb": "sq", "srp": "sr",
    "swe": "sv", "swa": "sw", "tam": "ta", "tel": "te", "tha": "th", "tgl": "tl", "tur": "tr",
    "ukr": "uk", "urd": "ur", "uzb": "uz", "vie": "vi", "zho": "zh", "chi": "zh", "cmn": "zh",
}  # fmt: skip
TARGET_TOKEN = re.compile(r"^>>([A-Za-z]{2,3}(?:_[A-Za-z]+)*)<<$")
CODE = re.compile(r"^[a-z][a-z0-9]*(?:[_-][a-z0-9]+)*$")  # de, deu, pt_br, zh-hant; a run's own names


def normalize(code: str) -> str:
    """``code`` as the service names it: lower case, ``_`` between its parts (``pt-BR`` ->
    ``pt_br``), an ISO 639-3 language as its ISO 639-1 code (``deu`` -> ``de``, ``deu_CH`` ->
    ``de_ch``)."""
    language, *rest = code.strip().lower().replace("-", "_").split("_")
    return "_".join([ISO_639_3.get(language, language), *rest])


def is_code(text: str) -> bool:
    """Whether ``text`` reads as a language code (``de``, ``deu``, ``pt_br``, ``zh-hant``; or a name a
    run gave its languages, such as the built-in task's ``digits``)."""
    return len(text) <= 32 and bool(CODE.match(text.strip().lower()))


def target_tokens(pieces) -> dict[str, str]:
    """The languages a multi-target model's ``>>xx<<`` pieces name, each with its piece (the first
    piece of a language wins: ``>>fr<<`` and ``>>fra<<`` are one target)."""
    found: dict[str, str] = {}
    for piece in pieces:
        match = TARGET_TOKEN.match(piece)
        if match:
            found.setdefault(normalize(match.group(1)), piece)
    return found
