"""Run model-written programs in a contained subprocess, never in our own process.

Each program gets a fresh temporary directory as its working directory and home,
closed stdin, and limits on CPU time, wall time, address space, process count
and file size (which also caps its captured output). When the evaluator runs as
root, the program additionally runs under a throw-away user id of its own (it
can neither write outside its directory nor signal our processes, and the
process limit counts only its own processes) in a fresh network namespace
(no network) and a mount namespace of its own in which /tmp, /var/tmp, /run/lock and
/dev/shm are fresh private tmpfs (only its working directory is visible under
/tmp), so nothing outside its directory can change. After the run every process of that user id is killed, so a
program that forks and detaches leaves nothing behind.

A program passes only when it exits 0 AND prints a per-run random token that is
appended after the tests, so `sys.exit(0)` before the asserts is a failure.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET, CLONE_NEWNS = 0x40000000, 0x00020000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000
# World-writable places a throw-away uid could still write to: each gets a small
# private tmpfs in the program's own mount namespace, gone when it exits.
SHARED_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/run/lock", "/dev/shm")
PRIVATE_TMPFS_OPTIONS = b"size=64m,mode=1777"
PR_SET_KEEPCAPS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE = 8, 47, 2
CAP_DAC_READ_SEARCH = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SANDBOX_UID_BASE = 3_000_000
_uid_counter = itertools.count()
# Loaded here, not in the forked child: dlopen after fork can deadlock.
_LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one program run."""

    cpu_seconds: int = 10
    wall_seconds: float = 20.0
    memory_bytes: int = 2 << 30
    max_processes: int = 32
    max_file_bytes: int = 8 << 20
    max_output_bytes: int = 64 << 10


@dataclass
class ExecutionResult:
    """How a program run ended."""

    passed: bool
    status: str  # passed | failed | timeout
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


def run_tests(program: str, limits: SandboxLimits = SandboxLimits()) -> ExecutionResult:
    """Run `program` (solution + its tests); passed iff it reaches the end and exits 0."""
    token = secrets.token_hex(16)
    source = f"{program}\n\nprint({token!r}, flush=True)\n"
    result = run_program(source, limits)
    result.passed = result.returncode == 0 and token in result.stdout and result.status != "timeout"
    result.status = "passed" if result.passed else result.status
    return result


def run_many(programs: list[str], limits: SandboxLimits = SandboxLimits(), workers: int | None = None) -> list[ExecutionResult]:
    """`run_tests` over many programs, in parallel across cores, results in order."""
    workers = workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda program: run_tests(program, limits), programs))


def run_program(source: str, limits: SandboxLimits = SandboxLimits()) -> ExecutionResult:
    """Execute Python `source` in the sandbox and report how it ended."""
    workdir = Path(tempfile.mkdtemp(prefix="headstart-sandbox-"))
    uid = _fresh_uid() if os.geteuid() == 0 else None
    try:
        (workdir / "program.py").write_text(source)
        if uid is not None:
            os.chown(workdir, uid, uid)
            os.chown(workdir / "program.py", uid, uid)
        return _execute(workdir, uid, limits)
    finally:
        if uid is not None:
            _kill_user(uid)
        shutil.rmtree(workdir, ignore_errors=True)


