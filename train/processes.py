"""How the processes of a launch join: the process group's arguments and timeout, and each
process's device."""

from __future__ import annotations

from datetime import timedelta

import torch
from accelerate import PartialState
from trl import SFTConfig

from train.config import TrainRecipe
from train.topology import uses_deepspeed


def process_state_kwargs() -> dict:
    """How this process joins the others. On GPU accelerate decides; on CPU it must be told:
    DDP needs `cpu=True` (MULTI_CPU over gloo), while DeepSpeed needs the gloo backend named and
    `cpu` left off, or each process trains alone."""
    if torch.cuda.is_available():
        return {}
    if uses_deepspeed():
        return {"backend": "gloo"}
    return {"cpu": True}


def process_group_kwargs(recipe: TrainRecipe) -> dict:
    """The PartialState arguments: how to join, and how long a collective may wait. The group is
    created before the trainer's arguments exist, so their `ddp_timeout` would never reach it
    (torch's and DeepSpeed's defaults would apply).

    Args:
        recipe (TrainRecipe): the validated recipe (its `training.ddp_timeout`).
    """
    return {**process_state_kwargs(), "timeout": timedelta(seconds=recipe.training["ddp_timeout"])}


def group_timeout() -> float | None:
    """Seconds the default process group's collectives wait (None: no group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = dist.distributed_c10d._get_default_group()
    for device in ("cuda", "cpu"):
        try:
            return group._get_backend(torch.device(device)).options._timeout.total_seconds()
        except (RuntimeError, AttributeError, ValueError):
            continue
    return None


def process_device(state: PartialState) -> tuple[int, str]:
    """The usable GPUs of this node and the device accelerate gives this process.

    Args:
        state (PartialState): this process's accelerate state.
    """
    return (torch.cuda.device_count() if torch.cuda.is_available() else 0), str(state.device)


def keep_one_gpu(args: SFTConfig, distributed: bool) -> None:
    """One process on a multi-GPU node trains on the one GPU its model is pinned to
    (train/model.py `model_init_kwargs`): left at the node's count, `Trainer` would wrap the model
    in nn.DataParallel, which TRL refuses once the model has loaded.

    Args:
        args (SFTConfig): the trainer's arguments, changed in place.
        distributed (bool): whether this launch runs more than one process.
    """
    if not distributed and args.n_gpu > 1:
        args._n_gpu = 1
