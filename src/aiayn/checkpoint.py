"""Checkpoints: a directory written atomically and loaded without unpickling.

Layout of one checkpoint directory::

    model.safetensors   the weights (tied tensors stored once)
    config.json         {"format": 1, "kind": "translation" | ..., "model": {...}, ...extra}
    tokenizer.model     the SentencePiece model (translation checkpoints)
    state.safetensors   tensors of the training state (optimizer moments, RNG states)
    state.json          the rest of the training state; tensors appear as {"__tensor__": key}

It is written to a temporary sibling directory, every file fsync'ed, then renamed into place, so a
crash at any moment leaves either the previous checkpoint or the complete new one. Nothing is ever
read with pickle: weights and tensors through safetensors, everything else as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from aiayn.errors import UserError

FORMAT = 1
MODEL_FILE, CONFIG_FILE, TOKENIZER_FILE = "model.safetensors", "config.json", "tokenizer.model"
STATE_TENSORS, STATE_JSON = "state.safetensors", "state.json"
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
    save_file(weights, str(tmp / MODEL_FILE))
    _write_bytes(tmp / CONFIG_FILE, json.dumps({"format": FORMAT, **config}, indent=2).encode())
    if tokenizer_bytes is not None:
        _write_bytes(tmp / TOKENIZER_FILE, tokenizer_bytes)
    if train_state is not None:
        tensors: dict[str, Tensor] = {}
        skeleton = pack_state(train_state, tensors)
        save_file(tensors, str(tmp / STATE_TENSORS))
        _write_bytes(tmp / STATE_JSON, json.dumps(skeleton).encode())
    _fsync_tree(tmp)
    replace_dir(tmp, path)
    remove_abandoned_temporaries(path.parent)
    return path


ABANDONED_AFTER_S = 3600.0  # a temporary untouched this long, its writer gone, is deleted by the next write


def temporary_path(final: Path) -> Path:
    """Where this process builds ``final`` before renaming it: ``.tmp-{name}@{host}+{pid}`` beside it."""
    return final.parent / f".tmp-{final.name}@{socket.gethostname()}+{os.getpid()}"


def remove_abandoned_temporaries(directory: Path) -> None:
    """Delete the :func:`temporary_path` directories that writers on this host abandoned.

    Abandoned: untouched for :data:`ABANDONED_AFTER_S` and its process gone. The age matters as much
    as the pid: a container on this host (same hostname, its own pid namespace) may be writing under
    a pid this process cannot see. Each is renamed to a private name before it is deleted, so a
    writer that renames its temporary into place meanwhile keeps it whole. Off POSIX nothing is
    deleted (no harmless way to ask whether a process exists), and no error here fails a write.
    """
    if os.name != "posix":
        return
    host, now = socket.gethostname(), time.time()
    for tmp in directory.glob(".tmp-*@*+*"):
        rest, _, pid = tmp.name.rpartition("+")
        try:
            if (
                rest.rpartition("@")[2] != host
                or not pid.isdigit()
                or _process_exists(int(pid))
                or now - tmp.stat().st_mtime < ABANDONED_AFTER_S
            ):
                continue
            doomed = tmp.with_name(f".del-{tmp.name}@{host}+{os.getpid()}")
            os.rename(tmp, doomed)
        except (OSError, OverflowError):  # gone meanwhile, renamed into place, or an absurd pid
            continue
        shutil.rmtree(doomed, ignore_errors=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only checks (POSIX)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)


def _fsync_tree(directory: Path) -> None:
    for file in directory.iterdir():
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_dir(tmp: Path, final: Path) -> None:
    """Move ``tmp`` to ``final``; an existing ``final`` is moved aside first, then deleted.

    A crash between the two renames leaves no ``final`` but its previous version in ``.old-*``:
    readers fall back to that copy (:func:`resolve_checkpoint`), and the next write here first moves
    it back (:func:`recover_replaced`). Readers never rename: a writer may be between the renames.
    """
    recover_replaced(final)
    old = final.parent / f".old-{final.name}-{os.getpid()}"
    if final.exists():
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def recover_replaced(final: Path) -> None:
    """Undo an interrupted :func:`replace_dir`: put back the previous ``final``, drop stale copies.

    When ``final`` is missing, the newest complete ``.old-{name}-*`` beside it (the version that was
    being replaced) is renamed back. ``.old-*`` copies left once ``final`` exists are deleted.
    """
    if not final.exists() and (copy := _replaced_copy(final)) is not None:
        os.rename(copy, final)
        _fsync_dir(final.parent)
    if final.exists():
        for stale in final.parent.glob(f".old-{final.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)


def _replaced_copy(final: Path) -> Path | None:
    """The newest complete ``.old-*`` copy of ``final`` an interrupted replacement left, if any."""
    if not final.parent.is_dir():
        return None
    complete = [p for p in final.parent.glob(f".old-{final.name}-*") if (p / CONFIG_FILE).is_file()]
    return max(complete, key=_mtime, default=None)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile by the writer
        return 0.0


def _in_place(path: Path) -> Path:
    """``path``, or when it is missing the copy an interrupted replacement left (read-only fallback)."""
    return path if path.exists() else (_replaced_copy(path) or path)


# --- reading --------------------------------------------------------------------------------------


def load_checkpoint(path: str | Path, with_state: bool = True) -> Checkpoint:
    """Read a checkpoint directory (or a run directory: its best, else its latest checkpoint).

    Any missing or unreadable file is a :class:`UserError` naming that file.
    """
    path = resolve_checkpoint(path)
    config = _read_json(path / CONFIG_FILE)
    if not isinstance(config, dict):
        raise UserError(
            f"corrupt checkpoint file {path / CONFIG_FILE}: expected a JSON object, "
            f"got {type(config).__name__}"
        )
    weights = _read_tensors(path / MODEL_FILE)
    tokenizer = (path / TOKENIZER_FILE).read_bytes() if (path / TOKENIZER_FILE).is_file() else None
    state = None
    if with_state and (path / STATE_JSON).is_file():
        state = unpack_state(_read_json(path / STATE_JSON), _read_tensors(path / STATE_TENSORS))
    return Checkpoint(path, config, weights, tokenizer, state)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory itself, or for a run directory its ``best/``, else its latest."""
    path = _in_place(Path(path))
    if (path / CONFIG_FILE).is_file() or (path / MODEL_FILE).is_file():
        return path
    best = _in_place(path / BEST_DIR)
    if (best / CONFIG_FILE).is_file():
        return best
    latest = latest_checkpoint(path)
    if latest is not None:
        return latest
    if not path.exists():
        raise UserError(f"checkpoint not found: {path}")
    raise UserError(f"no checkpoint in {path} (expected {CONFIG_FILE} and {MODEL_FILE}, or a run directory)")


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"checkpoint file missing: {file}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"corrupt checkpoint file {file}: {err}") from None


