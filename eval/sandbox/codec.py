"""Values across the sandbox's wall: the arguments of a call of the program's function
and what it returned, as one line of JSON each, with their types.

A value crosses with its type, so that the tests compare what the program returned
the way the official harnesses (which run tests and program in one process) would:
a `deque` stays a deque (not equal to a list), a `Fraction` a Fraction, `np.bool_`
stays numpy's (`is True` fails, as it does officially), a `dict_keys` view compares
like one. Types that cross: None, bool, int, float, str, bytes, complex, range, list,
tuple, set, frozenset, dict; from the standard library Fraction, Decimal, bytearray,
array.array, deque, OrderedDict, Counter, defaultdict (its factory stays behind: equality
ignores it) and the dict views; numpy's scalars and arrays of numbers, booleans or text
(never object arrays); an iterator (sent as the items it yields, received as an
iterator over them). The trusted side decodes with `from_wire`, which builds nothing
but those types from their plain parts, so no object of the program's (an `__eq__`
that always says True) ever reaches the tests.

The program's side first reduces an answer to those types (`plain`): a subclass of
a builtin type (a namedtuple, an IntEnum or a str-based Enum member) becomes its base
type by the base type's own conversion, never the subclass's override (a str Enum's
`__str__` would change its text); a UserList, UserDict or UserString as the list, dict or str
it wraps. Any other object (of the program's own class) stays in the program's process and
crosses as a handle: the call server (eval/sandbox/calls.py) keeps it, the trusted side holds a
stand-in that asks the program for its attributes, arithmetic and conversions and sends the
handle back when the tests pass it on; a comparison with a plain value is the object's own,
checked against a decoy of that value's type (eval/sandbox/calls.py) (`_HANDLES` on the program's
side, `_REMOTE` the stand-in's class on the trusted side; neither set here: nothing but
plain values crosses). Deliberate differences from the official harnesses: a namedtuple
arrives as a tuple and an Enum member as its value (they compare equal to those officially
too); an object that says it equals (or orders before) a decoy as well as the value it is
compared with fails: officially an `__eq__` that always says True passes.

This file is also executed as source text inside the sandbox (the program's side)
and in the trusted checker: standard library only (numpy imported only when a numpy
value crosses), no __future__ import.
"""

import array
import collections
import decimal
import fractions
import json
import math
import sys

MAX_DEPTH = 200
MAX_ITEMS = 1_000_000  # items taken from an iterator the program returns
_SMALL_INT = 1 << 60  # larger ints travel in hex (JSON's decimal ints stop at 4300 digits)
_EXACT = (type(None), bool, int, float, str, bytes, complex, range)
_KEYS, _VALUES, _ITEMS = type({}.keys()), type({}.values()), type({}.items())
_ATOMS = (fractions.Fraction, decimal.Decimal, bytearray, array.array)  # carried whole, no items to reduce
_MAPPINGS = {collections.OrderedDict: "odict", collections.Counter: "counter", collections.defaultdict: "defaultdict"}
_ARRAY_CODES = frozenset("bBuhHiIlLqQfd")
_NUMPY_KINDS = frozenset("biufcUS")  # booleans, integers, floats, complex, text, bytes: never objects
# A subclass of a builtin type becomes its base by the base type's own conversion.
# (bytes.__bytes__ and complex.__complex__ exist from Python 3.11: slicing and the parts do on 3.10.)
_BASE_CONVERSIONS = ((int, int.__index__), (float, float.__float__), (str, str.__str__),
                     (bytes, lambda value: bytes.__getitem__(value, slice(None))),
                     (complex, lambda value: complex(complex.real.__get__(value), complex.imag.__get__(value))))
_HANDLES = None  # the program's side of a call server: the objects sent as handles, by index
_HANDLE_INDEX = {}  # id of an object sent -> its index (the same object, the same handle)
_REMOTE = None  # the trusted side of a call server: the class of a handle's stand-in


