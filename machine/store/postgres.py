"""The PostgreSQL session store: sessions on a database server that many hosts share (S23–S28).

Tables, in one schema (``turnstile`` by default) that the store creates and
versions (S24)::

    meta(key PRIMARY KEY, value)                          -- ('schema', '1')
    sessions(id PRIMARY KEY, lock_key UNIQUE, token, header, created_at)
    events(session REFERENCES sessions, idx, crc, record) -- PRIMARY KEY (session, idx)
    quarantine(salvage, session, idx, crc, record, moved_at)

``record`` is the event's canonical JSON (S8) and ``idx`` its seq; ``crc``
is the CRC-32 of the session id, a NUL byte and the record, so a row carries
its session key twice and a row copied or moved from another session fails
its checksum (S25). Appends are held in memory; ``flush`` writes them in one
transaction (S27). One writer per session: an open session holds a
PostgreSQL advisory lock on the store's connection, which the server drops
the moment that connection ends (S26).

Requires the optional ``psycopg`` 3 dependency (``pip install
'turnstile-agent[postgres]'``).
"""

from __future__ import annotations

import math
import os
import re
import socket
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, TypeVar

from machine.errors import ValidationError
from machine.events import Event
from machine.store.base import BaseStore, StoredSession
from machine.store.codec import decode_event, event_bytes, header_bytes, parse_header
from machine.store.errors import (
    DamageError,
    SessionExistsError,
    SessionLockedError,
    SessionLostError,
    SessionNotFoundError,
    StoreConnectionError,
    StoreError,
    StoreFullError,
    StoreReadOnlyError,
    StoreTimeoutError,
    UnsupportedFormatError,
)
from machine.store.repair import RawRecord
from machine.store.types import LOAD_MODES, Damage, LoadMode, LoadResult, SessionInfo, check_session_id

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql
    from psycopg.rows import TupleRow

    _Conn = psycopg.Connection[TupleRow]

__all__ = ["SCHEMA_VERSION", "PostgresStore", "row_crc"]

#: S24: the version of the table layout this code creates and reads.
SCHEMA_VERSION: Final = 1
DEFAULT_SCHEMA: Final = "turnstile"
_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_TABLES: Final = ("meta", "sessions", "events", "quarantine")
_INSTALL: Final = ("PostgresStore needs psycopg 3 and libpq: pip install 'turnstile-agent[postgres]' "
                   "(or 'psycopg[binary]', which bundles libpq)")

#: S24: how each version is reached from the one before (index 0 builds version 1).
_MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = ((
    "CREATE SCHEMA IF NOT EXISTS {schema}",
    "CREATE TABLE {schema}.meta (key text PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE {schema}.sessions ("
    " id text PRIMARY KEY,"
    " lock_key integer GENERATED ALWAYS AS IDENTITY UNIQUE,"
    " token text NOT NULL,"
    " header bytea NOT NULL,"
    " created_at timestamptz NOT NULL DEFAULT now())",
    "CREATE TABLE {schema}.events ("
    " session text NOT NULL REFERENCES {schema}.sessions (id),"
    " idx bigint NOT NULL, crc bigint NOT NULL, record bytea NOT NULL,"
    " PRIMARY KEY (session, idx))",
    "CREATE TABLE {schema}.quarantine ("
    " salvage text NOT NULL, session text NOT NULL, idx bigint, crc bigint, record bytea,"
    " moved_at timestamptz NOT NULL DEFAULT now())",
),)
assert len(_MIGRATIONS) == SCHEMA_VERSION

_CONNECTION_STATES: Final = frozenset({"57P01", "57P02", "57P03"})  # shutdown, crash, starting
T = TypeVar("T")
_Row = tuple[int, int, bytes]  # idx, crc, record


def row_crc(session_id: str, record: bytes) -> int:
    """S25: a row's checksum: the CRC-32 of the session id, a NUL byte and the record."""
    return zlib.crc32(record, zlib.crc32(session_id.encode("ascii") + b"\0"))


