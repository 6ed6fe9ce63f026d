"""``aiayn serve`` end to end: a real server on a free loopback port, a tiny trained model.

The API's answers equal ``Translator``'s; documents are split into sentences, translated whole and
rebuilt; a sentence's output does not depend on what it is batched with, and the sentences of
requests that arrive together share batches; bad requests are one-line 4xx JSON errors that never
stop the server; the API key, the limits (413, 429), and a clean SIGTERM that answers the request in
flight. The LibreTranslate API is tested in test_serve_libretranslate.py.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import re
import signal
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.xdist_group("served")  # on one worker with the other tests of the tiny served model
httpx = pytest.importorskip("httpx")
# one client for the module: CLIENT.post() makes a new one per call, ~60 ms (its SSL context) each
CLIENT = httpx.Client(timeout=60.0)
pytest.importorskip("fastapi")

from aiayn.cli import main  # noqa: E402
from aiayn.decode import Translator  # noqa: E402
from aiayn.decode.request import TEXT, Line, Translation, Wanted  # noqa: E402
from aiayn.loading import load  # noqa: E402

SCORES = Wanted(scores=True)
NUMBERS = ["907042", "13", "500", "2024", "77", "100001", "48", "9", "31337", "600", "7", "123456"]


def post(url: str, route: str, body, **kwargs) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **kwargs.pop("headers", {})}
    return CLIENT.post(f"{url}{route}", content=content, headers=headers, timeout=60.0, **kwargs)


def test_translate_equals_the_translator_and_model_describes_it(tiny_translation_run, shared_server) -> None:
    url = shared_server(tiny_translation_run)
    answer = post(url, "/v1/translate", {"text": NUMBERS, "beam": 4, "alpha": 0.6, "nbest": 2})
    assert answer.status_code == 200, answer.text
    model, tokenizer, config = load(tiny_translation_run)
    found = Translator(model, tokenizer, beam=4, alpha=0.6, nbest=2).translate(NUMBERS, wanted=SCORES)
    expected = [t.nbest for t in found]
    got = answer.json()["translations"]
    assert [[h["text"] for h in t["nbest"]] for t in got] == [[text for _, text in e] for e in expected]
    for t, e in zip(got, expected):
        assert t["text"] == e[0][1] and t["score"] == pytest.approx(e[0][0], abs=1e-5)
    info = CLIENT.get(f"{url}/v1/model").json()
    assert info["kind"] == "translation" and info["engine"] == "torch"
    assert info["config"]["n_decoder_layers"] == config.n_decoder_layers == 2
    assert info["languages"] == {"source": "digits", "target": "words"}  # the run config's
    assert info["vocab_size"] == tokenizer.vocab_size and info["parameters"] > 0
    assert (
        CLIENT.get(f"{url}/docs").status_code == 200
        and "/v1/translate" in CLIENT.get(f"{url}/openapi.json").text
    )


def test_a_sentence_gets_the_same_output_whatever_it_is_batched_with(
    tiny_translation_run, shared_server
) -> None:
    url = shared_server(tiny_translation_run, "--max-wait-ms", "50")
    alone = {n: post(url, "/v1/translate", {"text": [n]}).json()["translations"][0] for n in NUMBERS}
    groups = [NUMBERS[i : i + 3] for i in range(0, len(NUMBERS), 3)] + [[n] for n in NUMBERS]
    documents = ["\n\n".join(NUMBERS[i : i + 4]) for i in range(0, len(NUMBERS), 4)]  # one entry each
    requests = [{"text": g} for g in groups] + [{"text": [d]} for d in documents]
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:  # arrive together: batched
        answers = list(pool.map(lambda body: post(url, "/v1/translate", body), requests))
    for group, answer in zip(groups, answers):
        for number, translation in zip(group, answer.json()["translations"]):
            assert translation["text"] == alone[number]["text"], number
            assert translation["score"] == pytest.approx(alone[number]["score"], abs=1e-5)
    for document, answer in zip(documents, answers[len(groups) :]):
        (translation,) = answer.json()["translations"]
        numbers = document.split("\n\n")
        assert translation["sentences"] == [[n, alone[n]["text"]] for n in numbers]
        assert translation["text"] == "\n\n".join(alone[n]["text"] for n in numbers)


BAD_REQUESTS = [
    (b"{not json", "body"),
    (b'{"text": ["\xff\xfe"]}', "body"),
    ({}, "text"),
    ({"text": "907042"}, "text"),
    ({"text": [907042]}, "text.0"),
    ({"text": []}, "text"),
    ({"text": ["1" * 100_001]}, "text[0]: at most 100000 characters per document"),
    ({"text": ["1"] * 300}, "text: at most 256 entries"),
    ({"text": ["1"], "format": "xml"}, "format: Input should be 'text', 'html' or 'markdown'"),
    ({"text": ["1"], "alignments": "yes"}, "alignments"),
    ({"text": ["1"], "beam": 0}, "beam"),
    ({"text": ["1"], "beam": -2}, "beam"),
    ({"text": ["1"], "beam": 100}, "beam"),
    ({"text": ["1"], "beam": "4"}, "beam"),
    ({"text": ["1"], "nbest": 5}, "nbest"),
    ({"text": ["1"], "engine": "marian"}, "engine"),
    ({"text": ["1"], "colour": "blue"}, "colour"),
    ({"text": ["1"], "top_p": 0.9}, "top_p: needs sample: true"),
    ({"text": ["1"], "seed": 3}, "seed: needs sample: true"),
    ({"text": ["1"], "sample": True, "top_p": 0}, "top_p"),
    ({"text": ["1"], "sample": True, "temperature": 0}, "temperature"),
    ({"text": ["1"], "sample": True, "top_k": -1}, "top_k"),
    ({"text": ["1"], "sample": True, "seed": -1}, "seed"),
    ({"text": ["1"], "sample": True, "seed": 2**40}, "seed"),
    ({"text": ["1"], "sample": True, "nbest": 65}, "nbest"),
    ({"text": ["1"], "sample": "yes"}, "sample"),
    ([1, 2], "body"),
    ({"text": ["1"], "glossary": [["1"]]}, "glossary: entry 1 is not a pair"),
    ({"text": ["1"], "glossary": [["1", " "]]}, "glossary: entry 1 is not a pair"),
    ({"text": ["1"], "glossary": [["1", "one", "two"]]}, "glossary: entry 1 is not a pair"),
    ({"text": ["1"], "glossary": "1\tone"}, "glossary"),
    ({"text": ["1"], "glossary": [["1", 1]]}, "glossary"),
    ({"text": ["1"], "glossary": [["1", "one\ntwo"]]}, "glossary: entry 1: terms of one line"),
    ({"text": ["1"], "glossary": [["1", "one"]] * 1001}, "glossary: at most 1000 pairs, got 1001"),
    ({"text": ["1"], "glossary": [["1", "one"]], "sample": True}, "glossary: constrains a search"),
    ({"text": ["1", "2"], "prefix": ["one"]}, "prefix: one per entry of text (2), got 1"),
    ({"text": ["1"], "prefix": "one"}, "prefix"),
    ({"text": ["1"], "prefix": ["one\ntwo"]}, "prefix[0]: one line"),
    ({"text": ["1"], "scores": True, "nbest": 2}, "scores: for the best translation only"),
    ({"text": ["1"], "scores": "yes"}, "scores"),
]
BAD_CHOICES = [
    ({"text": "907042", "k": 0}, "k: must be in 1..50, got 0"),
    ({"text": "907042", "k": 51}, "k: must be in 1..50, got 51"),
    ({"text": "907042", "k": "5"}, "k"),
    ({"text": " "}, "text: must not be blank"),
    ({"text": "907042", "prefix": "nine\nhundred"}, "prefix: one line"),
    ({"text": "907042", "prefix": "n" * 2001}, "prefix: at most 2000 characters"),
    ({"text": "907042", "beam": 4}, "beam"),
]


def test_hundreds_of_bad_requests_get_one_line_4xx_and_the_server_lives(
    tiny_translation_run, shared_server
) -> None:
    url = shared_server(tiny_translation_run)
    deadline = time.time() + 60
    for _ in range(12):  # 12 x 25 = 300 requests, bounded in time too
        for body, field in BAD_REQUESTS:
            answer = post(url, "/v1/translate", body)
            assert 400 <= answer.status_code < 500, (body, answer.status_code, answer.text)
            error = answer.json()["error"]
            assert "\n" not in error and error.startswith(field), (body, error)
        assert time.time() < deadline, "the bad requests took too long"
    bad_attention = post(url, "/v1/attention", {"text": ["907042"]})
    assert bad_attention.status_code == 422 and bad_attention.json()["error"].startswith("text")
    bad_attention = [
        ({"text": "907042", "prefix": "nine\nhundred"}, "prefix: one line"),
        ({"text": "907042", "glossary": [["9"]]}, "glossary: entry 1 is not a pair"),
    ]
    routed = [("/v1/choices", *bad) for bad in BAD_CHOICES] + [
        ("/v1/attention", *bad) for bad in bad_attention
    ]
    for route, body, field in routed:
        answer = post(url, route, body)
        assert answer.status_code == 422, (route, body, answer.text)
        error = answer.json()["error"]
        assert "\n" not in error and error.startswith(field), (route, body, error)
    assert post(url, "/v1/forecast", {"rows": [[1.0]]}).status_code == 404
    good = post(url, "/v1/translate", {"text": ["907042"]})
    assert good.status_code == 200 and good.json()["translations"][0]["text"]


def test_sampling_follows_the_translate_commands_rules(tiny_translation_run, shared_server) -> None:
    """``sample`` with a seed gives what ``aiayn translate --sample --seed`` gives for the same text,
    the same on every request and whatever arrives beside it (a sampling request is decoded alone);
    another seed, other samples; a sampling field without ``sample`` and /v1/attention's ``sample``
    are refused."""
    url = shared_server(tiny_translation_run, "--max-wait-ms", "50")
    texts = NUMBERS[:4]
    body = {"text": texts, "sample": True, "seed": 7, "temperature": 1.5, "top_k": 20, "nbest": 3}
    model, tokenizer, _ = load(tiny_translation_run)
    options = {"sample": True, "seed": 7, "temperature": 1.5, "top_k": 20}
    expected = [
        t.nbest for t in Translator(model, tokenizer, nbest=3, **options).translate(texts, wanted=SCORES)
    ]

    def samples(answer: httpx.Response) -> list[list[tuple[float, str]]]:
        assert answer.status_code == 200, answer.text
        return [[(h["score"], h["text"]) for h in t["nbest"]] for t in answer.json()["translations"]]

    first = samples(post(url, "/v1/translate", body))
    assert [[text for _, text in hyps] for hyps in first] == [[text for _, text in e] for e in expected]
    for got, want in zip(first, expected):
        assert [score for score, _ in got] == pytest.approx([score for score, _ in want], abs=1e-5)
    others = [{"text": [n]} for n in NUMBERS[4:]] + [{**body, "seed": 8}, {**body, "text": texts[:2]}]
    with concurrent.futures.ThreadPoolExecutor(len(others) + 2) as pool:  # arrive together
        answers = list(pool.map(lambda b: post(url, "/v1/translate", b), [body, *others, body]))
    assert samples(answers[0]) == samples(answers[-1]) == first
    assert samples(answers[-3]) != first  # seed 8
    unseeded = {k: v for k, v in body.items() if k != "seed"}
    assert samples(post(url, "/v1/translate", unseeded)) != samples(post(url, "/v1/translate", unseeded))
    refused = post(url, "/v1/attention", {"text": "907042", "sample": True})
    assert refused.status_code == 422 and refused.json()["error"].startswith("sample")


def test_the_manual_names_every_field_the_api_takes() -> None:
    """The deployment guide's paragraph on POST /v1/translate names exactly the fields of its
    OpenAPI schema (the /docs page), each of which has a description there."""
    from aiayn.serve.app import Limits, Served, create_app

    app = create_app(Served("translation", {}), Limits(), {"max_tokens": 0, "max_wait_s": 0.0})
    schema = app.openapi()["components"]["schemas"]["TranslateRequest"]
    guide = (Path(__file__).resolve().parents[1] / "docs" / "deploy.md").read_text(encoding="utf-8")
    paragraph = next(p for p in guide.split("\n- ") if p.startswith("`POST /v1/translate`:"))
    named = set(re.findall(r"`([a-z_]+)`", paragraph.split("The answer")[0]))
    assert named == set(schema["properties"]), named ^ set(schema["properties"])
    assert all(field.get("description") for field in schema["properties"].values())


def test_attention_holds_every_layer_and_head_for_the_chosen_translation(
    tiny_translation_run, shared_server
) -> None:
    url = shared_server(tiny_translation_run)
    found = post(url, "/v1/attention", {"text": "907042", "beam": 4}).json()
    translated = post(url, "/v1/translate", {"text": ["907042"], "beam": 4}).json()["translations"][0]
    assert found["translation"] == translated["text"]
    assert found["source_pieces"][-1] == "</s>" and found["target_pieces"][0] == "<s>"
    assert found["predicted_pieces"] == [*found["target_pieces"][1:], "</s>"]  # one place on
    s, t = len(found["source_pieces"]), len(found["target_pieces"])
    shapes = {"encoder_self": (1, s, s), "decoder_self": (2, t, t), "cross": (2, t, s)}
    for kind, (layers, queries, keys) in shapes.items():
        maps = torch.tensor(found["attention"][kind])  # (layers, H, T_q, T_k)
        assert maps.shape == (layers, 2, queries, keys), kind
        torch.testing.assert_close(maps.sum(-1), torch.ones(layers, 2, queries))  # each row a distribution


# --- terminology, prefixes, confidence and the model's choices (issue 43) ---------------------------


def _teacher_forced(model, tokenizer, source: str, translation: str) -> torch.Tensor:
    """``(T + 1, V)`` the model's own log-probabilities along ``translation`` (EOS last), from its
    forward pass over the source and ``[BOS] + translation``."""
    config = model.config
    tokens = tokenizer.encode(translation, target=True) if translation else []
    src = torch.tensor([tokenizer.encode(source) + [config.eos_id]])
    with torch.inference_mode():
        return model(src, torch.tensor([[config.bos_id, *tokens]]))[0].float().log_softmax(-1)


def test_a_glossary_puts_its_terms_in_the_translation_once(tiny_translation_run, shared_server) -> None:
    """ "twelve" is not the model's word for 13: absent without the glossary, there exactly once with
    it (terms met 1 of 1), in the sentence that holds the source term only; requests with other
    glossaries arriving together each get their own; the ctranslate2 engine refuses a glossary."""
    url = shared_server(tiny_translation_run, "--max-wait-ms", "50")
    texts = ["13", "500", "907042\n\n13"]
    plain = post(url, "/v1/translate", {"text": texts, "scores": True}).json()["translations"]
    assert all("twelve" not in t["text"].split() for t in plain)
    bodies = [
        {"text": texts, "scores": True, "glossary": [["13", "twelve"]]},
        {"text": texts, "scores": True, "glossary": [["13", "eleven"], ["500", "twelve"]]},
        {"text": texts, "scores": True},
    ]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:  # arrive together
        answers = list(pool.map(lambda body: post(url, "/v1/translate", body), bodies))
    assert all(answer.status_code == 200 for answer in answers), [a.text for a in answers]
    termed, other, again = (answer.json()["translations"] for answer in answers)
    assert [t["text"] for t in again] == [t["text"] for t in plain]
    first, fifty, document = termed
    assert first["text"].split().count("twelve") == 1 and fifty["text"] == plain[1]["text"]
    assert document["sentences"][0] == plain[2]["sentences"][0]  # 907042: no term there
    assert document["sentences"][1][1].split().count("twelve") == 1
    assert [s["terms"] for t in termed for s in t["sentence_scores"]] == [[1, 1], [0, 0], [0, 0], [1, 1]]
    assert other[0]["text"].split().count("eleven") == 1 and other[1]["text"].split().count("twelve") == 1

    from fastapi.testclient import TestClient

    from aiayn.serve.app import Limits, Served, create_app

    model, tokenizer, _ = load(tiny_translation_run)
    backend = Translator(model, tokenizer)
    backend.name = "ctranslate2"  # what the server checks before any decoding
    app = create_app(Served("translation", {}, backend=backend), Limits(), {"max_tokens": 0, "max_wait_s": 0})
    with TestClient(app) as client:
        refused = client.post("/v1/translate", json={"text": ["13"], "glossary": [["13", "twelve"]]})
    assert refused.status_code == 422
    assert refused.json() == {
        "error": "glossary: the ctranslate2 engine has no lexical constraints; serve with --engine torch"
    }


def test_a_glossary_term_finds_its_inflected_forms_in_the_servers_source_language(
    tiny_translation_run,
) -> None:
    """The model's source language (--source-lang, else the checkpoint's) is the glossary's: with
    "de", "Hund" is asked for where a sentence holds "Hunde"; with the checkpoint's "digits" (no
    lemmas), not."""
    from fastapi.testclient import TestClient

    from aiayn.serve.app import Limits, Served, create_app

    model, tokenizer, _ = load(tiny_translation_run)
    body = {"text": ["42 Hunde"], "scores": True, "glossary": [["Hund", "seven"]]}
    terms = {}
    for source in ("de", "digits"):
        info = {"languages": {"source": source, "target": "words"}}
        served = Served("translation", info, backend=Translator(model, tokenizer))
        with TestClient(create_app(served, Limits(), {"max_tokens": 0, "max_wait_s": 0})) as client:
            answer = client.post("/v1/translate", json=body)
        assert answer.status_code == 200, answer.text
        [translation] = answer.json()["translations"]
        terms[source] = [s["terms"] for s in translation["sentence_scores"]]
        assert translation["text"].split().count("seven") == (source == "de")
    assert terms == {"de": [[1, 1]], "digits": [[0, 0]]}


def test_a_prefix_starts_the_translation_and_the_model_continues(tiny_translation_run, shared_server) -> None:
    """Each document's (first sentence's) translation starts with its prefix, kept as given, the rest
    the model's as ``Translator`` continues it; "" is no prefix; with scores and alignments too."""
    url = shared_server(tiny_translation_run)
    texts, prefixes = ["13", "907042", "907042\n\n13"], ["two", "", "seven  hundred"]
    plain = post(url, "/v1/translate", {"text": texts}).json()["translations"]
    answer = post(url, "/v1/translate", {"text": texts, "prefix": prefixes})
    assert answer.status_code == 200, answer.text
    first, second, document = answer.json()["translations"]
    assert not plain[0]["text"].startswith("two") and first["text"].startswith("two ")
    assert second == plain[1]
    assert document["sentences"][0][1].startswith("seven  hundred") and document["text"].startswith(
        "seven  hundred"
    )
    assert document["sentences"][1] == plain[2]["sentences"][1]  # the second sentence: as without
    model, tokenizer, _ = load(tiny_translation_run)
    found = Translator(model, tokenizer, beam=4, alpha=0.6).translate(
        [Line("13", "two"), Line("907042", "seven  hundred")]
    )
    expected = [t.text for t in found]
    assert [first["text"], document["sentences"][0][1]] == expected
    scored = post(
        url, "/v1/translate", {"text": texts, "prefix": prefixes, "scores": True, "alignments": True}
    )
    assert [t["text"] for t in scored.json()["translations"]] == [
        first["text"],
        second["text"],
        document["text"],
    ]


