"""The speculative proposer vLLM loads (`speculative_config={"method": "custom_class", "model":
"eval.serving.proposer.DraftProposer"}`), and the board of live requests' drafts it reads.

How a row of vLLM's batch finds its drafts (the design choice, and why): vLLM hands the proposer
the token ids of each running request (prompt, then output) and nothing else, not its request id.
So every request is posted on the `BOARD` before it reaches the engine, with its prompt ids, and a
row is matched to the posted prompt it begins with (the longest, when one prompt begins another),
once; later steps only check that the row still begins with it (a finished request's row is
reused, and a request may move to a freed row). The board is a module global: the engine loop
(eval.serving.engine_worker) posts and removes entries between steps in the thread that runs the
model, so no lock is needed, and it needs the model runner in the engine loop's process (vLLM's
"uni" executor). Two live requests
with the same prompt may swap drafts: proposals only decide how many tokens a step settles,
never which (vLLM keeps a proposed token only where greedy decoding yields it).

What is proposed is `eval.engines.lookup.HeldDraftProposer`: the evaluator's own verify pass and
lookup regeneration, one home for the policy. This module imports nothing that needs torch or
transformers beyond numpy: it runs inside the vLLM environment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eval.engines.lookup import HeldDraftProposer
from eval.engines.lookup_policy import LookupPolicy


@dataclass
class Posting:
    """One live request: its prompt, its proposer (None: proposes nothing) and what it was proposed."""

    prompt: np.ndarray
    proposer: HeldDraftProposer | None
    proposed: int = 0  # tokens proposed, over all steps
    accepted: int = 0  # of which vLLM kept
    verifications: int = 0  # steps that verified a proposal
    pending: int = 0  # tokens proposed at the last step, not yet verified
    request_id: str = ""

    max_tokens: int = 0  # the request's answer cap: nothing is proposed past it

    def stats(self) -> dict[str, int]:
        """The counts of the verified proposals (the last one, made at the step that ended the request, never was)."""
        return {"proposed": self.proposed - self.pending, "accepted": self.accepted, "verifications": self.verifications}


@dataclass
class DraftBoard:
    """The live requests' drafts, by request id; `policy` and `eos_token_ids` are the engine's."""

    postings: dict[str, Posting] = field(default_factory=dict)
    policy: LookupPolicy | None = None
    eos_token_ids: set[int] = field(default_factory=set)
    rows: dict[int, Posting] = field(default_factory=dict)

    def post(self, request_id: str, prompt: list[int], max_tokens: int, sources: dict[str, Any] | None) -> None:
        """A request about to be added: `sources` {"held": draft, "earlier": [draft, ...] newest first,
        "policy": the lookup policy's fields, null for none (the held draft, then plain decoding),
        absent for the engine's}, or None for a request that gets no proposals (plain decoding).

        Args:
            request_id (str): the request's id.
            prompt (list[int]): the prompt's token ids.
            max_tokens (int): the most tokens the answer may have.
            sources (dict[str, Any] | None): the drafts to propose from, or None.
        """
        proposer = None
        if sources is not None:
            policy = self.policy
            if "policy" in sources:
                policy = LookupPolicy(**sources["policy"]) if sources["policy"] else None
            proposer = HeldDraftProposer(policy, list(sources.get("held") or []),
                                         [list(d) for d in sources.get("earlier") or []], list(prompt), self.eos_token_ids)
        self.postings[request_id] = Posting(np.asarray(prompt, dtype=np.int64), proposer, request_id=request_id,
                                            max_tokens=max_tokens)

    def remove(self, request_id: str) -> dict[str, int]:
        """Take a finished or aborted request off the board; its proposal counts.

        Args:
            request_id (str): the request's id.
        """
        posting = self.postings.pop(request_id, None)
        if posting is None:
            return {"proposed": 0, "accepted": 0, "verifications": 0}
        self.rows = {row: known for row, known in self.rows.items() if known is not posting}
        return posting.stats()

    def posting_of(self, row: int, tokens: np.ndarray, taken: set[int]) -> Posting | None:
        """The posting whose prompt row `row` (its tokens so far `tokens`) begins with, not one in
        `taken` (already matched to another row at this step). The row's posting of the last step
        is checked first: vLLM moves a request to another row only when rows free up.

        Args:
            row (int): the request's row in vLLM's batch.
            tokens (np.ndarray): the row's tokens so far.
            taken (set[int]): postings already matched to other rows at this step.
        """
        known = self.rows.get(row)
        if known is not None and id(known) not in taken and _begins_with(tokens, known.prompt) and \
                self.postings.get(known.request_id) is known:
            return known
        matches = [p for p in self.postings.values() if id(p) not in taken and _begins_with(tokens, p.prompt)]
        if not matches:
            self.rows.pop(row, None)
            return None
        chosen = max(matches, key=lambda p: len(p.prompt))
        self.rows[row] = chosen
        return chosen


def _begins_with(tokens: np.ndarray, prompt: np.ndarray) -> bool:
    return len(prompt) < len(tokens) and bool(np.array_equal(tokens[: len(prompt)], prompt))


BOARD = DraftBoard()
logger = logging.getLogger(__name__)


class DraftProposer:
    """vLLM's custom proposer: for each running request, the next tokens its posting proposes. A
    proposer that fails proposes nothing more for its request: the step, and every other request in
    it, go on (a proposal never decides an answer)."""

    def __init__(self, vllm_config: Any) -> None:
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: the proposals come from drafts.

        Args:
            args (Any): what vLLM passes, unused.
            kwargs (Any): what vLLM passes, unused.
        """

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None) -> list[list[int]]:
        """For each row of vLLM's batch, the next tokens its posting proposes (none without a posting).

        Args:
            sampled_token_ids (list[list[int]]): the tokens each row sampled at this step (none: the row is not
                decoding).
            num_tokens_no_spec (np.ndarray): each row's token count, proposals left out.
            token_ids_cpu (np.ndarray): each row's tokens.
            slot_mappings (Any): vLLM's slot mappings, unused.
        """
        proposals: list[list[int]] = []
        taken: set[int] = set()
        for row, sampled in enumerate(sampled_token_ids):
            length = int(num_tokens_no_spec[row])
            posting = BOARD.posting_of(row, token_ids_cpu[row, :length], taken) if sampled else None
            if posting is None:
                proposals.append([])
                continue
            taken.add(id(posting))
            if posting.pending:  # the step just run verified it: all but the last sampled token were proposals
                posting.accepted += min(len(sampled) - 1, posting.pending)
                posting.verifications += 1
                posting.pending = 0
            answered = length - len(posting.prompt)
            budget = min(self.k, self.max_model_len - length - 1, posting.max_tokens - answered - 1)
            proposal = self._proposal(posting, token_ids_cpu[row, len(posting.prompt) : length].tolist(), budget)
            posting.pending = len(proposal)
            posting.proposed += len(proposal)
            proposals.append(proposal)
        return proposals

    @staticmethod
    def _proposal(posting: Posting, answer: list[int], budget: int) -> list[int]:
        if posting.proposer is None or budget <= 0:
            return []
        try:
            return [int(token) for token in posting.proposer.propose(answer, budget)][:budget]
        except Exception:  # noqa: BLE001 - logged; the request decodes on without proposals
            logger.exception("the draft proposer of request %s failed; it proposes nothing more", posting.request_id)
            posting.proposer = None
            return []
