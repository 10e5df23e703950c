"""Session identity and format versions (S8, S30), zero-filled tails (S9), streamed loads
(S31) and typed storage failures (S32), on both backends where they apply.

Regressions of issue 14: a record copied from another session with the same seq loaded
clean; a NUL-only tail was cut as a torn record; a 1 GB session took 8 GiB to load; a
read-only file system or a full disk surfaced as a raw OSError, and SQLite reported them as
"not a session database".
"""

from __future__ import annotations

import errno
import gc
import json
import os
import sqlite3
import subprocess
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from machine.events import Event
from machine.store import (
    DamageError,
    JsonlStore,
    SessionInfo,
    SqliteStore,
    StoreError,
    StoreFullError,
    StoreReadError,
    StoreReadOnlyError,
    StoreWriteError,
    UnsupportedFormatError,
)
from machine.store import jsonl as jsonl_module
from machine.store.base import BaseStore
from machine.store.codec import canonical, event_bytes, header_uid, record_crc
from machine.store.jsonl import encode_record
from machine.store.testing import LogBuilder, sample_session, store_events

EVENTS = sample_session(open_tail=False)


def jsonl_lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


@pytest.fixture(params=["jsonl", "sqlite"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], BaseStore[Any]]]:
    opened: list[BaseStore[Any]] = []

    def make() -> BaseStore[Any]:
        store: BaseStore[Any] = (JsonlStore(tmp_path / "sessions", fsync=False)
                                 if request.param == "jsonl"
                                 else SqliteStore(tmp_path / "sessions.db", fsync=False))
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


# --------------------------------------------------------------------------
# S8, S30: every session has an identity, and its records' checksums cover it
# --------------------------------------------------------------------------


def test_S30_new_sessions_are_format_version_2_with_a_fresh_uid(
        backend: Callable[[], BaseStore[Any]]) -> None:
    store = backend()
    one = store.create("one")
    two = store.create("two")
    assert one.version == two.version == 2
    assert one.uid is not None and two.uid is not None and one.uid != two.uid
    store_events(store, "one", EVENTS, create=False)
    child = store.fork("one", child_id="kid")
    store.close()
    again = backend()
    assert again.info("one").uid == one.uid
    kid = again.info(child)
    assert kid.uid not in (None, one.uid)
    assert list(again.load(child).events) == EVENTS


def _copy_record_between_sessions_jsonl(root: Path, seq: int) -> None:
    source = jsonl_lines(root / "a.jsonl")
    target = jsonl_lines(root / "b.jsonl")
    target[seq + 1] = source[seq + 1]
    (root / "b.jsonl").write_bytes(b"".join(target))


