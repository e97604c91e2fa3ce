"""What one evaluator process prepares once for the programs it runs: slots, the
interpreter's prefixes, the cgroup parent, and (as root) the throw-away uids.

Throw-away uids (root only): each running program gets BASE + evaluator pid * SLOTS
+ slot. That range is wide and other software (container runtimes) may use uids in
it, so the range alone never says a process is ours: before a uid runs anything,
the evaluator records issuing it (a file per uid under a root-owned state directory,
naming the evaluator by pid and start time), and removes the record once nothing of
that uid runs. A new evaluator sweeps only recorded uids whose evaluator is gone: it
kills their processes and removes the record. A process of any other uid, in the
range or not, is never touched.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import stat
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from eval.sandbox.cgroup import CgroupParent

SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Root only: mount points for the interpreter's prefixes, and the uid records.
STATE_DIR = "/run/headstart-sandbox"
UID_RECORDS = f"{STATE_DIR}/uids"
SANDBOX_UID_BASE, SLOTS = 1 << 30, 512
_log = logging.getLogger(__name__)


def sandbox_uid(evaluator_pid: int, slot: int) -> int:
    """The throw-away uid of one running program (root only).

    Args:
        evaluator_pid (int): the pid of the evaluator that runs the program.
        slot (int): the program's slot, below `SLOTS`.
    """
    return SANDBOX_UID_BASE + evaluator_pid * SLOTS + slot


@dataclass(frozen=True)
class Evaluator:
    """One process for good: its pid and its start time (clock ticks after boot),
    so that a later process given the same pid is not taken for it."""

    pid: int
    start: int

    @classmethod
    def current(cls) -> Evaluator:
        start = start_time(os.getpid())
        if start is None:  # a record without it would look dead, and be swept, at once
            raise RuntimeError("cannot read this process's start time from /proc/self/stat")
        return cls(os.getpid(), start)

    def alive(self) -> bool:
        return start_time(self.pid) == self.start


def start_time(pid: int) -> int | None:
    """A process's start time in clock ticks after boot (`/proc/<pid>/stat`), None when it cannot be read.

    Args:
        pid (int): the process asked about.
    """
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class UidRecords:
    """The throw-away uids issued on this machine and not yet released: one file
    `<directory>/<uid>` holding "<evaluator pid> <its start time>"."""

    def __init__(self, directory: str = UID_RECORDS) -> None:
        self.directory = Path(directory)
        for path, mode in ((self.directory.parent, 0o755), (self.directory, 0o700)):
            make_private_dir(path, mode)

    def issue(self, uid: int, owner: Evaluator) -> None:
        """Record `uid` as `owner`'s; on disk before the uid runs anything.

        Args:
            uid (int): the throw-away uid issued.
            owner (Evaluator): the evaluator that runs a program under it.
        """
        partial = self.directory / f".{uid}.{owner.pid}"
        partial.write_text(f"{owner.pid} {owner.start}\n")
        partial.replace(self.directory / str(uid))

    def release(self, uid: int) -> None:
        """Nothing of `uid` runs any more: forget its record.

        Args:
            uid (int): the throw-away uid released.
        """
        try:
            (self.directory / str(uid)).unlink()
        except FileNotFoundError:
            pass

    def owners(self) -> dict[int, Evaluator | None]:
        """Every recorded uid and its evaluator (None for a record that does not parse)."""
        found: dict[int, Evaluator | None] = {}
        for path in self.directory.iterdir():
            if not path.name.isdigit():
                continue
            try:
                pid, start = (int(word) for word in path.read_text().split())
                found[int(path.name)] = Evaluator(pid, start)
            except (OSError, ValueError):
                found[int(path.name)] = None
        return found

    def sweep(self) -> None:
        """Kill what runs under recorded uids of evaluators that are gone, and
        forget those uids. Unrecorded uids are not ours to judge."""
        for uid, owner in self.owners().items():
            if owner is not None and owner.alive():
                continue
            if kill_uid(uid):
                self.release(uid)
            else:
                _log.warning("processes of throw-away uid %d survived the sweep; its record is kept", uid)


def make_private_dir(path: Path, mode: int) -> None:
    """A directory owned by root and writable by root only, made with `mode` if
    absent: a record another user could write would aim the sweep at any uid.

    Args:
        path (Path): the directory.
        mode (int): its permission bits where it is made (`0o700`, `0o755`).
    """
    try:
        os.mkdir(path, mode)
        os.chmod(path, mode)  # whatever the umask
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{path} must be a directory owned by root and writable by root only")


def kill_uid(uid: int, tries: int = 20) -> bool:
    """SIGKILL every live process whose real, effective, saved or fs uid is `uid`
    (read from /proc/<pid>/status: a process that made itself non-dumpable shows
    root as the owner of its /proc directory). True once none is left.

    Args:
        uid (int): the uid whose processes are killed.
        tries (int): rounds of kill-then-look, a short pause apart, before giving up.
    """
    for _ in range(tries):
        victims = [pid for pid, (uids, state) in _processes().items() if uid in uids and state != "Z"]
        if not victims:
            return True
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return False


def _processes() -> dict[int, tuple[set[int], str]]:
    """pid -> (its uids, its state letter), for every process we can read."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{entry.path}/status") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
            found[int(entry.name)] = ({int(u) for u in fields["Uid"].split()}, fields["State"].split()[0])
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return found


