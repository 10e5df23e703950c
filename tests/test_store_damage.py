"""Damaged storage is reported, never silently dropped (§22.5, D8; specs/persistence.md S9–S13)."""

from __future__ import annotations

import json
import os
import sqlite3
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from machine.events import Event
from machine.jsonvalue import FrozenDict
from machine.log import validate_events
from machine.store import (
    DamageError,
    JsonlStore,
    SessionInfo,
    SqliteStore,
    StoreFullError,
    StoreWriteError,
    UnsupportedFormatError,
)
from machine.store.base import BaseStore
from machine.store.codec import canonical, event_bytes, header_uid, record_crc
from machine.store.jsonl import encode_record, parse_jsonl
from machine.store.postgres import row_crc
from machine.store.repair import closers, scan
from machine.store.testing import sample_session, store_events

SESSION = "s"
EVENTS = sample_session(open_tail=False)  # 18 events; seqs 16 and 17 are between turns
TAIL = len(EVENTS) - 2  # the first between-turn event after the last turn/end
MIDDLE = 5


def bad_event(seq: int) -> Event:
    """A well-formed record whose event breaks the invariants (a step outside any turn)."""
    return Event("step/start", seq, 0, FrozenDict({"turn": 99, "step": 1}))


class Jsonl:
    """Damages the file of a JSONL session."""

    name = "jsonl"

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "store"

    def store(self) -> BaseStore[Any]:
        return JsonlStore(self.root, fsync=False)

    @property
    def path(self) -> Path:
        return self.root / f"{SESSION}.jsonl"

    def lines(self) -> list[bytes]:
        return self.path.read_bytes().splitlines(keepends=True)

    def offset(self, index: int) -> int | None:
        return sum(len(line) for line in self.lines()[:index + 1])

    def snapshot(self) -> object:
        return sorted((p.name, p.read_bytes()) for p in self.root.iterdir())

    def uid(self) -> str | None:
        """The session's identity, which a record's checksum covers (S8)."""
        return header_uid(self.lines()[0])

    def _edit(self, edit: Callable[[list[bytes]], None]) -> None:
        lines = self.lines()
        edit(lines)
        self.path.write_bytes(b"".join(lines))

    def checksum(self, index: int) -> None:
        def edit(lines: list[bytes]) -> None:
            line = lines[index + 1]
            crc = json.loads(line)["crc"]
            lines[index + 1] = line.replace(b'"crc":%d' % crc, b'"crc":%d' % (crc ^ 1))
        self._edit(edit)

    def garbage(self, index: int) -> None:
        def edit(lines: list[bytes]) -> None:
            lines[index + 1] = b"this is not a record\n"
        self._edit(edit)

    def not_an_event(self, index: int) -> None:
        raw = canonical({"x": 1})
        uid = self.uid()
        self._edit(lambda lines: lines.__setitem__(
            index + 1, b'{"crc":%d,"event":%s}\n' % (record_crc(raw, uid), raw)))

    def drop(self, index: int) -> None:
        self._edit(lambda lines: lines.__delitem__(index + 1))

    def duplicate(self, index: int) -> None:
        self._edit(lambda lines: lines.insert(index + 2, lines[index + 1]))

    def replace(self, event: Event) -> None:
        uid = self.uid()
        self._edit(lambda lines: lines.__setitem__(event.seq + 1, encode_record(event, uid)))

    def header(self) -> None:
        self._edit(lambda lines: lines.__setitem__(0, lines[0].replace(b"/cwd", b"/cwX")))


