"""Training data: load a conversational dataset and tokenize it for answer-only loss.

Rows hold a `messages` list (system, user prefix, assistant answer), or, as the
ReFusion data builds write them, a `query` (the prefix) and a `response` (the
answer), plus a `draft` in draft-refinement builds. The prompt
is rendered by `headstart.prompts.render_prompt`, the same function evaluation
uses, so the adapted model is trained on exactly the prompt it is tested on.
The prompt and the answer are tokenized separately and concatenated: the
boundary is exact (no token merges across it), and the model sees at training
time the very prompt ids it is given at inference, followed by its answer.

`objective: distill` also needs each row's complete request S_n, in a
`full_request` column (data_builders writes it): the teacher's prompt is the
student's with the streamed user turn S_i replaced by S_n.
"""

from __future__ import annotations

import json
from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset, load_from_disk
from transformers import PreTrainedTokenizerBase

from headstart.fingerprint import file_sha256, files_sha256, tree_sha256
from headstart.prompts import SYSTEM_ALIASES, SYSTEM_SETTINGS, Family, render_prompt, resolve_system_message

FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_split(path: str, split: str) -> Dataset | None:
    """One split of a dataset stored anywhere we accept; None when the split is absent.
    An empty file or split, or a line that is not JSON, is an error naming it."""
    local = Path(path).expanduser()
    if local.suffix in FILE_FORMATS:
        if not local.is_file():
            raise FileNotFoundError(f"data file not found: {path}")
        if split != "train":
            return None  # a single file holds one split: it is the training split, there is no other
        return _nonempty(_load_file(local), path, split)
    if local.is_dir():
        listing = local / "dataset_dict.json"  # a DatasetDict: each split is read on its own
        if listing.is_file():
            if split not in json.loads(listing.read_text()).get("splits", []):
                return None
            return _nonempty(_load_saved(local / split, path, split), path, split)
        return _nonempty(_load_saved(local, path, split), path, split) if split == "train" else None
    if path.startswith((".", "/", "~")) or path.startswith("outputs/"):
        raise FileNotFoundError(f"dataset not found: {path} (build it first, e.g. python -m data_builders)")
    try:
        return load_dataset(path, split=split)
    except ValueError as error:  # datasets raises ValueError for an unknown split
        if "split" in str(error).lower():
            return None
        raise


def data_fingerprint(path: str) -> str:
    """What a run is trained from, by content: "sha256:<hex>" of a data file's bytes, or of a
    saved dataset's rows (its .arrow files and split list: `save_to_disk` also writes a random
    fingerprint into state.json, which a rebuild of the same rows changes); a hub id is named,
    "hub:<id>" (the hub resolves it). Reads no dataset."""
    local = Path(path).expanduser()
    if local.is_file():
        return "sha256:" + file_sha256(local)
    if local.is_dir():
        rows = sorted(p for p in local.rglob("*") if p.is_file() and (p.suffix == ".arrow" or p.name == "dataset_dict.json"))
        if not rows:
            return "sha256:" + tree_sha256(local)
        return "sha256:" + files_sha256([(str(p.relative_to(local)), p) for p in rows])
    return f"hub:{path}"


def _load_file(path: Path) -> Dataset:
    """A .jsonl/.json/.parquet file through `datasets`; its errors (an empty file: a bare
    StopIteration; a bad line: DatasetGenerationError) become the file and line at fault."""
    if FILE_FORMATS[path.suffix] == "json" and not _first_line(path):
        raise ValueError(f"{path}: the file holds no rows (empty)")
    try:
        return load_dataset(FILE_FORMATS[path.suffix], data_files=str(path), split="train")
    except Exception as error:
        if FILE_FORMATS[path.suffix] == "json":
            _raise_bad_json_line(path)
        raise ValueError(f"{path}: cannot be read as a {path.suffix} dataset ({type(error).__name__}: {error})") from error


def _first_line(path: Path) -> str:
    with path.open("rb") as handle:
        for line in handle:
            if line.strip():
                return line.decode("utf-8", errors="replace")
    return ""


