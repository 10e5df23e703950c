"""Durable sessions (specs/persistence.md, S1–S34): stores, crash repair, resume, fork, compaction.

Three backends implement the `SessionStore` protocol and pass the same
contract: `JsonlStore` (one checksummed JSON record per line, the embedded
default), `SqliteStore` (standard-library ``sqlite3``, WAL) and
`PostgresStore` (a PostgreSQL server shared by many hosts; needs the
``postgres`` extra, psycopg 3).
"""

from machine.store.base import BaseStore
from machine.store.compaction import (
    COMPACT_SOURCE,
    SurfaceNode,
    checkpoint_message,
    choose_compaction_range,
    compact,
    compaction_problem,
    surface_nodes,
)
from machine.store.errors import (
    CompactionError,
    DamageError,
    LiveTurnOpenError,
    OpenTurnError,
    SessionExistsError,
    SessionLockedError,
    SessionLostError,
    SessionNotFoundError,
    SessionNotOpenError,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreFullError,
    StoreReadError,
    StoreReadOnlyError,
    StoreTimeoutError,
    StoreWriteError,
    UnreadableSessionError,
    UnsupportedFormatError,
)
from machine.store.jsonl import JsonlStore
from machine.store.postgres import PostgresStore
from machine.store.repair import closers, scan
from machine.store.resume import StoreSink, check_readable, resume_core, resume_from
from machine.store.sqlite import SqliteStore
from machine.store.types import (
    Damage,
    Inspection,
    LoadMode,
    LoadReport,
    LoadResult,
    SessionInfo,
    SessionStore,
)

__all__ = [
    "COMPACT_SOURCE", "BaseStore", "CompactionError", "Damage", "DamageError", "Inspection",
    "JsonlStore", "LiveTurnOpenError", "LoadMode", "LoadReport", "LoadResult", "OpenTurnError",
    "PostgresStore", "SessionExistsError", "SessionInfo", "SessionLockedError",
    "SessionLostError", "SessionNotFoundError", "SessionNotOpenError", "SessionStore",
    "SqliteStore", "StoreClosedError", "StoreConnectionError", "StoreError", "StoreFullError",
    "StoreReadError", "StoreReadOnlyError", "StoreSink", "StoreTimeoutError", "StoreWriteError",
    "SurfaceNode",
    "UnreadableSessionError", "UnsupportedFormatError", "check_readable", "checkpoint_message",
    "choose_compaction_range", "closers",
    "compact", "compaction_problem", "resume_core", "resume_from", "scan", "surface_nodes",
]
