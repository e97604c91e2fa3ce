"""What a finished run writes: the adapter with its tokenizer and training record, and the merged model
(a full-parameter run: the trained model in `merged/`, with its tokenizer and record)."""

from __future__ import annotations

from pathlib import Path

from accelerate import PartialState
from trl import SFTTrainer

from headstart.prompts import write_training_record
from train.batch import BatchPlan
from train.config import TrainRecipe


def training_record(recipe: TrainRecipe, recipe_name: str, plan: BatchPlan, data_record: dict) -> dict:
    """What an adapter (and its merged model) records of its training.

    Args:
        recipe (TrainRecipe): the validated recipe.
        recipe_name (str): its name.
        plan (BatchPlan): the batch plan of this launch.
        data_record (dict): what train/splits.py `load_data` records of the data.
    """
    return {"written_by": "train/sft.py", "recipe": recipe_name, "objective": recipe.objective,
            "base_model": recipe.model.name_or_path, "system_message_setting": recipe.data.system_message,
            **data_record, "batch_plan": plan.as_dict()}


def save_final(trainer: SFTTrainer, tokenizer, output_dir: Path, recipe: TrainRecipe, state: PartialState,
               record: dict | None = None) -> None:
    """Adapter (gathered from all ZeRO-3 shards by save_model: the run's last collective), its
    tokenizer and training record (headstart.json: the system message it was trained with, read
    back by evaluation), then the merged model on the main process alone. The other ranks return
    at once: none waits at a barrier while an 8-12B base loads and merges on CPU, which can outlast
    any collective timeout.

    Args:
        trainer (SFTTrainer): the trainer that trained the adapter.
        tokenizer (PreTrainedTokenizerBase): the tokenizer the adapter was trained with.
        output_dir (Path): the run directory (`adapter/` and `merged/` go under it; `merged/` alone when
            every weight trained).
        recipe (TrainRecipe): the validated recipe (`run.merge`).
        state (PartialState): this process's accelerate state.
        record (dict | None): the training record (`training_record`).
    """
    full = not recipe.model.use_peft  # the trained model is the whole model: written where a merge goes
    saved_dir = output_dir / ("merged" if full else "adapter")
    trainer.save_model(str(saved_dir))
    state.wait_for_everyone()  # every rank's part is written before the main process completes the directory
    if not state.is_main_process:
        return
    tokenizer.save_pretrained(saved_dir)
    write_training_record(saved_dir, record or {})
    if recipe.run.merge and not full:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        from train.merge import merge_adapter

        # Loading the base again must not be partitioned by the ZeRO-3 context of training.
        unset_hf_deepspeed_config()
        merge_adapter(saved_dir, output_dir / "merged")  # float32: small LoRA deltas survive (train/merge.py)
