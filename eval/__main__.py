"""`python -m eval recipe=NAME key=value ...`: streaming evaluation from a recipe
(a suite when the recipe lists `benchmarks` or `acceptances`)."""

from __future__ import annotations

import sys

from eval.evaluation.config import EvalConfig
from headstart.config import run_cli


def evaluate(config: EvalConfig) -> None:
    """A suite when the recipe lists several benchmarks or rules, else one evaluation.

    Args:
        config (EvalConfig): the evaluation's settings.
    """
    from eval.evaluation.runner import run_evaluation  # here, not above: `--help` loads neither
    from eval.evaluation.suite import report_finished, run_suite

    if config.report_only:
        report_finished(config)
    elif config.benchmarks or config.acceptances:
        run_suite(config)
    else:
        run_evaluation(config)


def main(argv: list[str] | None = None) -> int:
    """The command line's entry point; returns the exit code.

    Args:
        argv (list[str] | None): `recipe=NAME` and `key=value` overrides; None: `sys.argv[1:]`.
    """
    return run_cli(EvalConfig, evaluate, argv)


if __name__ == "__main__":
    sys.exit(main())
