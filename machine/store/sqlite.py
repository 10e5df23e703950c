"""The SQLite session store: standard-library ``sqlite3``, WAL journal (S8).

Tables::

    meta(key PRIMARY KEY, value)                      -- ('format', '1')
    sessions(id PRIMARY KEY, header BLOB)             -- the header record of S8
    events(session, idx, crc, record BLOB)            -- PRIMARY KEY (session, idx)
    quarantine(salvage, session, idx, crc, record, moved_at)

``record`` is the event's canonical JSON and ``crc`` its CRC-32; ``idx`` is
the seq. Appends are held in memory and written by ``flush`` in one
transaction (``synchronous=FULL``), so a record is either committed whole or
absent: the SQLite store never has a torn record. Every write is its own
short transaction, so several processes may share one database file.

``crc`` is keyed to the session's ``uid`` (S8, format version 2), so a row copied from
another session's rows is a checksum mismatch (S10). Every database failure is raised as
a typed store error naming its real cause (S5): a read-only database or a full disk is a
`StoreWriteError`, a database that is locked or cannot be read a `StoreReadError`, and
only a file that is not a database (or a corrupt one) is reported as such.
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from machine.events import Event
from machine.store.base import BaseStore, StoredSession
from machine.store.codec import (
    decode_event,
    event_bytes,
    header_bytes,
    header_uid,
    parse_header,
    record_crc,
)
from machine.store.errors import (
    DamageError,
    SessionExistsError,
    SessionNotFoundError,
    StoreError,
    StoreFullError,
    StoreReadError,
    StoreReadOnlyError,
    StoreWriteError,
    UnsupportedFormatError,
)
from machine.store.repair import RawRecord
from machine.store.types import Damage, SessionInfo

__all__ = ["SqliteStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, header BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    session TEXT NOT NULL, idx INTEGER NOT NULL, crc INTEGER NOT NULL, record BLOB NOT NULL,
    PRIMARY KEY (session, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS quarantine (
    salvage TEXT NOT NULL, session TEXT NOT NULL, idx INTEGER, crc INTEGER, record BLOB,
    moved_at REAL NOT NULL);
"""


#: The schema's format version, in ``meta`` (the records' format is per session, S8).
SCHEMA_VERSION: Final = 1

# SQLite's primary result codes (https://sqlite.org/rescode.html) that name the real cause.
_PERM, _BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB = (
    3, 5, 6, 8, 10, 11, 13, 14, 26)
_WRITE_CAUSES: Final = frozenset({_PERM, _READONLY, _IOERR, _FULL, _CANTOPEN})
_DAMAGE_CAUSES: Final = frozenset({_CORRUPT, _NOTADB})


def _code(error: sqlite3.Error) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _store_error(error: sqlite3.Error, what: str, *, writing: bool) -> StoreError:
    """The typed store error of a database failure while doing *what* (S5)."""
    code = _code(error)
    cause = f"{error} [{getattr(error, 'sqlite_errorname', 'SQLITE_ERROR')}]"
    if code in _DAMAGE_CAUSES:
        return StoreError(f"{what}: not a session database ({cause})")
    if code in (_BUSY, _LOCKED):
        return StoreReadError(f"{what}: the database is locked by another connection ({cause})")
    if code == _READONLY:                         # S32, as S28 for PostgreSQL
        return StoreReadOnlyError(f"{what}: {cause}")
    if code == _FULL:
        return StoreFullError(f"{what}: {cause}")
    if writing or code in _WRITE_CAUSES:
        return StoreWriteError(f"{what}: {cause}")
    return StoreReadError(f"{what}: {cause}")


@dataclass(slots=True)
class _Handle:
    session_id: str
    uid: str | None = None
    pending: list[Event] = field(default_factory=list)