class NotPlainData(TypeError):
    """A value that cannot cross, or a message that does not decode to one."""


def _tagged(tag, body):
    return {"$": tag, "v": body}


def to_wire(value, depth=0):
    """A JSON-able form of a value of the types that cross; exact types only.

    Args:
        value (Any): the value sent, of a type that crosses (on the program's side, as `plain` left it).
        depth (int): how deep in the outermost value this one sits; at `MAX_DEPTH`, NotPlainData.
    """
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value if -_SMALL_INT < value < _SMALL_INT else _tagged("int", format(value, "x"))
    if kind is float:
        return value if math.isfinite(value) else _tagged("float", repr(value))
    if kind is bytes or kind is bytearray:
        return _tagged(kind.__name__, value.hex())
    if kind is complex:
        return _tagged("complex", [to_wire(value.real), to_wire(value.imag)])
    if kind is range:
        return _tagged("range", [value.start, value.stop, value.step])
    if kind is fractions.Fraction:
        return _tagged("fraction", [to_wire(value.numerator), to_wire(value.denominator)])
    if kind is decimal.Decimal:
        return _tagged("decimal", decimal.Decimal.__str__(value))
    if depth >= MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH}")
    return _container_to_wire(value, kind, depth + 1)


def _container_to_wire(value, kind, depth):
    items = lambda values: [to_wire(item, depth) for item in values]  # noqa: E731 (source text for the sandbox)
    pairs = lambda mapping: [[to_wire(k, depth), to_wire(v, depth)] for k, v in mapping]  # noqa: E731
    if kind is list:
        return items(value)
    if kind in (tuple, set, frozenset):
        return _tagged(kind.__name__, items(value))
    if kind is dict:
        return _tagged("dict", pairs(value.items()))
    if kind in _MAPPINGS:
        return _tagged(_MAPPINGS[kind], pairs(dict.items(value)))
    if kind is collections.deque:
        return _tagged("deque", [items(value), value.maxlen])
    if kind is _KEYS or kind is _VALUES:
        return _tagged("keys" if kind is _KEYS else "values", items(value))
    if kind is _ITEMS:
        return _tagged("items", pairs(value))
    if kind is array.array:
        return _tagged("array", [value.typecode, items(value.tolist())])
    if kind is _Iterated:
        return _tagged("iter", items(value.items))
    if kind.__module__ == "numpy":
        return _numpy_to_wire(value, kind, depth)
    return _handle_to_wire(value, kind)


def _handle_to_wire(value, kind):
    """A handle: an object of the program's kept in its process, or a stand-in sent back."""
    if _REMOTE is not None and kind is _REMOTE:
        return _tagged("handle", [value._index, ""])
    if _HANDLES is None:
        raise NotPlainData(f"a {kind.__module__}.{kind.__qualname__} is not plain data")
    index = _HANDLE_INDEX.get(id(value))
    if index is None:
        index = _HANDLE_INDEX[id(value)] = len(_HANDLES)
        _HANDLES.append(value)  # kept alive: its id stays its own
    return _tagged("handle", [index, kind.__qualname__[:100]])


def _numpy_to_wire(value, kind, depth):
    numpy = sys.modules["numpy"]
    if not isinstance(value, (numpy.ndarray, numpy.generic)) or value.dtype.kind not in _NUMPY_KINDS \
            or value.dtype in (numpy.longdouble, numpy.clongdouble):  # their .item() is numpy's own again
        raise NotPlainData(f"a {kind.__module__}.{kind.__qualname__} of {getattr(value, 'dtype', '?')} is not plain data")
    if isinstance(value, numpy.ndarray):  # a subclass (matrix, memmap) as the array it holds
        value = numpy.asarray(value)
        flat = [to_wire(item, depth) for item in value.ravel().tolist()]
        return _tagged("ndarray", [value.dtype.str, list(value.shape), flat])
    return _tagged("npscalar", [value.dtype.str, to_wire(value.item(), depth)])


