"""Run model-written programs in a contained subprocess, never in our own process.

Every program runs under bubblewrap (`bwrap`, Debian package `bubblewrap`), which
gives it new user, IPC, PID, network, UTS and cgroup namespaces, no capabilities,
no new user namespaces (`--disable-userns`), a session of its own, and a
read-only root file system that holds only the system directories (/usr, /etc,
/lib...) and our interpreter's prefixes. Its working directory, home and /tmp
are one size-capped tmpfs (`max_disk_bytes`, /dev/shm likewise), which is
where `program.py` is written; it vanishes with the program, so nothing of it is
ever on the host's disk. SysV IPC objects and POSIX message queues live in the
program's own IPC namespace and die with it; so does every process it forks
(PID namespace: when the program's init goes, the kernel kills the rest).
When the evaluator dies, so does the program: the parent-death signal kills
bwrap, whose `--die-with-parent` kills the program's init. At the wall limit the
evaluator kills that init itself (through a pidfd), and it returns only once
that init is gone, and with it every process of the program.

On top of bwrap, by hand: rlimits on CPU time, address space, file size (which
also caps its output) and process count; closed stdin; stdout and stderr in
memory files that only the evaluator holds (a program cannot swap them for a
FIFO or a symlink); a cgroup per program where the machine lets us make one,
capping the memory and process count of the program as a whole
(eval/sandbox_cgroup.py; without one, memory is capped per process only). When
the evaluator runs as root, the program runs under a throw-away user id of its
own (bwrap then makes its user namespace as that uid); the interpreter's
prefixes, which that uid may be unable to reach (a 0700 home), are bound for
bwrap in a private mount namespace. Each evaluator process first sweeps what a
killed predecessor may have left (its cgroups, processes of its throw-away uids).

Without bwrap, or where it cannot build the sandbox, running a program raises
`SandboxUnavailable`: a program never runs unsandboxed.

A program passes only when it exits 0 AND the trusted bootstrap that runs it
reports, over a pipe only the evaluator reads, that the program's code returned
(`completed`): `sys.exit(0)` before the asserts is a failure. Nothing the program
can read (its file, argv, environment, working directory, output) holds a
secret to print. The bootstrap runs in the program's own process, so code that
deliberately reverse-engineers it (finds the pipe and writes the record) could
still forge a pass: no check inside that process can prevent that; only tests
run out of process could.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import logging
import os
import platform
import resource
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from eval.sandbox_cgroup import CgroupParent, alive, join as join_cgroup

# Host places a program must never be able to write to (the tests check them).
SHARED_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/run/lock", "/dev/shm")
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
WORKDIR = "/tmp"  # inside the sandbox: working directory, home and /tmp at once
# Throw-away uids (root only): BASE + evaluator pid * SLOTS + slot; pids stay below 2**22.
SANDBOX_UID_BASE, SLOTS, _MAX_PID = 1 << 30, 512, 1 << 22
# Mount points for the interpreter's prefixes in the private mount namespace (root only).
PREBIND_DIR = "/run/headstart-sandbox"
CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE = 0x00020000, 0x1000, 0x4000, 0x40000
PR_SET_PDEATHSIG = 1
# Loaded here, not in the forked child: dlopen after fork can deadlock.
_LIBC = ctypes.CDLL(None, use_errno=True)
_log = logging.getLogger(__name__)

# Runs inside the sandbox, in the program's process: closes every inherited
# descriptor but the channel, caps the process count (counted per user
# namespace since Linux 5.14), says it started, runs program.py as __main__,
# and says `completed` only when that returned.
BOOTSTRAP = """\
import os, resource, runpy, sys
channel, nproc = int(sys.argv[1]), int(sys.argv[2])
for fd in [int(name) for name in os.listdir('/proc/self/fd')]:
    if fd > 2 and fd != channel:
        try:
            os.close(fd)
        except OSError:
            pass
os.set_inheritable(channel, False)
if nproc:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
os.write(channel, b'started\\n')
sys.argv = ['program.py']
runpy.run_path('program.py', run_name='__main__')
os.write(channel, b'completed\\n')
"""


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
    """How a program run ended."""

    passed: bool
    status: str  # passed | failed | timeout
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


def run_tests(program: str, limits: SandboxLimits = SandboxLimits()) -> ExecutionResult:
    """Run `program` (solution + its tests); passed iff its code returned and it exited 0."""
    result, completed = _run(program, limits)
    result.passed = completed and result.returncode == 0 and result.status != "timeout"
    result.status = "passed" if result.passed else result.status
    return result


def run_many(programs: list[str], limits: SandboxLimits = SandboxLimits(), workers: int | None = None) -> list[ExecutionResult]:
    """`run_tests` over many programs, in parallel across cores, results in order."""
    workers = min(workers or os.cpu_count() or 1, SLOTS)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda program: run_tests(program, limits), programs))


def run_program(source: str, limits: SandboxLimits = SandboxLimits()) -> ExecutionResult:
    """Execute Python `source` in the sandbox and report how it ended."""
    return _run(source, limits)[0]


def bwrap_path() -> str:
    """The bwrap executable, or SandboxUnavailable saying how to get it."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is required to run model-written programs and was not found on PATH; "
            "install it (Debian/Ubuntu: apt-get install bubblewrap, or run scripts/setup.sh as root)")
    return path