def _raise_bad_json_line(path: Path) -> None:
    """Name the first line of a JSON-lines file that is not a JSON object (a .json array is read whole)."""
    with path.open("rb") as handle:
        if _first_line(path).lstrip().startswith("["):
            try:
                json.loads(handle.read())
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise ValueError(f"{path}: not a JSON array ({error})") from error
            return
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise ValueError(f"{path}:{number}: not a JSON line ({error})") from error
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: not a JSON object")


def _load_saved(directory: Path, path: str, split: str) -> Dataset:
    """A split written by `save_to_disk`. One without rows has no data file, and
    `load_from_disk` fails on it (and on the whole DatasetDict) with an IndexError."""
    state = directory / "state.json"
    if state.is_file() and not json.loads(state.read_text()).get("_data_files"):
        raise ValueError(f"{path}: split {split!r} holds no rows")
    try:
        stored = load_from_disk(str(directory))
    except Exception as error:
        raise ValueError(f"{path}: cannot be read as a saved dataset ({type(error).__name__}: {error})") from error
    if isinstance(stored, DatasetDict):
        raise ValueError(f"{directory}: a DatasetDict inside a split directory")
    return stored


def _nonempty(dataset: Dataset, path: str, split: str) -> Dataset:
    if len(dataset) == 0:
        raise ValueError(f"{path}: split {split!r} holds no rows")
    return dataset


def check_rows(dataset: Dataset, split: str) -> None:
    """Every row is a dialogue ending with an assistant answer: a `messages` list of
    {role, content} turns, or `query` and `response` strings. The error names the row
    (counting from 1) and the field."""
    columns = dataset.column_names
    fields = ("messages",) if "messages" in columns else ("query", "response")
    for number, row in enumerate(dataset.select_columns(list(fields)), 1):
        where = f"{split} row {number} (counting from 1)"
        if fields == ("messages",):
            messages = row["messages"]
            if not isinstance(messages, list) or not messages:
                raise ValueError(f"{where}: field `messages` is missing or empty")
            for turn in messages:
                if not isinstance(turn, dict) or not isinstance(turn.get("role"), str) or not isinstance(turn.get("content"), str):
                    raise ValueError(f"{where}: every turn of `messages` needs a `role` and a `content` string; got {turn!r}")
            if messages[-1]["role"] != "assistant":
                raise ValueError(f"{where}: the dialogue must end with an assistant turn (the answer)")
        else:
            for name in fields:
                if not isinstance(row[name], str):
                    raise ValueError(f"{where}: field `{name}` is missing or not a string")


# `system_message` below is the training setting resolved once (`resolve_training_system`):
# KEEP_ROWS (the `dataset` setting: each row's own turn), None (no system turn) or the text.
KEEP_ROWS = "\x00keep the rows' own system turns"  # a string: it survives datasets' pickling and hashing


def resolve_training_system(setting: str, model_source: str | None) -> str | None:
    """The system turn training gives every row: KEEP_ROWS for `dataset`, else the text of
    `headstart.prompts.resolve_system_message` (None: no system turn)."""
    return KEEP_ROWS if setting == "dataset" else resolve_system_message(setting, model_source)


def with_system(messages: list[dict[str, str]], system: str | None) -> list[dict[str, str]]:
    """The dialogue with its system turn replaced as resolved: kept (KEEP_ROWS), removed (None) or set."""
    if system == KEEP_ROWS:
        return messages
    rest = [m for m in messages if m["role"] != "system"]
    return rest if system is None else [{"role": "system", "content": system}] + rest


def rows_system_messages(dataset: Dataset) -> set[str | None]:
    """The distinct system messages the rows carry themselves (None: a row without one)."""
    if "messages" not in dataset.column_names:
        return {None}
    found: set[str | None] = set()
    for messages in dataset["messages"]:
        systems = [m["content"] for m in messages if m.get("role") == "system"]
        found.add(systems[0] if systems else None)
    return found