class Sqlite:
    """Damages the rows of a SQLite session."""

    name = "sqlite"

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "store.db"

    def store(self) -> BaseStore[Any]:
        return SqliteStore(self.path, fsync=False)

    def offset(self, index: int) -> int | None:
        return None

    def _sql(self, statement: str, *args: object) -> None:
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            db.execute(statement, args)
        finally:
            db.close()

    def snapshot(self) -> object:
        db = sqlite3.connect(self.path)
        try:
            return (db.execute("SELECT * FROM events ORDER BY session, idx").fetchall(),
                    db.execute("SELECT * FROM sessions").fetchall(),
                    db.execute("SELECT count(*) FROM quarantine").fetchall())
        finally:
            db.close()

    def uid(self) -> str | None:
        db = sqlite3.connect(self.path)
        try:
            (header,) = db.execute("SELECT header FROM sessions WHERE id=?", (SESSION,)).fetchone()
        finally:
            db.close()
        return header_uid(bytes(header))

    def checksum(self, index: int) -> None:
        self._sql("UPDATE events SET crc = (crc + 1) % 4294967296 WHERE idx=?", index)

    def garbage(self, index: int) -> None:
        raw = b"this is not a record"
        self._sql("UPDATE events SET record=?, crc=? WHERE idx=?", raw,
                  record_crc(raw, self.uid()), index)

    def not_an_event(self, index: int) -> None:
        raw = canonical({"x": 1})
        self._sql("UPDATE events SET record=?, crc=? WHERE idx=?", raw,
                  record_crc(raw, self.uid()), index)

    def drop(self, index: int) -> None:
        self._sql("DELETE FROM events WHERE idx=?", index)

    def duplicate(self, index: int) -> None:
        raw = event_bytes(EVENTS[index])
        self._sql("UPDATE events SET record=?, crc=? WHERE idx=?", raw,
                  record_crc(raw, self.uid()), index + 1)

    def replace(self, event: Event) -> None:
        raw = event_bytes(event)
        self._sql("UPDATE events SET record=?, crc=? WHERE idx=?", raw,
                  record_crc(raw, self.uid()), event.seq)

    def header(self) -> None:
        self._sql("UPDATE sessions SET header=replace(header, '/cwd', '/cwX')")


class Postgres:
    """Damages the rows of a PostgreSQL session (a row's crc covers its session key, S25)."""

    name = "postgres"

    def __init__(self, make: Callable[..., BaseStore[Any]], conninfo: str, schema: str) -> None:
        self.make, self.conninfo, self.schema = make, conninfo, schema

    def store(self) -> BaseStore[Any]:
        return self.make()

    def offset(self, index: int) -> int | None:
        return None

    def _sql(self, statement: str, *args: object) -> list[tuple[Any, ...]]:
        import psycopg
        with psycopg.connect(self.conninfo, autocommit=True) as db:
            db.execute(f"SET search_path = {self.schema}")
            cursor = db.execute(statement.replace("?", "%s"), args)
            return cursor.fetchall() if cursor.description else []

    def _set(self, index: int, raw: bytes) -> None:
        self._sql("UPDATE events SET record=?, crc=? WHERE session=? AND idx=?", raw,
                  row_crc(SESSION, raw), SESSION, index)

    def snapshot(self) -> object:
        return (self._sql("SELECT * FROM events ORDER BY session, idx"),
                self._sql("SELECT id, header FROM sessions ORDER BY id"),
                self._sql("SELECT count(*) FROM quarantine"))

    def checksum(self, index: int) -> None:
        self._sql("UPDATE events SET crc = mod(crc + 1, 4294967296) WHERE idx=?", index)

    def garbage(self, index: int) -> None:
        self._set(index, b"this is not a record")

    def not_an_event(self, index: int) -> None:
        self._set(index, canonical({"x": 1}))

    def drop(self, index: int) -> None:
        self._sql("DELETE FROM events WHERE idx=?", index)

    def duplicate(self, index: int) -> None:
        self._set(index + 1, event_bytes(EVENTS[index]))

    def replace(self, event: Event) -> None:
        self._set(event.seq, event_bytes(event))

    def header(self) -> None:
        self._sql("UPDATE sessions SET header=convert_to(replace(convert_from(header, 'UTF8'), "
                  "'/cwd', '/cwX'), 'UTF8')")


Backend = Jsonl | Sqlite | Postgres


def make_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "jsonl":
        return Jsonl(tmp_path)
    if request.param == "sqlite":
        return Sqlite(tmp_path)
    return Postgres(request.getfixturevalue("postgres_store"),
                    request.getfixturevalue("postgres").conninfo,
                    request.getfixturevalue("pg_schema"))


