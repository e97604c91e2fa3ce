"""The paper's models, checked without their weights.

Qwen3-8B, Llama-3.1-8B-Instruct, Gemma-3-12B-IT and ReFusion-8B cannot be downloaded here.
Their configs are vendored in headstart/recipes/models/ (see its README); each is built on the meta
device (shapes, no memory) with the adapter exactly as train/sft.py builds it, and checked
for what a GPU run depends on: the LoRA targets exist, only the language model of Gemma-3 is
adapted, the trainable parameters are the hand-computed count, ReFusion's token rows train as
train/sft.py makes them. The memory estimate (train/memory.py) is checked against a hand
computation, against what the meta-built model holds, and against what autograd saves and
PyTorch allocates in tiny real models (bf16 on CPU).

No tokenizer of these models can be had offline (they are on the hub only), so the chat
templates' answer boundaries are not checked here; the stand-in tokenizers below only lay out
Qwen3's ids to exercise ReFusion's token rows.
"""

from __future__ import annotations

import weakref

import pytest
import torch
import transformers
from peft import get_peft_model
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from headstart.refusion import (
    BEGIN_TOKEN,
    MASK_TOKEN,
    QWEN3_VOCABULARY,
    REFUSION_TOKEN_IDS,
)
from train import memory, memory_formulas
from train.memory_formulas import Adapter, Architecture, Kernels
from train.model import lora_config
from train.sft import parse_recipe

