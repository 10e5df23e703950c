"""Crash tests (specs/persistence.md S9–S13; §22, D8).

For the recorded multi-turn session with between-turn injections and an open
tail (`machine.store.testing.sample_session`):

* JSONL: truncate the file at every byte offset, and flip random bytes;
* every backend: kill a writer process at random points (for PostgreSQL, the dead
  writer's session lock is released with its connection, S26).

Each time, load never raises anything but the expected `DamageError`, never
loses an event that was durable before the damage point, never alters one,
and the repaired log passes every invariant, has no open turn, and continues with requests
both providers accept (specs/providers.md W9).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from machine.log import SessionLog, validate_events
from machine.providers.check import RequestCheck
from machine.store import DamageError, JsonlStore, LoadResult, SqliteStore
from machine.store.repair import closers, scan
from machine.store.testing import sample_session, store_events

EVENTS = sample_session()
REPO = Path(__file__).resolve().parent.parent


def recorded_file() -> bytes:
    with tempfile.TemporaryDirectory() as root:
        with JsonlStore(root, fsync=False) as store:
            store_events(store, "s", EVENTS)
        return (Path(root) / "s.jsonl").read_bytes()


DATA = recorded_file()
HEADER_END = DATA.index(b"\n") + 1
#: RECORD_ENDS[i]: the byte offset just after record i's newline
RECORD_ENDS = [i + 1 for i, byte in enumerate(DATA) if byte == 0x0A][1:]
CLOSERS = {m: closers(EVENTS[:m]) for m in range(len(EVENTS) + 1)}


def durable_before(offset: int) -> int:
    """How many records end (newline included) at or before *offset*."""
    return sum(1 for end in RECORD_ENDS if end <= offset)


def _repaired_is_valid(kept: int) -> bool:
    """EVENTS[:kept] + its closers passes every invariant, has no open turn, and continues
    with requests both providers accept (W9; memoised)."""
    if kept not in _VALID:
        full = EVENTS[:kept] + list(CLOSERS[kept])
        _VALID[kept] = validate_events(full) is None and scan(full).open_turn is None
        RequestCheck().log(SessionLog(full), f"repaired after {kept} records")
    return _VALID[kept]


_VALID: dict[int, bool] = {}


def check_repaired(result: LoadResult, durable: int) -> int:
    """The loaded log keeps every durable event unaltered and is balanced; returns its kept size."""
    events = list(result.events)
    kept = len(events) - result.report.closers_appended
    assert kept >= durable, f"lost durable events: kept {kept} of {durable}"
    assert events[:kept] == EVENTS[:kept], "a stored event was altered"
    assert tuple(events[kept:]) == CLOSERS[kept]
    assert _repaired_is_valid(kept)  # so the loaded log passes every invariant
    return kept


def write(path: Path, data: bytes) -> None:
    path.unlink(missing_ok=True)  # a fresh file: cheaper than truncating in place
    path.write_bytes(data)


def test_truncation_at_every_byte_offset(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    for offset in range(len(DATA) + 1):
        write(path, DATA[:offset])
        store = JsonlStore(tmp_path, fsync=False)
        try:
            if offset < HEADER_END:  # not even the header survived: reported, never guessed
                with pytest.raises(DamageError) as raised:
                    store.load("s")
                assert raised.value.kind == "header"
                continue
            result = store.load("s")
            durable = durable_before(offset)
            assert check_repaired(result, durable) == durable  # only a torn record is cut
            last_end = RECORD_ENDS[durable - 1] if durable else HEADER_END
            assert result.report.truncated_bytes == offset - last_end
            assert not result.report.damage
        finally:
            store.close()
        if offset % 61 == 0:  # the repair is durable: a second load is clean
            with JsonlStore(tmp_path, fsync=False) as again:
                second = again.load("s")
            assert list(second.events) == list(result.events) and second.report.clean


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(DATA) - 1), st.integers(1, 255)),
                min_size=1, max_size=3))
def test_random_byte_flips(flips: list[tuple[int, int]]) -> None:
    damaged = bytearray(DATA)
    for position, mask in flips:
        damaged[position] ^= mask
    durable = durable_before(min(position for position, _ in flips))
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "s.jsonl"
        for mode in ("strict", "salvage"):
            write(path, bytes(damaged))
            with JsonlStore(root, fsync=False) as store:
                try:
                    result = store.load("s", mode)
                except DamageError as error:
                    assert mode == "strict" and error.damage
                    continue
            kept = check_repaired(result, durable)
            if mode == "strict":  # a strict load accepts only undamaged data
                assert bytes(damaged) == DATA or kept == len(EVENTS)
                assert not result.report.damage


WRITER = """
import sys
from machine.store import JsonlStore, PostgresStore, SqliteStore
from machine.store.testing import sample_session

kind, where = sys.argv[1], sys.argv[2]
if kind == "postgres":
    store = PostgresStore(where, schema=sys.argv[3])
else:
    store = JsonlStore(where) if kind == "jsonl" else SqliteStore(where)
events = sample_session()
for number in range(40):
    session = f"s{number}"
    store.create(session)
    print(session, 0, flush=True)
    for event in events:
        store.append(session, event)
        if event.type == "turn/end" or event.seq % 4 == 3:
            store.flush(session)
            print(session, event.seq + 1, flush=True)
    store.release(session)
    print(session, len(events), flush=True)
"""


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
def test_killing_a_writer_at_random_points(tmp_path: Path, backend: str, seed: int,
                                           request: pytest.FixtureRequest) -> None:
    rng = random.Random(f"{backend}-{seed}")
    where = str(tmp_path / ("sessions" if backend == "jsonl" else "sessions.db"))
    extra: list[str] = []
    if backend == "postgres":
        where = request.getfixturevalue("postgres").conninfo
        extra = [request.getfixturevalue("pg_schema")]
        make_postgres = request.getfixturevalue("postgres_store")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writer = subprocess.Popen([sys.executable, "-c", WRITER, backend, where, *extra], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    reported: list[str] = []
    try:
        for _ in range(rng.randint(1, 120)):
            line = writer.stdout.readline()
            if not line:
                break
            reported.append(line)
        writer.kill()  # SIGKILL: no cleanup, no final flush
    finally:
        writer.wait(timeout=30)
    reported += writer.stdout.read().splitlines(keepends=True)
    stderr = writer.stderr.read() if writer.stderr else ""
    assert "Traceback" not in stderr, stderr
    durable: dict[str, int] = {}
    for line in reported:
        session, count = line.split()
        durable[session] = max(durable.get(session, 0), int(count))
    assert durable, "the writer reported nothing"
    if backend == "postgres":  # the killed writer's locks went with its connection (S26)
        store = make_postgres(lock_wait=30)
    else:
        store = JsonlStore(where) if backend == "jsonl" else SqliteStore(where)
    with store:
        sessions = store.list_sessions()
        assert set(durable) <= set(sessions)
        for session in sessions:
            check_repaired(store.load(session), durable.get(session, 0))
