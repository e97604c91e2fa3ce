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

COMPLETE_MARKER = "CHECKPOINT_COMPLETE"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


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
