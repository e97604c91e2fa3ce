"""Write a build's output directory atomically: dataset, config, report, card, preview.

The builder replaces only what it wrote. Each output directory holds headstart's run
record (headstart.run_dir, kind "data"), listing its files; a directory without it, or
holding a file the list does not name (an adapter saved there, notes), is refused, never
deleted. The one exception is `datasets`' cache files beside a split's rows (training's
tokenization writes them): derived data, replaced with the rows they came from. The work
directory gets its own marker (`.headstart-work`), and only the builder's own intermediate
files are ever removed from it.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from pathlib import Path

from datasets import Dataset, DatasetDict
from omegaconf import OmegaConf

from data_builders.card import render_card
from data_builders.config import BuildConfig
from data_builders.report import NOTHING_KEPT, Report
from headstart.run_dir import LOCK, MARK, read_mark, write_mark

OUTPUT_MARKER = MARK
RUN_KIND = "data"
WORK_MARKER = ".headstart-work"
# What a build writes into its work directory (datasets' map adds shard suffixes and tmp files).
WORK_FILES = ("requests-*", "analysed-*", "pairs-*", "answers-*", "seconds.json", "tmp*", LOCK)  # LOCK: the running build's
MARKED_BY = "python -m data_builders"
# The cache files `datasets` writes beside a saved split when it is mapped, filtered or shuffled
# (`cache-<fingerprint>.arrow`, with a `_00000_of_00004` shard suffix under num_proc).
MAP_CACHE_FILES = "cache-*.arrow"


def _files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() or p.is_symlink())


def _is_work_file(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in WORK_FILES)


def foreign_output_files(directory: Path) -> list[str]:
    """Files of an output directory the builder did not write: every file when it has no
    marker (it did not create the directory), else those its marker does not list.

    Args:
        directory (Path): the output directory.
    """
    if not directory.exists():
        return []
    if not directory.is_dir():
        return [directory.name]
    present = [f for f in _files(directory) if f != OUTPUT_MARKER]
    marker = _output_marker(directory)
    if marker is None:
        return present
    written = set(marker["files"])
    if marker.get("in_progress") and directory.name.endswith(".partial"):
        return []  # a save killed midway: every file in it is one it was writing
    return [f for f in present if f not in written and not _is_map_cache(f, written)]


def _is_map_cache(name: str, written: set[str]) -> bool:
    """A cache file `datasets` wrote beside a split's rows when a run mapped them (training
    tokenizes its data so): derived from the rows, and stale once they are rebuilt, so a rebuild
    replaces it with the rest. Only beside rows the builder wrote, under datasets' own name."""
    folder, _, file = name.rpartition("/")
    return fnmatch.fnmatchcase(file, MAP_CACHE_FILES) and any(
        w.rpartition("/")[0] == folder and fnmatch.fnmatchcase(w.rpartition("/")[2], "data-*.arrow") for w in written
    )


def _output_marker(directory: Path) -> dict | None:
    """The build's record of an output directory (headstart's run record of kind "data"); None
    when there is none, or one of another kind or unreadable."""
    try:
        marker = read_mark(directory)
    except (OSError, ValueError):  # OutputDirError (a damaged record) is a ValueError
        return None
    if not isinstance(marker, dict) or marker.get("kind", RUN_KIND) != RUN_KIND or not isinstance(marker.get("files"), list):
        return None
    return marker


def foreign_work_files(directory: Path) -> list[str]:
    """Files of a work directory that are not the builder's intermediate files. A work
    directory without a marker (written before markers existed) is adopted when it holds
    only such files: its answer cache is worth keeping.

    Args:
        directory (Path): the work directory.
    """
    if not directory.exists():
        return []
    if not directory.is_dir():
        return [directory.name]
    return [f for f in _files(directory) if f != WORK_MARKER and not _is_work_file(f)]


def check_replaceable(output: Path, work: Path) -> None:
    """Refuse, before any work, an output directory (or its .partial/.old siblings) the
    builder did not create, or one holding a file it did not write, and a work directory
    holding files that are not its own, naming them. Nothing is deleted.

    Args:
        output (Path): the output directory.
        work (Path): the work directory.
    """
    for directory in (output, output.with_name(output.name + ".partial"), output.with_name(output.name + ".old")):
        foreign = foreign_output_files(directory)
        if foreign:
            marked = _output_marker(directory) is not None
            why = ("files the data builders did not write" if marked
                   else f"no {OUTPUT_MARKER} marker: the data builders did not create it")
            hint = "" if marked or "dataset_dict.json" not in foreign else (
                "; a dataset built before markers existed is not replaced either: remove it yourself to rebuild it")
            raise ValueError(f"{directory} holds {_shown(foreign)} ({why}); nothing is deleted: choose another "
                             f"output_dir, or move the directory away yourself{hint}")
    foreign = foreign_work_files(work)
    if foreign:
        raise ValueError(f"work_dir {work} holds {_shown(foreign)}, not intermediate files of the data builders; "
                         "nothing is deleted: choose another work_dir, or move them away yourself")


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def open_work_dir(work: Path) -> None:
    """Create (or adopt) the work directory and mark it as the builder's.

    Args:
        work (Path): the work directory.
    """
    work.mkdir(parents=True, exist_ok=True)
    marker = work / WORK_MARKER
    if not marker.is_file():
        marker.write_text(json.dumps({"written_by": MARKED_BY, "files": list(WORK_FILES)}) + "\n")


