"""Checkpoints that are safe to resume from.

A run killed while writing `checkpoint-N` leaves a directory that looks like a
checkpoint but is not one. After every process has finished writing, the main
process drops a marker file into it; only marked checkpoints are resumed from.

Each checkpoint also records how it was written (`headstart_topology.json`: world
size, engine, ZeRO stage and the batch plan), and a relaunch is checked against it
before any data work: DeepSpeed's ZeRO shards load only on the data-parallel size
that wrote them and only into the same stage (DeepSpeed raises mid-start), and a
torch (single-process or DDP) checkpoint has no ZeRO shards, nor a DeepSpeed one an
`optimizer.pt` (the trainer would silently restart the optimizer and schedule). Those
relaunches are refused with what to do. A torch checkpoint resumes on another world
size when the effective batch and learning rate stay the same: step k then reads the
same samples (the sampler's order does not depend on the world size).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from headstart.config import config_to_dict, load_config
from headstart.prompts import write_training_record
from headstart.run_dir import check_output_dir, only_entries, read_mark, write_mark
from train.config import (
    RESUMABLE_KEYS, BatchPlan, RecipeValueError, TrainingSection, TrainRecipe, batch_plan, flat_keys, recipe_differences,
)

COMPLETE_MARKER = "CHECKPOINT_COMPLETE"
STOP_FILE_ENV = "HEADSTART_STOP_FILE"  # slurm/train.sbatch: the file its USR1 handler writes
TOPOLOGY_FILE = "headstart_topology.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
RUN_KIND = "train"
# What a run directory of an earlier version (without headstart.run_dir.MARK) may hold: the
# recipe, checkpoints, the adapter and merged model, the trackers' files (train/tracking.py).
# README.md: the model card TRL writes beside the checkpoints.
RUN_NAMES = {"config.yaml", "adapter", "merged", "tensorboard", "wandb", "wandb_run_id", "runs", "README.md"}
# What a run was trained from, by content (recorded in its run record): a resume on other
# rows or another base would continue the old steps on inputs they never saw.
INPUT_KEYS = ("data_fingerprint", "model_fingerprint")


@dataclass(frozen=True)
class Topology:
    """How a run's processes share the training state."""

    world_size: int
    engine: str  # "torch" (one process or DDP: full optimizer state in optimizer.pt) or "deepspeed"
    zero_stage: int | None = None  # DeepSpeed's ZeRO stage (1 and 2 write the same layout)

    @property
    def layout(self) -> str:
        """What the checkpoint files look like: the torch trainer's, ZeRO-1/2 shards or ZeRO-3 shards."""
        if self.engine != "deepspeed":
            return "torch"
        return "zero3" if self.zero_stage == 3 else "zero1/2"

    def describe(self) -> str:
        processes = f"{self.world_size} process{'es' if self.world_size != 1 else ''}"
        if self.engine != "deepspeed":
            return f"{processes} without DeepSpeed ({'DDP' if self.world_size > 1 else 'single process'})"
        stage = "ZeRO-1/2" if self.zero_stage is None else f"ZeRO-{self.zero_stage}"
        return f"{processes} under DeepSpeed {stage}"


def deepspeed_zero_stage() -> int | None:
    """The ZeRO stage of this launch: from the DeepSpeed JSON accelerate was given, else its flag."""
    config_file = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "")
    if config_file and config_file != "None" and Path(config_file).is_file():
        stage = json.loads(Path(config_file).read_text()).get("zero_optimization", {}).get("stage")
        if isinstance(stage, int):
            return stage
    stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "")
    return int(stage) if stage.isdigit() else None


