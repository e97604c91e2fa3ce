"""What every stage of the device check shares: the run (`Check`:
its directory, device and environment), its figures and errors, the output directory it owns,
and fp32 matrix products without TF32."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The GPU machine runs a copy of the checkout where headstart is not installed.
sys.path[:0] = [str(REPO)]
KIND = "device-check"  # its headstart.run_dir mark
DEFAULT_OUTPUT = "/tmp/headstart-device-check"


class CheckError(Exception):
    """A stage that cannot run or failed; the message names what and where its log is."""


@dataclass
class Figure:
    name: str
    value: str
    compare: str = ""  # what to compare the value with (an expectation, or the other setting's value)
    ok: bool | None = None  # None: a figure to read, not a pass/fail


@dataclass
class StageResult:
    stage: str
    seconds: float
    figures: list[Figure] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(f.ok is not False for f in self.figures)


@dataclass
class Check:
    """One run of the check: where it writes, on which device, with which environment."""

    out: Path
    cpu: bool

    @property
    def device(self) -> str:
        return "cpu" if self.cpu else "cuda"

    @property
    def assets(self) -> Path:
        return self.out / "assets"

    @property
    def model_dir(self) -> Path:
        return self.assets / "tiny-qwen3"

    @property
    def data_dir(self) -> Path:
        return self.assets / "data"

    def stage_dir(self, stage: str) -> Path:
        """The stage's own directory, emptied first: a rerun replaces only its stage.

        Args:
            stage (str): the stage's name.
        """
        directory = self.out / stage
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        return directory

    def env(self) -> dict[str, str]:
        """Offline, no W&B, the repository importable; on --cpu no GPU is visible."""
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled",
                   TOKENIZERS_PARALLELISM="false")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        if self.cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def run(self, command: list[str], log: Path, timeout: int = 420) -> None:
        """A command from the repository root, its output in `log`; a failure shows the log's end.

        Args:
            command (list[str]): the command and its arguments.
            log (Path): the file its output is written to.
            timeout (int): seconds it may run before it fails the stage.
        """
        started = time.perf_counter()
        with log.open("w") as handle:
            try:
                result = subprocess.run(command, cwd=REPO, env=self.env(), stdout=handle, stderr=subprocess.STDOUT,
                                        timeout=timeout)
            except subprocess.TimeoutExpired as error:
                raise CheckError(f"{log.stem}: no result after {timeout} s (log: {log})") from error
        with log.open("a") as handle:
            handle.write(f"\n[device_check] exit {result.returncode} after {time.perf_counter() - started:.1f} s\n")
        if result.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise CheckError(f"{log.stem}: exit {result.returncode} (log: {log})\n{tail}")


def claim_output_dir(out: Path, replace: bool) -> None:
    """Create `out` and mark it as the check's (headstart.run_dir). An existing one must be empty
    or hold the check's mark; `replace` (a full run) then empties it. Any other directory is
    left untouched.

    Args:
        out (Path): the check's output directory.
        replace (bool): whether to empty a directory the check already owns.
    """
    from headstart.run_dir import OutputDirError, check_output_dir, write_mark

    try:
        verdict = check_output_dir(out, KIND, setting="OUTPUT_DIR")
    except OutputDirError as error:
        raise CheckError(str(error)) from error
    if verdict == "resumable" and replace:
        for child in out.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    write_mark(out, KIND, {"note": "scripts/device_check.sh: its next full run replaces this directory"})


@contextmanager
def float32_matmuls() -> Iterator[None]:
    """fp32 matrix products at full precision (TF32 off), restored afterwards."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