def test_scores_give_each_sentences_confidence_and_each_words_probability(
    tiny_translation_run, shared_server
) -> None:
    """With ``scores``, a sentence's log_prob is the mean of its tokens' log-probabilities (EOS
    included) under the model's own forward pass, a word's probability the product of its pieces',
    all in (0, 1]; a document's confidence weighs its sentences by their tokens."""
    url = shared_server(tiny_translation_run)
    answer = post(url, "/v1/translate", {"text": ["907042\n\n13", "500"], "scores": True})
    assert answer.status_code == 200, answer.text
    model, tokenizer, _ = load(tiny_translation_run)
    for translation in answer.json()["translations"]:
        assert len(translation["sentence_scores"]) == len(translation["sentences"])
        total, count = 0.0, 0
        for (source, target), scored in zip(translation["sentences"], translation["sentence_scores"]):
            tokens = [*tokenizer.encode(target, target=True), model.config.eos_id]
            log_probs = _teacher_forced(model, tokenizer, source, target).gather(
                -1, torch.tensor(tokens)[:, None]
            )[:, 0]
            assert scored["log_prob"] == pytest.approx(log_probs.mean().item(), abs=1e-4)
            assert scored["probability"] == pytest.approx(math.exp(scored["log_prob"]))
            assert [w for w, _ in scored["words"]] == target.split()
            starts = [i for i, t in enumerate(tokens[:-1]) if tokenizer.id_to_piece(t).startswith("▁")]
            for (_, probability), start, end in zip(scored["words"], starts, [*starts[1:], len(tokens) - 1]):
                assert 0 < probability <= 1
                assert probability == pytest.approx(log_probs[start:end].sum().exp().item(), rel=1e-3)
            total, count = total + log_probs.sum().item(), count + len(tokens)
        assert translation["confidence"]["log_prob"] == pytest.approx(total / count, abs=1e-4)
        assert 0 < translation["confidence"]["probability"] <= 1
    assert "confidence" not in post(url, "/v1/translate", {"text": ["13"]}).json()["translations"][0]