def remove_work_dir(work: Path) -> None:
    """Remove the builder's intermediate files, then the directory if nothing else is left.

    Args:
        work (Path): the work directory.
    """
    if not (work / WORK_MARKER).is_file():
        return
    for name in _files(work):
        if _is_work_file(name):
            (work / name).unlink()
    (work / WORK_MARKER).unlink()
    try:
        work.rmdir()
    except OSError:
        pass  # something else lives there: it stays


def _remove_own(directory: Path) -> None:
    """Delete an output directory of the builder's own, every file of which it wrote."""
    if not directory.exists():
        return
    foreign = foreign_output_files(directory)
    if foreign:
        raise ValueError(f"{directory} holds {_shown(foreign)}, which the data builders did not write; nothing is deleted")
    shutil.rmtree(directory)


def save(splits: DatasetDict, config: BuildConfig, report: Report, output: Path, command: str) -> None:
    """Write everything to OUTPUT.partial, then swap it in: a killed build never leaves
    a half-written dataset where the trainer looks. The marker goes in first (a save killed
    beyond Python's reach leaves a directory the next build may remove) and lists every file
    at the end; a save that fails or is interrupted removes its OUTPUT.partial itself. The
    output it replaces is left as OUTPUT.old for `discard_replaced`.

    Args:
        splits (DatasetDict): the dataset's splits.
        config (BuildConfig): the build's settings.
        report (Report): the build's report.
        output (Path): the output directory.
        command (str): the command line that ran the build, for the dataset card.
    """
    partial = output.with_name(output.name + ".partial")
    _remove_own(partial)
    partial.mkdir(parents=True)  # outside the try: a directory this save did not create is never removed
    try:
        _write_partial(partial, splits, config, report, command)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # half a dataset: no resume can use it
        raise
    if output.exists():
        stale = output.with_name(output.name + ".old")
        _remove_own(stale)
        if foreign_output_files(output):  # checked before the build; checked again before anything moves
            raise ValueError(f"{output} holds files the data builders did not write; nothing is deleted")
        os.replace(output, stale)
    os.replace(partial, output)


def _write_partial(partial: Path, splits: DatasetDict, config: BuildConfig, report: Report, command: str) -> None:
    write_mark(partial, RUN_KIND, {"files": [], "in_progress": True, "command": MARKED_BY})
    splits.save_to_disk(str(partial))
    config_yaml = OmegaConf.to_yaml(OmegaConf.structured(config))
    (partial / "config.yaml").write_text(config_yaml)
    (partial / "report.json").write_text(report.to_json() + "\n")
    (partial / "README.md").write_text(
        render_card(config.name, config.format, config.pairs, config.answers, report, config_yaml, command, config.model)
    )
    _write_preview(splits["train"], partial / "preview.jsonl", config.preview_rows)
    written = [f for f in _files(partial) if f != OUTPUT_MARKER]
    write_mark(partial, RUN_KIND, {"files": written, "command": MARKED_BY})


def discard_replaced(output: Path, ignore_errors: bool = False) -> None:
    """Delete OUTPUT.old, the previous output `save` moved aside (checked as the builder's own
    before it moved). Deleted after the new output is in place: a large one takes a while.

    Args:
        output (Path): the output directory.
        ignore_errors (bool): leave what cannot be deleted instead of raising.
    """
    stale = output.with_name(output.name + ".old")
    if stale.exists():
        shutil.rmtree(stale, ignore_errors=ignore_errors)


def after_interrupt(output: Path, work: Path, created: bool, saved: bool) -> str:
    """Tidy up after a Ctrl-C and say, in one phrase, what the build kept. Its temporary files
    go (OUTPUT.partial is gone already, see `save`). The work directory stays when it holds a
    finished pass, since the same command resumes from it (a killed build resumes too);
    one this build created that holds none goes with the rest.

    Args:
        output (Path): the output directory.
        work (Path): the work directory.
        created (bool): whether this build created the work directory.
        saved (bool): whether the output was saved before the interrupt.
    """
    _remove_temporary_work_files(work)
    if saved:
        discard_replaced(output, ignore_errors=True)  # its deletion may be what was interrupted
        return f"{output} was saved whole before the interrupt"
    if _resumable_work_files(work):
        return (f"{output} was not written; the passes that finished are kept in {work}: rerun the same command "
                f"to resume (or delete {work} to start afresh)")
    if created:
        remove_work_dir(work)
    return NOTHING_KEPT


# What an interrupted pass leaves in the work directory: a file being written (collect's
# requests-*.partial, the temporary file of a `datasets` map), never a finished result.
TEMPORARY_WORK_FILES = ("*.partial", "tmp*")


def _remove_temporary_work_files(work: Path) -> None:
    """The builder's half-written intermediate files (in a work directory it marked: never a user's)."""
    if not (work / WORK_MARKER).is_file():
        return
    for name in _files(work):
        if _is_work_file(name) and any(fnmatch.fnmatchcase(name, pattern) for pattern in TEMPORARY_WORK_FILES):
            (work / name).unlink(missing_ok=True)


def _resumable_work_files(work: Path) -> list[str]:
    """The finished intermediate results a rerun would reuse (the clock of the build does not count)."""
    if not work.is_dir():
        return []
    return [name for name in _files(work) if _is_work_file(name) and name != "seconds.json"]


def _write_preview(dataset: Dataset, path: Path, rows: int) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for row in dataset.select(range(min(rows, len(dataset)))):
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
