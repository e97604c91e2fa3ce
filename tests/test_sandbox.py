"""Hostile programs end as failures within their limits and touch nothing outside."""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from pathlib import Path

import pytest

from eval.benchmarks.mbpp import MBPP
from eval.sandbox import SHARED_WRITABLE_DIRS, SandboxLimits, run_many, run_tests

LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=5, memory_bytes=1 << 30, max_processes=16)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="process and file containment use a throw-away uid (root only)")


def assert_contained(program: str, limits: SandboxLimits = LIMITS) -> None:
    start = time.monotonic()
    result = run_tests(program, limits)
    assert not result.passed
    assert time.monotonic() - start < limits.wall_seconds + 5


def test_a_correct_program_passes_and_a_wrong_one_fails():
    assert run_tests("def f():\n    return 1\n\nassert f() == 1\n", LIMITS).passed
    assert not run_tests("assert 1 == 2\n", LIMITS).passed


def test_infinite_loop_stops_at_the_cpu_limit():
    result = run_tests("while True:\n    pass\n", LIMITS)
    assert not result.passed and result.status == "timeout"


def test_sleeping_past_the_wall_limit_is_a_timeout():
    result = run_tests("import time\ntime.sleep(60)\n", LIMITS)
    assert not result.passed and result.status == "timeout"
    assert result.seconds < LIMITS.wall_seconds + 2


def test_ten_gigabyte_allocation_fails():
    assert_contained("x = bytearray(10 * 1024 ** 3)\n")


def test_exit_zero_before_the_asserts_is_a_failure():
    result = run_tests("import sys\nsys.exit(0)\nassert False\n", LIMITS)
    assert result.returncode == 0 and not result.passed


def test_infinite_output_is_capped():
    result = run_tests("while True:\n    print('x' * 1000)\n", LIMITS)
    assert not result.passed and len(result.stdout) <= LIMITS.max_output_bytes


@needs_root
def test_fork_bomb_is_contained_and_cleaned_up():
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert_contained(program)
    time.sleep(0.2)
    survivors = [p for p in os.listdir("/proc") if p.isdigit() and _uid(p) >= 3_000_000 and not _zombie(p)]
    assert survivors == []


@needs_root
def test_deleting_files_outside_the_temp_dir_changes_nothing(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    program = f"import os, shutil\nos.system('rm -rf {victim}')\nshutil.rmtree({str(victim)!r})\n"
    assert_contained(program)
    assert (victim / "keep.txt").read_text() == "precious"


@needs_root
def test_killing_the_parent_and_opening_sockets_fail():
    assert_contained("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n")
    assert_contained("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)\n")


def test_the_evaluator_keeps_going_after_hostile_programs():
    programs = ["while True:\n    pass\n", "import sys\nsys.exit(0)\n", "assert 2 + 2 == 4\n"]
    results = run_many(programs, LIMITS, workers=2)
    assert [r.passed for r in results] == [False, False, True]


def hostile_suite(victim: Path, marker: str) -> dict[str, str]:
    """Every hostile behaviour of the issue, aimed at `victim` and the shared
    writable directories (where `marker` files would betray an escape)."""
    escapes = "".join(f"    open({f'{d}/{marker}'!r}, 'w').write('x')\n" for d in SHARED_WRITABLE_DIRS)
    return {
        "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "memory bomb": "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 26))\n",
        "infinite output": "while True:\n    print('x' * 4096)\n",
        "delete outside": f"import os, shutil\nos.system('rm -rf {victim}')\nshutil.rmtree({str(victim)!r})\n",
        "overwrite outside": f"open({str(victim / 'keep.txt')!r}, 'w').write('gone')\n",
        "write shared dirs": f"for _ in [0]:\n{escapes}assert False\n",
        "kill the parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\n",
        "open sockets": "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)\n",
        "sleep past the limit": "import time\ntime.sleep(600)\n",
        "exit 0 before the asserts": "import sys\nsys.exit(0)\nassert False\n",
        "detached child": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\nassert False\n",
    }


def snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(directory.rglob("*"))}


@needs_root
def test_the_hostile_suite_fails_within_its_limits_and_changes_nothing_outside(tmp_path):
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "keep.txt").write_text("precious")
    (victim / "sub" / "data.bin").write_bytes(os.urandom(256))
    before = snapshot(victim)
    marker = f"headstart-escape-{secrets.token_hex(6)}"
    programs = hostile_suite(victim, marker)
    start = time.monotonic()
    results = run_many(list(programs.values()) + ["assert 2 + 2 == 4\n"], LIMITS, workers=2)
    # Two workers: the batch cannot take longer than its programs' wall limits, halved, plus slack.
    assert time.monotonic() - start < (len(programs) + 1) * LIMITS.wall_seconds / 2 + 20
    for name, result in zip(programs, results):
        assert not result.passed, name
        assert result.seconds < LIMITS.wall_seconds + 2, name
    assert results[-1].passed  # the run goes on after every hostile program
    assert snapshot(victim) == before
    assert [d for d in SHARED_WRITABLE_DIRS if os.path.exists(f"{d}/{marker}")] == []
    time.sleep(0.2)
    assert [p for p in os.listdir("/proc") if p.isdigit() and _uid(p) >= 3_000_000 and not _zombie(p)] == []


def test_the_evaluator_scores_hostile_answers_as_failures_and_carries_on(shared_data_dir, tmp_path):
    benchmark = MBPP(str(shared_data_dir / "mbpp" / "mbpp.jsonl"), limits=LIMITS)
    request = benchmark.load(limit=1)[0]
    answers = ["```python\nimport sys\ndef remove_Occ(s, ch):\n    sys.exit(0)\nremove_Occ('', '')\n```",
               "```python\ndef remove_Occ(s, ch):\n    while True:\n        pass\n```",
               "```python\ndef remove_Occ(s, ch):\n    return 'x' * (1 << 40)\n```"]
    assert [benchmark.score(request, a).passed for a in answers] == [False, False, False]
    solved = "```python\ndef remove_Occ(s, ch):\n    s = s.replace(ch, '', 1)\n    i = s.rfind(ch)\n    return s if i < 0 else s[:i] + s[i + 1:]\n```"
    assert benchmark.score(request, solved).passed


def _uid(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return -1


def _zombie(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True
