"""How a checkpoint was written, and whether this launch can resume it.

Each checkpoint records how it was written (`headstart_topology.json`: world
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

import os
from dataclasses import dataclass
from pathlib import Path

from headstart.files import read_json_file
from train.batch import batch_plan
from train.config import RecipeValueError, TrainRecipe

TOPOLOGY_FILE = "headstart_topology.json"


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
        stage = read_json_file(config_file).get("zero_optimization", {}).get("stage")
        if isinstance(stage, int):
            return stage
    stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "")
    return int(stage) if stage.isdigit() else None


def uses_deepspeed() -> bool:
    """Whether accelerate launched this process under DeepSpeed (its environment says so)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def launch_topology(world_size: int) -> Topology:
    """The topology of this launch, known before the trainer exists (accelerate's environment).

    Args:
        world_size (int): the processes of this launch.
    """
    if uses_deepspeed():
        return Topology(world_size, "deepspeed", deepspeed_zero_stage())
    return Topology(world_size, "torch")


def checkpoint_topology(checkpoint: Path) -> tuple[Topology | None, dict | None]:
    """(topology, batch plan) a checkpoint was written with: its record, else read off its files
    (checkpoints written before records existed: no plan); (None, None) when neither tells.

    Args:
        checkpoint (Path): the checkpoint's directory.
    """
    record = checkpoint / TOPOLOGY_FILE
    if record.is_file():
        saved = read_json_file(record)
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


def check_resume(checkpoint: Path, current: Topology, recipe: TrainRecipe) -> list[str]:
    """Refuse a relaunch that cannot continue `checkpoint` (see the module's doc); returns
    notes to print for one that can but differs from the run that wrote it. Reads only.

    Args:
        checkpoint (Path): the checkpoint to resume.
        current (Topology): the topology of this launch.
        recipe (TrainRecipe): the recipe of this launch.
    """
    plan = batch_plan(recipe, current.world_size)
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
        old = batch_plan(recipe, saved.world_size)
        before = (old.effective, old.learning_rate)
    if before != (plan.effective, plan.learning_rate):
        raise RecipeValueError(
            f"{checkpoint} was written by {saved.describe()} with effective batch {before[0]} and learning rate "
            f"{before[1]:g}; on {current.describe()} they would be {plan.effective} and "
            f"{plan.learning_rate:g} (run.effective_batch_size over the world size), and the resumed steps would "
            f"skip samples never trained on: {again}"
        )
    return [f"note: {checkpoint} was written by {saved.describe()}; resuming on {current.describe()} "
            f"with the same effective batch {plan.effective} and learning rate: the remaining steps read the same "
            f"samples, in other micro-batches (random streams per rank differ)"]
