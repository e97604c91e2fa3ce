"""The `training:` section of a recipe checked, and built once into TRL's config of the run
(`HeadstartSFTConfig`, train/training_fields.py, or SDFTConfig) for one launch: the recipe's values, and
what the launch decides (batch plan, precision, evaluation, placement).
"""

from __future__ import annotations

import difflib
import enum
import functools
import json
import types
import typing
from pathlib import Path
from typing import Any

from accelerate import PartialState
from trl import SFTConfig

from headstart.config import error_line
from train.batch import batch_plan
from train.config import RecipeValueError, TrainRecipe
from train.model import model_init_kwargs, use_bf16
from train.processes import process_device, process_state_kwargs
from train.sdft import SDFTConfig, sdft_arguments
from train.training_fields import HEADSTART_FIELDS, TRAINING_DEFAULTS, TRL_FIELDS, HeadstartSFTConfig

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
        if key not in TRL_FIELDS or not TRL_FIELDS[key].init:
            _refuse_an_old_key(key, value)
            close = difflib.get_close_matches(key, [n for n, f in TRL_FIELDS.items() if f.init], n=4, cutoff=0.6)
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


def trainer_config(recipe: TrainRecipe, recipe_name: str, output_dir: Path, world_size: int, evaluate: bool,
                   placement: tuple[int, str] | None = None) -> SFTConfig:
    """TRL's config of the run, built once: `HeadstartSFTConfig` of `trainer_arguments` (same arguments),
    or for `objective: sdft` TRL's SDFTConfig of them (train/sdft.py `sdft_arguments`). A value TRL
    refuses is its own error, in one line.
    """
    arguments, config_class, name = trainer_arguments(recipe, recipe_name, output_dir, world_size, evaluate,
                                                      placement), HeadstartSFTConfig, "SFTConfig"
    if recipe.objective == "sdft":
        arguments = sdft_arguments(recipe, arguments, batch_plan(recipe, world_size).effective)
        config_class, name = SDFTConfig, "SDFTConfig"
    try:
        return config_class(**arguments)
    except (ValueError, TypeError) as error:
        raise RecipeValueError(f"training: TRL's {name} refuses it: {error_line(error)}") from error
