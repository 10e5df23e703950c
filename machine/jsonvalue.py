"""Frozen JSON values (rules V1, V2).

Every value the library stores is a *frozen JSON value*: ``None``, ``bool``,
``int``, finite ``float``, ``str``, a `FrozenList` of frozen values, or a
`FrozenDict` with ``str`` keys. `freeze` validates a caller's value (JSON
compatibility, rule V1) and returns a deep immutable snapshot (rule V2);
`thaw` turns a frozen value back into plain lists and dicts.

`FrozenDict` and `FrozenList` keep their contents frozen whoever builds them:
their constructors freeze (and so validate) any child that is not already
frozen. `freeze` can therefore trust an existing frozen container as is.
Both compare equal to plain dicts and lists with the same JSON content.
"""

from __future__ import annotations

import json
import json.encoder
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, TypeAlias, TypeVar, overload

from machine.errors import NotJsonCompatibleError

_T = TypeVar("_T")


def _is_frozen(value: object) -> bool:
    """True if *value* is a frozen JSON value at its top level (children are frozen by
    construction of the containers)."""
    kind = type(value)
    # Why: exact-type tests first (the common case, no isinstance walk); same answers.
    if kind is str or kind is int or kind is FrozenDict or kind is FrozenList or value is None \
            or kind is bool:
        return True
    if kind is float:
        return math.isfinite(value)  # type: ignore[arg-type]
    return isinstance(value, (FrozenDict, FrozenList))


def _all_frozen_values(items: list[Any]) -> bool:
    """True if every item of *items* is frozen (`_is_frozen`)."""
    frozen_types = _FROZEN_TYPES
    for item in items:  # noqa: SIM110 - a plain loop is faster than all() over a generator
        if type(item) not in frozen_types and not _is_frozen(item):
            return False
    return True


def _all_frozen_items(data: dict[Any, Any]) -> bool:
    """True if every key of *data* is an exact str and every value is frozen (`_is_frozen`)."""
    frozen_types = _FROZEN_TYPES
    for key, item in data.items():
        if type(key) is not str or (type(item) not in frozen_types and not _is_frozen(item)):
            return False
    return True


class FrozenDict(Mapping[str, "Frozen"]):
    """An immutable, hashable mapping from str to frozen values."""

    __slots__ = ("_data", "_hash")

    def __init__(self, data: Mapping[str, JsonLike] | None = None) -> None:
        out: dict[str, Frozen] = {}
        if data:
            if type(data) is FrozenDict:
                # Why: a FrozenDict's keys and values were checked and frozen when it was
                # built; copying its plain dict gives the same contents without re-checking.
                out = dict(data._data)
            elif type(data) is dict and _all_frozen_items(data):
                # Why: the usual case (the core's own payloads): every key an exact str and
                # every value already frozen, so the general loop below would copy the pairs
                # unchanged; the dict's own copy does that in one step.
                out = data.copy()
            else:
                for key, item in data.items():
                    if type(key) is not str:
                        if not isinstance(key, str):
                            raise NotJsonCompatibleError("value", f"key {key!r} is not a string")
                        key = str.__str__(key)
                    out[key] = item if _is_frozen(item) else _freeze(item, f"value.{key}", set())
        self._data: dict[str, Frozen] = out
        self._hash: int | None = None

    @classmethod
    def _adopt(cls, data: dict[str, Frozen]) -> FrozenDict:
        """A FrozenDict over *data* itself, whose keys (exact str) and values (frozen) the
        caller has just checked, and which nobody else holds (internal to this module)."""
        self = cls.__new__(cls)
        self._data = data
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

    def set(self, key: str, value: JsonLike) -> FrozenDict:
        """A copy with one key set (the value is frozen if it is not already)."""
        data = dict(self._data)
        data[key] = value
        return FrozenDict(data)


class FrozenList(tuple["Frozen", ...]):
    """An immutable JSON array. Plain tuples are *not* JSON-compatible (rule V1);
    only arrays built by `freeze` (or this constructor) have this type.

    Equal to a plain list with equal items, as well as to equal tuples."""

    __slots__ = ()

    def __new__(cls, items: Iterable[JsonLike] = ()) -> FrozenList:
        if type(items) is FrozenList:  # Why: frozen by construction; nothing to check
            return super().__new__(cls, items)
        values = tuple(items)
        for v in values:  # Why: a plain loop, not a generator (same test, same order)
            if not _is_frozen(v):
                values = tuple(v if _is_frozen(v) else _freeze(v, f"value[{i}]", set())
                               for i, v in enumerate(values))
                break
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
#: The exact types whose every value is frozen (floats are frozen only when finite).
_FROZEN_TYPES: frozenset[type] = frozenset({str, int, bool, type(None), FrozenDict, FrozenList})
#: What callers may pass: plain JSON (lists, dicts) or frozen values.
JsonLike: TypeAlias = Any


#: Arrays and objects nested deeper than this are not JSON-compatible (rule V1).
MAX_DEPTH: Final = 128
_UNBOUNDED: Final = 1 << 62


