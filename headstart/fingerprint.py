"""Content fingerprints of files and directories: what a result was computed from.

A fingerprint hashes bytes, never sizes or modification times: two adapters of
the same size written in the same second differ in their fingerprint. Each file
is read once per process; a file written again since it was hashed (new size, mtime,
ctime or inode) is read again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

# (resolved path, size, mtime_ns, ctime_ns, inode) -> hex digest: only saves re-reading a file
# within one process (a suite's runs share one model). Any write, or a modification time put
# back by hand (which sets ctime), reads the file again. Never kept across processes.
_DIGESTS: dict[tuple[str, int, int, int, int], str] = {}


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes.

    Args:
        path (str | Path): the file hashed.
    """
    path = Path(path).resolve()
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def files_sha256(named: list[tuple[str, Path]]) -> str:
    """One digest over (name, content digest) pairs, in the order given.

    Args:
        named (list[tuple[str, Path]]): (name, file) pairs; the name, not the file's path, enters the digest.
    """
    digest = hashlib.sha256()
    for name, path in named:
        digest.update(f"{name}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()


def tree_sha256(directory: str | Path) -> str:
    """Digest of every file under `directory` (names relative to it, sorted).

    Args:
        directory (str | Path): the folder hashed, with its subfolders.
    """
    root = Path(directory)
    return files_sha256([(str(p.relative_to(root)), p) for p in sorted(root.rglob("*")) if p.is_file()])


def path_sha256(path: str | Path) -> str:
    """A file's digest, or a directory's (`tree_sha256`); FileNotFoundError when absent.

    Args:
        path (str | Path): a file or a folder.
    """
    path = Path(path)
    if path.is_dir():
        return tree_sha256(path)
    if not path.is_file():
        raise FileNotFoundError(f"not found: {path}")
    return file_sha256(path)
