"""What one sandboxed run may use (`SandboxLimits`), how it ended (`ExecutionResult`), and the
error raised where no program can run (`SandboxUnavailable`): the types every module of the
sandbox shares, so that this module imports none of them."""

from __future__ import annotations

from dataclasses import dataclass


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here (bwrap missing or unable to build it)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one program run."""

    cpu_seconds: int = 10
    wall_seconds: float = 20.0
    memory_bytes: int = 2 << 30  # the whole program where a cgroup is available, else each process
    max_processes: int = 32
    max_file_bytes: int = 8 << 20
    max_output_bytes: int = 64 << 10
    max_disk_bytes: int = 128 << 20  # its working directory (= /tmp, home), and /dev/shm


@dataclass
class ExecutionResult:
    """How a program run ended, and what contained it."""

    passed: bool
    status: str  # passed | failed | timeout
    returncode: int | None
    stdout: str  # stdout and stderr: the program's (capped), control characters escaped
    stderr: str
    seconds: float
    containment: str = ""  # cgroup+seccomp | rlimit+seccomp | not run (rejected before it started)
