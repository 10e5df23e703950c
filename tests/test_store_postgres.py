"""The PostgreSQL backend's own rules (specs/persistence.md S23–S29), against a real server.

The contract, damage, fork, resume, repair and crash suites run against
`PostgresStore` too (their ``postgres`` parameter); this module covers what
only a shared database server has: the schema and its version, rows bound to
their session, one writer per session across hosts and processes, flushes
interrupted by lost connections, server restarts and timeouts, and the
typed errors. Every server here is the session's throwaway one
(tests/conftest.py); nothing listens on TCP.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from scenario_helpers import at, string

from machine.errors import ValidationError
from machine.log import validate_events
from machine.store import (
    DamageError,
    PostgresStore,
    SessionExistsError,
    SessionLockedError,
    SessionLostError,
    StoreConnectionError,
    StoreError,
    StoreFullError,
    StoreReadOnlyError,
    StoreTimeoutError,
    StoreWriteError,
    UnsupportedFormatError,
)
from machine.store.codec import event_bytes
from machine.store.postgres import SCHEMA_VERSION, row_crc
from machine.store.postgres_server import (
    INSTALL_HINT,
    PostgresNotFoundError,
    TemporaryPostgres,
    find_server_binaries,
)
from machine.store.repair import closers, scan
from machine.store.testing import LogBuilder, sample_session, store_events

REPO = Path(__file__).resolve().parent.parent
BALANCED = sample_session(open_tail=False)
OPEN = sample_session()
Make = Callable[..., PostgresStore]


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


@pytest.fixture
def admin(postgres: TemporaryPostgres) -> Iterator[psycopg.Connection[Any]]:
    """A superuser connection of the test's own (autocommit)."""
    with psycopg.connect(postgres.conninfo, autocommit=True) as conn:
        yield conn


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll until *condition* holds (no timing is asserted: the limit only stops a hang)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def waiting_on(admin: psycopg.Connection[Any], pid: int | None, event: str) -> bool:
    """Whether backend *pid* waits on *event* (a wait_event_type or wait_event name)."""
    row = admin.execute("SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s",
                        (pid,)).fetchone()
    return row is not None and event in row


def rows(admin: psycopg.Connection[Any], schema: str, session: str) -> list[tuple[Any, ...]]:
    """(idx, crc, record, xmin) of a session's rows; xmin names the inserting transaction."""
    return admin.execute(f"SELECT idx, crc, record, xmin::text FROM {schema}.events "
                         "WHERE session = %s ORDER BY idx", (session,)).fetchall()


def script(source: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", source, *args], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def server_config(admin: psycopg.Connection[Any], postgres: TemporaryPostgres, name: str,
                  value: str | None) -> None:
    """ALTER SYSTEM SET (or RESET, for None) and wait until new connections see it."""
    if value is None:
        admin.execute(f"ALTER SYSTEM RESET {name}")
    else:
        admin.execute(f"ALTER SYSTEM SET {name} = '{value}'")
    admin.execute("SELECT pg_reload_conf()")

    def applied() -> bool:
        with psycopg.connect(postgres.conninfo, autocommit=True) as fresh:
            row = fresh.execute(f"SHOW {name}").fetchone()
        return row is not None and row[0] == (value or "")
    wait_for(applied, f"{name} = {value!r}")


# --------------------------------------------------------------------------
# S23: the backend
# --------------------------------------------------------------------------


def test_S23_a_url_and_a_connection_string_reach_the_same_sessions(
        postgres: TemporaryPostgres, postgres_store: Make, pg_schema: str) -> None:
    by_string = postgres_store()
    store_events(by_string, "s1", BALANCED)
    by_string.close()
    by_url = PostgresStore(postgres.url, schema=pg_schema)
    with by_url:
        assert by_url.list_sessions() == ["s1"]
        assert list(by_url.load("s1").events) == BALANCED
        assert by_url.where.endswith(f"/postgres?schema={pg_schema}")
        assert by_url.backend_pid is not None
    assert by_url.backend_pid is None


@pytest.mark.parametrize(("argument", "value"), [
    ("schema", "Bad-Name"), ("schema", ""), ("schema", "9lives"), ("schema", "x" * 64),
    ("schema", "pg_catalog"), ("schema", None),
    ("statement_timeout", -1), ("statement_timeout", 0), ("statement_timeout", float("nan")),
    ("statement_timeout", True), ("lock_wait", -0.5), ("lock_wait", float("inf")),
    ("connect_timeout", 0), ("keepalive", "30"), ("conninfo", "host=a port"),
    ("conninfo", None), ("application_name", 7),
])
def test_S23_bad_arguments_are_refused_before_connecting(argument: str, value: Any) -> None:
    options: dict[str, Any] = {argument: value}
    conninfo = options.pop("conninfo", "host=/nonexistent")
    with pytest.raises(ValidationError, match=argument):
        PostgresStore(conninfo, **options)


