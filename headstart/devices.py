"""Which device a run uses, and the refusal when a GPU was asked for but CUDA is unusable.

Without this, a torch whose CUDA cannot start (a driver older than the wheel's CUDA, a
CPU-only build on a GPU node) reports `torch.cuda.is_available() == False`, and every
"cuda when available, else cpu" default quietly puts an 8B model on the CPU, in fp32. Here
the run says what asked for a GPU and stops instead. What asks for one:
- the environment: a Slurm allocation with GPUs (`SLURM_GPUS_ON_NODE`, `SLURM_JOB_GPUS`,
  `SLURM_STEP_GPUS`) or a non-empty `CUDA_VISIBLE_DEVICES` other than "-1";
- for training, the host too: an NVIDIA driver loaded (`/proc/driver/nvidia/version`), unless
  `CUDA_VISIBLE_DEVICES` hides every GPU (an evaluation's merge or report job runs on GPU
  nodes without a GPU, and loads no model);
- the run's own settings: a training recipe with `training.bf16: true`, an evaluation with
  `device=cuda...`.
An explicit CPU choice (`device=cpu`, `accelerate launch --cpu`) overrides the environment.
The environment is an argument (default `os.environ`) so that callers and tests pass their own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

# Set by Slurm for a job or step holding GPUs: a count ("0": none), or the GPUs' indices ("0": GPU 0).
SLURM_GPU_COUNT = "SLURM_GPUS_ON_NODE"
SLURM_GPU_INDICES = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS")
# CUDA_VISIBLE_DEVICES values that hide every GPU (old Slurm writes NoDevFiles for a GPU-less job).
NO_GPU_VISIBLE = ("", "-1", "NoDevFiles")


class CudaUnusableError(ValueError):
    """A GPU was asked for and CUDA cannot run. A ValueError, so that the entry points print it
    as one line (headstart.config.CLI_ERRORS)."""


def environment_gpu_requests(environ: Mapping[str, str] | None = None) -> list[str]:
    """The variables of `environ` that hand this process GPUs, as `NAME=value`.

    Args:
        environ (Mapping[str, str] | None): the environment to read; None: this process's.
    """
    environ = os.environ if environ is None else environ
    none = {SLURM_GPU_COUNT: ("", "0"), **{name: ("", "(null)") for name in SLURM_GPU_INDICES},
            "CUDA_VISIBLE_DEVICES": NO_GPU_VISIBLE}
    return [f"{name}={environ[name]}" for name, empty in none.items()
            if name in environ and environ[name].strip() not in empty]


# Present wherever an NVIDIA kernel driver is loaded (a workstation or cloud VM without Slurm).
NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")


def host_gpu_requests(driver_file: Path = NVIDIA_DRIVER_FILE) -> list[str]:
    """A GPU driver on this host asks for its GPU: a torch that cannot use it is a broken install.

    Args:
        driver_file (Path): the file the NVIDIA driver exposes when loaded.
    """
    return [f"an NVIDIA driver ({driver_file})"] if driver_file.exists() else []


def cuda_state() -> str:
    """What this torch says of CUDA, for the refusal: its build and why CUDA did not start.
    `torch.cuda.is_available()` warns of a too-old driver once per process only; `init()`
    raises the reason on every call."""
    build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    try:
        torch.cuda.init()
        reason = ""
    except Exception as error:  # RuntimeError (driver), AssertionError (CPU build): both say why
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"torch {torch.__version__}, {build}" + (f"; {reason}" if reason else "")


def require_cuda(asked: list[str]) -> None:
    """Refuse when anything in `asked` (what asked for a GPU, in words) did and CUDA is unusable.

    Args:
        asked (list[str]): what asked for a GPU, in words (empty: nothing did).
    """
    if not asked or torch.cuda.is_available():
        return
    hint = ("install a CUDA build of torch" if not torch.version.cuda else
            f"check that the NVIDIA driver supports CUDA {torch.version.cuda} (nvidia-smi shows the driver's "
            "CUDA version) or install a torch built for an older CUDA")
    raise CudaUnusableError(f"{', '.join(asked)} asked for a GPU, but CUDA is unusable here "
                            f"(torch.cuda.is_available() is False: {cuda_state()}): {hint}; "
                            "to run on CPU after all, say so (device=cpu, or CUDA_VISIBLE_DEVICES= for any command; "
                            "for training, accelerate launch --cpu)")


def gpu_requests(environ: Mapping[str, str] | None = None, driver_file: Path = NVIDIA_DRIVER_FILE) -> list[str]:
    """Everything that asks this process for a GPU. `CUDA_VISIBLE_DEVICES` set to hide every GPU
    is an explicit CPU choice that a driver on the host does not overrule.

    Args:
        environ (Mapping[str, str] | None): the environment to read; None: this process's.
        driver_file (Path): the file the NVIDIA driver exposes when loaded.
    """
    environ = os.environ if environ is None else environ
    hidden = environ.get("CUDA_VISIBLE_DEVICES", None)
    host = [] if hidden is not None and hidden.strip() in NO_GPU_VISIBLE else host_gpu_requests(driver_file)
    return environment_gpu_requests(environ) + host


def default_device(environ: Mapping[str, str] | None = None) -> str:
    """cuda when it works; cpu when it does not and nothing asked for a GPU (else refused).

    Args:
        environ (Mapping[str, str] | None): the environment to read; None: this process's.
    """
    require_cuda(environment_gpu_requests(environ))
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(device: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The device a run asks for (None: `default_device`), checked: a cuda device needs CUDA.

    Args:
        device (str | None): the device the run asks for ("cpu", "cuda", "cuda:1"), or None.
        environ (Mapping[str, str] | None): the environment to read; None: this process's.
    """
    if device is None:
        return default_device(environ)
    if device.startswith("cuda"):
        require_cuda([f"device={device}"])
    return device


def idle_cores_note(device_type: str, local_processes: int, threads: int | None = None,
                    cores: int | None = None) -> str | None:
    """A note when CPU training leaves cores idle: `accelerate launch` gives its processes
    OMP_NUM_THREADS=1 unless `--num_cpu_threads_per_process` says otherwise (its own sizing only
    applies with `--cpu`), so a single process trained on one core without saying so.

    Args:
        device_type (str): the training device's type ("cpu", "cuda").
        local_processes (int): how many training processes run on this node.
        threads (int | None): the threads each process computes with; None: torch's count in this process.
        cores (int | None): the cores this process may use; None: counted here.
    """
    threads = torch.get_num_threads() if threads is None else threads
    if cores is None:  # the cores this process may run on (macOS has no affinity call: all of them)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if device_type != "cpu" or threads * local_processes >= cores:
        return None
    return (f"note: {local_processes} process{'es' if local_processes != 1 else ''} x {threads} thread"
            f"{'s' if threads != 1 else ''} on {cores} cores; `accelerate launch --num_cpu_threads_per_process "
            f"{cores // local_processes}` uses them all (OMP_NUM_THREADS=1 is right beside other jobs)")
