"""The device check's evaluation stages: the streaming evaluator in this process (residual
wall clock with CUDA synchronisation vs events; cuda vs cpu forward counts in fp32; identity to
the batch-1 baseline measured in bf16 under plain, lookup and token-tree regeneration)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from device_check.base import Check, Figure, float32_matmuls

EVAL_REQUESTS = 6


def evaluate(check: Check, loaded, output_dir: Path, device: str, *settings: str) -> list[dict]:
    """A streaming evaluation of the tiny model on MT-Bench (`benchmark=chat`), its records.

    Args:
        check (Check): the check's run: directory, device, environment.
        loaded (LoadedModel): the tiny model, loaded once for every run of the stage.
        output_dir (Path): the evaluation's output directory.
        device (str): the device the evaluation runs on.
        settings (str): more `key=value` settings of the evaluation.
    """
    from eval.evaluation.config import EvalConfig
    from eval.evaluation.runner import run_evaluation
    from headstart.config import load_config
    from headstart.files import read_jsonl

    config = load_config(EvalConfig, [f"model={check.model_dir}", "benchmark=chat", "data_path=data/mt_bench",
                                      f"limit={EVAL_REQUESTS}", "decode.max_new_tokens=64", f"device={device}",
                                      f"output_dir={output_dir}", *settings])
    run_evaluation(config, loaded=loaded)
    return read_jsonl(output_dir / "results.jsonl")


def median(values: list[float]) -> float:
    """The median of `values` (the mean of the middle two when their count is even).

    Args:
        values (list[float]): the numbers, at least one.
    """
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def stage_timing(check: Check) -> list[Figure]:
    """The same requests timed with sync, events, then sync again: the repeat gives the run-to-run
    noise that a difference between the two modes must exceed to mean anything.

    Args:
        check (Check): the check's run: directory, device, environment.
    """
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
    """Median over requests of |second - first| / first, in residual seconds.

    Args:
        first (list[dict]): one run's records.
        second (list[dict]): another run's records, of the same requests in the same order.
    """
    return median([abs(b["residual_seconds"] - a["residual_seconds"]) / max(a["residual_seconds"], 1e-9)
                   for a, b in zip(first, second)])


COUNTS = ("baseline_forwards", "residual_forwards", "drafting_forwards", "base_tokens", "stream_tokens", "identical")


def stage_stream(check: Check) -> list[Figure]:
    """The same requests in fp32 on each device: answers identical to the baseline, and equal forward counts across devices.

    Args:
        check (Check): the check's run: directory, device, environment.
    """
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
    """Requests (matched by id) whose forward and token counts are the same in both runs.

    Args:
        first (list[dict]): one run's records.
        second (list[dict]): another run's records.
    """
    by_id = {r["request_id"]: tuple(r[k] for k in COUNTS) for r in second}
    return sum(by_id.get(r["request_id"]) == tuple(r[k] for k in COUNTS) for r in first)


# The regeneration policies the identity stage runs, each on the fast path (drafts in padded batches).
IDENTITY_POLICIES: dict[str, tuple[str, ...]] = {
    "plain": ("decode.regenerate=plain",),
    "lookup": ("decode.regenerate=lookup",),
    "tree": ("decode.regenerate=lookup", "decode.lookup_match=longest", "decode.lookup_tree=8"),
}
# Greedy streaming is lossless in exact arithmetic; in bf16 a batched or wider forward may round a near-tie
# the other way, so the share is what bf16 gives here, not an expectation.
MEASURED_IN_BF16 = "fp32 is lossless; bf16 measured"


@dataclass
class PolicyRun:
    """One policy's evaluation: its records, its summary.json, and the widths (nodes) of its token-tree forwards."""

    records: list[dict]
    summary: dict
    tree_widths: list[int]


def stage_identity(check: Check) -> list[Figure]:
    """The streamed answer and the drafter's D_n against the batch-1 baseline, in bf16 (on --cpu too: how
    bf16 rounds on a CPU is a measurement too), for plain, lookup and token-tree regeneration on one loaded model.

    Args:
        check (Check): the check's run: directory, device, environment.
    """
    import torch

    from headstart.models import load_model

    directory = check.stage_dir("identity")
    loaded = load_model(str(check.model_dir), device=check.device, dtype=torch.bfloat16)
    runs = {}
    for policy, settings in IDENTITY_POLICIES.items():
        with counting_tree_forwards(loaded.model) as widths:
            # timed_every=1: every request timed, so every one is compared with its batch-1 baseline
            records = evaluate(check, loaded, directory / policy, check.device, "dtype=bfloat16", "timed_every=1", *settings)
        summary = json.loads((directory / policy / "summary.json").read_text())
        runs[policy] = PolicyRun(records, summary, widths)
    attention = loaded.model.config._attn_implementation
    figures = [figure for policy, run in runs.items() for figure in identity_figures(policy, run)]
    return figures + [compared_figure(runs), fast_path_figure(runs), tree_figure(runs, attention),
                      Figure("residual forwards, median: " + " / ".join(runs),
                             " / ".join(f"{median([r['residual_forwards'] for r in run.records]):g}" for run in runs.values()))]


