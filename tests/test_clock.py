"""The one clock of every timed phase (eval/engines/clock.py): synchronised or CUDA
events on a CUDA device, the host's perf_counter elsewhere; no engine reads a clock itself."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest
import torch

from eval.engines.ar import AREngine
from eval.engines.clock import Stopwatch, timing_method
from eval.engines.decode import TIMING_MODES, DecodeSpec
from headstart.models import load_model

ENGINES_DIR = Path(__file__).resolve().parents[1] / "eval" / "engines"
CLOCK_READS = {"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time"}


@pytest.mark.parametrize("mode", TIMING_MODES)
def test_sync_and_events_are_chosen_for_cuda_devices_only(mode):
    assert timing_method(torch.device("cuda"), mode) == mode
    assert timing_method(torch.device("cuda:1"), mode) == mode
    assert timing_method("cuda:0", mode) == mode
    for device in ("cpu", "mps", "meta"):
        assert timing_method(torch.device(device), mode) == "host"
    if not torch.cuda.is_available():
        assert not torch.cuda.is_initialized(), "deciding must not touch CUDA"


def test_an_unknown_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="timing must be one of sync, events, not 'wall'"):
        timing_method(torch.device("cpu"), "wall")
    with pytest.raises(ValueError, match="decode.timing must be one of sync, events"):
        DecodeSpec(timing="wall")


@pytest.mark.parametrize("mode", TIMING_MODES)
def test_on_cpu_the_stopwatch_is_the_host_clock(mode):
    outer_start = time.perf_counter()
    watch = Stopwatch(torch.device("cpu"), mode)
    time.sleep(0.05)
    seconds = watch.seconds()
    outer = time.perf_counter() - outer_start
    assert watch.method == "host"
    assert isinstance(seconds, float) and 0.05 <= seconds <= outer


def _clock_reads(path: Path) -> list[str]:
    """`time.X()` calls and `from time import X` of a clock-reading X in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in CLOCK_READS and getattr(node.value, "id", None) == "time":
            found.append(f"{path.name}:{node.lineno}: time.{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == "time":
            found += [f"{path.name}:{node.lineno}: from time import {a.name}" for a in node.names if a.name in CLOCK_READS]
    return found


def test_no_engine_module_reads_a_clock_but_the_clock():
    modules = sorted(ENGINES_DIR.glob("*.py"))
    assert len(modules) > 5
    reads = [read for path in modules if path.name != "clock.py" for read in _clock_reads(path)]
    assert reads == [], "time a phase with eval.engines.clock.Stopwatch (engine.stopwatch())"
    assert _clock_reads(ENGINES_DIR / "clock.py"), "the scan finds the clock's own reads"


@pytest.mark.parametrize("mode", TIMING_MODES)
def test_an_update_is_timed_by_the_decode_settings_clock(tiny_qwen3_dir, mode):
    loaded = load_model(str(tiny_qwen3_dir), device="cpu")
    engine = AREngine(loaded.model, loaded.eos_token_ids, DecodeSpec(engine="stepwise", max_new_tokens=8, timing=mode))
    assert engine.stopwatch().method == "host"
    result = engine.baseline(loaded.tokenizer("Write a function that sums a list.").input_ids)
    assert isinstance(result.seconds, float) and result.seconds > 0 and result.forwards == len(result.answer)
