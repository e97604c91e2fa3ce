"""Relative paths in recipes resolve against the working directory, then the project root.

So `python -m data_builders recipe=embedded_prefix` finds the shipped files
from any directory, while a user's own relative paths keep their usual meaning.
"""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def resolve(path: str | Path) -> Path:
    candidate = Path(path).expanduser()
    if candidate.exists() or candidate.is_absolute():
        return candidate
    in_project = PROJECT_ROOT / candidate
    return in_project if in_project.exists() else candidate
