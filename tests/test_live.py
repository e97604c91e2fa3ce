"""The live page on the streaming server (eval.live = eval.serve with the page at `/`): its websocket
protocol (Starlette's test client), and the page in a real headless browser (system Chromium driven
by Selenium): type a HumanEval request at a set speed, press Enter, and get plain greedy decoding's
answer, also when typing outpaces drafting. vLLM on the embedded SmolLM2: slow, and skipped without
the vLLM environment."""

from __future__ import annotations

import pytest

# The screenshot command is a script of benchmarks/ (it makes the README's picture; it does not ship).
from live_screenshot import browser_paths, chromium, serving, type_into

from eval.engines.decode import DecodeSpec
from eval.live import LiveConfig
from eval.serve import start_server
from eval.serving.sessions import complete_prefix
from headstart.vllm_client import vllm_unavailable
from headstart.vllm_settings import VLLMSettings

MISSING = vllm_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=f"vLLM not testable: {MISSING}")]
needs_browser = pytest.mark.skipif(not all(browser_paths()), reason="needs the system chromium and chromium-driver")
MAX_TOKENS = 24
CONFIG = LiveConfig(decode=DecodeSpec(max_new_tokens=MAX_TOKENS), max_model_len=1024,
                    vllm=VLLMSettings(cpu_kv_cache_gib=1))


@pytest.fixture(scope="module")
def live():
    server = start_server(CONFIG)
    yield server
    server.engine.close()


@pytest.fixture
def socket(live):
    from starlette.testclient import TestClient

    with TestClient(live.app) as client, client.websocket_connect("/ws") as websocket:
        yield websocket


def replies_until_answer(socket) -> list[dict]:
    replies = [socket.receive_json()]
    while replies[-1]["type"] not in ("answer", "error"):
        replies.append(socket.receive_json())
    return replies


def test_keystrokes_draft_once_per_complete_segment(socket):
    from headstart.segment import segment_request

    text = "Add two numbers. Use 2.5 as the default for b. Return the sum.\nName it add."
    segments = segment_request(text)
    drafted = []
    for typed in range(1, len(text) + 1):
        socket.send_json({"type": "typed", "text": text[:typed]})
        if complete_prefix(text[:typed]) not in ("", *drafted):  # this keystroke began a segment
            drafted.append(complete_prefix(text[:typed]))
            draft = socket.receive_json()  # waited for before the next keystroke: never stale
            assert draft["type"] == "draft" and draft["kept"] + draft["redrafted"]
    socket.send_json({"type": "enter", "text": text})
    answer = socket.receive_json()
    # One draft per segment before the last ("2.5" is no boundary), then Enter.
    assert drafted == ["".join(segments[:i]) for i in range(1, len(segments))] and len(segments) == 4
    assert answer["type"] == "answer" and answer["answer"] == answer["baseline_answer"]
    assert answer["dropped"] == 0 and answer["forwards"] < answer["baseline_forwards"]


def test_typing_faster_than_drafting_makes_drafts_stale_never_the_enter(socket):
    text = "Write a function. It adds two numbers. It returns the sum. Name it add. Test it.\n"
    for typed in range(1, len(text) + 1):  # every keystroke at once: faster than any draft
        socket.send_json({"type": "typed", "text": text[:typed]})
    socket.send_json({"type": "enter", "text": text})
    replies = replies_until_answer(socket)
    assert replies[-1]["type"] == "answer" and replies[-1]["dropped"] >= 1
    assert replies[-1]["answer"] == replies[-1]["baseline_answer"]  # greedy: lossless whatever went stale


def test_a_failure_or_a_bad_message_reaches_the_page_and_the_socket_stays_open(socket):
    socket.send_text("not json")
    assert socket.receive_json()["message"].startswith("unreadable message: JSONDecodeError")
    socket.send_json({"type": "enter"})
    assert socket.receive_json()["message"] == "unreadable message: ValueError: a 'enter' message needs the text as a string"
    socket.send_json({"type": "enter", "text": "add " * 2000})  # longer than the engine's max_model_len
    error = socket.receive_json()
    assert error["type"] == "error" and "RuntimeError" in error["message"]
    socket.send_json({"type": "enter", "text": "Add two numbers."})
    assert socket.receive_json()["type"] == "answer"


@pytest.fixture
def browser():
    with chromium() as driver:
        yield driver


@needs_browser
def test_typed_request_gets_plain_decodings_answer(live, browser, tmp_path):
    import httpx
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from eval.benchmarks import get_benchmark

    request = get_benchmark("humaneval").load(1)[0]
    with serving(live.app) as url:
        plain = httpx.post(f"{url}v1/chat/completions", timeout=300, json={
            "messages": [{"role": "user", "content": request.text}], "speculate": False}).json()
        browser.get(url)
        wait = WebDriverWait(browser, 300)
        wait.until(lambda b: b.find_element(By.ID, "status").text == "ready")
        box = browser.find_element(By.ID, "request")
        type_into(browser, "request", request.text, cpm=12000)  # a set speed: a keystroke every 5 ms
        wait.until(lambda b: b.find_element(By.ID, "draft").get_property("textContent"))
        browser.find_element(By.ID, "enter").click()
        wait.until(lambda b: b.find_element(By.ID, "status").text == "answered")
        assert box.get_property("value") == request.text
        assert browser.find_element(By.ID, "answer").get_property("textContent") == plain["choices"][0]["message"]["content"]
        stats = browser.find_element(By.ID, "answer-stats").text
        assert f"from scratch: {plain['headstart']['engine_steps']} engine steps" in stats and "after Enter: " in stats
        assert browser.find_element(By.CSS_SELECTOR, "#draft .kept") is not None
        assert not browser.find_element(By.ID, "error").text
        browser.save_screenshot(str(tmp_path / "live_page.png"))
    assert (tmp_path / "live_page.png").stat().st_size > 1000


@needs_browser
def test_the_screenshot_command_types_a_benchmark_request_and_saves_the_answered_page(tmp_path, capsys):
    from live_screenshot import ScreenshotConfig, take_screenshot

    output = tmp_path / "docs" / "live_page.png"
    take_screenshot(ScreenshotConfig(cpm=12000, decode=DecodeSpec(max_new_tokens=MAX_TOKENS), output=str(output)))
    assert output.stat().st_size > 1000 and output.read_bytes().startswith(b"\x89PNG")
    assert "from scratch:" in capsys.readouterr().out