def test_S23_an_unreachable_server_is_a_connection_error(tmp_path: Path) -> None:
    with pytest.raises(StoreConnectionError, match="cannot connect to postgresql://") as raised:
        PostgresStore(f"host={tmp_path} port=5432 user=nobody dbname=none password=secret",
                      connect_timeout=2)
    assert raised.value.code == "STORE_CONNECTION_LOST"
    assert "secret" not in str(raised.value)


def test_S23_schemas_are_separate_stores_on_one_database(
        postgres: TemporaryPostgres, postgres_store: Make, pg_schema: str) -> None:
    first = postgres_store()
    store_events(first, "s1", BALANCED)  # open (locked) here
    with PostgresStore(postgres.conninfo, schema=f"{pg_schema}_other") as second:
        assert second.list_sessions() == []
        store_events(second, "s1", BALANCED[:3])  # the same id, another session
        assert len(second.inspect("s1").events) == 3
    assert len(first.inspect("s1").events) == len(BALANCED)


def test_S23_the_readme_example_points_an_agent_at_a_database_url(
        postgres: TemporaryPostgres, admin: psycopg.Connection[Any]) -> None:
    """The README's example, run twice as written: the second run resumes the session."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    example = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
                   if "PostgresStore(" in block)
    admin.execute("DROP SCHEMA IF EXISTS turnstile CASCADE")  # the example's default schema
    env = {**os.environ, "PYTHONPATH": str(REPO), "TURNSTILE_DATABASE_URL": postgres.url}
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", example], env=env, capture_output=True,
                              text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr
    with PostgresStore(postgres.url) as store:
        events = store.inspect("support-42").events
    assert validate_events(events) is None and scan(events).open_turn is None
    assert [e.data["turn"] for e in events if e.type == "turn/start"] == [1, 2]
    assert [e.data["reason"] for e in events if e.type == "request/header"] == ["initial",
                                                                                 "resume"]
    admin.execute("DROP SCHEMA turnstile CASCADE")


# --------------------------------------------------------------------------
# S24: the schema and its version
# --------------------------------------------------------------------------


def test_S24_the_store_creates_and_versions_its_schema(
        postgres: TemporaryPostgres, postgres_store: Make, pg_schema: str,
        admin: psycopg.Connection[Any]) -> None:
    with pytest.raises(StoreError, match="no session schema"):
        PostgresStore(postgres.conninfo, schema=pg_schema, create=False)
    assert admin.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s",
                         (pg_schema,)).fetchone() == (0,)  # refused without creating anything
    postgres_store().close()
    tables = admin.execute("SELECT table_name FROM information_schema.tables WHERE "
                           "table_schema = %s ORDER BY table_name", (pg_schema,)).fetchall()
    assert tables == [("events",), ("meta",), ("quarantine",), ("sessions",)]
    assert admin.execute(f"SELECT key, value FROM {pg_schema}.meta").fetchall() == [
        ("schema", str(SCHEMA_VERSION))]
    reader = postgres_store(create=False)  # an existing schema opens without creating
    assert reader.list_sessions() == []


@pytest.mark.parametrize("version", ["2", "0", "x"])
def test_S24_an_unknown_schema_version_is_refused(
        postgres_store: Make, pg_schema: str, admin: psycopg.Connection[Any],
        version: str) -> None:
    store_events(postgres_store(), "s1", BALANCED)
    admin.execute(f"UPDATE {pg_schema}.meta SET value = %s", (version,))
    for create in (True, False):
        with pytest.raises(UnsupportedFormatError) as raised:
            postgres_store(create=create)
        assert raised.value.code == "UNSUPPORTED_FORMAT"
    assert admin.execute(f"SELECT value FROM {pg_schema}.meta").fetchone() == (version,)
    assert len(rows(admin, pg_schema, "s1")) == len(BALANCED)  # nothing migrated or dropped


def test_S24_a_schema_holding_other_tables_is_not_taken_over(
        postgres_store: Make, pg_schema: str, admin: psycopg.Connection[Any]) -> None:
    admin.execute(f"CREATE SCHEMA {pg_schema}")
    admin.execute(f"CREATE TABLE {pg_schema}.sessions (name text)")
    with pytest.raises(StoreError, match="not a session schema"):
        postgres_store()
    assert admin.execute(f"SELECT to_regclass('{pg_schema}.meta')").fetchone() == (None,)


def test_S24_an_incomplete_schema_is_refused(
        postgres_store: Make, pg_schema: str, admin: psycopg.Connection[Any]) -> None:
    postgres_store().close()
    admin.execute(f"DROP TABLE {pg_schema}.quarantine")
    with pytest.raises(StoreError, match=r"incomplete .*quarantine"):
        postgres_store()


def test_S24_stores_starting_together_create_the_schema_once(
        postgres: TemporaryPostgres, pg_schema: str) -> None:
    outcomes: list[object] = []

    def start() -> None:
        try:
            with PostgresStore(postgres.conninfo, schema=pg_schema) as store:
                outcomes.append(store.list_sessions())
        except Exception as error:
            outcomes.append(error)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes == [[], [], [], []]


# --------------------------------------------------------------------------
# S25: rows carry their session key
# --------------------------------------------------------------------------


def test_S25_every_row_carries_its_session_key_and_checksum(
        postgres_store: Make, pg_schema: str, admin: psycopg.Connection[Any]) -> None:
    store_events(postgres_store(), "s1", BALANCED)
    stored = rows(admin, pg_schema, "s1")
    assert [r[0] for r in stored] == list(range(len(BALANCED)))
    for (idx, crc, record, _), event in zip(stored, BALANCED, strict=True):
        assert bytes(record) == event_bytes(event) and idx == event.seq
        assert crc == row_crc("s1", bytes(record)) != zlib.crc32(bytes(record))
    assert row_crc("s1", b"x") != row_crc("s2", b"x")


def test_S25_a_row_copied_from_another_session_is_damage(
        postgres_store: Make, pg_schema: str, admin: psycopg.Connection[Any]) -> None:
    """The same events in two sessions: a row of one copied over the other's is reported,
    although its record and position are exactly right (issue 14 item 9)."""
    with postgres_store() as store:
        store_events(store, "s", BALANCED)
        store_events(store, "other", BALANCED)
    admin.execute(f"UPDATE {pg_schema}.events AS e SET crc = o.crc FROM {pg_schema}.events AS o "
                  "WHERE e.session = 's' AND o.session = 'other' AND e.idx = 5 AND o.idx = 5")
    with postgres_store() as store, pytest.raises(DamageError) as raised:
        store.load("s")
    assert (raised.value.kind, raised.value.record_index) == ("checksum-mismatch", 5)
    assert "another session" in str(raised.value.damage[0])
    with postgres_store() as store:
        result = store.load("s", "salvage")
    assert list(result.events) == BALANCED[:5] + list(closers(BALANCED[:5]))
    assert result.report.quarantine is not None and "#quarantine/" in result.report.quarantine
    assert admin.execute(f"SELECT idx FROM {pg_schema}.quarantine ORDER BY idx").fetchall() \
        == [(i,) for i in range(5, len(BALANCED))]


def test_S25_a_row_moved_in_from_another_session_is_damage(
        postgres_store: Make, pg_schema: str, admin: psycopg.Connection[Any]) -> None:
    with postgres_store() as store:
        store_events(store, "s", BALANCED[:9])  # ends with turn/end 1
        store_events(store, "other", BALANCED)
    admin.execute(f"UPDATE {pg_schema}.events SET session = 's' WHERE session = 'other' "
                  "AND idx = 9")  # the next seq of 's', and a valid next event
    with postgres_store() as store, pytest.raises(DamageError) as raised:
        store.load("s")
    assert (raised.value.kind, raised.value.record_index) == ("checksum-mismatch", 9)


# --------------------------------------------------------------------------
# S26: one writer per session
# --------------------------------------------------------------------------


def test_S26_a_session_open_in_one_store_is_refused_to_every_other(
        postgres_store: Make) -> None:
    holder = postgres_store(application_name="host-a")
    store_events(holder, "s1", OPEN)  # an open turn: a second writer would "repair" it
    other = postgres_store()
    with pytest.raises(SessionLockedError) as raised:
        other.load("s1")
    error = raised.value
    assert error.code == "SESSION_LOCKED" and "'host-a'" in str(error)
    assert f"pid {holder.backend_pid}" in str(error)
    with pytest.raises(SessionLockedError):
        other.load("s1", "salvage")
    with pytest.raises(SessionExistsError):
        other.create("s1")
    assert not other.is_open("s1")
    # reading needs no lock: what is flushed, nothing more, and no repair is written
    assert list(other.inspect("s1").events) == OPEN and other.list_sessions() == ["s1"]
    holder.release("s1")
    result = other.load("s1")
    assert result.report.closers_appended == 4
    with pytest.raises(SessionLockedError):
        holder.load("s1")


def test_S26_readers_see_only_flushed_events(postgres_store: Make) -> None:
    writer, reader = postgres_store(), postgres_store()
    store_events(writer, "s1", BALANCED[:5])
    for event in BALANCED[5:9]:
        writer.append("s1", event)
    assert list(reader.inspect("s1").events) == BALANCED[:5]
    writer.flush("s1")
    assert list(reader.inspect("s1").events) == BALANCED[:9]


def test_S26_created_and_forked_sessions_are_locked_and_release_frees_them(
        postgres_store: Make) -> None:
    holder, other = postgres_store(), postgres_store()
    store_events(holder, "src", BALANCED)
    child = holder.fork("src", 8)
    for session in ("src", child):
        with pytest.raises(SessionLockedError):
            other.load(session)
    holder.release(child)
    assert list(other.load(child).events) == BALANCED[:9]
    holder.close()
    assert list(other.load("src").events) == BALANCED


def test_S26_a_failed_load_gives_the_lock_back(postgres_store: Make, pg_schema: str,
                                               admin: psycopg.Connection[Any]) -> None:
    with postgres_store() as store:
        store_events(store, "s1", BALANCED)
    admin.execute(f"UPDATE {pg_schema}.events SET crc = mod(crc + 1, 4294967296) WHERE idx = 3")
    first = postgres_store()
    with pytest.raises(DamageError):
        first.load("s1")  # strict
    assert not first.is_open("s1")
    result = postgres_store().load("s1", "salvage")  # not held by the first store
    assert [d.record_index for d in result.report.damage] == [3]
    with pytest.raises(SessionLockedError):
        first.load("s1", "salvage")


HOLDER = """
import sys, time
from machine.store import PostgresStore
from machine.store.testing import sample_session, store_events

