"""The settings many entry points share, declared once: which model a run loads, on which device
and in which dtype.

A schema takes them by inheriting (OmegaConf's structured configs merge inherited fields), so
the command line keeps its flat keys (`model=`, `device=`, `dtype=`) and every schema checks
them the same way, before anything loads. Torch-free: building a config (and `--help`) imports
no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from headstart.device_names import check_device, check_dtype
from headstart.prompts import check_prompt_format


@dataclass
class ModelSetting:
    """The `model` key: what a run loads."""

    model: str = field(default="smollm2", metadata={"help": "Model: embedded name, hub id, local dir, .gguf or adapter dir."})


@dataclass
class DeviceSetting:
    """The `device` key: where a run computes. The schema that holds it checks it (`check_device`, under
    the key's full name); whether CUDA works there is asked when the run starts."""

    device: str | None = field(default=None, metadata={"help": "Torch device; default cuda when available, else cpu."})


@dataclass
class ModelOnDevice(DeviceSetting, ModelSetting):
    """The `model`, `device` and `dtype` keys (in that order) of a run that loads a model."""

    dtype: str | None = field(default=None, metadata={"help": "Torch dtype name; default bfloat16 on GPU, float32 on CPU."})

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        check_device(self.device)


@dataclass
class AdaptedModelOnDevice(ModelOnDevice):
    """A model on a device with a LoRA adapter on it, and the system message and format its prompts get
    (`python -m eval` and the verifier study: the same keys, with the same meaning)."""

    adapter: str | None = field(default=None, metadata={"help": "Optional LoRA adapter directory applied to `model`."})
    system_prompt: str = field(
        default="model",
        metadata={"help": "headstart.prompts setting: model (what the adapter/merged dir records; else none), incomplete, "
                          "none, or literal text"},
    )
    prompt_format: str = field(
        default="auto",
        metadata={"help": "auto (what the adapter records, else completion for an embedded base model, else chat), chat, "
                          "or completion (a base model: the request's text in its benchmark's frame; headstart.completion)"},
    )

    def __post_init__(self) -> None:
        check_prompt_format(self.prompt_format)
        super().__post_init__()
