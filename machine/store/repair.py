"""Crash repair (§22.1–§22.4, S12) and the analysis of stored records (§22.5, D8, S10–S11).

`scan` walks a log and finds what an interrupted turn left open: the open
turn, the open step and the pending tool calls. `append_closers` appends the
closers that balance it. `analyse` turns the records a backend read into the
intact prefix and the list of damage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from machine.errors import InvariantError
from machine.events import (
    APPEND,
    ASSISTANT_MESSAGE,
    STEP_END,
    STEP_START,
    TOOL_CALL,
    TOOL_RESULT,
    TURN_END,
    TURN_START,
    Event,
)
from machine.jsonvalue import FrozenDict, FrozenList
from machine.log import SessionLog
from machine.store.types import Damage, DamageKind

__all__ = [
    "NOT_STARTED_TEXT",
    "OUTCOME_UNKNOWN_TEXT",
    "TOOL_NOT_STARTED",
    "TOOL_OUTCOME_UNKNOWN",
    "Analysis",
    "PendingCall",
    "RawRecord",
    "RepairScan",
    "analyse",
    "append_closers",
    "closers",
    "scan",
]

TOOL_NOT_STARTED: Final = "TOOL_NOT_STARTED"
TOOL_OUTCOME_UNKNOWN: Final = "TOOL_OUTCOME_UNKNOWN"

#: §22.4: the fixed texts of the synthetic results (this project's wording).
NOT_STARTED_TEXT: Final = ("Error: tool call interrupted before the harness recorded its start; "
                           "it may be retried if it is still needed.")
OUTCOME_UNKNOWN_TEXT: Final = ("Error: tool call interrupted after it started, so its outcome is "
                               "unknown. Retry only read-only or idempotent work; otherwise verify "
                               "the current state or ask the user.")

_NOT_STARTED_ERROR: Final = FrozenDict({"name": "ToolNotStartedError", "code": TOOL_NOT_STARTED})
_OUTCOME_UNKNOWN_ERROR: Final = FrozenDict({"name": "ToolOutcomeUnknownError",
                                            "code": TOOL_OUTCOME_UNKNOWN})
_INTERRUPTED: Final = FrozenDict({"kind": "interrupted"})


# --------------------------------------------------------------------------
# The scan (§22.1)
# --------------------------------------------------------------------------


@dataclass(slots=True)
class PendingCall:
    """A tool call of the open step with no result yet (§22.1)."""

    call_id: str
    turn: int
    step: int
    call_seq: int | None = None  # the seq of its tool/call, when one was recorded


@dataclass(slots=True)
class RepairScan:
    """The scan state after a walk of the log (§22.1)."""

    open_turn: int | None = None
    open_step: int | None = None
    pending: list[PendingCall] = field(default_factory=list)
    last_time: int | float | None = None

    def feed(self, event: Event) -> None:
        self.last_time = event.time
        kind, data = event.type, event.data
        if kind == TURN_START:
            self.open_turn, self.open_step = _int(data.get("turn")), None
            self.pending = []
        elif kind == TURN_END:
            self.open_turn, self.open_step = None, None
            self.pending = []
        elif kind == STEP_START:
            self.open_step = _int(data.get("step"))
        elif kind == STEP_END:
            self.open_step = None
            self.pending = []
        elif kind == ASSISTANT_MESSAGE:
            message = data.get("message")
            content = message.get("content") if isinstance(message, FrozenDict) else None
            turn, step = _int(data.get("turn")), _int(data.get("step"))
            if isinstance(content, FrozenList) and turn is not None and step is not None:
                for block in content:
                    if isinstance(block, FrozenDict) and block.get("type") == "tool-call":
                        call_id = block.get("id")
                        if isinstance(call_id, str):
                            self.pending.append(PendingCall(call_id, turn, step))
        elif kind == TOOL_CALL:
            call_id = data.get("callId")
            for call in self.pending:
                if call.call_id == call_id and call.call_seq is None:
                    call.call_seq = event.seq
        elif kind == TOOL_RESULT:
            answered = _result_call_id(data)
            self.pending = [call for call in self.pending if call.call_id != answered]

    @property
    def needs_repair(self) -> bool:
        """§22.2: repair only when a turn is open."""
        return self.open_turn is not None


def scan(events: Iterable[Event]) -> RepairScan:
    """§22.1: walk *events* and track the open turn, open step and pending calls."""
    state = RepairScan()
    for event in events:
        state.feed(event)
    return state


def append_closers(log: SessionLog, state: RepairScan) -> list[Event]:
    """§22.3: commit the closers *state* calls for into *log*; returns them.

    *log* holds the scanned events; its clock must return the last real
    event's time (every closer carries that time).
    """
    if state.open_turn is None:
        return []
    turn = state.open_turn
    out: list[Event] = []
    for call in state.pending:
        seq = len(log)
        started = call.call_seq is not None
        text = OUTCOME_UNKNOWN_TEXT if started else NOT_STARTED_TEXT
        message = {
            "id": f"interrupted-tool-result-{call.call_id}-{seq}", "role": "user",
            "content": [{"type": "tool-result", "toolCallId": call.call_id,
                         "content": [{"type": "text", "text": text}], "isError": True}],
            "source": {"kind": "tool", "callId": call.call_id},
        }
        error = _OUTCOME_UNKNOWN_ERROR if started else _NOT_STARTED_ERROR
        out.append(log.commit(TOOL_RESULT, {"turn": call.turn, "step": call.step,
                                            "message": message, "error": error},
                              surface_op=APPEND,
                              source_event_seqs=[call.call_seq] if call.call_seq is not None
                              else None))
    if state.open_step is not None:
        out.append(log.commit(STEP_END, {"turn": turn, "step": state.open_step}))
    out.append(log.commit(TURN_END, {"turn": turn, "reason": _INTERRUPTED}))
    return out


def closers(events: Sequence[Event]) -> tuple[Event, ...]:
    """§22.3: the closers a valid log needs (empty when no turn is open). Pure."""
    state = scan(events)
    if not state.needs_repair:
        return ()
    last = state.last_time
    log = SessionLog(events, clock=lambda: last if last is not None else 0)
    return tuple(append_closers(log, state))


# --------------------------------------------------------------------------
# Analysis of stored records (§22.5, D8)
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One stored event record as a backend read it: the event, or why it is not one.

    ``stored_seq`` is the seq the storage itself keys the record by, for
    formats that have one (SQLite's row index); None otherwise.
    """

    index: int
    byte_offset: int | None
    event: Event | None
    damage: Damage | None = None
    stored_seq: int | None = None


