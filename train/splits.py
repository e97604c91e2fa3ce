"""The tokenized training and evaluation splits of a recipe, and what the adapter records of them."""

from __future__ import annotations

from accelerate import PartialState
from datasets import Dataset

from headstart.models import model_prompt_family
from headstart.prompts import Family
from train.config import TrainRecipe
from train.data import has_split, load_split
from train.provenance import answer_models, check_answer_models
from train.sdft import sdft_rows
from train.tokenization import check_fits, drop_over_long, tokenize_dataset, trained_system_record


def training_family(tokenizer, recipe: TrainRecipe) -> Family:
    """The rendering of the training rows: the completion format (`model.prompt_format`, a base model's),
    else the tokenizer's chat format, and ReFusion's for a Qwen3 base trained with `objective: refusion`
    (its tokens are added only after the data is tokenized; the adapter's tokenizer has them, so
    evaluation renders it as ReFusion).

    Args:
        tokenizer (PreTrainedTokenizerBase): the base model's tokenizer.
        recipe (TrainRecipe): the validated recipe.
    """
    source = recipe.model.name_or_path
    family = model_prompt_family(tokenizer, recipe.model.prompt_format, source)
    if family == "completion" and recipe.objective in ("refusion", "sdft"):
        raise ValueError(f"objective {recipe.objective} trains chat models; {source} is prompted as a base model "
                         "(prompt_format=completion): use objective sft or distill")
    return "refusion" if recipe.objective == "refusion" and family == "qwen3" else family


def evaluates(recipe: TrainRecipe) -> bool:
    """Whether the run evaluates: `training.eval_steps` above 0 and a `data.eval_split` the data holds
    (a local dataset's listing says; a hub dataset's split is assumed, and checked once read).

    Args:
        recipe (TrainRecipe): the validated recipe.
    """
    split = recipe.data.eval_split
    return bool(split) and (recipe.training["eval_steps"] or 0) > 0 and has_split(recipe.data.path, split) is not False


def load_data(recipe: TrainRecipe, tokenizer, state: PartialState,
              system: str | None) -> tuple[Dataset, Dataset | None, dict]:
    """Tokenized train and (optional) eval splits, and what the adapter records of its data; the
    main process tokenizes first, the others reuse its cache. Answers written by another model than
    the one trained are refused (`data.answers_from_other_model`). `objective: refusion` with
    `refusion.over_long: skip` drops the rows longer than `training.max_length`, as upstream, and
    says how many.

    Args:
        recipe (TrainRecipe): the validated recipe.
        tokenizer (PreTrainedTokenizerBase): the base model's tokenizer.
        state (PartialState): this process's accelerate state.
        system (str | None): the system message the rows are trained with (None: the template's default).
    """
    family, data = training_family(tokenizer, recipe), recipe.data
    sdft = recipe.objective == "sdft"  # trains on its own drafts: the rows' answers, whoever wrote them, unused
    skip_over_long = recipe.objective == "refusion" and recipe.refusion.over_long == "skip"
    max_length, dropped_notes, dropped_rows = recipe.training["max_length"], [], {}

    def prepare(rows: Dataset, split: str) -> Dataset:
        if sdft:
            return sdft_rows(rows, tokenizer, family, system, recipe, split)
        tokenized = tokenize_dataset(rows, tokenizer, family, system, recipe.objective)
        if skip_over_long:
            tokenized, dropped = drop_over_long(tokenized, max_length, split)
            dropped_rows[split] = dropped
            dropped_notes.append(f"refusion.over_long=skip: dropped {dropped} of the {len(rows)} {split} rows longer "
                                 f"than training.max_length={max_length} tokens (prompt + draft + answer)")
        return tokenized

    with state.main_process_first():
        train = load_split(data.path, data.train_split)
        if train is None:
            raise ValueError(f"{data.path} has no split {data.train_split!r}")
        notes = [] if sdft else check_answer_models(train, data.path, recipe.model.name_or_path,
                                                    data.answers_from_other_model)
        if data.max_train_samples:
            train = train.select(range(min(data.max_train_samples, len(train))))
        record = {**trained_system_record(system, train), "prompt_format": "completion" if family == "completion" else "chat",
                  "answer_models": None if sdft else sorted(answer_models(train, data.path) or []) or None}
        train = prepare(train, data.train_split)
        if not sdft:
            check_fits(train, max_length, data.train_split)
        evaluation = None
        if evaluates(recipe):
            evaluation = load_split(data.path, data.eval_split)
            if evaluation is None:  # a hub dataset: its splits are known once it is read
                raise ValueError(f"data.eval_split={data.eval_split!r}: {data.path} has no such split; "
                                 "give one it has, or data.eval_split=null")
            if data.max_eval_samples:
                evaluation = evaluation.select(range(min(data.max_eval_samples, len(evaluation))))
            evaluation = prepare(evaluation, data.eval_split)
    if state.is_main_process:
        for note in notes + dropped_notes:
            print(note, flush=True)
    if dropped_rows:  # the training record says what the model saw, not only what the data held
        record["over_long_rows_dropped"] = dropped_rows
    return train, evaluation, record
