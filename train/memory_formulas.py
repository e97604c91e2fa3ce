"""The memory formulas of train/memory.py: bytes of weights, LoRA state and activations.

Weights (bf16, 2 bytes a parameter; the parameter count is summed from the config's
dimensions and equals the count of the model transformers builds from that config):
- DDP: every GPU holds them all.
- ZeRO-3 over N GPUs: 2/N bytes a parameter, plus the parameters gathered while their layer
  runs: at most `stage3_max_live_parameters` (1e9, DeepSpeed's default) or, when larger, the
  largest single matrix (the embedding and the LM head are gathered whole).

LoRA state (trainable parameters only; the base is frozen, so it has no gradients and no
optimizer state):
- DDP: PEFT keeps the adapter in fp32 (`autocast_adapter_dtype`), so 4 bytes of weight,
  4 of gradient, 8 of AdamW moments and 4 of DDP's gradient bucket = 20 bytes, plus the bf16
  copy autocast caches for the step (2).
- ZeRO-3: TRL builds the adapter in bf16 (`autocast_adapter_dtype=False`, TRL's SFTTrainer);
  each LoRA matrix is below DeepSpeed's persistence threshold (10 x hidden elements) and stays
  whole on every GPU (2 bytes), while its gradient (2) and the fp32 master copy and AdamW
  moments (12) are partitioned: 2 + 14/N bytes (the mixed-precision Adam accounting of the
  ZeRO paper, Rajbhandari et al. 2020).

Activations: what autograd saves for the backward pass, in bytes per token of one decoder
layer. The derivation follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", Section 4.1: 34 s b h + 5 a s^2 b bytes per layer for GPT in
16-bit), redone for what these models and LoRA save. Symbols: h hidden, I MLP intermediate,
a query heads, g key/value heads, d head dimension, r LoRA rank, S sequence length, B
micro-batch, m bytes of a dropout mask (1: CUDA keeps a bool mask); bf16 autocast throughout.
- Frozen linears save nothing: their weight needs no gradient, so autograd keeps no input
  (the gradient with respect to their input needs only the weight, in memory anyway). This
  is where LoRA differs from full fine-tuning: the inputs of the projections are not stored.
  The nonlinearities and norms between frozen linears still are, since the gradient has to
  pass through them to reach the adapters of earlier layers.
- Attention runs in a fused kernel (sdpa, flash or memory-efficient): it keeps q, k, v, its
  output and one fp32 log-sum-exp per head, never the S x S attention matrix (Korthikanti's
  5 a s^2 b term). With a mask (padded batches; Gemma-3's sliding windows) transformers
  repeats k and v to all a heads (its sdpa path keeps grouped heads only without a mask) and
  the kernel keeps a bf16 copy of the mask: 2ad + 2 x 2ad + 2ad + 4a + 2S. Without a mask,
  k and v keep g heads (2 x 2gd) and no mask is kept. The estimate assumes a mask.
- MLP (SwiGLU / GeGLU): the activation's input, its output and the up projection, 3 x 2I.
- RMSNorm (computed in fp32): a fp32 copy of its input and the inverse RMS, 4h + 4, for each
  of the layer's norms (2 in Llama and Qwen3, 4 in Gemma-3); Qwen3 and Gemma-3 also normalise
  q and k per head: 4ad + 4a + 4gd + 4g.
- Each adapted projection with input width n: the dropout mask m n, the bf16 copy of the
  dropped input that lora_A keeps 2n, and lora_A's output that lora_B keeps 2r. The first
  layer keeps no mask and no input norm for the projections that read the embeddings, which
  need no gradient (unless checkpointing makes them require one).
Once per forward pass: the rotary cos and sin (bf16, B x S x d each, per rotary set), the
final norm (4h + 4 per token), and under DDP autocast's bf16 copy of the fp32 adapter.

Gradient checkpointing (one checkpoint per decoder layer, transformers' default): a layer
keeps only its input (2h per token); the rotary tables and the model's bool masks (B x S^2
per kind: Gemma-3 has a sliding-window and a full one) wait for the recompute, and one
layer's activations are recomputed at a time during the backward pass.

The LM head and the loss, per position it scores (V the vocabulary):
- sft: TRL's fused head (`add_fused_lm_head`) never builds the [tokens x V] logits. It keeps a
  bf16 copy of the hidden states it scores, the target, log-normaliser, entropy and label
  mask (2h + 17), and works in one [4096 x 32768] bf16 tile; its backward adds an fp32
  gradient of those hidden states and its bf16 cast (6h). On CUDA it scores only the
  positions that predict an answer token.
- refusion: the bf16 logits of every position (2V), their fp32 copy (4V) and the log-softmax
  the loss keeps (4V); in the backward the kept log-softmax and its incoming and outgoing
  fp32 gradients are live together: 12V at the peak, 4V saved.
- distill: over the positions that predict an answer token, the teacher's fp32
  log-probabilities (4V) live through the student pass beside the student's bf16 logits and
  their answer rows (2V + 2V), its log-softmax (4V) and the KL's p, log p - log q, product
  and mask (4V + 4V + 4V + V): 25V at the peak, 9V saved. `distill.top_k` > 0 keeps k + 1
  teacher numbers instead of V: 12V at the peak.

The peak: the head's backward runs first, with every layer's activations saved (saved +
the head's working set); the layers' backward comes after the head's tensors are freed, and
adds one layer's gradients, 2 x 2I + 2 x 2h per token (with checkpointing, plus the
recomputed layer). The larger of the two, plus what waits for the recompute, is the
activation peak; the weights and the LoRA state come on top.

The test suite checks these figures in tiny real Llama, Qwen3 and Gemma-3 models
(bf16 on CPU, with the CPU kernels' mask sizes, `Kernels`): the saved bytes against
saved-tensor hooks, the peak against the tensors PyTorch allocates; both agree within a few
percent. No GPU measurement backs them yet: check one real step with
`torch.cuda.max_memory_allocated()` before a long run.
"""

