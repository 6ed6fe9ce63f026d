"""`aiayn import marian OWNER/NAME`: a model of the Hugging Face Hub, downloaded with huggingface_hub
and imported as its directory is; offline from the cache; each error one line.

The Hub is a stand-in on 127.0.0.1 (:class:`FakeHub`) answering the calls ``snapshot_download`` makes
as the Hub does: the model's info (``/api/models/ID/revision/REV``: its commit), the file tree at the
commit (``/api/models/ID/tree/COMMIT``), then a HEAD and a GET of each file wanted
(``/ID/resolve/COMMIT/FILE``, with ``X-Repo-Commit``, ``ETag`` and ``Content-Length``); unknown repos,
revisions and files are 404s with the Hub's ``X-Error-Code``. It records every request.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import torch
from safetensors.torch import load as load_safetensors

transformers = pytest.importorskip("transformers")  # the `test` extra installs both
hub_constants = pytest.importorskip("huggingface_hub.constants")

from aiayn import load  # noqa: E402
from aiayn.cli import main  # noqa: E402
from aiayn.decode import Translator  # noqa: E402
from aiayn.decode.search import DecodeOptions  # noqa: E402
from aiayn.marian import is_hub_id  # noqa: E402
from marian_model import SOURCE_WORDS, import_marian, make_marian, sentences  # noqa: E402

REPO, BIN_REPO = "Helsinki-NLP/opus-mt-tiny", "opus-mt-tiny-bin"  # an owner/name id, a name-only one
COMMITS = {REPO: "a" * 40, BIN_REPO: "b" * 40}
WANTED = {  # what an import reads of the repo (target_vocab.json: only where the model has one)
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "source.spm",
    "target.spm",
    "tokenizer_config.json",
    "vocab.json",
}
UNWANTED = {  # in the repo besides, never fetched
    "pytorch_model.bin": b"not read where model.safetensors is",
    "tf_model.h5": bytes(1 << 20),
    "flax_model.msgpack": bytes(1 << 20),
    "README.md": b"# opus-mt-tiny\n",
    ".gitattributes": b"*.bin filter=lfs diff=lfs merge=lfs -text\n",
}


# --- the stand-in Hub -----------------------------------------------------------------------------


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str
    gated: bool = False  # its terms not accepted: the Hub refuses it

    def knows(self, revision: str) -> bool:  # its one branch, main, and its commit
        return revision in ("main", self.commit)


API = re.compile(r"/api/models/(?P<repo>.+?)(?:/revision/(?P<revision>[^/]+)|/tree/(?P<tree>[^/]+))?")
RESOLVE = re.compile(r"/(?P<repo>.+?)/resolve/(?P<revision>[^/]+)/(?P<file>.+)")


class FakeHub(ThreadingHTTPServer):
    """The Hub's answers to ``snapshot_download`` for ``repos``, on 127.0.0.1 and a free port."""

    daemon_threads = True

    def __init__(self, repos: dict[str, Repo]) -> None:
        super().__init__(("127.0.0.1", 0), HubHandler)
        self.repos, self.requests = repos, []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.shutdown()
            self.server_close()
            self.thread.join(timeout=10)

    def fetched(self) -> set[str]:
        """The files GET fetched from the repos."""
        return {
            m["file"] for method, path in self.requests if method == "GET" and (m := RESOLVE.fullmatch(path))
        }

    def answer(self, path: str) -> tuple[int, dict[str, str], bytes]:
        if match := API.fullmatch(path):
            return self._api(match["repo"], match["revision"] or match["tree"] or "main", bool(match["tree"]))
        if match := RESOLVE.fullmatch(path):
            return self._resolve(match["repo"], match["revision"], match["file"])
        return 404, {}, b"Not Found"

    def _found(self, repo_id: str, revision: str) -> tuple[Repo | None, tuple[int, dict[str, str], bytes]]:
        repo = self.repos.get(repo_id)
        if repo is None:
            return None, (404, {"X-Error-Code": "RepoNotFound"}, b'{"error": "Repository not found"}')
        if repo.gated:
            return None, (401, {"X-Error-Code": "GatedRepo"}, b'{"error": "Access to model is restricted"}')
        if not repo.knows(revision):
            return None, (404, {"X-Error-Code": "RevisionNotFound"}, b'{"error": "Invalid rev id"}')
        return repo, (200, {}, b"")

    def _api(self, repo_id: str, revision: str, tree: bool):
        repo, refused = self._found(repo_id, revision)
        if repo is None:
            return refused
        if tree:
            entries = [
                {"type": "file", "path": name, "size": len(data), "oid": _git_oid(data)}
                for name, data in repo.files.items()
            ]
            return 200, {"Content-Type": "application/json"}, json.dumps(entries).encode()
        siblings = [{"rfilename": name} for name in repo.files]
        info = {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False, "siblings": siblings}
        return 200, {"Content-Type": "application/json"}, json.dumps(info).encode()

    def _resolve(self, repo_id: str, revision: str, name: str):
        repo, refused = self._found(repo_id, revision)
        if repo is None:
            return refused
        if name not in repo.files:
            return 404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit}, b"Entry not found"
        data = repo.files[name]
        return 200, {"X-Repo-Commit": repo.commit, "ETag": f'"{_git_oid(data)}"'}, data


