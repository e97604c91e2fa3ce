"""Self-distillation from the complete request (`objective: distill`).

The student is the model with its LoRA adapter, prompted with the prefix S_i (the
row's streamed user turn, rendered as in `objective: sft`). The teacher is the same
weights with the adapter disabled (PEFT `disable_adapter()`), prompted with the
complete request S_n (the row's `full_request`: the same dialogue with S_i replaced
by S_n). Both are scored on the same answer tokens; only the prompts differ. No
second copy of the model is loaded: the teacher pass runs through the same wrapped
model (DDP module or DeepSpeed engine), under `torch.no_grad()`, before the
student pass.

Loss: for answer token j of example b, with p the teacher's and q the student's
next-token distribution at the position that predicts it,

    forward (default):  KL(p || q) = sum_v p(v) (log p(v) - log q(v))
    reverse:            KL(q || p) = sum_v q(v) (log q(v) - log p(v))

and the loss of an optimizer step is the mean over every answer token of the step
(all micro-batches of the accumulation window, all processes): the sum of the
per-token divergences divided by the number of answer tokens, as TRL's SFT loss
averages its cross-entropy (Trainer's `num_items_in_batch`). Every answer token
weighs the same whatever the batch split, so gradient accumulation, DDP and ZeRO
give the loss of one big batch. Without that count (a model that takes no loss
kwargs; evaluation) the loss is the mean over the answer tokens of the micro-batch.

`top_k = k > 0`: the divergence of the two distributions coarsened to k + 1
outcomes, the teacher's k most likely tokens and one bucket holding all the others
(p(rest) = 1 - sum of the top k). It is an exact KL of coarser distributions, so it
is >= 0, zero when student and teacher agree, never above the full KL (data
processing inequality) and equal to it as k grows to the vocabulary; unlike
renormalising the teacher's top k, the student is not pushed to put all its mass on
those k tokens. The teacher's [answer tokens x vocabulary] log-probabilities are
reduced to k + 1 numbers per token right after its pass, before the student pass
and its backward; the student still normalises over the full vocabulary.

Logits are computed only from the first position that predicts an answer token on
(`logits_to_keep`), and the divergence in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from trl import SFTTrainer

from train.config import DIVERGENCES
from train.tokenization import IGNORE_INDEX


@dataclass
class DistillCollator:
    """Tokenized rows (prompt_ids, teacher_prompt_ids, answer_ids) -> two right-padded batches.

    Student: input_ids, attention_mask, labels (the answer tokens at their positions,
    -100 elsewhere; Trainer counts them for the token mean). Teacher: the same keys
    prefixed `teacher_`. With `max_length`, both sequences keep the same answer tokens:
    as many as fit after the longer prompt (a row whose prompts fill `max_length`
    keeps none and adds nothing to the loss).
    """

    pad_token_id: int
    max_length: int | None = None

    def __call__(self, examples: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        student, teacher = [], []
        for example in examples:
            prompt, teacher_prompt, answer = (list(example[k]) for k in ("prompt_ids", "teacher_prompt_ids", "answer_ids"))
            if self.max_length is not None:
                room = self.max_length - max(len(prompt), len(teacher_prompt))
                answer = answer[: max(room, 0)]
                prompt, teacher_prompt = prompt[: self.max_length], teacher_prompt[: self.max_length]
            student.append((prompt, answer))
            teacher.append((teacher_prompt, answer))
        batch = pad_with_labels(student, self.pad_token_id)
        batch |= {f"teacher_{k}": v for k, v in pad_with_labels(teacher, self.pad_token_id).items()}
        return batch


def pad_with_labels(rows: Sequence[tuple[list[int], list[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """(prompt, answer) pairs -> input_ids, attention_mask, labels, padded on the right.

    Args:
        rows (Sequence[tuple[list[int], list[int]]]): (prompt ids, answer ids) of each sequence.
        pad_token_id (int): the id padding is written with.
    """
    width = max(len(p) + len(a) for p, a in rows)
    ids, mask, labels = [], [], []
    for prompt, answer in rows:
        n, pad = len(prompt) + len(answer), width - len(prompt) - len(answer)
        ids.append(prompt + answer + [pad_token_id] * pad)
        mask.append([1] * n + [0] * pad)
        labels.append([IGNORE_INDEX] * len(prompt) + answer + [IGNORE_INDEX] * pad)
    return {k: torch.tensor(v, dtype=torch.long) for k, v in (("input_ids", ids), ("attention_mask", mask), ("labels", labels))}


def predicting_positions(labels: torch.Tensor) -> torch.Tensor:
    """[B, L] bool: position t predicts an answer token (labels[t + 1] is one).

    Args:
        labels (torch.Tensor): [B, L] labels, IGNORE_INDEX off the answer.
    """
    return F.pad(labels[:, 1:] != IGNORE_INDEX, (0, 1), value=False)


def logits_to_keep(labels: torch.Tensor) -> int:
    """How many trailing positions hold every position that predicts an answer token.

    Args:
        labels (torch.Tensor): [B, L] labels, IGNORE_INDEX off the answer.
    """
    rows = predicting_positions(labels)
    if not rows.any():
        return 1
    first = int(rows.float().argmax(dim=1)[rows.any(dim=1)].min())
    return labels.shape[1] - first


def answer_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[N, V]: the logits that predict the N answer tokens, row by row, in order. `logits`
    may cover only the last positions of the sequence (`logits_to_keep`).

    Args:
        logits (torch.Tensor): [B, K, V] logits of the last K positions (K <= L).
        labels (torch.Tensor): [B, L] labels, IGNORE_INDEX off the answer.
    """
    predicts = predicting_positions(labels)[:, labels.shape[1] - logits.shape[1]:]
    return logits[predicts]


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x <= 0, finite: x is held below -1e-30 (1 - exp(x) >= 1e-30).

    Args:
        x (torch.Tensor): log-probabilities (<= 0).
    """
    return torch.log(-torch.expm1(x.clamp(max=-1e-30)))


def coarsen(log_probs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """[N, k + 1] log-probabilities: those of the tokens `indices`, then of all the others.

    Args:
        log_probs (torch.Tensor): [N, V] log-probabilities over the vocabulary.
        indices (torch.Tensor): [N, k] the tokens kept apart, per row.
    """
    top = log_probs.gather(-1, indices)
    return torch.cat([top, log1mexp(torch.logsumexp(top, dim=-1, keepdim=True))], dim=-1)


@dataclass
class TeacherTargets:
    """The teacher's log-probabilities over the full vocabulary ([N, V], `indices` None),
    or over its top k tokens and the rest ([N, k + 1], the top k tokens in `indices`)."""

    log_probs: torch.Tensor
    indices: torch.Tensor | None = None


def teacher_targets(logits: torch.Tensor, top_k: int = 0) -> TeacherTargets:
    """The teacher's log-probabilities at the answer tokens: full, or its top-k and the rest.

    Args:
        logits (torch.Tensor): [N, V] the teacher's answer logits.
        top_k (int): how many tokens to keep apart; 0 (or the vocabulary or more): all.
    """
    log_probs = F.log_softmax(logits.float(), dim=-1)
    if not top_k or top_k >= log_probs.shape[-1]:
        return TeacherTargets(log_probs)
    indices = log_probs.topk(top_k, dim=-1).indices
    return TeacherTargets(coarsen(log_probs, indices), indices)


def student_log_probs(logits: torch.Tensor, targets: TeacherTargets) -> torch.Tensor:
    """The student's log-probabilities over the same outcomes as the teacher's targets.

    Args:
        logits (torch.Tensor): [N, V] the student's answer logits.
        targets (TeacherTargets): the teacher's targets (their top-k tokens, if any).
    """
    log_probs = F.log_softmax(logits.float(), dim=-1)
    return log_probs if targets.indices is None else coarsen(log_probs, targets.indices)


def kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Per row, KL(p || q) = sum p (log p - log q), with 0 log 0 = 0.

    Args:
        log_p (torch.Tensor): [N, C] log-probabilities of p.
        log_q (torch.Tensor): [N, C] log-probabilities of q.
    """
    p = log_p.exp()
    return torch.where(p > 0, p * (log_p - log_q), 0.0).sum(dim=-1)


