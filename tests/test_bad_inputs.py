"""Bad inputs, tried as a user would: each ends with exit code 2 and one `error:` line naming
the problem, before any model loads (issue 25, "Errors come before the model, in one line").

Every entry point is called in-process through its own main (what `python -m ...` runs).
A guard makes any model load fail the test: before these checks existed, each of these
inputs was found only once the model had loaded (minutes for an 8B model), or never, or
came out as a traceback.
"""

from __future__ import annotations

import os
import runpy
import socket
import subprocess
from pathlib import Path

import pytest
import transformers
from test_train_support import sft_here

from headstart.config import cli_main

REPO = Path(__file__).resolve().parent.parent
UNWRITABLE = "/sys/headstart-bad-input-test"  # sysfs refuses new entries, to root too


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load fails the test: these inputs must be refused before one."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a model was loaded ({args[1:2]}) before the bad input was refused")

    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        monkeypatch.setattr(auto, "from_pretrained", classmethod(refuse))


@pytest.fixture(scope="module")
def broken(tmp_path_factory, tiny_qwen3_dir) -> dict[str, Path]:
    """A model directory without weights, an adapter cut short, an adapter config that is not
    JSON, a binary data file, a plain file, a recipe that is not YAML."""
    import json
    import shutil

    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("broken")
    no_weights = root / "no_weights"
    shutil.copytree(tiny_qwen3_dir, no_weights)
    for weights in no_weights.glob("*.safetensors"):
        weights.unlink()
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir)
    adapter = root / "adapter"
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": str(tiny_qwen3_dir)}))
    truncated = root / "truncated_adapter"
    shutil.copytree(adapter, truncated)
    weights = truncated / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])  # an interrupted copy
    corrupt = root / "corrupt_adapter"
    shutil.copytree(adapter, corrupt)
    (corrupt / "adapter_config.json").write_text('{"base_model_name_or_path": ')
    binary = root / "rows.jsonl"
    binary.write_bytes(bytes(range(256)) * 8)
    plain = root / "a_file"
    plain.write_text("not a directory\n")
    recipe = root / "broken.yaml"
    recipe.write_text("model: smollm2\nlimit: [1\n  decode: {\n")
    return {"no_weights": no_weights, "truncated": truncated, "corrupt": corrupt, "binary": binary,
            "file": plain, "recipe": recipe, "model": tiny_qwen3_dir}


def one_error_line(code: int, err: str) -> str:
    """Exit code 2 and exactly one `error:` line, no traceback; returns that line."""
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert "Traceback" not in err and len(errors) == 1, err
    return errors[0]


def eval_main(argv):
    from eval.__main__ import main

    return main(argv)


def live_main(argv):
    from eval.live import main

    return main(argv)


def serve_main(argv):
    from eval.serve import main

    return main(argv)


def before_after_main(argv):
    from eval.before_after import main

    return main(argv)




def data_main(argv):
    from data_builders.build import main

    return main(argv)


