"""ReFusion's `generate_refusion` (ML-GSAI/ReFusion, generate.py) written out plainly as a
test reference: same decisions, no KV cache.

Upstream keeps a KV cache and edits it (crops, batch repeats, and after an infill it splices
each batch row's KV into the single-row cache). Here every model call recomputes the whole fed
sequence from scratch instead: the prompt, the committed tokens in COMMIT order (each at its
true position), then what the call feeds. Who may see whom is spelled out by an explicit 4-D
attention mask, (batch, 1, query, key), additive floats (0 or the dtype's minimum: the one
convention both the sdpa and the eager attention of transformers' Qwen3 read the same way; a
boolean mask is misread by eager attention):

- causal over the fed order, except that
- tokens committed by one infill step in different batch rows never see each other (each such
  token carries the group (step, row)). That is what upstream's splice produces: each row's KV
  was computed in its own row, and later tokens attend to all of them.

The same rule lays the several batch rows of one infill call end to end in a single sequence
after the context (each row a group of its own), instead of repeating the context per row.

With `splice=False` the infilled tokens are ordinary causal context instead (each sees the
earlier rows of its step in commit order): headstart's earlier "re-feed" variant.

The decoding, for one request (batch 1), temperature 0:

1. The answer buffer is max_new_tokens rounded up to whole slots, at positions prompt_len..,
   split into `serial_blocks` blocks decoded in turn. Within a block, steps repeat until no
   slot remains.
2. PLAN: one forward over the context and every remaining slot of the block as masks, at their
   true positions. A position's confidence is its largest probability; the slots whose FIRST
   token's confidence exceeds slot_threshold are picked (else the single most confident slot),
   in slot order, and drafted by argmax.
3. GLOBAL VERIFY: one causal forward over the picked drafts concatenated. Token j > 0 of a
   slot passes when the probability the previous fed position gives it exceeds
   token_threshold; a slot's first token always passes. The leading run over the whole
   concatenation decides: an EOS in it commits up to that EOS; else a run covering whole
   slots commits those slots. Both keep the verify forward's KV (plain causal context here).
   The other picked slots go back to the remaining set.
4. Otherwise INFILL: each picked slot is a batch row after the shared context, its accepted
   prefix its own leading run from step 3. Rounds (at most slot_size) of a PREDICT forward
   (accepted tokens, masks for the rest; each mask position's argmax is its proposal, not
   shifted) and a VERIFY forward (the filled rows, causal): per row the first unaccepted token
   always passes, the next ones while prob(token | previous) > token_threshold. Once a row's
   accepted tokens hold an EOS, the rows after the first such row are dropped and that row is
   finished. Rounds stop when every row is fully accepted; the rows are committed in slot
   order, the EOS row up to its EOS.
5. After an EOS is committed, the slots after it are dropped and decoding stops after the
   current block. The answer is the committed tokens by position, cut at max_new_tokens and
   after the first EOS.

One deliberate departure, counted in `counts["upstream row-index drop"]`: after an EOS found
by infill, upstream drops the remaining slots from index `first_eos_block_idx` on, an index
into the picked rows used as an index into the remaining slots, so it can also drop unpicked
slots BEFORE the EOS (leaving a hole in its answer). Here, as after an EOS found by global
verification, exactly the slots after the EOS are dropped.
"""

from __future__ import annotations

from collections import Counter

import torch

# One committed (or fed) token: (token id, true position, group). Group None: ordinary causal
# context; (step, row): committed by infill step `step` from batch row `row` (splice only).
Fed = tuple[int, int, tuple[int, int] | None]
NO_GROUP = -1
CALL_STEP = 0  # the group step of the rows a call feeds (infill steps count from 1)


