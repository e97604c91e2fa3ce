"""What every streaming engine shares: the result of one update, the replay of a
request, and the baseline as an update with no draft (PROTOCOL.md, "The procedure").

An engine (autoregressive, ReFusion, bidirectional) provides `new_state()` and
`update(state, prompt_ids, phases)`; the replay and the baseline follow from them.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass
class UpdateResult:
    """One verify-accept-regenerate step."""

    answer: list[int]
    draft_length: int
    accepted: int
    forwards: int
    seconds: float


@dataclass
class StreamResult:
    """Every update of one streamed request; the last one is the residual phase."""

    steps: list[UpdateResult]

    @property
    def final(self) -> UpdateResult:
        return self.steps[-1]

    @property
    def drafting_forwards(self) -> int:
        return sum(step.forwards for step in self.steps[:-1])


class StreamingEngine:
    """The replay and the baseline, in terms of a subclass's `new_state` and `update`."""

    # A fully accepted draft that ends in EOS costs the verification pass alone.
    min_residual_forwards = 1

    forwards: Counter[str]  # model calls by phase, set by each engine

    def new_state(self) -> Any:
        raise NotImplementedError

    def update(self, state: Any, prompt_ids: list[int], phases: tuple[str, str]) -> UpdateResult:
        raise NotImplementedError

    def baseline(self, prompt_ids: list[int]) -> UpdateResult:
        """Decode S_n from scratch: an update with no draft and a fresh state."""
        return self.update(self.new_state(), prompt_ids, ("baseline", "baseline"))

    def stream(self, prompts: list[list[int]]) -> StreamResult:
        """Replay S_1..S_n; updates before the last are drafting, the last is residual."""
        state = self.new_state()
        steps = []
        for index, prompt_ids in enumerate(prompts):
            final = index == len(prompts) - 1
            phases = ("verify", "regenerate") if final else ("drafting", "drafting")
            steps.append(self.update(state, prompt_ids, phases))
        return StreamResult(steps)

    def _result(self, answer: list[int], draft: list[int], accepted: int, calls_before: int, start: float) -> UpdateResult:
        """The update that began at `start` (perf_counter) with `calls_before` counted forwards."""
        return UpdateResult(
            answer=answer,
            draft_length=len(draft),
            accepted=accepted,
            forwards=sum(self.forwards.values()) - calls_before,
            seconds=time.perf_counter() - start,
        )
