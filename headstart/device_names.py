"""Device and dtype names a config may hold, checked as strings before anything loads.

Torch-free, so that building a config (and `--help`) does not import torch: which device a
run gets, and whether CUDA works there, is headstart.devices' (`resolve_device`), asked when
the run starts.
"""

from __future__ import annotations

import re

# The dtypes a model loads in (headstart.models.from_pretrained_kwargs: `getattr(torch, name)`).
DTYPES = ("float32", "bfloat16", "float16", "float64")
# The device types torch.device parses (c10's DeviceType names), each with an optional ":N".
DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "meta", "hpu", "mtia", "maia", "xla", "lazy", "ipu", "hip", "ve",
                "fpga", "vulkan", "mkldnn", "opengl", "opencl", "ideep", "privateuseone")
DEVICE_NAME = re.compile(rf"(?:{'|'.join(DEVICE_TYPES)})(?::\d+)?")


def check_dtype(dtype: str | None, setting: str = "dtype") -> None:
    """Refuse a dtype name the loader would fail on only once it loads (None: the device's default).

    Args:
        dtype (str | None): the dtype name ("bfloat16", "float32"), or None.
        setting (str): the setting's name, for the message.
    """
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"{setting}={dtype!r}: use {', '.join(DTYPES)} (or leave it unset: bfloat16 on GPU, "
                         "float32 on CPU)")


def check_device(device: str | None, setting: str = "device") -> None:
    """Refuse, at configuration time, a device name torch cannot parse. Whether CUDA works is
    the machine's, not the configuration's (slurm/pipeline.sh validates recipes on a login node
    without GPUs): `headstart.devices.resolve_device` checks it when the run starts.

    Args:
        device (str | None): the device name ("cpu", "cuda", "cuda:1"), or None.
        setting (str): the setting's name, for the message.
    """
    if device is not None and not DEVICE_NAME.fullmatch(device):
        raise ValueError(f"{setting}={device!r} is not a torch device (cpu, cuda, cuda:N, mps)")
