"""`python -m data_builders recipe=NAME key=value ...`"""

import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from data_builders.config import BuildConfig  # noqa: E402
from data_builders.report import NOTHING_KEPT  # noqa: E402
from headstart.config import HelpShown, exit_on_help, report_interrupt  # noqa: E402

try:  # `--help` before the builder's imports (torch, transformers, vLLM's client)
    exit_on_help(BuildConfig, sys.argv[1:])
except HelpShown:
    sys.exit(0)

try:  # the imports take seconds: a Ctrl-C during them ends as one during the build does
    from data_builders.build import main
except KeyboardInterrupt:
    sys.exit(report_interrupt(NOTHING_KEPT))

sys.exit(main())
