"""Experiment tracking: W&B (offline unless a project is configured) and TensorBoard.

transformers' own callbacks do the logging; this module only prepares their
environment (run name, tags, directories) and adds the resolved recipe to the
W&B run, so a run can be reproduced from its tracker page alone.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from headstart.paths import INSTALL_ROOT
from train.config import TrainRecipe

WANDB_ID_FILE = "wandb_run_id"  # in the run directory: a resumed or requeued run continues the same W&B run


def git_commit() -> str:
    """Short hash of the checked-out commit, `unknown` outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=INSTALL_ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def run_tags(recipe: TrainRecipe, recipe_name: str) -> list[str]:
    """recipe, model and git commit, plus the recipe's own tags (W&B caps a tag at 64 chars).

    Args:
        recipe (TrainRecipe): the training recipe.
        recipe_name (str): the recipe's name.
    """
    model = Path(recipe.model.name_or_path.rstrip("/")).name or recipe.model.name_or_path
    tags = [f"recipe:{recipe_name}", f"model:{model}", f"git:{git_commit()}", *recipe.wandb.tags]
    return [tag.replace(",", "_")[:64] for tag in tags]


def hub_offline() -> bool:
    """Whether this machine was declared offline (HF_HUB_OFFLINE, as on compute nodes without internet)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def wandb_run_id(output_dir: Path) -> str:
    """The W&B run id of this run directory: created by its first launch, read back by every
    relaunch (a resume after a kill, a requeued Slurm job), so they all log to one W&B run.

    Args:
        output_dir (Path): the run directory.
    """
    path = output_dir / WANDB_ID_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = secrets.token_hex(4)  # W&B's own ids are 8 characters of [0-9a-z]
    output_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id + "\n")
    return run_id


def configure_trackers(recipe: TrainRecipe, recipe_name: str, output_dir: Path, main_process: bool = True) -> None:
    """Set the environment the W&B and TensorBoard callbacks read at start-up. W&B is offline
    (synced later with `wandb sync`) when no project is configured, and on an offline machine
    (HF_HUB_OFFLINE=1) even with one, unless WANDB_MODE says otherwise: an online W&B start
    without internet fails the run. The run keeps its W&B id in the run directory (resumed,
    never a second run) and is grouped by recipe unless WANDB_RUN_GROUP says otherwise. Only
    the main process opens a W&B run (transformers' WandbCallback logs on world rank 0), so
    only it reads or writes the id.

    Args:
        recipe (TrainRecipe): the training recipe.
        recipe_name (str): the recipe's name (the W&B group).
        output_dir (Path): the run directory.
        main_process (bool): whether this is the main process.
    """
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(output_dir / "tensorboard"))
    if "wandb" not in (recipe.training["report_to"] or []):
        return
    # A W&B service of our own: one inherited from the launching process (WANDB_SERVICE, which a
    # study or test running W&B in-process sets) still held a killed launch's run id, and refused
    # the relaunch's resume ("run ID ... is in use").
    os.environ.pop("WANDB_SERVICE", None)
    project = recipe.wandb.project or os.environ.get("WANDB_PROJECT")
    if project:
        os.environ["WANDB_PROJECT"] = project
        if hub_offline() and "WANDB_MODE" not in os.environ:
            os.environ["WANDB_MODE"] = "offline"
    else:
        # No project configured: keep the run on disk (sync later with `wandb sync`).
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ["WANDB_PROJECT"] = "headstart"
    if recipe.wandb.entity:
        os.environ["WANDB_ENTITY"] = recipe.wandb.entity
    os.environ.setdefault("WANDB_DIR", str(output_dir))
    os.environ["WANDB_TAGS"] = ",".join(run_tags(recipe, recipe_name))
    os.environ.setdefault("WANDB_RUN_GROUP", recipe_name)
    if main_process:
        os.environ["WANDB_RUN_ID"] = wandb_run_id(output_dir)
        os.environ["WANDB_RESUME"] = "allow"  # the first launch creates the run, a relaunch continues it


class ResolvedConfigToWandb(TrainerCallback):
    """Add the resolved recipe to the W&B run that WandbCallback opened."""

    def __init__(self, resolved: dict[str, Any], recipe_name: str) -> None:
        self.resolved = resolved
        self.recipe_name = recipe_name

    def on_train_begin(self, args, state, control, **kwargs):
        """Put the recipe's name and resolved values in the W&B run's config (main process).

        Args:
            args (TrainingArguments): the trainer's arguments.
            state (TrainerState): the trainer's state (step, world rank).
            control (TrainerControl): the trainer's flags, returned.
            kwargs (Any): what the trainer passes besides (model, tokenizer, ...), unused.
        """
        if not state.is_world_process_zero or "wandb" not in (args.report_to or []):
            return control
        import wandb

        if wandb.run is not None:
            wandb.run.config.update({"recipe_name": self.recipe_name, "recipe": self.resolved}, allow_val_change=True)
        return control


def finish_trackers() -> None:
    """Close the W&B run, so its files are complete when the process returns
    (otherwise an exit hook flushes them, which can race whoever reads them next)."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish()
