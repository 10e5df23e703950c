"""Snapshots of a core (rule R4.12): the whole state as a value, restored without replay.

Everything a core's future depends on is an attribute of `CoreState` (R4), the loop's
position included (its frames, R4.10), so a copy of those attributes is a copy of the
core. `duplicate_state` makes one in O(state): immutable values (frozen JSON, messages,
errors, outputs, frozen records, phases) are shared, mutable records (frames, batches,
calls, controllers, cancel scopes, machines, queues) are copied once each, so objects that
two parts of the state share stay shared in the copy. The session log is taken by
position (`SessionLog.mark`, L15) and forked (`SessionLog.fork`) only when a core is made.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import types
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from machine.core.loop import _Done
from machine.core.records import Wait
from machine.log import LogMark, SessionLog
from machine.machines import Inbox, Lifecycle, Outbox, Window

if TYPE_CHECKING:
    from machine.core.state import CoreState

#: Attributes of a core that never change its future and are shared by its copies: its
#: configuration, id minting and log (the log is forked separately).
STATIC_ATTRIBUTES: Final = frozenset({"config", "_mint", "log"})

_SCALARS: Final = frozenset({type(None), bool, int, float, str, bytes, tuple, frozenset,
                             types.FunctionType, types.BuiltinFunctionType})
#: Classes whose instances are never changed once made (decided once per class).
_shared_classes: dict[type, bool] = {}


def _is_shared(kind: type) -> bool:
    shared = _shared_classes.get(kind)
    if shared is None:
        params = getattr(kind, "__dataclass_params__", None)
        shared = _shared_classes[kind] = (
            kind in _SCALARS or issubclass(kind, BaseException)
            # A frozen record of the core's own may hold mutable ones (a cancel notice holds
            # its scope): copied. Frozen values of the vocabulary, io and events are shared.
            or (params is not None and params.frozen and not kind.__module__.startswith(
                "machine.core"))
            or kind.__module__ == "machine.jsonvalue"        # FrozenDict, FrozenList
            or kind in (Wait, _Done) or kind.__name__ == "_Prefix")
    return shared


#: Copier = a function (value, memo) -> its copy, registered in memo by the value's id.
_Copier = Callable[[Any, dict[int, Any]], Any]
#: How each class's instances are copied: None when they are shared (`_is_shared`), else
#: its copier (`_copier_of`). Decided once per class.
_COPIERS: dict[type, _Copier | None] = dict.fromkeys(_SCALARS)
#: A class not decided yet (a `_COPIERS.get` default).
_UNDECIDED: Final[Any] = object()


def duplicate(value: Any, memo: dict[int, Any]) -> Any:
    """A copy of *value* that shares what is immutable and copies each mutable object once
    (*memo*, by identity). `TypeError` for a kind of object the core does not hold, so that
    a new kind of state cannot be shared by accident."""
    copier = _COPIERS.get(value.__class__, _UNDECIDED)
    if copier is _UNDECIDED:
        copier = _copier_of(value.__class__)
    if copier is None:
        return value
    found = memo.get(id(value))
    if found is not None:
        return found
    return copier(value, memo)


def _copier_of(kind: type) -> _Copier | None:
    copier: _Copier | None
    if _is_shared(kind):
        copier = None
    elif kind is list:
        copier = _copy_list
    elif kind is dict:
        copier = _copy_dict
    elif kind is deque:
        copier = _copy_deque
    elif kind is set:
        copier = _copy_set
    elif kind in (Inbox, Outbox, Window, Lifecycle):
        copier = _copy_machine
    elif dataclasses.is_dataclass(kind):
        copier = _record_copier(kind)
    else:
        copier = _refuse
    _COPIERS[kind] = copier
    return copier


def _copy_list(value: list[Any], memo: dict[int, Any]) -> list[Any]:
    copiers, undecided = _COPIERS, _UNDECIDED
    copied: list[Any] = []
    memo[id(value)] = copied
    copied.extend([item if copiers.get(item.__class__, undecided) is None
                   else duplicate(item, memo) for item in value])
    return copied


def _copy_dict(value: dict[Any, Any], memo: dict[int, Any]) -> dict[Any, Any]:
    copiers, undecided = _COPIERS, _UNDECIDED
    copied: dict[Any, Any] = {}
    memo[id(value)] = copied
    copied.update({key: item if copiers.get(item.__class__, undecided) is None
                   else duplicate(item, memo) for key, item in value.items()})
    return copied


def _copy_deque(value: deque[Any], memo: dict[int, Any]) -> deque[Any]:
    copiers, undecided = _COPIERS, _UNDECIDED
    copied: deque[Any] = deque()
    memo[id(value)] = copied
    copied.extend([item if copiers.get(item.__class__, undecided) is None
                   else duplicate(item, memo) for item in value])
    return copied


def _copy_set(value: set[Any], memo: dict[int, Any]) -> set[Any]:
    copied = memo[id(value)] = set(value)       # sets hold ids and names only
    return copied


def _copy_machine(value: Inbox | Outbox | Window | Lifecycle, memo: dict[int, Any]) -> Any:
    copied = memo[id(value)] = value.copy()
    return copied


def _refuse(value: Any, memo: dict[int, Any]) -> Any:
    raise TypeError(f"a core holds no {type(value).__qualname__}: cannot copy it")


def _record_copier(kind: type) -> _Copier:
    """The copier of a mutable record (a dataclass): a new instance whose fields are the
    fields' copies. Why generated code, as `dataclasses` makes its methods: copying is most
    of what a state costs the explorer, and a field read and stored by name costs a fraction
    of a loop over `getattr` and `object.__setattr__`."""
    names = tuple(f.name for f in dataclasses.fields(kind))
    if not all(name.isidentifier() for name in names):   # cannot be spelt: the plain loop
        return functools.partial(_copy_record, names=names)
    lines = ["def copy(value, memo):", "    copied = new(kind)", "    memo[id(value)] = copied"]
    frozen = kind.__dataclass_params__.frozen  # type: ignore[attr-defined]
    for name in names:
        copied_item = "item if copiers.get(item.__class__, undecided) is None " \
                      "else duplicate(item, memo)"
        lines.append(f"    item = value.{name}")
        lines.append(f"    store(copied, {name!r}, {copied_item})" if frozen
                     else f"    copied.{name} = {copied_item}")
    lines.append("    return copied")
    namespace: dict[str, Any] = {"new": object.__new__, "kind": kind, "store": object.__setattr__,
                                 "copiers": _COPIERS, "undecided": _UNDECIDED,
                                 "duplicate": duplicate}
    exec("\n".join(lines), namespace)   # the field names of the core's own records
    copier: _Copier = namespace["copy"]
    return copier


def _copy_record(value: Any, memo: dict[int, Any], *, names: tuple[str, ...]) -> Any:
    copied = memo[id(value)] = object.__new__(type(value))
    for name in names:
        object.__setattr__(copied, name, duplicate(getattr(value, name), memo))
    return copied


def duplicate_state(source: CoreState, target: CoreState, log: SessionLog) -> None:
    """Give *target* (a bare instance, not initialised) a copy of *source*'s state over
    *log*."""
    memo: dict[int, Any] = {}
    attributes = vars(target)
    attributes.update(vars(source))     # then each attribute not shared is replaced by a copy
    copiers, undecided = _COPIERS, _UNDECIDED
    for name, value in attributes.items():
        if copiers.get(value.__class__, undecided) is not None and name not in STATIC_ATTRIBUTES:
            attributes[name] = duplicate(value, memo)
    attributes["log"] = log


_ADDRESS: Final = re.compile(r" at 0x[0-9a-fA-F]+")


def canonical(value: Any, ids: dict[str, str] | None) -> object:
    """A value built of tuples, strings and numbers that is equal for two states exactly
    when they are equal as data. With *ids*, every message id met is renamed to its order of
    first appearance (symmetry: messages are told apart only by identity)."""
    kind = value.__class__
    if value is None or kind in (bool, int, float, str):
        return value
    if kind in (list, tuple, deque):
        return (kind.__name__, tuple(canonical(item, ids) for item in value))
    if kind in (set, frozenset):
        return (kind.__name__, tuple(sorted(repr(canonical(item, ids))
                                            for item in value)))
    if kind is dict:
        return ("dict", tuple((repr(key), canonical(item, ids))
                              for key, item in value.items()))
    if kind in (Inbox, Outbox, Window, Lifecycle):
        return (kind.__name__, tuple((name, canonical(getattr(value, name), ids))
                                     for name in kind.__slots__))
    if isinstance(value, (types.FunctionType, types.MethodType)):
        return value.__qualname__                       # a phase, by name
    if ids is not None and kind.__name__ == "Message":
        renamed = ids.setdefault(value.id, f"#{len(ids)}")
        return ("Message", renamed, canonical(dataclasses.replace(value, id="#"), None))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (kind.__name__, tuple((field.name, canonical(getattr(value, field.name), ids))
                                     for field in dataclasses.fields(value)))
    if isinstance(value, BaseException):
        return (kind.__name__, repr(value.args), tuple(
            (name, canonical(item, ids))
            for name, item in sorted(vars(value).items())))
    text = _ADDRESS.sub("", repr(value))
    if ids is not None:                                 # message mappings in frozen JSON
        text = _rename_in_text(text, ids)
    return text


_QUOTED_ID: Final = re.compile(r"'id': '((?:[^'\\]|\\.)*)'")


def _rename_in_text(text: str, ids: dict[str, str]) -> str:
    def rename(match: re.Match[str]) -> str:
        return f"'id': '{ids.setdefault(match.group(1), f'#{len(ids)}')}'"
    return _QUOTED_ID.sub(rename, text)


def state_parts(state: CoreState, ids: dict[str, str] | None = None) -> tuple[object, ...]:
    """Everything the future of *state* depends on, but its log, canonical (`canonical`;
    with *ids*, message ids renamed)."""
    return tuple((name, canonical(value, ids)) for name, value in sorted(vars(state).items())
                 if name not in STATIC_ATTRIBUTES)


def log_parts(log: SessionLog, mark: LogMark,
              ids: dict[str, str] | None = None) -> tuple[object, ...]:
    """The events of *log* up to *mark*, as what a future depends on: types, data, surface
    operations and sources (not their times, which the clock decides); with *ids*, the ids
    in their data renamed as `canonical` renames them."""
    events = log.events[:mark.length]
    if ids is None:
        return tuple((event.type, log.data_json(event.seq), repr(event.surface_op),
                      repr(event.source_event_seqs)) for event in events)
    return tuple((event.type, _rename_in_json(log.data_json(event.seq), ids),
                  repr(event.surface_op), repr(event.source_event_seqs)) for event in events)


_JSON_ID: Final = re.compile(r'"id":"((?:[^"\\]|\\.)*)"')


def _rename_in_json(text: str, ids: dict[str, str]) -> str:
    def rename(match: re.Match[str]) -> str:
        return f'"id":"{ids.setdefault(match.group(1), f"#{len(ids)}")}"'
    return _JSON_ID.sub(rename, text)
