"""Chat formatting per model family, and the system message: its one vocabulary and resolver.

Training and evaluation both format requests here, so an adapted model is
evaluated with exactly the prompt it was trained on: the same chat rendering
(`render_prompt`), and the same system message, which training records in the
adapter and merged directories (`headstart.json`) and evaluation reads back
(`resolve_system_message(..., "model")`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from headstart.completion import TRANSCRIPT, CompletionFrame, render_completion
from headstart.refusion import MASK_TOKEN, token_id

if TYPE_CHECKING:  # annotations only: configs check their system-prompt setting here, `--help` stays light
    from transformers import PreTrainedTokenizerBase

Family = Literal["qwen3", "refusion", "llama3", "gemma3", "chatml", "completion"]

# The `prompt_format` setting: how requests become prompts.
PROMPT_FORMATS = {
    "auto": "the model's own: completion for an embedded base model (headstart.models.EMBEDDED_MODELS), else chat",
    "chat": "the tokenizer's chat template (ChatML when its vocabulary has ChatML's tokens and it ships none)",
    "completion": "a base model's: the request's text in its benchmark's frame, the answer its continuation "
                  "(headstart.completion)",
}

INCOMPLETE_REQUEST_SYSTEM = (
    "The user may still be typing: the request below can be incomplete and may stop "
    "mid-sentence. Answer the request it will most likely become once complete, "
    "and keep the answer you would give to the finished request."
)

# The system message settings: one vocabulary for training (`data.system_message`) and
# evaluation (`system_prompt`). Anything else with a space in it is the literal text.
SYSTEM_SETTINGS = {
    "incomplete": "headstart's incomplete-request message (INCOMPLETE_REQUEST_SYSTEM)",
    "model": "the message the model was trained with, as its directory records it (headstart.json); "
             "none for a model that records none",
    "none": "no system turn: the chat template's own default",
    "dataset": "training only: keep each row's own system turn",
}
# Earlier spellings, read as the setting they name (runs saved with them stay resumable).
SYSTEM_ALIASES = {"incomplete_request": "incomplete"}
# What train/sft.py writes beside an adapter and a merged model: how it was trained.
TRAINING_RECORD = "headstart.json"


def canonical_system_setting(setting: str) -> str:
    """The setting in its canonical spelling; literal text as it is. A single word that is
    not a setting is an error (a typo must not become the system message).

    Args:
        setting (str): the system setting as written: a setting's name (any case) or literal text.
    """
    if not isinstance(setting, str) or not setting.strip():
        raise ValueError(f"system message setting must be non-empty text, got {setting!r}")
    setting = SYSTEM_ALIASES.get(setting, setting)
    if setting not in SYSTEM_SETTINGS and re.fullmatch(r"[A-Za-z0-9_.:-]+", setting):
        raise ValueError(
            f"unknown system message setting {setting!r}; use one of "
            + "; ".join(f"{name} ({what})" for name, what in SYSTEM_SETTINGS.items())
            + "; or literal text (with a space in it)"
        )
    return setting


def check_evaluation_system_setting(setting: str) -> str:
    """`canonical_system_setting` for a run that builds its own prompts (evaluation, the live
    page): `dataset` names training rows' own turns and is refused. Config validation calls
    it, so a typo is refused before any model loads.

    Args:
        setting (str): the system setting as written.
    """
    setting = canonical_system_setting(setting)
    if setting == "dataset":
        raise ValueError("system message 'dataset' (each row's own) applies to training data only; "
                         "evaluate with model, incomplete, none or literal text")
    return setting


def read_training_record(source: str | Path | None) -> dict[str, Any] | None:
    """The training record of a model or adapter directory (None: not a directory, or none recorded).

    Args:
        source (str | Path | None): a model or adapter directory, or any other model source (None: none).
    """
    if source is None:
        return None
    path = Path(str(source)).expanduser() / TRAINING_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot be read ({error})") from error
    if not isinstance(record, dict):
        raise ValueError(f"{path}: not a JSON object")
    return record


def write_training_record(directory: str | Path, record: dict[str, Any]) -> Path:
    """Write `record` as the training record of `directory` (created if need be); returns the file written.

    Args:
        directory (str | Path): the model or adapter directory.
        record (dict[str, Any]): what training records of its run (the system message among it).
    """
    path = Path(directory) / TRAINING_RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def resolve_system_message(setting: str, model_source: str | Path | None = None) -> str | None:
    """The system message text for `setting`, None for no system turn. `model` reads what
    `model_source` (an adapter or merged directory) was trained with. `dataset` keeps each
    training row's own turn: the caller handles it (train/tokenization.py), it has no text here.

    Args:
        setting (str): the system setting (a setting's name or literal text).
        model_source (str | Path | None): the model source whose training record the `model` setting reads, or None.
    """
    setting = canonical_system_setting(setting)
    if setting == "incomplete":
        return INCOMPLETE_REQUEST_SYSTEM
    if setting == "none":
        return None
    if setting == "dataset":
        check_evaluation_system_setting(setting)
    if setting == "model":
        record = read_training_record(model_source)
        if record is None:
            return None
        if record.get("system_message_varies"):
            raise ValueError(
                f"{model_source} was trained on rows with different system messages (data.system_message=dataset); "
                "say which to evaluate with: system_prompt=incomplete, none or literal text"
            )
        return record.get("system_message")
    return setting


# SmolLM2-style ChatML, for tokenizers that ship without a chat template but with ChatML's tokens.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# The markers of the chat formats detect_family recognises. Written out as text in an answer, they
# show a format the model does not know (eval/evaluation/degenerate.py flags them).
CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")
CHAT_MARKERS = (*CHATML_MARKERS, "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<start_of_turn>",
                "<end_of_turn>")


def chat_template(tokenizer: PreTrainedTokenizerBase, source: str | None = None) -> str:
    """The template prompts are rendered with: the tokenizer's own, else ChatML when its vocabulary holds
    ChatML's markers as tokens. A tokenizer with neither is a base model's: refused, since wrapping its
    request in a format it never saw makes its answers degenerate without a word.

    Args:
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        source (str | None): the model as the user named it, for the error; None: the tokenizer's path.
    """
    if tokenizer.chat_template:
        return tokenizer.get_chat_template()  # a tokenizer with several named templates: its default
    vocabulary = tokenizer.get_vocab()
    if all(marker in vocabulary for marker in CHATML_MARKERS):
        return CHATML_TEMPLATE
    raise ValueError(
        f"{source or tokenizer.name_or_path or 'the tokenizer'}: no chat template, and no ChatML tokens to fall back on "
        f"({', '.join(CHATML_MARKERS)}): a base model, which headstart cannot prompt as a chat model. Use an "
        "instruction-tuned checkpoint, or give the tokenizer a template (tokenizer_config.json's chat_template)"
    )


def check_prompt_format(prompt_format: str) -> str:
    """`prompt_format` when it is one of PROMPT_FORMATS, else a ValueError naming them.

    Args:
        prompt_format (str): the setting as written.
    """
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"unknown prompt_format {prompt_format!r}; use one of "
                         + "; ".join(f"{name} ({what})" for name, what in PROMPT_FORMATS.items()))
    return prompt_format


def prompt_family(tokenizer: PreTrainedTokenizerBase, prompt_format: str, source: str | None = None) -> Family:
    """The format prompts are rendered in: "completion", or the chat family of the tokenizer's template
    (a tokenizer with none is refused by `chat_template`, never wrapped silently). `auto` must be
    resolved first (headstart.models.resolve_prompt_format).

    Args:
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        prompt_format (str): "chat" or "completion".
        source (str | None): the model as the user named it, for the error.
    """
    if check_prompt_format(prompt_format) == "completion":
        return "completion"
    if prompt_format != "chat":
        raise ValueError(f"prompt_format {prompt_format!r} is resolved before prompts are rendered")
    try:
        chat_template(tokenizer, source)
    except ValueError as error:
        raise ValueError(f"{error}; or prompt it as a base model: prompt_format=completion") from error
    return detect_family(tokenizer)


def detect_family(tokenizer: PreTrainedTokenizerBase) -> Family:
    """Recognise the chat format from the tokenizer's template markers.

    Args:
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
    """
    template = tokenizer.chat_template or ""
    if isinstance(template, dict):
        template = template.get("default", "")
    if "<|start_header_id|>" in template:
        return "llama3"
    if "<start_of_turn>" in template:
        return "gemma3"
    if "<|im_start|>" in template and ("enable_thinking" in template or "<think>" in template):
        # ReFusion-8B is a Qwen3 network with a mask token, and renders its prompts its own way.
        return "refusion" if token_id(tokenizer, MASK_TOKEN) is not None else "qwen3"
    return "chatml"


def build_messages(
    request: str,
    history: list[dict[str, str]] | None = None,
    system: str | None = None,
) -> list[dict[str, str]]:
    """The dialogue for one request: optional system message, earlier turns, the request.

    Args:
        request (str): the user's request.
        history (list[dict[str, str]] | None): earlier turns as {"role", "content"} dicts, or None.
        system (str | None): the system message, or None for no system turn.
    """
    messages = [{"role": "system", "content": system}] if system else []
    return messages + list(history or []) + [{"role": "user", "content": request}]


def render_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, str]],
    family: Family | None = None,
    add_generation_prompt: bool = True,
    frame: CompletionFrame = TRANSCRIPT,
) -> str:
    """The templated text the model sees, ending where the assistant answer begins.
    Qwen3 renders with thinking off (an empty think block opens the answer). ReFusion
    renders as upstream trains and evaluates it (ML-GSAI/ReFusion: train.py applies the
    template's default, generate.py and eval.py pass enable_thinking=True): no think
    block, the answer starts right after `<|im_start|>assistant\n`.

    Args:
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        messages (list[dict[str, str]]): the dialogue (`build_messages`).
        family (Family | None): the chat format; None: `detect_family(tokenizer)`.
        add_generation_prompt (bool): end with the assistant turn's opening, where the answer begins.
        frame (CompletionFrame): the completion format's frame of the request (family "completion" only).
    """
    family = family or detect_family(tokenizer)
    if family == "completion":
        return render_completion(messages, frame, tokenizer.bos_token)
    if family == "gemma3":
        messages = _fold_system_into_first_user_turn(messages)
    extra = {"enable_thinking": False} if family == "qwen3" else {"enable_thinking": True} if family == "refusion" else {}
    return tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        chat_template=chat_template(tokenizer),
        **extra,
    )


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, str]],
    family: Family | None = None,
    frame: CompletionFrame = TRANSCRIPT,
) -> list[int]:
    """Token ids of the rendered prompt; the template (or the completion format) already holds any BOS token.

    Args:
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
        messages (list[dict[str, str]]): the dialogue (`build_messages`).
        family (Family | None): the chat format; None: `detect_family(tokenizer)`.
        frame (CompletionFrame): the completion format's frame of the request (family "completion" only).
    """
    text = render_prompt(tokenizer, messages, family, frame=frame)
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
