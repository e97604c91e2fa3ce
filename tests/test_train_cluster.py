"""Ready for the cluster (issue 16): what used to crash, hang or give wrong results on many GPUs.

World sizes that cannot keep the effective batch and resumes on another topology are
refused or planned before any data work; the merge runs in float32 on the main process
alone; the adapter records its training system message; answers another model wrote are
refused; hub downloads happen once, before the run, and offline nodes keep W&B offline.
The arithmetic of the batch plan is in test_train_recipes.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset, DatasetDict
from test_train_support import (
    REPO,
    humaneval_dialogues,
    launch,
    launch_command,
    launch_env,
    slow_training_env,
    tiny_overrides,
    write_jsonl,
)

from headstart.config import dump_config
from headstart.prompts import INCOMPLETE_REQUEST_SYSTEM, read_training_record
from headstart.run_dir import write_mark
from train.batch import batch_plan
from train.checkpoints import COMPLETE_MARKER, CompletenessMarker
from train.config import RecipeValueError
from train.relaunch import RUN_KIND
from train.sft import parse_recipe
from train.topology import TOPOLOGY_FILE, Topology, check_resume, checkpoint_topology, launch_topology

# --- Resume on another topology ------------------------------------------------------------

def torch_checkpoint(path: Path, world_size: int) -> Path:
    """The files the trainer writes without DeepSpeed (no topology record: as before this change)."""
    path.mkdir(parents=True)
    (path / "optimizer.pt").write_bytes(b"")
    names = ["rng_state.pth"] if world_size == 1 else [f"rng_state_{r}.pth" for r in range(world_size)]
    for name in names:
        (path / name).write_bytes(b"")
    (path / COMPLETE_MARKER).write_text("2\n")
    return path


def deepspeed_checkpoint(path: Path, world_size: int, stage: int) -> Path:
    """The files DeepSpeed writes: one optimizer shard per rank, per-rank model states under ZeRO-3."""
    step = path / "global_step2"
    step.mkdir(parents=True)
    for rank in range(world_size):
        (step / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"")
        if stage == 3:
            (step / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").write_bytes(b"")
    if stage != 3:
        (step / "mp_rank_00_model_states.pt").write_bytes(b"")
    (path / COMPLETE_MARKER).write_text("2\n")
    return path


def test_topology_is_read_off_checkpoints_written_before_records(tmp_path):
    assert checkpoint_topology(torch_checkpoint(tmp_path / "a", 1)) == (Topology(1, "torch"), None)
    assert checkpoint_topology(torch_checkpoint(tmp_path / "b", 4)) == (Topology(4, "torch"), None)
    assert checkpoint_topology(deepspeed_checkpoint(tmp_path / "c", 16, 3))[0] == Topology(16, "deepspeed", 3)
    assert checkpoint_topology(deepspeed_checkpoint(tmp_path / "d", 8, 2))[0].layout == "zero1/2"


def test_resume_on_another_topology_is_refused_or_allowed_before_training(tmp_path):
    """DeepSpeed raised mid-start on another data-parallel size; DDP <-> ZeRO failed (or silently
    restarted the optimizer); now each case is decided from the checkpoint alone."""
    paper, _ = parse_recipe(["recipe=qwen3_prefix", "run.keep_effective_batch=false"])  # 32 processes: raised
    zero3 = deepspeed_checkpoint(tmp_path / "zero3-16", 16, 3)
    assert check_resume(zero3, Topology(16, "deepspeed", 3), paper) == []
    with pytest.raises(RecipeValueError, match=r"ZeRO shards of 16 data-parallel ranks; this launch has 32.*relaunch "
                                               r"with 16 processes under DeepSpeed ZeRO-3"):
        check_resume(zero3, Topology(32, "deepspeed", 3), paper)
    with pytest.raises(RecipeValueError, match=r"written by 16 processes under DeepSpeed ZeRO-3; this launch is 16 "
                                               r"processes without DeepSpeed \(DDP\)"):
        check_resume(zero3, Topology(16, "torch"), paper)
    with pytest.raises(RecipeValueError, match="this launch is 16 processes under DeepSpeed ZeRO-2"):
        check_resume(zero3, Topology(16, "deepspeed", 2), paper)
    ddp = torch_checkpoint(tmp_path / "ddp-8", 8)
    with pytest.raises(RecipeValueError, match="this launch is 8 processes under DeepSpeed ZeRO-3"):
        check_resume(ddp, Topology(8, "deepspeed", 3), paper)
    # DDP on another world size: the same effective batch and learning rate (16 over 8 or 16) resume ...
    (note,) = check_resume(ddp, Topology(16, "torch"), paper)
    assert "resuming on 16 processes without DeepSpeed (DDP) with the same effective batch 16" in note
    # ... another (16 over 32 is raised to 32) would skip samples never trained on.
    with pytest.raises(RecipeValueError, match="effective batch 16 and learning rate 2e-05; on 32 processes without "
                                               "DeepSpeed \\(DDP\\) they would be 32"):
        check_resume(ddp, Topology(32, "torch"), paper)


def test_checkpoints_record_their_topology(tmp_path):
    recipe, _ = parse_recipe(["recipe=qwen3_prefix"])
    topology, plan = Topology(16, "deepspeed", 3), batch_plan(recipe, 16)
    (tmp_path / "checkpoint-5").mkdir()
    args, state = SimpleNamespace(output_dir=str(tmp_path)), SimpleNamespace(global_step=5, is_world_process_zero=True)
    CompletenessMarker(topology, plan).on_save(args, state, control=None)
    assert (tmp_path / "checkpoint-5" / COMPLETE_MARKER).is_file()
    assert checkpoint_topology(tmp_path / "checkpoint-5") == (topology, plan.as_dict())
    record = json.loads((tmp_path / "checkpoint-5" / TOPOLOGY_FILE).read_text())
    assert record["batch_plan"]["effective_batch_size"] == 16 and record["batch_plan"]["per_device_train_batch_size"] == 1


def test_the_launch_topology_comes_from_accelerates_environment(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    assert launch_topology(4) == Topology(4, "torch")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(REPO / "headstart/recipes/accelerate/ds_zero3.json"))
    assert launch_topology(16) == Topology(16, "deepspeed", 3)
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(REPO / "headstart/recipes/accelerate/ds_zero2.json"))
    assert launch_topology(16).layout == "zero1/2"


class FakeState:
    """A PartialState of `num_processes` that records barriers and never joins anything."""

    def __init__(self, num_processes: int = 1, is_main_process: bool = True) -> None:
        self.num_processes, self.is_main_process, self.process_index = num_processes, is_main_process, 0
        self.barriers = 0
        self.kwargs = None

    def __call__(self, **kwargs):
        self.kwargs = kwargs
        return self

    def wait_for_everyone(self):
        self.barriers += 1

    def main_process_first(self):
        raise AssertionError("data work started before the batch plan and the resume were checked")


def test_batch_plan_and_resume_are_checked_before_any_data_work(monkeypatch, tmp_path):
    """The effective-batch error used to come after the data was tokenised."""
    import train.sft as sft

    missing = tmp_path / "no-data.jsonl"  # data work would fail differently
    state = FakeState(num_processes=3)
    monkeypatch.setattr(sft, "PartialState", state)
    with pytest.raises(RecipeValueError, match="cannot be split over 3 processes"):
        sft.main(["recipe=qwen3_prefix", "run.keep_effective_batch=true", f"data.path={missing}",
                  f"training.output_dir={tmp_path / 'run'}"])
    assert state.kwargs["timeout"].total_seconds() == 1800  # the group gets the recipe's timeout

    recipe, _ = parse_recipe(["recipe=qwen3_prefix", f"data.path={missing}", f"training.output_dir={tmp_path / 'zero'}",
                              "run.keep_effective_batch=false"])  # 3 processes: a raised batch, then the resume
    dump_config(recipe, tmp_path / "zero" / "config.yaml")
    write_mark(tmp_path / "zero", RUN_KIND)
    deepspeed_checkpoint(tmp_path / "zero" / "checkpoint-2", 2, 3)
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    with pytest.raises(RecipeValueError, match="DeepSpeed ZeRO-3; this launch is 3 processes without DeepSpeed"):
        sft.main(["recipe=qwen3_prefix", f"data.path={missing}", f"training.output_dir={tmp_path / 'zero'}",
                  "run.keep_effective_batch=false"])


# --- The merge: float32, on the main process alone -------------------------------------------

@pytest.fixture(scope="module")
def small_delta_adapter(tmp_path_factory, tiny_qwen3_dir):
    """A bf16 base (as hub weights are) and a LoRA adapter whose deltas are of order 1e-4
    (mean |delta| about 9e-5) beside weights of order 1e-2, whose bf16 spacing is about 1e-4."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("small_delta")
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.bfloat16)
    base.save_pretrained(root / "base")
    AutoTokenizer.from_pretrained(tiny_qwen3_dir).save_pretrained(root / "base")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(root / "base", dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_A" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
            elif "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 2e-4)
    model.save_pretrained(root / "adapter")
    AutoTokenizer.from_pretrained(tiny_qwen3_dir).save_pretrained(root / "adapter")
    return root


def _q_proj(directory: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    weights = {}
    for file in directory.glob("*.safetensors"):
        weights |= load_file(file)
    (key,) = [k for k in weights if k.endswith("layers.0.self_attn.q_proj.weight")]
    return weights[key].float()


def _logits(directory: Path) -> torch.Tensor:
    from headstart.models import load_model

    loaded = load_model(str(directory), device="cpu", dtype=torch.float32)
    ids = loaded.tokenizer("def add(a, b):\n    return a + b", return_tensors="pt")
    with torch.no_grad():
        return loaded.model(**ids).logits


def test_merge_in_float32_keeps_small_lora_deltas(tmp_path, small_delta_adapter):
    """The merged model used to be saved in bf16 (the recipe's GPU dtype): deltas of order 1e-4
    beside weights of order 1e-2 lost much of their size to bf16 rounding."""
    from headstart.models import load_model
    from train.merge import merge_adapter

    root = small_delta_adapter
    adapter_on = load_model(str(root / "adapter"), device="cpu", dtype=torch.float32).model
    delta = adapter_on.base_model.model.model.layers[0].self_attn.q_proj.get_delta_weight("default").detach()
    assert 1e-5 < delta.abs().mean() < 1e-3

    merged = merge_adapter(root / "adapter", tmp_path / "merged")
    assert json.loads((merged / "config.json").read_text())["dtype"] == "float32"
    kept = _q_proj(merged) - _q_proj(root / "base")
    assert (kept - delta).abs().max() < 1e-3 * delta.abs().max()  # the delta, exactly up to fp32 rounding
    torch.testing.assert_close(_logits(merged), _logits(root / "adapter"), rtol=1e-5, atol=1e-5)

    # What merging and saving in bf16 (the old path on GPU) keeps of the same delta.
    old = load_model(str(root / "adapter"), merge=True, device="cpu", dtype=torch.bfloat16)
    old.model.save_pretrained(tmp_path / "bf16")
    old.tokenizer.save_pretrained(tmp_path / "bf16")
    lost = (_q_proj(tmp_path / "bf16") - _q_proj(root / "base") - delta).abs().mean() / delta.abs().mean()
    assert lost > 0.15, lost  # a fifth of the adaptation (24% here) rounded away, against 0.1% in float32
    with pytest.raises(AssertionError):
        torch.testing.assert_close(_logits(tmp_path / "bf16"), _logits(root / "adapter"), rtol=1e-5, atol=1e-5)


def test_save_final_merges_in_float32_on_the_main_process_alone(tmp_path, small_delta_adapter, monkeypatch):
    """Rank 0 merged while the other ranks waited at a barrier under the default timeout; the
    merge also followed the recipe's model dtype (bf16 on GPU)."""
    import shutil

    from train.sft import save_final

    recipe, _ = parse_recipe(["recipe=qwen3_prefix", "model.dtype=bfloat16"])
    trainer = SimpleNamespace(save_model=lambda path: shutil.copytree(small_delta_adapter / "adapter", path))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(small_delta_adapter / "adapter")

    other = FakeState(num_processes=2, is_main_process=False)
    save_final(trainer, tokenizer, tmp_path / "rank1", recipe, other, {"system_message": "x y"})
    assert other.barriers == 1 and not (tmp_path / "rank1" / "merged").exists()  # returns after the adapter barrier

    main = FakeState(num_processes=2)
    save_final(trainer, tokenizer, tmp_path / "run", recipe, main, {"system_message": INCOMPLETE_REQUEST_SYSTEM})
    assert main.barriers == 1  # no barrier after the merge: nobody waits on it
    merged = tmp_path / "run" / "merged"
    assert json.loads((merged / "config.json").read_text())["dtype"] == "float32"
    torch.testing.assert_close(_logits(merged), _logits(small_delta_adapter / "adapter"), rtol=1e-5, atol=1e-5)
    for directory in (tmp_path / "run" / "adapter", merged):
        assert read_training_record(directory)["system_message"] == INCOMPLETE_REQUEST_SYSTEM


# --- Whose answers, which system message ------------------------------------------------------

def test_training_refuses_answers_written_by_another_model(tmp_path):
    """llama31_prefix and gemma3_prefix trained on Qwen3-8B's answers without a word."""
    from train.provenance import check_answer_models

    rows = [dict(r, answer_kind="self", answer_model="Qwen/Qwen3-8B") for r in humaneval_dialogues(2)]
    data = Dataset.from_list(rows)
    assert check_answer_models(data, "d", "Qwen/Qwen3-8B", False) == []
    assert check_answer_models(data, "d", "/models/Qwen3-8B/", False) == []  # a local copy of the same model
    with pytest.raises(ValueError, match=r"answers written by Qwen/Qwen3-8B, not by the model trained here "
                                         r"\(meta-llama/Llama-3.1-8B-Instruct\).*answers_from_other_model=true"):
        check_answer_models(data, "d", "meta-llama/Llama-3.1-8B-Instruct", False)
    (note,) = check_answer_models(data, "d", "meta-llama/Llama-3.1-8B-Instruct", True)
    assert "written by Qwen/Qwen3-8B" in note
    reference = Dataset.from_list([dict(r, answer_kind="reference", answer_model=None) for r in humaneval_dialogues(2)])
    assert check_answer_models(reference, "d", "meta-llama/Llama-3.1-8B-Instruct", False) == []

    # A build from before `answer_model`: its config.yaml names the model.
    legacy = tmp_path / "legacy"
    DatasetDict({"train": Dataset.from_list([dict(r, answer_kind="self") for r in humaneval_dialogues(2)])}).save_to_disk(
        str(legacy))
    (legacy / "config.yaml").write_text("name: lmsys_prefix\nmodel: Qwen/Qwen3-8B\nanswers: self\n")
    from train.data import load_split

    with pytest.raises(ValueError, match="answers written by Qwen/Qwen3-8B"):
        check_answer_models(load_split(str(legacy), "train"), str(legacy), "google/gemma-3-12b-it", False)


def test_the_adapter_records_what_the_rows_say_for_dataset(tmp_path):
    from train.tokenization import KEEP_ROWS, resolve_training_system, trained_system_record, with_system

    rows = Dataset.from_list(humaneval_dialogues(3))
    assert resolve_training_system("dataset", None) == KEEP_ROWS
    assert trained_system_record(KEEP_ROWS, rows) == {"system_message": INCOMPLETE_REQUEST_SYSTEM}
    mixed = Dataset.from_list(humaneval_dialogues(2) + [{"messages": humaneval_dialogues(1)[0]["messages"][1:],
                                                          "source": "x"}])
    assert trained_system_record(KEEP_ROWS, mixed) == {"system_message": None, "system_message_varies": True}
    messages = humaneval_dialogues(1)[0]["messages"]
    assert [m["role"] for m in with_system(messages, None)] == ["user", "assistant"]  # `none`: no system turn
    assert with_system(messages, "New text here.")[0]["content"] == "New text here."


# --- Offline nodes ------------------------------------------------------------------------------

def test_offline_nodes_keep_wandb_offline_even_with_a_project(monkeypatch, tmp_path):
    """WANDB_PROJECT set on nodes without internet made the run fail at W&B's start."""
    import os

    from train.tracking import configure_trackers

    recipe, _ = parse_recipe(["recipe=smollm2_prefix"])
    # configure_trackers writes os.environ: give it a copy, so nothing leaks into later tests.
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()
                                        if k not in ("WANDB_MODE", "WANDB_DIR", "WANDB_TAGS", "TENSORBOARD_LOGGING_DIR")})
    monkeypatch.setenv("WANDB_PROJECT", "team-project")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    configure_trackers(recipe, "smollm2_prefix", tmp_path)
    assert os.environ["WANDB_MODE"] == "offline" and os.environ["WANDB_PROJECT"] == "team-project"
    monkeypatch.setenv("WANDB_MODE", "online")  # said explicitly: kept
    configure_trackers(recipe, "smollm2_prefix", tmp_path)
    assert os.environ["WANDB_MODE"] == "online"


