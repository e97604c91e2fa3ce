"""Every command in the ```bash blocks of README.md and docs/*.md is checked, so the documentation
cannot drift from the code.

Each command is listed in COVERAGE with how it is checked:
- `Checked()`: its recipe and every key=value parsed and validated by the entry point's own
  schema (unknown keys, bad values and missing recipes fail), in this process;
- `RunCheap(extra)`: run here in a cheap mode, the README's arguments followed by `extra`
  (`limit=0`: the evaluator's check-only mode; later key=value settings win);
- `HelpHas()`: an argparse script; `--help` runs and names every option the command uses;
- `Elsewhere(test)`: run for real (on the tiny models) by the named test or script;
- `Allowed(reason)`: cannot run here, and why.
A command added to README.md or a docs/*.md file without an entry here, or an entry whose command
left all of them, fails `test_every_documented_command_is_covered`.
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from in_process import run_here

REPO = Path(__file__).resolve().parent.parent
GPU_OR_HOURS = "needs a GPU, a gated hub model or hours; its recipe and settings are parsed here"
STUDY_SIDE = ("reruns a side of the adaptation study from the config.yaml it wrote (in its output_dir, after nine "
              "hours of study); a written config.yaml as a recipe: tests/test_eval_runner.py::"
              "test_the_config_a_run_writes_reruns_it_as_a_recipe")


@dataclass(frozen=True)
class Checked:
    elsewhere: str = ""  # a test that also runs it (on tiny models), when one does


@dataclass(frozen=True)
class RunCheap:
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class HelpHas:
    pass


@dataclass(frozen=True)
class Elsewhere:
    test: str  # tests/FILE.py::NAME or a script that runs the command


@dataclass(frozen=True)
class Allowed:
    reason: str


CHECK_ONLY = ("limit=0",)
COVERAGE: dict[str, Checked | RunCheap | HelpHas | Elsewhere | Allowed] = {
    "make demo": Allowed("the whole demo (minutes); its stages, the `stage` lines of scripts/demo.sh, are "
                         "parsed by test_demo_stages_parse"),
    "make test": Allowed("the test suite itself"),
    # The streaming evaluator
    "python -m eval recipe=humaneval_smollm2": RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 limit=40 decode.acceptance=threshold:0.9": RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 decode.regenerate=plain": RunCheap(CHECK_ONLY),
    "python -m eval model=Qwen/Qwen3-8B benchmark=humaneval decode.acceptance=greedy system_prompt=incomplete":
        Checked(),
    "python -m eval model=outputs/train/qwen3_prefix/adapter benchmark=humaneval": Checked(),
    "python -m eval model=gemma3-270m benchmark=humaneval limit=3": Elsewhere(
        "tests/test_embedded_gemma.py::test_it_loads_as_a_sliding_window_gemma3_and_streams_in_the_completion_format"),
    "python benchmarks/bench_faster_answers.py --limit 40 --threads 2 --benchmarks humaneval": HelpHas(),
    "python benchmarks/bench_faster_answers.py --limit 40 --threads 1 --benchmarks mbpp": HelpHas(),
    "python benchmarks/bench_lookup_policy.py --limit 40 --threads 2 --drafts-from "
    "outputs/bench/faster_answers/humaneval/new_format-plain": HelpHas(),
    "python benchmarks/bench_streaming.py --limit 40 --compare 5 --max-new-tokens 128 --threads 1": HelpHas(),
    # Identity in bf16 and fp32 (docs/evaluation.md#identity); token-tree masks' cost (docs/results.md)
    "python -m eval recipe=humaneval_smollm2 dtype=bfloat16 limit=10 decode.max_new_tokens=64 decode.regenerate=plain":
        RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 dtype=bfloat16 limit=10 decode.max_new_tokens=64": RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 dtype=bfloat16 limit=10 decode.max_new_tokens=64 decode.lookup_match=longest "
    "decode.lookup_tree=8": RunCheap(CHECK_ONLY),
    "python benchmarks/bench_tree_mask.py --repeats 100": HelpHas(),
    "python benchmarks/bench_scoring.py --category unusual-correct subtly-wrong --programs "
    "benchmarks/scoring_programs_heldout": HelpHas(),
    "python benchmarks/bench_scoring.py --json outputs/scoring.json":
        Elsewhere("tests/test_scoring_agreement.py::test_the_project_gives_the_official_verdict"),
    "python benchmarks/bench_tree_mask.py --repeats 100 --module eval.engines.ar": HelpHas(),
    # Width costs and the cost chooser (docs/evaluation.md)
    "python -m eval.width_cost model=smollm2":
        Elsewhere("tests/test_width_cost.py::test_the_command_writes_the_table_auto_reads"),
    "python -m eval recipe=humaneval_smollm2 decode.lookup_match=longest decode.lookup_max_block=32 "
    "decode.lookup_choice=cost decode.width_cost=auto": RunCheap(CHECK_ONLY),
    # Data
    "python -m data_builders recipe=embedded_prefix": Elsewhere("tests/test_slurm.py::"
                                                                "test_pipeline_chains_data_train_and_before_after_eval"),
    "python -m data_builders recipe=lmsys_prefix": Checked(),
    "bash scripts/setup_vllm.sh": Allowed("creates the vLLM environment; scripts/setup.sh runs it on every `make test`, "
                                          "and tests/test_vllm_backend.py runs in what it made"),
    "python -m eval recipe=humaneval_smollm2 backend=vllm": RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 limit=40 timed_every=20 output_dir=/tmp/deg/humaneval": RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 limit=40 timed_every=40 decode.max_new_tokens=128": RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 limit=40 timed_every=40 decode.max_new_tokens=128 backend=vllm "
    "fast_batch_size=256": RunCheap(CHECK_ONLY),
    # Longest match and token trees (docs/results.md): recorded answers, replayed and timed per policy
    "python -m eval recipe=humaneval_smollm2 limit=40 timed_every=40 decode.max_new_tokens=128 backend=vllm "
    "fast_batch_size=256 record_tokens=true output_dir=outputs/bench/lookup27/humaneval": Checked(),
    "python -m eval recipe=humaneval_smollm2 benchmark=mbpp data_path=data/mbpp/mbpp.jsonl limit=40 timed_every=40 "
    "decode.max_new_tokens=128 backend=vllm fast_batch_size=256 record_tokens=true "
    "output_dir=outputs/bench/lookup27/mbpp": Checked(),
    'python benchmarks/lookup_bound.py outputs/bench/lookup27/humaneval --policy lookup_match=longest --policy '
    '"lookup_match=longest lookup_max_block=32" --policy "lookup_match=longest lookup_tree=4" --policy '
    '"lookup_match=longest lookup_tree=8" --policy "lookup_match=longest lookup_tree=4 lookup_max_block=32" '
    '--policy "lookup_match=longest lookup_tree=8 lookup_max_block=32"': HelpHas(),
    'python benchmarks/bench_lookup_policy.py --limit 20 --threads 2 --drafts-from outputs/bench/lookup27/humaneval '
    '--policy lookup_match=longest --policy "lookup_match=longest lookup_tree=4" --policy '
    '"lookup_match=longest lookup_tree=8 lookup_max_block=32"': HelpHas(),
    # Realignment candidates (docs/results.md)
    'python benchmarks/lookup_bound.py outputs/bench/lookup27/humaneval --policy "lookup_match=longest lookup_tree=8 '
    'lookup_max_block=32" --policy "lookup_match=longest lookup_tree=16 lookup_max_block=32 lookup_realign=2" --policy '
    '"lookup_match=longest lookup_tree=16 lookup_max_block=32 lookup_realign=3" --policy "lookup_match=longest '
    'lookup_tree=32 lookup_max_block=32 lookup_realign=5"': HelpHas(),
    "python -m eval recipe=humaneval_smollm2 limit=40 timed_every=40 decode.max_new_tokens=128 backend=vllm "
    "fast_batch_size=256 decode.lookup_match=longest decode.lookup_tree=16 decode.lookup_max_block=32 "
    "decode.lookup_realign=3 output_dir=outputs/bench/realign27/humaneval": RunCheap(CHECK_ONLY),
    'python benchmarks/lookup_bound.py outputs/bench/lookup27/mbpp --width-cost '
    'outputs/width_cost/smollm2-cpu-AMD_EPYC-2threads.json --policy "lookup_match=longest lookup_tree=64 '
    'lookup_max_block=32 lookup_realign=8" --policy "lookup_match=longest lookup_tree=64 lookup_max_block=32 '
    'lookup_realign=12" --policy "lookup_match=longest lookup_tree=128 lookup_max_block=32 lookup_realign=12"': HelpHas(),
    "python -m eval recipe=humaneval_smollm2 benchmark=mbpp data_path=data/mbpp/mbpp.jsonl limit=40 timed_every=40 "
    "decode.max_new_tokens=128 backend=vllm fast_batch_size=256 decode.lookup_match=longest decode.lookup_tree=64 "
    "decode.lookup_max_block=32 decode.lookup_realign=12 output_dir=outputs/bench/realign27/mbpp-tree64": RunCheap(CHECK_ONLY),
    # Width costs and the cost chooser (docs/results.md)
    "python benchmarks/lookup_bound.py outputs/bench/lookup27/humaneval --width-cost "
    'outputs/width_cost/smollm2-cpu-AMD_EPYC-2threads.json --policy "lookup_match=longest lookup_max_block=32 '
    'lookup_choice=cost width_cost=auto" --policy "lookup_match=longest lookup_tree=8 lookup_max_block=32" --policy '
    '"lookup_match=longest lookup_tree=8 lookup_max_block=32 lookup_choice=cost width_cost=auto"': HelpHas(),
    "python benchmarks/bench_lookup_policy.py --limit 20 --threads 2 --drafts-from outputs/bench/lookup27/humaneval "
    '--policy "lookup_match=longest lookup_max_block=32 lookup_choice=cost width_cost=auto" --policy '
    '"lookup_match=longest lookup_tree=8 lookup_max_block=32" --policy '
    '"lookup_match=longest lookup_tree=8 lookup_max_block=32 lookup_choice=cost width_cost=auto"': HelpHas(),
    "python -m data_builders recipe=embedded_prefix generation.backend=vllm generation.cache_files=[] "
    "generation.batch_size=36":
        Checked("tests/test_vllm_backend.py::test_self_distilled_data_built_on_vllm_matches_and_trains"),
    "python -m data_builders recipe=lmsys_prefix generation.backend=vllm generation.batch_size=1024 "
    "generation.vllm.tensor_parallel_size=2 generation.vllm.data_parallel_size=4": Checked(),
    "python benchmarks/bench_vllm.py": HelpHas(),
    "HEADSTART_VLLM_PACKAGE=vllm==<version> bash scripts/setup_vllm.sh": Allowed(
        "builds a vLLM environment with vLLM's CUDA torch for a GPU machine; needs a GPU and the network"),
    "python benchmarks/bench_vllm.py --distill 200 --eval 20 --device cuda": HelpHas(),
    "python benchmarks/bench_data_builders.py --sizes 50000 200000 --num-proc 2": HelpHas(),
    "python -m data_builders recipe=lmsys_prefix_llama31": Checked(),
    "python -m data_builders recipe=lmsys_prefix_gemma3": Checked(),
    "python -m data_builders recipe=code_prefix_to_answer": Checked(),
    "python -m data_builders recipe=code_draft_refinement": Checked(),
    "python -m data_builders recipe=code_prefix_to_answer mbpp.path=data/mbpp/mbpp.jsonl "
    "magicoder.path=data/code_sft/magicoder_oss_instruct_75k_sample500.jsonl sources=[mbpp,magicoder] "
    "caps.max_tokens=0 decontamination.on_missing=skip decontamination.hub=false num_proc=2": Checked(),
    # Training
    "accelerate launch train/sft.py": Checked("tests/test_train_resume.py::test_killed_run_resumes_to_the_same_adapter_and_run"),
    "accelerate launch train/sft.py recipe=qwen3_prefix training.learning_rate=1e-4": Checked(),
    "accelerate launch --config_file headstart/recipes/accelerate/zero3.yaml train/sft.py recipe=llama31_prefix": Checked(),
    "python -m train.merge adapter=outputs/train/qwen3_prefix/adapter output=/tmp/merged": Checked(),
    "python -m train.download recipe=llama31_prefix": Checked(),
    "accelerate launch train/sft.py recipe=smollm2_distill": Checked(),
    "accelerate launch train/sft.py recipe=qwen3_distill distill.top_k=64": Checked(),
    "accelerate launch train/sft.py recipe=smollm2_sdft": Checked(
        "tests/test_train_sdft.py::test_objective_sdft_through_sft_trains_saves_and_resumes"),
    "accelerate launch --multi_gpu --num_processes 2 train/sft.py recipe=smollm2_prefix": Checked(),
    "accelerate launch --config_file headstart/recipes/accelerate/zero3.yaml --num_processes 2 train/sft.py "
    "recipe=smollm2_prefix": Checked(),
    "HF_HUB_OFFLINE=1 python -m train.download recipe=llama31_prefix": Checked(),
    "HF_HUB_OFFLINE=1 accelerate launch train/sft.py recipe=llama31_prefix": Checked(),
    # ReFusion
    "accelerate launch train/sft.py recipe=refusion_prefix_to_answer": Checked(),
    "accelerate launch train/sft.py recipe=smollm2_refusion": Checked(),
    "python -m eval recipe=humaneval_refusion": Checked(),
    "python -m eval recipe=humaneval_smollm2_refusion": Checked(),
    "python -m eval recipe=humaneval_refusion_draft_refinement": Checked(),
    "python -m eval recipe=mbpp_smollm2_refusion_full": Checked(),
    "python benchmarks/bench_refusion.py": HelpHas(),
    "python benchmarks/bench_refusion.py --limit 2 --threads 1": HelpHas(),
    "python benchmarks/probe_refusion.py outputs/train/smollm2_refusion_full/merged --rows 4": HelpHas(),
    "python -m data_builders recipe=smollm2_refusion_self": Checked(),
    "accelerate launch train/sft.py recipe=smollm2_refusion_full": Checked(
        "tests/test_train_refusion.py::test_every_weight_trains_with_use_peft_false_resumes_and_saves_the_model"),
    "python benchmarks/bench_train.py --rows 48 --steps 4 --max-length 512": HelpHas(),
    # Suite
    "python -m eval recipe=suite model=Qwen/Qwen3-8B": Checked(),
    "python -m eval recipe=suite_smollm2 limit=4 decode.max_new_tokens=32": RunCheap(CHECK_ONLY),
    "python benchmarks/bench_suite.py": HelpHas(),
    "python benchmarks/bench_suite.py --report-only": HelpHas(),
    "python benchmarks/bench_suite.py --threads 1 --acceptances greedy --regenerate lookup": HelpHas(),
    "python benchmarks/bench_suite.py --threads 1 --acceptances greedy --regenerate lookup --benchmarks coedit,chat":
        HelpHas(),
    "python benchmarks/bench_suite.py --report-only --acceptances greedy --regenerate lookup": HelpHas(),
    "python benchmarks/bench_suite.py --model gemma3-270m --threads 1 --acceptances greedy --regenerate lookup "
    "--benchmarks humaneval,mbpp,coedit,chat,canitedit,ds1000 --output-dir outputs/bench/suite-20-128-lookup-gemma3-270m":
        HelpHas(),
    "python -m eval model=gemma3-270m benchmark=humaneval limit=null timed_every=20 decode.regenerate=lookup "
    "decode.max_new_tokens=128 output_dir=outputs/eval/gemma3-270m-humaneval-count": Checked(),
    "python -m eval model=gemma3-270m benchmark=chat data_path=data/mt_bench limit=null shard=23/27 "
    "decode.acceptance=greedy decode.regenerate=lookup decode.max_new_tokens=128 "
    "output_dir=outputs/eval/gemma3-270m-chat-window": Checked(),
    "python -m eval model=gemma3-270m benchmark=chat data_path=data/mt_bench limit=null shard=26/27 "
    "decode.acceptance=greedy decode.regenerate=lookup decode.max_new_tokens=128 "
    "output_dir=outputs/eval/gemma3-270m-chat-window": Checked(),
    "python benchmarks/study_adaptation.py recipe=study_gemma3": Checked(),
    "python -m eval model=smollm2 benchmark=humaneval limit=null timed_every=20 decode.acceptance=greedy "
    "decode.regenerate=lookup decode.max_new_tokens=128 backend=vllm fast_batch_size=256 "
    "output_dir=outputs/eval/smollm2-humaneval-count": Checked(),
    "python -m eval model=smollm2 benchmark=mbpp data_path=data/mbpp/mbpp.jsonl limit=null timed_every=50 "
    "decode.acceptance=greedy decode.regenerate=lookup decode.max_new_tokens=128 backend=vllm fast_batch_size=256 "
    "output_dir=outputs/eval/smollm2-mbpp-count": Checked(),
    # Before/after and the study
    "python -m eval.before_after recipe=before_after_smollm2 adapted=outputs/train/smollm2_prefix/adapter":
        Checked("tests/test_slurm.py::test_pipeline_chains_data_train_and_before_after_eval"),
    "python -m eval.before_after model=Qwen/Qwen3-8B adapted=outputs/train/qwen3_prefix/merged "
    "benchmarks=[humaneval,mbpp] data_paths='{mbpp: data/mbpp/mbpp.jsonl}' limit=40": Checked(),
    "python -m eval.before_after recipe=before_after_smollm2 adapted=outputs/train/smollm2_prefix/adapter "
    "more_adapted='{distill: outputs/train/smollm2_distill/adapter}'": Checked(),
    "python -m eval.before_after recipe=before_after_smollm2 limit=null timed_every=50 backend=vllm fast_batch_size=256":
        Checked("tests/test_count_mode.py::test_counted_records_equal_the_step_by_step_engines"),
    "python -m eval.before_after recipe=before_after_smollm2 limit=null timed_every=20 backend=vllm fast_batch_size=256":
        Checked("tests/test_count_mode.py::test_counted_records_equal_the_step_by_step_engines"),
    "python -m eval recipe=<study output_dir>/report/before/humaneval/config.yaml timed_every=50 "
    "output_dir=/tmp/side50/humaneval": Allowed(STUDY_SIDE),
    "python -m eval recipe=<study output_dir>/report/before/mbpp/config.yaml timed_every=50 "
    "output_dir=/tmp/side50/mbpp": Allowed(STUDY_SIDE),
    "python benchmarks/study_adaptation.py recipe=study_smollm2": Checked(),
    # Iterated self-distillation (docs/training.md)
    "python -m data_builders recipe=smollm2_code_self model=outputs/study/smollm2/train/sft/adapter "
    "output_dir=outputs/data/smollm2_code_self_round2":
        Checked("tests/test_data_builders_generation.py::test_a_second_round_answers_with_the_adapter_as_it_is_now"),
    "accelerate launch train/sft.py recipe=smollm2_prefix data.path=outputs/data/smollm2_code_self_round2 "
    "data.answers_from_other_model=true training.max_steps=160 training.learning_rate=3e-3 "
    "training.output_dir=outputs/train/smollm2_code_self_round2": Checked(),
    "python benchmarks/study_adaptation.py recipe=study_smollm2 data_recipe=embedded_prefix max_steps=2 "
    "objective_steps.sdft=2 curve_points=2 sweep_steps=1 learning_rates=[1e-3] eval.limit=2 eval.benchmarks=[humaneval] "
    "output_dir=/tmp/study_smoke": Checked(),
    # Slurm: the same scripts run on the local four-node cluster with CPU options (tests/test_slurm.py)
    "sbatch slurm/train.sbatch recipe=qwen3_prefix training.learning_rate=1e-4": Checked(
        "tests/test_slurm.py::test_usr1_saves_a_checkpoint_requeues_and_resumes_to_the_uninterrupted_adapter"),
    "sbatch --nodes 4 slurm/train.sbatch recipe=qwen3_prefix run.keep_effective_batch=false": Checked(
        "tests/test_slurm.py::test_usr1_saves_a_checkpoint_requeues_and_resumes_to_the_uninterrupted_adapter"),
    "ACCELERATE_CONFIG=headstart/recipes/accelerate/zero3.yaml sbatch slurm/train.sbatch recipe=qwen3_prefix": Checked(
        "tests/test_slurm.py::test_pipeline_chains_data_train_and_before_after_eval"),
    # Memory per GPU of the paper recipes (meta-device builds of the vendored configs)
    "python -m train.memory": RunCheap(),
    "python -m train.memory recipe=gemma3_prefix gpus=8": RunCheap(),
    "sbatch slurm/data.sbatch recipe=lmsys_prefix_llama31": Checked(),
    "sbatch --gpus-per-node=0 slurm/data.sbatch recipe=code_prefix_to_answer": Checked(
        "tests/test_slurm.py::test_pipeline_chains_data_train_and_before_after_eval"),
    "sbatch --gpus 1 slurm/eval.sbatch recipe=before_after_smollm2 model=Qwen/Qwen3-8B "
    "adapted=outputs/train/qwen3_prefix/adapter": Checked(),
    'slurm/pipeline.sh --data "recipe=lmsys_prefix" --train "recipe=qwen3_prefix" --eval-sbatch "--gpus 1" '
    '--eval "recipe=before_after_smollm2 model=Qwen/Qwen3-8B adapted=outputs/train/qwen3_prefix/adapter" --wait':
        Checked("tests/test_slurm.py::test_pipeline_chains_data_train_and_before_after_eval"),
    # Sharded evaluation: shards and their merge in-process; the Slurm array on the local cluster
    "python -m eval.before_after recipe=before_after_smollm2 adapted=outputs/train/smollm2_prefix/adapter shard=0/2":
        Checked("tests/test_eval_shards.py::test_sharded_before_after_merges_into_the_unsharded_report"),
    "python -m eval.before_after recipe=before_after_smollm2 adapted=outputs/train/smollm2_prefix/adapter shard=1/2":
        Checked("tests/test_eval_shards.py::test_sharded_before_after_merges_into_the_unsharded_report"),
    "python -m eval recipe=suite_smollm2 shard=0/2": RunCheap(CHECK_ONLY),
    'slurm/eval_sharded.sh 4 --sbatch "--gpus 1" recipe=before_after_smollm2 adapted=outputs/train/RUN/adapter':
        Elsewhere("tests/test_slurm_eval.py::test_a_two_task_array_and_its_merge_job_write_the_unsharded_report"),
    'slurm/eval_sharded.sh 8 --sbatch "--gpus 1" --merge-sbatch "" eval recipe=suite_smollm2 --wait':
        Elsewhere("tests/test_slurm_eval.py::test_a_two_task_array_and_its_merge_job_write_the_unsharded_report"),
    "array=$(sbatch --parsable --array=0-3 --gpus 1 slurm/eval.sbatch recipe=before_after_smollm2 "
    "adapted=outputs/train/RUN/adapter)": Allowed("what slurm/eval_sharded.sh submits, run by tests/test_slurm_eval.py"),
    "sbatch --dependency=afterok:$array slurm/eval.sbatch recipe=before_after_smollm2 adapted=outputs/train/RUN/adapter":
        Allowed("what slurm/eval_sharded.sh submits, run by tests/test_slurm_eval.py"),
    # Typing-time simulation and the live page
    "python -m eval recipe=humaneval_smollm2 limit=40 decode.max_new_tokens=128 backend=vllm fast_batch_size=256 "
    "decode.lookup_match=longest decode.lookup_max_block=32 decode.lookup_choice=cost decode.width_cost=auto "
    "typing=cpm:260 output_dir=outputs/bench/typing27/humaneval": Checked(),
    "python -m eval recipe=humaneval_smollm2 typing=cpm:260": RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 limit=40 backend=vllm fast_batch_size=256 typing=cpm:260 "
    "output_dir=outputs/bench/typing27/recipe-default-40": RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 limit=40 backend=vllm fast_batch_size=256 typing=cpm:260 "
    "typing_policy=abandon decode.width_cost=auto output_dir=outputs/bench/typing27/recipe-default-40": RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 decode.max_new_tokens=128 typing=cpm:260 decode.width_cost=auto "
    "output_dir=outputs/bench/typing27/recipe-default-128": RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 decode.max_new_tokens=256 typing=cpm:260 decode.width_cost=auto "
    "output_dir=outputs/bench/typing27/recipe-default-256": RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 decode.max_new_tokens=128 decode.lookup_match=longest "
    "decode.lookup_max_block=32 decode.lookup_choice=cost decode.width_cost=auto typing=cpm:260 "
    "output_dir=outputs/bench/typing27/recipe-chooser-128": RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 decode.max_new_tokens=256 decode.lookup_match=longest "
    "decode.lookup_max_block=32 decode.lookup_choice=cost decode.width_cost=auto typing=cpm:260 "
    "output_dir=outputs/bench/typing27/recipe-chooser": RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 typing=cpm:260 typing_policy=abandon decode.width_cost=auto":
        RunCheap(CHECK_ONLY),
    "python -m eval recipe=humaneval_smollm2 typing=keystrokes.tsv":
        Elsewhere("tests/test_typing_sim.py::test_a_keystroke_trace_replays_its_gaps_cyclically"),
    "python -m eval.before_after recipe=before_after_smollm2 typing=cpm:400": Checked(
        "tests/test_typing_sim.py::test_before_after_report_shows_the_typing_simulation_in_markdown_html_and_wandb"),
    "python -m eval.live model=smollm2": Elsewhere("tests/test_live.py::test_typed_request_gets_plain_decodings_answer"),
    "python -m eval.live model=outputs/train/smollm2_prefix/adapter decode.max_new_tokens=128 port=8080":
        Checked("tests/test_serving.py::test_an_adapter_is_merged_once_and_served"),
    # Serving (docs/serving.md)
    "python -m eval.serve": Checked("tests/test_serving.py::test_models_and_health"),
    "python -m eval.serve model=outputs/train/smollm2_prefix/adapter":
        Checked("tests/test_serving.py::test_an_adapter_is_merged_once_and_served"),
    "python -m eval.serve drafts=false port=8001":
        Checked("tests/test_serving.py::test_typed_answers_equal_plain_vllm_under_every_policy"),
    "python -m eval.live": Elsewhere("tests/test_live.py::test_typed_request_gets_plain_decodings_answer"),
    "python benchmarks/bench_serving.py --limit 40 --typists 1 --benchmarks humaneval mbpp chat": HelpHas(),
    "python benchmarks/bench_serving.py --limit 16 --typists 4 16 --benchmarks humaneval": HelpHas(),
    "python -m eval.serve model=Qwen/Qwen3-8B adapter=outputs/train/qwen3_prefix/adapter host=0.0.0.0": Checked(),
    "sbatch --gpus 1 slurm/serve.sbatch model=outputs/train/qwen3_prefix/merged":
        Checked("tests/test_slurm_eval.py::test_a_serving_job_answers_over_http_until_cancelled"),
    "python benchmarks/live_screenshot.py model=smollm2 request=0 cpm=400 output=docs/live_page.png": Elsewhere(
        "tests/test_live.py::test_the_screenshot_command_types_a_benchmark_request_and_saves_the_answered_page"),
    # Device check
    "bash scripts/device_wheels.sh": Allowed("downloads about 21 MiB of wheels from PyPI for the GPU machine"),
    "bash scripts/device_check.sh --wheels .whl /tmp/headstart-device-check": Allowed(
        "needs a CUDA GPU; its CPU twin (the same stages) runs in tests/test_device_check.py"),
    "bash scripts/device_check.sh --cpu /tmp/headstart-device-check-cpu":
        Elsewhere("tests/test_device_check.py::test_the_cpu_twin_runs_every_stage_and_reruns_one_alone"),
    "bash scripts/device_check.sh --stage zero3 /tmp/headstart-device-check":
        Elsewhere("tests/test_device_check.py::test_the_cpu_twin_runs_every_stage_and_reruns_one_alone"),
}


def documents() -> list[Path]:
    """The files whose ```bash blocks are checked: README.md and every docs/*.md."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def block_commands(text: str) -> list[str]:
    """The commands of a Markdown text's ```bash blocks: continuation lines joined, trailing
    comments and repeated whitespace removed, each once, in order."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+", " ", re.sub(r"(^|\s+)#.*$", "", line)).strip()  # comments are not commands
            if command and command not in commands:
                commands.append(command)
    return commands