def test_choices_are_the_models_most_probable_next_pieces(tiny_translation_run, shared_server) -> None:
    """/v1/choices gives the k most probable pieces after the prefix, most probable first, with the
    probabilities of the model's own softmax at that place; they and ``rest`` sum to one; a choice's
    prefix, sent back, starts the translation (/v1/translate and /v1/attention alike)."""
    url = shared_server(tiny_translation_run)
    model, tokenizer, config = load(tiny_translation_run)
    for prefix, k in [("", 5), ("nine hundred", 7), ("nine hundred forty-", 1)]:
        answer = post(url, "/v1/choices", {"text": "907042", "prefix": prefix, "k": k})
        assert answer.status_code == 200, answer.text
        found = answer.json()
        probabilities = _teacher_forced(model, tokenizer, "907042", prefix)[-1].exp()
        probabilities[[config.pad_id, config.bos_id]] = 0  # never produced
        expected = probabilities.topk(k)
        assert [c["token"] for c in found["choices"]] == expected.indices.tolist()
        got = [c["probability"] for c in found["choices"]]
        assert got == sorted(got, reverse=True) and got == pytest.approx(expected.values.tolist(), abs=1e-5)
        assert sum(got) + found["rest"] == pytest.approx(1.0, abs=1e-5) and found["rest"] >= 0
        for choice in found["choices"]:
            assert choice["piece"] == tokenizer.id_to_piece(choice["token"])
            assert choice["prefix"].startswith(prefix) and choice["end"] == (choice["token"] == config.eos_id)
    chosen = post(url, "/v1/choices", {"text": "907042", "prefix": "nine", "k": 3}).json()["choices"][2]
    translated = post(url, "/v1/translate", {"text": ["907042"], "prefix": [chosen["prefix"]]}).json()
    attended = post(url, "/v1/attention", {"text": "907042", "prefix": chosen["prefix"]}).json()
    assert translated["translations"][0]["text"] == attended["translation"]
    assert attended["translation"].startswith(chosen["prefix"])
    assert attended["words"] and [w for w, _ in attended["words"]] == attended["translation"].split()
    assert len(attended["probabilities"]) == len(attended["predicted_pieces"])
    assert all(0 < p <= 1 for p in attended["probabilities"])


