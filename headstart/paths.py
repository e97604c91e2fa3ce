"""Where things are: the checkout, its recipes and vendored data, and the default outputs.

headstart is installed editable (`pip install -e .`) from a checkout; only the
`headstart` library is installed. The applications beside it (eval/, train/,
data_builders/, benchmarks/, scripts/, slurm/) run from that checkout: `python -m
eval ...` from its root, or a script as a file (`accelerate launch train/sft.py`),
which calls `use_checkout()` before importing them.

Default outputs go under `outputs/` in the working directory (the checkout root,
where the documented commands run); `outputs_dir` spells each default.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent  # the repository root
RECIPES_DIR = CHECKOUT / "recipes"
DATA_DIR = CHECKOUT / "data"  # vendored data sets (sources and licenses in data/README.md)
OUTPUTS = Path("outputs")  # relative: under the working directory


def outputs_dir(*parts: str) -> Path:
    """A default output location: `outputs/<parts...>` under the working directory."""
    return OUTPUTS.joinpath(*parts)


def safe_name(name: str, keep: int = 80) -> str:
    """A model name or path as one file-name part: each run of characters other than letters,
    digits, `.`, `_` and `-` becomes `_`; the last `keep` characters (where names differ)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[-keep:]


def is_default_output(path: str) -> bool:
    """Whether a path names a default output location (`outputs/...`): local, never a hub id."""
    return Path(path).parts[:1] == OUTPUTS.parts


def resolve_path(path: str | Path) -> Path:
    """A relative path as given when it exists from the working directory, else from the
    checkout: `data/mbpp/mbpp.jsonl` works from any directory."""
    candidate = Path(path).expanduser()
    if candidate.exists() or candidate.is_absolute():
        return candidate
    in_checkout = CHECKOUT / candidate
    return in_checkout if in_checkout.exists() else candidate


def use_checkout() -> None:
    """Make the checkout's applications (eval, train, data_builders) importable from a script
    run as a file: its own folder is sys.path[0], not the root. The root goes first; a script
    folder that is itself a package (train/) is dropped, so `train/data.py` is only `train.data`."""
    if sys.path and sys.argv and sys.argv[0]:
        first, script = Path(sys.path[0] or ".").resolve(), Path(sys.argv[0]).resolve()
        if script.parent == first and first.parent == CHECKOUT and (first / "__init__.py").is_file():
            sys.path.pop(0)
    if str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))
