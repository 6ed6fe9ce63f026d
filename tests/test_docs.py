"""The code in the documentation runs: every ```python block of ``docs/paper.md`` and of the README's
library section is executed, in order, in one namespace per file, so the examples cannot rot.

A failing block is reported with its file and line (the code is compiled with its position in the
Markdown file, so a traceback points at the line of the document). The README's library section
loads a trained model from ``aiayn_demo/run`` (what ``aiayn demo`` writes); the test writes a small
randomly initialised one there, in a temporary directory, so that the example runs without training.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import aiayn
from aiayn.checkpoint import save_checkpoint
from aiayn.data.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
PAPER, README = ROOT / "docs" / "paper.md", ROOT / "README.md"
LIBRARY_HEADING = "## The library"
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def python_blocks(text: str, first_line: int = 1) -> list[tuple[int, str]]:
    """``(line of the block's first code line, code)`` for every ```python block of ``text``."""
    return [(first_line + text.count("\n", 0, m.start(1)), m.group(1)) for m in BLOCK.finditer(text)]


def section(text: str, heading: str) -> tuple[str, int]:
    """The text under ``heading`` (a whole line) up to the next heading of the same level, and the
    line it starts on."""
    start = text.index(f"\n{heading}\n") + 1
    level = heading.split(" ")[0]
    end = text.find(f"\n{level} ", start + len(heading))
    return text[start : end if end >= 0 else len(text)], text.count("\n", 0, start) + 1


def run_blocks(path: Path, blocks: list[tuple[int, str]]) -> None:
    """Execute ``blocks`` in order in one fresh namespace; line numbers as in ``path``."""
    namespace: dict = {"__name__": f"docs_{path.stem}"}
    for line, code in blocks:
        compiled = compile("\n" * (line - 1) + code, str(path), "exec")  # tracebacks name the .md line
        try:
            exec(compiled, namespace)
        except Exception as err:
            raise AssertionError(f"{path.name}, the block at line {line} failed: {err!r}") from err


def paper_blocks() -> list[tuple[int, str]]:
    return python_blocks(PAPER.read_text(encoding="utf-8"))


def readme_blocks() -> list[tuple[int, str]]:
    text, first_line = section(README.read_text(encoding="utf-8"), LIBRARY_HEADING)
    return python_blocks(text, first_line)


def test_the_paper_tour_runs() -> None:
    run_blocks(PAPER, paper_blocks())


def test_every_block_of_the_paper_tour_checks_something() -> None:
    blocks = paper_blocks()
    assert len(blocks) >= 10, f"only {len(blocks)} python blocks found in {PAPER}"
    unchecked = [line for line, code in blocks if not re.search(r"^\s*assert\b", code, re.MULTILINE)]
    assert not unchecked, f"blocks without an assert in docs/paper.md, at lines {unchecked}"


@pytest.fixture()
def demo_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding ``aiayn_demo/run``: a tiny untrained digits->words model."""
    digits = [str(n) for n in range(0, 100000, 997)]
    words = ["nine hundred seven thousand forty-two", "one two three four five six seven eight"] * 20
    tokenizer = Tokenizer.train(digits + words, vocab_size=320)
    config = aiayn.TransformerConfig.preset(
        "tiny",
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        tie_embeddings="all",
        d_model=32,
        d_ff=64,
        max_len=64,
    )
    torch.manual_seed(0)
    model = aiayn.build_model(config)
    meta = {"kind": "translation", "model": config.to_dict(), "step": 1}
    save_checkpoint(tmp_path / "aiayn_demo" / "run" / "best", model, meta, tokenizer.to_bytes())
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_readme_library_section_runs(demo_run: Path) -> None:
    blocks = readme_blocks()
    assert blocks, f"no python block under {LIBRARY_HEADING!r} in README.md"
    run_blocks(README, blocks)


def test_a_broken_block_fails_with_its_line(tmp_path: Path) -> None:
    """The harness itself: a false assert in a block fails, naming the block's line."""
    doc = tmp_path / "doc.md"
    text = "# t\n\n```python\nx = 1\n```\n\ntext\n\n```python\nassert x == 2\n```\n"
    doc.write_text(text, encoding="utf-8")
    blocks = python_blocks(doc.read_text(encoding="utf-8"))
    assert [line for line, _ in blocks] == [4, 10]
    with pytest.raises(AssertionError, match="line 10"):
        run_blocks(doc, blocks)
