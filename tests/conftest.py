"""Shared fixtures: the real data beside the repo, determinism."""

from __future__ import annotations

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
