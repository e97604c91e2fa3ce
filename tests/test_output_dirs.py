"""Output directories: a user's files are never overwritten, a resume never mixes inputs.

Every entry point that writes marks its directory with headstart's run record
(headstart.run_dir); an unmarked non-empty directory is refused before anything is
written (directories of earlier versions too: 0.1 keeps no compatibility shims),
and a directory without progress is no run."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_train_support import REPO, humaneval_dialogues, launch_env, tiny_overrides, write_jsonl

from eval.__main__ import main as eval_main
from eval.before_after import BeforeAfterConfig, run_before_after
from eval.engines.decode import DecodeSpec
from eval.evaluation.config import EvalConfig
from eval.evaluation.runner import run_evaluation
from eval.evaluation.suite import run_suite
from headstart.config import dump_config, load_config
from headstart.run_dir import MARK, OutputDirError, check_output_dir, write_mark
from train.checkpoints import COMPLETE_MARKER
from train.config import RecipeValueError, TrainRecipe
from train.data import data_fingerprint
from train.relaunch import check_inputs, check_run_dir, mark_run


def config_for(model_dir, output_dir, limit: int = 1, **overrides) -> EvalConfig:
    decode = DecodeSpec(max_new_tokens=8, **{k: overrides.pop(k) for k in ("acceptance",) if k in overrides})
    return EvalConfig(model=str(model_dir), output_dir=str(output_dir), limit=limit, decode=decode, **overrides)


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# --- A user's files are never overwritten ------------------------------------------


def test_the_issue_command_keeps_a_users_config_json(tmp_path, capsys):
    """`python -m eval ... output_dir=d` used to replace d/config.json ({"project": "x"}):
    it read as a results directory whose settings were all defaults."""
    users = tmp_path / "d"
    users.mkdir()
    (users / "config.json").write_text('{"project":"x"}\n')
    assert eval_main(["recipe=humaneval_smollm2", "decode.regenerate=plain", "limit=1", f"output_dir={users}"]) == 2
    err = capsys.readouterr().err
    assert f"output_dir {users} is not empty (config.json) and holds no {MARK}" in err and "Traceback" not in err
    assert files_of(users) == {"config.json": b'{"project":"x"}\n'}


def test_every_eval_entry_point_refuses_an_unmarked_directory(tmp_path, tiny_qwen3_dir):
    """A directory holding notes (no config.json at all) used to be written into."""
    users = tmp_path / "mine"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    runs = [
        lambda: run_evaluation(config_for(tiny_qwen3_dir, users)),
        lambda: run_evaluation(config_for(tiny_qwen3_dir, users, shard="0/2")),
        lambda: run_suite(replace(config_for(tiny_qwen3_dir, users), benchmarks=["humaneval"])),
        lambda: run_before_after(BeforeAfterConfig(model=str(tiny_qwen3_dir), adapted=str(tiny_qwen3_dir), limit=1,
                                                   decode=DecodeSpec(max_new_tokens=8), output_dir=str(users))),
    ]
    for run in runs:
        with pytest.raises(OutputDirError, match="holds no headstart-run.json"):
            run()
        assert files_of(users) == {"notes.txt": b"mine"}


def test_a_results_directory_is_marked_and_resumes(tmp_path, tiny_qwen3_dir):
    out = tmp_path / "out"
    run_evaluation(config_for(tiny_qwen3_dir, out))
    mark = json.loads((out / MARK).read_text())
    assert mark["written_by"] == "headstart" and mark["kind"] == "eval" and mark["version"]
    assert run_evaluation(config_for(tiny_qwen3_dir, out, limit=2))["requests"] == 2
    # Another kind's directory is not this one's.
    with pytest.raises(OutputDirError, match="holds a headstart eval run, not a train run"):
        check_run_dir(out, load_config(TrainRecipe, ["recipe=smollm2_prefix"]))


def test_results_without_the_run_record_are_refused(tmp_path, tiny_qwen3_dir):
    """The record is what makes a directory the evaluator's: its own files alone do not."""
    out = tmp_path / "out"
    run_evaluation(config_for(tiny_qwen3_dir, out))
    (out / MARK).unlink()
    with pytest.raises(OutputDirError, match="holds no headstart-run.json"):
        run_evaluation(config_for(tiny_qwen3_dir, out, limit=2))


