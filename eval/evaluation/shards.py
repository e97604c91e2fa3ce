"""One evaluation split across GPUs and nodes, then merged back into the run it splits.

`shard=INDEX/COUNT` keeps the requests at positions INDEX, INDEX+COUNT, ... of the
run's selection (the first `limit` requests, in order), so COUNT shards hold disjoint
requests that together are the whole selection. A shard is an ordinary resumable run
in its own directory, output_dir/shards/INDEX-of-COUNT/ (so no two shards ever write
the same file), which also records the request ids it was given (shard.json).

The same run without `shard` merges: every shard present, finished, made with this
run's settings and fingerprints and given the requests this run assigns it; their
records, in the unsharded request order, become output_dir/results.jsonl, from which
the run writes its summary and report as if it had computed them itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from headstart.files import read_jsonl, write_jsonl

SHARDS_DIR = "shards"
MANIFEST = "shard.json"
T = TypeVar("T")


@dataclass(frozen=True, order=True)
class Shard:
    """Shard `index` (from 0) of `count`."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def name(self) -> str:
        """Its directory's name (a slash cannot be one)."""
        return f"{self.index}-of-{self.count}"

    def select(self, items: Sequence[T]) -> list[T]:
        """Its part of `items`: every COUNT-th from INDEX, order kept (round robin, so
        long and short requests spread evenly when the data is sorted by anything).

        Args:
            items (Sequence[T]): the run's selection, in order.
        """
        return list(items[self.index :: self.count])


def parse_shard(text: str | None) -> Shard | None:
    """`INDEX/COUNT` (0 <= INDEX < COUNT) as a Shard; None (no sharding) for None.

    Args:
        text (str | None): the `shard` setting.
    """
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not match:
        raise ValueError(f"shard {text!r} is not INDEX/COUNT (e.g. shard=0/4: the first of four shards)")
    index, count = int(match[1]), int(match[2])
    if count < 1 or index >= count:
        raise ValueError(f"shard {text!r}: INDEX must be 0..COUNT-1 and COUNT at least 1 (e.g. 0/{max(count, 2)})")
    return Shard(index, count)


def shard_dir(output_dir: Path, shard: Shard) -> Path:
    """The directory a shard of the run in `output_dir` writes to: output_dir/shards/INDEX-of-COUNT.

    Args:
        output_dir (Path): the results directory of the run the shard splits.
        shard (Shard): the shard.
    """
    return output_dir / SHARDS_DIR / shard.name


def write_manifest(directory: Path, shard: Shard, request_ids: list[str]) -> None:
    """What the merge checks a shard against: which requests it was given.

    Args:
        directory (Path): the shard's directory.
        shard (Shard): the shard.
        request_ids (list[str]): the ids of the requests it was given, in order.
    """
    manifest = {"shard": str(shard), "request_ids": request_ids}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def merged_records(output_dir: Path, settings: dict[str, Any], request_ids: list[str]) -> list[dict[str, Any]] | None:
    """The records of output_dir's shards in the order of `request_ids` (the unsharded
    run's selection), or None when it holds no shards. Reads only; every way the shards
    can fail to add up to this run is an error naming the shard and what to do.

    Args:
        output_dir (Path): the results directory of the sharded run.
        settings (dict[str, Any]): this run's number-deciding settings and fingerprints; every shard must record them.
        request_ids (list[str]): the ids of the run's selection, in order.
    """
    root = output_dir / SHARDS_DIR
    shards = _shards_in(root)
    if not shards:
        return None
    count = _one_count(root, shards)
    missing = [str(Shard(i, count)) for i in range(count) if Shard(i, count) not in shards]
    if missing:
        raise ValueError(f"{root}: shard {', '.join(missing)} missing (of {count}): run it (shard=INDEX/{count}, "
                         "same settings) before merging")
    by_shard = {shard: _finished_records(root / shard.name, shard, settings, shard.select(request_ids))
                for shard in sorted(shards)}
    dtypes = {record["dtype"]: shard for shard, records in by_shard.items() for record in records.values()
              if record.get("dtype")}
    if len(dtypes) > 1:  # settings that leave dtype unset resolve it per device: a GPU shard in bf16, a CPU one in fp32
        found = ", ".join(f"{dtype} (shard {shard})" for dtype, shard in dtypes.items())
        raise ValueError(f"{root}: the shards computed in different dtypes ({found}); rerun them with one dtype=...")
    by_id = {request_id: record for records in by_shard.values() for request_id, record in records.items()}
    return [by_id[request_id] for request_id in request_ids]


