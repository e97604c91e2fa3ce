"""Build prefix-to-answer and draft-refinement datasets from source corpora.

`python -m data_builders recipe=NAME key=value ...`; see `headstart/recipes/data/`.
"""

from data_builders.config import BuildConfig

__all__ = ["BuildConfig", "build"]


def build(config: BuildConfig, command: str = "python -m data_builders"):
    """Run a build (imported lazily: the pipeline pulls in datasets and torch).

    Args:
        config (BuildConfig): the build's settings.
        command (str): the command line that ran the build, for the dataset card.
    """
    from data_builders.build import build as _build

    return _build(config, command)
