"""The manual's commands are valid as written: every ``aiayn`` command in a code block of README.md
and docs/*.md (also as ``python -m aiayn``, ``torchrun ... -m aiayn`` or after a pipe) is parsed by
aiayn's own argument parser, without running it, so a flag that does not exist, a misspelt one or a
missing required one fails the suite, naming the file and line. The tour's commands that need only
the demo's model (``aiayn_demo/run``) run for real, on a small trained model in its place.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
import types
from pathlib import Path

import pytest

from aiayn.cli import build_parser, main
from conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
MANUAL = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}
SEPARATORS = {"|", "||", "&&", ";", "&", "(", ")"}
REDIRECTS = {"<", ">", ">>", "<<<", ">&", "&>"}
DEMO_RUN = "aiayn_demo/run"


class Command:
    """One ``aiayn`` command of the manual: where it is, its arguments, and what feeds its stdin."""

    def __init__(self, path: Path, line: int, argv: list[str], stdin: str | None, text: str) -> None:
        self.path, self.line, self.argv, self.stdin, self.text = path, line, argv, stdin, text

    def __repr__(self) -> str:
        return f"{self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path}:{self.line}"


def shell_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, command)`` of each shell line in the code blocks of ``text`` (continued lines
    joined; python blocks are left to tests/test_docs.py)."""
    found = []
    for block in FENCE.finditer(text):
        if block.group(1) not in SHELL_BLOCKS:
            continue
        first = text.count("\n", 0, block.start(2)) + 1
        lines = block.group(2).split("\n")
        i = 0
        while i < len(lines):
            start, joined = i, lines[i]
            while joined.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                joined = joined.rstrip()[:-1] + " " + lines[i]
            found.append((first + start, joined))
            i += 1
    return found


def words(line: str) -> list[str]:
    """The shell words of ``line``, operators apart, without its comment."""
    line = re.sub(r"(?<=\s)\d+(?=[<>])", "", strip_comment(line))  # 2> err: the descriptor's number
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, ""
    return list(lexer)


def strip_comment(line: str) -> str:
    """``line`` up to a ``#`` that starts a word outside quotes (a shell comment; its words may hold
    an apostrophe)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def aiayn_argv(simple: list[str]) -> list[str] | None:
    """The arguments of the ``aiayn`` program in one simple command, or None if it runs another."""
    while simple and (re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", simple[0]) or simple[0] in ("do", "then")):
        simple = simple[1:]  # VAR=value prefixes; the body of a for loop
    if simple and (simple[0] == "aiayn" or simple[0].endswith("/aiayn")):
        return simple[1:]
    for i in range(len(simple) - 1):  # python -m aiayn, torchrun ... -m aiayn
        if simple[i] == "-m" and simple[i + 1] == "aiayn":
            return simple[i + 2 :]
    return None


def commands_of(path: Path, text: str | None = None) -> list[Command]:
    found = []
    for line, command in shell_lines(path.read_text(encoding="utf-8") if text is None else text):
        simple, stdin, tokens = [], None, words(command)
        tokens.append(";")
        i = 0
        while i < len(tokens):
            token = tokens[i]
            if token in REDIRECTS:
                i += 2  # the operator and its file
                continue
            if token not in SEPARATORS:
                simple.append(token)
                i += 1
                continue
            argv = aiayn_argv(simple)
            if argv is not None:
                found.append(Command(path, line, argv, stdin, command))
            stdin = " ".join(simple[1:]) + "\n" if token == "|" and simple[:1] == ["echo"] else None
            simple = []
            i += 1
    return found


def parse_error(argv: list[str]) -> str | None:
    """argparse's complaint about ``aiayn ARGV``, or None when it parses (``--help`` included)."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as exit:
        if exit.code not in (0, None):
            return stderr.getvalue().strip().splitlines()[-1]
    return None


def all_commands() -> list[Command]:
    return [command for path in MANUAL for command in commands_of(path)]


def test_every_command_of_the_manual_parses() -> None:
    commands = all_commands()
    assert len(commands) >= 40, f"only {len(commands)} aiayn commands found in the manual"
    assert {c.argv[0] for c in commands} >= {"demo", "data", "train", "translate", "serve", "forecast"}
    broken = [
        f"{c!r}: aiayn {' '.join(c.argv)}\n    {parse_error(c.argv)}" for c in commands if parse_error(c.argv)
    ]
    assert not broken, "commands of the manual that aiayn refuses:\n" + "\n".join(broken)


