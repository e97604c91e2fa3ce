"""What the lookup proposes (`LookupPolicy`, built from the decode settings), and what a
proposer offers a forward (`BranchProposer`): the types the lookup, its token trees and the cost
chooser share, in a module that imports none of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

OCCURRENCES = ("first", "last")
MATCHES = ("ngram", "longest")
CHOICES = ("fixed", "cost")


@dataclass(frozen=True)
class LookupPolicy:
    """What to propose (defaults: `eval.engines.decode.DecodeSpec`): `ngram` tries n-gram lengths
    max_ngram down to min_ngram, source by source, and proposes `block` tokens after the chosen
    `occurrence`; `longest` follows the occurrence with the longest matching context (at least
    min_ngram tokens) and proposes `block` tokens, or twice the context's length up to `max_block`."""

    max_ngram: int
    block: int
    occurrence: str
    min_ngram: int
    match: str = "ngram"
    max_block: int = 0  # 0: always `block`
    tree: int = 1  # branches verified per forward (1: a chain)
    realign: int = 0  # tree candidates resuming a source the answer broke from, up to this many edits back
    choice: str = "fixed"  # 'cost': per forward, by expected time saved (eval/engines/cost_choice.py)
    costs: tuple[float, ...] = ()  # choice 'cost': a forward of width w costs costs[w - 1] one-token steps

    def proposal_length(self, context: int) -> int:
        """Tokens proposed after a match of `context` tokens: a long match earns a long block.

        Args:
            context (int): the matched context's length in tokens.
        """
        if not self.max_block:
            return self.block
        return max(self.block, min(self.max_block, 2 * context))


class BranchProposer(Protocol):
    """Proposes, after an answer, the branches one forward verifies (at most `budget` tokens each)."""

    def branches(self, answer: list[int], budget: int) -> list[list[int]]:
        """The branches to verify after `answer` (none: decode plainly).

        Args:
            answer (list[int]): the answer's tokens so far.
            budget (int): the most tokens a branch may hold.
        """
        ...