def trained_system_record(system: str | None, dataset: Dataset) -> dict:
    """What the adapter records of its system message (headstart.json): the text, or for rows
    keeping their own, the one they share; `system_message_varies` when they differ."""
    if system != KEEP_ROWS:
        return {"system_message": system}
    found = rows_system_messages(dataset)
    return {"system_message": next(iter(found))} if len(found) == 1 else {"system_message": None,
                                                                         "system_message_varies": True}


def split_prompt_answer(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], family: Family
) -> tuple[str, str]:
    """(prompt text up to the answer, answer text with its end-of-turn markers). ReFusion's
    answer is its text and the EOS token, as upstream trains it (ML-GSAI/ReFusion train.py:
    the generation prompt, then the encoded response and eos_token_id)."""
    if not messages or messages[-1]["role"] != "assistant":
        raise ValueError("each training dialogue must end with an assistant turn")
    prompt = render_prompt(tokenizer, messages[:-1], family, add_generation_prompt=True)
    if family == "refusion":
        return prompt, messages[-1]["content"] + tokenizer.eos_token
    full = render_prompt(tokenizer, messages, family, add_generation_prompt=False)
    if not full.startswith(prompt):
        raise ValueError(
            "the chat template renders the prompt differently with and without the answer; "
            f"cannot find the answer boundary.\nprompt: {prompt[-200:]!r}\nfull: {full[-400:]!r}"
        )
    return prompt, full[len(prompt):]


def dialogue(example: dict) -> list[dict[str, str]]:
    """The row as a dialogue: its `messages`, or a ReFusion row's `query` and `response`
    as one user and one assistant turn (the system turn is set by `with_system`)."""
    if "messages" in example:
        return example["messages"]
    return [{"role": "user", "content": example["query"]}, {"role": "assistant", "content": example["response"]}]


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def tokenize_parts(
    example: dict, tokenizer: PreTrainedTokenizerBase, family: Family, system_message: str | None
) -> dict[str, list[int]]:
    """prompt_ids, draft_ids (empty without a draft) and answer_ids of one row, each tokenized apart."""
    messages = with_system(dialogue(example), system_message)
    prompt, answer = split_prompt_answer(tokenizer, messages, family)
    return {
        "prompt_ids": _ids(tokenizer, prompt),
        "draft_ids": _ids(tokenizer, example.get("draft") or ""),
        "answer_ids": _ids(tokenizer, answer),
    }


def tokenize_example(
    example: dict, tokenizer: PreTrainedTokenizerBase, family: Family, system_message: str | None
) -> dict[str, list[int]]:
    """input_ids and completion_mask (1 on answer tokens) for one dialogue."""
    parts = tokenize_parts(example, tokenizer, family, system_message)
    prompt_ids, answer_ids = parts["prompt_ids"], parts["answer_ids"]
    return {"input_ids": prompt_ids + answer_ids, "completion_mask": [0] * len(prompt_ids) + [1] * len(answer_ids)}


FULL_REQUEST = "full_request"


def streamed_turn(messages: list[dict[str, str]]) -> int:
    """Index of the streamed user turn: the one the answer answers (the turn before it)."""
    if len(messages) < 2 or messages[-2]["role"] != "user":
        raise ValueError("the answer must follow the streamed user turn (the prefix S_i)")
    return len(messages) - 2


def teacher_dialogue(example: dict) -> list[dict[str, str]]:
    """The row's dialogue with the streamed user turn S_i replaced by the complete request S_n:
    same system turn, same history, same answer."""
    messages = [dict(turn) for turn in dialogue(example)]
    messages[streamed_turn(messages)]["content"] = example[FULL_REQUEST]
    return messages