def _execute(workdir: Path, uid: int | None, limits: SandboxLimits) -> ExecutionResult:
    stdout_path, stderr_path = workdir / ".stdout", workdir / ".stderr"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8",
           # One thread per numeric library (programs run in parallel), no display.
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg",
           # As DS-1000's harness: quiet TensorFlow, no GPU for model-written code.
           "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1"}
    start = time.monotonic()
    with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-I", "program.py"],
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=env,
            preexec_fn=lambda: _contain(uid, limits, workdir),
        )
        timed_out = False
        try:
            process.wait(timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(process.pid)
        process.wait()
    seconds = time.monotonic() - start
    cpu_killed = process.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and seconds >= limits.cpu_seconds * 0.9
    return ExecutionResult(
        passed=False,
        status="timeout" if timed_out or cpu_killed else "failed",
        returncode=None if timed_out else process.returncode,
        stdout=_read_capped(stdout_path, limits.max_output_bytes),
        stderr=_read_capped(stderr_path, limits.max_output_bytes),
        seconds=seconds,
    )


def _contain(uid: int | None, limits: SandboxLimits, workdir: Path) -> None:
    """Runs in the child between fork and exec: limits first, privileges last."""
    os.setsid()
    os.chdir(workdir)
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if uid is None:
        return
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
    _LIBC.unshare(CLONE_NEWNET)  # best effort: fails harmlessly where the kernel forbids it
    _private_tmp(workdir)
    _LIBC.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    _keep_read_access()


def _private_tmp(workdir: Path) -> None:
    """Best effort, like the network namespace: a private mount namespace with
    fresh tmpfs over the shared writable directories, and the working directory
    bound back at its own path. Nothing is mounted unless the namespace is
    private, so no mount can ever propagate to the host."""
    if _LIBC.unshare(CLONE_NEWNS) != 0 or _LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return
    # An interpreter under a masked directory (a venv in /tmp) is bound back below.
    interpreter_fds = {path: os.open(path, os.O_RDONLY | os.O_DIRECTORY) for path in _masked_interpreter_dirs()}
    for directory in SHARED_WRITABLE_DIRS:
        if os.path.isdir(directory) and not os.path.islink(directory):
            _LIBC.mount(b"tmpfs", directory.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, PRIVATE_TMPFS_OPTIONS)
    for path, fd in interpreter_fds.items():
        os.makedirs(path, exist_ok=True)
        _LIBC.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, MS_BIND | MS_REC, None)
        os.close(fd)
    # The cwd still is the old directory: bind it back where its path now points.
    if not workdir.is_dir():
        os.makedirs(workdir)
        _LIBC.mount(b".", str(workdir).encode(), None, MS_BIND | MS_REC, None)
        os.chdir(workdir)


def _masked_interpreter_dirs() -> list[str]:
    """Our interpreter's prefixes that lie under a directory the sandbox masks."""
    prefixes = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    return sorted(
        prefix for prefix in prefixes
        if os.path.isdir(prefix) and any(os.path.commonpath([d, prefix]) == d for d in SHARED_WRITABLE_DIRS)
    )


def _keep_read_access() -> None:
    """Let the unprivileged program read (not write) files our interpreter lives
    among, e.g. under a 0700 home: CAP_DAC_READ_SEARCH, kept across exec as an
    ambient capability. Every other capability is gone with the setuid."""
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    bit = 1 << CAP_DAC_READ_SEARCH
    data = (ctypes.c_uint32 * 6)(bit, bit, bit, 0, 0, 0)  # effective, permitted, inheritable (low, high)
    _LIBC.capset(header, data)
    _LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH, 0, 0)


def _fresh_uid() -> int:
    """A user id no other process uses, so its process count and clean-up are ours alone."""
    return _SANDBOX_UID_BASE + (os.getpid() % 10_000) * 1_000 + next(_uid_counter) % 1_000


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_user(uid: int) -> None:
    """Kill every process running as `uid`, repeating until none is left (forks race us)."""
    for _ in range(50):
        victims = [pid for pid in _pids_of_user(uid)]
        if not victims:
            return
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def _pids_of_user(uid: int) -> list[int]:
    """Live (non-zombie) processes of `uid`; zombies are dead and await their reaper."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry.path).st_uid != uid:
                continue
            with open(f"{entry.path}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state != "Z":
            pids.append(int(entry.name))
    return pids


def _read_capped(path: Path, limit: int) -> str:
    with open(path, "rb") as handle:
        return handle.read(limit).decode("utf-8", errors="replace")
