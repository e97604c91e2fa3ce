"""Shared fixtures: tiny random models built on the spot, never fetched from a hub.

The tokenizer is a byte-level BPE trained here on HumanEval prompts, so every
test request tokenizes into realistic pieces; the models are randomly
initialised Qwen3 and Llama networks small enough to decode hundreds of tokens
per second on one core (headstart.tiny_models builds both; the device check uses them too).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from headstart.tiny_models import build_tiny_model, build_tiny_tokenizer

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Tiny models run fastest on one thread, and CI's two cores are shared with subprocesses.
torch.set_num_threads(1)

@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny_tokenizer")
    build_tiny_tokenizer(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3"), "qwen3", tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_llama"), "llama", tiny_tokenizer, seed=1)


@pytest.fixture(scope="session")
def tiny_qwen3_ending_dir(tmp_path_factory, tiny_qwen3_dir, tiny_tokenizer) -> Path:
    """The tiny Qwen3 made to end its answers: its end-of-turn row of the output layer is the
    row of a token it writes often ("umber"), scaled up by 0.1%, so greedy decoding ends where
    it would have written that token. Some answers end within a few tokens, others run to
    any small cap: both kinds of self-distilled answer occur."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32)
    often = tiny_tokenizer.convert_tokens_to_ids("umber")
    assert often is not None and often != tiny_tokenizer.unk_token_id
    with torch.no_grad():
        model.lm_head.weight[tiny_tokenizer.eos_token_id] = model.lm_head.weight[often] * 1.001
    directory = tmp_path_factory.mktemp("tiny_qwen3_ending")
    model.save_pretrained(directory)
    tiny_tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session", params=["qwen3", "llama"])
def tiny_model_dir(request, tiny_qwen3_dir, tiny_llama_dir) -> Path:
    """Each tiny family in turn."""
    return tiny_qwen3_dir if request.param == "qwen3" else tiny_llama_dir


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real public data vendored in the repository (`data/`, see data/README.md).
    It is part of every checkout: a missing file is a failure, never a skip."""
    from headstart.benchmark_registry import DATA_DIR

    assert DATA_DIR.is_dir(), f"the vendored data folder is missing: {DATA_DIR}"
    return DATA_DIR


@pytest.fixture(scope="session")
def tiny_refusion_dir(tmp_path_factory, tiny_qwen3_dir) -> Path:
    """The tiny Qwen3 with ReFusion's begin and mask tokens added (seeded: the new
    embeddings are drawn at random around the old ones)."""
    from headstart.models import load_model
    from headstart.refusion import add_refusion_tokens

    loaded = load_model(str(tiny_qwen3_dir), device="cpu")
    torch.manual_seed(0)
    add_refusion_tokens(loaded.model, loaded.tokenizer)
    directory = tmp_path_factory.mktemp("tiny_refusion")
    loaded.model.save_pretrained(directory)
    loaded.tokenizer.save_pretrained(directory)
    return directory