def test_a_wrong_flag_in_the_manual_fails_naming_its_line(tmp_path: Path) -> None:
    """The checker itself: it finds aiayn after a pipe, in torchrun and python -m, with a prefix,
    across a continued line and after a redirection, and names what argparse refuses."""
    doc = tmp_path / "doc.md"
    text = (
        "text\n\n```bash\n"
        "echo 907042 | aiayn translate --checkpoint run --seed 2 < in.txt   # the paper's --nope\n"
        "torchrun --nproc-per-node 2 -m aiayn train --config c.yaml \\\n    --out runs/x --no-such-flag\n"
        "AIAYN_API_KEY=k .venv/bin/aiayn serve --checkpoint run > log 2> err\n"
        "python -m aiayn plot attention --src x --out a.png\n"
        "pip install aiayn\n"
        "```\n\n```python\naiayn = 1  # not a shell block\n```\n"
    )
    doc.write_text(text, encoding="utf-8")
    found = commands_of(doc)
    assert [(c.line, c.argv[0]) for c in found] == [(4, "translate"), (5, "train"), (7, "serve"), (8, "plot")]
    assert found[0].stdin == "907042\n" and found[0].argv[-2:] == ["--seed", "2"]
    assert found[2].argv == ["serve", "--checkpoint", "run"]
    errors = [parse_error(c.argv) for c in found]
    assert errors[0] is None and errors[2] is None
    assert "unrecognized arguments: --no-such-flag" in errors[1]
    assert "the following arguments are required: --checkpoint" in errors[3]


def _feed_stdin(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """``text`` on a pipe as stdin, as the shell's ``echo ... |`` gives it."""
    read, write = os.pipe()
    os.write(write, text.encode())
    os.close(write)
    monkeypatch.setattr(sys, "stdin", os.fdopen(read, "r", encoding="utf-8"))


@pytest.mark.xdist_group("served")  # tiny_translation_run: tests/conftest.py, shared_server
def test_the_tour_on_the_demo_model_runs(
    tiny_translation_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    """Each command of the README on ``aiayn_demo/run`` runs as written, from a directory where
    that is a trained digits->words model; ``aiayn serve`` answers its page and a translation."""
    tour = [c for c in commands_of(ROOT / "README.md") if DEMO_RUN in c.argv]
    assert {c.argv[0] for c in tour} >= {"translate", "plot", "serve"}, tour
    (tmp_path / "aiayn_demo").mkdir()
    (tmp_path / DEMO_RUN).symlink_to(tiny_translation_run, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    for command in tour:
        if command.argv[0] == "serve":
            _serve(command, monkeypatch)
            continue
        if command.stdin is not None:
            _feed_stdin(monkeypatch, command.stdin)
        assert main(command.argv) == 0, (command, capfd.readouterr().err)
        out = capfd.readouterr().out
        if command.argv[0] == "translate":
            assert out.strip(), command
        for flag in ("--out", "--output"):
            if flag in command.argv:
                assert (tmp_path / command.argv[command.argv.index(flag) + 1]).stat().st_size > 0, command


def _serve(command: Command, monkeypatch: pytest.MonkeyPatch) -> None:
    """``aiayn serve`` as written, in this process: the command's own code builds and serves the
    app, whose requests come from Starlette's test client instead of a socket."""
    import uvicorn
    from fastapi.testclient import TestClient

    from aiayn.serve import cli as serve_cli

    answers: dict = {}

    class Server:  # uvicorn's server, its run() driving the app through the test client
        def __init__(self, config) -> None:
            self.app = config.app

        def run(self) -> None:
            with TestClient(self.app) as client:
                answers["health"] = client.get("/health").status_code
                answers["page"] = client.get("/").status_code
                answers["translate"] = client.post("/v1/translate", json={"text": ["907042"]}).json()

    monkeypatch.setattr(serve_cli, "_server_class", lambda uvicorn: Server)
    # uvicorn's Config sets up logging with dictConfig, which closes every handler of this process
    # (pytest's and other tests' too): a stand-in holds what the command passes it
    monkeypatch.setattr(uvicorn, "Config", lambda app, **settings: types.SimpleNamespace(app=app, **settings))
    assert main([*command.argv, "--port", str(free_port()), "--device", "cpu"]) == 0, command
    assert answers["health"] == answers["page"] == 200, answers
    assert answers["translate"]["translations"][0]["text"], answers
