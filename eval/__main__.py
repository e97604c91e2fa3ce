"""`python -m eval recipe=NAME key=value ...`: streaming evaluation from a recipe
(a suite when the recipe lists `benchmarks` or `acceptances`)."""

from __future__ import annotations

import sys

from eval.config import EvalConfig
from eval.runner import run_evaluation
from eval.suite import run_suite
from headstart.config import RecipeError, load_config


def main(argv: list[str] | None = None) -> int:
    try:
        config = load_config(EvalConfig, sys.argv[1:] if argv is None else argv)
        if config.benchmarks or config.acceptances:
            run_suite(config)
        else:
            run_evaluation(config)
    except (RecipeError, ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
