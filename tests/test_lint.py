"""The tree is clean under the project's linter configuration (ruff.toml)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_reports_nothing():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: `pip install -e .[dev]` installs the pinned one")
    result = subprocess.run([ruff, "check", "--output-format", "concise", "."], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