def _read_tensors(file: Path) -> dict[str, Tensor]:
    if not file.is_file():
        raise UserError(f"checkpoint file missing: {file}")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise UserError(f"corrupt checkpoint file {file}: {err}") from None


def load_weights(model: nn.Module, weights: dict[str, Tensor], source: Path | str = "checkpoint") -> None:
    """Load ``weights`` into ``model``; tied names absent from the file are fine, others are not."""
    state = model.state_dict()
    stored = {state[name].data_ptr() for name in weights if name in state}
    tied = {name for name, tensor in state.items() if name not in weights and tensor.data_ptr() in stored}
    wrong = [
        f"{name} {list(weights[name].shape)} (the model's {list(state[name].shape)})"
        for name in weights
        if name in state and weights[name].shape != state[name].shape
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


# --- loading a trained model for inference -------------------------------------------------------


@dataclass(frozen=True)
class LoadedModel:
    """What :func:`load` returns; unpacks as ``model, tokenizer, config = aiayn.load(path)``."""

    model: nn.Module  #: in eval mode, on the requested device
    tokenizer: Any  #: :class:`aiayn.data.Tokenizer`; None for a forecasting model
    config: Any  #: :class:`aiayn.TransformerConfig`, or :class:`aiayn.forecast.ForecastConfig`
    checkpoint: Checkpoint  #: where it came from, with the stored ``config.json`` (run settings, step)

    @property
    def kind(self) -> str:
        return self.checkpoint.kind

    def __iter__(self):
        return iter((self.model, self.tokenizer, self.config))


def load(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """A trained model from a checkpoint or run directory (a run's ``best/``, else its latest).

    Translation checkpoints give the :class:`~aiayn.model.Transformer` and its tokenizer,
    forecasting ones the :class:`~aiayn.forecast.Forecaster` (tokenizer None). Every file is
    checked against the checkpoint's checksums; a bad or missing file is a :class:`UserError`
    naming it.
    """
    ckpt = load_checkpoint(path, with_state=False)
    if ckpt.kind == "translation":
        model, tokenizer, config = _translation_model(ckpt)
    elif ckpt.kind == "forecast":
        model = _forecast_model(ckpt)
        tokenizer, config = None, model.config
    else:
        raise UserError(f"{ckpt.path / CONFIG_FILE}: unknown checkpoint kind {ckpt.kind!r}")
    return LoadedModel(model.to(device).eval(), tokenizer, config, ckpt)


def load_translation_model(path: str | Path, device: str | torch.device = "cpu"):
    """``(model, tokenizer, checkpoint)`` from a checkpoint or run directory, model in eval mode."""
    loaded = load(path, device)
    if loaded.kind != "translation":
        raise UserError(f"{loaded.checkpoint.path} is a {loaded.kind!r} checkpoint, not a translation model")
    return loaded.model, loaded.tokenizer, loaded.checkpoint


def _translation_model(ckpt: Checkpoint):
    from aiayn.config import TransformerConfig
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.model import build_model

    try:
        config = TransformerConfig.from_dict(ckpt.config["model"])
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"corrupt checkpoint file {ckpt.path / CONFIG_FILE}: {err}") from None
    if ckpt.tokenizer_bytes is None:
        raise UserError(f"checkpoint file missing: {ckpt.path / TOKENIZER_FILE}")
    try:
        tokenizer = Tokenizer.from_bytes(ckpt.tokenizer_bytes)
    except UserError as err:
        raise UserError(f"corrupt checkpoint file {ckpt.path / TOKENIZER_FILE}: {err}") from None
    _check_vocabulary(ckpt.path, config, tokenizer.vocab_size)
    model = build_model(config)
    load_weights(model, ckpt.weights, ckpt.path / MODEL_FILE)
    return model, tokenizer, config


def _forecast_model(ckpt: Checkpoint):
    from aiayn.forecast.model import ForecastConfig, Forecaster

    try:
        config = ForecastConfig.from_dict(ckpt.config["model"])
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"corrupt checkpoint file {ckpt.path / CONFIG_FILE}: model: {err}") from None
    model = Forecaster(config)
    load_weights(model, ckpt.weights, ckpt.path / MODEL_FILE)
    return model


def _check_vocabulary(path: Path, config, pieces: int) -> None:
    """The tokenizer's ids must be the model's: more pieces overrun the embeddings, fewer cannot
    decode every output id."""
    for name in ("src_vocab_size", "tgt_vocab_size"):
        if getattr(config, name) != pieces:
            raise UserError(
                f"{path}: {TOKENIZER_FILE} has {pieces} pieces but {CONFIG_FILE} says "
                f"{name}={getattr(config, name)}; they must be equal"
            )
