"""The typing-time simulation: the unlimited typist is the sentence replay, hand-computed
timelines for both policies, keystroke traces, refused settings, determinism."""

from __future__ import annotations

import json

import pytest
from wandb_log import logged_by_runs

from eval.engines.decode import DecodeSpec
from eval.engines.width_table import WidthCost
from eval.evaluation.config import EvalConfig
from eval.evaluation.runner import run_evaluation
from eval.evaluation.typing_sim import UNLIMITED, cpm_typist, parse_typist, read_trace, simulate, typing_summary
from headstart.files import read_jsonl

PLAIN = DecodeSpec(regenerate="plain")


def evaluate(model_dir, output_dir, **overrides) -> list[dict]:
    decode = DecodeSpec(max_new_tokens=16, regenerate=overrides.pop("regenerate", "lookup"))
    config = EvalConfig(model=str(model_dir), output_dir=str(output_dir), limit=3, decode=decode, **overrides)
    run_evaluation(config)
    return read_jsonl(output_dir / "results.jsonl")


@pytest.mark.parametrize("regenerate", ["lookup", "plain"])
def test_unlimited_typist_reproduces_the_sentence_replay(tiny_qwen3_ending_dir, tmp_path, regenerate, cpu_width_table):
    records = evaluate(tiny_qwen3_ending_dir, tmp_path, typing="unlimited", regenerate=regenerate)
    decode = DecodeSpec(max_new_tokens=16, regenerate=regenerate)
    by_width = DecodeSpec(max_new_tokens=16, regenerate=regenerate, width_cost=str(cpu_width_table))
    for record in records:
        typed = simulate(record, UNLIMITED, "abandon", decode)
        assert typed.time_to_answer == record["residual_seconds"]  # exactly, not approximately
        assert simulate(record, UNLIMITED, "finish", by_width).time_to_answer == record["residual_seconds"]
        assert typed.final_forwards == record["residual_forwards"]
        assert typed.drafting_forwards == record["drafting_forwards"]
        assert typed.updates == typed.kept_up == record["n_segments"] - 1 and typed.waited == 0
        assert typed.baseline_seconds == record["baseline_seconds"]
    report = (tmp_path / "report.md").read_text()
    assert "Typing-time simulation" in report and (tmp_path / "typing_curve.png").stat().st_size > 0


def hand_record() -> dict:
    """Three 2-character segments; 1 s per drafting forward, 0.5 s per residual forward.
    D_1 = 5 tokens (5 forwards from nothing); D_2 = the answer, ending in EOS 99, shares
    3 tokens with D_1 (2 forwards from D_1: verify + 1 step), and is final (1 forward)."""
    answer = [1, 2, 3, 9, 99]
    return {
        "request_id": "hand", "segments": ["ab", "cd", "ef"], "base_answer": "x", "stream_answer": "x",
        "draft_token_ids": [[1, 2, 3, 4, 5], answer], "stream_token_ids": answer,
        "prompt_token_ids": [[7], [7, 7], [7, 7, 7]], "eos_token_ids": [99],
        "baseline_forwards": 5, "baseline_seconds": 5.0, "residual_forwards": 1, "residual_seconds": 0.5,
        "drafting_forwards": 7,
    }


def test_finish_policy_waits_for_the_running_update():
    # 1 s per character: S_1, S_2, S_3 at 2, 4, 6 s. D_1 runs 2-7 s (late for S_2 at 4 s);
    # finished at 7, S_3 is already there: the final update holds D_1, waits 1 s, then
    # 2 forwards (3 tokens kept, one step to EOS) at 0.5 s.
    typed = simulate(hand_record(), cpm_typist(60), "finish", PLAIN)
    assert (typed.updates, typed.kept_up, typed.abandoned, typed.drafting_forwards) == (1, 0, 0, 5)
    assert typed.waited == 1.0 and typed.final_forwards == 2 and typed.time_to_answer == 2.0