def freeze(value: JsonLike, path: str = "value", *, max_depth: int | None = MAX_DEPTH) -> Frozen:
    """Validate that *value* is JSON-compatible and return a frozen deep copy.

    Raises `NotJsonCompatibleError` naming the first offending path (rule V1).
    Lists and `FrozenList`s are arrays; tuples, sets, bytes, NaN, infinities,
    non-string keys, cycles, nesting deeper than *max_depth* and other objects
    are refused. The depth bound is for values entering from outside; the library
    passes ``max_depth=None`` when it re-freezes its own envelopes around values that
    were checked on entry (they may sit a few levels deeper).
    """
    kind = type(value)
    # Why: a value frozen by its exact type needs no walk (and no cycle-tracking set).
    if kind is str or kind is int or kind is FrozenDict or kind is FrozenList or value is None \
            or kind is bool:
        return value  # type: ignore[no-any-return]
    try:
        return _freeze(value, path, set(), _UNBOUNDED if max_depth is None else max_depth)
    except RecursionError:
        # Why: called deep in a caller's stack, even MAX_DEPTH levels may exhaust Python's
        # recursion limit; that is still a refusal of the value, never a crash.
        raise NotJsonCompatibleError(path, "the value is nested too deeply") from None


def _freeze(value: JsonLike, path: str, active: set[int], limit: int = MAX_DEPTH) -> Frozen:
    kind = type(value)
    # Why: values that are frozen by their exact type come back as they are (as below), and
    # exact lists and dicts go straight to their branch: no walk of the isinstance chain.
    if kind is str or kind is int or kind is FrozenDict or kind is FrozenList or value is None \
            or kind is bool:
        return value  # type: ignore[no-any-return]
    if kind is dict:
        return _freeze_dict(value, path, active, limit)
    if kind is list:
        return _freeze_list(value, path, active, limit)
    if isinstance(value, str):
        return value if type(value) is str else str.__str__(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if type(value) is not int:
            raise NotJsonCompatibleError(path, f"{type(value).__name__} is not a JSON number")
        return value
    if isinstance(value, float):
        if type(value) is not float:
            raise NotJsonCompatibleError(path, f"{type(value).__name__} is not a JSON number")
        if not math.isfinite(value):
            raise NotJsonCompatibleError(path, f"{value!r} is not a finite number")
        return value
    if isinstance(value, (FrozenDict, FrozenList)):
        return value  # frozen by construction: already validated and immutable
    if isinstance(value, list):
        return _freeze_list(value, path, active, limit)
    if isinstance(value, dict):
        return _freeze_dict(value, path, active, limit)
    raise NotJsonCompatibleError(path, f"a {type(value).__name__} is not JSON-compatible")


def _too_deep(path: str) -> NotJsonCompatibleError:
    return NotJsonCompatibleError(path, f"arrays and objects nest more than {MAX_DEPTH} levels "
                                        "deep")


def _freeze_list(value: list[Any], path: str, active: set[int], limit: int) -> FrozenList:
    if len(active) >= limit:  # *active* holds the arrays and objects around this one
        raise _too_deep(path)
    # Why: a list whose items are all frozen already holds nothing to freeze and cannot
    # contain a cycle: adopt a copy as it is.
    if type(value) is list and _all_frozen_values(value):
        return FrozenList._adopt(value)
    key = id(value)
    if key in active:
        raise NotJsonCompatibleError(path, "the value contains a cycle")
    active.add(key)
    try:
        # Why: a plain loop; each item is frozen here, so the list is adopted unchecked.
        items: list[Frozen] = []
        for i, item in enumerate(value):
            items.append(_freeze(item, f"{path}[{i}]", active, limit))
        return FrozenList._adopt(items)
    finally:
        active.discard(key)


def _freeze_dict(value: dict[Any, Any], path: str, active: set[int], limit: int) -> FrozenDict:
    if len(active) >= limit:
        raise _too_deep(path)
    # Why: as for lists, a dict of exact str keys and frozen values is copied as it is.
    if type(value) is dict and _all_frozen_items(value):
        return FrozenDict._adopt(value.copy())
    key = id(value)
    if key in active:
        raise NotJsonCompatibleError(path, "the value contains a cycle")
    active.add(key)
    try:
        out: dict[str, Frozen] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise NotJsonCompatibleError(path, f"key {k!r} is not a string")
            out[k] = _freeze(v, f"{path}.{k}", active, limit)
        return FrozenDict(out)
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


def _frozen_array(items: list[Any]) -> FrozenList:
    return FrozenList._adopt([_frozen_array(item) if type(item) is list else item
                              for item in items])


def _frozen_object(data: dict[str, Any]) -> FrozenDict:
    # Why: the decoder hands over each object innermost first, so nested objects are
    # frozen already; only arrays (which the decoder builds as lists) remain.
    for key, item in data.items():
        if type(item) is list:
            data[key] = _frozen_array(item)
    return FrozenDict._adopt(data)


_DECODE = json.JSONDecoder(object_hook=_frozen_object).decode


def frozen_from_json(text: str) -> Frozen:
    """The frozen value of JSON text written by `compact_json` (trusted: not re-validated)."""
    value = _DECODE(text)
    return _frozen_array(value) if type(value) is list else value


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
