"""Markdown documents (CommonMark with GFM tables and strikethrough), edited in place.

markdown-it-py parses the document; its block tokens say on which lines each run of inline text
(a paragraph, a heading, a table cell) sits. The translation is written over that text only:
everything else (list markers and indentation, ``>`` markers, table pipes and alignment rows, code
blocks and fences, HTML blocks, reference definitions, front matter, blank lines) stays byte for
byte as it was. Inside a run:

- emphasis, strong emphasis, strikethrough and link text are elements whose markup is the source's
  own (``**``, ``_``, ``[`` and ``](url "title")``), placed by :func:`aiayn.documents.markup.transfer`
  around the aligned words; a link's destination and title stay as they were. One left with no
  word is left out (``****`` or ``[][ref]`` would be text, not markup);
- code spans, autolinks, images (with their alt text), inline HTML tags and hard breaks are carried
  as zero-width elements, untranslated;
- escapes and entities keep their spelling where the word comes back unchanged; translated text is
  escaped where it would otherwise become markup.
"""

from __future__ import annotations

import functools
import re
from typing import Callable

from markdown_it import MarkdownIt
from markdown_it.rules_inline import StateInline, autolink, backtick, image, link
from markdown_it.token import Token
from mdit_py_plugins.front_matter import front_matter_plugin

from aiayn.documents.markup import Assembled, InlineBuilder, Run
from aiayn.documents.types import SplitSentences
from aiayn.errors import Warn


@functools.cache
def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).use(front_matter_plugin)
    return md.disable("text_join")  # escapes and entities stay tokens of their own, with their spelling


class _Unplaced(Exception):
    """A run whose tokens could not be matched with the source text (it stays untranslated)."""


def parse_markdown(document: str, split: SplitSentences, warn: Warn) -> Assembled:
    """Parse a Markdown document into its runs of text to translate, and the text kept around them."""
    env: dict = {}
    tokens = _parser().parse(document, env)
    lines = _Lines(document)
    parts: list[str | Run] = []
    pos, unplaced, row = 0, 0, (-1, 0)
    for index, token in enumerate(tokens):
        if token.type != "inline" or token.map is None or not token.content.strip():
            continue
        try:
            where, row = _locate(token, tokens[index - 1], lines, row)
            run = _run(token, where, env, split)
        except _Unplaced:
            unplaced += 1
            continue
        if run is not None:
            (start, end), _, _ = where
            parts += [document[pos:start], run]
            pos = end
    parts.append(document[pos:])
    if unplaced:
        warn(f"{unplaced} Markdown block(s) left untranslated: their text was not found in the source")
    return Assembled(parts)


_LINE_BREAK = re.compile("\r\n|\r|\n")


class _Lines:
    """Where each line of the document starts and ends (before its line break: \\n, \\r\\n or \\r,
    the breaks markdown-it knows)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.bounds: list[tuple[int, int]] = []
        start = 0
        for match in _LINE_BREAK.finditer(text):
            self.bounds.append((start, match.start()))
            start = match.end()
        self.bounds.append((start, len(text)))

    def line(self, number: int) -> tuple[int, int, str]:
        if number >= len(self.bounds):
            raise _Unplaced
        start, end = self.bounds[number]
        return start, end, self.text[start:end]


#: Where a run's text is: (start, end) in the document, the text written for each of its line breaks,
#: and how a slice of the token's content is spelled in the source.
_Where = tuple[tuple[int, int], tuple[str, ...], Callable[[str], str]]


def _same(text: str) -> str:
    return text


def _locate(token: Token, block: Token, lines: _Lines, row: tuple[int, int]) -> tuple[_Where, tuple]:
    """Where the inline ``token`` (in ``block``: a paragraph, a heading or a table cell) is in the
    source; ``row`` is the line and offset where the last table cell ended."""
    content, first = token.content, token.map[0]
    if block.type in ("th_open", "td_open"):  # cells of a row are found left to right
        spelled = content.replace("|", "\\|")  # a cell's pipes were escaped
        start, _, text = lines.line(first)
        offset = text.find(spelled, row[1] if row[0] == first else 0)
        if offset < 0:
            raise _Unplaced
        end = offset + len(spelled)
        return ((start + offset, start + end), (), _escape_pipes), (first, end)
    if block.type == "heading_open" and block.markup.startswith("#"):
        start, _, text = lines.line(first)
        offset = text.find(content, len(text) - len(text.lstrip()) + len(block.markup))
        if offset < 0:
            raise _Unplaced
        return ((start + offset, start + offset + len(content)), (), _same), row
    return _locate_lines(content, first, lines), row


def _escape_pipes(text: str) -> str:
    return text.replace("|", "\\|")


def _locate_lines(content: str, first: int, lines: _Lines) -> _Where:
    """A paragraph's lines: each line of the content ends its source line (the last one before any
    trailing whitespace); what is before it on the line is the container's (``>``, indentation)."""
    parts = content.split("\n")
    bounds = []
    for k, part in enumerate(parts):
        start, _, text = lines.line(first + k)
        text = text.rstrip() if k == len(parts) - 1 else text
        if not text.endswith(part):
            raise _Unplaced
        bounds.append((start + len(text) - len(part), start + len(text)))
    breaks = tuple(lines.text[end:start] for (_, end), (start, _) in zip(bounds, bounds[1:]))
    return (bounds[0][0], bounds[-1][1]), breaks, _same


