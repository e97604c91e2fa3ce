"""The HTTP side of `python -m eval.serve`: OpenAI's chat completions (SSE when streamed), plus
typing sessions.

- `POST /v1/chat/completions`: OpenAI's request; greedy only. Extensions: `session` (a typing
  session's id: its drafts are the proposals, and the session ends), `speculate` (false: no
  proposals at all, plain decoding) and `decode` (this request's lookup policy: decode.lookup_*
  keys and `regenerate`, over the server's). OpenAI's `prediction` ({"type": "content", "content": ...})
  is the held draft. `usage.completion_tokens_details` counts accepted and rejected prediction
  tokens as OpenAI does; `headstart` adds the token ids, engine steps and proposal counts.
- `POST /v1/sessions` {"messages": earlier turns, "max_tokens"} opens a session;
  `POST /v1/sessions/{id}/text` {"text": typed so far, "complete": false} updates it (drafting
  starts in the background when a segment completes; `complete: true` says the text ends one);
  `GET` shows it, `DELETE` cancels it.
- `GET /v1/models`, `GET /health`, `GET /v1/headstart/stats` (drafting work and scheduling counts).
Bad input is a 400 naming the problem (404: an unknown model or session), in OpenAI's error shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from eval.engines.decode import LOOKUP_KEYS, DecodeSpec
from eval.engines.lookup_policy import LookupPolicy
from eval.serving.sessions import Session, Sessions

ROLES = ("system", "user", "assistant")
MAX_LOOKUP_SETTING = 256  # the largest n-gram or block a request may ask for: each costs proposer work every step


class BadRequest(ValueError):
    """A request the server refuses: `status` 400, or 404 for what does not exist."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


def error_response(error: BadRequest) -> JSONResponse:
    """The OpenAI-style error response of a refused request.

    Args:
        error (BadRequest): why the request is refused, with its status and parameter.
    """
    kind = "invalid_request_error" if error.status == 400 else "not_found_error"
    return JSONResponse({"error": {"message": str(error), "type": kind, "param": error.param, "code": None}},
                        status_code=error.status)


@dataclass
class Served:
    """What the routes need: the model's name, its tokenizer work, the sessions and the limits."""

    model_name: str
    sessions: Sessions
    encode: Any  # messages -> prompt ids (the server's system message added)
    encode_answer: Any  # text -> ids of an answer (a prediction)
    decode: Any  # ids -> text
    max_tokens: int  # default answer cap
    max_model_len: int  # prompt + answer
    speculating: bool  # the engine has the draft proposer
    decode_spec: DecodeSpec  # the server's lookup policy (a request's `decode` overrides it)


def text_of(content: Any, where: str) -> str:
    """OpenAI content: a string, or a list of text parts.

    Args:
        content (Any): a message's content.
        where (str): the message's place in the body, for the error.
    """
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                         for p in content):
        return "".join(p["text"] for p in content)
    raise BadRequest(f"{where}: content must be a string or a list of text parts", param=where)


def read_messages(value: Any, where: str = "messages", final_user: bool = True) -> list[dict[str, str]]:
    """The messages of a request body, checked: each an object with a known role and text content.

    Args:
        value (Any): the body's messages.
        where (str): their place in the body, for the error.
        final_user (bool): the list must be non-empty and end with a user turn.
    """
    if not isinstance(value, list) or (final_user and not value):
        raise BadRequest(f"{where} must be a{' non-empty' if final_user else ''} list of messages", param=where)
    messages = []
    for index, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise BadRequest(f"{where}[{index}]: a message is an object whose role is one of {', '.join(ROLES)}",
                             param=where)
        messages.append({"role": message["role"], "content": text_of(message.get("content"), f"{where}[{index}]")})
    if final_user and messages[-1]["role"] != "user":
        raise BadRequest(f"{where}: the last message must be the user's", param=where)
    return messages


