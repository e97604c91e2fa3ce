"""Chat formatting per family and model loading from local sources."""

from __future__ import annotations

import pytest

from headstart.models import load_model, resolve_model_dir
from headstart.prompts import (
    INCOMPLETE_REQUEST_SYSTEM,
    build_messages,
    detect_family,
    encode_prompt,
    render_prompt,
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


# --- The system message: one vocabulary and one resolver for training and evaluation ---------

def test_system_message_vocabulary(tmp_path):
    from headstart.prompts import (
        INCOMPLETE_REQUEST_SYSTEM,
        canonical_system_setting,
        resolve_system_message,
        write_training_record,
    )

    assert resolve_system_message("incomplete") == INCOMPLETE_REQUEST_SYSTEM
    assert resolve_system_message("incomplete_request") == INCOMPLETE_REQUEST_SYSTEM  # training's old spelling
    assert canonical_system_setting("incomplete_request") == "incomplete"
    assert resolve_system_message("none") is None
    assert resolve_system_message("Answer tersely.") == "Answer tersely."
    assert resolve_system_message("model", "Qwen/Qwen3-8B") is None  # a model that records none: the template's
    with pytest.raises(ValueError, match="training data only"):
        resolve_system_message("dataset")
    with pytest.raises(ValueError, match="unknown system message setting 'incomplet'"):
        resolve_system_message("incomplet")

    adapter = tmp_path / "adapter"
    write_training_record(adapter, {"system_message": "Trained with this."})
    assert resolve_system_message("model", str(adapter)) == "Trained with this."
    assert resolve_system_message("incomplete", str(adapter)) == INCOMPLETE_REQUEST_SYSTEM  # told otherwise
    assert resolve_system_message("none", str(adapter)) is None
    write_training_record(adapter, {"system_message": None, "system_message_varies": True})
    with pytest.raises(ValueError, match="different system messages"):
        resolve_system_message("model", str(adapter))


def test_the_evaluator_uses_the_adapters_training_system_message(tmp_path):
    """`python -m eval model=<adapter dir>` used the template's system message ('model' meant none)."""
    from headstart.prompts import INCOMPLETE_REQUEST_SYSTEM, write_training_record
    from headstart.prompts import resolve_system_message as system_message  # what the evaluator calls

    adapter = tmp_path / "adapter"
    write_training_record(adapter, {"system_message": INCOMPLETE_REQUEST_SYSTEM})
    assert system_message("model", str(adapter)) == INCOMPLETE_REQUEST_SYSTEM  # the default setting
    assert system_message("none", str(adapter)) is None
    assert system_message("model", "smollm2") is None


# --- ReFusion: upstream's rendering and token ids --------------------------------------------

def test_refusion_prompts_render_as_upstream(tokenizer_with):
    """ML-GSAI/ReFusion trains with the template's default (train.py) and generates and evaluates
    with enable_thinking=True (generate.py, eval.py): no empty think block, unlike Qwen3's."""
    from headstart.refusion import BEGIN_TOKEN, MASK_TOKEN
    from train.tokenization import split_prompt_answer

    tokenizer = tokenizer_with(QWEN3_TEMPLATE)
    tokenizer.add_special_tokens({"additional_special_tokens": [BEGIN_TOKEN, MASK_TOKEN]})
    assert detect_family(tokenizer) == "refusion"
    text = render_prompt(tokenizer, build_messages("Sort a list"))
    assert text.endswith("<|im_start|>user\nSort a list<|im_end|>\n<|im_start|>assistant\n")
    messages = build_messages("Sort a list") + [{"role": "assistant", "content": "sorted(x)"}]
    prompt, answer = split_prompt_answer(tokenizer, messages, "refusion")
    assert prompt == text and answer == "sorted(x)" + tokenizer.eos_token  # train.py: encode(target) + [eos]


def qwen3_layout_tokenizer(*extra: str):
    """A word-level tokenizer with Qwen3's size and special-token ids (151,669 entries;
    <|im_end|> = 151645, </think> = 151668), then `extra` tokens added in order."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(151669)}
    for token, index in {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                         "</think>": 151668}.items():
        del vocab[f"w{index}"]
        vocab[token] = index
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>")),
                                   eos_token="<|im_end|>", unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": list(extra)}, replace_extra_special_tokens=False)
    return fast


def test_refusion_token_ids_are_checked_on_qwen3s_vocabulary():
    from headstart.refusion import BEGIN_TOKEN, MASK_TOKEN, check_refusion_token_ids, mask_token_id

    right = qwen3_layout_tokenizer(BEGIN_TOKEN, MASK_TOKEN)
    assert mask_token_id(right) == 151670 and right.convert_tokens_to_ids(BEGIN_TOKEN) == 151669
    check_refusion_token_ids(right, "GSAI-ML/ReFusion")
    swapped = qwen3_layout_tokenizer(MASK_TOKEN, BEGIN_TOKEN)
    with pytest.raises(ValueError, match="151670"):
        mask_token_id(swapped)
    with pytest.raises(ValueError, match="lacks"):
        check_refusion_token_ids(qwen3_layout_tokenizer(), "GSAI-ML/ReFusion")
    check_refusion_token_ids(qwen3_layout_tokenizer())  # a plain Qwen3 tokenizer: nothing to check


def test_loading_a_tokenizer_checks_refusions_ids(tmp_path):
    from headstart.models import load_tokenizer
    from headstart.refusion import BEGIN_TOKEN, MASK_TOKEN

    qwen3_layout_tokenizer(MASK_TOKEN, BEGIN_TOKEN).save_pretrained(tmp_path / "swapped")
    with pytest.raises(ValueError, match="ReFusion-8B's"):
        load_tokenizer(str(tmp_path / "swapped"))
    qwen3_layout_tokenizer(BEGIN_TOKEN, MASK_TOKEN).save_pretrained(tmp_path / "right")
    assert load_tokenizer(str(tmp_path / "right")).convert_tokens_to_ids(MASK_TOKEN) == 151670


# --- Hub downloads: one step before the run, offline afterwards -------------------------------

def test_download_model_fetches_hub_ids_only(monkeypatch, tmp_path, tiny_llama_dir):
    import huggingface_hub

    from headstart.models import download_model, is_hub_id

    calls = []

    def fake_snapshot_download(repo, allow_patterns=None, ignore_patterns=None):
        calls.append((repo, tuple(allow_patterns or ()), tuple(ignore_patterns or ())))
        snapshot = tmp_path / repo.replace("/", "--")
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "model.safetensors").write_bytes(b"")
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert is_hub_id("Qwen/Qwen3-8B") and not is_hub_id("smollm2") and not is_hub_id(str(tiny_llama_dir))
    assert download_model(str(tiny_llama_dir)) is None and download_model("smollm2") is None and calls == []
    assert download_model("Qwen/Qwen3-8B").endswith("Qwen--Qwen3-8B")
    ((repo, allowed, ignored),) = calls
    assert repo == "Qwen/Qwen3-8B" and "*.safetensors" in allowed and "original/*" in ignored

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"base_model_name_or_path": "meta-llama/Llama-3.1-8B-Instruct"}')
    download_model(str(adapter))
    assert calls[-1][0] == "meta-llama/Llama-3.1-8B-Instruct"  # an adapter's base


def test_download_offline_without_a_cached_copy_says_what_to_do(monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    from headstart.models import download_model

    def missing(*args, **kwargs):
        raise huggingface_hub.errors.LocalEntryNotFoundError("not in the cache")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", missing)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match=r"python -m train.download recipe="):
        download_model("Qwen/Qwen3-8B")
