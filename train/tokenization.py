"""Tokenize training rows for answer-only loss, with the prompt evaluation uses.

The prompt is rendered by `headstart.prompts.render_prompt`, the same function
evaluation uses, so the adapted model is trained on exactly the prompt it is tested
on. The prompt and the answer are tokenized separately and concatenated: the
boundary is exact (no token merges across it), and the model sees at training
time the very prompt ids it is given at inference, followed by its answer.

`objective: distill` also needs each row's complete request S_n, in a
`full_request` column (data_builders writes it): the teacher's prompt is the
student's with the streamed user turn S_i replaced by S_n.
"""

from __future__ import annotations

from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from headstart.completion import TRANSCRIPT, CompletionFrame, completion_frame
from headstart.prompts import SYSTEM_ALIASES, SYSTEM_SETTINGS, Family, render_prompt, resolve_system_message
from train.data import check_rows

IGNORE_INDEX = -100  # the label of a token not learned from (torch's cross-entropy ignore_index)

# `system_message` below is the training setting resolved once (`resolve_training_system`):
# KEEP_ROWS (the `dataset` setting: each row's own turn), None (no system turn) or the text.
KEEP_ROWS = "\x00keep the rows' own system turns"  # a string: it survives datasets' pickling and hashing


def resolve_training_system(setting: str, model_source: str | None) -> str | None:
    """The system turn training gives every row: KEEP_ROWS for `dataset`, else the text of
    `headstart.prompts.resolve_system_message` (None: no system turn).

    Args:
        setting (str): `data.system_message`: a setting name or the text itself.
        model_source (str | None): the model's name or path (for a model's own default); None: unknown.
    """
    return KEEP_ROWS if setting == "dataset" else resolve_system_message(setting, model_source)


def with_system(messages: list[dict[str, str]], system: str | None) -> list[dict[str, str]]:
    """The dialogue with its system turn replaced as resolved: kept (KEEP_ROWS), removed (None) or set.

    Args:
        messages (list[dict[str, str]]): the dialogue.
        system (str | None): the resolved system turn: KEEP_ROWS, None (no system turn) or its text.
    """
    if system == KEEP_ROWS:
        return messages
    rest = [m for m in messages if m["role"] != "system"]
    return rest if system is None else [{"role": "system", "content": system}] + rest


def rows_system_messages(dataset: Dataset) -> set[str | None]:
    """The distinct system messages the rows carry themselves (None: a row without one).

    Args:
        dataset (Dataset): the training rows.
    """
    if "messages" not in dataset.column_names:
        return {None}
    found: set[str | None] = set()
    for messages in dataset["messages"]:
        systems = [m["content"] for m in messages if m.get("role") == "system"]
        found.add(systems[0] if systems else None)
    return found


def trained_system_record(system: str | None, dataset: Dataset) -> dict:
    """What the adapter records of its system message (headstart.json): the text, or for rows
    keeping their own, the one they share; `system_message_varies` when they differ.

    Args:
        system (str | None): the resolved system turn: KEEP_ROWS, None (no system turn) or its text.
        dataset (Dataset): the training rows.
    """
    if system != KEEP_ROWS:
        return {"system_message": system}
    found = rows_system_messages(dataset)
    return {"system_message": next(iter(found))} if len(found) == 1 else {"system_message": None,
                                                                         "system_message_varies": True}


