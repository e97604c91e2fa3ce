"""The `training:` section of a recipe: TRL `SFTConfig` fields under their own names.

A key must be a field of `trl.SFTConfig` (an unknown one is refused naming the closest
fields), and its value of the field's type; a field train/sft.py sets itself is refused
with where it comes from. Values TRL itself refuses (an unknown scheduler, a logging
strategy without steps) are TRL's own errors, raised in one line when train/sft.py
builds the SFTConfig. `training_help_rows` gives the help of the fields the recipes use,
from SFTConfig's own metadata.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import json
import types
import typing
from typing import Any

from train.config import TRAINING_DEFAULTS, TRAINING_NOTES, RecipeValueError

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

# Keys headstart reads itself, which left `training:` for `run:` when `training:` became TRL's
# SFTConfig (commit ffcb0a4): a recipe written before says where each went.
MOVED_TO_RUN = ("effective_batch_size", "keep_effective_batch", "resume", "merge")


@functools.cache
def sft_fields() -> dict[str, dataclasses.Field]:
    from trl import SFTConfig

    return {f.name: f for f in dataclasses.fields(SFTConfig) if f.init}


@functools.cache
def sft_types() -> dict[str, Any]:
    from trl import SFTConfig

    try:
        return typing.get_type_hints(SFTConfig)
    except (NameError, TypeError):  # an annotation naming what the module never imports
        return {name: f.type for name, f in sft_fields().items()}


def check_training_section(training: dict[str, Any]) -> None:
    """Refuse keys that are no SFTConfig field (or that train/sft.py sets) and values of another type."""
    fields = sft_fields()
    for key, value in training.items():
        if key in DERIVED:
            raise RecipeValueError(f"training.{key} is set by train/sft.py from {DERIVED[key]}; leave it out")
        if key in RENAMED:
            raise RecipeValueError(f"training.{key} is a deprecated alias in transformers; use training.{RENAMED[key]}")
        if key not in fields:
            _refuse_an_old_key(key, value)
            close = difflib.get_close_matches(key, list(fields), n=4, cutoff=0.6)
            hint = f"closest: {', '.join(close)}" if close else "see trl.SFTConfig for the valid names"
            raise RecipeValueError(f"unknown key training.{key} (not a field of TRL's SFTConfig); {hint}")
        expected = accepted_types(sft_types().get(key, fields[key].type))
        if expected is not None and not has_type(value, expected):
            names = " or ".join(sorted({t.__name__ if t is not type(None) else "null" for t in expected}))
            raise RecipeValueError(f"training.{key} must be {names}, got {value!r}")


def _refuse_an_old_key(key: str, value: Any) -> None:
    """Name the new place of a `training:` key an older recipe spells its old way (TRL's closest
    names would point elsewhere: per_device_train_batch_size for effective_batch_size)."""
    given = value if isinstance(value, str) else json.dumps(value)
    if key in MOVED_TO_RUN:
        raise RecipeValueError(f"training.{key} moved to run.{key}: give run.{key}={given}")
    if key == "warmup_ratio":  # the old schema's, and transformers' until version 5
        share = f" ({given}: {value * 100:g}% of the steps)" if isinstance(value, float) and 0 <= value < 1 else ""
        raise RecipeValueError(f"training.warmup_ratio is gone from transformers 5: give training.warmup_steps "
                               f"a share below 1{share}")


def accepted_types(annotation: Any) -> set[type] | None:
    """The plain types a value of `annotation` may have; None when the annotation is not one of them."""
    if annotation is None or annotation is type(None):
        return {type(None)}
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [accepted_types(arg) for arg in typing.get_args(annotation)]
        return None if any(p is None for p in parts) else set().union(*parts)
    if origin is typing.Literal:
        return {type(arg) for arg in typing.get_args(annotation)}
    if origin in (list, dict, tuple):
        return {origin}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {str}  # given by value: TRL checks it is one
    if annotation in (int, float, bool, str, list, dict):
        return {annotation}
    return None


def has_type(value: Any, expected: set[type]) -> bool:
    if isinstance(value, bool):  # a bool is an int to isinstance, never to a recipe
        return bool in expected
    if isinstance(value, int) and float in expected:
        return True
    if isinstance(value, tuple):
        value = list(value)
    return any(isinstance(value, t) for t in expected if t is not bool)


def type_name(annotation: Any) -> str:
    """An annotation as a recipe reads it: `int | None`, `str`."""
    names = sorted({t.__name__ if t is not type(None) else "null" for t in accepted_types(annotation) or set()})
    return " | ".join(names) or str(annotation).replace("typing.", "")


def training_help_rows(names: list[str] | None = None) -> list[tuple[str, str, Any, str]]:
    """(name, type, default, help) of the `training:` fields the recipes use (`TRAINING_DEFAULTS`,
    or `names`), for `--help`: the type and help from SFTConfig's own field metadata, the default
    headstart's where it sets one."""
    fields, hints = sft_fields(), sft_types()
    rows = []
    for name in names or list(TRAINING_DEFAULTS):
        f = fields[name]
        trl_default = f.default if f.default is not dataclasses.MISSING else None
        help_text = " ".join(f.metadata.get("help", "").replace("%%", "%").split())  # argparse's escape
        if name in TRAINING_NOTES:
            help_text += f" headstart: {TRAINING_NOTES[name]}."
        rows.append((name, type_name(hints.get(name, f.type)), TRAINING_DEFAULTS.get(name, trl_default), help_text))
    return rows