def documented_commands() -> dict[str, list[str]]:
    """Every documented command, in order of first appearance, with the files it appears in."""
    files_of: dict[str, list[str]] = {}
    for path in documents():
        for command in block_commands(path.read_text()):
            files_of.setdefault(command, []).append(str(path.relative_to(REPO)))
    return files_of


def test_every_documented_command_is_covered():
    documented = documented_commands()
    missing = [f"{c}   ({', '.join(files)})" for c, files in documented.items() if c not in COVERAGE]
    stale = [c for c in COVERAGE if c not in documented]
    assert not missing, "documented commands with no check (add them to COVERAGE):\n" + "\n".join(missing)
    assert not stale, "COVERAGE entries in neither README.md nor docs/*.md:\n" + "\n".join(stale)


def test_the_tests_named_as_running_a_command_exist():
    named = [c.test for c in COVERAGE.values() if isinstance(c, Elsewhere)]
    named += [c.elsewhere for c in COVERAGE.values() if isinstance(c, Checked) and c.elsewhere]
    for test in named:
        path, _, name = test.partition("::")
        assert f"def {name}(" in (REPO / path).read_text(), test


def split(command: str) -> tuple[dict[str, str], list[str]]:
    """(environment assignments, argv) of a README command line."""
    words = shlex.split(command)
    env = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def entry_and_arguments(argv: list[str]) -> tuple[str, list[str]]:
    """The entry point a command runs (`eval`, `train/sft.py`, `slurm/train.sbatch`, ...) and its
    key=value arguments; launcher options (accelerate's, sbatch's) are left out."""
    for i, word in enumerate(argv):
        if word.endswith((".py", ".sbatch", ".sh")) and i > 0 or word in ("-m",):
            if word == "-m":
                return argv[i + 1], argv[i + 2:]
            return word, argv[i + 1:]
    if argv[0].endswith(".sh"):
        return argv[0], argv[1:]
    raise ValueError(f"no entry point in {argv}")


