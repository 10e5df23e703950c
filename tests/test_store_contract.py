"""The SessionStore contract (specs/persistence.md S1–S7, S14–S17), run against every backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from machine.errors import InvariantError, ValidationError
from machine.events import Event
from machine.jsonvalue import FrozenDict
from machine.log import validate_events
from machine.store import (
    JsonlStore,
    LiveTurnOpenError,
    SessionExistsError,
    SessionInfo,
    SessionNotFoundError,
    SessionNotOpenError,
    SessionStore,
    SqliteStore,
    StoreClosedError,
)
from machine.store.base import BaseStore
from machine.store.repair import scan
from machine.store.testing import LogBuilder, sample_session, store_events

Factory = Callable[[], BaseStore[object]]


@pytest.fixture(params=["jsonl", "sqlite", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """A factory of store instances over the same storage (a new instance = a new process)."""
    opened: list[BaseStore[object]] = []
    postgres = (request.getfixturevalue("postgres_store") if request.param == "postgres"
                else None)

    def make() -> BaseStore[object]:
        store: BaseStore[object]
        if request.param == "jsonl":
            store = JsonlStore(tmp_path / "sessions")  # type: ignore[assignment]
        elif request.param == "sqlite":
            store = SqliteStore(tmp_path / "sessions.db")  # type: ignore[assignment]
        else:
            store = postgres(fsync=True)  # type: ignore[misc]
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store: Factory) -> BaseStore[object]:
    return make_store()


def balanced() -> list[Event]:
    return sample_session(open_tail=False)


def test_S1_every_backend_implements_the_protocol(store: BaseStore[object]) -> None:
    assert isinstance(store, SessionStore)


def test_S3_create_is_durable_and_opens_the_session(make_store: Factory) -> None:
    store = make_store()
    info = store.create("s1", cwd="/work")
    assert info == SessionInfo("s1", cwd="/work")
    assert store.is_open("s1")
    assert store.list_sessions() == ["s1"]
    other = make_store()  # another process sees it at once, without a flush
    assert other.info("s1") == info
    seen = other.inspect("s1")
    assert list(seen.events) == [] and seen.report.clean and seen.info == info
    store.close()  # one writer at a time (S26 makes PostgreSQL refuse a second one)
    result = other.load("s1")
    assert list(result.events) == [] and result.report.clean and result.info == info


def test_S3_create_refuses_an_id_in_use(make_store: Factory) -> None:
    store = make_store()
    store.create("s1")
    with pytest.raises(SessionExistsError):
        store.create("s1")
    with pytest.raises(SessionExistsError):
        make_store().create("s1")


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b", "a b", "x" * 201, 7, None, "-x"])
def test_S2_session_ids_are_checked(store: BaseStore[object], bad: object) -> None:
    with pytest.raises(ValidationError):
        store.create(bad)  # type: ignore[arg-type]


def test_S5_appended_events_round_trip_exactly(make_store: Factory) -> None:
    store = make_store()
    events = balanced()
    store_events(store, "s1", events)
    store.close()
    result = make_store().load("s1")
    assert list(result.events) == events
    assert [e.to_json() for e in result.events] == [e.to_json() for e in events]
    assert result.report.clean


def test_S5_append_needs_an_open_session(make_store: Factory) -> None:
    """S4: `append` needs a session open in this store (created or loaded here, until
    `release`); one stored but not open here is refused with SessionNotOpenError."""
    store = make_store()
    events = balanced()
    with pytest.raises(SessionNotOpenError):
        store.append("nope", events[0])
    store_events(store, "s1", events[:9])  # ends with turn/end 1
    store.close()
    other = make_store()
    with pytest.raises(SessionNotOpenError):  # stored, but not open in this instance
        other.append("s1", events[9])
    other.load("s1")
    other.append("s1", events[9])
    other.release("s1")
    assert list(make_store().load("s1").events) == events[:10]


def test_S5_append_checks_seq_and_invariants_before_writing(make_store: Factory) -> None:
    store = make_store()
    events = balanced()
    store_events(store, "s1", events[:3])
    with pytest.raises(InvariantError, match=r"\[L1\].*expected seq 3, got 4"):
        store.append("s1", events[4])
    bad = Event("step/start", 3, 0, FrozenDict({"turn": 9, "step": 1}))
    with pytest.raises(InvariantError, match="L5"):
        store.append("s1", bad)
    with pytest.raises(ValidationError):
        store.append("s1", events[3].to_json())  # type: ignore[arg-type]
    store.append("s1", events[3])  # the refused appends left nothing behind
    store.close()
    assert list(make_store().inspect("s1").events) == events[:4]


def test_S6_flush_makes_appends_visible_to_other_instances(make_store: Factory) -> None:
    store = make_store()
    events = balanced()
    store_events(store, "s1", events[:5])
    reader = make_store()
    assert len(reader.inspect("s1").events) == 5


def test_S7_release_and_close(make_store: Factory) -> None:
    store = make_store()
    store_events(store, "s1", balanced()[:2], flush=False)
    store.release("s1")  # flushes
    assert not store.is_open("s1")
    store.release("s1")  # a no-op now
    assert len(make_store().inspect("s1").events) == 2
    store.create("s2")
    store.append("s2", balanced()[0])
    store.close()  # flushes s2
    store.close()  # idempotent
    with pytest.raises(StoreClosedError):
        store.load("s1")
    assert len(make_store().inspect("s2").events) == 1


def test_list_sessions_and_missing_sessions(make_store: Factory) -> None:
    store = make_store()
    for name in ("b", "a", "c"):
        store.create(name)
    assert store.list_sessions() == ["a", "b", "c"]
    with pytest.raises(SessionNotFoundError):
        store.load("zz")
    with pytest.raises(SessionNotFoundError):
        store.info("zz")
    with pytest.raises(SessionNotFoundError):
        store.inspect("zz")
    with pytest.raises(ValidationError):
        store.load("a", "lenient")  # type: ignore[arg-type]


def test_S12_load_repairs_durably_and_opens_for_append(make_store: Factory) -> None:
    store = make_store()
    events = sample_session()
    store_events(store, "s1", events)
    store.close()
    loader = make_store()
    result = loader.load("s1")
    assert list(result.events[:len(events)]) == events
    assert result.report.closers_appended == 4  # two results, step/end, turn/end
    assert validate_events(result.events) is None
    assert scan(result.events).open_turn is None
    # durable before load returned: another instance sees the repaired log, clean
    again = make_store().inspect("s1")
    assert list(again.events) == list(result.events) and again.report.clean
    # and the loader may append at once
    builder = LogBuilder(result.events)
    loader.append("s1", builder.user("after", plugin="p"))
    loader.flush("s1")
    assert len(make_store().inspect("s1").events) == len(result.events) + 1
    loader.release("s1")
    reloaded = make_store().load("s1")
    assert len(reloaded.events) == len(result.events) + 1 and reloaded.report.clean


def test_S12_between_turn_tail_is_never_repaired(make_store: Factory) -> None:
    store = make_store()
    events = balanced()  # ends with two between-turn user messages
    assert events[-1].type == events[-2].type == "user/message"
    store_events(store, "s1", events)
    store.close()
    result = make_store().load("s1")
    assert list(result.events) == events and result.report.clean


def test_S14_G7_a_live_open_turn_cannot_be_loaded(store: BaseStore[object]) -> None:
    events = sample_session()
    store_events(store, "s1", events)  # live here, turn 3 open
    with pytest.raises(LiveTurnOpenError, match="live turn is open"):
        store.load("s1")
    builder = LogBuilder(events)
    closing = [builder.call(3, 1, "c3"), builder.result(3, 1, "c2"),
               builder.result(3, 1, "c3"), builder.step_end(3, 1), builder.end(3)]
    for event in closing:
        store.append("s1", event)
    result = store.load("s1")  # flushes, never repairs
    assert result.report.live and result.report.closers_appended == 0
    assert list(result.events) == events + closing
    assert result.events[-1].data["reason"] == {"kind": "completed"}


def test_S15_inspect_writes_nothing(make_store: Factory) -> None:
    store = make_store()
    events = sample_session()
    store_events(store, "s1", events)
    store.close()
    reader = make_store()
    seen = reader.inspect("s1")
    assert list(seen.events) == events and len(seen.closers) == 4
    assert seen.report.closers_appended == 4 and not reader.is_open("s1")
    assert len(make_store().inspect("s1").events) == len(events)  # still unrepaired


def test_S16_info_records_fork_parentage(make_store: Factory) -> None:
    store = make_store()
    store.create("p", cwd="/repo")
    store_events(store, "p", balanced(), create=False)
    child = store.fork("p", 8, "kid")
    assert child == "kid"
    expected = SessionInfo("kid", parent="p", seed_length=9, cwd="/repo")
    assert store.info("kid") == expected
    store.close()
    assert make_store().info("kid") == expected
