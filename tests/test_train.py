"""Training: the recipe's pieces, exact resume after SIGKILL, checkpoints, averaging, DDP, Multi30k."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor

from aiayn.checkpoint import MODEL_FILE, checkpoint_name, list_checkpoints, load_checkpoint, seal
from aiayn.cli import main
from aiayn.data.batching import collate
from aiayn.data.prepare import prepare
from aiayn.data.synthetic import write_task
from aiayn.errors import UserError
from aiayn.malloc import ONEDNN_CACHES
from aiayn.train import distributed
from aiayn.train import loss as loss_module
from aiayn.train.config import load_run_config, run_config_from_dict
from aiayn.train.engine import Engine
from aiayn.train.loss import label_smoothed_nll
from aiayn.train.schedule import cooldown_factor, inverse_sqrt_lr, noam_lr
from aiayn.train.trainer import Trainer

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
    directory = tmp_path_factory.mktemp("task")
    write_task(directory, seed=0, n_train=400, n_valid=40, n_test=40)
    return directory


def run_config(data_dir: Path, **sections) -> dict:
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


# --- the recipe's pieces ---------------------------------------------------------------------------


def test_noam_schedule_at_known_steps() -> None:
    assert noam_lr(1, 512, 4000) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert noam_lr(4000, 512, 4000) == pytest.approx(512**-0.5 * 4000**-0.5)  # the peak, ~7.0e-4
    assert noam_lr(4000, 512, 4000) == pytest.approx(6.988e-4, rel=1e-3)
    assert noam_lr(16000, 512, 4000) == pytest.approx(512**-0.5 / math.sqrt(16000))
    assert noam_lr(2000, 512, 4000) == pytest.approx(noam_lr(4000, 512, 4000) / 2)  # linear warm-up
    assert noam_lr(100, 512, 4000, factor=2.0) == pytest.approx(2 * noam_lr(100, 512, 4000))


def test_inverse_sqrt_schedule() -> None:
    assert inverse_sqrt_lr(2000, 5e-4, 4000) == pytest.approx(2.5e-4)
    assert inverse_sqrt_lr(4000, 5e-4, 4000) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(16000, 5e-4, 4000) == pytest.approx(2.5e-4)


def test_cooldown_factor() -> None:
    assert [cooldown_factor(p, 0.25) for p in (0.0, 0.75, 0.875, 1.0, 1.2)] == [1.0, 1.0, 0.5, 0.0, 0.0]
    assert cooldown_factor(0.99, 0.0) == 1.0  # off


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_trainer_bounds_onednn_caches_for_bf16_on_cpu_only(
    task_dir: Path, tmp_path: Path, precision: str, monkeypatch
) -> None:
    for name in ONEDNN_CACHES:  # set first, so that monkeypatch restores the variable's absence afterwards
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    Trainer(
        run_config_from_dict(run_config(task_dir, train={"precision": precision})),
        tmp_path / "run",
        log=lambda _: None,
        progress=False,
    )
    expected = ONEDNN_CACHES if precision == "bf16" else {}
    assert {name: os.environ[name] for name in ONEDNN_CACHES if name in os.environ} == expected


def test_cooldown_takes_the_lr_to_zero_at_the_last_step(task_dir: Path, tmp_path: Path) -> None:
    values = run_config(
        task_dir,
        optim={"lr_schedule": "inverse_sqrt", "peak_lr": 1e-3, "warmup": 4, "cooldown": 0.5},
        train={"max_steps": 12, "valid_every": 0, "save_every": 0},
    )
    Trainer(run_config_from_dict(values), tmp_path / "run", log=lambda _: None, progress=False).train()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lr = {r["step"]: r["lr"] for r in records if r["split"] == "train"}
    assert lr[6] == pytest.approx(inverse_sqrt_lr(6, 1e-3, 4))  # the cool-down starts after step 6 of 12
    assert lr[9] == pytest.approx(inverse_sqrt_lr(9, 1e-3, 4) * 0.5)
    assert lr[12] == 0.0


def test_label_smoothing_hand_computed() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))  # log-probs of a known distribution
    loss, nll = label_smoothed_nll(logits, torch.tensor([0]), epsilon=0.3)
    expected_nll = -math.log(0.5)
    smooth = -(math.log(0.5) + 2 * math.log(0.25)) / 3
    assert nll.item() == pytest.approx(expected_nll)
    assert loss.item() == pytest.approx(0.7 * expected_nll + 0.3 * smooth)
    assert math.isfinite(label_smoothed_nll(torch.tensor([[0.0, -1e4]]), torch.tensor([0]), 0.1)[0].item())


def test_label_smoothing_matches_torch_cross_entropy() -> None:
    logits, target = torch.randn(50, 37), torch.randint(0, 37, (50,))
    loss, nll = label_smoothed_nll(logits.bfloat16(), target, epsilon=0.1)
    reference = F.cross_entropy(logits.bfloat16().float(), target, label_smoothing=0.1, reduction="sum")
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(nll, F.cross_entropy(logits.bfloat16().float(), target, reduction="sum"))


@pytest.mark.parametrize(
    "chunk_elements", [1 << 18, 3 * 29]
)  # one block of rows; blocks of 3 rows (the last of 1)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_label_smoothing_gradient_matches_torch_cross_entropy(dtype, chunk_elements) -> None:
    """The hand-written forward and backward against autograd through F.cross_entropy, for both
    outputs, in one block of rows and in many."""
    blocks = loss_module._row_blocks(torch.empty(40, 29), chunk_elements)
    assert len(blocks) == (1 if chunk_elements > 40 * 29 else 14)
    logits, target = torch.randn(40, 29, dtype=torch.float64), torch.randint(0, 29, (40,))
    weights = torch.tensor(0.7), torch.tensor(-1.3)  # an arbitrary mix of the two outputs' gradients
    ours = logits.to(dtype).requires_grad_()
    loss, nll = label_smoothed_nll(ours, target, epsilon=0.1, chunk_elements=chunk_elements)
    (weights[0] * loss + weights[1] * nll).backward()
    theirs = logits.to(dtype).float().requires_grad_()
    ref = weights[0] * F.cross_entropy(theirs, target, label_smoothing=0.1, reduction="sum") + weights[
        1
    ] * F.cross_entropy(theirs, target, reduction="sum")
    ref.backward()
    torch.testing.assert_close(weights[0] * loss + weights[1] * nll, ref.detach())
    assert ours.grad.dtype == dtype
    tolerance = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(ours.grad.float(), theirs.grad.to(dtype).float(), **tolerance)


@pytest.mark.parametrize(
    "epsilon, masked", [(0.0, -math.inf), (0.1, -1e4)]
)  # smoothing gives -inf a loss of inf
def test_label_smoothing_in_blocks_of_rows_equals_one_block(epsilon, masked) -> None:
    """Strided logits (a transpose) with a masked logit: blocks of 3 rows give one block's loss and
    gradient."""
    logits, target = torch.randn(29, 40).t(), torch.randint(0, 29, (40,))
    logits[3, 5] = masked
    target[3] = 6

    def loss_and_grad(chunk_elements: int) -> tuple[Tensor, Tensor, Tensor]:
        leaf = logits.clone().t().contiguous().t().requires_grad_()  # strided like ``logits``
        loss, nll = label_smoothed_nll(leaf, target, epsilon, chunk_elements)
        (loss + 0.5 * nll).backward()
        return loss.detach(), nll.detach(), leaf.grad

    one, blocks = loss_and_grad(1 << 18), loss_and_grad(3 * 29)
    assert all(torch.isfinite(t).all() for t in one)
    for a, b in zip(one, blocks):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert one[2][3, 5] == pytest.approx(-epsilon / 29)  # no probability: only the smoothing target ε / V


def test_accumulating_small_batches_equals_one_big_batch(task_dir: Path, tmp_path: Path) -> None:
    config = run_config_from_dict(run_config(task_dir, model={"dropout": 0.0}))
    small, big = (
        Trainer(config, tmp_path / "a", log=lambda _: None),
        Trainer(config, tmp_path / "b", log=lambda _: None),
    )
    examples = small.train_examples[:24]
    parts = [collate(examples[i : i + 8]) for i in range(0, 24, 8)]
    totals_small = small.engine.accumulate_gradients(parts)
    totals_big = big.engine.accumulate_gradients([collate(examples)])
    assert totals_small[2] == totals_big[2] == sum(len(t) + 1 for _, t in examples)
    assert totals_small[0] == pytest.approx(totals_big[0], rel=1e-5)
    for (name, a), b in zip(small.model.named_parameters(), big.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4, msg=name)


# --- config ---------------------------------------------------------------------------------------


def test_unknown_keys_and_bad_values_name_the_field(task_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(
        UserError, match=r"^config: unknown config field\(s\) optim\.warmpu; valid: lr_schedule, warmup"
    ):
        load_run_config(None, ["optim.warmpu=10"])
    with pytest.raises(UserError, match=r"model\.d_modle.*valid:.*d_model"):
        run_config_from_dict({"model": {"d_modle": 3}})
    with pytest.raises(UserError, match=r"train\.precision must be one of auto, bf16, fp32; got 'fp8'"):
        load_run_config(None, ["train.precision=fp8"])
    with pytest.raises(UserError, match=r"^config: model\.d_model \(30\) must be divisible by n_heads"):
        run_config_from_dict({"model": {"d_model": 30, "n_heads": 4}})
    with pytest.raises(UserError, match=r"^config: train\.max_steps must be an integer; got 'many'"):
        load_run_config(None, ["train.max_steps=many"])
    with pytest.raises(UserError, match="config file not found"):
        load_run_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  patience: 0\n  log_every: -1\n")
    with pytest.raises(UserError, match=rf"^{bad}: train\.log_every must be >= 0; got -1$"):
        load_run_config(bad)
    bad.write_text("train:\n  patience: [1\n")
    with pytest.raises(UserError, match=rf"^{bad}:3: not valid YAML: "):
        load_run_config(bad)
    bad.write_text("- model\n")
    with pytest.raises(UserError, match=rf"^{bad}: must be a mapping of sections; got list$"):
        load_run_config(bad)
    bad.write_text("train: 5\n")
    with pytest.raises(UserError, match=rf"^{bad}: train must be a mapping of key: value; got int$"):
        load_run_config(bad)


def test_config_yaml_reads_exponents_as_numbers_and_rejects_zero_sizes(
    task_dir: Path, tmp_path: Path
) -> None:
    """PyYAML reads ``1e-6`` as a string (YAML 1.1); the run config reads it as the number it is."""
    config = tmp_path / "eps.yaml"
    config.write_text("model:\n  layer_norm_eps: 1e-6\noptim:\n  peak_lr: 5e-4\n  eps: 1.0e-9\n")
    loaded = load_run_config(config, ["optim.beta2=9.8e-1"])
    assert (
        loaded.model["layer_norm_eps"] == 1e-6 and loaded.optim.peak_lr == 5e-4 and loaded.optim.beta2 == 0.98
    )
    with pytest.raises(UserError, match=r"model\.layer_norm_eps must be a number; got 'tiny'"):
        run_config_from_dict({"model": {"layer_norm_eps": "tiny"}})
    for key in ("optim.warmup", "optim.accum_steps", "data.batch_tokens"):
        with pytest.raises(UserError, match=rf"{key} must be > 0; got 0"):
            load_run_config(None, [f"{key}=0"])


def test_max_len_must_cover_the_longest_training_sentence(task_dir: Path) -> None:
    with pytest.raises(
        UserError, match=r"data\.max_sentence_tokens 100 needs model\.max_len >= 101 \(got 64\)"
    ):
        run_config_from_dict({"model": {"max_len": 64}, "data": {"max_sentence_tokens": 100}})
    run_config_from_dict({"model": {"max_len": 101}, "data": {"max_sentence_tokens": 100}})


def test_training_refuses_a_single_corpus_file(task_dir: Path, tmp_path: Path) -> None:
    """One TSV file is one split: training on it would also validate on it."""
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("1 2\tone two\n")
    values = run_config(task_dir, data={"dir": str(tsv)})
    with pytest.raises(UserError, match=r"pairs\.tsv is a file; training reads a directory"):
        Trainer(run_config_from_dict(values), tmp_path / "run", log=lambda _: None, progress=False)


def test_training_on_a_missing_cuda_device_is_a_clear_error(task_dir: Path, tmp_path: Path) -> None:
    for device, message in [("cuda:x", "is not a device name"), ("gpu", "is not a device name")]:
        values = run_config(task_dir, train={"device": device})
        with pytest.raises(UserError, match=rf"train\.device '{device}' {message}"):
            Trainer(run_config_from_dict(values), tmp_path / "run", log=lambda _: None, progress=False)
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match=r"train\.device 'cuda': CUDA is not available here"):
            Trainer(
                run_config_from_dict(run_config(task_dir, train={"device": "cuda"})),
                tmp_path / "run",
                log=lambda _: None,
                progress=False,
            )


def test_cooldown_needs_a_budget_and_is_a_fraction(task_dir: Path) -> None:
    with pytest.raises(UserError, match=r"optim\.cooldown is a fraction of the run, from 0 to 1; got 1\.5"):
        run_config_from_dict(run_config(task_dir, optim={"cooldown": 1.5}))
    with pytest.raises(UserError, match=r"optim\.cooldown is a fraction of the run, from 0 to 1; got nan"):
        run_config_from_dict(run_config(task_dir, optim={"cooldown": float("nan")}))
    with pytest.raises(
        UserError, match=r"optim\.cooldown needs train\.max_steps, train\.max_hours or train\.max_epochs"
    ):
        run_config_from_dict(run_config(task_dir, optim={"cooldown": 0.2}, train={"max_steps": 0}))


def test_cooldown_follows_max_epochs_when_it_binds_first(task_dir: Path, tmp_path: Path) -> None:
    values = run_config(
        task_dir,
        optim={"lr_schedule": "inverse_sqrt", "peak_lr": 1e-3, "warmup": 1, "cooldown": 1.0},
        train={"max_steps": 10_000, "max_epochs": 2, "valid_every": 0, "save_every": 0},
    )
    trainer = Trainer(run_config_from_dict(values), tmp_path / "run", log=lambda _: None, progress=False)
    trainer.train()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lr = [r["lr"] for r in records if r["split"] == "train"]
    assert len(lr) == trainer.state.step < 100 and lr[-1] == 0.0  # two epochs, ending cooled
    half = len(lr) // 2  # the lr is (1 - epochs done / 2) times the inverse-sqrt value
    assert lr[half - 1] == pytest.approx(inverse_sqrt_lr(half, 1e-3, 1) * 0.5, rel=0.05)


def test_cli_bad_config_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("model:\n  d_model: 30\n  n_heads: 4\n")
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("aiayn: error:") and "\n" not in err and "divisible by n_heads" in err


def test_a_log_gets_plain_lines_and_no_progress_bar(task_dir: Path, tmp_path: Path, capsys) -> None:
    """The progress bar is drawn only on a terminal: a log file gets a line every log_every steps."""
    config = _write_config(
        tmp_path / "run.yaml", run_config(task_dir, train={"max_steps": 4, "log_every": 2})
    )
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err and "it/s" not in captured.err, captured.err
    assert "step=2 epoch=0 split=train loss=" in captured.out and "step=4 epoch=0 split=train" in captured.out


def test_shipped_configs_are_valid() -> None:
    configs = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
    translation = [c for c in configs if not c.name.startswith("ett")]
    assert {c.name for c in translation} >= {
        "demo.yaml",
        "multi30k_de_en.yaml",
        "multi30k_en_de.yaml",
        "wmt14_en_de_base.yaml",
        "wmt14_en_de_big.yaml",
    }
    for path in translation:
        load_run_config(path).model_config(vocab_size=1000)


# --- exact resume after SIGKILL -------------------------------------------------------------------


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


@pytest.mark.parametrize(
    "bpe_dropout", [0.0, 0.1]
)  # with BPE-dropout: the 40 steps span 3 epochs, each resampled
def test_sigkill_then_resume_is_bit_identical(
    task_dir: Path, tmp_path: Path, bpe_dropout: float, kill_after_checkpoints
) -> None:
    values = run_config(
        task_dir,
        optim={"cooldown": 0.5},  # a cool-down over max_steps is deterministic too
        data={"bpe_dropout": bpe_dropout},
        train={"max_steps": 40, "save_every": 3, "valid_every": 7},
    )
    config = _write_config(tmp_path / "run.yaml", values)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(_train_command(config, tmp_path / "straight"), check=True, env=env, capture_output=True)

    killed_at = kill_after_checkpoints(
        _train_command(config, tmp_path / "killed"), tmp_path / "killed", 3, env
    )
    resumed = subprocess.run(
        _train_command(config, tmp_path / "killed"), env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout

    final = lambda run: load_file(str(list_checkpoints(run)[-1] / MODEL_FILE))  # noqa: E731
    straight, again = final(tmp_path / "straight"), final(tmp_path / "killed")
    assert list_checkpoints(tmp_path / "killed")[-1].name == "step-00000040" != killed_at
    for name, tensor in straight.items():
        assert torch.equal(tensor, again[name]), name

    def log(run: Path) -> list[dict]:  # every record but the timing must match
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in records]

    assert log(tmp_path / "killed") == log(tmp_path / "straight")


def test_corrupt_latest_checkpoint_is_a_clear_error(task_dir: Path, tmp_path: Path, capsys) -> None:
    config = _write_config(tmp_path / "run.yaml", run_config(task_dir, train={"max_steps": 8}))
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    *_, previous, latest = list_checkpoints(tmp_path / "run")
    (latest / MODEL_FILE).write_bytes(b"\x00garbage")
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--max-steps", "12"]) == 2
    err = capsys.readouterr().err
    assert f"corrupt checkpoint file {latest / MODEL_FILE}" in err and "Traceback" not in err
    assert load_checkpoint(previous).train_state["trainer"]["step"] == 4


# --- averaging ------------------------------------------------------------------------------------


def test_average_checkpoints(task_dir: Path, tmp_path: Path, capsys) -> None:
    config = _write_config(tmp_path / "run.yaml", run_config(task_dir, train={"max_steps": 12}))
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    checkpoints = list_checkpoints(tmp_path / "run")[-3:]
    assert main(["average", "--last", "3", str(tmp_path / "run"), "--output", str(tmp_path / "avg")]) == 0
    averaged = load_checkpoint(tmp_path / "avg")
    weights = [load_checkpoint(c).weights for c in checkpoints]
    for name, tensor in averaged.weights.items():
        torch.testing.assert_close(tensor, sum(w[name] for w in weights) / 3)
    assert (
        averaged.train_state is None
        and averaged.tokenizer_bytes == load_checkpoint(checkpoints[-1]).tokenizer_bytes
    )
    assert (
        main(
            [
                "translate",
                "--checkpoint",
                str(tmp_path / "avg"),
                "--input",
                str(task_dir / "test.digits"),
                "--output",
                str(tmp_path / "out.txt"),
            ]
        )
        == 0
    )
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 40
    assert main(["average", "--last", "30", str(tmp_path / "run"), "--output", str(tmp_path / "x")]) == 2
    assert "fewer than --last 30" in capsys.readouterr().err
    assert main(["average", "--last", "0", str(tmp_path / "run"), "--output", str(tmp_path / "x")]) == 2
    assert "--last must be at least 1, got 0" in capsys.readouterr().err
    # a checkpoint of another model (other shapes) is refused by name, not with a traceback
    other = _write_config(
        tmp_path / "other.yaml", run_config(task_dir, model={"d_ff": 48}, train={"max_steps": 4})
    )
    assert main(["train", "--config", str(other), "--out", str(tmp_path / "other"), "--no-progress"]) == 0
    foreign = list_checkpoints(tmp_path / "other")[-1]
    assert (
        main(["average", "--inputs", str(checkpoints[-1]), str(foreign), "--output", str(tmp_path / "x")])
        == 2
    )
    err = capsys.readouterr().err
    assert f"{foreign}: a different model from {checkpoints[-1]}" in err and "Traceback" not in err


# --- several processes ----------------------------------------------------------------------------


def test_two_processes_match_one_with_the_same_global_batch(task_dir: Path, tmp_path: Path) -> None:
    values = run_config(
        task_dir,
        model={"dropout": 0.0},
        data={"batch_multiple": 2},
        train={"max_steps": 5, "save_every": 5, "valid_every": 5},
    )
    config = _write_config(tmp_path / "run.yaml", values)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(_train_command(config, tmp_path / "one"), check=True, env=env, capture_output=True)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(29500 + os.getpid() % 1000),
        "-m",
        "aiayn",
    ]
    two = subprocess.run(
        torchrun + _train_command(config, tmp_path / "two")[3:], env=env, capture_output=True, text=True
    )
    assert two.returncode == 0, two.stderr[-2000:]
    read = lambda run: [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    one_log, two_log = read(tmp_path / "one"), read(tmp_path / "two")
    assert [r["split"] for r in one_log] == [r["split"] for r in two_log]
    for a, b in zip(one_log, two_log):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), (a, b)
    assert sum(r["split"] == "train" for r in two_log) == 5


def test_a_sharded_optimizer_gives_the_same_run_bit_for_bit(task_dir: Path, tmp_path: Path) -> None:
    """Two processes with ``train.shard_optimizer`` (each keeps Adam's moments for half the weights)
    against two without: the same weights and the same whole optimizer state in every checkpoint;
    a run sharded from an unsharded checkpoint (and the other way round) goes on as either would."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    port = 29500 + (os.getpid() + 7) % 1000
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"]

    def train(out: Path, shard: bool, max_steps: int) -> None:
        values = run_config(
            task_dir,
            data={"batch_multiple": 2},
            train={"max_steps": max_steps, "save_every": 2, "valid_every": 0, "shard_optimizer": shard},
        )
        config = _write_config(tmp_path / f"{out.name}.yaml", values)
        run = subprocess.run(
            [*torchrun, str(port), "-m", "aiayn", *_train_command(config, out)[3:]],
            env=env,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert ("optimizer state split between the 2 processes" in run.stdout) == shard

    def checkpoint(out: Path, step: int) -> dict[str, Tensor]:
        found = load_checkpoint(out / "checkpoints" / checkpoint_name(step))
        optimizer = found.train_state["optimizer"]
        state = {f"{i}.{k}": v for i, s in optimizer["state"].items() for k, v in s.items()}
        return {**found.weights, **state}

    def same(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), name

    train(tmp_path / "plain", False, 4)
    train(tmp_path / "sharded", True, 4)
    for step in (2, 4):
        same(checkpoint(tmp_path / "plain", step), checkpoint(tmp_path / "sharded", step))
    assert not torch.equal(*(checkpoint(tmp_path / "plain", s)["0.exp_avg"] for s in (2, 4)))
    for first, then in ((False, True), (True, False)):  # resumed at step 2 with the other setting
        out = tmp_path / f"switched-{then}"
        train(out, first, 2)
        train(out, then, 4)
        same(checkpoint(tmp_path / "plain", 4), checkpoint(out, 4))


def test_each_process_draws_its_own_dropout_masks_and_resumes_them(
    task_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """Ranks built in one process (rank and world size patched), the random state recorded as each
    optimizer step starts: ranks start from the same weights and draw other masks at every step, and
    rank 1 resumed from a checkpoint draws what it drew uninterrupted."""
    states: dict[tuple[str, int], torch.Tensor] = {}  # (run, step before it) -> torch's RNG state
    accumulate = Engine.accumulate_gradients

    def recording(self, batches):
        states[(self.out.name, self.state.step)] = torch.get_rng_state()
        return accumulate(self, batches)

    monkeypatch.setattr(Engine, "accumulate_gradients", recording)

    prepared = tmp_path / "prepared"  # in one process no rank 0 prepares for the others
    prepare(task_dir, prepared, run_config_from_dict(run_config(task_dir)).prepare_settings(), log=print)

    def run(rank: int, world_size: int, out: Path, max_steps: int) -> Trainer:
        monkeypatch.setattr(distributed, "setup", lambda: (rank, world_size))
        config = run_config(prepared, train={"max_steps": max_steps, "save_every": 2, "valid_every": 0})
        trainer = Trainer(run_config_from_dict(config), out, log=lambda _: None, progress=False)
        trainer.train()
        return trainer

    run(0, 2, tmp_path / "rank0", 4), run(1, 2, tmp_path / "rank1", 4)
    assert all(not torch.equal(states[("rank0", step)], states[("rank1", step)]) for step in range(4))
    run(0, 1, tmp_path / "resumed", 2)  # a checkpoint at step 2
    run(1, 2, tmp_path / "resumed", 4)  # rank 1 resumes it
    for step in (2, 3):
        assert torch.equal(states[("resumed", step)], states[("rank1", step)]), step
    monkeypatch.setattr(distributed, "setup", lambda: (1, 2))
    fresh = Trainer(
        run_config_from_dict(run_config(prepared)), tmp_path / "fresh", log=lambda _: None, progress=False
    )
    monkeypatch.setattr(distributed, "setup", lambda: (0, 2))
    fresh0 = Trainer(
        run_config_from_dict(run_config(prepared)), tmp_path / "fresh0", log=lambda _: None, progress=False
    )
    for a, b in zip(fresh0.model.parameters(), fresh.model.parameters()):
        assert torch.equal(a, b)  # the same initial weights on every rank


# --- real data ------------------------------------------------------------------------------------


def test_multi30k_smoke_run_loss_falls(multi30k_dir: Path, tmp_path: Path) -> None:
    values = run_config(
        multi30k_dir,
        model={"dropout": 0.0, "d_model": 64, "d_ff": 128},
        data={
            "src_lang": "de",
            "tgt_lang": "en",
            "vocab_size": 2000,
            "batch_tokens": 2048,
            "max_sentence_tokens": 60,
        },
        optim={"warmup": 30, "lr_factor": 2.0},
        train={"max_steps": 30, "save_every": 30, "valid_every": 30, "log_every": 5},
    )
    logs: list[str] = []
    trainer = Trainer(run_config_from_dict(values), tmp_path / "run", log=logs.append, progress=False)
    trainer.valid_examples = trainer.valid_examples[:200]  # keep the smoke run short
    trainer.train()
    assert any(line.startswith("read 29000 pairs") for line in logs)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in records if r["split"] == "train"]
    assert len(train) == 6 and train[-1] < train[0] - 1.0, train
    assert (tmp_path / "run" / "best" / MODEL_FILE).is_file()


def test_lowercase_run_reads_and_writes_lowercase_and_scores_case_insensitively(
    multi30k_dir: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, count in (("train", 300), ("val", 6)):
        for lang in ("en", "de"):
            lines = (multi30k_dir / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            (corpus / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    values = run_config(
        corpus,
        data={"src_lang": "en", "tgt_lang": "de", "vocab_size": 600, "lowercase": True},
        train={"max_steps": 2, "save_every": 2, "valid_every": 0},
    )
    trainer = Trainer(run_config_from_dict(values), tmp_path / "run", log=lambda _: None, progress=False)
    trainer.train()
    assert trainer.tokenizer.lowercases
    assert load_checkpoint(tmp_path / "run").tokenizer_bytes == trainer.tokenizer.to_bytes()
    # Validation BLEU ignores case: a lowercasing model cannot write the references' capitals.
    from aiayn.decode import Translator

    references = [t for _, t in trainer.valid_pairs]
    monkeypatch.setattr(Translator, "translate", lambda self, sources: [r.lower() for r in references])
    assert trainer._bleu()["bleu"] == pytest.approx(100.0)
    monkeypatch.undo()
    src, ref = corpus / "val.en", corpus / "val.de"
    assert (
        main(["evaluate", "--checkpoint", str(tmp_path / "run"), "--src", str(src), "--ref", str(ref)]) == 0
    )
    assert "BLEU = " in (out := capsys.readouterr().out) and "|case:lc|" in out


def test_early_stopping_after_patience_validations_without_improvement(
    task_dir: Path, tmp_path: Path
) -> None:
    # An untrained model's greedy BLEU stays 0: the first validation sets the best, the next two
    # do not beat it, so patience 2 stops the run at the third validation (step 6 of 100).
    values = run_config(
        task_dir,
        model={"dropout": 0.0},
        optim={"lr_schedule": "inverse_sqrt", "peak_lr": 1e-9},
        train={
            "max_steps": 100,
            "valid_every": 2,
            "save_every": 50,
            "valid_bleu": True,
            "best_metric": "bleu",
            "patience": 2,
            "log_every": 0,
        },
    )
    trainer = Trainer(run_config_from_dict(values), tmp_path / "run", log=lambda _: None, progress=False)
    trainer.valid_pairs = trainer.valid_pairs[:8]  # BLEU on a few sentences keeps the test short
    trainer.train()
    assert trainer.state.step == 6 and trainer.state.stopped_early and trainer.state.bad_validations == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "valid"] == [2, 4, 6]
    assert load_checkpoint(tmp_path / "run" / "best").config["step"] == 2


def test_a_resumed_run_never_validates_twice_at_one_step(task_dir: Path, tmp_path: Path) -> None:
    values = run_config(task_dir, train={"max_steps": 6, "valid_every": 6, "save_every": 6})
    for _ in range(2):  # the second run resumes at its end: nothing left to do, nothing validated again
        Trainer(run_config_from_dict(values), tmp_path / "run", log=lambda _: None, progress=False).train()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "valid"] == [6]


def test_resuming_with_other_model_data_or_optim_settings_is_refused(task_dir: Path, tmp_path: Path) -> None:
    values = run_config(task_dir, train={"max_steps": 4, "save_every": 4, "valid_every": 0})
    Trainer(run_config_from_dict(values), tmp_path / "run", log=lambda _: None, progress=False).train()
    changed = run_config(
        task_dir,
        model={"d_model": 48},
        optim={"warmup": 99},
        train={"max_steps": 8, "save_every": 4, "valid_every": 0},
    )
    with pytest.raises(
        UserError,
        match=r"holds a run with other settings \(model\.d_model 32 -> 48; "
        r"optim\.warmup 10 -> 99\): resume it with the same",
    ):
        Trainer(run_config_from_dict(changed), tmp_path / "run", log=lambda _: None, progress=False)
    # train.* may change (a longer run), and data.dir (the corpus moved)
    moved = tmp_path / "moved"
    moved.mkdir()
    for file in task_dir.iterdir():
        (moved / file.name).write_bytes(file.read_bytes())
    longer = run_config(moved, train={"max_steps": 8, "save_every": 4, "valid_every": 0})
    longer["model"]["positional"] = "sinusoidal"  # spelled out, the default: the same model
    # a run saved by another number of processes (batch_multiple 2) resumes, with a warning
    state_file = list_checkpoints(tmp_path / "run")[-1] / "state.json"
    state = json.loads(state_file.read_text())
    state["sampler"]["batch_multiple"] = 2
    state_file.write_text(json.dumps(state))
    seal(state_file.parent)
    logs: list[str] = []
    trainer = Trainer(run_config_from_dict(longer), tmp_path / "run", log=logs.append, progress=False)
    assert trainer.state.step == 4 and trainer.config.data.dir == str(moved)
    assert any("batches were cut for a multiple of 2 sentences, now 1" in line for line in logs), logs
    trainer.train()
    assert trainer.state.step == 8


def test_resume_truncates_the_metrics_log_by_renaming_a_whole_file(
    task_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    values = run_config(task_dir, train={"max_steps": 4, "save_every": 4, "valid_every": 0})
    Trainer(run_config_from_dict(values), tmp_path / "run", log=lambda _: None, progress=False).train()
    log = tmp_path / "run" / "metrics.jsonl"
    kept = log.read_text()
    log.write_text(kept + '{"written": "after the checkpoint"}\n')
    replaced = []
    monkeypatch.setattr(
        os, "replace", lambda a, b: (replaced.append((Path(a).parent, Path(b))), os.rename(a, b))
    )
    Trainer(run_config_from_dict(values), tmp_path / "run", log=lambda _: None, progress=False)
    assert log.read_text() == kept and replaced == [(log.parent, log)]
    assert [p.name for p in log.parent.iterdir() if ".tmp-" in p.name] == []


def test_max_hours_stops_the_run_and_carries_over_resumes(task_dir: Path, tmp_path: Path) -> None:
    config = _write_config(
        tmp_path / "run.yaml", run_config(task_dir, train={"max_steps": 0, "max_hours": 1e-7})
    )
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    state = load_checkpoint(list_checkpoints(tmp_path / "run")[-1]).train_state["trainer"]
    assert state["step"] == 1 and state["hours"] > 1e-7  # one step already spends 0.36 ms
    # resumed with a larger budget: the hours already spent count, and the run goes on from there
    assert (
        main(
            [
                "train",
                "--config",
                str(config),
                "--out",
                str(tmp_path / "run"),
                "--no-progress",
                "--max-hours",
                str(state["hours"] + 1e-7),
            ]
        )
        == 0
    )
    again = load_checkpoint(list_checkpoints(tmp_path / "run")[-1]).train_state["trainer"]
    assert again["step"] == 2 and again["hours"] > state["hours"]


def test_the_loss_compiles_once_for_any_number_of_tokens() -> None:
    """The number of real target tokens changes at every step: the compiled loss must not
    specialise on it (a graph for the first call, then one dynamic graph; the CPU path's loop
    over row blocks would make one per N)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(label_smoothed_nll, backend="eager")
    for n in (5, 6, 7, 9, 12):
        logits, target = torch.randn(n, 11, requires_grad=True), torch.randint(0, 11, (n,))
        loss, _ = compiled(logits, target, 0.1)
        loss.backward()
        torch.testing.assert_close(loss, label_smoothed_nll(logits, target, 0.1)[0])
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])
    torch._dynamo.reset()


def test_objective_traces_under_torch_compile(task_dir: Path) -> None:
    """The hand-written loss backward goes through dynamo/AOTAutograd (train.compile: true).

    ``aot_eager`` traces exactly what inductor would get, without a C++ build (seconds, not minutes).
    """
    config = run_config_from_dict(run_config(task_dir, model={"dropout": 0.0}))
    trainer = Trainer(config, task_dir / "compiled", log=lambda _: None)
    batch = collate(trainer.train_examples[:8])
    eager = [trainer.loss_fn(batch.src, batch.tgt_in, batch.tgt_out)[0]]
    eager[0].backward()
    expected = {name: p.grad.clone() for name, p in trainer.loss_fn.named_parameters()}
    trainer.loss_fn.zero_grad(set_to_none=True)
    compiled = torch.compile(trainer.loss_fn, backend="aot_eager", fullgraph=False)
    loss, _ = compiled(batch.src, batch.tgt_in, batch.tgt_out)
    loss.backward()
    torch.testing.assert_close(loss, eager[0])
    for name, p in trainer.loss_fn.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], atol=1e-6, rtol=1e-5, msg=name)


# --- run directories of another kind ------------------------------------------------------------


def test_a_run_directory_of_another_kind_or_layout_is_refused(tmp_path: Path) -> None:
    """Both tasks share one layout, so training into the other task's run is one clear line; so is
    a forecasting run of the layout before it (``last/``), which cannot be resumed."""
    from aiayn import TransformerConfig, build_model
    from aiayn.checkpoint import save_checkpoint
    from aiayn.train.engine import Settings

    model = build_model(TransformerConfig(src_vocab_size=8, tgt_vocab_size=8, d_model=8, n_heads=2, d_ff=8))
    save_checkpoint(tmp_path / "fc" / "checkpoints" / "step-00000001", model, {"kind": "forecast"})
    with pytest.raises(UserError, match="holds a forecast run, not a translation run: give a new --out"):
        Engine(Settings(device="cpu"), tmp_path / "fc", kind="translation")
    Engine(Settings(device="cpu"), tmp_path / "fc", kind="forecast")  # its own kind resumes
    save_checkpoint(tmp_path / "old" / "last", model, {"kind": "forecast"})
    with pytest.raises(UserError, match=r"old/last is a run in aiayn's earlier forecasting layout"):
        Engine(Settings(device="cpu"), tmp_path / "old", kind="forecast")


@pytest.mark.parametrize("seed", [-3, 2**32])
def test_seeds_outside_numpys_range_are_refused(task_dir: Path, seed: int) -> None:
    from aiayn.forecast.train import TrainConfig

    with pytest.raises(UserError, match=f"train.seed must be in \\[0, {2**32 - 1}\\]; got {seed}"):
        run_config_from_dict(run_config(task_dir, train={"seed": seed}))
    with pytest.raises(ValueError, match="seed"):
        TrainConfig(seed=seed)