# (entry point, its arguments from the fixtures and tmp_path, what the error line must say)
CASES = {
    # python -m eval
    "eval system_prompt typo": (eval_main, lambda b, t: ["system_prompt=incomplet"], ["system message setting 'incomplet'"]),
    "eval fast_batch_size=0": (eval_main, lambda b, t: ["fast_batch_size=0"], ["fast_batch_size must be in [1, 65536], not 0"]),
    # issue 61: each of these was accepted, named no file, read as a range error, or was refused only after the model
    "eval lookup_tree=100000": (eval_main, lambda b, t: ["decode.lookup_match=longest", "decode.lookup_tree=100000"],
                                ["decode.lookup_tree must be in [1, 256], not 100000"]),
    "eval negative vllm cache": (eval_main, lambda b, t: ["vllm.cpu_kv_cache_gib=-1"], ["vllm.cpu_kv_cache_gib must be >= 1"]),
    "eval vllm.max_model_len=10": (eval_main, lambda b, t: ["backend=vllm", "vllm.max_model_len=10"],
                                   ["vllm.max_model_len=10 cannot hold", "decode.max_new_tokens="]),
    "eval empty system_prompt": (eval_main, lambda b, t: ["system_prompt="],
                                 ["system_prompt= gives no value, and system_prompt cannot be null"]),
    "eval data_path a directory": (eval_main, lambda b, t: [f"data_path={t}"], ["is a directory; give a file"]),
    "eval typing file not UTF-8": (eval_main, lambda b, t: [f"typing={b['binary']}"], ["rows.jsonl: not UTF-8 text"]),
    "eval lookup_tree without its companion": (eval_main, lambda b, t: ["decode.lookup_tree=8"],
                                               ["decode.lookup_tree=8 needs the companion setting decode.lookup_match=longest"]),
    "eval dtype typo": (eval_main, lambda b, t: ["dtype=bfloat61"], ["dtype='bfloat61'", "bfloat16"]),
    "eval device typo": (eval_main, lambda b, t: ["device=cdua"], ["device='cdua' is not a torch device"]),
    "eval limit=0 model without weights": (eval_main, lambda b, t: [f"model={b['no_weights']}", "limit=0"],
                                           ["no_weights", "holds no weights"]),
    "eval limit=0 truncated adapter": (eval_main, lambda b, t: [f"adapter={b['truncated']}", "limit=0"],
                                       ["adapter_model.safetensors", "truncated"]),
    "eval limit=0 unwritable output_dir": (eval_main, lambda b, t: [f"output_dir={UNWRITABLE}", "limit=0"],
                                           [UNWRITABLE, "cannot be written"]),
    "eval output_dir under a file": (eval_main, lambda b, t: [f"output_dir={b['file']}/results"],
                                     ["a_file, which is a file"]),
    "eval binary data_path": (eval_main, lambda b, t: [f"data_path={b['binary']}"], ["rows.jsonl: not UTF-8 text"]),
    "eval corrupt adapter_config.json": (eval_main, lambda b, t: [f"adapter={b['corrupt']}"],
                                         ["corrupt_adapter/adapter_config.json: not readable JSON"]),
    "eval recipe not YAML": (eval_main, lambda b, t: [f"recipe={b['recipe']}"],
                             ["broken.yaml: not valid YAML", "line 3, column 9"]),
    # python -m eval.before_after
    "before_after system_prompt typo": (before_after_main, lambda b, t: [f"adapted={b['model']}", "system_prompt=incomplet"],
                                        ["system message setting 'incomplet'"]),
    "before_after dtype typo": (before_after_main, lambda b, t: [f"adapted={b['model']}", "dtype=fp16"], ["dtype='fp16'"]),
    # python -m eval.live
    "live port out of range": (live_main, lambda b, t: ["port=99999"], ["port=99999", "1-65535"]),
    "live system_prompt typo": (live_main, lambda b, t: ["system_prompt=bogus"], ["system message setting 'bogus'"]),
    "live dtype typo": (live_main, lambda b, t: ["dtype=floot32"], ["dtype='floot32'"]),
    # python -m eval.serve
    "serve token tree": (serve_main, lambda b, t: ["decode.lookup_match=longest", "decode.lookup_tree=4"],
                         ["one chain of proposed tokens", "lookup_tree must be 1"]),
    "serve speculative_tokens=0": (serve_main, lambda b, t: ["speculative_tokens=0"], ["speculative_tokens", ">= 1"]),
    "serve model without weights": (serve_main, lambda b, t: [f"model={b['no_weights']}"], ["no_weights", "holds no weights"]),
    "serve model too short for max_model_len": (serve_main, lambda b, t: [], ["needs 4096 tokens", "2048 positions"]),
    "serve adapter not an adapter": (serve_main, lambda b, t: [f"adapter={t}"], ["adapter", "adapter_config.json"]),
    # train/sft.py
    "train lora.r=0": (sft_here, lambda b, t: ["lora.r=0"], ["lora.r must be >= 1"]),
    "train negative learning rate": (sft_here, lambda b, t: ["training.learning_rate=-1e-4"],
                                     ["training.learning_rate must be a positive number"]),
    "train unknown report_to": (sft_here, lambda b, t: ["training.report_to=[tensorbord]"],
                                ["unknown tracker 'tensorbord'"]),
    "train output_dir is a file": (sft_here, lambda b, t: [f"training.output_dir={b['file']}"], ["a_file", "is a file"]),
    "train unwritable output_dir": (sft_here, lambda b, t: [f"training.output_dir={UNWRITABLE}"],
                                    [UNWRITABLE, "cannot be written"]),
    "train model without weights": (sft_here, lambda b, t: [f"model.name_or_path={b['no_weights']}"],
                                    ["holds no weights"]),
    "train recipe not YAML": (sft_here, lambda b, t: [f"recipe={b['recipe']}"], ["broken.yaml: not valid YAML"]),
    # python -m data_builders
    "data generation.max_new_tokens=0": (data_main, lambda b, t: ["generation.max_new_tokens=0"],
                                         ["generation.max_new_tokens must be at least 1"]),
    "data decontamination.ngram=0": (data_main, lambda b, t: ["decontamination.ngram=0"],
                                     ["decontamination.ngram must be at least 1"]),
    "data generation.device typo": (data_main, lambda b, t: ["generation.device=gpu"], ["generation.device='gpu'"]),
    "data output_dir under a file": (data_main, lambda b, t: [f"output_dir={b['file']}/data"], ["a_file, which is a file"]),
    "data unwritable output_dir": (data_main, lambda b, t: [f"output_dir={UNWRITABLE}", f"work_dir={t / 'work'}"],
                                   [UNWRITABLE, "cannot be written"]),
    "data recipe not YAML": (data_main, lambda b, t: [f"recipe={b['recipe']}"], ["broken.yaml: not valid YAML"]),
}

