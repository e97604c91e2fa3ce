"""The device check: what only a GPU can show, in one short run on one CUDA GPU, and its CPU
twin (`--cpu`: the same stages in fp32 on CPU, except identity, which stays in bf16: how bf16
rounds on CPU is a measurement too), which CI runs so the check cannot rot.

    bash scripts/device_check.sh [--wheels .whl] [--cpu] [--stage NAME]... [OUTPUT_DIR]

It runs where no weights and no network reach (random-init models built from configs, data
built from the vendored MBPP), and each stage prints figures to compare:
  train       train/sft.py, bf16 + sdpa + gradient checkpointing, a few LoRA steps on a tiny Qwen3
  zero3       DeepSpeed ZeRO-3 on one process: adapter gathered at save, fp32 merge, merged vs
              adapter-on logits
  objectives  objective distill and objective refusion, 2 steps each
  memory      one LoRA step of a random Qwen3-8B (its vendored config) at qwen3_prefix's batch
              (2 x 2048 tokens), activation checkpointing on vs off: step time, peak memory against
              train/memory.py's estimate, activations kept
  timing      the evaluator's residual wall clock, CUDA synchronisation vs CUDA events (same requests)
  stream      a streaming evaluation (chat on MT-Bench, token F1: no sandbox) on cuda and on cpu,
              fp32 without TF32: the forward counts must be equal
  identity    the same evaluation in bf16 on the fast path, regeneration plain, lookup and token
              tree (lookup_tree=8: sdpa with a 4D mask): the streamed answer and the drafter's
              batched D_n against the batch-1 baseline, measured (bf16 may break batch
              invariance; fp32 is lossless); the tree policy must run tree forwards
  widths      a forward's cost by the tokens it feeds (1 to 257 after 256 cached) on a random
              Qwen3-8B in bf16: the width-cost table decode.width_cost reads
`--stage NAME` (repeatable) reruns stages alone; what they share (tiny model, tokenizer, data)
is built once into OUTPUT_DIR/assets. OUTPUT_DIR is the check's own: it holds headstart's run record (headstart-run.json, kind
device-check); a directory without it is never emptied (a non-empty one is refused).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from device_check.assets import preflight, prepare_assets
from device_check.base import DEFAULT_OUTPUT, Check, CheckError, Figure, StageResult, claim_output_dir
from device_check.eval_stages import stage_identity, stage_stream, stage_timing
from device_check.memory_stage import stage_memory
from device_check.train_stages import stage_objectives, stage_train, stage_zero3
from device_check.widths_stage import stage_widths

STAGES: dict[str, Callable[[Check], list[Figure]]] = {
    "train": stage_train, "zero3": stage_zero3, "objectives": stage_objectives, "memory": stage_memory,
    "timing": stage_timing, "stream": stage_stream, "identity": stage_identity, "widths": stage_widths,
}


def run_stage(check: Check, name: str) -> StageResult:
    """Run one stage; its error, if any, is its result.

    Args:
        check (Check): the check's run: directory, device, environment.
        name (str): the stage's name in STAGES.
    """
    print(f"=== {name}", flush=True)
    started = time.perf_counter()
    try:
        figures = STAGES[name](check)
        result = StageResult(name, time.perf_counter() - started, figures)
    except CheckError as error:
        result = StageResult(name, time.perf_counter() - started, error=str(error))
    except Exception as error:  # a stage's bug or a library's refusal: reported, the other stages still run
        result = StageResult(name, time.perf_counter() - started, error=f"{type(error).__name__}: {error}")
    for figure in result.figures:
        mark = "" if figure.ok is None else (" ok" if figure.ok else " FAIL")
        print(f"  {figure.name}: {figure.value}" + (f"  [{figure.compare}]" if figure.compare else "") + mark, flush=True)
    if result.error:
        print(f"  FAILED: {result.error}", flush=True)
    print(f"  ({result.seconds:.0f} s)", flush=True)
    return result


def record_results(check: Check, results: list[StageResult]) -> dict[str, dict]:
    """figures.json keeps every stage's latest result (a rerun of one stage replaces its entry).

    Args:
        check (Check): the check's run: directory, device, environment.
        results (list[StageResult]): the stages just run.
    """
    path = check.out / "figures.json"
    stored = json.loads(path.read_text()) if path.is_file() else {}
    stored.update({r.stage: asdict(r) for r in results})
    stored = {name: stored[name] for name in STAGES if name in stored}
    path.write_text(json.dumps(stored, indent=2) + "\n")
    return stored


def figures_table(stored: dict[str, dict], device: str) -> str:
    """The stored results as a Markdown table, one figure a row.

    Args:
        stored (dict[str, dict]): the stages' results, as figures.json keeps them.
        device (str): the device, in the title.
    """
    lines = [f"# Device check ({device})", "", "| stage | figure | value | compare with | |", "|---|---|---|---|---|"]
    for name, result in stored.items():
        for figure in result["figures"]:
            mark = "" if figure["ok"] is None else ("ok" if figure["ok"] else "FAIL")
            lines.append(f"| {name} | {cell(figure['name'])} | {cell(figure['value'])} | {cell(figure['compare'])} | {mark} |")
        if result["error"]:
            lines.append(f"| {name} | failed | {cell(result['error'].splitlines()[0])} | | FAIL |")
        lines.append(f"| {name} | stage seconds | {result['seconds']:.0f} | | |")
    return "\n".join(lines) + "\n"


def cell(text: str) -> str:
    """`text` safe in a Markdown table cell.

    Args:
        text (str): the cell's text.
    """
    return text.replace("|", "\\|")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line's output directory, `--cpu` and `--stage` choices.

    Args:
        argv (list[str]): the command line.
    """
    parser = argparse.ArgumentParser(prog="scripts/device_check.sh", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_dir", nargs="?", default=DEFAULT_OUTPUT,
                        help=f"the check's directory (default {DEFAULT_OUTPUT}; created, or reused when it holds its run record)")
    parser.add_argument("--cpu", action="store_true", help="the same stages in fp32 on CPU, every GPU hidden")
    parser.add_argument("--stage", action="append", choices=list(STAGES), help="run only this stage (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the check's stages and write their table; returns the exit code.

    Args:
        argv (list[str] | None): the command line; None: `sys.argv[1:]`.
    """
    args = parse_args(sys.argv[1:] if argv is None else argv)
    check = Check(Path(args.output_dir).expanduser().resolve(), args.cpu)
    if check.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch first looks: this process runs on CPU too
    os.environ.update({k: v for k, v in check.env().items() if k != "PYTHONPATH"})
    started = time.perf_counter()
    try:
        claim_output_dir(check.out, replace=not args.stage)
        print("\n".join(preflight(check)), flush=True)
        prepare_assets(check)
    except CheckError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    results = [run_stage(check, name) for name in (args.stage or STAGES)]
    stored = record_results(check, results)
    table = figures_table(stored, f"{'cpu, --cpu' if check.cpu else 'cuda'}; this run {time.perf_counter() - started:.0f} s")
    (check.out / "figures.md").write_text(table)
    print("\n" + table + f"\nlogs, figures.json and figures.md: {check.out}", flush=True)
    failed = [r.stage for r in results if not r.ok]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