def pipeline_arguments(arguments: list[str]) -> dict[str, list[str]]:
    """slurm/pipeline.sh's --data/--train/--eval strings, as the entry points they go to."""
    targets = {"--data": "data_builders", "--train": "train/sft.py", "--eval": "eval.before_after"}
    pairs = zip(arguments[::2], arguments[1::2])
    return {targets[flag]: value.split() for flag, value in pairs if flag in targets}


def parse(entry: str, arguments: list[str]) -> None:
    """Parse and validate `arguments` with the entry point's own schema, as it does at start."""
    from headstart.config import load_config

    if entry in ("train/sft.py", "train.download", "slurm/train.sbatch"):
        from train.sft import parse_recipe

        parse_recipe(arguments)
    elif entry in ("eval", "slurm/eval.sbatch") and not any(a.startswith("recipe=before_after") for a in arguments):
        from eval.evaluation.config import EvalConfig

        load_config(EvalConfig, arguments)
    elif entry in ("eval.before_after", "slurm/eval.sbatch"):
        from eval.before_after import BeforeAfterConfig

        load_config(BeforeAfterConfig, arguments)
    elif entry in ("data_builders", "slurm/data.sbatch"):
        from data_builders.config import BuildConfig

        load_config(BuildConfig, arguments)
    elif entry in ("eval.serve", "slurm/serve.sbatch"):
        from eval.serve import ServeConfig

        load_config(ServeConfig, arguments)
    elif entry == "eval.live":
        from eval.live import LiveConfig

        load_config(LiveConfig, arguments)
    elif entry == "train.merge":
        from train.merge import MergeArgs

        load_config(MergeArgs, arguments)
    elif entry == "benchmarks/study_adaptation.py":
        from study_adaptation import StudyConfig

        load_config(StudyConfig, arguments)
    elif entry == "slurm/pipeline.sh":
        for target, values in pipeline_arguments(arguments).items():
            parse(target, values)
    else:
        raise AssertionError(f"no schema known for {entry}")


