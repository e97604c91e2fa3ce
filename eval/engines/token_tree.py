"""Token-tree proposals (`decode.lookup_tree`): several continuations verified in one forward.

The candidates are the occurrences in the sources of the answer's last tokens, ranked by the
length of their matching context (longest first, ties by source order: `lookup_match=longest`'s
order, so its first branch is that proposer's proposal). With `lookup_realign` R, candidates that
resume a source where the answer broke from it follow: the answer before its last d tokens
(d = 1..R) ends at a source position with a matching context, and the source is resumed s = 0..R+1
tokens after it (s = 0: the answer inserted d tokens; s = d: it replaced them, a renamed variable),
fewest edits (d + s) first. Context matching alone cannot see these: the answer's last token
occurs nowhere or somewhere else. The first `lookup_tree` distinct continuations form a trie.
One forward over the answer's last token and the trie's nodes, each node attending to the cache
and to its own ancestors at the position of its depth, gives greedy decoding's next token after
every node; the longest root-to-node path that greedy decoding agrees with is kept (its KV only),
with the token the forward yields after it. Counted as one forward whatever its width
(PROTOCOL.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eval.engines.lookup_policy import LookupPolicy
from eval.engines.suffix_index import JoinedSources
from eval.engines.tokens import common_prefix_length, through_first_eos

ROOT = -1  # a node's parent when it follows the answer's last token
# Occurrences of the answer's head (the answer less its last d tokens) resumed, longest context
# first: two, the fewest that kept the realigned tree's speedup on recorded drafts.
REALIGNED_OCCURRENCES = 2


@dataclass
class TokenTree:
    """A trie of proposals, flattened: node i holds `tokens[i]` after node `parents[i]`
    (parents come before their children)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)

    @classmethod
    def from_branches(cls, branches: list[list[int]]) -> TokenTree:
        """The trie of `branches`, shared prefixes one path.

        Args:
            branches (list[list[int]]): the continuations, each a list of token ids.
        """
        tree = cls()
        children: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        for branch in branches:
            parent = ROOT
            for token in branch:
                if (parent, token) not in children:
                    children[(parent, token)] = len(tree.tokens)
                    tree.tokens.append(token)
                    tree.parents.append(parent)
                parent = children[(parent, token)]
        return tree

    def depths(self) -> list[int]:
        """Each node's distance from the root (1 for the root's children)."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent == ROOT else depths[parent] + 1)
        return depths

    def accepted_path(self, predicted: list[int]) -> list[int]:
        """The nodes of the longest path greedy decoding agrees with, root first:
        `predicted[0]` is greedy's token after the root, `predicted[i + 1]` after node i.

        Args:
            predicted (list[int]): greedy's token after the root and after each node.
        """
        path: list[int] = []
        current = ROOT
        for node, (token, parent) in enumerate(zip(self.tokens, self.parents)):
            if parent == current and token == predicted[current + 1]:
                path.append(node)
                current = node
        return path


def tree_matched(branches: list[list[int]], rest: list[int]) -> int:
    """Tokens of `rest` the tree's best branch proposes in order (what one forward keeps).

    Args:
        branches (list[list[int]]): the tree's branches.
        rest (list[int]): the tokens greedy decoding goes on with.
    """
    return max((common_prefix_length(branch, rest) for branch in branches), default=0)


class TreeProposer:
    """The best few continuations in the sources by matching context (module docstring)."""

    def __init__(self, sources: list[list[int]], policy: LookupPolicy, eos_token_ids: set[int]) -> None:
        self.index = JoinedSources(sources)
        self.policy = policy
        self.eos_token_ids = eos_token_ids
        self.after: dict[int, list[int]] = {}  # token -> positions it holds with a real token after it
        text = self.index.text
        for position in range(len(text) - 1):
            if text[position] >= 0 and text[position + 1] >= 0:
                self.after.setdefault(text[position], []).append(position)

    def _context(self, answer: list[int], position: int) -> int:
        text, context = self.index.text, 0
        while context < len(answer) and context <= position and text[position - context] == answer[-1 - context]:
            context += 1
        return context

    def _ranked(self, answer: list[int]) -> list[tuple[int, int]]:
        """(context, position) of every occurrence of the answer's last token with a token after
        it, longest context first, ties by source order and position."""
        ranked = sorted((-self._context(answer, position), position) for position in self.after.get(answer[-1], ()))
        return [(-negative_context, position) for negative_context, position in ranked]

    def _realigned(self, answer: list[int]) -> list[tuple[int, int]]:
        """(context, start) of the realignment candidates (module docstring), fewest edits first."""
        found = []
        for inserted in range(1, min(self.policy.realign, len(answer) - 1) + 1):
            ranked = self._ranked(answer[:-inserted])[:REALIGNED_OCCURRENCES]
            for context, position in ranked:
                if context < self.policy.min_ngram:
                    break
                for skipped in range(self.policy.realign + 2):
                    start = position + 1 + skipped
                    if self.index.text[start] < 0:  # the source's end: skipping further would enter the next one
                        break
                    found.append((inserted + skipped, -context, inserted, position, start))
        return [(-negative_context, start) for _, negative_context, _, _, start in sorted(found)]

    def branches(self, answer: list[int], budget: int) -> list[list[int]]:
        """Up to `policy.tree` distinct continuations, best first, each at most the proposal
        length its context earns and `budget`; cut at a source's end and after an EOS.

        Args:
            answer (list[int]): the answer so far.
            budget (int): the most tokens a branch may propose.
        """
        if budget <= 0 or not answer:
            return []
        chosen: list[list[int]] = []
        self._take(chosen, [(context, position + 1) for context, position in self._ranked(answer)
                            if context >= self.policy.min_ngram], budget)
        if self.policy.realign and len(chosen) < self.policy.tree:
            self._take(chosen, self._realigned(answer), budget)
        return chosen

    def _take(self, chosen: list[list[int]], candidates: list[tuple[int, int]], budget: int) -> None:
        """Add the continuations at each (context, start) in turn, until the tree is full; one a
        chosen branch already covers adds nothing."""
        for context, start in candidates:
            if len(chosen) == self.policy.tree:
                return
            limit = min(self.policy.proposal_length(context), budget)
            branch = through_first_eos(self.index.tokens_after(start, limit), self.eos_token_ids)
            if branch and not any(taken[: len(branch)] == branch for taken in chosen):
                chosen.append(branch)
