"""The session log: an append-only, invariant-checked list of durable events.

Rules L1–L14 are stated in ``specs/log.md`` (restating the reference's §0.6,
§1.21, §2, §20.2 and §21). Every append is checked *before* it is committed
(L2): a rejected append raises `InvariantError`, changes nothing and consumes
no seq. The checks keep a small incremental state (open turn, open step, the
callIds of the current step, ...) so an append costs O(size of its data), never
a walk of the log. The derived message history (L13) is maintained
incrementally too, so `history(end)` is a cheap immutable view.
"""

from __future__ import annotations

import bisect
import builtins
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as replace_fields
from typing import Final, Generic, NoReturn, TypeAlias, TypeVar, cast, overload

from machine.errors import InvariantError, ValidationError
from machine.events import (
    APPEND,
    ASSISTANT_CHUNK,
    ASSISTANT_MESSAGE,
    CORE_EVENT_TYPES,
    REQUEST_HEADER,
    STEERING_MESSAGE,
    STEP_END,
    STEP_START,
    SURFACE_TYPES,
    TODO_WRITE,
    TOOL_CALL,
    TOOL_RESULT,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    Event,
    EventRecord,
    checked_event,
    event_from_record,
    event_record,
    surface_op_problem,
)
from machine.jsonvalue import (
    ENVELOPE_DEPTH,
    Frozen,
    FrozenDict,
    FrozenList,
    depth_of,
    freeze,
    plain_text,
    shown,
    snapshot,
)
from machine.vocabulary import (
    ErrorInfo,
    Message,
    TurnEndReason,
    TurnTrigger,
    message_mapping,
    registrations,
    validate_assistant_message,
    validate_chunk,
    validate_tool_result_message,
    validate_user_message,
)

__all__ = [
    "EventRule",
    "Observer",
    "SessionLog",
    "Violation",
    "derive_history",
    "shares_items",
    "validate_events",
]

logger = logging.getLogger("turnstile")

#: A log observer: called with each committed event, after commit (L11).
Observer: TypeAlias = Callable[[Event], None]
#: An extension-type rule (L10): returns a description of the problem, or None.
EventRule: TypeAlias = Callable[["SessionLog", str, FrozenDict], "str | None"]

HEADER_REASONS: Final = frozenset({"initial", "resume", "change"})
TOOL_NOT_STARTED: Final = "TOOL_NOT_STARTED"

# The rule id reported for a core type's own checks (enclosure and data shape).
_RULE_OF_TYPE: Final[Mapping[str, str]] = {
    TURN_START: "L4", TURN_END: "L4",
    STEP_START: "L5", STEP_END: "L5",
    ASSISTANT_CHUNK: "L6", ASSISTANT_MESSAGE: "L6", TOOL_CALL: "L6",
    TOOL_RESULT: "L7",
    STEERING_MESSAGE: "L8", TODO_WRITE: "L8", REQUEST_HEADER: "L8",
    USER_MESSAGE: "L9",
}


def _wall_clock_ms() -> float:
    return int(time.time() * 1000)


def _fail(rule: str, message: str) -> NoReturn:
    raise InvariantError(rule, message)


def _problem_text(error: InvariantError) -> str:
    """The message of an InvariantError without its ``[rule] `` prefix."""
    return str(error).removeprefix(f"[{error.rule}] ")


# --------------------------------------------------------------------------
# Immutable views
# --------------------------------------------------------------------------

T = TypeVar("T")


S = TypeVar("S")


class _View(Sequence[T], Generic[S, T]):
    """An immutable view of the first *length* items of an append-only list of stored
    items (`S`), each shown as `_show(item)` (`T`).

    The log only ever appends to the lists these views wrap (and builds a new
    list where it would have to change one), so a view never changes.
    """

    __slots__ = ("_items", "_length")

    def __init__(self, items: list[S], length: int) -> None:
        self._items = items
        self._length = length

    @staticmethod
    def _show(item: S) -> T:
        raise NotImplementedError

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        if isinstance(index, slice):
            return tuple(map(self._show, self._items[: self._length][index]))
        position = index + self._length if index < 0 else index
        if not 0 <= position < self._length:
            raise IndexError("view index out of range")
        return self._show(self._items[position])

    def __iter__(self) -> Iterator[T]:
        return map(self._show, self._items[: self._length])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self._length and all(a == b for a, b in zip(self, other, strict=False))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


class _Prefix(_View[T, T]):
    """A view of items shown as they are (the derived history's messages)."""

    __slots__ = ()

    @staticmethod
    def _show(item: T) -> T:
        return item

    def __iter__(self) -> Iterator[T]:
        return iter(self._items[: self._length])  # Why: no call per item