def from_wire(data, depth=0):
    """The value `data` (decoded JSON) stands for; NotPlainData for anything else.

    Args:
        data (Any): one value in `to_wire`'s form, as `json.loads` gives it back.
        depth (int): how deep in the outermost value this one sits; at `MAX_DEPTH`, NotPlainData.
    """
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
        if type(body) is str:
            return _text_from_wire(tag, body)
        if type(body) is not list:
            raise NotPlainData(f"a {tag!r} value without its items")
        return _items_from_wire(tag, body, depth + 1)
    except (TypeError, ValueError, ArithmeticError) as error:  # an unhashable key, a bad hex string, a zero step
        if isinstance(error, NotPlainData):
            raise
        raise NotPlainData(f"a {tag!r} value that does not decode: {error}") from None


def _text_from_wire(tag, body):
    if tag == "int":
        return int(body, 16)
    if tag == "float" and body in ("inf", "-inf", "nan"):
        return float(body)
    if tag in ("bytes", "bytearray"):
        return (bytes if tag == "bytes" else bytearray).fromhex(body)
    if tag == "decimal":
        return decimal.Decimal(body)
    raise NotPlainData(f"an unknown or malformed tag {tag!r}")


def _items_from_wire(tag, body, depth):
    if tag == "handle" and len(body) == 2 and type(body[0]) is int and type(body[1]) is str:
        return _handle_from_wire(*body)
    if tag == "ndarray" or tag == "npscalar":
        return _numpy_from_wire(tag, body, depth)
    if tag == "array" and len(body) == 2 and body[0] in _ARRAY_CODES and type(body[1]) is list:
        return array.array(body[0], [from_wire(item, depth) for item in body[1]])
    if tag == "deque" and len(body) == 2 and type(body[0]) is list and (body[1] is None or type(body[1]) is int):
        return collections.deque([from_wire(item, depth) for item in body[0]], body[1])
    items = [from_wire(item, depth) for item in body]
    numbers = all(type(x) in (int, float) for x in items)
    if tag == "complex" and len(items) == 2 and numbers:
        return complex(*items)
    if tag == "range" and len(items) == 3 and all(type(x) is int for x in items):
        return range(*items)
    if tag == "fraction" and len(items) == 2 and all(type(x) is int for x in items):
        return fractions.Fraction(*items)
    if tag in ("tuple", "set", "frozenset", "iter", "keys"):
        return {"tuple": tuple, "set": set, "frozenset": frozenset, "iter": iter,
                "keys": lambda keys: dict.fromkeys(keys).keys()}[tag](items)
    if tag == "values":
        return dict(enumerate(items)).values()
    if all(type(pair) is list and len(pair) == 2 for pair in items):
        if tag in ("dict", "items"):
            return dict(items) if tag == "dict" else dict(items).items()
        for kind, name in _MAPPINGS.items():
            if tag == name:
                return _mapping(kind, items)
    raise NotPlainData(f"an unknown or malformed tag {tag!r}")


def _handle_from_wire(index, kind):
    if _HANDLES is not None and 0 <= index < len(_HANDLES):
        return _HANDLES[index]
    if _REMOTE is not None:
        return _REMOTE(index, kind)
    raise NotPlainData("a handle that names no object")


def _mapping(kind, pairs):
    """A dict, OrderedDict, Counter or defaultdict (without a factory) holding `pairs`, in their order."""
    ordered = dict(pairs)
    return collections.defaultdict(None, ordered) if kind is collections.defaultdict else kind(ordered)


