"""Checkpoints that are safe to resume from, and the stop a preempted job asks for.

A run killed while writing `checkpoint-N` leaves a directory that looks like a
checkpoint but is not one. After every process has finished writing, the main
process drops a marker file into it; only marked checkpoints are resumed from.
How a checkpoint was written, and whether a launch may resume it: train/topology.py;
which run a directory holds: train/relaunch.py.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from headstart.prompts import write_training_record
from train.batch import BatchPlan
from train.topology import TOPOLOGY_FILE, Topology

COMPLETE_MARKER = "CHECKPOINT_COMPLETE"
STOP_FILE_ENV = "HEADSTART_STOP_FILE"  # slurm/train.sbatch: the file its USR1 handler writes
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def last_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The marked checkpoint with the highest step in `output_dir`, or None.

    Args:
        output_dir (str | Path): the run directory.
    """
    directory = Path(output_dir)
    if not directory.is_dir():
        return None
    marked = [
        (int(match.group(1)), path)
        for path in directory.iterdir()
        if (match := CHECKPOINT_NAME.match(path.name)) and (path / COMPLETE_MARKER).is_file()
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
        """After a save: wait for every rank, then record the topology and mark the checkpoint complete.

        Args:
            args (TrainingArguments): the trainer's arguments.
            state (TrainerState): the trainer's state (step, world rank).
            control (TrainerControl): the trainer's flags, returned.
            kwargs (Any): what the trainer passes besides (model, tokenizer, ...), unused.
        """
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
        """Whether any rank has seen the stop file (every rank must call it: an all-reduce).

        Args:
            device (torch.device): where the all-reduce's tensor lives (the process group's device).
        """
        seen = torch.tensor([1.0 if self.path.is_file() else 0.0], device=device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        return bool(seen.item())

    def on_step_end(self, args, state, control, **kwargs):
        """On a stop request before the last step: save at the end of this step and stop.

        Args:
            args (TrainingArguments): the trainer's arguments.
            state (TrainerState): the trainer's state (step, world rank).
            control (TrainerControl): the trainer's flags, returned.
            kwargs (Any): what the trainer passes besides (model, tokenizer, ...), unused.
        """
        if self.requested(args.device) and state.global_step < state.max_steps:
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
        return control

    def report(self, checkpoint: Path) -> None:
        """Tell the batch script the checkpoint is written, so it requeues the job (main process).

        Args:
            checkpoint (Path): the checkpoint the stopped run wrote.
        """
        self.path.write_text(f"saved {checkpoint}\n")


def stop_on_request() -> StopOnRequest | None:
    """The preemption callback when the launch names a stop file (HEADSTART_STOP_FILE)."""
    path = os.environ.get(STOP_FILE_ENV, "").strip()
    return StopOnRequest(Path(path)) if path else None
