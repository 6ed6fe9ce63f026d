"""Shared fixtures: the real data beside the repo, determinism."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """``../shared/data`` (Multi30k and ETT); tests read real data from there, never a copy."""
    if not (DATA / "multi30k" / "val.en").is_file():
        pytest.fail(f"real data not found at {DATA}: CI must have ../shared beside the repo")
    return DATA


@pytest.fixture(scope="session")
def multi30k_dir(data_dir: Path) -> Path:
    return data_dir / "multi30k"


@pytest.fixture(scope="session")
def small_csv(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """The first 600 rows of ETTh1 under a non-ETT name (so 70/10/20 % splits): a small forecasting file."""
    lines = (data_dir / "ett" / "ETTh1.csv").read_text().splitlines(keepends=True)[:601]
    path = tmp_path_factory.mktemp("series") / "small.csv"
    path.write_text("".join(lines))
    return path


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tiny models run faster on one thread, and far faster when the two cores are shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _kill_after_checkpoints(command: list[str], run_dir: Path, n: int, env: dict) -> str:
    """Start ``command`` (a training run into ``run_dir``), SIGKILL it once it has written ``n``
    checkpoints (at most 120 s), and return the name of its newest checkpoint."""
    from aiayn.checkpoint import list_checkpoints

    victim = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while len(list_checkpoints(run_dir)) < n and victim.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    return list_checkpoints(run_dir)[-1].name


@pytest.fixture()
def kill_after_checkpoints():
    """:func:`_kill_after_checkpoints`: kill a training subprocess mid-run, for the resume tests."""
    return _kill_after_checkpoints


# --- a served model: a tiny trained run and a real `aiayn serve` on a free loopback port ---------


@pytest.fixture(scope="session")
def tiny_translation_run(tmp_path_factory) -> Path:
    """A run directory of a tiny model trained for a few seconds on the built-in digits->words task."""
    from aiayn.data.synthetic import write_task
    from aiayn.train.config import run_config_from_dict
    from aiayn.train.trainer import Trainer

    root = tmp_path_factory.mktemp("served")
    write_task(root / "data", seed=0, n_train=2000, n_valid=40, n_test=40)
    model = {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 2, "d_ff": 64}
    values = {
        "model": {**model, "dropout": 0.0, "max_len": 64, "tie_embeddings": "all"},
        "data": {
            "dir": str(root / "data"),
            "src_lang": "digits",
            "tgt_lang": "words",
            "vocab_size": 400,
            "batch_tokens": 1024,
            "max_sentence_tokens": 32,
        },
        "optim": {"lr_schedule": "inverse_sqrt", "peak_lr": 0.005, "warmup": 50},
        "train": {
            "precision": "fp32",
            "device": "cpu",
            "max_steps": 150,
            "save_every": 150,
            "valid_every": 150,
            "valid_bleu": False,
            "log_every": 0,
            "seed": 0,
        },
    }
    Trainer(run_config_from_dict(values), root / "run", log=lambda _: None, progress=False).train()
    return root / "run"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_up(url: str, process: subprocess.Popen, seconds: float = 60.0) -> None:
    import httpx

    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"aiayn serve exited with {process.returncode}: {process.stderr.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"aiayn serve did not answer {url}/health within {seconds} s")


@pytest.fixture()
def live_server():
    """``live_server(run_dir, *flags) -> base URL`` of a real ``aiayn serve`` subprocess on
    127.0.0.1 and a free port; stopped (SIGTERM, then SIGKILL after 10 s) after the test."""
    started: list[subprocess.Popen] = []

    def start(run_dir: Path, *flags: str) -> str:
        port = _free_port()
        command = [
            sys.executable,
            "-m",
            "aiayn",
            "serve",
            "--checkpoint",
            str(run_dir),
            "--port",
            str(port),
            "--device",
            "cpu",
            *flags,
        ]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started.append(process)
        url = f"http://127.0.0.1:{port}"
        _wait_until_up(url, process)
        start.process = process
        return url

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- training: a tiny model on the digits->words task (the test_train_*.py files) ---------------

TINY_MODEL = {
    "d_model": 32,
    "n_heads": 4,
    "n_encoder_layers": 1,
    "n_decoder_layers": 1,
    "d_ff": 64,
    "max_len": 64,
    "tie_embeddings": "all",
}


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    """The built-in digits->words task, small: 400 training pairs, 40 validation and 40 test."""
    from aiayn.data.synthetic import write_task

    directory = tmp_path_factory.mktemp("task")
    write_task(directory, seed=0, n_train=400, n_valid=40, n_test=40)
    return directory


def run_config(data_dir: Path, **sections) -> dict:
    """The values of a run config for :data:`TINY_MODEL` on ``data_dir``, each section updated from
    ``sections``."""
    values = {
        "model": {**TINY_MODEL, "dropout": 0.1},
        "data": {
            "dir": str(data_dir),
            "src_lang": "digits",
            "tgt_lang": "words",
            "vocab_size": 400,
            "batch_tokens": 256,
            "max_sentence_tokens": 32,
        },
        "optim": {"warmup": 10},
        "train": {
            "precision": "fp32",
            "device": "cpu",
            "max_steps": 12,
            "save_every": 4,
            "valid_every": 6,
            "log_every": 1,
            "valid_bleu": False,
            "keep_last": 10,
        },
    }
    for name, updates in sections.items():
        values[name] = {**values[name], **updates}
    return values


def _train_command(config: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "aiayn",
        "train",
        "--config",
        str(config),
        "--out",
        str(out),
        "--no-progress",
    ]


def _write_config(path: Path, values: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(values))
    return path