def test_training_refuses_a_directory_holding_unrelated_files(tmp_path):
    recipe = load_config(TrainRecipe, ["recipe=smollm2_prefix"])
    users = tmp_path / "mine"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    with pytest.raises(OutputDirError, match="training.output_dir .* holds no headstart-run.json"):
        check_run_dir(users, recipe)
    # Nor is a run's set of files without the record (headstart 0.1 wrote none: no compatibility kept).
    unmarked = tmp_path / "unmarked"
    (unmarked / "checkpoint-2").mkdir(parents=True)
    (unmarked / "checkpoint-2" / COMPLETE_MARKER).write_text("2\n")
    dump_config(recipe, unmarked / "config.yaml")
    with pytest.raises(OutputDirError, match="holds no headstart-run.json"):
        check_run_dir(unmarked, recipe)
    # But a user's folder holding only a recipe is no run of ours: its config.yaml is not replaced.
    project = tmp_path / "project"
    project.mkdir()
    dump_config(recipe, project / "config.yaml")
    with pytest.raises(OutputDirError, match="holds no headstart-run.json"):
        check_run_dir(project, recipe)
    # headstart's own passing files (another rank's write probe) are not a user's.
    probe = tmp_path / "probed"
    (probe / ".headstart-write-check-x1").mkdir(parents=True)
    assert check_output_dir(probe, "train") == "new"
    assert check_output_dir(tmp_path / "absent", "train") == "new"
    (tmp_path / "empty").mkdir()
    assert check_output_dir(tmp_path / "empty", "train") == "new"


# --- A resume never mixes inputs ------------------------------------------------------


def test_a_sandbox_limit_is_part_of_the_resume_key(tmp_path, tiny_qwen3_dir):
    """`sandbox_cpu_seconds` decides verdicts; resuming under another limit used to mix them."""
    out = tmp_path / "out"
    run_evaluation(config_for(tiny_qwen3_dir, out))
    with pytest.raises(ValueError, match="sandbox_cpu_seconds: None -> 5"):
        run_evaluation(config_for(tiny_qwen3_dir, out, limit=2, sandbox_cpu_seconds=5))


def test_a_failed_eval_launch_does_not_poison_its_directory(tmp_path, tiny_qwen3_dir):
    """config.json is written before the model loads; a launch that failed there left a
    directory that refused the corrected command ("holds results of other settings")."""
    out = tmp_path / "out"

    def failing_load():
        raise RuntimeError("out of memory while loading")

    with pytest.raises(RuntimeError):
        run_evaluation(config_for(tiny_qwen3_dir, out), failing_load)
    assert (out / "config.json").is_file() and not (out / "results.jsonl").exists()
    corrected = config_for(tiny_qwen3_dir, out, acceptance="threshold:0.5")
    assert run_evaluation(corrected)["requests"] == 1
    assert json.loads((out / "config.json").read_text())["acceptance"] == "threshold:0.5"
    with pytest.raises(ValueError, match="acceptance"):  # now it holds a result: a run
        run_evaluation(config_for(tiny_qwen3_dir, out))


def test_a_failed_training_launch_does_not_poison_its_directory(tmp_path):
    recipe = load_config(TrainRecipe, ["recipe=smollm2_prefix"])
    run = tmp_path / "run"
    mark_run(run, {"data_fingerprint": "sha256:a", "model_fingerprint": "sha256:b"})
    dump_config(recipe, run / "config.yaml")  # what a launch writes before the model loads
    other = replace(recipe, lora=replace(recipe.lora, r=16))
    assert check_run_dir(run, other) == {}
    (run / "checkpoint-2").mkdir()
    with pytest.raises(RecipeValueError, match="holds a run of another recipe"):
        check_run_dir(run, other)


def test_training_inputs_are_checked_on_resume(tmp_path):
    run = tmp_path / "run"
    inputs = {"data_fingerprint": "sha256:" + "1" * 64, "model_fingerprint": "sha256:" + "2" * 64}
    mark_run(run, inputs)
    assert check_inputs(run, inputs, resuming=True) == inputs
    assert check_inputs(run, inputs | {"model_fingerprint": "sha256:3"}, resuming=False)["model_fingerprint"] == "sha256:3"
    with pytest.raises(RecipeValueError, match="model.name_or_path holds other weights"):
        check_inputs(run, inputs | {"model_fingerprint": "sha256:" + "3" * 64}, resuming=True)
    write_mark(run, "train")  # a record without fingerprints vouches for nothing: refused
    with pytest.raises(RecipeValueError, match="data_fingerprint unrecorded"):
        check_inputs(run, inputs, resuming=True)


