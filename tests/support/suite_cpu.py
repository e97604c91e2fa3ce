"""CPU seconds per test: where the suite's time goes on a machine whose cores are the limit.

As a pytest plugin it appends, per test, the CPU time of the worker and of the subprocesses it
waited for (getrusage self + children, module fixtures counted in their first test) to
$SUITE_CPU_DIR/cpu-<pid>.jsonl:

    SUITE_CPU_DIR=/tmp/suite-cpu PYTHONPATH=tests/support bash scripts/test.sh -p suite_cpu

Run as a script it prints the heaviest tests and files:

    python tests/support/suite_cpu.py /tmp/suite-cpu

Slurm jobs run under slurmd, not under a worker: their CPU is not in these figures (compare the
total with the machine's busy time over the run, /proc/stat).
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import time
from pathlib import Path

import pytest

from headstart.files import append_jsonl, read_jsonl


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    cpu, wall = cpu_seconds(), time.monotonic()
    yield
    row = {"test": item.nodeid, "cpu_s": round(cpu_seconds() - cpu, 2), "wall_s": round(time.monotonic() - wall, 2)}
    append_jsonl(Path(os.environ.get("SUITE_CPU_DIR", "suite-cpu")) / f"cpu-{os.getpid()}.jsonl", [row])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="the SUITE_CPU_DIR of a run")
    parser.add_argument("--top", type=int, default=25, help="how many tests and files to list")
    args = parser.parse_args()
    rows = [row for path in Path(args.directory).glob("cpu-*.jsonl") for row in read_jsonl(path)]
    if not rows:
        raise SystemExit(f"{args.directory}: no cpu-*.jsonl rows (was the run started with -p suite_cpu?)")
    print(f"{len(rows)} tests, {sum(r['cpu_s'] for r in rows):.0f} CPU-s in the workers and their subprocesses")
    for row in sorted(rows, key=lambda r: -r["cpu_s"])[: args.top]:
        print(f"{row['cpu_s']:8.1f} CPU-s {row['wall_s']:8.1f} s  {row['test']}")
    by_file = collections.Counter()
    for row in rows:
        by_file[row["test"].split("::")[0]] += row["cpu_s"]
    for name, seconds in by_file.most_common(args.top):
        print(f"{seconds:8.1f} CPU-s  {name}")


if __name__ == "__main__":
    main()
