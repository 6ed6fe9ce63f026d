"""``aiayn serve`` over several models: each pair routed to its model, pivots through a bridge
language equal to the models run by hand one after the other, models loaded once on first use and
unloaded beyond ``--max-loaded-models``, a model that cannot load refused (503) while the others
serve, and one line at start for what cannot be served.

The tiny digits->words model stands for every model here, served under several names and pairs
(``aa-bb=RUN``): a pivot aa->bb->cc runs it twice, which is what a pivot is, whatever the languages.
"""

from __future__ import annotations

import concurrent.futures
import re
import shutil
from pathlib import Path

import pytest

from aiayn.cli import main
from aiayn.decode import Translator
from aiayn.decode.request import TEXT, Line, Wanted
from aiayn.loading import load
from aiayn.service.chain import compose
from conftest import free_port

pytestmark = pytest.mark.xdist_group("served")  # on one worker with the other tests of the tiny model
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
CLIENT = httpx.Client(timeout=60.0)
NUMBERS = ["907042", "13", "500", "2024", "77"]


def pivot_server(server, run: Path, *flags: str) -> str:
    """A server of two models: aa->bb and bb->cc (aa->cc is a pivot through bb)."""
    return server(f"aa-bb={run}", "--checkpoint", f"bb-cc={run}", *flags)


