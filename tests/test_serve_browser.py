"""The page of ``aiayn serve`` in a real browser: Debian's chromium, headless, driven by Selenium.

A tiny trained model (digits -> words) is served on a free loopback port; the tests type a sentence
or a small document, click Translate and check what the page shows against the JSON API. Without chromium or
chromedriver (or Selenium) the tests skip, saying which is missing. Every wait is bounded.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("served")  # on one worker with the other tests of the tiny served model
webdriver = pytest.importorskip(
    "selenium.webdriver", reason="Selenium is not installed (pip install -e '.[test]')"
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

# The flags that run Debian's chromium headless as root, with no network of its own.
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1000",
]
WAIT_S = 20  # the longest any one wait may take
SENTENCE = "907042"
# The RGBA of a canvas's centre pixel (arguments[0]: the canvas).
CENTRE_PIXEL = (
    "const c = arguments[0]; "
    "return [...c.getContext('2d').getImageData(c.width / 2, c.height / 2, 1, 1).data]"
)


def _program(*names: str) -> str | None:
    """The first of ``names`` on PATH or in /usr/bin (Debian's packages put them there)."""
    for name in names:
        found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").is_file() else None)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless chromium with a new empty profile; Selenium Manager is never asked to download."""
    chromium, driver_path = _program("chromium", "chromium-browser"), _program("chromedriver")
    if chromium is None or driver_path is None:
        missing = " and ".join(n for n, p in [("chromium", chromium), ("chromedriver", driver_path)] if not p)
        pytest.skip(f"{missing} not found (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(WAIT_S)
    driver.set_script_timeout(WAIT_S)
    yield driver
    driver.quit()


def _api(base_url: str, path: str, body: dict | None = None, key: str | None = None) -> tuple[int, dict]:
    """(status, JSON) of one request to the server, errors included."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base_url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def _open(browser, base_url: str) -> None:
    browser.get(base_url + "/")
    _wait(
        browser, lambda d: "parameters" in d.find_element(By.ID, "model-info").text, "the model's description"
    )


def _wait(browser, condition, what: str):
    return WebDriverWait(browser, WAIT_S).until(condition, f"waited {WAIT_S} s for {what}")


def _fill(browser, **fields) -> None:
    for name, value in fields.items():
        element = browser.find_element(By.ID, name)
        element.clear()
        element.send_keys(str(value))


def _translate(browser, sentence: str, **fields) -> str:
    """Type the sentence, click Translate; the page's state when done ("ready" or "error")."""
    _fill(browser, source=sentence, **fields)
    return _click_and_wait(browser, "translate", "an answer")


def _click_and_wait(browser, button: str, what: str) -> str:
    """Click ``button``; the page's state once it has answered ("ready" or "error")."""
    browser.execute_script("document.body.dataset.state = 'submitted'")
    browser.find_element(By.ID, button).click()
    done = ("ready", "error")
    _wait(
        browser,
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") in done,
        what,
    )
    return browser.find_element(By.TAG_NAME, "body").get_attribute("data-state")


def _visible_error(browser) -> str:
    error = browser.find_element(By.ID, "error")
    return error.text if error.is_displayed() else ""


def test_the_page_translates_and_draws_what_the_model_attends_to(
    browser, tiny_translation_run, shared_server, tmp_path
):
    base_url = shared_server(tiny_translation_run)
    _open(browser, base_url)
    assert _translate(browser, SENTENCE, beam=4, alpha=0.6, nbest=3) == "ready", _visible_error(browser)

    # the translation and its n-best list are the API's for the same request
    status, expected = _api(
        base_url, "/v1/translate", {"text": [SENTENCE], "beam": 4, "alpha": 0.6, "nbest": 3}
    )
    assert status == 200
    best = expected["translations"][0]
    assert browser.find_element(By.ID, "translation").text == best["text"]
    assert best["text"]  # the tiny model's words for the number (not always right)
    entries = browser.find_elements(By.CSS_SELECTOR, "#nbest-list li")
    assert len(entries) == 3 == len(best["nbest"])
    assert [e.text.split(" ", 1)[1] for e in entries] == [h["text"] for h in best["nbest"]]

    # one heatmap per layer and head of the three kinds, as the model is built
    _, info = _api(base_url, "/v1/model")
    config = info.get("config", info)
    layers = config["n_encoder_layers"] + 2 * config["n_decoder_layers"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "canvas.heatmap")) == layers * config["n_heads"]

    # target pieces labelled by what each position predicts (the translation, </s> last), in the
    # lines and the heatmaps' rows; the toggle gives the pieces the decoder reads (<s> first)
    _, found = _api(base_url, "/v1/attention", {"text": SENTENCE, "beam": 4, "alpha": 0.6})
    predicted, read = found["predicted_pieces"], found["target_pieces"]
    assert predicted == [*read[1:], "</s>"] and read[0] == "<s>"

    def labels() -> tuple[list[str], list[str], list[str]]:
        lines = [e.text for e in browser.find_elements(By.CSS_SELECTOR, '#alignment text[data-side="tgt"]')]
        rows = {
            kind: json.loads(
                browser.find_element(By.CSS_SELECTOR, f'canvas.heatmap[data-kind="{kind}"]').get_attribute(
                    "data-rows"
                )
            )
            for kind in ("cross", "decoder_self")
        }
        return lines, rows["cross"], rows["decoder_self"]

    assert labels() == (predicted, predicted, predicted)
    Select(browser.find_element(By.ID, "target-rows")).select_by_value("reads")
    assert labels() == (read, read, read)
    Select(browser.find_element(By.ID, "target-rows")).select_by_value("predicts")
    assert labels() == (predicted, predicted, predicted)

    # lines between the pieces; hovering a source piece highlights its own
    assert len(browser.find_elements(By.CSS_SELECTOR, "#alignment line")) > 0
    piece = browser.find_element(By.CSS_SELECTOR, '#alignment text[data-side="src"][data-index="1"]')
    ActionChains(browser).move_to_element(piece).perform()
    active = _wait(
        browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#alignment line.active"), "highlighted lines"
    )
    assert all(line.get_attribute("data-src") == "1" for line in active)
    browser.save_screenshot(str(tmp_path / "serve.png"))

    # the positional encoding is drawn; nothing came from elsewhere than this server; no script error
    assert browser.execute_script(CENTRE_PIXEL, browser.find_element(By.ID, "pe"))[3] > 0  # drawn
    sources = browser.execute_script("return performance.getEntriesByType('resource').map((e) => e.name)")
    assert sources and all(s.startswith(base_url + "/") for s in sources), sources
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    assert (tmp_path / "serve.png").stat().st_size > 10_000

    # one head of the last layer: its lines are drawn again
    Select(browser.find_element(By.ID, "head")).select_by_value("0")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#alignment line")) > 0

    # an invalid request (beam 0) shows the server's own one-line error
    assert _translate(browser, SENTENCE, beam=0) == "error"
    status, refused = _api(
        base_url, "/v1/translate", {"text": [SENTENCE], "beam": 0, "alpha": 0.6, "nbest": 3}
    )
    assert 400 <= status < 500
    assert _visible_error(browser) == refused["error"]


DOCUMENT = "907042\n\n13\n\n500"  # three sentences: a blank line always ends one


def test_a_document_is_shown_sentence_by_sentence_with_the_attention_of_the_one_clicked(
    browser, tiny_translation_run, shared_server
):
    base_url = shared_server(tiny_translation_run)
    browser.get_log("browser")  # what earlier tests left there
    _open(browser, base_url)
    assert _translate(browser, DOCUMENT, beam=4, alpha=0.6, nbest=2) == "ready", _visible_error(browser)
    options = {"beam": 4, "alpha": 0.6}
    status, expected = _api(base_url, "/v1/translate", {"text": [DOCUMENT], **options, "nbest": 2})
    assert status == 200
    translated = expected["translations"][0]
    assert browser.find_element(By.ID, "translation").get_attribute("textContent") == translated["text"]
    assert len(translated["sentences"]) == 3

    # one row per sentence: the source beside its translation
    rows = browser.find_elements(By.CSS_SELECTOR, "#sentences li.pair")
    shown = [[cell.text for cell in row.find_elements(By.CSS_SELECTOR, ".sentence")] for row in rows]
    assert shown == translated["sentences"]

    # hovering a translation highlights it and its source, and nothing else; then another pair
    def active() -> list[tuple[int, str]]:
        cells = browser.find_elements(By.CSS_SELECTOR, "#sentences .sentence.active")
        return sorted(
            (rows.index(c.find_element(By.XPATH, "..")), c.get_attribute("data-side")) for c in cells
        )

    ActionChains(browser).move_to_element(rows[1].find_element(By.CSS_SELECTOR, ".tgt")).perform()
    assert _wait(browser, lambda d: active() == [(1, "src"), (1, "tgt")], "the second pair highlighted")
    ActionChains(browser).move_to_element(rows[2].find_element(By.CSS_SELECTOR, ".src")).perform()
    assert _wait(browser, lambda d: active() == [(2, "src"), (2, "tgt")], "the third pair highlighted")

    # the attention view: the first sentence's at first, then the one clicked, as /v1/attention's
    def drawn_source() -> list[str]:
        return [e.text for e in browser.find_elements(By.CSS_SELECTOR, '#alignment text[data-side="src"]')]

    for index in (0, 2, 1):
        source = translated["sentences"][index][0]
        if index:
            browser.execute_script("document.body.dataset.state = 'submitted'")
            rows[index].click()
            _wait(
                browser,
                lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "ready",
                "attention",
            )
        _, found = _api(base_url, "/v1/attention", {"text": source, **options})
        assert drawn_source() == found["source_pieces"], index
        assert browser.find_element(By.ID, "attention-sentence").text == source
        selected = browser.find_elements(By.CSS_SELECTOR, "#sentences li.pair.selected")
        assert [rows.index(row) for row in selected] == [index]
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_the_api_key_field_is_sent_when_the_server_needs_one(
    browser, tiny_translation_run, shared_server, tmp_path
):
    base_url = shared_server(tiny_translation_run, "--api-key", "s3cret")
    browser.get(base_url + "/")
    browser.execute_script("sessionStorage.clear()")
    assert _translate(browser, SENTENCE) == "error"  # no key yet: the server refuses
    assert _visible_error(browser)
    assert browser.find_element(By.ID, "api-key").is_displayed()  # a 401 opens the key field
    _fill(browser, **{"api-key": "s3cret"})
    assert _translate(browser, SENTENCE) == "ready", _visible_error(browser)
    status, expected = _api(base_url, "/v1/translate", {"text": [SENTENCE]}, key="s3cret")
    assert status == 200
    assert browser.find_element(By.ID, "translation").text == expected["translations"][0]["text"]
    assert browser.execute_script("return sessionStorage.getItem('aiayn-api-key')") == "s3cret"
    numbers = tmp_path / "numbers.txt"  # a file: the key goes as the form's api_key
    numbers.write_text(SENTENCE)
    assert _translate_file(browser, numbers) == "ready", _file_error(browser)


def test_the_api_page_renders_offline(browser, tiny_translation_run, shared_server):
    """FastAPI's /docs with Swagger UI from the installed package: every endpoint listed, nothing
    fetched from another host (the browser here has no network beyond loopback)."""
    base_url = shared_server(tiny_translation_run)
    browser.get(base_url + "/docs")
    _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) >= 5, "the API's operations")
    paths = {e.text for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
    assert {"/v1/translate", "/v1/attention", "/v1/model", "/health", "/v1/forecast"} <= paths, paths
    hosts = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => new URL(e.name).host)"
    )
    assert hosts and set(hosts) == {base_url.split("//")[1]}, hosts