def _numpy_from_wire(tag, body, depth):
    if len(body) != 3 - (tag == "npscalar") or type(body[0]) is not str:
        raise NotPlainData(f"a malformed {tag!r} value")
    numpy = _import_numpy()
    dtype = numpy.dtype(body[0])
    if dtype.kind not in _NUMPY_KINDS:
        raise NotPlainData(f"a numpy value of {dtype} does not cross")
    if tag == "npscalar":
        return dtype.type(from_wire(body[1], depth))
    shape = body[1]
    if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape) or type(body[2]) is not list:
        raise NotPlainData("a malformed 'ndarray' value")
    return numpy.array([from_wire(item, depth) for item in body[2]], dtype=dtype).reshape(shape)


def _import_numpy():
    """numpy, for a numpy value that crosses; the trusted checker starts without the site
    packages (python -S), so their directories are added the first time one does."""
    if "numpy" not in sys.modules:
        import sysconfig

        for key in ("purelib", "platlib"):
            directory = sysconfig.get_paths()[key]
            if directory not in sys.path:
                sys.path.append(directory)
    try:
        import numpy
    except ImportError:
        raise NotPlainData("a numpy value, where numpy is not installed") from None
    return numpy


class _Iterated:
    """The items an iterator yielded, to be received as an iterator again."""

    def __init__(self, items):
        self.items = items


def plain(value, depth=0):
    """The program's side: an answer as the types that cross (module docstring), else NotPlainData.

    Args:
        value (Any): what the program's function (or an operation on its object) returned.
        depth (int): how deep in the outermost value this one sits; at `MAX_DEPTH`, NotPlainData.
    """
    kind = type(value)
    if kind in _EXACT or kind in _ATOMS:
        return value
    if depth >= MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH}")
    reduce = lambda item: plain(item, depth + 1)  # noqa: E731 (source text for the sandbox)
    if kind.__module__ == "numpy":
        return value  # numbers, booleans or text, or refused by to_wire: no items of the program's inside
    if kind in (list, tuple, set, frozenset):
        return kind(map(reduce, value))
    if kind is dict or kind in _MAPPINGS:
        return _mapping(kind, [(reduce(k), reduce(v)) for k, v in dict.items(value)])
    if kind is collections.deque:
        return collections.deque(map(reduce, value), value.maxlen)
    if kind is _KEYS or kind is _VALUES or kind is _ITEMS:
        reduced = [reduce(item) for item in value]
        return (dict.fromkeys(reduced).keys() if kind is _KEYS else dict(enumerate(reduced)).values()
                if kind is _VALUES else dict(reduced).items())
    return _plain_subclass(value, kind, depth)


def _plain_subclass(value, kind, depth):
    """A subclass of a builtin type as its base, by the base's own conversion; an iterator as what it yields."""
    for base, conversion in _BASE_CONVERSIONS:
        if isinstance(value, base):
            return conversion(value)
    if isinstance(value, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in dict.items(value)}
    for base in (list, tuple, set, frozenset):
        if isinstance(value, base):
            return base(plain(item, depth + 1) for item in base.__iter__(value))
    for wrapper, base in ((collections.UserList, list), (collections.UserDict, dict), (collections.UserString, str)):
        if isinstance(value, wrapper):  # equal to its base type's value officially: arrives as that value
            return plain(base(value.data), depth + 1)
    if hasattr(kind, "__next__") and hasattr(kind, "__iter__"):
        items = []
        for item in value:
            if len(items) >= MAX_ITEMS:
                raise NotPlainData(f"an iterator of more than {MAX_ITEMS} items")
            items.append(plain(item, depth + 1))
        return _Iterated(items)
    if _HANDLES is not None:  # crosses as a handle (to_wire)
        return value
    raise NotPlainData(f"a {kind.__module__}.{kind.__qualname__} is not plain data")


def dumps(message):
    """One message as a line of compact JSON; NaN and infinities are refused (`to_wire` tags them).

    Args:
        message (dict): a call, an operation or an answer, its values in `to_wire`'s form.
    """
    return json.dumps(message, allow_nan=False, separators=(",", ":")) + "\n"
