"""`python -m eval.serve model=smollm2`: streaming generation served on vLLM, OpenAI-compatible.

One vLLM engine (the vLLM environment, eval.serving.engine_worker) decodes every answer greedily;
its speculative proposer verifies drafts made while the request was typed (typing sessions,
eval.serving.sessions) or passed as OpenAI's `prediction`. The HTTP API is in eval.serving.api;
the live page (eval/serving/page.py) is served beside it at `/`.

Adapters are merged into the base weights once, then served as a plain model (cached under
~/.cache/headstart/merged): a merged model runs at the base model's speed, while vLLM's LoRA
adds its LoRA kernels to every step and every verification, and the served answers are those of
the trained model either way (PEFT's merge, in float32).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eval.engines.decode import DecodeSpec
from headstart.config import run_cli
from headstart.prompts import check_evaluation_system_setting
from headstart.run_config import AdapterSetting, ModelOnDevice, SystemPromptSetting
from headstart.vllm_settings import VLLMSettings

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from eval.serving.api import Served
    from eval.serving.engine import ServingEngine


@dataclass
class ServeConfig(SystemPromptSetting, AdapterSetting, ModelOnDevice):
    """Serve a model with streaming generation: OpenAI chat completions and typing sessions on vLLM. `model` may be
    a merged dir or an adapter dir (merged before serving)."""

    drafts: bool = field(default=True, metadata={"help": "Verify drafts as speculative proposals (false: plain vLLM, "
                                                          "the reference the drafts' answers must equal)."})
    speculative_tokens: int = field(default=8, metadata={"help": "Most draft tokens verified per engine step (vLLM's "
                                                                 "num_speculative_tokens)."})
    max_drafting: int = field(default=4, metadata={"help": "Drafts decoded at once, while no answer is in flight."})
    answers_first: bool = field(default=True, metadata={"help": "Draft only while no answer is in flight, pausing drafts "
                                                                "when one arrives (false: drafts run beside answers)."})
    session_ttl: float = field(default=300.0, metadata={"help": "Seconds after its last text that an unsubmitted "
                                                                "session expires."})
    decode: DecodeSpec = field(default_factory=DecodeSpec, metadata={
        "help": "The lookup policy (decode.lookup_*, chains only) and decode.max_new_tokens, the default max_tokens."})
    max_model_len: int = field(default=4096, metadata={"help": "Longest prompt + answer a request may take."})
    host: str = field(default="127.0.0.1", metadata={"help": "Address to listen on."})
    port: int = field(default=8000, metadata={"help": "Port to listen on."})
    vllm: VLLMSettings = field(default_factory=VLLMSettings, metadata={"help": "The vLLM engine's settings."})

    def __post_init__(self) -> None:
        self.decode.chain_lookup()
        if self.speculative_tokens < 1 or self.max_drafting < 1 or self.session_ttl <= 0:
            raise ValueError("speculative_tokens and max_drafting must be >= 1 and session_ttl > 0")
        if self.max_model_len <= self.decode.max_new_tokens:
            raise ValueError(f"max_model_len={self.max_model_len} leaves no room for a prompt beside "
                             f"decode.max_new_tokens={self.decode.max_new_tokens}")
        self.system_prompt = check_evaluation_system_setting(self.system_prompt)
        super().__post_init__()  # dtype, device
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port={self.port}: a TCP port is 1-65535")


def served_model_dir(model: str, adapter: str | None) -> str:
    """The directory vLLM loads: `model` resolved (a GGUF converted once), or base + adapter merged
    once into the cache (keyed by the weights' fingerprint).

    Args:
        model (str): a model's name, directory or .gguf file, or an adapter directory (then served merged into its base).
        adapter (str | None): a LoRA adapter directory to merge into `model`; None: none.
    """
    from headstart.model_files import adapter_base
    from headstart.models import cache_dir, resolve_model_dir, weights_fingerprint

    if adapter_base(model):
        model, adapter = adapter_base(model), model
    if not adapter:
        return resolve_model_dir(model)
    target = cache_dir() / "merged" / weights_fingerprint(model, adapter).removeprefix("sha256:")[:20]
    if not (target / "config.json").is_file():
        from train.merge import merge_adapter

        print(f"eval.serve: merging {adapter} into {target}")
        staging = target.with_name(target.name + ".partial")
        merge_adapter(adapter, staging)
        staging.replace(target)
    return str(target)


@dataclass
class Server:
    """The running parts: the engine, what the routes serve, and the app."""

    engine: ServingEngine
    served: Served
    app: Starlette


def start_server(config: ServeConfig) -> Server:
    """Load the tokenizer, start the engine, build the app (the live page included).

    Args:
        config (ServeConfig): the server's settings.
    """
    from transformers import GenerationConfig

    from eval.serving.api import Served, build_app
    from eval.serving.engine import ServingEngine, serving_engine_args
    from eval.serving.page import live_routes
    from eval.serving.sessions import Sessions
    from headstart.devices import resolve_device
    from headstart.model_files import check_local_source, is_adapter_dir
    from headstart.models import end_token_ids, load_tokenizer
    from headstart.prompts import build_messages, chat_template, detect_family, encode_prompt, resolve_system_message
    from headstart.vllm_client import vllm_dtype

    device = resolve_device(config.device)
    check_local_source(config.model)  # no weights, a truncated file: refused before the engine starts
    if config.adapter:
        check_local_source(config.adapter)
        if not is_adapter_dir(config.adapter):
            raise FileNotFoundError(f"adapter={config.adapter}: not a LoRA adapter directory (no adapter_config.json)")
    source = config.adapter or config.model
    system = resolve_system_message(config.system_prompt, source)
    model_dir = served_model_dir(config.model, config.adapter)
    tokenizer = load_tokenizer(model_dir if Path(model_dir, "tokenizer_config.json").is_file() else config.model)
    chat_template(tokenizer, source)  # a base model is refused before the engine starts, not on every request
    family = detect_family(tokenizer)
    try:
        eos = end_token_ids(tokenizer, GenerationConfig.from_pretrained(model_dir))
    except OSError:  # no generation_config.json
        eos = end_token_ids(tokenizer)
    speculative = config.speculative_tokens if config.drafts else 0
    llm = serving_engine_args(model_dir, config.vllm, vllm_dtype(config.dtype, device), config.max_model_len, speculative,
                              device)
    engine = ServingEngine(llm, config.vllm, config.decode.chain_lookup() if config.drafts else None, eos, device)

    def encode(messages: list[dict[str, str]]) -> list[int]:
        if system and messages[0]["role"] != "system":
            messages = build_messages(messages[-1]["content"], messages[:-1], system)
        return encode_prompt(tokenizer, messages, family)

    sessions = Sessions(engine, encode, config.max_drafting, config.session_ttl, config.drafts, config.answers_first)
    served = Served(
        model_name=config.model, sessions=sessions,
        encode=encode, encode_answer=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        # No clean-up of spaces: a streamed answer's text then only grows token by token, and equals the whole one.
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False),
        max_tokens=config.decode.max_new_tokens,
        max_model_len=config.max_model_len, speculating=config.drafts, decode_spec=config.decode,
    )
    return Server(engine, served, build_app(served, live_routes(served)))


def serve(config: ServeConfig) -> None:
    """Check the address, start the server and serve until stopped; the engine is closed at the end.

    Args:
        config (ServeConfig): the server's settings.
    """
    import uvicorn

    from eval.serving.page import check_listenable

    check_listenable(config.host, config.port)
    server = start_server(config)
    print(f"eval.serve: http://{config.host}:{config.port}/v1 (OpenAI chat completions), the live page at "
          f"http://{config.host}:{config.port}/", flush=True)
    try:
        uvicorn.run(server.app, host=config.host, port=config.port, log_level="warning", ws_ping_interval=20.0,
                    ws_ping_timeout=None)
    finally:
        server.engine.close()


def main(argv: list[str] | None = None) -> int:
    """The command line's entry point; returns the exit code.

    Args:
        argv (list[str] | None): `model=NAME` and `key=value` overrides; None: `sys.argv[1:]`.
    """
    return run_cli(ServeConfig, serve, argv)


if __name__ == "__main__":
    sys.exit(main())