def test_documents_are_translated_sentence_by_sentence_and_rebuilt(
    tiny_translation_run, shared_server
) -> None:
    """An entry of text is a document: line breaks allowed, split into sentences, each translated as
    alone, the whitespace between them kept; its score is the mean of theirs and its n-best list the
    sentences' k-th hypotheses joined; a blank document is a blank translation; a document of 300
    sentences is one entry; ``alignments`` adds pairs of word indices within both texts' words."""
    url = shared_server(tiny_translation_run)
    numbers = NUMBERS[:5]
    alone = post(url, "/v1/translate", {"text": numbers, "nbest": 2}).json()["translations"]
    document = "  " + "\n\n".join(numbers[:3]) + "\n\n\n" + "\n\n".join(numbers[3:]) + "\n"
    answer = post(url, "/v1/translate", {"text": [document, "", " \n "], "nbest": 2})
    assert answer.status_code == 200, answer.text
    translated, blank, spaces = answer.json()["translations"]
    texts = [t["text"] for t in alone]
    assert translated["sentences"] == [[n, t] for n, t in zip(numbers, texts)]
    assert translated["text"] == "  " + "\n\n".join(texts[:3]) + "\n\n\n" + "\n\n".join(texts[3:]) + "\n"
    assert translated["score"] == pytest.approx(sum(t["score"] for t in alone) / 5, abs=1e-5)
    (best, second) = translated["nbest"]
    assert best == {"text": translated["text"], "score": translated["score"]}
    assert second["text"].split() == " ".join(t["nbest"][1]["text"] for t in alone).split()
    assert second["score"] == pytest.approx(sum(t["nbest"][1]["score"] for t in alone) / 5, abs=1e-5)
    assert blank == {"text": "", "score": 0.0, "nbest": [], "sentences": []} and spaces["nbest"] == []
    assert "alignment" not in translated
    many = " ".join(f"{n}." for n in (NUMBERS * 25)[:300])
    long = post(url, "/v1/translate", {"text": [many], "beam": 1}).json()["translations"][0]
    assert len(long["sentences"]) == 300 and "".join(s for s, _ in long["sentences"]) == many.replace(" ", "")
    aligned = post(url, "/v1/translate", {"text": [document], "alignments": True}).json()["translations"][0]
    words = (len(document.split()), len(aligned["text"].split()))
    assert aligned["alignment"] and aligned["score"] == pytest.approx(
        translated["nbest"][0]["score"], abs=1e-5
    )
    assert all(0 <= i < words[0] and 0 <= j < words[1] for i, j in aligned["alignment"])
    assert {i for i, _ in aligned["alignment"]} <= set(range(5)) and aligned["text"] == translated["text"]


