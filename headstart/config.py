"""Recipes: YAML files in `headstart/recipes/` validated against a config dataclass.

Every entry point takes `recipe=NAME key=value nested.key=value ...`. The recipe
is found by name anywhere under `headstart/recipes/` (or given as a path), merged onto the
dataclass's defaults, then the command-line overrides are merged on top. Keys the
dataclass does not declare are errors that list the valid keys, so a typo never
silently falls back to a default. `--help` (or `-h`) anywhere prints the schema's sections
and keys, each with its type, default and `metadata={"help": ...}` (`render_help`), and exits 0.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from headstart.interrupts import one_press
from headstart.paths import RECIPES_DIR

T = TypeVar("T")


class RecipeError(ValueError):
    """A recipe or override that cannot be applied; the message says which and why."""


def check_range(setting: str, value: float, low: float, high: float | None = None, none_means: str = "") -> None:
    """Refuse a numeric setting outside [low, high] before any work: a typo (`lookup_tree=100000`, a
    negative cache size) would otherwise be found minutes later, or never.

    Args:
        setting (str): the key as the user writes it (`decode.lookup_tree`).
        high (float | None): the largest value taken; None: no upper bound.
        none_means (str): what null means, for a setting that takes null (said in the error).
    """
    if low <= value and (high is None or value <= high):
        return
    allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
    raise ValueError(f"{setting} must be {allowed}{f' (or null: {none_means})' if none_means else ''}, not {value}")


def find_recipe(name: str, recipes_dir: Path = RECIPES_DIR) -> Path:
    """`headstart/recipes/**/NAME.yaml`, or NAME itself when it is a YAML path.

    Args:
        name (str): a recipe's name (its file's stem) or a YAML file's path.
        recipes_dir (Path): the folder searched, with its subfolders.
    """
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
    """Build a `schema` instance from `recipe=NAME` and `key=value` arguments; `--help` (or
    `-h`) anywhere prints the schema's help instead and exits 0 (`HelpShown`).

    Args:
        schema (type[T]): the config dataclass to build.
        argv (list[str]): the command line: `recipe=NAME` (at most one) and `key=value` overrides.
        recipes_dir (Path): where recipe names are looked up.
    """
    exit_on_help(schema, argv, recipes_dir=recipes_dir)
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
    try:
        config = _merge(config, OmegaConf.from_dotlist(overrides), "command line")
    except RecipeError as error:
        empty = [a.split("=", 1)[0] for a in overrides if a.endswith("=")]
        key = getattr(error.__cause__, "full_key", None)
        if key in empty:  # OmegaConf reads `key=` as null, and says only that null is incompatible
            raise RecipeError(f"{key}= gives no value, and {key} cannot be null; give one (--help lists it)") from error
        raise
    return OmegaConf.to_object(config)


# What an entry point reports as `error: ...` with exit code 2: bad recipes and values
# (RecipeError is a ValueError), bad or missing input files, and a path given that cannot
# be one (an output directory that is a file or sits under one, a directory where a file
# is due, no permission). Anything else is a bug or an accident of the machine, and keeps
# its traceback.
# What an interrupted entry point says it kept, unless it says more: each writes its results as they finish.
KEPT_ON_INTERRUPT = "what was finished is kept (the same command resumes from it)"
PATH_ERRORS = (FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError, IsADirectoryError)
CLI_ERRORS = (RecipeError, ValueError, *PATH_ERRORS)


def cli_main(body: Callable[[], Any], kept: str = KEPT_ON_INTERRUPT) -> int:
    """Run an entry point's body: `CLI_ERRORS` end with their message on stderr and exit
    code 2 instead of a traceback, `--help` with 0, one Ctrl-C with one line and 130; returns
    the exit code.

    Args:
        body (Callable[[], Any]): the entry point's work, called with no arguments.
        kept (str): what an interrupted run keeps, said to the user (unless the interrupt says it).
    """
    with one_press() as interrupt_handled:
        try:
            body()
        except HelpShown:
            return 0
        except CLI_ERRORS as error:
            print(f"error: {error_line(error)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as interrupt:
            interrupt_handled()
            return report_interrupt(str(interrupt) or kept)  # an interrupt may say what its run kept
    return 0


INTERRUPTED_EXIT = 130  # 128 + SIGINT: what a shell reports for a command Ctrl-C ended


def report_interrupt(what: str) -> int:
    """End a Ctrl-C'd entry point with one line saying what it kept (no traceback); returns 130.

    Args:
        what (str): what the interrupted run kept, said to the user.
    """
    print(f"interrupted: {what}", file=sys.stderr)
    return INTERRUPTED_EXIT


def error_line(error: BaseException) -> str:
    """One line for the user: an OSError as `<file>: <problem>` (its own text may name no
    file, or two), anything else its message with its lines joined.

    Args:
        error (BaseException): the error to describe.
    """
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return " ".join(str(error).split("\n")).strip() or type(error).__name__


def yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error in one line: the problem and where (PyYAML's own text spans 4 lines).

    Args:
        error (yaml.YAMLError): the error PyYAML raised.
    """
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}" + (f" ({context})" if context else "")