def uses_deepspeed() -> bool:
    """Whether accelerate launched this process under DeepSpeed (its environment says so)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def launch_topology(world_size: int) -> Topology:
    """The topology of this launch, known before the trainer exists (accelerate's environment)."""
    if uses_deepspeed():
        return Topology(world_size, "deepspeed", deepspeed_zero_stage())
    return Topology(world_size, "torch")


def checkpoint_topology(checkpoint: Path) -> tuple[Topology | None, dict | None]:
    """(topology, batch plan) a checkpoint was written with: its record, else read off its files
    (checkpoints written before records existed: no plan); (None, None) when neither tells."""
    record = checkpoint / TOPOLOGY_FILE
    if record.is_file():
        saved = json.loads(record.read_text())
        return Topology(**saved["topology"]), saved.get("batch_plan")
    steps = [p for p in checkpoint.glob("global_step*") if p.is_dir()]
    if steps:  # DeepSpeed: one optimizer shard per data-parallel rank; per-rank model states under ZeRO-3
        shards = list(steps[0].glob("*zero_pp_rank_*_optim_states.pt"))
        stage = 3 if list(steps[0].glob("zero_pp_rank_*_model_states.pt")) else None
        return (Topology(len(shards), "deepspeed", stage) if shards else None), None
    if (checkpoint / "optimizer.pt").is_file():
        ranks = len(list(checkpoint.glob("rng_state_*.pth")))
        return Topology(ranks or 1, "torch"), None
    return None, None


def check_resume(checkpoint: Path, current: Topology, training: TrainingSection) -> list[str]:
    """Refuse a relaunch that cannot continue `checkpoint` (see the module's doc); returns
    notes to print for one that can but differs from the run that wrote it. Reads only."""
    plan = batch_plan(training, current.world_size)
    saved, saved_plan = checkpoint_topology(checkpoint)
    if saved is None:
        return [f"note: {checkpoint} does not say how it was written; it is resumed as it is"]
    again = (f"relaunch with {saved.describe()} (e.g. the same nodes x GPUs and accelerate --config_file), or "
             f"start a new run in another training.output_dir")
    if saved.layout != current.layout:
        raise RecipeValueError(
            f"{checkpoint} was written by {saved.describe()}; this launch is {current.describe()}. The optimizer "
            f"state of one cannot be loaded by the other (DeepSpeed raises on a foreign layout; without DeepSpeed "
            f"the trainer would silently restart the optimizer and learning-rate schedule): {again}"
        )
    if saved.engine == "deepspeed" and saved.world_size != current.world_size:
        raise RecipeValueError(
            f"{checkpoint} holds DeepSpeed ZeRO shards of {saved.world_size} data-parallel ranks; this launch has "
            f"{current.world_size}, and DeepSpeed loads ZeRO shards only on the world size that wrote them: {again}"
        )
    if saved.world_size == current.world_size:
        return []
    if saved_plan is not None:
        before = (saved_plan["effective_batch_size"], saved_plan["learning_rate"])
    else:  # written before records: the same recipe (check_run_dir) on that world size gives its plan
        old = batch_plan(training, saved.world_size)
        before = (old.effective, old.learning_rate)
    if before != (plan.effective, plan.learning_rate):
        raise RecipeValueError(
            f"{checkpoint} was written by {saved.describe()} with effective batch {before[0]} and learning rate "
            f"{before[1]:g}; on {current.describe()} they would be {plan.effective} and "
            f"{plan.learning_rate:g} (training.effective_batch_size over the world size), and the resumed steps would "
            f"skip samples never trained on: {again}"
        )
    return [f"note: {checkpoint} was written by {saved.describe()}; resuming on {current.describe()} "
            f"with the same effective batch {plan.effective} and learning rate: the remaining steps read the same "
            f"samples, in other micro-batches (random streams per rank differ)"]


def check_run_dir(output_dir: str | Path, recipe: TrainRecipe) -> dict[str, tuple]:
    """Refuse to train into a directory headstart did not create (headstart.run_dir), or
    into a run directory holding another run: one whose saved recipe
    (config.yaml) differs on a key outside `RESUMABLE_KEYS`, one with checkpoints but
    no config.yaml, or any run at all when `training.resume` is false (a new run would
    overwrite and rotate away its checkpoints). Reads only. Returns the resumable keys
    that changed, {key: (saved, new)}."""
    directory = Path(output_dir)
    # A directory headstart did not create is refused (headstart.run_dir); one without a
    # checkpoint or an adapter holds no run (a launch that failed early): a new one starts there.
    if check_output_dir(directory, RUN_KIND, legacy=_legacy_run_dir, setting="training.output_dir") == "new":
        return {}
    saved_path = directory / "config.yaml"
    holds_run = has_progress(directory)
    how = f"to start a new run, choose another training.output_dir (or move {directory} away)"
    if not holds_run:
        return {}
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


def has_progress(directory: Path) -> bool:
    """Whether a run directory holds a checkpoint or an adapter (else it holds no run)."""
    return any(_CHECKPOINT.match(p.name) for p in directory.iterdir()) or (directory / "adapter").exists()


def _legacy_run_dir(directory: Path) -> bool:
    """A run directory of an earlier version (no run record): only a run's names, with its
    recipe, a checkpoint or an adapter among them."""
    # Progress, not names alone: a user's folder holding just a config.yaml is no run of ours.
    return only_entries(directory, RUN_NAMES, lambda name: bool(_CHECKPOINT.match(name))) and has_progress(directory)


def check_inputs(output_dir: str | Path, inputs: dict[str, str], resuming: bool) -> dict[str, str | None]:
    """Refuse to resume a run on other data or another base model than it was trained on
    (`inputs`: INPUT_KEYS -> content fingerprint). Reads only; returns what the run record is
    to keep: these fingerprints, or None for those a run of an earlier version never recorded
    (it resumes with a warning: its inputs cannot be checked, and the record never vouches for them)."""
    if not resuming:
        return dict(inputs)
    directory = Path(output_dir)
    saved = (read_mark(directory) or {}).get("inputs") or {}
    unrecorded = [key for key in INPUT_KEYS if saved.get(key) is None]
    changed = [key for key in INPUT_KEYS if key not in unrecorded and saved[key] != inputs[key]]
    if changed:
        what = {"data_fingerprint": "data.path holds other rows", "model_fingerprint": "model.name_or_path holds other weights"}
        detail = "; ".join(f"{what[key]} ({key} {saved[key][:19]}... -> {inputs[key][:19]}...)" for key in changed)
        raise RecipeValueError(
            f"{directory} holds checkpoints trained on other inputs: {detail}; resuming would continue them on these. "
            f"Choose another training.output_dir for a new run (or move {directory} away)")
    if unrecorded:
        print(f"warning: {directory} predates input fingerprints ({', '.join(unrecorded)} unrecorded): its checkpoints "
              "cannot be checked against the data and model of this run", flush=True)
    return {key: None if key in unrecorded else inputs[key] for key in INPUT_KEYS}


def mark_run(output_dir: str | Path, inputs: dict[str, str | None]) -> None:
    """Write the run record (main process, before anything else of the run): the directory
    is headstart's, and what the run is trained from."""
    write_mark(output_dir, RUN_KIND, {"inputs": inputs})


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
    """Mark `checkpoint-<step>` complete once every rank has saved its part, after recording
    the topology and batch plan that wrote it."""

    def __init__(self, topology: Topology | None = None, plan: BatchPlan | None = None,
                 training_record: dict | None = None) -> None:
        self.topology = topology
        self.plan = plan
        self.training_record = training_record  # headstart.json: a checkpoint evaluates like the final adapter

    def on_save(self, args, state, control, **kwargs):
        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # ZeRO ranks write their own shards; wait for all of them
        if state.is_world_process_zero:
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if checkpoint.is_dir():
                if self.topology is not None:
                    record = {"topology": asdict(self.topology), "batch_plan": self.plan.as_dict() if self.plan else None}
                    (checkpoint / TOPOLOGY_FILE).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
                if self.training_record is not None:
                    write_training_record(checkpoint, self.training_record)
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


class StopOnRequest(TrainerCallback):
    """Preemption: once `path` exists (slurm/train.sbatch writes it when Slurm sends USR1
    ahead of the time limit), save a checkpoint at the end of the current step and stop.
    The ranks decide together (one all-reduce per step): a rank that saw the file a step
    later than another would save, or wait in a collective, alone. A request that comes
    at the last step changes nothing (the run ends and saves its adapter as usual)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stopped_at: int | None = None

    def requested(self, device: torch.device) -> bool:
        seen = torch.tensor([1.0 if self.path.is_file() else 0.0], device=device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        return bool(seen.item())

    def on_step_end(self, args, state, control, **kwargs):
        if self.requested(args.device) and state.global_step < state.max_steps:
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
        return control

    def report(self, checkpoint: Path) -> None:
        """Tell the batch script the checkpoint is written, so it requeues the job (main process)."""
        self.path.write_text(f"saved {checkpoint}\n")


def stop_on_request() -> StopOnRequest | None:
    """The preemption callback when the launch names a stop file (HEADSTART_STOP_FILE)."""
    path = os.environ.get(STOP_FILE_ENV, "").strip()
    return StopOnRequest(Path(path)) if path else None
