"""Frozen JSON values (rules V1, V2, V23).

Every value the library stores is a *frozen JSON value*: ``None``, ``bool``,
``int``, finite ``float``, ``str`` (Unicode scalar values only: no lone
surrogates, rule V23), a `FrozenList` of frozen values, or a `FrozenDict` with
``str`` keys. `freeze` validates a caller's value (JSON compatibility, rule
V1) and returns a deep immutable snapshot (rule V2); `thaw` turns a frozen
value back into plain lists and dicts.

`FrozenDict` and `FrozenList` keep their contents frozen whoever builds them:
their constructors freeze (and so validate) any child that is not already
frozen. Both are final (they cannot be subclassed). A `FrozenDict` also knows
its nesting depth, so a bound (V1) is checked in O(1) wherever one enters.
A `FrozenList` is a tuple, and ``tuple.__new__(FrozenList, ...)`` builds one
without its constructor; so a `FrozenList` is never trusted blindly: its items
are checked (down to the `FrozenDict`s, whose depth is known) wherever one
enters, and one holding anything else is rebuilt through `freeze`, which
refuses what is not JSON-compatible. Both compare equal to plain dicts and
lists with the same JSON content.
"""

from __future__ import annotations

import json
import json.encoder
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, NoReturn, TypeAlias, TypeVar, overload

from machine.errors import NotJsonCompatibleError

_T = TypeVar("_T")

#: Arrays and objects nested deeper than this are not JSON-compatible where a value enters
#: (rule V1).
MAX_DEPTH: Final = 128
#: The bound of the envelopes the library builds around entered values (event data, live and
#: effect payloads; V1): the deepest core envelope holds an entered value 4 levels down.
ENVELOPE_DEPTH: Final = MAX_DEPTH + 8
#: Stored depths saturate here: a container this deep is deeper than every bound.
_DEPTH_CAP: Final = ENVELOPE_DEPTH + 1

_INF: Final = math.inf


def _scalar_types() -> frozenset[type]:
    return frozenset({int, bool, type(None)})


#: Exact types whose every value is a frozen scalar (str and float need a look at the value).
_SCALARS: Final = _scalar_types()