def _rows(session_id: str, events: Sequence[Event]) -> list[_Row]:
    out: list[_Row] = []
    for event in events:
        raw = event_bytes(event)
        out.append((event.seq, row_crc(session_id, raw), raw))
    return out


def _decode_row(session_id: str, position: int, idx: int, crc: object, raw: bytes) -> RawRecord:
    """One stored row (S25): its event, or the damage that keeps it out (S10)."""
    expected = row_crc(session_id, raw)
    if crc != expected:
        return RawRecord(position, None, None, Damage(
            "checksum-mismatch", position, None,
            f"stored crc {crc!r}, computed {expected} for session {session_id!r} (the row is "
            "corrupted, or was copied or moved from another session)"), idx)
    return decode_event(position, None, zlib.crc32(raw), raw, idx)


def _import_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
    except ImportError as error:
        raise StoreError(f"{_INSTALL} ({error})") from error


@dataclass(slots=True)
class _Handle:
    """An open session (S4) as this store holds it: its lock and what is durable."""

    session_id: str
    lock_key: int
    durable: int  # rows known to be committed: seqs 0..durable-1
    last_crc: int | None  # the crc of row durable-1
    pending: list[_Row] = field(default_factory=list)
    lost: str | None = None


class PostgresStore(BaseStore[_Handle]):
    """Sessions in a PostgreSQL database (S23–S28), shared by every host that connects to it.

    *conninfo* is a libpq connection string or URL (``postgresql://user@host/db``; empty:
    libpq's environment variables). *schema* names the PostgreSQL schema holding the tables;
    with *create* (the default) it is created when missing, otherwise it must exist.
    *fsync* false commits with ``synchronous_commit=off`` (for tests and throwaway sessions:
    a commit survives a crash of this process, not a crash of the server).

    *statement_timeout* (seconds, None for the server's setting) cancels any statement that
    runs longer (`StoreTimeoutError`); *lock_wait* is how long `load` and `fork`/`create`
    wait for a session another store holds before `SessionLockedError` (0: do not wait);
    *connect_timeout* bounds each connection attempt; *keepalive* (seconds) is the TCP
    keepalive idle time of both ends, so a vanished peer is noticed in about twice that.
    """

    def __init__(self, conninfo: str = "", *, schema: str = DEFAULT_SCHEMA, create: bool = True,
                 fsync: bool = True, statement_timeout: float | None = None,
                 lock_wait: float = 0.0, connect_timeout: float = 10.0,
                 keepalive: float = 30.0, application_name: str | None = None) -> None:
        super().__init__()
        _import_psycopg()
        if not isinstance(schema, str) or _SCHEMA_NAME.fullmatch(schema) is None \
                or schema.startswith("pg_"):
            raise ValidationError("schema", f"{schema!r} is not a schema name (1-63 characters "
                                  "of a-z 0-9 _, not starting with a digit or pg_)")
        for name, value, positive in (("statement_timeout", statement_timeout, True),
                                      ("lock_wait", lock_wait, False),
                                      ("connect_timeout", connect_timeout, True),
                                      ("keepalive", keepalive, True)):
            if value is None and name == "statement_timeout":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0 or (positive and value == 0):
                raise ValidationError(name, f"must be a {'positive' if positive else 'non-negative'}"
                                      f" finite number of seconds, not {value!r}")
        if application_name is not None and not isinstance(application_name, str):
            raise ValidationError("application_name", "must be a string or None")
        if not isinstance(conninfo, str):
            raise ValidationError("conninfo", "must be a libpq connection string or URL")
        self.schema = schema
        self._conninfo = conninfo
        self._fsync = fsync
        self._statement_timeout = statement_timeout
        self._lock_wait = float(lock_wait)
        self._connect_timeout = max(2, math.ceil(connect_timeout))  # libpq: whole seconds >= 2
        self._keepalive = max(1, round(keepalive))
        self._application = (application_name if application_name is not None
                             else f"turnstile {socket.gethostname()} pid {os.getpid()}")[:63]
        self._namespace = zlib.crc32(f"turnstile/{schema}".encode()) & 0x7FFFFFFF
        self._conn: _Conn | None = None
        self._locks: dict[str, int] = {}  # sessions whose advisory lock this store holds
        self._handles: dict[str, _Handle] = {}
        self._epoch = 0  # counts connections; a load's writes need the one it read on
        self._loading: tuple[str, int] | None = None
        self.where = self._describe()
        self._sql = _statements(schema)
        conn = self._connect()
        try:
            self._bootstrap(conn, create)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    # -- public extras ---------------------------------------------------------------

    @property
    def backend_pid(self) -> int | None:
        """The server process id of this store's connection (None while disconnected): the
        one that holds its sessions' locks, as pg_locks and pg_stat_activity show it."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return None
        return conn.info.backend_pid

    def load(self, session_id: str, mode: LoadMode = "strict") -> LoadResult:
        """S9–S14, S26: take the session's lock, then load, repair and open it."""
        self._check_usable()
        check_session_id(session_id)
        if mode not in LOAD_MODES:
            raise ValidationError("mode", f"must be 'strict' or 'salvage', not {mode!r}")
        if self.is_open(session_id):
            return super().load(session_id, mode)
        self._attempt(f"lock session {session_id!r}",
                      lambda conn: self._lock_existing(conn, session_id))
        self._loading = (session_id, self._epoch)
        try:
            return super().load(session_id, mode)
        except BaseException:
            self._unlock(session_id)
            raise
        finally:
            self._loading = None

    # -- primitives -------------------------------------------------------------------

    def _exists(self, session_id: str) -> bool:
        return self._attempt(f"look up session {session_id!r}", lambda conn: conn.execute(
            self._sql["exists"], (session_id,)).fetchone() is not None)

    def _list(self) -> list[str]:
        return self._attempt("list sessions", lambda conn: [
            str(row[0]) for row in conn.execute(self._sql["list"]).fetchall()])

    def _header(self, conn: _Conn, session_id: str) -> bytes:
        row = conn.execute(self._sql["header"], (session_id,)).fetchone()
        if row is None:
            raise SessionNotFoundError(f"no session {session_id!r} in {self.where}")
        return bytes(row[0])

    def _read(self, session_id: str) -> StoredSession:
        def read(conn: _Conn) -> StoredSession:
            if self._loading is not None and self._loading[0] == session_id:
                self._require_claim(session_id)
                self._loading = (session_id, self._epoch)  # read on this connection
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                header = self._header(conn, session_id)
                with conn.cursor(binary=True) as cursor:
                    rows = cursor.execute(self._sql["events"], (session_id,)).fetchall()
            info, header_damage = parse_header(header, session_id, None)
            records = [_decode_row(session_id, position, int(idx), crc,
                                   bytes(raw))
                       for position, (idx, crc, raw) in enumerate(rows)]
            return StoredSession(info, header_damage, records)
        return self._attempt(f"read session {session_id!r}", read)

    def _read_info(self, session_id: str) -> SessionInfo:
        header = self._attempt(f"read session {session_id!r}",
                               lambda conn: self._header(conn, session_id))
        info, damage = parse_header(header, session_id, None)
        if damage is not None:
            raise DamageError(session_id, [damage])
        assert info is not None
        return info

    def _create(self, info: SessionInfo, events: Sequence[Event]) -> _Handle:
        session_id = info.session_id
        token = uuid.uuid4().hex
        rows = _rows(session_id, events)
        tries = 0

        def create(conn: _Conn) -> _Handle:
            nonlocal tries
            tries += 1
            if tries > 1 and self._created_by(conn, session_id, token):
                return self._adopt_created(conn, session_id, rows)  # the lost commit landed
            key: int | None = None
            try:
                with conn.transaction():
                    row = conn.execute(self._sql["create"],
                                       (session_id, token, header_bytes(info))).fetchone()
                    if row is None:
                        raise SessionExistsError(f"session {session_id!r} already exists")
                    key = int(row[0])
                    # nobody else can know the new key before the commit: free by construction
                    conn.execute(self._sql["lock"], (self._namespace, key))
                    self._locks[session_id] = key
                    self._copy(conn, session_id, rows)
            except BaseException:
                if key is not None:  # a session-level lock outlives the rollback
                    self._unlock(session_id)
                raise
            return self._track(_Handle(session_id, key, len(rows),
                                       rows[-1][1] if rows else None))
        return self._attempt(f"create session {session_id!r}", create)

    def _reopen(self, session_id: str, stored: StoredSession) -> _Handle:
        def reopen(conn: _Conn) -> _Handle:
            self._require_fresh_read(session_id)
            return self._track(self._tail_handle(conn, session_id))
        return self._attempt(f"open session {session_id!r}", reopen, retry=False)

    def _salvage(self, info: SessionInfo, stored: StoredSession, kept: Sequence[Event],
                 closers: Sequence[Event]) -> tuple[_Handle, str]:
        session_id = info.session_id
        salvage = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        records = stored.records
        assert isinstance(records, list)    # this backend reads every row at once (_read)
        first = records[len(kept)].stored_seq if len(kept) < len(records) else None

        def move(conn: _Conn) -> _Handle:
            self._require_fresh_read(session_id)
            with conn.transaction():
                if first is not None:
                    conn.execute(self._sql["quarantine_rows"], (salvage, session_id, first))
                    conn.execute(self._sql["delete_rows"], (session_id, first))
                if stored.header_damage is not None:
                    conn.execute(self._sql["quarantine_header"], (salvage, session_id))
                    conn.execute(self._sql["rewrite_header"], (header_bytes(info), session_id))
                self._copy(conn, session_id, _rows(session_id, closers))
            return self._track(self._tail_handle(conn, session_id))
        handle = self._attempt(f"salvage session {session_id!r}", move, retry=False)
        return handle, f"{self.where}#quarantine/{salvage}"

    def _write(self, handle: _Handle, events: Sequence[Event]) -> None:
        if handle.lost is not None:
            raise SessionLostError(f"session {handle.session_id!r}: {handle.lost}; load it again")
        handle.pending.extend(_rows(handle.session_id, events))

    def _sync(self, handle: _Handle) -> None:
        def flush(conn: _Conn) -> None:
            if handle.lost is not None:
                raise SessionLostError(f"session {handle.session_id!r}: {handle.lost}; load it "
                                       "again")
            batch = list(handle.pending)  # a reconnection may have found some committed
            if not batch:
                return
            with conn.transaction():
                self._copy(conn, handle.session_id, batch)
            handle.durable += len(batch)
            handle.last_crc = batch[-1][1]
            del handle.pending[:len(batch)]
        if handle.pending or handle.lost is not None:
            self._attempt(f"flush session {handle.session_id!r}", flush, handle=handle)

    def _release(self, handle: _Handle) -> None:
        handle.pending.clear()
        self._handles.pop(handle.session_id, None)
        self._unlock(handle.session_id)

    def _close_backend(self) -> None:
        conn, self._conn = self._conn, None
        self._locks.clear()
        if conn is not None:
            conn.close()  # the server drops every lock the connection held

    # -- connection ----------------------------------------------------------------

    def _describe(self) -> str:
        from psycopg.conninfo import conninfo_to_dict
        try:
            params = conninfo_to_dict(self._conninfo)
        except Exception as error:  # psycopg.ProgrammingError: not a connection string
            raise ValidationError("conninfo", f"not a libpq connection string or URL: "
                                  f"{error}") from None
        host = str(params.get("host") or os.environ.get("PGHOST") or "localhost")
        port = str(params.get("port") or os.environ.get("PGPORT") or "5432")
        dbname = str(params.get("dbname") or os.environ.get("PGDATABASE") or "")
        user = str(params.get("user") or os.environ.get("PGUSER") or "")
        return (f"postgresql://{user + '@' if user else ''}{host}:{port}/{dbname}"
                f"?schema={self.schema}")

    def _connect(self) -> _Conn:
        import psycopg
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True,
                                   connect_timeout=self._connect_timeout,
                                   application_name=self._application, keepalives=1,
                                   keepalives_idle=self._keepalive,
                                   keepalives_interval=max(1, self._keepalive // 3),
                                   keepalives_count=3)
        except psycopg.Error as error:
            raise StoreConnectionError(f"cannot connect to {self.where}: "
                                       f"{_message(error)}") from error
        try:
            settings = [("tcp_keepalives_idle", str(self._keepalive)),
                        ("tcp_keepalives_interval", str(max(1, self._keepalive // 3))),
                        ("tcp_keepalives_count", "3")]
            if self._statement_timeout is not None:
                settings.append(("statement_timeout",
                                 f"{max(1, round(self._statement_timeout * 1000))}ms"))
            if not self._fsync:
                settings.append(("synchronous_commit", "off"))
            elif conn.execute("SHOW synchronous_commit").fetchone() == ("off",):
                settings.append(("synchronous_commit", "on"))  # S27: a flush is durable
            for name, value in settings:
                conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        except psycopg.Error as error:
            conn.close()
            raise self._typed(error, "set up the connection", False) from error
        return conn

    def _bootstrap(self, conn: _Conn, create: bool) -> None:
        """S24: check the schema's version; create the schema when it is missing."""
        import psycopg
        try:
            version = self._schema_version(conn)
            if version is None and create:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (self._namespace,))
                    version = self._schema_version(conn)  # another store may have made it
                    if version is None:
                        self._migrate(conn, 0)
                        version = SCHEMA_VERSION
        except psycopg.Error as error:
            raise self._typed(error, "set up the session schema",
                              conn.closed or conn.broken) from error
        if version is None:
            raise StoreError(f"{self.where}: no session schema (create it with create=True)")
        if version != SCHEMA_VERSION:
            raise UnsupportedFormatError(
                f"{self.where} has session schema version {version}; this code reads version "
                f"{SCHEMA_VERSION} and migrates none other")

    def _schema_version(self, conn: _Conn) -> int | None:
        # a catalog query (a fresh snapshot), not to_regclass: its cache may predate the
        # commit of a store that created the schema while this one waited for the lock
        present = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = ANY(%s)", (self.schema, list(_TABLES))).fetchall()
        names = {str(row[0]) for row in present}
        if not names:
            return None
        if "meta" not in names:
            raise StoreError(f"{self.where}: schema {self.schema!r} holds tables "
                             f"({', '.join(sorted(names))}) but is not a session schema")
        row = conn.execute(self._sql["version"]).fetchone()
        value = None if row is None else str(row[0])
        if value is None or not value.isdigit():
            raise UnsupportedFormatError(f"{self.where}: the session schema has no readable "
                                         f"version ({value!r})")
        if int(value) == SCHEMA_VERSION and names != set(_TABLES):
            raise StoreError(f"{self.where}: the session schema is incomplete (missing "
                             f"{', '.join(sorted(set(_TABLES) - names))})")
        return int(value)

    def _migrate(self, conn: _Conn, version: int) -> None:
        from psycopg import sql
        for step in _MIGRATIONS[version:]:
            for statement in step:
                conn.execute(sql.SQL(statement).format(schema=sql.Identifier(self.schema)))
        conn.execute(self._sql["set_version"], (str(SCHEMA_VERSION),))

    def _connection(self) -> _Conn:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return self._reconnect()
        return conn

    def _reconnect(self) -> _Conn:
        """S27: a new connection; take back every lock, and check each open session is as
        this store left it (finding out whether an interrupted flush committed)."""
        import psycopg
        old, self._conn = self._conn, None
        if old is not None:
            old.close()
        conn = self._connect()
        self._epoch += 1
        try:
            self._bootstrap(conn, create=False)  # S24: the schema may have changed meanwhile
        except BaseException:
            conn.close()
            raise
        try:
            for session_id, key in list(self._locks.items()):
                row = conn.execute(self._sql["try_lock"], (self._namespace, key)).fetchone()
                handle = self._handles.get(session_id)
                if row is None or row[0] is not True:
                    del self._locks[session_id]
                    if handle is not None:
                        self._lose(handle, "another store took the session while this store "
                                   "was disconnected")
                elif handle is not None:
                    self._verify(conn, handle)
        except psycopg.Error as error:
            conn.close()
            raise self._typed(error, "reconnect", True) from error
        self._conn = conn
        return conn

    def _verify(self, conn: _Conn, handle: _Handle) -> None:
        """After a reconnection: the stored rows from the last durable one on must be that row
        and then a prefix of the pending ones (a flush whose commit was cut off may have
        landed); anything else is another writer's doing."""
        start = max(0, handle.durable - 1)
        rows = [(int(idx), int(crc))
                for idx, crc in conn.execute(self._sql["tail_from"],
                                             (handle.session_id, start)).fetchall()]
        if handle.durable:
            if not rows or rows[0] != (handle.durable - 1, handle.last_crc):
                self._lose(handle, "its stored rows were changed by another writer", conn)
                return
            rows = rows[1:]
        expected = [(idx, crc) for idx, crc, _ in handle.pending[:len(rows)]]
        if rows != expected:
            self._lose(handle, "another writer appended to it", conn)
            return
        if rows:  # the interrupted flush did commit
            handle.durable += len(rows)
            handle.last_crc = rows[-1][1]
            del handle.pending[:len(rows)]

    def _lose(self, handle: _Handle, reason: str, conn: _Conn | None = None) -> None:
        """S27: the session is no longer this store's to write: forget its unflushed events
        and give up its lock."""
        unflushed = len(handle.pending)
        handle.pending.clear()
        handle.lost = (f"this store lost its hold on it: {reason} ({unflushed} unflushed "
                       f"event{'s' if unflushed != 1 else ''} not stored)")
        self._unlock(handle.session_id, conn)

    def _attempt(self, action: str, work: Callable[[_Conn], T],
                 *, retry: bool = True, handle: _Handle | None = None) -> T:
        """Run *work* on the connection, as *action*; psycopg errors become typed store errors.

        On a lost connection, *retry* allows one more try on a new connection (every
        primitive that retries is idempotent once `_reconnect` has checked the open
        sessions)."""
        import psycopg
        for attempt in (1, 2):
            conn = self._connection()
            try:
                return work(conn)
            except psycopg.Error as error:
                lost = conn.closed or conn.broken or _is_connection_state(error)
                if lost and retry and attempt == 1:
                    self._conn = None
                    try:
                        self._reconnect()
                    except StoreConnectionError as again:
                        raise StoreConnectionError(
                            f"cannot {action} in {self.where}: the connection to the server was "
                            f"lost ({_message(error)}), and reconnecting failed: {again}") from error
                    continue
                if error.sqlstate == "23505" and handle is not None:  # unique violation
                    self._lose(handle, "another writer stored rows of it")
                    raise SessionLostError(f"session {handle.session_id!r}: {handle.lost}; "
                                           "load it again") from error
                raise self._typed(error, action, lost) from error
        raise AssertionError("unreachable")

    def _typed(self, error: psycopg.Error, action: str, lost: bool) -> StoreError:
        """S28: the store error for a psycopg error, naming the real cause."""
        state = error.sqlstate or ""
        where = f"cannot {action} in {self.where}"
        detail = _message(error)
        if lost or state.startswith("08") or state in _CONNECTION_STATES:
            return StoreConnectionError(f"{where}: the connection to the server was lost "
                                        f"({detail})")
        if state == "57014":
            limit = ("" if self._statement_timeout is None
                     else f" after {self._statement_timeout:g} s")
            return StoreTimeoutError(f"{where}: the statement was cancelled{limit} ({detail})")
        if state == "55P03":
            return StoreTimeoutError(f"{where}: a lock was not granted in time ({detail})")
        if state == "25006":
            return StoreReadOnlyError(f"{where}: the database is read-only ({detail})")
        if state == "53100":
            return StoreFullError(f"{where}: the server's disk is full ({detail})")
        if state == "53200":
            return StoreError(f"{where}: the server is out of memory or of lock slots ({detail}; "
                              "each open session holds one advisory lock: raise "
                              "max_locks_per_transaction for many open sessions)")
        if state == "42501":
            return StoreError(f"{where}: permission denied ({detail})")
        if state in ("42P01", "3F000", "42703"):
            return StoreError(f"{where}: the session schema is missing or altered ({detail})")
        return StoreError(f"{where}: PostgreSQL error {state or '(no SQLSTATE)'}: {detail}")

    # -- locks ----------------------------------------------------------------------

    def _lock_existing(self, conn: _Conn, session_id: str) -> None:
        """S26: take the lock of a stored session, or raise `SessionLockedError`."""
        row = conn.execute(self._sql["lock_key"], (session_id,)).fetchone()
        if row is None:
            raise SessionNotFoundError(f"no session {session_id!r} in {self.where}")
        key = int(row[0])
        if not self._take(conn, key):
            raise SessionLockedError(self._locked_message(conn, session_id, key))
        self._locks[session_id] = key

    def _take(self, conn: _Conn, key: int) -> bool:
        import psycopg
        if self._lock_wait <= 0:
            row = conn.execute(self._sql["try_lock"], (self._namespace, key)).fetchone()
            return row is not None and row[0] is True
        try:
            with conn.transaction():
                conn.execute("SELECT set_config('lock_timeout', %s, true)",
                             (f"{max(1, round(self._lock_wait * 1000))}ms",))
                conn.execute(self._sql["lock"], (self._namespace, key))
        except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
            return False  # lock_timeout (or statement_timeout) while waiting for the holder
        return True

    def _locked_message(self, conn: _Conn, session_id: str,
                        key: int) -> str:
        import psycopg
        message = f"session {session_id!r} is open for writing in another store"
        try:
            row = conn.execute(self._sql["holder"], (self._namespace, key)).fetchone()
        except psycopg.Error:
            row = None
        if row is not None:
            pid, application, client, since = row
            origin = f", client {client}" if client is not None else ""
            message += (f" (PostgreSQL backend pid {pid}, application {application!r}"
                        f"{origin}, connected since {since})")
        return message + "; one writer per session (S26)"

    def _unlock(self, session_id: str, conn: _Conn | None = None) -> None:
        """Give up a session's lock (on *conn*, by default the store's connection). When that
        fails, drop the connection, which gives up every lock; the next operation
        reconnects and takes the others back."""
        import psycopg
        key = self._locks.pop(session_id, None)
        conn = conn if conn is not None else self._conn
        if key is None or conn is None or conn.closed or conn.broken:
            return
        try:
            conn.execute(self._sql["unlock"], (self._namespace, key))
        except psycopg.Error:
            if conn is self._conn:
                self._conn = None
            conn.close()

    def _require_claim(self, session_id: str) -> None:
        if session_id not in self._locks:
            raise SessionLockedError(f"session {session_id!r}: the lock was lost with the "
                                     "connection and another store holds it now")

    def _require_fresh_read(self, session_id: str) -> None:
        """A load's write must use the connection (so the lock) that its read used."""
        self._require_claim(session_id)
        if self._loading is None or self._loading != (session_id, self._epoch):
            raise StoreConnectionError(f"cannot load session {session_id!r} from {self.where}: "
                                       "the connection was lost during the load; load it again")

    # -- helpers ----------------------------------------------------------------------

    def _track(self, handle: _Handle) -> _Handle:
        self._handles[handle.session_id] = handle
        return handle

    def _tail_handle(self, conn: _Conn, session_id: str) -> _Handle:
        row = conn.execute(self._sql["tail"], (session_id,)).fetchone()
        durable, last = (0, None) if row is None else (int(row[0]) + 1,
                                                       int(row[1]))
        return _Handle(session_id, self._locks[session_id], durable, last)

    def _created_by(self, conn: _Conn, session_id: str,
                    token: str) -> bool:
        row = conn.execute(self._sql["token"], (session_id,)).fetchone()
        return row is not None and row[0] == token

    def _adopt_created(self, conn: _Conn, session_id: str,
                       rows: Sequence[_Row]) -> _Handle:
        """S27: the creation committed although its acknowledgement was lost."""
        row = conn.execute(self._sql["lock_key"], (session_id,)).fetchone()
        assert row is not None
        key = int(row[0])
        if not self._take(conn, key):
            raise SessionLockedError(self._locked_message(conn, session_id, key))
        self._locks[session_id] = key
        return self._track(_Handle(session_id, key, len(rows), rows[-1][1] if rows else None))

    def _copy(self, conn: _Conn, session_id: str,
              rows: Sequence[_Row]) -> None:
        if not rows:
            return
        with conn.cursor() as cursor, cursor.copy(self._sql["copy"]) as copy:
            copy.set_types(["text", "int8", "int8", "bytea"])
            for idx, crc, raw in rows:
                copy.write_row((session_id, idx, crc, raw))


def _message(error: BaseException) -> str:
    diag = getattr(error, "diag", None)
    primary = getattr(diag, "message_primary", None)
    text = primary if isinstance(primary, str) and primary else str(error)
    return " ".join(text.split()) or type(error).__name__


def _is_connection_state(error: psycopg.Error) -> bool:
    state = error.sqlstate or ""
    return state.startswith("08") or state in _CONNECTION_STATES


def _statements(schema: str) -> dict[str, sql.Composed]:
    from psycopg import sql
    texts = {
        "version": "SELECT value FROM {s}.meta WHERE key = 'schema'",
        "set_version": "INSERT INTO {s}.meta VALUES ('schema', %s) "
                       "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        "exists": "SELECT 1 FROM {s}.sessions WHERE id = %s",
        "list": 'SELECT id FROM {s}.sessions ORDER BY id COLLATE "C"',
        "header": "SELECT header FROM {s}.sessions WHERE id = %s",
        "token": "SELECT token FROM {s}.sessions WHERE id = %s",
        "lock_key": "SELECT lock_key FROM {s}.sessions WHERE id = %s",
        "events": "SELECT idx, crc, record FROM {s}.events WHERE session = %s ORDER BY idx",
        "tail": "SELECT idx, crc FROM {s}.events WHERE session = %s ORDER BY idx DESC LIMIT 1",
        "tail_from": "SELECT idx, crc FROM {s}.events WHERE session = %s AND idx >= %s "
                     "ORDER BY idx",
        "create": "INSERT INTO {s}.sessions (id, token, header) VALUES (%s, %s, %s) "
                  "ON CONFLICT (id) DO NOTHING RETURNING lock_key",
        "copy": "COPY {s}.events (session, idx, crc, record) FROM STDIN (FORMAT BINARY)",
        "quarantine_rows": "INSERT INTO {s}.quarantine (salvage, session, idx, crc, record) "
                           "SELECT %s, session, idx, crc, record FROM {s}.events "
                           "WHERE session = %s AND idx >= %s",
        "delete_rows": "DELETE FROM {s}.events WHERE session = %s AND idx >= %s",
        "quarantine_header": "INSERT INTO {s}.quarantine (salvage, session, record) "
                             "SELECT %s, id, header FROM {s}.sessions WHERE id = %s",
        "rewrite_header": "UPDATE {s}.sessions SET header = %s WHERE id = %s",
        "lock": "SELECT pg_advisory_lock(%s, %s)",
        "try_lock": "SELECT pg_try_advisory_lock(%s, %s)",
        "unlock": "SELECT pg_advisory_unlock(%s, %s)",
        "holder": "SELECT a.pid, a.application_name, a.client_addr::text, a.backend_start "
                  "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                  "WHERE l.locktype = 'advisory' AND l.granted AND l.database = "
                  "(SELECT oid FROM pg_database WHERE datname = current_database()) "
                  "AND l.classid = %s AND l.objid = %s AND l.objsubid = 2 LIMIT 1",
    }
    return {name: sql.SQL(text).format(s=sql.Identifier(schema))
            for name, text in texts.items()}

