"""The device check's evaluation stages: the streaming evaluator in this process (residual
wall clock with CUDA synchronisation vs events; cuda vs cpu forward counts in fp32)."""

from __future__ import annotations

from pathlib import Path

from device_check_base import Check, Figure, float32_matmuls

EVAL_REQUESTS = 6


def evaluate(check: Check, loaded, output_dir: Path, device: str, *settings: str) -> list[dict]:
    """A streaming evaluation of the tiny model on MT-Bench (`benchmark=chat`), its records."""
    from eval.config import EvalConfig
    from eval.runner import run_evaluation
    from headstart.config import load_config
    from headstart.files import read_jsonl

    config = load_config(EvalConfig, [f"model={check.model_dir}", "benchmark=chat", "data_path=data/mt_bench",
                                      f"limit={EVAL_REQUESTS}", "decode.max_new_tokens=64", f"device={device}",
                                      f"output_dir={output_dir}", *settings])
    run_evaluation(config, loaded=loaded)
    return read_jsonl(output_dir / "results.jsonl")


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def stage_timing(check: Check) -> list[Figure]:
    """The same requests timed with sync, events, then sync again: the repeat gives the run-to-run
    noise that a difference between the two modes must exceed to mean anything."""
    from headstart.models import load_model

    directory = check.stage_dir("timing")
    loaded = load_model(str(check.model_dir), device=check.device)  # the evaluator's default dtype
    runs = {name: evaluate(check, loaded, directory / name, check.device, f"decode.timing={mode}")
            for name, mode in (("sync", "sync"), ("events", "events"), ("sync-again", "sync"))}
    forwards = {name: [r["residual_forwards"] for r in found] for name, found in runs.items()}
    clock = "host perf_counter in both modes (no CUDA)" if check.cpu else "synchronize + host clock vs CUDA events"
    medians = " / ".join(f"{median([r['residual_seconds'] for r in found]) * 1e3:.2f}" for found in runs.values())
    return [
        Figure("clock", clock),
        Figure("residual seconds, median: sync / events / sync again", f"{medians} ms"),
        Figure("per-request difference, median: events vs sync", f"{relative_gap(runs['sync'], runs['events']):.1%}",
               f"sync again vs sync (noise): {relative_gap(runs['sync'], runs['sync-again']):.1%}"),
        Figure("residual forwards equal in every run", f"{len(runs['sync'])} requests", "equal",
               forwards["sync"] == forwards["events"] == forwards["sync-again"]),
    ]


def relative_gap(first: list[dict], second: list[dict]) -> float:
    """Median over requests of |second - first| / first, in residual seconds."""
    return median([abs(b["residual_seconds"] - a["residual_seconds"]) / max(a["residual_seconds"], 1e-9)
                   for a, b in zip(first, second)])


COUNTS = ("baseline_forwards", "residual_forwards", "drafting_forwards", "base_tokens", "stream_tokens", "identical")


def stage_stream(check: Check) -> list[Figure]:
    import torch

    from headstart.models import load_model

    directory = check.stage_dir("stream")
    devices = ["cpu"] if check.cpu else ["cuda", "cpu"]
    records = {}
    with float32_matmuls():
        for device in devices:
            loaded = load_model(str(check.model_dir), device=device, dtype=torch.float32)
            records[device] = evaluate(check, loaded, directory / device, device, "dtype=float32")
    figures = []
    for device, found in records.items():
        figures.append(Figure(f"{device}: residual / baseline forwards (median)",
                              f"{median([r['residual_forwards'] for r in found]):g} / "
                              f"{median([r['baseline_forwards'] for r in found]):g}"))
        figures.append(Figure(f"{device}: streamed answer identical to baseline",
                              f"{sum(r['identical'] for r in found)}/{len(found)}", "all (greedy is lossless)",
                              all(r["identical"] for r in found)))
    if len(records) == 2:
        equal = equal_counts(records["cuda"], records["cpu"])
        figures.append(Figure("cuda vs cpu: requests with equal forward counts", f"{equal}/{len(records['cpu'])}",
                              "all (fp32, TF32 off)", equal == len(records["cpu"]) == len(records["cuda"])))
    else:
        figures.append(Figure("cuda vs cpu", "not run (--cpu): the GPU run compares them"))
    return figures


def equal_counts(first: list[dict], second: list[dict]) -> int:
    """Requests (matched by id) whose forward and token counts are the same in both runs."""
    by_id = {r["request_id"]: tuple(r[k] for k in COUNTS) for r in second}
    return sum(by_id.get(r["request_id"]) == tuple(r[k] for k in COUNTS) for r in first)
