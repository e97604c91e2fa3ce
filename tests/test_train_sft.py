"""train/sft.py: answer-only labels, loss falls, adapter + merged model, trackers."""

from __future__ import annotations

import torch
from datasets import Dataset
from test_train_support import ONE_PROCESS, humaneval_dialogues, launch, step_losses, tiny_overrides, write_dataset_dict

from headstart.models import load_model, load_tokenizer
from headstart.prompts import (
    INCOMPLETE_REQUEST_SYSTEM,
    detect_family,
    read_training_record,
    render_prompt,
    resolve_system_message,
)
from train.model import lora_config
from train.sft import parse_recipe
from train.sft_config import trainer_config
from train.tokenization import split_prompt_answer, tokenize_dataset


def test_labels_cover_only_the_assistant_answer(tmp_path, tiny_qwen3_dir):
    """Labels after TRL's own preparation: -100 on the prompt, the answer and its end-of-turn after it."""
    from trl import SFTTrainer

    tokenizer = load_tokenizer(str(tiny_qwen3_dir))
    rows = humaneval_dialogues(6)
    data = tokenize_dataset(Dataset.from_list(rows), tokenizer, detect_family(tokenizer), "incomplete_request")
    recipe, _ = parse_recipe(["training.report_to=[none]", "training.max_length=4096"])
    trainer = SFTTrainer(
        model=str(tiny_qwen3_dir), args=trainer_config(recipe, "t", tmp_path, 1, False), train_dataset=data,
        processing_class=tokenizer, peft_config=lora_config(recipe),
    )
    prepared = trainer.train_dataset
    assert len(prepared) == len(rows)
    for row, example in zip(rows, prepared):
        prompt = render_prompt(tokenizer, row["messages"][:-1])
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        labels = example["labels"]
        assert example["input_ids"][: len(prompt_ids)] == prompt_ids  # the evaluation prompt, token for token
        assert labels[: len(prompt_ids)] == [-100] * len(prompt_ids)
        answer = labels[len(prompt_ids):]
        assert -100 not in answer
        assert tokenizer.decode(answer) == row["messages"][-1]["content"] + "<|im_end|>\n"


def test_answer_boundary_for_a_family_without_system_role(tiny_tokenizer):
    messages = humaneval_dialogues(1)[0]["messages"]
    prompt, answer = split_prompt_answer(tiny_tokenizer, messages, "gemma3")
    assert "<|im_start|>system" not in prompt and prompt.count(messages[0]["content"]) == 1
    assert answer.startswith(messages[-1]["content"])


def test_training_falls_saves_adapter_and_merged_model_and_logs(tmp_path, tiny_qwen3_dir):
    data = write_dataset_dict(tmp_path / "data")
    out = tmp_path / "run"
    overrides = tiny_overrides(
        tiny_qwen3_dir, data, out, max_steps=8, save_steps=4, eval_steps=4,
        report_to="[tensorboard,wandb]", merge="true", run_name="tiny-run",
    )
    launch(ONE_PROCESS, ["recipe=smollm2_prefix", *overrides])

    losses = step_losses(out)
    assert sorted(losses) == list(range(1, 9))
    assert losses[8] < 0.9 * losses[1], losses
    assert (out / "checkpoint-8" / "CHECKPOINT_COMPLETE").is_file()
    # A checkpoint records its training like the final adapter: evaluated, it gets the same system message.
    assert read_training_record(out / "checkpoint-4") == read_training_record(out / "adapter")
    assert resolve_system_message("model", out / "checkpoint-4") == INCOMPLETE_REQUEST_SYSTEM
    assert "effective_batch_size: 4" in (out / "config.yaml").read_text()

    # Trackers: TensorBoard events, and an offline W&B run holding tags and the resolved recipe.
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    (run_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    blob = run_file.read_bytes()
    for needle in (b"recipe:smollm2_prefix", b"model:", b"git:", b"tiny-run", b"system_message"):
        assert needle in blob, needle

    # Merged weights give the PEFT model's logits (fp32, CPU): tolerance rtol 1e-5, atol 1e-4.
    peft = load_model(str(out / "adapter"), device="cpu")
    merged = load_model(str(out / "merged"), device="cpu")
    assert type(peft.model).__name__.startswith("Peft") and not hasattr(merged.model, "peft_config")
    ids = peft.tokenizer(render_prompt(peft.tokenizer, humaneval_dialogues(1)[0]["messages"][:-1]), return_tensors="pt")
    with torch.no_grad():
        expected, actual = peft.model(**ids).logits, merged.model(**ids).logits
    base = load_model(str(tiny_qwen3_dir), device="cpu").model
    with torch.no_grad():
        assert (base(**ids).logits - expected).abs().max() > 1e-2  # the adapter changed something
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-4)
