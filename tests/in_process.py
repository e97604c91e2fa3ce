"""Entry points run as `__main__` in the test's own process (pytest's `pythonpath` has tests/ too)."""

from __future__ import annotations

import io
import runpy
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run_here(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """`python -m MODULE ARGS` or `python SCRIPT ARGS` run as `__main__` in this process, from the
    repository root with `env` added: (exit code, stdout, stderr). Torch, transformers and the
    project are imported here already, which a fresh interpreter pays 8 CPU-s for per command;
    the entry points take their arguments from sys.argv and keep no state between runs."""
    assert argv[0] == "python", argv
    module = argv[2] if argv[1] == "-m" else None
    arguments = argv[3:] if module else argv[2:]
    out, err, code = io.StringIO(), io.StringIO(), 0
    with pytest.MonkeyPatch.context() as patch, redirect_stdout(out), redirect_stderr(err):
        for key, value in (env | {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}).items():
            patch.setenv(key, value)
        patch.chdir(REPO)
        patch.setattr(sys, "argv", [module or argv[1], *arguments])
        try:
            if module:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(str(REPO / argv[1]), run_name="__main__")
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
            if isinstance(exit_.code, str):
                err.write(exit_.code)
        except Exception as error:  # a traceback, with what the command printed before it
            raise AssertionError(f"{' '.join(argv)} raised\n{out.getvalue()[-2000:]}\n{err.getvalue()[-3000:]}") from error
    return code, out.getvalue(), err.getvalue()
