"""Chat formatting per model family, and the incomplete-request system message.

Training and evaluation both format requests here, so an adapted model is
evaluated with exactly the prompt it was trained on.
"""

from __future__ import annotations

from typing import Literal

from transformers import PreTrainedTokenizerBase

Family = Literal["qwen3", "llama3", "gemma3", "chatml"]

INCOMPLETE_REQUEST_SYSTEM = (
    "The user may still be typing: the request below can be incomplete and may stop "
    "mid-sentence. Answer the request it will most likely become once complete, "
    "and keep the answer you would give to the finished request."
)

# SmolLM2-style ChatML, for tokenizers that ship without a chat template.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def detect_family(tokenizer: PreTrainedTokenizerBase) -> Family:
    """Recognise the chat format from the tokenizer's template markers."""
    template = tokenizer.chat_template or ""
    if isinstance(template, dict):
        template = template.get("default", "")
    if "<|start_header_id|>" in template:
        return "llama3"
    if "<start_of_turn>" in template:
        return "gemma3"
    if "<|im_start|>" in template and ("enable_thinking" in template or "<think>" in template):
        return "qwen3"
    return "chatml"


def build_messages(
    request: str,
    history: list[dict[str, str]] | None = None,
    system: str | None = None,
) -> list[dict[str, str]]:
    """The dialogue for one request: optional system message, earlier turns, the request."""
    messages = [{"role": "system", "content": system}] if system else []
    return messages + list(history or []) + [{"role": "user", "content": request}]


def render_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, str]],
    family: Family | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The templated text the model sees, ending where the assistant answer begins."""
    family = family or detect_family(tokenizer)
    if family == "gemma3":
        messages = _fold_system_into_first_user_turn(messages)
    extra = {"enable_thinking": False} if family == "qwen3" else {}
    template = tokenizer.chat_template or CHATML_TEMPLATE
    return tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        chat_template=template,
        **extra,
    )


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, str]],
    family: Family | None = None,
) -> list[int]:
    """Token ids of the rendered prompt; the template already holds any BOS token."""
    text = render_prompt(tokenizer, messages, family)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _fold_system_into_first_user_turn(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Gemma-3 has no system role: its instructions open the first user turn."""
    if not messages or messages[0]["role"] != "system":
        return messages
    system, rest = messages[0]["content"], [dict(m) for m in messages[1:]]
    for message in rest:
        if message["role"] == "user":
            message["content"] = f"{system}\n\n{message['content']}"
            break
    return rest