def token_divergences(
    student_logits: torch.Tensor, targets: TeacherTargets, divergence: str = "forward"
) -> torch.Tensor:
    """[N]: the divergence between teacher and student at each answer token.

    Args:
        student_logits (torch.Tensor): [N, V] the student's answer logits.
        targets (TeacherTargets): the teacher's targets at the same N tokens.
        divergence (str): "forward" (KL(teacher || student)) or "reverse".
    """
    student = student_log_probs(student_logits, targets)
    if divergence == "forward":
        return kl(targets.log_probs, student)
    if divergence == "reverse":
        return kl(student, targets.log_probs)
    raise ValueError(f"divergence {divergence!r}: use {' or '.join(DIVERGENCES)}")


def divergence_sum(student_logits: torch.Tensor, targets: TeacherTargets, divergence: str = "forward") -> torch.Tensor:
    """Sum over the answer tokens of the divergence ([N, V] student logits, the teacher's targets).

    Args:
        student_logits (torch.Tensor): [N, V] the student's answer logits.
        targets (TeacherTargets): the teacher's targets at the same N tokens.
        divergence (str): "forward" (KL(teacher || student)) or "reverse".
    """
    if student_logits.shape[0] != targets.log_probs.shape[0]:
        raise ValueError(f"{student_logits.shape[0]} student answer tokens but {targets.log_probs.shape[0]} teacher ones")
    return token_divergences(student_logits, targets, divergence).sum()


