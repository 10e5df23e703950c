"""Item 6: session stores (`machine.store`): append rate and load+repair time.

**Appends.** The durable events of a W2 session (bench/workloads.py: tool turns,
15 events a turn) are appended one by one with ``store.append``, and
``store.flush`` is called after each ``turn/end`` — the post-turn flush barrier
(R12.4) — as the runtime's `PersistentSession` does. With ``fsync=True`` the
barrier is an ``fsync`` (JSONL) or a ``synchronous=FULL`` commit (SQLite); with
``fsync=False`` nothing is synced. Every append is checked against the session
invariants before it is written (S5), so the rate includes the log checks.

**Load + repair.** A crashed session of about 1,000,000 events: a W1 history,
then a turn left open (turn/start, the prompt, step/start, one chunk) and, for
JSONL, a torn half record at the end. ``store.load`` reads it, checks every
event (L14), cuts the torn bytes and appends the closers. The stored log is
written in bulk through the backends' own creation path, which is not timed.

**PostgreSQL.** The item starts a server of its own (`TemporaryPostgres`: the
installed PostgreSQL, a temporary data directory, a Unix socket, the server's
fsync on) and runs the same two measurements through `PostgresStore`: with
``fsync=True`` each flush is a commit that waits for the server's WAL flush
(``synchronous_commit=on``), with ``fsync=False`` it does not wait. Without a
PostgreSQL installation the rows say so and the other backends still run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from bench.common import Section, rate
from bench.workloads import LeanDriver, user
from machine.events import TURN_END, Event
from machine.io import MODEL, Effect
from machine.jsonvalue import FrozenDict
from machine.store import JsonlStore, PostgresStore, SqliteStore, StoreError
from machine.store.base import BaseStore
from machine.store.jsonl import encode_header, encode_record
from machine.store.postgres_server import TemporaryPostgres
from machine.store.types import SessionInfo

FULL_APPENDS = 30_000
QUICK_APPENDS = 300
FULL_LOAD = 1_000_000
QUICK_LOAD = 2_000
UID = "0123456789abcdef" * 2     # the sessions' identity (format version 2, S30)


def session_events(workload: str, events: int) -> list[Event]:
    """At least *events* durable events of complete turns of *workload*."""
    driver = LeanDriver(workload)
    driver.drain()
    while len(driver.core.log) < events:
        driver.turn()
    return list(driver.core.log.events)


def crashed_session(events: int) -> tuple[list[Event], int]:
    """About *events* durable events: complete W1 turns, then a turn left open mid-stream
    (turn/start, the prompt, step/start, one chunk). Returns the events and the length of
    the complete history."""
    driver = LeanDriver("W1")
    driver.drain()
    core = driver.core
    while len(core.log) < events - 4:
        driver.turn()
    history = len(core.log)
    core.followup(user("crash"))
    pending: list[Effect] = []
    while True:
        output = core.next_output()
        if output is None:
            effect = pending.pop(0)
            if effect.kind == MODEL:
                core.chunk(effect.id, {"type": "text", "text": "hal"})
                while core.next_output() is not None:
                    pass
                break
            driver._answer(effect)
            continue
        if isinstance(output, Effect):
            pending.append(output)
    return list(core.log.events), history


def _appends(store: BaseStore[Any], events: Sequence[Event]) -> float:
    store.create("s")
    start = time.perf_counter()
    for event in events:
        store.append("s", event)
        if event.type == TURN_END:
            store.flush("s")
    store.flush("s")
    seconds = time.perf_counter() - start
    store.close()
    return seconds


def _bulk_jsonl(root: str, session: str, events: Sequence[Event], torn: bytes) -> None:
    info = SessionInfo(session, uid=UID)
    with open(os.path.join(root, f"{session}.jsonl"), "wb") as handle:
        handle.write(encode_header(info))
        for event in events:
            handle.write(encode_record(event, info.uid))
        handle.write(torn)


def _bulk_sqlite(path: str, session: str, events: Sequence[Event]) -> None:
    store = SqliteStore(path, fsync=False)
    try:
        store._create(SessionInfo(session, uid=UID), events)  # the primitive create() uses
    finally:
        store.close()


def _bulk_postgres(conninfo: str, session: str, events: Sequence[Event]) -> None:
    store = PostgresStore(conninfo, schema="bench_load", fsync=False)
    try:
        store._create(SessionInfo(session), events)   # the primitive create() and fork() use
    finally:
        store.close()


def _start_postgres() -> tuple[TemporaryPostgres | None, str]:
    """The item's own server and its version, or None and why it could not be had."""
    try:
        import psycopg
        server = TemporaryPostgres(fsync=True, settings={"shared_buffers": "128MB"}).start()
    except (ImportError, StoreError) as error:
        return None, str(error)
    with psycopg.connect(server.conninfo) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return server, str(row[0]) if row else "?"


def _load(store: BaseStore[Any], session: str) -> tuple[float, int, int, int]:
    start = time.perf_counter()
    result = store.load(session)
    seconds = time.perf_counter() - start
    report = result.report
    count = len(result.events)
    store.close()
    return seconds, count, report.closers_appended, report.truncated_bytes