def _text_ok(text: str) -> bool:
    """V23: *text* holds no lone surrogate (it is encodable as UTF-8)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _surrogate_problem(text: str) -> str:
    for position, char in enumerate(text):
        if "\ud800" <= char <= "\udfff":
            return (f"the string holds a lone surrogate (U+{ord(char):04X} at index {position}), "
                    "which UTF-8 JSON cannot represent")
    return "the string is not valid Unicode text"  # pragma: no cover - _text_ok said so


def plain_text(value: str, path: str) -> str:
    """*value* as a plain ``str`` (a subclass is converted), refused with a
    `NotJsonCompatibleError` naming *path* when it holds a lone surrogate (rule V23)."""
    text = value if type(value) is str else str.__str__(value)
    if text.isascii() or _text_ok(text):
        return text
    raise NotJsonCompatibleError(path, _surrogate_problem(text))


def scrub_text(text: str) -> str:
    """*text* with every lone surrogate replaced by U+FFFD (rule V23: for text the library
    takes from elsewhere, such as an exception's message, rather than accepts from a caller)."""
    text = text if type(text) is str else str.__str__(text)
    if text.isascii() or _text_ok(text):
        return text
    return "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in text)


def _children_depth(values: Iterable[Any], *, nested_lists: bool = True) -> int:
    """The depth of the deepest container among *values* (0 if none), or -1 if one of them
    is not a frozen value (a mutable or non-JSON value, a non-finite float, a string with a
    lone surrogate, a FrozenList holding any of those, a FrozenDict never built). Without
    *nested_lists*, -2 as soon as one of them is a FrozenList (see `_list_depth`)."""
    deepest = 0
    scalars = _SCALARS
    try:
        for item in values:
            kind = type(item)
            if kind is str:
                if item.isascii() or _text_ok(item):
                    continue
                return -1
            if kind in scalars:
                continue
            if kind is FrozenDict:
                depth = item._depth
            elif kind is FrozenList:
                if not nested_lists:
                    return -2
                depth = _list_depth(item)
                if depth < 0:
                    return -1
            elif kind is float and -_INF < item < _INF:
                continue
            else:
                return -1
            if depth > deepest:
                deepest = depth
    except AttributeError:  # a FrozenDict made by object.__new__, never built
        return -1
    return deepest


#: Exact str keys found free of lone surrogates (at most `_KNOWN_KEYS_LIMIT` of them).
_KNOWN_KEYS: set[str] = set()
_KNOWN_KEYS_LIMIT: Final = 4096


def _items_depth(data: dict[Any, Any]) -> int:
    """`_children_depth` of a plain dict's values, or -1 if a key is not an exact str free
    of lone surrogates."""
    # Why not `_children_depth(data.values())` after a pass over the keys: this runs for
    # every payload the core builds, and one pass over the pairs, inline, costs less.
    deepest = 0
    scalars = _SCALARS
    known = _KNOWN_KEYS
    try:
        for key, item in data.items():
            if type(key) is not str or key not in known:
                # Why the cache: most keys are the few the vocabulary uses, checked once;
                # an exact str compares and hashes without running any code of a caller's.
                if type(key) is not str or not (key.isascii() or _text_ok(key)):
                    return -1
                if len(known) < _KNOWN_KEYS_LIMIT:
                    known.add(key)
            kind = type(item)
            if kind is str:
                if item.isascii() or _text_ok(item):
                    continue
                return -1
            if kind in scalars:
                continue
            if kind is FrozenDict:
                depth = item._depth
            elif kind is FrozenList:
                depth = _list_depth(item)
                if depth < 0:
                    return -1
            elif kind is float and -_INF < item < _INF:
                continue
            else:
                return -1
            if depth > deepest:
                deepest = depth
    except AttributeError:  # a FrozenDict never built
        return -1
    return deepest


def _list_depth(root: FrozenList) -> int:
    """The depth of *root* (1 for an array of scalars), saturating at `_DEPTH_CAP`, or -1
    if it holds anything but frozen values. Iterative: any nesting costs no Python stack."""
    # Why a first pass without the stack: most arrays (message content, tool lists) hold
    # objects and scalars only, whose depths are known at once.
    inner = _children_depth(root, nested_lists=False)
    if inner >= 0:
        return inner + 1 if inner < _DEPTH_CAP else _DEPTH_CAP
    if inner == -1:
        return -1
    # The loop below is `_children_depth` with levels, inline (it runs for every item).
    deepest = 1
    pending: list[tuple[tuple[Any, ...], int]] = [(root, 1)]
    scalars = _SCALARS
    try:
        while pending:
            items, level = pending.pop()
            for item in items:
                kind = type(item)
                if kind is str:
                    if item.isascii() or _text_ok(item):
                        continue
                    return -1
                if kind in scalars:
                    continue
                if kind is FrozenDict:
                    depth = level + item._depth
                elif kind is FrozenList:
                    depth = level + 1
                    if depth >= _DEPTH_CAP:
                        return _DEPTH_CAP
                    pending.append((item, depth))
                elif kind is float and -_INF < item < _INF:
                    continue
                else:
                    return -1
                if depth > deepest:
                    deepest = depth
    except AttributeError:  # a FrozenDict never built
        return -1
    return deepest if deepest < _DEPTH_CAP else _DEPTH_CAP


def depth_of(value: Frozen) -> int:
    """The nesting depth of a frozen value: 0 for a scalar, 1 for an array or object of
    scalars, and so on (saturating above every bound). -1 when *value* is not a frozen
    value at all (see `FrozenList`)."""
    kind = type(value)
    if kind is FrozenDict:
        try:
            return value._depth  # type: ignore[union-attr]
        except AttributeError:
            return -1
    if kind is FrozenList:
        return _list_depth(value)  # type: ignore[arg-type]
    return _children_depth((value,))


class FrozenDict(Mapping[str, "Frozen"]):
    """An immutable, hashable mapping from str to frozen values. Final (V2)."""

    __slots__ = ("_data", "_depth", "_hash")

    _data: dict[str, Frozen]
    _depth: int
    _hash: int | None

    def __init_subclass__(cls, **kwargs: object) -> NoReturn:
        raise TypeError("FrozenDict cannot be subclassed (a frozen value has exactly this type)")

    def __new__(cls, data: Mapping[str, JsonLike] | None = None) -> FrozenDict:
        # Why __new__ (not __init__): the value is complete when it exists, and calling
        # __init__ again on it (a public dunder) cannot change it.
        self = object.__new__(cls)
        out: dict[str, Frozen]
        depth = 1
        if not data:
            out = {}
        elif type(data) is FrozenDict:
            try:
                out, depth = dict(data._data), data._depth
            except AttributeError:
                raise NotJsonCompatibleError("value", "a FrozenDict that was never built") from None
        elif type(data) is dict and (children := _items_depth(data)) >= 0:
            # Why: the usual case (the core's own payloads): every key an exact str and
            # every value already frozen; the dict's own copy takes them in one step.
            out, depth = data.copy(), (children + 1 if children < _DEPTH_CAP else _DEPTH_CAP)
        else:
            out = {}
            deepest = 0
            for key, item in data.items():
                if type(key) is not str:
                    if not isinstance(key, str):
                        raise NotJsonCompatibleError("value", f"key {shown(key)} is not a string")
                    key = str.__str__(key)
                if not _text_ok(key):
                    raise NotJsonCompatibleError("value", f"key {key!r}: "
                                                 f"{_surrogate_problem(key)}")
                frozen = item if _children_depth((item,)) >= 0 else _freeze(
                    item, f"value.{key}", set())
                out[key] = frozen
                deepest = max(deepest, depth_of(frozen))
            depth = min(deepest + 1, _DEPTH_CAP)
        self._data = out
        self._depth = depth
        self._hash = None
        return self

    @classmethod
    def _adopt(cls, data: dict[str, Frozen], depth: int = 0) -> FrozenDict:
        """A FrozenDict over *data* itself, whose keys (exact str) and values (frozen) the
        caller has just checked, and which nobody else holds (internal to the library).
        *depth* is its depth when the caller knows it (0: measured here)."""
        if depth <= 0:
            children = _children_depth(data.values())
            if children < 0:  # not what the caller promised: take the checking path
                return cls(data)
            depth = children + 1 if children < _DEPTH_CAP else _DEPTH_CAP
        self = object.__new__(cls)
        self._data = data
        self._depth = depth
        self._hash = None
        return self

    def __getitem__(self, key: str) -> Frozen:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    # Why: the Mapping ABC's get and __contains__ go through __getitem__ and a KeyError;
    # the plain dict answers the same (a TypeError for an unhashable key, as before).
    @overload
    def get(self, key: str, /) -> Frozen: ...

    @overload
    def get(self, key: str, /, default: Frozen | _T) -> Frozen | _T: ...

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._data.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenDict):
            return self._data == other._data
        if isinstance(other, Mapping):
            return self._data == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenDict({thaw(self)!r})"    # nested values as plain lists and dicts

    def __str__(self) -> str:
        return json.dumps(thaw(self), ensure_ascii=False)

    def __reduce__(self) -> tuple[type[FrozenDict], tuple[dict[str, Frozen]]]:
        return FrozenDict, (self._data,)

    def set(self, key: str, value: JsonLike) -> FrozenDict:
        """A copy with one key set (the value is frozen if it is not already)."""
        data = dict(self._data)
        data[key] = value
        return FrozenDict(data)


