"""What a GPU cluster would break (issue 23): loading straight to the device, no silent CPU
fallback, the paper's batch kept or refused, one device per process, the transformers version,
and the Slurm scripts' resources and --wait=0. The environment (Slurm and CUDA variables, the
installed version) is input here, set per test; this machine has no usable CUDA."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from headstart.config import load_config
from headstart.devices import (
    CudaUnusableError,
    default_device,
    environment_gpu_requests,
    idle_cores_note,
    require_cuda,
    resolve_device,
)
from headstart.models import from_pretrained_kwargs, load_model
from headstart.paths import RECIPES_DIR
from train.batch import batch_plan
from train.config import RecipeValueError, TrainRecipe

REPO = Path(__file__).resolve().parent.parent
GPU_VARIABLES = ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES")


@pytest.fixture
def no_gpu_environment(monkeypatch):
    """A machine whose CUDA is unusable (as here; on a GPU machine, as with a driver too old for
    the wheel), and an environment that asks for no GPU (each test adds what it asks)."""
    for name in (*GPU_VARIABLES, "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return monkeypatch


# --- 1. Loading straight onto the device ---------------------------------------------------------

def test_from_pretrained_kwargs_load_onto_the_device():
    assert from_pretrained_kwargs("cuda:1") == {"dtype": torch.bfloat16, "device_map": "cuda:1"}
    assert from_pretrained_kwargs("cpu") == {"dtype": torch.float32, "device_map": "cpu"}
    assert from_pretrained_kwargs("cuda", "float32") == {"dtype": torch.float32, "device_map": "cuda"}


def test_load_model_on_cpu_places_every_model_and_keeps_its_logits(tmp_path, tiny_qwen3_dir):
    """A full model, the base under an adapter and a merged model, loaded through the device map,
    give the logits of a plain load (the adapter's applied)."""
    from peft import PeftModel
    from test_before_after import make_adapter

    adapter = make_adapter(tiny_qwen3_dir, tmp_path / "adapter")
    ids = torch.tensor([[5, 17, 42, 99, 3, 250]])
    plain = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32),
                                        str(adapter)).eval()
    with torch.no_grad():
        expected = {"full": plain(ids).logits, "adapter": adapted(ids).logits}
        full = load_model(str(tiny_qwen3_dir), device="cpu").model
        under_adapter = load_model(str(adapter), device="cpu").model
        merged = load_model(str(adapter), merge=True, device="cpu").model
        assert torch.equal(full(ids).logits, expected["full"])
        assert torch.equal(under_adapter(ids).logits, expected["adapter"])
        torch.testing.assert_close(merged(ids).logits, expected["adapter"], rtol=1e-5, atol=1e-5)
    assert {p.device.type for m in (full, under_adapter, merged) for p in m.parameters()} == {"cpu"}


# --- 2. No silent CPU fallback -------------------------------------------------------------------

@pytest.mark.parametrize("name,value", [("SLURM_GPUS_ON_NODE", "8"), ("SLURM_JOB_GPUS", "0,1"),
                                        ("SLURM_STEP_GPUS", "3"), ("CUDA_VISIBLE_DEVICES", "0")])
def test_an_environment_that_hands_out_gpus_is_refused_without_cuda(no_gpu_environment, name, value):
    no_gpu_environment.setenv(name, value)
    assert environment_gpu_requests() == [f"{name}={value}"]
    with pytest.raises(CudaUnusableError) as refused:
        default_device()
    message = str(refused.value)
    assert "\n" not in message and f"{name}={value} asked for a GPU, but CUDA is unusable" in message
    assert f"torch {torch.__version__}" in message and (f"built for CUDA {torch.version.cuda}" if torch.version.cuda
                                                        else "a CPU-only build") in message


@pytest.mark.parametrize("name,value", [("CUDA_VISIBLE_DEVICES", ""), ("CUDA_VISIBLE_DEVICES", "-1"),
                                        ("CUDA_VISIBLE_DEVICES", "NoDevFiles"), ("SLURM_GPUS_ON_NODE", "0")])