@pytest.fixture(params=["jsonl", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    chosen = make_backend(request, tmp_path)
    with chosen.store() as store:
        store.create(SESSION, cwd="/cwd")
        store_events(store, SESSION, EVENTS, create=False)
    return chosen


# (damage, expected kind, index of the damaged record given the damaged position)
CASES: list[tuple[str, str, Callable[[int], int]]] = [
    ("checksum", "checksum-mismatch", lambda k: k),
    ("garbage", "undecodable", lambda k: k),
    ("not_an_event", "undecodable", lambda k: k),
    ("drop", "seq-gap", lambda k: k),
    ("duplicate", "seq-duplicate", lambda k: k + 1),
    ("invariant", "invariant-violation", lambda k: k),
]


def damage(backend: Backend, how: str, position: int) -> None:
    if how == "invariant":
        backend.replace(bad_event(position))
    else:
        getattr(backend, how)(position)


STRICT_CASES = [
    pytest.param(how, kind, index_of, position, id=f"{how}-{where}")
    for where, position in (("middle", MIDDLE), ("between-turn-tail", TAIL),
                            ("final-record", len(EVENTS) - 1))
    for how, kind, index_of in CASES
    # a final record removed whole leaves a shorter valid log: nothing to detect
    if not (where == "final-record" and how in ("drop", "duplicate"))
]


@pytest.mark.parametrize(("how", "kind", "index_of", "position"), STRICT_CASES)
def test_D8_damage_is_reported_with_its_position_and_strict_raises(
        backend: Backend, how: str, kind: str, index_of: Callable[[int], int],
        position: int) -> None:
    """S10, S11: each kind of damage is reported with its record index and byte offset; a
    strict load raises DamageError (SESSION_DAMAGED) and changes nothing stored."""
    damage(backend, how, position)
    index = index_of(position)
    before = backend.snapshot()
    with backend.store() as store, pytest.raises(DamageError) as raised:
        store.load(SESSION)
    error = raised.value
    assert (error.kind, error.record_index) == (kind, index)
    assert error.byte_offset == backend.offset(index)
    assert error.code == "SESSION_DAMAGED" and f"record {index}" in str(error)
    assert backend.snapshot() == before  # nothing truncated, skipped or rewritten


@pytest.mark.parametrize("position", [MIDDLE, TAIL], ids=["middle", "between-turn-tail"])
@pytest.mark.parametrize(("how", "kind", "index_of"), CASES, ids=[c[0] for c in CASES])
def test_D8_salvage_keeps_the_intact_prefix_and_reports(
        backend: Backend, how: str, kind: str, index_of: Callable[[int], int],
        position: int) -> None:
    """S11, S13: a salvage load keeps the intact prefix, reports the first damage and
    leaves a session that loads clean."""
    damage(backend, how, position)
    index = index_of(position)
    with backend.store() as store:
        result = store.load(SESSION, "salvage")
    kept = EVENTS[:index]
    assert list(result.events) == kept + list(closers(kept))
    assert [(d.kind, d.record_index) for d in result.report.damage][:1] == [(kind, index)]
    assert result.report.quarantine is not None
    assert validate_events(result.events) is None and scan(result.events).open_turn is None
    assert result.info == SessionInfo(SESSION, cwd="/cwd")
    with backend.store() as store:  # the salvage is durable and the session is clean now
        again = store.load(SESSION)
    assert list(again.events) == list(result.events) and again.report.clean


def test_D8_every_record_damage_is_listed_in_storage_order(backend: Backend) -> None:
    backend.checksum(12)
    backend.garbage(3)
    with backend.store() as store, pytest.raises(DamageError) as raised:
        store.load(SESSION)
    assert [(d.kind, d.record_index) for d in raised.value.damage] == [
        ("undecodable", 3), ("checksum-mismatch", 12)]
    assert raised.value.record_index == 3


def test_D8_header_damage(backend: Backend) -> None:
    backend.header()
    with backend.store() as store, pytest.raises(DamageError) as raised:
        store.load(SESSION)
    assert raised.value.record_index is None and raised.value.kind == "checksum-mismatch"
    with backend.store() as store, pytest.raises(DamageError):
        store.info(SESSION)
    with backend.store() as store:
        result = store.load(SESSION, "salvage")  # the events are intact: all kept
    assert list(result.events) == EVENTS
    assert result.info == SessionInfo(SESSION)  # the header is rewritten without its fields
    with backend.store() as store:
        assert store.info(SESSION) == SessionInfo(SESSION)


def test_inspect_reports_damage_without_raising(backend: Backend) -> None:
    backend.garbage(MIDDLE)
    with backend.store() as store:
        seen = store.inspect(SESSION)
    assert list(seen.events) == EVENTS[:MIDDLE] and seen.stored_records == len(EVENTS)
    assert [d.kind for d in seen.report.damage] == ["undecodable"]


# --------------------------------------------------------------------------
# JSONL specifics: torn final records, headers
# --------------------------------------------------------------------------


@pytest.fixture
def jsonl(tmp_path: Path) -> Jsonl:
    chosen = Jsonl(tmp_path)
    with chosen.store() as store:
        store.create(SESSION, cwd="/cwd")
        store_events(store, SESSION, EVENTS, create=False)
    return chosen


def test_S9_a_torn_final_record_is_cut_off(jsonl: Jsonl) -> None:
    data = jsonl.path.read_bytes()
    jsonl.path.write_bytes(data + encode_record(bad_event(len(EVENTS)), jsonl.uid())[:40])
    with jsonl.store() as store:
        result = store.load(SESSION)
    assert list(result.events) == EVENTS and result.report.truncated_bytes == 40
    assert not result.report.damage
    assert jsonl.path.read_bytes() == data  # cut durably, nothing else written


def test_S9_a_complete_record_without_its_newline_is_torn(jsonl: Jsonl) -> None:
    data = jsonl.path.read_bytes()
    jsonl.path.write_bytes(data[:-1])
    with jsonl.store() as store:
        result = store.load(SESSION)
    assert list(result.events) == EVENTS[:-1]
    assert result.report.truncated_bytes == len(encode_record(EVENTS[-1], jsonl.uid())) - 1


@pytest.mark.parametrize("suffix", [b"X", b" ", b"\x00", b"}"], ids=["letter", "space", "nul", "brace"])
def test_S9_a_complete_record_followed_by_other_bytes_is_damage(jsonl: Jsonl, suffix: bytes) -> None:
    data = jsonl.path.read_bytes()
    jsonl.path.write_bytes(data[:-1] + suffix)  # the final newline became something else
    with jsonl.store() as store, pytest.raises(DamageError) as raised:
        store.load(SESSION)
    assert raised.value.record_index == len(EVENTS) - 1


def test_S9_an_unterminated_final_record_failing_its_checksum_is_damage(jsonl: Jsonl) -> None:
    jsonl.checksum(len(EVENTS) - 1)
    jsonl.path.write_bytes(jsonl.path.read_bytes()[:-1])
    with jsonl.store() as store, pytest.raises(DamageError) as raised:
        store.load(SESSION)
    assert raised.value.kind == "checksum-mismatch"


def test_S9_control_bytes_in_an_unterminated_tail_are_damage(jsonl: Jsonl) -> None:
    jsonl.path.write_bytes(jsonl.path.read_bytes() + b'{"crc":1\x07')
    with jsonl.store() as store, pytest.raises(DamageError) as raised:
        store.load(SESSION)
    assert (raised.value.kind, raised.value.record_index) == ("undecodable", len(EVENTS))


def test_S9_zero_fill_after_a_torn_record_is_part_of_it(jsonl: Jsonl) -> None:
    jsonl.path.write_bytes(jsonl.path.read_bytes() + b'{"crc":12,"ev' + b"\x00" * 100)
    with jsonl.store() as store:
        assert store.load(SESSION).report.truncated_bytes == 113


def test_S8_empty_lines_are_damage(jsonl: Jsonl) -> None:
    lines = jsonl.lines()
    lines.insert(4, b"\n")
    jsonl.path.write_bytes(b"".join(lines))
    with jsonl.store() as store, pytest.raises(DamageError, match="empty line"):
        store.load(SESSION)


@pytest.mark.parametrize("data", [b"", b'{"crc":1,"kind":"hea'], ids=["empty", "torn"])
def test_S9_a_file_without_a_header_is_damage(jsonl: Jsonl, data: bytes) -> None:
    jsonl.path.write_bytes(data)
    with jsonl.store() as store, pytest.raises(DamageError) as raised:
        store.load(SESSION)
    assert raised.value.kind == "header" and raised.value.record_index is None
    with jsonl.store() as store:
        result = store.load(SESSION, "salvage")
    assert list(result.events) == [] and result.info == SessionInfo(SESSION)


def test_S8_a_header_naming_another_session_is_damage(jsonl: Jsonl) -> None:
    jsonl.path.rename(jsonl.root / "other.jsonl")
    with jsonl.store() as store, pytest.raises(DamageError, match="names session 's'"):
        store.load("other")


def test_S9_unsupported_format_versions_are_refused_even_in_salvage(jsonl: Jsonl) -> None:
    fields = {"version": 3, "kind": "header", "session": SESSION}
    header = canonical({**fields, "crc": zlib.crc32(canonical(fields))})
    lines = jsonl.lines()
    lines[0] = header + b"\n"
    jsonl.path.write_bytes(b"".join(lines))
    for mode in ("strict", "salvage"):
        with jsonl.store() as store, pytest.raises(UnsupportedFormatError):
            store.load(SESSION, mode)


def test_S13_salvage_keeps_the_damaged_original_aside(jsonl: Jsonl) -> None:
    jsonl.garbage(MIDDLE)
    original = jsonl.path.read_bytes()
    with jsonl.store() as store:
        result = store.load(SESSION, "salvage")
    assert result.report.quarantine == str(jsonl.root / f"{SESSION}.jsonl.damaged-1")
    assert Path(result.report.quarantine).read_bytes() == original
    with jsonl.store() as store:
        assert store.list_sessions() == [SESSION]


def test_parse_jsonl_positions_are_byte_offsets(jsonl: Jsonl) -> None:
    data = jsonl.path.read_bytes()
    stored = parse_jsonl(data, SESSION)
    for record in stored.records:
        assert record.byte_offset is not None
        line_end = data.index(b"\n", record.byte_offset)
        assert data[record.byte_offset:line_end + 1] == encode_record(EVENTS[record.index],
                                                                      jsonl.uid())


# --------------------------------------------------------------------------
# SQLite specifics
# --------------------------------------------------------------------------


def test_sqlite_a_row_index_that_disagrees_with_its_event_is_a_gap(tmp_path: Path) -> None:
    backend = Sqlite(tmp_path)
    with backend.store() as store:
        store_events(store, SESSION, EVENTS)
    backend._sql("UPDATE events SET idx=idx+5 WHERE idx=?", len(EVENTS) - 1)
    with backend.store() as store, pytest.raises(DamageError) as raised:
        store.load(SESSION)
    assert (raised.value.kind, raised.value.record_index) == ("seq-gap", len(EVENTS) - 1)
    assert "stored index" in str(raised.value)


def test_sqlite_salvage_moves_damaged_rows_to_quarantine(tmp_path: Path) -> None:
    backend = Sqlite(tmp_path)
    with backend.store() as store:
        store_events(store, SESSION, EVENTS)
    backend.garbage(TAIL)
    with backend.store() as store:
        result = store.load(SESSION, "salvage")
    assert result.report.quarantine is not None and "#quarantine/" in result.report.quarantine
    db = sqlite3.connect(backend.path)
    try:
        moved = db.execute("SELECT idx FROM quarantine ORDER BY idx").fetchall()
    finally:
        db.close()
    assert moved == [(TAIL,), (TAIL + 1,)]


def test_S5_a_failed_append_leaves_nothing_behind(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    store = JsonlStore(tmp_path, fsync=False)
    store_events(store, SESSION, EVENTS[:3])
    size = (tmp_path / f"{SESSION}.jsonl").stat().st_size
    real_write = os.write
    calls = {"n": 0}

    def half_then_fail(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[:10])  # a short write...
        raise OSError(28, "No space left on device")  # ...then the disk is full

    monkeypatch.setattr("machine.store.jsonl.os.write", half_then_fail)
    with pytest.raises(StoreFullError, match="No space left") as raised:
        store.append(SESSION, EVENTS[3])
    assert raised.value.recovered
    monkeypatch.setattr("machine.store.jsonl.os.write", real_write)
    assert (tmp_path / f"{SESSION}.jsonl").stat().st_size == size  # the partial record is gone
    store.append(SESSION, EVENTS[3])  # and the session goes on
    store.close()
    assert list(JsonlStore(tmp_path).inspect(SESSION).events) == EVENTS[:4]


def test_S5_an_unrecoverable_write_failure_stops_appends(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    store = JsonlStore(tmp_path, fsync=False)
    store_events(store, SESSION, EVENTS[:3])

    def fail(*_: Any) -> int:
        raise OSError(5, "I/O error")

    monkeypatch.setattr("machine.store.jsonl.os.write", fail)
    monkeypatch.setattr("machine.store.jsonl.os.ftruncate", fail)
    with pytest.raises(StoreWriteError) as raised:
        store.append(SESSION, EVENTS[3])
    assert not raised.value.recovered
    monkeypatch.undo()
    with pytest.raises(StoreWriteError, match="load it again"):
        store.append(SESSION, EVENTS[3])
    store.close()