def test_a_document_over_the_limits_is_413(tiny_translation_run, live_server) -> None:
    url = live_server(tiny_translation_run, "--max-chars", "40", "--max-sentences", "3")
    over = post(url, "/v1/translate", {"text": ["13. " * 10 + "7."]})
    assert (
        over.status_code == 413
        and over.json()["error"] == "text[0]: at most 40 characters per document, got 42"
    )
    many = post(url, "/v1/translate", {"text": ["1", "2", "3", "4"]})
    assert many.status_code == 413 and many.json()["error"] == "text: at most 3 entries per request, got 4"
    assert post(url, "/v1/translate", {"text": ["13. " * 9 + "7."]}).status_code == 200


class _Held:
    """A backend whose decoding waits until ``release`` is set (everything else: ``backend``'s)."""

    def __init__(self, backend: Translator) -> None:
        import threading

        self.name, self.tokenizer, self.config = backend.name, backend.tokenizer, backend.config
        self.backend, self.release, self.waiting = backend, threading.Event(), threading.Event()
        self.progress = None

    def translate(self, lines, options, wanted=TEXT):
        self.waiting.set()
        assert self.release.wait(timeout=30)
        return self.backend.translate(lines, options, wanted)


def test_requests_beyond_max_queue_get_429_at_once(tiny_translation_run) -> None:
    """With --max-queue 1, a request while another is being decoded is refused with a 429 and
    Retry-After, on /v1/translate and LibreTranslate's /translate alike; once the first is answered,
    the next is served."""
    from fastapi.testclient import TestClient

    from aiayn.serve.app import Limits, Served, create_app

    model, tokenizer, _ = load(tiny_translation_run)
    held = _Held(Translator(model, tokenizer))
    info = {"languages": {"source": "digits", "target": "words"}}
    app = create_app(
        Served("translation", info, backend=held), Limits(max_queue=1), {"max_tokens": 0, "max_wait_s": 0}
    )
    with TestClient(app) as client, concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, "/v1/translate", json={"text": ["907042"]})
        assert held.waiting.wait(timeout=30)  # the first request is being decoded
        for route, body in [
            ("/v1/translate", {"text": ["13"]}),
            ("/translate", {"q": "13", "source": "digits", "target": "words"}),
        ]:
            refused = client.post(route, json=body)
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"].startswith("Slowdown: 1 requests are already waiting")
        held.release.set()
        assert first.result(timeout=30).status_code == 200
        assert client.post("/v1/translate", json={"text": ["13"]}).status_code == 200


