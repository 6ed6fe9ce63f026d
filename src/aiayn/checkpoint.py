"""Checkpoints: a directory written atomically and loaded without unpickling.

Layout of one checkpoint directory::

    model.safetensors   the weights (tied tensors stored once)
    config.json         {"format": 2, "kind": "translation" | "forecast", "model": {...}, ...extra}
    tokenizer.model     the SentencePiece model (translation checkpoints)
    state.safetensors   tensors of the training state (optimizer moments, RNG states)
    state.json          the rest of the training state; tensors appear as {"__tensor__": key}
    manifest.json       the SHA-256 of every other file, and of its own list

It is written to a temporary sibling directory, every file fsync'ed, then renamed into place, so a
crash at any moment leaves either the previous checkpoint or the complete new one. Every load checks
each file it reads against the manifest, so a file changed on disk afterwards (a flipped byte, a
truncation) is refused with one line naming it, never loaded as a silently different model.
Checkpoints of format 1 (written before the manifest existed) load unchecked. Nothing is ever read
with pickle: weights and tensors through safetensors, everything else as JSON.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from aiayn.errors import UserError
from aiayn.io import (
    file_sha256,
    fsync_tree,
    in_place,
    remove_abandoned_temporaries,
    replace_dir,
    temporary_path,
)

FORMAT = 2  # 2: with manifest.json
MODEL_FILE, CONFIG_FILE, TOKENIZER_FILE = "model.safetensors", "config.json", "tokenizer.model"
STATE_TENSORS, STATE_JSON, MANIFEST_FILE = "state.safetensors", "state.json", "manifest.json"
CHECKPOINTS_DIR, BEST_DIR = "checkpoints", "best"


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` reads back."""

    path: Path
    config: dict[str, Any]  # the whole config.json
    weights: dict[str, Tensor]
    tokenizer_bytes: bytes | None
    train_state: dict[str, Any] | None  # tensors restored in place of their references

    @property
    def kind(self) -> str:
        kind = self.config.get("kind", "translation")  # config: a JSON object (load_checkpoint checks)
        if not isinstance(kind, str):
            raise UserError(f'corrupt checkpoint file {self.path / CONFIG_FILE}: "kind" must be a string')
        return kind


# --- nested state <-> (tensors, JSON) -------------------------------------------------------------


