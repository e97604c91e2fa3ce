"""Acceptance rules: which leading draft tokens survive verification (PROTOCOL.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # DecodeSpec parses rules when a config is built: `--help` must not load torch
    import torch


@dataclass(frozen=True)
class AcceptanceRule:
    """`greedy` (lossless: token equals the argmax) or `threshold:TAU` (p(token) >= TAU)."""

    kind: str
    tau: float | None = None

    @classmethod
    def parse(cls, spec: str) -> AcceptanceRule:
        """Read `greedy` or `threshold:0.9`.

        Args:
            spec (str): the rule as configured.
        """
        if spec == "greedy":
            return cls("greedy")
        if spec.startswith("threshold:"):
            try:
                tau = float(spec.split(":", 1)[1])
            except ValueError:
                tau = None
            if tau is not None:
                # A probability: below 0 every token passes, above 1 none does (nan compares false).
                if not 0.0 <= tau <= 1.0:
                    raise ValueError(f"acceptance rule {spec!r}: TAU is a probability, 0 <= TAU <= 1 "
                                     "(threshold:0 keeps every draft token, threshold:1 only those of probability 1)")
                return cls("threshold", tau)
        raise ValueError(f"unknown acceptance rule {spec!r}; use 'greedy' or 'threshold:TAU' (e.g. threshold:0.9)")

    @property
    def lossless(self) -> bool:
        return self.kind == "greedy"

    def __str__(self) -> str:
        return "greedy" if self.kind == "greedy" else f"threshold:{self.tau:g}"

    def passes(self, logits: torch.Tensor, draft: list[int]) -> torch.Tensor:
        """Whether each draft token passes on its own; `logits[j]` is the verifier's
        prediction for draft position j.

        Args:
            logits (torch.Tensor): the verifier's logits, one row per draft position.
            draft (list[int]): the draft's token ids.
        """
        import torch  # here, not above: parsing a rule (a config, `--help`) needs no torch

        tokens = torch.tensor(draft, device=logits.device, dtype=torch.long)
        if self.kind == "greedy":
            return logits.argmax(dim=-1) == tokens
        probabilities = torch.softmax(logits.float(), dim=-1).gather(1, tokens[:, None])[:, 0]
        return probabilities >= self.tau

    def accepted_length(self, logits: torch.Tensor, draft: list[int]) -> int:
        """Length of the leading run of `draft` that passes; `logits[j]` is the
        verifier's prediction for draft position j (causal engines form it without
        seeing draft[j]; the bidirectional control does not).

        Args:
            logits (torch.Tensor): the verifier's logits, one row per draft position.
            draft (list[int]): the draft's token ids.
        """
        if not draft:
            return 0
        failures = (~self.passes(logits, draft)).nonzero()
        return int(failures[0, 0]) if len(failures) else len(draft)

    def accepted_length_from_scores(self, scores: list[tuple[float, int]]) -> int:
        """`accepted_length` from each draft token's (log-probability, rank) under the
        verifier, rank 1 being the argmax: what vLLM's prompt log-probabilities give.

        Args:
            scores (list[tuple[float, int]]): (log-probability, rank) of each draft token under the verifier.
        """
        for index, (logprob, rank) in enumerate(scores):
            if not (rank == 1 if self.kind == "greedy" else math.exp(logprob) >= self.tau):
                return index
        return len(scores)