def test_an_environment_that_hides_gpus_asks_for_none(no_gpu_environment, name, value):
    no_gpu_environment.setenv(name, value)
    assert environment_gpu_requests() == [] and default_device() == "cpu"


def test_an_nvidia_driver_on_the_host_asks_for_a_gpu(no_gpu_environment, tmp_path):
    """A workstation or cloud VM (no Slurm, no CUDA_VISIBLE_DEVICES) whose torch cannot use its GPU."""
    from headstart.devices import gpu_requests

    driver = tmp_path / "version"
    assert gpu_requests(driver_file=driver) == []
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.03\n")
    assert gpu_requests(driver_file=driver) == [f"an NVIDIA driver ({driver})"]
    with pytest.raises(CudaUnusableError, match="an NVIDIA driver .* asked for a GPU"):
        require_cuda(gpu_requests(driver_file=driver))
    no_gpu_environment.setenv("CUDA_VISIBLE_DEVICES", "")  # every GPU hidden: an explicit CPU choice
    assert gpu_requests(driver_file=driver) == []


def test_a_cuda_build_that_cannot_start_points_at_the_driver(no_gpu_environment):
    no_gpu_environment.setattr(torch.version, "cuda", "13.0")  # what a cu130 wheel says on an old driver
    with pytest.raises(CudaUnusableError, match=r"device=cuda asked for a GPU.*built for CUDA 13\.0.*NVIDIA driver "
                                                r"supports CUDA 13\.0"):
        resolve_device("cuda")


def test_an_explicit_device_wins_over_the_environment(no_gpu_environment):
    no_gpu_environment.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(CudaUnusableError, match="device=cuda:1 asked for a GPU"):
        resolve_device("cuda:1")


def test_load_model_refuses_instead_of_loading_on_cpu(no_gpu_environment, tiny_qwen3_dir):
    no_gpu_environment.setenv("SLURM_JOB_GPUS", "0")
    with pytest.raises(CudaUnusableError, match="SLURM_JOB_GPUS=0 asked for a GPU"):
        load_model(str(tiny_qwen3_dir))
    assert load_model(str(tiny_qwen3_dir), device="cpu").model.device.type == "cpu"


def test_the_evaluator_refuses_before_reading_anything(no_gpu_environment, tmp_path, tiny_qwen3_dir):
    from eval.evaluation.config import EvalConfig
    from eval.evaluation.runner import run_evaluation

    missing = tmp_path / "absent.jsonl"  # the data would fail differently, later
    with pytest.raises(CudaUnusableError, match="device=cuda asked for a GPU"):
        run_evaluation(EvalConfig(model=str(tiny_qwen3_dir), device="cuda", data_path=str(missing), limit=0))
    no_gpu_environment.setenv("SLURM_GPUS_ON_NODE", "1")
    with pytest.raises(CudaUnusableError, match="SLURM_GPUS_ON_NODE=1 asked for a GPU"):
        run_evaluation(EvalConfig(model=str(tiny_qwen3_dir), data_path=str(missing), limit=0))
    # device=cpu is a choice: the run goes on (and stops at the missing data).
    with pytest.raises(FileNotFoundError):
        run_evaluation(EvalConfig(model=str(tiny_qwen3_dir), device="cpu", data_path=str(missing), limit=0))


@pytest.mark.parametrize("setting,extra", [("CUDA_VISIBLE_DEVICES=0,1", []), ("SLURM_GPUS_ON_NODE=8", []),
                                           ("training.bf16=true", ["training.bf16=true"])])
def test_training_refuses_before_any_work(no_gpu_environment, tmp_path, setting, extra):
    import train.sft as sft

    if not extra:
        no_gpu_environment.setenv(*setting.split("=", 1))
    argv = ["recipe=qwen3_prefix", f"training.output_dir={tmp_path / 'run'}", *extra]
    with pytest.raises(CudaUnusableError, match=f"{setting} asked for a GPU, but CUDA is unusable"):
        sft.main(argv)
    assert not (tmp_path / "run").exists()