from __future__ import annotations

from dataclasses import dataclass

from headstart.config import RecipeError

ZERO3_MAX_LIVE_PARAMETERS = 10**9  # DeepSpeed's stage3_max_live_parameters default
FUSED_HEAD_TILE = (4096, 32768)  # TRL's token x vocabulary tile (trl/kernels/chunked_logprob.py)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Kernels:
    """What the training device's kernels keep beyond the model's own tensors. Dropout: on
    CUDA a bool mask (native dropout); on CPU (the tests) a float mask of the dropped tensor's
    dtype, the adapter's fp32. Attention with a mask: a bf16 copy of the mask per layer
    (measured on CPU; on CUDA sdpa turns the bool mask into an additive bias for its
    memory-efficient kernel, which keeps it for the backward)."""

    dropout_mask_bytes: int = 1
    attention_mask_bytes: int = 2
    # TRL's fused head folds each logits tile in place in a Triton kernel on CUDA; its torch
    # fallback (CPU) holds about 8 fp32 temporaries of the tile (`_backward_tile`).
    head_tile_temporary_bytes: int = 0


CUDA = Kernels()


@dataclass(frozen=True)
class Architecture:
    """The dimensions of a decoder-only text model (and its vision tower, if any) that the
    estimate reads, from a transformers config."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    norms_per_layer: int = 2
    qk_norm: bool = False
    rotary_sets: int = 1  # Gemma-3: local and global rotary embeddings
    mask_kinds: int = 1  # Gemma-3: sliding-window and full attention masks
    tied_embeddings: bool = False
    other_params: int = 0  # outside the text decoder: vision tower and projector
    decoder_path: str = "model"  # module path of the text decoder inside the loaded model

    @classmethod
    def from_config(cls, config) -> Architecture:
        """The dimensions of a llama, qwen3 or gemma3 model (its text decoder) from its config.

        Args:
            config (PretrainedConfig): the model's transformers config.
        """
        text = config.get_text_config()
        model_type = text.model_type
        if model_type not in ("llama", "qwen3", "gemma3_text"):
            raise ValueError(f"no activation formula for model type {model_type!r}: llama, qwen3 or gemma3 only")
        gemma = model_type == "gemma3_text"
        multimodal = text is not config
        return cls(
            layers=text.num_hidden_layers, hidden=text.hidden_size, intermediate=text.intermediate_size,
            heads=text.num_attention_heads, kv_heads=text.num_key_value_heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
            vocab=text.vocab_size, norms_per_layer=4 if gemma else 2, qk_norm=model_type != "llama",
            rotary_sets=2 if gemma else 1, mask_kinds=2 if gemma else 1,
            tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            other_params=vision_params(config) if multimodal else 0,
            decoder_path="model.language_model" if multimodal else "model",
        )

    def projection_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear of a decoder layer."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def layer_params(self) -> int:
        norms = self.norms_per_layer * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return sum(i * o for i, o in self.projection_dims().values()) + norms

    def total_params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return embeddings + self.layers * self.layer_params() + self.hidden + self.other_params

    def largest_matrix(self) -> int:
        return max(self.vocab * self.hidden, *(i * o for i, o in self.projection_dims().values()))


def vision_params(config) -> int:
    """Parameters of a SigLIP vision tower without head and of Gemma-3's projector.

    Args:
        config (PretrainedConfig): a Gemma-3 model's config.
    """
    v = config.vision_config
    if v.model_type != "siglip_vision_model" or getattr(v, "vision_use_head", False):
        raise ValueError(f"vision tower {v.model_type!r}: only SigLIP without head is counted")
    width, hidden = v.hidden_size, config.get_text_config().hidden_size
    patches = (v.image_size // v.patch_size) ** 2
    embeddings = v.num_channels * v.patch_size**2 * width + width + patches * width
    layer = 4 * (width * width + width) + 2 * (width * v.intermediate_size) + v.intermediate_size + width + 4 * width
    return embeddings + v.num_hidden_layers * layer + 2 * width + width * hidden + width


@dataclass(frozen=True)
class Adapter:
    """The LoRA adapter of a recipe, as train/model.py `lora_config` builds it."""

    rank: int
    dropout: float
    projections: tuple[str, ...]  # the decoder-layer linears it wraps

    def params(self, arch: Architecture) -> int:
        """The adapter's parameters over every decoder layer.

        Args:
            arch (Architecture): the model's dimensions.
        """
        dims = arch.projection_dims()
        return arch.layers * sum(self.rank * sum(dims[p]) for p in self.projections)


def adapter_of(recipe, arch: Architecture) -> Adapter:
    """The projections the recipe's LoRA wraps, matched by PEFT's own rule against the module
    names transformers gives them (`<decoder>.layers.<i>.<self_attn|mlp>.<name>`).

    Args:
        recipe (TrainRecipe): the training recipe.
        arch (Architecture): the model's dimensions.
    """
    from peft.tuners.tuners_utils import check_target_module_exists

    from train.model import lora_config

    config = lora_config(recipe)
    wrapped = tuple(p for p in PROJECTIONS if check_target_module_exists(config, module_name(arch, p)))
    if not wrapped:
        raise RecipeError(f"the recipe's LoRA targets match no linear of the decoder ({', '.join(PROJECTIONS)})")
    return Adapter(recipe.lora.r, recipe.lora.dropout, wrapped)


def module_name(arch: Architecture, projection: str, layer: int = 0) -> str:
    """The module name transformers gives a projection of a decoder layer.

    Args:
        arch (Architecture): the model's dimensions (its decoder's path).
        projection (str): the projection's name (`q_proj`, `down_proj`).
        layer (int): the decoder layer's index.
    """
    block = "self_attn" if projection in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
    return f"{arch.decoder_path}.layers.{layer}.{block}.{projection}"


def layer_activation_bytes(arch: Architecture, adapter: Adapter, length: int, kernels: Kernels = CUDA,
                           first: bool = False, masked: bool = True) -> int:
    """Bytes one decoder layer saves for the backward pass, per token of sequences of
    `length` tokens (see the module docstring). `first`: the first layer without
    checkpointing, whose input needs no gradient. `masked`: attention runs with a mask
    (padded batches; Gemma-3's sliding windows), so transformers repeats k and v to every
    query head (its sdpa path keeps grouped heads only without a mask) and the kernel keeps
    the mask.

    Args:
        arch (Architecture): the model's dimensions.
        adapter (Adapter): the projections the LoRA wraps, and its rank.
        length (int): the sequence length in tokens.
        kernels (Kernels): what the attention and head kernels keep (CUDA's by default).
        first (bool): whether it is the first layer without checkpointing.
        masked (bool): whether attention runs with a mask.
    """
    h, i, a, g, d = arch.hidden, arch.intermediate, arch.heads, arch.kv_heads, arch.head_dim
    norm = 4 * h + 4
    total = arch.norms_per_layer * norm - (norm if first else 0)
    if arch.qk_norm:
        total += 4 * a * d + 4 * a + 4 * g * d + 4 * g
    kv_width = a * d if masked else g * d
    total += 2 * a * d + 2 * 2 * kv_width + 2 * a * d + 4 * a  # fused attention: q, k, v, output, log-sum-exp
    total += kernels.attention_mask_bytes * length if masked else 0
    total += 3 * 2 * i  # MLP: activation input and output, up projection
    dims = arch.projection_dims()
    for projection in adapter.projections:
        n = dims[projection][0]
        reads_embeddings = first and projection in ("q_proj", "k_proj", "v_proj")
        mask = kernels.dropout_mask_bytes * n if adapter.dropout > 0 and not reads_embeddings else 0
        total += mask + 2 * n + 2 * adapter.rank
    return total


@dataclass(frozen=True)
class Head:
    """The LM head and loss, per token: what autograd saves of it, and what it holds at its
    peak (forward or backward) beside the layers' saved activations; plus a fixed tile."""

    saved: int
    peak: int
    tile: int = 0


def head_bytes(arch: Architecture, objective: str, top_k: int = 0, rows: int = 1, kernels: Kernels = CUDA) -> Head:
    """The head of `objective` for `rows` scored positions.

    Args:
        arch (Architecture): the model's dimensions.
        objective (str): "sft", "refusion" or "distill".
        top_k (int): distill's top-k; 0: the full vocabulary.
        rows (int): the positions the head scores.
        kernels (Kernels): what the head's kernel keeps (CUDA's by default).
    """
    h, v = arch.hidden, arch.vocab
    if objective == "sft":  # hidden copy, target, log-normaliser, entropy, label mask; fp32 + bf16 hidden gradient
        tile_rows, width = FUSED_HEAD_TILE
        tile = min(tile_rows, rows) * (2 * width + kernels.head_tile_temporary_bytes * min(width, v))
        return Head(saved=2 * h + 17, peak=2 * h + 17 + 6 * h, tile=tile)
    if objective == "refusion":  # the log-softmax output; at the peak, it and its two gradients
        return Head(saved=4 * v, peak=12 * v)
    if objective == "distill":  # student log-softmax, the teacher's p and the KL's mask (full vocabulary)
        return Head(saved=9 * v, peak=25 * v) if top_k == 0 else Head(saved=4 * v, peak=12 * v)
    if objective == "sdft":  # TRL's head and its generation's KV cache: neither derived nor measured here
        raise ValueError("objective sdft: train.memory has no model of TRL's SDFT head or of the KV cache of its "
                         "drafting; estimate the distill twin (same base, LoRA, batch and length) and add the cache")
    raise ValueError(f"objective {objective!r}: sft, refusion or distill")


@dataclass(frozen=True)
class Activations:
    """Activation memory of one micro-batch (bytes)."""

    saved: int  # held at the end of the forward pass (the saved-tensor measurement)
    peak: int  # saved + the largest working set on top of it


def activation_bytes(arch: Architecture, adapter: Adapter, batch: int, length: int, objective: str,
                     checkpointing: bool, top_k: int = 0, kernels: Kernels = CUDA, masked: bool = True,
                     adapter_dtype_bytes: int = 4, scored: int | None = None) -> Activations:
    """Saved and peak activation bytes of a micro-batch of `batch` x `length` tokens.
    `adapter_dtype_bytes`: 4 when the adapter is fp32 and autocast keeps its bf16 copy (DDP),
    2 when it is bf16 (ZeRO-3: no copy). `scored`: positions the head scores (default all:
    refusion scores every position; sft and distill only those predicting an answer token).

    Args:
        arch (Architecture): the model's dimensions.
        adapter (Adapter): the projections the LoRA wraps, and its rank.
        batch (int): sequences in the micro-batch.
        length (int): tokens per sequence.
        objective (str): "sft", "refusion" or "distill".
        checkpointing (bool): whether activation checkpointing is on.
        top_k (int): distill's top-k; 0: the full vocabulary.
        kernels (Kernels): what the attention and head kernels keep (CUDA's by default).
        masked (bool): whether attention runs with a mask.
        adapter_dtype_bytes (int): bytes per adapter parameter: 4 (fp32) or 2 (bf16).
        scored (int | None): positions the head scores; None: all.
    """
    tokens = batch * length
    scored = tokens if scored is None else scored
    layer = layer_activation_bytes(arch, adapter, length, kernels, masked=masked)
    rotary = arch.rotary_sets * 2 * 2 * tokens * arch.head_dim  # cos and sin, bf16
    head = head_bytes(arch, objective, top_k, scored, kernels)
    final_norm = (4 * arch.hidden + 4) * tokens
    cast_adapter = 2 * adapter.params(arch) if adapter_dtype_bytes == 4 else 0  # autocast's bf16 copy
    if checkpointing:
        # Each layer keeps its input; the rotary tables and masks wait, unsaved, for the recompute.
        layers = arch.layers * 2 * arch.hidden * tokens
        waiting = rotary + (arch.mask_kinds * batch * length * length if masked else 0) + cast_adapter
    else:
        first = layer_activation_bytes(arch, adapter, length, kernels, first=True, masked=masked)
        layers = (first + (arch.layers - 1) * layer) * tokens + rotary + cast_adapter
        waiting = 0
    saved = layers + final_norm + head.saved * scored
    # The head's backward runs first, on top of everything saved; the layers' backward after
    # it, once the head's saved tensors are freed (with checkpointing: one layer recomputed).
    at_head = saved + (head.peak - head.saved) * scored + head.tile
    backward_layer = (2 * 2 * arch.intermediate + 2 * 2 * arch.hidden + (layer if checkpointing else 0)) * tokens
    at_layers = saved - head.saved * scored + backward_layer
    return Activations(saved, max(at_head, at_layers) + waiting)


def weight_bytes(arch: Architecture, strategy: str, gpus: int) -> int:
    """Bytes of the bf16 base weights per GPU: all of them (DDP), or a shard and the gathered ones (ZeRO-3).

    Args:
        arch (Architecture): the model's dimensions.
        strategy (str): "ddp" or "zero3".
        gpus (int): the number of GPUs (ZeRO-3's shards).
    """
    total = arch.total_params()
    if strategy == "ddp":
        return 2 * total
    gathered = min(total, max(ZERO3_MAX_LIVE_PARAMETERS, arch.largest_matrix()))
    return 2 * total // gpus + 2 * gathered


def lora_state_bytes(params: int, strategy: str, gpus: int) -> int:
    """Adapter weights, gradients and AdamW moments (see the module docstring).

    Args:
        params (int): the adapter's parameters.
        strategy (str): "ddp" or "zero3".
        gpus (int): the number of GPUs (ZeRO-3's shards).
    """
    if strategy == "ddp":
        return 20 * params
    return 2 * params + 14 * params // gpus
