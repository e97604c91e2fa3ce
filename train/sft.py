"""Fine-tuning of a LoRA adapter on prefix-to-answer dialogues: `objective: sft`, `refusion`, `distill` or `sdft`.

    accelerate launch train/sft.py recipe=qwen3_prefix [training.learning_rate=1e-4 ...]
    accelerate launch --config_file headstart/recipes/accelerate/zero3.yaml train/sft.py recipe=qwen3_prefix
    accelerate launch train/sft.py recipe=refusion_prefix_to_answer
    accelerate launch train/sft.py recipe=qwen3_distill

Without `recipe=` the embedded default `smollm2_prefix` runs (SmolLM2-135M on CPU).
The script reads top to bottom: recipe, process group (with `training.ddp_timeout`),
batch plan and the checkpoint to resume (both checked before any data work), model
files (the main process downloads first), tokenizer and data, run directory and
trackers, TRL configuration, model (ReFusion adds its tokens), trainer, training,
adapter, and the merged model (float32, on the main process alone: no other rank
waits on it). `objective: refusion` swaps in the slot layout and loss of
train/refusion.py, `objective: distill` the student/teacher batches and KL loss of
train/distill.py, `objective: sdft` TRL's on-policy SDFTTrainer (train/sdft.py);
everything else (LoRA, accelerate, DeepSpeed, checkpoints) is shared.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from accelerate import PartialState
from accelerate.utils import DistributedType
from packaging.version import Version
from transformers import AutoModelForCausalLM
from trl import SFTTrainer

from headstart.config import cli_main, config_to_dict, dump_config, load_config
from headstart.devices import gpu_requests, idle_cores_note, require_cuda
from headstart.model_files import check_local_source
from headstart.models import download_model, load_tokenizer, resolve_model_dir, weights_fingerprint
from headstart.paths import outputs_dir
from headstart.prompts import Family, detect_family, write_training_record
from headstart.run_dir import check_writable
from train.arguments import (
    group_timeout,
    keep_one_gpu,
    lora_config,
    model_init_kwargs,
    process_device,
    process_group_kwargs,
    refusion_collator,
    sft_config,
)
from train.batch import BatchPlan, batch_plan
from train.checkpoints import CompletenessMarker, StopOnRequest, last_complete_checkpoint, stop_on_request
from train.config import TrainRecipe
from train.data import data_fingerprint, load_split
from train.distill import DistillCollator, DistillTrainer
from train.provenance import answer_models, check_answer_models
from train.refusion import RefusionTrainer, add_trainable_tokens
from train.relaunch import check_inputs, check_run_dir, mark_run
from train.sdft import sdft_config, sdft_rows, sdft_trainer
from train.tokenization import check_fits, resolve_training_system, tokenize_dataset, trained_system_record
from train.topology import Topology, check_resume, launch_topology
from train.tracking import ResolvedConfigToWandb, configure_trackers, finish_trackers
from train.validation import validate

DEFAULT_RECIPE = "smollm2_prefix"
# TrainingArguments.activation_checkpointing (sft_config) and Trainer.loss_is_scaled_for_ga
# (train/refusion.py, train/distill.py) first appear in transformers 5.19: older releases raise
# on the first, and ignore the second, dividing the distillation loss by the accumulation steps
# once more (a learning rate silently cut by that factor).
TRANSFORMERS_NEEDED = "5.19"


class StackVersionError(ValueError):
    """An installed library too old for this script (a ValueError: printed as one line by cli_main)."""


def check_transformers_version(installed: str, needed: str = TRANSFORMERS_NEEDED) -> None:
    if Version(installed) < Version(needed):
        raise StackVersionError(
            f"transformers {installed} is installed; train/sft.py needs transformers >= {needed} "
            f"(activation_checkpointing, loss_is_scaled_for_ga): pip install 'transformers>={needed}' "
            "(pyproject.toml pins the tested version)"
        )


def training_gpu_requests(recipe: TrainRecipe, environ: Mapping[str, str] | None = None) -> list[str]:
    """What asks this run for a GPU (headstart.devices): the environment's GPUs and a recipe saying
    bf16. `accelerate launch --cpu` (or `use_cpu: true`) is an explicit CPU choice: nothing asks."""
    environ = os.environ if environ is None else environ
    if environ.get("ACCELERATE_USE_CPU", "false").lower() in ("1", "true", "yes", "y", "on", "t"):
        return []
    return gpu_requests(environ) + (["training.bf16=true"] if recipe.training.get("bf16") else [])


def parse_recipe(argv: list[str]) -> tuple[TrainRecipe, str]:
    """The validated recipe and its name (for the run directory and tags)."""
    if not any(arg.startswith("recipe=") for arg in argv):
        argv = [f"recipe={DEFAULT_RECIPE}", *argv]
    name = Path([a for a in argv if a.startswith("recipe=")][-1].split("=", 1)[1]).stem
    return validate(load_config(TrainRecipe, argv)), name


def training_family(tokenizer, recipe: TrainRecipe) -> Family:
    """The chat rendering of the training rows: the tokenizer's, and ReFusion's for a Qwen3
    base trained with `objective: refusion` (its tokens are added only after the data is
    tokenized; the adapter's tokenizer has them, so evaluation renders it as ReFusion)."""
    family = detect_family(tokenizer)
    return "refusion" if recipe.objective == "refusion" and family == "qwen3" else family


def load_data(recipe: TrainRecipe, tokenizer, state: PartialState, system: str | None):
    """Tokenized train and (optional) eval splits, and what the adapter records of its data;
    the main process tokenizes first, the others reuse its cache. Answers written by another
    model than the one trained are refused (`data.answers_from_other_model`)."""
    family = training_family(tokenizer, recipe)
    with state.main_process_first():
        train = load_split(recipe.data.path, recipe.data.train_split)
        if train is None:
            raise ValueError(f"{recipe.data.path} has no split {recipe.data.train_split!r}")
        sdft = recipe.objective == "sdft"  # trains on its own drafts: the rows' answers, whoever wrote them, unused
        notes = [] if sdft else check_answer_models(train, recipe.data.path, recipe.model.name_or_path,
                                                    recipe.data.answers_from_other_model)
        if recipe.data.max_train_samples:
            train = train.select(range(min(recipe.data.max_train_samples, len(train))))
        record = {**trained_system_record(system, train),
                  "answer_models": None if sdft else sorted(answer_models(train, recipe.data.path) or []) or None}
        if sdft:
            train = sdft_rows(train, tokenizer, family, system, recipe, recipe.data.train_split)
        else:
            train = tokenize_dataset(train, tokenizer, family, system, recipe.objective)
            check_fits(train, recipe.training["max_length"], recipe.data.train_split)
        evaluation = None
        if recipe.data.eval_split and (recipe.training["eval_steps"] or 0) > 0:
            evaluation = load_split(recipe.data.path, recipe.data.eval_split)
            if evaluation is not None:
                if recipe.data.max_eval_samples:
                    evaluation = evaluation.select(range(min(recipe.data.max_eval_samples, len(evaluation))))
                evaluation = (sdft_rows(evaluation, tokenizer, family, system, recipe, recipe.data.eval_split)
                              if sdft else
                              tokenize_dataset(evaluation, tokenizer, family, system, recipe.objective))
    if state.is_main_process:
        for note in notes:
            print(note, flush=True)
    return train, evaluation, record


def callbacks(recipe: TrainRecipe, recipe_name: str, topology: Topology | None = None,
              plan: BatchPlan | None = None, record: dict | None = None, stop: StopOnRequest | None = None) -> list:
    chosen = [CompletenessMarker(topology, plan, record), ResolvedConfigToWandb(config_to_dict(recipe), recipe_name)]
    return chosen + ([stop] if stop is not None else [])


def save_final(trainer: SFTTrainer, tokenizer, output_dir: Path, recipe: TrainRecipe, state: PartialState,
               record: dict | None = None) -> None:
    """Adapter (gathered from all ZeRO-3 shards by save_model: the run's last collective), its
    tokenizer and training record (headstart.json: the system message it was trained with,
    read back by evaluation), then the merged model on the main process alone. The other
    ranks return at once: none waits at a barrier while an 8-12B base loads and merges on
    CPU, which can outlast any collective timeout."""
    adapter_dir = output_dir / "adapter"
    trainer.save_model(str(adapter_dir))
    state.wait_for_everyone()  # every rank's part is written before the main process completes the directory
    if not state.is_main_process:
        return
    tokenizer.save_pretrained(adapter_dir)
    write_training_record(adapter_dir, record or {})
    if recipe.run.merge:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        from train.merge import merge_adapter

        # Loading the base again must not be partitioned by the ZeRO-3 context of training.
        unset_hf_deepspeed_config()
        merge_adapter(adapter_dir, output_dir / "merged")  # float32: small LoRA deltas survive (train/merge.py)


def training_record(recipe: TrainRecipe, recipe_name: str, plan: BatchPlan, data_record: dict) -> dict:
    """What an adapter (and its merged model) records of its training."""
    return {"written_by": "train/sft.py", "recipe": recipe_name, "objective": recipe.objective,
            "base_model": recipe.model.name_or_path, "system_message_setting": recipe.data.system_message,
            **data_record, "batch_plan": plan.as_dict()}


def main(argv: list[str]) -> None:
    # --- Stack, recipe, device, and the run it would resume ---------------------
    check_transformers_version(metadata.version("transformers"))
    recipe, recipe_name = parse_recipe(argv)
    require_cuda(training_gpu_requests(recipe))  # never an 8B model on CPU in fp32 without a word
    output_dir = Path(recipe.training["output_dir"] or outputs_dir("train", recipe_name))
    changed = check_run_dir(output_dir, recipe)  # another recipe's run is refused, before anything is written
    check_writable(output_dir, "training.output_dir")  # else a PermissionError once data and model were read
    check_local_source(recipe.model.name_or_path)  # a directory without weights: refused before any download or load
    state = PartialState(**process_group_kwargs(recipe))

    # --- Batch plan and resume: checked before any download or data work ---------
    plan = batch_plan(recipe, state.num_processes)
    topology = launch_topology(state.num_processes)
    checkpoint = last_complete_checkpoint(output_dir) if recipe.run.resume else None
    resume_notes = check_resume(checkpoint, topology, recipe) if checkpoint else []
    # TRL's own checks of the `training:` values, before any download (built again below, once
    # the data says whether there is an evaluation split).
    trainer_config = sdft_config if recipe.objective == "sdft" else sft_config
    trainer_config(recipe, recipe_name, output_dir, state.num_processes, False, process_device(state))
    if state.is_main_process:
        for note in plan.notes():
            print(note, flush=True)

    # --- Model files, tokenizer and data (checked before the run directory is written)
    try:
        with state.main_process_first():  # one download per cache; the other ranks then read it
            download_model(recipe.model.name_or_path)
        model_dir = resolve_model_dir(recipe.model.name_or_path)
        tokenizer = load_tokenizer(model_dir)
    except OSError as error:  # transformers' "not a local folder and not a valid model identifier"
        raise FileNotFoundError(f"model.name_or_path={recipe.model.name_or_path}: {error}") from error
    # A checkpoint continues only on the rows and the base it was trained on (every rank checks:
    # a refusal on one alone would leave the others waiting).
    inputs = {"data_fingerprint": data_fingerprint(recipe.data.path),
              "model_fingerprint": weights_fingerprint(recipe.model.name_or_path)}
    recorded_inputs = check_inputs(output_dir, inputs, resuming=checkpoint is not None)
    system = resolve_training_system(recipe.data.system_message, model_dir)
    train_data, eval_data, data_record = load_data(recipe, tokenizer, state, system)

    # --- Run directory and trackers --------------------------------------------
    if state.is_main_process:
        mark_run(output_dir, recorded_inputs)  # first: the directory is headstart's, and what it trains from
        dump_config(recipe, output_dir / "config.yaml")
    configure_trackers(recipe, recipe_name, output_dir, state.is_main_process)

    # --- Model and trainer -----------------------------------------------------
    evaluate = eval_data is not None
    args = trainer_config(recipe, recipe_name, output_dir, state.num_processes, evaluate, process_device(state))
    keep_one_gpu(args, distributed=state.distributed_type != DistributedType.NO)
    stop = stop_on_request()  # preemption (slurm/train.sbatch): checkpoint and stop when asked
    model, peft_config, trainer_class, collator, objective_kwargs = model_dir, lora_config(recipe), SFTTrainer, None, {}
    if recipe.objective == "refusion":
        # The base with its mask and begin tokens (rows trained beside LoRA), then the slot layout and loss.
        # Loaded after the TRL arguments, so a ZeRO-3 run partitions it as TRL's own loading would.
        model = AutoModelForCausalLM.from_pretrained(model_dir, **model_init_kwargs(recipe, *process_device(state)))
        add_trainable_tokens(model, tokenizer, peft_config)
        trainer_class, collator = RefusionTrainer, refusion_collator(recipe, tokenizer, state.process_index)
    elif recipe.objective == "distill":
        # The teacher is this model with its adapter disabled: no second copy is loaded.
        trainer_class = DistillTrainer
        collator = DistillCollator(pad_token_id=tokenizer.pad_token_id, max_length=recipe.training["max_length"])
        objective_kwargs = {"divergence": recipe.distill.divergence, "top_k": recipe.distill.top_k}
    elif recipe.objective == "sdft":
        trainer_class = sdft_trainer  # TRL's: student drafts, the adapter-off teacher scores them
    trainer = trainer_class(
        model=model,
        args=args,
        data_collator=collator,
        train_dataset=train_data,
        eval_dataset=eval_data,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks(recipe, recipe_name, topology, plan, training_record(recipe, recipe_name, plan, data_record),
                            stop),
        **objective_kwargs,
    )

    # --- Train (resuming from the last complete checkpoint) ---------------------
    if state.is_main_process:
        timeout = group_timeout()
        print(
            f"processes: {state.num_processes} ({trainer.accelerator.distributed_type.value}), "
            f"gradient accumulation: {args.gradient_accumulation_steps}, per-device batch: "
            f"{args.per_device_train_batch_size}, effective batch: {plan.effective}, learning rate: "
            f"{args.learning_rate:.4g}" + (f", collective timeout: {timeout:g} s" if timeout is not None else ""),
            flush=True,
        )
        if note := idle_cores_note(state.device.type, int(os.environ.get("LOCAL_WORLD_SIZE", state.num_processes))):
            print(note, flush=True)
        if checkpoint:
            print(f"resuming from {checkpoint}", flush=True)
            for note in resume_notes:
                print(note, flush=True)
            for key, (old, new) in changed.items():
                print(f"note: {key} {old!r} -> {new!r} on resume", flush=True)
            if "training.max_steps" in changed:
                print("note: the remaining steps follow the learning-rate schedule of the new max_steps; the result "
                      "is not what a fresh run of that length gives", flush=True)
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    if stop is not None and stop.stopped_at is not None:
        # Preempted: the checkpoint is the run's state; the relaunch resumes from it and
        # writes the adapter. Nothing final is written now.
        saved = output_dir / f"checkpoint-{stop.stopped_at}"
        if state.is_main_process:
            print(f"stopped at step {stop.stopped_at} on request ({stop.path}): saved {saved}; "
                  f"relaunch the same command to resume", flush=True)
            stop.report(saved)
        finish_trackers()
        return

    # --- Adapter and merged model ----------------------------------------------
    save_final(trainer, tokenizer, output_dir, recipe, state, training_record(recipe, recipe_name, plan, data_record))
    if state.is_main_process:
        print(f"adapter: {output_dir / 'adapter'}", flush=True)
        if recipe.run.merge:
            print(f"merged: {output_dir / 'merged'}", flush=True)
    finish_trackers()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(cli_main(lambda: main(sys.argv[1:])))
