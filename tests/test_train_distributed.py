"""Training: several processes (torchrun DDP, a sharded optimizer, per-rank dropout masks)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor

from aiayn.checkpoint import checkpoint_name, load_checkpoint
from aiayn.cli import main
from aiayn.data.prepare import prepare
from aiayn.train import distributed
from aiayn.train.config import run_config_from_dict
from aiayn.train.engine import Engine, start
from aiayn.train.translation import TranslationTask
from conftest import _train_command, _write_config, free_port, launched, run_config


@pytest.mark.xdist_group("torchrun")
def test_the_torchrun_tests_are_one_group_for_xdist(request: pytest.FixtureRequest) -> None:
    """On a worker of ``--dist loadgroup`` (the suite's default) a test of the group is named with it,
    which is how xdist's scheduler sends the whole group to one worker (tests/conftest.py)."""
    loadgroup = getattr(request.config.option, "loadgroup", False)
    assert not loadgroup or request.node.nodeid.endswith("@torchrun"), request.node.nodeid


@pytest.mark.xdist_group("torchrun")  # one launch of several processes at a time
def test_two_processes_match_one_with_the_same_global_batch(task_dir: Path, tmp_path: Path) -> None:
    values = run_config(
        task_dir,
        model={"dropout": 0.0},
        data={"batch_multiple": 2},
        train={"max_steps": 5, "save_every": 5, "valid_every": 5},
    )
    config = _write_config(tmp_path / "run.yaml", values)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    assert main(_train_command(config, tmp_path / "one")[3:]) == 0  # one process: this one
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "-m",
        "aiayn",
    ]

    def launch() -> tuple[list[int], list[str]]:
        two = subprocess.run(
            torchrun + _train_command(config, tmp_path / "two")[3:], env=env, capture_output=True, text=True
        )
        return [two.returncode], [two.stdout + two.stderr]

    codes, outputs = launched(launch, tmp_path / "two")
    assert codes == [0], outputs[0][-2000:]
    read = lambda run: [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    one_log, two_log = read(tmp_path / "one"), read(tmp_path / "two")
    assert [r["split"] for r in one_log] == [r["split"] for r in two_log]
    for a, b in zip(one_log, two_log):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), (a, b)
    assert sum(r["split"] == "train" for r in two_log) == 5


# One process of a launch: each run of the JSON list (its store's port, name, `aiayn train` arguments)
# in turn, as `aiayn train` (main) in this process: one start (~5 s of CPU) for several runs.
RUNS = """
import json, os, sys
from aiayn.cli import main
for port, name, argv in json.loads(sys.argv[1]):
    os.environ["MASTER_PORT"] = str(port)
    print(f"=== run {name}", flush=True)
    code = main(argv)
    sys.stdout.flush()
    if code:
        sys.exit(code)
"""


