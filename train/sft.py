"""Fine-tuning on prefix-to-answer dialogues, of a LoRA adapter (or every weight, `model.use_peft: false`):
`objective: sft`, `refusion`, `distill` or `sdft`.

    accelerate launch train/sft.py recipe=qwen3_prefix [training.learning_rate=1e-4 ...]
    accelerate launch --config_file headstart/recipes/accelerate/zero3.yaml train/sft.py recipe=qwen3_prefix
    accelerate launch train/sft.py recipe=refusion_prefix_to_answer

Without `recipe=` the embedded default `smollm2_prefix` runs (SmolLM2-135M on CPU). The script
reads top to bottom: setup (recipe, process group, batch plan, the checkpoint to resume and TRL's
config, all checked before any download or data work), data, model and trainer, training, and
saving (the adapter, then the merged model on the main process alone; a full-parameter run's model
in `merged/`). The recipe's `training:`
section is TRL's SFTConfig, built once (train/sft_config.py); what each objective swaps in is train/objectives.py.
"""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path
from typing import Any

from accelerate import PartialState
from accelerate.utils import DistributedType

from headstart.config import cli_main, config_to_dict, dump_config
from headstart.devices import idle_cores_note, require_cuda
from headstart.model_files import check_local_source
from headstart.models import download_model, load_tokenizer, resolve_model_dir, weights_fingerprint
from headstart.paths import outputs_dir
from headstart.run_dir import check_writable, holding_run_dir
from train.batch import batch_plan
from train.checkpoints import CompletenessMarker, last_complete_checkpoint, stop_on_request
from train.config import TrainRecipe
from train.data import data_fingerprint
from train.model import lora_config
from train.objectives import objective_trainer
from train.processes import group_timeout, keep_one_gpu, process_device, process_group_kwargs
from train.recipe import StackVersionError as StackVersionError  # raised by check_transformers_version
from train.recipe import check_transformers_version, parse_recipe, training_gpu_requests
from train.relaunch import check_inputs, check_run_dir, mark_run
from train.saving import save_final, training_record
from train.sft_config import trainer_config
from train.splits import evaluates, load_data
from train.tokenization import resolve_training_system
from train.topology import check_resume, launch_topology
from train.tracking import ResolvedConfigToWandb, configure_trackers, finish_trackers


def say(state: PartialState, *lines: str) -> None:
    """Print on the main process alone.

    Args:
        state (PartialState): the process group's state.
        lines (str): the lines to print.
    """
    if state.is_main_process:
        for line in lines:
            print(line, flush=True)


def main(argv: list[str]) -> None:
    """Train one recipe: set up, load data and model, train, save the adapter (and merge it).

    Args:
        argv (list[str]): `recipe=NAME` and `key=value` overrides.
    """
    # --- Setup: stack, recipe, device, run directory, process group
    check_transformers_version(metadata.version("transformers"))
    recipe, recipe_name = parse_recipe(argv)
    require_cuda(training_gpu_requests(recipe))  # never an 8B model on CPU in fp32 without a word
    output_dir = Path(recipe.training["output_dir"] or outputs_dir("train", recipe_name))
    changed = check_run_dir(output_dir, recipe)  # another recipe's run is refused, before anything is written
    check_writable(output_dir, "training.output_dir")  # else a PermissionError once data and model were read
    check_local_source(recipe.model.name_or_path)  # a directory without weights: refused before any download or load
    state = PartialState(**process_group_kwargs(recipe))
    with ExitStack() as held:  # the run directory, once its first file is written (`load_inputs`)
        train(recipe, recipe_name, output_dir, state, changed, held)


