"""Draft-guided regeneration (PROTOCOL.md, `regenerate=lookup`).

After the verify pass keeps k draft tokens, the rest of the answer is decoded in
blocks: the answer's last n tokens (n = `max_ngram` down to 1) are looked up in
the sources, in order (the unaccepted tail of the held draft, the earlier drafts,
newest first, then the request), and the tokens that followed the match are
proposed. One forward over (last token, proposal) keeps the longest run of the
proposal that greedy decoding would produce, plus the token the forward yields.
So the answer is the greedy one, token for token, and a forward is never worth
less than a plain step; a regenerated answer that re-joins the stale draft after
a renamed variable or an inserted line costs one forward per block.

The same code computes the forwards of an update from token sequences alone
(`update_cost`), which the fast path uses for the drafting it batches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eval.engines.cost_choice import CostChooser
from eval.engines.lookup_policy import LookupPolicy
from eval.engines.suffix_index import SuffixIndex
from eval.engines.token_tree import TokenTree, TreeProposer, tree_matched
from eval.engines.tokens import answer_finished, common_prefix_length, through_first_eos

if TYPE_CHECKING:
    from eval.engines.decode import DecodeSpec

class ChainProposer:
    """A proposer of one continuation per forward (`propose`), seen as a one-branch tree."""

    def propose(self, answer: list[int], budget: int) -> list[int]:
        """Up to `budget` tokens to verify after `answer` (none: decode plainly).

        Args:
            answer (list[int]): the answer so far.
            budget (int): the most tokens to propose.
        """
        raise NotImplementedError

    def branches(self, answer: list[int], budget: int) -> list[list[int]]:
        """The proposal as a one-branch tree (none when nothing is proposed).

        Args:
            answer (list[int]): the answer so far.
            budget (int): the most tokens to propose.
        """
        proposal = self.propose(answer, budget)
        return [proposal] if proposal else []


class LongestMatchProposer(ChainProposer):
    """Proposes what followed the longest context match in the sources (`SuffixIndex`); the
    answer's walk through the index is kept between calls of one update (the answer only grows)."""

    def __init__(self, sources: list[list[int]], policy: LookupPolicy, eos_token_ids: set[int]) -> None:
        self.index = SuffixIndex(sources)
        self.policy = policy
        self.eos_token_ids = eos_token_ids
        self.walked: list[int] = []
        self.state, self.matched = 0, 0

    def _walk(self, answer: list[int]) -> None:
        if answer[: len(self.walked)] != self.walked:  # another answer: walk it from the start
            self.walked, self.state, self.matched = [], 0, 0
        for token in answer[len(self.walked):]:
            self.state, self.matched = self.index.step(self.state, self.matched, token)
        self.walked = list(answer)

    def propose(self, answer: list[int], budget: int) -> list[int]:
        """Up to min(proposal length, budget) tokens to verify after `answer`; cut at a source's
        end and after an EOS.

        Args:
            answer (list[int]): the answer so far.
            budget (int): the most tokens to propose.
        """
        if budget <= 0:
            return []
        self._walk(answer)
        follow, context = self.index.continuation(self.state, self.matched, self.policy.min_ngram)
        if follow < 0:
            return []
        limit = min(self.policy.proposal_length(context), budget)
        return through_first_eos(self.index.tokens_after(follow, limit), self.eos_token_ids)

class Proposer(ChainProposer):
    """N-gram lookup over a fixed list of sources. Each source is indexed once:
    n-gram -> the position after its chosen occurrence (one with a token after it)."""

    def __init__(self, sources: list[list[int]], policy: LookupPolicy, eos_token_ids: set[int]) -> None:
        self.sources = [source for source in sources if len(source) > 1]
        self.policy = policy
        self.eos_token_ids = eos_token_ids
        self.indexes = [self._index(source) for source in self.sources]

    def _index(self, source: list[int]) -> dict[tuple[int, ...], int]:
        index: dict[tuple[int, ...], int] = {}
        keep_first = self.policy.occurrence == "first"
        for n in range(self.policy.min_ngram, self.policy.max_ngram + 1):
            for start in range(len(source) - n):  # a match must have a token after it
                key = tuple(source[start : start + n])
                if not keep_first or key not in index:
                    index[key] = start + n
        return index

    def propose(self, answer: list[int], budget: int) -> list[int]:
        """Up to min(block, budget) tokens to verify after `answer`; cut after an EOS.

        Args:
            answer (list[int]): the answer so far.
            budget (int): the most tokens to propose.
        """
        limit = min(self.policy.block, budget)
        if limit <= 0:
            return []
        for n in range(min(self.policy.max_ngram, len(answer)), self.policy.min_ngram - 1, -1):
            key = tuple(answer[-n:])
            for source, index in zip(self.sources, self.indexes):
                follow = index.get(key)
                if follow is not None:
                    return through_first_eos(source[follow : follow + limit], self.eos_token_ids)
        return []

AnyProposer = Proposer | LongestMatchProposer | TreeProposer | CostChooser