def _ready(browser, what: str) -> None:
    _wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "ready", what)


def _click(browser, element, what: str) -> None:
    """Click ``element`` and wait until the page is ready again."""
    browser.execute_script("document.body.dataset.state = 'submitted'")
    element.click()
    _ready(browser, what)


def test_words_show_their_probability_and_a_click_the_models_choices(
    browser, tiny_translation_run, shared_server
):
    """Each word of the translation is coloured by its probability, the figure in its title, as the
    API's scores; clicking a word lists the model's choices there (/v1/choices after the words before
    it); taking one decodes the rest again: the translation starts with the choice's prefix."""
    base_url = shared_server(tiny_translation_run)
    browser.get_log("browser")  # what earlier tests left there
    _open(browser, base_url)
    options = {"beam": 4, "alpha": 0.6}
    assert _translate(browser, SENTENCE, nbest=1, **options) == "ready", _visible_error(browser)
    _, expected = _api(base_url, "/v1/translate", {"text": [SENTENCE], **options, "scores": True})
    scored = expected["translations"][0]["sentence_scores"][0]["words"]
    spans = browser.find_elements(By.CSS_SELECTOR, "#translation .word")
    assert [s.text for s in spans] == [w for w, _ in scored] and len(spans) > 2
    assert [s.get_attribute("title") for s in spans] == [f"probability {p:.3f}" for _, p in scored]
    colours = {p: s.value_of_css_property("background-color") for s, (_, p) in zip(spans, scored)}
    assert colours[min(colours)] != colours[max(colours)]  # an unsure word stands out

    _click(browser, spans[1], "the choices")
    shown = browser.find_elements(By.CSS_SELECTOR, "#choices-list li")
    _, choices = _api(base_url, "/v1/choices", {"text": SENTENCE, "prefix": scored[0][0], "k": 5})
    assert browser.find_element(By.ID, "choices").is_displayed() and len(shown) == 5
    assert [li.text.split(" %")[0] for li in shown] == [
        f"{100 * c['probability']:.1f}" for c in choices["choices"]
    ]
    taken = next(c for c in choices["choices"] if not c["end"] and c["prefix"].split()[1] != scored[1][0])
    button = browser.find_element(By.CSS_SELECTOR, f'button.choice[data-prefix="{taken["prefix"]}"]')
    _click(browser, button, "the rest decoded again")
    _, continued = _api(base_url, "/v1/attention", {"text": SENTENCE, **options, "prefix": taken["prefix"]})
    translation = browser.find_element(By.ID, "translation").get_attribute("textContent")
    assert translation == continued["translation"] and translation.startswith(taken["prefix"])
    pair = browser.find_element(By.CSS_SELECTOR, "#sentences li.pair .tgt")
    assert pair.text == translation == browser.find_element(By.ID, "edit").get_attribute("value")
    lines = browser.find_elements(By.CSS_SELECTOR, '#alignment text[data-side="tgt"]')
    assert [e.text for e in lines] == continued["predicted_pieces"]  # the attention view is the new one's
    assert [
        s.get_attribute("title") for s in browser.find_elements(By.CSS_SELECTOR, "#translation .word")
    ] == [f"probability {p:.3f}" for _, p in continued["words"]]
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_a_glossary_applies_and_an_edited_translation_is_continued_from_the_cursor(
    browser, tiny_translation_run, shared_server
):
    """The glossary box's terms reach the translation (as the API's glossary); a line that is not a
    pair is refused on the page. The sentence edited, the cursor placed after its start, "Continue"
    keeps that start and has the model decode the rest (as /v1/attention from that prefix)."""
    from selenium.webdriver.common.keys import Keys

    base_url = shared_server(tiny_translation_run)
    _open(browser, base_url)
    options = {"beam": 4, "alpha": 0.6}
    _fill(browser, glossary="13 twelve")
    assert _translate(browser, "13", nbest=1, **options) == "error"
    assert _visible_error(browser).startswith("glossary, line 1:")
    _fill(browser, glossary="# terms\n13 = twelve")
    assert _translate(browser, "13", nbest=2, **options) == "ready", _visible_error(browser)
    glossary = {"glossary": [["13", "twelve"]]}
    _, expected = _api(base_url, "/v1/translate", {"text": ["13"], **options, **glossary})
    translation = browser.find_element(By.ID, "translation").get_attribute("textContent")
    assert translation == expected["translations"][0]["text"] and translation.split().count("twelve") == 1

    edit = browser.find_element(By.ID, "edit")
    edit.clear()
    edit.send_keys("six hundred nonsense", *[Keys.ARROW_LEFT] * len(" nonsense"))
    _click(browser, browser.find_element(By.ID, "continue"), "the rest from the cursor")
    _, continued = _api(
        base_url, "/v1/attention", {"text": "13", **options, **glossary, "prefix": "six hundred"}
    )
    translation = browser.find_element(By.ID, "translation").get_attribute("textContent")
    assert translation == continued["translation"] and translation.startswith("six hundred")
    assert "nonsense" not in translation and translation.split().count("twelve") == 1
    assert browser.find_element(By.ID, "changed").is_displayed()


