"""train/sdft.py: `objective: sdft`, TRL's SDFTTrainer, through train/sft.py: the student
(adapter on) drafts from the prefix S_i, the teacher (the same weights, adapter off) reading
the complete request S_n scores the draft."""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset, DatasetDict
from test_train_distill import distill_rows
from test_train_support import (
    ONE_PROCESS,
    humaneval_dialogues,
    launch,
    resume_from_checkpoint_2,
    sft_here,
    step_losses,
    tiny_overrides,
)
from transformers import AutoModelForCausalLM

from headstart.models import load_model, load_tokenizer
from headstart.prompts import detect_family, encode_prompt, render_prompt
from train.config import RecipeValueError
from train.model import lora_config
from train.sdft import PRIVILEGED, sdft_rows, sdft_trainer
from train.sft import parse_recipe
from train.sft_config import trainer_config
from train.tokenization import resolve_training_system

SYSTEM = resolve_training_system("incomplete", None)  # the text of the incomplete-request message


def recipe_of(*overrides: str):
    return parse_recipe(["recipe=smollm2_sdft", "training.report_to=[none]", *overrides])[0]


def test_rows_give_trl_the_prefix_dialogue_and_the_rest_of_the_request(tiny_tokenizer):
    rows = distill_rows(3)
    data = sdft_rows(Dataset.from_list(rows), tiny_tokenizer, detect_family(tiny_tokenizer), SYSTEM,
                     recipe_of("training.max_length=2048"), "train")
    assert data.column_names == ["prompt", PRIVILEGED]
    for row, out in zip(rows, data):
        assert out["prompt"] == row["messages"][:-1]  # system turn and S_i; the answer is not used
        assert out["prompt"][-1]["content"] + out[PRIVILEGED] == row["full_request"]


def test_rows_without_the_full_request_or_room_are_refused(tiny_tokenizer):
    family = detect_family(tiny_tokenizer)
    with pytest.raises(ValueError, match="objective: sdft needs .* `full_request` column"):
        sdft_rows(Dataset.from_list(humaneval_dialogues(2)), tiny_tokenizer, family, SYSTEM, recipe_of(), "train")
    with pytest.raises(ValueError, match="no train row's teacher prompt fits in training.max_length=160"):
        sdft_rows(Dataset.from_list(distill_rows(2)), tiny_tokenizer, family, SYSTEM,
                  recipe_of("training.max_length=160", "sdft.max_completion_length=100"), "train")


def test_sdft_recipe_mirrors_the_distill_recipe():
    recipe, other = recipe_of(), parse_recipe(["recipe=smollm2_distill", "training.report_to=[none]"])[0]
    assert recipe.objective == "sdft"
    assert (recipe.model, recipe.data, recipe.lora, recipe.run, recipe.training) == \
        (other.model, other.data, other.lora, other.run, other.training)


@pytest.mark.parametrize("argv, key", [
    (["recipe=smollm2_distill", "sdft.num_generations=2"], "sdft.* settings apply to objective: sdft only"),
    (["recipe=smollm2_sdft", "sdft.distillation_mode=fancy"], "sdft.distillation_mode"),
    (["recipe=smollm2_sdft", "sdft.distillation_mode=sampled_token"], "sdft.distillation_alpha=1"),
    (["recipe=smollm2_sdft", "sdft.max_completion_length=512"], "sdft.max_completion_length"),
    (["recipe=smollm2_sdft", "sdft.temperature=0"], "sdft.temperature"),
    (["recipe=smollm2_sdft", "training.packing=true"], "training.packing"),
])
def test_bad_sdft_settings_name_the_key(argv, key):
    with pytest.raises(RecipeValueError, match=key.replace(".", r"\.").replace("*", r"\*")):
        parse_recipe(argv)


def test_batch_not_divisible_by_the_generations_and_sft_only_fields_are_refused(tmp_path):
    with pytest.raises(RecipeValueError, match=r"sdft\.num_generations=3 must divide the effective batch 4"):
        trainer_config(recipe_of("sdft.num_generations=3"), "t", tmp_path, 1, False, (0, "cpu"))
    with pytest.raises(RecipeValueError, match=r"training\.dataset_num_proc is a field of TRL's SFTConfig"):
        trainer_config(recipe_of("training.dataset_num_proc=2"), "t", tmp_path, 1, False, (0, "cpu"))
    args = trainer_config(recipe_of("sdft.num_generations=2"), "t", tmp_path, 1, False, (0, "cpu"))
    assert (args.teacher_model_kind, args.num_generations, args.generation_batch_size) == ("base", 2, 4)


def test_sft_refuses_a_batch_the_generations_do_not_divide_in_one_line(tmp_path, tiny_qwen3_dir, capsys):
    code = sft_here(["recipe=smollm2_sdft", f"model.name_or_path={tiny_qwen3_dir}", "sdft.num_generations=3",
                     f"training.output_dir={tmp_path / 'run'}"])
    stderr = capsys.readouterr().err
    assert code == 2, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith("error: sdft.num_generations=3 must divide")


# --- the teacher: the base with the adapter off, reading the full request -----------------------