class FrozenList(tuple["Frozen", ...]):
    """An immutable JSON array. Plain tuples are *not* JSON-compatible (rule V1);
    only arrays built by `freeze` (or this constructor) have this type. Final (V2).

    Equal to a plain list with equal items, as well as to equal tuples."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: object) -> NoReturn:
        raise TypeError("FrozenList cannot be subclassed (a frozen value has exactly this type)")

    def __new__(cls, items: Iterable[JsonLike] = ()) -> FrozenList:
        values = tuple(items)
        if _children_depth(values) < 0:
            # Why a FrozenList here too: one made by tuple.__new__ may hold anything.
            values = tuple(v if _children_depth((v,)) >= 0 else _freeze(v, f"value[{i}]", set())
                           for i, v in enumerate(values))
        return super().__new__(cls, values)

    @classmethod
    def _adopt(cls, items: Iterable[Frozen]) -> FrozenList:
        """A FrozenList of *items*, which the caller has just checked are frozen (internal)."""
        return tuple.__new__(cls, items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return f"FrozenList({thaw(self)!r})"    # nested values as plain lists and dicts

    def __str__(self) -> str:
        return json.dumps(thaw(self), ensure_ascii=False)


Frozen: TypeAlias = bool | int | float | str | FrozenList | FrozenDict | None
#: What callers may pass: plain JSON (lists, dicts) or frozen values.
JsonLike: TypeAlias = Any


def freeze(value: JsonLike, path: str = "value", *, max_depth: int | None = MAX_DEPTH) -> Frozen:
    """Validate that *value* is JSON-compatible and return a frozen deep copy.

    Raises `NotJsonCompatibleError` naming the first offending path (rules V1, V23).
    Lists and `FrozenList`s are arrays; tuples, sets, bytes, NaN, infinities,
    non-string keys, strings holding a lone surrogate, cycles, nesting deeper than
    *max_depth* and other objects are refused. A frozen container is returned as it is
    when it is within the bound (a `FrozenList` whose items are not all frozen is rebuilt
    here, V2). The bound is for values entering from outside; the library passes
    ``max_depth=None`` (the envelope bound, `ENVELOPE_DEPTH`) when it freezes its own
    envelopes around values that were checked on entry (they sit a few levels deeper).
    """
    limit = ENVELOPE_DEPTH if max_depth is None else max_depth
    kind = type(value)
    # Why: a value frozen by its exact type needs no walk (and no cycle-tracking set).
    if kind is int or kind is bool or value is None:
        return value  # type: ignore[no-any-return]
    if kind is dict:
        # Why: the usual case, a dict of scalars and frozen values within the bound, is
        # copied at once (what `_freeze_dict` would do, without its calls and set).
        children = _items_depth(value)
        if 0 <= children < limit:
            return FrozenDict._adopt(value.copy(), children + 1)
        try:
            return _freeze_dict(value, path, set(), limit, checked=True)
        except RecursionError:
            raise NotJsonCompatibleError(path, "the value is nested too deeply") from None
    if kind is str:
        if value.isascii() or _text_ok(value):
            return value  # type: ignore[no-any-return]
        raise NotJsonCompatibleError(path, _surrogate_problem(value))
    if kind is FrozenDict:
        try:
            depth = value._depth
        except AttributeError:   # never built: refused below
            depth = -1
        if 0 <= depth <= limit:
            return value  # type: ignore[no-any-return]
        if depth > limit:
            raise _too_deep(path, limit)
    try:
        return _freeze(value, path, set(), limit)
    except RecursionError:
        # Why: called deep in a caller's stack, even MAX_DEPTH levels may exhaust Python's
        # recursion limit; that is still a refusal of the value, never a crash.
        raise NotJsonCompatibleError(path, "the value is nested too deeply") from None


def _freeze(value: JsonLike, path: str, active: set[int], limit: int = MAX_DEPTH) -> Frozen:
    kind = type(value)
    # Why: values that are frozen by their exact type come back as they are (as below), and
    # exact lists and dicts go straight to their branch: no walk of the subclass tests.
    if kind is int or kind is bool or value is None:
        return value  # type: ignore[no-any-return]
    if kind is dict:
        return _freeze_dict(value, path, active, limit)
    if kind is list:
        return _freeze_list(value, path, active, limit)
    if kind is FrozenDict or kind is FrozenList:
        # A frozen container counts with its whole depth where it sits (V1): *active* holds
        # the containers around it.
        depth = depth_of(value)
        if depth >= 0:
            if len(active) + depth > limit:
                raise _too_deep(path, limit)
            return value  # type: ignore[no-any-return]
        if kind is FrozenDict:
            raise NotJsonCompatibleError(path, "a FrozenDict that was never built")
        return _freeze_list(value, path, active, limit)   # rebuilt, item by item (V2)
    # Why issubclass(kind, ...) and the base classes' own methods below, never the value's:
    # a caller's subclass may override anything (even __class__), and reading a value must
    # not run the caller's code (an exception there would escape the entry point).
    if issubclass(kind, str):
        text: str = str.__str__(value)
        if text.isascii() or _text_ok(text):
            return text
        raise NotJsonCompatibleError(path, _surrogate_problem(text))
    if kind is float:
        if -_INF < value < _INF:
            return value  # type: ignore[no-any-return]
        raise NotJsonCompatibleError(path, f"{value!r} is not a finite number")
    if issubclass(kind, (int, float)):
        raise NotJsonCompatibleError(path, f"{kind.__name__} is not a JSON number")
    if issubclass(kind, list):
        return _freeze_list(value, path, active, limit)
    if issubclass(kind, dict):
        return _freeze_dict(value, path, active, limit)
    if kind is Foreign:
        raise NotJsonCompatibleError(path, value.problem())
    if kind is Unreadable:
        raise NotJsonCompatibleError(path, f"the value could not be read ({value.problem})")
    raise NotJsonCompatibleError(path, f"a {kind.__name__} is not JSON-compatible")


#: How much of a value's repr an error message shows.
_SHOWN_LENGTH: Final = 120


def shown(value: object) -> str:
    """repr(value) for an error message, cut to `_SHOWN_LENGTH` characters, or the name of
    its type when its repr raises (a caller's object may do anything, and a deeply nested
    value exhausts the stack); never raises."""
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__}"
    return text if len(text) <= _SHOWN_LENGTH else text[:_SHOWN_LENGTH - 1] + "…"


def _too_deep(path: str, limit: int = MAX_DEPTH) -> NotJsonCompatibleError:
    return NotJsonCompatibleError(path, f"arrays and objects nest more than {limit} levels "
                                        "deep")


def _freeze_list(value: list[Any] | FrozenList, path: str, active: set[int],
                 limit: int) -> FrozenList:
    if len(active) >= limit:  # *active* holds the arrays and objects around this one
        raise _too_deep(path, limit)
    # Why: a list whose items are all frozen already holds nothing to freeze and cannot
    # contain a cycle: adopt a copy as it is, if it fits within the bound.
    if type(value) is list:
        children = _children_depth(value)
        if children >= 0 and len(active) + children + 1 <= limit:
            return FrozenList._adopt(value)
        # Else the loop below names the offending item (too deep, or not frozen).
    key = id(value)
    if key in active:
        raise NotJsonCompatibleError(path, "the value contains a cycle")
    active.add(key)
    try:
        # Why a plain loop: each item is frozen here, so the list is adopted unchecked.
        items: list[Frozen] = []
        each = tuple.__iter__ if isinstance(value, tuple) else list.__iter__
        for i, item in enumerate(each(value)):  # type: ignore[arg-type]
            items.append(_freeze(item, f"{path}[{i}]", active, limit))
        return FrozenList._adopt(items)
    finally:
        active.discard(key)


def _freeze_dict(value: dict[Any, Any], path: str, active: set[int], limit: int, *,
                 checked: bool = False) -> FrozenDict:
    if len(active) >= limit:
        raise _too_deep(path, limit)
    # Why: as for lists, a dict of exact str keys and frozen values is copied as it is
    # (unless the caller has just found that it is not: *checked*).
    if type(value) is dict and not checked:
        children = _items_depth(value)
        if children >= 0 and len(active) + children + 1 <= limit:
            return FrozenDict._adopt(value.copy(), children + 1)
    key = id(value)
    if key in active:
        raise NotJsonCompatibleError(path, "the value contains a cycle")
    active.add(key)
    try:
        out: dict[str, Frozen] = {}
        deepest = 0
        for k, v in dict.items(value):
            if type(k) is not str:
                if not issubclass(type(k), str):
                    raise NotJsonCompatibleError(path, f"key {shown(k)} is not a string")
                k = str.__str__(k)
            if not (k.isascii() or _text_ok(k)):
                raise NotJsonCompatibleError(path, f"key {k!r}: {_surrogate_problem(k)}")
            frozen = _freeze(v, f"{path}.{k}", active, limit)
            out[k] = frozen
            kind = type(frozen)
            if kind is FrozenDict or kind is FrozenList:
                deepest = max(deepest, depth_of(frozen))
        return FrozenDict._adopt(out, min(deepest + 1, _DEPTH_CAP))
    finally:
        active.discard(key)


def thaw(value: Frozen) -> Any:
    """Plain JSON data (lists and dicts) from a frozen value: what ``json.dumps`` takes, and
    what to copy when you want to change it (specs/vocabulary.md V2)."""
    if isinstance(value, FrozenDict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, FrozenList):
        return [thaw(v) for v in value]
    return value


def canonical_json(value: Frozen | JsonLike) -> str:
    """Canonical JSON text: sorted keys, no spaces, non-ASCII characters kept as they are
    (not escaped); equal texts mean equal JSON values (see `same_json`)."""
    return json.dumps(thaw(value) if isinstance(value, (FrozenDict, FrozenList)) else value,
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def same_json(a: Frozen, b: Frozen) -> bool:
    """``canonical_json(a) == canonical_json(b)`` for frozen values, without encoding them.

    Canonical JSON text is equal exactly when the values have the same structure and the
    same scalars *of the same type*: ``1``, ``1.0`` and ``true`` differ, and so do ``0.0``
    and ``-0.0`` (their texts differ). Key order does not matter (the keys are sorted).
    """
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is FrozenDict:
        assert isinstance(a, FrozenDict) and isinstance(b, FrozenDict)
        mine, theirs = a._data, b._data
        if len(mine) != len(theirs):
            return False
        for key, value in mine.items():
            if key not in theirs or not same_json(value, theirs[key]):
                return False
        return True
    if kind is FrozenList:
        assert isinstance(a, FrozenList) and isinstance(b, FrozenList)
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if kind is float:
        assert isinstance(a, float) and isinstance(b, float)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b


def _plain_mapping(value: object) -> dict[str, Frozen]:
    """The JSON encoder's fallback: a FrozenDict's own plain dict (no copy)."""
    if type(value) is FrozenDict:
        return value._data
    raise TypeError(f"a {type(value).__name__} is not a frozen JSON value")


def _compact_encoder() -> Callable[[Frozen], str]:
    """Compact JSON text of a frozen value (no spaces, keys in insertion order, NaN refused)."""
    # Why: the C encoder built once and called directly costs half of `JSONEncoder.encode`,
    # which builds it again at every call; the log encodes every committed event.
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has the C accelerator
        return json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                                check_circular=False, default=_plain_mapping).encode
    chunks = make(None, _plain_mapping, json.encoder.encode_basestring, None, ":", ",",
                  False, False, False)
    join = "".join

    def encode(value: Frozen) -> str:
        return join(chunks(value, 0))

    return encode


_COMPACT = _compact_encoder()


def compact_json(value: Frozen) -> str:
    """Compact JSON text of a frozen value, for `frozen_from_json` to rebuild it exactly.

    Frozen values are acyclic and hold only JSON scalars, so the text is exact: ints stay
    ints, floats round-trip through their repr, and key order is kept.
    """
    return _COMPACT(value)


def _frozen_array(items: list[Any]) -> tuple[FrozenList, int]:
    """The FrozenList of a decoded array and its depth (its objects are frozen already)."""
    deepest = 0
    for index, item in enumerate(items):
        kind = type(item)
        if kind is list:
            items[index], depth = _frozen_array(item)
        elif kind is FrozenDict:
            depth = item._depth
        else:
            continue
        if depth > deepest:
            deepest = depth
    return FrozenList._adopt(items), min(deepest + 1, _DEPTH_CAP)


def _frozen_object(data: dict[str, Any]) -> FrozenDict:
    # Why: the decoder hands over each object innermost first, so nested objects are
    # frozen already; only arrays (which the decoder builds as lists) remain.
    deepest = 0
    for key, item in data.items():
        kind = type(item)
        if kind is list:
            data[key], depth = _frozen_array(item)
        elif kind is FrozenDict:
            depth = item._depth
        else:
            continue
        if depth > deepest:
            deepest = depth
    return FrozenDict._adopt(data, min(deepest + 1, _DEPTH_CAP))


_DECODE = json.JSONDecoder(object_hook=_frozen_object).decode


def frozen_from_json(text: str) -> Frozen:
    """The frozen value of JSON text written by `compact_json` (trusted: not re-validated)."""
    value = _DECODE(text)
    return _frozen_array(value)[0] if type(value) is list else value


def is_mapping(value: Frozen) -> bool:
    return isinstance(value, FrozenDict)


def json_default(value: object) -> Any:
    """A ``default=`` for ``json.dumps``: ``json.dumps(value, default=json_default)`` encodes
    frozen values anywhere inside *value*, and the library's values that have a JSON form
    (`Event`, `LiveEvent`, `Message`, reasons, failures, ...: their ``to_json()``). Any other
    object raises ``TypeError`` as ``json.dumps`` does (specs/vocabulary.md V2)."""
    if isinstance(value, FrozenDict):
        return thaw(value)
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return to_json()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# --------------------------------------------------------------------------
# Snapshots of values whose validation comes later (rule V6)
# --------------------------------------------------------------------------

#: The class attribute that marks an immutable value class of the library (a `Message`, an
#: `ErrorInfo`, ...): `snapshot` keeps its instances as they are.
IMMUTABLE_MARK: Final = "__turnstile_immutable__"


def immutable_value(cls: type[_T]) -> type[_T]:
    """Mark *cls* as an immutable value class (see `snapshot`) and make it final: a subclass
    could override what a frozen value promises, so defining one raises `TypeError`."""
    setattr(cls, IMMUTABLE_MARK, True)
    name = cls.__name__

    def refuse(_cls: type, /, **_kwargs: object) -> NoReturn:
        raise TypeError(f"{name} cannot be subclassed (its values are immutable snapshots)")

    cls.__init_subclass__ = classmethod(refuse)  # type: ignore[assignment]
    return cls


class Unreadable:
    """Stands for a caller's value that raised while `snapshot` read it: every validation
    refuses it, naming the problem."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem

    def __repr__(self) -> str:
        return f"<unreadable value: {self.problem}>"