def shares_items(a: Sequence[object], b: Sequence[object]) -> bool:
    """Whether *a* and *b* are views of one of the log's append-only lists (two `history`
    views of one generation, L13): then the shorter is a prefix of the longer, item for
    item. O(1); False for anything else (which may still share a prefix)."""
    return (isinstance(a, _View) and isinstance(b, _View) and type(a) is type(b)
            and a._items is b._items)


class _Events(_View[EventRecord, Event]):
    """A view of the committed events, rebuilt from their compact records."""

    __slots__ = ()

    @staticmethod
    def _show(item: EventRecord) -> Event:
        return event_from_record(item)


# --------------------------------------------------------------------------
# Derived history (L13)
# --------------------------------------------------------------------------


def _is_skipped(message: Message) -> bool:
    # §21.2: an assistant message with empty content carries only usage.
    return message.role == "assistant" and len(message.content) == 0


def _project(event: Event) -> Message:
    """The message a (valid) surface event contributes to the history (§21.2)."""
    if event.type == USER_MESSAGE:
        return Message.from_json(event.data, "data")
    return Message.from_json(event.data["message"], "data.message")


def _replace_range(origins: Sequence[int], messages: Sequence[Message], start: int, end: int,
                   new_origin: int, new: Message | None) -> tuple[list[int], list[Message]]:
    """Apply ``surfaceOp {op:'replace', start, end}`` to a derived list (L13).

    The entries produced by events ``start..end`` are shadowed and the new
    message takes the place of the first of them; if none is left to shadow,
    it goes before the first entry that originated after the range.
    """
    kept_origins: list[int] = []
    kept_messages: list[Message] = []
    position: int | None = None
    for origin, message in zip(origins, messages, strict=True):
        if start <= origin <= end:
            if position is None:
                position = len(kept_origins)
            continue
        if position is None and origin > end:
            position = len(kept_origins)
        kept_origins.append(origin)
        kept_messages.append(message)
    if new is not None:
        at = len(kept_origins) if position is None else position
        kept_origins.insert(at, new_origin)
        kept_messages.insert(at, new)
    return kept_origins, kept_messages


def derive_history(events: Iterable[Event]) -> tuple[Message, ...]:
    """The derived history (§21.2) of valid events, computed by a plain walk (L13)."""
    origins: list[int] = []
    messages: list[Message] = []
    for event in events:
        if event.type not in SURFACE_TYPES:
            continue
        projected = _project(event)
        message = None if _is_skipped(projected) else projected
        op = event.surface_op
        if isinstance(op, FrozenDict):
            start, end = op["start"], op["end"]
            assert isinstance(start, int) and isinstance(end, int)
            origins, messages = _replace_range(origins, messages, start, end, event.seq, message)
        elif message is not None:
            origins.append(event.seq)
            messages.append(message)
    return tuple(messages)


@dataclass(slots=True)
class _Generation:
    """The derived history from one replace event on (L13).

    ``keys`` is non-decreasing so `bisect` finds how many entries belong to a
    prefix of the log: entries carried over by the replace event are keyed by
    that event's seq, entries appended afterwards by their own seq.
    ``origins`` holds the seq of the event that produced each entry, which a
    later replace range is matched against.
    """

    start: int
    keys: list[int] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)


# --------------------------------------------------------------------------
# Violations (for validators and the CLI)
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Violation:
    """The first event of a sequence that breaks a session invariant.

    ``seq`` is the event's position in the sequence (which L1 requires to be
    its seq), ``rule`` the rule id (L1–L10), ``message`` what is wrong.
    """

    seq: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"seq {self.seq} [{self.rule}] {self.message}"


def validate_events(events: Iterable[Event]) -> Violation | None:
    """Replay *events* through the session invariants (L14); the first violation, or None."""
    log = SessionLog()
    for position, event in enumerate(events):
        try:
            log._replay(event)
        except InvariantError as error:
            return Violation(position, error.rule, _problem_text(error))
    return None


# --------------------------------------------------------------------------
# The log
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogMark:
    """A position of a `SessionLog` (`SessionLog.mark`): its length, the checker state
    there and the extension rules registered then (by event type), so that `SessionLog.fork`
    can give back the log as it was. Compares by value (a rule by identity)."""

    length: int
    open_turn: int | None
    open_step: int | None
    last_turn: int
    last_step: int
    step_calls: frozenset[str]
    last_header: FrozenDict | None
    generations: int
    entries: int
    rules: tuple[tuple[str, EventRule], ...] = ()


def _check_ignorable(type_: str, ignorable: object) -> None:
    """L3, D16: ``ignorable`` is true or absent, and only on an extension type: a build always
    reads the core's own types."""
    if ignorable is not True:
        _fail("L3", f"{type_}: ignorable must be a bool (true marks the event), not "
              f"{shown(ignorable)}")
    if type_ in CORE_EVENT_TYPES:
        _fail("L3", f"{type_} cannot be ignorable: a build always reads the core's own event "
              "types (only extension events may be marked ignorable)")