class Host:
    """Per evaluator process: prepared, and leftovers swept, on first use."""

    _lock = threading.Lock()
    _instance: Host | None = None

    def __init__(self) -> None:
        self.evaluator = Evaluator.current()
        self.root = os.geteuid() == 0
        self.free = list(range(SLOTS))
        self.slot_lock = threading.Lock()
        self.prefixes = interpreter_prefixes()
        self.uids: UidRecords | None = None
        if self.root:
            self.uids = UidRecords()
            self.uids.sweep()
            for index in range(len(self.prefixes)):
                make_private_dir(Path(f"{STATE_DIR}/prefix-{index}"), 0o755)
        self.cgroups = CgroupParent.find()
        if self.cgroups is not None:
            self.cgroups.sweep()
            atexit.register(self.cgroups.remove_own)
        else:
            _log.warning("no cgroup to write: each sandboxed process is capped at its memory limit, "
                         "not the program as a whole")

    @classmethod
    def get(cls) -> Host:
        with cls._lock:
            if cls._instance is None or cls._instance.evaluator.pid != os.getpid():
                cls._instance = Host()
            return cls._instance

    @property
    def containment(self) -> str:
        """What caps a program's memory and processes: a cgroup, or rlimits per process."""
        return "cgroup+seccomp" if self.cgroups is not None else "rlimit+seccomp"

    def acquire_slot(self) -> tuple[int, int | None]:
        """A free slot and, as root, its throw-away uid, recorded before it is used."""
        with self.slot_lock:
            if not self.free:
                raise RuntimeError(f"more than {SLOTS} programs at once")
            slot = self.free.pop()
        if self.uids is None:
            return slot, None
        uid = sandbox_uid(self.evaluator.pid, slot)
        try:
            self.uids.issue(uid, self.evaluator)
        except BaseException:
            self.release_slot(slot, None, gone=True)
            raise
        return slot, uid

    def release_slot(self, slot: int, uid: int | None, gone: bool) -> None:
        """Give the slot back once nothing of its program runs (`gone`); a slot
        whose program may still run is retired, its uid record kept for a sweep.

        Args:
            slot (int): the slot given back.
            uid (int | None): its throw-away uid (as root); None without one.
            gone (bool): whether nothing of the slot's program runs any more.
        """
        if not gone:
            _log.warning("a sandboxed program did not end within its grace time; slot %d is retired", slot)
            return
        if uid is not None and self.uids is not None:
            self.uids.release(uid)
        with self.slot_lock:
            self.free.append(slot)

    def prebinds(self) -> list[tuple[bytes, bytes]]:
        return [(prefix.encode(), f"{STATE_DIR}/prefix-{i}".encode()) for i, prefix in enumerate(self.prefixes)]

    def prefix_binds(self) -> list[tuple[str, str]]:
        """bwrap's (source, target) for each prefix: the prebound mount point as root."""
        return [(f"{STATE_DIR}/prefix-{i}" if self.root else prefix, prefix) for i, prefix in enumerate(self.prefixes)]


def interpreter_prefixes() -> list[str]:
    """Our interpreter's prefixes outside the system directories, outermost only."""
    candidates = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    covered = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    kept: list[str] = []
    for prefix in sorted(os.path.realpath(p) for p in candidates if os.path.isdir(p)):
        if not any(prefix == d or prefix.startswith(d.rstrip("/") + "/") for d in covered + kept):
            kept.append(prefix)
    return kept
