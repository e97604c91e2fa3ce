"""Fold a LoRA adapter into its base weights: `python -m train.merge adapter=DIR output=DIR`.

The merged directory is a plain transformers model (with its tokenizer and the
adapter's training record, `headstart.json`), so `headstart.models.load_model(output)`
and any serving stack load it directly.

The merge runs in float32 and saves float32 by default. LoRA deltas are small
(order 1e-4 at lr 2e-5) beside weights of order 1e-2, whose bfloat16 spacing is
about 1e-4: added and rounded in bfloat16, most of the adaptation is lost. Saving
`dtype=bfloat16` keeps the merge in float32 but rounds its result (say so when you
choose it); the adapter directory stays the exact form.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from headstart.config import run_cli
from headstart.device_names import check_dtype
from headstart.model_files import is_adapter_dir
from headstart.models import load_model
from headstart.prompts import TRAINING_RECORD
from headstart.run_config import AdapterSetting, DtypeSetting


@dataclass
class MergeArgs(DtypeSetting, AdapterSetting):
    """Fold `adapter` (its adapter_config.json names the base) into its base weights, saved in `dtype` (the
    merge runs on the CPU in float32: unset saves float32; bfloat16 rounds away much of a small adapter)."""

    output: str = field(default="", metadata={"help": "directory for the merged model"})


def merge_adapter(adapter_dir: str | Path, output_dir: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Load base + adapter on CPU in float32, merge, save model (in `dtype`), tokenizer and the
    adapter's training record to `output_dir`.

    Args:
        adapter_dir (str | Path): the LoRA adapter's directory.
        output_dir (str | Path): where the merged model is written (created).
        dtype (torch.dtype): the dtype the merged weights are saved in.
    """
    loaded = load_model(str(adapter_dir), merge=True, dtype=torch.float32, device="cpu")
    model = loaded.model if dtype == torch.float32 else loaded.model.to(dtype)
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output)
    loaded.tokenizer.save_pretrained(output)
    record = Path(adapter_dir) / TRAINING_RECORD
    if record.is_file():
        shutil.copyfile(record, output / TRAINING_RECORD)
    return output


def run(args: MergeArgs) -> Path:
    """Check the arguments, then merge; every check runs before the base model loads.

    Args:
        args (MergeArgs): the adapter, output directory and dtype.
    """
    if not args.adapter or not args.output:
        raise ValueError("usage: python -m train.merge adapter=DIR output=DIR [dtype=float32|bfloat16|float16]")
    check_dtype(args.dtype)
    if not is_adapter_dir(args.adapter):
        raise FileNotFoundError(f"adapter={args.adapter}: not a LoRA adapter directory (no adapter_config.json)")
    output = merge_adapter(args.adapter, args.output, getattr(torch, args.dtype or "float32"))  # the CPU's default
    print(output)
    return output


def main(argv: list[str] | None = None) -> int:
    """The command line's entry point; returns the exit code.

    Args:
        argv (list[str] | None): `adapter=DIR output=DIR [dtype=...]`; None: `sys.argv[1:]`.
    """
    return run_cli(MergeArgs, run, argv)


if __name__ == "__main__":
    sys.exit(main())
