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
a typed store error naming its real cause (S5, S32): a read-only database or file system is a
`StoreReadOnlyError`, a full disk (``SQLITE_FULL``, or no room to grow the ``-shm`` index) a
`StoreFullError`, other write failures a `StoreWriteError`, a database that is locked or
cannot be read a `StoreReadError`, and only a file that is not a database (or a corrupt one)
is reported as such.

A database this process cannot write (a read-only file system, or no write permission on
the file, its ``-wal``/``-shm`` files or, to create them, its directory) is opened
read-only (S32): loading, inspecting and listing work; every write is refused with a
`StoreReadOnlyError` naming that cause. SQLite cannot open a WAL database read-only without
its ``-shm`` index, so on a read-only file system, when that index is missing, the database
file is read as immutable, but only when no write-ahead log (or rollback journal) holds
changes that reading would have to apply; otherwise the open is refused rather than reading
a stale database.
"""

from __future__ import annotations

import errno
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
#: The extended result code of a ``-shm`` index that could not be grown: on a full disk (or
#: quota) writing into the index file fails with ENOSPC (or EDQUOT).
_IOERR_SHMSIZE: Final = _IOERR | (19 << 8)
#: I/O errors of reading, never a lack of room.
_IOERR_READS: Final = frozenset({_IOERR | (1 << 8), _IOERR | (2 << 8)})
_WRITE_CAUSES: Final = frozenset({_PERM, _READONLY, _IOERR, _FULL, _CANTOPEN})
_DAMAGE_CAUSES: Final = frozenset({_CORRUPT, _NOTADB})
#: statvfs's flag of a file system mounted read-only (POSIX; no statvfs on Windows).
_ST_RDONLY: Final[int] = getattr(os, "ST_RDONLY", 1)
#: The files beside a database whose content a reader must apply (S32): a write-ahead log,
#: or the rollback journal a writer that died mid-transaction left.
_JOURNALS: Final = (("-wal", "write-ahead log"), ("-journal", "rollback journal"))


def _code(error: sqlite3.Error) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _sqlite_cause(error: sqlite3.Error) -> str:
    """SQLite's own words for *error* and its result code's name (S32: the real cause)."""
    return f"{error} [{getattr(error, 'sqlite_errorname', 'SQLITE_ERROR')}]"


def _statvfs(directory: Path) -> os.statvfs_result | None:
    """The statistics of the file system holding *directory*; None where the platform has
    none (Windows) or they cannot be read."""
    try:
        return os.statvfs(directory) if hasattr(os, "statvfs") else None
    except OSError:
        return None


def _out_of_space(path: Path) -> bool:
    """Whether the file system holding the database *path* has no block (or no inode) left
    for this process: root may use the blocks reserved for it, others may not."""
    stat = _statvfs(Path(os.path.realpath(path)).parent)
    if stat is None:
        return False
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    blocks = stat.f_bfree if root else stat.f_bavail
    inodes = stat.f_ffree if root else stat.f_favail
    return blocks == 0 or (stat.f_files > 0 and inodes == 0)


def _no_room(error: sqlite3.Error, path: Path) -> str | None:
    """S32: the real cause when *error* says the storage has no room, else None."""
    extended = getattr(error, "sqlite_errorcode", None)
    code = _code(error)
    if code == _FULL:
        return _sqlite_cause(error)
    if extended == _IOERR_SHMSIZE:        # writing into the -shm index failed: no room
        reason = os.strerror(errno.ENOSPC) if _out_of_space(path) else \
            "no room on the disk (or in the quota)"
        return (f"{reason}: cannot grow the shared-memory index {path.name}-shm "
                f"({_sqlite_cause(error)})")
    if code == _IOERR and extended not in _IOERR_READS and _out_of_space(path):
        return f"{os.strerror(errno.ENOSPC)} ({_sqlite_cause(error)})"
    return None


def _store_error(error: sqlite3.Error, what: str, *, writing: bool, path: Path,
                 read_only: str | None = None) -> StoreError:
    """The typed store error of a database failure while doing *what* to the database at
    *path* (S5, S32); *read_only* is why the store opened the database read-only, if it
    did."""
    code = _code(error)
    cause = _sqlite_cause(error)
    if code in _DAMAGE_CAUSES:
        return StoreError(f"{what}: not a session database ({cause})")
    if code in (_BUSY, _LOCKED):
        return StoreReadError(f"{what}: the database is locked by another connection ({cause})")
    if code == _READONLY:                         # S32, as S28 for PostgreSQL
        return StoreReadOnlyError(f"{what}: {read_only} ({cause})" if read_only is not None
                                  else f"{what}: {cause}")
    room = _no_room(error, path)
    if room is not None:
        return StoreFullError(f"{what}: {room}")
    if writing or code in _WRITE_CAUSES:
        return StoreWriteError(f"{what}: {cause}")
    return StoreReadError(f"{what}: {cause}")


def _companion(path: Path, suffix: str) -> Path:
    """The ``-wal``, ``-shm`` or ``-journal`` file SQLite keeps beside the database *path*."""
    return path.with_name(path.name + suffix)


def _mounted_read_only(directory: Path) -> bool:
    stat = _statvfs(directory)
    return stat is not None and bool(stat.f_flag & _ST_RDONLY)


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids)


def _read_only_cause(path: Path) -> str | None:
    """S32: why this process cannot write the database *path* (with the ``-wal`` and
    ``-shm`` files a WAL database needs beside it), in the operating system's words; None
    when it can, or cannot tell (SQLite then says what is wrong)."""
    real = Path(os.path.realpath(path))
    directory = real.parent
    if _mounted_read_only(directory):
        return os.strerror(errno.EROFS)
    companions = [_companion(real, suffix) for suffix in ("-wal", "-shm")]
    for file in (real, *companions):
        if file.exists() and not _writable(file):
            return f"{os.strerror(errno.EACCES)} ({file} is not writable)"
    if not all(file.exists() for file in companions) and directory.is_dir() \
            and not os.access(directory, os.W_OK | os.X_OK,
                              effective_ids=os.access in os.supports_effective_ids):
        return f"{os.strerror(errno.EACCES)} (cannot create files in {directory})"
    return None


def _unapplied_journal(path: Path) -> tuple[Path, str] | None:
    """A non-empty write-ahead log or rollback journal beside *path*: changes a reader must
    apply, which it cannot on read-only storage (S32). A file that cannot be examined counts
    as one."""
    real = Path(os.path.realpath(path))
    for suffix, kind in _JOURNALS:
        file = _companion(real, suffix)
        try:
            if file.stat().st_size > 0:
                return file, kind
        except FileNotFoundError:
            continue
        except OSError:
            return file, kind
    return None


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
        #: Why this store opened its database read-only (S32): the operating system's words
        #: for what keeps this process from writing it; None when it can write.
        self.read_only: str | None = _read_only_cause(self.path)
        if self.read_only is not None and not self.path.exists():
            raise StoreReadOnlyError(f"cannot create {self.path}: {self.read_only}")
        try:
            self._db = (self._connect_read_only(timeout) if self.read_only is not None
                        else sqlite3.connect(self.path, timeout=timeout, isolation_level=None))
        except sqlite3.Error as error:
            raise self._error(error, f"cannot open {self.path}", writing=create) from error
        try:
            if create and self.read_only is None:
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'OFF'}")
            self._check_format(create)
        except sqlite3.Error as error:
            self._db.close()
            raise self._error(error, f"cannot open {self.path}", writing=create) from error
        except BaseException:
            self._db.close()
            raise

    def _connect_read_only(self, timeout: float) -> sqlite3.Connection:
        """S32: open the database for reading only, on storage this process cannot write.

        SQLite reads a WAL database read-only when its ``-wal`` and ``-shm`` files exist,
        applying the log. Without them it cannot open it at all; then, on a read-only file
        system (nothing can change the file), the database file is read as immutable, but
        only when no write-ahead log or rollback journal holds changes it would ignore.
        """
        uri = Path(os.path.realpath(self.path)).as_uri()
        db = sqlite3.connect(f"{uri}?mode=ro", timeout=timeout, isolation_level=None,
                             uri=True)
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.Error as error:
            db.close()
            if _code(error) in _DAMAGE_CAUSES or _code(error) in (_BUSY, _LOCKED):
                raise
            failure = error
        unapplied = _unapplied_journal(self.path)
        if unapplied is not None:
            file, kind = unapplied
            raise StoreReadOnlyError(
                f"cannot open {self.path}: its {kind} {file.name} holds changes not yet "
                f"applied to the database file, and they cannot be applied on storage this "
                f"process cannot write ({self.read_only}); reading without them could miss "
                f"flushed events (copy the database and {file.name} to writable storage to "
                f"read it; {_sqlite_cause(failure)})") from failure
        if not _mounted_read_only(Path(os.path.realpath(self.path)).parent):
            # Another process may still write this file: reading it without SQLite's
            # locks (immutable) could see a half-written database.
            raise StoreReadOnlyError(
                f"cannot open {self.path} for reading: {self.read_only}, and SQLite cannot "
                f"read a WAL database without creating its {self.path.name}-shm index "
                f"({_sqlite_cause(failure)})") from failure
        db = sqlite3.connect(f"{uri}?mode=ro&immutable=1", timeout=timeout,
                             isolation_level=None, uri=True)
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except BaseException:
            db.close()
            raise
        return db

    def _error(self, error: sqlite3.Error, what: str, *, writing: bool) -> StoreError:
        """The typed store error of a database failure while doing *what* (S5, S32)."""
        return _store_error(error, what, writing=writing, path=self.path,
                            read_only=self.read_only)

    def _refuse(self, what: str) -> StoreReadOnlyError:
        """S32: the error of a write to a database this store opened read-only."""
        return StoreReadOnlyError(f"{what}: {self.read_only} (the database is open read-only)")

    def _check_format(self, create: bool) -> None:
        """Create the schema (when *create*) and check the format version."""
        if not create or self.read_only is not None:
            found = self._db.execute("SELECT name FROM sqlite_master WHERE type='table' AND "
                                     "name IN ('meta', 'sessions', 'events')").fetchall()
            if len(found) != 3:
                if create:
                    raise StoreReadOnlyError(f"cannot create the session tables in "
                                             f"{self.path}: {self.read_only}")
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
            raise self._error(error, f"cannot look for session {session_id!r} in {self.path}",
                              writing=False) from error

    def _list(self) -> list[str]:
        try:
            return [row[0] for row in self._db.execute("SELECT id FROM sessions ORDER BY id")]
        except sqlite3.Error as error:
            raise self._error(error, f"cannot list the sessions of {self.path}",
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
            raise self._error(error, f"cannot read session {session_id!r} from {self.path}",
                              writing=False) from error
        uid = info.uid if info is not None else header_uid(header)
        records = [decode_event(position, None, crc, _blob(record), idx, uid=uid)
                   for position, (idx, crc, record) in enumerate(rows)]
        return StoredSession(info, header_damage, records, uid=uid)

    def _read_info(self, session_id: str) -> SessionInfo:
        try:
            header = self._header(session_id)
        except sqlite3.Error as error:
            raise self._error(error, f"cannot read session {session_id!r} from {self.path}",
                              writing=False) from error
        info, damage = parse_header(header, session_id, None)
        if damage is not None:
            raise DamageError(session_id, [damage])
        assert info is not None
        return info

    def _create(self, info: SessionInfo, events: Sequence[Event]) -> _Handle:
        if self.read_only is not None:
            raise self._refuse(f"cannot create session {info.session_id!r} in {self.path}")
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
            raise self._error(error, f"cannot create session {info.session_id!r} in "
                              f"{self.path}", writing=True) from error
        return _Handle(info.session_id, info.uid)

    def _reopen(self, session_id: str, stored: StoredSession) -> _Handle:
        return _Handle(session_id, stored.uid)

    def _salvage(self, info: SessionInfo, stored: StoredSession, kept: Sequence[Event],
                 closers: Sequence[Event]) -> tuple[_Handle, str]:
        session_id = info.session_id
        if self.read_only is not None:
            raise self._refuse(f"cannot salvage session {session_id!r} in {self.path} "
                               "(the session is unchanged)")
        salvage = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        now = time.time()
        records = stored.records
        assert isinstance(records, list)   # this backend reads its records as a list
        try:
            self._salvage_rows(info, stored, records, kept, closers, salvage, now)
        except sqlite3.Error as error:
            raise self._error(error, f"cannot salvage session {session_id!r} in {self.path} "
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
        if self.read_only is not None:    # S32: refused at once, as no flush could store it
            raise self._refuse(f"cannot append to session {handle.session_id!r} in "
                               f"{self.path}")
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
            what = f"cannot write session {handle.session_id!r} to {self.path}"
            typed = self._error(error, what, writing=True)                # S32
            if not isinstance(typed, StoreWriteError):
                typed = StoreWriteError(f"{what}: {_sqlite_cause(error)}")
            raise typed from error
        handle.pending.clear()

    def _release(self, handle: _Handle) -> None:
        handle.pending.clear()

    def _close_backend(self) -> None:
        self._db.close()
