"""`python -m eval.live model=smollm2`: answer while typing, live, in a web page.

One model in this process serves a small page (Starlette, a websocket per page): the page
sends the text at every keystroke; when a segment is complete (PROTOCOL's segmentation of
a free-form request, headstart.segment: a segment is complete once the next has begun)
the model runs one streaming update on the complete segments (verify the held draft,
keep what passes, redraft the rest: eval.engines.ar); at
Enter it runs the final update and, for comparison, the baseline from scratch. Every
model call goes through one worker thread, so requests from several pages are queued,
never interleaved. A page that types faster than the model updates gets its queued
segment updates dropped in favour of the newest text (`Inbox`). A model failure is
shown in the page, not swallowed.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from eval.engines.decode import DecodeSpec
from headstart.config import run_cli
from headstart.device_names import check_device, check_dtype
from headstart.prompts import build_messages, check_evaluation_system_setting, encode_prompt, resolve_system_message
from headstart.segment import segment_request

if TYPE_CHECKING:  # annotations only: the engine and the loader (torch) are imported where they run, not for `--help`
    from headstart.models import LoadedModel

PAGE = Path(__file__).with_name("live_page") / "index.html"


@dataclass
class LiveConfig:
    """Serve the answer-while-typing page for one model."""

    model: str = field(default="smollm2", metadata={"help": "Model: embedded name, hub id, local dir or adapter dir."})
    decode: DecodeSpec = field(
        default_factory=DecodeSpec,
        metadata={"help": "Decode settings (eval.engines.decode); AR engines."},
    )
    system_prompt: str = field(default="model", metadata={"help": "System message setting, as for `python -m eval`."})
    host: str = field(default="127.0.0.1", metadata={"help": "Address to listen on."})
    port: int = field(default=8765, metadata={"help": "Port to listen on."})
    device: str | None = field(default=None, metadata={"help": "Torch device; default cuda when available, else cpu."})
    dtype: str | None = field(default=None, metadata={"help": "Torch dtype name; default bfloat16 on GPU, float32 on CPU."})

    def __post_init__(self) -> None:
        # Each used to surface only once the model had loaded (a port: as uvicorn's traceback).
        if self.decode.engine not in ("auto", "fast", "stepwise"):
            raise ValueError(f"eval.live runs the autoregressive engine; decode.engine={self.decode.engine} is not one")
        self.system_prompt = check_evaluation_system_setting(self.system_prompt)
        check_dtype(self.dtype)
        check_device(self.device)
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port={self.port}: a TCP port is 1-65535")


def check_listenable(host: str, port: int) -> None:
    """Refuse, before the model loads, an address this process cannot listen on (a port in
    use, a host that is not this machine's). The socket is closed again: uvicorn binds its
    own, so another program may still take the port in between, which uvicorn then reports."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
            probe.bind((host, port))
    except OSError as error:
        raise ValueError(f"cannot listen on {host}:{port}: {error.strerror or error} (choose another port=... "
                         "or host=...)") from error


class LiveModel:
    """The model and one worker thread: every update of every page runs there, in order."""

    def __init__(self, loaded: LoadedModel, config: LiveConfig) -> None:
        from eval.engines.ar import AREngine  # torch: not for `--help`
        from eval.engines.width_cost import use_auto_table

        self.loaded = loaded
        use_auto_table(config.decode, config.model, loaded.model)
        self.engine = AREngine(loaded.model, loaded.eos_token_ids, config.decode)
        self.system = resolve_system_message(config.system_prompt, config.model)
        self.worker = ThreadPoolExecutor(max_workers=1)

    def prompt(self, text: str) -> list[int]:
        """Token ids of the templated request, exactly as `python -m eval` builds them."""
        return encode_prompt(self.loaded.tokenizer, build_messages(text, None, self.system), self.loaded.family)

    def text(self, tokens: list[int]) -> str:
        return self.loaded.tokenizer.decode(tokens, skip_special_tokens=True)

    def segment(self, state: Any, text: str) -> dict[str, Any]:
        """A drafting update for the text typed so far."""
        result = self.engine.update(state, self.prompt(text), ("drafting", "drafting"))
        return {"type": "draft", "kept": self.text(result.answer[: result.accepted]),
                "redrafted": self.text(result.answer[result.accepted :]), "forwards": result.forwards,
                "seconds": result.seconds}

    def enter(self, state: Any, text: str) -> dict[str, Any]:
        """The final update (the residual phase) and the baseline from scratch."""
        prompt = self.prompt(text)
        final = self.engine.update(state, prompt, ("verify", "regenerate"))
        baseline = self.engine.baseline(prompt)
        return {"type": "answer", "answer": self.text(final.answer), "forwards": final.forwards,
                "seconds": final.seconds, "baseline_answer": self.text(baseline.answer),
                "baseline_forwards": baseline.forwards, "baseline_seconds": baseline.seconds}

    async def run(self, method, *args) -> dict[str, Any]:
        """One queued model call; a failure becomes an error message for the page."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self.worker, method, *args)
        except Exception as error:  # the page shows it; the server keeps serving
            return {"type": "error", "message": f"{type(error).__name__}: {error}"}


class Inbox:
    """A page's messages waiting for the model. Only the newest text matters while the user
    types: queued segment updates are dropped when a newer segment or an Enter follows them
    (the running update finishes, then the next starts from the newest text: the typing
    simulation's `finish` policy); an Enter is never dropped."""

    def __init__(self) -> None:
        self.waiting: deque[dict[str, Any]] = deque()
        self.arrived = asyncio.Event()
        self.closed = False

    def put(self, message: dict[str, Any] | None) -> None:
        """A message from the page; None: the page went away."""
        if message is None:
            self.closed = True
        else:
            self.waiting.append(message)
        self.arrived.set()

    async def take(self) -> tuple[dict[str, Any] | None, int]:
        """(the next message to run, how many superseded segments were dropped); None once closed."""
        while not self.waiting and not self.closed:
            self.arrived.clear()
            await self.arrived.wait()
        if not self.waiting:
            return None, 0
        dropped = 0
        while len(self.waiting) > 1 and self.waiting[0].get("type") == "segment":
            self.waiting.popleft()
            dropped += 1
        return self.waiting.popleft(), dropped


def complete_prefix(typed: str) -> str:
    """The complete segments of the text typed so far: all but the last, which may still grow."""
    return "".join(segment_request(typed)[:-1])


async def read_messages(websocket: WebSocket, inbox: Inbox) -> None:
    """Receive while the model works, so that newer text supersedes queued updates. A
    keystroke (`typed`) becomes a drafting update when it completes a new segment; a message
    that cannot be read is answered with an error, and reading goes on."""
    drafted = ""
    try:
        while True:
            try:
                message = await websocket.receive_json()
                kind, text = message.get("type"), message.get("text")
                if kind in ("typed", "segment", "enter") and not isinstance(text, str):
                    raise ValueError(f"a {kind!r} message needs the text as a string")
            except (ValueError, AttributeError) as error:  # not JSON, not an object, no text
                inbox.put({"type": "unreadable", "message": f"{type(error).__name__}: {error}"})
                continue
            if kind == "typed":
                prefix = complete_prefix(text)
                if prefix and prefix != drafted:
                    inbox.put({"type": "segment", "text": prefix})
                drafted = prefix
                continue
            if kind == "enter":
                drafted = ""  # the next request starts from nothing
            inbox.put(message)
    except WebSocketDisconnect:
        pass
    finally:
        inbox.put(None)


def build_app(live: LiveModel) -> Starlette:
    async def page(request) -> HTMLResponse:
        return HTMLResponse(PAGE.read_text())

    async def socket(websocket: WebSocket) -> None:
        await websocket.accept()
        inbox = Inbox()
        reader = asyncio.create_task(read_messages(websocket, inbox))
        state = live.engine.new_state()  # one request per page at a time
        try:
            while True:
                message, dropped = await inbox.take()
                if message is None:
                    return
                if message.get("type") == "enter":
                    reply = await live.run(live.enter, state, message["text"])
                    state = live.engine.new_state()
                elif message.get("type") == "segment":
                    reply = await live.run(live.segment, state, message["text"])
                elif message.get("type") == "unreadable":
                    reply = {"type": "error", "message": f"unreadable message: {message['message']}"}
                else:
                    reply = {"type": "error", "message": f"unknown message type {message.get('type')!r}"}
                await websocket.send_json(reply | {"dropped": dropped})
        except WebSocketDisconnect:
            pass
        finally:
            reader.cancel()

    return Starlette(routes=[Route("/", page), WebSocketRoute("/ws", socket)])


def serve(config: LiveConfig) -> None:
    import uvicorn

    from headstart.devices import resolve_device  # torch: imported once serving, not for `--help`
    from headstart.models import load_model

    resolve_device(config.device)  # a GPU asked for where CUDA is unusable: refused before the port and the model
    check_listenable(config.host, config.port)
    resolve_system_message(config.system_prompt, config.model)  # reads the model's training record: cheap, before loading
    loaded = load_model(config.model, dtype=config.dtype, device=config.device)
    print(f"eval.live: http://{config.host}:{config.port}/")
    # Keep-alive pings, but no closing on a late pong: on a busy CPU the event loop may answer
    # late while the worker thread runs the model, and a page must not drop for that.
    uvicorn.run(build_app(LiveModel(loaded, config)), host=config.host, port=config.port, log_level="warning",
                ws_ping_interval=20.0, ws_ping_timeout=None)


def main(argv: list[str] | None = None) -> int:
    return run_cli(LiveConfig, serve, argv)


if __name__ == "__main__":
    sys.exit(main())
