"""What train/sft.py checks before any work: the installed stack, the recipe (loaded, its values
checked), and what asks the run for a GPU.

The loader has checked the headstart sections' keys and types, train/sft_config.py the
`training:` section's; the checks here are those TRL makes nowhere, or only once the model has
loaded: values that would fail (or silently misbehave) then, and the combinations an objective
cannot run with. TRL's own checks of the `training:` values run when train/sft.py builds its
SFTConfig, before any download.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.version import Version

from headstart.config import load_config
from headstart.device_names import check_dtype
from headstart.devices import gpu_requests
from headstart.prompts import canonical_system_setting, check_prompt_format
from train.config import (
    CLEAN_AVERAGES,
    DIVERGENCES,
    OBJECTIVES,
    OVER_LONG,
    SDFT_MODES,
    TRACKERS,
    RecipeValueError,
    SdftSection,
    TrainRecipe,
)
from train.sft_config import check_training_section

DEFAULT_RECIPE = "smollm2_prefix"
# TrainingArguments.activation_checkpointing (train/sft_config.py) and Trainer.loss_is_scaled_for_ga
# (train/refusion_objective.py, train/distill.py) first appear in transformers 5.19: older releases
# raise on the first, and ignore the second, dividing the distillation loss by the accumulation steps
# once more (a learning rate silently cut by that factor).
TRANSFORMERS_NEEDED = "5.19"


def parse_recipe(argv: list[str]) -> tuple[TrainRecipe, str]:
    """The validated recipe and its name (for the run directory and tags).

    Args:
        argv (list[str]): `recipe=NAME key=value section.key=value ...`; without `recipe=`, the embedded default.
    """
    if not any(arg.startswith("recipe=") for arg in argv):
        argv = [f"recipe={DEFAULT_RECIPE}", *argv]
    name = Path([a for a in argv if a.startswith("recipe=")][-1].split("=", 1)[1]).stem
    return validate(load_config(TrainRecipe, argv)), name


def require(ok: bool, message: str) -> None:
    """Refuse the recipe with `message` unless `ok`.

    Args:
        ok (bool): whether the recipe passes.
        message (str): what is wrong, for the error.
    """
    if not ok:
        raise RecipeValueError(message)


def at_least(training: dict[str, Any], name: str, low: float, why: str = "") -> None:
    """Refuse the recipe unless `training.<name>` is set and at least `low`.

    Args:
        training (dict[str, Any]): the recipe's `training:` section.
        name (str): the key checked.
        low (float): the smallest value accepted.
        why (str): added to the message after the bound.
    """
    value = training.get(name)
    require(value is not None and value >= low, f"training.{name} must be >= {low:g}{why}, got {value}")


def validate(recipe: TrainRecipe) -> TrainRecipe:
    """Reject values that cannot work: unknown objective, bad batch split, bad slot settings;
    returns the recipe with its system message setting canonicalised.

    Args:
        recipe (TrainRecipe): the loaded recipe.
    """
    require(recipe.objective in OBJECTIVES,
            f"objective {recipe.objective!r} is not implemented; available: {', '.join(OBJECTIVES)}")
    check_training_section(recipe.training)
    effective = recipe.run.effective_batch_size
    require(effective >= 1, f"run.effective_batch_size must be >= 1, got {effective}")
    for name in ("per_device_train_batch_size", "max_length", "max_steps", "save_steps", "ddp_timeout"):
        at_least(recipe.training, name, 1)
    try:
        check_dtype(recipe.model.dtype, "model.dtype")
    except ValueError as error:
        raise RecipeValueError(str(error)) from error
    validate_numbers(recipe)
    try:
        recipe.data.system_message = canonical_system_setting(recipe.data.system_message)
    except ValueError as error:
        raise RecipeValueError(f"data.system_message: {error}") from error
    try:
        check_prompt_format(recipe.model.prompt_format)
    except ValueError as error:
        raise RecipeValueError(f"model.prompt_format: {error}") from error
    validate_refusion(recipe)
    validate_distill(recipe)
    validate_sdft(recipe)
    return recipe


def validate_numbers(recipe: TrainRecipe) -> None:
    """Values PEFT, TRL or the optimiser would refuse (or misuse) only once the model has loaded:
    a rank-0 adapter, a negative learning rate, a tracker name nobody knows.

    Args:
        recipe (TrainRecipe): the recipe to check.
    """
    lora, t, data = recipe.lora, recipe.training, recipe.data
    require(recipe.model.use_peft or recipe.objective in ("sft", "refusion"),
            f"model.use_peft=false trains every weight, which objective {recipe.objective} cannot: its teacher is "
            "the model with its adapter disabled; use objective sft or refusion, or keep the adapter")
    require(lora.r >= 1, f"lora.r must be >= 1 (the adapter's rank), got {lora.r}")
    require(lora.alpha > 0, f"lora.alpha must be > 0 (scale = alpha / r), got {lora.alpha}")
    require(0 <= lora.dropout < 1, f"lora.dropout must be in [0, 1), got {lora.dropout}")
    require(bool(lora.target_modules or lora.target_regex),
            "lora.target_modules is empty and lora.target_regex unset: no module would get an adapter")
    rate = t.get("learning_rate")
    require(isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0,
            f"training.learning_rate must be a positive number, got {rate}")
    for name in ("weight_decay", "eval_steps", "dataloader_num_workers"):
        at_least(t, name, 0)
    at_least(t, "max_grad_norm", 0, " (0: no clipping)")
    limit = t.get("save_total_limit")
    require(limit is None or limit >= 1, f"training.save_total_limit must be null (keep all) or >= 1, got {limit}")
    trackers = t.get("report_to") or []
    unknown = [name for name in ([trackers] if isinstance(trackers, str) else trackers) if name not in TRACKERS]
    require(not unknown, f"training.report_to: unknown tracker {', '.join(map(repr, unknown))}; "
                         f"use a list of {', '.join(TRACKERS)}")
    for name in ("max_train_samples", "max_eval_samples"):
        value = getattr(data, name)
        require(value is None or value >= 1, f"data.{name} must be null (all rows) or >= 1, got {value}")


def own_batches(recipe: TrainRecipe, why: str) -> None:
    """An objective whose collator lays out its batches: TRL's packing and padding-free modes would replace it.

    Args:
        recipe (TrainRecipe): the recipe to check.
        why (str): what the objective's collator does, for the message.
    """
    require(not (recipe.training.get("packing") or recipe.training.get("padding_free")),
            f"objective: {recipe.objective} {why}; set training.packing and training.padding_free to false")


def validate_refusion(recipe: TrainRecipe) -> None:
    """Slot sizes, eps, clean_average and over_long are checked whatever the objective (the defaults
    pass). The layout needs its own collator, run in the main process, where it counts the batches
    it lays out.

    Args:
        recipe (TrainRecipe): the recipe to check.
    """
    r = recipe.refusion
    require(bool(r.slot_sizes) and all(size >= 1 for size in r.slot_sizes),
            f"refusion.slot_sizes must be a non-empty list of sizes >= 1, got {list(r.slot_sizes)}")
    require(0 < r.eps < 1, f"refusion.eps must be in (0, 1), got {r.eps}")
    require(r.clean_average in CLEAN_AVERAGES,
            f"refusion.clean_average {r.clean_average!r}: use {' or '.join(CLEAN_AVERAGES)}")
    require(r.over_long in OVER_LONG, f"refusion.over_long {r.over_long!r}: use {' or '.join(OVER_LONG)}")
    if recipe.objective == "refusion":
        own_batches(recipe, "lays out and pads its own batches")
        require(not recipe.training.get("dataloader_num_workers"),
                "objective: refusion numbers its batches in the main process to draw their layouts; "
                "set training.dataloader_num_workers to 0")


def validate_distill(recipe: TrainRecipe) -> None:
    """Divergence and top-k are checked whatever the objective (the defaults pass); the student and
    teacher sequences are laid out by their own collator.

    Args:
        recipe (TrainRecipe): the recipe to check.
    """
    d = recipe.distill
    require(d.divergence in DIVERGENCES, f"distill.divergence {d.divergence!r}: use {' or '.join(DIVERGENCES)}")
    require(d.top_k >= 0, f"distill.top_k must be >= 0 (0 = the full vocabulary), got {d.top_k}")
    if recipe.objective == "distill":
        own_batches(recipe, "pads its student and teacher batches itself")


def validate_sdft(recipe: TrainRecipe) -> None:
    """`sdft:` settings are for objective: sdft alone (elsewhere they would be silently unused); the
    values TRL's SDFTConfig would take but misuse, or refuse only once the data is read. The batch
    against num_generations is checked with the batch plan (train/sdft.py `sdft_arguments`).

    Args:
        recipe (TrainRecipe): the recipe to check.
    """
    s = recipe.sdft
    if recipe.objective != "sdft":
        require(s == SdftSection(), f"sdft.* settings apply to objective: sdft only; this recipe's objective is "
                                    f"{recipe.objective}: leave the sdft section out")
        return
    require(s.distillation_mode in SDFT_MODES,
            f"sdft.distillation_mode {s.distillation_mode!r}: use {', '.join(SDFT_MODES)}")
    for name in ("max_completion_length", "num_generations", "distillation_topk"):
        require(getattr(s, name) >= 1, f"sdft.{name} must be >= 1, got {getattr(s, name)}")
    require(s.temperature > 0, f"sdft.temperature must be > 0, got {s.temperature}")
    require(0 <= s.distillation_alpha <= 1, f"sdft.distillation_alpha must be in [0, 1], got {s.distillation_alpha}")
    require(s.distillation_mode != "sampled_token" or s.distillation_alpha == 1,
            "sdft.distillation_mode=sampled_token is TRL's reverse KL only: set sdft.distillation_alpha=1")
    require(s.max_completion_length < recipe.training["max_length"],
            f"sdft.max_completion_length={s.max_completion_length} leaves no room for the prompt "
            f"in training.max_length={recipe.training['max_length']}")
    require(not (recipe.training.get("packing") or recipe.training.get("padding_free")),
            "objective: sdft batches TRL's own drafts (SDFTConfig has no packing); set "
            "training.packing and training.padding_free to false")


class StackVersionError(ValueError):
    """An installed library too old for this script (a ValueError: printed as one line by cli_main)."""


def check_transformers_version(installed: str, needed: str = TRANSFORMERS_NEEDED) -> None:
    """Refuse a transformers release older than `needed`.

    Args:
        installed (str): the installed version.
        needed (str): the oldest version train/sft.py runs on.
    """
    if Version(installed) < Version(needed):
        raise StackVersionError(
            f"transformers {installed} is installed; train/sft.py needs transformers >= {needed} "
            f"(activation_checkpointing, loss_is_scaled_for_ga): pip install 'transformers>={needed}' "
            "(pyproject.toml pins the tested version)"
        )


def training_gpu_requests(recipe: TrainRecipe, environ: Mapping[str, str] | None = None) -> list[str]:
    """What asks this run for a GPU (headstart.devices): the environment's GPUs and a recipe saying
    bf16. `accelerate launch --cpu` (or `use_cpu: true`) is an explicit CPU choice: nothing asks.

    Args:
        recipe (TrainRecipe): the validated recipe.
        environ (Mapping[str, str] | None): the environment (default: this process's).
    """
    environ = os.environ if environ is None else environ
    if environ.get("ACCELERATE_USE_CPU", "false").lower() in ("1", "true", "yes", "y", "on", "t"):
        return []
    return gpu_requests(environ) + (["training.bf16=true"] if recipe.training.get("bf16") else [])
