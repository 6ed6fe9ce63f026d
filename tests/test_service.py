"""The models a server holds (:mod:`aiayn.service`): which exist and what each translates, which are
loaded within a budget, and how a pair is reached (directly, or through bridge languages).

No server here: the registry runs in an event loop of the test's own, the catalog reads checkpoint
directories the tests write, the chain runs fake backends whose outputs name what they read.
"""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aiayn.checkpoint import CONFIG_FILE, MODEL_FILE, TOKENIZER_FILE
from aiayn.data.tokenizer import VocabTokenizer
from aiayn.decode.request import TEXT, Line, Translation, Wanted, as_lines
from aiayn.decode.search import DecodeOptions
from aiayn.errors import UserError
from aiayn.service.catalog import ModelSpec, catalog, direct_pairs, parse_naming
from aiayn.service.chain import Chain, Tagged, compose
from aiayn.service.languages import normalize, target_tokens
from aiayn.service.registry import Budget, Registry, Unavailable
from aiayn.service.router import Router

# --- the catalog ------------------------------------------------------------------------------------


def write_checkpoint(
    path: Path, src: str | None = "de", tgt: str | None = "en", pieces=None, size=100
) -> Path:
    """A directory that reads as a checkpoint (config, weights of ``size`` bytes, a tokenizer): the
    catalog reads no weights, so their bytes need not be a model."""
    path.mkdir(parents=True)
    data = {k: v for k, v in (("src_lang", src), ("tgt_lang", tgt)) if v}
    config = {"format": 1, "kind": "translation", "model": {}, "run": {"data": data}}
    (path / CONFIG_FILE).write_text(json.dumps(config))
    (path / MODEL_FILE).write_bytes(b"\0" * size)
    if pieces is not None:  # a vocabulary tokenizer, as an opus-mt import's
        (path / TOKENIZER_FILE).write_bytes(
            VocabTokenizer.MAGIC + b', "pieces": ' + json.dumps(pieces).encode() + b"}"
        )
    return path


def test_languages_come_from_the_checkpoint_or_are_named(tmp_path) -> None:
    write_checkpoint(tmp_path / "de_en")
    write_checkpoint(tmp_path / "anon", src=None, tgt=None)
    [spec] = catalog([str(tmp_path / "de_en")], None)
    assert (spec.sources, spec.targets, spec.pairs, spec.size) == (("de",), ("en",), [("de", "en")], 100)
    [named] = catalog([f"fr-en+es={tmp_path / 'anon'}"], None)
    assert named.pairs == [("fr", "en"), ("fr", "es")]
    [alone] = catalog([str(tmp_path / "anon")], None)  # one model may be served without languages
    assert alone.pairs == []
    with pytest.raises(UserError, match="records no languages; name them: --checkpoint SRC-TGT="):
        catalog([str(tmp_path / "de_en"), str(tmp_path / "anon")], None)
    [flagged] = catalog([str(tmp_path / "anon")], None, ("deu", "EN"))  # --source-lang, --target-lang
    assert flagged.pairs == [("de", "en")]
    assert parse_naming("runs/x") == ("runs/x", None, None)
    assert parse_naming("de-en=runs/x") == ("runs/x", ("de",), ("en",))


def test_a_multi_target_model_serves_each_of_its_target_pieces(tmp_path) -> None:
    pieces = ["<pad>", "<unk>", "<s>", "</s>", ">>fra<<", ">>es<<", ">>fr<<", "▁a"]
    assert target_tokens(pieces) == {"fr": ">>fra<<", "es": ">>es<<"}
    assert [normalize(c) for c in ("deu", " DE", "pt-BR", "deu_CH", "cmn_Hans")] == [
        "de",
        "de",
        "pt_br",
        "de_ch",
        "zh_hans",
    ]
    write_checkpoint(tmp_path / "romance", src="en", tgt="ROMANCE", pieces=pieces)
    [spec] = catalog([str(tmp_path / "romance")], None)
    assert spec.pairs == [("en", "fr"), ("en", "es")] and spec.tokens == {"fr": ">>fra<<", "es": ">>es<<"}
    with pytest.raises(UserError, match="without a >>it<< piece; its targets: fr, es"):
        catalog([f"en-it={tmp_path / 'romance'}"], None)