@contextmanager
def counting_tree_forwards(model) -> Iterator[list[int]]:
    """The widths (tree nodes) of `model`'s forwards that carry a 4D attention mask (one tensor, or one per
    layer type): only a token-tree step passes one; batched drafting passes 2D padding masks, a chain none.

    Args:
        model (torch.nn.Module): the model whose forwards are watched.
    """
    widths: list[int] = []

    def note(_module, _args, kwargs) -> None:
        mask = kwargs.get("attention_mask")
        if isinstance(mask, dict) or getattr(mask, "ndim", 0) == 4:
            widths.append(kwargs["input_ids"].shape[1] - 1)  # the root (the answer's last token) is no node

    handle = model.register_forward_pre_hook(note, with_kwargs=True)
    try:
        yield widths
    finally:
        handle.remove()


def identity_figures(policy: str, run: PolicyRun) -> list[Figure]:
    """A policy's figures: streamed answers and drafter D_n against the batch-1 baseline.

    Args:
        policy (str): the policy's name.
        run (PolicyRun): its evaluation.
    """
    return [
        Figure(f"{policy}: streamed answer identical to batch-1 baseline",
               measured_share(run.summary, "identical_measured", "identical_to_baseline"), MEASURED_IN_BF16),
        Figure(f"{policy}: drafter D_n (batched) agrees with batch-1 baseline",
               measured_share(run.summary, "drafter_compared", "drafter_agreement"), MEASURED_IN_BF16),
    ]


def measured_share(summary: dict, count_key: str, share_key: str) -> str:
    """"k/n compared" from a summary's count and share; says so when the evaluator did not report them.

    Args:
        summary (dict): an evaluation's summary.json.
        count_key (str): the key of the count compared.
        share_key (str): the key of the share that agreed.
    """
    count = summary.get(count_key)
    if count is None:
        return f"not reported (summary.json has no {count_key}: an evaluator before issue 47)"
    if count == 0:
        return "0 compared"
    return f"{round(summary[share_key] * count)}/{count} compared"


def compared_figure(runs: dict[str, PolicyRun]) -> Figure:
    """Every request is timed here (timed_every=1), so each must have been compared token for token.

    Args:
        runs (dict[str, PolicyRun]): each policy's evaluation, by name.
    """
    counts = [run.summary.get("identical_measured") for run in runs.values()]
    records = [len(run.records) for run in runs.values()]
    value = " / ".join("not reported" if count is None else f"{count} of {total}" for count, total in zip(counts, records))
    return Figure("requests compared token for token: " + " / ".join(runs), value, "every record (all timed)",
                  counts == records)


def fast_path_figure(runs: dict[str, PolicyRun]) -> Figure:
    """The drafter agreement means batched drafting only if the fast path computed the records.

    Args:
        runs (dict[str, PolicyRun]): each policy's evaluation, by name.
    """
    fast = [sum(r["engine"] == "fast" for r in run.records) for run in runs.values()]
    total = sum(len(run.records) for run in runs.values())
    return Figure("records from the fast path (drafts in padded batches)", f"{sum(fast)}/{total}", "all",
                  sum(fast) == total)


def tree_figure(runs: dict[str, PolicyRun], attention: str | None) -> Figure:
    """decode.lookup_tree=8 may propose single chains only; the tree policy is checked only if tree forwards ran.

    Args:
        runs (dict[str, PolicyRun]): each policy's evaluation, by name.
        attention (str | None): the attention implementation the model ran with, for the figure.
    """
    counts = " / ".join(str(len(run.tree_widths)) for run in runs.values())
    widest = max(runs["tree"].tree_widths, default=0)
    ran = bool(runs["tree"].tree_widths) and not any(run.tree_widths for name, run in runs.items() if name != "tree")
    return Figure("token-tree forwards (4D mask): " + " / ".join(runs),
                  f"{counts} (widest {widest} nodes; attention {attention})", "above 0 on tree only", ran)
