"""The README's picture of the page (docs/serve.png): ``aiayn serve`` on loopback, Debian's chromium
headless through Selenium, a paragraph translated with a glossary, a word clicked, the page shot.

    python benchmarks/page_screenshot.py --checkpoint RUN [--out docs/serve.png] \\
        [--text "Ein Mann ... Schnee."] [--glossary "Hemd = T-shirt"] [--click-sentence 1 --click-word 3]
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_serve_browser import CHROMIUM_FLAGS, _program  # noqa: E402

TEXT = "Ein Mann in einem roten Hemd fährt Fahrrad auf der Straße. Zwei kleine Hunde spielen im Schnee."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", default=str(ROOT / "docs" / "serve.png"))
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--glossary", default="Hemd = T-shirt")
    parser.add_argument("--click-sentence", type=int, default=1)
    parser.add_argument("--click-word", type=int, default=3)
    parser.add_argument("--size", default="1280,1500")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "aiayn", "serve", "--checkpoint", args.checkpoint, "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        options = webdriver.ChromeOptions()
        options.binary_location = _program("chromium", "chromium-browser")
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--window-size={args.size}")
        browser = webdriver.Chrome(service=Service(_program("chromedriver")), options=options)
        try:
            shoot(browser, base, args)
        finally:
            browser.quit()
    finally:
        server.terminate()
        server.wait(timeout=30)


def shoot(browser, base: str, args) -> None:
    wait = WebDriverWait(browser, 120)
    browser.get(base + "/")
    wait.until(lambda d: "parameters" in d.find_element(By.ID, "model-info").text)
    for name, value in (("source", args.text), ("glossary", args.glossary)):
        element = browser.find_element(By.ID, name)
        element.clear()
        element.send_keys(value)
    browser.execute_script("document.body.dataset.state = 'submitted'")
    browser.find_element(By.ID, "translate").click()
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "ready")
    selector = f'#translation .word[data-sentence="{args.click_sentence}"][data-word="{args.click_word}"]'
    browser.find_element(By.CSS_SELECTOR, selector).click()
    wait.until(lambda d: d.find_element(By.ID, "choices").is_displayed())
    time.sleep(1.0)  # the choices' list and the attention view drawn
    print("translation:", browser.find_element(By.ID, "translation").text)
    for entry in browser.find_elements(By.CSS_SELECTOR, "#nbest-list li"):
        print("n-best:", entry.text)
    browser.save_screenshot(args.out)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