def merge_into(results_path: Path, merged: list[dict[str, Any]]) -> None:
    """Make `results_path` hold the merged records (first, in their order). Merging
    again is a no-op; records of the same requests that differ (results computed
    apart from these shards) are refused rather than silently replaced.

    Args:
        results_path (Path): the run's results.jsonl.
        merged (list[dict[str, Any]]): the shards' records, from `merged_records`.
    """
    by_id = {record["request_id"]: record for record in merged}
    existing = read_jsonl(results_path)
    conflicting = [r["request_id"] for r in existing if r["request_id"] in by_id and r != by_id[r["request_id"]]]
    if conflicting:
        raise ValueError(f"{results_path} already holds other results for {len(conflicting)} of the sharded requests "
                         f"(e.g. {conflicting[0]}), not written by merging these shards: move it away to merge them")
    write_jsonl(results_path, merged + [r for r in existing if r["request_id"] not in by_id])


def _shards_in(root: Path) -> set[Shard]:
    if not root.is_dir():
        return set()
    shards = set()
    for path in root.iterdir():
        match = re.fullmatch(r"(\d+)-of-(\d+)", path.name)
        if not (path.is_dir() and match and int(match[1]) < int(match[2])):
            raise ValueError(f"{path}: not a shard directory (INDEX-of-COUNT); {root} holds the shards only")
        shards.add(Shard(int(match[1]), int(match[2])))
    return shards


def _one_count(root: Path, shards: set[Shard]) -> int:
    """The shards' COUNT: one sharding per run, or positions would overlap."""
    counts = sorted({shard.count for shard in shards})
    if len(counts) > 1:
        raise ValueError(f"{root} holds shards of {' and '.join(map(str, counts))} shards: one sharding per run; "
                         "move the shards of the other COUNT away")
    return counts[0]


# Number-deciding settings added after results directories were first written, each with the value
# that gives the numbers recorded before it existed: a directory (or shard) that does not record one
# ran with that value. Any other setting a directory does not record is a difference.
ADDED_SETTINGS = {"lookup_realign": 0, "prompt_format": "auto"}


def recorded_settings(directory: Path) -> dict[str, Any]:
    """The settings a results directory's config.json records, with ADDED_SETTINGS where it predates them.

    Args:
        directory (Path): the results directory (a run's or a shard's).
    """
    path = directory / "config.json"
    try:
        return ADDED_SETTINGS | json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error}); the settings of these results are unknown") from error


def _finished_records(directory: Path, shard: Shard, settings: dict[str, Any],
                      request_ids: list[str]) -> dict[str, dict[str, Any]]:
    """A shard's record of each of `request_ids`, checked: this run's settings, these requests, all finished."""
    if not (directory / MANIFEST).is_file() or not (directory / "config.json").is_file():
        raise ValueError(f"{directory}: shard {shard} never started (no {MANIFEST} or config.json): run it with "
                         f"shard={shard}")
    saved = recorded_settings(directory)
    changed = [f"{k}: {saved.get(k)!r} (shard) vs {v!r} (this run)" for k, v in settings.items() if saved.get(k) != v]
    if changed:
        raise ValueError(f"{directory}: shard {shard} ran with other settings ({'; '.join(changed)}); rerun it with "
                         "this run's settings")
    given = json.loads((directory / MANIFEST).read_text())["request_ids"]
    if given != request_ids:
        raise ValueError(f"{directory}: shard {shard} was given {len(given)} other requests than the {len(request_ids)} "
                         f"this run assigns it (another limit or data?); rerun it with shard={shard}")
    records = {r["request_id"]: r for r in read_jsonl(directory / "results.jsonl")}
    done = sum(request_id in records for request_id in request_ids)
    if done < len(request_ids):
        raise ValueError(f"{directory}: shard {shard} unfinished ({done} of {len(request_ids)} requests done); "
                         f"rerun it with shard={shard} (it resumes) before merging")
    return {request_id: records[request_id] for request_id in request_ids}
