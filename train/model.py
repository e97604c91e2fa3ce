"""The trained model as the libraries are given it: TRL's `ModelConfig` of the recipe's `model:`
and `lora:` sections, PEFT's LoRA config from it (TRL's `get_peft_config`), and the
`from_pretrained` arguments of this process."""

from __future__ import annotations

import torch
from peft import LoraConfig
from trl import ModelConfig, get_peft_config

from headstart.models import default_dtype
from train.config import TrainRecipe
from train.topology import uses_deepspeed


def model_config(recipe: TrainRecipe) -> ModelConfig:
    """TRL's ModelConfig of the recipe: the base, its dtype and attention, and the LoRA adapter
    (`lora.target_regex`, a full-name regex, takes the place of the module names).

    Args:
        recipe (TrainRecipe): the validated recipe.
    """
    model, lora = recipe.model, recipe.lora
    return ModelConfig(model_name_or_path=model.name_or_path, dtype=model.dtype or "auto",
                       attn_implementation=model.attn_implementation, use_peft=model.use_peft, lora_r=lora.r,
                       lora_alpha=lora.alpha, lora_dropout=lora.dropout, lora_task_type="CAUSAL_LM",
                       lora_target_modules=lora.target_regex or list(lora.target_modules))


def lora_config(recipe: TrainRecipe) -> LoraConfig | None:
    """PEFT's LoRA config of the recipe, as TRL's `get_peft_config` builds it (None: `model.use_peft`
    false, every weight trains).

    Args:
        recipe (TrainRecipe): the validated recipe.
    """
    return get_peft_config(model_config(recipe))


def use_bf16(recipe: TrainRecipe) -> bool:
    """bf16 mixed precision on GPU, fp32 on CPU, unless the recipe's `training.bf16` decides.

    Args:
        recipe (TrainRecipe): the validated recipe.
    """
    bf16 = recipe.training.get("bf16")
    return torch.cuda.is_available() if bf16 is None else bf16


def model_dtype(recipe: TrainRecipe) -> torch.dtype:
    """The weights' dtype: `model.dtype`, where unset is bf16 on GPU and fp32 on CPU, and fp32 wherever
    every weight trains (`model.use_peft` false): AdamW on bf16 weights rounds small updates away, and
    `training.bf16` still autocasts the compute. (LoRA keeps its adapter in fp32 over a bf16 base.)

    Args:
        recipe (TrainRecipe): the validated recipe.
    """
    if recipe.model.dtype is None and not recipe.model.use_peft:
        return torch.float32
    if recipe.model.dtype is None:
        return default_dtype("cuda" if torch.cuda.is_available() else "cpu")
    return getattr(torch, recipe.model.dtype)


def model_init_kwargs(recipe: TrainRecipe, gpus: int = 0, device: str = "cpu") -> dict:
    """`from_pretrained` arguments of the trained model. With GPUs the whole model goes to this
    process's device: left unset, TRL gives a single process `device_map="auto"`, which spreads the
    model over every GPU of the node (one layer range per GPU, each idle while the others compute).
    Under DDP TRL drops the map (each rank loads on the CPU, then moves to its GPU); the refusion
    path, which loads the model itself, keeps it. Under DeepSpeed the engine places the model
    (ZeRO-3 partitions it as it loads, and transformers refuses a device_map there); on CPU there
    is nothing to place.

    Args:
        recipe (TrainRecipe): the validated recipe.
        gpus (int): the usable GPUs of this node.
        device (str): the device accelerate gives this process.
    """
    placed = gpus > 0 and not uses_deepspeed()
    return {"dtype": model_dtype(recipe), "attn_implementation": recipe.model.attn_implementation,
            "device_map": {"": device} if placed else None}
