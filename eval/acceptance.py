"""Acceptance rules: which leading draft tokens survive verification (PROTOCOL.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AcceptanceRule:
    """`greedy` (lossless: token equals the argmax) or `threshold:TAU` (p(token) >= TAU)."""

    kind: str
    tau: float | None = None

    @classmethod
    def parse(cls, spec: str) -> "AcceptanceRule":
        """Read `greedy` or `threshold:0.9`."""
        if spec == "greedy":
            return cls("greedy")
        if spec.startswith("threshold:"):
            try:
                return cls("threshold", float(spec.split(":", 1)[1]))
            except ValueError:
                pass
        raise ValueError(f"unknown acceptance rule {spec!r}; use 'greedy' or 'threshold:TAU' (e.g. threshold:0.9)")

    @property
    def lossless(self) -> bool:
        return self.kind == "greedy"

    def __str__(self) -> str:
        return "greedy" if self.kind == "greedy" else f"threshold:{self.tau:g}"

    def accepted_length(self, logits: torch.Tensor, draft: list[int]) -> int:
        """Length of the leading run of `draft` that passes; `logits[j]` is the
        causal prediction for draft position j (formed without seeing draft[j])."""
        if not draft:
            return 0
        tokens = torch.tensor(draft, device=logits.device)
        if self.kind == "greedy":
            passed = logits.argmax(dim=-1) == tokens
        else:
            probabilities = torch.softmax(logits.float(), dim=-1).gather(1, tokens[:, None])[:, 0]
            passed = probabilities >= self.tau
        failures = (~passed).nonzero()
        return int(failures[0, 0]) if len(failures) else len(draft)
