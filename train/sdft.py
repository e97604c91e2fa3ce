"""On-policy self-distillation from the complete request (`objective: sdft`), by TRL's
`trl.experimental.sdft.SDFTTrainer` (trl 1.16, pinned in pyproject.toml).

Each optimizer step the student (the model with its LoRA adapter) drafts
`sdft.max_completion_length` tokens, `sdft.num_generations` per prompt, from the prefix S_i
(the row's dialogue up to its streamed user turn, rendered as `objective: sft` renders it);
the teacher (the same weights with the adapter disabled: TRL's `teacher_model_kind="base"`
on a PEFT model reuses the trained model under `disable_adapter()`, no second copy) reads
the same dialogue with S_i replaced by the complete request S_n and scores the student's
own draft; the loss is TRL's divergence between their next-token distributions on the
drafted tokens (`sdft.distillation_mode`, `sdft.distillation_alpha`). The rows' answers
are not used.

What is headstart's here, and why TRL's configuration covers the rest:
- The teacher prompt. TRL builds its user turn as
  `teacher_prompt_template.format(prompt=<student's last user turn>, privileged_context=...)`
  and keeps the turns before it. S_i is a prefix of S_n (checked), so with the template
  `"{prompt}{privileged_context}"` and the rest of the request S_n - S_i as the privileged
  context the teacher's user turn is exactly S_n: the full request replaces the prefix in the
  same dialogue (system turn, history), with no subclass.
- The rendering. TRL renders conversational prompts with `apply_chat_template`; the keyword
  arguments `headstart.prompts.render_prompt` adds (the template, Qwen3's thinking off) are
  given as `chat_template_kwargs`, and `check_rendering` proves on the run's first rows that
  TRL's ids are the evaluator's (`encode_prompt`) for the student and the teacher.
- The lengths. TRL cuts prompts from the left (`max_prompt_length`), which would drop the
  system turn; it is off, and rows whose teacher prompt plus the draft would exceed
  `training.max_length` are left out (a note says how many).
- The arguments: `training:` (SFTConfig fields) mapped onto SDFTConfig (`sdft_arguments`).
"""

from __future__ import annotations

import dataclasses
import os

from accelerate import PartialState
from datasets import Dataset

from headstart.prompts import Family, chat_template, detect_family, encode_prompt
from train.config import RecipeValueError, TrainRecipe
from train.data import check_rows
from train.tokenization import FULL_REQUEST, check_full_requests, dialogue, streamed_turn, with_system
from train.training_fields import TRAINING_DEFAULTS

# The API is experimental upstream; the pinned trl 1.16 is what this module and its tests use.
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl.experimental.sdft import SDFTConfig, SDFTTrainer  # noqa: E402

PRIVILEGED = "privileged_context"  # TRL's column name
TEACHER_PROMPT_TEMPLATE = "{prompt}{privileged_context}"  # S_i + (S_n - S_i) = S_n, see above
RENDERING_CHECKED_ROWS = 8
# SFTConfig fields of `training:` with no SDFTConfig counterpart that are dropped when at headstart's
# default (max_length is read here: the draft and the teacher prompt must fit in it).
SFT_ONLY_DEFAULTS = ("max_length", "packing", "packing_strategy", "padding_free", "completion_only_loss")


def sdft_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(SDFTConfig) if f.init}


def sdft_arguments(recipe: TrainRecipe, arguments: dict, effective_batch: int) -> dict:
    """TRL's SDFTConfig arguments: the SFTConfig arguments of the run (`arguments`, train/sft_config.py
    `trainer_arguments`) that SDFTConfig has, the `sdft:` section, and the teacher and prompt settings above.

    Args:
        arguments (dict): the run's SFTConfig arguments.
        effective_batch (int): sequences per optimizer step (the batch plan's).
    """
    s = recipe.sdft
    if effective_batch % s.num_generations:
        raise RecipeValueError(
            f"sdft.num_generations={s.num_generations} must divide the effective batch {effective_batch} (the batch "
            "plan of run.effective_batch_size): each step drafts num_generations answers to effective / "
            "num_generations prompts")
    fields = sdft_fields()
    for key in sorted(set(recipe.training) - fields):
        unused = key in SFT_ONLY_DEFAULTS and (key == "max_length" or recipe.training[key] == TRAINING_DEFAULTS[key])
        if not unused:
            raise RecipeValueError(f"training.{key} is a field of TRL's SFTConfig that SDFTConfig lacks: "
                                   "objective: sdft cannot use it; leave it out")
    return {k: v for k, v in arguments.items() if k in fields} | {
        field.name: getattr(s, field.name) for field in dataclasses.fields(s)} | dict(
        teacher_model_kind="base", teacher_prompt_template=TEACHER_PROMPT_TEMPLATE, max_prompt_length=None,
        remove_unused_columns=False,
        # TRL's SDFT batches hold prompt_ids and completion_ids, no input_ids for Trainer to count (it warns
        # every step); the completions/* metrics give the draft lengths instead.
        include_num_input_tokens_seen="no")


