"""Chat formatting per family and model loading from local sources."""

from __future__ import annotations

import pytest

from headstart.models import load_model, resolve_model_dir
from headstart.prompts import (
    INCOMPLETE_REQUEST_SYSTEM, build_messages, detect_family, encode_prompt, render_prompt,
)

GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}"
    "{% endif %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@pytest.fixture
def tokenizer_with(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    def make(template: str):
        tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
        tokenizer.chat_template = template
        return tokenizer

    return make


def test_families_are_recognised_from_their_templates(tokenizer_with, tiny_tokenizer):
    assert detect_family(tokenizer_with(GEMMA_TEMPLATE)) == "gemma3"
    assert detect_family(tokenizer_with(QWEN3_TEMPLATE)) == "qwen3"
    assert detect_family(tokenizer_with(LLAMA3_TEMPLATE)) == "llama3"
    assert detect_family(tiny_tokenizer) == "chatml"


def test_gemma3_takes_the_system_message_into_the_first_user_turn(tokenizer_with):
    messages = build_messages("Sort a list", system=INCOMPLETE_REQUEST_SYSTEM)
    text = render_prompt(tokenizer_with(GEMMA_TEMPLATE), messages)
    assert f"<start_of_turn>user\n{INCOMPLETE_REQUEST_SYSTEM}\n\nSort a list<end_of_turn>" in text
    assert text.endswith("<start_of_turn>model\n")


def test_qwen3_prompts_have_thinking_switched_off(tokenizer_with):
    text = render_prompt(tokenizer_with(QWEN3_TEMPLATE), build_messages("Sort a list"))
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_history_precedes_the_streamed_turn_and_no_bos_is_doubled(tokenizer_with):
    tokenizer = tokenizer_with(LLAMA3_TEMPLATE)
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    text = render_prompt(tokenizer, build_messages("Now sort a list", history=history))
    assert text.index("Hi") < text.index("Hello") < text.index("Now sort a list")
    ids = encode_prompt(tokenizer, build_messages("x"))
    assert tokenizer.decode(ids).count("<|begin_of_text|>") == 1


def test_models_load_from_local_dirs_and_missing_ones_are_named(tiny_llama_dir, tmp_path):
    loaded = load_model(str(tiny_llama_dir), device="cpu")
    assert loaded.family == "chatml" and loaded.tokenizer.pad_token_id is not None
    assert str(next(loaded.model.parameters()).dtype) == "torch.float32"
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        resolve_model_dir(str(tmp_path / "no_such_model"))
    with pytest.raises(FileNotFoundError, match="GGUF"):
        resolve_model_dir(str(tmp_path / "missing.gguf"))
