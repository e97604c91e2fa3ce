"""What train/sft.py checks before any work: the installed stack, and what asks the run for a GPU."""

from __future__ import annotations

import os
from collections.abc import Mapping

from packaging.version import Version

from headstart.devices import gpu_requests
from train.config import TrainRecipe

# TrainingArguments.activation_checkpointing (train/sft_config.py) and Trainer.loss_is_scaled_for_ga
# (train/refusion_objective.py, train/distill.py) first appear in transformers 5.19: older releases
# raise on the first, and ignore the second, dividing the distillation loss by the accumulation steps
# once more (a learning rate silently cut by that factor).
TRANSFORMERS_NEEDED = "5.19"


class StackVersionError(ValueError):
    """An installed library too old for this script (a ValueError: printed as one line by cli_main)."""


def check_transformers_version(installed: str, needed: str = TRANSFORMERS_NEEDED) -> None:
    """Refuse a transformers release older than `needed`.

    Args:
        installed: the installed version.
        needed: the oldest version train/sft.py runs on.
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
        recipe: the validated recipe.
        environ: the environment (default: this process's).
    """
    environ = os.environ if environ is None else environ
    if environ.get("ACCELERATE_USE_CPU", "false").lower() in ("1", "true", "yes", "y", "on", "t"):
        return []
    return gpu_requests(environ) + (["training.bf16=true"] if recipe.training.get("bf16") else [])
