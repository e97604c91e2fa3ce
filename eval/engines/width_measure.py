"""Measure this machine's width-cost table on a loaded model (eval/engines/width_table.py holds
the table itself), and resolve what `decode.width_cost` names once a model is loaded."""

from __future__ import annotations

import statistics

import torch
from transformers import PreTrainedModel

from eval.engines.base import crop_cache, decoder_config, new_cache
from eval.engines.clock import Stopwatch
from eval.engines.decode import DecodeSpec
from eval.engines.width_table import AUTO, CONTEXT, WIDTHS, WidthCost, auto_path, machine_label


def measure(model: PreTrainedModel, name: str, widths: tuple[int, ...] = WIDTHS, context: int = CONTEXT,
            repeats: int = 5) -> WidthCost:
    """Time a forward of each width after `context` cached tokens (median of `repeats`, after a
    warm-up); the tokens are fixed ids, since the cost does not depend on which tokens they are.

    Args:
        model (PreTrainedModel): the loaded model.
        name (str): the model's name, recorded in the table.
        widths (tuple[int, ...]): the forward widths to time, in tokens.
        context (int): how many tokens the cache holds before each forward.
        repeats (int): timed forwards per width.
    """
    device = model.device
    vocabulary = decoder_config(model).vocab_size
    ids = [(7 + 13 * i) % vocabulary for i in range(context + max(widths))]
    cache, cached = new_cache(model), []
    seconds = []
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids[:context]], device=device), past_key_values=cache, use_cache=True)
        cached.extend(ids[:context])
        for width in widths:
            times = []
            for repeat in range(repeats + 1):
                crop_cache(cache, cached, context)
                clock = Stopwatch(device)
                model(input_ids=torch.tensor([ids[context : context + width]], device=device), past_key_values=cache,
                      use_cache=True, logits_to_keep=width)
                cached.extend(ids[context : context + width])
                if repeat:  # the first is the warm-up
                    times.append(clock.seconds())
            seconds.append(statistics.median(times))
    return WidthCost(tuple(widths), tuple(seconds), context, name, machine_label(str(device)))


def resolve(setting: str, name: str, device: str, model: PreTrainedModel | None = None) -> WidthCost | None:
    """The table `decode.width_cost` names: none (''), a file, or (`auto`) this machine's for
    `name`, measured on `model` and kept the first time (without a model, only read).

    Args:
        setting (str): `decode.width_cost`: '', a file, or `auto`.
        name (str): the model's name.
        device (str): the device the run is on.
        model (PreTrainedModel | None): the loaded model, to measure with; None: only read.
    """
    if not setting:
        return None
    if setting != AUTO:
        return WidthCost.load(setting)
    path = auto_path(name, device)
    if path.is_file():
        return WidthCost.load(path)
    if model is None:
        raise ValueError(f"decode.width_cost=auto: no table for {name} on this machine yet ({path}); it is measured when "
                         "an evaluation loads the model (or run python -m eval.width_cost)")
    table = measure(model, name)
    table.save(path)
    return table


def use_auto_table(decode: DecodeSpec, name: str, model: PreTrainedModel) -> None:
    """Give `decode` this machine's table for `name` when its width_cost is `auto`: measured
    once per machine and model, then read; a table `decode` holds for this model and machine
    already is kept.

    Args:
        decode (DecodeSpec): the decode settings; their table is set in place.
        name (str): the model's name, as the table records it.
        model (PreTrainedModel): the loaded model (its device names the machine; it is measured when no table exists).
    """
    if decode.width_cost != AUTO:
        return
    held = decode.resolved_width_table
    if held is not None and held.model == name and held.machine == machine_label(str(model.device)):
        return  # resolved for this model and machine already (a suite's earlier run)
    decode.use_width_table(resolve(AUTO, name, str(model.device), model))
