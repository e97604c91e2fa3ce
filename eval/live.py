"""`python -m eval.live model=smollm2`: answer while typing, live, in a web page.

One model in this process serves a small page (Starlette, a websocket per page): at each
sentence boundary the page sends the text typed so far and the model runs one streaming
update (verify the held draft, keep what passes, redraft the rest: eval.engines.ar); at
Enter it runs the final update and, for comparison, the baseline from scratch. Every
model call goes through one worker thread, so requests from several pages are queued,
never interleaved. A model failure is shown in the page, not swallowed.
"""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from eval.engines.ar import AREngine
from eval.engines.decode import DecodeSpec
from eval.runner import eos_token_ids
from headstart.config import run_cli
from headstart.models import LoadedModel, load_model
from headstart.prompts import build_messages, encode_prompt, resolve_system_message

PAGE = Path(__file__).with_name("live_page") / "index.html"


@dataclass
class LiveConfig:
    """Serve the answer-while-typing page for one model."""

    model: str = field(default="smollm2", metadata={"help": "Model: embedded name, hub id, local dir or adapter dir."})
    decode: DecodeSpec = field(default_factory=DecodeSpec, metadata={"help": "Decode settings (eval.engines.decode); AR engines."})
    system_prompt: str = field(default="model", metadata={"help": "System message setting, as for `python -m eval`."})
    host: str = field(default="127.0.0.1", metadata={"help": "Address to listen on."})
    port: int = field(default=8765, metadata={"help": "Port to listen on."})
    device: str | None = field(default=None, metadata={"help": "Torch device; default cuda when available, else cpu."})
    dtype: str | None = field(default=None, metadata={"help": "Torch dtype name; default bfloat16 on GPU, float32 on CPU."})


class LiveModel:
    """The model and one worker thread: every update of every page runs there, in order."""

    def __init__(self, loaded: LoadedModel, config: LiveConfig) -> None:
        self.loaded = loaded
        self.engine = AREngine(loaded.model, eos_token_ids(loaded), config.decode)
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


def build_app(live: LiveModel) -> Starlette:
    async def page(request) -> HTMLResponse:
        return HTMLResponse(PAGE.read_text())

    async def socket(websocket: WebSocket) -> None:
        await websocket.accept()
        state = live.engine.new_state()  # one request per page at a time
        try:
            while True:
                message = await websocket.receive_json()
                if message.get("type") == "enter":
                    await websocket.send_json(await live.run(live.enter, state, message["text"]))
                    state = live.engine.new_state()
                elif message.get("type") == "segment":
                    await websocket.send_json(await live.run(live.segment, state, message["text"]))
                else:
                    await websocket.send_json({"type": "error", "message": f"unknown message type {message.get('type')!r}"})
        except WebSocketDisconnect:
            pass

    return Starlette(routes=[Route("/", page), WebSocketRoute("/ws", socket)])


def serve(config: LiveConfig) -> None:
    import uvicorn

    if config.decode.engine not in ("auto", "fast", "stepwise"):
        raise ValueError(f"eval.live runs the autoregressive engine; decode.engine={config.decode.engine} is not one")
    loaded = load_model(config.model, dtype=config.dtype, device=config.device)
    print(f"eval.live: http://{config.host}:{config.port}/")
    uvicorn.run(build_app(LiveModel(loaded, config)), host=config.host, port=config.port, log_level="warning")


def main(argv: list[str] | None = None) -> int:
    return run_cli(LiveConfig, serve, argv)


if __name__ == "__main__":
    sys.exit(main())