store = PostgresStore(sys.argv[1], schema=sys.argv[2])
events = sample_session()  # ends inside an open turn
store_events(store, "held", events[:-2])  # flushed
for event in events[-2:]:
    store.append("held", event)  # appended, never flushed
print(store.backend_pid, flush=True)
time.sleep(600)
"""


def test_S26_a_killed_holder_frees_its_sessions_and_loses_only_unflushed_events(
        postgres: TemporaryPostgres, postgres_store: Make, pg_schema: str) -> None:
    holder = script(HOLDER, postgres.conninfo, pg_schema)
    try:
        assert holder.stdout is not None
        pid = holder.stdout.readline().strip()
        assert pid.isdigit(), holder.stderr.read() if holder.stderr else pid
        with pytest.raises(SessionLockedError, match=f"pid {pid}"):
            postgres_store().load("held")
        holder.send_signal(signal.SIGKILL)  # no cleanup, no flush, no unlock
    finally:
        holder.kill()
        holder.wait(timeout=60)
    # the server ends the dead client's backend, and with it the lock (lock_wait covers the
    # moment that takes)
    result = postgres_store(lock_wait=30).load("held")
    flushed = OPEN[:-2]
    assert list(result.events) == flushed + list(closers(flushed))
    assert result.report.closers_appended > 0 and not result.report.damage


def test_S26_lock_wait_waits_for_the_holder(postgres_store: Make,
                                            admin: psycopg.Connection[Any]) -> None:
    holder = postgres_store()
    store_events(holder, "s1", BALANCED)
    with pytest.raises(SessionLockedError):
        postgres_store(lock_wait=0.2).load("s1")  # gives up
    waiter = postgres_store(lock_wait=60)
    released: list[bool] = []

    def release_when_waited_for() -> None:
        wait_for(lambda: waiting_on(admin, waiter.backend_pid, "advisory"), "the waiter")
        holder.release("s1")
        released.append(True)

    thread = threading.Thread(target=release_when_waited_for)
    thread.start()
    try:
        result = waiter.load("s1")
    finally:
        thread.join()
    assert released == [True] and list(result.events) == BALANCED


RACER = """
import sys
from machine.store import PostgresStore
from machine.store.testing import LogBuilder