def _git_oid(data: bytes) -> str:
    """The file's git blob id, the Hub's ETag of a file kept in git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubHandler(BaseHTTPRequestHandler):
    server: FakeHub

    def do_GET(self) -> None:
        self._reply(body=True)

    def do_HEAD(self) -> None:
        self._reply(body=False)

    def _reply(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.server.requests.append((self.command, path))
        status, headers, data = self.server.answer(path)
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, *args) -> None:  # quiet
        pass


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    return make_marian(tmp_path_factory.mktemp("marian") / "opus-mt-tiny", steps=30)


@pytest.fixture(scope="module")
def local(marian_dir, tmp_path_factory) -> Path:
    """The same model imported from its directory."""
    return import_marian(marian_dir, tmp_path_factory.mktemp("local") / "run")


def _bin_repo(files: dict[str, bytes]) -> dict[str, bytes]:
    """The model as older opus-mt repos keep it: pytorch_model.bin and no model.safetensors."""
    weights = io.BytesIO()
    torch.save(load_safetensors(files["model.safetensors"]), weights)
    return {
        **{k: v for k, v in files.items() if k != "model.safetensors"},
        "pytorch_model.bin": weights.getvalue(),
    }


@pytest.fixture
def hub(marian_dir, monkeypatch):
    """The stand-in Hub holding the model twice (REPO with model.safetensors and files an import does
    not read; BIN_REPO with pytorch_model.bin only), huggingface_hub pointed at it, online."""
    files = {path.name: path.read_bytes() for path in marian_dir.iterdir()}
    server = FakeHub(
        {
            REPO: Repo({**files, **UNWANTED}, COMMITS[REPO]),
            BIN_REPO: Repo(_bin_repo(files), COMMITS[BIN_REPO]),
            "owner/gated": Repo(files, "c" * 40, gated=True),
        }
    )
    # HF_ENDPOINT through the environment, which import_marian reads when it runs and passes on as
    # endpoint=: huggingface_hub read it into its constants at its import (before this test). Its
    # constants stay as they are: the file URLs are made from a template of constants.ENDPOINT and
    # then moved to endpoint=, so patching ENDPOINT alone would send them to the real Hub.
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    # its user agent looks its agent registry up at constants.ENDPOINT, the real Hub: not here
    monkeypatch.setattr(hub_constants, "HF_HUB_DISABLE_TELEMETRY", True)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # online, whatever the shell says
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    yield server
    server.stop()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """``aiayn import marian ...``: the exit status, stdout and stderr."""
    capsys.readouterr()
    code = main(["import", "marian", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def imported_from_hub(repo: str, out: Path, cache: Path, capsys) -> dict:
    """The checkpoint's record of the import, which must succeed and say the commit."""
    code, printed, err = run(capsys, repo, "--out", str(out), "--cache-dir", str(cache))
    assert code == 0, err
    info = json.loads((out / "config.json").read_text())["imported"]
    assert printed.startswith(f"imported {repo} (commit {info['hub']['revision']}) to {out}: d_model")
    return info


def translations(checkpoint: Path) -> list[str]:
    model, tokenizer, _ = load(checkpoint)
    translator = Translator(model, tokenizer, options=DecodeOptions(beam=1, max_len_a=0.0, max_len_b=20))
    return [t.text for t in translator.translate(sentences(SOURCE_WORDS, 6, 5))]


def same_model(a: Path, b: Path) -> bool:
    """The two checkpoints' weights, tokenizer and config (but where each came from) are equal."""
    (model_a, tokenizer_a, _), (model_b, tokenizer_b, _) = load(a), load(b)
    state_a, state_b = model_a.state_dict(), model_b.state_dict()
    weights = state_a.keys() == state_b.keys() and all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    configs = [json.loads((c / "config.json").read_text()) for c in (a, b)]
    configs = [{k: v for k, v in c.items() if k != "imported"} for c in configs]
    return weights and tokenizer_a.to_bytes() == tokenizer_b.to_bytes() and configs[0] == configs[1]


# --- tests ----------------------------------------------------------------------------------------


def test_hub_ids_are_told_from_paths() -> None:
    """huggingface_hub's rule: ``owner/name`` or ``name``, ASCII letters, digits, ``_-.``, no ``--`` or
    ``..``, neither end a ``-`` or ``.``; anything else is a path."""
    assert all(map(is_hub_id, ["Helsinki-NLP/opus-mt-de-en", "gpt2", "t5-small", "a_b/c.d"]))
    assert not any(
        map(is_hub_id, ["./model", "a/b/c", "/abs/model", "a--b", "x..y", "-x", "x.", "m.git", ""])
    )


