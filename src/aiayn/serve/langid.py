"""Which language a text is in: py3langid (the ``serve`` extra), offline, for ``source: "auto"`` and
``POST /detect`` of the LibreTranslate API (:mod:`aiayn.serve.libretranslate`).

Chosen on ``benchmarks/langid.py`` (Multi30k val in de, en, fr, cs, each identifier over all the
languages it knows): py3langid names the language of 99.7% of the sentences and 86.9% of their first
three words, at about 12,700 sentences/s on one thread, from a 4.4 MB package that loads in under a
second; lingua-language-detector is as accurate (99.6%, 86.4%) at 1/40 of the speed with 1.2 GB of
models in memory (its low-accuracy mode drops to 96.5%), pycld2 is faster but misses more (97.9%,
59.2%). The model loads at the first text, so that a server nobody asks to detect never holds it.
"""

from __future__ import annotations

import threading
from html.parser import HTMLParser

from aiayn.errors import UserError

# English names of the languages a model is likely to be served for (LibreTranslate's and more);
# GET /languages and /frontend/settings show them, and any other code is shown as itself.
NAMES = {
    "af": "Afrikaans",
    "am": "Amharic",
    "ar": "Arabic",
    "az": "Azerbaijani",
    "be": "Belarusian",
    "bg": "Bulgarian",
    "bn": "Bengali",
    "bs": "Bosnian",
    "ca": "Catalan",
    "cs": "Czech",
    "cy": "Welsh",
    "da": "Danish",
    "de": "German",
    "el": "Greek",
    "en": "English",
    "eo": "Esperanto",
    "es": "Spanish",
    "et": "Estonian",
    "eu": "Basque",
    "fa": "Persian",
    "fi": "Finnish",
    "fr": "French",
    "ga": "Irish",
    "gl": "Galician",
    "gu": "Gujarati",
    "he": "Hebrew",
    "hi": "Hindi",
    "hr": "Croatian",
    "hu": "Hungarian",
    "hy": "Armenian",
    "id": "Indonesian",
    "is": "Icelandic",
    "it": "Italian",
    "ja": "Japanese",
    "ka": "Georgian",
    "kk": "Kazakh",
    "km": "Khmer",
    "kn": "Kannada",
    "ko": "Korean",
    "ky": "Kyrgyz",
    "la": "Latin",
    "lb": "Luxembourgish",
    "lt": "Lithuanian",
    "lv": "Latvian",
    "mk": "Macedonian",
    "ml": "Malayalam",
    "mn": "Mongolian",
    "mr": "Marathi",
    "ms": "Malay",
    "mt": "Maltese",
    "my": "Burmese",
    "nb": "Norwegian Bokmål",
    "ne": "Nepali",
    "nl": "Dutch",
    "nn": "Norwegian Nynorsk",
    "no": "Norwegian",
    "pa": "Punjabi",
    "pl": "Polish",
    "ps": "Pashto",
    "pt": "Portuguese",
    "ro": "Romanian",
    "ru": "Russian",
    "si": "Sinhala",
    "sk": "Slovak",
    "sl": "Slovenian",
    "sq": "Albanian",
    "sr": "Serbian",
    "sv": "Swedish",
    "sw": "Swahili",
    "ta": "Tamil",
    "te": "Telugu",
    "th": "Thai",
    "tl": "Tagalog",
    "tr": "Turkish",
    "uk": "Ukrainian",
    "ur": "Urdu",
    "uz": "Uzbek",
    "vi": "Vietnamese",
    "zh": "Chinese",
}


def language_name(code: str) -> str:
    return NAMES.get(code.lower(), code)


class LanguageIdentifier:
    """py3langid's model over all its languages, with probabilities; thread-safe, loaded once."""

    def __init__(self) -> None:
        self._model = None
        self._lock = threading.Lock()

    def rank_among(self, text: str, languages: list[str]) -> list[tuple[str, float]]:
        """``languages`` ranked by how likely ``text`` is in each, best first, with its probability
        in percent among every language py3langid knows (so that a text in none of them is said with
        a low confidence; a language it does not know gets 0)."""
        known = {code: float(p) for code, p in self._identifier().rank(text)}
        ranked = sorted(languages, key=lambda code: -known.get(code, 0.0))
        return [(code, round(100.0 * known.get(code, 0.0), 2)) for code in ranked]

    def _identifier(self):
        with self._lock:
            if self._model is None:
                self._model = _load_py3langid()
            return self._model


def _load_py3langid():
    try:
        from py3langid.langid import MODEL_FILE
        from py3langid.langid import LanguageIdentifier as Py3LangId
    except ImportError:
        raise UserError("language detection needs py3langid: pip install 'aiayn[serve]'") from None
    return Py3LangId.from_model_file(MODEL_FILE, norm_probs=True)


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs) -> None:
        self.skipping += tag in ("script", "style")

    def handle_endtag(self, tag) -> None:
        self.skipping -= tag in ("script", "style") and self.skipping > 0

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def html_text(html: str) -> str:
    """The text of an HTML document or fragment, without its markup, scripts and styles (what a
    language is detected on: tag names are English)."""
    parser = _Text()
    parser.feed(html)
    parser.close()
    return " ".join(" ".join(parser.parts).split())
