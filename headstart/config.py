"""Recipes: YAML files in `recipes/` validated against a config dataclass.

Every entry point takes `recipe=NAME key=value nested.key=value ...`. The recipe
is found by name anywhere under `recipes/` (or given as a path), merged onto the
dataclass's defaults, then the command-line overrides are merged on top. Keys the
dataclass does not declare are errors that list the valid keys, so a typo never
silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"

T = TypeVar("T")


class RecipeError(ValueError):
    """A recipe or override that cannot be applied; the message says which and why."""


def find_recipe(name: str, recipes_dir: Path = RECIPES_DIR) -> Path:
    """`recipes/**/NAME.yaml`, or NAME itself when it is a YAML path."""
    path = Path(name).expanduser()
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise RecipeError(f"recipe file not found: {name}")
        return path
    matches = sorted(recipes_dir.rglob(f"{name}.yaml"))
    if not matches:
        known = sorted(p.stem for p in recipes_dir.rglob("*.yaml"))
        raise RecipeError(f"unknown recipe {name!r}; recipes under {recipes_dir}: {', '.join(known)}")
    if len(matches) > 1:
        raise RecipeError(f"recipe name {name!r} is ambiguous: {', '.join(map(str, matches))}")
    return matches[0]


def load_config(schema: type[T], argv: list[str], recipes_dir: Path = RECIPES_DIR) -> T:
    """Build a `schema` instance from `recipe=NAME` and `key=value` arguments."""
    recipe_args = [a for a in argv if a.startswith("recipe=")]
    overrides = [a for a in argv if not a.startswith("recipe=")]
    for arg in overrides:
        if "=" not in arg:
            raise RecipeError(f"argument {arg!r} is not of the form key=value")
    config = OmegaConf.structured(schema)
    if recipe_args:
        path = find_recipe(recipe_args[-1].split("=", 1)[1], recipes_dir)
        try:
            recipe = OmegaConf.load(path)
        except yaml.YAMLError as error:
            raise RecipeError(f"{path}: not valid YAML: {yaml_problem(error)}") from error
        except (OSError, OmegaConfBaseException, ValueError) as error:
            raise RecipeError(f"cannot read recipe {path}: {error}") from error
        config = _merge(config, recipe, f"recipe {path}")
    config = _merge(config, OmegaConf.from_dotlist(overrides), "command line")
    return OmegaConf.to_object(config)


# What an entry point reports as `error: ...` with exit code 2: bad recipes and values
# (RecipeError is a ValueError), bad or missing input files, and a path given that cannot
# be one (an output directory that is a file or sits under one, a directory where a file
# is due, no permission). Anything else is a bug or an accident of the machine, and keeps
# its traceback.
PATH_ERRORS = (FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError, IsADirectoryError)
CLI_ERRORS = (RecipeError, ValueError, *PATH_ERRORS)


def cli_main(body: Callable[[], Any]) -> int:
    """Run an entry point's body: `CLI_ERRORS` end with their message on stderr and exit
    code 2 instead of a traceback; returns the exit code."""
    try:
        body()
    except CLI_ERRORS as error:
        print(f"error: {error_line(error)}", file=sys.stderr)
        return 2
    return 0


def error_line(error: BaseException) -> str:
    """One line for the user: an OSError as `<file>: <problem>` (its own text may name no
    file, or two), anything else its message with its lines joined."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return " ".join(str(error).split("\n")).strip() or type(error).__name__


def yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error in one line: the problem and where (PyYAML's own text spans 4 lines)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}" + (f" ({context})" if context else "")


def run_cli(schema: type[T], run: Callable[[T], Any], argv: list[str] | None = None) -> int:
    """The body of every `recipe=NAME key=value` entry point: bad recipes, values and
    missing files end with their message and exit code 2 instead of a traceback."""
    return cli_main(lambda: run(load_config(schema, sys.argv[1:] if argv is None else argv)))


def config_from_dict(schema: type[T], values: dict[str, Any]) -> T:
    """Validate a plain mapping against `schema` with the same strict rules."""
    return OmegaConf.to_object(_merge(OmegaConf.structured(schema), OmegaConf.create(values), "mapping"))


def dump_config(config: Any, path: Path) -> None:
    """Write the resolved config as YAML, for the output directory and trackers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(OmegaConf.structured(config)))


def config_to_dict(config: Any) -> dict[str, Any]:
    """A plain nested dict of a config dataclass (for W&B and JSON reports)."""
    return OmegaConf.to_container(OmegaConf.structured(config), resolve=True)


def field_help(schema: type) -> dict[str, str]:
    """The one-line doc of each field (`metadata={"help": ...}`), for error messages."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(schema)}


def _merge(config: DictConfig, update: DictConfig, origin: str) -> DictConfig:
    try:
        return OmegaConf.merge(config, update)
    except ConfigKeyError as error:
        raise RecipeError(_unknown_key_message(config, error, origin)) from error
    except OmegaConfBaseException as error:
        raise RecipeError(f"invalid value in {origin}: {error}") from error


def _unknown_key_message(config: DictConfig, error: ConfigKeyError, origin: str) -> str:
    key = getattr(error, "key", None)
    parent = getattr(error, "full_key", "") or ""
    node = config
    parent_path = parent.rsplit(".", 1)[0] if "." in parent else ""
    if parent_path:
        node = OmegaConf.select(config, parent_path) or config
    valid = ", ".join(sorted(str(k) for k in node.keys())) if isinstance(node, DictConfig) else "?"
    where = f"{parent_path}." if parent_path else ""
    moved = [f"{name}.{key}" for name, child in node.items() if isinstance(child, DictConfig) and key in child] \
        if isinstance(node, DictConfig) else []
    hint = f" (did you mean {' or '.join(moved)}?)" if moved else ""
    return f"unknown key {where}{key!s} in {origin}{hint}; valid keys: {valid}"
