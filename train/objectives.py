"""What each `objective:` changes in the run: the trainer with its model, collator and loss settings
(TRL's config class: train/sft_config.py `trainer_config`). Everything else (LoRA, accelerate,
DeepSpeed, checkpoints) is shared."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from accelerate import PartialState
from peft import LoraConfig
from transformers import AutoModelForCausalLM
from trl import SFTTrainer

from headstart.refusion import add_refusion_tokens, mask_token_id
from train.config import TrainRecipe
from train.distill import DistillCollator, DistillTrainer
from train.model import model_init_kwargs
from train.processes import process_device
from train.refusion_objective import RefusionCollator, RefusionTrainer, add_trainable_tokens
from train.sdft import sdft_trainer


def refusion_collator(recipe: TrainRecipe, tokenizer, process_index: int) -> RefusionCollator:
    """The slot-layout collator; each process draws its layouts from its own stream (seed + rank).

    Args:
        recipe (TrainRecipe): the validated recipe (`refusion:` and `training.max_length`, `training.seed`).
        tokenizer (PreTrainedTokenizerBase): the tokenizer with ReFusion's tokens.
        process_index (int): this process's rank.
    """
    return RefusionCollator(
        mask_token_id=mask_token_id(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        slot_sizes=tuple(recipe.refusion.slot_sizes),
        eps=recipe.refusion.eps,
        max_length=recipe.training["max_length"],
        seed=recipe.training["seed"] + process_index,
        clean_average=recipe.refusion.clean_average,
    )


def objective_trainer(recipe: TrainRecipe, model_dir: Path, tokenizer, peft_config: LoraConfig | None,
                      state: PartialState) -> tuple[Callable[..., SFTTrainer], Any, Any, dict]:
    """The trainer class (or factory), the model it is given, its collator and its extra arguments.

    `sft` hands TRL the model directory. `refusion` loads the base with its mask and begin tokens
    (rows trained beside LoRA), then lays out slots; it is called after the TRL arguments exist, so
    a ZeRO-3 run partitions the model as TRL's own loading would. `distill`'s teacher is the model
    with its adapter disabled: no second copy is loaded. `sdft` is TRL's: the student drafts, the
    adapter-off teacher scores them.

    Args:
        recipe (TrainRecipe): the validated recipe.
        model_dir (Path): the base model's directory.
        tokenizer (PreTrainedTokenizerBase): its tokenizer (refusion adds its tokens to it).
        peft_config (LoraConfig | None): the LoRA config (refusion adds its token rows to it); None: every
            weight trains (`model.use_peft` false), the new token rows with them.
        state (PartialState): this process's accelerate state.
    """
    if recipe.objective == "refusion":
        model = AutoModelForCausalLM.from_pretrained(model_dir, **model_init_kwargs(recipe, *process_device(state)))
        if peft_config is None:
            add_refusion_tokens(model, tokenizer)
        else:
            add_trainable_tokens(model, tokenizer, peft_config)
        return RefusionTrainer, model, refusion_collator(recipe, tokenizer, state.process_index), {}
    if recipe.objective == "distill":
        collator = DistillCollator(pad_token_id=tokenizer.pad_token_id, max_length=recipe.training["max_length"])
        return DistillTrainer, model_dir, collator, {"divergence": recipe.distill.divergence,
                                                     "top_k": recipe.distill.top_k}
    if recipe.objective == "sdft":
        return sdft_trainer, model_dir, None, {}
    return SFTTrainer, model_dir, None, {}
