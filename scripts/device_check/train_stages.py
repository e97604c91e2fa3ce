"""The device check's training stages: train/sft.py as users launch it (bf16 + checkpointing,
DeepSpeed ZeRO-3 with the fp32 merge, the distill and refusion objectives)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from device_check.base import Check, CheckError, Figure, float32_matmuls

# Merged vs adapter-on logits, relative to the largest logit, by the dtype the comparison runs in: the merged
# model's x(W + sBA) and the adapter's xW + s(xA)B round in different orders, and cuBLAS picks its reduction order per shape,
# so a few dozen roundings of the dtype's epsilon (fp32 2^-23: 1e-5 leaves margin; bf16 2^-7: 1e-2).
MERGE_TOLERANCES = {"float32": 1e-5, "bfloat16": 1e-2}
MERGE_DTYPE = "float32"  # the zero3 stage loads base, adapter and merged model in this dtype to compare them
RUN_KEYS = ("effective_batch_size", "keep_effective_batch", "resume", "merge")  # train/config.py RunSection


def sft_command(check: Check, launcher: list[str], recipe: str, run_dir: Path, **training: object) -> list[str]:
    """`accelerate launch LAUNCHER train/sft.py` on the tiny model and the check's data; `training`: keys of
    the recipe's `training:` (TRL SFTConfig) or `run:` section.

    Args:
        check (Check): the check's run: directory, device, environment.
        launcher (list[str]): `accelerate launch`'s own arguments.
        recipe (str): the recipe's name.
        run_dir (Path): the run directory.
        training (object): settings over the check's defaults.
    """
    settings = dict(max_steps=6, save_steps=6, learning_rate=1e-2, effective_batch_size=4,
                    per_device_train_batch_size=2, max_length=512, report_to="[tensorboard]", merge="false",
                    bf16=str(not check.cpu).lower(), output_dir=str(run_dir))
    settings.update(training)
    return [sys.executable, "-m", "accelerate.commands.launch", *launcher, "train/sft.py", f"recipe={recipe}",
            f"model.name_or_path={check.model_dir}", "model.attn_implementation=sdpa", f"data.path={check.data_dir}",
            *(f"{'run' if key in RUN_KEYS else 'training'}.{key}={value}" for key, value in settings.items())]


def last_checkpoint(run_dir: Path) -> Path:
    """The run's last complete checkpoint; a CheckError when it wrote none.

    Args:
        run_dir (Path): the run directory.
    """
    from train.checkpoints import last_complete_checkpoint

    checkpoint = last_complete_checkpoint(run_dir)
    if checkpoint is None:
        raise CheckError(f"{run_dir}: no complete checkpoint written")
    return checkpoint


def trainer_log(run_dir: Path) -> list[dict]:
    """The per-step log of the run's last checkpoint (trainer_state.json).

    Args:
        run_dir (Path): the run directory.
    """
    state = json.loads((last_checkpoint(run_dir) / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "loss" in entry]


def loss_figures(run_dir: Path, steps: int) -> list[Figure]:
    """The run's losses (all finite, one a step) and its time and throughput.

    Args:
        run_dir (Path): the run directory.
        steps (int): the steps the run was to train.
    """
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
    """The arguments the trainer actually ran with (training_args.bin of the last checkpoint).

    Args:
        run_dir (Path): the run directory.
    """
    import torch

    return torch.load(last_checkpoint(run_dir) / "training_args.bin", weights_only=False)


def stage_train(check: Check) -> list[Figure]:
    """A short LoRA run in one process: finite losses, and the precision, checkpointing and logs it ran with.

    Args:
        check (Check): the check's run: directory, device, environment.
    """
    directory = check.stage_dir("train")
    run_dir = directory / "run"
    started = time.perf_counter()
    check.run(sft_command(check, ["--num_processes", "1"], "smollm2_prefix", run_dir, activation_checkpointing="true"),
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
    """A short LoRA run under DeepSpeed ZeRO-3, then its merge: merged and adapter-on logits must agree.

    Args:
        check (Check): the check's run: directory, device, environment.
    """
    directory = check.stage_dir("zero3")
    run_dir = directory / "run"
    launcher = ["--config_file", "headstart/recipes/accelerate/zero3.yaml", "--num_processes", "1"]
    check.run(sft_command(check, launcher, "smollm2_prefix", run_dir, max_steps=4, save_steps=4, merge="true"),
              directory / "zero3.log")
    processes = [line for line in (directory / "zero3.log").read_text().splitlines() if line.startswith("processes:")]
    base, adapter_on, merged = adapter_logits(check, run_dir)
    difference = (adapter_on - merged).abs().max().item()
    relative = difference / adapter_on.abs().max().item()
    effect = (adapter_on - base).abs().max().item()
    tolerance = merge_tolerance(MERGE_DTYPE)
    return [
        Figure("launch", processes[0].split(",")[0] if processes else "no processes line", "processes: 1 (DEEPSPEED)",
               bool(processes) and "DEEPSPEED" in processes[0]),
        *loss_figures(run_dir, 4),
        Figure("adapter effect: adapter-on vs base logits", f"{effect:.3g}", "well above the merge difference", effect > 1e-3),
        Figure("merged vs adapter-on logits (fp32): max abs diff", f"{difference:.2e} ({relative:.1e} of the largest)",
               f"below {tolerance:g} of the largest logit", relative < tolerance),
    ]


def merge_tolerance(dtype: str) -> float:
    """The largest merged vs adapter-on logit difference, relative to the largest logit, that rounding in `dtype` explains.

    Args:
        dtype (str): the dtype's name (a key of MERGE_TOLERANCES).
    """
    if dtype not in MERGE_TOLERANCES:
        raise ValueError(f"no merge tolerance for {dtype}: one of {', '.join(MERGE_TOLERANCES)}")
    return MERGE_TOLERANCES[dtype]


def adapter_logits(check: Check, run_dir: Path):
    """Logits (in MERGE_DTYPE) of the base, the base with the saved (ZeRO-3-gathered) adapter, and the merged model.

    Args:
        check (Check): the check's run: directory, device, environment.
        run_dir (Path): the ZeRO-3 run's directory.
    """
    import torch

    from headstart.models import load_model

    ids = torch.arange(5, 133).unsqueeze(0)

    def logits(source: str, **kwargs):
        loaded = load_model(source, device=check.device, dtype=getattr(torch, MERGE_DTYPE), **kwargs)
        with torch.no_grad():
            return loaded.model(ids.to(check.device)).logits.float().cpu()

    with float32_matmuls():
        return (logits(str(check.model_dir)), logits(str(run_dir / "adapter")), logits(str(run_dir / "merged")))


def stage_objectives(check: Check) -> list[Figure]:
    """Short runs of the distill and refusion objectives: finite losses.

    Args:
        check (Check): the check's run: directory, device, environment.
    """
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