def test_a_width_cost_table_charges_each_forward_its_width(tmp_path):
    """A table where a forward of w tokens costs w steps. The baseline is a 3-token prefill and
    4 steps: 7 steps in 5 s. D_1 from nothing: a 1-token verify pass and 4 steps, 5 steps =
    3.571 s (2-5.571 s, late for S_2 at 4 s). D_2 holds D_1: its verify pass feeds the new
    prompt token and D_1 (6 tokens: 6 steps) and one step to EOS, 5 s (5.571-10.571 s). The
    final update is the replay's own (verify over 6 tokens): 0.5 s, after waiting 4.571 s."""
    WidthCost((1, 2), (0.1, 0.2), 256, "m", "cpu-test").save(tmp_path / "linear.json")
    typed = simulate(hand_record(), cpm_typist(60), "finish", DecodeSpec(regenerate="plain",
                                                                         width_cost=str(tmp_path / "linear.json")))
    assert (typed.updates, typed.kept_up, typed.drafting_forwards, typed.final_forwards) == (2, 0, 7, 1)
    assert typed.waited == pytest.approx(2 + 25 / 7 + 5 - 6) and typed.time_to_answer == pytest.approx(typed.waited + 0.5)


def test_abandon_policy_restarts_from_the_newest_segment():
    # D_1 (2-7 s) is abandoned at 4 s when S_2 arrives; D_2 from nothing (5 forwards,
    # 4-9 s) is abandoned at 6 s by S_3: the final update holds no draft, 5 forwards.
    typed = simulate(hand_record(), cpm_typist(60), "abandon", PLAIN)
    assert (typed.updates, typed.kept_up, typed.abandoned, typed.drafting_forwards) == (2, 0, 2, 0)
    assert typed.waited == 0 and typed.final_forwards == 5 and typed.time_to_answer == 2.5


def test_a_slow_typist_keeps_up_and_equals_the_replay():
    # 10 s per character: D_1 at 20-25 s, D_2 at 40-42 s, both kept up; the final is the replay's.
    for policy in ("finish", "abandon"):
        typed = simulate(hand_record(), cpm_typist(6), policy, PLAIN)
        assert (typed.updates, typed.kept_up, typed.drafting_forwards) == (2, 2, 7)
        assert typed.time_to_answer == 0.5 == simulate(hand_record(), UNLIMITED, policy, PLAIN).time_to_answer


def test_a_keystroke_trace_replays_its_gaps_cyclically(tmp_path):
    trace = tmp_path / "trace.tsv"
    trace.write_text("# seconds\tcharacter\n0.0\ta\n1.0\tb\n\n2.0\tc\n3.0\td\n")
    typist = read_trace(trace)
    assert typist.label == "trace:trace.tsv" and typist.arrivals(["ab", "cd", "ef"]) == [2.0, 4.0, 6.0]
    expected = simulate(hand_record(), cpm_typist(60), "finish", PLAIN)
    assert vars(simulate(hand_record(), typist, "finish", PLAIN)) == vars(expected)
    uneven = tmp_path / "uneven.txt"
    uneven.write_text("0\n0.5\n2.5\n")  # gaps 0.5, 2: characters at 0.5, 2.5, 3, 5, 5.5, 7.5
    assert read_trace(uneven).arrivals(["ab", "cd", "ef"]) == [2.5, 5.0, 7.5]


@pytest.mark.parametrize("text, message", [
    ("0\nabc\n", r"bad.txt:2: 'abc' is not a keystroke time in seconds"),
    ("0\n2\n1\n", r"bad.txt:3: keystroke times must not decrease \(1 after 2\)"),
    ("3\n", r"bad.txt: a keystroke trace needs at least 2 keystroke times, found 1"),
    ("1\n1\n", r"bad.txt: every keystroke has the same time"),
    ("0\n-1\n", r"bad.txt:2: keystroke time -1 must be a finite number of seconds >= 0"),
    ("0\nnan\n", r"bad.txt:2: keystroke time nan must be a finite"),
])
def test_trace_errors_name_the_file_line_and_problem(tmp_path, text, message):
    (tmp_path / "bad.txt").write_text(text)
    with pytest.raises(ValueError, match=message):
        parse_typist(str(tmp_path / "bad.txt"))