def positive_int(body: dict, *names: str, default: int) -> int:
    """The first of `names` set in `body`, checked to be a positive integer; `default` when none is set.

    Args:
        body (dict): the request body.
        names (str): the parameters' names, the preferred first.
        default (int): the value when none is set.
    """
    for name in names:
        if body.get(name) is not None:
            value = body[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BadRequest(f"{name} must be a positive integer, not {value!r}", param=name)
            return value
    return default


async def read_body(request: Request) -> dict:
    """The request's JSON body, refused unless it is an object.

    Args:
        request (Request): the HTTP request.
    """
    try:
        body = json.loads(await request.body() or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BadRequest(f"the body is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def check_greedy(body: dict) -> None:
    """The server decodes greedily, the mode in which drafts cannot change an answer.

    Args:
        body (dict): the request body.
    """
    if body.get("temperature") not in (None, 0, 0.0):
        raise BadRequest(f"temperature={body['temperature']!r}: this server decodes greedily (temperature 0)",
                         param="temperature")
    if body.get("n") not in (None, 1):
        raise BadRequest(f"n={body['n']!r}: one answer per request", param="n")
    for name in ("logprobs", "tools", "response_format", "stop", "logit_bias"):
        if body.get(name):
            raise BadRequest(f"{name} is not served here", param=name)


def stream_usage(body: dict) -> bool:
    """Whether a streamed answer ends with a usage chunk (`stream_options.include_usage`).

    Args:
        body (dict): the request body.
    """
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise BadRequest('stream_options must be {"include_usage": true|false}', param="stream_options")
    return options.get("include_usage", False)


class ClosingStream(StreamingResponse):
    """A streamed answer whose generator is closed however the response ends: Starlette leaves it
    suspended when the client leaves, and closing it is what aborts the answer's decoding."""

    async def stream_response(self, send) -> None:
        """Stream the response, then close its generator, whether or not the client stayed.

        Args:
            send: the ASGI send callable.
        """
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()


class Routes:
    def __init__(self, served: Served) -> None:
        self.served = served

    def _model(self, body: dict) -> None:
        name = body.get("model")
        if name not in (None, self.served.model_name):
            raise BadRequest(f"model {name!r} is not served here; this server serves {self.served.model_name!r}",
                             404, "model")

    def _prompt(self, messages: list[dict[str, str]], max_tokens: int) -> list[int]:
        prompt = self.served.encode(messages)
        if len(prompt) + max_tokens > self.served.max_model_len:
            raise BadRequest(f"the prompt ({len(prompt)} tokens) and max_tokens ({max_tokens}) exceed the "
                             f"{self.served.max_model_len} tokens a request may take", param="messages")
        return prompt

    async def chat(self, request: Request) -> Response:
        """POST /v1/chat/completions: one answer, whole or streamed.

        Args:
            request (Request): the HTTP request.
        """
        try:
            body = await read_body(request)
            self._model(body)
            check_greedy(body)
            messages = read_messages(body.get("messages"))
            max_tokens = positive_int(body, "max_completion_tokens", "max_tokens", default=self.served.max_tokens)
            prompt = self._prompt(messages, max_tokens)
            usage = stream_usage(body)
            sources, session = self._sources(body)
        except BadRequest as error:
            return error_response(error)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        events = self.served.sessions.answer(request_id, prompt, max_tokens, sources, session)
        reply = Reply(request_id, self.served, len(prompt), bool(sources and sources["held"]))
        if body.get("stream"):
            return ClosingStream(reply.chunks(events, usage), media_type="text/event-stream")
        whole = await reply.whole(events)
        return JSONResponse(whole, status_code=500 if "error" in whole else 200)

    def _sources(self, body: dict) -> tuple[dict[str, Any] | None, Session | None]:
        speculate = body.get("speculate", True)
        if not isinstance(speculate, bool):
            raise BadRequest("speculate must be true or false", param="speculate")
        prediction = body.get("prediction")
        predicted = None
        if prediction is not None:
            if not isinstance(prediction, dict) or prediction.get("type") != "content":
                raise BadRequest('prediction must be {"type": "content", "content": ...}', param="prediction")
            predicted = self.served.encode_answer(text_of(prediction.get("content"), "prediction"))
        session = None
        if body.get("session") is not None:
            session = self._session(body["session"])
        if not speculate or not self.served.speculating:
            return None, session
        sources = session.sources(predicted) if session is not None else {"held": predicted or [], "earlier": []}
        if body.get("decode") is not None:
            policy = self._policy(body["decode"])
            sources["policy"] = asdict(policy) if policy else None
        return sources, session

    def _policy(self, overrides: Any) -> LookupPolicy | None:
        """This request's lookup policy: the server's decode settings with `overrides` (decode.lookup_* keys,
        and `regenerate`: plain verifies the held draft and decodes the rest without lookup)."""
        allowed = (*LOOKUP_KEYS, "regenerate")
        if not isinstance(overrides, dict) or set(overrides) - set(allowed):
            raise BadRequest(f"decode must be an object of {', '.join(allowed)}", param="decode")
        for key, value in overrides.items():
            default = getattr(self.served.decode_spec, key)
            if type(value) is not type(default) or (isinstance(value, int) and not 0 <= value <= MAX_LOOKUP_SETTING):
                raise BadRequest(f"decode.{key} must be a {type(default).__name__}"
                                 f"{f' in 0-{MAX_LOOKUP_SETTING}' if isinstance(default, int) else ''}, not {value!r}",
                                 param="decode")
        try:
            return replace(self.served.decode_spec, **overrides).chain_lookup()
        except (TypeError, ValueError) as error:
            raise BadRequest(f"decode: {error}", param="decode") from None

    def _session(self, session_id: Any) -> Session:
        if not isinstance(session_id, str):
            raise BadRequest("session must be a session id string", param="session")
        try:
            return self.served.sessions.get(session_id)
        except KeyError as error:
            raise BadRequest(error.args[0], 404, "session") from None

    async def open_session(self, request: Request) -> Response:
        """POST /v1/sessions: open a typing session.

        Args:
            request (Request): the HTTP request.
        """
        try:
            body = await read_body(request)
            self._model(body)
            history = read_messages(body.get("messages", []), final_user=False)
            max_tokens = positive_int(body, "max_completion_tokens", "max_tokens", default=self.served.max_tokens)
            session = self.served.sessions.open(history, max_tokens)
            if body.get("text") is not None:
                self._type(session, body)
        except BadRequest as error:
            return error_response(error)
        return JSONResponse(self._view(session))

    async def session_text(self, request: Request) -> Response:
        """POST /v1/sessions/{id}/text: the text typed so far, which starts or updates a draft.

        Args:
            request (Request): the HTTP request.
        """
        try:
            session = self._session(request.path_params["session_id"])
            body = await read_body(request)
            self._type(session, body)
        except BadRequest as error:
            return error_response(error)
        return JSONResponse(self._view(session))

    def _type(self, session: Session, body: dict) -> None:
        text, complete = body.get("text"), body.get("complete", False)
        if not isinstance(text, str) or not isinstance(complete, bool):
            raise BadRequest('the body is {"text": typed so far, "complete": true|false}', param="text")
        self.served.sessions.type(session, text, complete)

    async def session(self, request: Request) -> Response:
        """GET or DELETE /v1/sessions/{id}: the session's state, or its end.

        Args:
            request (Request): the HTTP request.
        """
        try:
            session = self._session(request.path_params["session_id"])
        except BadRequest as error:
            return error_response(error)
        if request.method == "DELETE":
            self.served.sessions.close(session)
            return JSONResponse({"id": session.session_id, "object": "headstart.session", "deleted": True})
        return JSONResponse(self._view(session))

    def _view(self, session: Session) -> dict[str, Any]:
        return {"id": session.session_id, "object": "headstart.session", "typed_characters": len(session.text),
                "drafts": len(session.drafts), "drafted_tokens": len(session.drafts[-1][1]) if session.drafts else 0,
                "drafting": session.job is not None, "waiting": bool(session.wanted), "stale": session.dropped,
                "expires_in": self.served.sessions.ttl}

    async def models(self, request: Request) -> Response:
        """GET /v1/models: the served model.

        Args:
            request (Request): the HTTP request.
        """
        return JSONResponse({"object": "list", "data": [{"id": self.served.model_name, "object": "model",
                                                         "owned_by": "headstart", "created": 0}]})

    async def health(self, request: Request) -> Response:
        """GET /health: the server is up.

        Args:
            request (Request): the HTTP request.
        """
        return JSONResponse({"status": "ok"})

    async def stats(self, request: Request) -> Response:
        """GET /v1/headstart/stats: counts of sessions, answers and drafts, and the work done.

        Args:
            request (Request): the HTTP request.
        """
        return JSONResponse(self.served.sessions.stats())


class Reply:
    """One answer as OpenAI's chat completion, whole or in SSE chunks."""

    def __init__(self, request_id: str, served: Served, prompt_tokens: int, predicted: bool) -> None:
        self.request_id, self.served, self.prompt_tokens, self.predicted = request_id, served, prompt_tokens, predicted
        self.created = int(time.time())
        self.tokens: list[int] = []

    def _usage(self, finished: dict[str, Any]) -> dict[str, Any]:
        accepted, proposed = finished.get("accepted", 0), finished.get("proposed", 0)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.tokens),
                "total_tokens": self.prompt_tokens + len(self.tokens),
                "completion_tokens_details": {"accepted_prediction_tokens": accepted,
                                              "rejected_prediction_tokens": proposed - accepted}}

    def _extension(self, finished: dict[str, Any]) -> dict[str, Any]:
        return {"token_ids": self.tokens, "engine_steps": finished.get("steps", 0),
                "proposed": finished.get("proposed", 0), "accepted": finished.get("accepted", 0),
                "verifications": finished.get("verifications", 0), "held_draft": self.predicted}

    @staticmethod
    def _finish_reason(finished: dict[str, Any]) -> str:
        return "length" if finished.get("reason") == "length" else "stop"

    async def whole(self, events: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
        """The whole answer as a chat completion, or an error object when decoding failed.

        Args:
            events (AsyncIterator[dict[str, Any]]): the answer's events.
        """
        finished: dict[str, Any] = {}
        async for event in events:
            self.tokens += event["tokens"]
            finished = event
        if finished.get("error"):
            return {"error": {"message": finished["error"], "type": "server_error", "param": None, "code": None}}
        return {"id": self.request_id, "object": "chat.completion", "created": self.created,
                "model": self.served.model_name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": self.served.decode(self.tokens)},
                             "finish_reason": self._finish_reason(finished)}],
                "usage": self._usage(finished), "headstart": self._extension(finished)}

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> str:
        chunk = {"id": self.request_id, "object": "chat.completion.chunk", "created": self.created,
                 "model": self.served.model_name,
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}] if delta is not None else [],
                 **extra}
        return f"data: {json.dumps(chunk)}\n\n"

    async def chunks(self, events: AsyncIterator[dict[str, Any]], usage: bool) -> AsyncIterator[str]:
        """The answer as SSE chunks; the events are closed however the stream ends, which aborts unfinished decoding.

        Args:
            events (AsyncIterator[dict[str, Any]]): the answer's events.
            usage (bool): end with a usage chunk.
        """
        try:
            async for chunk in self._chunks(events, usage):
                yield chunk
        finally:
            await events.aclose()  # the answer's own clean-up: an unfinished decoding is aborted

    async def _chunks(self, events: AsyncIterator[dict[str, Any]], usage: bool) -> AsyncIterator[str]:
        yield self._chunk({"role": "assistant", "content": ""})
        sent = ""
        async for event in events:
            if event.get("error"):
                yield f"data: {json.dumps({'error': {'message': event['error'], 'type': 'server_error'}})}\n\n"
                break
            self.tokens += event["tokens"]
            text = self.served.decode(self.tokens)
            if not event["finished"] and text.endswith("\ufffd"):
                continue  # a character cut between tokens: wait for the rest of it
            if len(text) > len(sent) and text.startswith(sent):
                yield self._chunk({"content": text[len(sent):]})
                sent = text
            if event["finished"]:
                yield self._chunk({}, self._finish_reason(event), headstart=self._extension(event))
                if usage:
                    yield self._chunk(None, usage=self._usage(event))
        yield "data: [DONE]\n\n"