def split_prompt_answer(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], family: Family,
    frame: CompletionFrame = TRANSCRIPT,
) -> tuple[str, str]:
    """(prompt text up to the answer, answer text with its end-of-turn markers). ReFusion's
    answer is its text and the EOS token, as upstream trains it (ML-GSAI/ReFusion train.py:
    the generation prompt, then the encoded response and eos_token_id); so is a base model's in
    the completion format: its answer follows the request's frame (a row's `frame`; the transcript
    by default) after the frame's `answer_lead`.

    Args:
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        messages (list[dict[str, str]]): the dialogue, ending with the assistant's answer.
        family (Family): the model's prompt family.
        frame (CompletionFrame): the frame of the request (family "completion" only).
    """
    if not messages or messages[-1]["role"] != "assistant":
        raise ValueError("each training dialogue must end with an assistant turn")
    prompt = render_prompt(tokenizer, messages[:-1], family, add_generation_prompt=True, frame=frame)
    if family == "refusion":
        return prompt, messages[-1]["content"] + tokenizer.eos_token
    if family == "completion":  # the frame (the transcript's "Assistant:"), then the answer and the model's EOS
        return prompt, frame.answer_lead + messages[-1]["content"] + tokenizer.eos_token
    full = render_prompt(tokenizer, messages, family, add_generation_prompt=False)
    if not full.startswith(prompt):
        raise ValueError(
            "the chat template renders the prompt differently with and without the answer; "
            f"cannot find the answer boundary.\nprompt: {prompt[-200:]!r}\nfull: {full[-400:]!r}"
        )
    return prompt, full[len(prompt):]


def row_frame(example: dict) -> CompletionFrame:
    """The completion frame a row's request is written in: its `frame` column (a data build's
    `generation.completion_frame`), else the transcript.

    Args:
        example (dict): one row.
    """
    return completion_frame(example.get("frame") or "transcript")


def dialogue(example: dict) -> list[dict[str, str]]:
    """The row as a dialogue: its `messages`, or a ReFusion row's `query` and `response`
    as one user and one assistant turn (the system turn is set by `with_system`).

    Args:
        example (dict): one row.
    """
    if "messages" in example:
        return example["messages"]
    return [{"role": "user", "content": example["query"]}, {"role": "assistant", "content": example["response"]}]


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def tokenize_parts(
    example: dict, tokenizer: PreTrainedTokenizerBase, family: Family, system_message: str | None
) -> dict[str, list[int]]:
    """prompt_ids, draft_ids (empty without a draft) and answer_ids of one row, each tokenized apart.

    Args:
        example (dict): one row.
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        family (Family): the model's prompt family.
        system_message (str | None): the resolved system turn: KEEP_ROWS, None (no system turn) or its text.
    """
    messages = with_system(dialogue(example), system_message)
    prompt, answer = split_prompt_answer(tokenizer, messages, family, row_frame(example))
    return {
        "prompt_ids": _ids(tokenizer, prompt),
        "draft_ids": _ids(tokenizer, example.get("draft") or ""),
        "answer_ids": _ids(tokenizer, answer),
    }


def tokenize_example(
    example: dict, tokenizer: PreTrainedTokenizerBase, family: Family, system_message: str | None
) -> dict[str, list[int]]:
    """input_ids and completion_mask (1 on answer tokens) for one dialogue.

    Args:
        example (dict): one row.
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        family (Family): the model's prompt family.
        system_message (str | None): the resolved system turn: KEEP_ROWS, None (no system turn) or its text.
    """
    parts = tokenize_parts(example, tokenizer, family, system_message)
    prompt_ids, answer_ids = parts["prompt_ids"], parts["answer_ids"]
    return {"input_ids": prompt_ids + answer_ids, "completion_mask": [0] * len(prompt_ids) + [1] * len(answer_ids)}


FULL_REQUEST = "full_request"


def streamed_turn(messages: list[dict[str, str]]) -> int:
    """Index of the streamed user turn: the one the answer answers (the turn before it).

    Args:
        messages (list[dict[str, str]]): the dialogue, ending with the answer.
    """
    if len(messages) < 2 or messages[-2]["role"] != "user":
        raise ValueError("the answer must follow the streamed user turn (the prefix S_i)")
    return len(messages) - 2


