"""`python -m eval.width_cost model=NAME`: measure what a forward costs by its width on this
machine (eval/engines/width_measure.py) and keep the table where `decode.width_cost=auto` finds it."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from headstart.config import run_cli
from headstart.run_config import ModelOnDevice


@dataclass
class WidthCostConfig(ModelOnDevice):
    """One model's width-cost table on this machine."""

    repeats: int = field(default=5, metadata={"help": "Timed forwards per width (the median is kept), after one warm-up."})
    output: str | None = field(
        default=None,
        metadata={"help": "Table file; default the one decode.width_cost=auto reads "
                          "(outputs/width_cost/<model>-<machine>.json)."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # device, dtype
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, not {self.repeats}")


def measure_table(config: WidthCostConfig) -> None:
    """Measure, write, and print the table (seconds and steps per width).

    Args:
        config (WidthCostConfig): the model, device, repeats and output file.
    """
    from pathlib import Path

    from eval.engines.width_measure import measure
    from eval.engines.width_table import auto_path
    from headstart.models import load_model

    loaded = load_model(config.model, dtype=config.dtype, device=config.device)
    table = measure(loaded.model, config.model, repeats=config.repeats)
    path = Path(config.output) if config.output else auto_path(config.model, str(loaded.model.device))
    table.save(path)
    print(f"{table.model} on {table.machine}, after {table.context} cached tokens:\n")
    print("| tokens fed | seconds | one-token steps |\n|---|---|---|")
    for width, seconds in zip(table.widths, table.seconds):
        print(f"| {width} | {seconds:.4f} | {table.relative(width):.2f} |")
    print(f"\ntable: {path}")


def main(argv: list[str] | None = None) -> int:
    """The command line's entry point; returns the exit code.

    Args:
        argv (list[str] | None): `model=NAME` and `key=value` overrides; None: `sys.argv[1:]`.
    """
    return run_cli(WidthCostConfig, measure_table, argv)


if __name__ == "__main__":
    sys.exit(main())
