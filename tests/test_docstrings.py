r"""The packages' docstrings say what the arguments are; comments and docstrings carry no results and no test or doc paths.

Three checks over the modules in COVERED_FOLDERS (each folder's own `*.py`, not its subfolders), less NOT_YET_COVERED,
read with `ast` and `tokenize` only (nothing is imported):

* Every public function and public method that takes an argument besides `self`/`cls` has a docstring. Its `Args:`
  section, where it has one, documents the arguments whose name and type do not say enough (TRL's style: the docstring
  says what the signature does not), each on an entry's first line, in torchtune's short form, and names no argument
  the function does not take:

      Args:
          name (type): what it is.
          kwargs (Any): `*args` and `**kwargs` by their bare names (the stars may be written too).

  Public: the function's name, its class's and its module's have no leading underscore. Skipped: dunder methods,
  `@property` (and its setters), `@overload`, functions nested in functions, test files.
* No comment or docstring names a path under the tests or docs folders. PATH_PATTERN: `\b(tests|docs)/[\w./-]+`.
* No comment or docstring carries a measurement of a machine. MEASUREMENT_PATTERN: a number (or a range, `0.7-1`)
  followed by a unit of time (`s`, `ms`, `us`, `min`), size (`KB`..`TB`, `KiB`..`TiB`) or rate (`GB/s`, `MB/s`,
  `tokens/s`, `tok/s`, `it/s`, `req/s`), or a speed-up (`x` right after the number: `3.2x`). Not counted: text in
  backticks (a default written as code, `wall_seconds=120`, or a formula), and a unit followed by a lone letter other
  than "a" (a formula's product, "34 s b h"). The figures live in the results document, with their command and machine.

Every offender is reported as file:line.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The folders checked (each folder's own *.py).
COVERED_FOLDERS = [
    "headstart",
    "eval",
    "eval/evaluation",
    "eval/sandbox",
    "data_builders",
    "eval/engines",
    "eval/benchmarks",
    "eval/reporting",
    "eval/serving",
    "train",
    "scripts/device_check",
    "slurm",
]

# Modules in the covered folders left unchecked, each with its reason (none today).
NOT_YET_COVERED: list[str] = []

PATH_PATTERN = re.compile(r"\b(tests|docs)/[\w./-]+")
_NUMBER = r"(?<![\w.])\d+(\.\d+)?(\s*[-–]\s*\d+(\.\d+)?)?"
_UNITS = r"(s|ms|us|µs|min|mins|KB|MB|GB|TB|KiB|MiB|GiB|TiB|GB/s|MB/s|GiB/s|MiB/s|tokens/s|tok/s|it/s|req/s)"
# A unit followed by a lone letter but "a" is a formula's product ("34 s b h": 34 x sequence x batch x hidden).
MEASUREMENT_PATTERN = re.compile(_NUMBER + r"(\s*" + _UNITS + r"(?![\w/])(?!\s+(?!a\b)[a-zA-Z]\b)|x(?!\w))")
_BACKTICKED = re.compile(r"`[^`]*`")


def _modules() -> list[Path]:
    skipped = {ROOT / name for name in NOT_YET_COVERED}
    found = []
    for folder in COVERED_FOLDERS:
        for path in sorted((ROOT / folder).glob("*.py")):
            if path not in skipped and not path.name.startswith(("test_", "conftest")):
                found.append(path)
    return found


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def _decorator_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names = set()
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, ast.Attribute):
            names.add(target.attr)
    return names


def _public_functions(tree: ast.Module):
    """(function, is_method) for the module's public functions and its public classes' public methods."""

    def walk(body, in_class):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("_"):
                    continue
                if _decorator_names(node) & {"property", "setter", "deleter", "overload", "cached_property"}:
                    continue
                yield node, in_class
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                yield from walk(node.body, True)

    yield from walk(tree.body, False)


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool) -> list[str]:
    arguments = node.args
    positional = [a.arg for a in arguments.posonlyargs + arguments.args]
    if is_method and "staticmethod" not in _decorator_names(node) and positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    names = positional
    if arguments.vararg:
        names.append(arguments.vararg.arg)
    names += [a.arg for a in arguments.kwonlyargs]
    if arguments.kwarg:
        names.append(arguments.kwarg.arg)
    return names


def _args_section(docstring: str) -> list[str] | None:
    """The lines of the docstring's `Args:` section, or None without one."""
    lines = docstring.splitlines()
    for index, line in enumerate(lines):
        if line.strip() == "Args:":
            indent = len(line) - len(line.lstrip())
            section = []
            for following in lines[index + 1:]:
                if following.strip() and len(following) - len(following.lstrip()) <= indent:
                    break  # the next section (Returns:, Raises:) or the prose after the entries
                section.append(following)
            return section
    return None


