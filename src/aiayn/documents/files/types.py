"""What a file's reading is bounded by and what its translation gives (no format library needed)."""

from __future__ import annotations

from dataclasses import dataclass

from aiayn.errors import UserError


class TooLarge(UserError):
    """A file over one of its :class:`FileLimits` (a zip bomb included): a server's 413."""


@dataclass(frozen=True)
class FileLimits:
    """What :func:`read_file` accepts; all enforced there."""

    max_bytes: int = 20_000_000  #: the file as uploaded
    #: a zip's members uncompressed, summed (the directory's sizes, and what is actually read)
    max_unpacked_bytes: int = 200_000_000
    max_members: int = 10_000
    max_characters: int = 1_000_000  #: text to translate
    #: the XML parsed for its text (a zip's text members, summed): what a tree's memory grows with
    max_xml_bytes: int = 50_000_000


def squeezed(text: str) -> str:
    """A text as the model sees it: its whitespace runs as single spaces, none at its ends."""
    return " ".join(text.split())


def characters(text: str) -> int:
    """A text's characters to translate (and to count against quotas): :func:`squeezed`'s."""
    return len(squeezed(text))


@dataclass
class TranslatedFile:
    data: bytes  #: the translated file, of the source's kind
    sentences: int  #: sentences translated
    characters: int  #: characters of source text translated