conninfo, schema, host, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = PostgresStore(conninfo, schema=schema, lock_wait=120, fsync=False)
sys.stdin.readline()  # everyone starts together
for number in range(rounds):
    events = store.load("race").events
    builder = LogBuilder(events)
    turn = 1 + sum(1 for event in events if event.type == "turn/start")
    store.append("race", builder.turn(turn))
    store.flush("race")  # others now see an open turn, and must not "repair" it
    store.append("race", builder.user(f"{host}-{number}"))
    store.flush("race")
    store.append("race", builder.end(turn))
    store.release("race")
print("done", flush=True)
"""


def test_S26_two_hosts_racing_to_append_never_interleave(
        postgres: TemporaryPostgres, postgres_store: Make, pg_schema: str) -> None:
    rounds = 8
    with postgres_store() as store:
        store.create("race")
    racers = [script(RACER, postgres.conninfo, pg_schema, host, str(rounds))
              for host in ("a", "b")]
    try:
        for racer in racers:
            assert racer.stdin is not None
            racer.stdin.write("go\n")
            racer.stdin.flush()
        outputs = [racer.communicate(timeout=300) for racer in racers]
    finally:
        for racer in racers:
            racer.kill()
    assert [out for out, _ in outputs] == ["done\n", "done\n"], [err for _, err in outputs]
    events = postgres_store().load("race").events
    assert validate_events(events) is None and scan(events).open_turn is None
    assert [e.type for e in events] == ["turn/start", "user/message", "turn/end"] * 2 * rounds
    assert all(e.data["reason"] == {"kind": "completed"} for e in events if e.type == "turn/end")
    texts = [string(at(e.data, "content", 0, "text")) for e in events if e.type == "user/message"]
    assert sorted(texts) == sorted(f"{h}-{n}" for h in "ab" for n in range(rounds))


CREATOR = """
import sys
from machine.store import PostgresStore, SessionExistsError