def teacher_dialogue(example: dict) -> list[dict[str, str]]:
    """The row's dialogue with the streamed user turn S_i replaced by the complete request S_n:
    same system turn, same history, same answer.

    Args:
        example (dict): one row, with its complete request.
    """
    messages = [dict(turn) for turn in dialogue(example)]
    messages[streamed_turn(messages)]["content"] = example[FULL_REQUEST]
    return messages


def check_full_requests(dataset: Dataset, split: str) -> None:
    """`objective: distill`: every row holds its complete request S_n, and its streamed
    user turn S_i is a prefix of it (PROTOCOL: S_i = s_1 + ... + s_i). Run after `check_rows`.

    Args:
        dataset (Dataset): the split's rows.
        split (str): the split's name, for the message.
    """
    fields = [FULL_REQUEST, "messages" if "messages" in dataset.column_names else "query"]
    for number, row in enumerate(dataset.select_columns(fields), 1):
        where = f"{split} row {number} (counting from 1)"
        full = row[FULL_REQUEST]
        if not isinstance(full, str) or not full:
            raise ValueError(f"{where}: field `{FULL_REQUEST}` is missing or empty")
        if "messages" in row:
            try:
                prefix = row["messages"][streamed_turn(row["messages"])]["content"]
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from error
        else:
            prefix = row["query"]
        if not full.startswith(prefix):
            raise ValueError(
                f"{where}: the streamed user turn is not a prefix of `{FULL_REQUEST}` (S_i must start S_n): "
                f"{prefix[:80]!r} vs {full[:80]!r}"
            )


def require_full_request(dataset: Dataset, split: str) -> None:
    """The column `objective: distill` adds, named before anything else is checked.

    Args:
        dataset (Dataset): the split's rows.
        split (str): the split's name, for the message.
    """
    if FULL_REQUEST not in dataset.column_names:
        raise ValueError(
            f"objective: distill needs the complete request of every row in a `{FULL_REQUEST}` column (the "
            f"teacher's prompt); the {split} split has only {', '.join(dataset.column_names)}. Rebuild the data "
            f"with `python -m data_builders` (it writes `{FULL_REQUEST}`) or add the column"
        )


def tokenize_distill(
    example: dict, tokenizer: PreTrainedTokenizerBase, family: Family, system_message: str | None
) -> dict[str, list[int]]:
    """prompt_ids (the student's prompt, S_i), teacher_prompt_ids (the same dialogue with S_n)
    and answer_ids (the one answer both are scored on), each tokenized apart.

    Args:
        example (dict): one row, with its complete request.
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        family (Family): the model's prompt family.
        system_message (str | None): the resolved system turn: KEEP_ROWS, None (no system turn) or its text.
    """
    student = with_system(dialogue(example), system_message)
    teacher = with_system(teacher_dialogue(example), system_message)
    frame = row_frame(example)
    prompt, answer = split_prompt_answer(tokenizer, student, family, frame)
    teacher_prompt, teacher_answer = split_prompt_answer(tokenizer, teacher, family, frame)
    if teacher_answer != answer:
        raise ValueError("the chat template renders the answer differently after the full request; "
                         f"cannot score one answer under both prompts: {answer[:80]!r} vs {teacher_answer[:80]!r}")
    return {
        "prompt_ids": _ids(tokenizer, prompt),
        "teacher_prompt_ids": _ids(tokenizer, teacher_prompt),
        "answer_ids": _ids(tokenizer, answer),
    }


TOKENIZERS = {"sft": tokenize_example, "refusion": tokenize_parts, "distill": tokenize_distill}