def _blob(value: object) -> bytes:
    """A stored record as bytes, whatever type damage left in the column."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8", "surrogatepass")


def _row(session_id: str, event: Event, uid: str | None) -> tuple[str, int, int, bytes]:
    raw = event_bytes(event)
    return session_id, event.seq, record_crc(raw, uid), raw


class SqliteStore(BaseStore[_Handle]):
    """Sessions in one SQLite database file *path* (created if missing).

    *timeout* is how long a write waits for another connection's lock. With
    *create* false the database must already exist and hold the session
    tables; nothing is created (for read-only tools). *fsync* false turns
    SQLite's syncing off (``synchronous=OFF``: for tests and throwaway
    sessions; a commit then survives a process crash but not a power loss).
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0,
                 create: bool = True, fsync: bool = True) -> None:
        super().__init__()
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise StoreError(f"{self.path}: no such database")
        try:
            self._db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
        except sqlite3.Error as error:
            raise _store_error(error, f"cannot open {self.path}", writing=create) from error
        try:
            if create:
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'OFF'}")
            self._check_format(create)
        except sqlite3.Error as error:
            self._db.close()
            raise _store_error(error, f"cannot open {self.path}", writing=create) from error
        except BaseException:
            self._db.close()
            raise

    def _check_format(self, create: bool) -> None:
        """Create the schema (when *create*) and check the format version."""
        if not create:
            found = self._db.execute("SELECT name FROM sqlite_master WHERE type='table' AND "
                                     "name IN ('meta', 'sessions', 'events')").fetchall()
            if len(found) != 3:
                raise StoreError(f"{self.path}: not a session database (no session tables)")
            row = self._db.execute("SELECT value FROM meta WHERE key='format'").fetchone()
        else:
            with self._transaction():
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                row = self._db.execute("SELECT value FROM meta WHERE key='format'").fetchone()
                if row is None:
                    self._db.execute("INSERT INTO meta VALUES ('format', ?)",
                                     (str(SCHEMA_VERSION),))
                    row = (str(SCHEMA_VERSION),)
        if row is None or row[0] != str(SCHEMA_VERSION):
            raise UnsupportedFormatError(
                f"{self.path} has format version {None if row is None else row[0]!r}; this "
                f"code reads version {SCHEMA_VERSION}")

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    # -- primitives ---------------------------------------------------------------

    def _exists(self, session_id: str) -> bool:
        try:
            return self._db.execute("SELECT 1 FROM sessions WHERE id=?",
                                    (session_id,)).fetchone() is not None
        except sqlite3.Error as error:
            raise _store_error(error, f"cannot look for session {session_id!r} in {self.path}",
                               writing=False) from error

    def _list(self) -> list[str]:
        try:
            return [row[0] for row in self._db.execute("SELECT id FROM sessions ORDER BY id")]
        except sqlite3.Error as error:
            raise _store_error(error, f"cannot list the sessions of {self.path}",
                               writing=False) from error

    def _header(self, session_id: str) -> bytes:
        row = self._db.execute("SELECT header FROM sessions WHERE id=?",
                               (session_id,)).fetchone()
        if row is None:
            raise SessionNotFoundError(f"no session {session_id!r} in {self.path}")
        return _blob(row[0])

    def _read(self, session_id: str) -> StoredSession:
        try:
            header = self._header(session_id)
            info, header_damage = parse_header(header, session_id, None)
            rows = self._db.execute(
                "SELECT idx, crc, record FROM events WHERE session=? ORDER BY idx",
                (session_id,)).fetchall()
        except sqlite3.Error as error:
            if _code(error) in _DAMAGE_CAUSES:
                raise DamageError(session_id, [Damage("undecodable", None, None,
                                                      f"database: {error}")]) from error
            raise _store_error(error, f"cannot read session {session_id!r} from {self.path}",
                               writing=False) from error
        uid = info.uid if info is not None else header_uid(header)
        records = [decode_event(position, None, crc, _blob(record), idx, uid=uid)
                   for position, (idx, crc, record) in enumerate(rows)]
        return StoredSession(info, header_damage, records, uid=uid)

    def _read_info(self, session_id: str) -> SessionInfo:
        try:
            header = self._header(session_id)
        except sqlite3.Error as error:
            raise _store_error(error, f"cannot read session {session_id!r} from {self.path}",
                               writing=False) from error
        info, damage = parse_header(header, session_id, None)
        if damage is not None:
            raise DamageError(session_id, [damage])
        assert info is not None
        return info

    def _create(self, info: SessionInfo, events: Sequence[Event]) -> _Handle:
        try:
            with self._transaction():
                self._db.execute("INSERT INTO sessions VALUES (?, ?)",
                                 (info.session_id, header_bytes(info)))
                self._db.executemany("INSERT INTO events VALUES (?, ?, ?, ?)",
                                     [_row(info.session_id, event, info.uid)
                                      for event in events])
        except sqlite3.IntegrityError:
            raise SessionExistsError(f"session {info.session_id!r} already exists") from None
        except sqlite3.Error as error:
            raise _store_error(error, f"cannot create session {info.session_id!r} in "
                               f"{self.path}", writing=True) from error
        return _Handle(info.session_id, info.uid)

    def _reopen(self, session_id: str, stored: StoredSession) -> _Handle:
        return _Handle(session_id, stored.uid)

    def _salvage(self, info: SessionInfo, stored: StoredSession, kept: Sequence[Event],
                 closers: Sequence[Event]) -> tuple[_Handle, str]:
        session_id = info.session_id
        salvage = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        now = time.time()
        records = stored.records
        assert isinstance(records, list)   # this backend reads its records as a list
        try:
            self._salvage_rows(info, stored, records, kept, closers, salvage, now)
        except sqlite3.Error as error:
            raise _store_error(error, f"cannot salvage session {session_id!r} in {self.path} "
                               "(the session is unchanged)", writing=True) from error
        return _Handle(session_id, info.uid), f"{self.path}#quarantine/{salvage}"

    def _salvage_rows(self, info: SessionInfo, stored: StoredSession,
                      records: list[RawRecord], kept: Sequence[Event],
                      closers: Sequence[Event], salvage: str, now: float) -> None:
        session_id = info.session_id
        with self._transaction():
            if len(kept) < len(records):
                first = records[len(kept)].stored_seq
                self._db.execute(
                    "INSERT INTO quarantine SELECT ?, session, idx, crc, record, ? FROM events "
                    "WHERE session=? AND idx>=?", (salvage, now, session_id, first))
                self._db.execute("DELETE FROM events WHERE session=? AND idx>=?",
                                 (session_id, first))
            if stored.header_damage is not None:
                self._db.execute(
                    "INSERT INTO quarantine SELECT ?, id, NULL, NULL, header, ? FROM sessions "
                    "WHERE id=?", (salvage, now, session_id))
                self._db.execute("UPDATE sessions SET header=? WHERE id=?",
                                 (header_bytes(info), session_id))
            self._db.executemany("INSERT INTO events VALUES (?, ?, ?, ?)",
                                 [_row(session_id, event, info.uid) for event in closers])

    def _write(self, handle: _Handle, events: Sequence[Event]) -> None:
        handle.pending.extend(events)

    def _sync(self, handle: _Handle) -> None:
        if not handle.pending:
            return
        try:
            with self._transaction():
                self._db.executemany("INSERT INTO events VALUES (?, ?, ?, ?)",
                                     [_row(handle.session_id, event, handle.uid)
                                      for event in handle.pending])
        except sqlite3.Error as error:  # rolled back: the events stay pending
            kind = {_READONLY: StoreReadOnlyError, _FULL: StoreFullError}.get(
                _code(error) or 0, StoreWriteError)           # S32
            raise kind(f"cannot write session {handle.session_id!r} to {self.path}: {error} "
                       f"[{getattr(error, 'sqlite_errorname', 'SQLITE_ERROR')}]") from error
        handle.pending.clear()

    def _release(self, handle: _Handle) -> None:
        handle.pending.clear()

    def _close_backend(self) -> None:
        self._db.close()
