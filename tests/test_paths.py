"""headstart.paths: one home for where things are; the packages, with their recipes and data, run from a wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import headstart
from headstart.paths import DATA_DIR, INSTALL_ROOT, RECIPES_DIR, outputs_dir, resolve_path, safe_name

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("headstart", "eval", "train", "data_builders")


def test_the_package_holds_the_recipes_and_the_vendored_data():
    package = Path(headstart.__file__).resolve().parent
    assert RECIPES_DIR == package / "recipes" and DATA_DIR == package / "data"
    assert RECIPES_DIR.is_dir() and DATA_DIR.is_dir()
    assert outputs_dir("train", "smollm2_prefix") == Path("outputs/train/smollm2_prefix")


def test_a_relative_path_falls_back_to_the_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_path("data/mbpp/mbpp.jsonl") == DATA_DIR / "mbpp" / "mbpp.jsonl"
    assert resolve_path("data_builders/embedded/requests.jsonl") == INSTALL_ROOT / "data_builders/embedded/requests.jsonl"
    (tmp_path / "data").mkdir()
    assert resolve_path("data") == Path("data")  # the working directory's own comes first
    assert resolve_path("absent.jsonl") == Path("absent.jsonl")


def test_a_model_name_becomes_one_file_name_part():
    assert safe_name("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB_SmolLM2-135M-Instruct"
    assert safe_name("/tmp/a b//model") == "_tmp_a_b_model"
    assert len(safe_name("x" * 200)) == 80


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory) -> Path:
    """The project built as a wheel (from a copy of its sources: no build folder of the checkout's
    leaks in) and installed, without dependencies, into a folder of its own."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(source)],
                   check=True, capture_output=True, timeout=300)
    site = root / "site"
    wheels = sorted((root / "dist").glob("headstart-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), *map(str, wheels)],
                   check=True, capture_output=True, timeout=300)
    return site


def from_the_wheel(site: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    """`python argv...` in `cwd` (outside the checkout) with only the wheel's packages on PYTHONPATH."""
    env = dict(os.environ, PYTHONPATH=str(site), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_applications_and_their_recipes_run_from_a_wheel(wheel_site, tmp_path):
    for module in ("eval", "data_builders", "train.sft"):
        result = from_the_wheel(wheel_site, tmp_path, "-m", module, "--help")
        assert result.returncode == 0 and f"usage: python -m {module} " in result.stdout, result.stderr
    found = from_the_wheel(wheel_site, tmp_path, "-c", "from headstart.config import find_recipe; "
                           "from headstart.paths import resolve_path; print(find_recipe('smollm2_prefix')); "
                           "print(resolve_path('data/mbpp/mbpp.jsonl')); "
                           "print(resolve_path('data_builders/embedded/requests.jsonl'))")
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [str(wheel_site / "headstart/recipes/train/smollm2_prefix.yaml"),
                                    str(wheel_site / "headstart/data/mbpp/mbpp.jsonl"),
                                    str(wheel_site / "data_builders/embedded/requests.jsonl")]
    assert (wheel_site / "eval/serving/live_page/index.html").is_file()
    assert (wheel_site / "headstart/data/README.md").is_file() and (wheel_site / "headstart/data/mbpp/LICENSE").is_file()


@pytest.mark.slow
def test_a_script_run_as_a_file_imports_the_installed_applications(wheel_site, tmp_path):
    # A benchmark (not installed) and train/sft.py as `accelerate launch train/sft.py` runs it: its own
    # folder first on sys.path, every import absolute, so the wheel's packages are what it imports.
    for script in ("benchmarks/lookup_bound.py", "train/sft.py"):
        result = from_the_wheel(wheel_site, tmp_path, str(REPO / script), "--help")
        assert result.returncode == 0 and "usage" in result.stdout, (script, result.stderr)
