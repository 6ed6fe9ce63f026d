"""Multi30k download against a local HTTP server (127.0.0.1 only): good, corrupt, truncated, missing.

The server serves a synthetic corpus in Multi30k's layout, and the checksum table is patched to its
files' digests; the real table is checked against the shared copy of Multi30k."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import http.server
import os
import socket
import threading
from pathlib import Path

import pytest

from aiayn.cli import main
from aiayn.data import download
from aiayn.data.cli import register
from aiayn.data.download import SPLITS, download_multi30k
from aiayn.errors import UserError

SUBSET = dict(languages=["en", "de"], splits=["val", "test2016"])


class Handler(http.server.BaseHTTPRequestHandler):
    """Serves ``{upstream}.{lang}.gz`` from ``server.root``; ``server.faults`` maps a name to a fault."""

    def do_GET(self):  # noqa: N802 (http.server's naming)
        name = self.path.rsplit("/", 1)[-1]
        self.server.requests.append(name)
        file = self.server.root / name
        fault = self.server.faults.get(name)
        if fault == "404" or not file.is_file():
            return self.send_error(404)
        body = file.read_bytes()
        self.send_response(200)
        if fault == "cut_no_length":  # the connection closes early, no Content-Length to notice it
            return self._finish(body[: len(body) // 2])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if fault == "cut" else body)

    def _finish(self, body: bytes):
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory, parallel_dir):
    """Serves ``parallel_dir``'s files (``server.source``) gzipped under their upstream names, with
    their digests in ``server.digests``."""
    root = tmp_path_factory.mktemp("served")
    digests = dict(download.SHA256)
    for split, upstream in SPLITS.items():
        for lang in ("en", "de"):
            data = (parallel_dir / f"{split}.{lang}").read_bytes()
            (root / f"{upstream}.{lang}.gz").write_bytes(gzip.compress(data, mtime=0))
            digests[f"{split}.{lang}"] = hashlib.sha256(data).hexdigest()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.root, httpd.faults, httpd.requests = root, {}, []
    httpd.source, httpd.digests = parallel_dir, digests
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def url(server, monkeypatch):
    """The served directory's URL; ``download.SHA256`` holds the served files' digests meanwhile."""
    monkeypatch.setattr(download, "SHA256", server.digests)
    server.faults.clear()
    server.requests.clear()
    return f"http://127.0.0.1:{server.server_address[1]}/data/task1/raw"


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir()) if out.exists() else []


def test_good_download_equals_originals_and_is_not_repeated(tmp_path, url, server):
    out = tmp_path / "m30k"
    paths = download_multi30k(out, base_url=url, **SUBSET)
    assert [p.name for p in paths] == ["val.en", "val.de", "test2016.en", "test2016.de"]
    assert all(p.read_bytes() == (server.source / p.name).read_bytes() for p in paths)
    umask = os.umask(0)
    os.umask(umask)
    assert {p.stat().st_mode & 0o777 for p in paths} == {
        0o666 & ~umask
    }  # as a plain new file, not mkstemp's 0600
    assert leftovers(out) == sorted(p.name for p in paths)
    assert len(server.requests) == 4
    download_multi30k(out, base_url=url, **SUBSET)
    assert len(server.requests) == 4  # verified files are kept, not fetched again


def test_corrupt_file_fails_and_leaves_nothing(tmp_path, url, server):
    data = bytearray((server.source / "val.de").read_bytes())
    data[1000] ^= 0x01
    (server.root / "val.de.gz").rename(server.root / "val.de.gz.orig")
    try:
        (server.root / "val.de.gz").write_bytes(gzip.compress(bytes(data)))
        with pytest.raises(
            UserError,
            match=r"val\.de: checksum mismatch for http://127\.0\.0\.1:\d+/data/task1/raw/val\.de\.gz",
        ):
            download_multi30k(tmp_path, base_url=url, **SUBSET)
    finally:
        (server.root / "val.de.gz.orig").replace(server.root / "val.de.gz")
    assert leftovers(tmp_path) == ["val.en"]  # the file before it is complete; no val.de, no temp file


@pytest.mark.parametrize("fault", ["cut", "cut_no_length"])
def test_interrupted_download_fails_and_leaves_nothing(tmp_path, url, server, fault):
    server.faults["test_2016_flickr.en.gz"] = fault
    with pytest.raises(UserError, match=r"^test2016\.en: .*test_2016_flickr\.en\.gz") as err:
        download_multi30k(tmp_path, base_url=url, **SUBSET)
    expected = "IncompleteRead" if fault == "cut" else "not a complete gzip file"
    assert expected in str(err.value)
    assert leftovers(tmp_path) == ["val.de", "val.en"]


def test_not_gzip(tmp_path, url, server):
    (server.root / "junk.en.gz").write_bytes(b"<html>not found</html>")
    with pytest.raises(UserError, match=r"val\.en: .* is not a complete gzip file"):
        download.fetch_verified(f"{url}/junk.en.gz", tmp_path / "val.en", download.SHA256["val.en"])
    assert leftovers(tmp_path) == []


def test_missing_file_is_404(tmp_path, url, server):
    server.faults["val.de.gz"] = "404"
    with pytest.raises(UserError, match=r"^val\.de: download failed, HTTP 404 .*val\.de\.gz"):
        download_multi30k(tmp_path, base_url=url, **SUBSET)
    assert leftovers(tmp_path) == ["val.en"]


def test_connection_refused(tmp_path):
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens on it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(UserError, match=r"^val\.en: download failed for http://127\.0\.0\.1"):
        download_multi30k(tmp_path, base_url=f"http://127.0.0.1:{port}", languages=["en"], splits=["val"])
    assert leftovers(tmp_path) == []


def test_unknown_language_or_split(tmp_path):
    with pytest.raises(UserError, match="unknown Multi30k language.* xx; valid: en, de, fr, cs"):
        download_multi30k(tmp_path, languages=["en", "xx"])
    with pytest.raises(UserError, match="unknown Multi30k split.* test2017"):
        download_multi30k(tmp_path, splits=["test2017"])


def test_checksum_table_matches_the_shared_copy(multi30k_dir):
    sums = dict(
        line.split()[::-1]
        for line in (multi30k_dir.parent / "SHA256SUMS").read_text().splitlines()
        if "multi30k/" in line and "README" not in line
    )
    assert {f"multi30k/{name}": digest for name, digest in download.SHA256.items()} == sums


# --- the `aiayn data` command ---------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="aiayn")
    register(root.add_subparsers(dest="command", required=True))
    return root


def test_cli_multi30k(tmp_path, url, capsys):
    args = parser().parse_args(["data", "multi30k", "--out", str(tmp_path), "--url", url, "--langs", "en,de"])
    assert args.func(args) == 0
    assert leftovers(tmp_path) == sorted(f"{s}.{line}" for s in SPLITS for line in ("de", "en"))
    assert "wrote 6 verified files" in capsys.readouterr().out


def test_cli_synthetic(tmp_path, capsys):
    args = parser().parse_args(
        ["data", "synthetic", "--out", str(tmp_path), "--seed", "3", "--n-train", "200"]
    )
    assert args.func(args) == 0
    assert (tmp_path / "train.digits").read_text().count("\n") == 200
    assert "train 200, val 1000, test 1000" in capsys.readouterr().out


def test_cli_unwritable_out_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    for args in (
        ["data", "synthetic", "--out", str(tmp_path / "afile" / "x")],
        ["data", "multi30k", "--out", str(tmp_path / "afile")],
    ):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("aiayn: error: ") and err.count("\n") == 1 and str(tmp_path / "afile") in err, (
            err
        )


def test_cli_bad_input_raises_user_error(tmp_path):
    args = parser().parse_args(["data", "multi30k", "--out", str(tmp_path), "--langs", "en,klingon"])
    with pytest.raises(UserError, match="klingon"):
        args.func(args)
    with pytest.raises(SystemExit):
        parser().parse_args(["data"])  # a sub-command is required