# What each entry point is given besides the bad input: a tiny model, files under tmp_path.
def base_arguments(main, broken: dict[str, Path], tmp_path: Path) -> list[str]:
    if main is eval_main:
        return ["recipe=humaneval_smollm2", f"model={broken['model']}", "limit=1", f"output_dir={tmp_path / 'eval'}"]
    if main is before_after_main:
        return [f"model={broken['model']}", "limit=1", f"output_dir={tmp_path / 'before_after'}"]
    if main in (live_main, serve_main):
        return [f"model={broken['model']}", "device=cpu", f"port={free_port()}"]
    if main is sft_here:
        data = tmp_path / "train.jsonl"
        data.write_text('{"messages": [{"role": "user", "content": "Add two numbers. In Python."}, '
                        '{"role": "assistant", "content": "def add(a, b):\\n    return a + b"}]}\n' * 4)
        return ["recipe=smollm2_prefix", f"model.name_or_path={broken['model']}", f"data.path={data}",
                "data.eval_split=null", "data.answers_from_other_model=true", "training.max_steps=1",
                "training.report_to=[none]", f"training.output_dir={tmp_path / 'train'}"]
    # The embedded build from its shipped answer cache; no token caps, so no tokenizer either.
    return ["recipe=embedded_prefix", "caps.max_tokens=0", f"output_dir={tmp_path / 'data'}"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_input_is_one_error_line_before_any_model_loads(case, broken, tmp_path, capsys, no_model_loads):
    main, arguments, needles = CASES[case]
    bad = arguments(broken, tmp_path)
    # The bad input comes last: on the command line, the last value of a key wins.
    code = main([*base_arguments(main, broken, tmp_path), *bad])
    line = one_error_line(code, capsys.readouterr().err)
    for needle in needles:
        assert needle in line, line


def test_the_live_page_refuses_a_port_in_use_before_loading(broken, capsys, no_model_loads):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = live_main([f"model={broken['model']}", "device=cpu", f"port={port}"])
    line = one_error_line(code, capsys.readouterr().err)
    assert f"cannot listen on 127.0.0.1:{port}" in line and "in use" in line


def test_unwritable_output_dirs_leave_nothing_behind(broken, tmp_path, capsys):
    """The write check makes and removes a directory where the output would go: a check-only run
    (limit=0) still writes nothing."""
    out = tmp_path / "new" / "results"
    assert eval_main(["recipe=humaneval_smollm2", f"model={broken['model']}", "limit=0", f"output_dir={out}"]) == 0
    assert "limit=0" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


# slurm/pipeline.sh: every argument is parsed and validated before the first sbatch. An sbatch
# first on PATH records each call instead of submitting: what the script would have queued.
# Caught by the script itself, before any Python runs.
PIPELINE_CASES = {
    "shard count not a number": (["--eval-shards", "four"], ["--eval-shards four"]),
    "shard count zero": (["--eval-shards", "0"], ["--eval-shards 0"]),
    "option without its value": (["--data"], ["--data needs a value"]),
    # The last stage's value: the data and training stages were checked (and passed) first.
    "bad eval value": (["--eval", "recipe=before_after_smollm2 system_prompt=incomplet"], ["--eval", "'incomplet'"]),
}
# Caught by slurm/check_args.py, which the script runs on every stage's arguments (the case above
# runs it through the script; these call it in this process: each launch imports TRL, 10 CPU-s).
CHECK_ARGS_CASES = {
    "bad train key": ({"train": "recipe=smollm2_prefix training.lora_r=8"}, ["--train", "unknown key training.lora_r"]),
    "bad train value": ({"train": "recipe=smollm2_prefix lora.r=0"}, ["lora.r must be >= 1"]),
    "bad data value": ({"data": "recipe=embedded_prefix decontamination.ngram=0"}, ["--data", "ngram"]),
    "unknown eval recipe": ({"eval": "recipe=before_after_nope"}, ["unknown recipe 'before_after_nope'"]),
}
PIPELINE_DEFAULTS = {"data": "recipe=embedded_prefix", "train": "recipe=smollm2_prefix", "eval": "recipe=before_after_smollm2"}


def recording_sbatch(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose `sbatch` appends its arguments to the returned file, one line per call,
    and answers the line's number as the job id."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "sbatch_calls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nwc -l < {calls}\n')
    (bin_dir / "sbatch").chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OMP_NUM_THREADS="1"), calls


