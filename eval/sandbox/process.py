"""One sandbox process, built, contained and ended: bwrap's arguments, what runs
between fork and exec (cgroup, rlimits, the throw-away uid, the parent-death
signal), and the sandbox's init, held by a pidfd until it is gone and reaped.
eval/sandbox/__init__.py says what the sandbox guarantees."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from eval.sandbox.cgroup import join as join_cgroup
from eval.sandbox.host import SYSTEM_DIRS

if TYPE_CHECKING:
    from eval.sandbox.limits import SandboxLimits

WORKDIR = "/tmp"  # inside the sandbox: working directory, home and /tmp at once
# Pipes and AF_UNIX sockets hold kernel memory RLIMIT_AS does not count: this many
# descriptors (and as many in flight) bound it, at the default socket buffer each.
MAX_OPEN_FILES = 256
MASKED_PROC_FILES = ("/proc/keys", "/proc/key-users")
CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE = 0x00020000, 0x1000, 0x4000, 0x40000
PR_SET_PDEATHSIG = 1
# Loaded here, not in the forked child: dlopen after fork can deadlock.
LIBC = ctypes.CDLL(None, use_errno=True)


def until_exit(process: subprocess.Popen) -> Callable[[float], bool]:
    """A wait for `process` to exit: called with a deadline (`time.monotonic()`), it says whether it did by then.

    Args:
        process (subprocess.Popen): the process waited for (bwrap).
    """
    def wait(deadline: float) -> bool:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False
    return wait


def end_sandbox(process: subprocess.Popen, init: Init | None) -> bool:
    """Kill the init (whatever kept it alive: bwrap may exit first), then bwrap;
    True once the init is gone, and with it every process of the program.

    Args:
        process (subprocess.Popen): bwrap's process.
        init (Init | None): the sandbox's init; None: none was made.
    """
    if init is not None:
        init.kill()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    kill_group(process.pid)
    process.wait()
    return init is None or init.reap(timeout=5)


def bwrap_args(bwrap: str, limits: SandboxLimits, prefix_binds: list[tuple[str, str]], source_fd: int,
                seccomp_fd: int, info_fd: int) -> list[str]:
    """bwrap's command line up to `--`: the namespaces, the read-only system directories and
    interpreter prefixes, the size-capped tmpfs, the program file and the environment.

    Args:
        bwrap (str): the bwrap executable's path.
        limits (SandboxLimits): the run's limits; `max_disk_bytes` sizes the two tmpfs.
        prefix_binds (list[tuple[str, str]]): (source, target) of each interpreter prefix, bound read-only.
        source_fd (int): the descriptor holding the program's text, its `program.py` inside.
        seccomp_fd (int): the descriptor holding the seccomp filter (`seccomp_program`).
        info_fd (int): the descriptor bwrap writes the init's pid to (`--info-fd`).
    """
    args = [bwrap, "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--new-session", "--info-fd", str(info_fd),
            "--seccomp", str(seccomp_fd)]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev",
             "--size", str(limits.max_disk_bytes), "--tmpfs", WORKDIR,
             "--size", str(limits.max_disk_bytes), "--tmpfs", "/dev/shm",
             "--dir", "/var", "--symlink", WORKDIR, "/var/tmp"]
    for path in MASKED_PROC_FILES:
        args += ["--ro-bind", "/dev/null", path]
    for source, target in prefix_binds:
        args += ["--ro-bind", source, target]
    args += ["--file", str(source_fd), f"{WORKDIR}/program.py",
             "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKDIR, "--clearenv"]
    env = {"PATH": "/usr/bin:/bin", "HOME": WORKDIR, "TMPDIR": WORKDIR, "LANG": "C.UTF-8",
           # One thread per numeric library (programs run in parallel), no display.
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg",
           # As DS-1000's harness: quiet TensorFlow, no GPU for model-written code.
           "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1"}
    for name, value in env.items():
        args += ["--setenv", name, value]
    return args + ["--"]


def nproc_limit(limits: SandboxLimits, own_uid: bool) -> int:
    """RLIMIT_NPROC for inside: a throw-away uid counts only its own processes;
    the evaluator's own uid does so only where the count is per user namespace.

    Args:
        limits (SandboxLimits): the run's limits (`max_processes`).
        own_uid (bool): whether the program runs under a throw-away uid of its own.
    """
    release = tuple(int(part) for part in platform.release().split(".")[:2] if part.isdigit())
    return limits.max_processes if own_uid or release >= (5, 14) else 0


class Contain:
    """Runs in the child between fork and exec of bwrap: cgroup and limits
    first, privileges last, then the parent-death signal (which a change of
    user id would clear). Raw system calls only."""

    def __init__(self, uid: int | None, limits: SandboxLimits, cgroup_procs: list[bytes],
                 prebinds: list[tuple[bytes, bytes]], parent: int) -> None:
        self.uid, self.limits, self.parent = uid, limits, parent
        self.cgroup_procs, self.prebinds = cgroup_procs, prebinds

    def __call__(self) -> None:
        limits = self.limits
        join_cgroup(self.cgroup_procs)
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (MAX_OPEN_FILES, MAX_OPEN_FILES))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if self.uid is not None:
            # bwrap, running as the throw-away uid, resolves its bind sources
            # itself: bind the interpreter's prefixes where that uid can reach them.
            if LIBC.unshare(CLONE_NEWNS) != 0 or LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
                raise OSError(ctypes.get_errno(), "private mount namespace")
            for source, target in self.prebinds:
                if LIBC.mount(source, target, None, MS_BIND | MS_REC, None) != 0:
                    raise OSError(ctypes.get_errno(), f"bind {source!r}")
            os.setgroups([])
            os.setgid(self.uid)
            os.setuid(self.uid)
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self.parent:  # the evaluator died before the signal was armed
            os._exit(1)


class Init:
    """The sandbox's init (bwrap's child, named on --info-fd), held by a pidfd.
    Its exit ends every other process of the PID namespace (the kernel kills
    them and waits for them first), so once it is gone nothing of the program
    runs any more. bwrap itself may exit before it: the init then becomes a child
    of the nearest subreaper, which may be us."""

    def __init__(self, process: subprocess.Popen, info_fd: int, timeout: float) -> None:
        self.fd: int | None = None
        data, deadline = b"", time.monotonic() + timeout
        while True:
            try:
                child = json.loads(data)["child-pid"]
                break
            except (ValueError, KeyError, TypeError):
                pass
            ready, _, _ = select.select([info_fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(info_fd, 4096) if ready else b""
            if not chunk:
                return  # bwrap failed before it made the sandbox
            data += chunk
        try:
            fd = os.pidfd_open(child)
        except OSError:
            return
        # Still bwrap's child, so the pid was not reused: the pidfd is the init's.
        if parent_pid(child) == process.pid:
            self.fd = fd
        else:
            os.close(fd)

    def kill(self) -> None:
        if self.fd is not None:
            try:
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)
            except OSError:
                pass

    def reap(self, timeout: float) -> bool:
        """Wait until the init is gone, and reap it where it is our child now (we
        are PID 1 or a subreaper): else every program would leave a zombie.

        Args:
            timeout (float): how long to wait for the init to exit, in seconds.
        """
        if self.fd is None:
            return True  # never made, or gone before we could hold it
        if not select.select([self.fd], [], [], timeout)[0]:
            return False
        try:
            os.waitid(os.P_PIDFD, self.fd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            pass  # bwrap reaped it, or the machine's init will
        return True


def parent_pid(pid: int) -> int | None:
    """The pid of a process's parent (`/proc/<pid>/status`), None when it cannot be read.

    Args:
        pid (int): the process asked about.
    """
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("PPid:"))
    except (OSError, StopIteration, ValueError):
        return None


def kill_group(pid: int) -> None:
    """SIGKILL every process of a process group; nothing when none is left or it is not ours to signal.

    Args:
        pid (int): the group's id: its leader's pid.
    """
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def close_all(fds: list[int] | tuple[int, ...]) -> None:
    """Close each descriptor; one that will not close (already closed) is skipped.

    Args:
        fds (list[int] | tuple[int, ...]): the descriptors.
    """
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def normalized(returncode: int) -> int:
    """bwrap reports a program killed by signal N as exit 128 + N; give it back as -N.

    Args:
        returncode (int): bwrap's exit status.
    """
    return -(returncode - 128) if 128 < returncode < 128 + signal.NSIG else returncode


def status_channel() -> tuple[int, int]:
    """(our end, the program's end) of the bootstrap's status channel: a socket pair,
    not a pipe. A pipe's write end reopened through /proc/self/fd (possible where
    the program runs under the evaluator's own uid) is a read end, from which the
    program could drain the "started" record its bootstrap wrote before it ran,
    and look like a sandbox that never started. A socket cannot be reopened
    (ENXIO), and what its end sends is read only from ours, never in the sandbox."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.shutdown(socket.SHUT_WR)  # one way: nothing for the program to read on its end
    return ours.detach(), theirs.detach()


def read_channel(fd: int) -> bytes:
    """The records the bootstrap wrote on the status channel (`started`, `completed`), read without
    blocking and no further than the first 4096 bytes and the chunk that crosses them.

    Args:
        fd (int): our end of the channel (`status_channel`).
    """
    os.set_blocking(fd, False)
    data = b""
    try:
        while len(data) < 4096:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    except BlockingIOError:
        pass
    return data


# C0 controls but tab and newline, DEL and C1 controls, as `\xNN`: program-chosen text
# (a NUL, a terminal escape) must reach a terminal or a JSONL record as text, not as control bytes.
_ESCAPED = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7f, 0xa0)) if chr(code) not in "\t\n"}


def printable(text: str) -> str:
    """`text` with its control characters escaped, tab and newline kept.

    Args:
        text (str): text the program chose (its output, an error message).
    """
    return text.translate(_ESCAPED)


def read_capped(fd: int, limit: int) -> str:
    """The first `limit` bytes of a program's output, as printable text.

    Args:
        fd (int): the descriptor holding the output, read from its start.
        limit (int): the most bytes read.
    """
    return printable(os.pread(fd, limit, 0).decode("utf-8", errors="replace"))
