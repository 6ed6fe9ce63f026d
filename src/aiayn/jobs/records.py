"""The record formats of a job's input: what of each line is translated, and the output line made
from the line and its translation.

plain
    The line is the text; the output is what the translation gives (one line, or for ``--nbest K``
    K lines per input line: a chunk's output is a block).
tsv (``--column N``, counted from 1)
    Tab-separated fields, no quoting; field N is translated and replaced by its translation (a tab
    or line break in a translation becomes a space), the other fields kept as they are.
jsonl (``--field NAME``, ``--output-field NAME``)
    One JSON object a line; its string field NAME is translated, and the translation written to
    the same field or to ``--output-field`` (a new field goes last). The object is written again
    (``json.dumps``, non-ASCII kept): the other fields keep their values and order, not their
    spacing. A blank line stays a blank line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from aiayn.errors import UserError

FORMATS = ("plain", "tsv", "jsonl")
_SPACES = re.compile(r"[\t\r\n\v\f\x1c-\x1e\x85\u2028\u2029]")


@dataclass(frozen=True)
class RecordFormat:
    """How lines become texts and texts with their lines output lines. ``name`` one of
    :data:`FORMATS`; ``column`` (tsv, from 1), ``field`` and ``output_field`` (jsonl)."""

    name: str = "plain"
    column: int | None = None
    field: str | None = None
    output_field: str | None = None

    def __post_init__(self) -> None:
        if self.name not in FORMATS:
            raise UserError(f"--input-format: unknown format {self.name!r}; valid: {', '.join(FORMATS)}")
        if self.name == "tsv" and (self.column is None or self.column < 1):
            raise UserError("--input-format tsv: needs --column N, the field to translate (from 1)")
        if self.name == "jsonl" and not self.field:
            raise UserError("--input-format jsonl: needs --field NAME, the field to translate")
        if self.name != "tsv" and self.column is not None:
            raise UserError("--column: needs --input-format tsv")
        if self.name != "jsonl" and (self.field is not None or self.output_field is not None):
            flag = "--field" if self.field is not None else "--output-field"
            raise UserError(f"{flag}: needs --input-format jsonl")

    def texts(self, lines: list[str], name: str, first: int) -> list[str]:
        """The text to translate of each line (line ``first`` of the input ``name`` is the first)."""
        if self.name == "plain":
            return lines
        return [self._text(line, name, number) for number, line in enumerate(lines, first)]

    def _text(self, line: str, name: str, number: int) -> str:
        if self.name == "tsv":
            fields = line.split("\t")
            if len(fields) < self.column:  # type: ignore[operator]
                raise UserError(
                    f"{name}: line {number}: {len(fields)} tab-separated field(s); --column {self.column} "
                    "is not there"
                )
            return fields[self.column - 1]  # type: ignore[operator]
        if not line.strip():
            return ""
        record = _json_object(line, name, number)
        value = record.get(self.field)
        if not isinstance(value, str):
            what = "no such field" if value is None and self.field not in record else "not a string"
            raise UserError(f"{name}: line {number}: field {self.field!r}: {what}")
        return value

    def output(self, lines: list[str], translations: list[str]) -> list[str]:
        """The output lines: plain, ``translations`` as they are; else each line with its field
        replaced (one translation per line)."""
        if self.name == "plain":
            return translations
        if len(translations) != len(lines):
            raise ValueError(f"{len(lines)} lines but {len(translations)} translations")
        if self.name == "tsv":
            out = []
            for line, text in zip(lines, translations):
                fields = line.split("\t")
                fields[self.column - 1] = _SPACES.sub(" ", text)  # type: ignore[operator]
                out.append("\t".join(fields))
            return out
        out = []
        for line, text in zip(lines, translations):
            if not line.strip():
                out.append("")
                continue
            record = json.loads(line)
            record[self.output_field or self.field] = text
            out.append(json.dumps(record, ensure_ascii=False))
        return out


def _json_object(line: str, name: str, number: int) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise UserError(f"{name}: line {number}: not JSON ({err.msg})") from None
    if not isinstance(record, dict):
        raise UserError(f"{name}: line {number}: not a JSON object")
    return record
