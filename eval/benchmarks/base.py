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
    """PROTOCOL.md: requests of a single segment have nothing to stream and are excluded.

    Args:
        requests (list[Request]): the requests.
    """
    return [request for request in requests if len(request.segments) >= 2]


def execution_score(result: ExecutionResult) -> Score:
    """The score of an executed program: pass or fail, its status (with why it failed), its containment.

    Args:
        result (ExecutionResult): the program's execution.
    """
    return Score(value=float(result.passed), passed=result.passed, detail=status_detail(result),
                 containment=result.containment)


def status_detail(result: ExecutionResult) -> str:
    """The status; for a failure, the run's most telling line too: the trusted tests' error where
    they reported one, else the last line of the program's stderr (already escaped).

    Args:
        result (ExecutionResult): the program's execution.
    """
    if result.passed:
        return result.status
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    tests = [line for line in lines if line.startswith("tests (")]
    telling = (tests or lines)[-1:]
    return f"{result.status}: {telling[0][:300]}" if telling else result.status


class Benchmark(Protocol):
    """A benchmark loads its requests (n >= 2 segments only) and scores answers."""

    name: str

    def load(self, limit: int | None = None) -> list[Request]:
        """The benchmark's streamable requests, in a fixed order.

        Args:
            limit (int | None): the most requests to return (the first ones); None: all.
        """
        ...

    def score(self, request: Request, answer: str) -> Score:
        """The score of `answer` to `request`.

        Args:
            request (Request): the request, with its reference.
            answer (str): the model's answer to the complete request.
        """
        ...