def tokenize_dataset(
    dataset: Dataset, tokenizer: PreTrainedTokenizerBase, family: Family, system_message: str | None, objective: str = "sft"
) -> Dataset:
    """Tokenize for `objective`: sft gives TRL's pre-tokenized form (input_ids, completion_mask);
    refusion gives the parts the ReFusion collator lays out (prompt_ids, draft_ids, answer_ids);
    distill the parts of the student and teacher sequences (prompt_ids, teacher_prompt_ids, answer_ids).
    `system_message`: what `resolve_training_system` returned, or a setting name (resolved
    here, without a model directory); any other text is the system message itself.

    Args:
        dataset (Dataset): the split's rows.
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        family (Family): the model's prompt family.
        system_message (str | None): the resolved system turn, or a setting name (see above).
        objective (str): "sft", "refusion" or "distill".
    """
    if system_message in SYSTEM_SETTINGS or system_message in SYSTEM_ALIASES:
        system_message = resolve_training_system(system_message, None)
    columns = dataset.column_names
    if "messages" not in columns and not {"query", "response"} <= set(columns):
        raise ValueError(f"training data needs a `messages` column, or `query` and `response`; found {columns}")
    if "draft" in columns and objective != "refusion":
        raise ValueError("draft-refinement rows (a `draft` column) train with `objective: refusion`")
    split = str(dataset.split or "training data")
    if objective == "distill":
        require_full_request(dataset, split)
    check_rows(dataset, split)
    if objective == "distill":
        check_full_requests(dataset, split)
    return dataset.map(
        TOKENIZERS[objective],
        fn_kwargs={"tokenizer": tokenizer, "family": family, "system_message": system_message},
        remove_columns=columns,
        desc="Tokenizing prompts and answers",
    )


def answer_starts(dataset: Dataset) -> list[int]:
    """Index of each row's first answer token in the sequence the model sees (for distill,
    in the longer of the student and teacher sequences: both must keep it).

    Args:
        dataset (Dataset): the tokenized rows.
    """
    if "completion_mask" in dataset.column_names:
        return [mask.index(1) if 1 in mask else len(mask) for mask in dataset["completion_mask"]]
    if "teacher_prompt_ids" in dataset.column_names:
        return [max(len(p), len(t)) for p, t in zip(dataset["prompt_ids"], dataset["teacher_prompt_ids"])]
    return [len(p) + len(d) for p, d in zip(dataset["prompt_ids"], dataset["draft_ids"])]


def check_fits(dataset: Dataset, max_length: int, split: str) -> None:
    """Fail clearly when truncation to `max_length` would leave no answer token to learn from.

    Args:
        dataset (Dataset): the tokenized rows.
        max_length (int): `training.max_length`.
        split (str): the split's name, for the message.
    """
    starts = answer_starts(dataset)
    kept = sum(start < max_length for start in starts)
    if kept == 0:
        raise ValueError(
            f"no {split} example keeps an answer token within training.max_length={max_length}: "
            f"the shortest prompt has {min(starts)} tokens; raise training.max_length"
        )


def drop_over_long(dataset: Dataset, max_length: int, split: str) -> tuple[Dataset, int]:
    """`refusion.over_long: skip`, as upstream (ML-GSAI/ReFusion train.py): rows whose prompt + draft +
    answer exceed `max_length` tokens are dropped, not cut (a cut loses the answer's end and its EOS).
    Returns the rows kept and the number dropped; an error naming training.max_length when none is kept.

    Args:
        dataset (Dataset): the tokenized rows (prompt_ids, draft_ids, answer_ids).
        max_length (int): `training.max_length`.
        split (str): the split's name, for the message.
    """
    lengths = [len(p) + len(d) + len(a)
               for p, d, a in zip(dataset["prompt_ids"], dataset["draft_ids"], dataset["answer_ids"])]
    kept = [index for index, length in enumerate(lengths) if length <= max_length]
    if lengths and not kept:
        raise ValueError(
            f"no {split} row fits training.max_length={max_length}: the shortest has {min(lengths)} tokens "
            "(prompt + draft + answer), and refusion.over_long=skip drops longer rows; raise training.max_length "
            "or set refusion.over_long=cut"
        )
    return (dataset if len(kept) == len(dataset) else dataset.select(kept)), len(dataset) - len(kept)
