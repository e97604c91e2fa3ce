"""One cgroup per sandboxed program: a memory and process cap on the whole
program (every process it forks counts), where this machine lets us make one.

Layout: `<parent>/headstart-sandbox-<evaluator pid>/<slot>`, one leaf per
running program, and `.../checker-<n>` per running trusted checker
(eval/sandbox/calls.py). cgroup v2: `<parent>` is the nearest ancestor of the
evaluator's own cgroup that delegates the memory and pids controllers (a leaf
cannot sit under a cgroup that holds processes); cgroup v1 (hybrid hosts): the
evaluator's own memory and pids cgroups. A cgroup of an evaluator that no
longer runs (it was killed mid-run) is emptied and removed by the next
evaluator's `sweep`.

Where none can be made (no cgroup file system we may write, as for most
non-root users), `CgroupParent.find` returns None and memory is capped per
process only (RLIMIT_AS): a program may then use up to its process limit times
its memory limit.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "headstart-sandbox-"
CONTROLLERS = ("memory", "pids")


@dataclass(frozen=True)
class CgroupParent:
    """Where this evaluator's per-program cgroups go: one directory per
    hierarchy (v2: one; v1: the memory and, if mounted, the pids hierarchy)."""

    version: int
    parents: tuple[Path, ...]

    @classmethod
    def find(cls) -> CgroupParent | None:
        """The cgroup parent we can write, v2 first, or None."""
        for finder in (_find_v2, _find_v1):
            try:
                found = finder()
            except OSError:
                found = None
            if found is not None and found.usable():
                return found
        return None

    def usable(self) -> bool:
        """We may create (and remove) a directory of our own there."""
        probe = [parent / f"{PREFIX}probe-{os.getpid()}" for parent in self.parents]
        try:
            for path in probe:
                path.mkdir(exist_ok=True)
            if self.version == 2:
                _write(probe[0] / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
            return True
        except OSError:
            return False
        finally:
            for path in probe:
                _rmdir_quietly(path)

    def evaluator_dirs(self, pid: int | None = None) -> list[Path]:
        """An evaluator's directories, one per hierarchy: `<parent>/headstart-sandbox-<pid>`.

        Args:
            pid (int | None): the evaluator's pid; None: this process's.
        """
        name = f"{PREFIX}{os.getpid() if pid is None else pid}"
        return [parent / name for parent in self.parents]

    def create(self, name: int | str, memory_bytes: int, max_pids: int, owner: int | None = None) -> Cgroup:
        """A fresh leaf `name` (a program's slot, or a trusted checker's name) of
        evaluator `owner` (us), its limits set.

        Args:
            name (int | str): the leaf's name: a program's slot, or `checker-<n>`.
            memory_bytes (int): the memory cap, in bytes, of all its processes together.
            max_pids (int): the most processes (threads included) in it at once.
            owner (int | None): the evaluator's pid; None: this process's.
        """
        leaves = []
        for base in self.evaluator_dirs(owner):
            base.mkdir(exist_ok=True)
            if self.version == 2:
                _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
            leaf = base / str(name)
            leaf.mkdir(exist_ok=True)
            leaves.append(leaf)
        cgroup = Cgroup(self.version, tuple(leaves))
        cgroup.set_limits(memory_bytes, max_pids)
        return cgroup

    def sweep(self) -> None:
        """Empty and remove the cgroups of evaluators that no longer run (and
        any left under our own pid by an earlier process that had it)."""
        for parent in self.parents:
            try:
                entries = list(parent.iterdir())
            except OSError:
                continue
            for base in entries:
                owner = base.name[len(PREFIX):]
                if not base.name.startswith(PREFIX) or not owner.isdigit():
                    continue
                if int(owner) != os.getpid() and alive(int(owner)):
                    continue
                try:
                    leaves = [p for p in base.iterdir() if p.is_dir()]
                except FileNotFoundError:  # another evaluator's sweep removed it first
                    continue
                for leaf in leaves:
                    Cgroup(self.version, (leaf,)).destroy()
                _rmdir_quietly(base)

    def remove_own(self) -> None:
        """Remove our (empty) evaluator directories; at exit."""
        for base in self.evaluator_dirs():
            _rmdir_quietly(base)


@dataclass(frozen=True)
class Cgroup:
    """The cgroup (one leaf per hierarchy) of one running program."""

    version: int
    leaves: tuple[Path, ...]

    def set_limits(self, memory_bytes: int, max_pids: int) -> None:
        """Cap the memory (swap included) and the number of processes of everything in the cgroup,
        as far as its hierarchies offer (v1: the memory and, where mounted, the pids controller).

        Args:
            memory_bytes (int): the memory cap, in bytes, of all its processes together.
            max_pids (int): the most processes (threads included) in it at once.
        """
        for leaf in self.leaves:
            if self.version == 2:
                _write(leaf / "memory.max", str(memory_bytes))
                _write_if_present(leaf / "memory.swap.max", "0")
                # One process over the cap takes the whole program with it.
                _write_if_present(leaf / "memory.oom.group", "1")
                _write(leaf / "pids.max", str(max_pids))
            elif (leaf / "memory.limit_in_bytes").exists():
                # memory+swap may never be below memory: raise it first, lower it last.
                _write_if_present(leaf / "memory.memsw.limit_in_bytes", str(memory_bytes))
                _write(leaf / "memory.limit_in_bytes", str(memory_bytes))
                _write_if_present(leaf / "memory.memsw.limit_in_bytes", str(memory_bytes))
            elif (leaf / "pids.max").exists():
                _write(leaf / "pids.max", str(max_pids))

    def procs_files(self) -> list[bytes]:
        """The `cgroup.procs` paths to write "0" to, in the child before exec
        (computed here, before the fork)."""
        return [str(leaf / "cgroup.procs").encode() for leaf in self.leaves]

    def destroy(self) -> None:
        """Kill whatever still runs in it, then remove it."""
        for leaf in self.leaves:
            _write_if_present(leaf / "cgroup.kill", "1")
            for _ in range(200):
                pids = _procs(leaf)
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                if not pids and _rmdir_quietly(leaf):
                    break
                time.sleep(0.01)


def join(procs_files: list[bytes]) -> None:
    """Move the calling process into the cgroup; runs between fork and exec,
    so only raw system calls.

    Args:
        procs_files (list[bytes]): the cgroup's `cgroup.procs` paths (`Cgroup.procs_files`).
    """
    for path in procs_files:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


def _find_v2() -> CgroupParent | None:
    mount = _mountpoint("cgroup2", None)
    own = _own_path("")
    if mount is None or own is None:
        return None
    root = Path(mount)
    if not set(CONTROLLERS) <= set((root / "cgroup.controllers").read_text().split()):
        return None
    # The root cgroup may hold processes and children; any other must not hold
    # processes to delegate, so start at our parent.
    candidate = own if own == "/" else os.path.dirname(own)
    while True:
        directory = root / candidate.lstrip("/")
        if set(CONTROLLERS) <= set((directory / "cgroup.subtree_control").read_text().split()):
            return CgroupParent(2, (directory,))
        if candidate == "/":
            return None
        candidate = os.path.dirname(candidate)


def _find_v1() -> CgroupParent | None:
    parents = []
    for controller in CONTROLLERS:
        mount, own = _mountpoint("cgroup", controller), _own_path(controller)
        if mount is None or own is None:
            if controller == "memory":
                return None
            continue
        parents.append(Path(mount) / own.lstrip("/"))
    return CgroupParent(1, tuple(parents))


def _mountpoint(fstype: str, controller: str | None) -> str | None:
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            before, after = line.split(" - ", 1)
            fields, tail = before.split(), after.split()
            if tail[0] != fstype or fields[3] != "/":
                continue
            if controller is None or controller in tail[2].split(","):
                return fields[4]
    return None


def _own_path(controller: str) -> str | None:
    """Our cgroup path in the hierarchy of `controller` ("" is v2's)."""
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if (controller == "" and controllers == "") or (controller and controller in controllers.split(",")):
                return path
    return None


def _procs(leaf: Path) -> list[int]:
    try:
        return [int(pid) for pid in (leaf / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def alive(pid: int) -> bool:
    """Whether a process exists (one of another user counts).

    Args:
        pid (int): the process asked about.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _write_if_present(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass


def _rmdir_quietly(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False
