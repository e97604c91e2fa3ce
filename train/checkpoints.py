"""Checkpoints that are safe to resume from.

A run killed while writing `checkpoint-N` leaves a directory that looks like a
checkpoint but is not one. After every process has finished writing, the main
process drops a marker file into it; only marked checkpoints are resumed from.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import torch.distributed as dist
from transformers import TrainerCallback

from headstart.config import config_to_dict, load_config
from train.config import RESUMABLE_KEYS, RecipeValueError, TrainRecipe, flat_keys, recipe_differences

COMPLETE_MARKER = "CHECKPOINT_COMPLETE"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def check_run_dir(output_dir: str | Path, recipe: TrainRecipe) -> dict[str, tuple]:
    """Refuse to train into a run directory holding another run: one whose saved recipe
    (config.yaml) differs on a key outside `RESUMABLE_KEYS`, one with checkpoints but
    no config.yaml, or any run at all when `training.resume` is false (a new run would
    overwrite and rotate away its checkpoints). Reads only. Returns the resumable keys
    that changed, {key: (saved, new)}."""
    directory = Path(output_dir)
    if not directory.is_dir():
        return {}
    saved_path = directory / "config.yaml"
    holds_run = any(_CHECKPOINT.match(p.name) for p in directory.iterdir()) or (directory / "adapter").exists()
    how = f"to start a new run, choose another training.output_dir (or move {directory} away)"
    if not saved_path.is_file():
        if holds_run:
            raise RecipeValueError(f"{directory} holds checkpoints or an adapter but no config.yaml: the recipe that "
                                   f"trained them is unknown; {how}")
        return {}
    try:
        saved = load_config(TrainRecipe, [f"recipe={saved_path}"])
    except ValueError as error:
        raise RecipeValueError(f"{directory} holds a run whose config.yaml cannot be read ({error}); {how}") from error
    if holds_run and not recipe.training.resume:
        raise RecipeValueError(f"training.resume=false, but {directory} holds a run (checkpoints or an adapter) that a "
                               f"new run would overwrite; {how}")
    differences = recipe_differences(saved, recipe)
    if differences:
        detail = ", ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in differences.items())
        raise RecipeValueError(
            f"{directory} holds a run of another recipe ({detail}); resuming it would continue the saved run, not "
            f"this one. Only these keys may change on resume: {', '.join(RESUMABLE_KEYS)}. {how[0].upper()}{how[1:]}"
        )
    old, new = flat_keys(config_to_dict(saved)), flat_keys(config_to_dict(recipe))
    return {key: (old[key], new[key]) for key in RESUMABLE_KEYS if old.get(key) != new.get(key)}


def last_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The marked checkpoint with the highest step in `output_dir`, or None."""
    directory = Path(output_dir)
    if not directory.is_dir():
        return None
    marked = [
        (int(match.group(1)), path)
        for path in directory.iterdir()
        if (match := _CHECKPOINT.match(path.name)) and (path / COMPLETE_MARKER).is_file()
    ]
    return max(marked)[1] if marked else None


class CompletenessMarker(TrainerCallback):
    """Mark `checkpoint-<step>` complete once every rank has saved its part."""

    def on_save(self, args, state, control, **kwargs):
        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # ZeRO ranks write their own shards; wait for all of them
        if state.is_world_process_zero:
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if checkpoint.is_dir():
                (checkpoint / COMPLETE_MARKER).write_text(f"{state.global_step}\n")
        return control


class StepDelay(TrainerCallback):
    """Sleep after every optimizer step (`HEADSTART_STEP_DELAY_S`): leaves a test time
    to kill a run between two checkpoints, as a preempted cluster job would be."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)
        return control
