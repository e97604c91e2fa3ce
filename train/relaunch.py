"""What a relaunch in a run directory may change, and what it must find there.

A run directory holds one run: its recipe (config.yaml), checkpoints, the adapter.
A relaunch resumes it only with the same recipe (`RESUMABLE_KEYS` aside), on the same
data and base model (their fingerprints in the run record, headstart.run_dir); any
other is refused before anything is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headstart.config import config_to_dict, load_config
from headstart.prompts import canonical_system_setting
from headstart.run_dir import check_output_dir, read_mark, write_mark
from train.checkpoints import CHECKPOINT_NAME
from train.config import RecipeValueError, TrainRecipe

RUN_KIND = "train"
# What a run was trained from, by content (recorded in its run record): a resume on other
# rows or another base would continue the old steps on inputs they never saw.
INPUT_KEYS = ("data_fingerprint", "model_fingerprint")


# The keys a run may change when it resumes in its run directory: when it stops, how
# often it saves, evaluates and logs, where it reports, and what is done after training.
# Every other key decides what the steps compute (data, model, LoRA, optimiser,
# schedule, batch, seed, objective): a relaunch that changes one is refused
# (check_run_dir), since the trainer would silently continue the
# saved run (a changed learning rate resumes with the saved one; a finished run runs
# 0 steps). Changing max_steps extends or shortens the run, and the remaining steps
# follow the learning-rate schedule of the new max_steps (cosine and warm-up are
# shares of it), so the result is not what a fresh run of that length gives; the
# run says so when it resumes.
RESUMABLE_KEYS = (
    "training.max_steps",
    "training.save_steps",
    "training.save_total_limit",
    "training.eval_steps",
    "training.logging_steps",
    "training.report_to",
    "training.run_name",
    "training.output_dir",
    "training.ddp_timeout",
    "training.dataloader_num_workers",  # the sampler and its order stay in the main process
    "run.resume",
    "run.merge",
    # Only refuses or allows a raised batch; check_resume compares the plan itself with the checkpoint's.
    "run.keep_effective_batch",
    "wandb.project",
    "wandb.entity",
    "wandb.tags",
)


def recipe_differences(saved: TrainRecipe, recipe: TrainRecipe) -> dict[str, tuple[Any, Any]]:
    """Keys whose values differ between two recipes, `RESUMABLE_KEYS` aside: {key: (saved, new)}.

    Args:
        saved (TrainRecipe): the run's saved recipe.
        recipe (TrainRecipe): the recipe of this launch.
    """
    old, new = canonical_keys(config_to_dict(saved)), canonical_keys(config_to_dict(recipe))
    return {key: (old.get(key), new.get(key)) for key in sorted(old.keys() | new.keys())
            if key not in RESUMABLE_KEYS and old.get(key) != new.get(key)}


def canonical_keys(values: dict[str, Any]) -> dict[str, Any]:
    """`flat_keys`, with the system message setting in its canonical spelling (a run saved
    with the old `incomplete_request` is the same recipe as one saying `incomplete`).

    Args:
        values (dict[str, Any]): a recipe as a nested dict.
    """
    flat = flat_keys(values)
    if isinstance(flat.get("data.system_message"), str):
        flat["data.system_message"] = canonical_system_setting(flat["data.system_message"])
    return flat


def flat_keys(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict flattened to dotted keys (`training.max_length`).

    Args:
        values (dict[str, Any]): the nested dict.
        prefix (str): put before every key.
    """
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat |= flat_keys(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def check_run_dir(output_dir: str | Path, recipe: TrainRecipe) -> dict[str, tuple]:
    """Refuse to train into a directory headstart did not create (headstart.run_dir), or
    into a run directory holding another run: one whose saved recipe
    (config.yaml) differs on a key outside `RESUMABLE_KEYS`, one with checkpoints but
    no config.yaml, or any run at all when `run.resume` is false (a new run would
    overwrite and rotate away its checkpoints). Reads only. Returns the resumable keys
    that changed, {key: (saved, new)}.

    Args:
        output_dir (str | Path): the run directory.
        recipe (TrainRecipe): the recipe of this launch.
    """
    directory = Path(output_dir)
    # A directory headstart did not create is refused (headstart.run_dir); one without a
    # checkpoint, an adapter or a trained model holds no run (a launch that failed early): a new one starts there.
    if check_output_dir(directory, RUN_KIND, setting="training.output_dir") == "new":
        return {}
    saved_path = directory / "config.yaml"
    holds_run = has_progress(directory)
    how = f"to start a new run, choose another training.output_dir (or move {directory} away)"
    if not holds_run:
        return {}
    if not saved_path.is_file():
        if holds_run:
            raise RecipeValueError(f"{directory} holds checkpoints, an adapter or a trained model but no config.yaml: "
                                   f"the recipe that trained them is unknown; {how}")
        return {}
    try:
        saved = load_config(TrainRecipe, [f"recipe={saved_path}"])
    except ValueError as error:
        raise RecipeValueError(f"{directory} holds a run whose config.yaml cannot be read ({error}); {how}") from error
    if holds_run and not recipe.run.resume:
        raise RecipeValueError(f"run.resume=false, but {directory} holds a run (checkpoints, an adapter or a trained "
                               f"model) that a new run would overwrite; {how}")
    differences = recipe_differences(saved, recipe)
    if differences:
        detail = ", ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in differences.items())
        raise RecipeValueError(
            f"{directory} holds a run of another recipe ({detail}); resuming it would continue the saved run, not "
            f"this one. Only these keys may change on resume: {', '.join(RESUMABLE_KEYS)}. {how[0].upper()}{how[1:]}"
        )
    old, new = flat_keys(config_to_dict(saved)), flat_keys(config_to_dict(recipe))
    return {key: (old.get(key), new.get(key)) for key in RESUMABLE_KEYS if old.get(key) != new.get(key)}


def has_progress(directory: Path) -> bool:
    """Whether a run directory holds a checkpoint, an adapter or a trained model (a full-parameter run
    writes `merged/` alone); else it holds no run.

    Args:
        directory (Path): the run directory.
    """
    return (any(CHECKPOINT_NAME.match(p.name) for p in directory.iterdir())
            or any((directory / name).exists() for name in ("adapter", "merged")))


def check_inputs(output_dir: str | Path, inputs: dict[str, str], resuming: bool) -> dict[str, str | None]:
    """Refuse to resume a run on other data or another base model than it was trained on
    (`inputs`: INPUT_KEYS -> content fingerprint); a record without them vouches for nothing and
    is refused too. Reads only; returns what the run record is to keep.

    Args:
        output_dir (str | Path): the run directory.
        inputs (dict[str, str]): INPUT_KEYS -> the content fingerprints of this launch's data and model.
        resuming (bool): whether the launch continues a run.
    """
    if not resuming:
        return dict(inputs)
    directory = Path(output_dir)
    saved = (read_mark(directory) or {}).get("inputs") or {}
    changed = [key for key in INPUT_KEYS if saved.get(key) != inputs[key]]
    if changed:
        what = {"data_fingerprint": "data.path holds other rows", "model_fingerprint": "model.name_or_path holds other weights"}
        detail = "; ".join(f"{what[key]} ({key} {str(saved.get(key, 'unrecorded'))[:19]}... -> {inputs[key][:19]}...)"
                           for key in changed)
        raise RecipeValueError(
            f"{directory} holds checkpoints trained on other inputs: {detail}; resuming would continue them on these. "
            f"Choose another training.output_dir for a new run (or move {directory} away)")
    return dict(inputs)


def mark_run(output_dir: str | Path, inputs: dict[str, str | None]) -> None:
    """Write the run record (main process, before anything else of the run): the directory
    is headstart's, and what the run is trained from.

    Args:
        output_dir (str | Path): the run directory.
        inputs (dict[str, str | None]): INPUT_KEYS -> the content fingerprints the run is trained from.
    """
    write_mark(output_dir, RUN_KIND, {"inputs": inputs})
