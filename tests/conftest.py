"""Shared fixtures: data the tests make (synthetic parallel text, an ETT-like series), the real data
for tests of its own figures (skipped without it), determinism, training helpers.

The real data is found through the environment variable ``AIAYN_DATA`` (a folder holding
``multi30k/`` and ``ett/``), by default ``../shared/data`` beside the repository."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("AIAYN_DATA") or REPO.parent / "shared" / "data")
MULTI30K = DATA / "multi30k"
ETT = DATA / "ett"
GET_MULTI30K = "get it with `aiayn data multi30k --out $AIAYN_DATA/multi30k`"
GET_ETT = "put the ETT-small CSVs from the ETDataset repository (github.com/zhouhaoyi/ETDataset) there"


def _real(path: Path, what: str, how: str) -> Path:
    """``path`` of a real data set under ``AIAYN_DATA``, or the test is skipped saying how to get it."""
    if not path.is_file():
        pytest.skip(f"{what} not found at {path.parent} (set AIAYN_DATA): {how}")
    return path


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The real Multi30k (``$AIAYN_DATA/multi30k``), for tests of its own figures; skips without it."""
    return _real(MULTI30K / "train.en", "Multi30k", GET_MULTI30K).parent


@pytest.fixture(scope="session")
def etth1() -> Path:
    """The real ETTh1 (``$AIAYN_DATA/ett/ETTh1.csv``), for tests of its own figures; skips without it."""
    return _real(ETT / "ETTh1.csv", "ETTh1", GET_ETT)


@pytest.fixture(scope="session")
def ett_dir(etth1: Path) -> Path:
    return etth1.parent


# --- data the tests make themselves ----------------------------------------------------------------

# One lexicon row per word: (en, de, fr, cs). Sentences are built from the same choices in every
# language, so the files are parallel line by line, with each language's own letters.
_SUBJECTS = [
    ("A man", "Ein Mann", "Un homme", "Muž"),
    ("A woman", "Eine Frau", "Une femme", "Žena"),
    ("A young boy", "Ein kleiner Junge", "Un jeune garçon", "Malý chlapec"),
    ("A little girl", "Ein kleines Mädchen", "Une petite fille", "Malá holčička"),
    ("Two dogs", "Zwei Hunde", "Deux chiens", "Dva psi"),
    ("A group of people", "Eine Gruppe Menschen", "Un groupe de personnes", "Skupina lidí"),
    ("An older man", "Ein älterer Mann", "Un homme âgé", "Starší muž"),
    ("A brown dog", "Ein brauner Hund", "Un chien marron", "Hnědý pes"),
    ("Three children", "Drei Kinder", "Trois enfants", "Tři děti"),
    ("A cyclist", "Ein Radfahrer", "Un cycliste", "Cyklista"),
    ("A street musician", "Ein Straßenmusiker", "Un musicien de rue", "Pouliční muzikant"),
    ("A soccer player", "Ein Fußballspieler", "Un joueur de football", "Fotbalista"),
]
_CLOTHES = [
    ("in a red shirt", "in einem roten Hemd", "en chemise rouge", "v červené košili"),
    ("in a blue jacket", "in einer blauen Jacke", "en veste bleue", "v modré bundě"),
    ("wearing a hat", "mit einem Hut", "portant un chapeau", "s kloboukem"),
    ("in black shorts", "in schwarzen Shorts", "en short noir", "v černých šortkách"),
    ("with sunglasses", "mit Sonnenbrille", "avec des lunettes de soleil", "se slunečními brýlemi"),
    ("in a green dress", "in einem grünen Kleid", "en robe verte", "v zelených šatech"),
]
_ACTIONS = [
    ("is riding a bike", "fährt Fahrrad", "fait du vélo", "jede na kole"),
    ("is playing the guitar", "spielt Gitarre", "joue de la guitare", "hraje na kytaru"),
    ("is running", "rennt", "court", "běží"),
    ("is jumping over a wall", "springt über eine Mauer", "saute par-dessus un mur", "skáče přes zeď"),
    ("is reading a newspaper", "liest eine Zeitung", "lit un journal", "čte noviny"),
    ("is climbing a rock", "klettert auf einen Felsen", "escalade un rocher", "leze na skálu"),
    ("is eating lunch", "isst zu Mittag", "déjeune", "obědvá"),
    ("is kicking a ball", "schießt einen Ball", "frappe un ballon", "kope do míče"),
    ("is waiting", "wartet", "attend", "čeká"),
    ("is taking a photo", "macht ein Foto", "prend une photo", "fotografuje"),
]
_PLACES = [
    ("on the street", "auf der Straße", "dans la rue", "na ulici"),
    ("in the park", "im Park", "dans le parc", "v parku"),
    ("at the beach", "am Strand", "à la plage", "na pláži"),
    ("in front of a building", "vor einem Gebäude", "devant un bâtiment", "před budovou"),
    ("near the water", "in der Nähe des Wassers", "près de l'eau", "u vody"),
    ("in the snow", "im Schnee", "dans la neige", "ve sněhu"),
    ("on a stage", "auf einer Bühne", "sur une scène", "na pódiu"),
    ("in a crowded market", "auf einem vollen Markt", "dans un marché bondé", "na rušném trhu"),
]
_LANGS = ("en", "de", "fr", "cs")
PARALLEL_SPLITS = {"train": 2000, "val": 400, "test2016": 200}


