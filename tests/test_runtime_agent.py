"""The asyncio Agent's API: commands, lifecycle, subscriptions, stores (specs/runtime.md RT1-RT5,
RT12, RT13)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from scenario_helpers import arr, string

from machine.errors import DisposedError, ValidationError
from machine.events import Event, LiveEvent
from machine.io import Effect, Output
from machine.log import SessionLog, validate_events
from machine.runtime import (
    Agent,
    Hang,
    InMemorySink,
    PersistentSession,
    ScriptedModel,
    Sent,
    text_reply,
)
from machine.store import JsonlStore


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))     # a hang fails instead of blocking the suite


def msg(id_: str, text: str, plugin: str | None = None) -> dict[str, Any]:
    source = {"kind": "plugin", "plugin": plugin} if plugin else {"kind": "user"}
    return {"id": id_, "role": "user", "content": [{"type": "text", "text": text}],
            "source": source}


def returned(command: Callable[[], object]) -> object:
    """What *command* returned (cancel is typed to return None, which RT4 asserts)."""
    return command()


def types(events: Any) -> list[str]:
    return [e.type for e in events]


def test_commands_take_effect_at_once_and_sends_return_their_message() -> None:
    """RT4: commands are synchronous and have taken effect when they return; a send returns
    the accepted message's `Sent` (its id and fate so far, RT26), cancel returns None."""
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            seen: list[str] = []
            agent.on("agent/inbox/enqueue",
                     lambda e: seen.append(string(e.payload["placement"])))
            first = agent.followup("first")
            assert isinstance(first, Sent) and first.id == "user-1"
            assert first.fate.kind == "pending" and first.fate.waiting == "queued"
            assert seen == ["queued"] and agent.status == "idle" and agent.core.wake_pending
            context = agent.inject(msg("c", "context", "shell"))
            assert types(agent.session.events) == ["user/message"]       # appended at once
            assert (context.id, context.fate.kind, context.fate.seq) == ("c", "appended", 0)
            assert agent.send("quiet", target="next-turn", wakeup=False).fate.route == "prompt"
            assert agent.steer("second").fate.waiting == "queued"        # the window is closed
            assert returned(lambda: agent.cancel("user", keep_inbox=True)) is None  # nothing active
            await agent.when_idle()
            starts = [e for e in agent.session.events if e.type == "turn/start"]
            assert len(starts) == 3          # first, quiet (claimed in the same interval), second
            assert (first.fate.kind, first.fate.turn, first.fate.step) == ("delivered", 1, 1)
    run(main)


def test_invalid_messages_and_options_are_refused_at_the_call() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            with pytest.raises(ValidationError):
                agent.followup({"id": "", "role": "user", "content": [], "source": {"kind": "user"}})
            with pytest.raises(ValidationError):
                agent.send("x", target="later", wakeup=True)  # type: ignore[arg-type]
            with pytest.raises(ValidationError):
                agent.cancel("disposed")  # type: ignore[arg-type]
            assert not agent.session and agent.core.is_quiescent
    run(main)


def test_string_messages_get_minted_user_ids() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            agent.inject("one")
            agent.inject("two")
            assert [e.data["id"] for e in agent.session.events] == ["user-1", "user-2"]
            assert agent.session.events[0].data["source"] == {"kind": "user"}
    run(main)


def test_async_with_publishes_to_early_listeners_and_disposes_on_exit() -> None:
    live: list[str] = []

    async def main() -> None:
        agent = Agent(ScriptedModel([text_reply("hello")]))
        async with agent as entered:
            assert entered is agent
            entered.on("*", lambda e: live.append(e.type))
            for kind in ("session/created", "agent/created", "agent/session-start", "agent/status",
                         "agent/disposed", "session/disposed"):
                entered.on(kind, lambda e: live.append(e.type))
            agent.followup("hi")
            await agent.when_idle()
            disposed = agent.disposed  # a local: mypy would keep agent.disposed narrowed below
            assert not disposed
        assert agent.disposed
        with pytest.raises(DisposedError):
            agent.followup("too late")
        await agent.dispose()                    # again: already complete
    run(main)
    assert live[:3] == ["session/created", "agent/created", "agent/session-start"]
    assert live[-2:] == ["agent/disposed", "session/disposed"]
    assert "turn/end" in live


def test_dispose_interrupts_a_running_turn_and_waits_for_teardown() -> None:
    async def main() -> None:
        agent = Agent(ScriptedModel([Hang(({"type": "text", "text": "partial"},))]))
        streaming = asyncio.Event()
        agent.on("assistant/chunk", lambda e: streaming.set())
        agent.followup("go")
        agent.followup("never claimed")
        await streaming.wait()
        discarded: list[Any] = []
        agent.on("agent/inbox/discard", lambda e: discarded.extend(arr(e.payload["messages"])))
        disposal = agent.dispose()
        assert [m["id"] for m in discarded] == ["user-2"]        # at once, before awaiting
        await disposal
        assert agent.disposed
        end = [e for e in agent.session.events if e.type == "turn/end"][-1]
        assert end.data["reason"] == {"kind": "disposed"}
        await agent.when_idle()
    run(main)


def test_when_idle_completes_at_once_when_idle_and_otherwise_after_the_work() -> None:
    """RT7: `when_idle()` completes at once when idle, and otherwise once the core is
    quiescent after the work."""
    async def main() -> None:
        async with Agent(ScriptedModel([text_reply("a"), text_reply("b")])) as agent:
            await asyncio.wait_for(agent.when_idle(), 30)   # at once; the bound only guards a hang
            agent.followup("one")
            idle = asyncio.ensure_future(agent.when_idle())
            await asyncio.sleep(0)
            assert not idle.done()
            agent.inject("quiet items alone do not hold it back")
            await idle
            assert agent.status == "idle" and agent.core.is_quiescent
            assert [e.type for e in agent.session.events].count("turn/end") == 1
    run(main)


