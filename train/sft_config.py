"""The `training:` section of a recipe: TRL's `SFTConfig` with headstart's defaults.

A recipe's `training:` keys are `SFTConfig`'s field names (as alignment-handbook's recipes give
them). `HeadstartSFTConfig` declares the fields headstart sets its own way, with their defaults
and help, as TRL's `SFTConfig` does over `TrainingArguments`; those fields are what `--help`
lists and what a recipe's section starts from. `sft_config` builds it for one launch: the
recipe's values, and what the launch decides (batch plan, precision, evaluation, placement).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerate import PartialState
from transformers.trainer_utils import SaveStrategy, SchedulerType
from trl import SFTConfig

from headstart.config import error_line
from train.batch import batch_plan
from train.config import RecipeValueError, TrainRecipe
from train.model import model_init_kwargs, use_bf16
from train.processes import process_device, process_state_kwargs

_TRL_FIELDS = {f.name: f for f in dataclasses.fields(SFTConfig)}


def _headstart(default: Any = None, note: str = "", *, factory: Any = None) -> Any:
    """A field headstart sets its own way; `note`: what headstart does beyond TRL's meaning."""
    kind = {"default_factory": factory} if factory is not None else {"default": default}
    return dataclasses.field(**kind, metadata={"headstart": note})


def _with_trl_help(cls: type) -> type:
    """Give each field `cls` declares TRL's help, then its headstart note, as its `help` metadata
    (what HfArgumentParser and `--help` read)."""
    for name in cls.__annotations__:
        f, note = cls.__dataclass_fields__[name], cls.__dataclass_fields__[name].metadata["headstart"]
        text = _TRL_FIELDS[name].metadata.get("help", "") + (f" headstart: {note}." if note else "")
        f.metadata = types.MappingProxyType({"help": text})  # argparse's keywords only
    return cls


@_with_trl_help
@dataclass
class HeadstartSFTConfig(SFTConfig):
    r"""TRL's [`SFTConfig`] with the defaults of headstart's embedded CPU recipe (`smollm2_prefix`): a bare
    `train/sft.py` run trains SmolLM2-135M in minutes without network. A field's help is TRL's, then
    what headstart does beyond it (`training_help_rows`).

    > [!NOTE]
    > These parameters have default values different from [`SFTConfig`]:
    > - `learning_rate` `2e-4` (not `2e-5`), `per_device_train_batch_size` `2` (not `8`), `max_length` `512`
    >   (not `1024`), `max_steps` `20` (not `-1`), `lr_scheduler_type` `"cosine"` (not `"linear"`),
    >   `warmup_steps` `0.03` (not `0`), `logging_steps` `1` (not `10`), `save_steps` `10` (not `500`),
    >   `save_total_limit` `2` (not `None`), `eval_steps` `0` (never; not `None`).
    > - `bf16` `None`: on with CUDA, off on CPU (not on unless `fp16`); `activation_checkpointing` `False`
    >   (not on); `completion_only_loss` `True` (the answer only).
    > - `report_to` `["tensorboard", "wandb"]` (not `"none"`); `include_num_input_tokens_seen` `"all"` (not `"no"`).
    """

    output_dir: str | None = _headstart(None, "null: outputs/train/<recipe>")
    run_name: str | None = _headstart(None, "null: <recipe>-<model name>")
    learning_rate: float = _headstart(2e-4, "scaled by the square root when the batch plan raises the effective batch")
    per_device_train_batch_size: int = _headstart(2, "at most: lowered to keep run.effective_batch_size")
    max_length: int | None = _headstart(512)
    max_steps: int = _headstart(20)
    lr_scheduler_type: SchedulerType | str = _headstart("cosine")
    warmup_steps: float = _headstart(0.03)
    weight_decay: float = _headstart(0.0)
    max_grad_norm: float = _headstart(1.0)
    seed: int = _headstart(42, "also the data order (data_seed) unless given")
    bf16: bool | None = _headstart(None, "null: on with CUDA, off on CPU; true asks for a GPU (refused where CUDA is "
                                         "unusable, unless accelerate launch --cpu)")
    activation_checkpointing: bool | None = _headstart(False)
    packing: bool = _headstart(False)
    packing_strategy: str = _headstart("bfd")
    padding_free: bool = _headstart(False)
    completion_only_loss: bool | None = _headstart(True)
    logging_steps: float = _headstart(1)
    save_strategy: SaveStrategy | str = _headstart("steps")
    save_steps: float = _headstart(10)
    save_total_limit: int | None = _headstart(2)
    eval_steps: float | None = _headstart(0, "0: never; else every N steps when data.eval_split exists")
    report_to: None | str | list[str] = _headstart(
        note="trackers train/tracking.py configures: tensorboard, wandb, or [none]",
        factory=lambda: ["tensorboard", "wandb"])
    include_num_input_tokens_seen: str | bool = _headstart("all")
    ddp_timeout: int = _headstart(1800, "also the timeout of the process group train/sft.py creates")
    dataloader_num_workers: int = _headstart(0)


