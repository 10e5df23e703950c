"""One writer per JSONL session (specs/persistence.md S33): the advisory lock beside the
session's file, between real processes and between store instances of one process.

Regression of issue 28: two processes writing one JSONL session were both allowed to, and
the next load reported `seq-duplicate` damage.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from machine.errors import ValidationError
from machine.payloads import UserMessageData
from machine.store import (
    DamageError,
    JsonlStore,
    SessionExistsError,
    SessionLockedError,
    StoreWriteError,
)
from machine.store.repair import closers
from machine.store.testing import LogBuilder, sample_session, store_events

REPO = Path(__file__).resolve().parent.parent
OPEN = sample_session(open_tail=True)           # ends inside an open turn
BALANCED = sample_session(open_tail=False)
#: How long a test waits for a child process to answer: generous, so that a busy machine
#: never fails the test (a child that is stuck is a failure all the same).
PATIENCE = 120


def _script(source: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", source, *args], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _answer(process: subprocess.Popen[str]) -> str:
    """The next line the child writes (its stderr when it ends without one)."""
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line:
        process.wait(timeout=PATIENCE)
        raise AssertionError(process.stderr.read() if process.stderr else "no answer")
    return line


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        process.kill()
        process.wait(timeout=PATIENCE)


#: A process holding one session open for writing: it creates it with the events of the
#: sample session up to its open turn (or loads it), says its pid, and releases the session
#: when it reads a line, then says so and waits for the next line to exit.
HOLDER = """
import os, sys
from machine.store import JsonlStore
from machine.store.testing import sample_session, store_events

store = JsonlStore(sys.argv[1], fsync=False)
if sys.argv[2] == "create":
    store_events(store, "held", sample_session(open_tail=True))
else:
    store.load("held")
print(os.getpid(), flush=True)
sys.stdin.readline()
store.release("held")
print("released", flush=True)
sys.stdin.readline()
"""


def test_S33_a_session_held_by_another_process_is_refused_naming_the_holder(
        tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    """S3, S12, S14: the second process neither repairs nor writes anything; it reads what
    reached the file; once the holder releases the session, it loads and repairs it."""
    root = tmp_path / "sessions"
    holder = _script(HOLDER, str(root), "create")
    processes.append(holder)
    pid = _answer(holder)
    path = root / "held.jsonl"
    before = path.read_bytes()
    other = JsonlStore(root, fsync=False)
    for mode in ("strict", "salvage"):
        with pytest.raises(SessionLockedError) as raised:
            other.load("held", mode)
        error = raised.value
        assert error.code == "SESSION_LOCKED"
        assert f"session 'held' is open for writing in another store (pid {pid} on host " in \
            str(error)
        assert "program '-c " in str(error) and f"lock file {path}.lock" in str(error)
        assert str(error).endswith("one writer per session (S33)")
    with pytest.raises(SessionExistsError):
        other.create("held")
    assert not other.is_open("held")
    inspection = other.inspect("held")                  # reading needs no lock
    assert list(inspection.events) == OPEN and inspection.closers
    assert other.list_sessions() == ["held"]
    assert path.read_bytes() == before                  # no repair was written
    assert holder.stdin is not None
    holder.stdin.write("release\n")
    holder.stdin.flush()
    assert _answer(holder) == "released"
    result = other.load("held")
    assert list(result.events) == OPEN + list(closers(OPEN))
    assert result.report.closers_appended == len(closers(OPEN))
    other.close()


def test_S33_a_killed_holder_holds_nothing(tmp_path: Path,
                                           processes: list[subprocess.Popen[str]]) -> None:
    """The lock goes with its holder: a process killed without any cleanup leaves a lock
    file that locks nothing, and the next load repairs the open turn it left."""
    root = tmp_path / "sessions"
    holder = _script(HOLDER, str(root), "create")
    processes.append(holder)
    _answer(holder)
    with pytest.raises(SessionLockedError):
        JsonlStore(root, fsync=False).load("held")
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=PATIENCE)
    assert (root / "held.jsonl.lock").exists()
    with JsonlStore(root, fsync=False) as store:
        result = store.load("held")
        assert list(result.events) == OPEN + list(closers(OPEN))


#: A process that waits for "go", then tries to load the session and append ten events
#: to it: it says "wrote" or "locked".
RACER = """
import sys
from machine.store import JsonlStore, SessionLockedError
from machine.store.testing import LogBuilder

