"""The two tokens a slot-diffusion model (ReFusion) adds to its base vocabulary.

ReFusion-8B is a Qwen3 network whose tokenizer carries a begin token and a mask
token; any other causal LM (the embedded SmolLM2) becomes one by adding them and
resizing its embeddings. Training and evaluation both ask this module for the ids.
"""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

BEGIN_TOKEN = "<|beginoftext|>"
MASK_TOKEN = "<|mask|>"


def mask_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """Id of the mask token; a clear error when the tokenizer lacks it."""
    token_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ValueError(
            f"the tokenizer has no {MASK_TOKEN} token: load a ReFusion model, or a model adapted "
            "with `objective: refusion` (train/sft.py adds the token)"
        )
    return token_id


def add_refusion_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Add the begin and mask tokens where missing and resize the embeddings;
    returns the ids of the tokens that were added (empty for a ReFusion model)."""
    missing = [t for t in (BEGIN_TOKEN, MASK_TOKEN) if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    return [tokenizer.convert_tokens_to_ids(t) for t in missing]