# The fields HeadstartSFTConfig declares: the `training:` keys --help lists, and the section's defaults.
# In the order it declares them (dataclasses keep an overridden field at its base class's place).
HEADSTART_FIELDS = [HeadstartSFTConfig.__dataclass_fields__[name] for name in HeadstartSFTConfig.__annotations__]
TRAINING_DEFAULTS: dict[str, Any] = {
    f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default for f in HEADSTART_FIELDS}

# SFTConfig fields train/sft.py computes for every run: a recipe giving one is refused, told where it comes from.
DERIVED = {
    "gradient_accumulation_steps": "run.effective_batch_size over the world size (the batch plan)",
    "per_device_eval_batch_size": "the batch plan's per-device batch",
    "eval_strategy": "training.eval_steps (0: never) and data.eval_split",
    "use_cpu": "the launch (accelerate launch --cpu, or no CUDA)",
    "ddp_backend": "the launch (gloo under DeepSpeed on CPU)",
    "model_init_kwargs": "model.dtype and model.attn_implementation",
    "remove_unused_columns": "the objective (refusion and distill keep their own columns)",
    "dataset_kwargs": "the objective (refusion and distill lay out their own batches)",
    "resume_from_checkpoint": "run.resume (the last complete checkpoint in training.output_dir)",
}
# Deprecated aliases transformers still accepts: one name per setting keeps saved recipes comparable.
RENAMED = {"gradient_checkpointing": "activation_checkpointing",
           "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs"}
# Keys headstart reads itself, which left `training:` for `run:` (commit ffcb0a4): an older recipe is told where.
MOVED_TO_RUN = ("effective_batch_size", "keep_effective_batch", "resume", "merge")


@functools.cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(HeadstartSFTConfig)


def check_training_section(training: dict[str, Any]) -> None:
    """Refuse a key that is no SFTConfig field (naming the closest), one train/sft.py sets, and a
    value of another type than the field's: TRL would take it and fail later, or far from the key.

    Args:
        training (dict[str, Any]): the recipe's `training:` section, its defaults merged.
    """
    for key, value in training.items():
        if key in DERIVED:
            raise RecipeValueError(f"training.{key} is set by train/sft.py from {DERIVED[key]}; leave it out")
        if key in RENAMED:
            raise RecipeValueError(f"training.{key} is a deprecated alias in transformers; use training.{RENAMED[key]}")
        if key not in _TRL_FIELDS or not _TRL_FIELDS[key].init:
            _refuse_an_old_key(key, value)
            close = difflib.get_close_matches(key, [n for n, f in _TRL_FIELDS.items() if f.init], n=4, cutoff=0.6)
            hint = f"closest: {', '.join(close)}" if close else "see trl.SFTConfig for the valid names"
            raise RecipeValueError(f"unknown key training.{key} (not a field of TRL's SFTConfig); {hint}")
        expected = _accepted_types(_field_types()[key])
        if expected is not None and not _has_type(value, expected):
            raise RecipeValueError(f"training.{key} must be {' or '.join(sorted(_names(expected)))}, got {value!r}")


def _refuse_an_old_key(key: str, value: Any) -> None:
    """Name the new place of a key an older recipe spells its old way (TRL's closest names would
    point elsewhere: per_device_train_batch_size for effective_batch_size)."""
    given = value if isinstance(value, str) else json.dumps(value)
    if key in MOVED_TO_RUN:
        raise RecipeValueError(f"training.{key} moved to run.{key}: give run.{key}={given}")
    if key == "warmup_ratio":  # transformers' until version 5
        share = f" ({given}: {value * 100:g}% of the steps)" if isinstance(value, float) and 0 <= value < 1 else ""
        raise RecipeValueError(f"training.warmup_ratio is gone from transformers 5: give training.warmup_steps "
                               f"a share below 1{share}")