def test_commands_need_a_running_event_loop() -> None:
    agent = Agent(ScriptedModel())
    with pytest.raises(RuntimeError, match="running asyncio event loop"):
        agent.followup("hi")


def test_listeners_by_type_star_session_event_and_observe_all_outputs() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel([text_reply("hi")])) as agent:
            typed: list[Event] = []
            star: list[int] = []
            session_event: list[int] = []
            live: list[LiveEvent] = []
            every: list[Output] = []
            agent.on("turn/end", typed.append)
            agent.on("*", lambda e: star.append(e.seq))
            agent.on("session/event", lambda e: session_event.append(e.seq))
            agent.on("agent/settled", live.append)
            agent.observe(every.append)
            agent.followup("go")
            await agent.when_idle()
            assert [e.data["reason"] for e in typed] == [{"kind": "completed"}]
            assert star == session_event == list(range(len(agent.session)))
            assert live[0].payload["turn"] == 1
            assert any(isinstance(o, Effect) and o.kind == "model" for o in every)
    run(main)


def test_unsubscribe_and_listeners_added_during_a_delivery() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            seen: list[str] = []
            stop = agent.on("*", lambda e: seen.append(f"a:{e.data['id']}"))

            def add_later(event: Event) -> None:
                agent.on("*", lambda e: seen.append(f"b:{e.data['id']}"))
            first = agent.on("user/message", add_later)
            agent.inject("x1")
            first()
            agent.inject("x2")
            stop()
            agent.inject("x3")
            assert seen == ["a:user-1", "a:user-2", "b:user-2", "b:user-3"]
    run(main)


def test_listener_exceptions_are_contained_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """RT3: a listener's exception is contained and logged; the remaining listeners run."""
    async def main() -> None:
        async with Agent(ScriptedModel([text_reply("ok")])) as agent:
            after: list[int] = []

            def broken(event: Event) -> None:
                raise RuntimeError("observer bug")
            agent.on("turn/start", broken)
            agent.on("turn/start", lambda e: after.append(e.seq))
            agent.followup("go")
            await agent.when_idle()
            assert after == [0]
            assert [e.type for e in agent.session.events][-1] == "turn/end"
    with caplog.at_level(logging.WARNING, logger="turnstile"):
        run(main)
    assert "listener of turn/start (seq 0) raised: observer bug" in caplog.text


def test_agent_warnings_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            async def broken(submit: Any, next_: Any) -> Any:
                raise RuntimeError("handler exploded")
            agent.hooks.prompt_submit.use(broken)
            agent.followup("go")
            await agent.when_idle()
            assert not agent.session
    with caplog.at_level(logging.WARNING, logger="turnstile"):
        run(main)
    assert "prompt admission failed: handler exploded" in caplog.text


def test_direct_append_is_delivered_in_order() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            seen: list[str] = []
            agent.on("*", lambda e: seen.append(e.type))
            event = agent.append("x-telemetry/sample", {"n": 1})
            assert event.seq == 0 and seen == ["x-telemetry/sample"]
    run(main)


def test_the_store_gets_every_event_in_order_and_a_flush_after_each_turn() -> None:
    store = InMemorySink()

    async def main() -> None:
        async with Agent(ScriptedModel([text_reply("a"), text_reply("b")]), sink=store) as agent:
            flushed_at_settle: list[int] = []
            agent.on("agent/settled", lambda e: flushed_at_settle.append(len(store.durable)))
            agent.inject("before")
            agent.followup("one")
            agent.followup("two")
            await agent.when_idle()
            assert [e.seq for e in store.events] == list(range(len(agent.session)))
            assert store.flushes == 2
            ends = [e.seq + 1 for e in agent.session.events if e.type == "turn/end"]
            assert flushed_at_settle == ends
    run(main)


def test_a_persistent_session_stores_a_valid_log_that_loads_back(tmp_path: Path) -> None:
    backend = JsonlStore(tmp_path, fsync=False)
    backend.create("s1")
    session = PersistentSession(backend, "s1")

    async def main() -> list[Event]:
        async with Agent(ScriptedModel([text_reply("hello")]), sink=session) as agent:
            agent.inject("ctx")
            agent.followup("hi")
            await agent.when_idle()
            return list(agent.session.events)
    events = asyncio.run(main())
    backend.close()
    loaded = JsonlStore(tmp_path, fsync=False).load("s1").events
    assert [e.to_json() for e in loaded] == [e.to_json() for e in events]
    assert validate_events(loaded) is None and types(loaded)[-1] == "turn/end"


def test_a_resumed_session_continues_numbering() -> None:
    async def main() -> None:
        first = Agent(ScriptedModel([text_reply("one")]))
        async with first:
            first.followup("a")
            await first.when_idle()
        log = SessionLog(first.session.events)
        second = Agent(ScriptedModel([text_reply("two")]), session=log, session_start="resume")
        starts: list[str] = []
        second.on("agent/session-start", lambda e: starts.append(string(e.payload["source"])))
        async with second:
            second.followup("b")
            await second.when_idle()
        assert starts == ["resume"]
        assert [e.data["turn"] for e in second.session.events if e.type == "turn/start"] == [1, 2]
        headers = [e.data["reason"] for e in second.session.events if e.type == "request/header"]
        assert headers == ["initial", "resume"]
    run(main)
