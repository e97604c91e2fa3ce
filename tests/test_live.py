"""The live page: its websocket protocol (Starlette's test client), and the page in a real
headless browser (system Chromium driven by Selenium): type a HumanEval request at a set
speed, press Enter, and get `python -m eval`'s answer, also when typing outpaces the model."""

from __future__ import annotations

import threading
import time

import pytest

# The screenshot command is a script of benchmarks/ (it makes the README's picture; it does not ship).
from live_screenshot import browser_paths, chromium, serving, type_into

from eval.config import EvalConfig
from eval.engines.decode import DecodeSpec
from eval.live import LiveConfig, LiveModel, build_app, complete_prefix
from eval.runner import run_evaluation
from headstart.files import read_jsonl
from headstart.models import load_model

needs_browser = pytest.mark.skipif(not all(browser_paths()), reason="needs the system chromium and chromium-driver")


class SlowLiveModel(LiveModel):
    """The live model slower than any typist, deterministically: its first drafting update
    waits until the test opens `gate` (the typing is done), as SmolLM2 on a busy CPU lags."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.gate = threading.Event()

    def segment(self, state, text):
        assert self.gate.wait(timeout=120), "the test never opened the gate"
        return super().segment(state, text)


class FailingLiveModel(LiveModel):
    def segment(self, state, text):
        raise RuntimeError("out of memory (the test's own failure)")


def live_model(model_dir, cls=LiveModel) -> LiveModel:
    config = LiveConfig(model=str(model_dir), decode=DecodeSpec(max_new_tokens=24))
    return cls(load_model(config.model, device="cpu"), config)


@pytest.fixture(params=[LiveModel, SlowLiveModel], ids=["model", "slow-model"])
def served(request, tiny_qwen3_ending_dir):
    live = live_model(tiny_qwen3_ending_dir, request.param)
    with serving(live) as url:
        yield url, getattr(live, "gate", None)


def replies_until_answer(socket) -> list[dict]:
    replies = [socket.receive_json()]
    while replies[-1]["type"] not in ("answer", "error"):
        replies.append(socket.receive_json())
    return replies


def test_updates_the_model_cannot_keep_up_with_are_dropped_never_the_enter(tiny_qwen3_ending_dir):
    from starlette.testclient import TestClient

    live = live_model(tiny_qwen3_ending_dir, SlowLiveModel)
    text = "Write a function. It adds two numbers. It returns the sum. Name it add. Test it.\n"
    sentences = [text[: i + 1] for i, c in enumerate(text) if c in ".\n"]
    with TestClient(build_app(live)).websocket_connect("/ws") as socket:
        for sentence in sentences:  # all at once: faster than any update
            socket.send_json({"type": "segment", "text": sentence})
        socket.send_json({"type": "enter", "text": text})
        time.sleep(1.0)  # the server reads them while its first update waits (microseconds of work)
        live.gate.set()
        replies = replies_until_answer(socket)
    assert sum(1 + reply["dropped"] for reply in replies) == len(sentences) + 1  # every message answered or dropped
    assert [reply["type"] for reply in replies] == ["draft", "answer"]  # the Enter superseded every queued segment
    assert replies[-1]["answer"] == replies[-1]["baseline_answer"]  # greedy: lossless whatever was skipped


def test_keystrokes_draft_once_per_complete_segment(tiny_qwen3_ending_dir):
    from starlette.testclient import TestClient

    from headstart.segment import segment_request

    live = live_model(tiny_qwen3_ending_dir)
    text = "Add two numbers. Use 2.5 as the default for b. Return the sum.\nName it add."
    segments = segment_request(text)
    with TestClient(build_app(live)).websocket_connect("/ws") as socket:
        drafted = []
        for typed in range(1, len(text) + 1):
            socket.send_json({"type": "typed", "text": text[:typed]})
            if complete_prefix(text[:typed]) not in ("", *drafted):  # this keystroke began a segment
                drafted.append(complete_prefix(text[:typed]))
                assert socket.receive_json()["type"] == "draft"  # answered before the next keystroke
        socket.send_json({"type": "enter", "text": text})
        answer = socket.receive_json()
    # One update per segment before the last ("2.5" is no boundary), then Enter.
    assert drafted == ["".join(segments[:i]) for i in range(1, len(segments))] and len(segments) == 4
    assert answer["type"] == "answer" and answer["answer"] == answer["baseline_answer"]


def test_a_model_failure_or_a_bad_message_reaches_the_page_and_the_socket_stays_open(tiny_qwen3_ending_dir):
    from starlette.testclient import TestClient

    live = live_model(tiny_qwen3_ending_dir, FailingLiveModel)
    with TestClient(build_app(live)).websocket_connect("/ws") as socket:
        socket.send_json({"type": "segment", "text": "Add two numbers."})
        assert socket.receive_json() == {"type": "error", "message": "RuntimeError: out of memory (the test's own failure)",
                                          "dropped": 0}
        socket.send_text("not json")
        assert socket.receive_json()["message"].startswith("unreadable message: JSONDecodeError")
        socket.send_json({"type": "enter"})
        assert socket.receive_json()["message"] == "unreadable message: ValueError: a 'enter' message needs the text as a string"
        socket.send_json({"type": "enter", "text": "Add two numbers."})
        assert socket.receive_json()["type"] == "answer"


@pytest.fixture
def browser():
    with chromium() as driver:
        yield driver


@needs_browser
def test_typed_request_gets_the_evaluators_answer(served, browser, tiny_qwen3_ending_dir, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    config = EvalConfig(model=str(tiny_qwen3_ending_dir), limit=1, decode=DecodeSpec(max_new_tokens=24),
                        output_dir=str(tmp_path / "eval"))
    run_evaluation(config)
    record = read_jsonl(tmp_path / "eval" / "results.jsonl")[0]
    url, gate = served
    browser.get(url)
    wait = WebDriverWait(browser, 120)
    wait.until(lambda b: b.find_element(By.ID, "status").text == "ready")
    box = browser.find_element(By.ID, "request")
    type_into(browser, "request", "".join(record["segments"]), cpm=12000)  # a set speed: a keystroke every 5 ms
    if gate:  # the slow model: every sentence typed during its first update is waiting
        gate.set()
        wait.until(lambda b: "updates skipped" in b.find_element(By.ID, "skipped").text)
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


@needs_browser
def test_the_screenshot_command_types_a_benchmark_request_and_saves_the_answered_page(tiny_qwen3_ending_dir, tmp_path,
                                                                                       capsys):
    from live_screenshot import ScreenshotConfig, take_screenshot

    output = tmp_path / "docs" / "live_page.png"
    take_screenshot(ScreenshotConfig(model=str(tiny_qwen3_ending_dir), cpm=12000, decode=DecodeSpec(max_new_tokens=24),
                                     output=str(output)))
    assert output.stat().st_size > 1000 and output.read_bytes().startswith(b"\x89PNG")
    assert "from scratch:" in capsys.readouterr().out
