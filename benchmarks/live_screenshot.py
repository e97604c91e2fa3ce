"""`python benchmarks/live_screenshot.py`: type a benchmark request into the live page, press Enter,
and save what the page shows (the README's picture).

The live page runs in this process on a background thread, on eval.serve's server (as
`python -m eval.live` serves it: vLLM, so the vLLM environment is needed); the system Chromium,
driven by Selenium, types the request at a set speed. Needs the `dev` extra (selenium) and the
system packages chromium and chromium-driver.
"""

from __future__ import annotations

import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.benchmarks import get_benchmark
from eval.engines.decode import DecodeSpec
from eval.live import LiveConfig
from eval.serve import start_server
from headstart.config import run_cli
from headstart.run_config import ModelSetting


@dataclass
class ScreenshotConfig(ModelSetting):
    """Type one request into the live page and save a screenshot."""

    benchmark: str = field(default="humaneval", metadata={"help": "Benchmark the typed request comes from."})
    request: int = field(default=0, metadata={"help": "Index of the request among the benchmark's streamable ones."})
    cpm: float = field(default=400.0, metadata={"help": "Typing speed, characters per minute."})
    decode: DecodeSpec = field(default_factory=DecodeSpec, metadata={"help": "Decode settings of the page's model."})
    output: str = field(default="docs/live_page.png", metadata={"help": "Where the screenshot is written."})
    timeout: float = field(default=900.0, metadata={"help": "Seconds to wait for the answer after Enter."})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """The app (eval.serve's, the live page at `/`) on a free local port, served from a background thread; its URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           ws_ping_timeout=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the live page's server did not start on port {port} (its error is above)")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join()


def browser_paths() -> tuple[str | None, str | None]:
    """The system chromium and its driver (browsers that download their own build cannot here)."""
    return shutil.which("chromium"), shutil.which("chromedriver")


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless system Chromium under Selenium."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = browser_paths()
    if not (binary and driver_path):
        raise RuntimeError("needs the system packages chromium and chromium-driver (scripts/setup.sh installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1000,1100"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def type_into(driver: Any, element_id: str, text: str, cpm: float) -> None:
    """Type `text` into the element one keystroke at a time, at `cpm` characters per minute."""
    from selenium.webdriver.common.by import By

    box, gap = driver.find_element(By.ID, element_id), 60.0 / cpm
    start = time.perf_counter()
    for typed, character in enumerate(text, 1):
        box.send_keys(character)
        time.sleep(max(0.0, start + typed * gap - time.perf_counter()))


def page_text(driver: Any, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id).get_property("textContent")


def take_screenshot(config: ScreenshotConfig) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    requests = get_benchmark(config.benchmark).load(config.request + 1)
    if config.request >= len(requests):
        raise ValueError(f"{config.benchmark} has {len(requests)} streamable requests; request={config.request} is past them")
    request = requests[config.request]
    server = start_server(LiveConfig(model=config.model, decode=config.decode))
    try:
        with serving(server.app) as url, chromium() as driver:
            driver.get(url)
            wait = WebDriverWait(driver, config.timeout)
            wait.until(lambda d: page_text(d, "status") == "ready")
            print(f"typing {request.request_id} ({len(request.text)} characters) at {config.cpm:g} cpm", flush=True)
            type_into(driver, "request", request.text, config.cpm)
            driver.find_element(By.ID, "enter").click()
            wait.until(lambda d: page_text(d, "status") in ("answered", "disconnected") or page_text(d, "error"))
            if page_text(driver, "status") != "answered":
                raise RuntimeError(f"the page did not answer: status {page_text(driver, 'status')!r}, "
                                   f"error {page_text(driver, 'error')!r}")
            Path(config.output).parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(config.output)
            print(page_text(driver, "answer-stats"))
            print(page_text(driver, "skipped") or "no draft went stale")
            print(f"screenshot: {config.output}")
    finally:
        server.engine.close()


def main(argv: list[str] | None = None) -> int:
    return run_cli(ScreenshotConfig, take_screenshot, argv)


if __name__ == "__main__":
    sys.exit(main())