def sdft_row(example: dict, tokenizer, family: Family, system_message: str | None) -> dict:
    """TRL's columns of one row: `prompt`, the dialogue up to S_i (conversational), and the rest
    of the request S_n - S_i; and the teacher prompt's length in tokens.

    Args:
        example (dict): one row, with its complete request.
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        family (Family): the model's prompt family.
        system_message (str | None): the resolved system turn: KEEP_ROWS, None (no system turn) or its text.
    """
    messages = with_system(dialogue(example), system_message)
    prompt = messages[:streamed_turn(messages) + 1]
    rest = example[FULL_REQUEST][len(prompt[-1]["content"]):]
    teacher = [*prompt[:-1], {**prompt[-1], "content": example[FULL_REQUEST]}]
    return {"prompt": prompt, PRIVILEGED: rest, "teacher_length": len(encode_prompt(tokenizer, teacher, family))}


def sdft_rows(dataset: Dataset, tokenizer, family: Family, system_message: str | None, recipe: TrainRecipe,
              split: str) -> Dataset:
    """The split as SDFTTrainer reads it (`prompt`, `privileged_context`), without the rows
    whose teacher prompt and draft would not fit in `training.max_length`.

    Args:
        dataset (Dataset): the split's rows.
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        family (Family): the model's prompt family.
        system_message (str | None): the resolved system turn: KEEP_ROWS, None (no system turn) or its text.
        recipe (TrainRecipe): the training recipe (`training.max_length`).
        split (str): the split's name, for messages.
    """
    if FULL_REQUEST not in dataset.column_names:
        raise ValueError(
            f"objective: sdft needs the complete request of every row in a `{FULL_REQUEST}` column (the teacher's "
            f"prompt); the {split} split has only {', '.join(dataset.column_names)}. Rebuild the data with "
            f"`python -m data_builders` (it writes `{FULL_REQUEST}`) or add the column")
    check_rows(dataset, split)
    check_full_requests(dataset, split)
    rows = dataset.map(sdft_row, fn_kwargs={"tokenizer": tokenizer, "family": family, "system_message": system_message},
                       remove_columns=dataset.column_names, desc="Rendering student and teacher prompts")
    room = recipe.training["max_length"] - recipe.sdft.max_completion_length
    kept = rows.filter(lambda length: length <= room, input_columns="teacher_length").remove_columns("teacher_length")
    if not len(kept):
        raise ValueError(f"no {split} row's teacher prompt fits in training.max_length={recipe.training['max_length']} "
                         f"- sdft.max_completion_length={recipe.sdft.max_completion_length}; raise training.max_length")
    if len(kept) < len(rows) and PartialState().is_main_process:
        print(f"note: {len(rows) - len(kept)} of {len(rows)} {split} rows left out: their teacher prompt and "
              f"{recipe.sdft.max_completion_length} drafted tokens exceed training.max_length", flush=True)
    return kept


def chat_template_kwargs(tokenizer, family: Family) -> dict:
    """What `headstart.prompts.render_prompt` passes to apply_chat_template beside the dialogue
    (`check_rendering` proves the ids equal).

    Args:
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        family (Family): the model's prompt family.
    """
    extra = {"enable_thinking": False} if family == "qwen3" else {}
    return {"chat_template": chat_template(tokenizer), **extra}


def sdft_trainer(*, args: SDFTConfig, processing_class, data_collator=None, **kwargs) -> SDFTTrainer:
    """TRL's SDFTTrainer (its own batches: no collator), rendering as the evaluator does.

    Args:
        args (SDFTConfig): TRL's config of the run.
        processing_class (PreTrainedTokenizerBase): the model's tokenizer.
        data_collator (Any): must be None: SDFT builds its own batches.
        kwargs (Any): passed on to SDFTTrainer (`train_dataset` among them).
    """
    if data_collator is not None:
        raise ValueError("objective: sdft builds its batches from TRL's drafts; it takes no collator")
    family = detect_family(processing_class)
    args.chat_template_kwargs = chat_template_kwargs(processing_class, family)
    trainer = SDFTTrainer(args=args, processing_class=processing_class, **kwargs)
    check_rendering(trainer, kwargs["train_dataset"], family)
    return trainer


def teacher_prompt(trainer: SDFTTrainer, row: dict) -> list[dict]:
    """The teacher's dialogue TRL composes from one row.

    Args:
        trainer (SDFTTrainer): the trainer whose teacher context composes it.
        row (dict): one row of `sdft_rows`.
    """
    return trainer.teacher_context_builder._compose_teacher_prompt(row["prompt"], row[PRIVILEGED])


def check_rendering(trainer: SDFTTrainer, dataset: Dataset, family: Family) -> None:
    """TRL's student and teacher prompt ids on the first rows are the evaluator's ids of S_i and S_n.

    Args:
        trainer (SDFTTrainer): the trainer built.
        dataset (Dataset): the training rows (`sdft_rows`).
        family (Family): the model's prompt family.
    """
    tokenizer = trainer.processing_class
    for number, row in enumerate(dataset.select(range(min(RENDERING_CHECKED_ROWS, len(dataset)))), 1):
        prompt = row["prompt"]
        full = [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + row[PRIVILEGED]}]
        for who, trl_prompt, expected in (("student", prompt, prompt), ("teacher", teacher_prompt(trainer, row), full)):
            if trainer._tokenize_prompts([trl_prompt])[0] != encode_prompt(tokenizer, expected, family):
                raise ValueError(f"row {number}: TRL renders the {who} prompt differently from "
                                 "headstart.prompts.render_prompt; objective: sdft cannot train on this chat template")
