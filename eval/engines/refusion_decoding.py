"""The ReFusion streaming engine: slot plan-and-infill decoding, and the streaming
update that blanks the rejected part of a draft and infills it (PROTOCOL.md,
"Slot diffusion models ... blank the rejected part with mask tokens").

ReFusion is a causal LM (Qwen3) trained with slot masking: fed a mask token at a
true position, it predicts the token at that position. The answer buffer is a
grid of fixed-width slots with fixed true positions, decoded in any slot order:

1. plan: one forward over every undecided slot of the current block as masks
   picks the slots whose first token is confident (else the single most
   confident one), and drafts their tokens;
2. verify: one causal forward over the chosen slots' drafts, concatenated in
   position order; a leading run covering whole slots (or an EOS) is committed
   with the KV it just produced;
3. otherwise infill: each chosen slot is completed in its own batch row by
   predict (masks after the accepted prefix) / verify (causal) rounds, and each
   row's KV is spliced into the cache as its own row computed it, so slots
   infilled together never see each other (`decode.infill_kv=splice`, upstream's
   `generate_refusion`; `refeed` feeds them again instead, an earlier variant).

The model always runs with explicit position ids and ordinary causal attention
over the fed order, so the context is the prompt and then the committed tokens
in COMMIT order, each at its true position; sorting them by position gives the
answer. Committed tokens not yet in the KV cache are "pending": they are fed at
the start of the next forward, never in a forward of their own.

Streaming (`update`): the held draft is verified in one causal forward after the
prompt alone, so no draft token is ever visible to the position that judges it
(with `draft_in_context`, the draft precedes the answer only while it is decoded).
With `draft_end=decode` the draft is judged without its EOS, so the answer's end
is decoded by at least one plan and one verify forward: 3 residual forwards at
least, the floor the paper reports for ReFusion-8B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from eval.engines.base import StreamingEngine, UpdateResult, append_to_cache, crop_cache, new_cache, set_cache_batch
from eval.engines.decode import DecodeSpec
from eval.engines.tokens import common_prefix_length, leading_run

# A fed token and its true position id: the KV cache holds a sequence of these.
Pair = tuple[int, int]
# Marks a spliced infill entry in `SlotState.cached`: its KV did not see the rows infilled beside it,
# so it is never what a causal pass over the same pairs gives, and a later forward must not reuse it.
SPLICED = "spliced"


@dataclass
class SlotState:
    """What the engine holds for one request between updates."""

    cache: DynamicCache
    cached: list[Pair | tuple[int, int, str]] = field(default_factory=list)  # SPLICED entries: three items
    draft: list[int] = field(default_factory=list)


@dataclass
class _Decoding:
    """One plan-and-infill decode of the answer buffer."""

    pending: list[Pair]
    committed: dict[int, int] = field(default_factory=dict)  # position -> token
    eos_position: int | None = None  # of the first committed EOS: decoding stops after its block

    def commit(self, tokens: list[int], positions: list[int], cached: bool, eos: set[int]) -> None:
        for token, position in zip(tokens, positions):
            self.committed[position] = token
            if token in eos and (self.eos_position is None or position < self.eos_position):
                self.eos_position = position
        if not cached:
            self.pending.extend(zip(tokens, positions))


class RefusionEngine(StreamingEngine):
    """Plan-and-infill decoding with draft verification, at batch size 1 (the
    infill rows of one request aside)."""

    def __init__(self, model: PreTrainedModel, mask_token_id: int, eos_token_ids: set[int], decode: DecodeSpec) -> None:
        super().__init__(model, eos_token_ids, decode)
        self.mask_token_id = mask_token_id
        # Block width in slots, fixed by the full buffer; a residual decode after
        # an accepted prefix uses the same width (fewer blocks).
        full_slots = math.ceil(decode.max_new_tokens / decode.slot_size)
        self.block_slots = math.ceil(full_slots / min(decode.serial_blocks, full_slots))
        # The verify pass, then the plan and verify forwards that decode the answer's end.
        self.min_residual_forwards = 3 if decode.draft_end == "decode" else 1

    def new_state(self) -> SlotState:
        return SlotState(cache=new_cache(self.model))

    # ----------------------------------------------------------------- forwards

    @torch.inference_mode()
    def run(
        self, cache: DynamicCache, tokens: torch.Tensor, positions: torch.Tensor, phase: str | None, keep: int
    ) -> torch.Tensor:
        """One model call on `tokens` (batch, width) after the cache; float logits of
        the last `keep` positions of each row. Counted under `phase` (None: untimed
        set-up). A cache is always passed: without one, transformers would read a
        gap in the position ids as the start of another packed sequence.

        Args:
            cache (DynamicCache): the KV cache the call reads and extends.
            tokens (torch.Tensor): the token ids, (batch, width).
            positions (torch.Tensor): their position ids, (batch, width).
            phase (str | None): the phase the call is counted and timed under, or None.
            keep (int): how many last positions' logits to return.
        """
        output = self.model(
            input_ids=tokens.to(self.model.device),
            position_ids=positions.to(self.model.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=keep,
        )
        if phase:
            self.forwards[phase] += 1
        return output.logits.to(torch.promote_types(output.logits.dtype, torch.float32))  # float64 stays float64

    def feed(self, state: SlotState, pairs: list[Pair], phase: str | None, keep: int = 1) -> torch.Tensor:
        """Feed `pairs` after the cached ones (batch 1); logits of the last `keep`.

        Args:
            state (SlotState): the request's decoding state.
            pairs (list[Pair]): the (token, position) pairs to feed.
            phase (str | None): the phase the call is counted and timed under, or None.
            keep (int): how many last positions' logits to return.
        """
        tokens = torch.tensor([[t for t, _ in pairs]])
        positions = torch.tensor([[p for _, p in pairs]])
        logits = self.run(state.cache, tokens, positions, phase, keep)[0]
        state.cached.extend(pairs)
        return logits

    def forward(self, state: SlotState, token_ids: list[int], phase: str | None, logits_to_keep: int = 1) -> torch.Tensor:
        """AREngine's signature (the runner's warm-up): tokens at the next positions.

        Args:
            state (SlotState): the request's decoding state.
            token_ids (list[int]): the tokens to feed.
            phase (str | None): the phase the call is counted and timed under, or None.
            logits_to_keep (int): how many last positions' logits to return.
        """
        start = len(state.cached)
        return self.feed(state, list(zip(token_ids, range(start, start + len(token_ids)))), phase, logits_to_keep)

    @staticmethod
    def crop(state: SlotState, length: int) -> None:
        """Cut the state's cache back to its first `length` entries.

        Args:
            state (SlotState): the request's decoding state.
            length (int): how many cached entries to keep.
        """
        crop_cache(state.cache, state.cached, length)

    # ---------------------------------------------------------------- streaming

    def update(self, state: SlotState, prompt_ids: list[int], phases: tuple[str, str]) -> UpdateResult:
        """Verify the held draft in one causal forward after the prompt, keep its accepted
        leading run, blank the rest and infill it. With no draft this IS the baseline decode.

        Args:
            state (SlotState): the request's decoding state.
            prompt_ids (list[int]): the prompt as known now, S_i.
            phases (tuple[str, str]): the phases the verify pass and the infilling are counted under.
        """
        verify_phase, regenerate_phase = phases
        clock, calls_before = self.stopwatch(), sum(self.forwards.values())
        judged = self._judged(state.draft)
        accepted = 0
        if judged:
            logits = self.verify_draft(state, prompt_ids, judged, verify_phase)
            accepted = self.rule.accepted_length(logits, judged)
        answer = judged[:accepted]
        if not self.finished(answer):
            context = prompt_ids + self._draft_context(state.draft)
            answer = answer + self.decode(state, context, answer, regenerate_phase)
        state.draft = answer
        return self._result(answer, judged, accepted, calls_before, clock)

    def _judged(self, draft: list[int]) -> list[int]:
        """The draft tokens the verify pass judges: all, or (draft_end=decode) all but a final EOS."""
        if self.spec.draft_end == "decode" and draft and draft[-1] in self.eos_token_ids:
            return draft[:-1]
        return list(draft)

    def _draft_context(self, draft: list[int]) -> list[int]:
        """What precedes the answer besides the prompt while it is decoded: nothing, or
        (draft_in_context) the draft as training saw it, text without the EOS that ended it."""
        if not self.spec.draft_in_context:
            return []
        return draft[:-1] if draft and draft[-1] in self.eos_token_ids else list(draft)

    def verify_draft(self, state: SlotState, prompt_ids: list[int], draft: list[int], phase: str | None) -> torch.Tensor:
        """ONE forward over (S_i, D_{i-1}) reusing the cache of the common prefix;
        row j judges draft[j] causally. The cache is left over prompt + draft.

        Args:
            state (SlotState): the request's decoding state.
            prompt_ids (list[int]): the prompt, S_i.
            draft (list[int]): the held draft, D_{i-1}.
            phase (str | None): the phase the forward is counted and timed under, or None.
        """
        sequence = _pairs(prompt_ids + draft, 0)
        # Keep at least the last prompt token to feed: its logits judge draft token 0.
        reuse = min(common_prefix_length(state.cached, sequence), len(prompt_ids) - 1)
        self.crop(state, reuse)
        return self.feed(state, sequence[reuse:], phase, keep=len(draft) + 1)[:-1]

    # ------------------------------------------------------------ slot decoding

    def decode(self, state: SlotState, prompt_ids: list[int], prefix: list[int], phase: str) -> list[int]:
        """Plan-and-infill the answer after `prefix`; returns the new tokens (up to
        and including the first EOS, at most max_new_tokens - len(prefix)).

        Args:
            state (SlotState): the request's decoding state.
            prompt_ids (list[int]): the prompt.
            prefix (list[int]): the answer tokens kept.
            phase (str): the phase the forwards are counted and timed under.
        """
        context = _pairs(prompt_ids + prefix, 0)
        reuse = common_prefix_length(state.cached, context)  # never past a SPLICED entry
        self.crop(state, reuse)
        run = _Decoding(pending=context[reuse:])
        first, length = len(context), self.max_new_tokens - len(prefix)
        size = self.spec.slot_size
        slots = [first + size * k for k in range(math.ceil(length / size))]  # each slot's first position
        for block_start in range(0, len(slots), self.block_slots):
            undecided = slots[block_start : block_start + self.block_slots]
            while undecided:
                chosen = self._decode_step(state, run, undecided, phase)
                undecided = [s for s in undecided if s not in chosen]
                if run.eos_position is not None:
                    undecided = [s for s in undecided if s < run.eos_position]
            if run.eos_position is not None:
                break
        answer = [run.committed[p] for p in sorted(run.committed)][:length]
        for index, token in enumerate(answer):
            if token in self.eos_token_ids:
                return answer[: index + 1]
        return answer

    def _decode_step(self, state: SlotState, run: _Decoding, undecided: list[int], phase: str) -> list[int]:
        """Plan, verify, then commit whole slots (or up to an EOS) or infill; returns
        the slots decided by this step."""
        size = self.spec.slot_size
        chosen, drafts, context_length = self._plan(state, run, undecided, phase)
        passes = self._verify_chosen(state, drafts, chosen, phase)
        tokens = [t for slot in drafts for t in slot]
        positions = [p for start in chosen for p in self._slot_positions(start)]
        run_length = leading_run(passes)
        eos_at = next((j for j in range(run_length) if tokens[j] in self.eos_token_ids), None)
        if eos_at is not None or run_length >= size:
            # Commit with the KV the verify pass just produced; the other chosen slots stay undecided.
            keep = eos_at + 1 if eos_at is not None else run_length - run_length % size
            self.crop(state, context_length + keep)
            run.commit(tokens[:keep], positions[:keep], cached=True, eos=self.eos_token_ids)
            return chosen[: math.ceil(keep / size)]
        self.crop(state, context_length)
        accepted = [leading_run(passes[i * size : (i + 1) * size]) for i in range(len(chosen))]  # each >= 1
        rows, row_kv = self._infill(state, drafts, chosen, accepted, phase)
        pairs = [(t, p) for row, start in zip(rows, chosen) for t, p in zip(row, self._slot_positions(start))]
        splice = self.spec.infill_kv == "splice"
        if splice:  # each row's own KV, in slot order: the rows never see one another
            append_to_cache(state.cache, [self._row_states(layer, [len(r) for r in rows]) for layer in row_kv])
            state.cached.extend((token, position, SPLICED) for token, position in pairs)
        run.commit([t for t, _ in pairs], [p for _, p in pairs], cached=splice, eos=self.eos_token_ids)
        return chosen

    def _plan(
        self, state: SlotState, run: _Decoding, undecided: list[int], phase: str
    ) -> tuple[list[int], list[list[int]], int]:
        """Pending tokens + every undecided slot as masks: the chosen slots (position
        order), their drafted tokens, and the context length (masks are cropped)."""
        size = self.spec.slot_size
        masks = [(self.mask_token_id, p) for start in undecided for p in self._slot_positions(start)]
        logits = self.feed(state, run.pending + masks, phase, keep=len(masks))
        run.pending = []
        context_length = len(state.cached) - len(masks)
        self.crop(state, context_length)
        probabilities = torch.softmax(logits, dim=-1)
        confidence, tokens = probabilities.max(dim=-1)
        first_confidence = confidence[::size]
        picked = (first_confidence > self.spec.slot_threshold).nonzero()[:, 0].tolist()
        if not picked:
            picked = [int(first_confidence.argmax())]
        drafts = [tokens[i * size : (i + 1) * size].tolist() for i in picked]
        return [undecided[i] for i in picked], drafts, context_length

    def _verify_chosen(self, state: SlotState, drafts: list[list[int]], chosen: list[int], phase: str) -> list[bool]:
        """One causal forward over the chosen drafts concatenated; token j passes when
        p(token j | ... token j-1) > token_threshold. Each slot's first token passes:
        its planning confidence chose it."""
        pairs = [(t, p) for slot, start in zip(drafts, chosen) for t, p in zip(slot, self._slot_positions(start))]
        logits = self.feed(state, pairs, phase, keep=len(pairs))
        passes = self._causal_passes(logits[None], torch.tensor([[t for t, _ in pairs]]))[0].tolist()
        for i in range(len(chosen)):
            passes[i * self.spec.slot_size] = True
        return passes

    def _infill(
        self, state: SlotState, drafts: list[list[int]], chosen: list[int], accepted: list[int], phase: str
    ) -> tuple[list[list[int]], list[tuple[torch.Tensor, torch.Tensor]]]:
        """Complete each chosen slot in its own batch row over the shared context:
        predict the unaccepted tokens (masks), re-judge them causally, grow each
        accepted prefix by its leading passing run and at least one token. A row whose
        accepted prefix holds an EOS ends there, and the rows after it are dropped.
        Every round feeds every row, finished ones too (as upstream does): the last
        verify forward holds each row's KV over its final tokens, returned per layer
        as (keys, values) of shape (rows, heads, slot_size, head_dim)."""
        size, context_length = self.spec.slot_size, len(state.cached)
        rows = [list(d) for d in drafts]
        positions = torch.tensor([self._slot_positions(start) for start in chosen])
        ends = [size] * len(rows)  # tokens each row commits: all, or up to its EOS
        rows, accepted, ends = self._cut_at_eos(rows, accepted, ends)
        cache, row_kv = state.cache, []
        while any(a < size for a in accepted):
            count = len(rows)
            set_cache_batch(cache, count)
            masked = torch.tensor([row[:a] + [self.mask_token_id] * (size - a) for row, a in zip(rows, accepted)])
            predicted = self.run(cache, masked, positions[:count], phase, keep=size).argmax(dim=-1)
            cache.crop(-size)
            for i in range(count):
                rows[i][accepted[i] :] = predicted[i, accepted[i] :].tolist()
            filled = torch.tensor(rows)
            passes = self._causal_passes(self.run(cache, filled, positions[:count], phase, keep=size), filled)
            row_kv = [(layer.keys[:, :, -size:], layer.values[:, :, -size:]) for layer in cache.layers]
            cache.crop(-size)
            for i in range(count):
                if accepted[i] < size:  # the first unaccepted token always passes: every round makes progress
                    accepted[i] += 1 + leading_run(passes[i, accepted[i] + 1 :].tolist())
            rows, accepted, ends = self._cut_at_eos(rows, accepted, ends)
        set_cache_batch(cache, 1)
        assert cache.get_seq_length() == context_length
        return [row[:end] for row, end in zip(rows, ends)], row_kv

    @staticmethod
    def _row_states(layer_kv: tuple[torch.Tensor, torch.Tensor], lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's infill KV, rows laid end to end (the first `lengths[i]` entries of row i): (1, heads, sum, dim)."""
        return tuple(torch.cat([states[i, :, :n] for i, n in enumerate(lengths)], dim=-2)[None] for states in layer_kv)

    def _cut_at_eos(
        self, rows: list[list[int]], accepted: list[int], ends: list[int]
    ) -> tuple[list[list[int]], list[int], list[int]]:
        """End the first row whose accepted prefix holds an EOS there (its tokens stay, for
        the batch; `ends` says where it stops) and drop the rows after it."""
        for i, (row, length) in enumerate(zip(rows, accepted)):
            eos_at = next((j for j in range(length) if row[j] in self.eos_token_ids), None)
            if eos_at is not None:
                return rows[: i + 1], accepted[:i] + [self.spec.slot_size], ends[:i] + [eos_at + 1]
        return rows, accepted, ends

    def _causal_passes(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """(batch, width) booleans: token j > 0 passes when the probability the
        position before gave it exceeds token_threshold; j = 0 is left False."""
        probabilities = torch.softmax(logits[:, :-1], dim=-1).gather(-1, tokens[:, 1:, None].to(logits.device))[..., 0]
        passes = torch.zeros(tokens.shape, dtype=torch.bool)
        passes[:, 1:] = (probabilities > self.spec.token_threshold).cpu()
        return passes

    def _slot_positions(self, start: int) -> list[int]:
        return list(range(start, start + self.spec.slot_size))


def _pairs(token_ids: list[int], first_position: int) -> list[Pair]:
    return list(zip(token_ids, range(first_position, first_position + len(token_ids))))