def test_teacher_is_the_base_with_the_adapter_off_reading_the_full_request(tmp_path, tiny_model_dir):
    """Each tiny family (Qwen3, Llama): TRL's student and teacher inputs are the evaluator's S_i and S_n."""
    recipe = recipe_of("training.max_length=2048", "sdft.max_completion_length=12", "lora.dropout=0")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    family = detect_family(tokenizer)
    row = distill_rows(1)[0]
    data = sdft_rows(Dataset.from_list([row]), tokenizer, family, SYSTEM, recipe, "train")
    trainer = sdft_trainer(model=str(tiny_model_dir), args=trainer_config(recipe, "t", tmp_path, 1, False, (0, "cpu")),
                           train_dataset=data, processing_class=tokenizer, peft_config=lora_config(recipe))
    assert trainer.teacher_model is trainer.model  # no second copy of the weights
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained-looking adapter (LoRA B starts at zero)
        for name, param in trainer.model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)

    batch = trainer._prepare_training_batch([data[0]])  # the student's real draft
    completion = batch["completion_ids"][0].tolist()
    student_prompt = encode_prompt(tokenizer, row["messages"][:-1], family)
    teacher_prompt = encode_prompt(tokenizer, [*row["messages"][:-2], {"role": "user", "content": row["full_request"]}],
                                   family)
    assert batch["prompt_ids"][0].tolist() == student_prompt
    assert batch["teacher_input_ids"][0].tolist() == teacher_prompt + completion
    assert len(completion) > 0 and teacher_prompt != student_prompt

    logits = trainer._compute_teacher_student_logits(trainer.model, trainer.teacher_model, batch)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    n = len(completion)
    with torch.no_grad():
        expected_teacher = base(torch.tensor([teacher_prompt + completion])).logits[:, -n - 1:-1]
        base_on_student = base(torch.tensor([student_prompt + completion])).logits[:, -n - 1:-1]
        expected_student = trainer.model(input_ids=torch.tensor([student_prompt + completion])).logits[:, -n - 1:-1]
    torch.testing.assert_close(logits.teacher_logits, expected_teacher, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits.student_logits.detach(), expected_student, rtol=1e-5, atol=1e-5)
    assert (expected_student - base_on_student).abs().max() > 1e-3  # the adapter is on for the student


# --- through train/sft.py ---------------------------------------------------------------------


def write_sdft_data(path, n_train: int = 16):
    DatasetDict({"train": Dataset.from_list(distill_rows(n_train))}).save_to_disk(str(path))
    return path


def test_objective_sdft_through_sft_trains_saves_and_resumes(tmp_path, tiny_qwen3_dir):
    data = write_sdft_data(tmp_path / "data")
    out, resumed = tmp_path / "run", tmp_path / "resumed"
    settings = dict(max_steps=4, save_steps=2, max_length=1024)
    extra = ["sdft.max_completion_length=16"]
    launch(ONE_PROCESS, ["recipe=smollm2_sdft", *extra, *tiny_overrides(tiny_qwen3_dir, data, out, **settings)])
    losses = step_losses(out)
    assert sorted(losses) == [1, 2, 3, 4] and all(math.isfinite(v) and v > 0 for v in losses.values())

    # Resumed from step 2: TRL's drafts are drawn from the torch RNG the checkpoint restores, so
    # the resumed run drafts the same answers: the same losses and the same adapter, bit for bit.
    resume_from_checkpoint_2(out, resumed, ["recipe=smollm2_sdft", *extra,
                                            *tiny_overrides(tiny_qwen3_dir, data, resumed, **settings)])

    # The adapter loads as the evaluator loads it, and changed the model.
    peft = load_model(str(out / "adapter"), device="cpu")
    base = load_model(str(tiny_qwen3_dir), device="cpu").model
    ids = peft.tokenizer(render_prompt(peft.tokenizer, humaneval_dialogues(1)[0]["messages"][:-1]), return_tensors="pt")
    with torch.no_grad():
        assert (base(**ids).logits - peft.model(**ids).logits).abs().max() > 1e-4


@pytest.mark.slow
def test_sdft_ddp_and_zero3_give_the_same_losses(tmp_path, tiny_qwen3_dir):
    """Two CPU processes (gloo): each rank drafts its own prompts from the same seed, under DDP
    and under ZeRO-3 (the drafts from gathered weights, the teacher through the engine's hooks)
    alike. One process drafts all four prompts in one batch, so its drafts, and losses, differ."""
    data = write_sdft_data(tmp_path / "data")
    losses = {}
    for name, launcher in (("ddp", ["--multi_gpu", "--num_processes", "2"]),
                           ("zero3", ["--config_file", "headstart/recipes/accelerate/zero3.yaml", "--num_processes", "2"])):
        out = tmp_path / name
        launch(launcher, ["recipe=smollm2_sdft", "sdft.max_completion_length=16",
                          *tiny_overrides(tiny_qwen3_dir, data, out, max_steps=2, save_steps=2, max_length=1024)],
               timeout=500)
        losses[name] = step_losses(out)
    assert sorted(losses["ddp"]) == [1, 2] and all(math.isfinite(v) for v in losses["ddp"].values())
    assert losses["zero3"] == pytest.approx(losses["ddp"], rel=1e-4, abs=1e-6)
