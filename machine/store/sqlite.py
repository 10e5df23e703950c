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
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from machine.events import Event
from machine.store.base import BaseStore, StoredSession
from machine.store.codec import FORMAT_VERSION, decode_event, event_bytes, header_bytes, parse_header
from machine.store.errors import (
    DamageError,
    SessionExistsError,
    SessionNotFoundError,
    StoreError,
    StoreWriteError,
    UnsupportedFormatError,
)
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


@dataclass(slots=True)
class _Handle:
    session_id: str
    pending: list[Event] = field(default_factory=list)


def _blob(value: object) -> bytes:
    """A stored record as bytes, whatever type damage left in the column."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8", "surrogatepass")


def _row(session_id: str, event: Event) -> tuple[str, int, int, bytes]:
    raw = event_bytes(event)
    return session_id, event.seq, zlib.crc32(raw), raw


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
        self._db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
        try:
            if create:
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'OFF'}")
            self._check_format(create)
        except sqlite3.DatabaseError as error:
            self._db.close()
            raise StoreError(f"{self.path}: not a session database ({error})") from error
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
                                     (str(FORMAT_VERSION),))
                    row = (str(FORMAT_VERSION),)
        if row is None or row[0] != str(FORMAT_VERSION):
            raise UnsupportedFormatError(
                f"{self.path} has format version {None if row is None else row[0]!r}; this "
                f"code reads version {FORMAT_VERSION}")

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
        return self._db.execute("SELECT 1 FROM sessions WHERE id=?",
                                (session_id,)).fetchone() is not None

    def _list(self) -> list[str]:
        return [row[0] for row in self._db.execute("SELECT id FROM sessions ORDER BY id")]

    def _header(self, session_id: str) -> bytes:
        row = self._db.execute("SELECT header FROM sessions WHERE id=?",
                               (session_id,)).fetchone()
        if row is None:
            raise SessionNotFoundError(f"no session {session_id!r} in {self.path}")
        return _blob(row[0])

    def _read(self, session_id: str) -> StoredSession:
        try:
            info, header_damage = parse_header(self._header(session_id), session_id, None)
            rows = self._db.execute(
                "SELECT idx, crc, record FROM events WHERE session=? ORDER BY idx",
                (session_id,)).fetchall()
        except sqlite3.DatabaseError as error:
            raise DamageError(session_id, [Damage("undecodable", None, None,
                                                  f"database: {error}")]) from error
        records = [decode_event(position, None, crc, _blob(record), idx)
                   for position, (idx, crc, record) in enumerate(rows)]
        return StoredSession(info, header_damage, records)

    def _read_info(self, session_id: str) -> SessionInfo:
        info, damage = parse_header(self._header(session_id), session_id, None)
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
                                     [_row(info.session_id, event) for event in events])
        except sqlite3.IntegrityError:
            raise SessionExistsError(f"session {info.session_id!r} already exists") from None
        return _Handle(info.session_id)

    def _reopen(self, session_id: str, stored: StoredSession) -> _Handle:
        return _Handle(session_id)

    def _salvage(self, info: SessionInfo, stored: StoredSession, kept: Sequence[Event],
                 closers: Sequence[Event]) -> tuple[_Handle, str]:
        session_id = info.session_id
        salvage = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        now = time.time()
        with self._transaction():
            if len(kept) < len(stored.records):
                first = stored.records[len(kept)].stored_seq
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
                                 [_row(session_id, event) for event in closers])
        return _Handle(session_id), f"{self.path}#quarantine/{salvage}"

    def _write(self, handle: _Handle, events: Sequence[Event]) -> None:
        handle.pending.extend(events)

    def _sync(self, handle: _Handle) -> None:
        if not handle.pending:
            return
        try:
            with self._transaction():
                self._db.executemany("INSERT INTO events VALUES (?, ?, ?, ?)",
                                     [_row(handle.session_id, event) for event in handle.pending])
        except sqlite3.Error as error:  # rolled back: the events stay pending
            raise StoreWriteError(f"cannot write session {handle.session_id!r} to "
                                  f"{self.path}: {error}") from error
        handle.pending.clear()

    def _release(self, handle: _Handle) -> None:
        handle.pending.clear()

    def _close_backend(self) -> None:
        self._db.close()
