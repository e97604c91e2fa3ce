"""The batch plan: how one optimizer step of a recipe is split over the processes of a launch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from train.config import RecipeValueError, TrainRecipe


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step is split over the processes of this launch.

    world_size x per_device x accumulation = effective. The recipe's effective batch is
    kept whenever the world size divides it, lowering the per-device batch as far as
    needed (16 over 16 processes: 1 x 1). A world size that cannot keep it (16 over 3,
    24 or 32 processes) raises it to the next multiple of the world size, and the
    learning rate is scaled by the square root of the ratio (the square-root rule for
    Adam-type optimisers), unless `run.keep_effective_batch` asks for a refusal."""

    world_size: int
    per_device: int
    accumulation: int
    effective: int
    learning_rate: float
    requested_per_device: int
    requested_effective: int
    requested_learning_rate: float

    @property
    def kept(self) -> bool:
        return self.effective == self.requested_effective

    def notes(self) -> list[str]:
        """What differs from the recipe, in words (printed loudly by train/sft.py)."""
        lines = []
        if not self.kept:
            lines.append(
                f"WARNING: effective batch {self.requested_effective} is not a multiple of the world size "
                f"{self.world_size}; raised to {self.effective} (= {self.world_size} processes x {self.per_device} "
                f"per device x {self.accumulation} accumulation) and the learning rate scaled by "
                f"sqrt({self.effective}/{self.requested_effective}): {self.requested_learning_rate:g} -> "
                f"{self.learning_rate:.4g}. Launch on a world size dividing {self.requested_effective} to keep the "
                f"recipe, or set run.keep_effective_batch=true to refuse instead"
            )
        if self.per_device != self.requested_per_device:
            lines.append(
                f"note: per-device batch lowered {self.requested_per_device} -> {self.per_device} so that "
                f"{self.world_size} processes make the effective batch {self.effective}"
            )
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "per_device_train_batch_size": self.per_device,
                "gradient_accumulation_steps": self.accumulation, "effective_batch_size": self.effective,
                "learning_rate": self.learning_rate}


def batch_plan(recipe: TrainRecipe, world_size: int) -> BatchPlan:
    """The split of `run.effective_batch_size` over `world_size` processes (see BatchPlan).

    Args:
        recipe (TrainRecipe): the training recipe.
        world_size (int): the number of training processes.
    """
    effective, rate = recipe.run.effective_batch_size, recipe.training["learning_rate"]
    most = recipe.training["per_device_train_batch_size"]
    if world_size < 1:
        raise RecipeValueError(f"world size must be >= 1, got {world_size}")
    requested = dict(requested_per_device=most, requested_effective=effective, requested_learning_rate=rate)
    for per_device in range(most, 0, -1):
        if effective % (world_size * per_device) == 0:
            return BatchPlan(world_size, per_device, effective // (world_size * per_device), effective, rate, **requested)
    raised = -(-effective // world_size) * world_size
    if recipe.run.keep_effective_batch:
        raise RecipeValueError(
            f"run.effective_batch_size={effective} cannot be split over {world_size} processes (it is not a "
            f"multiple of {world_size}) and run.keep_effective_batch is true: launch on a world size that "
            f"divides {effective} (e.g. {largest_divisor(effective, world_size)} processes), or pass "
            f"run.keep_effective_batch=false to accept the raised batch {raised} (learning rate "
            f"{rate:g} x sqrt({raised}/{effective}) = {rate * math.sqrt(raised / effective):.4g})"
        )
    per_process = raised // world_size
    per_device = max(d for d in range(1, most + 1) if per_process % d == 0)
    return BatchPlan(world_size, per_device, per_process // per_device, raised, rate * math.sqrt(raised / effective),
                     **requested)


def largest_divisor(effective: int, below: int) -> int:
    """The largest world size under `below` that keeps `effective` (1 keeps any).

    Args:
        effective (int): the effective batch size to keep.
        below (int): the world size it must stay under.
    """
    return max(size for size in range(1, below) if effective % size == 0)