def test_training_data_fingerprint_is_the_rows(tmp_path):
    from test_train_support import write_dataset_dict

    first = write_dataset_dict(tmp_path / "a", 4, 2)
    again = write_dataset_dict(tmp_path / "b", 4, 2)  # the same rows, saved again (state.json differs)
    assert data_fingerprint(str(first)) == data_fingerprint(str(again))
    before = data_fingerprint(str(first))
    (first / "train" / "cache-0123456789abcdef.arrow").write_bytes(b"a map's cache, written by a run")
    assert data_fingerprint(str(first)) == before  # a resume on the same rows is not refused
    other = write_dataset_dict(tmp_path / "c", 5, 1)
    assert data_fingerprint(str(first)) != data_fingerprint(str(other))
    assert data_fingerprint("org/dataset") == "hub:org/dataset"


@pytest.mark.slow
def test_a_rebuilt_dataset_at_the_same_path_is_not_resumed_on(tmp_path, tiny_qwen3_dir):
    """Rebuilding the data at the same path and rerunning used to continue the old
    checkpoints on the new rows."""
    data = write_jsonl(tmp_path / "data.jsonl", humaneval_dialogues(8))
    out = tmp_path / "run"

    def sft(**settings) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "train/sft.py", "recipe=smollm2_prefix",
                               *tiny_overrides(tiny_qwen3_dir, data, out, **settings)], cwd=REPO, env=launch_env(),
                              capture_output=True, text=True, timeout=300)

    first = sft(max_steps=2, save_steps=1)
    assert first.returncode == 0, first.stderr[-3000:]
    recorded = json.loads((out / MARK).read_text())["inputs"]
    assert recorded["data_fingerprint"] == data_fingerprint(str(data))
    write_jsonl(data, humaneval_dialogues(12)[4:])  # rebuilt: other rows, same path
    before = files_of(out)
    refused = sft(max_steps=4, save_steps=1)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "data.path holds other rows" in refused.stderr and "Traceback" not in refused.stderr
    assert files_of(out) == before


# --- One run writes a directory at a time ------------------------------------------------

HOLD_AND_WAIT = ("import sys, time\nfrom headstart.run_dir import holding_run_dir\n"
                 "with holding_run_dir(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)\n")


def held_by_another_process(directory: Path) -> subprocess.Popen:
    """A process holding `directory` (as a running evaluation or training does) until killed."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_WAIT, str(directory)], cwd=REPO, text=True,
                              stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_directory_another_run_writes_is_refused_with_its_pid(tmp_path, tiny_qwen3_dir, capsys):
    """Two evaluations on one output_dir at once used to both compute every request and append
    duplicate records; the second is now refused in one line naming the first's pid."""
    output = tmp_path / "eval"
    holder = held_by_another_process(output)
    try:
        argv = ["recipe=humaneval_smollm2", f"model={tiny_qwen3_dir}", "limit=1", "decode.max_new_tokens=8",
                f"output_dir={output}"]
        assert eval_main(argv) == 2
        err = capsys.readouterr().err
        assert f"is being written by another run (pid {holder.pid})" in err and "Traceback" not in err
        assert not (output / "results.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    assert eval_main(argv) == 0  # its holder gone (killed, no clean-up), the directory is free
    assert len((output / "results.jsonl").read_text().splitlines()) == 1
    run_evaluation(config_for(tiny_qwen3_dir, output))  # the same process may hold it again


def test_a_training_directory_another_launch_writes_is_refused(tmp_path, tiny_qwen3_dir):
    data = tmp_path / "train.jsonl"
    write_jsonl(data, humaneval_dialogues(4))
    output = tmp_path / "train"
    holder = held_by_another_process(output)
    try:
        command = [sys.executable, "train/sft.py", "recipe=smollm2_prefix", *tiny_overrides(tiny_qwen3_dir, data, output),
                   "data.eval_split=null"]
        done = subprocess.run(command, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2, done.stderr
    assert f"training.output_dir {output} is being written by another run (pid {holder.pid})" in done.stderr
    assert not any(output.glob("checkpoint-*"))


def test_a_data_build_another_build_runs_is_refused(tmp_path, capsys):
    from data_builders.build import main as build_main

    output = tmp_path / "data"
    holder = held_by_another_process(tmp_path / "data.work")
    try:
        assert build_main(["recipe=embedded_prefix", "caps.max_tokens=0", f"output_dir={output}"]) == 2
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert f"work_dir {tmp_path / 'data.work'} is being written by another run (pid {holder.pid})" in err
    assert not output.exists()
    # Its holder gone (killed: the lock file stays behind), the build runs, and runs again on its own work.
    assert build_main(["recipe=embedded_prefix", "caps.max_tokens=0", f"output_dir={output}"]) == 0
    assert build_main(["recipe=embedded_prefix", "caps.max_tokens=0", f"output_dir={output}"]) == 0
