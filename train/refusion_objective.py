"""The ReFusion training objective (slot layout + mixed loss), for any causal LM.

Per example the collator draws a slot size s from `slot_sizes`, cuts the answer into
consecutive slots of s tokens (the last one may be shorter), draws t ~ U(0, 1) and
masks each slot with probability p = (1 - eps) t + eps. The sequence is laid out as

    prompt | draft (if any) | clean slots, in random order | masked slots (all <|mask|>), in order

and every token keeps its original index as its position id. The model runs with
standard causal attention over this order and those explicit `position_ids`, and
learns two things at once:
- a clean token predicts the next token of its own slot (a slot's last token predicts
  nothing): autoregressive decoding of a slot, given any subset of the other slots;
- a mask token predicts its own original token: parallel infilling of masked slots.

Loss of a micro-batch, by default as upstream computes it (ML-GSAI/ReFusion,
`Qwen3ForCausalLM.forward`), with A an example's answer length (in tokens, the draft not
counted) and B the micro-batch's examples that have an answer:

    mean CE over all clean targets of the micro-batch  +  (sum over its masked tokens of CE / (p A)) / B

One named difference: upstream's first term is NaN in a micro-batch without a clean target
(every slot masked, or only one-token clean slots); here it is 0 there.

`refusion.clean_average: example` is headstart's earlier form: per example, the mean CE over
its own clean targets + (sum over its masked tokens of CE / p) / A, then the mean over the
examples that have a target. Every example then weighs the same whatever its answer length
(in the micro-batch mean, a long answer's clean tokens outweigh a short one's), and the loss
of an optimizer step does not depend on how its examples are split into equal micro-batches
(per-device batch x accumulation x processes): with upstream's form, one example per micro-batch
makes the clean term a per-example mean again.

The collator writes each target's share of the micro-batch loss as its weight (`loss_shares`),
so either form is one weighted sum of per-token cross-entropies (`weighted_token_losses` summed).

Draft-refinement rows: the draft D_{i-1} sits at the start of the answer buffer as
committed text: right after the prompt, clean, visible to every answer token, never a
target (the model must not learn to write stale drafts). The answer to the complete
request follows it at the next positions, laid out in slots as above, so the model
learns to write the answer with the earlier draft in view. An empty draft (i = 1)
gives exactly the prefix-to-answer layout.

Run the model with an explicit 2-D `attention_mask` (ones where a token is real):
without one, transformers reads the position-id jumps of the shuffled slots as
boundaries of packed documents and would hide the slots from one another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from peft import LoraConfig
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerState
from transformers.trainer import TRAINER_STATE_NAME
from trl import SFTTrainer

from headstart.refusion import add_refusion_tokens
from train.config import CLEAN_AVERAGES
from train.tokenization import IGNORE_INDEX


@dataclass(frozen=True)
class SlotDraw:
    """The random choices for one example's answer."""

    slot_size: int
    p: float  # masking probability of every slot
    masked: tuple[bool, ...]  # per slot, in answer order
    clean_order: tuple[int, ...]  # indices of the clean slots, in the order they are laid out


