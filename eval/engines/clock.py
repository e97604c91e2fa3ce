"""The wall clock of a timed phase (PROTOCOL.md, "Costs": wall clock at batch size 1).

CUDA runs asynchronously: a forward returns once its kernels are queued. A host
clock read right after untimed work (priming the cache, the phase before) would
start while that work still runs on the GPU and charge it to the timed phase, and
one read at the end could stop before the phase's own kernels finish. So on a CUDA
device a phase is timed by one of two modes (`DecodeSpec.timing`):

- `sync`: wait for the device (`torch.cuda.synchronize`) before each host clock
  read, at the start and at the end;
- `events`: CUDA events recorded on the current stream at the start and at the
  end; the elapsed time between them, read once the end event has completed.

Off CUDA both are the host's `perf_counter`: CPU work is done when a call returns.
Every timed phase of the engines goes through `Stopwatch`.
"""

from __future__ import annotations

import time

import torch

from eval.engines.decode import TIMING_MODES


def timing_method(device: torch.device, mode: str) -> str:
    """How a phase on `device` is timed under `mode`: `mode` itself on a CUDA
    device, 'host' (plain perf_counter) on any other. Decides without calling CUDA.

    Args:
        device (torch.device): the device the phase runs on.
        mode (str): the configured timing mode.
    """
    if mode not in TIMING_MODES:
        raise ValueError(f"timing must be one of {', '.join(TIMING_MODES)}, not {mode!r}")
    return mode if torch.device(device).type == "cuda" else "host"


class Stopwatch:
    """One timed phase on `device`: started when made, `seconds()` at its end."""

    def __init__(self, device: torch.device | str, mode: str = "sync") -> None:
        self.device = torch.device(device)
        self.method = timing_method(self.device, mode)
        if self.method == "events":
            # Untimed work still queued (a priming forward) would otherwise hide this phase's
            # launch overhead behind it: start on an idle stream, end by an event.
            torch.cuda.current_stream(self.device).synchronize()
            self._start_event = torch.cuda.Event(enable_timing=True)
            self._start_event.record(torch.cuda.current_stream(self.device))
        else:
            self._wait_for_device()
            self._start = time.perf_counter()

    def seconds(self) -> float:
        """Seconds from the start to now, counting every kernel queued in between."""
        if self.method == "events":
            end_event = torch.cuda.Event(enable_timing=True)
            end_event.record(torch.cuda.current_stream(self.device))
            end_event.synchronize()
            return self._start_event.elapsed_time(end_event) / 1000.0  # milliseconds
        self._wait_for_device()
        return time.perf_counter() - self._start

    def _wait_for_device(self) -> None:
        if self.method == "sync":
            torch.cuda.synchronize(self.device)
