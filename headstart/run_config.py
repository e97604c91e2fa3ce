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
class DtypeSetting:
    """The `dtype` key: the weights' dtype; the schema that holds it checks it (`check_dtype`)."""

    dtype: str | None = field(default=None, metadata={"help": "Torch dtype name; default bfloat16 on GPU, float32 on CPU."})


@dataclass
class ModelOnDevice(DtypeSetting, DeviceSetting, ModelSetting):
    """The `model`, `device` and `dtype` keys (in that order) of a run that loads a model."""

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        check_device(self.device)


@dataclass
class AdapterSetting:
    """The `adapter` key: a LoRA adapter on `model`."""

    adapter: str | None = field(default=None, metadata={"help": "LoRA adapter directory (its adapter_config.json names "
                                                                 "the base): on `model` where a command has one; the "
                                                                 "server merges it before serving."})


@dataclass
class SystemPromptSetting:
    """The `system_prompt` key; the schema that holds it checks it (`check_evaluation_system_setting`)."""

    system_prompt: str = field(
        default="model",
        metadata={"help": "headstart.prompts setting: model (what the adapter/merged dir records; else none), incomplete, "
                          "none, or literal text (the server adds it to a request that has no system message)"},
    )


@dataclass
class PromptFormatSetting:
    """The `prompt_format` key; the schema that holds it checks it (`check_prompt_format`)."""

    prompt_format: str = field(
        default="auto",
        metadata={"help": "auto (what the adapter records, else completion for an embedded base model, else chat), chat, "
                          "or completion (a base model: plain text in a frame, headstart.completion: the benchmark's in "
                          "evaluation, generation.completion_frame in a data build, a User/Assistant transcript in "
                          "training, the answer then EOS)"},
    )


@dataclass
class AdaptedModelOnDevice(PromptFormatSetting, SystemPromptSetting, AdapterSetting, ModelOnDevice):
    """A model on a device with a LoRA adapter on it, and the system message and format its prompts get
    (`python -m eval` and the verifier study: the same keys, with the same meaning)."""

    def __post_init__(self) -> None:
        check_prompt_format(self.prompt_format)
        super().__post_init__()