def update_proposer(
    policy: LookupPolicy | None,
    held_tail: list[int],
    earlier_drafts: list[list[int]],
    prompt_ids: list[int],
    eos_token_ids: set[int],
) -> AnyProposer | None:
    """The lookup of one update: the unaccepted tail of the held draft, the earlier
    drafts (newest first), then the request, searched in that order. None: plain.

    Args:
        policy (LookupPolicy | None): the lookup policy, or None for plain decoding.
        held_tail (list[int]): the held draft's tokens after those accepted.
        earlier_drafts (list[list[int]]): the request's earlier drafts, newest first.
        prompt_ids (list[int]): the prompt as known now.
        eos_token_ids (set[int]): the ids that end an answer.
    """
    if policy is None:
        return None
    proposer = TreeProposer if policy.tree > 1 else LongestMatchProposer if policy.match == "longest" else Proposer
    candidates = proposer([held_tail, *earlier_drafts, prompt_ids], policy, eos_token_ids)
    return CostChooser(candidates, policy) if policy.choice == "cost" else candidates


class HeldDraftProposer:
    """The proposals of one whole update, one forward at a time, for an engine that verifies a
    few tokens per forward (vLLM's speculative decoding, eval.serving): while the answer follows
    the held draft, the draft's next tokens (the verify pass, cut to the budget); once it breaks
    from it, `update_proposer`'s lookup over the draft's unaccepted tail, the earlier drafts and
    the request, exactly as the evaluator regenerates after its verify pass. Chains only: a
    tree's first branch is its best one."""

    def __init__(self, policy: LookupPolicy | None, held: list[int], earlier: list[list[int]], prompt_ids: list[int],
                 eos_token_ids: set[int]) -> None:
        self.policy = policy
        self.held = held
        self.earlier = earlier
        self.prompt_ids = prompt_ids
        self.eos_token_ids = eos_token_ids
        self.accepted: int | None = None  # where the answer broke from the held draft, once it has
        self.lookup: AnyProposer | None = None

    def propose(self, answer: list[int], budget: int) -> list[int]:
        """Up to `budget` tokens to verify after `answer`.

        Args:
            answer (list[int]): the answer so far.
            budget (int): the most tokens to propose.
        """
        if budget <= 0:
            return []
        if self.accepted is None:
            followed = common_prefix_length(answer, self.held)
            if followed == len(answer) and followed < len(self.held):
                return through_first_eos(self.held[followed : followed + budget], self.eos_token_ids)
            self.accepted = followed
            self.lookup = update_proposer(self.policy, self.held[followed:], self.earlier, self.prompt_ids,
                                          self.eos_token_ids)
        branches = self.lookup.branches(answer, budget) if self.lookup else []
        return branches[0][:budget] if branches else []


def regeneration_widths(answer: list[int], start: int, proposer: AnyProposer | None, max_new_tokens: int) -> list[int]:
    """The tokens fed by each forward after the verify pass that decodes `answer[start + 1:]`
    (the verify pass yields `answer[start]`), when `answer` is what greedy decoding produces.

    Args:
        answer (list[int]): the answer greedy decoding produces.
        start (int): the index of the token the verify pass yields.
        proposer (AnyProposer | None): the update's proposer, or None for plain decoding.
        max_new_tokens (int): the most tokens an answer may have.
    """
    length, widths = start + 1, []
    while length < len(answer):
        branches = proposer.branches(answer[:length], max_new_tokens - length - 1) if proposer else []
        matched = tree_matched(branches, answer[length:])
        length = min(length + matched + 1, len(answer))
        widths.append(1 + len(TokenTree.from_branches(branches).tokens))
    return widths


def update_widths(
    held: list[int], answer: list[int], accepted: int, earlier: list[list[int]], prompt_ids: list[int],
    decode: DecodeSpec, eos_token_ids: set[int],
) -> list[int]:
    """The tokens fed by each forward after the verify pass of the update that held `held`
    (earlier drafts `earlier`, newest first), kept `accepted` tokens of it and ended with
    `answer`, computed from the tokens: none when the whole draft was kept and it was
    finished, else the regeneration's (`regeneration_widths`).

    Args:
        held (list[int]): the draft the update held.
        answer (list[int]): the answer it ended with.
        accepted (int): how many tokens of `held` it kept.
        earlier (list[list[int]]): the drafts before `held`, newest first.
        prompt_ids (list[int]): the update's prompt.
        decode (DecodeSpec): the decode settings.
        eos_token_ids (set[int]): the ids that end an answer.
    """
    if accepted == len(held) and answer_finished(held, eos_token_ids, decode.max_new_tokens):
        return []
    proposer = update_proposer(decode.lookup, held[accepted:], earlier, prompt_ids, eos_token_ids)
    return regeneration_widths(answer, accepted, proposer, decode.max_new_tokens)


def update_cost(
    held: list[int], answer: list[int], accepted: int, earlier: list[list[int]], prompt_ids: list[int],
    decode: DecodeSpec, eos_token_ids: set[int],
) -> int:
    """Forwards of that update (`update_widths`), its verify pass included: what
    `AREngine.update` executes.

    Args:
        held (list[int]): the draft the update held.
        answer (list[int]): the answer it ended with.
        accepted (int): how many tokens of `held` it kept.
        earlier (list[list[int]]): the drafts before `held`, newest first.
        prompt_ids (list[int]): the update's prompt.
        decode (DecodeSpec): the decode settings.
        eos_token_ids (set[int]): the ids that end an answer.
    """
    return 1 + len(update_widths(held, answer, accepted, earlier, prompt_ids, decode, eos_token_ids))