def run_cli(schema: type[T], run: Callable[[T], Any], argv: list[str] | None = None) -> int:
    """The body of every `recipe=NAME key=value` entry point: bad recipes, values and
    missing files end with their message and exit code 2 instead of a traceback.

    Args:
        schema (type[T]): the config dataclass the arguments build.
        run (Callable[[T], Any]): the entry point's work, called with the config.
        argv (list[str] | None): the command line; None: `sys.argv[1:]`.
    """
    return cli_main(lambda: run(load_config(schema, sys.argv[1:] if argv is None else argv)))


def config_from_dict(schema: type[T], values: dict[str, Any]) -> T:
    """Validate a plain mapping against `schema` with the same strict rules.

    Args:
        schema (type[T]): the config dataclass to build.
        values (dict[str, Any]): the mapping, nested as the dataclass is.
    """
    return OmegaConf.to_object(_merge(OmegaConf.structured(schema), OmegaConf.create(values), "mapping"))


def dump_config(config: Any, path: Path) -> None:
    """Write the resolved config as YAML, for the output directory and trackers.

    Args:
        config (Any): a config dataclass instance.
        path (Path): the YAML file written (its folder is created).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(OmegaConf.structured(config)))


def config_to_dict(config: Any) -> dict[str, Any]:
    """A plain nested dict of a config dataclass (for W&B and JSON reports).

    Args:
        config (Any): a config dataclass instance.
    """
    return OmegaConf.to_container(OmegaConf.structured(config), resolve=True)


HELP_FLAGS = ("--help", "-h")
# A field's `help_rows` metadata: the rows (key, type, default, help) of a section that is a
# plain mapping validated elsewhere (train's `training:`, TRL's SFTConfig fields); a callable
# or "module:function", imported only when help is asked for.
HelpRows = Iterable[tuple[str, str, Any, str]]


class HelpShown(SystemExit):
    """`--help` printed the schema's help: exit code 0 (`cli_main` returns it)."""

    def __init__(self) -> None:
        super().__init__(0)


def exit_on_help(schema: type, argv: list[str], prog: str | None = None, recipes_dir: Path = RECIPES_DIR,
                 usage: str | None = None) -> None:
    """With `--help`/`-h` in `argv`: print `schema`'s help and raise `HelpShown`; else nothing.
    load_config calls it before reading anything; an entry point that parses its own arguments
    (train.memory) calls it itself, first.

    Args:
        schema (type): the config dataclass whose help is printed.
        argv (list[str]): the command line.
        prog (str | None): the program's name in the usage line; None: worked out from how it was started.
        recipes_dir (Path): where the recipes the help lists are found.
        usage (str | None): the usage line after the program's name; None: the `recipe=NAME key=value` one.
    """
    if any(arg in HELP_FLAGS for arg in argv):
        print(render_help(schema, prog, recipes_dir, usage))
        raise HelpShown()


