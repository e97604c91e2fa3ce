"""What every benchmark provides: streamable requests and a scorer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from eval.sandbox import ExecutionResult


@dataclass
class Request:
    """One evaluation request: the final user turn as segments, after `history`."""

    request_id: str
    segments: list[str]
    history: list[dict[str, str]] = field(default_factory=list)
    reference: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "".join(self.segments)


@dataclass
class Score:
    """Quality of one answer: `passed` for executed tests, `value` in [0, 1];
    `containment`: what the program ran under and where its tests ran (executed only)."""

    value: float
    passed: bool | None = None
    detail: str = ""
    containment: str = ""


def streamable(requests: list[Request]) -> list[Request]:
    """PROTOCOL.md: requests of a single segment have nothing to stream and are excluded."""
    return [request for request in requests if len(request.segments) >= 2]


def execution_score(result: ExecutionResult) -> Score:
    """The score of an executed program: pass or fail, its status, its containment."""
    return Score(value=float(result.passed), passed=result.passed, detail=result.status,
                 containment=result.containment)


class Benchmark(Protocol):
    """A benchmark loads its requests (n >= 2 segments only) and scores answers."""

    name: str

    def load(self, limit: int | None = None) -> list[Request]: ...

    def score(self, request: Request, answer: str) -> Score: ...
