"""Errors of the session stores (specs/persistence.md, rules S1–S22).

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
    "SessionNotFoundError",
    "SessionNotOpenError",
    "StoreClosedError",
    "StoreError",
    "StoreReadError",
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


class UnsupportedFormatError(StoreError):
    """The stored session was written in a format version this code does not read (S9)."""

    code = "UNSUPPORTED_FORMAT"


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