def render_help(schema: type, prog: str | None = None, recipes_dir: Path = RECIPES_DIR,
                usage: str | None = None) -> str:
    """The usage line, the schema's doc, the recipes whose keys it accepts, then every field
    (type, default, help): top-level keys first, then each section (a nested dataclass, or a
    mapping with `help_rows`) under its name.

    Args:
        schema (type): the config dataclass described.
        prog (str | None): the program's name in the usage line; None: worked out from how it was started.
        recipes_dir (Path): where the recipes the help lists are found.
        usage (str | None): the usage line after the program's name; None: the `recipe=NAME key=value` one.
    """
    prog = prog or _program_name()
    sections = {f: rows for f in dataclasses.fields(schema) if (rows := _section_rows(f)) is not None}
    usage = usage or "recipe=NAME key=value " + ("section.key=value ..." if sections else "...")
    lines = [f"usage: {prog} {usage}", ""]
    if schema.__doc__ and not schema.__doc__.startswith(f"{schema.__name__}("):  # dataclasses invent a doc
        lines += [" ".join(schema.__doc__.split()), ""]
    recipes = fitting_recipes(schema, recipes_dir)
    if recipes:
        lines += ["recipes (recipe=NAME, or recipe=path/to/file.yaml):",
                  *textwrap.wrap(", ".join(recipes), 100, initial_indent="  ", subsequent_indent="  "), ""]
    keys = [f for f in dataclasses.fields(schema) if f not in sections]
    if keys:
        lines += ["top-level keys:", *_rows_text(_key_row(f, "") for f in keys), ""]
    for f, rows in sections.items():
        lines += [f"{f.name}: {f.metadata.get('help', '')}".rstrip(), *_rows_text(rows), ""]
    return "\n".join(lines).rstrip() + "\n"


def fitting_recipes(schema: type, recipes_dir: Path = RECIPES_DIR) -> list[str]:
    """Names of the recipes under `recipes_dir` whose top-level keys are all `schema`'s fields.

    Args:
        schema (type): the config dataclass the recipes must fit.
        recipes_dir (Path): the folder searched, with its subfolders.
    """
    names = {f.name for f in dataclasses.fields(schema)}
    fits = []
    for path in sorted(recipes_dir.rglob("*.yaml")):
        try:
            recipe = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue  # a broken recipe is reported when it is used, not in the help
        if isinstance(recipe, dict) and recipe and set(recipe) <= names:
            fits.append(path.stem)
    return fits


def _program_name() -> str:
    """How this process was started: `python -m package.module` or `python path/to/script.py`."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return f"python -m {spec.name.removesuffix('.__main__')}"
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(Path.cwd())
    except ValueError:
        pass
    return f"python {script}"


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _field_rows(schema: type, prefix: str) -> list[tuple[str, str, Any, str]]:
    """(key, type, default, help) of every field of `schema`, nested sections flattened."""
    rows = []
    for f in dataclasses.fields(schema):
        default = _default(f)
        if dataclasses.is_dataclass(default):
            rows += _field_rows(type(default), f"{prefix}{f.name}.")
        else:
            rows.append(_key_row(f, prefix))
    return rows


def _key_row(f: dataclasses.Field, prefix: str) -> tuple[str, str, Any, str]:
    return prefix + f.name, _type_name(f.type), _default(f), f.metadata.get("help", "")


def _section_rows(f: dataclasses.Field) -> list[tuple[str, str, Any, str]] | None:
    """The rows of a section field (a nested dataclass, or a mapping with `help_rows`); None
    for a plain key."""
    hook = f.metadata.get("help_rows")
    if hook is not None:
        if isinstance(hook, str):
            module, _, name = hook.partition(":")
            hook = getattr(importlib.import_module(module), name)
        return [(f"{f.name}.{key}", kind, default, text) for key, kind, default, text in hook()]
    default = _default(f)
    return _field_rows(type(default), f"{f.name}.") if dataclasses.is_dataclass(default) else None


def _rows_text(rows: HelpRows) -> list[str]:
    lines = []
    for key, kind, default, text in rows:
        shown = "required" if default is dataclasses.MISSING else f"default {_value_text(default)}"
        lines.append(f"  {key} ({kind}, {shown})")
        lines += textwrap.wrap(" ".join(str(text).split()), 96, initial_indent="      ", subsequent_indent="      ")
    return lines


def _type_name(kind: Any) -> str:
    return kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))


def _value_text(value: Any) -> str:
    """A default as a recipe or command line spells it (null, true, [a, b], text)."""
    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    except yaml.YAMLError:  # a value YAML has no plain spelling for (a tuple, a Path)
        return str(value)
    return text.removesuffix("\n...").removesuffix("...").strip() or "''"


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
