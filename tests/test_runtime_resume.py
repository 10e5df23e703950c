"""Resuming a stored session in one call, and the runtime's sinks (specs/runtime.md RT17, RT12)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from scenario_helpers import at, integer

from machine.events import Event
from machine.log import validate_events
from machine.runtime import (
    Agent,
    InMemorySink,
    PersistentSession,
    ScriptedModel,
    SessionSink,
    text_reply,
)
from machine.store import (
    DamageError,
    JsonlStore,
    SessionNotFoundError,
    SqliteStore,
)
from machine.store.base import BaseStore
from machine.store.testing import sample_session, store_events


def _turns(events: list[Event]) -> list[int]:
    return [integer(e.data["turn"]) for e in events if e.type == "turn/start"]


def _talk(agent: Agent, *prompts: str) -> list[Event]:
    async def main() -> list[Event]:
        async with agent:
            for prompt in prompts:
                agent.followup(prompt)
            await agent.when_idle(timeout=60)
        return list(agent.session.events)
    return asyncio.run(main())


STORES: dict[str, Callable[[Path], BaseStore[Any]]] = {
    "jsonl": lambda root: JsonlStore(root, fsync=False),
    "sqlite": lambda root: SqliteStore(root / "sessions.db"),
}


@pytest.mark.parametrize("backend", sorted(STORES))
def test_RT17_resume_continues_turns_and_seqs_and_writes_into_the_session(
        backend: str, tmp_path: Path) -> None:
    make = STORES[backend]
    store = make(tmp_path)
    first = Agent.resume(store, "s1", ScriptedModel([text_reply("one")]), create=True)
    assert first.load_report is None
    before = _talk(first, "a")
    assert not store.is_open("s1")                 # released after teardown
    store.close()

    store = make(tmp_path)
    starts: list[str] = []
    second = Agent.resume(store, "s1", ScriptedModel([text_reply("two")]))
    second.on("agent/session-start", lambda e: starts.append(str(e.payload["source"])))
    after = _talk(second, "b")
    assert second.load_report is not None and second.load_report.clean
    assert starts == ["resume"]
    assert _turns(after) == [1, 2]
    assert [e.seq for e in after] == list(range(len(after)))
    assert after[:len(before)] == before
    assert [e.data["reason"] for e in after if e.type == "request/header"] == ["initial",
                                                                               "resume"]
    stored = make(tmp_path).load("s1").events
    assert list(stored) == after and validate_events(stored) is None


def test_RT17_a_crashed_session_is_repaired_reported_and_continued(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = JsonlStore(tmp_path, fsync=False)
    store_events(store, "s1", sample_session(open_tail=True))   # turn 3 left open
    store.close()
    store = JsonlStore(tmp_path, fsync=False)
    with caplog.at_level(logging.WARNING, logger="turnstile"):
        agent = Agent.resume(store, "s1", ScriptedModel([text_reply("after the crash")]))
    report = agent.load_report
    assert report is not None and report.closers_appended > 0 and not report.clean
    assert "session s1 resumed after repair" in caplog.text
    assert "repair closer" in caplog.text
    events = _talk(agent, "still there?")
    reasons = [at(e.data, "reason", "kind") for e in events if e.type == "turn/end"]
    assert reasons[-2:] == ["interrupted", "completed"]
    assert _turns(events) == [1, 2, 3, 4]


def test_RT17_damage_raises_in_strict_mode_and_is_reported_in_salvage_mode(
        tmp_path: Path) -> None:
    store = JsonlStore(tmp_path, fsync=False)
    store_events(store, "s1", sample_session(open_tail=False))
    store.close()
    path = tmp_path / "s1.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[6] = lines[6].replace(b'"turn"', b'"tUrn"', 1)       # a checksum mismatch
    path.write_bytes(b"".join(lines))
    with pytest.raises(DamageError):
        Agent.resume(JsonlStore(tmp_path, fsync=False), "s1", ScriptedModel())
    agent = Agent.resume(JsonlStore(tmp_path, fsync=False), "s1",
                         ScriptedModel([text_reply("ok")]), mode="salvage")
    report = agent.load_report
    assert report is not None and [d.kind for d in report.damage] == ["checksum-mismatch"]
    assert report.quarantine is not None
    events = _talk(agent, "go on")
    assert validate_events(events) is None and events[-1].type == "turn/end"


def test_RT17_a_missing_session_raises_unless_created(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path, fsync=False)
    with pytest.raises(SessionNotFoundError):
        Agent.resume(store, "nope", ScriptedModel())
    agent = Agent.resume(store, "nope", ScriptedModel([text_reply("new")]), create=True)
    starts: list[str] = []
    agent.on("agent/session-start", lambda e: starts.append(str(e.payload["source"])))
    _talk(agent, "hi")
    assert starts == ["startup"] and store.load("nope").report.clean


# --------------------------------------------------------------------------
# Sinks (RT12)
# --------------------------------------------------------------------------


class SyncSink:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.flushed: list[int] = []
        self.closed = 0

    def append(self, event: Event) -> None:
        self.events.append(event)

    def flush(self) -> None:
        self.flushed.append(len(self.events))

    def close(self) -> None:
        self.closed += 1


class AsyncSink(SyncSink):
    async def flush(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        self.flushed.append(len(self.events))


@pytest.mark.parametrize("sink_type", [SyncSink, AsyncSink])
def test_RT12_a_sink_flushes_synchronously_or_asynchronously_and_is_closed_once(
        sink_type: type[SyncSink]) -> None:
    sink = sink_type()
    protocol: SessionSink = sink
    agent = Agent(ScriptedModel([text_reply("a"), text_reply("b")]), sink=protocol)
    events = _talk(agent, "one", "two")
    ends = [e.seq + 1 for e in events if e.type == "turn/end"]
    assert sink.flushed == ends and sink.events == events and sink.closed == 1


def test_RT12_a_raising_sync_flush_is_reported_like_an_async_one(
        caplog: pytest.LogCaptureFixture) -> None:
    class Broken(SyncSink):
        def flush(self) -> None:
            raise OSError("disk full")
    with caplog.at_level(logging.WARNING, logger="turnstile"):
        events = _talk(Agent(ScriptedModel([text_reply("a")]), sink=Broken()), "x")
    assert "session flush failed at turn 1: disk full" in caplog.text
    assert events[-1].type == "turn/end"


def test_RT12_the_old_store_names_are_gone() -> None:
    """The sink's names from before it was a sink (``SessionStore``, ``InMemorySessionStore``,
    ``Agent(store=)``, ``Agent.store``) were removed before the first release (issue 32):
    each fails as an unknown name does."""
    import machine.runtime as runtime
    for name in ("SessionStore", "InMemorySessionStore"):
        assert not hasattr(runtime, name)
    with pytest.raises(TypeError, match="store"):
        Agent(ScriptedModel(), store=InMemorySink())  # type: ignore[call-arg]
    assert not hasattr(Agent(ScriptedModel()), "store")


def test_RT12_a_persistent_session_releases_only_when_it_owns_the_session(
        tmp_path: Path) -> None:
    store = JsonlStore(tmp_path, fsync=False)
    store.create("kept")
    _talk(Agent(ScriptedModel([text_reply("a")]), sink=PersistentSession(store, "kept")), "x")
    assert store.is_open("kept")
    store.create("owned")
    _talk(Agent(ScriptedModel([text_reply("a")]),
                sink=PersistentSession(store, "owned", release=True)), "x")
    assert not store.is_open("owned")
