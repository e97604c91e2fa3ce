"""The live page's routes: the page itself at `/` and its websocket, on the streaming server.

The page (Starlette websocket) sends the text at every keystroke; the server opens a typing
session for it, and drafts in the background whenever a segment completes (headstart.segment:
a segment is complete once the next has begun), dropping a draft that a newer segment makes
stale. Each finished draft is shown, kept (what it shares with the draft before) and redrafted.
At Enter the session is submitted (its drafts are the proposals), then, for comparison, the same
request is answered from scratch with no proposals. A failure is shown in the page.
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.responses import HTMLResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from eval.engines.tokens import common_prefix_length

if TYPE_CHECKING:
    from eval.serving.api import Served
    from eval.serving.sessions import DraftJob, Session

PAGE = Path(__file__).with_name("live_page") / "index.html"


def check_listenable(host: str, port: int) -> None:
    """Refuse, before the model loads, an address this process cannot listen on (a port in
    use, a host that is not this machine's). The socket is closed again: uvicorn binds its
    own, so another program may still take the port in between, which uvicorn then reports.

    Args:
        host (str): the address to listen on.
        port (int): the TCP port to listen on.
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
            probe.bind((host, port))
    except OSError as error:
        raise ValueError(f"cannot listen on {host}:{port}: {error.strerror or error} (choose another port=... "
                         "or host=...)") from error


class LivePage:
    """One page's socket: its typing session and the messages the page shows."""

    def __init__(self, served: Served, websocket: WebSocket) -> None:
        self.served, self.websocket = served, websocket
        self.session: Session | None = None
        self.shown: list[int] = []  # the draft the page shows
        self.outbox: list[dict[str, Any]] = []

    def typed(self, text: str) -> None:
        """Pass the page's text to its typing session, opening one at the first keystroke.

        Args:
            text (str): the whole text typed so far.
        """
        if self.session is None:
            self.session = self.served.sessions.open([], self.served.max_tokens)
            self.session.listener = self.drafted
        self.served.sessions.type(self.session, text)

    def drafted(self, job: DraftJob) -> None:
        """Queue a finished draft for the page: the part it keeps of the draft shown, and the part redrafted.

        Args:
            job (DraftJob): the finished draft.
        """
        kept = common_prefix_length(self.shown, job.tokens)
        self.shown = job.tokens
        self.outbox.append({"type": "draft", "kept": self.served.decode(job.tokens[:kept]),
                            "redrafted": self.served.decode(job.tokens[kept:]), "forwards": job.steps,
                            "seconds": time.monotonic() - job.started, "dropped": self.session.dropped if self.session else 0})

    async def enter(self, text: str) -> dict[str, Any]:
        """Submit the session and answer it with its drafts as proposals, then from scratch for comparison;
        returns the page's answer message.

        Args:
            text (str): the submitted text.
        """
        prompt = self.served.encode([{"role": "user", "content": text}])
        session, self.session, self.shown = self.session, None, []
        sources = session.sources() if session else {"held": [], "earlier": []}
        answer = await self._answer(prompt, sources if self.served.speculating else None, session)
        baseline = await self._answer(prompt, None, None)
        return {"type": "answer", "answer": answer["text"], "forwards": answer["steps"], "seconds": answer["seconds"],
                "baseline_answer": baseline["text"], "baseline_forwards": baseline["steps"],
                "baseline_seconds": baseline["seconds"], "dropped": session.dropped if session else 0}

    async def _answer(self, prompt: list[int], sources: dict | None, session: Session | None) -> dict[str, Any]:
        started, tokens, last = time.monotonic(), [], {}
        async for event in self.served.sessions.answer(f"live-{uuid.uuid4().hex}", prompt, self.served.max_tokens,
                                                       sources, session):
            tokens += event["tokens"]
            last = event
        if last.get("error"):
            raise RuntimeError(last["error"])
        return {"text": self.served.decode(tokens), "steps": last.get("steps", 0), "seconds": time.monotonic() - started}

    async def flush(self) -> None:
        while self.outbox:
            await self.websocket.send_json(self.outbox.pop(0))

    def close(self) -> None:
        if self.session is not None:
            self.served.sessions.close(self.session)


def live_routes(served: Served) -> list:
    """The page at `/` and its socket at `/ws`.

    Args:
        served (Served): what the server serves: the sessions, the tokenizer's encode and decode, the limits.
    """

    async def page(request) -> HTMLResponse:
        return HTMLResponse(PAGE.read_text())

    async def page_socket(websocket: WebSocket) -> None:
        await websocket.accept()
        live = LivePage(served, websocket)
        try:
            while True:
                await live.flush()
                try:
                    message = await _receive(websocket, live)
                except ValueError as error:
                    await websocket.send_json({"type": "error", "message": f"unreadable message: {type(error).__name__}: {error}",
                                               "dropped": 0})
                    continue
                if message is None:
                    continue
                try:
                    if message["type"] == "typed":
                        live.typed(message["text"])
                    elif message["type"] == "enter":
                        await live.flush()  # drafts shown before the answer, never after it
                        answer = await live.enter(message["text"])
                        live.outbox.clear()  # drafts of the submitted session that ended meanwhile
                        await websocket.send_json(answer)
                    else:
                        raise ValueError(f"unknown message type {message['type']!r}")
                except Exception as error:  # the page shows it; the server keeps serving
                    await websocket.send_json({"type": "error", "message": f"{type(error).__name__}: {error}",
                                               "dropped": 0})
        except WebSocketDisconnect:
            pass
        finally:
            live.close()

    return [Route("/", page), WebSocketRoute("/ws", page_socket)]


async def _receive(websocket: WebSocket, live: LivePage) -> dict[str, Any] | None:
    """The next message, or None when a draft finished first (to be shown at once)."""
    import asyncio

    receiving = asyncio.ensure_future(websocket.receive_json())
    while not receiving.done():
        await asyncio.wait([receiving], timeout=0.1)
        if live.outbox and not receiving.done():
            await live.flush()
    try:
        message = receiving.result()
        kind, text = message.get("type"), message.get("text")
    except (AttributeError, KeyError) as error:
        raise ValueError(f"{type(error).__name__}: {error}") from None
    if kind in ("typed", "enter") and not isinstance(text, str):
        raise ValueError(f"a {kind!r} message needs the text as a string")
    return {"type": kind, "text": text}