store = PostgresStore(sys.argv[1], schema=sys.argv[2])
sys.stdin.readline()
try:
    store.create("new", cwd=sys.argv[3])
except SessionExistsError:
    print("exists", flush=True)
else:
    print("created", flush=True)
sys.stdin.readline()
store.close()
"""


def test_S26_two_hosts_racing_to_create_one_session(
        postgres: TemporaryPostgres, postgres_store: Make, pg_schema: str) -> None:
    postgres_store().close()  # the schema exists before the race
    racers = [script(CREATOR, postgres.conninfo, pg_schema, f"/{host}") for host in ("a", "b")]
    try:
        for racer in racers:
            assert racer.stdin is not None
            racer.stdin.write("go\n")
            racer.stdin.flush()
        said = [racer.stdout.readline().strip() for racer in racers if racer.stdout]
        for racer in racers:
            assert racer.stdin is not None
            racer.stdin.write("bye\n")
            racer.stdin.flush()
            racer.wait(timeout=60)
    finally:
        for racer in racers:
            racer.kill()
    assert sorted(said) == ["created", "exists"]
    winner = "/a" if said[0] == "created" else "/b"
    assert postgres_store().info("new").cwd == winner


# --------------------------------------------------------------------------
# S27: flushes, lost connections, restarts
# --------------------------------------------------------------------------


def test_S27_each_flush_is_one_transaction(postgres_store: Make, pg_schema: str,
                                           admin: psycopg.Connection[Any]) -> None:
    store = postgres_store(fsync=True)
    store.create("s1")
    for batch in (BALANCED[:5], BALANCED[5:8], BALANCED[8:9]):
        for event in batch:
            store.append("s1", event)
        store.flush("s1")
    store.flush("s1")  # nothing pending: no transaction at all
    transactions = [r[3] for r in rows(admin, pg_schema, "s1")]
    assert len(set(transactions[:5])) == len(set(transactions[5:8])) == 1
    assert len(set(transactions)) == 3


def test_S27_a_connection_dropped_mid_flush_stores_everything_once(
        postgres: TemporaryPostgres, postgres_store: Make, pg_schema: str,
        admin: psycopg.Connection[Any]) -> None:
    """The backend is terminated while the flush's transaction waits inside COPY: nothing of
    it commits; the store reconnects, finds nothing new stored, and writes it all once."""
    store = postgres_store(fsync=True)
    store_events(store, "s1", BALANCED[:5])
    for event in BALANCED[5:9]:
        store.append("s1", event)
    pid = store.backend_pid
    with psycopg.connect(postgres.conninfo) as blocker:  # a transaction holding a table lock
        blocker.execute(f"LOCK TABLE {pg_schema}.events IN EXCLUSIVE MODE")

        def drop_the_connection() -> None:
            wait_for(lambda: waiting_on(admin, pid, "Lock"), "the flush to block")
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            blocker.commit()  # the retried flush may go through now

        thread = threading.Thread(target=drop_the_connection)
        thread.start()
        try:
            store.flush("s1")
        finally:
            thread.join()
    assert store.backend_pid not in (None, pid)  # a new connection did it
    assert [r[0] for r in rows(admin, pg_schema, "s1")] == list(range(9))
    with pytest.raises(SessionLockedError):  # and the lock was taken back with it
        postgres_store().load("s1")
    store.close()
    result = postgres_store().load("s1")
    assert list(result.events) == BALANCED[:9] and result.report.clean


@pytest.mark.parametrize("operation", ["flush", "create"])
def test_S27_a_commit_whose_acknowledgement_was_lost_is_found_not_repeated(
        postgres: TemporaryPostgres, postgres_store: Make, pg_schema: str,
        admin: psycopg.Connection[Any], operation: str) -> None:
    """The server commits, then the connection ends before the client hears of it (a backend
    terminated while its commit waits for a synchronous standby that never answers). The
    store must find the commit on reconnecting rather than write the rows again."""
    store = postgres_store(fsync=True)
    store_events(store, "s1", BALANCED[:5])
    for event in BALANCED[5:9]:
        store.append("s1", event)
    pid = store.backend_pid
    server_config(admin, postgres, "synchronous_standby_names", "no_such_standby")
    try:
        def drop_during_the_commit() -> None:
            wait_for(lambda: waiting_on(admin, pid, "SyncRep"), "the commit to wait")
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            server_config(admin, postgres, "synchronous_standby_names", None)

        thread = threading.Thread(target=drop_during_the_commit)
        thread.start()
        try:
            if operation == "flush":
                store.flush("s1")
            else:
                store.create("s2", cwd="/new")
        finally:
            thread.join()
    finally:
        server_config(admin, postgres, "synchronous_standby_names", None)
    assert store.backend_pid not in (None, pid)
    if operation == "flush":
        assert [r[0] for r in rows(admin, pg_schema, "s1")] == list(range(9))
    else:
        assert store.is_open("s2") and store.info("s2").cwd == "/new"
        store_events(store, "s2", BALANCED[:9], create=False)
        with pytest.raises(SessionLockedError):
            postgres_store().load("s2")
    store.close()
    expected = {"flush": ("s1", BALANCED[:9]), "create": ("s2", BALANCED[:9])}[operation]
    assert list(postgres_store().load(expected[0]).events) == expected[1]


def test_S27_with_the_server_down_flush_raises_and_keeps_the_events(
        postgres: TemporaryPostgres, postgres_store: Make) -> None:
    store = postgres_store(fsync=True, connect_timeout=2)
    store_events(store, "s1", BALANCED[:5])
    postgres.stop("fast")
    try:
        for event in BALANCED[5:9]:
            store.append("s1", event)  # held in memory, as always
        for attempt in range(2):
            with pytest.raises(StoreConnectionError) as raised:
                store.flush("s1")
            assert raised.value.code == "STORE_CONNECTION_LOST", attempt
    finally:
        postgres.start()
    store.flush("s1")  # the same events, stored once
    store.release("s1")
    assert list(postgres_store().load("s1").events) == BALANCED[:9]


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_S27_a_server_restart_between_flushes_is_invisible(
        postgres: TemporaryPostgres, postgres_store: Make, mode: Any) -> None:
    """A clean restart, or a crash (immediate shutdown, recovery at the next start): every
    flushed event survives, and the next flush carries on as if nothing had happened."""
    store = postgres_store(fsync=True)
    store_events(store, "s1", BALANCED[:5])
    for event in BALANCED[5:9]:
        store.append("s1", event)  # appended before the restart, flushed after it
    postgres.restart(mode)
    for event in BALANCED[9:16]:
        store.append("s1", event)
    store.flush("s1")
    with pytest.raises(SessionLockedError):  # the lock was taken back
        postgres_store().load("s1")
    store.close()
    result = postgres_store().load("s1")
    assert list(result.events) == BALANCED[:16] and result.report.clean


@pytest.mark.parametrize("other_keeps_it", [True, False], ids=["taken", "changed"])
def test_S27_a_session_taken_while_disconnected_is_lost_never_overwritten(
        postgres_store: Make, admin: psycopg.Connection[Any], other_keeps_it: bool) -> None:
    first = postgres_store()
    store_events(first, "s1", OPEN[:-2])
    for event in OPEN[-2:]:
        first.append("s1", event)  # unflushed when the connection dies
    admin.execute("SELECT pg_terminate_backend(%s)", (first.backend_pid,))
    second = postgres_store(lock_wait=30)  # the lock went with the connection
    repaired = second.load("s1")  # the writer looks dead: its turn is closed
    assert repaired.report.closers_appended > 0
    if not other_keeps_it:
        second.release("s1")
    with pytest.raises(SessionLostError, match=r"2 unflushed events not stored.*load it again") \
            as raised:
        first.flush("s1")
    assert raised.value.code == "SESSION_LOST" and not raised.value.recovered
    assert isinstance(raised.value, StoreWriteError)
    builder = LogBuilder(OPEN)
    with pytest.raises(SessionLostError):
        first.append("s1", builder.call(3, 1, "c3"))
    with pytest.raises(SessionLostError):
        first.release("s1")
    assert not first.is_open("s1")
    assert list(first.inspect("s1").events) == list(repaired.events)  # only the other's


def test_S27_an_idle_connection_dropped_is_replaced_and_its_locks_taken_back(
        postgres_store: Make, admin: psycopg.Connection[Any]) -> None:
    store = postgres_store()
    store_events(store, "s1", BALANCED[:5])
    store_events(store, "s2", BALANCED[:3])
    old = store.backend_pid
    admin.execute("SELECT pg_terminate_backend(%s)", (old,))
    assert store.list_sessions() == ["s1", "s2"]  # reconnected, transparently
    assert store.backend_pid != old
    for session in ("s1", "s2"):
        with pytest.raises(SessionLockedError):
            postgres_store().load(session)
    store.append("s1", BALANCED[5])
    store.flush("s1")
    store.close()
    assert list(postgres_store().inspect("s1").events) == BALANCED[:6]


# --------------------------------------------------------------------------
# S28: typed errors with the real cause
# --------------------------------------------------------------------------


def test_S28_a_statement_timeout_is_typed_and_nothing_is_half_written(
        postgres: TemporaryPostgres, postgres_store: Make, pg_schema: str,
        admin: psycopg.Connection[Any]) -> None:
    store = postgres_store(statement_timeout=0.2)
    store_events(store, "s1", BALANCED[:5])
    store_events(store, "s2", BALANCED[:9])
    store.release("s2")
    for event in BALANCED[5:9]:
        store.append("s1", event)
    with psycopg.connect(postgres.conninfo) as blocker:
        blocker.execute(f"LOCK TABLE {pg_schema}.events IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StoreTimeoutError, match=r"cancelled after 0\.2 s") as raised:
            store.flush("s1")
        assert raised.value.code == "STORE_TIMEOUT"
        with pytest.raises(StoreTimeoutError):
            store.load("s2")
        assert not store.is_open("s2")
        blocker.rollback()
    assert [r[0] for r in rows(admin, pg_schema, "s1")] == list(range(5))
    store.flush("s1")  # the same events, once
    assert [r[0] for r in rows(admin, pg_schema, "s1")] == list(range(9))
    assert list(store.load("s2").events) == BALANCED[:9]  # and its lock was given back


def test_S28_a_read_only_database_is_typed_and_changes_nothing(
        postgres: TemporaryPostgres, postgres_store: Make, pg_schema: str,
        admin: psycopg.Connection[Any]) -> None:
    with postgres_store() as store:
        store_events(store, "balanced", BALANCED)
        store_events(store, "open", OPEN)
    before = admin.execute(f"SELECT count(*) FROM {pg_schema}.events").fetchone()
    read_only = PostgresStore(postgres.conninfo + " options='-c default_transaction_read_only=on'",
                              schema=pg_schema)
    with read_only:
        with pytest.raises(StoreReadOnlyError, match="read-only") as raised:
            read_only.create("s3")
        assert raised.value.code == "STORE_READ_ONLY" and isinstance(raised.value, StoreWriteError)
        with pytest.raises(StoreReadOnlyError):
            read_only.load("open")  # its repair cannot be written
        assert not read_only.is_open("open")
        read_only.load("balanced")  # nothing to write: a read-only load works
        read_only.append("balanced", LogBuilder(BALANCED).user("late", plugin="p"))
        with pytest.raises(StoreReadOnlyError) as raised:
            read_only.flush("balanced")
        assert raised.value.recovered
        assert read_only.list_sessions() == ["balanced", "open"]
        with pytest.raises(StoreReadOnlyError):
            read_only.release("balanced")
    assert admin.execute(f"SELECT count(*) FROM {pg_schema}.events").fetchone() == before
    assert postgres_store().load("open").report.closers_appended == 4  # still unrepaired


def test_S28_permission_denied_is_typed(postgres: TemporaryPostgres, postgres_store: Make,
                                        pg_schema: str, admin: psycopg.Connection[Any]) -> None:
    postgres_store().close()
    role = f"{pg_schema}_nobody"
    admin.execute(f"CREATE ROLE {role} LOGIN")
    conninfo = postgres.conninfo.replace("user=turnstile", f"user={role}")
    with pytest.raises(StoreError, match="permission denied"):
        PostgresStore(conninfo, schema=pg_schema)
    with pytest.raises(StoreError, match="permission denied"):
        PostgresStore(conninfo, schema=f"{pg_schema}_new")  # may not create a schema either


@pytest.mark.parametrize(("error", "kind", "words"), [
    (psycopg.errors.DiskFull, StoreFullError, "disk is full"),
    (psycopg.errors.ReadOnlySqlTransaction, StoreReadOnlyError, "read-only"),
    (psycopg.errors.QueryCanceled, StoreTimeoutError, "cancelled"),
    (psycopg.errors.LockNotAvailable, StoreTimeoutError, "lock was not granted"),
    (psycopg.errors.AdminShutdown, StoreConnectionError, "connection to the server was lost"),
    (psycopg.errors.OutOfMemory, StoreError, "max_locks_per_transaction"),
    (psycopg.errors.UndefinedTable, StoreError, "schema is missing or altered"),
    (psycopg.errors.DivisionByZero, StoreError, "PostgreSQL error 22012"),
])
def test_S28_server_errors_are_named_by_their_cause(
        postgres_store: Make, error: type[psycopg.Error], kind: type[StoreError],
        words: str) -> None:
    """The causes a test server cannot be made to produce at will (a full disk), mapped the
    same way as the ones the tests above provoke."""
    typed = postgres_store()._typed(error("the server's words"), "flush session 's1'", False)
    assert type(typed) is kind and words in str(typed) and "the server's words" in str(typed)
    assert "cannot flush session 's1' in postgresql://" in str(typed)


def test_S28_no_psycopg_exception_escapes_with_the_server_gone(
        postgres: TemporaryPostgres, postgres_store: Make) -> None:
    store = postgres_store(connect_timeout=2)
    store_events(store, "s1", BALANCED[:9])
    store_events(store, "s2", BALANCED[:3])
    postgres.stop("immediate")
    try:
        def append_and_flush() -> None:
            store.append("s1", BALANCED[9])
            store.flush("s1")
        calls: list[tuple[str, Callable[[], object]]] = [
            ("create", lambda: store.create("s3")), ("load", lambda: store.load("other")),
            ("inspect", lambda: store.inspect("other")), ("info", lambda: store.info("other")),
            ("list", store.list_sessions), ("fork", lambda: store.fork("s1", 8, "kid")),
            ("flush", append_and_flush),
            ("close", store.close),  # s1's unflushed event cannot be stored
        ]
        for name, call in calls:
            try:
                call()
            except StoreConnectionError as error:
                assert "connect" in str(error), name
            else:
                raise AssertionError(f"{name} did not raise")
        with pytest.raises(StoreConnectionError):
            postgres_store()
    finally:
        postgres.start()


def test_S28_a_schema_dropped_under_a_live_store_is_typed(
        postgres_store: Make, pg_schema: str, admin: psycopg.Connection[Any]) -> None:
    store = postgres_store()
    store_events(store, "s1", BALANCED[:3])
    store.append("s1", BALANCED[3])
    admin.execute(f"DROP SCHEMA {pg_schema} CASCADE")
    with pytest.raises(StoreError, match="schema is missing or altered"):
        store.flush("s1")
    with pytest.raises(StoreError, match="schema is missing or altered"):
        store.list_sessions()


# --------------------------------------------------------------------------
# S29: the throwaway server of the tests
# --------------------------------------------------------------------------


def test_S29_the_server_runs_unprivileged_on_a_socket_in_its_directory(
        postgres: TemporaryPostgres, admin: psycopg.Connection[Any]) -> None:
    assert postgres.pid is not None
    status = Path(f"/proc/{postgres.pid}/status").read_text()
    uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
    if os.geteuid() == 0:  # PostgreSQL refuses root: the server runs as another account
        assert uid != 0
    else:
        assert uid == os.geteuid()
    assert (postgres.socket_dir / ".s.PGSQL.5432").is_socket()
    assert admin.execute("SHOW listen_addresses").fetchone() == ("",)  # no TCP at all


def test_S29_missing_server_programs_say_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PostgresNotFoundError, match="apt-get install postgresql") as raised:
        find_server_binaries(tmp_path)
    assert str(tmp_path) in str(raised.value) and INSTALL_HINT in str(raised.value)
    monkeypatch.setenv("TURNSTILE_PG_BIN", str(tmp_path))
    with pytest.raises(PostgresNotFoundError, match="TURNSTILE_PG_BIN"):
        TemporaryPostgres()


def test_S29_without_server_programs_the_postgres_tests_fail_and_say_why(tmp_path: Path) -> None:
    """Never a silent skip: a test session that cannot start its server fails each
    PostgreSQL test with what to install (here the programs are looked for in an empty
    directory)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TURNSTILE_PG_BIN": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--no-header", "-rE",
         f"{Path(__file__).name}::test_S26_readers_see_only_flushed_events"],
        cwd=Path(__file__).parent, env=env, capture_output=True, text=True, timeout=300,
        check=False)
    assert done.returncode == 1, done.stdout
    assert "1 error" in done.stdout and "skipped" not in done.stdout
    assert "need a PostgreSQL server" in done.stdout and "apt-get install postgresql" in done.stdout


def test_S24_a_reconnecting_store_checks_the_version_again(
        postgres_store: Make, pg_schema: str, admin: psycopg.Connection[Any]) -> None:
    store = postgres_store()
    store_events(store, "s1", BALANCED[:9])
    admin.execute(f"UPDATE {pg_schema}.meta SET value = '2'")  # upgraded by newer code
    admin.execute("SELECT pg_terminate_backend(%s)", (store.backend_pid,))
    store.append("s1", BALANCED[9])
    with pytest.raises(UnsupportedFormatError, match="version 2"):
        store.flush("s1")
    assert [r[0] for r in rows(admin, pg_schema, "s1")] == list(range(9))