class Foreign:
    """Stands, in a `snapshot`, for a caller's object that is not a JSON value (an int
    subclass, a set, bytes, any object): it keeps the object's type name and its repr as
    they were, and runs none of its code, so validating the snapshot refuses it with the
    words the object itself would have got."""

    __slots__ = ("number", "text", "type_name")

    def __init__(self, value: object) -> None:
        kind = type(value)
        self.type_name = kind.__name__
        self.number = issubclass(kind, (int, float)) and not issubclass(kind, bool)
        self.text = shown(value)

    def problem(self) -> str:
        if self.number:
            return f"{self.type_name} is not a JSON number"
        return f"a {self.type_name} is not JSON-compatible"

    def __repr__(self) -> str:
        return self.text


def snapshot(value: JsonLike) -> JsonLike:
    """A copy of *value* as it is now, detached from the caller's objects (rule V6), which a
    validation can read without running any of the caller's code.

    A JSON-compatible value (within `MAX_DEPTH`) comes back frozen, and an instance of an
    immutable library class (`immutable_value`) as it is. Any other value comes back as a
    structural copy: dicts, lists and tuples are copied (cycles kept, as cycles; subclasses
    read through the base type's own methods and copied as the base type), a `FrozenList`
    built around mutable items is copied as a `FrozenList`, a str subclass becomes a plain
    str, immutable library values and JSON scalars stay, and every other object becomes a
    `Foreign` stand-in. So a later validation reaches exactly the verdict, and words the
    problem as, it would have reached on the value at the time of the call, whatever the
    caller changes afterwards. A value that raises while it is read becomes `Unreadable`.
    """
    kind = type(value)
    if value is None or kind is int or kind is bool:   # Why: the usual completion value
        return value
    try:
        # Why inside: a class can raise when asked for an attribute (its metaclass's code).
        if kind is not dict and getattr(kind, IMMUTABLE_MARK, False):
            return value
        return freeze(value)
    except NotJsonCompatibleError:
        pass
    except Exception as error:  # a caller's object that raises when read
        return Unreadable(_describe(error))
    try:
        return _structural_copy(value)
    except Exception as error:  # as above
        return Unreadable(_describe(error))


