"""The device check's memory stage: one LoRA step of a random Qwen3-8B at qwen3_prefix's batch,
activation checkpointing on vs off, against train/memory.py's estimate."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from device_check.base import Check, Figure

# The memory stage builds the paper recipe's model (qwen3_prefix: Qwen3-8B) with random weights from
# its config vendored in headstart/recipes/models/ (train/memory.py `vendored_config`). On CPU, Qwen3-8B's
# fp32 weights do not fit a small machine's memory, and a step of even one of its layers is slow
# on a core: the same code runs 2 layers a quarter as wide (head_dim 128 and the
# 4:1 grouping of query to KV heads kept) with a smaller vocabulary.
MEMORY_RECIPE = "qwen3_prefix"
CPU_SHAPE = dict(num_hidden_layers=2, hidden_size=1024, intermediate_size=3072, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=16384)
CPU_SEQUENCE = 128


def stage_memory(check: Check) -> list[Figure]:
    """Memory and time of LoRA steps with activation checkpointing on and off, against the estimate.

    Args:
        check (Check): the check's run: directory, device, environment.
    """
    import torch

    from train.memory import estimate
    from train.model import lora_config

    recipe, config = paper_model_config(check)
    batch = recipe.training["per_device_train_batch_size"]
    sequence = CPU_SEQUENCE if check.cpu else recipe.training["max_length"]
    model = shaped_lora_model(config, lora_config(recipe), check.device)
    weights = None if check.cpu else torch.cuda.memory_allocated() / 2**30
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (batch, sequence), device=check.device)
    measured = {on: lora_steps(model, ids, check.device, checkpointing=on) for on in (True, False)}
    label = (f"{recipe.model.name_or_path}: {config.num_hidden_layers} layers x {config.hidden_size}, vocab "
             f"{config.vocab_size}, batch {batch} x {sequence} tokens, LoRA r {recipe.lora.r}")
    figures = [Figure("shape", label + (" (reduced on CPU: Qwen3-8B in fp32 fits no 24 GB machine; not comparable)"
                                        if check.cpu else " (bf16 weights, bf16 autocast)"))]
    if weights is not None:
        figures.append(Figure("weights on the GPU (GiB)", f"{weights:.1f}"))
    # train/memory.py's worst case for this recipe on one GPU (it assumes TRL's fused LM head; this
    # step computes the plain loss over the full logits, so its peak sits somewhat above).
    predicted = None if check.cpu else estimate(recipe, MEMORY_RECIPE, "ddp", 1)
    for on in (True, False):
        seconds, peak, kept = measured[on]
        tag = "checkpointing " + ("on" if on else "off")
        figures += [Figure(f"{tag}: step (s)", f"{seconds:.3g} ({batch * sequence / seconds:.0f} tokens/s)"),
                    Figure(f"{tag}: activations kept for backward (GiB)", f"{kept:.3g}")]
        if peak is not None:
            figures.append(Figure(f"{tag}: peak GPU memory (GiB)", f"{peak:.1f}",
                                  f"train/memory.py estimates {predicted.total(on) / 2**30:.1f}"))
    on, off = measured[True], measured[False]
    figures.append(Figure("checkpointing keeps fewer activations", f"{on[2]:.3g} < {off[2]:.3g} GiB", "on < off",
                          on[2] < off[2]))
    if on[1] is not None:
        figures.append(Figure("checkpointing lowers the peak", f"{on[1]:.1f} < {off[1]:.1f} GiB", "on < off",
                              on[1] < off[1]))
    return figures


def paper_model_config(check: Check):
    """MEMORY_RECIPE's recipe and its model's vendored config (train/memory.py), at CPU_SHAPE on --cpu.

    Args:
        check (Check): the check's run: directory, device, environment.
    """
    from train.memory import vendored_config
    from train.sft import parse_recipe

    recipe, _ = parse_recipe([f"recipe={MEMORY_RECIPE}", "training.report_to=[none]"])
    config = vendored_config(recipe.model.name_or_path)
    for key, value in (CPU_SHAPE.items() if check.cpu else ()):
        setattr(config, key, value)
    return recipe, config


def random_model(config, device: str):
    """A random-init model of `config` built on `device` (bf16 on GPU, fp32 on CPU), seeded.

    Args:
        config (PretrainedConfig): the model's transformers config.
        device (str): where the model is built.
    """
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    with torch.device(device):  # initialised where it runs: an 8B model's weights never pass through host memory
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")


def shaped_lora_model(config, lora, device: str):
    """A random-init model of `config` on `device` (random_model) with the recipe's LoRA.

    Args:
        config (PretrainedConfig): the model's transformers config.
        lora (LoraConfig): the recipe's adapter config.
        device (str): where the model is built.
    """
    from peft import get_peft_model

    model = random_model(config, device)
    model.to(device)  # a no-op, unless a transformers version builds elsewhere first
    model.config.use_cache = False  # as the trainer runs it: no KV cache while training
    return get_peft_model(model, lora)


def lora_steps(model, ids, device: str, checkpointing: bool, steps: int = 2) -> tuple[float, float | None, float]:
    """Mean seconds of `steps` timed LoRA steps (after one untimed), the peak GPU memory (GiB; None
    on CPU) and the activations autograd kept for backward in one forward (GiB).

    Args:
        model (PeftModel): the model with its adapter.
        ids (torch.Tensor): [B, L] the input ids of each step.
        device (str): the device the steps run on.
        checkpointing (bool): whether activation checkpointing is on.
        steps (int): the timed steps.
    """
    import torch

    from eval.engines.clock import Stopwatch

    if checkpointing:
        model.activation_checkpointing_enable()  # as the trainer's `activation_checkpointing` does
    else:
        model.activation_checkpointing_disable()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    step(model, optimizer, ids)  # untimed: kernels chosen, allocator warm
    if device != "cpu":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    clock = Stopwatch(device, "sync")
    for _ in range(steps):
        step(model, optimizer, ids)
    seconds = clock.seconds() / steps
    peak = torch.cuda.max_memory_allocated() / 2**30 if device != "cpu" else None
    with kept_for_backward(model) as kept, torch.autocast(ids.device.type, dtype=torch.bfloat16,
                                                          enabled=ids.device.type == "cuda"):
        loss = model(input_ids=ids, labels=ids).loss
    del loss
    optimizer.zero_grad(set_to_none=True)
    return seconds, peak, kept[0] / 2**30


def step(model, optimizer, ids) -> None:
    """One optimizer step, under bf16 autocast on GPU as the trainer's `bf16` runs it.

    Args:
        model (PeftModel): the model with its adapter.
        optimizer (torch.optim.Optimizer): the adapter's optimizer.
        ids (torch.Tensor): [B, L] the input ids (their own labels).
    """
    import torch

    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=ids.device.type == "cuda"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@contextmanager
def kept_for_backward(model) -> Iterator[list[int]]:
    """Bytes of the tensors autograd saves for backward (weights excluded, each storage once).
    Inside a checkpointed layer the checkpoint's own hooks take over: what it drops is not counted.

    Args:
        model (torch.nn.Module): the model whose weights are left out of the count.
    """
    import torch

    seen = {p.untyped_storage().data_ptr() for p in model.parameters()}
    total = [0]

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total[0] += storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield total