def draw_slots(
    answer_length: int, slot_sizes: Sequence[int], eps: float, generator: torch.Generator | None = None
) -> SlotDraw:
    """Draw slot size, masking probability, masked slots and the order of the clean ones.

    Args:
        answer_length (int): the answer's tokens.
        slot_sizes (Sequence[int]): the slot sizes drawn from.
        eps (float): the smallest masking probability.
        generator (torch.Generator | None): the random stream; None: torch's global one.
    """
    slot_size = slot_sizes[int(torch.randint(len(slot_sizes), (1,), generator=generator))]
    p = (1 - eps) * float(torch.rand((), generator=generator)) + eps
    num_slots = -(-answer_length // slot_size)
    masked = tuple(bool(m) for m in torch.rand(num_slots, generator=generator) < p)
    clean = [k for k in range(num_slots) if not masked[k]]
    order = torch.randperm(len(clean), generator=generator).tolist()
    return SlotDraw(slot_size, p, masked, tuple(clean[i] for i in order))


def lay_out(
    prompt_ids: Sequence[int],
    answer_ids: Sequence[int],
    draw: SlotDraw,
    mask_id: int,
    draft_ids: Sequence[int] = (),
) -> dict[str, list]:
    """One example in ReFusion order: input_ids, position_ids, labels and loss_weights: 1 on each
    clean target, 1 / (p A) on each masked token, 0 elsewhere (the terms of the loss's two sums;
    `loss_shares` turns them into shares of the micro-batch loss).

    Args:
        prompt_ids (Sequence[int]): the prompt's tokens.
        answer_ids (Sequence[int]): the answer's tokens.
        draw (SlotDraw): the slot size, masked slots and clean order drawn for it.
        mask_id (int): the mask token's id.
        draft_ids (Sequence[int]): a draft's tokens after the prompt (draft refinement); empty: none.
    """
    prefix = list(prompt_ids) + list(draft_ids)
    row = {
        "input_ids": prefix,
        "position_ids": list(range(len(prefix))),
        "labels": [IGNORE_INDEX] * len(prefix),
        "loss_weights": [0.0] * len(prefix),
    }
    size, start = draw.slot_size, len(prefix)
    slots = [list(answer_ids[k : k + size]) for k in range(0, len(answer_ids), size)]
    masked_weight = 1.0 / (draw.p * len(answer_ids)) if answer_ids else 0.0
    for k in draw.clean_order:  # autoregressive within the slot
        tokens = slots[k]
        weights = [1.0] * (len(tokens) - 1) + [0.0]
        _extend(row, tokens, start + k * size, tokens[1:] + [IGNORE_INDEX], weights)
    for k in (k for k in range(len(slots)) if draw.masked[k]):  # each mask predicts its own token
        tokens = slots[k]
        _extend(row, [mask_id] * len(tokens), start + k * size, tokens, [masked_weight] * len(tokens))
    return row


def _extend(row: dict[str, list], ids: list[int], first_position: int, labels: list[int], weights: list[float]) -> None:
    row["input_ids"] += ids
    row["position_ids"] += range(first_position, first_position + len(ids))
    row["labels"] += labels
    row["loss_weights"] += weights


@dataclass
class RefusionCollator:
    """Tokenized rows (prompt_ids, draft_ids, answer_ids) -> one padded batch in ReFusion layout,
    each target weighted by its share of the micro-batch loss under `clean_average` (`loss_shares`).

    Sequences are cut to `max_length` from the end (the answer first, as TRL truncates): the
    `refusion.over_long: cut` path; with `skip`, rows that do not fit were dropped before training.
    Padding is on the right (attention_mask 0, labels -100, weight 0).

    With a `seed`, batch number k draws from a generator seeded with (seed, k), whatever
    was drawn before: the data loader's prefetching does not shift the draws, and a
    resumed run sets `batches` to the batches already trained on and lays out the rest
    as an uninterrupted run does. Without one, draws come from torch's global RNG.
    """

    mask_token_id: int
    pad_token_id: int
    slot_sizes: Sequence[int] = (4, 8, 16, 32)
    eps: float = 1e-3
    max_length: int | None = None
    seed: int | None = None
    batches: int = 0  # number of the next batch
    clean_average: str = "batch"  # refusion.clean_average: "batch" (upstream) or "example"

    def __call__(self, examples: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        generator = None if self.seed is None else torch.Generator().manual_seed(batch_seed(self.seed, self.batches))
        self.batches += 1
        parts = [self.cut(e) for e in examples]
        rows = [lay_out(prompt, answer, draw_slots(len(answer), self.slot_sizes, self.eps, generator),
                        self.mask_token_id, draft) for prompt, draft, answer in parts]
        answered = sum(1 for _, _, answer in parts if answer)
        return pad_rows(loss_shares(rows, self.mask_token_id, answered, self.clean_average), self.pad_token_id)

    def cut(self, example: dict[str, list[int]]) -> list[list[int]]:
        """A tokenized row's (prompt, draft, answer), cut to `max_length` from the end.

        Args:
            example (dict[str, list[int]]): the row's `prompt_ids`, `answer_ids` and optional `draft_ids`.
        """
        parts = [example["prompt_ids"], example.get("draft_ids") or [], example["answer_ids"]]
        return parts if self.max_length is None else keep_start(parts, self.max_length)


def batch_seed(seed: int, batch: int) -> int:
    """A 63-bit seed for batch number `batch` of stream `seed` (int tuples hash the same in every process).

    Args:
        seed (int): the stream's seed.
        batch (int): the batch's number.
    """
    return hash((seed, batch)) % (1 << 63)


def keep_start(parts: list[list[int]], max_length: int) -> list[list[int]]:
    """Cut the concatenation of `parts` after `max_length` tokens, keeping each part's boundaries.

    Args:
        parts (list[list[int]]): token lists, in order (prompt, draft, answer).
        max_length (int): the tokens kept in all.
    """
    kept, room = [], max_length
    for part in parts:
        kept.append(list(part[:room]))
        room -= len(kept[-1])
    return kept


def loss_shares(rows: list[dict[str, list]], mask_token_id: int, answered: int,
                clean_average: str = "batch") -> list[dict[str, list]]:
    """The rows with each target's weight replaced by its share of the micro-batch loss, so that
    the loss is the sum of share x CE (the module docstring's two forms):
    - "batch" (upstream): a clean target 1 / (clean targets of the micro-batch), a masked token
      1 / (p A B), B the examples with an answer;
    - "example": a clean target 1 / (clean targets of its example), a masked token 1 / (p A),
      each divided by the examples that have a target.

    Args:
        rows (list[dict[str, list]]): laid-out rows (`lay_out`: 1 on a clean target, 1 / (p A) on a masked token).
        mask_token_id (int): the mask token's id (a target under it is a masked one).
        answered (int): the examples with an answer (at least one token left after any cut).
        clean_average (str): "batch" or "example".
    """
    if clean_average not in CLEAN_AVERAGES:
        raise ValueError(f"refusion.clean_average must be one of {', '.join(CLEAN_AVERAGES)}, not {clean_average!r}")
    clean = [[w > 0 and t != mask_token_id for t, w in zip(r["input_ids"], r["loss_weights"])] for r in rows]
    with_target = sum(any(w > 0 for w in r["loss_weights"]) for r in rows)
    # No clean target in the micro-batch: the term is 0 (upstream's token mean is NaN there).
    batch_clean_share, batch_masked_scale = _inverse(sum(map(sum, clean))), _inverse(answered)
    shared = []
    for row, marks in zip(rows, clean):
        if clean_average == "batch":
            clean_share, masked_scale = batch_clean_share, batch_masked_scale
        else:
            clean_share, masked_scale = _inverse(sum(marks) * with_target), _inverse(with_target)
        weights = [clean_share if is_clean else w * masked_scale for is_clean, w in zip(marks, row["loss_weights"])]
        shared.append({**row, "loss_weights": weights})
    return shared


def _inverse(count: int) -> float:
    return 1.0 / count if count else 0.0


def pad_rows(rows: list[dict[str, list]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad laid-out rows into tensors; padded positions keep counting (they are never attended).

    Args:
        rows (list[dict[str, list]]): laid-out rows (`lay_out`).
        pad_token_id (int): the id padding is written with.
    """
    width = max(len(r["input_ids"]) for r in rows)
    batch = {"input_ids": [], "attention_mask": [], "position_ids": [], "labels": [], "loss_weights": []}
    for r in rows:
        n, pad = len(r["input_ids"]), width - len(r["input_ids"])
        batch["input_ids"].append(r["input_ids"] + [pad_token_id] * pad)
        batch["attention_mask"].append([1] * n + [0] * pad)
        batch["position_ids"].append(r["position_ids"] + list(range(n, width)))
        batch["labels"].append(r["labels"] + [IGNORE_INDEX] * pad)
        batch["loss_weights"].append(r["loss_weights"] + [0.0] * pad)
    return {k: torch.tensor(v, dtype=torch.float32 if k == "loss_weights" else torch.long) for k, v in batch.items()}


def weighted_token_losses(logits: torch.Tensor, labels: torch.Tensor, loss_weights: torch.Tensor) -> torch.Tensor:
    """weight x cross-entropy of each position against its own label (labels are already
    aligned with the positions that predict them: no shift), in float32; 0 where ignored.

    Args:
        logits (torch.Tensor): [B, L, V] the model's logits.
        labels (torch.Tensor): [B, L] each position's target, IGNORE_INDEX where none.
        loss_weights (torch.Tensor): [B, L] each position's weight.
    """
    losses = F.cross_entropy(
        logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    )
    return losses.view_as(labels) * loss_weights


def add_trainable_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, lora: LoraConfig) -> list[int]:
    """Add the ReFusion tokens where missing (resizing the embeddings) and let their rows
    train beside the adapter (PEFT trainable tokens: only those rows are trained and saved).
    The output rows train too unless tied to the input ones: the model learns never to
    predict a mask, and a reloaded adapter gives them its own values, not a fresh init.
    A ReFusion model already has both tokens: nothing is added, LoRA alone trains, as upstream.

    Args:
        model (PreTrainedModel): the base model, before the adapter is added.
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        lora (LoraConfig): the adapter's config, given the trainable token rows.
    """
    added = add_refusion_tokens(model, tokenizer)
    if added:
        rows = {_module_name(model, model.get_input_embeddings()): added}
        output = model.get_output_embeddings()
        if output is not None and output.weight is not model.get_input_embeddings().weight:
            rows[_module_name(model, output)] = added
        lora.trainable_token_indices = rows
    return added


def _module_name(model: torch.nn.Module, module: torch.nn.Module) -> str:
    return next(name for name, m in model.named_modules() if m is module).split(".")[-1]


# Evaluations number their batches from here: training never reaches these numbers, so
# every evaluation draws the same layouts and none repeats a training batch's.
EVAL_FIRST_BATCH = -(1 << 40)


class RefusionTrainer(SFTTrainer):
    """TRL's SFTTrainer with the ReFusion loss; the collator (a seeded `RefusionCollator`)
    lays out each batch.

    Run with `remove_unused_columns=False` and `dataset_kwargs={"skip_prepare_dataset": True}`:
    the rows are (prompt_ids, draft_ids, answer_ids), not TRL's tokenized columns.
    Logs the two parts of the loss beside it (their sum): `clean_loss` and `masked_loss`.
    """

    loss_is_scaled_for_ga = False  # a mean per micro-batch: Trainer divides by the accumulation steps

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The ReFusion loss of the batch; logs its clean and masked parts.

        Args:
            model (torch.nn.Module): the wrapped model.
            inputs (dict[str, torch.Tensor]): the collated batch, with `labels` and `loss_weights`.
            return_outputs (bool): whether to return the model's outputs with the loss.
            num_items_in_batch (int | torch.Tensor | None): unused: the loss is a mean per micro-batch.
        """
        labels, weights = inputs.pop("labels"), inputs.pop("loss_weights")
        outputs = model(**inputs, use_cache=False)
        weighted = weighted_token_losses(outputs.logits, labels, weights)
        loss = weighted.sum()  # the collator's weights are each target's share
        masked = inputs["input_ids"] == self.data_collator.mask_token_id
        mode = "train" if self.model.training else "eval"
        for name, part in (("clean_loss", weighted[~masked]), ("masked_loss", weighted[masked])):  # they sum to loss
            value = part.detach().sum()
            self._metrics[mode][name].append(self.accelerator.gather_for_metrics(value).mean().item())
        return (loss, outputs) if return_outputs else loss

    def train(self, resume_from_checkpoint=None, **kwargs):
        """On resume, continue the layout draws after the batches the checkpoint trained on
        (transformers skips those batches without collating them).

        Args:
            resume_from_checkpoint (str | Path | bool | None): the checkpoint to resume, as `Trainer.train` takes it.
            kwargs (Any): passed on to `Trainer.train`.
        """
        if isinstance(resume_from_checkpoint, (str, Path)):
            state = TrainerState.load_from_json(str(Path(resume_from_checkpoint) / TRAINER_STATE_NAME))
            self.data_collator.batches = state.global_step * self.args.gradient_accumulation_steps
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def evaluate(self, *args, **kwargs):
        """Every evaluation draws the same layouts (its losses compare across steps), then
        training continues its own draws.

        Args:
            args (Any): passed on to `Trainer.evaluate`.
            kwargs (Any): passed on to `Trainer.evaluate`.
        """
        collator = self.data_collator
        next_training_batch, collator.batches = collator.batches, EVAL_FIRST_BATCH
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            collator.batches = next_training_batch