@contextlib.asynccontextmanager
async def expiring(served: Served) -> AsyncIterator[None]:
    """While the app runs: close the sessions left untouched for `ttl` seconds, checked a few times per ttl.

    Args:
        served (Served): what the server serves, its sessions among it.
    """

    async def sweep() -> None:
        while True:
            await asyncio.sleep(min(served.sessions.ttl / 4, 5.0))
            served.sessions.expire()

    task = asyncio.create_task(sweep())
    try:
        yield
    finally:
        task.cancel()


def build_app(served: Served, extra_routes: list | None = None) -> Starlette:
    """The Starlette app with the OpenAI and session routes.

    Args:
        served (Served): what the server serves.
        extra_routes (list | None): further routes (the live page's), or None.
    """
    routes = Routes(served)
    return Starlette(lifespan=lambda app: expiring(served), routes=[
        Route("/v1/chat/completions", routes.chat, methods=["POST"]),
        Route("/v1/sessions", routes.open_session, methods=["POST"]),
        Route("/v1/sessions/{session_id}/text", routes.session_text, methods=["POST"]),
        Route("/v1/sessions/{session_id}", routes.session, methods=["GET", "DELETE"]),
        Route("/v1/models", routes.models),
        Route("/health", routes.health),
        Route("/v1/headstart/stats", routes.stats),
        *(extra_routes or []),
    ])