PAPER_MODELS = {
    "qwen3_prefix": "Qwen/Qwen3-8B",
    "llama31_prefix": "meta-llama/Llama-3.1-8B-Instruct",
    "gemma3_prefix": "google/gemma-3-12b-it",
    "qwen3_distill": "Qwen/Qwen3-8B",
    "refusion_prefix_to_answer": "GSAI-ML/ReFusion",
    "refusion_draft_refinement": "GSAI-ML/ReFusion",
}
# Published figures (model cards, config.json; sources in headstart/recipes/models/README.md):
# layers, hidden, intermediate, heads, kv_heads, head_dim, vocab.
DIMENSIONS = ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab")
PUBLISHED = {
    "Qwen/Qwen3-8B": (36, 4096, 12288, 32, 8, 128, 151936),
    "meta-llama/Llama-3.1-8B-Instruct": (32, 4096, 14336, 32, 8, 128, 128256),
    "google/gemma-3-12b-it": (48, 3840, 15360, 16, 8, 256, 262208),
    "GSAI-ML/ReFusion": (36, 4096, 12288, 32, 8, 128, 151671),
}
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def build_on_meta(config, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """The class TRL's loader picks (config.architectures[0]), built on the meta device."""
    architecture = getattr(transformers, config.architectures[0])
    with torch.device("meta"):
        return architecture._from_config(config, dtype=dtype)


def recipe_model(name: str):
    """The recipe, its vendored config and its model on meta with the recipe's LoRA (as TRL
    applies it under DDP: get_peft_model with PEFT's defaults)."""
    recipe, _ = parse_recipe([f"recipe={name}"])
    config = memory.vendored_config(recipe.model.name_or_path)
    return recipe, config, get_peft_model(build_on_meta(config), lora_config(recipe))


# --- The vendored configs ----------------------------------------------------------------


def test_every_paper_recipe_has_a_vendored_config():
    for name, hub_id in PAPER_MODELS.items():
        recipe, _ = parse_recipe([f"recipe={name}"])
        assert recipe.model.name_or_path == hub_id, name
        assert (memory.MODELS_DIR / hub_id / "config.json").is_file()


@pytest.mark.parametrize("hub_id", sorted(PUBLISHED))
def test_vendored_config_builds_with_the_published_dimensions(hub_id):
    config = memory.vendored_config(hub_id)
    arch = Architecture.from_config(config)
    assert tuple(getattr(arch, k) for k in DIMENSIONS) == PUBLISHED[hub_id]
    model = build_on_meta(config)
    assert type(model).__name__ == config.architectures[0]
    # The parameter count summed from the dimensions is the one transformers builds.
    assert sum(p.numel() for p in model.parameters()) == arch.total_params()


def test_published_parameter_counts():
    # Meta's model card: 8.03B; Qwen's: 8.2B; Google's: 12B (12.2B with the vision tower).
    assert Architecture.from_config(memory.vendored_config("meta-llama/Llama-3.1-8B-Instruct")).total_params() \
        == 8_030_261_248
    assert round(Architecture.from_config(memory.vendored_config("Qwen/Qwen3-8B")).total_params() / 1e9, 1) == 8.2
    assert round(Architecture.from_config(memory.vendored_config("google/gemma-3-12b-it")).total_params() / 1e9, 1) \
        == 12.2


def test_gemma3_alternates_five_sliding_layers_with_one_global():
    text = memory.vendored_config("google/gemma-3-12b-it").get_text_config()
    assert text.sliding_window == 1024
    assert text.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 8


def test_refusion_config_holds_its_tokens_at_the_ids_headstart_uses():
    config = memory.vendored_config("GSAI-ML/ReFusion")
    assert config.mask_token_id == REFUSION_TOKEN_IDS[MASK_TOKEN]
    assert config.bos_token_id == REFUSION_TOKEN_IDS[BEGIN_TOKEN]
    # Qwen3's tokenizer (151,669 tokens) plus the two: upstream resizes the embeddings to it.
    assert config.vocab_size == QWEN3_VOCABULARY["</think>"] + 1 + 2


# --- LoRA as train/sft.py builds it --------------------------------------------------------


def hand_lora_params(text, rank: int, projections=ATTENTION) -> int:
    """r x (in + out) per adapted linear, summed, from the config's dimensions."""
    h, q, kv = text.hidden_size, text.num_attention_heads * text.head_dim, text.num_key_value_heads * text.head_dim
    dims = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    return text.num_hidden_layers * sum(rank * (dims[p][0] + dims[p][1]) for p in projections)


@pytest.mark.parametrize("name", sorted(PAPER_MODELS))
def test_lora_wraps_every_attention_projection_of_every_layer(name):
    recipe, config, model = recipe_model(name)
    text = config.get_text_config()
    wrapped = {n.removeprefix("base_model.model.") for n, m in model.named_modules() if hasattr(m, "lora_A")}
    decoder = "model.language_model" if text is not config else "model"
    expected = {f"{decoder}.layers.{i}.self_attn.{p}" for i in range(text.num_hidden_layers) for p in ATTENTION}
    assert wrapped == expected
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == hand_lora_params(text, recipe.lora.r)


def test_qwen3_8b_trainable_count_by_hand():
    _, _, model = recipe_model("qwen3_prefix")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == 36 * 8 * ((4096 + 4096) + (4096 + 1024) + (4096 + 1024) + (4096 + 4096)) == 7_667_712


def test_gemma3_adapts_the_language_model_only():
    _, _, model = recipe_model("gemma3_prefix")
    wrapped = [n for n, m in model.named_modules() if hasattr(m, "lora_A")]
    assert wrapped and all(".language_model." in n for n in wrapped)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert not [n for n in trainable if "vision_tower" in n or "multi_modal_projector" in n]
    # The vision tower has q/k/v projections of its own: the recipe's regex is what keeps them out.
    assert [n for n, _ in model.named_modules() if "vision_tower" in n and n.endswith("self_attn.q_proj")]
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == \
        48 * 8 * ((3840 + 4096) + 2 * (3840 + 2048) + (4096 + 3840))


# --- ReFusion's token rows -------------------------------------------------------------------


def qwen3_layout_tokenizer(extra: tuple[str, ...] = ()):
    """A stand-in with Qwen3's vocabulary layout: 151,643 ordinary tokens, then its special
    tokens up to </think> at 151,668 (and `extra` after them), so ids land where Qwen3's do."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    specials = {QWEN3_VOCABULARY["<|im_end|>"]: "<|im_end|>", QWEN3_VOCABULARY["</think>"]: "</think>"}
    size = QWEN3_VOCABULARY["</think>"] + 1
    vocab = {specials.get(i, f"t{i}"): i for i in range(size)}
    vocab.update({token: size + k for k, token in enumerate(extra)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", pad_token="t0", eos_token="<|im_end|>")


def test_refusion_8b_trains_lora_alone():
    """ReFusion-8B's tokenizer already has both tokens: nothing is added, as upstream trains it."""
    from train.refusion_objective import add_trainable_tokens

    recipe, _ = parse_recipe(["recipe=refusion_prefix_to_answer"])
    config = memory.vendored_config(recipe.model.name_or_path)
    model, peft_config = build_on_meta(config), lora_config(recipe)
    tokenizer = qwen3_layout_tokenizer((BEGIN_TOKEN, MASK_TOKEN))
    assert add_trainable_tokens(model, tokenizer, peft_config) == []
    assert model.get_input_embeddings().num_embeddings == config.vocab_size == len(tokenizer)
    peft_model = get_peft_model(model, peft_config)
    assert sum(p.numel() for p in peft_model.parameters() if p.requires_grad) == hand_lora_params(config, 8)


def test_qwen3_base_with_the_refusion_objective_trains_the_two_token_rows():
    """A Qwen3-8B base gets the tokens at ReFusion's ids, inside its 151,936 rows (no
    resize), and their input and output rows train beside LoRA (untied embeddings)."""
    from train.refusion_objective import add_trainable_tokens

    recipe, _ = parse_recipe(["recipe=refusion_prefix_to_answer", "model.name_or_path=Qwen/Qwen3-8B"])
    config = memory.vendored_config(recipe.model.name_or_path)
    model, peft_config = build_on_meta(config), lora_config(recipe)
    added = add_trainable_tokens(model, qwen3_layout_tokenizer(), peft_config)
    assert added == [REFUSION_TOKEN_IDS[BEGIN_TOKEN], REFUSION_TOKEN_IDS[MASK_TOKEN]]
    assert model.get_input_embeddings().num_embeddings == 151936
    assert peft_config.trainable_token_indices == {"embed_tokens": added, "lm_head": added}
    peft_model = get_peft_model(model, peft_config)
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert trainable == hand_lora_params(config, 8) + 2 * len(added) * config.hidden_size


# --- The memory estimate -------------------------------------------------------------------

TINY = Architecture(layers=3, hidden=64, intermediate=176, heads=4, kv_heads=2, head_dim=24, vocab=384, qk_norm=True)


def test_estimate_of_a_tiny_config_by_hand():
    adapter = Adapter(rank=8, dropout=0.05, projections=ATTENTION)
    # One layer, per token of 10-token sequences: 2 norms (4h + 4), q/k norms, attention with a mask
    # (q, k and v repeated to 4 heads, output, log-sum-exp, the bf16 mask row), MLP (3 x 2I), and per
    # adapted projection a 1-byte mask and a 2-byte input per input feature, plus 2r.
    norms = 2 * (4 * 64 + 4)
    qk = 4 * 96 + 4 * 4 + 4 * 48 + 4 * 2
    attention = 2 * 96 + 2 * 2 * 96 + 2 * 96 + 4 * 4 + 2 * 10
    mlp = 6 * 176
    lora = 3 * (64 + 2 * 64 + 16) + (96 + 2 * 96 + 16)
    assert memory_formulas.layer_activation_bytes(TINY, adapter, 10) == norms + qk + attention + mlp + lora == 3908
    # The first layer reads the embeddings: no input norm and no q/k/v mask saved.
    assert memory_formulas.layer_activation_bytes(TINY, adapter, 10, first=True) == 3908 - 260 - 3 * 64
    # Without a mask, k and v keep their 2 heads and no mask row is kept.
    assert memory_formulas.layer_activation_bytes(TINY, adapter, 10, masked=False) == 3908 - 2 * 2 * 48 - 20
    lora_params = 3 * 8 * ((64 + 96) + 2 * (64 + 48) + (96 + 64))
    assert adapter.params(TINY) == lora_params == 13056
    params = 2 * 384 * 64 + 3 * (64 * 96 + 2 * 64 * 48 + 96 * 64 + 3 * 64 * 176 + 2 * 64 + 2 * 24) + 64
    assert TINY.total_params() == params
    assert memory_formulas.weight_bytes(TINY, "ddp", 4) == 2 * params
    assert memory_formulas.weight_bytes(TINY, "zero3", 4) == 2 * params // 4 + 2 * params  # the live cap exceeds the model
    assert memory_formulas.lora_state_bytes(1000, "ddp", 4) == 20_000
    assert memory_formulas.lora_state_bytes(1000, "zero3", 4) == 2000 + 14_000 // 4

    tokens, rotary, cast, final_norm, head_saved = 20, 2 * 2 * 20 * 24, 2 * lora_params, 260 * 20, 4 * 384 * 20
    full = memory_formulas.activation_bytes(TINY, adapter, batch=2, length=10, objective="refusion", checkpointing=False)
    saved = (3456 + 2 * 3908) * tokens + rotary + cast + final_norm + head_saved
    assert full.saved == saved == 289_392
    # Peak at the head's backward: 12V per token, of which 4V is saved.
    assert full.peak == saved + 8 * 384 * tokens == 350_832
    ckpt = memory_formulas.activation_bytes(TINY, adapter, batch=2, length=10, objective="refusion", checkpointing=True)
    assert ckpt.saved == 3 * 2 * 64 * tokens + final_norm + head_saved == 43_600
    # Peak in the last layer's backward: its recomputed activations and gradients, after the head's
    # tensors are freed, with the rotary tables, the mask and the adapter's bf16 copy waiting.
    waiting = rotary + 2 * 10 * 10 + cast
    assert ckpt.peak == 43_600 - head_saved + (4 * 176 + 4 * 64 + 3908) * tokens + waiting == 138_472


@pytest.mark.parametrize("name", sorted(PAPER_MODELS))
def test_weights_and_lora_state_are_what_the_meta_model_holds(name):
    """bf16 frozen weights, the fp32 adapter and its AdamW moments, summed over the tensors
    the meta-built model and a real optimizer step hold."""
    recipe, _config, model = recipe_model(name)
    estimate = memory.estimate(recipe, name, "ddp", 8)
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {p.dtype for p in trainable} == {torch.float32}
    for p in trainable:
        p.grad = torch.zeros_like(p)
    optimizer = torch.optim.AdamW(trainable, foreach=False)
    optimizer.step()
    moments = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                  for k, t in s.items() if k != "step")
    held = sum(p.numel() * p.element_size() for p in trainable) + sum(p.grad.numel() * p.grad.element_size()
                                                                      for p in trainable) + moments
    assert estimate.weights == frozen
    ddp_bucket = 4 * sum(p.numel() for p in trainable)  # DDP's gradient bucket: not held by a single process' model
    assert estimate.lora_state == held + ddp_bucket


