"""The embedded recipe: SmolLM2's shipped answers make the CPU build instant, and they are real.

Both tests load SmolLM2-135M (its tokenizer, or the model), hence `slow`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets import load_from_disk

from data_builders.answer_cache import AnswerCache
from data_builders.build import build
from data_builders.config import BuildConfig
from data_builders.generation import GenerationSettings, cache_path, greedy_answers_finished
from data_builders.report import Report
from headstart.config import load_config
from headstart.prompts import INCOMPLETE_REQUEST_SYSTEM

EMBEDDED = Path(__file__).resolve().parents[1] / "data_builders" / "embedded"


@pytest.mark.slow
def test_embedded_recipe_builds_from_shipped_answers(tmp_path):
    output = build(load_config(BuildConfig, ["recipe=embedded_prefix", f"output_dir={tmp_path / 'out'}"]))
    assert not cache_path(tmp_path / "out.work", "smollm2").exists()  # nothing had to be generated
    data = load_from_disk(str(output))
    cache = AnswerCache(tmp_path / "unused.jsonl", [EMBEDDED / "smollm2_answers.jsonl"])
    shipped = {cache.get(key) for key in cache.answers if cache.finished(key)}
    assert len(shipped) == 23  # 13 of the 36 shipped answers reach the 192-token cap without ending
    rows = list(data["train"]) + list(data["validation"])
    assert len({r["source_id"] for r in rows}) == 23
    assert Report.load(output / "report.json").drops["answer_hit_token_cap"] == 13
    assert len(data["validation"]) > 0
    for row in rows:
        assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
        assert row["messages"][0]["content"] == INCOMPLETE_REQUEST_SYSTEM
        assert row["messages"][2]["content"] in shipped and row["answer_model"] == "smollm2"


@pytest.mark.slow
def test_shipped_answers_are_smollm2_greedy_answers(tmp_path):
    """Regenerate the first batch (the six shortest prompts) with the recipe's settings."""
    config = load_config(BuildConfig, ["recipe=embedded_prefix"])
    requests = [json.loads(line)["request"] for line in (EMBEDDED / "requests.jsonl").open()]
    settings = GenerationSettings(
        model=config.model,
        max_new_tokens=config.generation.max_new_tokens,
        batch_size=config.generation.batch_size,
        backend="transformers",
    )
    shipped = [json.loads(line) for line in (EMBEDDED / "smollm2_answers.jsonl").open()]
    fresh = AnswerCache(tmp_path / "cache.jsonl")
    fresh.add(shipped[settings.batch_size :])  # all but the first batch, as the shipped file was written in order
    answers = [answer for answer, _ in greedy_answers_finished(requests, settings, fresh, desc="regenerate one batch")]
    assert len(fresh.answers) == len(shipped)
    expected = {e["key"]: e["answer"] for e in shipped}
    assert all(fresh.get(e["key"]) == expected[e["key"]] for e in shipped[: settings.batch_size])
    # The shipped `finished` flags are what the backend reports (whether the answer ended before the cap).
    assert all(fresh.finished(e["key"]) == e["finished"] for e in shipped[: settings.batch_size])
    assert sorted(answers) == sorted(expected.values())
