"""Shared fixtures: tiny random models built on the spot, never fetched from a hub.

The tokenizer is a byte-level BPE trained here on HumanEval prompts, so every
test request tokenizes into realistic pieces; the models are randomly
initialised Qwen3 and Llama networks small enough to decode hundreds of tokens
per second on one core (scripts/device_check/tiny_models.py builds both, for the device check too).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from device_check.tiny_models import build_tiny_model, build_tiny_tokenizer

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Tiny models run fastest on one thread, and CI's two cores are shared with subprocesses.
torch.set_num_threads(1)

@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny_tokenizer")
    build_tiny_tokenizer(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3"), "qwen3", tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_llama"), "llama", tiny_tokenizer, seed=1)


@pytest.fixture(scope="session")
def tiny_qwen3_ending_dir(tmp_path_factory, tiny_qwen3_dir, tiny_tokenizer) -> Path:
    """The tiny Qwen3 made to end its answers: its end-of-turn row of the output layer is the
    row of a token it writes often ("umber"), scaled up by 0.1%, so greedy decoding ends where
    it would have written that token. Some answers end within a few tokens, others run to
    any small cap: both kinds of self-distilled answer occur."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32)
    often = tiny_tokenizer.convert_tokens_to_ids("umber")
    assert often is not None and often != tiny_tokenizer.unk_token_id
    with torch.no_grad():
        model.lm_head.weight[tiny_tokenizer.eos_token_id] = model.lm_head.weight[often] * 1.001
    directory = tmp_path_factory.mktemp("tiny_qwen3_ending")
    model.save_pretrained(directory)
    tiny_tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def cpu_width_table(tmp_path_factory) -> Path:
    """A width-cost table as measured for SmolLM2-135M on the 2-core development CPU (seconds
    after 300 cached tokens, docs/results.md): a wide forward costs 2-7 steps. Fixed numbers,
    so that what the cost chooser picks does not depend on this machine's noise."""
    from eval.engines.width_table import WidthCost

    path = tmp_path_factory.mktemp("width_cost") / "cpu.json"
    WidthCost((1, 2, 9, 17, 33, 65, 129), (0.091, 0.168, 0.207, 0.248, 0.309, 0.437, 0.601), 300, "smollm2",
              "cpu-development-2threads").save(path)
    return path


