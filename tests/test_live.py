"""The live page in a real headless browser (system Chromium driven by Selenium): type a
HumanEval request at a set speed, press Enter, and get `python -m eval`'s answer."""

from __future__ import annotations

import shutil
import socket
import threading
import time

import pytest
import uvicorn

from eval.config import EvalConfig
from eval.engines.decode import DecodeSpec
from eval.live import LiveConfig, LiveModel, build_app
from eval.runner import load_records, run_evaluation
from headstart.models import load_model

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs the system chromium and chromium-driver")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(tiny_qwen3_ending_dir):
    config = LiveConfig(model=str(tiny_qwen3_ending_dir), decode=DecodeSpec(max_new_tokens=24), port=free_port())
    live = LiveModel(load_model(config.model, device="cpu"), config)
    server = uvicorn.Server(uvicorn.Config(build_app(live), host="127.0.0.1", port=config.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:  # start-up wait, not a timed assertion
        time.sleep(0.05)
    yield f"http://127.0.0.1:{config.port}/"
    server.should_exit = True
    thread.join()


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1000,1100"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_typed_request_gets_the_evaluators_answer(served, browser, tiny_qwen3_ending_dir, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    config = EvalConfig(model=str(tiny_qwen3_ending_dir), limit=1, decode=DecodeSpec(max_new_tokens=24),
                        output_dir=str(tmp_path / "eval"))
    run_evaluation(config)
    record = load_records(tmp_path / "eval" / "results.jsonl")[0]
    browser.get(served)
    wait = WebDriverWait(browser, 120)
    wait.until(lambda b: b.find_element(By.ID, "status").text == "ready")
    box = browser.find_element(By.ID, "request")
    for character in "".join(record["segments"]):  # a set speed: one keystroke every 5 ms
        box.send_keys(character)
        time.sleep(0.005)
    wait.until(lambda b: b.find_element(By.ID, "draft").get_property("textContent"))
    browser.find_element(By.ID, "enter").click()
    wait.until(lambda b: b.find_element(By.ID, "status").text == "answered")
    assert box.get_property("value") == "".join(record["segments"])
    assert browser.find_element(By.ID, "answer").get_property("textContent") == record["stream_answer"]
    # The page drafts at its own boundaries (every sentence end and line), so its residual
    # may differ from the evaluator's; the baseline is the same decode of the same prompt.
    stats = browser.find_element(By.ID, "answer-stats").text
    assert f"from scratch: {record['baseline_forwards']} forwards" in stats and "after Enter: " in stats
    assert browser.find_element(By.CSS_SELECTOR, "#draft .kept") is not None
    assert not browser.find_element(By.ID, "error").text
    browser.save_screenshot(str(tmp_path / "live_page.png"))
    assert (tmp_path / "live_page.png").stat().st_size > 1000
