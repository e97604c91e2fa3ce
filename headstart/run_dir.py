"""Output directories: which ones headstart wrote, and may therefore write into again.

Every entry point that writes (evaluation and its suite, before/after, training, the
data builders, the adaptation study) marks its output directory with a run record,
`headstart-run.json`: {"written_by": "headstart", "kind": ..., "version": ...} plus what
the entry point records of its run. A directory is recognised by that record only, never
by a file name users also use (`config.json` is also a model directory's, `config.yaml`
anybody's). Before anything is read or written, `check_output_dir` sorts a directory:

- new: absent or empty; the run starts there;
- resumable: it holds the record of this kind;
- refused: anything else (a file, a non-empty directory without the record, the record
  of another kind, a damaged record): one line naming it, nothing written.

A process holds the directory it writes with `holding_run_dir` (an advisory `flock` on
`.headstart-lock`, removed when the run ends; a killed process's lock is released by the kernel): a second run
on the same directory at the same time is refused with the first's pid, instead of both
computing every request and appending duplicate records.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from headstart import __version__

MARK = "headstart-run.json"
WRITTEN_BY = "headstart"

Verdict = Literal["new", "resumable"]
# headstart's own passing files (a write probe, a record being written): never a user's.
LOCK = ".headstart-lock"
TRANSIENT_PREFIXES = (".headstart-write-check-", f".{MARK}.", LOCK)
_held_locks: dict[Path, int] = {}  # directory -> its open lock file, while this process holds it


def _entries(directory: Path) -> list[Path]:
    """What `directory` holds, less headstart's transient files (another rank's, or a killed one's)."""
    return [p for p in directory.iterdir() if not p.name.startswith(TRANSIENT_PREFIXES)]


class OutputDirError(ValueError):
    """An output directory headstart may not write into (a ValueError: one `error:` line, exit 2)."""


def read_mark(directory: Path) -> dict[str, Any] | None:
    """The run record of `directory`; None when it has none. A record that is not
    headstart's (damaged, or another program's file of that name) is refused.

    Args:
        directory (Path): the output directory.
    """
    path = Path(directory) / MARK
    if not path.is_file():
        return None
    try:
        mark = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise OutputDirError(f"{path}: not a readable headstart run record ({error}); nothing is written: "
                             "choose another output_dir, or move the directory away") from error
    if not isinstance(mark, dict) or mark.get("written_by") != WRITTEN_BY or not isinstance(mark.get("kind"), str):
        raise OutputDirError(f"{path}: not a headstart run record (no written_by/kind); nothing is written: "
                             "choose another output_dir, or move the directory away")
    return mark


def check_output_dir(directory: str | Path, kind: str, setting: str = "output_dir") -> Verdict:
    """Sort `directory` for a run of `kind` (see the module's doc). Reads only. `setting`: the
    name the user gave the directory by, for the message.

    Args:
        directory (str | Path): the output directory.
        kind (str): the run's kind ("train", "eval", ...), which a resumable directory's record must name.
        setting (str): the name the user gave the directory by, for the message.
    """
    directory = Path(directory)
    if not directory.exists():
        return "new"
    how = f"nothing is written: choose another {setting} (a new or empty directory), or move {directory} away"
    if not directory.is_dir():
        raise OutputDirError(f"{setting} {directory} is a file, not a directory; {how}")
    mark = read_mark(directory)
    if mark is not None:
        if mark["kind"] != kind:
            raise OutputDirError(f"{directory} holds a headstart {mark['kind']} run, not a {kind} run; {how}")
        return "resumable"
    entries = sorted(p.name for p in _entries(directory))
    if not entries:
        return "new"
    shown = ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
    raise OutputDirError(f"{setting} {directory} is not empty ({shown}) and holds no {MARK}: headstart did not "
                         f"create it; {how}")


def write_mark(directory: str | Path, kind: str, record: dict[str, Any] | None = None) -> None:
    """Create `directory` if need be and write its run record (atomically: several shards
    may start at once, and a reader never sees half a record).

    Args:
        directory (str | Path): the output directory.
        kind (str): the run's kind.
        record (dict[str, Any] | None): what the entry point records of its run besides headstart's fields, or None.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    mark = {"written_by": WRITTEN_BY, "kind": kind, "version": __version__} | (record or {})
    handle, partial = tempfile.mkstemp(dir=directory, prefix=f".{MARK}.", suffix=".partial")
    with os.fdopen(handle, "w") as stream:
        stream.write(json.dumps(mark, indent=1, sort_keys=True) + "\n")
    os.replace(partial, directory / MARK)


@contextmanager
def holding_run_dir(directory: str | Path, setting: str = "output_dir") -> Iterator[None]:
    """Hold `directory` (created if need be) for the block: a directory another live process holds
    is refused, naming its pid. Nested holds of one directory in one process are one hold.

    Args:
        directory (str | Path): the run directory this process writes.
        setting (str): the name the user gave the directory by, for the message.
    """
    directory = Path(directory).resolve()
    if directory in _held_locks:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    handle = _lock(directory, setting)
    _held_locks[directory] = handle
    try:
        yield
    finally:
        del _held_locks[directory]
        _unlink_own(directory / LOCK, handle)  # while still held: a process that opened it finds it gone, and retries
        os.close(handle)


def _names(path: Path, handle: int) -> bool:
    """Whether `path` is still the file open as `handle` (not unlinked, nor replaced by another)."""
    try:
        return os.stat(path).st_ino == os.fstat(handle).st_ino
    except FileNotFoundError:
        return False


def _unlink_own(path: Path, handle: int) -> None:
    """Remove the lock file if it is still this process's (the run may have removed its directory)."""
    if _names(path, handle):
        os.unlink(path)


def _lock(directory: Path, setting: str) -> int:
    """The open, locked lock file of `directory`, this process's pid written in it."""
    path = directory / LOCK
    while True:
        handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(handle, 32, 0).decode(errors="replace").strip() or "?"
            os.close(handle)
            raise OutputDirError(f"{setting} {directory} is being written by another run (pid {holder}); wait for it "
                                 f"to end, or choose another {setting}") from None
        if _names(path, handle):  # not a file its last holder unlinked meanwhile
            break
        os.close(handle)
    os.ftruncate(handle, 0)
    os.pwrite(handle, str(os.getpid()).encode(), 0)
    return handle


def check_writable(directory: str | Path, setting: str = "output_dir") -> None:
    """Refuse, before anything loads, a directory that cannot be created or written: under a
    file, or where this process may not write. Tried for real (a directory made and removed
    at once) where the directory or its nearest existing parent is: permission bits do not
    say it for root, nor on a read-only mount. Leaves nothing behind.

    Args:
        directory (str | Path): the directory the run will write to.
        setting (str): the name the user gave the directory by, for the message.
    """
    directory = Path(directory).expanduser()
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == directory else f"would be under {existing}, which is a file"
        raise OutputDirError(f"{setting} {directory} {where}, not a directory; choose another {setting}")
    try:
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".headstart-write-check-"))
    except OSError as error:
        what = "" if existing == directory else f" (in {existing}, its nearest existing parent)"
        raise OutputDirError(f"{setting} {directory} cannot be written{what}: {error.strerror or error}; "
                             f"choose another {setting}") from error
