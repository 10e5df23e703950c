"""Durable session events and live notifications (spec §E: rules E1–E4).

A durable event has the envelope ``{type, seq, time, data, surfaceOp?,
sourceEventSeqs?}`` (rule E1). Four types are *surface* types: they carry a
message into the derived history and must carry ``surfaceOp`` (rule E2).
Live notifications (rule E3) are not durable; they carry a type and a payload.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

from machine.errors import CodecError, ValidationError
from machine.jsonvalue import (
    Frozen,
    FrozenDict,
    FrozenList,
    JsonLike,
    compact_json,
    freeze,
    frozen_from_json,
    immutable_value,
    plain_text,
    thaw,
)
from machine.payloads import (
    SURFACE_MESSAGE,
    DurableData,
    ExtensionData,
    LiveData,
    V,
    durable_view,
    live_view,
    view_as,
)
from machine.vocabulary import Message

# Durable event types of the core catalog (rule E1).
TURN_START: Final = "turn/start"
TURN_END: Final = "turn/end"
STEP_START: Final = "step/start"
STEP_END: Final = "step/end"
USER_MESSAGE: Final = "user/message"
STEERING_MESSAGE: Final = "steering/message"
ASSISTANT_CHUNK: Final = "assistant/chunk"
ASSISTANT_MESSAGE: Final = "assistant/message"
TOOL_CALL: Final = "tool/call"
TOOL_RESULT: Final = "tool/result"
TODO_WRITE: Final = "todo/write"
REQUEST_HEADER: Final = "request/header"

CORE_EVENT_TYPES: Final = frozenset({
    TURN_START, TURN_END, STEP_START, STEP_END, USER_MESSAGE, STEERING_MESSAGE,
    ASSISTANT_CHUNK, ASSISTANT_MESSAGE, TOOL_CALL, TOOL_RESULT, TODO_WRITE, REQUEST_HEADER,
})
SURFACE_TYPES: Final = frozenset({USER_MESSAGE, ASSISTANT_MESSAGE, TOOL_RESULT, STEERING_MESSAGE})

# Live notification types (rule E3).
STATUS: Final = "agent/status"
INBOX_ENQUEUE: Final = "agent/inbox/enqueue"
INBOX_DEQUEUE: Final = "agent/inbox/dequeue"
INBOX_DISCARD: Final = "agent/inbox/discard"
CONTEXT_DISCARD: Final = "agent/context/discard"
CANCEL_REQUESTED: Final = "agent/cancel-requested"
SETTLED: Final = "agent/settled"
ERROR: Final = "agent/error"
WARNING: Final = "agent/warning"
SESSION_START: Final = "agent/session-start"
AGENT_CREATED: Final = "agent/created"
AGENT_DISPOSED: Final = "agent/disposed"
SESSION_CREATED: Final = "session/created"
SESSION_DISPOSED: Final = "session/disposed"

LIVE_TYPES: Final = frozenset({
    STATUS, INBOX_ENQUEUE, INBOX_DEQUEUE, INBOX_DISCARD, CONTEXT_DISCARD, CANCEL_REQUESTED,
    SETTLED, ERROR, WARNING, SESSION_START, AGENT_CREATED, AGENT_DISPOSED, SESSION_CREATED,
    SESSION_DISPOSED,
})

APPEND: Final = "append"


def surface_op_problem(op: Frozen) -> str | None:
    """Rule E2: 'append' or {op:'replace', start, end} with 0 <= start <= end."""
    if op == APPEND:
        return None
    if isinstance(op, FrozenDict) and set(op) == {"op", "start", "end"} and op["op"] == "replace":
        start, end = op["start"], op["end"]
        if (type(start) is int and type(end) is int and 0 <= start <= end):
            return None
    return "surfaceOp must be 'append' or {op:'replace', start, end} with 0 <= start <= end"


def _rebase_codec(exc: ValidationError, default: str, path: str) -> CodecError:
    where = exc.path
    if where == default or where.startswith((default + ".", default + "[")):
        where = path + where[len(default):]
    return CodecError(where, exc.problem)


@immutable_value
@dataclass(frozen=True, slots=True)
class Event:
    """One committed durable session event (rule E1). Immutable.

    Construction checks the envelope's *shape* only (field types) and
    snapshots ``data``, ``surface_op`` and ``source_event_seqs``; the session
    invariants (seq = index, surfaceOp exactly on surface types, enclosure)
    are the log's job.
    """

    type: str
    seq: int
    time: int | float
    data: FrozenDict
    surface_op: Frozen = None
    source_event_seqs: FrozenList | None = None
    #: D16: its writer says a build that does not read this (extension) type may resume the
    #: session all the same; the log refuses it on a core type (L3).
    ignorable: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type:
            raise ValidationError("event.type", "must be a non-empty string")
        if type(self.type) is not str or not self.type.isascii():   # V23
            object.__setattr__(self, "type", plain_text(self.type, "event.type"))
        if type(self.seq) is not int or self.seq < 0:
            raise ValidationError("event.seq", "must be a non-negative integer")
        time = self.time
        kind = type(time)
        # Why: an exact int, or an exact finite float, passes; anything else takes the full test.
        if kind is not int and (kind is not float or not math.isfinite(time)) and (
                isinstance(time, bool) or not isinstance(time, (int, float))
                or not math.isfinite(time)):
            raise ValidationError("event.time", "must be a finite number (epoch milliseconds)")
        # Why: a FrozenDict (exact type) is frozen by construction, and freeze would return it
        # unchanged: skip the call. Other values are snapshotted and checked as before.
        if type(self.data) is not FrozenDict:
            data = freeze(self.data, "event.data", max_depth=None)  # envelope (V1)
            if not isinstance(data, FrozenDict):
                raise ValidationError("event.data", "must be a mapping")
            object.__setattr__(self, "data", data)
        op = self.surface_op
        if op is not None and type(op) is not str:  # None and str are frozen as they are
            object.__setattr__(self, "surface_op", freeze(op, "event.surfaceOp"))
        if self.source_event_seqs is not None:
            seqs: Frozen = self.source_event_seqs
            if type(seqs) is not FrozenList:
                seqs = freeze(seqs, "event.sourceEventSeqs")
            # Why map(type): one C-level pass instead of a generator over the entries.
            if not isinstance(seqs, FrozenList) or not set(map(type, seqs)) <= _INT_ONLY:
                raise ValidationError("event.sourceEventSeqs", "must be a list of integers")
            object.__setattr__(self, "source_event_seqs", seqs)
        if self.ignorable is not False and self.ignorable is not True:
            raise ValidationError("event.ignorable", f"must be a bool, not {self.ignorable!r}")

    @property
    def is_surface(self) -> bool:
        return self.type in SURFACE_TYPES

    # -- typed reading of the data (E5); the data itself is the reference's shape (E1) ----

    @property
    def view(self) -> DurableData | ExtensionData:
        """The data as the typed view of this event's type (`machine.payloads`), e.g.
        `TurnEndData`; `ExtensionData` for an extension type. Decoded at each access."""
        return durable_view(self.type, self.data)

    def data_as(self, view: builtins.type[V]) -> V:
        """The data as *view* (``event.data_as(TurnEndData).reason``); `ValidationError` if
        this event is of another type."""
        return view_as(view, self.type, self.data, "data")

    @property
    def message(self) -> Message:
        """The message a surface event carries — the data itself for ``user/message``,
        ``data.message`` for ``steering/message``, ``assistant/message`` and
        ``tool/result``; `ValidationError` for any other type (check `is_surface`)."""
        if self.type not in SURFACE_MESSAGE:
            raise ValidationError("event.message", f"a {self.type!r} event carries no message "
                                  "(user/message, steering/message, assistant/message and "
                                  "tool/result do)")
        key = SURFACE_MESSAGE[self.type]
        if key is None:
            return Message.from_json(self.data, "event.data")
        return Message.from_json(self.data.get(key), f"event.data.{key}")

    def __repr__(self) -> str:
        extra = ""
        if self.surface_op is not None:
            extra += f", surface_op={thaw(self.surface_op)!r}"
        if self.source_event_seqs is not None:
            extra += f", source_event_seqs={list(self.source_event_seqs)!r}"
        if self.ignorable:
            extra += ", ignorable=True"
        return (f"Event(seq={self.seq}, type={self.type!r}, data={thaw(self.data)!r}{extra}, "
                f"time={self.time!r})")

    def to_json(self, *, with_time: bool = True) -> dict[str, JsonLike]:
        out: dict[str, JsonLike] = {"type": self.type, "seq": self.seq}
        if with_time:
            out["time"] = self.time
        out["data"] = thaw(self.data)
        if self.surface_op is not None:
            out["surfaceOp"] = thaw(self.surface_op)
        if self.source_event_seqs is not None:
            out["sourceEventSeqs"] = list(self.source_event_seqs)
        if self.ignorable:
            out["ignorable"] = True
        return out

    @classmethod
    def from_json(cls, value: JsonLike, path: str = "event") -> Event:
        """Decode the JSON form; shape only (the session invariants are the log's job)."""
        if not isinstance(value, dict):
            raise CodecError(path, "must be an object {type, seq, time, data, ...}")
        extra = set(value) - {"type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs",
                              "ignorable"}
        if extra:
            names = ", ".join(sorted(repr(k) for k in extra))
            raise CodecError(path, f"unexpected field(s) {names}")
        for key in ("type", "seq", "time", "data"):
            if key not in value:
                raise CodecError(f"{path}.{key}", "is missing")
        for key in ("surfaceOp", "sourceEventSeqs"):
            if key in value and value[key] is None:
                raise CodecError(f"{path}.{key}", "must be omitted rather than null")
        if "ignorable" in value and value["ignorable"] is not True:
            raise CodecError(f"{path}.ignorable", "must be true, or omitted (D16)")
        try:
            return cls(value["type"], value["seq"], value["time"], value["data"],
                       value.get("surfaceOp"), value.get("sourceEventSeqs"),
                       "ignorable" in value)
        except ValidationError as exc:
            raise _rebase_codec(exc, "event", path) from None


_INT_ONLY: Final = frozenset({int})


def _slot_setter(name: str) -> Callable[[Event, object], None]:
    """The setter of one of Event's slots (it bypasses the frozen dataclass's guard)."""
    setter: Callable[[Event, object], None] = Event.__dict__[name].__set__
    return setter


# For `checked_event` (see there).
_NEW = object.__new__
_SET_TYPE, _SET_SEQ, _SET_TIME, _SET_DATA, _SET_OP, _SET_SEQS, _SET_IGNORABLE = (
    _slot_setter(name) for name in ("type", "seq", "time", "data", "surface_op",
                                    "source_event_seqs", "ignorable"))


def checked_event(type_: str, seq: int, time: int | float, data: FrozenDict,
                  surface_op: Frozen, source_event_seqs: FrozenList | None,
                  ignorable: bool = False) -> Event:
    """``Event(type_, seq, time, data, surface_op, source_event_seqs)`` for the session log's
    commit, whose checks (L3) have just covered what `Event.__post_init__` checks of the type
    (a non-empty str), seq (the next index) and surfaceOp (frozen). The rest takes the
    constructor, which accepts or refuses it exactly as always, unless it is plainly valid:
    *time* (from the log's clock) an exact int or finite float, *data* an exact FrozenDict,
    and sourceEventSeqs, if any, a FrozenList of exact ints (L3 also admits int subclasses).

    Why: the constructor's checks and its frozen-dataclass field setting cost about 1 µs,
    paid again for every committed event; the slot setters cost half of that."""
    kind = type(time)
    if ((kind is not int and (kind is not float or not math.isfinite(time)))
            or type(data) is not FrozenDict
            or (source_event_seqs is not None and (type(source_event_seqs) is not FrozenList
                                                   or not set(map(type, source_event_seqs))
                                                   <= _INT_ONLY))):
        return Event(type_, seq, time, data, surface_op, source_event_seqs, ignorable)
    event: Event = _NEW(Event)
    _SET_TYPE(event, type_)
    _SET_SEQ(event, seq)
    _SET_TIME(event, time)
    _SET_DATA(event, data)
    _SET_OP(event, surface_op)
    _SET_SEQS(event, source_event_seqs)
    _SET_IGNORABLE(event, ignorable is True)
    return event


#: A durable event in compact form: (type, seq, time, data as compact JSON text, surfaceOp,
#: sourceEventSeqs as a plain tuple, ignorable). Why: a tuple of strings and numbers is not tracked by
#: CPython's cyclic garbage collector, which otherwise walks every retained event (about
#: five objects each) at every full collection, so that the cost per turn would grow with
#: the session; it also takes less memory. The session log and the in-memory store keep
#: events in this form (specs/log.md, L1).
EventRecord: TypeAlias = "tuple[str, int, int | float, str, Frozen, tuple[int, ...] | None, bool]"


def event_record(event: Event) -> EventRecord:
    """The compact form of *event* (`event_from_record` gives back an equal Event)."""
    seqs = event.source_event_seqs
    return (event.type, event.seq, event.time, compact_json(event.data), event.surface_op,
            None if seqs is None else tuple(seqs), event.ignorable)  # type: ignore[arg-type]


def event_from_record(record: EventRecord) -> Event:
    """The Event a record was made from (equal to it; its data the same JSON value)."""
    type_, seq, time, text, op, seqs, ignorable = record
    data = frozen_from_json(text)
    assert type(data) is FrozenDict
    return Event(type_, seq, time, data, op, None if seqs is None else FrozenList._adopt(seqs),
                 ignorable)


@immutable_value
@dataclass(frozen=True, slots=True)
class LiveEvent:
    """A live, non-durable notification (rule E3): a type and a payload mapping.

    The JSON form puts the payload's fields beside ``type``, so the payload may
    not itself have a ``type`` field. Construction snapshots the payload.
    """

    type: str
    payload: FrozenDict

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type:
            raise ValidationError("live.type", "must be a non-empty string")
        if type(self.type) is not str or not self.type.isascii():   # V23
            object.__setattr__(self, "type", plain_text(self.type, "live.type"))
        payload: Frozen = self.payload
        if type(payload) is not FrozenDict:  # Why: frozen by construction (see Event)
            payload = freeze(payload, "live.payload", max_depth=None)  # envelope (V1)
            if not isinstance(payload, FrozenDict):
                raise ValidationError("live.payload", "must be a mapping")
            object.__setattr__(self, "payload", payload)
        if "type" in payload:
            raise ValidationError("live.payload.type", "is reserved for the notification type")

    def to_json(self) -> dict[str, JsonLike]:
        return {"type": self.type, **thaw(self.payload)}

    @property
    def view(self) -> LiveData | ExtensionData:
        """The payload as the typed view of this notification's type (`machine.payloads`),
        e.g. `SettledData`. Decoded at each access."""
        return live_view(self.type, self.payload)

    def payload_as(self, view: builtins.type[V]) -> V:
        """The payload as *view* (``notice.payload_as(SettledData).reason``);
        `ValidationError` if this notification is of another type."""
        return view_as(view, self.type, self.payload, "payload")

    @property
    def message(self) -> Message:
        """The message of an ``agent/inbox/enqueue`` or ``agent/inbox/dequeue`` notice;
        `ValidationError` for any other type."""
        if self.type not in (INBOX_ENQUEUE, INBOX_DEQUEUE):
            raise ValidationError("live.message", f"a {self.type!r} notice carries no message "
                                  "(agent/inbox/enqueue and agent/inbox/dequeue do)")
        return Message.from_json(self.payload.get("message"), "live.payload.message")

    def __repr__(self) -> str:
        return f"LiveEvent({self.type!r}, {thaw(self.payload)!r})"

    @classmethod
    def from_json(cls, value: JsonLike, path: str = "live") -> LiveEvent:
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            raise CodecError(path, "must be an object with a string 'type'")
        payload = {k: v for k, v in value.items() if k != "type"}
        try:
            return cls(value["type"], payload)  # type: ignore[arg-type]
        except ValidationError as exc:
            where = exc.path
            for prefix in ("live.payload", "live"):
                if where == prefix or where.startswith((prefix + ".", prefix + "[")):
                    where = path + where[len(prefix):]
                    break
            raise CodecError(where, exc.problem) from None