def test_wandb_run_id_is_kept_in_the_run_directory_and_runs_are_grouped_by_recipe(monkeypatch, tmp_path):
    """A requeued or resumed run continues its W&B run instead of opening a second one."""
    import os

    from train.tracking import WANDB_ID_FILE, configure_trackers

    recipe, _ = parse_recipe(["recipe=smollm2_prefix"])
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")})
    configure_trackers(recipe, "smollm2_prefix", tmp_path)
    first = os.environ["WANDB_RUN_ID"]
    assert (tmp_path / WANDB_ID_FILE).read_text().strip() == first
    assert os.environ["WANDB_RESUME"] == "allow" and os.environ["WANDB_RUN_GROUP"] == "smollm2_prefix"

    os.environ.pop("WANDB_RUN_ID")
    configure_trackers(recipe, "smollm2_prefix", tmp_path)  # the relaunch
    assert os.environ["WANDB_RUN_ID"] == first
    configure_trackers(recipe, "smollm2_prefix", tmp_path / "other")
    assert os.environ["WANDB_RUN_ID"] != first  # another run directory, another run

    # Other ranks open no W&B run (only world rank 0 logs): they neither read nor write the id.
    os.environ.pop("WANDB_RUN_ID")
    configure_trackers(recipe, "smollm2_prefix", tmp_path / "rank1", main_process=False)
    assert "WANDB_RUN_ID" not in os.environ and not (tmp_path / "rank1" / WANDB_ID_FILE).exists()

    monkeypatch.setitem(os.environ, "WANDB_RUN_GROUP", "study-smollm2")  # a study's group is kept
    configure_trackers(recipe, "smollm2_prefix", tmp_path)
    assert os.environ["WANDB_RUN_GROUP"] == "study-smollm2"