def _options(browser, select_id: str) -> list[str]:
    return [o.get_attribute("value") for o in Select(browser.find_element(By.ID, select_id)).options]


def test_the_pickers_choose_a_pair_and_a_pivot_shows_its_path_and_bridge_sentence(
    browser, tiny_translation_run, shared_server
):
    """Two models named as the pairs aa->bb and bb->cc (the tiny model twice): the pickers list the
    languages from GET /languages; aa->cc goes through bb, and the page says so under the translation
    (as /v1/translate's route) and above the attention view, which is the last model's reading the
    bridge sentence (as /v1/attention's); the choices of a word are the pair's (/v1/choices)."""
    run = tiny_translation_run
    base_url = shared_server([f"aa-bb={run}", f"bb-cc={run}"])
    browser.get_log("browser")  # what earlier tests left there
    browser.get(base_url + "/")
    _wait(browser, lambda d: "2 models" in d.find_element(By.ID, "model-info").text, "the models listed")
    assert browser.find_element(By.ID, "source-lang").is_displayed()
    assert _options(browser, "source-lang") == ["auto", "aa", "bb"]  # cc has no target
    assert _options(browser, "target-lang") == ["bb", "cc"]  # aa's, the first source's
    assert "through bb" in Select(browser.find_element(By.ID, "target-lang")).options[1].text
    source, target = (Select(browser.find_element(By.ID, name)) for name in ("source-lang", "target-lang"))
    source.select_by_value("bb")
    assert _options(browser, "target-lang") == ["cc"]
    source.select_by_value("auto")
    assert _options(browser, "target-lang") == ["bb", "cc"]  # every target any source reaches
    source.select_by_value("aa")
    target.select_by_value("cc")

    # aa -> bb -> cc: the page's translation and n-best list are the API's for the same pair
    options = {"source": "aa", "target": "cc", "beam": 4, "alpha": 0.6}
    assert _translate(browser, SENTENCE, nbest=2, beam=4, alpha=0.6) == "ready", _visible_error(browser)
    status, expected = _api(base_url, "/v1/translate", {"text": [SENTENCE], **options, "nbest": 2})
    assert status == 200
    best, route = expected["translations"][0], expected["route"]
    assert browser.find_element(By.ID, "translation").get_attribute("textContent") == best["text"]
    entries = browser.find_elements(By.CSS_SELECTOR, "#nbest-list li")
    assert [e.text.split(" ", 1)[1] for e in entries] == [h["text"] for h in best["nbest"]]
    assert [(s["source"], s["target"]) for s in route] == [("aa", "bb"), ("bb", "cc")]
    models = ", ".join(step["model"] for step in route)
    assert browser.find_element(By.ID, "route").text == f"aa → bb → cc (models {models})"

    # the attention view: the last model's, over the bridge sentence, said above it
    _, found = _api(base_url, "/v1/attention", {"text": SENTENCE, **options})
    assert len(found["bridge"]) == 1 and found["bridge"][0]
    assert browser.find_element(By.ID, "bridge").is_displayed()
    assert browser.find_element(By.ID, "bridge-sentence").text == found["bridge"][-1]
    assert route[-1]["model"] in browser.find_element(By.ID, "bridge-step").text
    drawn = [e.text for e in browser.find_elements(By.CSS_SELECTOR, '#alignment text[data-side="src"]')]
    assert drawn == found["source_pieces"]
    _wait(browser, lambda d: "parameters" in d.find_element(By.ID, "model-info").text, "the pair's model")

    # a word's choices are the pair's (the last model's after the words before it)
    _, scores = _api(base_url, "/v1/translate", {"text": [SENTENCE], **options, "scores": True})
    words = scores["translations"][0]["sentence_scores"][0]["words"]
    _click(browser, browser.find_elements(By.CSS_SELECTOR, "#translation .word")[1], "the choices")
    asked = {"text": SENTENCE, "prefix": words[0][0], "k": 5, "source": "aa", "target": "cc"}
    status, choices = _api(base_url, "/v1/choices", asked)
    assert status == 200, choices
    shown = browser.find_elements(By.CSS_SELECTOR, "#choices-list li")
    assert [li.text.split(" %")[0] for li in shown] == [
        f"{100 * c['probability']:.1f}" for c in choices["choices"]
    ]

    # a direct pair: one model, no bridge sentence
    source.select_by_value("bb")
    assert _translate(browser, SENTENCE, nbest=1) == "ready", _visible_error(browser)
    _, direct = _api(base_url, "/v1/translate", {"text": [SENTENCE], "source": "bb", "target": "cc"})
    assert (
        browser.find_element(By.ID, "translation").get_attribute("textContent")
        == direct["translations"][0]["text"]
    )
    assert browser.find_element(By.ID, "route").text == f"bb → cc (model {direct['route'][0]['model']})"
    assert not browser.find_element(By.ID, "bridge").is_displayed()

    # auto: the language detected among the sources that reach cc, said after the path
    source.select_by_value("auto")
    target.select_by_value("cc")
    assert _translate(browser, SENTENCE, nbest=1) == "ready", _visible_error(browser)
    _, detected = _api(base_url, "/v1/translate", {"text": [SENTENCE], "source": "auto", "target": "cc"})
    language, confidence = detected["detected"]["language"], detected["detected"]["confidence"]
    assert browser.find_element(By.ID, "route").text.endswith(
        f" · detected: {language} ({round(confidence)}%)"
    )
    assert (
        browser.find_element(By.ID, "translation").get_attribute("textContent")
        == (detected["translations"][0]["text"])
    )
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def _upload(base_url: str, path: Path, **fields: str) -> tuple[int, dict]:
    """(status, JSON) of LibreTranslate's ``POST /translate_file`` of ``path``, as a client sends it."""
    import httpx

    files = {"file": (path.name, path.read_bytes())}
    answer = httpx.post(f"{base_url}/translate_file", data=fields, files=files, timeout=WAIT_S)
    return answer.status_code, answer.json()


