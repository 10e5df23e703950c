"""Errors of the session stores (specs/persistence.md, rules S1–S34).

Every store error is a coded `TurnstileError` (§0.9). `DamageError` is the
strict-mode load failure of D8: it names the kind and position of the first
damage and carries the whole list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from machine.errors import TurnstileError

if TYPE_CHECKING:
    from machine.store.types import Damage

__all__ = [
    "CompactionError",
    "DamageError",
    "LiveTurnOpenError",
    "OpenTurnError",
    "SessionExistsError",
    "SessionLockedError",
    "SessionLostError",
    "SessionNotFoundError",
    "SessionNotOpenError",
    "StoreClosedError",
    "StoreConnectionError",
    "StoreError",
    "StoreFullError",
    "StoreReadError",
    "StoreReadOnlyError",
    "StoreTimeoutError",
    "StoreWriteError",
    "UnsupportedFormatError",
]


class StoreError(TurnstileError):
    """Base class of the store errors."""

    code = "STORE_ERROR"


class SessionExistsError(StoreError):
    """The session id is already in use (S3, S17)."""

    code = "SESSION_EXISTS"


class SessionNotFoundError(StoreError):
    """No stored session has this id."""

    code = "SESSION_NOT_FOUND"


class SessionNotOpenError(StoreError):
    """The operation needs a session that is open (live) in this store (S5, S17)."""

    code = "SESSION_NOT_OPEN"


class StoreClosedError(StoreError):
    """The store was closed (S7)."""

    code = "STORE_CLOSED"


class StoreWriteError(StoreError):
    """Writing to storage failed (S3, S5, S6, S12, S13): a read-only file system, a full
    disk, a permission; the message names the operation, the file and the real cause.

    ``recovered`` is true when the failed write left nothing behind; when it
    is false the session refuses further appends until it is loaded again.
    """

    code = "STORE_WRITE_FAILED"

    def __init__(self, message: str, *, recovered: bool = True) -> None:
        super().__init__(message)
        self.recovered = recovered


class StoreReadError(StoreError):
    """Reading from storage failed (S5): a permission, an I/O error, a lock; the message
    names the operation, the file and the operating system's or database's own cause."""

    code = "STORE_READ_FAILED"


class StoreReadOnlyError(StoreWriteError):
    """The storage refuses writes: a read-only database, file system or server (S5, S6, S28)."""

    code = "STORE_READ_ONLY"


class StoreFullError(StoreWriteError):
    """The storage has no room left: a full disk or quota (S5, S6, S28)."""

    code = "STORE_FULL"


class StoreConnectionError(StoreError):
    """The connection to a database server could not be made or was lost (S27, S28).

    Nothing was half-written: a transaction the loss interrupted either
    committed whole or not at all, and the store finds out which when it
    reconnects (S27).
    """

    code = "STORE_CONNECTION_LOST"


class StoreTimeoutError(StoreError):
    """A database statement ran past its time limit and was cancelled (S28); nothing of it
    was kept."""

    code = "STORE_TIMEOUT"


class SessionLockedError(StoreError):
    """Another store instance holds the session for writing (S26, S33): one writer per
    session."""

    code = "SESSION_LOCKED"


class SessionLostError(StoreWriteError):
    """This store lost its hold on an open session (S27): its connection dropped and, before
    it could take the session back, another writer took or changed it. The unflushed
    events were not stored; the session refuses appends until it is loaded again."""

    code = "SESSION_LOST"

    def __init__(self, message: str) -> None:
        super().__init__(message, recovered=False)


class UnsupportedFormatError(StoreError):
    """The stored session was written in a format version this code does not read (S9)."""

    code = "UNSUPPORTED_FORMAT"


class UnreadableSessionError(StoreError):
    """D16, S34: a session holds an event whose type this build does not read, and its writer
    did not mark it ignorable; resuming it would go on from a history read in part.

    ``seq`` and ``event_type`` name the first such event; the session was released again."""

    code = "UNREADABLE_SESSION"

    def __init__(self, message: str, *, seq: int, event_type: str) -> None:
        super().__init__(message)
        self.seq = seq
        self.event_type = event_type


class OpenTurnError(StoreError):
    """A fork boundary lies inside an open turn (§24.1, S17)."""

    code = "OPEN_TURN"


class LiveTurnOpenError(StoreError):
    """A load of a session live in this store while one of its turns is open (§22.6, S14)."""

    code = "LIVE_TURN_OPEN"


class CompactionError(StoreError):
    """A compaction was refused (§25, S20); ``code`` says why."""

    code = "COMPACTION_REFUSED"


class DamageError(StoreError):
    """A stored session is damaged (§22.5 step 2, D8, S11).

    ``kind``, ``record_index`` and ``byte_offset`` describe the first damage
    (in storage order); ``damage`` lists every damage found. Nothing was
    truncated, skipped or rewritten, and the session was not opened.
    """

    code = "SESSION_DAMAGED"

    def __init__(self, session_id: str, damage: Sequence[Damage]) -> None:
        if not damage:
            raise ValueError("DamageError needs at least one damage")
        self.session_id = session_id
        self.damage: tuple[Damage, ...] = tuple(damage)
        first = self.damage[0]
        self.kind = first.kind
        self.record_index = first.record_index
        self.byte_offset = first.byte_offset
        more = f" (and {len(self.damage) - 1} more)" if len(self.damage) > 1 else ""
        super().__init__(f"session {session_id!r} is damaged: {first}{more}")
