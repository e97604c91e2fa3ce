"""The vLLM backend's settings (a config's `vllm:` section), torch-free: `--help` and
config validation import this module, not headstart.vllm_client (torch, transformers)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from headstart.config import check_range
from headstart.paths import INSTALL_ROOT

# Where scripts/setup_vllm.sh makes it: the root of the checkout headstart is installed from.
DEFAULT_VENV = INSTALL_ROOT / ".venv-vllm"
MOST_GPUS = 1024  # a typo guard on the parallel sizes


@dataclass
class VLLMSettings:
    """How the vLLM engines run (used when a `backend` setting is `vllm`)."""

    python: str | None = field(
        default=None,
        metadata={"help": "Interpreter of the vLLM environment; null: $HEADSTART_VLLM_PYTHON, else .venv-vllm/bin/python of "
                          "this checkout (scripts/setup_vllm.sh)."},
    )
    tensor_parallel_size: int = field(
        default=1,
        metadata={"help": "GPUs each engine shards the model over (vLLM tensor parallelism)."},
    )
    data_parallel_size: int = field(
        default=1,
        metadata={"help": "Independent engines, each on tensor_parallel_size GPUs of its own; every batch is split among them."},
    )
    max_model_len: int | None = field(
        default=None,
        metadata={"help": "Longest prompt + answer in tokens the engine reserves cache for; null: what the run needs (its "
                          "longest prompt + max_new_tokens + 1), the model's only where a caller does not know its prompts; a "
                          "value below the run's need is refused."},
    )
    gpu_memory_utilization: float | None = field(
        default=None,
        metadata={"help": "GPU: share of each GPU's memory vLLM may take (weights and KV cache); null: what is free on the "
                          "engine's GPUs at its start less gpu_memory_margin_gib, at most 0.9 (the evaluator's transformers "
                          "model shares the GPU); a value above what is free is refused."},
    )
    gpu_memory_margin_gib: float = field(
        default=4.0,
        metadata={"help": "GPU, gpu_memory_utilization null: GiB left free beside vLLM on each of its GPUs (vLLM's CUDA "
                          "context, the transformers model's working memory)."},
    )
    cpu_kv_cache_gib: int = field(default=4, metadata={"help": "CPU: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)."})
    cpu_threads_bind: str = field(
        default="auto",
        metadata={"help": "CPU: cores the engine's threads are bound to (VLLM_CPU_OMP_THREADS_BIND, e.g. '0' for one, "
                          "'nobind')."},
    )
    enforce_eager: bool | None = field(
        default=None,
        metadata={"help": "Run the model without compiling it; null: eager on CPU (compiling takes minutes there), vLLM's "
                          "default (compiled, CUDA graphs) on GPU."},
    )
    block_size: int | None = field(
        default=None,
        metadata={"help": "KV cache block in tokens, the unit vLLM's prefix cache shares; null: 32 on CPU (the smallest its "
                          "attention takes; vLLM's CPU default, 128, shares little of the prefixes S_1..S_n of a request), "
                          "vLLM's default on GPU."},
    )
    seed: int = field(default=0, metadata={"help": "vLLM's seed (decoding is greedy; it only fixes vLLM's own initialisation)."})

    def __post_init__(self) -> None:
        check_range("vllm.tensor_parallel_size", self.tensor_parallel_size, 1, MOST_GPUS)
        check_range("vllm.data_parallel_size", self.data_parallel_size, 1, MOST_GPUS)
        if self.max_model_len is not None:  # the run's own need (prompts + answer) is checked by its config
            check_range("vllm.max_model_len", self.max_model_len, 2, none_means="what the run needs")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"vllm.gpu_memory_utilization must be in (0, 1] or null, not {self.gpu_memory_utilization}")
        check_range("vllm.gpu_memory_margin_gib", self.gpu_memory_margin_gib, 0)
        check_range("vllm.cpu_kv_cache_gib", self.cpu_kv_cache_gib, 1)
        if self.block_size is not None:
            check_range("vllm.block_size", self.block_size, 1, 1024, none_means="32 on CPU, vLLM's default on GPU")
        check_range("vllm.seed", self.seed, 0)


def vllm_python(settings: VLLMSettings | None = None) -> Path:
    """The interpreter the workers run in (see VLLMSettings.python).

    Args:
        settings (VLLMSettings | None): the run's vLLM settings; None: the defaults.
    """
    chosen = (settings.python if settings else None) or os.environ.get("HEADSTART_VLLM_PYTHON")
    return Path(chosen) if chosen else DEFAULT_VENV / "bin" / "python"
