"""Tree size and block length chosen per forward by expected time saved (`decode.lookup_choice=cost`).

A proposal is worth its width only if it is accepted far enough: on a CPU a wide forward
costs several one-token steps, so it pays back only when it keeps enough proposed tokens on
average. The chooser sees the configured proposer's candidates (the best
`lookup_tree` continuations, each as long as its context earns) and picks, for each forward,
one option: a plain step, or the first t candidates cut to k tokens (t, k powers of two up to
the configured ones). It picks the option with the most tokens per unit of cost over this
update's earlier forwards, where each option's tokens at an earlier forward are what it would
have kept there (the answer since then says so, whichever option ran) plus the one token a
forward yields, and its cost is the width-cost table's (eval/engines/width_table.py). Before
any earlier forward is settled it runs the configured proposal.

Only the choice of what to verify changes: every forward still keeps exactly the tokens greedy
decoding produces, so answers stay identical. The choice is a function of this update's
tokens alone, so the fast path computes the same forwards as the engine executes.
"""

from __future__ import annotations

from dataclasses import dataclass

from eval.engines.lookup_policy import BranchProposer, LookupPolicy
from eval.engines.token_tree import TokenTree
from eval.engines.tokens import common_prefix_length

Option = tuple[int, int]  # (candidates kept, tokens per candidate); (0, 0): a plain step


def powers_up_to(limit: int) -> list[int]:
    """1, 2, 4, ... below `limit`, and `limit` itself.

    Args:
        limit (int): the largest value.
    """
    values, value = [], 1
    while value < limit:
        values.append(value)
        value *= 2
    return values + [limit]


def options(policy: LookupPolicy) -> list[Option]:
    """What the chooser may verify under `policy`; the configured proposal is the last.

    Args:
        policy (LookupPolicy): the lookup policy.
    """
    longest = max(policy.block, policy.max_block)
    return [(0, 0)] + [(trees, length) for trees in powers_up_to(policy.tree) for length in powers_up_to(longest)]


def cut(candidates: list[list[int]], option: Option) -> list[list[int]]:
    """The first `option[0]` candidates, each cut to `option[1]` tokens (distinct ones only).

    Args:
        candidates (list[list[int]]): the candidate continuations, best first.
        option (Option): (candidates kept, tokens per candidate).
    """
    trees, length = option
    kept: list[list[int]] = []
    for candidate in candidates[:trees]:
        branch = candidate[:length]
        if branch not in kept:
            kept.append(branch)
    return kept


def width(branches: list[list[int]]) -> int:
    """Tokens a forward feeds to verify `branches`: the answer's last token and the trie's nodes.

    Args:
        branches (list[list[int]]): the branches to verify.
    """
    return 1 + len(TokenTree.from_branches(branches).tokens)


def settled_gain(branches: list[list[int]], known: list[int]) -> int | None:
    """Tokens a forward verifying `branches` would have added where the answer went on with
    `known` (the longest branch run it agrees with, and the token after); None while `known`
    is too short to tell.

    Args:
        branches (list[list[int]]): the branches the forward would verify.
        known (list[int]): the answer's tokens after the forward's start, as far as they are known.
    """
    best = 0
    for branch in branches:
        matched = common_prefix_length(branch, known)
        if matched == len(known) < len(branch):
            return None  # the answer has not yet gone past this branch's match
        best = max(best, matched)
    return best + 1


@dataclass
class Pending:
    """An earlier forward: where the answer stood, and each option's branches and width there."""

    start: int
    branches: list[list[list[int]]]
    widths: list[int]


class CostChooser:
    """Wraps one update's proposer (module docstring); `branches` is what the engine verifies."""

    def __init__(self, proposer: BranchProposer, policy: LookupPolicy) -> None:
        self.proposer = proposer
        self.costs = policy.costs  # relative cost of a forward of width w at index w - 1
        self.options = options(policy)
        self.tokens = [0.0] * len(self.options)
        self.spent = [0.0] * len(self.options)
        self.pending: list[Pending] = []

    def cost(self, width: int) -> float:
        """What a forward of `width` tokens costs, in one-token steps (past the table's widest: the widest's).

        Args:
            width (int): the forward's width in tokens.
        """
        return self.costs[min(width, len(self.costs)) - 1]

    def _settle(self, answer: list[int]) -> None:
        still = []
        for forward in self.pending:
            known = answer[forward.start :]
            gains = [settled_gain(branches, known) if branches else 1 for branches in forward.branches]
            if any(gain is None for gain in gains):
                still.append(forward)
                continue
            for index, (gain, forward_width) in enumerate(zip(gains, forward.widths)):
                self.tokens[index] += gain
                self.spent[index] += self.cost(forward_width)
        self.pending = still

    def branches(self, answer: list[int], budget: int) -> list[list[int]]:
        """The branches of the option with the most settled tokens per unit of cost.

        Args:
            answer (list[int]): the answer so far.
            budget (int): the most tokens a branch may propose.
        """
        self._settle(answer)
        candidates = self.proposer.branches(answer, budget)
        if not candidates:
            return []
        branches = [cut(candidates, option) for option in self.options]
        self.pending.append(Pending(len(answer), branches, [width(b) for b in branches]))
        if not any(self.spent):
            return branches[-1]
        rates = [tokens / spent for tokens, spent in zip(self.tokens, self.spent)]
        return branches[max(range(len(rates)), key=lambda index: (rates[index], -index))]