# Tiny real models of each family, bf16 on CPU under bf16 autocast (as a GPU run).
TINY_DIMS = {"vocab_size": 384, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 3,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24, "tie_word_embeddings": False}
# On CPU, dropout keeps a float mask of the adapter's dtype (fp32) and sdpa a bf16 additive mask.
CPU = Kernels(dropout_mask_bytes=4, attention_mask_bytes=2, head_tile_temporary_bytes=32)
BATCH, LENGTH = 2, 64


def tiny_model(family: str):
    from transformers import Gemma3Config, LlamaConfig, Qwen3Config

    torch.manual_seed(0)
    if family == "gemma3":
        config = Gemma3Config(
            text_config=dict(TINY_DIMS, sliding_window=16, query_pre_attn_scalar=24),
            vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                           "num_attention_heads": 2, "image_size": 28, "patch_size": 14, "vision_use_head": False},
            mm_tokens_per_image=4,
        )
    else:
        config = (Qwen3Config if family == "qwen3" else LlamaConfig)(**TINY_DIMS)
    config.architectures = [{"gemma3": "Gemma3ForConditionalGeneration", "qwen3": "Qwen3ForCausalLM",
                             "llama": "LlamaForCausalLM"}[family]]
    model = getattr(transformers, config.architectures[0])._from_config(config, dtype=torch.bfloat16,
                                                                        attn_implementation="sdpa")
    return config, model


