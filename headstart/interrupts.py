"""One Ctrl-C stops a command.

Python raises KeyboardInterrupt wherever the main thread happens to be when SIGINT arrives. Inside
an at-fork handler (logging registers one; every sandboxed program and every worker is forked) the
exception is printed as "Exception ignored in ..." and dropped, and the run goes on: the user has
to press again. `one_press` raises it again, every `REPEAT_SECONDS`, until the entry point says it
has been handled, so one press always ends the command; the first raise is left that long to
unwind (finally blocks that stop workers) before another can land in it.
"""

from __future__ import annotations

import _thread
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

REPEAT_SECONDS = 5.0


@contextmanager
def one_press(repeat_seconds: float | None = None) -> Iterator[Callable[[], None]]:
    """Within the block, a Ctrl-C raises KeyboardInterrupt in the main thread until the callable
    yielded (call it once the interrupt is handled) is called. Outside the main thread, where no
    signal handler can be set, the block runs with Python's own handling.

    Args:
        repeat_seconds (float | None): how long a raised interrupt has to reach its handler before it is
            raised again; None: `REPEAT_SECONDS`.
    """
    repeat_seconds = REPEAT_SECONDS if repeat_seconds is None else repeat_seconds
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    handled, pressed = threading.Event(), threading.Event()

    def raise_again() -> None:
        while not handled.wait(repeat_seconds):
            _thread.interrupt_main(signal.SIGINT)  # runs `on_sigint` in the main thread

    def on_sigint(signum, frame) -> None:
        if handled.is_set():
            return
        if not pressed.is_set():
            pressed.set()
            threading.Thread(target=raise_again, name="one-press-interrupt", daemon=True).start()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield handled.set
    finally:
        handled.set()
        signal.signal(signal.SIGINT, previous)
