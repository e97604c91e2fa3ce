"""Where things are: the recipes and vendored data shipped with headstart, and the default outputs.

headstart, eval, train and data_builders are installed packages (editable from a checkout,
or from a wheel). The recipes (`recipes/`) and the vendored data sets (`data/`) are package
data of headstart: they sit next to this module, wherever it is installed, so one rule
finds them from a checkout, an editable install and a wheel alike.

Default outputs go under `outputs/` in the working directory (the checkout root,
where the documented commands run); `outputs_dir` spells each default.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent  # the headstart package's own folder
RECIPES_DIR = PACKAGE_DIR / "recipes"
DATA_DIR = PACKAGE_DIR / "data"  # vendored data sets (sources and licenses in its README.md)
# The folder holding the installed packages: a checkout's root (editable install) or site-packages
# (wheel). The applications' own files (data_builders/embedded/) are found from here.
INSTALL_ROOT = PACKAGE_DIR.parent
OUTPUTS = Path("outputs")  # relative: under the working directory


def outputs_dir(*parts: str) -> Path:
    """A default output location: `outputs/<parts...>` under the working directory.

    Args:
        parts (str): the path's parts under `outputs/`, outermost first.
    """
    return OUTPUTS.joinpath(*parts)


def safe_name(name: str, keep: int = 80) -> str:
    """A model name or path as one file-name part: each run of characters other than letters,
    digits, `.`, `_` and `-` becomes `_`; the last `keep` characters (where names differ).

    Args:
        name (str): a model's hub id or local path.
        keep (int): the most characters kept, counted from the end.
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[-keep:]


def is_default_output(path: str) -> bool:
    """Whether a path names a default output location (`outputs/...`): local, never a hub id.

    Args:
        path (str): a model's path or hub id, as configured.
    """
    return Path(path).parts[:1] == OUTPUTS.parts


def resolve_path(path: str | Path) -> Path:
    """A relative path as given when it exists from the working directory, else from the headstart
    package (its `recipes/` and `data/`), else from the folder holding the packages.

    Args:
        path (str | Path): a file or folder; `data/mbpp/mbpp.jsonl` and `data_builders/embedded/requests.jsonl`
            work from any directory. Absolute paths, and paths found nowhere, come back as given.
    """
    candidate = Path(path).expanduser()
    if candidate.exists() or candidate.is_absolute():
        return candidate
    for root in (PACKAGE_DIR, INSTALL_ROOT):
        if (root / candidate).exists():
            return root / candidate
    return candidate