def test_accelerate_cpu_is_an_explicit_choice(no_gpu_environment):
    from train.sft import parse_recipe, training_gpu_requests

    recipe, _ = parse_recipe(["recipe=smollm2_prefix", "training.bf16=true"])
    environ = {"CUDA_VISIBLE_DEVICES": "0"}
    assert training_gpu_requests(recipe, environ) == ["CUDA_VISIBLE_DEVICES=0", "training.bf16=true"]
    assert training_gpu_requests(recipe, environ | {"ACCELERATE_USE_CPU": "True"}) == []
    recipe.training["bf16"] = None
    assert training_gpu_requests(recipe, {}) == []


# --- 3. The paper's effective batch: kept, or refused unless the raised batch is accepted -----------

PAPER_RECIPES = ["gemma3_prefix", "llama31_prefix", "qwen3_distill", "qwen3_prefix", "refusion_draft_refinement",
                 "refusion_prefix_to_answer"]


def paper_recipe(name: str, *overrides: str) -> TrainRecipe:
    return load_config(TrainRecipe, [f"recipe={name}", *overrides])


def test_the_paper_recipes_are_those_tagged_paper_and_the_distillation_twin():
    tagged = sorted(path.stem for path in (RECIPES_DIR / "train").glob("*.yaml")
                    if "paper" in paper_recipe(path.stem).wandb.tags)
    assert sorted([*tagged, "qwen3_distill"]) == PAPER_RECIPES