def check_full_requests(dataset: Dataset, split: str) -> None:
    """`objective: distill`: every row holds its complete request S_n, and its streamed
    user turn S_i is a prefix of it (PROTOCOL: S_i = s_1 + ... + s_i). Run after `check_rows`."""
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
    """The column `objective: distill` adds, named before anything else is checked."""
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
    and answer_ids (the one answer both are scored on), each tokenized apart."""
    student = with_system(dialogue(example), system_message)
    teacher = with_system(teacher_dialogue(example), system_message)
    prompt, answer = split_prompt_answer(tokenizer, student, family)
    teacher_prompt, teacher_answer = split_prompt_answer(tokenizer, teacher, family)
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
    here, without a model directory); any other text is the system message itself."""
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
    in the longer of the student and teacher sequences: both must keep it)."""
    if "completion_mask" in dataset.column_names:
        return [mask.index(1) if 1 in mask else len(mask) for mask in dataset["completion_mask"]]
    if "teacher_prompt_ids" in dataset.column_names:
        return [max(len(p), len(t)) for p, t in zip(dataset["prompt_ids"], dataset["teacher_prompt_ids"])]
    return [len(p) + len(d) for p, d in zip(dataset["prompt_ids"], dataset["draft_ids"])]


def check_fits(dataset: Dataset, max_length: int, split: str) -> None:
    """Fail clearly when truncation to `max_length` would leave no answer token to learn from."""
    starts = answer_starts(dataset)
    kept = sum(start < max_length for start in starts)
    if kept == 0:
        raise ValueError(
            f"no {split} example keeps an answer token within training.max_length={max_length}: "
            f"the shortest prompt has {min(starts)} tokens; raise training.max_length"
        )


ANSWER_MODEL = "answer_model"


def same_model(a: str, b: str) -> bool:
    """Whether two model names denote the same model: equal, or the same repository/directory
    name (a hub id and its local copy), an embedded alias, its GGUF file and the directory
    `headstart.models.resolve_model_dir` converts that file into all alike."""
    return a.strip().rstrip("/").lower() == b.strip().rstrip("/").lower() or model_key(a) == model_key(b)


def model_key(name: str) -> str:
    """What identifies a model across its spellings: the GGUF stem for an embedded alias, a .gguf
    file or its converted directory; else the last part of a hub id or path (lower case)."""
    from headstart.models import EMBEDDED_MODELS, converted_gguf_stem

    name = name.strip().rstrip("/")
    if name.lower() in EMBEDDED_MODELS:
        return Path(EMBEDDED_MODELS[name.lower()][1]).stem.lower()
    path = Path(name).expanduser()
    return (converted_gguf_stem(path) or path.name.lower().removesuffix(".gguf")).lower()


def answer_models(dataset: Dataset, path: str) -> set[str] | None:
    """Which models wrote the rows' answers: the `answer_model` column (data_builders writes it;
    empty for a corpus's own answers), else, for a build that predates it, the `model` of its
    config.yaml when its rows say `answer_kind: self`. None: the data does not say."""
    if ANSWER_MODEL in dataset.column_names:
        return {m for m in dataset.unique(ANSWER_MODEL) if m}
    if "answer_kind" in dataset.column_names and "self" in dataset.unique("answer_kind"):
        config = Path(path).expanduser() / "config.yaml"
        if config.is_file():
            from omegaconf import OmegaConf

            model = OmegaConf.load(config).get("model")
            return {str(model)} if model else None
        return None
    if "answer_kind" in dataset.column_names:
        return set()  # corpus answers only
    return None


def check_answer_models(dataset: Dataset, path: str, model: str, allowed: bool) -> list[str]:
    """Refuse answers written by another model than the one trained (self-distillation data of
    another model is distillation from it), unless `data.answers_from_other_model`; returns notes."""
    writers = answer_models(dataset, path)
    if writers is None:
        return [f"note: {path} does not say which model wrote its answers (no `{ANSWER_MODEL}` column)"]
    others = sorted(w for w in writers if not same_model(w, model))
    if not others:
        return []
    if allowed:
        return [f"note: training {model} on answers written by {', '.join(others)} (data.answers_from_other_model=true)"]
    raise ValueError(
        f"{path} holds answers written by {', '.join(others)}, not by the model trained here ({model}): that is "
        f"distillation from another model, not self-distillation. Build this model's own data (e.g. "
        f"`python -m data_builders recipe=lmsys_prefix_<model>` or `model={model}`), or set "
        f"data.answers_from_other_model=true to train on them anyway"
    )