def test_train_download_fetches_the_recipes_model(monkeypatch, capsys):
    import train.download as download

    fetched = []
    monkeypatch.setattr(download, "download_model", lambda name: fetched.append(name) or f"/cache/{name}")
    assert download.main(["recipe=llama31_prefix"]) == 0
    assert fetched == ["meta-llama/Llama-3.1-8B-Instruct"]
    assert "in the hub cache at /cache/meta-llama/Llama-3.1-8B-Instruct" in capsys.readouterr().out
    assert download.main(["recipe=qwen3_prefix", "model.name_or_path=smollm2"]) == 0


# --- Two processes, for real ----------------------------------------------------------------------

@pytest.mark.slow
def test_two_processes_merge_past_the_timeout_record_and_resume_on_another_topology(tmp_path, tiny_qwen3_dir):
    """DDP over gloo with a 30 s collective timeout and a merge held 40 s on rank 0: rank 1
    no longer waits on it. The adapter records its system message; the checkpoint its topology;
    the same run then resumes on one process (same effective batch) and is refused under ZeRO-2."""
    data = write_jsonl(tmp_path / "data.jsonl", humaneval_dialogues(16))
    out = tmp_path / "run"
    overrides = tiny_overrides(tiny_qwen3_dir, data, out, max_steps=2, save_steps=2, merge="true", ddp_timeout=30)
    result = launch(["--multi_gpu", "--num_processes", "2"], overrides, timeout=500, **slow_training_env(merge_s=40))
    assert "processes: 2 (MULTI_CPU), gradient accumulation: 1" in result.stdout
    assert "collective timeout: 30 s" in result.stdout
    assert (out / "merged" / "config.json").is_file()
    assert read_training_record(out / "adapter")["system_message"] == INCOMPLETE_REQUEST_SYSTEM
    assert read_training_record(out / "merged")["system_message"] == INCOMPLETE_REQUEST_SYSTEM
    assert checkpoint_topology(out / "checkpoint-2")[0] == Topology(2, "torch")

    longer = tiny_overrides(tiny_qwen3_dir, data, out, max_steps=3, save_steps=3, merge="false", ddp_timeout=30)
    resumed = launch(["--num_processes", "1"], longer, timeout=300)
    assert "resuming on 1 process without DeepSpeed (single process) with the same effective batch 4" in resumed.stdout
    assert checkpoint_topology(out / "checkpoint-3")[0] == Topology(1, "torch")

    again = tiny_overrides(tiny_qwen3_dir, data, out, max_steps=4, save_steps=4, merge="false", ddp_timeout=30)
    refused = subprocess.run(
        launch_command(["--config_file", "headstart/recipes/accelerate/zero2.yaml", "--num_processes", "1"], again), cwd=REPO,
        env=launch_env(), capture_output=True, text=True, timeout=300,
    )
    assert refused.returncode != 0
    assert "written by 1 process without DeepSpeed (single process); this launch is 1 process under DeepSpeed" \
           " ZeRO-2" in refused.stderr, refused.stderr[-3000:]
    assert not (out / "checkpoint-4").exists()
