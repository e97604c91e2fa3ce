"""Build prefix-to-answer and draft-refinement datasets from source corpora.

`python -m data_builders recipe=NAME key=value ...`; see `recipes/data/`.
"""

from data_builders.config import BuildConfig

__all__ = ["BuildConfig", "build"]


def build(config: BuildConfig, command: str = "python -m data_builders"):
    """Run a build (imported lazily: the pipeline pulls in datasets and torch)."""
    from data_builders.build import build as _build

    return _build(config, command)