def _run(token: Token, where: _Where, env: dict, split: SplitSentences) -> Run | None:
    _, breaks, spell = where
    reader = _Reader(token.content, env, spell)
    end = reader.add(token.children or [], 0)
    if end != len(token.content):
        raise _Unplaced
    inline = reader.builder.build()
    spans = tuple(split(inline.text))
    return Run(inline, spans, escape_markdown, breaks) if spans else None


class _Reader:
    """Reads an inline token's children along its content, which they cover in order, into an
    :class:`InlineBuilder`, each with its source spelling."""

    def __init__(self, content: str, env: dict, spell: Callable[[str], str]) -> None:
        self.content, self.env, self.spell = content, env, spell
        self.builder = InlineBuilder()

    def add(self, tokens: list[Token], pos: int) -> int:
        """Adds ``tokens``, read from ``pos`` on; returns where they end."""
        k = 0
        while k < len(tokens):
            token = tokens[k]
            if token.type == "link_open":
                k, pos = self._link(tokens, k, pos)
                continue
            pos = self._token(token, pos)
            k += 1
        return pos

    def _raw(self, start: int, end: int) -> str:
        return self.spell(self.content[start:end])

    def _expect(self, text: str, pos: int) -> int:
        if not self.content.startswith(text, pos):
            raise _Unplaced
        return pos + len(text)

    def _token(self, token: Token, pos: int) -> int:
        kind = token.type
        if kind in ("text", "html_inline"):
            end = self._expect(token.content, pos)
            if kind == "text":
                self.builder.text(token.content, self._raw(pos, end))
            else:
                self.builder.void(self._raw(pos, end), separates=False)
            return end
        if kind == "text_special":
            end = self._expect(token.markup, pos)
            self.builder.text(token.content, self._raw(pos, end))
            return end
        if kind in ("softbreak", "hardbreak"):
            return self._break(kind, pos)
        if kind.endswith("_open") or kind.endswith("_close"):  # em, strong, s
            end = self._expect(token.markup, pos)
            if kind.endswith("_open"):
                self.builder.open(self._raw(pos, end), empty=False)  # "****" is no emphasis
            else:
                self.builder.close(self._raw(pos, end))
            return end
        rule = {"code_inline": backtick, "image": image}.get(kind)
        if rule is None:
            raise _Unplaced
        end = self._rule_end(rule, pos)
        self.builder.void(self._raw(pos, end))
        return end

    def _break(self, kind: str, pos: int) -> int:
        """A line break, with the spaces (or the backslash) before it and the indentation after it:
        a soft break is whitespace of the text; a hard break, a zero-width element."""
        start = pos
        while pos < len(self.content) and self.content[pos] in " \t\\":
            pos += 1
        pos = self._expect("\n", pos)
        if kind == "hardbreak":
            self.builder.void(self._raw(start, pos))
            start = pos
        while pos < len(self.content) and self.content[pos] in " \t":
            pos += 1
        self.builder.text(self.content[start:pos], self._raw(start, pos))
        return pos

    def _link(self, tokens: list[Token], k: int, pos: int) -> tuple[int, int]:
        """A link: autolinks whole, as zero-width elements; others as an element around their text."""
        close = k + 1
        depth = 1
        while depth:
            depth += {"link_open": 1, "link_close": -1}.get(tokens[close].type, 0)
            close += 1
        if tokens[k].markup == "autolink":
            end = self._rule_end(autolink, pos)
            self.builder.void(self._raw(pos, end))
            return close, end
        self.builder.open(self._raw(pos, pos + 1), empty=False)  # "[][ref]" would be no link
        label = self.add(tokens[k + 1 : close - 1], pos + 1)  # the link text ends at its "]"
        end = self._link_end(pos, label)
        self.builder.close(self._raw(label, end))
        return close, end

    def _link_end(self, start: int, label: int) -> int:
        """Where the link from ``start`` whose text ends at ``label`` (its "]") ends."""
        if label >= len(self.content) or self.content[label] != "]":
            raise _Unplaced
        return self._rule_end(link, start)

    def _rule_end(self, rule: Callable[[StateInline, bool], bool], pos: int) -> int:
        """Where the construct that markdown-it's ``rule`` reads from ``pos`` ends."""
        state = StateInline(self.content, _parser(), self.env, [])
        state.pos = pos
        if not rule(state, True):
            raise _Unplaced
        return state.pos


#: What translated text must not start: an ASCII character that opens markup anywhere, ``#`` at the
#: start of a word (a heading), a word of only ``-``, ``+``, ``=`` (a list item, a rule, an underline).
_MARKUP = re.compile(r"[\\`*_\[\]<>|~]|(?<!\S)#|(?<!\S)[-+=](?=[-+=]*(?:\s|$))")


def escape_markdown(text: str) -> str:
    """Translated text as Markdown text: what could start markup backslash-escaped."""
    return _MARKUP.sub(r"\\\g<0>", text)
