"""A training recipe as train/sft.py reads it: loaded, and its values checked before anything loads.

The loader has checked the headstart sections' keys and types, train/sft_config.py the
`training:` section's; the checks here are those TRL makes nowhere, or only once the model has
loaded: values that would fail (or silently misbehave) then, and the combinations an objective
cannot run with. TRL's own checks of the `training:` values run when train/sft.py builds its
SFTConfig, before any download.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from headstart.config import load_config
from headstart.prompts import canonical_system_setting
from train.config import DIVERGENCES, OBJECTIVES, SDFT_MODES, TRACKERS, RecipeValueError, SdftSection, TrainRecipe
from train.sft_config import check_training_section

DEFAULT_RECIPE = "smollm2_prefix"


def parse_recipe(argv: list[str]) -> tuple[TrainRecipe, str]:
    """The validated recipe and its name (for the run directory and tags).

    Args:
        argv: `recipe=NAME key=value section.key=value ...`; without `recipe=`, the embedded default.
    """
    if not any(arg.startswith("recipe=") for arg in argv):
        argv = [f"recipe={DEFAULT_RECIPE}", *argv]
    name = Path([a for a in argv if a.startswith("recipe=")][-1].split("=", 1)[1]).stem
    return validate(load_config(TrainRecipe, argv)), name


def validate(recipe: TrainRecipe) -> TrainRecipe:
    """Reject values that cannot work: unknown objective, bad batch split, bad slot settings;
    returns the recipe with its system message setting canonicalised.

    Args:
        recipe: the loaded recipe.
    """
    if recipe.objective not in OBJECTIVES:
        raise RecipeValueError(
            f"objective {recipe.objective!r} is not implemented; available: {', '.join(OBJECTIVES)}"
        )
    check_training_section(recipe.training)
    if recipe.run.effective_batch_size < 1:
        raise RecipeValueError(f"run.effective_batch_size must be >= 1, got {recipe.run.effective_batch_size}")
    for name in ("per_device_train_batch_size", "max_length", "max_steps", "save_steps", "ddp_timeout"):
        at_least(recipe.training, name, 1)
    if recipe.model.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise RecipeValueError(f"model.dtype {recipe.model.dtype!r}: use auto, float32, bfloat16 or float16")
    validate_numbers(recipe)
    try:
        recipe.data.system_message = canonical_system_setting(recipe.data.system_message)
    except ValueError as error:
        raise RecipeValueError(f"data.system_message: {error}") from error
    validate_refusion(recipe)
    validate_distill(recipe)
    validate_sdft(recipe)
    return recipe


def at_least(training: dict[str, Any], name: str, low: float, why: str = "") -> None:
    value = training.get(name)
    if value is None or value < low:
        raise RecipeValueError(f"training.{name} must be >= {low:g}{why}, got {value}")


def validate_numbers(recipe: TrainRecipe) -> None:
    """Values PEFT, TRL or the optimiser would refuse (or misuse) only once the model has loaded:
    a rank-0 adapter, a negative learning rate, a tracker name nobody knows."""
    lora, t = recipe.lora, recipe.training
    if lora.r < 1:
        raise RecipeValueError(f"lora.r must be >= 1 (the adapter's rank), got {lora.r}")
    if lora.alpha <= 0:
        raise RecipeValueError(f"lora.alpha must be > 0 (scale = alpha / r), got {lora.alpha}")
    if not 0 <= lora.dropout < 1:
        raise RecipeValueError(f"lora.dropout must be in [0, 1), got {lora.dropout}")
    if not lora.target_modules and not lora.target_regex:
        raise RecipeValueError("lora.target_modules is empty and lora.target_regex unset: no module would get an adapter")
    rate = t.get("learning_rate")
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise RecipeValueError(f"training.learning_rate must be a positive number, got {rate}")
    for name in ("weight_decay", "eval_steps", "dataloader_num_workers"):
        at_least(t, name, 0)
    at_least(t, "max_grad_norm", 0, " (0: no clipping)")
    limit = t.get("save_total_limit")
    if limit is not None and limit < 1:
        raise RecipeValueError(f"training.save_total_limit must be null (keep all) or >= 1, got {limit}")
    trackers = t.get("report_to") or []
    unknown = [name for name in ([trackers] if isinstance(trackers, str) else trackers) if name not in TRACKERS]
    if unknown:
        raise RecipeValueError(f"training.report_to: unknown tracker {', '.join(map(repr, unknown))}; "
                               f"use a list of {', '.join(TRACKERS)}")
    for name in ("max_train_samples", "max_eval_samples"):
        if getattr(recipe.data, name) is not None and getattr(recipe.data, name) < 1:
            raise RecipeValueError(f"data.{name} must be null (all rows) or >= 1, got {getattr(recipe.data, name)}")


def validate_refusion(recipe: TrainRecipe) -> None:
    """Slot sizes and eps are checked whatever the objective (the defaults pass). The layout
    needs its own collator, which TRL's packing and padding-free modes would replace, run
    in the main process, where it counts the batches it lays out."""
    r = recipe.refusion
    if not r.slot_sizes or any(size < 1 for size in r.slot_sizes):
        raise RecipeValueError(f"refusion.slot_sizes must be a non-empty list of sizes >= 1, got {list(r.slot_sizes)}")
    if not 0 < r.eps < 1:
        raise RecipeValueError(f"refusion.eps must be in (0, 1), got {r.eps}")
    if recipe.objective != "refusion":
        return
    if recipe.training.get("packing") or recipe.training.get("padding_free"):
        raise RecipeValueError(
            "objective: refusion lays out and pads its own batches; set training.packing and training.padding_free to false"
        )
    if recipe.training.get("dataloader_num_workers"):
        raise RecipeValueError(
            "objective: refusion numbers its batches in the main process to draw their layouts; "
            "set training.dataloader_num_workers to 0"
        )


def validate_distill(recipe: TrainRecipe) -> None:
    """Divergence and top-k are checked whatever the objective (the defaults pass). The
    student and teacher sequences are laid out by their own collator, which TRL's packing
    and padding-free modes would replace."""
    d = recipe.distill
    if d.divergence not in DIVERGENCES:
        raise RecipeValueError(f"distill.divergence {d.divergence!r}: use {' or '.join(DIVERGENCES)}")
    if d.top_k < 0:
        raise RecipeValueError(f"distill.top_k must be >= 0 (0 = the full vocabulary), got {d.top_k}")
    if recipe.objective == "distill" and (recipe.training.get("packing") or recipe.training.get("padding_free")):
        raise RecipeValueError(
            "objective: distill pads its student and teacher batches itself; set training.packing and "
            "training.padding_free to false"
        )


def validate_sdft(recipe: TrainRecipe) -> None:
    """`sdft:` settings are for objective: sdft alone (elsewhere they would be silently unused);
    the values TRL's SDFTConfig would take but misuse. The batch against num_generations is
    checked with the batch plan (train/sdft.py `sdft_config`)."""
    s = recipe.sdft
    if recipe.objective != "sdft":
        if s != SdftSection():
            raise RecipeValueError(f"sdft.* settings apply to objective: sdft only; this recipe's objective is "
                                   f"{recipe.objective}: leave the sdft section out")
        return
    if s.distillation_mode not in SDFT_MODES:
        raise RecipeValueError(f"sdft.distillation_mode {s.distillation_mode!r}: use {', '.join(SDFT_MODES)}")
    for name, value in (("max_completion_length", s.max_completion_length), ("num_generations", s.num_generations),
                        ("distillation_topk", s.distillation_topk)):
        if value < 1:
            raise RecipeValueError(f"sdft.{name} must be >= 1, got {value}")
    if not s.temperature > 0:
        raise RecipeValueError(f"sdft.temperature must be > 0, got {s.temperature}")
    if not 0 <= s.distillation_alpha <= 1:
        raise RecipeValueError(f"sdft.distillation_alpha must be in [0, 1], got {s.distillation_alpha}")
    if s.distillation_mode == "sampled_token" and s.distillation_alpha != 1:
        raise RecipeValueError("sdft.distillation_mode=sampled_token is TRL's reverse KL only: set "
                               "sdft.distillation_alpha=1")
    if s.max_completion_length >= recipe.training["max_length"]:
        raise RecipeValueError(f"sdft.max_completion_length={s.max_completion_length} leaves no room for the prompt "
                               f"in training.max_length={recipe.training['max_length']}")
    if recipe.training.get("packing") or recipe.training.get("padding_free"):
        raise RecipeValueError("objective: sdft batches TRL's own drafts (SDFTConfig has no packing); set "
                               "training.packing and training.padding_free to false")
