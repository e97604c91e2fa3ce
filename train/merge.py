"""Fold a LoRA adapter into its base weights: `python -m train.merge adapter=DIR output=DIR`.

The merged directory is a plain transformers model (with its tokenizer), so
`headstart.models.load_model(output)` and any serving stack load it directly.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from headstart.config import run_cli
from headstart.models import load_model


@dataclass
class MergeArgs:
    adapter: str = field(default="", metadata={"help": "LoRA adapter directory (adapter_config.json names the base)"})
    output: str = field(default="", metadata={"help": "directory for the merged model"})
    dtype: str = field(default="float32", metadata={"help": "dtype of the merged weights: float32 or bfloat16"})


def merge_adapter(adapter_dir: str | Path, output_dir: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Load base + adapter on CPU, merge, save model and tokenizer to `output_dir`."""
    loaded = load_model(str(adapter_dir), merge=True, dtype=dtype, device="cpu")
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    loaded.model.save_pretrained(output)
    loaded.tokenizer.save_pretrained(output)
    return output


DTYPES = ("float32", "bfloat16", "float16")


def run(args: MergeArgs) -> Path:
    """Check the arguments, then merge; every check runs before the base model loads."""
    if not args.adapter or not args.output:
        raise ValueError("usage: python -m train.merge adapter=DIR output=DIR [dtype=float32|bfloat16|float16]")
    if args.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {args.dtype!r}")
    if not (Path(args.adapter).expanduser() / "adapter_config.json").is_file():
        raise FileNotFoundError(f"adapter={args.adapter}: not a LoRA adapter directory (no adapter_config.json)")
    output = merge_adapter(args.adapter, args.output, getattr(torch, args.dtype))
    print(output)
    return output


def main(argv: list[str] | None = None) -> int:
    return run_cli(MergeArgs, run, argv)


if __name__ == "__main__":
    sys.exit(main())