def _documents(section: list[str], name: str) -> bool:
    entry = re.compile(r"^\s*\**" + re.escape(name) + r"\s*(\(|:)")
    return any(entry.match(line) for line in section)


def _entry_names(section: list[str]) -> list[str]:
    """The names the `Args:` entries document (an entry's first line: `name (type): ...`, stars allowed)."""
    entry = re.compile(r"^(\s*)\**(\w+)\s*(\(|:)")
    matches = [entry.match(line) for line in section]
    indents = [len(m.group(1)) for m in matches if m]
    return [m.group(2) for m in matches if m and len(m.group(1)) == min(indents)]


def _missing_args() -> list[str]:
    """Public functions with no docstring, and `Args:` entries that name no parameter (stale ones). An
    argument its name and type say enough about needs no entry (TRL's style): the docstring says the rest."""
    offenders = []
    for path in _modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, is_method in _public_functions(tree):
            parameters = _parameters(node, is_method)
            if not parameters:
                continue
            docstring = ast.get_docstring(node)
            where = _where(path, node.lineno)
            if docstring is None:
                offenders.append(f"{where}: {node.name} has no docstring")
                continue
            stale = [name for name in _entry_names(_args_section(docstring) or []) if name not in parameters]
            if stale:
                offenders.append(f"{where}: {node.name}'s Args: names {', '.join(stale)}, not a parameter")
    return offenders


def _docstrings(tree: ast.Module):
    """(line, text) of every docstring: the module's, its classes' and its functions' (nested ones too)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                yield body[0].lineno, body[0].value.value


def _comments(source: str):
    """(line, text) of every `#` comment."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def _prose_offenders() -> tuple[list[str], list[str]]:
    paths, measurements = [], []
    for path in _modules():
        source = path.read_text()
        comments = list(_comments(source))
        for line, text in comments + list(_docstrings(ast.parse(source))):
            for match in PATH_PATTERN.finditer(text):
                paths.append(f"{_where(path, line + text.count(chr(10), 0, match.start()))}: names {match.group(0)}")
            # backticked code is blanked, not removed, so that a match's line is still its own
            for match in MEASUREMENT_PATTERN.finditer(_BACKTICKED.sub(lambda code: "`" * len(code.group(0)), text)):
                where = _where(path, line + text.count(chr(10), 0, match.start()))
                measurements.append(f"{where}: carries {match.group(0).strip()!r}")
    return paths, measurements


def test_checker_covers_existing_modules():
    for name in COVERED_FOLDERS:
        assert (ROOT / name).is_dir(), name
    for name in NOT_YET_COVERED:
        assert (ROOT / name).is_file(), f"{name} is gone: take it out of NOT_YET_COVERED"
    assert _modules()


def test_public_functions_have_docstrings_whose_args_are_their_own():
    offenders = _missing_args()
    assert not offenders, f"{len(offenders)} public functions without a docstring or with stale Args: entries:\n" + \
        "\n".join(offenders)


def test_no_test_or_doc_paths_in_comments_or_docstrings():
    offenders, _ = _prose_offenders()
    assert not offenders, "comments or docstrings name test or doc paths:\n" + "\n".join(offenders)


def test_no_measurements_in_comments():
    _, offenders = _prose_offenders()
    assert not offenders, "comments carry measurements:\n" + "\n".join(offenders)


def test_an_args_entry_is_read_by_its_first_line_only():
    section = ["    first (int): the first,", "        continued (a word with a colon): not an entry",
               "    **kwargs (Any): the rest."]
    assert _entry_names(section) == ["first", "kwargs"]