def pack_state(obj: Any, tensors: dict[str, Tensor], prefix: str = "s") -> Any:
    """Split a nested state (dicts, lists, tensors, numbers) into JSON and a flat tensor dict.

    Dicts whose keys are not all strings (an optimizer's ``state`` uses int keys) are stored as
    ``{"__items__": [[key, value], ...]}`` so the key types survive JSON.
    """
    if isinstance(obj, Tensor):
        key = f"{prefix}"
        tensors[key] = obj.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: pack_state(v, tensors, f"{prefix}.{k}") for k, v in obj.items()}
        return {"__items__": [[k, pack_state(v, tensors, f"{prefix}.{k}")] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return [pack_state(v, tensors, f"{prefix}.{i}") for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} at {prefix} in a checkpoint")


def unpack_state(obj: Any, tensors: dict[str, Tensor]) -> Any:
    """Inverse of :func:`pack_state` (tuples come back as lists)."""
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            return tensors[obj["__tensor__"]]
        if set(obj) == {"__items__"}:
            return {k: unpack_state(v, tensors) for k, v in obj["__items__"]}
        return {k: unpack_state(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [unpack_state(v, tensors) for v in obj]
    return obj


# --- writing --------------------------------------------------------------------------------------


def unique_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The state dict with tied tensors kept once (first name wins), as safetensors requires."""
    seen: set[int] = set()
    out: dict[str, Tensor] = {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        out[name] = tensor.detach().cpu().contiguous()
    return out


def save_checkpoint(
    path: str | Path,
    model: nn.Module | dict[str, Tensor],
    config: dict[str, Any],
    tokenizer_bytes: bytes | None = None,
    train_state: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint directory atomically and return its path.

    ``model``: a module (tied weights stored once) or an already flat tensor dict.
    ``config``: JSON-able; should hold "kind" and "model" (the model config as a dict).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    weights = unique_state_dict(model) if isinstance(model, nn.Module) else model
    # tensors stream from their own memory into the files: no serialized copy of the weights and the
    # optimizer state is ever held in memory
    save_file(weights, str(tmp / MODEL_FILE))
    files = {CONFIG_FILE: json.dumps({"format": FORMAT, **config}, indent=2).encode()}
    if tokenizer_bytes is not None:
        files[TOKENIZER_FILE] = tokenizer_bytes
    if train_state is not None:
        tensors: dict[str, Tensor] = {}
        skeleton = pack_state(train_state, tensors)
        save_file(tensors, str(tmp / STATE_TENSORS))
        files[STATE_JSON] = json.dumps(skeleton).encode()
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    digests = {file.name: file_sha256(file) for file in sorted(tmp.iterdir())}
    (tmp / MANIFEST_FILE).write_bytes(_manifest(digests))
    fsync_tree(tmp)
    replace_dir(tmp, path)
    remove_abandoned_temporaries(path.parent)
    return path


# --- reading --------------------------------------------------------------------------------------


def load_checkpoint(path: str | Path, with_state: bool = True) -> Checkpoint:
    """Read a checkpoint directory (or a run directory: its best, else its latest checkpoint).

    Any missing, unreadable or changed file (its SHA-256 not the manifest's) is a
    :class:`UserError` naming that file.
    """
    files = _Files(resolve_checkpoint(path))
    config = files.json(CONFIG_FILE)
    if not isinstance(config, dict):
        raise UserError(
            f"corrupt checkpoint file {files.path / CONFIG_FILE}: expected a JSON object, "
            f"got {type(config).__name__}"
        )
    files.require_manifest(config)
    weights = files.tensors(MODEL_FILE)
    tokenizer = files.read(TOKENIZER_FILE) if files.has(TOKENIZER_FILE) else None
    state = None
    if with_state and files.has(STATE_JSON):
        state = unpack_state(files.json(STATE_JSON), files.tensors(STATE_TENSORS))
    return Checkpoint(files.path, config, weights, tokenizer, state)


class _Files:
    """The files of one checkpoint directory, each read once and checked against its manifest."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.expected = _read_manifest(path / MANIFEST_FILE) if (path / MANIFEST_FILE).is_file() else None

    def require_manifest(self, config: dict[str, Any]) -> None:
        """Only format-1 checkpoints (from before checksums) may lack the manifest."""
        if self.expected is None and config.get("format", 1) != 1:
            raise UserError(f"checkpoint file missing: {self.path / MANIFEST_FILE}")

    def has(self, name: str) -> bool:
        return name in self.expected if self.expected is not None else (self.path / name).is_file()

    def read(self, name: str) -> bytes:
        self.check(name)
        return (self.path / name).read_bytes()

    def check(self, name: str) -> None:
        """The file exists, is readable, and has the manifest's SHA-256 (when there is a manifest)."""
        file = self.path / name
        try:
            digest = file_sha256(file)
        except FileNotFoundError:
            raise UserError(f"checkpoint file missing: {file}") from None
        except OSError as err:
            raise UserError(f"cannot read checkpoint file {file}: {err.strerror}") from None
        if self.expected is not None and self.expected.get(name) != digest:
            raise UserError(
                f"corrupt checkpoint file {file}: its SHA-256 is not the one in {MANIFEST_FILE} "
                "(the file changed after it was written)"
            )

    def json(self, name: str) -> Any:
        try:
            return json.loads(self.read(name).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise UserError(f"corrupt checkpoint file {self.path / name}: {err}") from None

    def tensors(self, name: str) -> dict[str, Tensor]:
        self.check(name)
        try:
            return load_file(str(self.path / name))  # read from a memory map: one copy, into the tensors
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            raise UserError(f"corrupt checkpoint file {self.path / name}: {err}") from None


def seal(path: str | Path) -> None:
    """(Re)write the manifest of the checkpoint directory ``path`` from the files in it now.

    For checkpoints assembled by hand or converted by other tools; a checkpoint written by
    :func:`save_checkpoint` is sealed already.
    """
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name != MANIFEST_FILE)
    (path / MANIFEST_FILE).write_bytes(_manifest({p.name: file_sha256(p) for p in files}))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest(digests: dict[str, str]) -> bytes:
    """``{"files": {name: sha256}, "sha256": <of the files list>}``: the manifest checks itself too."""
    return json.dumps({"files": digests, "sha256": _sha256(_canonical(digests))}, indent=2).encode()


def _canonical(digests: dict[str, str]) -> bytes:
    return json.dumps(digests, sort_keys=True, separators=(",", ":")).encode()


def _read_manifest(file: Path) -> dict[str, str]:
    try:
        manifest = json.loads(file.read_bytes().decode("utf-8"))
        digests = manifest["files"]
        ok = isinstance(digests, dict) and manifest["sha256"] == _sha256(_canonical(digests))
    except OSError as err:
        raise UserError(f"cannot read checkpoint file {file}: {err.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise UserError(f"corrupt checkpoint file {file}: {err}") from None
    if not ok:
        raise UserError(f"corrupt checkpoint file {file}: its own checksum does not match")
    return digests


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory itself, or for a run directory its ``best/``, else its latest."""
    path = in_place(Path(path))
    if (path / CONFIG_FILE).is_file() or (path / MODEL_FILE).is_file():
        return path
    best = in_place(path / BEST_DIR)
    if (best / CONFIG_FILE).is_file():
        return best
    latest = latest_checkpoint(path)
    if latest is not None:
        return latest
    if not path.exists():
        raise UserError(f"checkpoint not found: {path}")
    raise UserError(f"no checkpoint in {path} (expected {CONFIG_FILE} and {MODEL_FILE}, or a run directory)")


def load_weights(model: nn.Module, weights: dict[str, Tensor], source: Path | str = "checkpoint") -> None:
    """Load ``weights`` into ``model``; tied names absent from the file are fine, others are not."""
    state = model.state_dict()
    stored = {state[name].data_ptr() for name in weights if name in state}
    tied = {name for name, tensor in state.items() if name not in weights and tensor.data_ptr() in stored}
    wrong = [
        f"{name} {list(weights[name].shape)} (the model's {list(state[name].shape)})"
        for name in state  # the model's order: the file's is not fixed
        if name in weights and weights[name].shape != state[name].shape
    ]
    if wrong:
        raise UserError(
            f"{source}: weights do not fit the model its config describes: "
            f"{len(wrong)} of a wrong shape, e.g. {', '.join(wrong[:3])}"
        )
    result = model.load_state_dict(weights, strict=False)
    missing = sorted(set(result.missing_keys) - tied)
    if missing or result.unexpected_keys:
        raise UserError(
            f"{source}: weights do not fit the model (missing {missing[:5]}, "
            f"unexpected {sorted(result.unexpected_keys)[:5]})"
        )


# --- run directories ------------------------------------------------------------------------------


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """A run's checkpoints, oldest first (temporary directories are ignored)."""
    folder = Path(run_dir) / CHECKPOINTS_DIR
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("step-"))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def prune_checkpoints(run_dir: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints of a run (``keep <= 0`` keeps all)."""
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
