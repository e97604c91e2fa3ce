"""`python -m eval.live model=smollm2`: answer while typing, live, in a web page, on the server a
user deploys (eval.serve: vLLM, typing sessions, drafts verified as speculative proposals; the
page's routes: eval/serving/page.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from eval.serve import ServeConfig, serve
from headstart.config import run_cli


@dataclass
class LiveConfig(ServeConfig):
    """Serve the answer-while-typing page (and the OpenAI API beside it) for one model."""

    port: int = field(default=8765, metadata={"help": "Port to listen on."})


def main(argv: list[str] | None = None) -> int:
    """The command line's entry point; returns the exit code.

    Args:
        argv (list[str] | None): `model=NAME` and `key=value` overrides; None: `sys.argv[1:]`.
    """
    return run_cli(LiveConfig, serve, argv)


if __name__ == "__main__":
    sys.exit(main())