class Analysis:
    """S10–S11 one record at a time, so that a load streams its records (S31): the intact
    prefix is replayed into a log as it is read, and every damage is collected.

    Record-level damage (checksum, decoding) is reported wherever it is. The first seq that
    is not its record's position is reported as a gap (too high) or a duplicate (too low).
    The events before the first damage of any kind are replayed through the session
    invariants, and the first violation is reported too; the intact prefix ends before the
    first damage. Only the log is kept: a record after the prefix is judged and dropped.
    """

    def __init__(self, header_damage: Damage | None = None, *,
                 clock: Callable[[], float] | None = None) -> None:
        self.damage: list[Damage] = [header_damage] if header_damage is not None else []
        self.log = SessionLog(clock=clock)
        self.records = 0               # how many records were fed
        self._intact = True            # no damage at any position fed so far
        self._seq_damage: Damage | None = None

    def feed(self, record: RawRecord) -> None:
        position = self.records
        self.records += 1
        if record.damage is not None:
            self.damage.append(record.damage)
            self._intact = False
            return
        event = record.event
        assert event is not None
        if self._seq_damage is None:
            found, what = event.seq, "seq"
            stored = record.stored_seq
            if found == position and stored is not None and stored != position:
                found, what = stored, "stored index"
            if found != position:
                kind: DamageKind = "seq-gap" if found > position else "seq-duplicate"
                self._seq_damage = Damage(kind, position, record.byte_offset,
                                          f"expected seq {position}, found {what} {found}")
                self.damage.append(self._seq_damage)
                self._intact = False
                return
        if not self._intact:
            return
        try:
            self.log.replay(event)
        except InvariantError as error:
            self.damage.append(Damage("invariant-violation", position, record.byte_offset,
                                      str(error)))
            self._intact = False

    def finish(self) -> tuple[SessionLog, list[Damage]]:
        """The intact prefix (as a log) and every damage, in storage order."""
        self.damage.sort(key=lambda d: -1 if d.record_index is None else d.record_index)
        return self.log, self.damage


def analyse(records: Iterable[RawRecord], header_damage: Damage | None = None, *,
            clock: Callable[[], float] | None = None) -> tuple[SessionLog, list[Damage]]:
    """S10–S11: the intact prefix of *records*, replayed into a log, and every damage (see
    `Analysis`); the log uses *clock*."""
    analysis = Analysis(header_damage, clock=clock)
    for record in records:
        analysis.feed(record)
    return analysis.finish()


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _result_call_id(data: FrozenDict) -> object:
    message = data.get("message")
    if isinstance(message, FrozenDict):
        source = message.get("source")
        if isinstance(source, FrozenDict):
            return source.get("callId")
    return None
