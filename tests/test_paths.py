"""headstart.paths: one home for where things are, and the install that holds only the library."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from headstart.paths import CHECKOUT, DATA_DIR, RECIPES_DIR, outputs_dir, resolve_path, safe_name


def test_the_checkout_holds_the_recipes_and_the_vendored_data():
    assert (CHECKOUT / "pyproject.toml").is_file() and RECIPES_DIR.is_dir() and DATA_DIR.is_dir()
    assert outputs_dir("train", "smollm2_prefix") == Path("outputs/train/smollm2_prefix")


def test_a_relative_path_falls_back_to_the_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_path("data/mbpp/mbpp.jsonl") == CHECKOUT / "data" / "mbpp" / "mbpp.jsonl"
    (tmp_path / "data").mkdir()
    assert resolve_path("data") == Path("data")  # the working directory's own comes first
    assert resolve_path("absent.jsonl") == Path("absent.jsonl")


def test_a_model_name_becomes_one_file_name_part():
    assert safe_name("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB_SmolLM2-135M-Instruct"
    assert safe_name("/tmp/a b//model") == "_tmp_a_b_model"
    assert len(safe_name("x" * 200)) == 80


def outside_the_checkout(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *argv], cwd=tmp_path, env=dict(env, OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=300)


def test_only_the_library_is_installed(tmp_path):
    assert outside_the_checkout(tmp_path, "-c", "import headstart.paths").returncode == 0
    for application in ("eval", "train", "data_builders"):
        result = outside_the_checkout(tmp_path, "-c", f"import {application}")
        assert f"No module named '{application}'" in result.stderr, (application, result.stderr)


def test_a_script_run_as_a_file_finds_the_checkouts_applications(tmp_path):
    result = outside_the_checkout(tmp_path, str(CHECKOUT / "benchmarks" / "lookup_bound.py"), "--help")
    assert result.returncode == 0 and "usage" in result.stdout, result.stderr
