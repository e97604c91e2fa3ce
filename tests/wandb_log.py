"""What an offline W&B run logged: the records of its `run-*.wandb` file, read back whole.

The file is a LevelDB-style log: a 7-byte header, then 32 KiB blocks of chunks (CRC32 4 bytes,
length 2, type 1, data). A record that crosses a block boundary is cut in two there, so a search
of the raw bytes misses a key that straddles one: the chunks' data are joined first.
"""

from __future__ import annotations

import time
from pathlib import Path

FILE_HEADER = 7  # ":W&B", a 2-byte magic, a 1-byte version
BLOCK = 32 * 1024  # counted from the start of the file, header included
CHUNK_HEADER = 7


def logged_bytes(path: Path) -> bytes:
    """Every chunk's data in order: each record's bytes contiguous, the block framing gone."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    chunks, offset = [], FILE_HEADER
    while offset + CHUNK_HEADER <= len(data):
        left = BLOCK - offset % BLOCK
        if left < CHUNK_HEADER:  # too little room for a chunk: the block's zero padding
            offset += left
            continue
        length = int.from_bytes(data[offset + 4:offset + 6], "little")
        chunks.append(data[offset + CHUNK_HEADER:offset + CHUNK_HEADER + length])
        offset += CHUNK_HEADER + length
    return b"".join(chunks)


def logged_by_runs(runs: list[Path], needle: bytes, holders: int = 1, timeout_s: float = 60) -> list[bytes]:
    """Each offline run's logged bytes, read again until `holders` of them hold `needle` (or
    `timeout_s` passed): wandb-core may write the last records after `run.finish()` returned
    (under load, a summary key was missing from the file for a moment and there a second later)."""
    deadline = time.monotonic() + timeout_s
    while True:
        logs = [logged_bytes(next(run.glob("run-*.wandb"))) for run in runs]
        if sum(needle in log for log in logs) >= holders or time.monotonic() > deadline:
            return logs
        time.sleep(0.5)