def test_the_sentences_of_documents_arriving_together_share_a_batch(tiny_translation_run) -> None:
    """Two requests of documents translated at once: their sentences reach the batcher from the
    document threads and are decoded in one batch, each document rebuilt from its own."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from aiayn.decode.search import DecodeOptions
    from aiayn.documents.translate import DocumentTranslator
    from aiayn.serve.batching import Batcher
    from aiayn.serve.documents import BatchedBackend

    decoded: list[list[str]] = []

    def decode(lines, options, wanted):  # the batcher's decoding, recorded (the model is not run)
        decoded.append([line.text for line in lines])
        return [Translation(f"<{line.text}>") for line in lines]

    model, tokenizer, _ = load(tiny_translation_run)

    async def scenario():
        with ThreadPoolExecutor(1) as model_thread:
            batcher = Batcher(decode, len, model_thread, max_tokens=1000, max_wait_s=3600.0)
            batcher.recent.append(2)  # two requests came together before: the batch waits for two
            backend = BatchedBackend(Translator(model, tokenizer), batcher, asyncio.get_running_loop())
            documents = DocumentTranslator(backend)
            worker = asyncio.create_task(batcher.run())
            options = DecodeOptions(beam=1)
            first = asyncio.to_thread(documents.translate, ["907042\n\n13"], options)
            second = asyncio.to_thread(documents.translate, ["500"], options)
            results = await asyncio.wait_for(asyncio.gather(first, second), timeout=30)
            worker.cancel()
            return results

    (first,), (second,) = asyncio.run(scenario())
    assert len(decoded) == 1 and sorted(decoded[0]) == ["13", "500", "907042"]
    assert first.text == "<907042>\n\n<13>" and second.text == "<500>"


def test_the_api_key_guards_the_api_only(tiny_translation_run, shared_server) -> None:
    url = shared_server(tiny_translation_run, "--api-key", "s3cret")
    assert post(url, "/v1/translate", {"text": ["1"]}).status_code == 401
    wrong = post(url, "/v1/translate", {"text": ["1"]}, headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "API key" in wrong.json()["error"]
    right = post(url, "/v1/translate", {"text": ["1"]}, headers={"authorization": "Bearer s3cret"})
    assert right.status_code == 200
    assert CLIENT.get(f"{url}/health").status_code == 200 and CLIENT.get(f"{url}/").status_code == 200


def test_a_body_over_the_limit_is_413(tiny_translation_run, live_server) -> None:
    url = live_server(tiny_translation_run, "--max-body-bytes", "200")
    answer = post(url, "/v1/translate", {"text": ["1" * 50] * 10})
    assert answer.status_code == 413 and answer.json()["error"].startswith("body")

    def chunks():  # no Content-Length: the server counts what arrives
        yield b'{"text": ["'
        for _ in range(100):
            yield b"1" * 50
        yield b'"]}'

    chunked = CLIENT.post(
        f"{url}/v1/translate", content=chunks(), headers={"content-type": "application/json"}
    )
    assert chunked.status_code == 413 and chunked.json()["error"].startswith("body")
    small = CLIENT.post(
        f"{url}/v1/translate",
        content=iter([b'{"text": ', b'["907042"]}']),
        headers={"content-type": "application/json"},
    )
    assert small.status_code == 200, small.text
    assert post(url, "/v1/translate", {"text": ["907042"]}).status_code == 200


def test_sigterm_answers_the_request_in_flight_then_exits_0(tiny_translation_run, live_server) -> None:
    url = live_server(tiny_translation_run, "--no-batching")
    process = live_server.process
    long_request = {"text": NUMBERS * 20, "beam": 8, "nbest": 8, "max_len_b": 60}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, url, "/v1/translate", long_request)
        time.sleep(0.5)  # the request is being decoded
        process.send_signal(signal.SIGTERM)
        answer = pending.result(timeout=60)
    assert answer.status_code == 200 and len(answer.json()["translations"]) == len(NUMBERS) * 20
    assert process.wait(timeout=30) == 0


def test_bad_command_lines_are_one_line_and_exit_2(tmp_path: Path, tiny_translation_run, capsys) -> None:
    assert main(["serve", "--checkpoint", str(tmp_path / "nowhere")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
    assert main(["serve", "--checkpoint", str(tiny_translation_run), "--engine", "marian"]) == 2
    assert "--engine: unknown engine 'marian'" in capsys.readouterr().err
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--checkpoint", str(tiny_translation_run), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err


FORECAST_CONFIG = """
data: {target: OT, features: M, input_len: 32, label_len: 8, horizon: 16}
model: {d_model: 16, n_heads: 2, n_encoder_layers: 1, n_decoder_layers: 1, d_ff: 32, dropout: 0.0,
        channel_independent: true, patch_len: 4}
