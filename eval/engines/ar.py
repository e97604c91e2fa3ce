"""The autoregressive streaming engine: verify a draft in one forward, keep the
accepted prefix, regenerate the rest (PROTOCOL.md, "The procedure").

One `update` serves every case: the baseline is an update with no draft and an
empty cache, a drafting step is an update while the user is still typing, and
the residual phase is the update at submission. The KV cache of the request is
reused across updates: it is cropped to the longest common token prefix of what
it holds and what the next pass needs, so only new tokens are fed.

Regeneration is `plain` (one token per forward) or `lookup` (blocks proposed by
`eval.engines.lookup`, each verified in one forward); the state says which, so
the plain baseline, the lookup baseline and the stream share this code.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from eval.engines.base import StreamingEngine, UpdateResult, crop_cache, decoder_config, keep_cache_positions, new_cache
from eval.engines.decode import DecodeSpec
from eval.engines.lookup import AnyProposer, update_proposer
from eval.engines.lookup_policy import LookupPolicy
from eval.engines.token_tree import TokenTree
from eval.engines.tokens import common_prefix_length, reused_prefix, through_first_eos
from eval.engines.tree_mask import tree_masks


@dataclass
class DecodeState:
    """What the engine holds for one request between updates."""

    cache: DynamicCache
    lookup: LookupPolicy | None = None  # None: plain regeneration
    cached_ids: list[int] = field(default_factory=list)
    draft: list[int] = field(default_factory=list)
    earlier_drafts: list[list[int]] = field(default_factory=list)  # newest first


def proposal_outcome(proposal: list[int], kept: int) -> str:
    """How a lookup proposal fared: 'none' proposed, 'wrong', 'partial' or 'full'.

    Args:
        proposal (list[int]): the proposed tokens.
        kept (int): how many of them the verify pass kept.
    """
    if not proposal:
        return "none"
    return "wrong" if kept == 0 else "full" if kept == len(proposal) else "partial"


class AREngine(StreamingEngine):
    """Greedy decoding with draft verification for one causal LM at batch size 1."""

    def __init__(self, model: PreTrainedModel, eos_token_ids: set[int], decode: DecodeSpec) -> None:
        super().__init__(model, eos_token_ids, decode)
        self.proposals: Counter[str] = Counter()  # regeneration forwards by proposal_outcome
        self.tree_widths: Counter[int] = Counter()  # token-tree forwards by number of nodes
        self.decoder_config = decoder_config(model)  # the layer types and window a tree's masks follow

    def new_state(self, lookup: bool = True) -> DecodeState:
        """A fresh request; `lookup=False` regenerates plainly whatever the decode settings say.

        Args:
            lookup (bool): decode with lookup when the decode settings ask for it; False: plainly.
        """
        policy = self.spec.lookup if lookup else None
        return DecodeState(cache=new_cache(self.model), lookup=policy)

    def baseline(self, prompt_ids: list[int]) -> UpdateResult:
        """Plain greedy decoding of S_n from scratch: what a user gets without streaming.

        Args:
            prompt_ids (list[int]): the complete request's prompt, S_n.
        """
        return self.update(self.new_state(lookup=False), prompt_ids, ("baseline", "baseline"))

    def lookup_baseline(self, prompt_ids: list[int]) -> UpdateResult:
        """The lookup decoder on S_n from scratch, the request its only source:
        what streaming adds beyond lookup decoding.

        Args:
            prompt_ids (list[int]): the complete request's prompt, S_n.
        """
        return self.update(self.new_state(), prompt_ids, ("lookup_baseline", "lookup_baseline"))

    @torch.inference_mode()
    def forward(
        self, state: DecodeState, token_ids: list[int], phase: str | None, logits_to_keep: int = 1, **tree_inputs
    ) -> torch.Tensor:
        """Feed `token_ids` after the cached ones; logits of the last `logits_to_keep`
        positions. Counted under `phase` (None: set-up work outside any measurement).
        `tree_inputs`: a token tree's position ids and attention mask.

        Args:
            state (DecodeState): the request's decoding state, whose cache grows.
            token_ids (list[int]): the tokens to feed.
            phase (str | None): the phase the forward is counted and timed under, or None.
            logits_to_keep (int): how many last positions' logits to return.
            tree_inputs: `position_ids` and `attention_mask` of a token tree's forward, or nothing for a chain.
        """
        input_ids = torch.tensor([token_ids], device=self.model.device)
        output = self.model(
            input_ids=input_ids, past_key_values=state.cache, use_cache=True, logits_to_keep=logits_to_keep, **tree_inputs
        )
        if phase:
            self.forwards[phase] += 1
        state.cached_ids.extend(token_ids)
        return output.logits[0].float()

    def prime(self, state: DecodeState, prompt_ids: list[int], draft: list[int],
              earlier_drafts: list[list[int]] = ()) -> None:
        """Put the engine where it stands after drafting `draft` for `prompt_ids`
        (cache over prompt + draft minus its last token), without counting.

        Args:
            state (DecodeState): the request's decoding state.
            prompt_ids (list[int]): the prompt the draft was written for.
            draft (list[int]): the draft the engine holds afterwards.
            earlier_drafts (list[list[int]]): the drafts before it, newest first, for lookup.
        """
        self.crop(state, 0)
        self.forward(state, prompt_ids + draft[:-1], phase=None)
        state.draft = list(draft)
        state.earlier_drafts = [list(d) for d in earlier_drafts]

    def update(self, state: DecodeState, prompt_ids: list[int], phases: tuple[str, str]) -> UpdateResult:
        """Verify the held draft against `prompt_ids`, accept, regenerate: the new draft.

        Args:
            state (DecodeState): the request's decoding state.
            prompt_ids (list[int]): the prompt as known now, S_i.
            phases (tuple[str, str]): the phases the verify pass and the regeneration are counted under.
        """
        verify_phase, regenerate_phase = phases
        clock, calls_before = self.stopwatch(), sum(self.forwards.values())
        draft = state.draft
        sequence = prompt_ids + draft
        reuse = reused_prefix(state.cached_ids, prompt_ids, draft)
        self.crop(state, reuse)
        logits = self.forward(state, sequence[reuse:], verify_phase, logits_to_keep=len(draft) + 1)
        accepted = self.rule.accepted_length(logits[:-1], draft)
        answer = draft[:accepted]
        if accepted < len(draft) or not self.finished(answer):
            self.crop(state, len(prompt_ids) + accepted)
            proposer = update_proposer(state.lookup, draft[accepted:], state.earlier_drafts, prompt_ids, self.eos_token_ids)
            answer = self._regenerate(state, len(prompt_ids), answer + [int(logits[accepted].argmax())],
                                      regenerate_phase, proposer)
        if draft:
            state.earlier_drafts.insert(0, draft)
        state.draft = answer
        return self._result(answer, draft, accepted, calls_before, clock)

    def _regenerate(
        self, state: DecodeState, prompt_length: int, answer: list[int], phase: str, proposer: AnyProposer | None
    ) -> list[int]:
        """Greedy decoding after `answer` (whose last token is not yet fed), one
        block per forward: the proposal's run that greedy would produce, plus the
        token the forward yields. The cache ends over prompt + answer[:-1]."""
        while not self.finished(answer):
            branches = proposer.branches(answer, self.max_new_tokens - len(answer) - 1) if proposer else []
            added = self._tree_step(state, answer, TokenTree.from_branches(branches), phase) if len(branches) > 1 \
                else self._chain_step(state, answer, branches[0] if branches else [], phase)
            answer = through_first_eos(answer + added, self.eos_token_ids)  # a stop string may straddle the two
            self.crop(state, prompt_length + len(answer) - 1)
        return answer

    def _chain_step(self, state: DecodeState, answer: list[int], proposal: list[int], phase: str) -> list[int]:
        """One forward over (last token, proposal): the run of the proposal greedy decoding
        produces and the token after it."""
        logits = self.forward(state, answer[-1:] + proposal, phase, logits_to_keep=len(proposal) + 1)
        predicted = logits.argmax(-1).tolist()
        kept = common_prefix_length(proposal, predicted)
        self.proposals[proposal_outcome(proposal, kept)] += 1
        return proposal[:kept] + [predicted[kept]]

    def _tree_step(self, state: DecodeState, answer: list[int], tree: TokenTree, phase: str) -> list[int]:
        """One forward over the last token and the tree's nodes: the path greedy decoding agrees
        with and the token after it; the cache keeps that path's KV only."""
        past, device, depths = len(state.cached_ids), self.model.device, tree.depths()
        positions = torch.tensor([[past, *(past + depth for depth in depths)]], device=device)
        masks = tree_masks(self.decoder_config, tree, depths, past, self.model.dtype, device)
        logits = self.forward(state, answer[-1:] + tree.tokens, phase, logits_to_keep=len(tree.tokens) + 1,
                              position_ids=positions, attention_mask=masks)
        self.tree_widths[len(tree.tokens)] += 1
        predicted = logits.argmax(-1).tolist()
        path = tree.accepted_path(predicted)
        keep_cache_positions(state.cache, [*range(past + 1), *(past + 1 + node for node in path)])
        accepted = [tree.tokens[node] for node in path]
        state.cached_ids[past + 1 :] = accepted
        self.proposals["full" if len(path) == max(depths) else "partial" if path else "wrong"] += 1
        return accepted + [predicted[path[-1] + 1 if path else 0]]

    @staticmethod
    def crop(state: DecodeState, length: int) -> None:
        """Cut the state's cache back to its first `length` tokens.

        Args:
            state (DecodeState): the request's decoding state.
            length (int): how many cached tokens to keep.
        """
        crop_cache(state.cache, state.cached_ids, length)