def translate(url: str, **body) -> dict:
    answer = CLIENT.post(f"{url}/v1/translate", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def by_hand(run: Path, lines: list, wanted: Wanted = TEXT, **options) -> list:
    model, tokenizer, _ = load(run)
    return Translator(model, tokenizer, **options).translate(lines, wanted=wanted)


def test_a_pivot_equals_the_two_models_run_one_after_the_other(tiny_translation_run, shared_server) -> None:
    url = pivot_server(shared_server, tiny_translation_run)
    answer = translate(url, text=NUMBERS, source="aa", target="cc", nbest=2)
    bridge = by_hand(tiny_translation_run, NUMBERS)
    expected = by_hand(tiny_translation_run, [b.text for b in bridge], Wanted(scores=True), nbest=2)
    assert [t["text"] for t in answer["translations"]] == [e.text for e in expected]
    assert [[h["text"] for h in t["nbest"]] for t in answer["translations"]] == [
        [text for _, text in e.nbest] for e in expected
    ]
    assert answer["route"] == [
        {"model": str(tiny_translation_run), "source": "aa", "target": "bb"},  # named by its path
        {"model": f"{tiny_translation_run}#2", "source": "bb", "target": "cc"},  # the same, made unique
    ]
    direct = translate(url, text=NUMBERS, source="AA", target=" bb")  # codes as the catalog reads them
    assert [t["text"] for t in direct["translations"]] == [b.text for b in bridge]
    assert len(direct["route"]) == 1
    languages = CLIENT.get(f"{url}/languages").json()
    assert languages[0] == {"code": "aa", "name": "aa", "targets": ["bb", "cc"], "pivots": {"cc": ["bb"]}}
    assert {lang["code"]: lang["targets"] for lang in languages} == {
        "aa": ["bb", "cc"],
        "bb": ["cc"],
        "cc": [],
    }
    listed = CLIENT.get(f"{url}/v1/models").json()["models"]
    assert [(m["languages"], m["loaded"], m["loads"]) for m in listed] == [
        ({"source": ["aa"], "target": ["bb"]}, True, 1),
        ({"source": ["bb"], "target": ["cc"]}, True, 1),
    ]


def test_prefix_alignments_html_and_glossary_over_a_pivot(tiny_translation_run, shared_server) -> None:
    """A prefix is the last model's; alignments are composed through the bridge; HTML keeps its
    markup; a glossary is refused in one line."""
    url = pivot_server(shared_server, tiny_translation_run)
    pair = {"source": "aa", "target": "cc"}
    bridge = by_hand(tiny_translation_run, ["907042"], Wanted(alignment=True))[0]
    aligned = Wanted(alignment=True)
    last = by_hand(tiny_translation_run, [Line(bridge.text, "seven")], aligned)[0]
    answer = translate(url, text=["907042"], prefix=["seven"], alignments=True, **pair)["translations"][0]
    assert answer["text"] == last.text and answer["text"].startswith("seven")
    assert [tuple(p) for p in answer["alignment"]] == list(compose(bridge.alignment, last.alignment))
    html = translate(url, text=["<p>907042 <b>13</b></p>"], format="html", **pair)["translations"][0]
    assert html["text"].startswith("<p>") and "<b>" in html["text"] and html["text"].endswith("</p>")
    refused = CLIENT.post(f"{url}/v1/translate", json={"text": ["13"], "glossary": [["13", "x"]], **pair})
    assert refused.status_code == 422 and refused.json()["error"].startswith(
        "glossary: not over a pivot (aa->bb->cc)"
    )
    attention = CLIENT.post(f"{url}/v1/attention", json={"text": "907042", **pair}).json()
    assert attention["bridge"] == [by_hand(tiny_translation_run, ["907042"])[0].text]
    assert attention["translation"] == translate(url, text=["907042"], **pair)["translations"][0]["text"]
    choices = CLIENT.post(f"{url}/v1/choices", json={"text": "907042", "k": 3, **pair}).json()
    assert len(choices["choices"]) == 3 and choices["bridge"] == attention["bridge"]


def test_every_request_names_a_served_pair(tiny_translation_run, shared_server) -> None:
    url = pivot_server(shared_server, tiny_translation_run)
    for body, start in [
        ({"text": ["1"]}, "source: needed: this server translates aa (aa) to bb (bb), aa (aa) to cc (cc)"),
        ({"text": ["1"], "source": "aa"}, "target: needed"),
        ({"text": ["1"], "source": "cc", "target": "aa"}, "cc->aa is not served: this server translates"),
    ]:
        answer = CLIENT.post(f"{url}/v1/translate", json=body)
        assert answer.status_code == 400 and answer.json()["error"].startswith(start), answer.text
    lt = CLIENT.post(f"{url}/translate", json={"q": "1", "source": "cc", "target": "aa"})
    assert lt.status_code == 400 and lt.json()["error"].startswith("cc is not supported: this server")
    pivoted = CLIENT.post(f"{url}/translate", json={"q": "907042", "source": "aa", "target": "cc"}).json()
    assert (
        pivoted["translatedText"]
        == translate(url, text=["907042"], source="aa", target="cc")["translations"][0]["text"]
    )
    assert [step["target"] for step in pivoted["route"]] == ["bb", "cc"]  # beyond LibreTranslate's fields


def test_models_load_once_on_first_use_and_unload_beyond_the_cap(tiny_translation_run, live_server) -> None:
    url = live_server(
        f"aa-bb={tiny_translation_run}",
        "--checkpoint",
        f"cc-dd={tiny_translation_run}",
        "--max-loaded-models",
        "1",
    )
    state = lambda: [(m["loaded"], m["loads"]) for m in CLIENT.get(f"{url}/v1/models").json()["models"]]  # noqa: E731
    assert state() == [(False, 0), (False, 0)]  # nothing loaded before it is asked for
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # a cold model asked four times at once
        answers = list(pool.map(lambda _: translate(url, text=["13"], source="aa", target="bb"), range(4)))
    assert len({a["translations"][0]["text"] for a in answers}) == 1 and state() == [(True, 1), (False, 0)]
    translate(url, text=["13"], source="cc", target="dd")
    assert state() == [(False, 1), (True, 1)]
    translate(url, text=["13"], source="aa", target="bb")
    assert state() == [(True, 2), (False, 1)]


def test_a_model_that_cannot_load_is_a_503_while_the_others_serve(
    tiny_translation_run, tmp_path, live_server
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(load(tiny_translation_run).checkpoint.path, broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    url = live_server(f"aa-bb={tiny_translation_run}", "--checkpoint", f"bb-cc={broken}")
    for _ in range(3):
        refused = CLIENT.post(f"{url}/v1/translate", json={"text": ["13"], "source": "aa", "target": "cc"})
        assert refused.status_code == 503
        assert refused.json()["error"].startswith(f"model {broken} cannot be loaded: corrupt checkpoint file")
        assert translate(url, text=["13"], source="aa", target="bb")["translations"][0]["text"]
    live_server.process.kill()
    said = [line for line in live_server.process.stderr.read().splitlines() if "cannot be loaded" in line]
    assert len(said) == 1, said


def test_what_cannot_be_served_is_one_line_at_start(tiny_translation_run, tmp_path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    cases = [
        (["--models", str(tmp_path / "empty")], "--models .*: no checkpoint or run directory in it"),
        (["--checkpoint", str(tiny_translation_run)] * 2, "two models translate digits->words: "),
        (
            ["--checkpoint", str(tiny_translation_run), "--max-memory", "1k"],
            "--max-memory 1024: smaller than",
        ),
        (["--checkpoint", "aa-bb=x", "--checkpoint", "y", "--source-lang", "de"], "--source-lang: for one"),
        (["--models", str(tmp_path), "--target-lang", "en"], "--target-lang: for one --checkpoint"),
        (
            ["--checkpoint", str(tiny_translation_run), "--max-memory", "lots"],
            "--max-memory lots: not a size",
        ),
        ([], "give --checkpoint PATH"),
    ]
    for flags, message in cases:
        assert main(["serve", *flags, "--port", str(free_port())]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and re.search(message, err), (flags, err)


def test_a_multi_target_model_is_asked_with_its_target_piece(tmp_path, live_server) -> None:
    """An imported opus-mt-shaped model whose vocabulary has ``>>deu<<`` serves German as a target:
    its sources start with the piece, as the model run by hand on ">>deu<< TEXT" gives, and its
    alignments leave the piece out."""
    from marian_model import import_marian, make_marian

    checkpoint = import_marian(make_marian(tmp_path / "opus-mt-tiny", steps=20), tmp_path / "imported")
    url = live_server(f"xx-de={checkpoint}")
    texts = ["Der hund läuft im park.", "Ein kind spielt mit dem ball"]
    answer = translate(url, text=texts, source="xx", target="de", alignments=True)
    expected = by_hand(checkpoint, [f">>deu<< {text}" for text in texts], Wanted(alignment=True))
    assert [t["text"] for t in answer["translations"]] == [e.text for e in expected]
    for got, hand in zip(answer["translations"], expected):
        assert [tuple(p) for p in got["alignment"]] == [(i - 1, j) for i, j in hand.alignment if i > 0]
    unnamed = translate(url, text=texts)  # the server's one pair: the piece too
    assert [t["text"] for t in unnamed["translations"]] == [e.text for e in expected]
    refused = CLIENT.post(f"{url}/v1/translate", json={"text": ["x"], "source": "xx", "target": "en"})
    assert (
        refused.status_code == 400
        and "this server translates xx (xx) to German (de)" in refused.json()["error"]
    )
