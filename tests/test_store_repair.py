"""Crash repair (§22.1–§22.4, specs/persistence.md S12): every closer case."""

from __future__ import annotations

from pathlib import Path

import pytest
from scenario_helpers import at, obj

from machine.events import Event
from machine.jsonvalue import thaw
from machine.log import SessionLog, derive_history, validate_events
from machine.store import JsonlStore, SqliteStore
from machine.store.base import BaseStore
from machine.store.repair import (
    NOT_STARTED_TEXT,
    OUTCOME_UNKNOWN_TEXT,
    closers,
    scan,
)
from machine.store.testing import LogBuilder, sample_session, store_events


def kinds(events: tuple[Event, ...] | list[Event]) -> list[str]:
    return [e.type for e in events]


def check_balanced(events: list[Event], added: tuple[Event, ...]) -> None:
    full = events + list(added)
    assert validate_events(full) is None
    assert scan(full).open_turn is None
    assert [e.seq for e in added] == list(range(len(events), len(full)))
    assert all(e.time == events[-1].time for e in added)  # the last real event's time


def open_step_with_calls(*, recorded: tuple[str, ...]) -> tuple[LogBuilder, Event]:
    b = LogBuilder()
    b.turn(1)
    b.user("go")
    b.step(1, 1)
    assistant = b.assistant(1, 1, "calling", calls=["c1", "c2"])
    for call_id in recorded:
        b.call(1, 1, call_id)
    return b, assistant