class SessionLog:
    """An append-only session log that checks every append before commit (L1–L14).

    *events* seed the log; they are replayed through the same checks as
    appends (L14). *clock* supplies each appended event's ``time`` (epoch
    milliseconds by default) (L1).
    """

    def __init__(self, events: Iterable[Event] = (), *,
                 clock: Callable[[], float] | None = None) -> None:
        self._clock: Callable[[], float] = clock if clock is not None else _wall_clock_ms
        self._records: list[EventRecord] = []
        # Extension rules (L10). Why both are replaced on registering, never changed in
        # place: a mark takes them by reference in O(1) and keeps them as they were (L15).
        self._rules: dict[str, EventRule] = {}
        self._rule_table: tuple[tuple[str, EventRule], ...] = ()
        # Incremental checker state (L4–L8): O(1) per append.
        self._open_turn: int | None = None
        self._open_step: int | None = None
        self._last_turn = 0
        self._last_step = 0  # the last step number of the open turn
        self._step_calls: set[str] = set()  # callIds of the open step's tool/call events
        self._last_header: FrozenDict | None = None
        # Derived history (L13), one generation per replace event.
        self._generations: list[_Generation] = [_Generation(start=-1)]
        self._generation_starts: list[int] = [-1]
        # Observer delivery (L11, L12).
        self._observers: dict[int, Observer] = {}
        self._next_token = 0
        self._undelivered: deque[Event] = deque()
        self._delivering = False
        # The last successful `check` of a core type: (type, data, op, seqs, message).
        self._checked: tuple[str, FrozenDict, Frozen, FrozenList | None, Message | None, int
                             ] | None = None
        for position, event in enumerate(events):
            try:
                self._replay(event)
            except InvariantError as error:
                raise InvariantError(
                    error.rule, f"seed event at seq {position}: {_problem_text(error)}") from None

    # -- read-only state ---------------------------------------------------

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index: int) -> Event:
        return event_from_record(self._records[index])

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    @property
    def events(self) -> Sequence[Event]:
        """An immutable snapshot of the committed events."""
        return _Events(self._records, len(self._records))

    @property
    def open_turn(self) -> int | None:
        return self._open_turn

    @property
    def open_step(self) -> int | None:
        return self._open_step

    @property
    def last_turn(self) -> int:
        """The number of the last ``turn/start`` (0 when there is none)."""
        return self._last_turn

    @property
    def last_header(self) -> FrozenDict | None:
        """The ``header`` of the most recent ``request/header``."""
        return self._last_header

    @property
    def has_header(self) -> bool:
        return self._last_header is not None

    # -- marks and forks (L15) -----------------------------------------------------

    def mark(self) -> LogMark:
        """The log's position now, as a value: what `fork` needs to give back the log as it
        is now, however much is appended later (the log is append-only) and whatever rules
        are registered later. O(1)."""
        last = self._generations[-1]
        return LogMark(len(self._records), self._open_turn, self._open_step, self._last_turn,
                       self._last_step, frozenset(self._step_calls), self._last_header,
                       len(self._generations), len(last.keys), self._rule_table)

    def fork(self, mark: LogMark | None = None) -> SessionLog:
        """An independent log holding this log's events up to *mark* (all if None), with the
        same clock, the extension rules registered when *mark* was taken and no observers:
        appends to either log never reach the other. O(events) references copied; nothing is
        re-checked or re-encoded. `ValueError` if *mark* is not a position of this log."""
        if mark is None:
            mark = self.mark()
        elif (type(mark) is not LogMark or mark.length > len(self._records)
              or mark.generations > len(self._generations)):
            raise ValueError(f"{shown(mark)} is not a position of this log")
        fork = SessionLog.__new__(SessionLog)
        fork._clock = self._clock
        fork._records = self._records[:mark.length]
        fork._rules = dict(mark.rules)
        fork._rule_table = mark.rules
        fork._open_turn, fork._open_step = mark.open_turn, mark.open_step
        fork._last_turn, fork._last_step = mark.last_turn, mark.last_step
        fork._step_calls = set(mark.step_calls)
        fork._last_header = mark.last_header
        # Why only the last generation is copied: an earlier one is never appended to again
        # (a replace starts a new one), and views of this log keep their own lengths.
        kept = self._generations[:mark.generations]
        last = kept[-1]
        entries = mark.entries
        kept[-1] = _Generation(last.start, last.keys[:entries], last.origins[:entries],
                               last.messages[:entries])
        fork._generations = kept
        fork._generation_starts = self._generation_starts[:mark.generations]
        fork._observers = {}
        fork._next_token = 0
        fork._undelivered = deque()
        fork._delivering = False
        fork._checked = None
        return fork

    # -- extension rules (L10) ----------------------------------------------

    def register_rule(self, event_type: str, check: EventRule) -> None:
        """Give an extension event type a rule (L10); it replaces an earlier one.

        *check* receives the log (before the append), the type and the frozen
        data, and returns a description of the problem or None.
        """
        if not isinstance(event_type, str) or not event_type:
            raise ValidationError("event_type", "must be a non-empty string")
        if event_type in _RULE_OF_TYPE:
            raise ValidationError("event_type", f"{shown(event_type)} is a core event type; "
                                  "its rules cannot be overridden")
        rules = {**self._rules, event_type: check}
        self._rules = rules
        self._rule_table = tuple(sorted(rules.items(), key=lambda item: item[0]))

    # -- appending ------------------------------------------------------------

    def check(self, type: str, data: Mapping[str, object] | Message, *,
              surface_op: str | Mapping[str, object] | None = None,
              source_event_seqs: Sequence[int] | None = None, ignorable: bool = False) -> None:
        """Raise `InvariantError` if this append would break an invariant (L2). Pure."""
        if builtins.type(type) is not str or not type.isascii():
            type = _event_type(type)
        frozen_data, frozen_op, frozen_seqs = _freeze_envelope(data, surface_op, source_event_seqs)
        if ignorable is not False:
            _check_ignorable(type, ignorable)
        message = self._verdict(type, frozen_data, frozen_op, frozen_seqs)
        # Why (performance): a store checks each append before writing it and commits the
        # same values right after (S5). Remember this verdict, so that a commit of the very
        # same frozen values with nothing stored in between reuses it instead of reaching it
        # twice. Only core types: their checks depend on nothing but the log and the values
        # (an extension rule is the caller's function, so it is always called again).
        # A registration in between (V3, V4) may refuse what was accepted: it voids the verdict.
        self._checked = ((type, frozen_data, frozen_op, frozen_seqs, message, registrations())
                         if type in _CORE_CHECKS else None)

    def commit(self, type: str, data: Mapping[str, object] | Message, *,
               surface_op: str | Mapping[str, object] | None = None,
               source_event_seqs: Sequence[int] | None = None, ignorable: bool = False) -> Event:
        """Snapshot, check (L2) and commit one event; no observer delivery.

        A `Message` may stand for a message mapping (as *data* itself or as a
        top-level value of it). *ignorable* marks an extension event a build that does not
        read its type may resume past (D16).
        """
        if builtins.type(type) is not str or not type.isascii():   # Why: the usual type, at once
            type = _event_type(type)
        frozen_data, frozen_op, frozen_seqs = _freeze_envelope(data, surface_op, source_event_seqs)
        if ignorable is not False:
            _check_ignorable(type, ignorable)
        checked, self._checked = self._checked, None
        if (checked is not None and checked[0] == type and checked[1] is frozen_data
                and checked[2] is frozen_op and checked[3] is frozen_seqs
                and checked[5] == registrations()):
            message = checked[4]        # checked by `check` just before (see there)
        else:
            message = self._verdict(type, frozen_data, frozen_op, frozen_seqs)
        event = checked_event(type, len(self._records), self._stamp(type), frozen_data,
                              frozen_op, frozen_seqs, ignorable)
        self._store(event, message)
        return event

    def _stamp(self, type_: str) -> int | float:
        """The clock's time for an event (L3): a failing clock refuses the append, typed."""
        try:
            now = self._clock()
        except Exception as error:
            _fail("L3", f"{type_}: the log's clock failed: "
                  f"{ErrorInfo.from_exception(error).rendered()}")
        kind = type(now)
        if kind is int or (kind is float and -math.inf < now < math.inf):
            return now
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            _fail("L3", f"{type_}: the log's clock returned {shown(now)}, not a finite number of "
                  "epoch milliseconds")
        return now

    def append(self, type: str, data: Mapping[str, object] | Message, *,
               surface_op: str | Mapping[str, object] | None = None,
               source_event_seqs: Sequence[int] | None = None, ignorable: bool = False) -> Event:
        """Commit one event, then deliver it to the observers (L11, L12).

        Made during a delivery (by an observer), the event commits at once but
        is delivered only after the current event has reached every observer;
        the outermost append returns after all such deliveries are done.
        """
        event = self.commit(type, data, surface_op=surface_op,
                            source_event_seqs=source_event_seqs, ignorable=ignorable)
        self._undelivered.append(event)
        if not self._delivering:
            self._deliver_all()
        return event

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Register a log observer (L11); returns a function that unsubscribes it."""
        token = self._next_token
        self._next_token += 1
        self._observers[token] = observer

        def unsubscribe() -> None:
            self._observers.pop(token, None)

        return unsubscribe

    # -- derived history (L13) ------------------------------------------------

    def derive_messages(self, end: int | None = None) -> tuple[Message, ...]:
        """The derived history (§21.2) of the events with seq < *end* (all if None)."""
        events = self.events
        return derive_history(events if end is None else events[:max(end, 0)])

    def data_json(self, seq: int) -> str:
        """The compact JSON text of event *seq*'s data, exactly as the log retains it (L1):
        what ``compact_json(self[seq].data)`` would give, without decoding the event."""
        if type(seq) is not int or not 0 <= seq < len(self._records):
            raise IndexError(f"no event with seq {shown(seq)} (the log has {len(self._records)})")
        return self._records[seq][3]

    def history(self, end: int) -> Sequence[Message]:
        """An immutable view equal to ``derive_messages(end)``, in O(log n)."""
        end = max(end, 0)
        generation = self._generations[bisect.bisect_left(self._generation_starts, end) - 1]
        return _Prefix(generation.messages, bisect.bisect_left(generation.keys, end))

    # -- internals --------------------------------------------------------------

    def _deliver_all(self) -> None:
        self._delivering = True
        try:
            while self._undelivered:
                event = self._undelivered.popleft()
                for token, observer in tuple(self._observers.items()):
                    if token not in self._observers:
                        continue  # unsubscribed by an earlier observer of this event
                    try:
                        observer(event)
                    except Exception as error:  # L11: contained, never vetoes
                        logger.warning("session log observer failed on %s (seq %d): %s",
                                       event.type, event.seq,
                                       ErrorInfo.from_exception(error).rendered())
        finally:
            self._delivering = False

    def replay(self, event: Event) -> None:
        """Check and store an already stamped event, as a seed is (L14): `InvariantError`
        if it may not come next. (For readers that replay stored events one at a time.)"""
        self._replay(event)

    def _replay(self, event: Event) -> None:
        """Check and store an already stamped event (seeds and validators, L14)."""
        expected = len(self._records)
        if event.seq != expected:
            _fail("L1", f"{event.type}: expected seq {expected}, got {event.seq}")
        if isinstance(event.time, bool) or not isinstance(event.time, (int, float)):
            _fail("L3", f"{event.type}: time must be a number of epoch milliseconds")
        data, op, seqs = _freeze_envelope(event.data, event.surface_op, event.source_event_seqs)
        if event.ignorable:
            _check_ignorable(event.type, True)
        message = self._verdict(event.type, data, op, seqs)
        unchanged = (data is event.data and op is event.surface_op
                     and seqs is event.source_event_seqs)
        if not unchanged:  # the caller built the Event from plain values: keep the snapshot
            event = replace_fields(event, data=data, surface_op=op, source_event_seqs=seqs)
        self._store(event, message)

    def _store(self, event: Event, message: Message | None) -> None:
        """Commit a checked event and advance the incremental state."""
        self._checked = None        # the state changes: an earlier check no longer holds
        try:
            record = event_record(event)
        except (RecursionError, MemoryError) as error:  # the data is bounded (V1): rare
            _fail("L3", f"{event.type}: the event could not be encoded "
                  f"({type(error).__name__}); nothing was appended")
        self._records.append(record)
        data = event.data
        kind = event.type
        if kind not in _STATE_TYPES:  # Why: most events change none of the state below
            pass
        elif kind == TURN_START:
            self._open_turn = self._last_turn = _as_int(data["turn"])
            self._last_step = 0
        elif kind == TURN_END:
            self._open_turn = None
        elif kind == STEP_START:
            self._open_step = self._last_step = _as_int(data["step"])
            self._step_calls = set()
        elif kind == STEP_END:
            self._open_step = None
            self._step_calls = set()  # L7: a later step cannot answer these calls
        elif kind == TOOL_CALL:
            self._step_calls.add(str(data["callId"]))
        elif kind == REQUEST_HEADER:
            header = data["header"]
            assert isinstance(header, FrozenDict)
            self._last_header = header
        if message is not None:
            self._record_surface(event, message)

    def _record_surface(self, event: Event, projected: Message) -> None:
        message = None if _is_skipped(projected) else projected
        current = self._generations[-1]
        op = event.surface_op
        if not isinstance(op, FrozenDict):
            if message is not None:
                current.keys.append(event.seq)
                current.origins.append(event.seq)
                current.messages.append(message)
            return
        # A replace never mutates a list that views may reference: it starts a
        # new generation whose carried-over entries are keyed by this seq.
        origins, messages = _replace_range(current.origins, current.messages,
                                           _as_int(op["start"]), _as_int(op["end"]),
                                           event.seq, message)
        self._generations.append(_Generation(event.seq, [event.seq] * len(origins),
                                             origins, messages))
        self._generation_starts.append(event.seq)

    # -- the checks --------------------------------------------------------------

    def _verdict(self, type_: str, data: FrozenDict, op: Frozen,
                 seqs: FrozenList | None) -> Message | None:
        """Raise InvariantError if the event may not come next; else its surface message."""
        next_seq = len(self._records)
        # L3: the envelope.
        if not isinstance(type_, str) or not type_:
            _fail("L3", "the event type must be a non-empty string")
        surface = type_ in SURFACE_TYPES
        if surface:
            if op is None:
                _fail("L3", f"{type_} requires a surfaceOp ('append' or a replace range)")
            op_problem = surface_op_problem(op)
            if op_problem:
                _fail("L3", f"{type_}: {op_problem}")
            if isinstance(op, FrozenDict) and _as_int(op["end"]) >= next_seq:
                _fail("L3", f"{type_}: replace range {op['start']}..{op['end']} must name "
                      f"earlier events (this event would be seq {next_seq})")
        elif op is not None:
            _fail("L3", f"{type_} must not carry a surfaceOp (only surface types do)")
        if seqs is not None:
            if not surface:
                _fail("L3", f"{type_} must not carry sourceEventSeqs (only surface types do)")
            # Why: exact ints in range (the usual case) are confirmed by three C-level passes;
            # anything else takes the loop, which finds and words the first bad entry.
            ints = cast("tuple[int, ...]", seqs)   # checked on the next line
            if not (set(map(type, seqs)) <= _INT_ONLY
                    and (not ints or (min(ints) >= 0 and max(ints) < next_seq))):
                for source in seqs:
                    if isinstance(source, bool) or not isinstance(source, int) \
                            or not 0 <= source < next_seq:
                        _fail("L3", f"{type_}: sourceEventSeqs entry {shown(source)} does not name "
                              f"an earlier event (this event would be seq {next_seq})")
        check = _CORE_CHECKS.get(type_)
        if check is not None:
            return check(self, data, op)
        # L10: extension types follow their registered rule, else anything goes.
        rule = self._rules.get(type_)
        if rule is None:
            return None
        try:
            problem = rule(self, type_, data)
        except Exception as error:  # a caller's rule: its failure refuses the append, typed
            _fail("L10", f"{type_}: its rule raised {ErrorInfo.from_exception(error).rendered()}")
        if problem:
            _fail("L10", f"{type_}: {problem if isinstance(problem, str) else shown(problem)}")
        return None

    def _require_turn(self, type_: str) -> int:
        if self._open_turn is None:
            _fail(_RULE_OF_TYPE[type_], f"{type_} is outside any open turn")
        return self._open_turn

    def _require_step(self, type_: str, data: FrozenDict) -> None:
        """The event must sit in an open step and name it (L6, L7)."""
        # Why: the usual case (exact ints naming the open step) is answered at once; anything
        # else takes the full test below, which also words the refusal.
        fields = data._data
        turn_named, step_named = fields.get("turn"), fields.get("step")
        if (type(turn_named) is int and type(step_named) is int and self._open_step is not None
                and turn_named == self._open_turn and step_named == self._open_step):
            return
        rule = _RULE_OF_TYPE[type_]
        turn = self._require_turn(type_)
        step = self._open_step
        if step is None:
            _fail(rule, f"{type_} is outside any open step (turn {turn} has no open step)")
        named = (data.get("turn"), data.get("step"))
        if named != (turn, step) or not (_is_int(named[0]) and _is_int(named[1])):
            _fail(rule, f"{type_}: names step {_dotted(named)} but the open step is {turn}.{step}")

    def _check_turn_start(self, data: FrozenDict, _op: Frozen) -> None:
        if self._open_turn is not None:
            _fail("L4", f"turn/start: turn {self._open_turn} is still open")
        turn = data.get("turn")
        expected = self._last_turn + 1
        if not _is_int(turn) or turn != expected:
            _fail("L4", f"turn/start: expected turn {expected}, got {shown(turn)}")
        try:  # V13: message / retry / injection
            TurnTrigger.from_json(data.get("trigger"), "data.trigger")
        except ValidationError as error:
            _fail("L4", f"turn/start: {error}")

    def _check_turn_end(self, data: FrozenDict, _op: Frozen) -> None:
        turn = data.get("turn")
        if self._open_turn is None:
            _fail("L4", f"turn/end: turn {shown(turn)} is outside any open turn")
        if not _is_int(turn) or turn != self._open_turn:
            _fail("L4", f"turn/end: turn {shown(turn)} does not match open turn {self._open_turn}")
        if self._open_step is not None:
            _fail("L4", f"turn/end: step {self._open_turn}.{self._open_step} is still open")
        try:  # V19: completed / aborted / error / disposed / max-tokens / interrupted
            TurnEndReason.from_json(data.get("reason"), "data.reason")
        except ValidationError as error:
            _fail("L4", f"turn/end: {error}")

    def _check_step_start(self, data: FrozenDict, _op: Frozen) -> None:
        if self._open_turn is None:
            _fail("L5", "step/start requires an open turn")
        if self._open_step is not None:
            _fail("L5", f"step/start: step {self._open_turn}.{self._open_step} is still open")
        turn, step = data.get("turn"), data.get("step")
        if not _is_int(turn) or turn != self._open_turn:
            _fail("L5", f"step/start: turn {shown(turn)} does not match open turn {self._open_turn}")
        expected = self._last_step + 1
        if not _is_int(step) or step != expected:
            _fail("L5", f"step/start: expected step {expected} of turn {turn}, got {shown(step)}")

    def _check_step_end(self, data: FrozenDict, _op: Frozen) -> None:
        if self._open_step is None:
            _fail("L5", "step/end is outside any open step")
        named = (data.get("turn"), data.get("step"))
        if named != (self._open_turn, self._open_step) or not (
                _is_int(named[0]) and _is_int(named[1])):
            _fail("L5", f"step/end: step {_dotted(named)} does not match open step "
                  f"{self._open_turn}.{self._open_step}")

    def _check_chunk(self, data: FrozenDict, _op: Frozen) -> None:
        self._require_step(ASSISTANT_CHUNK, data)
        try:
            validate_chunk(data.get("chunk"), "data.chunk")
        except ValidationError as error:
            _fail("L6", f"assistant/chunk: {error}")

    def _check_assistant_message(self, data: FrozenDict, _op: Frozen) -> Message:
        self._require_step(ASSISTANT_MESSAGE, data)
        message = _message_field(ASSISTANT_MESSAGE, data, validate_assistant_message)
        if "usage" in data and not isinstance(data["usage"], FrozenDict):
            _fail("L6", "assistant/message: data.usage must be a mapping")
        if "interrupted" in data and data["interrupted"] is not True:      # D15
            _fail("L6", "assistant/message: data.interrupted, when present, must be true, got "
                  f"{shown(data['interrupted'])}")
        return message

    def _check_tool_call(self, data: FrozenDict, _op: Frozen) -> None:
        self._require_step(TOOL_CALL, data)
        call_id, name = data.get("callId"), data.get("name")
        if not isinstance(call_id, str) or not call_id:
            _fail("L6", f"tool/call: data.callId must be a non-empty string, got {shown(call_id)}")
        if not isinstance(name, str):
            _fail("L6", f"tool/call: data.name must be a string, got {shown(name)}")

    def _check_tool_result(self, data: FrozenDict, op: Frozen) -> Message:
        fresh = op == APPEND
        if fresh:
            self._require_step(TOOL_RESULT, data)
        else:
            self._require_turn(TOOL_RESULT)  # a replacement needs only an open turn
        message = _message_field(TOOL_RESULT, data, validate_tool_result_message)
        call_id = message.source["callId"]
        error = data.get("error")
        if error is not None and not isinstance(error, FrozenDict):
            _fail("L7", f"tool/result: data.error must be a mapping, got {shown(error)}")
        not_started = error is not None and error.get("code") == TOOL_NOT_STARTED
        if fresh and call_id not in self._step_calls and not not_started:
            _fail("L7", f"tool/result: no tool/call with callId {shown(call_id)} earlier in step "
                  f"{self._open_turn}.{self._open_step}")
        return message

    def _check_steering(self, data: FrozenDict, _op: Frozen) -> Message:
        turn = self._require_turn(STEERING_MESSAGE)
        named = data.get("turn")
        if not _is_int(named) or named != turn:
            _fail("L8", f"steering/message: turn {shown(named)} does not match open turn {turn}")
        return _message_field(STEERING_MESSAGE, data, validate_user_message)

    def _check_todo_write(self, _data: FrozenDict, _op: Frozen) -> None:
        self._require_turn(TODO_WRITE)

    def _check_request_header(self, data: FrozenDict, _op: Frozen) -> None:
        self._require_turn(REQUEST_HEADER)
        if not isinstance(data.get("header"), FrozenDict):
            _fail("L8", "request/header: data.header must be a mapping {config, system?, tools?}")
        reason = data.get("reason")
        if reason not in HEADER_REASONS:
            _fail("L8", "request/header: data.reason must be 'initial', 'resume' or 'change', "
                  f"got {shown(reason)}")

    def _check_user_message(self, data: FrozenDict, _op: Frozen) -> Message:
        # L9: no enclosure at all; the data is the well-formed user message itself.
        try:
            return validate_user_message(data, "data")
        except ValidationError as error:
            _fail("L9", f"user/message: {error}")


_CoreCheck: TypeAlias = Callable[[SessionLog, FrozenDict, Frozen], "Message | None"]

_CORE_CHECKS: Final[Mapping[str, _CoreCheck]] = {
    TURN_START: SessionLog._check_turn_start,
    TURN_END: SessionLog._check_turn_end,
    STEP_START: SessionLog._check_step_start,
    STEP_END: SessionLog._check_step_end,
    ASSISTANT_CHUNK: SessionLog._check_chunk,
    ASSISTANT_MESSAGE: SessionLog._check_assistant_message,
    TOOL_CALL: SessionLog._check_tool_call,
    TOOL_RESULT: SessionLog._check_tool_result,
    STEERING_MESSAGE: SessionLog._check_steering,
    TODO_WRITE: SessionLog._check_todo_write,
    REQUEST_HEADER: SessionLog._check_request_header,
    USER_MESSAGE: SessionLog._check_user_message,
}


# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------


_INT_ONLY: Final = {int}

#: The event types whose commit advances the log's incremental state (`SessionLog._store`).
_STATE_TYPES: Final = frozenset({TURN_START, TURN_END, STEP_START, STEP_END, TOOL_CALL,
                                 REQUEST_HEADER})


def _is_int(value: object) -> bool:
    # Why: an exact int (the usual case) answers at once; same answer as the full test.
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


def _as_int(value: Frozen) -> int:
    assert isinstance(value, int)
    return value


def _dotted(named: tuple[Frozen, Frozen]) -> str:
    return f"{shown(named[0])}.{shown(named[1])}"


def _message_field(type_: str, data: FrozenDict,
                   validate: Callable[[Frozen, str], Message]) -> Message:
    """``data.message``, checked by the vocabulary's validator for its kind (§1.2)."""
    try:
        return validate(data.get("message"), "data.message")
    except ValidationError as error:
        _fail(_RULE_OF_TYPE[type_], f"{type_}: {error}")


