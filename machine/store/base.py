"""The backend-independent half of a session store (specs/persistence.md, S1–S17).

`BaseStore` implements the `SessionStore` protocol once: live-session
tracking, loading (read, analyse, repair, salvage), appends checked against a
mirror `SessionLog`, and fork. A backend supplies a handful of storage
primitives (the abstract methods below): reading a session's records,
creating one atomically, reopening one for append (cutting a torn tail),
rewriting a salvaged one, writing records and making them durable.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Generic, TypeVar, cast

from machine.errors import InvariantError, ValidationError
from machine.events import TURN_END, TURN_START, Event
from machine.log import SessionLog
from machine.store.codec import new_uid
from machine.store.errors import (
    DamageError,
    LiveTurnOpenError,
    OpenTurnError,
    SessionExistsError,
    SessionNotOpenError,
    StoreClosedError,
    StoreWriteError,
)
from machine.store.repair import Analysis, RawRecord, append_closers, scan
from machine.store.types import (
    LOAD_MODES,
    Damage,
    Inspection,
    LoadMode,
    LoadReport,
    LoadResult,
    SessionInfo,
    check_session_id,
)

__all__ = ["BaseStore", "StoredSession"]

H = TypeVar("H")


@dataclass(frozen=True, slots=True)
class StoredSession:
    """What a backend read for one session (before analysis).

    ``info`` is the decoded header (None when it could not be decoded),
    ``torn_bytes`` the size of a torn final record (S9), ``valid_length`` the
    stored size without it, for formats measured in bytes. ``records`` may be a
    one-pass iterator (JSONL streams its records, S31). ``uid`` is the identity the
    records were checked against (S8): the header's, or the one a damaged header still
    names; None for a version-1 session.
    """

    info: SessionInfo | None
    header_damage: Damage | None
    records: Iterable[RawRecord]
    torn_bytes: int = 0
    valid_length: int | None = None
    uid: str | None = None


@dataclass(slots=True)
class _Live(Generic[H]):
    """A session open for append in this store (S4): its mirror log and storage handle."""

    info: SessionInfo
    log: SessionLog
    clock: list[float]
    handle: H
    broken: str | None = None


@dataclass(slots=True)
class _Plan:
    """A load worked out but not yet carried out (S9–S13)."""

    stored: StoredSession
    info: SessionInfo
    kept: Sequence[Event]
    damage: list[Damage]
    log: SessionLog
    clock: list[float]
    records: int = 0
    closers: list[Event] = field(default_factory=list)


def _mirror(events: Sequence[Event]) -> tuple[SessionLog, list[float]]:
    """A log replaying *events* whose clock stamps whatever time is put in the cell."""
    clock: list[float] = [events[-1].time if events else 0]
    return SessionLog(events, clock=lambda: clock[0]), clock


class BaseStore(ABC, Generic[H]):
    """A `SessionStore` over a backend's storage primitives (S1–S17)."""

    def __init__(self) -> None:
        self._live: dict[str, _Live[H]] = {}
        self._closed = False

    # -- storage primitives (the backend) -------------------------------------

    @abstractmethod
    def _exists(self, session_id: str) -> bool:
        """Whether storage holds a session with this id."""

    @abstractmethod
    def _list(self) -> list[str]:
        """The ids of the stored sessions, sorted."""

    @abstractmethod
    def _read(self, session_id: str) -> StoredSession:
        """Read a stored session's header and records; raise SessionNotFoundError if absent."""

    @abstractmethod
    def _read_info(self, session_id: str) -> SessionInfo:
        """Read only the header; raise SessionNotFoundError or DamageError."""

    @abstractmethod
    def _create(self, info: SessionInfo, events: Sequence[Event]) -> H:
        """Store a new session with *events*, durably and exclusively (SessionExistsError)."""

    @abstractmethod
    def _reopen(self, session_id: str, stored: StoredSession) -> H:
        """Open a stored session for append, durably cutting off its torn final record."""

    @abstractmethod
    def _salvage(self, info: SessionInfo, stored: StoredSession, kept: Sequence[Event],
                 closers: Sequence[Event]) -> tuple[H, str]:
        """Durably replace the session by its kept prefix and closers, keeping the damaged
        original elsewhere; returns the handle and where the original went (S13)."""

    @abstractmethod
    def _write(self, handle: H, events: Sequence[Event]) -> None:
        """Append records; on failure raise StoreWriteError (``recovered`` if nothing is left)."""

    @abstractmethod
    def _sync(self, handle: H) -> None:
        """Make every record written through *handle* durable (S6)."""

    @abstractmethod
    def _release(self, handle: H) -> None:
        """Give up the handle (its records are already durable)."""

    def _close_backend(self) -> None:
        """Release backend resources when the store closes."""

    # -- the protocol ------------------------------------------------------------

    def create(self, session_id: str, *, parent: str | None = None, seed_length: int = 0,
               cwd: str | None = None) -> SessionInfo:
        """S3: create an empty session durably and open it for append."""
        self._check_usable()
        info = SessionInfo(check_session_id(session_id), parent, seed_length, cwd, new_uid())
        if session_id in self._live or self._exists(session_id):
            raise SessionExistsError(f"session {session_id!r} already exists")
        self._go_live(info, [], self._create(info, ()))
        return info

    def load(self, session_id: str, mode: LoadMode = "strict") -> LoadResult:
        """S9–S14: load a session, repair it durably, and open it for append."""
        self._check_usable()
        check_session_id(session_id)
        if mode not in LOAD_MODES:
            raise ValidationError("mode", f"must be 'strict' or 'salvage', not {mode!r}")
        live = self._live.get(session_id)
        if live is not None:  # S14 (§22.6): never crash-repaired
            self._sync(live.handle)
            if live.log.open_turn is not None:
                raise LiveTurnOpenError(
                    f"live turn is open: session {session_id!r} is open in this store and its "
                    f"turn {live.log.open_turn} has not ended")
            return LoadResult(live.log.events, LoadReport(live=True), live.info)
        plan = self._plan(session_id)
        if plan.damage and mode == "strict":
            raise DamageError(session_id, plan.damage)
        quarantine: str | None = None
        if plan.damage:
            handle, quarantine = self._salvage(plan.info, plan.stored, plan.kept, plan.closers)
        else:
            handle = self._reopen(session_id, plan.stored)
            if plan.closers:
                try:
                    self._write(handle, plan.closers)
                    self._sync(handle)
                except BaseException:
                    self._release(handle)
                    raise
        live = _Live(plan.info, plan.log, plan.clock, handle)
        self._live[session_id] = live
        report = LoadReport(plan.stored.torn_bytes, tuple(plan.damage), len(plan.closers),
                            quarantine)
        return LoadResult(live.log.events, report, plan.info)

    def inspect(self, session_id: str) -> Inspection:
        """S15: what a load would keep, report and append; writes nothing."""
        self._check_usable()
        check_session_id(session_id)
        live = self._live.get(session_id)
        if live is not None:
            return Inspection(live.info, live.log.events, (), LoadReport(live=True),
                              len(live.log))
        plan = self._plan(session_id)
        report = LoadReport(plan.stored.torn_bytes, tuple(plan.damage), len(plan.closers))
        return Inspection(plan.info, plan.kept, tuple(plan.closers), report, plan.records)

    def append(self, session_id: str, event: Event) -> None:
        """S5: append the next event; checked against the invariants before it is written."""
        self._check_usable()
        live = self._require_live(session_id)
        if not isinstance(event, Event):
            raise ValidationError("event", f"must be an Event, not {type(event).__name__}")
        if live.broken is not None:
            raise StoreWriteError(f"session {session_id!r} refuses appends after a failed "
                                  f"write ({live.broken}); load it again", recovered=False)
        expected = len(live.log)
        if event.seq != expected:
            raise InvariantError("L1", f"{event.type}: expected seq {expected}, got {event.seq}")
        surface_op, sources = _envelope(event)
        live.log.check(event.type, event.data, surface_op=surface_op, source_event_seqs=sources,
                       ignorable=event.ignorable)
        try:
            self._write(live.handle, (event,))
        except StoreWriteError as error:
            if not error.recovered:
                live.broken = str(error)
            raise
        live.clock[0] = event.time
        live.log.commit(event.type, event.data, surface_op=surface_op, source_event_seqs=sources,
                        ignorable=event.ignorable)

    def flush(self, session_id: str) -> None:
        """S6: make everything appended to the session so far durable."""
        self._check_usable()
        self._sync(self._require_live(session_id).handle)

    def fork(self, source_id: str, boundary: int | None = None,
             child_id: str | None = None) -> str:
        """S17 (§24): copy the prefix of an open session up to *boundary* into a new session."""
        self._check_usable()
        if child_id is None:
            child_id = f"fork-{uuid.uuid4().hex}"
        check_session_id(child_id, "child_id")
        if child_id in self._live or self._exists(child_id):  # checked first (§24.1)
            raise SessionExistsError(f"child session id {child_id!r} is already in use")
        check_session_id(source_id, "source_id")
        source = self._require_live(source_id)
        events = source.log.events
        length = _fork_length(events, boundary)
        self._sync(source.handle)  # the child never holds more than the parent has stored
        copies = [Event.from_json(event.to_json()) for event in events[:length]]  # detached
        info = SessionInfo(child_id, source_id, length, source.info.cwd, new_uid())
        self._go_live(info, copies, self._create(info, copies))
        return child_id

    def list_sessions(self) -> list[str]:
        self._check_usable()
        return self._list()

    def info(self, session_id: str) -> SessionInfo:
        """The header of a session (from memory when it is open here)."""
        self._check_usable()
        check_session_id(session_id)
        live = self._live.get(session_id)
        return live.info if live is not None else self._read_info(session_id)

    def is_open(self, session_id: str) -> bool:
        """Whether the session is open for append (live) in this store (S4)."""
        return session_id in self._live

    def release(self, session_id: str) -> None:
        """S7: flush an open session and stop treating it as live; a no-op otherwise."""
        self._check_usable()
        live = self._live.pop(session_id, None)
        if live is not None:
            try:
                self._sync(live.handle)
            finally:
                self._release(live.handle)

    def close(self) -> None:
        """S7: flush and release every open session, then close the store. Idempotent."""
        if self._closed:
            return
        first_error: BaseException | None = None
        for session_id in list(self._live):
            try:
                self.release(session_id)
            except Exception as error:  # release the others, then report the first
                first_error = first_error or error
        self._closed = True
        self._close_backend()
        if first_error is not None:
            raise first_error

    def __enter__(self) -> BaseStore[H]:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")

    def _require_live(self, session_id: str) -> _Live[H]:
        live = self._live.get(session_id)
        if live is None:
            check_session_id(session_id)
            raise SessionNotOpenError(f"session {session_id!r} is not open in this store "
                                      "(create or load it first)")
        return live

    def _go_live(self, info: SessionInfo, events: Sequence[Event], handle: H) -> None:
        log, clock = _mirror(events)
        self._live[info.session_id] = _Live(info, log, clock, handle)

    def _plan(self, session_id: str) -> _Plan:
        """S9–S12: read, analyse, and work out the closers of the intact prefix."""
        stored = self._read(session_id)
        clock: list[float] = [0]
        analysis = Analysis(stored.header_damage, clock=lambda: clock[0])
        for record in stored.records:       # one pass: JSONL streams them (S31)
            analysis.feed(record)
        log, damage = analysis.finish()
        kept = log.events                   # a view: nothing decoded twice
        if len(kept):
            clock[0] = kept[-1].time
        info = stored.info if stored.info is not None else SessionInfo(session_id,
                                                                       uid=stored.uid)
        if info.session_id != session_id:
            info = SessionInfo(session_id, info.parent, info.seed_length, info.cwd, info.uid)
        plan = _Plan(stored, info, kept, damage, log, clock, analysis.records)
        plan.closers = append_closers(log, scan(kept))
        return plan


def _envelope(event: Event) -> tuple[str | Mapping[str, object] | None, Sequence[int] | None]:
    """An event's surfaceOp and sourceEventSeqs typed as `SessionLog.commit` takes them."""
    return (cast("str | Mapping[str, object] | None", event.surface_op),
            cast("Sequence[int] | None", event.source_event_seqs))


def _fork_length(events: Sequence[Event], boundary: int | None) -> int:
    """§24.1: how many events a fork at *boundary* copies; OPEN_TURN inside an open turn."""
    if boundary is None:
        if not events:
            return 0
        boundary = len(events) - 1
    elif type(boundary) is not int or not 0 <= boundary < len(events) \
            or events[boundary].seq != boundary:
        raise ValidationError("boundary", f"{boundary!r} does not name an event of the source "
                              f"(it has {len(events)} events)")
    for position in range(boundary, -1, -1):
        kind = events[position].type
        if kind == TURN_END:
            break
        if kind == TURN_START:
            turn = events[position].data.get("turn")
            raise OpenTurnError(f"fork boundary {boundary} lies inside turn {turn}, opened at "
                                f"seq {position} (fork at a turn/end or a between-turn event)")
    return boundary + 1