class DistillTrainer(SFTTrainer):
    """TRL's SFTTrainer with the distillation loss; `DistillCollator` lays out each batch.

    Run with `remove_unused_columns=False` and `dataset_kwargs={"skip_prepare_dataset": True}`:
    the rows are (prompt_ids, teacher_prompt_ids, answer_ids), not TRL's tokenized columns.
    """

    # The loss is normalised over the whole accumulated batch (or scaled here when Trainer
    # gives no token count): Trainer must not divide it by the accumulation steps again.
    loss_is_scaled_for_ga = True

    def __init__(self, *args, divergence: str = "forward", top_k: int = 0, **kwargs):
        if divergence not in DIVERGENCES:
            raise ValueError(f"divergence {divergence!r}: use {' or '.join(DIVERGENCES)}")
        self.divergence, self.top_k = divergence, top_k
        super().__init__(*args, **kwargs)

    def teacher_logits(self, model, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher pass: the same wrapped model (DDP module, DeepSpeed engine: under ZeRO-3
        its hooks gather each layer's shards as the pass reaches it), adapter disabled, no graph.

        Args:
            model (torch.nn.Module): the wrapped student model (the teacher is it without its adapter).
            inputs (dict[str, torch.Tensor]): the collated batch, with the teacher's `teacher_*` tensors.
        """
        labels = inputs["teacher_labels"]
        with torch.no_grad(), self.accelerator.unwrap_model(model).disable_adapter():
            outputs = model(
                input_ids=inputs["teacher_input_ids"], attention_mask=inputs["teacher_attention_mask"],
                use_cache=False, logits_to_keep=logits_to_keep(labels),
            )
        return outputs.logits, labels

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The summed divergence over the batch's answer tokens, divided by `num_items_in_batch`.

        Args:
            model (torch.nn.Module): the wrapped student model.
            inputs (dict[str, torch.Tensor]): the collated batch (student and teacher sequences).
            return_outputs (bool): whether to return the student's outputs with the loss.
            num_items_in_batch (int | torch.Tensor | None): answer tokens over the accumulated batch; None: this batch's.
        """
        teacher_logits, teacher_labels = self.teacher_logits(model, inputs)
        targets = teacher_targets(answer_logits(teacher_logits, teacher_labels), self.top_k)
        del teacher_logits  # only the targets live on through the student pass and its backward
        labels = inputs["labels"]
        outputs = model(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
            use_cache=False, logits_to_keep=logits_to_keep(labels),
        )
        student = answer_logits(outputs.logits, labels)
        total = divergence_sum(student, targets, self.divergence)
        if num_items_in_batch is not None:
            # The mean over every answer token of the step, on every process: DDP and ZeRO
            # average the gradients of the processes, hence the factor (as Trainer's own loss).
            loss = total / torch.as_tensor(num_items_in_batch, device=total.device).clamp(min=1)
            if self.args.average_tokens_across_devices:
                loss = loss * self.accelerator.num_processes
        else:
            loss = total / max(student.shape[0], 1)
            if self.model.training:
                loss = loss / getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        return (loss, outputs) if return_outputs else loss