def parallel_sentences(n: int, seed: int) -> list[tuple[str, ...]]:
    """``n`` seeded sentences in the four languages (en, de, fr, cs), in Multi30k's style."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        parts = [rng.choice(_SUBJECTS)]
        if rng.random() < 0.6:
            parts.append(rng.choice(_CLOTHES))
        parts += [rng.choice(_ACTIONS), rng.choice(_PLACES)]
        if rng.random() < 0.3:
            parts += [("and", "und", "et", "a"), rng.choice(_PLACES)]
        rows.append(tuple(" ".join(p[i] for p in parts) + "." for i in range(len(_LANGS))))
    return rows


def write_parallel_text(directory: Path, splits: dict[str, int] = PARALLEL_SPLITS, seed: int = 0) -> Path:
    """A small synthetic corpus in Multi30k's layout: ``{split}.{en,de,fr,cs}``, one sentence a line."""
    directory.mkdir(parents=True, exist_ok=True)
    for k, (split, n) in enumerate(splits.items()):
        rows = parallel_sentences(n, seed * 1000 + k)
        for i, lang in enumerate(_LANGS):
            text = "".join(row[i] + "\n" for row in rows)
            (directory / f"{split}.{lang}").write_text(text, encoding="utf-8")
    return directory


@pytest.fixture(scope="session")
def parallel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic parallel corpus laid out like Multi30k (train 2,000, val 400, test2016 200
    sentences in en, de, fr and cs): for tests that need some parallel text, not Multi30k's."""
    return write_parallel_text(tmp_path_factory.mktemp("parallel"))


ETT_COLUMNS = ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]


