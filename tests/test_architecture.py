"""The architecture is checked, not described only: the import contracts in pyproject.toml
(``lint-imports``: the layers of the one-way flow and of the markup package, four forbidden arrows),
and the rule that library modules import aiayn at the top, where a reader sees the arrows."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "aiayn"


def _lint_imports() -> str:
    beside = Path(sys.executable).with_name("lint-imports")  # the test extra installs it into the venv
    found = str(beside) if beside.is_file() else shutil.which("lint-imports")
    if found is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[test]'")
    return found


def lint(cwd: Path, *extra: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    command = [_lint_imports(), "--no-logo", "--no-cache", *extra]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def test_the_import_contracts_are_kept() -> None:
    result = lint(ROOT, pythonpath=ROOT / "src")  # this tree's package, not the one installed
    assert result.returncode == 0 and "0 broken" in result.stdout, result.stdout + result.stderr
    contracts = (ROOT / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")
    assert result.stdout.count(" KEPT") == contracts


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("decode/search.py", "import aiayn.train.engine", "never imports the training package BROKEN"),
        ("checkpoint.py", "import aiayn.forecast.model", "checkpoint.py imports no task package BROKEN"),
        ("data/corpus.py", "import aiayn.model", "Data never imports the model or training BROKEN"),
        ("model/masks.py", "import aiayn.checkpoint", "imports no data, training or checkpoint code BROKEN"),
        ("config.py", "import aiayn.loading", "foundations BROKEN"),  # an arrow up the layers
        (
            "decode/translator.py",
            "import aiayn.documents.text",
            "imports no documents (formats are above it) BROKEN",
        ),
        ("documents/markup/inline.py", "import aiayn.documents.markup.place", "the inline model BROKEN"),
        ("serve/quotas.py", "import aiayn.serve.models", "its engines or its models BROKEN"),
        ("loading.py", "import aiayn.jobs.ray", "imports ray only when a job runs on it) BROKEN"),
    ],
)
def test_the_contracts_catch_a_wrong_arrow(tmp_path: Path, module: str, line: str, broken: str) -> None:
    """The same contracts on a copy of the package with one import added: that contract breaks."""
    shutil.copytree(
        PACKAGE, tmp_path / "src" / "aiayn", ignore=shutil.ignore_patterns("__pycache__", "static")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    target = tmp_path / "src" / "aiayn" / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    result = lint(tmp_path, pythonpath=tmp_path / "src")
    assert result.returncode != 0, result.stdout + result.stderr
    assert broken in " ".join(result.stdout.split()), result.stdout


#: Modules that may import aiayn inside functions: the commands, which load what a command needs
#: only when it runs so that ``aiayn --help`` stays fast; each such import says why in a comment.
COMMAND_MODULES = {"aiayn.cli", "aiayn.demo", "aiayn.translate"}


def is_command_module(name: str) -> bool:
    return name in COMMAND_MODULES or name.endswith(".cli")


def lazy_imports(source: str) -> list[tuple[int, bool]]:
    """``(line, explained)`` of each import of aiayn (absolute or relative) inside a function;
    ``explained``: a comment on its line, or above the run of import lines it ends."""
    lines = source.splitlines()
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def in_function(node: ast.AST) -> bool:
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return True
        return False

    def ours(node: ast.AST) -> bool:
        if isinstance(node, ast.Import):
            return any(alias.name.split(".")[0] == "aiayn" for alias in node.names)
        return isinstance(node, ast.ImportFrom) and (
            node.level > 0 or (node.module or "").startswith("aiayn")
        )

    def explained(line: int) -> bool:
        if "#" in lines[line - 1]:
            return True
        above = line - 2
        while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
            above -= 1
        return above >= 0 and lines[above].strip().startswith("#")

    return [
        (node.lineno, explained(node.lineno)) for node in ast.walk(tree) if ours(node) and in_function(node)
    ]


def test_lazy_imports_are_found_and_judged() -> None:
    """The scanner itself: imports at the top are not lazy; an explained block is; a bare one is not."""
    source = (
        "import aiayn\n"
        "def command():\n"
        "    # lazily: the training package\n"
        "    from aiayn.train import engine\n"
        "    from aiayn.train.config import load_run_config\n"
        "    x = 1\n"
        "    from aiayn import model\n"
        "    import aiayn.io\n"
        "    def inner():\n"
        "        import aiayn.config  # the reason\n"
        "def other():\n"
        "    if True:\n"
        "        from . import io\n"
    )
    assert sorted(lazy_imports(source)) == [
        (4, True),
        (5, True),
        (7, False),
        (8, False),
        (10, True),
        (13, False),
    ]


def test_library_modules_import_aiayn_at_the_top() -> None:
    misplaced, unexplained = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(("aiayn", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        for line, explained in lazy_imports(path.read_text(encoding="utf-8")):
            where = f"{path.relative_to(ROOT)}:{line}"
            if not is_command_module(name):
                misplaced.append(where)
            elif not explained:
                unexplained.append(where)
    assert not misplaced, f"library modules import aiayn inside a function: {misplaced}"
    assert not unexplained, f"a command's lazy import without a comment saying why: {unexplained}"


def test_every_engine_and_what_stands_before_one_answer_the_one_call() -> None:
    """The seam (:mod:`aiayn.decode.request`): the torch engine, the CTranslate2 backend, the server's
    batched backend and the tests' fake documents backend each have the Backend protocol's
    attributes and its ``translate(lines, options, wanted)``, with the same parameters, and nothing
    else that translates."""
    import inspect

    from aiayn.decode.backends import CTranslate2Backend
    from aiayn.decode.request import Backend
    from aiayn.decode.translator import Translator
    from aiayn.serve.documents import BatchedBackend
    from test_documents_translate import FakeBackend

    wanted = list(inspect.signature(Backend.translate).parameters)
    for implementation in (Translator, CTranslate2Backend, BatchedBackend, FakeBackend):
        assert list(inspect.signature(implementation.translate).parameters) == wanted, implementation
        others = [
            name for name in dir(implementation) if name.startswith("translate") and name != "translate"
        ]
        assert others == [], (implementation, others)
    assert isinstance(FakeBackend(), Backend)
    assert not isinstance(object(), Backend)


def test_the_type_checker_holds_every_engine_to_the_backend_protocol(tmp_path: Path) -> None:
    """mypy reads tests/backend_types.py, which passes each of them where a Backend is wanted (a
    parameter or an attribute missing or of another type there is an error; tried: the fake without
    ``wanted``, without ``name``; a renamed parameter is the other test's)."""
    mypy = Path(sys.executable).with_name("mypy")
    if not mypy.is_file():
        pytest.fail("mypy is not installed: pip install -e '.[test]'")
    command = [str(mypy), "--cache-dir", str(tmp_path), "--config-file", str(ROOT / "pyproject.toml")]
    env = {"PATH": "/usr/bin:/bin", "MYPYPATH": f"{ROOT / 'src'}:{ROOT / 'tests'}"}
    result = subprocess.run(
        [*command, str(ROOT / "tests" / "backend_types.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
