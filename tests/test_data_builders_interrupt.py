"""Ctrl-C during `python -m data_builders`: one line, exit code 130, no temporary file left.

Before: a KeyboardInterrupt traceback, exit code -2 (or 1), and the half-written
OUTPUT.partial left beside the output. The build runs in a subprocess that receives a
real SIGINT. To interrupt it at a known point rather than at a race's mercy, a wrapper
(the `-c` program below) lets one function of the build run as usual, then drops a cue
file and sleeps until the signal comes.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from data_builders.build import main
from data_builders.output import WORK_FILES, WORK_MARKER

REPO = Path(__file__).resolve().parent.parent
# argv: cue file, module, function, then the build's own arguments.
PAUSE_AFTER = """
import importlib, pathlib, runpy, sys, time
cue, module, name = sys.argv[1:4]
hooked = importlib.import_module(module)
original = getattr(hooked, name)
def pause(*args, **kwargs):
    result = original(*args, **kwargs)
    pathlib.Path(cue).touch()
    time.sleep(300)
    return result
setattr(hooked, name, pause)
sys.argv = ["data_builders", *sys.argv[4:]]
runpy.run_module("data_builders", run_name="__main__")
"""


def as_a_terminal_starts() -> None:
    """SIGINT delivered and handled by default in the build, as a shell starts a command. A test worker
    may have inherited it ignored or blocked (both survive exec), and the build would then sleep through
    the signal: run under a parent that ignores SIGINT, this test timed out without this reset."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def interrupted_build(tmp_path: Path, module: str, name: str, args: list[str]) -> subprocess.CompletedProcess:
    """Run the build until `module.name` has returned once, then send it SIGINT."""
    cue = tmp_path / "cue"
    process = subprocess.Popen([sys.executable, "-c", PAUSE_AFTER, str(cue), module, name, *args], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_a_terminal_starts)
    deadline = time.monotonic() + 240
    while not cue.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cue.exists(), process.communicate(timeout=60)[1][-3000:]
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def the_interrupted_line(result: subprocess.CompletedProcess) -> str:
    """Exit code 130, no traceback, and one `interrupted:` line, the last one; returns it."""
    err = result.stderr
    assert result.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert [line for line in lines if line.startswith("interrupted:")] == lines[-1:], err[-3000:]
    return lines[-1]


def temporary_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name.endswith(".partial") or p.name.startswith("tmp"))


# The embedded recipe from its shipped answers, without token caps: no model, no tokenizer loads.
ARGS = ["recipe=embedded_prefix", "caps.max_tokens=0", "decontamination.benchmarks=[humaneval]"]


def test_an_interrupt_while_reading_keeps_nothing(tmp_path):
    """Interrupted with the requests half collected (requests-*.arrow.partial open in the work
    directory the build created): nothing of the build is left."""
    out = tmp_path / "out"
    result = interrupted_build(tmp_path, "data_builders.collect", "_collect_source", [*ARGS, f"output_dir={out}"])
    assert the_interrupted_line(result) == "interrupted: nothing of this build was kept; rerun to build again"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cue"]  # no out, out.partial, out.work


def test_an_interrupt_while_saving_removes_the_partial_output_and_keeps_what_resumes(tmp_path, capsys):
    """Interrupted with OUTPUT.partial half written: it goes; the work directory keeps the finished
    passes (what a resume needs, as docs/data.md promises a killed build), and the line says so."""
    out, work = tmp_path / "out", tmp_path / "out.work"
    result = interrupted_build(tmp_path, "data_builders.output", "_write_preview", [*ARGS, f"output_dir={out}"])
    line = the_interrupted_line(result)
    assert line == (f"interrupted: {out} was not written; the passes that finished are kept in {work}: rerun the "
                    f"same command to resume (or delete {work} to start afresh)")
    assert not out.exists() and not (tmp_path / "out.partial").exists()
    assert temporary_files(tmp_path) == []
    kept = sorted(p.name for p in work.iterdir())
    assert WORK_MARKER in kept and any(name.startswith("requests-") for name in kept)
    assert all(name == WORK_MARKER or any(Path(name).match(pattern) for pattern in WORK_FILES) for name in kept)
    # What was kept resumes: the same command finishes the build.
    assert main([*ARGS, f"output_dir={out}"]) == 0, capsys.readouterr().err[-3000:]
    assert (out / "dataset_dict.json").is_file() and temporary_files(tmp_path) == []