def _translate_file(browser, path: Path) -> str:
    """Choose the file, click "Translate the file"; the page's state when done ("ready" or "error")."""
    browser.find_element(By.ID, "file").send_keys(str(path))
    return _click_and_wait(browser, "translate-file", "the file's answer")


def _file_error(browser) -> str:
    error = browser.find_element(By.ID, "file-error")
    return error.text if error.is_displayed() else ""


def test_a_file_is_translated_through_the_page_and_its_link_gives_it_back(
    browser, tiny_translation_run, shared_server, tmp_path
):
    """The file part sends LibreTranslate's form (POST /translate_file) in the pair chosen; its link,
    named as the file, downloads what the route gives for the same file. Auto is refused on the page
    (the server detects no file's language); a file of a kind not read is the server's one line."""
    base_url = shared_server(tiny_translation_run)
    browser.get_log("browser")  # what earlier tests left there
    _open(browser, base_url)
    _wait(browser, lambda d: d.find_element(By.ID, "files").is_displayed(), "the file part")
    _, settings = _api(base_url, "/frontend/settings")
    accept = browser.find_element(By.ID, "file").get_attribute("accept")
    assert accept.split(",") == settings["supportedFilesFormat"]
    assert ".txt" in settings["supportedFilesFormat"]
    pair = {"source": "digits", "target": "words"}  # the tiny model's, chosen first by the pickers
    assert [
        Select(browser.find_element(By.ID, f"{side}-lang")).first_selected_option.get_attribute("value")
        for side in ("source", "target")
    ] == list(pair.values())

    numbers = tmp_path / "numbers.txt"
    numbers.write_text(DOCUMENT + "\n")
    assert _translate_file(browser, numbers) == "ready", _file_error(browser)
    link = browser.find_element(By.ID, "file-link")
    assert link.is_displayed() and link.text == "numbers.txt" == link.get_attribute("download")
    status, answer = _upload(base_url, numbers, **pair)
    assert status == 200, answer
    with urllib.request.urlopen(link.get_attribute("href"), timeout=WAIT_S) as got:
        shown = got.read()
        disposition = got.headers["Content-Disposition"]
        assert disposition == "attachment; filename=\"numbers.txt\"; filename*=UTF-8''numbers.txt"
    with urllib.request.urlopen(answer["translatedFileUrl"], timeout=WAIT_S) as got:
        expected = got.read()
    assert shown == expected and shown.decode().strip() and shown != numbers.read_bytes()
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []

    # auto: one line on the page, nothing sent (the server refuses auto for a file)
    source = Select(browser.find_element(By.ID, "source-lang"))
    source.select_by_value("auto")
    assert _translate_file(browser, numbers) == "error"
    assert "file's language" in _file_error(browser) and not link.is_displayed()
    source.select_by_value("digits")

    # a kind of file not read: the server's one line, as the route answers it
    odd = tmp_path / "numbers.xyz"
    odd.write_text(DOCUMENT)
    assert _translate_file(browser, odd) == "error"
    status, refused = _upload(base_url, odd, **pair)
    assert 400 <= status < 500 and refused["error"]
    assert _file_error(browser) == refused["error"] and "\n" not in refused["error"]
    assert not link.is_displayed() and not browser.find_element(By.ID, "error").is_displayed()