def _describe(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # its __str__ raises too
        text = ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


#: How deep `snapshot` copies a value that is not JSON-compatible: below this nothing a
#: later validation looks at can change its verdict (it refuses the value as too deep).
_SNAPSHOT_DEPTH: Final = _DEPTH_CAP + 1
_SCALAR_LEAVES: Final = frozenset({int, bool, float, str, type(None)})


def _structural_copy(root: JsonLike) -> JsonLike:
    """The copy `snapshot` makes of a value that is not JSON-compatible (iterative for
    dicts and lists; tuples are built once their items are copied)."""
    copies: dict[int, Any] = {}
    keep: list[Any] = []          # the originals, so that their ids stay theirs meanwhile
    pending: list[tuple[Any, Any, int]] = []

    def copy_of(item: Any, level: int) -> Any:
        kind = type(item)
        if kind in _SCALAR_LEAVES or kind is FrozenDict or getattr(kind, IMMUTABLE_MARK, False):
            return item
        if issubclass(kind, str):
            return str.__str__(item)
        if kind is FrozenList and _list_depth(item) >= 0:
            return item
        if not issubclass(kind, (dict, list, tuple)):
            return Foreign(item)
        if level > _SNAPSHOT_DEPTH:
            return Foreign(item)
        known = copies.get(id(item))
        if known is not None:
            return known
        keep.append(item)
        if issubclass(kind, tuple):
            items = [copy_of(inner, level + 1) for inner in tuple.__iter__(item)]
            made_tuple = tuple.__new__(FrozenList, items) if kind is FrozenList else tuple(items)
            copies[id(item)] = made_tuple
            return made_tuple
        made: dict[Any, Any] | list[Any] = {} if issubclass(kind, dict) else []
        copies[id(item)] = made
        pending.append((item, made, level))
        return made

    result = copy_of(root, 0)
    while pending:
        original, made, level = pending.pop()
        if isinstance(made, dict):
            for key, inner in dict.items(original):
                made[copy_of(key, level + 1) if type(key) is not str else key] = \
                    copy_of(inner, level + 1)
        else:
            made.extend([copy_of(inner, level + 1) for inner in list.__iter__(original)])
    return result