class UpstreamRefusion:
    """`generate_refusion` without a KV cache; `decode(prompt)` returns (answer, forwards).
    `counts` accumulates over decodes which branch each step took."""

    def __init__(self, model, mask_id: int, eos: set[int], *, max_new_tokens: int, slot_size: int, serial_blocks: int,
                 slot_threshold: float, token_threshold: float, splice: bool = True) -> None:
        self.model, self.mask_id, self.eos = model, mask_id, set(eos)
        self.max_new_tokens, self.size, self.serial_blocks = max_new_tokens, slot_size, serial_blocks
        self.slot_threshold, self.token_threshold, self.splice = slot_threshold, token_threshold, splice
        self.counts: Counter[str] = Counter()
        self.forwards = 0

    # ------------------------------------------------------------------ the model

    def call(self, context: list[Fed], rows: list[list[tuple[int, int]]]) -> torch.Tensor:
        """One model call: each row (equal lengths) of (token, position) fed after `context`, as
        if each were its own batch row. The rows are laid end to end in ONE sequence after the
        context, a row seeing the context and its own earlier tokens only (the same rule as
        sibling infill rows: one group per row), which computes what a batch would at a
        fraction of the cost. Returns the probabilities at the rows' positions, (rows, width,
        vocab), float64."""
        self.forwards += 1
        fed = context + [(t, p, (CALL_STEP, r)) for r, row in enumerate(rows) for t, p in row]
        tokens = torch.tensor([[t for t, _, _ in fed]], device=self.model.device)
        positions = torch.tensor([[p for _, p, _ in fed]], device=self.model.device)
        mask = self.attention_mask([g for _, _, g in fed]).to(self.model.device)
        with torch.no_grad():
            logits = self.model(input_ids=tokens, position_ids=positions, attention_mask=mask).logits
        probabilities = torch.softmax(logits[0, len(context):].double().cpu(), dim=-1)
        return probabilities.view(len(rows), -1, probabilities.shape[-1])

    def attention_mask(self, groups: list[tuple[int, int] | None]) -> torch.Tensor:
        """(1, 1, n, n) additive mask over fed tokens of these groups: causal, but a token never
        sees an earlier one of the same step and another row."""
        steps = torch.tensor([NO_GROUP if g is None else g[0] for g in groups])
        rows = torch.tensor([NO_GROUP if g is None else g[1] for g in groups])
        siblings = (steps[:, None] == steps[None, :]) & (steps[:, None] != NO_GROUP) & (rows[:, None] != rows[None, :])
        allowed = torch.ones(len(groups), len(groups), dtype=torch.bool).tril() & ~siblings
        dtype = self.model.dtype
        return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]

    # ----------------------------------------------------------------- decoding

    def decode(self, prompt: list[int]) -> tuple[list[int], int]:
        """The answer to `prompt` (token ids) and the number of model calls it took."""
        size = self.size
        self.forwards = 0
        context: list[Fed] = [(t, p, None) for p, t in enumerate(prompt)]
        buffer_slots = -(-self.max_new_tokens // size)
        assert buffer_slots % self.serial_blocks == 0, "upstream needs whole slots in every block"
        block = buffer_slots // self.serial_blocks
        slots = [len(prompt) + size * k for k in range(buffer_slots)]  # each slot's first position
        eos_position = None  # of the first committed EOS
        step = 0
        for first in range(0, buffer_slots, block):
            remaining = slots[first:first + block]
            while remaining:
                step += 1
                chosen, drafts = self.plan(context, remaining)
                committed, decided, infilled_eos = self.verify_or_infill(context, chosen, drafts, step)
                for token, position, _ in committed:
                    if token in self.eos and (eos_position is None or position < eos_position):
                        eos_position = position
                if infilled_eos is not None:
                    self.note_upstream_row_index_drop(remaining, chosen, infilled_eos)
                context += committed
                remaining = [s for s in remaining if s not in decided and (eos_position is None or s < eos_position)]
            if eos_position is not None:
                self.counts["eos stop"] += 1
                break
        by_position = sorted((p, t) for t, p, _ in context[len(prompt):])
        answer = [t for _, t in by_position][:self.max_new_tokens]
        cut = next((j for j, t in enumerate(answer) if t in self.eos), None)
        return (answer if cut is None else answer[:cut + 1]), self.forwards

    def slot(self, start: int) -> list[int]:
        return list(range(start, start + self.size))

    def plan(self, context: list[Fed], remaining: list[int]) -> tuple[list[int], list[list[int]]]:
        """Step 1: the picked slots (slot order) and their argmax drafts."""
        size = self.size
        masks = [(self.mask_id, p) for s in remaining for p in self.slot(s)]
        confidence, argmax = self.call(context, [masks])[0].max(dim=-1)
        first_confidence = confidence[::size]
        picked = [i for i in range(len(remaining)) if first_confidence[i] > self.slot_threshold]
        if not picked:
            picked = [int(first_confidence.argmax())]
        self.counts["plans"] += 1
        self.counts["multi-slot plans"] += len(picked) > 1
        return [remaining[i] for i in picked], [argmax[i * size:(i + 1) * size].tolist() for i in picked]

    def passes_after(self, probabilities: torch.Tensor, tokens: list[int], j: int) -> bool:
        """Whether token j passes causally: the position before it gave it > token_threshold."""
        return float(probabilities[j - 1, tokens[j]]) > self.token_threshold

    def verify_or_infill(self, context: list[Fed], chosen: list[int], drafts: list[list[int]],
                         step: int) -> tuple[list[Fed], list[int], int | None]:
        """Steps 2 and 3: the tokens committed, the slots decided (they leave the remaining set),
        and the position of the EOS an infill ended on (None: none)."""
        size = self.size
        tokens = [t for draft in drafts for t in draft]
        positions = [p for s in chosen for p in self.slot(s)]
        probabilities = self.call(context, [list(zip(tokens, positions))])[0]
        passed = [j % size == 0 or self.passes_after(probabilities, tokens, j) for j in range(len(tokens))]
        run = passed.index(False) if False in passed else len(passed)
        eos_at = next((j for j in range(run) if tokens[j] in self.eos), None)
        if eos_at is not None or run >= size:
            keep = eos_at + 1 if eos_at is not None else run // size * size
            self.counts["eos in global verify" if eos_at is not None else "whole slots"] += 1
            decided = chosen[:-(-keep // size)]
            return [(t, p, None) for t, p in zip(tokens[:keep], positions[:keep])], decided, None
        self.counts["infills"] += 1
        accepted = []
        for i in range(len(chosen)):
            own = passed[i * size:(i + 1) * size]
            accepted.append(own.index(False) if False in own else size)
        rows, eos_at = self.infill(context, chosen, [list(d) for d in drafts], accepted)
        committed: list[Fed] = []
        for r, (row, start) in enumerate(zip(rows, chosen)):
            group = (step, r) if self.splice else None
            committed += [(t, p, group) for t, p in zip(row, self.slot(start))]
        return committed, chosen, eos_at

    def infill(self, context: list[Fed], chosen: list[int], rows: list[list[int]],
               accepted: list[int]) -> tuple[list[list[int]], int | None]:
        """Step 3: complete each row; returns the rows to commit (the EOS row cut after its
        EOS, the rows after it dropped) and that EOS's position (None: no EOS)."""
        size = self.size
        eos_row = eos_index = None
        rounds = 0
        for _ in range(size):
            if all(a == size for a in accepted):
                break
            rounds += 1
            # PREDICT: accepted tokens, masks after them; a mask position's argmax fills it.
            feed = [[(row[j] if j < a else self.mask_id, p) for j, p in enumerate(self.slot(s))]
                    for row, a, s in zip(rows, accepted, chosen)]
            proposals = self.call(context, feed).argmax(dim=-1)
            for r, a in enumerate(accepted):
                rows[r][a:] = proposals[r, a:].tolist()
            # VERIFY: the filled rows, causally.
            probabilities = self.call(context, [list(zip(row, self.slot(s))) for row, s in zip(rows, chosen)])
            for r, a in enumerate(accepted):
                if a < size:
                    a += 1  # the first unaccepted token always passes
                    while a < size and self.passes_after(probabilities[r], rows[r], a):
                        a += 1
                    accepted[r] = a
            # An EOS among a row's accepted tokens: that row is finished, the rows after it dropped.
            for r, (row, a) in enumerate(zip(rows, accepted)):
                at = next((j for j in range(a) if row[j] in self.eos), None)
                if at is not None:
                    self.counts["eos in infill"] += 1
                    rows, accepted = rows[:r + 1], accepted[:r] + [size]
                    eos_row, eos_index = r, at
                    break
        self.counts["infill rounds"] += rounds
        self.counts["multi-round infills"] += rounds > 1
        if eos_row is None:
            return rows, None
        rows[eos_row] = rows[eos_row][:eos_index + 1]
        return rows, chosen[eos_row] + eos_index

    def note_upstream_row_index_drop(self, remaining: list[int], chosen: list[int], eos_position: int) -> None:
        """Count an infill EOS after which upstream's literal code drops unpicked slots that lie
        BEFORE the EOS (it removes remaining-slot indices from the EOS row's index on)."""
        row = next(r for r, s in enumerate(chosen) if s <= eos_position < s + self.size)
        lost = [s for s in remaining[row:] if s not in chosen and s < eos_position]
        self.counts["upstream row-index drop"] += bool(lost)
