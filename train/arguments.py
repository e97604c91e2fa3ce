"""What train/sft.py hands the libraries: TRL's SFTConfig, PEFT's LoraConfig, the model's
`from_pretrained` arguments, the process group, and the ReFusion collator."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
from accelerate import PartialState
from peft import LoraConfig
from trl import SFTConfig

from headstart.config import error_line
from headstart.models import default_dtype
from headstart.refusion import mask_token_id
from train.batch import batch_plan
from train.config import RecipeValueError, TrainRecipe
from train.refusion import RefusionCollator
from train.topology import uses_deepspeed


def process_state_kwargs() -> dict:
    """How this process joins the others. On GPU accelerate decides; on CPU it
    must be told: DDP needs `cpu=True` (MULTI_CPU over gloo), while DeepSpeed
    needs the gloo backend named and `cpu` left off, or each process trains alone."""
    if torch.cuda.is_available():
        return {}
    if uses_deepspeed():
        return {"backend": "gloo"}
    return {"cpu": True}


def process_group_kwargs(recipe: TrainRecipe) -> dict:
    """The PartialState arguments: how to join, and how long a collective may wait. The
    group is created here, before the trainer's arguments exist, so their `ddp_timeout`
    would never reach it (torch's and DeepSpeed's defaults, 10-30 minutes, would apply)."""
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


def use_bf16(recipe: TrainRecipe) -> bool:
    """bf16 mixed precision on GPU, fp32 on CPU, unless the recipe decides."""
    bf16 = recipe.training.get("bf16")
    return torch.cuda.is_available() if bf16 is None else bf16


def model_dtype(recipe: TrainRecipe) -> torch.dtype:
    if recipe.model.dtype == "auto":
        return default_dtype("cuda" if torch.cuda.is_available() else "cpu")
    return getattr(torch, recipe.model.dtype)


def model_init_kwargs(recipe: TrainRecipe, gpus: int = 0, device: str = "cpu") -> dict:
    """`from_pretrained` arguments of the trained model, for a process on `device` of a node with
    `gpus` usable GPUs. With GPUs the whole model goes to this process's device: left unset, TRL
    gives a single process `device_map="auto"`, which spreads the model over every GPU of the node
    (one layer range per GPU, each idle while the others compute). Under DDP TRL drops the map
    (each rank loads on the CPU, then moves to its GPU); the refusion path, which loads the model
    itself, keeps it. Under DeepSpeed the engine
    places the model (ZeRO-3 partitions it as it loads, and transformers refuses a device_map
    there); on CPU there is nothing to place."""
    placed = gpus > 0 and not uses_deepspeed()
    return {"dtype": model_dtype(recipe), "attn_implementation": recipe.model.attn_implementation,
            "device_map": {"": device} if placed else None}


def keep_one_gpu(args: SFTConfig, distributed: bool) -> None:
    """One process on a multi-GPU node trains on the one GPU its model is pinned to
    (`model_init_kwargs`): left at the node's count, `Trainer` would wrap the model in
    nn.DataParallel, which TRL refuses once the model has loaded."""
    if not distributed and args.n_gpu > 1:
        args._n_gpu = 1


def process_device(state: PartialState) -> tuple[int, str]:
    """The usable GPUs of this node and the device accelerate gives this process."""
    return (torch.cuda.device_count() if torch.cuda.is_available() else 0), str(state.device)


def sft_config(recipe: TrainRecipe, recipe_name: str, output_dir: Path, world_size: int, evaluate: bool,
               placement: tuple[int, str] | None = None) -> SFTConfig:
    """TRL's SFTConfig of `trainer_arguments`; values TRL refuses are its own error, in one line."""
    arguments = trainer_arguments(recipe, recipe_name, output_dir, world_size, evaluate, placement)
    try:
        return SFTConfig(**arguments)
    except (ValueError, TypeError) as error:
        raise RecipeValueError(f"training: TRL's SFTConfig refuses it: {error_line(error)}") from error


def trainer_arguments(recipe: TrainRecipe, recipe_name: str, output_dir: Path, world_size: int, evaluate: bool,
                      placement: tuple[int, str] | None = None) -> dict:
    """TRL arguments: the recipe's `training:` section as it is, and what this launch decides:
    per-device batch, accumulation and learning rate from the batch plan of this world size
    (train/batch.py), precision, evaluation, the process group's backend and, for refusion and
    distill, TRL keeping the tokenized parts as they are (the objective's collator lays them
    out; refusion also hands TRL the model already loaded, with its tokens added). `placement`:
    the node's GPUs and this process's device (`process_device`; default the current process's)."""
    t = recipe.training
    plan = batch_plan(recipe, world_size)
    own_layout = recipe.objective in ("refusion", "distill")
    placement = placement or process_device(PartialState())
    trackers = [t["report_to"]] if isinstance(t["report_to"], str) else list(t["report_to"] or [])
    arguments = {"data_seed": t["seed"], **t} | dict(
        output_dir=str(output_dir),
        run_name=t["run_name"] or f"{recipe_name}-{Path(recipe.model.name_or_path.rstrip('/')).name}",
        per_device_train_batch_size=plan.per_device,
        per_device_eval_batch_size=plan.per_device,
        gradient_accumulation_steps=plan.accumulation,
        learning_rate=plan.learning_rate,
        bf16=use_bf16(recipe),
        eval_strategy="steps" if evaluate else "no",
        eval_steps=t["eval_steps"] if evaluate else None,
        report_to=[r for r in trackers if r != "none"] or "none",
        use_cpu=process_state_kwargs().get("cpu", False),
        ddp_backend=process_state_kwargs().get("backend"),
        model_init_kwargs=None if recipe.objective == "refusion" else model_init_kwargs(recipe, *placement),
        remove_unused_columns=not own_layout,
        dataset_kwargs={"skip_prepare_dataset": True} if own_layout else None,
    )
    return arguments


def lora_config(recipe: TrainRecipe) -> LoraConfig:
    lora = recipe.lora
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_regex or list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def refusion_collator(recipe: TrainRecipe, tokenizer, process_index: int) -> RefusionCollator:
    """The slot-layout collator; each process draws its layouts from its own stream (seed + rank)."""
    return RefusionCollator(
        mask_token_id=mask_token_id(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        slot_sizes=tuple(recipe.refusion.slot_sizes),
        eps=recipe.refusion.eps,
        max_length=recipe.training["max_length"],
        seed=recipe.training["seed"] + process_index,
    )