@pytest.mark.xdist_group("torchrun")
def test_a_sharded_optimizer_gives_the_same_run_bit_for_bit(task_dir: Path, tmp_path: Path) -> None:
    """Two processes with ``train.shard_optimizer`` (each keeps Adam's moments for half the weights)
    against two without: the same weights and the same whole optimizer state in every checkpoint;
    a run sharded from an unsharded checkpoint (and the other way round) goes on as either would.

    The two processes are started as torchrun starts them (its variables: rank 0 hosts the store),
    without its launcher (tested above and in test_data_prepare.py), and each runs two trainings
    one after the other (:data:`RUNS`): 2 launches of 2 processes for the 4 runs, instead of 4
    launches of a launcher and 2 processes, each of which imports torch and aiayn."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "2"}

    def train(root: Path, runs: dict[str, bool]) -> None:
        """The runs (name: sharded or not) to step 4 in ``root``/name, in one launch."""
        argvs = []
        for name, shard in runs.items():
            values = run_config(
                task_dir,
                data={"batch_multiple": 2},
                train={"max_steps": 4, "save_every": 2, "valid_every": 0, "shard_optimizer": shard},
            )
            config = _write_config(tmp_path / f"{name}.yaml", values)
            argvs.append([free_port(), name, _train_command(config, root / name)[3:]])

        def launch() -> tuple[list[int], list[str]]:
            logs = [tmp_path / f"{root.name}.rank{rank}.log" for rank in range(2)]
            ranks = []
            for rank, log in enumerate(logs):
                with log.open("w") as file:  # the child holds its own descriptor
                    ranks.append(
                        subprocess.Popen(
                            [sys.executable, "-c", RUNS, json.dumps(argvs)],
                            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                            stdout=file,
                            stderr=subprocess.STDOUT,
                        )
                    )
            try:
                codes = [rank.wait(timeout=240) for rank in ranks]
            finally:  # a rank left waiting for the other, or past the time
                for rank in ranks:
                    if rank.poll() is None:
                        rank.kill()
                        rank.wait()
            return codes, [log.read_text() for log in logs]

        codes, outputs = launched(launch, root)
        assert codes == [0, 0], [output[-2000:] for output in outputs]
        said = dict(part.split("\n", 1) for part in outputs[0].split("=== run ")[1:])  # rank 0's, by run
        assert list(said) == list(runs), outputs[0][-2000:]
        for name, shard in runs.items():
            assert ("optimizer state split between the 2 processes" in said[name]) == shard, name

    def checkpoint(out: Path, step: int) -> dict[str, Tensor]:
        found = load_checkpoint(out / "checkpoints" / checkpoint_name(step))
        optimizer = found.train_state["optimizer"]
        state = {f"{i}.{k}": v for i, s in optimizer["state"].items() for k, v in s.items()}
        return {**found.weights, **state}

    def same(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), name

    first, then = tmp_path / "first", tmp_path / "then"
    train(first, {"plain": False, "sharded": True})
    plain = first / "plain"
    for step in (2, 4):
        same(checkpoint(plain, step), checkpoint(first / "sharded", step))
    assert not torch.equal(*(checkpoint(plain, s)["0.exp_avg"] for s in (2, 4)))
    for sharded in (False, True):  # each resumed at step 2 with the other setting
        # the run as if killed after its step-2 checkpoint (equal in both, above)
        out = then / f"switched-{not sharded}"
        shutil.copytree(first / ("sharded" if sharded else "plain"), out)
        shutil.rmtree(out / "checkpoints" / checkpoint_name(4))
    train(then, {"switched-True": True, "switched-False": False})
    for out in (then / "switched-True", then / "switched-False"):
        same(checkpoint(plain, 4), checkpoint(out, 4))


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

    def run(rank: int, world_size: int, out: Path, max_steps: int) -> TranslationTask:
        monkeypatch.setattr(distributed, "setup", lambda: (rank, world_size))
        config = run_config(prepared, train={"max_steps": max_steps, "save_every": 2, "valid_every": 0})
        trainer = start(
            TranslationTask(run_config_from_dict(config)), out, log=lambda _: None, progress=False
        )
        trainer.engine.run(trainer)
        return trainer

    run(0, 2, tmp_path / "rank0", 4), run(1, 2, tmp_path / "rank1", 4)
    assert all(not torch.equal(states[("rank0", step)], states[("rank1", step)]) for step in range(4))
    run(0, 1, tmp_path / "resumed", 2)  # a checkpoint at step 2
    run(1, 2, tmp_path / "resumed", 4)  # rank 1 resumes it
    for step in (2, 3):
        assert torch.equal(states[("resumed", step)], states[("rank1", step)]), step
    monkeypatch.setattr(distributed, "setup", lambda: (1, 2))
    fresh = start(
        TranslationTask(run_config_from_dict(run_config(prepared))),
        tmp_path / "fresh",
        log=lambda _: None,
        progress=False,
    )
    monkeypatch.setattr(distributed, "setup", lambda: (0, 2))
    fresh0 = start(
        TranslationTask(run_config_from_dict(run_config(prepared))),
        tmp_path / "fresh0",
        log=lambda _: None,
        progress=False,
    )
    for a, b in zip(fresh0.model.parameters(), fresh.model.parameters()):
        assert torch.equal(a, b)  # the same initial weights on every rank
