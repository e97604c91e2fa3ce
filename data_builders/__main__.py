"""`python -m data_builders recipe=NAME key=value ...`"""

import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from data_builders.build import main  # noqa: E402

sys.exit(main())