def tiny_recipe(family: str, objective: str):
    name = {"gemma3": "gemma3_prefix", "qwen3": "qwen3_prefix", "llama": "llama31_prefix"}[family]
    if objective != "sft":
        name = {"refusion": "refusion_prefix_to_answer", "distill": "qwen3_distill"}[objective]
    recipe, _ = parse_recipe([f"recipe={name}"])
    return recipe


def prepared(family: str, objective: str, checkpointing: bool):
    """The tiny model as train/sft.py and TRL prepare it: fused LM head (sft), LoRA, training
    mode, checkpointing with input gradients."""
    from trl.trainer.utils import add_fused_lm_head

    config, model = tiny_model(family)
    if objective == "sft":
        add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    recipe = tiny_recipe(family, objective)
    model = get_peft_model(model, lora_config(recipe))
    model.train()
    if checkpointing:
        model.enable_input_require_grads()
        model.activation_checkpointing_enable()
    return config, recipe, model


def tiny_batch() -> dict[str, torch.Tensor]:
    """Two rows, the second padded: the attention mask is materialised, as in padded training batches."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, TINY_DIMS["vocab_size"], (BATCH, LENGTH), generator=generator)
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[1, -5:] = 0
    labels = ids.clone()
    labels[:, : LENGTH // 4] = -100
    labels[mask == 0] = -100
    positions = torch.arange(LENGTH).expand(BATCH, LENGTH).clone()
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "position_ids": positions}


def training_loss(model, objective: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss each objective's trainer computes (TRL's fused SFT loss, train/refusion_objective.py,
    train/distill.py), with their functions."""
    from train.distill import (
        answer_logits,
        divergence_sum,
        logits_to_keep,
        teacher_targets,
    )
    from train.refusion_objective import weighted_token_losses

    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    if objective == "sft":
        return model(**inputs, labels=batch["labels"], fused_lm_head=True, use_cache=False).loss
    if objective == "refusion":
        logits = model(**inputs, use_cache=False).logits
        return weighted_token_losses(logits, batch["labels"], (batch["labels"] != -100).float()).sum()
    keep = logits_to_keep(batch["labels"])
    with torch.no_grad(), model.disable_adapter():
        teacher = model(**inputs, use_cache=False, logits_to_keep=keep).logits
    targets = teacher_targets(answer_logits(teacher, batch["labels"]), top_k=0)
    del teacher
    student = answer_logits(model(**inputs, use_cache=False, logits_to_keep=keep).logits, batch["labels"])
    return divergence_sum(student, targets)


