"""Fork (§24, scenario G4; specs/persistence.md S17), on every backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from machine.errors import ValidationError
from machine.events import Event
from machine.store import (
    JsonlStore,
    OpenTurnError,
    SessionExistsError,
    SessionInfo,
    SessionNotOpenError,
    SqliteStore,
)
from machine.store.base import BaseStore
from machine.store.testing import LogBuilder, sample_session, store_events

BALANCED = sample_session(open_tail=False)  # seq 8 = TE(1), 9 = UM between, 15 = TE(2)
OPEN = sample_session()  # ... 18 TS(3), 19 SS(3.1), 20 AM with calls, 21 TC(c2)


@pytest.fixture(params=["jsonl", "sqlite", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    opened: list[BaseStore[Any]] = []
    postgres = request.getfixturevalue("postgres_store") if kind == "postgres" else None

    def factory() -> BaseStore[Any]:
        store: BaseStore[Any]
        if kind == "jsonl":
            store = JsonlStore(tmp_path / "s", fsync=False)
        elif kind == "sqlite":
            store = SqliteStore(tmp_path / "s.db", fsync=False)
        else:
            assert postgres is not None
            store = postgres()
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()


@pytest.fixture
def store(make: Any) -> BaseStore[Any]:
    store: BaseStore[Any] = make()
    store.create("src", cwd="/repo")
    store_events(store, "src", OPEN, create=False)
    store.create("bal", cwd="/repo")
    store_events(store, "bal", BALANCED, create=False)
    return store


def events_of(store: BaseStore[Any], session: str) -> list[Event]:
    return list(store.inspect(session).events)


def test_G4_default_fork_copies_everything_including_a_between_turn_tail(
        store: BaseStore[Any]) -> None:
    assert BALANCED[-1].type == "user/message"  # the tail after the last turn/end
    child = store.fork("bal")
    assert events_of(store, child) == BALANCED
    assert store.info(child) == SessionInfo(child, "bal", len(BALANCED), "/repo")


def test_G4_the_child_records_parent_seed_length_and_cwd_durably(
        store: BaseStore[Any], make: Any) -> None:
    store.fork("bal", 9, "kid")
    store.close()
    result = make().load("kid")
    assert result.info == SessionInfo("kid", parent="bal", seed_length=10, cwd="/repo")
    assert list(result.events) == BALANCED[:10] and result.report.clean


def test_G4_copies_are_immutable_and_detached(store: BaseStore[Any]) -> None:
    source = store.load("bal").events  # the live source
    store.fork("bal", None, "kid")
    copies = store.load("kid").events
    assert list(copies) == list(source)
    assert all(copy is not original and copy.data is not original.data
               for copy, original in zip(copies, source, strict=True))
    with pytest.raises(TypeError):
        copies[0].data["id"] = "changed"  # type: ignore[index]
    with pytest.raises(AttributeError):
        copies[0].seq = 5  # type: ignore[misc]


@pytest.mark.parametrize(("boundary", "what"), [
    (18, "TS"), (19, "SS"), (20, "AM"), (21, "TC")])
def test_G4_a_boundary_inside_an_open_turn_fails_with_OPEN_TURN(
        store: BaseStore[Any], boundary: int, what: str) -> None:
    assert OPEN[boundary].type == {"TS": "turn/start", "SS": "step/start",
                                   "AM": "assistant/message", "TC": "tool/call"}[what]
    with pytest.raises(OpenTurnError) as raised:
        store.fork("src", boundary, "kid")
    assert raised.value.code == "OPEN_TURN"
    assert "kid" not in store.list_sessions()


def test_G4_a_user_message_inside_a_turn_is_inside_the_turn(store: BaseStore[Any]) -> None:
    assert BALANCED[2].type == "user/message" and BALANCED[1].type == "turn/start"
    with pytest.raises(OpenTurnError):
        store.fork("bal", 2)


def test_G4_the_default_boundary_of_a_source_with_an_open_turn_fails(
        store: BaseStore[Any]) -> None:
    with pytest.raises(OpenTurnError):
        store.fork("src")


def test_G4_an_earlier_turn_end_works_while_the_source_turn_is_open(
        store: BaseStore[Any]) -> None:
    assert OPEN[15].type == "turn/end"
    child = store.fork("src", 15)
    assert events_of(store, child) == OPEN[:16]


def test_G4_a_between_turn_user_message_is_a_valid_boundary(store: BaseStore[Any]) -> None:
    assert OPEN[9].type == "user/message" and OPEN[8].type == "turn/end"
    assert events_of(store, store.fork("src", 9)) == OPEN[:10]
    assert OPEN[0].type == "user/message"  # before the first turn
    assert events_of(store, store.fork("src", 0)) == OPEN[:1]


def test_G4_an_empty_source_forks_an_empty_child(store: BaseStore[Any]) -> None:
    store.create("empty")
    child = store.fork("empty")
    assert events_of(store, child) == [] and store.info(child).seed_length == 0
    with pytest.raises(ValidationError):
        store.fork("empty", 0)


def test_the_child_id_is_checked_first(store: BaseStore[Any]) -> None:
    store.create("taken")
    with pytest.raises(SessionExistsError):  # before the unknown source and bad boundary
        store.fork("not-open", -3, "taken")
    with pytest.raises(SessionExistsError):
        store.fork("src", 15, "src")


@pytest.mark.parametrize("boundary", [-1, len(OPEN), True, 1.0, "3"])
def test_the_boundary_must_name_an_event(store: BaseStore[Any], boundary: Any) -> None:
    with pytest.raises(ValidationError, match="boundary"):
        store.fork("src", boundary)


def test_the_source_must_be_open_in_this_store(store: BaseStore[Any], make: Any) -> None:
    store.close()
    other: BaseStore[Any] = make()
    with pytest.raises(SessionNotOpenError):
        other.fork("bal", 8, "kid")
    other.load("bal")
    assert other.fork("bal", 8, "kid") == "kid"


def test_the_child_is_open_and_continues_the_numbering(store: BaseStore[Any]) -> None:
    child = store.fork("bal", 8)
    assert store.is_open(child)
    builder = LogBuilder(BALANCED[:9])
    event = builder.turn(2)
    store.append(child, event)
    store.flush(child)
    assert events_of(store, child)[-1] == event
    assert events_of(store, "bal") == BALANCED  # the source is untouched


def test_fork_flushes_the_source_first(store: BaseStore[Any], make: Any) -> None:
    builder = LogBuilder(BALANCED)
    extra = builder.user("late", plugin="p")
    store.append("bal", extra)  # not flushed yet
    store.fork("bal", None, "kid")
    reader: BaseStore[Any] = make()
    assert events_of(reader, "bal")[-1] == extra
    assert events_of(reader, "kid")[-1] == extra