def write_ett_like_csv(path: Path, rows: int = 600, seed: int = 0) -> Path:
    """An hourly series shaped like ETT-small: a ``date`` column from 2016-07-01 00:00 and the 7
    columns HUFL..OT, each a daily and a weekly cycle plus seeded noise, written to 3 decimals."""
    import numpy as np

    rng = np.random.default_rng(seed)
    hours = np.arange(rows)
    start = np.datetime64("2016-07-01T00:00")
    columns = []
    for k in range(len(ETT_COLUMNS)):
        daily = (2.0 + 0.3 * k) * np.sin(2 * np.pi * (hours + 3 * k) / 24)
        weekly = (1.0 + 0.1 * k) * np.sin(2 * np.pi * hours / (24 * 7) + k)
        columns.append(5.0 + k + daily + weekly + 0.3 * rng.standard_normal(rows))
    lines = ["date," + ",".join(ETT_COLUMNS)]
    for i in range(rows):
        stamp = str(start + np.timedelta64(i, "h")).replace("T", " ") + ":00"
        lines.append(stamp + "," + ",".join(f"{c[i]:.3f}" for c in columns))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def small_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """600 hourly rows shaped like ETT-small under a non-ETT name (so 70/10/20 % splits): a small
    forecasting file, made here (:func:`write_ett_like_csv`)."""
    return write_ett_like_csv(tmp_path_factory.mktemp("series") / "small.csv")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests of one ``xdist_group`` go to one worker under ``--dist loadgroup`` (the default:
    pyproject.toml) because each worker appends the group's name to their node ids
    (``...::test@torchrun``), which xdist's scheduler reads. pytest-xdist 3.8 sets ``item._nodeid``,
    which pytest 9.2's structured node ids no longer read, so every group ran spread over the workers
    as other tests do (the torchrun launches side by side): the name is appended here where it is not."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers under loadgroup
        return
    for item in items:
        names = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
        suffix = "@" + "_".join(sorted(names))
        if not names or item.nodeid.endswith(suffix):
            continue
        if hasattr(item, "_id"):  # pytest >= 9.2: a NodeId, parsed from its string
            item._id = type(item._id).parse(item.nodeid + suffix)
        else:
            item._nodeid = item.nodeid + suffix


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
    # every test starts on one thread (below), whatever the one before left: a CTranslate2 translator
    # opened without intra_threads sets the OpenMP threads torch shares to the cores' number, and
    # on two shared cores every later test of that worker then took up to 9x the CPU time
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


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
    from aiayn.train.engine import train
    from aiayn.train.translation import TranslationTask

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
    train(TranslationTask(run_config_from_dict(values)), root / "run", log=lambda _: None, progress=False)
    return root / "run"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (servers, torchrun's master and rendezvous ports)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_up(url: str, process: subprocess.Popen, seconds: float = 60.0) -> None:
    import httpx

    deadline = time.time() + seconds
    with httpx.Client(timeout=1.0) as client:  # one client: each new one costs ~60 ms
        while time.time() < deadline:
            if process.poll() is not None:
                raise AssertionError(f"aiayn serve exited with {process.returncode}: {process.stderr.read()}")
            try:
                if client.get(f"{url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
    raise AssertionError(f"aiayn serve did not answer {url}/health within {seconds} s")


class _Servers:
    """Starts real ``aiayn serve`` subprocesses on 127.0.0.1 and free ports; kills them all in
    :meth:`stop`. ``shared``: one server per run directory
    and flags, started at the first call and reused by the next (for tests that leave it as it was).
    ``run_dir``: a run directory, or a list of ``--checkpoint`` values to serve several models
    (``["aa-bb=RUN", "bb-cc=RUN"]``)."""

    def __init__(self, shared: bool) -> None:
        self.shared, self.started, self.urls = shared, [], {}

    def __call__(self, run_dir: Path | list[str], *flags: str) -> str:
        key = (str(run_dir), flags)
        if self.shared and key in self.urls:
            return self.urls[key]
        port = free_port()
        given = run_dir if isinstance(run_dir, list) else [run_dir]
        checkpoints = [arg for value in given for arg in ("--checkpoint", str(value))]
        command = [sys.executable, "-m", "aiayn", "serve", *checkpoints, "--port", str(port)]
        process = subprocess.Popen(
            [*command, "--device", "cpu", *flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(process)
        url = f"http://127.0.0.1:{port}"
        _wait_until_up(url, process)
        self.process, self.urls[key] = process, url
        return url

    def stop(self) -> None:
        # killed: a server's clean exit on SIGTERM costs ~1 s of CPU (its interpreter's teardown), and
        # what it does is tested where it matters (test_serve.py, the request in flight, exit 0)
        for process in self.started:
            process.kill()
        for process in self.started:
            process.wait()


@pytest.fixture()
def live_server():
    """``live_server(run_dir, *flags) -> base URL`` of a real ``aiayn serve`` subprocess of this test
    alone (``live_server.process``: the last one started); stopped after the test."""
    servers = _Servers(shared=False)
    yield servers
    servers.stop()


@pytest.fixture(scope="session")
def shared_server():
    """As :func:`live_server`, but one server per run directory and flags for the whole session: for
    tests that neither stop the server nor depend on what other requests it has answered. A session
    of pytest-xdist is a worker's, so the tests of :func:`tiny_translation_run` are one group,
    ``xdist_group("served")``, which runs on one worker: the model is trained once and each shared
    server started once (each start costs ~3.5 s of CPU)."""
    servers = _Servers(shared=True)
    yield servers
    servers.stop()


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


# --- torchrun launches -----------------------------------------------------------------------------

#: What a torchrun launch prints when one of its processes aborts while they shut down, after the
#: training ended (PyTorch's gloo/c10d teardown; pytorch#69197): seen in 3 of 8 full runs of the
#: suite here, never in 9 runs of the two-node test alone (benchmarks/README.md).
TORCHRUN_TEARDOWN = ("terminate called without an active exception", "RendezvousConnectionError")


def launched(
    launch: Callable[[], tuple[list[int], list[str]]], out: Path, attempts: int = 3
) -> tuple[list[int], list[str]]:
    """``launch()`` (its launchers' exit codes and outputs), training into the run directory ``out``;
    launched again, with ``out`` as it was before, only while it fails with :data:`TORCHRUN_TEARDOWN`."""
    before = Path(tempfile.mkdtemp(prefix="before-")) / out.name
    if out.exists():
        shutil.copytree(out, before)
    for attempt in range(attempts):
        codes, outputs = launch()
        teardown = any(marker in output for output in outputs for marker in TORCHRUN_TEARDOWN)
        if all(code == 0 for code in codes) or not teardown or attempt == attempts - 1:
            return codes, outputs
        shutil.rmtree(out, ignore_errors=True)
        if before.exists():
            shutil.copytree(before, out)
    raise AssertionError("unreachable")
