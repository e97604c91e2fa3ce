"""Throughput and peak memory of the LMSYS builder (no generation) as the input grows.

Writes synthetic LMSYS-Chat-1M files in the real schema (benchmarks/synthetic_corpus.py, the tests' too),
runs `python -m data_builders recipe=lmsys_prefix answers=reference ...` on each
in a fresh process, and samples the memory of that process and its map workers.

    python benchmarks/bench_data_builders.py --sizes 50000 200000 --num-proc 2

Memory is proportional set size (PSS) summed over the builder and its map
workers at each sample, so pages shared after fork count once. "peak PSS"
includes the file pages of memory-mapped Arrow files (page cache, reclaimable);
"peak anon" is the heap alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from synthetic_corpus import lmsys_rows, write_jsonl  # beside this script

from headstart.paths import DATA_DIR

REPO = Path(__file__).resolve().parents[1]  # the checkout this benchmark runs from (benchmarks are not installed)


def process_tree(pid: int) -> list[int]:
    pids, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        pids.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                frontier += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return pids


def memory_kib(pids: list[int]) -> tuple[int, int]:
    """(PSS, anonymous PSS) in KiB summed over `pids`: pages shared after fork count once."""
    pss = anon = 0
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in rollup.splitlines():
            if line.startswith("Pss:"):
                pss += int(line.split()[1])
            elif line.startswith("Pss_Anon:"):
                anon += int(line.split()[1])
    return pss, anon


def run_build(input_path: Path, output: Path, num_proc: int, data_dir: str) -> dict:
    argv = [
        sys.executable, "-m", "data_builders", "recipe=lmsys_prefix", f"lmsys.path={input_path}",
        "answers=reference", "caps.max_tokens=0", "caps.max_pairs=0", "caps.max_pairs_per_request=4",
        f"num_proc={num_proc}", f"output_dir={output}", f"decontamination.data_dir={data_dir}",
        "decontamination.on_missing=skip", "keep_work_dir=false",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    started = time.perf_counter()
    process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = [0, 0]

    def sample() -> None:
        while process.poll() is None:
            rss, anon = memory_kib(process_tree(process.pid))
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], anon)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    seconds = time.perf_counter() - started
    sampler.join()
    if process.returncode:
        raise SystemExit(f"build failed ({process.returncode}):\n{stderr[-3000:]}")
    report = json.loads((output / "report.json").read_text())
    return {
        "seconds": round(seconds, 1),
        "peak_rss_mib": round(peak[0] / 1024),
        "peak_anon_mib": round(peak[1] / 1024),
        "pairs": sum(s["rows"] for s in report["splits"].values()),
        "requests": sum(s["requests"] for s in report["splits"].values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50_000, 200_000])
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--data-dir", default=str(DATA_DIR), help="benchmark files for decontamination")
    parser.add_argument("--workdir", default=None, help="where the synthetic inputs go (default: a temp dir)")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_data_builders-"))
    print(f"{'rows':>8} {'MB':>6} {'seconds':>8} {'rows/s':>8} {'peak PSS MiB':>13} {'peak anon MiB':>14} "
          f"{'requests':>9} {'pairs':>8}")
    for size in args.sizes:
        path = workdir / f"lmsys-{size}.jsonl"
        if not path.exists():
            write_jsonl(path, lmsys_rows(size, seed=0))
        result = run_build(path, workdir / f"out-{size}", args.num_proc, args.data_dir)
        megabytes = path.stat().st_size / 1e6
        print(
            f"{size:>8} {megabytes:>6.0f} {result['seconds']:>8} {size / result['seconds']:>8.0f} "
            f"{result['peak_rss_mib']:>13} {result['peak_anon_mib']:>14} {result['requests']:>9} {result['pairs']:>8}",
            flush=True,
        )


if __name__ == "__main__":
    main()
