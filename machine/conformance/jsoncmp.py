"""Strict JSON comparison for conformance checks (specs/conformance/PROTOCOL.md §Comparison).

Two JSON values are *the same* when they have the same structure and the
same scalars, where ``true``/``false`` never equal a number (Python's
``True == 1`` is not JSON's), numbers compare by value (``1`` and ``1.0``
are the same number in JSON), and object key order does not matter.

Some fields are worded by the implementation (for example the text of a
validation failure the core synthesises). A vector marks them *loose*: a
map from a JSON Pointer (RFC 6901) into the output to a required prefix; the
actual value there only has to be a string that starts with the prefix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from machine.jsonvalue import Frozen, FrozenDict, FrozenList

__all__ = ["Difference", "Path", "Pointer", "first_difference", "parse_pointer", "pointer",
           "render", "resolve", "same", "same_frozen"]

Path: TypeAlias = tuple[str | int, ...]
Pointer: TypeAlias = str
#: Loose fields: path -> required string prefix.
Loose: TypeAlias = Mapping[Path, str]

_NUMBER: Final = (int, float)


def same(a: Any, b: Any) -> bool:
    """Strict JSON equality (see the module docstring)."""
    ta = type(a)
    if ta is dict:
        if type(b) is not dict or len(a) != len(b):
            return False
        return all(key in b and same(value, b[key]) for key, value in a.items())
    if ta is list:
        if type(b) is not list or len(a) != len(b):
            return False
        return all(same(x, y) for x, y in zip(a, b, strict=True))
    if ta is str or a is None:
        return type(b) is ta and a == b
    if ta is bool:
        return type(b) is bool and a is b
    if ta is int or ta is float:
        return (type(b) is int or type(b) is float) and a == b
    return bool(a == b)  # pragma: no cover - only JSON values reach here


@dataclass(frozen=True, slots=True)
class Difference:
    """Where two outputs first differ and how."""

    path: Path
    problem: str

    def __str__(self) -> str:
        return f"at {pointer(self.path) or '/'}: {self.problem}"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, _NUMBER):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__  # pragma: no cover


def render(value: Any, limit: int = 200) -> str:
    """Compact JSON text of *value*, shortened to about *limit* characters."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=False)
    except (TypeError, ValueError):  # pragma: no cover - not JSON
        text = repr(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def first_difference(expected: Any, actual: Any, loose: Loose | None = None,
                     path: Path = ()) -> Difference | None:
    """The first difference between *expected* and *actual* in document order, or None."""
    if loose and path in loose:
        prefix = loose[path]
        if not isinstance(actual, str):
            return Difference(path, f"expected a string (implementation-worded), got {_kind(actual)}")
        if not actual.startswith(prefix):
            return Difference(path, f"expected a string starting with {render(prefix)}, "
                                    f"got {render(actual)}")
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return Difference(path, f"expected an object, got {_kind(actual)} {render(actual, 80)}")
        for key, value in expected.items():
            if key not in actual:
                return Difference((*path, key), f"missing (expected {render(value, 80)})")
            found = first_difference(value, actual[key], loose, (*path, key))
            if found is not None:
                return found
        for key in actual:
            if key not in expected:
                return Difference((*path, key), f"unexpected field (got {render(actual[key], 80)})")
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return Difference(path, f"expected an array, got {_kind(actual)} {render(actual, 80)}")
        for index, (x, y) in enumerate(zip(expected, actual, strict=False)):
            found = first_difference(x, y, loose, (*path, index))
            if found is not None:
                return found
        if len(expected) != len(actual):
            return Difference(path, f"expected {len(expected)} item(s), got {len(actual)}")
        return None
    if same(expected, actual):
        return None
    return Difference(path, f"expected {render(expected, 80)}, got {render(actual, 80)}")


# --------------------------------------------------------------------------
# JSON Pointer (RFC 6901)
# --------------------------------------------------------------------------


def pointer(path: Path) -> Pointer:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def parse_pointer(text: Pointer) -> tuple[str, ...]:
    """The reference tokens of a JSON Pointer; raises ValueError if it is not one."""
    if text == "":
        return ()
    if not text.startswith("/"):
        raise ValueError("a JSON Pointer starts with '/'")
    parts = text[1:].split("/")
    for part in parts:
        stripped = part.replace("~0", "").replace("~1", "")
        if "~" in stripped:
            raise ValueError(f"bad escape in {part!r} (only ~0 and ~1 are allowed)")
    return tuple(p.replace("~1", "/").replace("~0", "~") for p in parts)


def resolve(value: Any, tokens: tuple[str, ...]) -> Path | None:
    """The typed path of *tokens* inside *value* (array indices as ints), or None if absent."""
    path: list[str | int] = []
    current = value
    for token in tokens:
        if isinstance(current, dict):
            if token not in current:
                return None
            path.append(token)
            current = current[token]
        elif isinstance(current, list):
            if not token.isdigit() or int(token) >= len(current) or (token != "0" and token[0] == "0"):
                return None
            path.append(int(token))
            current = current[int(token)]
        else:
            return None
    return tuple(path)


# --------------------------------------------------------------------------
# Frozen (core) values against plain JSON, without thawing
# --------------------------------------------------------------------------


def same_frozen(a: Frozen, b: Any) -> bool:
    """`same(thaw(a), b)` for a frozen value *a*, in one walk and without copying."""
    if isinstance(a, FrozenDict):
        if type(b) is not dict or len(a) != len(b):
            return False
        data: dict[str, Frozen] = a._data  # the plain dict inside: no Mapping-ABC overhead
        for key, value in data.items():
            other = b.get(key, _MISSING)
            kind = type(value)
            if kind is str:
                if type(other) is not str or value != other:
                    return False
            elif kind is int:
                if (type(other) is not int and type(other) is not float) or value != other:
                    return False
            elif not same_frozen(value, other):
                return False
        return True
    if isinstance(a, FrozenList):
        if type(b) is not list or len(a) != len(b):
            return False
        return all(same_frozen(x, y) for x, y in zip(a, b, strict=True))
    kind = type(a)
    if kind is str or a is None:
        return type(b) is kind and a == b
    if kind is bool:
        return type(b) is bool and a is b
    if kind is int or kind is float:
        return (type(b) is int or type(b) is float) and a == b
    return False


_MISSING: Final = object()
