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
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeAlias

from machine.errors import NotJsonCompatibleError


def _is_frozen(value: object) -> bool:
    """True if *value* is a frozen JSON value at its top level (children are frozen by
    construction of the containers)."""
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return True
    if kind is float:
        return math.isfinite(value)  # type: ignore[arg-type]
    return isinstance(value, (FrozenDict, FrozenList))


class FrozenDict(Mapping[str, "Frozen"]):
    """An immutable, hashable mapping from str to frozen values."""

    __slots__ = ("_data", "_hash")

    def __init__(self, data: Mapping[str, JsonLike] | None = None) -> None:
        out: dict[str, Frozen] = {}
        if data:
            for key, item in data.items():
                if not isinstance(key, str):
                    raise NotJsonCompatibleError("value", f"key {key!r} is not a string")
                if type(key) is not str:
                    key = str.__str__(key)
                out[key] = item if _is_frozen(item) else _freeze(item, f"value.{key}", set())
        self._data: dict[str, Frozen] = out
        self._hash: int | None = None

    def __getitem__(self, key: str) -> Frozen:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

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
        return f"FrozenDict({self._data!r})"

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
        values = tuple(items)
        if not all(_is_frozen(v) for v in values):
            values = tuple(v if _is_frozen(v) else _freeze(v, f"value[{i}]", set())
                           for i, v in enumerate(values))
        return super().__new__(cls, values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return f"FrozenList({list(self)!r})"


Frozen: TypeAlias = bool | int | float | str | FrozenList | FrozenDict | None
#: What callers may pass: plain JSON (lists, dicts) or frozen values.
JsonLike: TypeAlias = Any


def freeze(value: JsonLike, path: str = "value") -> Frozen:
    """Validate that *value* is JSON-compatible and return a frozen deep copy.

    Raises `NotJsonCompatibleError` naming the first offending path (rule V1).
    Lists and `FrozenList`s are arrays; tuples, sets, bytes, NaN, infinities,
    non-string keys, cycles and other objects are refused.
    """
    return _freeze(value, path, set())


def _freeze(value: JsonLike, path: str, active: set[int]) -> Frozen:
    if value is None:
        return value
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
        key = id(value)
        if key in active:
            raise NotJsonCompatibleError(path, "the value contains a cycle")
        active.add(key)
        try:
            return FrozenList(_freeze(item, f"{path}[{i}]", active) for i, item in enumerate(value))
        finally:
            active.discard(key)
    if isinstance(value, dict):
        key = id(value)
        if key in active:
            raise NotJsonCompatibleError(path, "the value contains a cycle")
        active.add(key)
        try:
            out: dict[str, Frozen] = {}
            for k, v in value.items():
                if not isinstance(k, str):
                    raise NotJsonCompatibleError(path, f"key {k!r} is not a string")
                out[k] = _freeze(v, f"{path}.{k}", active)
            return FrozenDict(out)
        finally:
            active.discard(key)
    raise NotJsonCompatibleError(path, f"a {type(value).__name__} is not JSON-compatible")


def thaw(value: Frozen) -> Any:
    """Plain JSON data (lists and dicts) from a frozen value."""
    if isinstance(value, FrozenDict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, FrozenList):
        return [thaw(v) for v in value]
    return value


def canonical_json(value: Frozen | JsonLike) -> str:
    """Canonical JSON text: sorted keys, no spaces (used to compare headers)."""
    return json.dumps(thaw(value) if isinstance(value, (FrozenDict, FrozenList)) else value,
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def is_mapping(value: Frozen) -> bool:
    return isinstance(value, FrozenDict)