@pytest.mark.parametrize("case", list(PIPELINE_CASES))
def test_the_pipeline_submits_nothing_before_every_argument_is_checked(case, tmp_path):
    arguments, needles = PIPELINE_CASES[case]
    env, calls = recording_sbatch(tmp_path)
    result = subprocess.run(["bash", "slurm/pipeline.sh", *arguments], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300)
    line = one_error_line(result.returncode, result.stderr)
    for needle in needles:
        assert needle in line, line
    assert not calls.exists(), f"submitted before the bad argument was found: {calls.read_text()}"


@pytest.mark.parametrize("case", list(CHECK_ARGS_CASES))
def test_check_args_refuses_a_bad_stage_in_one_line(case, capsys):
    """What pipeline.sh runs on its three stages' arguments, the script's defaults for the others."""
    check_stages = runpy.run_path(str(REPO / "slurm" / "check_args.py"), run_name="check_args")["check_stages"]
    changed, needles = CHECK_ARGS_CASES[case]
    stages = [word for stage, words in (PIPELINE_DEFAULTS | changed).items() for word in (stage, words)]
    line = one_error_line(cli_main(lambda: check_stages(stages)), capsys.readouterr().err)
    for needle in needles:
        assert needle in line, line


def test_eval_shards_queue_an_array_after_training_and_a_merge_after_both(tmp_path):
    """`--eval-shards 2`: slurm/eval_sharded.sh gets the training job (tests/test_slurm_eval.py runs
    the array and its merge on the local cluster, tests/test_slurm.py the unsharded chain)."""
    env, calls = recording_sbatch(tmp_path)
    result = subprocess.run(["bash", "slurm/pipeline.sh", "--eval-shards", "2"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    submitted = [line.split() for line in calls.read_text().splitlines() if "--test-only" not in line]
    assert len(submitted) == 4, submitted  # data, train, the array, the merge
    offset = len(calls.read_text().splitlines()) - len(submitted)  # the ids the --test-only calls took
    data, train, array, merge = (offset + i + 1 for i in range(4))
    assert "slurm/data.sbatch" in submitted[0] and f"--dependency=afterok:{data}" in submitted[1], submitted
    assert "--array=0-1" in submitted[2] and f"--dependency=afterok:{train}" in submitted[2], submitted
    assert f"--dependency=afterok:{array}:{train}" in submitted[3] and "slurm/eval.sbatch" in submitted[3], submitted
    assert f"shards {array} -> merge {merge}" in result.stdout
