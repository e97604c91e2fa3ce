"""The device check's widths stage: what a forward costs by the tokens it feeds, on a random
Qwen3-8B (qwen3_prefix's model, its vendored config) in bf16. On a CPU a forward of 129 tokens
costs several one-token steps, which is why token trees and realignment buy forwards but no wall
clock there (the results document's realignment candidates); on a GPU at batch 1 a step is bound by
reading the weights, so a wide forward should cost about one. The table is written where
`decode.width_cost` reads it, so `benchmarks/lookup_bound.py --width-cost` can price the
recorded policies with it afterwards."""

from __future__ import annotations

from device_check.base import Check, CheckError, Figure
from device_check.memory_stage import paper_model_config, random_model

SHOWN_WIDTHS = (2, 9, 33, 129, 257)


def stage_widths(check: Check) -> list[Figure]:
    """The cost of a forward by its width, written where `decode.width_cost` reads it.

    Args:
        check (Check): the check's run: directory, device, environment.
    """
    from eval.engines.decode import DecodeSpec
    from eval.engines.width_measure import measure

    recipe, config = paper_model_config(check)
    model = random_model(config, check.device).eval()
    if model.device.type != check.device:  # a transformers that builds elsewhere first: never time an 8B model on the host
        raise CheckError(f"the model was built on {model.device}, not {check.device}")
    table = measure(model, recipe.model.name_or_path)
    path = check.stage_dir("widths") / "width_cost.json"
    table.save(path)
    readable = DecodeSpec(width_cost=str(path)).width_table == table
    label = f"{recipe.model.name_or_path}: {config.num_hidden_layers} layers x {config.hidden_size}, random weights"
    return [
        Figure("shape", label + (" (reduced on CPU, fp32: not comparable)" if check.cpu else " (bf16, sdpa)")),
        Figure("one-token forward after 256 cached tokens (ms)", f"{table.seconds[0] * 1e3:.2f}"),
        Figure("a forward of w tokens, in one-token steps",
               ", ".join(f"{width}: {table.relative(width):.2f}" for width in SHOWN_WIDTHS)),
        Figure("table read back by decode.width_cost", str(path), "the measured table", readable),
    ]
