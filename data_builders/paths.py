"""Relative paths in recipes resolve against the working directory, then the project root.

So `python -m data_builders recipe=embedded_prefix` finds the shipped files
from any directory, while a user's own relative paths keep their usual meaning.
One implementation, shared with the evaluation loaders: `headstart.benchmark_registry`.
"""

from __future__ import annotations

from headstart.benchmark_registry import PROJECT_ROOT
from headstart.benchmark_registry import resolve_path as resolve

__all__ = ["PROJECT_ROOT", "resolve"]