def train(recipe: TrainRecipe, recipe_name: str, output_dir: Path, state: PartialState,
          changed: dict[str, tuple[Any, Any]], held: ExitStack) -> None:
    """The run after setup: batch plan and resume, data, model and trainer, training, saving.

    Args:
        changed (dict[str, tuple[Any, Any]]): the resumable keys this launch changed (`check_run_dir`).
        held (ExitStack): where the run directory's hold is kept until the run ends.
    """
    # --- Batch plan, the checkpoint to resume, TRL's config of the run (built once, before any download:
    # TRL's checks of the `training:` values fail here, not after the data and model are read)
    plan = batch_plan(recipe, state.num_processes)
    topology = launch_topology(state.num_processes)
    checkpoint = last_complete_checkpoint(output_dir) if recipe.run.resume else None
    resume_notes = check_resume(checkpoint, topology, recipe) if checkpoint else []
    args = trainer_config(recipe, recipe_name, output_dir, state.num_processes, evaluates(recipe),
                          process_device(state))
    keep_one_gpu(args, distributed=state.distributed_type != DistributedType.NO)
    say(state, *plan.notes())

    # --- Data
    model_dir, tokenizer, train_data, eval_data, data_record = load_inputs(recipe, output_dir, state, checkpoint, held)
    configure_trackers(recipe, recipe_name, output_dir, state.is_main_process)

    # --- Model and trainer
    stop = stop_on_request()  # preemption (slurm/train.sbatch): checkpoint and stop when asked
    peft_config = lora_config(recipe)
    trainer_class, model, collator, objective_kwargs = objective_trainer(recipe, model_dir, tokenizer, peft_config,
                                                                         state)
    record = training_record(recipe, recipe_name, plan, data_record)
    callbacks = [CompletenessMarker(topology, plan, record), ResolvedConfigToWandb(config_to_dict(recipe), recipe_name),
                 *([stop] if stop is not None else [])]
    trainer = trainer_class(model=model, args=args, data_collator=collator, train_dataset=train_data,
                            eval_dataset=eval_data, processing_class=tokenizer, peft_config=peft_config,
                            callbacks=callbacks, **objective_kwargs)

    # --- Train (resuming from the last complete checkpoint)
    announce(state, trainer, plan.effective, checkpoint, resume_notes, changed)
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    if stop is not None and stop.stopped_at is not None:
        # Preempted: the checkpoint is the run's state; the relaunch resumes from it and writes the adapter.
        saved = output_dir / f"checkpoint-{stop.stopped_at}"
        say(state, f"stopped at step {stop.stopped_at} on request ({stop.path}): saved {saved}; "
                   f"relaunch the same command to resume")
        if state.is_main_process:
            stop.report(saved)
        finish_trackers()
        return

    # --- Save: the adapter, then the merged model (float32, on the main process alone)
    save_final(trainer, tokenizer, output_dir, recipe, state, record)
    if recipe.model.use_peft:
        say(state, f"adapter: {output_dir / 'adapter'}", *([f"merged: {output_dir / 'merged'}"] if recipe.run.merge else []))
    else:
        say(state, f"model (every weight trained): {output_dir / 'merged'}")
    finish_trackers()


def load_inputs(recipe: TrainRecipe, output_dir: Path, state: PartialState, checkpoint: Path | None,
                held: ExitStack) -> tuple:
    """Model files and tokenizer (the main process downloads first), the run's inputs checked against a
    checkpoint's, the tokenized splits; then the run directory held and its run record written. Returns
    (model_dir, tokenizer, train_data, eval_data, data_record).

    Args:
        checkpoint (Path | None): the checkpoint the run resumes from, None for a fresh run.
        held (ExitStack): where the main process keeps its hold on the run directory.
    """
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
    if state.is_main_process:
        # Held from its first file on: a second launch on it at once is refused, naming this one's pid.
        held.enter_context(holding_run_dir(output_dir, "training.output_dir"))
        mark_run(output_dir, recorded_inputs)  # first: the directory is headstart's, and what it trains from
        dump_config(recipe, output_dir / "config.yaml")
    return model_dir, tokenizer, train_data, eval_data, data_record


def announce(state: PartialState, trainer: Any, effective_batch: int, checkpoint: Path | None,
             resume_notes: list[str], changed: dict[str, tuple[Any, Any]]) -> None:
    """Say how the run trains (processes, batch, learning rate, collective timeout) and what it resumes.

    Args:
        trainer (Any): the built trainer (its accelerator and arguments).
        effective_batch (int): sequences per optimizer step (the batch plan's).
        checkpoint (Path | None): the checkpoint resumed from, or None.
        resume_notes (list[str]): what `check_resume` noted of the checkpoint.
        changed (dict[str, tuple[Any, Any]]): the resumable keys this launch changed.
    """
    args, timeout = trainer.args, group_timeout()
    say(state, f"processes: {state.num_processes} ({trainer.accelerator.distributed_type.value}), gradient "
               f"accumulation: {args.gradient_accumulation_steps}, per-device batch: {args.per_device_train_batch_size}, "
               f"effective batch: {effective_batch}, learning rate: {args.learning_rate:.4g}"
               + (f", collective timeout: {timeout:g} s" if timeout is not None else ""))
    if note := idle_cores_note(state.device.type, int(os.environ.get("LOCAL_WORLD_SIZE", state.num_processes))):
        say(state, note)
    if checkpoint:
        say(state, f"resuming from {checkpoint}", *resume_notes,
            *(f"note: {key} {old!r} -> {new!r} on resume" for key, (old, new) in changed.items()))
        if "training.max_steps" in changed:
            say(state, "note: the remaining steps follow the learning-rate schedule of the new max_steps; the "
                       "result is not what a fresh run of that length gives")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(cli_main(lambda: main(sys.argv[1:])))
