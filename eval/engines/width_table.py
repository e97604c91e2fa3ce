"""What a forward costs by its width, on one machine for one model (`decode.width_cost`).

A forward that feeds w tokens after a cached context costs about what a one-token step
does on a GPU at batch 1 (memory-bound), but several times more on a CPU (compute-bound). PROTOCOL.md counts every forward as one,
whatever its width; the wall clock pays the width. So the table is measured once per
machine and model (`python -m eval.width_cost`, or `decode.width_cost=auto` when the
evaluator loads the model), kept as a small JSON file, and reused by
- the lookup chooser (`decode.lookup_choice=cost`, eval/engines/cost_choice.py), which
  picks each forward's tree size and block length by expected tokens per second;
- the typing simulation (eval/evaluation/typing_sim.py), which turns forwards into seconds.
Both use only ratios to a one-token step (`relative`): the simulation calibrates the
absolute rate on each request's own measured baseline.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

from headstart.files import read_json_file
from headstart.paths import outputs_dir, safe_name

WIDTHS = (1, 2, 3, 5, 9, 17, 33, 65, 129, 257)  # a step, then proposals of 1..256 tokens after the last token
CONTEXT = 256  # cached tokens before the measured forward: a prompt and part of an answer
AUTO = "auto"


@dataclass(frozen=True)
class WidthCost:
    """Median seconds of one forward by the tokens it feeds (`widths`, ascending, starting at 1),
    after `context` cached tokens, measured for `model` on `machine`."""

    widths: tuple[int, ...]
    seconds: tuple[float, ...]
    context: int
    model: str
    machine: str

    def __post_init__(self) -> None:
        if not self.widths or self.widths[0] != 1 or list(self.widths) != sorted(set(self.widths)):
            raise ValueError(f"a width-cost table needs ascending distinct widths starting at 1, not {list(self.widths)}")
        if len(self.seconds) != len(self.widths) or not all(s > 0 for s in self.seconds):
            raise ValueError("a width-cost table needs one positive number of seconds per width")

    def seconds_for(self, width: int) -> float:
        """Seconds of a forward of `width` tokens: linear between measured widths, and past the
        widest along its last segment (never below the widest's cost).

        Args:
            width (int): the forward's width in tokens.
        """
        if width < 1:
            raise ValueError(f"a forward feeds at least one token, not {width}")
        points = list(zip(self.widths, self.seconds))
        for (w0, s0), (w1, s1) in zip(points, points[1:]):
            if width <= w1:
                return s0 + (s1 - s0) * (width - w0) / (w1 - w0)
        if len(points) == 1:
            return points[0][1]
        (w0, s0), (w1, s1) = points[-2], points[-1]
        return max(s1, s1 + (s1 - s0) * (width - w1) / (w1 - w0))

    def relative(self, width: int) -> float:
        """The cost of a `width`-token forward in one-token steps.

        Args:
            width (int): the forward's width in tokens.
        """
        return self.seconds_for(width) / self.seconds[0]

    def save(self, path: Path) -> None:
        """Write the table to `path` as JSON, atomically.

        Args:
            path (Path): the file to write.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self), indent=1) + "\n")
        os.replace(temporary, path)  # a reader never sees half a table

    @classmethod
    def load(cls, path: str | Path) -> WidthCost:
        """A table written by `save`; a clear error for a missing or malformed file.

        Args:
            path (str | Path): the table's JSON file.
        """
        try:
            values = read_json_file(path)
        except FileNotFoundError:
            raise ValueError(f"decode.width_cost={path}: no such file (python -m eval.width_cost writes one; "
                             "decode.width_cost=auto measures this machine's)") from None
        except (OSError, ValueError) as error:  # not UTF-8, not JSON: the error names the file
            raise ValueError(f"decode.width_cost={path}: not a readable width-cost table ({error})") from None
        fields = ("widths", "seconds", "context", "model", "machine")
        if not isinstance(values, dict) or any(key not in values for key in fields):
            raise ValueError(f"decode.width_cost={path}: a width-cost table needs the fields {', '.join(fields)}")
        return cls(tuple(values["widths"]), tuple(values["seconds"]), values["context"], values["model"], values["machine"])


def machine_label(device: str) -> str:
    """The machine a table holds for: the device type, the processor and the threads torch uses.

    Args:
        device (str): the device the table is measured on.
    """
    import torch

    if torch.device(device).type == "cuda":
        return f"cuda-{torch.cuda.get_device_name(torch.device(device))}"
    return f"cpu-{cpu_name()}-{torch.get_num_threads()}threads"


def cpu_name() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else its architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def auto_path(model: str, device: str) -> Path:
    """Where `decode.width_cost=auto` keeps this machine's table for `model`.

    Args:
        model (str): the model's name.
        device (str): the device the table is measured on.
    """
    return outputs_dir("width_cost", f"{safe_name(model)}-{safe_name(machine_label(device))}.json")
