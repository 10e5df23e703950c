"""Resume and live sessions with a real agent (§22.6, §23; scenarios G6, G7; S14, S16, S18)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from scenario_helpers import at

from machine import events as ev
from machine.checking.scripted import HOLD, Driver, ScriptedEnvironment, calls_reply, text_reply
from machine.core import AgentCore, CoreConfig
from machine.events import Event
from machine.io import FLUSH, MODEL, TOOL_EXECUTE
from machine.jsonvalue import JsonLike
from machine.log import validate_events
from machine.store import (
    JsonlStore,
    LiveTurnOpenError,
    SqliteStore,
    StoreSink,
    resume_core,
)
from machine.store.base import BaseStore
from machine.store.testing import LogBuilder, store_events
from machine.vocabulary import user_message

CONFIG = CoreConfig(request_options={"provider": "test", "model": "m1"})


@pytest.fixture(params=["jsonl", "sqlite", "postgres"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    opened: list[BaseStore[Any]] = []
    postgres = (request.getfixturevalue("postgres_store") if request.param == "postgres"
                else None)

    def factory() -> BaseStore[Any]:
        store: BaseStore[Any]
        if request.param == "jsonl":
            store = JsonlStore(tmp_path / "s")
        elif request.param == "sqlite":
            store = SqliteStore(tmp_path / "s.db")
        else:
            assert postgres is not None
            store = postgres(fsync=True)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()


def persisted(store: BaseStore[Any], session: str, core: AgentCore,
              replies: Sequence[Sequence[JsonLike]] = ()) -> Driver:
    """A scripted driver whose durable outputs go to *store* and whose flushes flush it."""
    sink = StoreSink(store, session)
    env = ScriptedEnvironment(replies=[list(r) for r in replies])
    env.handlers[FLUSH] = sink.answer_flush
    driver = Driver(core, env)
    driver.on(sink)
    return driver


def turn_starts(events: Sequence[Event]) -> list[Any]:
    return [e.data["turn"] for e in events if e.type == ev.TURN_START]


def header_reasons(events: Sequence[Event]) -> list[Any]:
    return [e.data["reason"] for e in events if e.type == ev.REQUEST_HEADER]


def test_G6_resume_continues_numbering_and_re_anchors_the_header(make: Any) -> None:
    store = make()
    store.create("s")
    first = persisted(store, "s", AgentCore(CONFIG), [text_reply("one")])
    first.core.followup(user_message("p1", "first"))
    first.run()
    store.close()  # persist; lifecycle 1 is over

    store2 = make()
    core = resume_core(store2, "s", CONFIG)
    second = persisted(store2, "s", core, [text_reply("two")])
    core.followup(user_message("p2", "second"))
    second.run()
    store2.close()

    events = make().load("s").events
    assert [e.seq for e in events] == list(range(len(events)))
    assert turn_starts(events) == [1, 2]
    assert header_reasons(events) == ["initial", "resume"]
    types = [e.type for e in events if e.type != ev.ASSISTANT_CHUNK]
    one_turn = [ev.TURN_START, ev.USER_MESSAGE, ev.STEP_START, ev.REQUEST_HEADER,
                ev.ASSISTANT_MESSAGE, ev.STEP_END, ev.TURN_END]
    assert types == one_turn + one_turn
    assert validate_events(events) is None
    request_1 = first.effects(MODEL)[0].history
    request_2 = second.effects(MODEL)[0].history
    assert request_1 is not None and request_2 is not None
    assert list(request_2[:len(request_1)]) == list(request_1)
    assert [m.text for m in request_2] == ["first", "one", "second"]
    # §23.1-23.2: publication order and the session-start source of the resumed instance
    assert [live.event.type for live in second.live()][:3] == [
        ev.SESSION_CREATED, ev.AGENT_CREATED, ev.SESSION_START]
    assert second.live(ev.SESSION_START)[0].event.payload["source"] == "resume"


def test_resume_after_an_interrupted_turn(tmp_path: Path) -> None:
    """A crash mid-tool: the load closes the turn, the resumed agent continues at turn 3."""
    store = JsonlStore(tmp_path)
    store.create("s")
    driver = persisted(store, "s", AgentCore(CONFIG),
                       [text_reply("one"), calls_reply(("c1", "ls"))])
    driver.env.handlers[TOOL_EXECUTE] = lambda effect: HOLD
    driver.core.followup(user_message("p1", "first"))
    driver.run()
    driver.core.followup(user_message("p2", "list"))
    driver.run()  # now waiting on the held tool: turn 2 is open
    assert driver.core.log.open_turn == 2
    store.close()  # the process dies here (every append already reached the file)

    store2 = JsonlStore(tmp_path)
    core = resume_core(store2, "s", CONFIG)
    seeded = list(core.log.events)
    assert [e.type for e in seeded[-3:]] == [ev.TOOL_RESULT, ev.STEP_END, ev.TURN_END]
    assert at(seeded[-3].data, "error", "code") == "TOOL_OUTCOME_UNKNOWN"
    assert seeded[-1].data["reason"] == {"kind": "interrupted"}
    second = persisted(store2, "s", core, [text_reply("three")])
    core.followup(user_message("p3", "again"))
    second.run()
    store2.close()
    events = JsonlStore(tmp_path).load("s").events
    assert turn_starts(events) == [1, 2, 3]
    assert header_reasons(events) == ["initial", "resume"]
    history = second.effects(MODEL)[0].history
    assert history is not None
    assert history[-2].id == f"interrupted-tool-result-c1-{len(seeded) - 3}"


def test_resume_without_a_header_logs_initial(make: Any) -> None:
    store = make()
    builder = LogBuilder()
    store_events(store, "s", [builder.user("context before anything", plugin="p")])
    store.close()
    store2 = make()
    core = resume_core(store2, "s", CONFIG)
    driver = persisted(store2, "s", core)
    core.followup(user_message("p1", "hi"))
    driver.run()
    store2.close()
    events = make().load("s").events
    assert header_reasons(events) == ["initial"] and turn_starts(events) == [1]
    assert events[0].data["content"][0]["text"] == "context before anything"


def test_G7_a_live_open_turn_cannot_be_loaded(make: Any) -> None:
    store = make()
    store.create("s")
    driver = persisted(store, "s", AgentCore(CONFIG))
    driver.env.handlers[MODEL] = lambda effect: HOLD  # the model hangs
    driver.core.followup(user_message("p1", "hello"))
    driver.run()
    assert driver.core.log.open_turn == 1
    store.flush("s")
    with pytest.raises(LiveTurnOpenError, match="live turn is open"):
        store.load("s")
    driver.stream(driver.take_held(MODEL), text_reply("done"))
    driver.run()  # TE(1, completed), then the flush barrier flushes the store
    result = store.load("s")
    assert result.report.live and result.report.closers_appended == 0
    assert result.events[-1].type == ev.TURN_END
    assert result.events[-1].data["reason"] == {"kind": "completed"}
    assert list(result.events) == list(driver.core.log.events)
    assert list(make().inspect("s").events) == list(result.events)  # and it is durable


def test_between_turn_events_survive_persist_and_resume(make: Any) -> None:
    """§23.3: an idle inject is persisted as is and no synthetic turn is added."""
    store = make()
    store.create("s")
    driver = persisted(store, "s", AgentCore(CONFIG))
    driver.core.followup(user_message("p1", "first"))
    driver.run()
    driver.core.inject(user_message("ctx", "idle context", {"kind": "plugin", "plugin": "x"}))
    driver.run()
    store.close()  # close flushes the unflushed between-turn event (§21.5)
    store2 = make()
    core = resume_core(store2, "s", CONFIG)
    assert core.log.events[-1].type == ev.USER_MESSAGE
    assert core.log.events[-1].data["id"] == "ctx" and core.log.open_turn is None
    assert turn_starts(core.log.events) == [1]


# --------------------------------------------------------------------------
# S34, D16: a session the build cannot read is not resumed
# --------------------------------------------------------------------------


def _with_plugin_events(store: BaseStore[Any], *, ignorable: bool) -> None:
    """A session with a turn, then a plugin's own event (type ``todo-x/state``) appended while
    idle, marked ignorable or not, persisted."""
    store.create("s")
    driver = persisted(store, "s", AgentCore(CONFIG), [text_reply("one")])
    driver.core.followup(user_message("p1", "first"))
    driver.run()
    driver.core.append("todo-x/state", {"open": 2}, ignorable=ignorable)
    driver.run()
    store.close()


def test_S34_D16_a_session_with_an_event_type_the_build_does_not_read_is_refused(
        make: Any) -> None:
    from machine.store import UnreadableSessionError
    _with_plugin_events(make(), ignorable=False)
    store = make()
    with pytest.raises(UnreadableSessionError, match=r"event 9 has type 'todo-x/state'") as info:
        resume_core(store, "s", CONFIG)
    assert (info.value.seq, info.value.event_type, info.value.code) == (
        9, "todo-x/state", "UNREADABLE_SESSION")
    # released again: the same store loads it (and another resume with the type named works)
    assert [e.type for e in store.load("s").events][-1] == "todo-x/state"
    store.release("s")
    core = resume_core(store, "s", CONFIG, reads=["todo-x/state"])
    assert core.log.events[-1].data == {"open": 2} and not core.log.events[-1].ignorable


def test_S34_D16_an_event_its_writer_marked_ignorable_does_not_stop_a_resume(
        make: Any) -> None:
    _with_plugin_events(make(), ignorable=True)
    store = make()
    core = resume_core(store, "s", CONFIG)             # the type is not read: still resumed
    last = core.log.events[-1]
    assert (last.type, last.ignorable) == ("todo-x/state", True)
    assert last.to_json()["ignorable"] is True
    driver = persisted(store, "s", core, [text_reply("two")])
    core.followup(user_message("p2", "second"))
    driver.run()
    store.close()
    events = make().load("s").events
    assert [e.ignorable for e in events if e.type == "todo-x/state"] == [True]   # kept as it was
    assert turn_starts(events) == [1, 2]


def test_S34_D16_the_agent_resumes_only_what_it_can_read(tmp_path: Path) -> None:
    import asyncio

    from machine.runtime import Agent, ScriptedModel
    from machine.store import UnreadableSessionError
    _with_plugin_events(JsonlStore(tmp_path / "s"), ignorable=False)
    store = JsonlStore(tmp_path / "s")
    with pytest.raises(UnreadableSessionError, match="todo-x/state"):
        Agent.resume(store, "s", ScriptedModel())
    agent = Agent.resume(store, "s", ScriptedModel(), reads=("todo-x/state",))

    async def run() -> None:
        async with agent:
            agent.append("todo-y/note", {"n": 1}, ignorable=True)
            await agent.when_idle()
    asyncio.run(run())
    again = Agent.resume(store, "s", ScriptedModel(), reads=("todo-x/state",))
    assert again.session.events[-1].type == "todo-y/note"        # ignorable: resumed past
    store.close()


def test_D16_L3_only_extension_events_may_be_ignorable_and_the_mark_is_true() -> None:
    from machine.errors import CodecError, InvariantError
    from machine.log import SessionLog
    log = SessionLog()
    with pytest.raises(InvariantError, match="cannot be ignorable: a build always reads"):
        log.append(ev.USER_MESSAGE, user_message("m", "hi"), surface_op="append", ignorable=True)
    with pytest.raises(InvariantError, match="ignorable must be a bool"):
        log.append("x/y", {}, ignorable="yes")  # type: ignore[arg-type]
    assert len(log) == 0
    event = log.append("x/y", {"a": 1}, ignorable=True)
    assert event.ignorable and Event.from_json(event.to_json()) == event
    assert "ignorable" not in log.append("x/z", {}).to_json()
    with pytest.raises(CodecError, match=r"event.ignorable: must be true, or omitted"):
        Event.from_json({"type": "x/y", "seq": 0, "time": 0, "data": {}, "ignorable": False})
    # a seed that marks a core type ignorable is refused like any other seed (L14)
    with pytest.raises(InvariantError, match="seed event at seq 0"):
        SessionLog([Event.from_json({"type": ev.TURN_START, "seq": 0, "time": 0, "data": {
            "turn": 1, "trigger": {"kind": "retry"}}, "ignorable": True})])