class AllocatedBytes(TorchDispatchMode):
    """Bytes of the tensors PyTorch allocates while active, live and at their peak; storages
    are followed to their release, and the `excluded` ones (parameters) are not counted."""

    def __init__(self, excluded: list[torch.Tensor]):
        super().__init__()
        self.excluded = {id(t.untyped_storage()) for t in excluded}
        self._keep = [t.untyped_storage() for t in excluded]  # their ids stay theirs
        self.live = self.peak = 0
        self.tracked: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self._track(tensor.untyped_storage())
        return out

    def _track(self, storage) -> None:
        key = id(storage)
        if key in self.excluded or key in self.tracked:
            return
        self.tracked[key] = storage.nbytes()
        self.live += storage.nbytes()
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        self.live -= self.tracked.pop(key)


def saved_tensor_bytes(model, objective: str, batch) -> int:
    """Bytes autograd holds for the backward pass after the forward (saved-tensor hooks; a
    storage once, parameters not: they are in memory anyway)."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in parameters:
            saved[pointer] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = training_loss(model, objective, batch)
    del loss
    return sum(saved.values())


def scored_positions(objective: str, batch: dict[str, torch.Tensor]) -> int:
    """Positions the head scores: all (refusion); all but each row's last (TRL's fused head
    on CPU, where it does not drop the unlabelled ones); those predicting an answer token
    (distill)."""
    from train.distill import predicting_positions

    if objective == "refusion":
        return BATCH * LENGTH
    if objective == "sft":
        return BATCH * (LENGTH - 1)
    return int(predicting_positions(batch["labels"]).sum())


def tiny_estimate(config, recipe, checkpointing: bool) -> memory_formulas.Activations:
    arch = Architecture.from_config(config)
    return memory_formulas.activation_bytes(arch, memory_formulas.adapter_of(recipe, arch), BATCH, LENGTH, recipe.objective,
                                   checkpointing, kernels=CPU, scored=scored_positions(recipe.objective, tiny_batch()))


# Tolerance of the activation estimate against the measurements (about 2% apart here): the
# transient working sets are counted from the order of the operations, not measured.
SAVED_TOLERANCE = 0.02
PEAK_TOLERANCE = 0.1


@pytest.mark.parametrize("checkpointing", [False, True], ids=["full", "checkpointed"])
@pytest.mark.parametrize("family, objective", [("llama", "sft"), ("qwen3", "sft"), ("gemma3", "sft"),
                                               ("qwen3", "refusion"), ("qwen3", "distill")])
def test_saved_activations_match_the_estimate(family, objective, checkpointing):
    config, recipe, model = prepared(family, objective, checkpointing)
    measured = saved_tensor_bytes(model, objective, tiny_batch())
    estimated = tiny_estimate(config, recipe, checkpointing).saved
    assert estimated == pytest.approx(measured, rel=SAVED_TOLERANCE), (estimated, measured)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["full", "checkpointed"])
@pytest.mark.parametrize("family, objective", [("llama", "sft"), ("gemma3", "sft"), ("qwen3", "refusion"),
                                               ("qwen3", "distill")])
def test_peak_activation_memory_matches_the_estimate(family, objective, checkpointing):
    config, recipe, model = prepared(family, objective, checkpointing)
    batch = tiny_batch()
    counter = AllocatedBytes(list(model.parameters()))
    with counter:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = training_loss(model, objective, batch)
        loss.backward()
    estimated = tiny_estimate(config, recipe, checkpointing).peak
    assert estimated == pytest.approx(counter.peak, rel=PEAK_TOLERANCE), (estimated, counter.peak)


def test_memory_table_for_every_paper_recipe(capsys):
    memory.main([])
    out = capsys.readouterr().out
    for name in PAPER_MODELS:
        assert out.count(f"| {name} |") == 2, name  # DDP and ZeRO-3
    assert "| ZeRO-3 / 8 |" in out


def test_memory_of_one_recipe_with_overrides(capsys):
    memory.main(["recipe=qwen3_prefix", "gpus=16", "training.max_length=4096"])
    out = capsys.readouterr().out
    assert "| qwen3_prefix | DDP | 1 x 4096 |" in out  # 16 over 16 GPUs: one sequence per device
    assert "llama31_prefix" not in out


def test_memory_cli_errors_name_the_problem():
    from headstart.config import RecipeError

    with pytest.raises(RecipeError, match="gpus must be >= 1"):
        memory.parse_args(["gpus=0"])
    with pytest.raises(FileNotFoundError, match="no vendored config for 'org/unknown'"):
        memory.vendored_config("org/unknown")