def test_S30_a_record_copied_from_another_session_is_damage_jsonl(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    with JsonlStore(root, fsync=False) as store:
        store_events(store, "a", EVENTS)
        store_events(store, "b", EVENTS)       # the same events, so the same record texts
    _copy_record_between_sessions_jsonl(root, 4)
    with JsonlStore(root, fsync=False) as store, pytest.raises(DamageError) as raised:
        store.load("b")
    assert (raised.value.kind, raised.value.record_index) == ("checksum-mismatch", 4)
    assert "copied from another session" in str(raised.value.damage[0])
    with JsonlStore(root, fsync=False) as store:
        assert list(store.load("a").events) == EVENTS         # the source is untouched


def test_S30_a_row_copied_from_another_session_is_damage_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    with SqliteStore(path, fsync=False) as store:
        store_events(store, "a", EVENTS)
        store_events(store, "b", EVENTS)
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("UPDATE events SET crc = (SELECT crc FROM events WHERE session='a' AND "
                   "idx=7), record = (SELECT record FROM events WHERE session='a' AND idx=7) "
                   "WHERE session='b' AND idx=7")
    finally:
        db.close()
    with SqliteStore(path, fsync=False) as store, pytest.raises(DamageError) as raised:
        store.load("b")
    assert (raised.value.kind, raised.value.record_index) == ("checksum-mismatch", 7)


def _version_1_file(root: Path, session: str, events: list[Event]) -> bytes:
    """A session file as format version 1 wrote it: no uid, plain checksums."""
    fields = {"version": 1, "kind": "header", "session": session}
    lines = [canonical({**fields, "crc": zlib.crc32(canonical(fields))}) + b"\n"]
    for event in events:
        raw = event_bytes(event)
        lines.append(b'{"crc":%d,"event":%s}\n' % (zlib.crc32(raw), raw))
    data = b"".join(lines)
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{session}.jsonl").write_bytes(data)
    return data


def test_S30_version_1_sessions_are_read_repaired_and_appended_in_version_1(
        tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    open_tail = sample_session(open_tail=True)
    data = _version_1_file(root, "old", open_tail)
    with JsonlStore(root, fsync=False) as store:
        result = store.load("old")                    # repaired: closers appended in v1
        assert result.info.version == 1 and result.info.uid is None
        assert list(result.events)[:len(open_tail)] == open_tail
        assert result.report.closers_appended == 4     # two pending calls, step/end, turn/end
        following = LogBuilder(result.events).user("after", plugin="p")
        store.append("old", following)
    stored = (root / "old.jsonl").read_bytes()
    assert stored.startswith(data)
    last = json.loads(stored.splitlines()[-1])
    assert last["crc"] == zlib.crc32(canonical(last["event"]))     # a version-1 record
    with JsonlStore(root, fsync=False) as store:
        again = store.load("old")
        assert again.report.clean and len(again.events) == len(open_tail) + 5
        child = store.fork("old", child_id="new")
        assert store.info(child).version == 2


@pytest.mark.parametrize(("fields", "problem"), [
    ({"version": 2, "kind": "header", "session": "s"}, "needs a uid"),
    ({"version": 2, "kind": "header", "session": "s", "uid": "XYZ"}, "uid"),
    ({"version": 1, "kind": "header", "session": "s", "uid": "0" * 32}, "has no uid"),
])
def test_S30_a_header_whose_uid_does_not_fit_its_version_is_header_damage(
        tmp_path: Path, fields: dict[str, Any], problem: str) -> None:
    root = tmp_path / "sessions"
    root.mkdir()
    (root / "s.jsonl").write_bytes(canonical({**fields, "crc": zlib.crc32(canonical(fields))})
                                   + b"\n")
    with JsonlStore(root) as store, pytest.raises(DamageError, match=problem) as raised:
        store.load("s")
    assert raised.value.kind == "header"


def test_S30_unknown_versions_are_refused_in_every_mode(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    root.mkdir()
    fields = {"version": 3, "kind": "header", "session": "s", "uid": "0" * 32}
    (root / "s.jsonl").write_bytes(canonical({**fields, "crc": zlib.crc32(canonical(fields))})
                                   + b"\n")
    for mode in ("strict", "salvage"):
        with JsonlStore(root) as store, pytest.raises(UnsupportedFormatError,
                                                      match="reads versions 1, 2"):
            store.load("s", mode)


def test_S13_a_salvaged_header_keeps_the_uid_it_still_names(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    with JsonlStore(root, fsync=False) as store:
        uid = store.create("s", cwd="/cwd").uid
        store_events(store, "s", EVENTS, create=False)
    lines = jsonl_lines(root / "s.jsonl")
    lines[0] = lines[0].replace(b"/cwd", b"/cwX")    # fails its checksum; uid still readable
    (root / "s.jsonl").write_bytes(b"".join(lines))
    with JsonlStore(root, fsync=False) as store:
        result = store.load("s", "salvage")
    assert result.report.damage[0].kind == "checksum-mismatch"
    assert list(result.events) == EVENTS and result.info.uid == uid
    with JsonlStore(root, fsync=False) as store:
        assert store.load("s").report.clean


# --------------------------------------------------------------------------
# S9: zero fill alone is not a torn record
# --------------------------------------------------------------------------


@pytest.mark.parametrize("tail", [b"\x00" * 4096, b"\x00"], ids=["4KiB", "one"])
def test_S9_a_zero_filled_tail_is_damage_not_a_torn_record(tmp_path: Path, tail: bytes) -> None:
    root = tmp_path / "sessions"
    with JsonlStore(root, fsync=False) as store:
        store_events(store, "s", EVENTS)
    path = root / "s.jsonl"
    original = path.read_bytes()
    path.write_bytes(original + tail)
    with JsonlStore(root, fsync=False) as store, pytest.raises(DamageError) as raised:
        store.load("s")
    assert (raised.value.kind, raised.value.record_index) == ("undecodable", len(EVENTS))
    assert raised.value.byte_offset == len(original)
    assert path.read_bytes() == original + tail          # nothing cut
    with JsonlStore(root, fsync=False) as store:
        inspected = store.inspect("s")
    assert inspected.report.truncated_bytes == 0 and len(inspected.report.damage) == 1


def test_S9_zero_fill_after_the_start_of_a_record_is_still_torn(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    with JsonlStore(root, fsync=False) as store:
        store_events(store, "s", EVENTS)
    path = root / "s.jsonl"
    path.write_bytes(path.read_bytes() + b"{" + b"\x00" * 64)
    with JsonlStore(root, fsync=False) as store:
        assert store.load("s").report.truncated_bytes == 65


# --------------------------------------------------------------------------
# S31: a load streams its records
# --------------------------------------------------------------------------


def _large_session(root: Path, records: int, size: int) -> int:
    """A session of *records* chunks of *size* characters each (inside one step); returns
    the file's size."""
    builder = LogBuilder()
    builder.turn(1)
    builder.step(1, 1)
    for index in range(records):
        builder.chunk(1, 1, chr(ord("a") + index % 26) * size)
    builder.step_end(1, 1)
    builder.end(1)
    with JsonlStore(root, fsync=False) as store:
        store_events(store, "big", builder.events)
    return (root / "big.jsonl").stat().st_size


def test_S31_a_load_holds_about_the_log_not_a_multiple_of_the_file(tmp_path: Path) -> None:
    """tracemalloc counts every Python allocation (deterministically, whatever the load of
    the machine): loading a 6 MB session peaks near what the log keeps (the events' compact
    JSON texts, about the file size), where reading it whole took five times the file."""
    root = tmp_path / "sessions"
    file_size = _large_session(root, 24, 256 * 1024)
    gc.collect()
    tracemalloc.start()
    try:
        with JsonlStore(root, fsync=False) as store:
            result = store.load("big")
            _, peak = tracemalloc.get_traced_memory()
            assert len(result.events) == 28
    finally:
        tracemalloc.stop()
    assert peak < 1.6 * file_size, (peak, file_size)


def test_S31_a_streamed_load_reports_the_same_as_parsing_the_whole_file(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    with JsonlStore(root, fsync=False) as store:
        store_events(store, "s", sample_session(open_tail=True))
    path = root / "s.jsonl"
    lines = jsonl_lines(path)
    lines[6] = b"garbage\n"
    data = b"".join(lines) + b'{"crc":12,"ev'
    path.write_bytes(data)
    whole = jsonl_module.parse_jsonl(data, "s")
    with path.open("rb") as file:
        streamed = jsonl_module._stream_jsonl(file, "s")
        streamed_records = list(streamed.records)
    assert streamed_records == list(whole.records)
    assert (streamed.info, streamed.header_damage, streamed.torn_bytes, streamed.valid_length,
            streamed.uid) == (whole.info, whole.header_damage, whole.torn_bytes,
                              whole.valid_length, whole.uid)


# --------------------------------------------------------------------------
# S32: storage failures are typed, with their real cause
# --------------------------------------------------------------------------


@pytest.fixture
def read_only_fs(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """From the call on, every open for writing, truncation, link and rename fails as on a
    read-only file system (EROFS)."""
    real_open = os.open

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse()
        return real_open(path, flags, *args, **kwargs)

    def engage() -> None:
        monkeypatch.setattr(os, "open", open_)
        for name in ("truncate", "link", "replace", "ftruncate"):
            monkeypatch.setattr(os, name, refuse)
        monkeypatch.setattr(Path, "open", _read_only_path_open)
    return engage


_REAL_PATH_OPEN = Path.open


def _read_only_path_open(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
    if any(flag in mode for flag in "wxa+"):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
    return _REAL_PATH_OPEN(self, mode, *args, **kwargs)


def test_S32_jsonl_on_a_read_only_file_system(tmp_path: Path,
                                              read_only_fs: Callable[[], None]) -> None:
    root = tmp_path / "sessions"
    with JsonlStore(root, fsync=False) as store:
        store_events(store, "clean", EVENTS)
        store_events(store, "crashed", sample_session(open_tail=True))
        store_events(store, "torn", EVENTS)
    torn = root / "torn.jsonl"
    torn.write_bytes(torn.read_bytes() + b'{"crc":1,"ev')
    damaged = root / "clean.jsonl"
    read_only_fs()
    store = JsonlStore(root, fsync=False)
    loaded = store.load("clean")                     # needs no repair: it loads
    assert list(loaded.events) == EVENTS
    assert store.inspect("crashed").closers
    with pytest.raises(StoreReadOnlyError, match="Read-only file system") as raised:
        store.load("crashed")                        # needs its closers written
    assert "crashed" in str(raised.value)
    with pytest.raises(StoreReadOnlyError, match=r"cut the torn final record .*Read-only"):
        store.load("torn")
    with pytest.raises(StoreReadOnlyError, match=r"cannot create session 'new'.*Read-only"):
        store.create("new")
    next_event = LogBuilder(loaded.events).user("x", plugin="p")
    with pytest.raises(StoreReadOnlyError, match=r"cannot append.*Read-only") as append_error:
        store.append("clean", next_event)
    assert append_error.value.recovered
    assert damaged.read_bytes().count(b"\n") == len(EVENTS) + 1
    store.close()


def test_S32_jsonl_salvage_on_a_read_only_file_system_changes_nothing(
        tmp_path: Path, read_only_fs: Callable[[], None]) -> None:
    root = tmp_path / "sessions"
    with JsonlStore(root, fsync=False) as store:
        store_events(store, "s", EVENTS)
    path = root / "s.jsonl"
    lines = jsonl_lines(path)
    lines[5] = b"garbage\n"
    path.write_bytes(b"".join(lines))
    before = sorted(p.name for p in root.iterdir())
    read_only_fs()
    with JsonlStore(root, fsync=False) as store, \
            pytest.raises(StoreWriteError, match=r"cannot salvage session 's'.*unchanged"):
        store.load("s", "salvage")
    assert sorted(p.name for p in root.iterdir()) == before


def test_S32_jsonl_a_full_disk_is_a_recovered_write_error(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "sessions"
    store = JsonlStore(root, fsync=False)
    store_events(store, "s", EVENTS[:5])
    size = (root / "s.jsonl").stat().st_size

    def full(_fd: int, _data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(StoreFullError, match="No space left on device") as raised:
        store.append("s", EVENTS[5])
    assert raised.value.recovered and raised.value.code == "STORE_FULL"
    assert isinstance(raised.value, StoreWriteError)      # S32: a kind of write failure
    monkeypatch.undo()
    assert (root / "s.jsonl").stat().st_size == size
    store.append("s", EVENTS[5])
    store.close()


def test_S32_jsonl_an_unreadable_session_is_a_read_error(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "sessions"
    with JsonlStore(root, fsync=False) as store:
        store_events(store, "s", EVENTS)

    def denied(self: Path, *_args: Any, **_kwargs: Any) -> Any:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))

    monkeypatch.setattr(Path, "open", denied)
    with JsonlStore(root, fsync=False) as store:
        for action in (store.load, store.inspect, store.info):
            with pytest.raises(StoreReadError, match="Permission denied") as raised:
                action("s")
            assert raised.value.code == "STORE_READ_FAILED"


def _read_only_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    real = sqlite3.connect

    def connect(path: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        connection: sqlite3.Connection = real(f"file:{path}?mode=ro", *args, uri=True, **kwargs)
        return connection

    monkeypatch.setattr(sqlite3, "connect", connect)


def test_S32_sqlite_read_only_is_not_reported_as_a_bad_database(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "sessions.db"
    with SqliteStore(path, fsync=False) as store:
        store_events(store, "s", EVENTS)
        store_events(store, "crashed", sample_session(open_tail=True))
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()                # a database without the session tables
    _read_only_connect(monkeypatch)
    with pytest.raises(StoreReadOnlyError, match="readonly") as raised:
        SqliteStore(empty)                        # its tables cannot be created
    assert "not a session database" not in str(raised.value)
    with SqliteStore(path, fsync=False) as store:     # nothing to create: it opens
        assert list(store.inspect("s").events) == EVENTS
        assert list(store.load("s").events) == EVENTS
        with pytest.raises(StoreWriteError, match=r"cannot create session 'n'.*readonly"):
            store.create("n")
        store.append("s", LogBuilder(EVENTS).user("more", plugin="p"))
        with pytest.raises(StoreReadOnlyError, match=r"readonly.*SQLITE_READONLY"):
            store.flush("s")
        with pytest.raises(StoreWriteError, match="readonly"):
            store.load("crashed")                 # its closers cannot be written
        with pytest.raises(StoreWriteError):
            store.release("s")                    # the final flush fails, typed


def test_S32_sqlite_a_full_disk_is_a_write_error_with_its_cause(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = SqliteStore(path, fsync=False)
    store.create("s")
    (pages,) = store._db.execute("PRAGMA page_count").fetchone()
    store._db.execute(f"PRAGMA max_page_count={pages}")   # the database cannot grow: full
    big = LogBuilder()
    big.user("x" * 200_000, plugin="p")
    store.append("s", big.events[0])
    with pytest.raises(StoreFullError, match="full") as raised:
        store.flush("s")
    assert "SQLITE_FULL" in str(raised.value)
    with pytest.raises(StoreWriteError, match=r"cannot create session 't'.*full"):
        store.create("t", cwd="y" * 200_000)
    store._db.execute("PRAGMA max_page_count=1073741823")
    store.flush("s")                          # the append stayed pending and now lands
    store.close()
    with SqliteStore(path) as again:
        assert len(again.load("s").events) == 1


# S32 on real media: a tmpfs the test mounts (as root), remounted read-only or filled up.


class _Medium:
    """A tmpfs mounted at ``root`` for one test."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def remount(self, mode: str) -> None:
        """Remount the tmpfs ``ro`` or ``rw`` (every store on it must be closed first)."""
        _mount_command("mount", "-o", f"remount,{mode}", str(self.root))

    def fill(self) -> None:
        """Take every byte left on the tmpfs (ENOSPC from then on)."""
        fd = os.open(self.root / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (b"\0" * 65536, b"\0" * 4096, b"\0"):
                try:
                    while True:
                        os.write(fd, chunk)
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
        finally:
            os.close(fd)

    def free(self) -> None:
        (self.root / "filler").unlink()


def _mount_command(*argv: str) -> None:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except OSError as error:
        pytest.fail(f"S32 tests on real media: cannot run {argv[0]}: {error}")
    if result.returncode != 0:
        pytest.fail(f"S32 tests on real media: {' '.join(argv)} failed as root "
                    f"(exit {result.returncode}): {result.stderr.strip()}")


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[_Medium]:
    """A 4 MiB tmpfs mounted in the test's temporary directory, unmounted afterwards. Tests
    run as root (CI); without root nothing can be mounted and the test is skipped."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs for the S32 real-media tests needs root")
    root = tmp_path / "medium"
    root.mkdir()
    _mount_command("mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(root))
    try:
        yield _Medium(root)
    finally:
        gc.collect()                        # connections of stores a failed test left open
        result = subprocess.run(["umount", str(root)], capture_output=True, text=True,
                                check=False)
        if result.returncode != 0:          # detach it anyway, then report
            subprocess.run(["umount", "-l", str(root)], capture_output=True, check=False)
            raise AssertionError(f"cannot unmount the test's tmpfs {root}: "
                                 f"{result.stderr.strip()}")


def _leave_a_crashed_writer(path: Path, event: Event) -> None:
    """Leave the database *path* as a writer killed after flushing *event* to session ``s``
    leaves it: the event is only in the ``-wal`` file, with its ``-shm`` index beside it."""
    store = SqliteStore(path, fsync=False)
    store._db.execute("PRAGMA wal_autocheckpoint=0")      # nothing reaches the database file
    store.load("s")
    store.append("s", event)
    store.flush("s")
    files = {suffix: Path(f"{path}{suffix}").read_bytes() for suffix in ("", "-wal", "-shm")}
    store.close()                                         # checkpoints and removes the -wal
    for suffix, data in files.items():
        Path(f"{path}{suffix}").write_bytes(data)


def _stored_in_database_file(path: Path) -> int:
    """How many events of session ``s`` the database file itself holds (its -wal ignored)."""
    db = sqlite3.connect(f"{path.as_uri()}?immutable=1", uri=True)
    try:
        (count,) = db.execute("SELECT count(*) FROM events WHERE session='s'").fetchone()
    finally:
        db.close()
    assert isinstance(count, int)
    return count


def test_S32_sqlite_on_a_read_only_mount_reads_and_refuses_every_write(
        tmpfs: _Medium) -> None:
    path = tmpfs.root / "sessions.db"
    with SqliteStore(path, fsync=False) as store:
        store_events(store, "s", EVENTS)
        store_events(store, "crashed", sample_session(open_tail=True))
        store_events(store, "damaged", EVENTS)
    db = sqlite3.connect(path)
    db.execute("UPDATE events SET crc=crc+1 WHERE session='damaged' AND idx=5")
    db.commit()
    db.close()
    assert sorted(p.name for p in tmpfs.root.iterdir()) == ["sessions.db"]   # no -wal, -shm
    tmpfs.remount("ro")
    for create in (False, True):
        sqlite_store = SqliteStore(path, create=create)       # it opens, read-only
        assert sqlite_store.read_only is not None
        assert "Read-only file system" in sqlite_store.read_only
        with sqlite_store as store:
            assert store.list_sessions() == ["crashed", "damaged", "s"]
            assert store.info("s").session_id == "s"
            assert list(store.inspect("s").events) == EVENTS
            loaded = store.load("s")
            assert list(loaded.events) == EVENTS and not loaded.report.damage
            assert store.inspect("crashed").closers
            with pytest.raises(DamageError):
                store.load("damaged")                     # reading finds the damage
            write_refusals: list[tuple[str, Callable[[], object]]] = [
                (r"cannot create session 'n'", lambda: store.create("n")),
                (r"cannot append to session 's'",
                 lambda: store.append("s", LogBuilder(EVENTS).user("x", plugin="p"))),
                (r"session 'crashed'", lambda: store.load("crashed")),   # its closers
                (r"cannot salvage session 'damaged' .*unchanged",
                 lambda: store.load("damaged", "salvage")),
                (r"cannot create session 'kid'", lambda: store.fork("s", child_id="kid")),
            ]
            for what, write in write_refusals:
                with pytest.raises(StoreReadOnlyError, match=what) as raised:
                    write()
                assert "Read-only file system" in str(raised.value), what
                assert raised.value.code == "STORE_READ_ONLY" and raised.value.recovered
            assert not store.is_open("crashed") and not store.is_open("kid")
            store.flush("s")                              # nothing was held: nothing to write
    with pytest.raises(StoreReadOnlyError, match=r"cannot create .*Read-only file system"):
        SqliteStore(tmpfs.root / "new.db")
    with pytest.raises(StoreError, match="no such database"):
        SqliteStore(tmpfs.root / "new.db", create=False)
    assert sorted(p.name for p in tmpfs.root.iterdir()) == ["sessions.db"]


def test_S32_sqlite_on_a_read_only_mount_a_crashed_writers_log_is_read_or_refused(
        tmpfs: _Medium) -> None:
    path = tmpfs.root / "sessions.db"
    with SqliteStore(path, fsync=False) as store:
        store_events(store, "s", EVENTS)
    late = LogBuilder(EVENTS).user("late", plugin="p")
    _leave_a_crashed_writer(path, late)
    assert _stored_in_database_file(path) == len(EVENTS)   # the late event is in the -wal only
    tmpfs.remount("ro")
    with SqliteStore(path, create=False) as store:       # -wal and -shm: SQLite applies the log
        assert list(store.load("s").events) == [*EVENTS, late]
        with pytest.raises(StoreReadOnlyError, match="Read-only file system"):
            store.append("s", LogBuilder([*EVENTS, late]).user("more", plugin="p"))
    tmpfs.remount("rw")
    Path(f"{path}-shm").unlink()                         # a log SQLite cannot apply read-only
    tmpfs.remount("ro")
    for create in (False, True):
        with pytest.raises(StoreReadOnlyError, match=r"write-ahead log sessions\.db-wal") as raised:
            SqliteStore(path, create=create)             # not a stale read without the event
        assert "Read-only file system" in str(raised.value)
        assert "could miss flushed events" in str(raised.value)
    tmpfs.remount("rw")
    with SqliteStore(path, create=False) as store:       # where it can be written, it is all there
        assert list(store.load("s").events) == [*EVENTS, late]


def test_S32_sqlite_on_a_full_tmpfs_flush_fails_typed_and_loses_nothing(
        tmpfs: _Medium) -> None:
    path = tmpfs.root / "sessions.db"
    store = SqliteStore(path)
    store_events(store, "s", EVENTS)
    tmpfs.fill()
    late = LogBuilder(EVENTS).user("x" * 100_000, plugin="p")
    store.append("s", late)                               # held in memory (S5)
    with pytest.raises(StoreFullError, match=r"cannot write session 's'.*SQLITE_FULL") as raised:
        store.flush("s")
    assert raised.value.recovered and raised.value.code == "STORE_FULL"
    with pytest.raises(StoreFullError, match=r"cannot create session 't'.*full"):
        store.create("t", cwd="y" * 100_000)
    with SqliteStore(path, create=False) as reader:       # what was flushed is all there
        assert list(reader.inspect("s").events) == EVENTS
        assert reader.list_sessions() == ["s"]
    tmpfs.free()
    store.flush("s")                                      # the append stayed pending: it lands
    store.create("t")
    store.close()
    with SqliteStore(path) as again:
        assert list(again.load("s").events) == [*EVENTS, late]
        assert again.list_sessions() == ["s", "t"]


def test_S32_sqlite_opening_on_a_full_tmpfs_is_a_full_error(tmpfs: _Medium) -> None:
    path = tmpfs.root / "sessions.db"
    with SqliteStore(path) as store:
        store_events(store, "s", EVENTS)
    tmpfs.fill()
    for create in (True, False):                          # its -shm index cannot be made
        with pytest.raises(StoreFullError, match=r"cannot open .*No space left on device") \
                as raised:
            SqliteStore(path, create=create)
        assert "SQLITE_IOERR_SHMSIZE" in str(raised.value) and raised.value.code == "STORE_FULL"
    with pytest.raises(StoreFullError, match="SQLITE_FULL"):
        SqliteStore(tmpfs.root / "new.db")
    tmpfs.free()
    with SqliteStore(path) as store:
        assert list(store.load("s").events) == EVENTS
        store.append("s", LogBuilder(EVENTS).user("after", plugin="p"))
        store.flush("s")
    with SqliteStore(path, create=False) as store:
        assert len(store.load("s").events) == len(EVENTS) + 1


def test_S32_sqlite_not_a_database_is_still_named_so(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"this is plain text, not SQLite" * 100)
    with pytest.raises(StoreError, match="not a session database"):
        SqliteStore(path)


def test_S8_header_uid_is_found_in_a_damaged_header() -> None:
    uid = "ab" * 16
    assert header_uid(b'{"crc":1,"kind":"header","session":"s","uid":"' + uid.encode()
                      + b'","version":2') == uid
    assert header_uid(b"garbage") is None
    raw = b'{"a":1}'
    assert record_crc(raw, None) == zlib.crc32(raw)
    assert record_crc(raw, uid) == zlib.crc32(uid.encode() + raw)
    assert encode_record(EVENTS[0], uid) != encode_record(EVENTS[0])
    assert SessionInfo("s", uid=uid) == SessionInfo("s")   # identity is no part of equality
