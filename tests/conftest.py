"""Shared fixtures: the real data beside the repo, determinism."""

from __future__ import annotations

import signal
import subprocess
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