def _accepted_types(annotation: Any) -> set[type] | None:
    """The plain types a recipe value of `annotation` may have; None: not checked here."""
    if annotation is None or annotation is type(None):
        return {type(None)}
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [_accepted_types(arg) for arg in typing.get_args(annotation)]
        return None if None in parts else set().union(*parts)
    if origin is typing.Literal:
        return {type(arg) for arg in typing.get_args(annotation)}
    if origin in (list, dict, tuple):
        return {origin}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {str}  # given by value: TRL checks it is one
    return {annotation} if annotation in (int, float, bool, str, list, dict) else None


def _has_type(value: Any, expected: set[type]) -> bool:
    if isinstance(value, bool):  # a bool is an int to isinstance, never to a recipe
        return bool in expected
    if isinstance(value, int) and float in expected:
        return True
    return any(isinstance(list(value) if isinstance(value, tuple) else value, t) for t in expected if t is not bool)


def _names(expected: set[type]) -> set[str]:
    return {"null" if t is type(None) else t.__name__ for t in expected}


def training_help_rows() -> list[tuple[str, str, Any, str]]:
    """(key, type, default, help) of the fields `HeadstartSFTConfig` declares, for `--help`: TRL's
    help from SFTConfig's field metadata, then headstart's note."""
    rows = []
    for f in HEADSTART_FIELDS:
        text = " ".join(f.metadata["help"].replace("%%", "%").split())  # argparse's escape undone
        kind = " | ".join(sorted(_names(_accepted_types(_field_types()[f.name]) or set()))) or str(f.type)
        rows.append((f.name, kind, TRAINING_DEFAULTS[f.name], text))
    return rows


def trainer_arguments(recipe: TrainRecipe, recipe_name: str, output_dir: Path, world_size: int, evaluate: bool,
                      placement: tuple[int, str] | None = None) -> dict[str, Any]:
    """The recipe's `training:` section as it is, and what this launch decides: per-device batch,
    accumulation and learning rate from the batch plan, precision, evaluation, the process group's
    backend and, for refusion and distill, TRL keeping the tokenized parts as they are (the objective's
    collator lays them out; refusion also hands TRL the model already loaded).

    Args:
        recipe (TrainRecipe): the validated recipe.
        recipe_name (str): its name, for the run name.
        output_dir (Path): the run directory.
        world_size (int): the processes of this launch.
        evaluate (bool): whether there is an evaluation split to evaluate on.
        placement (tuple[int, str] | None): the node's usable GPUs and this process's device (default: this process's).
    """
    t = recipe.training
    plan = batch_plan(recipe, world_size)
    own_layout = recipe.objective in ("refusion", "distill")
    placement = placement or process_device(PartialState())
    trackers = [t["report_to"]] if isinstance(t["report_to"], str) else list(t["report_to"] or [])
    return {"data_seed": t["seed"], **t} | dict(
        output_dir=str(output_dir),
        run_name=t["run_name"] or f"{recipe_name}-{Path(recipe.model.name_or_path.rstrip('/')).name}",
        per_device_train_batch_size=plan.per_device,
        per_device_eval_batch_size=plan.per_device,
        gradient_accumulation_steps=plan.accumulation,
        learning_rate=plan.learning_rate,
        bf16=use_bf16(recipe),
        eval_strategy="steps" if evaluate else "no",
        eval_steps=t["eval_steps"] if evaluate else None,
        report_to=[r for r in trackers if r != "none"] or "none",
        use_cpu=process_state_kwargs().get("cpu", False),
        ddp_backend=process_state_kwargs().get("backend"),
        model_init_kwargs=None if recipe.objective == "refusion" else model_init_kwargs(recipe, *placement),
        remove_unused_columns=not own_layout,
        dataset_kwargs={"skip_prepare_dataset": True} if own_layout else None,
    )


def sft_config(recipe: TrainRecipe, recipe_name: str, output_dir: Path, world_size: int, evaluate: bool,
               placement: tuple[int, str] | None = None) -> HeadstartSFTConfig:
    """The `HeadstartSFTConfig` of `trainer_arguments` (same arguments); a value TRL refuses is its own
    error, in one line.

    Args:
        recipe (TrainRecipe): the validated recipe.
        recipe_name (str): its name, for the run name.
        output_dir (Path): the run directory.
        world_size (int): the processes of this launch.
        evaluate (bool): whether there is an evaluation split to evaluate on.
        placement (tuple[int, str] | None): the node's usable GPUs and this process's device (default: this process's).
    """
    try:
        return HeadstartSFTConfig(**trainer_arguments(recipe, recipe_name, output_dir, world_size, evaluate, placement))
    except (ValueError, TypeError) as error:
        raise RecipeValueError(f"training: TRL's SFTConfig refuses it: {error_line(error)}") from error