train: {batch_size: 64, lr: 0.003, max_epochs: 1, max_steps_per_epoch: 3, seed: 0}
"""


def test_a_forecasting_run_answers_forecast_as_aiayn_forecast_predict(
    tmp_path, small_csv, live_server
) -> None:
    import numpy as np

    from aiayn.forecast.cli import forecast_last, load_forecaster

    csv = small_csv
    (tmp_path / "run.yaml").write_text(FORECAST_CONFIG)
    train = ["forecast", "train", "--config", str(tmp_path / "run.yaml"), "--data", str(csv)]
    assert main([*train, "--out", str(tmp_path / "run"), "--threads", "1"]) == 0
    url = live_server(tmp_path / "run")
    info = CLIENT.get(f"{url}/v1/model").json()
    assert info["kind"] == "forecast" and info["input_len"] == 32 and info["horizon"] == 16
    rows = [[float(v) for v in line.split(",")[1:]] for line in csv.read_text().splitlines()[-32:]]
    answer = post(url, "/v1/forecast", {"rows": rows})
    assert answer.status_code == 200, answer.text
    model, config = load_forecaster(tmp_path / "run")
    _, expected, names = forecast_last(model, config, str(csv))
    assert answer.json()["columns"] == names == info["output_columns"]
    np.testing.assert_allclose(np.array(answer.json()["forecast"]), expected, rtol=1e-5, atol=1e-6)
    short = post(url, "/v1/forecast", {"rows": rows[:5]})
    assert short.status_code == 422 and short.json()["error"].startswith("rows: expected 32 rows of 7 values")
    assert post(url, "/v1/translate", {"text": ["1"]}).status_code == 404


def test_inference_modules_never_import_the_training_package() -> None:
    """decode, export, serve and the checkpoint loader: inference stays apart from aiayn.train."""
    import subprocess
    import sys

    modules = "aiayn.translate, aiayn.decode.backends, aiayn.decode.attention, aiayn.export, aiayn.plots"
    code = (
        f"import sys, aiayn, aiayn.serve.app, aiayn.serve.cli, {modules}; "
        "assert not [m for m in sys.modules if m.startswith('aiayn.train')], sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_batcher_waits_only_until_as_many_requests_as_recent_batches_are_in() -> None:
    """After batches of three requests, a batch of three is decoded at once, not after the (here
    hour-long) wait; requests already queued beyond three still join it; a batch short of three
    waits up to the limit for more."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from aiayn.decode.search import DecodeOptions
    from aiayn.serve.batching import Batcher

    decoded: list[list[str]] = []

    def decode(lines: list[Line], options: DecodeOptions, wanted: Wanted):
        lines = [line.text for line in lines]
        decoded.append(lines)
        return [[(0.0, line)] for line in lines]

    async def scenario(wait_s: float, recent: list[int], lines: list[str]) -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(decode, len, pool, max_tokens=100, max_wait_s=wait_s)
            batcher.recent.extend(recent)
            worker = asyncio.create_task(batcher.run())
            options = DecodeOptions(beam=1)
            submitted = [asyncio.create_task(batcher.submit([Line(line)], options, TEXT)) for line in lines]
            await asyncio.wait_for(asyncio.gather(*submitted), timeout=30)
            worker.cancel()

    asyncio.run(scenario(3600.0, [3, 2], ["a", "b", "c", "d"]))  # queued together: one batch
    assert decoded == [["a", "b", "c", "d"]]
    decoded.clear()
    asyncio.run(scenario(3600.0, [3], ["a", "b", "c"]))
    assert decoded == [["a", "b", "c"]]
    decoded.clear()
    asyncio.run(scenario(0.2, [3], ["a", "b"]))  # short of three: waits its 0.2 s, then decodes
    assert decoded == [["a", "b"]]