@pytest.fixture(scope="session", params=["qwen3", "llama"])
def tiny_model_dir(request, tiny_qwen3_dir, tiny_llama_dir) -> Path:
    """Each tiny family in turn."""
    return tiny_qwen3_dir if request.param == "qwen3" else tiny_llama_dir


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real public data vendored in the repository (`headstart/data/`, see its README.md).
    It is part of every checkout: a missing file is a failure, never a skip."""
    from headstart.paths import DATA_DIR

    assert DATA_DIR.is_dir(), f"the vendored data folder is missing: {DATA_DIR}"
    return DATA_DIR


@pytest.fixture(scope="session")
def tiny_refusion_dir(tmp_path_factory, tiny_qwen3_dir) -> Path:
    """The tiny Qwen3 with ReFusion's begin and mask tokens added (seeded: the new
    embeddings are drawn at random around the old ones)."""
    from headstart.models import load_model
    from headstart.refusion import add_refusion_tokens

    loaded = load_model(str(tiny_qwen3_dir), device="cpu")
    torch.manual_seed(0)
    add_refusion_tokens(loaded.model, loaded.tokenizer)
    directory = tmp_path_factory.mktemp("tiny_refusion")
    loaded.model.save_pretrained(directory)
    loaded.tokenizer.save_pretrained(directory)
    return directory


# --- Work units for pytest-xdist (scripts/test.sh runs `-n 4 --dist loadgroup`) ----------------
# A unit runs whole on one worker, one test at a time. By default a unit is a file, so its module
# fixtures are built once. Tests that share a machine resource form one unit whatever their file:
# - slurm-a, slurm-b: two streams of jobs on the local four-node cluster (scripts/slurm_local.sh), side
#   by side: a stream's jobs take at most two nodes, so the other stream's --exclusive jobs find two
#   free. test_slurm_local.py stops and restarts the cluster: it holds the cluster's lock alone
#   (`slurm_cluster_lock`), the other Slurm tests share it;
# - torchrun: multi-process or DeepSpeed launches, whose rendezvous takes torch's default port 29500.
SLURM_STREAMS = {  # every other Slurm test is in slurm-b
    "slurm-a": {"test_slurm_local.py", "test_slurm.py::test_pipeline_chains_data_train_and_before_after_eval",
                "test_slurm.py::test_usr1_saves_a_checkpoint_requeues_and_resumes_to_the_uninterrupted_adapter",
                "test_slurm_eval.py::test_a_failed_shard_cancels_the_merge_job"},
}
TORCHRUN_FILES = {"test_train_cluster.py", "test_train_distributed.py", "test_device_check.py"}
# Files whose tests start separate expensive engines: one unit per set of module fixtures used
# (test_vllm_backend: the evaluator's vLLM engine, the data build's, the LoRA one), so that the
# two workers can run them side by side.
SPLIT_BY_MODULE_FIXTURES = {"test_vllm_backend.py"}


def work_unit(item: pytest.Item) -> str:
    if item.get_closest_marker("slurm"):
        name = f"{item.path.name}::{item.originalname}"
        stream = next((s for s, tests in SLURM_STREAMS.items() if item.path.name in tests or name in tests), "slurm-b")
        return stream
    name = item.path.name
    if name in TORCHRUN_FILES:
        return "torchrun"
    if name in SPLIT_BY_MODULE_FIXTURES:
        definitions = item._fixtureinfo.name2fixturedefs
        shared = sorted(n for n, defs in definitions.items() if defs and defs[-1].scope == "module")
        # No brackets: xdist reads a group only from a node id whose last "@" follows its last "]"
        # (a parametrized id's brackets), so "file[a,b]" made every test a unit of its own.
        return f"{name}+{'+'.join(shared)}"
    return name


# The units that took longest on 2 cores (minutes: the Slurm streams about 7 each, vLLM's about 10
# over its units, the launches about 10, the streaming server's about 5 and the live page's 3), started
# first; the others follow, most slow tests first.
LONGEST_FIRST = ("slurm", "test_vllm_backend.py", "torchrun", "test_serving.py", "test_live.py")


def unit_order(unit: str, slow_tests: int) -> tuple[int, int]:
    rank = next((i for i, prefix in enumerate(LONGEST_FIRST) if unit.startswith(prefix)), len(LONGEST_FIRST))
    return rank, -slow_tests


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: mark each test's work unit and put the long units first. With
    --no-loadscope-reorder xdist hands units out in this order to whichever worker is free, so
    the long ones start at once and the short ones fill the end. A run without workers is left
    as collected."""
    if not hasattr(config, "workerinput"):
        return
    units = {item: work_unit(item) for item in items}
    slow = {}
    for item, unit in units.items():
        slow[unit] = slow.get(unit, 0) + (item.get_closest_marker("slow") is not None)
    # Stable: a unit keeps its order, but for test_slurm_local.py, first in its stream: it needs the cluster
    # alone, which it gets soonest while the other stream is on its first, short test.
    items.sort(key=lambda item: (*unit_order(units[item], slow[units[item]]), units[item],
                                 item.path.name != "test_slurm_local.py"))
    for item, unit in units.items():
        item.add_marker(pytest.mark.xdist_group(unit))


SLURM_LOCK = Path("/tmp/headstart-slurm-tests.lock")


@pytest.fixture(autouse=True)
def slurm_cluster_lock(request):
    """Slurm tests share the local cluster (a shared lock); test_slurm_local.py, which stops and
    restarts it, takes it alone (`exclusive_slurm_cluster`). Other tests take nothing."""
    if request.node.get_closest_marker("slurm") is None or request.node.path.name == "test_slurm_local.py":
        yield
        return
    import fcntl

    with SLURM_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        yield


@contextmanager
def exclusive_slurm_cluster():
    """The cluster to one test module alone, once every other Slurm test has let go of it."""
    import fcntl

    with SLURM_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
