"""Loaders on the real samples (../shared/data) and the schema fixtures:
counts, lossless segmentation, the PROTOCOL order, and scoring of known answers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from eval.benchmarks import BENCHMARKS, get_benchmark
from eval.benchmarks.canitedit import CanItEdit, canitedit_request_text
from eval.benchmarks.chat import Chat
from eval.benchmarks.coedit import CoEdIT, coedit_request_text, split_source
from eval.benchmarks.ds1000 import DS1000, ds1000_segments
from eval.benchmarks.imports import imported_modules, installed
from eval.benchmarks.mbpp import MBPP, entry_point

FIXTURES = Path(__file__).parent / "fixtures"


def rows(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return [json.loads(line) for line in handle]


def fenced(code: str) -> str:
    return f"Here is the program:\n\n```python\n{code}\n```\n"


def test_registry_holds_the_six_benchmarks():
    assert set(BENCHMARKS) == {"humaneval", "mbpp", "canitedit", "ds1000", "coedit", "chat"}
    with pytest.raises(ValueError, match="known"):
        get_benchmark("mmlu")


# MBPP ---------------------------------------------------------------------------------

def test_mbpp_loads_the_test_split_and_streams_description_then_asserts(shared_data_dir):
    requests = MBPP(str(shared_data_dir / "mbpp" / "mbpp.jsonl")).load()
    assert len(requests) == 500
    assert [r.request_id for r in requests[:2]] == ["mbpp/11", "mbpp/12"] and requests[-1].request_id == "mbpp/510"
    first = requests[0]
    assert first.segments[0].startswith("Write a python function to remove first and last occurrence")
    intro = "Your code should pass these tests:\n```python\n"
    assert [s.removeprefix(intro)[:7] for s in first.segments[1:]] == ["assert "] * 3 and first.segments[1].startswith(intro)
    assert first.text.endswith('== "H"\n```') and first.reference["entry_point"] == "remove_Occ"
    assert len(MBPP(str(shared_data_dir / "mbpp" / "sanitized-mbpp.json")).load()) == 257
    assert len(MBPP(str(shared_data_dir / "mbpp" / "mbpp.jsonl")).load(limit=7)) == 7


def test_mbpp_scores_the_reference_solution_as_a_pass(shared_data_dir):
    path = shared_data_dir / "mbpp" / "mbpp.jsonl"
    solutions = {row["task_id"]: row["code"] for row in rows(path)}
    benchmark = MBPP(str(path))
    request = benchmark.load(limit=1)[0]
    assert benchmark.score(request, fenced(solutions[11])).passed
    assert not benchmark.score(request, fenced("def remove_Occ(s, ch):\n    return s")).passed
    assert entry_point(["assert (sum_of( [1]) == 1)"]) == "sum_of"


# CanItEdit ----------------------------------------------------------------------------

def test_canitedit_streams_the_program_first_and_the_instruction_last(shared_data_dir):
    path = shared_data_dir / "canitedit" / "canitedit.jsonl"
    requests = CanItEdit(str(path)).load()
    assert len(requests) == 105
    source = {f"canitedit/{row['full_name']}": row for row in rows(path)}
    for request in requests:
        row = source[request.request_id]
        assert request.text == canitedit_request_text(row["before"], row["instruction_descriptive"])
        assert request.segments[0].startswith("```python\n")
        assert row["instruction_descriptive"].strip().endswith(request.segments[-1].strip())
    lazy = CanItEdit(str(path), instruction="lazy").load(limit=1)[0]
    assert lazy.text.endswith(source[lazy.request_id]["instruction_lazy"].strip())


def test_canitedit_passes_the_edited_program_and_fails_the_original(shared_data_dir):
    path = shared_data_dir / "canitedit" / "canitedit.jsonl"
    benchmark = CanItEdit(str(path))
    request = benchmark.load(limit=1)[0]
    row = rows(path)[0]
    assert benchmark.score(request, fenced(row["after"])).passed
    assert not benchmark.score(request, fenced(row["before"])).passed


def test_canitedit_skips_problems_whose_libraries_are_missing(shared_data_dir):
    benchmark = CanItEdit(str(shared_data_dir / "canitedit" / "canitedit.jsonl"))
    z3 = [r for r in benchmark.load() if "z3" in imported_modules(r.reference["before"] + "\n" + r.reference["tests"])]
    assert z3
    score = benchmark.score(z3[0], fenced(z3[0].reference["before"]))
    assert score.detail.startswith("skipped") == (not installed("z3"))
    assert imported_modules("import os.path\nfrom numpy import array\nfrom . import x\n") == {"os", "numpy"}


# DS-1000 ------------------------------------------------------------------------------

def test_ds1000_loads_all_problems_losslessly(shared_data_dir):
    path = shared_data_dir / "ds1000" / "ds1000.jsonl.gz"
    requests = DS1000(str(path)).load()
    assert len(requests) == 1000
    libraries = {}
    for request, row in zip(requests, rows(path)):
        assert request.text == row["prompt"] and request.request_id == f"ds1000/{row['metadata']['problem_id']}"
        libraries[request.reference["library"]] = libraries.get(request.reference["library"], 0) + 1
    assert libraries == {"Pandas": 291, "Numpy": 220, "Matplotlib": 155, "Sklearn": 115, "Scipy": 106,
                         "Pytorch": 68, "Tensorflow": 45}


def test_ds1000_code_stays_whole_lines_with_its_tags():
    prompt = "Problem:\nSum it. Then print.\nA:\n<code>\nimport numpy as np\nx = 'a. B'\n</code>\nBEGIN SOLUTION\n<code>\n"
    segments = ds1000_segments(prompt)
    assert "".join(segments) == prompt
    assert "<code>\nimport numpy as np\nx = 'a. B'\n</code>\n" in segments
    assert segments[:3] == ["Problem:\n", "Sum it.", " Then print.\n"]


def test_ds1000_official_execution_passes_the_reference_and_fails_a_wrong_answer(shared_data_dir):
    benchmark = DS1000(str(shared_data_dir / "ds1000" / "ds1000.jsonl.gz"))
    request = benchmark.load(limit=1)[0]  # a Pandas problem
    reference = request.reference["reference_code"]
    assert benchmark.score(request, f"<code>\n{reference}\n</code>\nEND SOLUTION").passed
    assert benchmark.score(request, fenced(reference)).passed
    assert not benchmark.score(request, "result = df\n").passed


def test_ds1000_reports_problems_of_missing_libraries_as_skipped(shared_data_dir):
    benchmark = DS1000(str(shared_data_dir / "ds1000" / "ds1000.jsonl.gz"))
    tensorflow = next(r for r in benchmark.load() if r.reference["library"] == "Tensorflow")
    score = benchmark.score(tensorflow, tensorflow.reference["reference_code"])
    if installed("tensorflow"):
        assert not score.detail.startswith("skipped")
    else:
        assert score.detail.startswith("skipped") and score.passed is None and score.value == 0.0


# CoEdIT -------------------------------------------------------------------------------

def test_coedit_streams_the_text_first_and_the_instruction_last():
    path = FIXTURES / "coedit" / "validation.jsonl"
    requests = CoEdIT(str(path)).load()
    assert len(requests) == 24
    for request, row in zip(requests, rows(path)):
        instruction, text = split_source(row["src"])
        assert request.text == coedit_request_text(row["src"]) == f"{text}\n\n{instruction}."
        assert request.segments[-1] == f"{instruction}." and request.reference["tgt"] == row["tgt"]
    assert requests[1].segments == ["The results was suprising, and nobody expect them.",
                                    " We checked the data twice.\n\n", "Fix the grammar."]


def test_coedit_scores_token_f1_of_the_edited_text():
    benchmark = CoEdIT(str(FIXTURES / "coedit" / "validation.jsonl"))
    request = benchmark.load(limit=1)[0]  # tgt: "She goes to the market every morning."
    assert benchmark.score(request, "Here is the corrected sentence:\n\"She goes to the market every morning.\"").value == 1.0
    # "she go to market every mornings" vs "she goes to market every morning": 4 of 6 tokens.
    assert benchmark.score(request, "She go to the market every mornings.").value == pytest.approx(4 / 6)
    with pytest.raises(ValueError, match="instruction: text"):
        split_source("no colon here")


# Chat ---------------------------------------------------------------------------------

def test_chat_streams_the_final_user_turn_after_the_history(shared_data_dir):
    ultrachat = FIXTURES / "ultrachat" / "test_sft.jsonl"
    requests = Chat(f"{ultrachat},{shared_data_dir / 'mt_bench'}").load()
    by_source = {"ultrachat": [], "mtbench": []}
    for request in requests:
        by_source[request.request_id.split("/")[0]].append(request)
    assert len(by_source["ultrachat"]) == 4 and len(by_source["mtbench"]) == 27
    assert [r.request_id.split("/")[0] for r in requests[:4]] == ["ultrachat", "mtbench"] * 2
    dialogue = rows(ultrachat)[2]["messages"]  # three user turns: the last one is streamed
    lisbon = next(r for r in requests if r.history and r.history[0]["content"] == dialogue[0]["content"])
    assert lisbon.history == dialogue[:4] and lisbon.text == dialogue[4]["content"]
    assert lisbon.segments == ["Great.", " How early should I get there?", " I want to avoid the crowds at Pena Palace."]
    assert lisbon.reference["answer"] == dialogue[5]["content"]
    second_turn = next(r for r in by_source["mtbench"] if r.request_id == "mtbench/106-2")
    assert [m["role"] for m in second_turn.history] == ["user", "assistant"]
    assert second_turn.history[1]["content"] == "true."


def test_chat_scores_f1_against_the_reference(shared_data_dir):
    benchmark = Chat(str(FIXTURES / "ultrachat" / "test_sft.jsonl"))
    request = benchmark.load(limit=1)[0]
    assert benchmark.score(request, request.reference["answer"]).value == 1.0
    assert benchmark.score(request, "Zebra xylophone.").value == 0.0


# Bad input ----------------------------------------------------------------------------

def test_missing_files_and_fields_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        MBPP(str(tmp_path / "absent.jsonl")).load()
    with pytest.raises(FileNotFoundError, match="chat data not found"):
        Chat(str(tmp_path / "absent")).load()
    broken = tmp_path / "coedit.jsonl"
    broken.write_text(json.dumps({"_id": "1", "src": "Fix: x"}) + "\n")
    with pytest.raises(ValueError, match="tgt"):
        CoEdIT(str(broken)).load()
    broken.write_text("{not json\n")
    with pytest.raises(ValueError, match="not a JSON line"):
        CoEdIT(str(broken)).load()


# Round trip ---------------------------------------------------------------------------

def all_requests(shared_data_dir):
    data = {"mbpp": shared_data_dir / "mbpp" / "mbpp.jsonl", "canitedit": shared_data_dir / "canitedit" / "canitedit.jsonl",
            "ds1000": shared_data_dir / "ds1000" / "ds1000.jsonl.gz", "coedit": FIXTURES / "coedit" / "validation.jsonl",
            "chat": f"{FIXTURES / 'ultrachat' / 'test_sft.jsonl'},{shared_data_dir / 'mt_bench'}"}
    return {name: get_benchmark(name, str(path)).load() for name, path in data.items()} | {"humaneval": get_benchmark("humaneval").load()}


def test_every_request_is_streamable_and_its_segments_rebuild_it(shared_data_dir):
    mbpp_rows = {f"mbpp/{row['task_id']}": row for row in rows(shared_data_dir / "mbpp" / "mbpp.jsonl")}
    for name, requests in all_requests(shared_data_dir).items():
        assert requests, name
        for request in requests:
            assert len(request.segments) >= 2 and all(s.strip() for s in request.segments), request.request_id
            assert len({r.request_id for r in requests}) == len(requests), name
        if name == "mbpp":
            for request in requests:
                row = mbpp_rows[request.request_id]
                tests = "\n".join(test.strip() for test in row["test_list"])
                assert request.text == f"{row['text'].strip()}\nYour code should pass these tests:\n```python\n{tests}\n```"
