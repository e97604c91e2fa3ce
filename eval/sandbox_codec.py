"""Plain data across the sandbox's wall: the arguments of a call of the program's
function and what it returned, as one line of JSON each.

Only exact builtin types cross: None, bool, int, float, str, bytes, complex, list,
tuple, set, frozenset, dict, range, and an iterator (sent as the items it yields,
received as an iterator over them). The trusted side decodes with `from_wire`,
which builds nothing but those types, so no object of the program's (an `__eq__`
that always says True) ever reaches the tests. The program's side first reduces
an honest answer to plain data (`plain`: a namedtuple to a tuple, a Counter to a
dict, a numpy scalar to its value); whatever it sends, the tests see plain data.

This file is also executed as source text inside the sandbox (the program's side)
and in the trusted checker: standard library only, no __future__ import.
"""

import json
import math

MAX_DEPTH = 200
MAX_ITEMS = 1_000_000  # items taken from an iterator the program returns
_SMALL_INT = 1 << 60  # larger ints travel in hex (JSON's decimal ints stop at 4300 digits)
_EXACT = (type(None), bool, int, float, str, bytes, complex, range)


class NotPlainData(TypeError):
    """A value that is not plain data, or a message that does not decode to it."""


def to_wire(value, depth=0):
    """A JSON-able form of a plain value; exact types only."""
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value if -_SMALL_INT < value < _SMALL_INT else {"$": "int", "v": format(value, "x")}
    if kind is float:
        return value if math.isfinite(value) else {"$": "float", "v": repr(value)}
    if kind is bytes:
        return {"$": "bytes", "v": value.hex()}
    if kind is complex:
        return {"$": "complex", "v": [to_wire(value.real), to_wire(value.imag)]}
    if kind is range:
        return {"$": "range", "v": [value.start, value.stop, value.step]}
    if depth >= MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH}")
    if kind is list:
        return [to_wire(item, depth + 1) for item in value]
    if kind in (tuple, set, frozenset):
        return {"$": kind.__name__, "v": [to_wire(item, depth + 1) for item in value]}
    if kind is dict:
        return {"$": "dict", "v": [[to_wire(k, depth + 1), to_wire(v, depth + 1)] for k, v in value.items()]}
    if kind is _Iterated:
        return {"$": "iter", "v": [to_wire(item, depth + 1) for item in value.items]}
    raise NotPlainData(f"a {kind.__module__}.{kind.__qualname__} is not plain data")


def from_wire(data, depth=0):
    """The plain value `data` (decoded JSON) stands for; NotPlainData for anything else."""
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if depth >= MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH}")
    if kind is list:
        return [from_wire(item, depth + 1) for item in data]
    if kind is not dict or set(data) != {"$", "v"}:
        raise NotPlainData(f"not a plain value: {kind.__name__}")
    tag, body = data["$"], data["v"]
    try:
        if tag == "int" and type(body) is str:
            return int(body, 16)
        if tag == "float" and body in ("inf", "-inf", "nan"):
            return float(body)
        if tag == "bytes" and type(body) is str:
            return bytes.fromhex(body)
        if type(body) is not list:
            raise NotPlainData(f"a {tag!r} value without its items")
        items = [from_wire(item, depth + 1) for item in body]
        if tag == "complex" and len(items) == 2 and all(type(x) in (int, float) for x in items):
            return complex(*items)
        if tag == "range" and len(items) == 3 and all(type(x) is int for x in items):
            return range(*items)
        if tag in ("tuple", "set", "frozenset", "iter"):
            return {"tuple": tuple, "set": set, "frozenset": frozenset, "iter": iter}[tag](items)
        if tag == "dict" and all(type(pair) is list and len(pair) == 2 for pair in items):
            return dict((key, value) for key, value in items)
    except (TypeError, ValueError) as error:  # an unhashable key, a bad hex string, a zero step
        raise NotPlainData(f"a {tag!r} value that does not decode: {error}") from None
    raise NotPlainData(f"an unknown or malformed tag {tag!r}")


class _Iterated:
    """The items an iterator yielded, to be received as an iterator again."""

    def __init__(self, items):
        self.items = items


def plain(value, depth=0):
    """The program's side: an honest answer as plain data (subclasses of builtin
    types as their base type, numpy scalars and 0-d arrays as their value, an
    iterator as what it yields), else NotPlainData."""
    kind = type(value)
    if kind in _EXACT:
        return value
    if depth >= MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH}")
    for base in (bool, int, float, str, bytes, complex):
        if isinstance(value, base):
            return base(value)
    if isinstance(value, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in dict.items(value)}
    for base in (list, tuple, set, frozenset):
        if isinstance(value, base):
            return base(plain(item, depth + 1) for item in base.__iter__(value))
    if kind.__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return plain(value.item(), depth + 1)
    if hasattr(kind, "__next__") and hasattr(kind, "__iter__"):
        items = []
        for item in value:
            if len(items) >= MAX_ITEMS:
                raise NotPlainData(f"an iterator of more than {MAX_ITEMS} items")
            items.append(plain(item, depth + 1))
        return _Iterated(items)
    raise NotPlainData(f"a {kind.__module__}.{kind.__qualname__} is not plain data")


def dumps(message):
    return json.dumps(message, allow_nan=False, separators=(",", ":")) + "\n"
