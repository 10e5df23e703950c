"""Model adapters through the runtime: streams, failures, release (reference §9.7, §13;
specs/runtime.md RT11)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from scenario_helpers import at, obj

from machine.runtime import (
    Agent,
    ModelCall,
    ModelFailure,
    RequestDraft,
    ScriptedModel,
    text_reply,
)
from machine.runtime.hooks import JsonValue
from machine.runtime.model import Chunk


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))


def ends(agent: Agent) -> list[Any]:
    return [e.data["reason"] for e in agent.session.events if e.type == "turn/end"]


def test_a_model_failure_carries_its_facts_to_the_log_and_the_settlement() -> None:
    async def main() -> None:
        failure = ModelFailure("rate limited", "RATE_LIMIT", status=429, retry_after_ms=1500,
                               request_id="req-7")
        async with Agent(ScriptedModel([failure])) as agent:
            settled: list[Any] = []
            agent.on("agent/settled", lambda e: settled.append(e.payload["reason"]))
            agent.followup("go")
            await agent.when_idle()
            facts = {"message": "rate limited", "code": "RATE_LIMIT", "status": 429,
                     "providerRetryAfterMs": 1500, "requestId": "req-7"}
            assert ends(agent) == [{"kind": "error", "step": 1, "failure": facts}]
            assert settled[0]["kind"] == "error" and settled[0]["failure"] == facts
            assert settled[0]["error"]["name"] == "ModelFailure"
    run(main)


def test_an_error_finish_chunk_is_a_request_failure_and_other_raises_are_generic() -> None:
    async def main() -> None:
        error_finish: list[Chunk] = [{"type": "text", "text": "par"},
                                     {"type": "finish", "kind": "error",
                                      "failure": {"message": "overloaded",
                                                  "code": "OVERLOADED"}}]
        async with Agent(ScriptedModel([error_finish, KeyError("boom")])) as agent:
            agent.followup("one")
            agent.followup("two")
            await agent.when_idle()
            first, second = ends(agent)
            assert first["failure"]["code"] == "OVERLOADED"
            assert second == {"kind": "error", "step": 1, "message": "'boom'"}
            kinds = [e.type for e in agent.session.events]
            assert "assistant/message" not in kinds
    run(main)


class Watched:
    """A network-like adapter: awaits between chunks and records when it is closed."""

    def __init__(self, chunks: list[Chunk], *, pause: float = 0.0) -> None:
        self.chunks = chunks
        self.pause = pause
        self.closed = False
        self.cancelled = False

    def stream(self, call: ModelCall) -> AsyncIterator[Chunk]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[Chunk]:
        try:
            for chunk in self.chunks:
                yield chunk
                await asyncio.sleep(self.pause)
            await asyncio.sleep(3600)           # a connection that never ends by itself
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            self.closed = True


def test_an_invalid_chunk_releases_the_stream_and_the_runtime_closes_it() -> None:
    adapter = Watched([{"type": "text", "text": "ok"}, {"type": "text", "text": 7}],
                      pause=0.001)

    async def main() -> None:
        async with Agent(adapter, request_options={"provider": "p", "model": "m"}) as agent:
            released: list[Any] = []
            agent.observe(lambda o: released.append(o) if getattr(o, "kind", "") == "release"
                          else None)
            agent.followup("go")
            await agent.when_idle()
            assert len(released) == 1
            assert ends(agent)[0]["code"] == "INVALID_CHUNK"
            for _ in range(5):
                await asyncio.sleep(0)
            assert adapter.closed and adapter.cancelled     # before disposal: by the release
            assert not agent._tasks
    run(main)


def test_a_cancel_while_streaming_releases_and_closes_a_stream_that_ignores_its_signal() -> None:
    adapter = Watched([{"type": "text", "text": str(i)} for i in range(100)], pause=0.001)

    async def main() -> None:
        async with Agent(adapter, request_options={"provider": "p", "model": "m"}) as agent:
            first = asyncio.Event()
            agent.on("assistant/chunk", lambda e: first.set())
            released: list[Any] = []
            agent.observe(lambda o: released.append(o) if getattr(o, "kind", "") == "release"
                          else None)
            agent.followup("go")
            await first.wait()
            agent.cancel("user")
            await agent.when_idle()
            assert ends(agent) == [{"kind": "aborted"}] and len(released) == 1
            chunks = sum(1 for e in agent.session.events if e.type == "assistant/chunk")
            assert chunks < 100
            for _ in range(5):
                await asyncio.sleep(0)
            assert adapter.closed                           # before disposal: by the release
    run(main)


class Preparing:
    """An adapter that builds its own request header and sees the request messages."""

    def __init__(self) -> None:
        self.calls: list[ModelCall] = []

    async def prepare(self, draft: RequestDraft) -> Mapping[str, JsonValue]:
        return {"config": {**draft.config, "provider": "acme", "model": "acme-large"},
                "system": f"turn {draft.turn}"}

    def stream(self, call: ModelCall) -> AsyncIterator[Chunk]:
        self.calls.append(call)
        return self._reply()

    async def _reply(self) -> AsyncIterator[Chunk]:
        for chunk in text_reply("hello", usage={"inputTokens": 5, "outputTokens": 1}):
            yield chunk


def test_an_adapter_may_prepare_the_header_and_gets_the_history() -> None:
    adapter = Preparing()

    async def main() -> None:
        async with Agent(adapter) as agent:
            agent.inject("context first")
            agent.followup("hi")
            await agent.when_idle()
            header = next(e.data["header"] for e in agent.session.events
                          if e.type == "request/header")
            assert header == {"config": {"provider": "acme", "model": "acme-large"},
                              "system": "turn 1"}
            message = next(e.data for e in agent.session.events if e.type == "assistant/message")
            assert at(message, "message", "source") == {"kind": "model", "provider": "acme",
                                                        "model": "acme-large"}
            assert message["usage"] == {"inputTokens": 5, "outputTokens": 1}
    run(main)
    call = adapter.calls[0]
    assert [m.text for m in call.messages] == ["context first", "hi"]
    assert call.system == "turn 1" and call.config["model"] == "acme-large"


def test_a_scripted_model_records_calls_and_can_pace_chunks() -> None:
    model = ScriptedModel([text_reply("a b c", pieces=3)], chunk_delay=0.001)

    async def main() -> None:
        async with Agent(model) as agent:
            agent.followup("go")
            await agent.when_idle()
            texts = [obj(e.data["chunk"]).get("text") for e in agent.session.events
                     if e.type == "assistant/chunk"]
            assert texts[:3] == ["a ", "b ", "c"]
    run(main)
    assert len(model.calls) == 1 and model.calls[0].config == {"provider": "scripted",
                                                               "model": "scripted-1"}
