"""One program in its sandbox: start it contained, wait for it, end it and everything it started,
and say how it ended (the package's docstring says what the sandbox guarantees)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

from eval.sandbox.bootstrap import BOOTSTRAP
from eval.sandbox.host import SLOTS, Host
from eval.sandbox.limits import ExecutionResult, SandboxLimits, SandboxUnavailable
from eval.sandbox.process import (
    Contain,
    Init,
    bwrap_args,
    close_all,
    end_sandbox,
    normalized,
    nproc_limit,
    read_capped,
    read_channel,
    status_channel,
    until_exit,
)
from eval.sandbox.seccomp import UnsupportedMachine, seccomp_program

# After the trusted side is done, how long a program may take to exit by itself.
EXIT_GRACE_SECONDS = 0.5


class _Rejected(ValueError):
    """The program's text cannot become a program file: it fails, nothing runs."""


def run_tests(program: str, limits: SandboxLimits = SandboxLimits()) -> ExecutionResult:
    """Run `program` (solution + its tests); passed iff it started once, its code
    returned and it exited 0.

    Args:
        program (str): the solution and its tests, one Python source.
        limits (SandboxLimits): what the run may use.
    """
    result, records = run_contained(program, limits, BOOTSTRAP)
    result.passed = records == b"started\ncompleted\n" and result.returncode == 0 and result.status != "timeout"
    result.status = "passed" if result.passed else result.status
    if result.containment != "not run":
        result.containment += ", tests in the program's process"
    return result


def run_many(programs: list[str], limits: SandboxLimits = SandboxLimits(), workers: int | None = None) -> list[ExecutionResult]:
    """`run_tests` over many programs, in parallel across cores, results in order.

    Args:
        programs (list[str]): the programs, each as `run_tests` takes it.
        limits (SandboxLimits): what each run may use.
        workers (int | None): programs run at once, at most `SLOTS`; None: one per CPU core.
    """
    workers = min(workers or os.cpu_count() or 1, SLOTS)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda program: run_tests(program, limits), programs))


def run_program(source: str, limits: SandboxLimits = SandboxLimits()) -> ExecutionResult:
    """Execute Python `source` in the sandbox and report how it ended.

    Args:
        source (str): the program's text.
        limits (SandboxLimits): what the run may use.
    """
    return run_contained(source, limits, BOOTSTRAP)[0]


def bwrap_path() -> str:
    """The bwrap executable, or SandboxUnavailable saying how to get it."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is required to run model-written programs and was not found on PATH; "
            "install it (Debian/Ubuntu: apt-get install bubblewrap, or run scripts/setup.sh as root)")
    return path


def sandbox_host() -> Host:
    """This evaluator process's Host (slots, uids, cgroups), or SandboxUnavailable."""
    try:
        return Host.get()
    except PermissionError as error:  # a state directory others may write
        raise SandboxUnavailable(f"cannot keep the sandbox's records safely: {error}") from error


@lru_cache(maxsize=1)
def _seccomp_filter() -> bytes:
    try:
        return seccomp_program()
    except UnsupportedMachine as error:
        raise SandboxUnavailable(f"{error}: programs are not run without it") from error


def program_bytes(source: str, limits: SandboxLimits) -> bytes:
    """The program file's bytes, or _Rejected naming why there can be none.

    Args:
        source (str): the program's text.
        limits (SandboxLimits): the run's limits; `max_file_bytes` and `max_disk_bytes` cap the file.
    """
    try:
        data = source.encode("utf-8")
    except UnicodeEncodeError as error:
        raise _Rejected(f"the program is not valid text (not encodable as UTF-8: {error.reason} "
                        f"at character {error.start})") from None
    cap = min(limits.max_file_bytes, limits.max_disk_bytes)
    if len(data) > cap:
        raise _Rejected(f"the program is {len(data)} bytes, over the sandbox's file-size cap of {cap} bytes")
    return data


def _rejected(error: _Rejected) -> ExecutionResult:
    return ExecutionResult(passed=False, status="failed", returncode=None, stdout="", stderr=f"sandbox: {error}\n",
                           seconds=0.0, containment="not run")


def run_contained(source: str, limits: SandboxLimits, bootstrap: str, extra_fds: tuple[int, ...] = (),
         during: Callable[[float], bool] | None = None) -> tuple[ExecutionResult, bytes]:
    """Run one program; returns how it ended and what its bootstrap reported.

    Args:
        source (str): the program's text.
        limits (SandboxLimits): what the run may use.
        bootstrap (str): the trusted code that starts the program (`eval.sandbox.bootstrap`).
        extra_fds (tuple[int, ...]): descriptors passed to the program (owned by this call from now on), their
            numbers appended to the bootstrap's argv.
        during (Callable[[float], bool] | None): called once the sandbox runs, with the deadline: waits for a companion of the
            program (the trusted side of `run_calls`) and says whether it finished in time; the
            program is ended after it. None: wait for the program itself.
    """
    run = _Run(limits, extra_fds)
    try:
        try:
            data = program_bytes(source, limits)
        except _Rejected as error:
            return _rejected(error), b""
        run.start(data, bootstrap)
        return run.result(run.wait(during))
    finally:
        run.close()