def test_models_dir_and_pairs_served_twice(tmp_path) -> None:
    folder = tmp_path / "models"
    write_checkpoint(folder / "de_en")
    write_checkpoint(folder / "en_fr", src="en", tgt="fr")
    (folder / "notes").mkdir()  # not a model: left out
    assert [s.name for s in catalog([], str(folder))] == ["de_en", "en_fr"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no checkpoint or run directory in it"):
        catalog([], str(tmp_path / "empty"))
    write_checkpoint(tmp_path / "other_de_en")
    with pytest.raises(UserError, match="two models translate de->en: .*de_en and .*de_en; serve one"):
        direct_pairs(catalog([str(tmp_path / "other_de_en")], str(folder)))
    write_checkpoint(tmp_path / "multi", src="en", tgt="mul", pieces=[">>fr<<", ">>es<<"])
    chosen = direct_pairs(catalog([str(tmp_path / "multi")], str(folder)))
    assert chosen[("en", "fr")].name == "en_fr" and chosen[("en", "es")].name.endswith("multi")


# --- the router -------------------------------------------------------------------------------------


def spec(name: str, pairs: str, tokens: dict | None = None) -> ModelSpec:
    """A model of ``pairs`` ("de-en"; "en-fr+es" for a multi-target one)."""
    source, targets = pairs.split("-")
    return ModelSpec(name, Path(name), (source,), tuple(targets.split("+")), tokens=tokens or {})


def test_a_pair_is_reached_directly_through_english_first_else_by_the_shortest_chain() -> None:
    router = Router(
        [
            spec("de_en", "de-en"),
            spec("en_fr", "en-fr"),
            spec("de_cs", "de-cs"),
            spec("cs_fr", "cs-fr"),  # de->cs->fr is as short as de->en->fr: English goes first
            spec("fr_it", "fr-it"),
        ]
    )
    assert router.route("de", "en").models == ["de_en"] and not router.route("de", "en").pivoted
    assert router.route("de", "fr").languages == ["de", "en", "fr"]
    assert router.route("de", "fr").models == ["de_en", "en_fr"]
    assert router.route("de", "it").languages == ["de", "en", "fr", "it"]  # shortest: 3 legs
    assert router.route("cs", "it").languages == ["cs", "fr", "it"]  # no English on the way
    assert router.route("fr", "de") is None and router.route("de", "de") is None
    assert router.targets("de") == ["cs", "en", "fr", "it"] and router.sources == ["cs", "de", "en", "fr"]
    assert Router([spec("de_en", "de-en")]).sources == ["de"]  # English, a target only, is no source
    tagged = Router([spec("romance", "en-fr+es", {"fr": ">>fr<<", "es": ">>es<<"}), spec("de_en", "de-en")])
    assert [leg.token for leg in tagged.route("de", "es").legs] == [None, ">>es<<"]


# --- the registry -----------------------------------------------------------------------------------


class Loads:
    """A ``load`` that records each load, can be held until released, and fails for ``broken``."""

    def __init__(self, broken: set[str] = frozenset()) -> None:
        self.count: dict[str, int] = {}
        self.gate = threading.Event()
        self.gate.set()
        self.broken, self.closed = broken, []

    def __call__(self, spec: ModelSpec) -> str:
        assert self.gate.wait(10)
        if spec.name in self.broken:
            raise UserError(f"corrupt checkpoint file {spec.path}/model.safetensors: bad\nsecond line")
        self.count[spec.name] = self.count.get(spec.name, 0) + 1
        return f"model {spec.name}"


def registry(loads: Loads, budget: Budget, logged: list, *names: str, size: int = 10) -> Registry:
    specs = [ModelSpec(n, Path(n), ("x",), ("y",), size=size) for n in names]
    return Registry(
        specs, loads, ThreadPoolExecutor(1), budget=budget, closed=loads.closed.append, log=logged.append
    )


async def use(reg: Registry, name: str) -> str:
    async with reg.use(name) as value:
        return value


def test_concurrent_requests_wait_for_one_load() -> None:
    loads, logged = Loads(), []
    reg = registry(loads, Budget(), logged, "a")

    async def scenario():
        loads.gate.clear()
        waiting = [asyncio.ensure_future(use(reg, "a")) for _ in range(5)]
        await asyncio.sleep(0.05)
        assert reg.status("a")["state"] == "loading" and not any(w.done() for w in waiting)
        loads.gate.set()
        return await asyncio.wait_for(asyncio.gather(*waiting), 10)

    assert asyncio.run(scenario()) == ["model a"] * 5 and loads.count == {"a": 1}


def test_the_least_recently_used_idle_model_is_unloaded_beyond_the_budget() -> None:
    loads, logged = Loads(), []
    reg = registry(loads, Budget(max_loaded=2), logged, "a", "b", "c")

    async def scenario():
        for name in ("a", "b", "a", "c"):  # c unloads b (a was used after it)
            await use(reg, name)
        assert reg.loaded() == ["a", "c"] and loads.closed == ["model b"]
        async with reg.use("a"), reg.use("c"):  # both in use: b loads beyond the budget
            async with reg.use("b"):
                assert sorted(reg.loaded()) == ["a", "b", "c"]
            assert reg.loaded() == ["a", "c"]  # b, idle, goes first: back within the budget

    asyncio.run(scenario())
    assert loads.count == {"a": 1, "b": 2, "c": 1}


def test_two_cold_models_asked_at_once_load_one_after_the_other_within_the_budget() -> None:
    """With a cap of 2 and an idle model loaded, two cold models asked together: the second's load
    starts only after the first's, and the idle model is unloaded before it (never 3 at once)."""
    loads, logged = Loads(), []
    reg = registry(loads, Budget(max_loaded=2), logged, "a", "b", "c")
    resident = []  # models loaded when each load starts, the one loading included

    def load(spec):
        resident.append(len(reg.loaded()) + 1)
        return loads(spec)

    reg.load = load

    async def scenario():
        await use(reg, "a")
        loads.gate.clear()
        both = asyncio.gather(use(reg, "b"), use(reg, "c"))
        await asyncio.sleep(0.05)
        loads.gate.set()
        await asyncio.wait_for(both, 10)

    asyncio.run(scenario())
    assert resident == [1, 2, 2] and loads.closed == ["model a"] and sorted(reg.loaded()) == ["b", "c"]


def test_a_byte_budget_and_one_no_model_fits() -> None:
    loads, logged = Loads(), []
    reg = registry(loads, Budget(max_bytes=25), logged, "a", "b", "c")  # 10 bytes each: two fit

    async def scenario():
        for name in ("a", "b", "c"):
            await use(reg, name)
        return reg.loaded()

    assert asyncio.run(scenario()) == ["b", "c"]
    with pytest.raises(UserError, match=r"--max-memory 5: smaller than the model a \(10 bytes of weights\)"):
        registry(loads, Budget(max_bytes=5), logged, "a")
    with pytest.raises(UserError, match="--max-loaded-models: must be >= 1"):
        registry(loads, Budget(max_loaded=0), logged, "a")


def test_a_model_that_fails_to_load_is_said_once_and_the_others_serve() -> None:
    loads, logged = Loads(broken={"bad"}), []
    reg = registry(loads, Budget(), logged, "bad", "good")

    async def scenario():
        for _ in range(3):
            with pytest.raises(Unavailable, match="model bad cannot be loaded: corrupt checkpoint file"):
                await use(reg, "bad")
            assert await use(reg, "good") == "model good"

    asyncio.run(scenario())
    assert logged == ["model bad cannot be loaded: corrupt checkpoint file bad/model.safetensors: bad"]
    assert reg.status("bad")["state"] == "failed" and reg.status("good")["loaded"]


# --- chains -----------------------------------------------------------------------------------------


class Echo:
    """A backend whose translation of a line is ``tag(text)``, word for word (alignment i -> i), with
    a confidence of -1 per line and its prefix kept in front."""

    name, tokenizer, config, progress = "fake", None, None, None

    def __init__(self, tag: str) -> None:
        self.tag, self.calls = tag, []

    def translate(self, lines, options, wanted=TEXT):
        lines = as_lines(lines)
        self.calls.append((lines, options, wanted))
        return [self._one(line, options) for line in lines]

    def _one(self, line: Line, options) -> Translation:
        words = [f"{self.tag}({w})" for w in line.text.split()]
        text = " ".join([line.prefix, *words]).strip()
        nbest = tuple((-float(k), f"{text} #{k}") for k in range(options.nbest))
        pairs = tuple((i, i + len(line.prefix.split())) for i in range(len(words)))
        return Translation(text, pairs, -1.0, nbest, confidence=-1.0, length=3)


def test_a_chain_is_its_legs_one_after_the_other() -> None:
    first, second = Echo("en"), Echo("fr")
    chain = Chain([first, second])
    lines = [Line("ein hund", prefix="le"), Line("zwei")]
    found = chain.translate(lines, DecodeOptions(nbest=2), Wanted(alignment=True, confidence=True))
    by_hand = second.translate([Line("en(ein) en(hund)", "le"), Line("en(zwei)")], DecodeOptions(nbest=2))
    assert (
        [f.text for f in found]
        == [b.text for b in by_hand]
        == ["le fr(en(ein)) fr(en(hund))", "fr(en(zwei))"]
    )
    assert [f.nbest for f in found] == [b.nbest for b in by_hand]  # the last leg's n-best
    assert first.calls[0][1].nbest == 1 and first.calls[0][0] == [Line("ein hund"), Line("zwei")]  # no prefix
    assert found[0].alignment == ((0, 1), (1, 2)) and found[0].confidence == -2.0  # composed; summed
    with pytest.raises(UserError, match="glossary: not over a pivot"):
        chain.translate(lines, DecodeOptions(glossary=(("hund", "chien"),)))
    assert compose(((0, 0), (1, 0), (2, 1)), ((0, 1), (1, 0))) == ((0, 1), (1, 1), (2, 0))


def test_a_multi_target_leg_starts_each_source_with_its_piece() -> None:
    echo = Echo("t")
    found = Tagged(echo, ">>fr<<").translate(["ein hund", "  "], DecodeOptions(), Wanted(alignment=True))
    assert [line.text for line in echo.calls[0][0]] == [">>fr<< ein hund", "  "]  # a blank line stays blank
    assert found[0].alignment == ((0, 1), (1, 2))  # over "ein hund": the piece's word left out