def test_recorded_call_gets_outcome_unknown_with_provenance() -> None:
    b, _ = open_step_with_calls(recorded=("c1",))
    call_seq = len(b.log) - 1
    b.call(1, 1, "c2")
    b.result(1, 1, "c2", len(b.log) - 1)  # c2 answered: not pending
    events = b.events
    added = closers(events)
    assert kinds(added) == ["tool/result", "step/end", "turn/end"]
    result = added[0]
    seq = len(events)
    assert result.surface_op == "append"
    assert result.source_event_seqs == [call_seq]
    assert thaw(result.data) == {
        "turn": 1, "step": 1,
        "error": {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"},
        "message": {"id": f"interrupted-tool-result-c1-{seq}", "role": "user",
                    "source": {"kind": "tool", "callId": "c1"},
                    "content": [{"type": "tool-result", "toolCallId": "c1", "isError": True,
                                 "content": [{"type": "text", "text": OUTCOME_UNKNOWN_TEXT}]}]}}
    assert thaw(added[1].data) == {"turn": 1, "step": 1}
    assert thaw(added[2].data) == {"turn": 1, "reason": {"kind": "interrupted"}}
    check_balanced(events, added)


def test_unrecorded_call_gets_not_started_without_provenance() -> None:
    b, _ = open_step_with_calls(recorded=())
    events = b.events
    added = closers(events)
    assert kinds(added) == ["tool/result", "tool/result", "step/end", "turn/end"]
    for position, call_id in enumerate(("c1", "c2")):
        result = added[position]
        assert result.source_event_seqs is None
        assert thaw(result.data["error"]) == {"name": "ToolNotStartedError",
                                              "code": "TOOL_NOT_STARTED"}
        message = obj(result.data["message"])
        assert message["id"] == f"interrupted-tool-result-{call_id}-{result.seq}"
        assert thaw(message["content"])[0]["content"] == [{"type": "text",
                                                           "text": NOT_STARTED_TEXT}]
    check_balanced(events, added)


def test_results_follow_assistant_content_order_not_call_order() -> None:
    b, _ = open_step_with_calls(recorded=("c2",))  # c2 started first, c1 never
    events = b.events
    added = closers(events)
    assert [at(e.data, "message", "source", "callId") for e in added[:2]] == ["c1", "c2"]
    assert at(added[0].data, "error", "code") == "TOOL_NOT_STARTED"
    assert at(added[1].data, "error", "code") == "TOOL_OUTCOME_UNKNOWN"
    check_balanced(events, added)


def test_open_step_without_calls_gets_step_end_and_turn_end() -> None:
    b = LogBuilder()
    b.turn(1)
    b.step(1, 1)
    b.chunk(1, 1)
    events = b.events
    added = closers(events)
    assert kinds(added) == ["step/end", "turn/end"]
    check_balanced(events, added)


def test_open_turn_without_step_gets_only_turn_end() -> None:
    b = LogBuilder()
    b.turn(1)
    b.user("go")
    b.step(1, 1)
    b.step_end(1, 1)
    b.user("mid-turn context", plugin="p")
    events = b.events
    added = closers(events)
    assert kinds(added) == ["turn/end"]
    assert thaw(added[0].data) == {"turn": 1, "reason": {"kind": "interrupted"}}
    check_balanced(events, added)


def test_turn_start_alone_is_closed() -> None:
    b = LogBuilder()
    b.turn(1)
    assert kinds(closers(b.events)) == ["turn/end"]


@pytest.mark.parametrize("events", [
    [],
    sample_session(open_tail=False),  # ends with between-turn user messages
    sample_session(open_tail=False)[:9],  # ends with turn/end
    LogBuilder().events,
], ids=["empty", "between-turn-tail", "turn-end", "fresh"])
def test_no_open_turn_no_repair(events: list[Event]) -> None:
    assert closers(events) == ()
    assert not scan(events).needs_repair


def test_unanswered_call_of_an_ended_step_gets_no_result() -> None:
    b, _ = open_step_with_calls(recorded=("c1",))
    b.step_end(1, 1)  # a step may end with unresolved calls; step/end forgets them
    b.step(1, 2)
    events = b.events
    assert kinds(closers(events)) == ["step/end", "turn/end"]


def test_calls_of_earlier_closed_turns_are_ignored() -> None:
    b, _ = open_step_with_calls(recorded=())
    b.step_end(1, 1)
    b.end(1, "aborted")
    b.user("between", plugin="p")
    b.turn(2)
    events = b.events
    assert kinds(closers(events)) == ["turn/end"]
    assert closers(events)[0].data["turn"] == 2


def test_repair_never_rewrites_real_events_and_history_extends() -> None:
    events = sample_session()
    added = closers(events)
    full = events + list(added)
    assert full[:len(events)] == events
    before, after = derive_history(events), derive_history(full)
    assert after[:len(before)] == before
    assert [m.id for m in after[len(before):]] == [
        f"interrupted-tool-result-c2-{len(events)}", f"interrupted-tool-result-c3-{len(events) + 1}"]


def test_the_sample_tail_gets_the_documented_closers() -> None:
    events = sample_session()
    added = closers(events)
    assert kinds(added) == ["tool/result", "tool/result", "step/end", "turn/end"]
    assert [at(e.data, "error", "code") for e in added[:2]] == ["TOOL_OUTCOME_UNKNOWN",
                                                            "TOOL_NOT_STARTED"]
    check_balanced(events, added)
    SessionLog(events + list(added))  # a valid seed


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
def test_load_appends_the_same_closers_durably(tmp_path: Path, backend: str,
                                               request: pytest.FixtureRequest) -> None:
    postgres = request.getfixturevalue("postgres_store") if backend == "postgres" else None

    def make() -> BaseStore[object]:
        if backend == "postgres":
            return postgres()  # type: ignore[misc,no-any-return]
        return (JsonlStore(tmp_path) if backend == "jsonl"  # type: ignore[return-value]
                else SqliteStore(tmp_path / "s.db"))

    events = sample_session()
    with make() as store:
        store_events(store, "s", events)
    with make() as store:
        result = store.load("s")
    assert list(result.events) == events + list(closers(events))
    assert result.report.closers_appended == 4 and not result.report.damage
    with make() as store:
        again = store.load("s")
    assert list(again.events) == list(result.events) and again.report.clean