store = JsonlStore(sys.argv[1], fsync=False)
sys.stdin.readline()
try:
    loaded = store.load("raced")
except SessionLockedError:
    print("locked", flush=True)
    sys.exit(0)
builder = LogBuilder(loaded.events)
for number in range(10):
    store.append("raced", builder.user(f"{sys.argv[2]}-{number}", plugin="p"))
store.flush("raced")
print("wrote", flush=True)
sys.stdin.readline()
store.close()
"""


def test_S33_two_processes_racing_to_write_one_session_never_interleave(
        tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    """The case of the issue: a user starts the same agent twice. Of two processes that
    load one session at the same moment, one writes and the other is refused; the session
    then loads with no damage and holds the one writer's events."""
    root = tmp_path / "sessions"
    with JsonlStore(root, fsync=False) as store:
        store_events(store, "raced", BALANCED)
    for rounds in range(5):
        racers = [_script(RACER, str(root), name) for name in ("a", "b")]
        processes.extend(racers)
        for racer in racers:
            assert racer.stdin is not None
            racer.stdin.write("go\n")
            racer.stdin.flush()
        answers = sorted(_answer(racer) for racer in racers)
        assert answers == ["locked", "wrote"], answers
        for racer in racers:
            assert racer.stdin is not None
            racer.stdin.close()
            assert racer.wait(timeout=PATIENCE) == 0
        with JsonlStore(root, fsync=False) as store:
            events = list(store.load("raced").events)      # strict: no damage
        assert len(events) == len(BALANCED) + 10 * (rounds + 1)
        writers = {event.data_as(UserMessageData).message.text[0] for event in events[-10:]}
        assert len(writers) == 1                           # one process's ten events


def test_S33_two_stores_of_one_process_and_release_close_and_fork(tmp_path: Path) -> None:
    """Two store instances are two writers too; `release` and `close` give the lock back,
    and a fork's child is held by the store that forked it."""
    root = tmp_path / "sessions"
    first, second = JsonlStore(root, fsync=False), JsonlStore(root, fsync=False)
    store_events(first, "s1", BALANCED)
    with pytest.raises(SessionLockedError, match=f"pid {os.getpid()} on host"):
        second.load("s1")
    child = first.fork("s1", 8, "child")
    with pytest.raises(SessionLockedError):
        second.load(child)
    first.release("s1")
    assert list(second.load("s1").events) == BALANCED
    with pytest.raises(SessionLockedError):
        first.load("s1")
    first.close()
    assert list(second.load(child).events) == BALANCED[:9]
    second.close()
    with JsonlStore(root, fsync=False) as third:
        third.load("s1")
        assert third.list_sessions() == ["child", "s1"]    # lock files are not sessions