def sandbox_uid(evaluator_pid: int, slot: int) -> int:
    """The throw-away uid of one running program (root only)."""
    return SANDBOX_UID_BASE + evaluator_pid * SLOTS + slot


def sandbox_uid_owner(uid: int) -> int | None:
    """The evaluator pid a throw-away uid belongs to, or None for any other uid."""
    if SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + _MAX_PID * SLOTS:
        return (uid - SANDBOX_UID_BASE) // SLOTS
    return None


def _run(source: str, limits: SandboxLimits) -> tuple[ExecutionResult, bool]:
    bwrap = bwrap_path()
    host = _Host.get()
    slot = host.acquire_slot()
    cgroup = None
    fds: list[int] = []
    try:
        root = os.geteuid() == 0
        if host.cgroups is not None:
            cgroup = host.cgroups.create(slot, limits.memory_bytes, limits.max_processes + 2)
        source_fd, stdout_fd, stderr_fd = (os.memfd_create(name) for name in ("program", "stdout", "stderr"))
        channel_r, channel_w = os.pipe()
        info_r, info_w = os.pipe()
        fds += [source_fd, stdout_fd, stderr_fd, channel_r, channel_w, info_r, info_w]
        os.write(source_fd, source.encode("utf-8", errors="surrogateescape"))
        os.lseek(source_fd, 0, os.SEEK_SET)
        args = _bwrap_args(bwrap, limits, host.prefix_binds(root), source_fd, channel_w, info_w, _nproc(limits, root))
        contain = _Contain(
            uid=sandbox_uid(os.getpid(), slot) if root else None,
            limits=limits,
            cgroup_procs=cgroup.procs_files() if cgroup else [],
            prebinds=host.prebinds() if root else [],
            parent=os.getpid(),
        )
        start = time.monotonic()
        try:
            process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=stdout_fd, stderr=stderr_fd, env={},
                                       pass_fds=(source_fd, channel_w, info_w), start_new_session=True,
                                       preexec_fn=contain)
        except (OSError, subprocess.SubprocessError) as error:
            raise SandboxUnavailable(f"could not start the sandbox: {error}") from error
        for fd in (channel_w, info_w):
            os.close(fd)
            fds.remove(fd)
        init = _Init(process, info_r, limits.wall_seconds)
        if init.fd is not None:
            fds.append(init.fd)
        timed_out = False
        try:
            process.wait(timeout=max(0.0, limits.wall_seconds - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            timed_out = True
            init.kill()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(process.pid)
        process.wait()
        init.wait_gone(timeout=5)
        seconds = time.monotonic() - start
        if cgroup is not None:
            cgroup.destroy()
            cgroup = None
        records = _read_channel(channel_r).split(b"\n")
        stderr = _read_capped(stderr_fd, limits.max_output_bytes)
        if not timed_out and records[0] != b"started":
            raise SandboxUnavailable(f"the sandbox did not start (bwrap exit {process.returncode}; a limit too "
                                     f"small for the interpreter, or no user namespaces here?): {stderr.strip()[-2000:]}")
        returncode = _normalized(process.returncode)
        cpu_killed = returncode in (-signal.SIGXCPU, -signal.SIGKILL) and seconds >= limits.cpu_seconds * 0.9
        result = ExecutionResult(
            passed=False,
            status="timeout" if timed_out or cpu_killed else "failed",
            returncode=None if timed_out else returncode,
            stdout=_read_capped(stdout_fd, limits.max_output_bytes),
            stderr=stderr,
            seconds=seconds,
        )
        return result, b"completed" in records[1:]
    finally:
        if cgroup is not None:
            cgroup.destroy()
        for fd in fds:
            os.close(fd)
        host.release_slot(slot)


def _bwrap_args(bwrap: str, limits: SandboxLimits, prefix_binds: list[tuple[str, str]], source_fd: int,
                channel_fd: int, info_fd: int, nproc: int) -> list[str]:
    args = [bwrap, "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--new-session", "--info-fd", str(info_fd)]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev",
             "--size", str(limits.max_disk_bytes), "--tmpfs", WORKDIR,
             "--size", str(limits.max_disk_bytes), "--tmpfs", "/dev/shm",
             "--dir", "/var", "--symlink", WORKDIR, "/var/tmp"]
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
    return args + ["--", sys.executable, "-I", "-c", BOOTSTRAP, str(channel_fd), str(nproc)]


def _nproc(limits: SandboxLimits, root: bool) -> int:
    """RLIMIT_NPROC for inside: a throw-away uid counts only its own processes;
    the evaluator's own uid does so only where the count is per user namespace."""
    release = tuple(int(part) for part in platform.release().split(".")[:2] if part.isdigit())
    return limits.max_processes if root or release >= (5, 14) else 0


class _Contain:
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
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if self.uid is not None:
            # bwrap, running as the throw-away uid, resolves its bind sources
            # itself: bind the interpreter's prefixes where that uid can reach them.
            if _LIBC.unshare(CLONE_NEWNS) != 0 or _LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
                raise OSError(ctypes.get_errno(), "private mount namespace")
            for source, target in self.prebinds:
                if _LIBC.mount(source, target, None, MS_BIND | MS_REC, None) != 0:
                    raise OSError(ctypes.get_errno(), f"bind {source!r}")
            os.setgroups([])
            os.setgid(self.uid)
            os.setuid(self.uid)
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self.parent:  # the evaluator died before the signal was armed
            os._exit(1)


class _Host:
    """Per evaluator process: the cgroup parent, the interpreter's prefixes, the
    slots of running programs; prepared (and leftovers swept) on first use."""

    _lock = threading.Lock()
    _instance: _Host | None = None

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.root = os.geteuid() == 0
        self.free = list(range(SLOTS))
        self.slot_lock = threading.Lock()
        self.prefixes = _interpreter_prefixes()
        if self.root:
            _sweep_uids()
            for index in range(len(self.prefixes)):
                os.makedirs(f"{PREBIND_DIR}/prefix-{index}", mode=0o755, exist_ok=True)
        self.cgroups = CgroupParent.find()
        if self.cgroups is not None:
            self.cgroups.sweep()
            atexit.register(self.cgroups.remove_own)
        else:
            _log.warning("no cgroup to write: each sandboxed process is capped at its memory limit, "
                         "not the program as a whole")

    @classmethod
    def get(cls) -> _Host:
        with cls._lock:
            if cls._instance is None or cls._instance.pid != os.getpid():
                cls._instance = _Host()
            return cls._instance

    def acquire_slot(self) -> int:
        with self.slot_lock:
            if not self.free:
                raise RuntimeError(f"more than {SLOTS} programs at once")
            return self.free.pop()

    def release_slot(self, slot: int) -> None:
        with self.slot_lock:
            self.free.append(slot)

    def prebinds(self) -> list[tuple[bytes, bytes]]:
        return [(prefix.encode(), f"{PREBIND_DIR}/prefix-{i}".encode()) for i, prefix in enumerate(self.prefixes)]

    def prefix_binds(self, root: bool) -> list[tuple[str, str]]:
        """bwrap's (source, target) for each prefix: the prebound mount point as root."""
        return [(f"{PREBIND_DIR}/prefix-{i}" if root else prefix, prefix) for i, prefix in enumerate(self.prefixes)]


def _interpreter_prefixes() -> list[str]:
    """Our interpreter's prefixes outside the system directories, outermost only."""
    candidates = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    covered = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    kept: list[str] = []
    for prefix in sorted(os.path.realpath(p) for p in candidates if os.path.isdir(p)):
        if not any(prefix == d or prefix.startswith(d.rstrip("/") + "/") for d in covered + kept):
            kept.append(prefix)
    return kept


def _sweep_uids() -> None:
    """Kill processes of throw-away uids whose evaluator is gone (or had our pid)."""
    for _ in range(20):
        victims = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                owner = sandbox_uid_owner(os.stat(entry.path).st_uid)
                if owner is None or (owner != os.getpid() and alive(owner)):
                    continue
                with open(f"{entry.path}/stat") as handle:
                    if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue  # dead already, awaiting its parent
            except (OSError, IndexError):
                continue
            victims.append(int(entry.name))
        if not victims:
            return
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


class _Init:
    """The sandbox's init (bwrap's child, named on --info-fd), held by a pidfd.
    Its exit ends every other process of the PID namespace (the kernel kills
    them and waits for them first), so once it is gone nothing of the program
    runs any more. bwrap itself may exit a moment before it."""

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
        if _parent_pid(child) == process.pid:
            self.fd = fd
        else:
            os.close(fd)

    def kill(self) -> None:
        if self.fd is not None:
            try:
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)
            except OSError:
                pass

    def wait_gone(self, timeout: float) -> None:
        if self.fd is not None:
            select.select([self.fd], [], [], timeout)


def _parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("PPid:"))
    except (OSError, StopIteration, ValueError):
        return None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _normalized(returncode: int) -> int:
    """bwrap reports a program killed by signal N as exit 128 + N; give it back as -N."""
    return -(returncode - 128) if 128 < returncode < 128 + signal.NSIG else returncode


def _read_channel(fd: int) -> bytes:
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


def _read_capped(fd: int, limit: int) -> str:
    return os.pread(fd, limit, 0).decode("utf-8", errors="replace")
