"""Typing sessions: drafts made in the background while a request is typed, and the scheduling
that keeps answers first.

A session holds what the user has typed of one request (after the conversation `history`).
Each time a segment completes (headstart.segment cuts the typed text, or the client says so),
the session wants a draft: greedy decoding of the request typed so far, with the session's
newest draft as the speculative proposal (the evaluator's update, on vLLM). A newer segment
makes a running draft stale: it is aborted and what it had decoded kept as a draft. At
submission the newest draft is the held draft of the answer and the older ones its lookup
sources (eval.serving.proposer).

Scheduling (the paper's advice for production: draft only with spare capacity): drafts run only
while no answer is in flight, at most `max_drafting` at a time. An answer arriving pauses every
running draft (aborted, its tokens kept, resumed later from them), so an answer shares the engine
with no draft beyond the step already running when it arrived. Sessions waiting to draft are
served in the order their segments arrived; a session waits for its newest segment only.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from headstart.segment import segment_request


class Engine(Protocol):
    def add(self, request_id: str, prompt: list[int], max_tokens: int, sources: dict[str, Any] | None) -> asyncio.Queue:
        """Start greedy decoding of `prompt`; its events arrive on the returned queue.

        Args:
            request_id (str): the request's id.
            prompt (list[int]): the prompt's token ids.
            max_tokens (int): the most tokens the answer may have.
            sources (dict[str, Any] | None): the drafts the proposer reads, or None for no proposals.
        """
        ...

    def abort(self, request_id: str) -> None:
        """Stop a request.

        Args:
            request_id (str): the request's id.
        """
        ...


def complete_prefix(typed: str) -> str:
    """The complete segments of the text typed so far: all but the last, which may still grow.

    Args:
        typed (str): the text typed so far.
    """
    return "".join(segment_request(typed)[:-1])


@dataclass
class DraftJob:
    """One drafting request on the engine."""

    request_id: str
    prefix: str
    tokens: list[int] = field(default_factory=list)
    steps: int = 0
    stopping: str = ""  # why it was aborted: "stale", "paused", "submitted", "cancelled"
    started: float = field(default_factory=time.monotonic)


@dataclass
class Session:
    """One request being typed."""

    session_id: str
    history: list[dict[str, str]]
    max_tokens: int
    touched: float
    text: str = ""
    wanted: str = ""  # the newest complete prefix not drafted yet ("" none)
    drafts: list[tuple[str, list[int]]] = field(default_factory=list)  # (prefix, draft), oldest first
    job: DraftJob | None = None
    dropped: int = 0  # drafts made stale by a newer segment before they finished
    listener: Callable[[DraftJob], None] | None = None  # told of every draft that ends (the live page)

    def keep(self, prefix: str, tokens: list[int]) -> None:
        """A draft (whole or partial) of `prefix`: it replaces an earlier one of the same prefix,
        which it extends (a resumed draft starts from the paused one's tokens).

        Args:
            prefix (str): the typed text (complete segments) the draft answers.
            tokens (list[int]): the draft's tokens.
        """
        if not tokens:
            return
        kept = dict(self.drafts).get(prefix, [])
        if len(kept) > len(tokens) and kept[: len(tokens)] == tokens:
            tokens = kept  # a resumed draft paused again before it caught up with the one it resumed
        self.drafts = [(p, d) for p, d in self.drafts if p != prefix] + [(prefix, tokens)]

    def sources(self, prediction: list[int] | None = None) -> dict[str, Any]:
        """The proposer's sources: the held draft (`prediction` when the client sent one, else the
        newest draft) and the earlier drafts, newest first.

        Args:
            prediction (list[int] | None): the held draft the client sent, or None.
        """
        drafts = [d for p, d in self.drafts]
        if self.job and self.job.tokens:
            kept = dict(self.drafts).get(self.job.prefix, [])
            drafts.append(max(self.job.tokens, kept, key=len))  # a resumed draft, or the one it resumes
        if prediction:
            drafts.append(prediction)
        return {"held": drafts[-1] if drafts else [], "earlier": drafts[-2::-1]}


@dataclass
class Work:
    """What drafting has cost and what happened to it, since the server started."""

    drafts_started: int = 0
    draft_tokens: int = 0  # tokens decoded by drafts (finished or not)
    draft_steps: int = 0  # engine steps that advanced a draft
    stale: int = 0
    paused: int = 0
    expired: int = 0
    answers_abandoned: int = 0  # answers whose client left before the end: their decoding was aborted


class Sessions:
    """The sessions of one server, their drafting, and the answers in flight."""

    def __init__(self, engine: Engine, encode: Callable[[list[dict[str, str]]], list[int]], max_drafting: int,
                 ttl: float, drafting: bool = True, answers_first: bool = True) -> None:
        self.engine = engine
        self.drafting = drafting  # False: sessions are kept (the API stays the same), nothing is drafted
        self.answers_first = answers_first  # False: drafts run beside answers (the policy it is measured against)
        self.encode = encode  # messages (no system message) -> prompt ids, as the server templates them
        self.max_drafting = max_drafting
        self.ttl = ttl
        self.sessions: dict[str, Session] = {}
        self.waiting: deque[str] = deque()
        self.running: dict[str, DraftJob] = {}  # session id -> its draft on the engine
        self.answers = 0
        self.work = Work()
        self.ids = itertools.count()

    # Sessions

    def open(self, history: list[dict[str, str]], max_tokens: int) -> Session:
        """A new session with its earlier turns.

        Args:
            history (list[dict[str, str]]): the dialogue's earlier turns.
            max_tokens (int): the most tokens an answer may have.
        """
        session = Session(f"sess-{next(self.ids)}-{time.time_ns() % 10**9}", history, max_tokens, time.monotonic())
        self.sessions[session.session_id] = session
        return session

    def get(self, session_id: str) -> Session:
        """The open session `session_id`; KeyError when it is not open.

        Args:
            session_id (str): the session's id.
        """
        session = self.sessions.get(session_id)
        if session is None:
            raise KeyError(f"no session {session_id!r}: never opened, already submitted, cancelled or expired "
                           f"(a session expires {self.ttl:g} s after its last text)")
        return session

    def type(self, session: Session, text: str, complete: bool = False) -> None:
        """The text typed so far; `complete`: it ends a segment (else headstart.segment decides).

        Args:
            session (Session): the session.
            text (str): the text typed so far.
            complete (bool): the text ends a segment.
        """
        session.text, session.touched = text, time.monotonic()
        if not self.drafting:
            return
        prefix = text if complete else complete_prefix(text)
        current = session.wanted or (session.job.prefix if session.job else "") or \
            (session.drafts[-1][0] if session.drafts else "")
        if not prefix.strip() or prefix == current:
            return
        if session.job and not session.job.stopping:
            self._stop(session.job, "stale")
            session.dropped += 1
        session.wanted = prefix
        if session.session_id not in self.waiting:
            self.waiting.append(session.session_id)
        self._schedule()

    def close(self, session: Session, why: str = "cancelled") -> None:
        """End a session: its draft stops, its drafts are dropped, its listener hears no more.

        Args:
            session (Session): the session.
            why (str): why it ends: the reason its running draft stops with.
        """
        self.sessions.pop(session.session_id, None)
        session.listener = None
        if session.job:
            self._stop(session.job, why)

    def expire(self) -> int:
        """Close the sessions untouched for `ttl` seconds; how many."""
        cutoff = time.monotonic() - self.ttl
        old = [s for s in self.sessions.values() if s.touched < cutoff]
        for session in old:
            self.close(session, "expired")
        self.work.expired += len(old)
        return len(old)

    # Drafting

    def _schedule(self) -> None:
        while not (self.answers and self.answers_first) and len(self.running) < self.max_drafting and self.waiting:
            session = self.sessions.get(self.waiting.popleft())
            if session is None or not session.wanted or session.job:
                continue
            self._start(session)

    def _start(self, session: Session) -> None:
        job = DraftJob(f"draft-{next(self.ids)}", session.wanted)
        prompt = self.encode([*session.history, {"role": "user", "content": job.prefix}])
        events = self.engine.add(job.request_id, prompt, session.max_tokens, session.sources())
        session.job, session.wanted = job, ""
        self.running[session.session_id] = job
        self.work.drafts_started += 1
        asyncio.get_running_loop().create_task(self._follow(session, job, events))

    async def _follow(self, session: Session, job: DraftJob, events: asyncio.Queue) -> None:
        finished: dict[str, Any] = {}
        while not finished:
            event = await events.get()
            job.tokens += event["tokens"]
            finished = event if event["finished"] else {}
        job.steps = finished.get("steps", 0)
        self.work.draft_tokens += len(job.tokens)
        self.work.draft_steps += job.steps
        self.running.pop(session.session_id, None)
        if session.job is job:
            session.job = None
        if job.stopping in ("", "stale", "paused"):
            session.keep(job.prefix, job.tokens)
            if session.listener:
                session.listener(job)
        if job.stopping == "paused" and finished.get("reason") == "abort" and not session.wanted:
            session.wanted = job.prefix  # resumed from its own tokens once the answers are done
        if session.wanted and session.session_id in self.sessions and session.session_id not in self.waiting:
            # A paused draft resumes first; a stale one's successor waited behind it (`_schedule` skips
            # a session whose draft is still stopping).
            self.waiting.appendleft(session.session_id)
        self._schedule()

    def _stop(self, job: DraftJob, why: str) -> None:
        if not job.stopping:
            job.stopping = why
            if why == "stale":
                self.work.stale += 1
            elif why == "paused":
                self.work.paused += 1
            self.engine.abort(job.request_id)

    # Answers

    async def answer(self, request_id: str, prompt: list[int], max_tokens: int, sources: dict[str, Any] | None,
                     session: Session | None = None) -> AsyncIterator[dict[str, Any]]:
        """The events of one answer; every draft pauses while it runs. A session is submitted: its
        draft stops (what it decoded is a source) and the session ends.

        Args:
            request_id (str): the request's id.
            prompt (list[int]): the prompt's token ids.
            max_tokens (int): the most tokens the answer may have.
            sources (dict[str, Any] | None): the drafts the proposer reads, or None.
            session (Session | None): the session submitted, or None for a plain chat request.
        """
        self.answers += 1
        try:
            for job in list(self.running.values()) if self.answers_first else []:
                self._stop(job, "paused")
            if session is not None:
                self.close(session, "submitted")
            events = self.engine.add(request_id, prompt, max_tokens, sources)
            finished = False
            try:
                while not finished:
                    event = await events.get()
                    finished = event["finished"]
                    yield event
            finally:
                if not finished:  # the client went away: stop decoding for it
                    self.engine.abort(request_id)
                    self.work.answers_abandoned += 1
        finally:
            self.answers -= 1
            self._schedule()

    def stats(self) -> dict[str, Any]:
        return {"sessions": len(self.sessions), "answers_in_flight": self.answers, "drafting": len(self.running),
                "waiting_to_draft": len(self.waiting), **vars(self.work)}