@pytest.mark.parametrize("name", PAPER_RECIPES)
def test_a_paper_recipe_keeps_batch_16_or_refuses_naming_the_override(name):
    recipe = paper_recipe(name)
    raising = paper_recipe(name, "run.keep_effective_batch=false")
    rate = recipe.training["learning_rate"]
    assert recipe.run.effective_batch_size == 16
    for world in range(1, 65):
        if 16 % world == 0:
            plan = batch_plan(recipe, world)
            assert (plan.effective, plan.learning_rate, plan.kept) == (16, rate, True), world
            assert not any(note.startswith("WARNING") for note in plan.notes())
            continue
        raised = -(-16 // world) * world
        with pytest.raises(RecipeValueError, match=f"cannot be split over {world} processes.*pass "
                                                   f"run.keep_effective_batch=false to accept the raised "
                                                   f"batch {raised} "):
            batch_plan(recipe, world)
        plan = batch_plan(raising, world)
        assert plan.effective == raised and plan.world_size * plan.per_device * plan.accumulation == raised
        assert plan.learning_rate == pytest.approx(rate * (raised / 16) ** 0.5)
        assert plan.notes()[0].startswith(f"WARNING: effective batch 16 is not a multiple of the world size {world}")


def test_the_paper_batch_is_refused_before_any_data_work(no_gpu_environment, tmp_path):
    """sbatch --nodes 4 (4 x 8 = 32 processes) used to train at batch 32 behind a warning."""
    from test_train_cluster import FakeState

    import train.sft as sft

    state = FakeState(num_processes=32)
    no_gpu_environment.setattr(sft, "PartialState", state)
    with pytest.raises(RecipeValueError, match="run.keep_effective_batch=false to accept the raised batch 32"):
        sft.main(["recipe=qwen3_prefix", f"data.path={tmp_path / 'absent.jsonl'}",
                  f"training.output_dir={tmp_path / 'run'}"])


# --- 5. One device per process -------------------------------------------------------------------

def test_a_process_loads_the_whole_model_on_its_own_gpu(no_gpu_environment):
    """Left unset, TRL gives a single process device_map="auto": the model spread over every GPU."""
    from train.model import model_init_kwargs
    from train.sft import parse_recipe

    recipe, _ = parse_recipe(["recipe=qwen3_prefix", "model.dtype=bfloat16"])
    assert model_init_kwargs(recipe, 8, "cuda:0") == {"dtype": torch.bfloat16, "attn_implementation": "sdpa",
                                                      "device_map": {"": "cuda:0"}}
    assert model_init_kwargs(recipe, 8, "cuda:5")["device_map"] == {"": "cuda:5"}
    assert model_init_kwargs(recipe, 1, "cuda:0")["device_map"] == {"": "cuda:0"}
    assert model_init_kwargs(recipe, 0, "cpu")["device_map"] is None
    no_gpu_environment.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # the engine places (ZeRO-3 partitions at load)
    assert model_init_kwargs(recipe, 8, "cuda:0")["device_map"] is None


def test_a_single_process_on_a_multi_gpu_node_trains_on_one_gpu(tmp_path):
    """With the model pinned to one GPU, Trainer would still wrap it in nn.DataParallel over the
    node's count, which TRL refuses after the model has loaded."""
    from trl import SFTConfig

    from train.processes import keep_one_gpu

    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    args._n_gpu = 8  # what TrainingArguments counts on an 8-GPU node without a launcher
    keep_one_gpu(args, distributed=True)
    assert args.n_gpu == 8
    keep_one_gpu(args, distributed=False)
    assert args.n_gpu == 1


# --- 7. transformers >= 5.19 --------------------------------------------------------------------

def test_the_transformers_version_is_checked():
    from train.sft import StackVersionError, check_transformers_version

    for accepted in ("5.19.0", "5.23.0", "6.0.1"):
        check_transformers_version(accepted)
    for refused in ("5.17.0", "5.18.2", "4.57.1", "5.19.0.dev0"):
        with pytest.raises(StackVersionError, match=f"transformers {refused} is installed; train/sft.py needs "
                                                    r"transformers >= 5\.19"):
            check_transformers_version(refused)


def test_training_checks_the_version_first(monkeypatch, tmp_path):
    from importlib import metadata

    import train.sft as sft

    installed = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "5.17.0" if name == "transformers" else installed(name))
    with pytest.raises(sft.StackVersionError, match="transformers 5.17.0 is installed"):
        sft.main(["recipe=smollm2_prefix", f"training.output_dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists()


# --- 1 and 4. The Slurm scripts on the local cluster ---------------------------------------------

def local_slurm():
    from test_slurm import cluster_up, slurm_env

    if not cluster_up():
        pytest.skip("no local Slurm: run `bash scripts/slurm_local.sh start`")
    return slurm_env


@pytest.mark.slurm
def test_eval_sbatch_asks_for_cpus_and_memory(tmp_path):
    """Under a typical per-CPU memory default, one CPU's share cannot hold an 8B model."""
    slurm_env = local_slurm()
    submitted = subprocess.run(["sbatch", "--parsable", "--hold", "--output=/dev/null", "slurm/eval.sbatch",
                                f"output_dir={tmp_path}"], cwd=REPO, env=slurm_env(), capture_output=True, text=True,
                               check=True)
    job = submitted.stdout.strip().split(";")[0]
    try:
        shown = subprocess.run(["scontrol", "-o", "show", "job", job], env=slurm_env(), capture_output=True, text=True,
                               check=True).stdout
    finally:
        subprocess.run(["scancel", job], env=slurm_env(), check=False)
    fields = dict(item.split("=", 1) for item in shown.split() if "=" in item)
    assert fields["NumCPUs"] == "8" and fields["MinMemoryNode"] == "64G", shown


# The main node merging alone past the site's wait time (`srun --wait=0`) is checked by the
# uninterrupted job of tests/test_slurm.py's USR1 test: one two-node training serves both.


def test_cpu_training_that_leaves_cores_idle_says_how_to_use_them():
    """accelerate launch gives one process OMP_NUM_THREADS=1 unless told: the demo trained on one of two cores."""
    note = idle_cores_note("cpu", 1, threads=1, cores=2)
    assert note and "1 process x 1 thread on 2 cores" in note and "--num_cpu_threads_per_process 2" in note
    assert "--num_cpu_threads_per_process 4" in idle_cores_note("cpu", 2, threads=1, cores=8)
    assert idle_cores_note("cpu", 1, threads=2, cores=2) is None
    assert idle_cores_note("cpu", 2, threads=1, cores=2) is None  # two processes, a core each
    assert idle_cores_note("cuda", 1, threads=1, cores=16) is None
