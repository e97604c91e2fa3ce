"""The two tokens a slot-diffusion model (ReFusion) adds to its base vocabulary.

ReFusion-8B is a Qwen3 network whose tokenizer carries a begin token and a mask
token; any other causal LM (the embedded SmolLM2) becomes one by adding them and
resizing its embeddings. Training and evaluation both ask this module for the ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: headstart.prompts (a config's check) imports this module
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

BEGIN_TOKEN = "<|beginoftext|>"
MASK_TOKEN = "<|mask|>"
REFUSION_REPO = "GSAI-ML/ReFusion"
# The ids ReFusion-8B was trained and is decoded with (ML-GSAI/ReFusion: train.py sets
# config.bos_token_id = 151669 and config.mask_token_id = 151670 after adding the two
# tokens to Qwen3's tokenizer; generate.py and eval.py decode with mask_id=151670).
REFUSION_TOKEN_IDS = {BEGIN_TOKEN: 151669, MASK_TOKEN: 151670}
# Qwen3's vocabulary, which ReFusion-8B extends: its end-of-turn and its last special token.
QWEN3_VOCABULARY = {"<|im_end|>": 151645, "</think>": 151668}


def token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int | None:
    """The id of `token`, None when the tokenizer does not have it (cheap: no vocabulary copy).

    Args:
        tokenizer (PreTrainedTokenizerBase): the tokenizer asked.
        token (str): the token's text, e.g. `MASK_TOKEN`.
    """
    found = tokenizer.convert_tokens_to_ids(token)
    if found is None or (found == tokenizer.unk_token_id and token != tokenizer.unk_token):
        return None
    return found


def is_qwen3_vocabulary(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer has Qwen3's vocabulary (the one ReFusion-8B extends): its end-of-turn
    and last special token at Qwen3's ids.

    Args:
        tokenizer (PreTrainedTokenizerBase): the tokenizer checked.
    """
    return all(token_id(tokenizer, token) == expected for token, expected in QWEN3_VOCABULARY.items())


def check_refusion_token_ids(tokenizer: PreTrainedTokenizerBase, source: str | None = None) -> None:
    """On Qwen3's vocabulary (ReFusion-8B's own tokenizer, an adapter of it, or a Qwen3 base
    given the tokens), the begin and mask tokens must sit at ReFusion's ids: a model reading
    other ids would see other embedding rows than the ones it was trained with. The
    ReFusion repository's tokenizer must carry both. Other vocabularies (a small model
    given the tokens) have ids of their own and are not checked.

    Args:
        tokenizer (PreTrainedTokenizerBase): the tokenizer checked.
        source (str | None): the model's hub id or path, named in the errors; one ending in
            ReFusion's repository must carry both tokens. None: not named, that check skipped.
    """
    ids = {token: token_id(tokenizer, token) for token in REFUSION_TOKEN_IDS}
    if source and source.rstrip("/").lower().endswith(REFUSION_REPO.lower()) and None in ids.values():
        raise ValueError(f"{source}: the tokenizer lacks {', '.join(t for t, i in ids.items() if i is None)}; "
                         "ReFusion's tokenizer carries both; the download may be incomplete or another model")
    if not is_qwen3_vocabulary(tokenizer) or all(i is None for i in ids.values()):
        return
    if ids != REFUSION_TOKEN_IDS:
        raise ValueError(
            f"the tokenizer{f' of {source}' if source else ''} has Qwen3's vocabulary but its ReFusion tokens are at "
            f"{ids}, not ReFusion-8B's {REFUSION_TOKEN_IDS} (ML-GSAI/ReFusion train.py, generate.py): the model "
            "would read other embedding rows than it was trained with"
        )


def mask_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """Id of the mask token; a clear error when the tokenizer lacks it, or (Qwen3's
    vocabulary) holds it at another id than ReFusion-8B's.

    Args:
        tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
    """
    found = token_id(tokenizer, MASK_TOKEN)
    if found is None:
        raise ValueError(
            f"the tokenizer has no {MASK_TOKEN} token: load a ReFusion model, or a model adapted "
            "with `objective: refusion` (train/sft.py adds the token)"
        )
    check_refusion_token_ids(tokenizer)
    return found


def add_refusion_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Add the begin and mask tokens where missing and resize the embeddings;
    returns the ids of the tokens that were added (empty for a ReFusion model).

    Args:
        model (PreTrainedModel): the causal LM whose embeddings grow to the tokenizer's length.
        tokenizer (PreTrainedTokenizerBase): its tokenizer, given the tokens in place.
    """
    missing = [t for t in (BEGIN_TOKEN, MASK_TOKEN) if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    check_refusion_token_ids(tokenizer)  # a Qwen3 base gets ReFusion's ids, as upstream's train.py gives them
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    return [tokenizer.convert_tokens_to_ids(t) for t in missing]
