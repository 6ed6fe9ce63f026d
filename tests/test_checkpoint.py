"""Checkpoints: atomic directories, no pickle, tied weights, clear errors on corruption."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
import torch

from aiayn import TransformerConfig, build_model
from aiayn.checkpoint import (
    MODEL_FILE,
    STATE_JSON,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_weights,
    pack_state,
    prune_checkpoints,
    save_checkpoint,
    seal,
    unpack_state,
)
from aiayn.errors import UserError
from aiayn.io import ABANDONED_AFTER_S, temporary_path
from aiayn.loading import load_translation_model


def _model(tie: str = "all"):
    config = TransformerConfig(
        src_vocab_size=40,
        tgt_vocab_size=40,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=32,
        tie_embeddings=tie,
    )
    return build_model(config), config


def test_round_trip_with_tied_weights_and_train_state(tmp_path) -> None:
    model, config = _model()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.tensor([[5, 6, 3]]), torch.tensor([[2, 7]])).sum().backward()
    optimizer.step()
    rng = torch.get_rng_state()
    state = {"optimizer": optimizer.state_dict(), "step": 7, "rng": rng, "none": None}
    path = save_checkpoint(
        tmp_path / "ck",
        model,
        {"kind": "translation", "model": config.to_dict()},
        tokenizer_bytes=b"spm",
        train_state=state,
    )
    ckpt = load_checkpoint(path)
    assert ckpt.tokenizer_bytes == b"spm" and ckpt.kind == "translation"
    assert ckpt.config["model"] == config.to_dict()
    assert "generator.proj.weight" not in ckpt.weights or "tgt_embed.lut.weight" not in ckpt.weights
    fresh, _ = _model()
    load_weights(fresh, ckpt.weights)
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    assert fresh.generator.proj.weight is fresh.tgt_embed.weight  # still tied after loading
    new_optimizer = torch.optim.Adam(fresh.parameters())
    new_optimizer.load_state_dict(ckpt.train_state["optimizer"])
    assert ckpt.train_state["step"] == 7 and torch.equal(ckpt.train_state["rng"], rng)
    exp_avg = [s["exp_avg"] for s in optimizer.state_dict()["state"].values()]
    assert all(
        torch.equal(a, s["exp_avg"]) for a, s in zip(exp_avg, new_optimizer.state_dict()["state"].values())
    )


def test_pack_state_keeps_int_keys_and_rejects_objects() -> None:
    tensors: dict = {}
    packed = pack_state({"state": {0: {"m": torch.ones(2)}}, "betas": (0.9, 0.98)}, tensors)
    json.dumps(packed)
    restored = unpack_state(json.loads(json.dumps(packed)), tensors)
    assert list(restored["state"]) == [0] and restored["betas"] == [0.9, 0.98]
    with pytest.raises(TypeError):
        pack_state({"x": object()}, {})


def test_missing_and_corrupt_checkpoints_name_the_file(tmp_path) -> None:
    model, config = _model()
    run = tmp_path / "run"
    first = save_checkpoint(
        run / "checkpoints" / "step-00000001", model, {"kind": "translation"}, train_state={"a": 1}
    )
    second = save_checkpoint(
        run / "checkpoints" / "step-00000002", model, {"kind": "translation"}, train_state={"a": 2}
    )
    assert latest_checkpoint(run) == second
    (second / MODEL_FILE).write_bytes((second / MODEL_FILE).read_bytes()[:100])  # truncated
    with pytest.raises(UserError, match=f"corrupt checkpoint file {second / MODEL_FILE}"):
        load_checkpoint(second)
    (first / STATE_JSON).write_text("{not json")
    with pytest.raises(UserError, match=f"corrupt checkpoint file {first / STATE_JSON}"):
        load_checkpoint(first)
    assert load_checkpoint(first, with_state=False).config["kind"] == "translation"
    with pytest.raises(UserError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "nowhere")
    with pytest.raises(UserError, match="no checkpoint in"):
        load_checkpoint(tmp_path)


def test_overwrite_is_atomic_and_prune_keeps_newest(tmp_path) -> None:
    model, _ = _model()
    run = tmp_path / "run"
    for step in range(1, 5):
        save_checkpoint(
            run / "checkpoints" / f"step-{step:08d}", model, {"kind": "translation", "step": step}
        )
    save_checkpoint(run / "checkpoints" / "step-00000004", model, {"kind": "translation", "step": 44})
    assert load_checkpoint(run / "checkpoints" / "step-00000004").config["step"] == 44
    prune_checkpoints(run, keep=2)
    assert [p.name for p in list_checkpoints(run)] == ["step-00000003", "step-00000004"]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


def test_crash_between_the_renames_of_a_replacement_loses_nothing(tmp_path) -> None:
    """The state a crash leaves inside ``replace_dir``: ``best/`` moved aside, the new copy half written."""
    model, _ = _model()
    run = tmp_path / "run"
    save_checkpoint(run / "best", model, {"kind": "translation", "step": 1})
    (run / "best").rename(run / ".old-best-4242")
    (run / ".tmp-best@host+4242").mkdir()
    (run / ".tmp-best@host+4242" / MODEL_FILE).write_bytes(b"half")
    # readers find the previous version and leave the directory as it is (a writer may be mid-way)
    assert load_checkpoint(run).config["step"] == 1
    assert load_checkpoint(run / "best").config["step"] == 1
    assert not (run / "best").exists()
    # the next write puts the old copy back first, then replaces it; nothing stale is left
    save_checkpoint(run / "best", model, {"kind": "translation", "step": 2})
    assert load_checkpoint(run / "best").config["step"] == 2
    assert not list(run.glob(".old-*"))


def test_a_write_removes_what_dead_writers_on_this_host_left_only(tmp_path) -> None:
    """An old temporary of a dead process on this host goes; a live writer's, another host's, a
    recent one (its writer may live in another pid namespace) and one with an absurd pid stay."""
    model, _ = _model()
    run = tmp_path / "run"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host, old = socket.gethostname(), time.time() - 2 * ABANDONED_AFTER_S
    left = {
        name: run / f".tmp-step-00000001@{name}"
        for name in (
            f"{host}+{dead.pid}",
            f"{host}+{os.getpid()}",
            f"other-host+{dead.pid}",
            f"{host}+{10**30}",
        )
    }
    for directory in left.values():
        directory.mkdir(parents=True)
        (directory / MODEL_FILE).write_bytes(b"half")
        os.utime(directory, (old, old))
    recent = run / f".tmp-averaged@{host}+{dead.pid}"
    recent.mkdir()
    save_checkpoint(run / "best", model, {"kind": "translation", "step": 1})
    kept = [left[f"{host}+{os.getpid()}"], left[f"other-host+{dead.pid}"], left[f"{host}+{10**30}"], recent]
    assert sorted(p.name for p in run.glob(".*")) == sorted(p.name for p in kept)
    assert temporary_path(run / "best").name == f".tmp-best@{host}+{os.getpid()}"


def test_weights_of_another_model_are_refused(tmp_path) -> None:
    model, _ = _model()
    other = build_model(
        TransformerConfig(
            src_vocab_size=40,
            tgt_vocab_size=40,
            d_model=16,
            n_heads=2,
            n_encoder_layers=2,
            n_decoder_layers=1,
            d_ff=32,
        )
    )
    path = save_checkpoint(tmp_path / "ck", other, {"kind": "translation"})
    with pytest.raises(UserError, match="do not fit"):
        load_weights(model, load_checkpoint(path).weights, path)


def test_weights_of_another_shape_are_a_user_error_naming_the_file(tmp_path) -> None:
    model, _ = _model()
    other = build_model(
        TransformerConfig(
            src_vocab_size=40,
            tgt_vocab_size=40,
            d_model=16,
            n_heads=2,
            n_encoder_layers=1,
            n_decoder_layers=1,
            d_ff=64,
        )
    )
    path = save_checkpoint(tmp_path / "ck", other, {"kind": "translation"})
    expected = rf"{re.escape(str(path / MODEL_FILE))}: .*wrong shape.*w_1.weight \[64, 16\]"
    with pytest.raises(UserError, match=expected):
        load_weights(model, load_checkpoint(path).weights, path / MODEL_FILE)


@pytest.mark.parametrize("text", ["[1, 2]", '"translation"', "null"])
def test_config_json_that_is_not_an_object_is_a_user_error(tmp_path, text) -> None:
    model, config = _model()
    path = save_checkpoint(tmp_path / "ck", model, {"kind": "translation", "model": config.to_dict()}, b"spm")
    (path / "config.json").write_text(text)
    seal(path)  # a well-formed but wrong file, as a hand-assembled checkpoint's could be
    expected = re.escape(f"corrupt checkpoint file {path / 'config.json'}: expected a JSON object")
    with pytest.raises(UserError, match=expected):
        load_checkpoint(path)
    with pytest.raises(UserError, match="expected a JSON object"):
        load_translation_model(path)


# --- integrity: every file checked against the manifest ---------------------------------------------


def _full_checkpoint(tmp_path, parallel_dir):
    """A translation checkpoint with every kind of file: weights, config, tokenizer, training state."""
    from aiayn.data.tokenizer import Tokenizer

    lines = (parallel_dir / "val.en").read_text(encoding="utf-8").splitlines()[:200]
    tokenizer = Tokenizer.train(lines, vocab_size=400)
    config = TransformerConfig(
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=32,
        max_len=32,
    )
    model = build_model(config)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.tensor([[5, 6, 3]]), torch.tensor([[2, 7]])).sum().backward()
    optimizer.step()
    meta = {"kind": "translation", "model": config.to_dict()}
    state = {"optimizer": optimizer.state_dict(), "step": 1}
    return save_checkpoint(tmp_path / "ck", model, meta, tokenizer.to_bytes(), train_state=state)


def _flip_middle_byte(file) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit: headers and lengths stay intact
    file.write_bytes(bytes(data))


FILES = ["model.safetensors", "config.json", "tokenizer.model", "state.safetensors", "state.json"]


def test_the_manifest_lists_every_file_with_its_sha256(tmp_path, parallel_dir) -> None:
    import hashlib

    path = _full_checkpoint(tmp_path, parallel_dir)
    manifest = json.loads((path / "manifest.json").read_text())
    assert sorted(manifest["files"]) == sorted(FILES)
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((path / name).read_bytes()).hexdigest() == digest, name
    assert load_checkpoint(path).train_state["step"] == 1


@pytest.mark.parametrize("name", [*FILES, "manifest.json"])
def test_a_flipped_byte_in_any_file_is_refused_naming_it(tmp_path, parallel_dir, name) -> None:
    path = _full_checkpoint(tmp_path, parallel_dir)
    _flip_middle_byte(path / name)
    with pytest.raises(UserError, match=re.escape(f"corrupt checkpoint file {path / name}")):
        load_checkpoint(path)


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.model", "manifest.json"])
def test_translate_on_a_corrupted_checkpoint_is_one_line_and_exit_2(
    tmp_path, parallel_dir, name, capsys
) -> None:
    from aiayn.cli import main

    path = _full_checkpoint(tmp_path, parallel_dir)
    _flip_middle_byte(path / name)
    (tmp_path / "in.txt").write_text("A dog runs.\n")
    code = main(["translate", "--checkpoint", str(path), "--input", str(tmp_path / "in.txt"), "--beam", "1"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"corrupt checkpoint file {path / name}" in err


def test_a_missing_listed_file_or_manifest_is_named(tmp_path, parallel_dir) -> None:
    path = _full_checkpoint(tmp_path, parallel_dir)
    (path / "tokenizer.model").unlink()
    with pytest.raises(UserError, match=re.escape(f"checkpoint file missing: {path / 'tokenizer.model'}")):
        load_checkpoint(path)
    (path / "manifest.json").unlink()
    with pytest.raises(UserError, match=re.escape(f"checkpoint file missing: {path / 'manifest.json'}")):
        load_checkpoint(path)


def test_a_format_1_checkpoint_without_a_manifest_still_loads(tmp_path, parallel_dir) -> None:
    """Checkpoints written before checksums existed (format 1) load, unchecked."""
    path = _full_checkpoint(tmp_path, parallel_dir)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "format": 1}))
    (path / "manifest.json").unlink()
    assert load_checkpoint(path).train_state["step"] == 1