def _message_mapping(message: Message) -> FrozenDict:
    # Content and source are already frozen, so this is cheap.
    return message_mapping(message)


def _event_type(type_: object) -> str:
    """L3, V23: the event type as a plain non-empty str without lone surrogates."""
    if type(type_) is not str:
        if not isinstance(type_, str):
            _fail("L3", "the event type must be a non-empty string")
        type_ = str.__str__(type_)
    if not type_:
        _fail("L3", "the event type must be a non-empty string")
    if not type_.isascii():
        try:
            plain_text(type_, "type")
        except ValidationError as error:
            _fail("L3", f"the event type {shown(type_)}: {error.problem}")
    return type_


def _freeze_envelope(data: Mapping[str, object] | Message, surface_op: object,
                     source_event_seqs: object) -> tuple[FrozenDict, Frozen, FrozenList | None]:
    """Snapshot the caller's data, surfaceOp and sourceEventSeqs (L3). Each is taken first
    (V6), so reading it runs none of the caller's code."""
    if type(data) is FrozenDict and surface_op is None and source_event_seqs is None \
            and 0 < depth_of(data) <= ENVELOPE_DEPTH:
        return data, None, None  # Why: the usual case, frozen already (as the general path)
    # Why only these: exact dicts, lists, strs and frozen values are read below without
    # running any code of the caller's; anything else (a subclass, say) is taken first.
    if type(data) is not dict and type(data) is not FrozenDict and not isinstance(data, Message):
        data = snapshot(data)
    if surface_op is not None and type(surface_op) is not str:
        surface_op = snapshot(surface_op)
    if source_event_seqs is not None and type(source_event_seqs) is not list \
            and type(source_event_seqs) is not FrozenList:
        source_event_seqs = snapshot(source_event_seqs)
    try:
        if isinstance(data, Message):
            frozen_data: Frozen = freeze(_message_mapping(data), "data", max_depth=None)
        elif isinstance(data, FrozenDict):
            frozen_data = freeze(data, "data", max_depth=None)  # its depth: V1's envelope bound
        elif isinstance(data, Mapping):
            # The envelope bound (V1): event data wraps values bounded where they entered.
            frozen_data = freeze({key: _message_mapping(value) if isinstance(value, Message)
                                  else value for key, value in data.items()}, "data",
                                 max_depth=None)
        else:
            frozen_data = freeze(data, "data", max_depth=None)
        frozen_op = freeze(surface_op, "surfaceOp")
        frozen_seqs: Frozen = None
        if source_event_seqs is not None:
            if isinstance(source_event_seqs, FrozenList):
                frozen_seqs = source_event_seqs  # already a frozen JSON array
            elif isinstance(source_event_seqs, (list, tuple)):
                frozen_seqs = freeze(list(source_event_seqs), "sourceEventSeqs")
            else:
                frozen_seqs = freeze(source_event_seqs, "sourceEventSeqs")
    except ValidationError as error:
        _fail("L3", f"not JSON-compatible: {error}")
    if not isinstance(frozen_data, FrozenDict):
        _fail("L3", "data must be a JSON object (a mapping)")
    if frozen_seqs is not None and not isinstance(frozen_seqs, FrozenList):
        _fail("L3", "sourceEventSeqs must be a list of earlier seqs")
    return frozen_data, frozen_op, frozen_seqs
