"""A checkout stands alone: the real data is vendored in headstart/data/ with its licenses and
checksums, one registry says what each file is for both the evaluation loaders and the
decontamination filter, and nothing local ever waits on the hub."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from headstart.benchmark_registry import DATA, EVALUATION_SETS
from headstart.paths import DATA_DIR, resolve_path

CHECKOUT = Path(__file__).resolve().parents[1]  # the checkout under test

# Spelled in pieces so that this file does not match itself.
OUTSIDE = re.compile("|".join([re.escape(".." + "/shared"), re.escape("shared" + "/data"),
                               r"""["']shared["']\s*/\s*["']data["']"""]))
# Ignored by .gitignore: what a plain copy of a working tree may hold beside the sources.
IGNORED_DIRS = {".git", "outputs", "__pycache__", ".pytest_cache", ".venv", "wandb", "runs", "build", "logs"}


def project_files() -> list[Path]:
    """Tracked and untracked-but-not-ignored files (git), else every file outside ignored dirs."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=CHECKOUT, capture_output=True, check=True).stdout
        return [CHECKOUT / name for name in listed.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):  # a copy without .git
        files = []
        for root, dirs, names in os.walk(CHECKOUT):
            dirs[:] = [d for d in dirs if d not in IGNORED_DIRS and not d.endswith(".egg-info")]
            files += [Path(root) / name for name in names]
        return files


def test_no_file_refers_to_data_outside_the_repository():
    offending = []
    for path in project_files():
        if not path.is_file():
            continue  # deleted in the working tree
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary: the gzipped DS-1000, images
        offending += [f"{path.relative_to(CHECKOUT)}:{number}: {line.strip()}"
                      for number, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]
    assert not offending, "\n".join(offending)


def readme_checksums() -> dict[str, str]:
    block = (DATA_DIR / "README.md").read_text().split("SHA-256")[-1]
    return {name: digest for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", block, re.MULTILINE)}


def test_every_vendored_file_is_listed_with_its_checksum_and_license():
    sums = readme_checksums()
    locals_ = {source.local for source in DATA.values() if source.local}
    assert locals_ <= set(sums), "a registry file is missing from headstart/data/README.md"
    data_files = {str(p.relative_to(DATA_DIR)) for p in DATA_DIR.rglob("*") if p.is_file()}
    assert data_files - {"README.md"} - {f for f in data_files if f.endswith("LICENSE")} == set(sums)
    for name, digest in sums.items():
        assert hashlib.sha256((DATA_DIR / name).read_bytes()).hexdigest() == digest, name
        assert (DATA_DIR / name.split("/")[0] / "LICENSE").is_file(), name
    readme = (DATA_DIR / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in sums)


def test_offline_recipes_read_the_vendored_copies():
    from eval.evaluation.config import EvalConfig
    from headstart.config import load_config

    paths = load_config(EvalConfig, ["recipe=suite_smollm2"]).data_paths
    pieces = [piece for value in paths.values() for piece in value.split(",")]
    assert any(piece.startswith("data/") for piece in pieces)
    for piece in pieces:
        path = resolve_path(piece).resolve()
        assert path.exists() and path.is_relative_to(CHECKOUT), piece


def test_loaders_and_decontamination_read_one_registry():
    from data_builders.config import DecontaminationConfig
    from data_builders.decontamination import KNOWN_BENCHMARKS
    from data_builders.sources import SOURCES
    from eval.benchmarks import BENCHMARKS, canitedit, chat, coedit, ds1000, mbpp
    from headstart.benchmark_registry import MBPP_TRAIN_IDS

    assert sorted(n for entry in BENCHMARKS.values() for n in entry.sources) == sorted(EVALUATION_SETS)
    files = [DATA[n].local for entry in BENCHMARKS.values() for n in entry.sources if DATA[n].local]
    assert files and all((DATA_DIR / file).is_file() for file in files), files
    assert KNOWN_BENCHMARKS == list(EVALUATION_SETS) == DecontaminationConfig().benchmarks
    used = {"mbpp": mbpp.SOURCE, "canitedit": canitedit.SOURCE, "ds1000": ds1000.SOURCE, "coedit": coedit.SOURCE,
            "chat": chat.ULTRACHAT}
    for name, source in used.items():
        assert source is DATA[BENCHMARKS[name].sources[0]], name
    assert (chat.MT_BENCH, chat.MT_BENCH_REFERENCE) == (DATA["mt_bench"], DATA["mt_bench_reference"])
    assert DATA["mbpp_test"].ids == range(11, 511) and MBPP_TRAIN_IDS == range(601, 975)
    assert (SOURCES["mbpp"].hub_id, SOURCES["mbpp"].hub_config, SOURCES["mbpp"].split) == (
        DATA["mbpp_train"].hub_id, "full", "train")


def test_every_evaluated_request_is_caught_by_the_decontamination_index(data_dir):
    """Each benchmark's requests, as its loader gives them, are flagged by the index the
    data builders build from the registry entries of that benchmark: they read the same data."""
    from data_builders.decontamination import build_index
    from eval.benchmarks import BENCHMARKS, get_benchmark

    files = {"humaneval": None, "mbpp": "mbpp/mbpp.jsonl", "canitedit": "canitedit/canitedit.jsonl",
             "ds1000": "ds1000/ds1000.jsonl.gz", "chat": "mt_bench"}
    for benchmark, local in files.items():
        requests = get_benchmark(benchmark, local and str(data_dir / local)).load()
        index, skipped = build_index([n for n in BENCHMARKS[benchmark].sources if n != "ultrachat"], data_dir, [], 13,
                                     on_missing="error", hub=False)
        flags = index.check_batch([r.text for r in requests], [None] * len(requests))
        assert requests and all(flags), (benchmark, [r.request_id for r, f in zip(requests, flags) if not f][:5])
    sanitized = get_benchmark("mbpp", str(data_dir / "mbpp/sanitized-mbpp.json")).load()
    index, _ = build_index(["mbpp_sanitized_test"], data_dir, [], 13, on_missing="error", hub=False)
    assert len(sanitized) == 257 and all(index.check_batch([r.text for r in sanitized], [None] * len(sanitized)))


@pytest.fixture
def no_network(monkeypatch):
    """Any hub lookup or name resolution fails the test at once."""
    import datasets

    def refuse(*args, **kwargs):
        raise AssertionError(f"network or hub access: {args[:2]}")

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_local_files_never_touch_the_hub(no_network):
    from eval.benchmarks import get_benchmark
    from eval.evaluation.config import EvalConfig
    from headstart.config import load_config

    config = load_config(EvalConfig, ["recipe=suite_smollm2"])
    for name in config.benchmarks:
        assert get_benchmark(name, config.data_paths.get(name)).load(limit=2), name


def test_the_embedded_build_decontaminates_offline_without_a_hub_lookup(no_network, tmp_path):
    """recipe=embedded_prefix checks every evaluation set with a local copy and records the
    two without one (CoEdIT, UltraChat) as skipped, never asking the hub for them."""
    from data_builders.build import _index
    from data_builders.config import BuildConfig
    from data_builders.report import Report
    from headstart.config import load_config

    config = load_config(BuildConfig, ["recipe=embedded_prefix", f"output_dir={tmp_path}"])
    assert config.decontamination.hub is False and config.decontamination.data_dir is None
    report = Report()
    _index(config, report)
    assert report.decontamination["skipped"] == ["coedit", "ultrachat"]
    assert set(report.decontamination["texts"]) == set(EVALUATION_SETS) - {"coedit", "ultrachat"}