HEADERS = ["backend", "flush barrier", "events appended", "seconds", "appends/s", "µs/append",
           "flushes"]


def run(quick: bool = False) -> Section:
    started = time.perf_counter()
    root = tempfile.mkdtemp(prefix="turnstile-bench-stores-")
    rows: list[list[str]] = []
    figures: dict[str, Any] = {}
    server, version = _start_postgres()
    backends = ("JSONL", "SQLite", "PostgreSQL") if server is not None else ("JSONL", "SQLite")
    try:
        events = session_events("W2", QUICK_APPENDS if quick else FULL_APPENDS)
        flushes = sum(1 for e in events if e.type == TURN_END)
        for backend in backends:
            for fsync in (True, False):
                where = os.path.join(root, f"append-{backend}-{fsync}")
                store: BaseStore[Any]
                if backend == "JSONL":
                    store = JsonlStore(where, fsync=fsync)
                elif backend == "SQLite":
                    store = SqliteStore(where + ".db", fsync=fsync)
                else:
                    assert server is not None
                    store = PostgresStore(server.conninfo, schema=f"bench_append_{fsync}".lower(),
                                          fsync=fsync)
                seconds = _appends(store, events)
                barrier = key = "fsync" if fsync else "no fsync"
                if backend == "PostgreSQL":
                    barrier = "commit, WAL flushed" if fsync else "commit, no WAL wait"
                rows.append([backend, barrier, f"{len(events):,}", f"{seconds:.2f}",
                             f"{rate(len(events), seconds):,.0f}",
                             f"{1e6 * seconds / len(events):.1f}", f"{flushes:,}"])
                figures[f"append/{backend}/{key}"] = rate(len(events), seconds)
        # Load + repair of a crashed session of about FULL_LOAD events.
        target = QUICK_LOAD if quick else FULL_LOAD
        crashed, history = crashed_session(target)
        torn = encode_record(Event("assistant/chunk", len(crashed), 0, FrozenDict({
            "turn": 1, "step": 1, "chunk": FrozenDict({"type": "text", "text": "x"})})), UID)[:25]
        load_rows: list[list[str]] = []
        jsonl_root = os.path.join(root, "load-jsonl")
        os.makedirs(jsonl_root)
        _bulk_jsonl(jsonl_root, "big", crashed, torn)
        size = os.path.getsize(os.path.join(jsonl_root, "big.jsonl"))
        sqlite_path = os.path.join(root, "load.db")
        _bulk_sqlite(sqlite_path, "big", crashed)
        if server is not None:
            _bulk_postgres(server.conninfo, "big", crashed)
        for backend in backends:
            if backend == "JSONL":
                store = JsonlStore(jsonl_root, fsync=True)
            elif backend == "SQLite":
                store = SqliteStore(sqlite_path, fsync=True)
            else:
                assert server is not None
                store = PostgresStore(server.conninfo, schema="bench_load", fsync=True)
            seconds, count, closers, cut = _load(store, "big")
            load_rows.append([backend, f"{len(crashed):,}", f"{seconds:.1f}",
                              f"{rate(len(crashed), seconds):,.0f}", str(closers),
                              f"{cut} bytes" if backend == "JSONL" else "–", f"{count:,}"])
            figures[f"load/{backend}"] = seconds
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if server is not None:
            server.close()
    section = Section("6. Session stores", HEADERS, rows)
    section.tables.append((
        "Load + repair of a crashed session (strict load: read, check every event, cut the torn "
        "record, append the closers):",
        ["backend", "stored events", "load + repair s", "events/s", "closers appended",
         "torn record cut", "events after load"], load_rows))
    section.figures = figures
    section.notes.append(
        f"Appends: a W2 session of {len(events):,} events ({flushes:,} turns), one "
        "`append` per event and a `flush` after each `turn/end`; a fresh store per row. "
        "JSONL issues one `write` per append; SQLite buffers the turn's events and inserts them "
        "in one transaction at the flush.")
    section.notes.append(
        f"The crashed session: {history:,} events of complete W1 turns, then an open turn of "
        f"{len(crashed) - history} events and (JSONL) a torn 25-byte record; the file is "
        f"{size / 1e6:.0f} MB. The stores are on the same file "
        f"system ({tempfile.gettempdir()}).")
    if server is not None:
        section.notes.append(
            f"PostgreSQL {version}: a server started for this item from the installed "
            "programs (a temporary data directory, a Unix socket, the server's fsync on, "
            "shared_buffers 128MB); `PostgresStore` holds a turn's events in memory and "
            "writes them at the flush in one transaction (one COPY). With `fsync=True` the "
            "commit waits for the server's WAL flush, with `fsync=False` "
            "(`synchronous_commit=off`) it does not. The load reads the rows in one "
            "REPEATABLE READ transaction (binary protocol) under the session's advisory lock.")
    else:
        section.notes.append(f"No PostgreSQL rows: {version}")
    section.seconds = time.perf_counter() - started
    return section