def test_S33_a_failed_load_gives_the_lock_back(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    with JsonlStore(root, fsync=False) as store:
        store_events(store, "s1", BALANCED)
    path = root / "s1.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[4] = b"garbage\n"
    path.write_bytes(b"".join(lines))
    first = JsonlStore(root, fsync=False)
    with pytest.raises(DamageError):
        first.load("s1")                                   # strict
    assert not first.is_open("s1")
    with JsonlStore(root, fsync=False) as second:
        result = second.load("s1", "salvage")              # not held by the first store
        assert [d.record_index for d in result.report.damage] == [3]
        with pytest.raises(SessionLockedError):
            first.load("s1", "salvage")
    first.close()


def test_S33_lock_wait_waits_for_the_holder(tmp_path: Path,
                                            processes: list[subprocess.Popen[str]]) -> None:
    root = tmp_path / "sessions"
    holder = _script(HOLDER, str(root), "create")
    processes.append(holder)
    _answer(holder)
    assert holder.stdin is not None
    holder.stdin.write("release\n")              # released while the load below waits
    holder.stdin.flush()
    with JsonlStore(root, fsync=False, lock_wait=PATIENCE) as store:
        assert list(store.load("held").events) == OPEN + list(closers(OPEN))
    for wrong in (-1, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValidationError, match="lock_wait"):
            JsonlStore(root, lock_wait=wrong)  # type: ignore[arg-type]


def test_S33_S32_without_a_lock_file_the_first_write_takes_the_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no lock file can be made (a directory this process may not write), the load
    goes on without the lock, and the first append takes it first: refused, and nothing
    written, when another store holds the session by then."""
    root = tmp_path / "sessions"
    with JsonlStore(root, fsync=False) as store:
        store_events(store, "s1", BALANCED[:9])
    (root / "s1.jsonl.lock").unlink()
    real_open = os.open

    def no_lock_files(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith(".lock"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_lock_files)
    unlocked = JsonlStore(root, fsync=False)
    assert list(unlocked.load("s1").events) == BALANCED[:9]
    with pytest.raises(StoreWriteError, match=r"cannot create session 'new'.*Permission denied"):
        unlocked.create("new")
    monkeypatch.undo()
    holder = JsonlStore(root, fsync=False)
    holder.load("s1")
    size = (root / "s1.jsonl").stat().st_size
    with pytest.raises(SessionLockedError):
        unlocked.append("s1", BALANCED[9])
    assert (root / "s1.jsonl").stat().st_size == size
    holder.close()
    unlocked.append("s1", BALANCED[9])                     # the lock is free now: taken
    with pytest.raises(SessionLockedError):
        JsonlStore(root, fsync=False).load("s1")
    unlocked.close()
    assert len(JsonlStore(root, fsync=False).inspect("s1").events) == 10


def test_S33_an_existing_lock_file_still_locks_on_storage_this_process_cannot_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "sessions"
    with JsonlStore(root, fsync=False) as store:
        store_events(store, "s1", BALANCED)
    real_open = os.open

    def read_only(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    first = JsonlStore(root, fsync=False)
    first.load("s1")
    with pytest.raises(SessionLockedError, match="open for writing in another store"):
        JsonlStore(root, fsync=False).load("s1")
    first.close()
    JsonlStore(root, fsync=False).load("s1")


def test_S33_the_holder_line_names_the_holder_and_a_nameless_holder_is_said_so(
        tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    holder = JsonlStore(root, fsync=False)
    store_events(holder, "s1", BALANCED[:1])
    lock_file = root / "s1.jsonl.lock"
    line = lock_file.read_text(encoding="utf-8")
    assert line.endswith("\n") and f'"pid": {os.getpid()}' in line
    lock_file.write_text("")            # the moment before a new holder writes its line
    with pytest.raises(SessionLockedError, match="a holder that has not named itself yet"):
        JsonlStore(root, fsync=False).load("s1")
    holder.close()
    assert lock_file.read_bytes() == b""  # released: the line names no one any more
    builder = LogBuilder(BALANCED[:1])
    with JsonlStore(root, fsync=False) as store:
        store.load("s1")
        store.append("s1", builder.user("more", plugin="p"))


def test_S33_S22_log_repair_of_a_held_session_is_refused_and_log_show_reads_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`turnstile log repair` opens the session for writing: refused with the lock's
    message (exit 1), nothing written; `log show` only reads and needs no lock."""
    from machine.cli.main import main
    root = tmp_path / "sessions"
    holder = JsonlStore(root, fsync=False)
    store_events(holder, "s1", OPEN)
    path = root / "s1.jsonl"
    before = path.read_bytes()
    assert main(["log", "repair", str(path)]) == 1
    out = capsys.readouterr().out
    assert "session 's1' is open for writing in another store" in out
    assert out.rstrip().endswith("[SESSION_LOCKED]")
    assert path.read_bytes() == before
    assert main(["log", "show", str(path)]) == 0
    assert "a load would append" in capsys.readouterr().out
    holder.close()
    assert main(["log", "repair", str(path)]) == 0
    assert path.read_bytes() != before


def test_S33_S11_a_failed_load_leaves_the_lock_file_as_it_found_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A strict load of a damaged session changes nothing stored, the lock file included:
    the holder's line is emptied when the lock is given back (a regression: it was left
    with the failed load's time, so a load a second later differed)."""
    import itertools

    from machine.store import filelock
    taken = itertools.count()
    monkeypatch.setattr(filelock, "holder_line", lambda: f"holder {next(taken)}\n".encode())
    root = tmp_path / "sessions"
    with JsonlStore(root, fsync=False) as store:
        store_events(store, "s1", BALANCED)
    path = root / "s1.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[4] = b"garbage\n"
    path.write_bytes(b"".join(lines))
    before = sorted((p.name, p.read_bytes()) for p in root.iterdir())
    for _ in range(2):
        with JsonlStore(root, fsync=False) as store, pytest.raises(DamageError):
            store.load("s1")
        assert sorted((p.name, p.read_bytes()) for p in root.iterdir()) == before
    assert next(taken) == 3                 # each load took the lock and named itself
