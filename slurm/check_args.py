"""Parse and validate a pipeline's stage arguments as each entry point will, running nothing.

    python slurm/check_args.py data "recipe=embedded_prefix ..." train "recipe=smollm2_prefix ..." \
        eval "recipe=before_after_smollm2 ..."

slurm/pipeline.sh calls it before it submits anything: a typo in the last stage's
overrides must not surface hours later, after the data and training jobs have run. Each
stage's recipe is loaded against its schema with the same strict rules and value checks
its entry point applies (headstart.config.load_config, the schemas' own validation).
Files are not checked: the data and the adapter do not exist until the earlier jobs ran,
and whether CUDA works is the compute node's. Prints one `error: <stage>: ...` line and
exits 2 at the first bad stage; exits 0 when all pass.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from headstart.config import cli_main, load_config


def check_data(argv: list[str]) -> None:
    """slurm/data.sbatch's arguments, as `python -m data_builders` reads them.

    Args:
        argv (list[str]): `recipe=NAME` and `key=value` overrides.
    """
    from data_builders.build import validate
    from data_builders.config import BuildConfig

    validate(load_config(BuildConfig, argv), machine=False)  # the compute node's vLLM is its own


def check_train(argv: list[str]) -> None:
    """slurm/train.sbatch's arguments, as train/sft.py reads them.

    Args:
        argv (list[str]): `recipe=NAME` (default smollm2_prefix) and `key=value` overrides.
    """
    from train.config import TrainRecipe
    from train.recipe import validate

    if not any(arg.startswith("recipe=") for arg in argv):
        argv = ["recipe=smollm2_prefix", *argv]  # train/sft.py's default recipe
    validate(load_config(TrainRecipe, argv))


def check_eval(argv: list[str]) -> None:
    """slurm/eval.sbatch's arguments: `eval ...` (python -m eval), else eval.before_after.

    Args:
        argv (list[str]): the script's arguments, optionally led by the module's name.
    """
    module = argv[0] if argv and argv[0] in ("eval", "eval.before_after") else "eval.before_after"
    argv = argv[1:] if argv and argv[0] == module else argv
    if any(arg.startswith("shard=") for arg in argv):
        raise ValueError("shard= is set by slurm/eval.sbatch for an array task (--eval-shards N); leave it out")
    if module == "eval":
        from eval.evaluation.config import EvalConfig

        load_config(EvalConfig, argv)
    else:
        from eval.before_after import BeforeAfterConfig

        load_config(BeforeAfterConfig, argv)


STAGES: dict[str, Callable[[list[str]], None]] = {"data": check_data, "train": check_train, "eval": check_eval}


def check_stages(argv: list[str]) -> None:
    """`argv`: pairs of a stage name and its arguments as one string (word-split as the script does).

    Args:
        argv (list[str]): stage names and argument strings, alternating.
    """
    if len(argv) % 2:
        raise ValueError(f"usage: {sys.argv[0]} STAGE ARGS [STAGE ARGS ...] with STAGE one of {', '.join(STAGES)}")
    for stage, words in zip(argv[::2], argv[1::2]):
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        try:
            STAGES[stage](words.split())  # word-split as pipeline.sh splits them
        except ValueError as error:
            raise ValueError(f"--{stage} {words!r}: {error}") from error


if __name__ == "__main__":
    sys.exit(cli_main(lambda: check_stages(sys.argv[1:])))
