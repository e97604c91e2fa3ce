"""Slow-downs the tests install in a training subprocess from outside the package.

Python imports this module at start-up when tests/support is on PYTHONPATH
(tests/test_train_support.py `slow_training_env` puts it there); train/ knows nothing of it.
- HEADSTART_TEST_STEP_DELAY_S: every transformers Trainer sleeps that long after each
  optimizer step, which leaves a test time to kill a run between two checkpoints, as a
  preempted cluster job would be; it prints "HEADSTART_TEST_STEP_DELAY_S: step N done" first.
- HEADSTART_TEST_MERGE_DELAY_S: `train.merge.merge_adapter` sleeps that long first (a merge
  that outlasts a collective timeout).
- HEADSTART_TEST_EXIT_BARRIER_S: torchrun's exit barrier lasts that long instead of 300 s.
  torchrun (and `accelerate launch`, which calls it in-process) builds its LocalElasticAgent
  with a fixed exit_barrier_timeout that no flag or environment variable sets; the Slurm test
  of `srun --wait=0` needs a merge longer than that barrier, and a short one shows the same
  kill in seconds rather than minutes.
Each module is patched right after it is first imported, so a process that never imports
it pays nothing.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType

STEP_DELAY_ENV = "HEADSTART_TEST_STEP_DELAY_S"
MERGE_DELAY_ENV = "HEADSTART_TEST_MERGE_DELAY_S"
EXIT_BARRIER_ENV = "HEADSTART_TEST_EXIT_BARRIER_S"
ELASTIC_AGENT = "torch.distributed.elastic.agent.server.local_elastic_agent"


class PatchAfterImport(importlib.abc.MetaPathFinder):
    """Find the modules named in `patches` as the path finder would, and patch each once executed."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self.patches = patches

    def find_spec(self, name, path=None, target=None):
        if name not in self.patches:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        patch, execute = self.patches[name], spec.loader.exec_module

        def execute_then_patch(module: ModuleType) -> None:
            execute(module)
            patch(module)

        spec.loader.exec_module = execute_then_patch
        return spec


def delay_steps(seconds: float) -> Callable[[ModuleType], None]:
    def patch(trainer_module: ModuleType) -> None:
        from transformers import TrainerCallback

        class StepDelay(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                # A line a test can wait for (the progress bar reaches a Slurm log only at its next newline).
                print(f"{STEP_DELAY_ENV}: step {state.global_step} done", flush=True)
                time.sleep(seconds)
                return control

        init = trainer_module.Trainer.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            if not any(isinstance(c, StepDelay) for c in self.callback_handler.callbacks):
                self.add_callback(StepDelay())

        trainer_module.Trainer.__init__ = __init__

    return patch


def delay_merge(seconds: float) -> Callable[[ModuleType], None]:
    def patch(merge_module: ModuleType) -> None:
        merge = merge_module.merge_adapter

        @functools.wraps(merge)
        def merge_adapter(*args, **kwargs):
            time.sleep(seconds)
            return merge(*args, **kwargs)

        merge_module.merge_adapter = merge_adapter

    return patch


def shorten_exit_barrier(seconds: float) -> Callable[[ModuleType], None]:
    def patch(agent_module: ModuleType) -> None:
        init = agent_module.LocalElasticAgent.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("exit_barrier_timeout", seconds)
            init(self, *args, **kwargs)

        agent_module.LocalElasticAgent.__init__ = __init__

    return patch


def install() -> None:
    patches = {}
    if float(os.environ.get(STEP_DELAY_ENV) or 0) > 0:
        patches["transformers.trainer"] = delay_steps(float(os.environ[STEP_DELAY_ENV]))
    if float(os.environ.get(MERGE_DELAY_ENV) or 0) > 0:
        patches["train.merge"] = delay_merge(float(os.environ[MERGE_DELAY_ENV]))
    if float(os.environ.get(EXIT_BARRIER_ENV) or 0) > 0:
        patches[ELASTIC_AGENT] = shorten_exit_barrier(float(os.environ[EXIT_BARRIER_ENV]))
    if patches:
        sys.meta_path.insert(0, PatchAfterImport(patches))


install()