@pytest.mark.parametrize("overrides, message", [
    ({"typing": "cpm:fast"}, "N of cpm:N must be a number"),
    ({"typing": "cpm:0"}, "typing speed N > 0"),
    ({"typing": "no/such/trace.txt"}, "neither 'unlimited', 'cpm:<N>' nor an existing keystroke trace file"),
    ({"typing": "cpm:400", "typing_policy": "wait"}, "typing_policy must be one of finish, abandon"),
    ({"typing": "cpm:400", "decode": DecodeSpec(acceptance="threshold:0.9")}, "needs decode.acceptance=greedy"),
])
def test_typing_settings_are_refused_before_anything_loads(overrides, message):
    with pytest.raises(ValueError, match=message):
        EvalConfig(**overrides)


def test_rerun_gives_the_identical_report(tiny_qwen3_ending_dir, tmp_path):
    """Deterministic given the recorded step times: the report is rebuilt from results.jsonl
    alone (a rerun computes nothing and reads no clock) and comes out byte for byte the same."""
    evaluate(tiny_qwen3_ending_dir, tmp_path, typing="cpm:400", typing_policy="abandon")
    first = {name: (tmp_path / name).read_bytes() for name in ("report.md", "typing.json")}
    evaluate(tiny_qwen3_ending_dir, tmp_path, typing="cpm:400", typing_policy="abandon")
    assert {name: (tmp_path / name).read_bytes() for name in first} == first
    typing = json.loads(first["typing.json"])["humaneval"]
    assert [p["typist"] for p in typing["curve"]] == ["cpm:200", "cpm:260", "cpm:400", "cpm:800", "unlimited"]
    assert len(typing["configured"]["requests"]) == 3 and typing["configured"]["typist"] == "cpm:400"


def test_results_written_without_typing_are_refused_clearly(tiny_qwen3_dir, tmp_path):
    records = evaluate(tiny_qwen3_dir, tmp_path)
    with pytest.raises(ValueError, match="lacks draft_token_ids.*evaluated without `typing`"):
        typing_summary(records, UNLIMITED, "finish", DecodeSpec())


def test_before_after_report_shows_the_typing_simulation_in_markdown_html_and_wandb(tmp_path, tiny_qwen3_dir, monkeypatch):
    from test_before_after import make_adapter

    from eval.before_after import BeforeAfterConfig, run_before_after

    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "report"
    config = BeforeAfterConfig(model=str(tiny_qwen3_dir), adapted=str(make_adapter(tiny_qwen3_dir, tmp_path / "adapter")),
                               limit=2, decode=DecodeSpec(max_new_tokens=12), typing="cpm:400", output_dir=str(out))
    summaries = run_before_after(config)
    report, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    for side in ("before", "after"):
        assert f"Typing-time simulation, {side} (policy `finish`)" in report and f"Typing-time simulation, {side}" in page
        assert (out / "figures" / f"typing_{side}.png").stat().st_size > 1000
        assert "typing_unlimited_time_to_answer_median" in summaries["humaneval"][side]
    assert page.count("<table>") == 6 and "cpm:800" in page  # Tables 1-3, paired changes, a typing table per side
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2
    key = b"humaneval/typing_cpm400_time_to_answer_median"
    for run, logged in zip(runs, logged_by_runs(runs, key, holders=len(runs))):
        # each side's run holds the typing figures and numbers (offline: in its .wandb log)
        images = (run / "files" / "media" / "images").glob("typing_*.png")
        assert {p.name.split("_1_")[0] for p in images} == {"typing_before", "typing_after"}
        assert key in logged