class _Run:
    """One program in its sandbox, from start to the release of its slot."""

    def __init__(self, limits: SandboxLimits, extra_fds: tuple[int, ...]) -> None:
        self.limits, self.extra_fds, self.fds = limits, tuple(extra_fds), list(extra_fds)
        self.host: Host | None = None
        self.slot: int | None = None
        self.uid: int | None = None
        self.cgroup = None
        self.process: subprocess.Popen | None = None
        self.init: Init | None = None
        self.gone, self.ended, self.ended_itself, self.seconds = True, False, False, 0.0

    def start(self, data: bytes, bootstrap: str) -> None:
        limits = self.limits
        bwrap, seccomp = bwrap_path(), _seccomp_filter()
        self.host = host = sandbox_host()
        self.slot, self.uid = host.acquire_slot()
        if host.cgroups is not None:
            self.cgroup = host.cgroups.create(self.slot, limits.memory_bytes, limits.max_processes + 2)
        source_fd, self.stdout_fd, self.stderr_fd, seccomp_fd = (self._keep(os.memfd_create(name)) for name in
                                                                  ("program", "stdout", "stderr", "seccomp"))
        for fd, content in ((source_fd, data), (seccomp_fd, seccomp)):
            os.write(fd, content)
            os.lseek(fd, 0, os.SEEK_SET)
        self.channel_r, channel_w = status_channel()
        self._keep(self.channel_r)
        self._keep(channel_w)
        info_r, info_w = (self._keep(fd) for fd in os.pipe())
        passed = (source_fd, seccomp_fd, channel_w, info_w, *self.extra_fds)
        args = bwrap_args(bwrap, limits, host.prefix_binds(), source_fd, seccomp_fd, info_w)
        args += [sys.executable, "-I", "-c", bootstrap, str(channel_w), str(nproc_limit(limits, self.uid is not None)),
                 *map(str, self.extra_fds)]
        contain = Contain(uid=self.uid, limits=limits, cgroup_procs=self.cgroup.procs_files() if self.cgroup else [],
                           prebinds=host.prebinds() if self.uid is not None else [], parent=os.getpid())
        self.start_time = time.monotonic()
        try:
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.stdout_fd,
                                            stderr=self.stderr_fd, env={}, pass_fds=passed, start_new_session=True,
                                            preexec_fn=contain)
        except (OSError, subprocess.SubprocessError) as error:
            raise SandboxUnavailable(f"could not start the sandbox: {error}") from error
        self.gone = False
        for fd in passed:  # the program's ends: its exit must be seen as EOF
            os.close(fd)
            self.fds.remove(fd)
        self.init = Init(self.process, info_r, limits.wall_seconds)
        if self.init.fd is not None:
            self._keep(self.init.fd)

    def _keep(self, fd: int) -> int:
        self.fds.append(fd)
        return fd

    def wait(self, during: Callable[[float], bool] | None) -> bool:
        """Until the program exits (or `during` returns) or its wall time is up;
        then end it. True when it finished in time."""
        deadline = self.start_time + self.limits.wall_seconds
        finished = (during or until_exit(self.process))(deadline)
        if during is not None and finished:
            until_exit(self.process)(min(deadline, time.monotonic() + EXIT_GRACE_SECONDS))
        self.ended_itself = self.process.poll() is not None
        self.end()
        self.seconds = time.monotonic() - self.start_time
        return finished

    def end(self) -> None:
        """Nothing of the program runs after this (unless its init refuses to die)."""
        if self.process is None or self.ended:
            return
        self.ended = True
        self.gone = end_sandbox(self.process, self.init)
        if self.cgroup is not None:
            self.cgroup.destroy()
            self.cgroup, self.gone = None, True

    def result(self, finished: bool) -> tuple[ExecutionResult, bytes]:
        limits, process = self.limits, self.process
        records = read_channel(self.channel_r)
        stderr = read_capped(self.stderr_fd, limits.max_output_bytes)
        # The bootstrap writes "started" before the program's first line, on a channel the
        # program can add to but never read or reopen (status_channel): without it,
        # nothing of the program ran, and the sandbox, not the program, failed.
        if self.ended_itself and finished and not records.startswith(b"started\n"):
            raise SandboxUnavailable(f"the sandbox did not start (bwrap exit {process.returncode}; a limit too "
                                     f"small for the interpreter, or no user namespaces here?): {stderr.strip()[-2000:]}")
        returncode = normalized(process.returncode)
        cpu_killed = returncode in (-signal.SIGXCPU, -signal.SIGKILL) and self.seconds >= limits.cpu_seconds * 0.9
        result = ExecutionResult(
            passed=False,
            status="timeout" if not finished or cpu_killed else "failed",
            returncode=returncode if finished else None,
            stdout=read_capped(self.stdout_fd, limits.max_output_bytes),
            stderr=stderr,
            seconds=self.seconds,
            containment=self.host.containment,
        )
        return result, records

    def close(self) -> None:
        self.end()  # an error between start and end must not leave the program running
        if self.cgroup is not None:
            self.cgroup.destroy()
            self.gone = True
        close_all(self.fds)
        if self.slot is not None:
            self.host.release_slot(self.slot, self.uid, self.gone)