@pytest.mark.parametrize("command", [c for c, check in COVERAGE.items() if isinstance(check, Checked)])
def test_readme_command_parses(command):
    entry, arguments = entry_and_arguments(split(command)[1])
    parse(entry, arguments)


def demo_stages() -> dict[str, list[str]]:
    """scripts/demo.sh's stages, name -> argv (its `"$@"`, the user's extra settings, left out)."""
    stages = {}
    script = (REPO / "scripts" / "demo.sh").read_text().replace("\\\n", " ")  # continued lines joined
    for line in script.splitlines():
        if line.startswith("stage "):
            name, *argv = shlex.split(line)[1:]
            stages[name] = [word for word in argv if word != "$@"]
    return stages


def test_demo_stages_parse():
    stages = demo_stages()
    assert list(stages) == ["data", "train", "eval"], stages
    for argv in stages.values():
        parse(*entry_and_arguments(argv))


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c, check in COVERAGE.items() if isinstance(check, RunCheap)])
def test_readme_command_runs_in_its_cheap_mode(command, tmp_path):
    env, argv = split(command)
    extra = list(COVERAGE[command].extra)
    if "limit=0" in extra:
        extra.append(f"output_dir={tmp_path / 'out'}")
    code, out, err = run_here([*argv, *extra], env)
    assert code == 0, f"{command} {' '.join(extra)}\n{out[-2000:]}\n{err[-3000:]}"


@functools.cache
def script_help(script: str, env: tuple[tuple[str, str], ...]) -> tuple[int, str, str]:
    """`python SCRIPT --help`, once per script and environment (several commands share a script)."""
    return run_here(["python", script, "--help"], dict(env))


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c, check in COVERAGE.items() if isinstance(check, HelpHas)])
def test_readme_benchmark_command_names_real_options(command):
    env, argv = split(command)
    script = next(word for word in argv if word.endswith(".py"))
    code, out, err = script_help(script, tuple(sorted(env.items())))
    assert code == 0, err[-3000:]
    for option in (word for word in argv if word.startswith("--")):
        assert option in out, f"{script} has no option {option}"


def test_the_readme_and_the_results_stay_short():
    """The README says what headstart is, how to set it up and run it (at most 250 lines); docs/results.md
    holds the current figures only (at most 450), superseded ones moving to CHANGELOG.md."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 250
    assert len((REPO / "docs" / "results.md").read_text().splitlines()) <= 450