def test_a_hub_model_imports_as_its_directory_does_and_records_its_commit(
    hub, local, tmp_path, capsys
) -> None:
    out, cache = tmp_path / "run", tmp_path / "cache"
    info = imported_from_hub(REPO, out, cache, capsys)
    assert info["hub"] == {"repo": REPO, "revision": COMMITS[REPO]}
    snapshot = Path(info["source"])
    assert snapshot.name == COMMITS[REPO] and snapshot.is_relative_to(cache.resolve())
    assert same_model(out, local)
    assert translations(out) == translations(local)


def test_only_the_files_an_import_reads_are_fetched(hub, tmp_path, capsys) -> None:
    imported_from_hub(REPO, tmp_path / "run", tmp_path / "cache", capsys)
    assert hub.fetched() == WANTED  # not pytorch_model.bin (model.safetensors is there), tf, flax, README
    fetched_paths = " ".join(path for _, path in hub.requests)
    assert not any(name in fetched_paths for name in UNWANTED)
    api = [path for _, path in hub.requests if path.startswith("/api/")]
    assert api == [f"/api/models/{REPO}/revision/main", f"/api/models/{REPO}/tree/{COMMITS[REPO]}"]


def test_a_model_without_safetensors_imports_its_pytorch_model_bin(hub, local, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    info = imported_from_hub(BIN_REPO, out, tmp_path / "cache", capsys)
    assert info["hub"] == {"repo": BIN_REPO, "revision": COMMITS[BIN_REPO]}
    assert hub.fetched() == WANTED - {"model.safetensors"} | {"pytorch_model.bin"}
    assert same_model(out, local)


@pytest.mark.parametrize("repo", [REPO, BIN_REPO])
@pytest.mark.parametrize("how", ["HF_HUB_OFFLINE=1", "server stopped"])
def test_a_cached_model_imports_again_offline(how, repo, hub, local, tmp_path, monkeypatch, capsys) -> None:
    cache, revision = tmp_path / "cache", COMMITS[repo]
    imported_from_hub(repo, tmp_path / "first", cache, capsys)
    hub.requests.clear()
    if how == "server stopped":
        hub.stop()
    else:  # set after huggingface_hub's import: import_marian reads it and asks for the cache alone
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    info = imported_from_hub(repo, tmp_path / "again", cache, capsys)
    assert info["hub"] == {"repo": repo, "revision": revision} and hub.requests == []
    assert same_model(tmp_path / "again", local)
    code, _, err = run(
        capsys, repo, "--revision", revision, "--out", str(tmp_path / "at"), "--cache-dir", str(cache)
    )
    assert code == 0 and hub.requests == [], err


@pytest.mark.parametrize(
    "case, argv, expected",
    [
        (
            "unknown revision",
            [REPO, "--revision", "nope"],
            f"{REPO}: the Hugging Face Hub has no revision 'nope'",
        ),
        (
            "unknown repo",
            ["nobody/nothing"],
            "nobody/nothing: no such directory, and no model nobody/nothing on",
        ),
        (
            "gated",
            ["owner/gated"],
            "owner/gated: a gated model: accept its terms on the Hub, then hf auth login",
        ),
        ("offline", [REPO], f"{REPO}: not in the cache"),
        ("unreachable", [REPO], f"{REPO}: not in the cache"),
    ],
)
def test_hub_errors_are_one_line_and_exit_2(case, argv, expected, hub, tmp_path, monkeypatch, capsys) -> None:
    if case == "offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if case == "unreachable":
        hub.stop()
    code, _, err = run(capsys, *argv, "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"))
    assert code == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith(f"aiayn: error: {expected}"), err
    assert not (tmp_path / "run").exists()
    if case == "offline":
        assert "HF_HUB_OFFLINE is set" in err and hub.requests == []
    if case == "unreachable":
        assert "the Hugging Face Hub cannot be reached" in err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["./missing"], "SOURCE: ./missing: no such directory"),
        (["a/b/c"], "SOURCE: a/b/c: no such directory"),
        (["model", "--revision", "v1"], "--revision and --cache-dir are for a Hub model id; model is a path"),
        (["Helsinki-NLP/opus-mt-de-en"], "importing a Hub model needs the huggingface_hub package"),
    ],
)
def test_names_neither_a_directory_nor_a_hub_id_and_a_missing_huggingface_hub(
    argv, expected, marian_dir, tmp_path, monkeypatch, capsys
) -> None:
    """huggingface_hub is imported only for a Hub id: hidden, it is missed there and nowhere else."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").symlink_to(marian_dir)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` fails
    code, _, err = run(capsys, *argv, "--out", str(tmp_path / "run"))
    assert code == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith(f"aiayn: error: {expected}"), err


def test_an_out_that_cannot_be_written_is_said_before_any_download(hub, tmp_path, capsys) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    code, _, err = run(capsys, REPO, "--out", str(tmp_path / "full"), "--cache-dir", str(tmp_path / "cache"))
    assert code == 2 and "is not empty" in err and hub.requests == []