def test_held_requests_are_batched_together_not_one_per_batch() -> None:
    """Requests beyond one batch's token bound, or with other options, are held; the next batches
    take as many of them as fit (12 requests of 3 tokens with a bound of 10 are 4 batches of 3;
    alternating options are one batch per option), each request answered with its own lines."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from aiayn.decode.search import DecodeOptions
    from aiayn.serve.batching import Batcher

    decoded: list[tuple[list[str], int]] = []

    def decode(lines: list[Line], options: DecodeOptions, wanted: Wanted):
        lines = [line.text for line in lines]
        decoded.append((lines, options.beam))
        return [[(0.0, f"{line}@{options.beam}")] for line in lines]

    async def scenario(requests: list[tuple[str, int]], max_tokens: int):
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(decode, len, pool, max_tokens=max_tokens, max_wait_s=0.01)
            worker = asyncio.create_task(batcher.run())
            submitted = [
                batcher.submit([Line(line)], DecodeOptions(beam=beam), TEXT) for line, beam in requests
            ]
            answers = await asyncio.wait_for(asyncio.gather(*submitted), timeout=30)
            worker.cancel()
            return answers

    requests = [(f"{i:03d}", 4) for i in range(12)]
    answers = asyncio.run(scenario(requests, max_tokens=10))
    assert answers == [[[(0.0, f"{line}@4")]] for line, _ in requests]
    assert [lines for lines, _ in decoded] == [[f"{i:03d}" for i in range(j, j + 3)] for j in (0, 3, 6, 9)]
    decoded.clear()
    mixed = [(f"{i:03d}", 4 if i % 2 else 5) for i in range(8)]  # beam 5 first, then alternating
    answers = asyncio.run(scenario(mixed, max_tokens=100))
    assert answers == [[[(0.0, f"{line}@{beam}")]] for line, beam in mixed]
    assert decoded == [(["000", "002", "004", "006"], 5), (["001", "003", "005", "007"], 4)]


def test_the_batcher_groups_requests_by_options_within_the_token_bound() -> None:
    """Requests queued together are decoded together; other options and the token bound make new
    batches, in arrival order; each request gets its own lines' results."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from aiayn.decode.search import DecodeOptions
    from aiayn.serve.batching import Batcher

    decoded: list[tuple[list[str], int]] = []

    def decode(lines: list[Line], options: DecodeOptions, wanted: Wanted):
        lines = [line.text for line in lines]
        decoded.append((lines, options.beam))
        return [[(0.0, f"{line}@{options.beam}")] for line in lines]

    async def scenario():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(decode, len, pool, max_tokens=10, max_wait_s=0.05)
            worker = asyncio.create_task(batcher.run())
            four, five = DecodeOptions(beam=4), DecodeOptions(beam=5)
            requests = [(["aa", "bb"], four), (["cc"], five), (["dd"], four), (["eeeeeeeeee"], four)]
            answers = await asyncio.gather(
                *(batcher.submit([Line(x) for x in lines], o, TEXT) for lines, o in requests)
            )
            worker.cancel()
            return answers

    answers = asyncio.run(scenario())
    assert answers == [
        [[(0.0, "aa@4")], [(0.0, "bb@4")]],
        [[(0.0, "cc@5")]],
        [[(0.0, "dd@4")]],
        [[(0.0, "eeeeeeeeee@4")]],
    ]
    assert decoded == [(["aa", "bb", "dd"], 4), (["cc"], 5), (["eeeeeeeeee"], 4)]


def test_a_sampling_request_is_decoded_alone() -> None:
    """Sampling draws depend on the batch: requests with equal sampling options queued together are
    each decoded alone, while search requests around them still share a batch."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from aiayn.decode.search import DecodeOptions
    from aiayn.serve.batching import Batcher

    decoded: list[list[str]] = []

    def decode(lines: list[Line], options: DecodeOptions, wanted: Wanted):
        lines = [line.text for line in lines]
        decoded.append(lines)
        return [[(0.0, line)] for line in lines]

    async def scenario():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(decode, len, pool, max_tokens=100, max_wait_s=0.05)
            worker = asyncio.create_task(batcher.run())
            search, sample = DecodeOptions(beam=4), DecodeOptions(sample=True, seed=7)
            requests = [(["a"], search), (["s1"], sample), (["s2"], sample), (["b"], search)]
            answers = await asyncio.gather(
                *(batcher.submit([Line(x) for x in lines], o, TEXT) for lines, o in requests)
            )
            worker.cancel()
            return answers

    assert asyncio.run(scenario()) == [[[(0.0, x)]] for x in ("a", "s1", "s2", "b")]
    assert decoded == [["a", "b"], ["s1"], ["s2"]]


def test_requests_that_want_different_things_share_a_batch() -> None:
    """Lines travel with their prefixes; requests that want scores, confidence or alignments share a
    batch with those that want none, which computes what any of them wants; each request gets its
    own lines' results. Other options make another batch."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from aiayn.decode.search import DecodeOptions
    from aiayn.serve.batching import Batcher

    decoded: list[tuple[list[Line], Wanted]] = []

    def decode(lines: list[Line], options: DecodeOptions, wanted: Wanted):
        decoded.append((lines, wanted))
        return [f"{line.prefix}{line.text}@{options.beam}" for line in lines]

    async def scenario(requests):
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(decode, len, pool, max_tokens=100, max_wait_s=0.05)
            worker = asyncio.create_task(batcher.run())
            answers = await asyncio.gather(*(batcher.submit(*request) for request in requests))
            worker.cancel()
            return answers

    four, five = DecodeOptions(beam=4), DecodeOptions(beam=5)
    requests = [
        ([Line("a"), Line("b")], four, TEXT),
        ([Line("c", "x:")], four, Wanted(scores=True)),
        ([Line("d"), Line("e", "y:")], four, Wanted(alignment=True)),
        ([Line("f")], five, Wanted(confidence=True)),
    ]
    assert asyncio.run(scenario(requests)) == [["a@4", "b@4"], ["x:c@4"], ["d@4", "y:e@4"], ["f@5"]]
    assert decoded == [
        ([Line("a"), Line("b"), Line("c", "x:"), Line("d"), Line("e", "y:")], Wanted(True, False, True)),
        ([Line("f")], Wanted(confidence=True)),
    ]


def test_a_job_submitted_after_the_batcher_closed_is_refused_not_left_waiting() -> None:
    """At shutdown the batcher answers the jobs it holds with an error, and refuses those that come
    after (a document thread still at work would otherwise wait for an answer that never comes)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from aiayn.decode.search import DecodeOptions
    from aiayn.serve.batching import Batcher

    async def scenario():
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(lambda lines, options, wanted: lines, len, pool, max_tokens=10, max_wait_s=0.0)
            waiting = asyncio.create_task(batcher.submit([Line("a")], DecodeOptions(), TEXT))
            await asyncio.sleep(0)  # queued; no worker runs
            batcher.close("shutting down")
            with pytest.raises(RuntimeError, match="shutting down"):
                await asyncio.wait_for(waiting, timeout=5)
            with pytest.raises(RuntimeError, match="shutting down"):
                await asyncio.wait_for(batcher.submit([Line("b")], DecodeOptions(), TEXT), timeout=5)

    asyncio.run(scenario())
