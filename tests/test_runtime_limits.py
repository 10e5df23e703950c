"""Limits (specs/runtime.md RT24): steps per turn, tool calls per turn, tokens per turn and per
run. Reaching one ends the turn with a declared reason (``turn/end {kind:'error', code}``),
nothing accepted is lost, and the tool batch's results stay adjacent to its calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from scenario_helpers import at, obj

from machine.errors import ValidationError
from machine.events import Event
from machine.payloads import TurnEndData
from machine.runtime import (
    Agent,
    Limits,
    ModelCall,
    ModelFailure,
    NoOutputError,
    RetryPolicy,
    ScriptedModel,
    StepContext,
    Tool,
    ToolCall,
    calls_reply,
    retry_request,
    text_reply,
)
from machine.runtime.adapters.fake_server import FakeServer, openai_text, openai_tool_calls
from machine.runtime.adapters.openai import OpenAIChat


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))


class Counter:
    def __init__(self) -> None:
        self.ran: list[str] = []

    async def body(self, call: ToolCall) -> str:
        self.ran.append(call.call_id)
        return f"ok {call.call_id}"


def looping(call: ModelCall) -> AsyncIterator[dict[str, Any]]:
    """A model that calls a tool at every step, with 10 tokens of usage."""
    async def stream() -> AsyncIterator[dict[str, Any]]:
        yield {"type": "tool-call", "id": f"c{call.turn}-{call.step}", "name": "work",
               "arguments": "{}"}
        yield {"type": "usage", "usage": {"inputTokens": 6, "outputTokens": 4}}
        yield {"type": "finish", "kind": "stop"}
    return stream()


def forever() -> ScriptedModel:
    return ScriptedModel([looping] * 50)


def turn_end(events: tuple[Event, ...] | list[Event]) -> TurnEndData:
    return [e.data_as(TurnEndData) for e in events if e.type == "turn/end"][-1]


def test_RT24_a_step_limit_ends_the_turn_at_the_next_step_with_its_code() -> None:
    async def main() -> None:
        counter = Counter()
        async with Agent(forever(), tools=[Tool("work", counter.body)]) as agent:
            result = await agent.run("loop", limits=Limits(steps=3))
            assert result.outcome == "limit"
            end = turn_end(result.events)
            assert (end.reason.kind, end.reason.code, end.reason.step) == ("error", "STEP_LIMIT", 4)
            assert end.reason.message == "step limit reached: 3 steps per turn"
            assert [e.type for e in result.events].count("step/start") == 3
            assert counter.ran == ["c1-1", "c1-2", "c1-3"]     # every call answered
            with pytest.raises(NoOutputError) as raised:
                _ = result.output
            assert raised.value.code == "STEP_LIMIT"
            errors: list[str] = []
            agent.on("agent/error", lambda e: errors.append(str(e.payload["turn"])))
            again = await agent.run("once more", limits=Limits(steps=1))
            assert again.outcome == "limit" and errors == ["2"]
    run(main)


def test_RT24_calls_over_the_tool_call_limit_get_error_results_in_model_order() -> None:
    async def main() -> None:
        counter = Counter()
        model = ScriptedModel([calls_reply(("a", "work"), ("b", "work"), ("c", "work")),
                               text_reply("never")])
        async with Agent(model, tools=[Tool("work", counter.body, "parallel")]) as agent:
            result = await agent.run("go", limits=Limits(tool_calls=2))
            assert counter.ran == ["a", "b"]
            types = [e.type for e in result.events]
            batch = types[types.index("assistant/message") + 1:types.index("step/end")]
            assert sorted(batch) == ["tool/call"] * 3 + ["tool/result"] * 3   # nothing between
            results = [e for e in result.events if e.type == "tool/result"]
            assert [at(e.data, "message", "content", 0, "toolCallId") for e in results] == [
                "a", "b", "c"]
            refused = results[2]
            assert obj(refused.data["error"])["code"] == "TOOL_CALL_LIMIT"
            assert at(refused.data, "message", "content", 0, "content", 0, "text") == (
                "Error: tool call limit reached (2 per turn): this call was not run")
            end = turn_end(result.events)
            assert (end.reason.code, end.reason.step) == ("TOOL_CALL_LIMIT", 2)
            assert len(model.calls) == 1 and result.outcome == "limit"
    run(main)


def test_RT24_the_tool_call_limit_counts_over_the_turns_steps_and_restarts_each_turn() -> None:
    async def main() -> None:
        counter = Counter()
        async with Agent(forever(), tools=[Tool("work", counter.body)],
                         limits=Limits(tool_calls=2)) as agent:
            agent.followup("first")                   # agent-level limits: no run needed
            agent.followup("second")
            await agent.when_idle()
            ends = [e.data_as(TurnEndData) for e in agent.session.events if e.type == "turn/end"]
            assert [(e.turn, e.reason.code) for e in ends] == [(1, "TOOL_CALL_LIMIT"),
                                                              (2, "TOOL_CALL_LIMIT")]
            assert counter.ran == ["c1-1", "c1-2", "c2-1", "c2-2"]
    run(main)


def test_RT24_token_limits_per_turn_end_the_turn_once_reached() -> None:
    async def main() -> None:
        counter = Counter()
        async with Agent(forever(), tools=[Tool("work", counter.body)]) as agent:
            result = await agent.run("go", limits=Limits(turn_tokens=25))
            end = turn_end(result.events)
            assert (end.reason.code, end.reason.step) == ("TURN_TOKEN_LIMIT", 4)
            assert end.reason.message == "token limit reached: 30 tokens used of 25 per turn"
            assert result.usage.total_tokens == 30
    run(main)


def test_RT24_a_turn_that_ends_by_itself_is_not_cut_by_its_token_count() -> None:
    async def main() -> None:
        model = ScriptedModel([text_reply("done", usage={"inputTokens": 500,
                                                         "outputTokens": 500})])
        async with Agent(model, limits=Limits(turn_tokens=10, run_tokens=10)) as agent:
            result = await agent.run("go")
            assert result.outcome == "completed" and result.output == "done"
    run(main)


def test_RT24_the_run_token_limit_counts_over_the_retry_turns() -> None:
    async def main() -> None:
        counter = Counter()

        def failing(call: ModelCall) -> AsyncIterator[dict[str, Any]]:
            async def stream() -> AsyncIterator[dict[str, Any]]:
                raise ModelFailure("overloaded", "OVERLOADED", status=529)
                yield {}
            return stream()
        model = ScriptedModel([looping, failing, looping, text_reply("never")])
        async with Agent(model, tools=[Tool("work", counter.body)],
                         retry_policy=RetryPolicy(base_delay=0.001, jitter=0)) as agent:
            agent.hooks.request_error.use(retry_request)
            # turn 1: 10 tokens, then a failure retried; turn 2: 10 more: 10 per turn, 20 in all
            result = await agent.run("go", limits=Limits(run_tokens=15, turn_tokens=15))
            assert result.turns == (1, 2) and result.outcome == "limit"
            end = turn_end(result.events)
            assert (end.turn, end.reason.code, end.reason.step) == (2, "RUN_TOKEN_LIMIT", 2)
            assert end.reason.message == "token limit reached: 20 tokens used of 15 per run"
    run(main)


def test_RT24_nothing_accepted_is_lost_when_a_limit_ends_the_turn() -> None:
    async def main() -> None:
        counter = Counter()
        model = ScriptedModel([looping, looping, text_reply("next turn")])
        async with Agent(model, tools=[Tool("work", counter.body)]) as agent:
            async def at_step_two(context: StepContext) -> None:
                if context.turn == 1 and context.step == 2:
                    agent.steer("steer at the last step")
                    agent.inject("context at the last step")
                    agent.followup("a prompt queued meanwhile")
            agent.hooks.step.use(at_step_two)
            stopped: list[Event] = []

            def at_step_end(event: Event) -> None:
                if event.data.get("turn") == 1 and event.data.get("step") == 2:
                    agent.steer("steer at the final step/end")     # retained (R11.3)
                    stopped.append(event)
            agent.on("step/end", at_step_end)
            result = await agent.run("go", limits=Limits(steps=2))
            assert result.outcome == "limit" and stopped
            await agent.when_idle()
            fates = {f.message_id: f for f in agent.fates()}
            assert (fates["user-2"].kind, fates["user-2"].turn) == ("delivered", 1)
            assert (fates["user-3"].kind, fates["user-3"].turn) == ("delivered", 1)
            assert (fates["user-5"].kind, fates["user-5"].turn) == ("delivered", 2)
            assert (fates["user-4"].kind, fates["user-4"].turn) == ("delivered", 2)
            assert all(f.kind == "delivered" for f in agent.fates())
    run(main)


def test_RT24_run_limits_override_the_agents_field_by_field() -> None:
    assert Limits(steps=2).over(Limits(steps=5, tool_calls=1)) == Limits(steps=2, tool_calls=1)
    assert Limits(steps=2).over(None) == Limits(steps=2)

    async def main() -> None:
        counter = Counter()
        async with Agent(forever(), tools=[Tool("work", counter.body)],
                         limits=Limits(steps=1, tool_calls=10)) as agent:
            wider = await agent.run("go", limits=Limits(steps=3))
            assert turn_end(wider.events).reason.code == "STEP_LIMIT"
            assert [e.type for e in wider.events].count("step/start") == 3
    run(main)


def test_RT24_bad_limits_are_refused() -> None:
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValidationError, match=r"limits\.steps: must be a positive integer"):
            Limits(steps=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limits must be a Limits"):
        Agent(ScriptedModel(), limits={"steps": 1})  # type: ignore[arg-type]

    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            with pytest.raises(TypeError, match="limits must be a Limits"):
                await agent.run("x", limits=3)  # type: ignore[call-overload]
            assert agent.session.events == ()
    run(main)


def test_RT24_the_history_a_limit_leaves_is_valid_for_a_provider() -> None:
    async def main() -> None:
        async def work(call: ToolCall) -> str:
            return "done"
        replies = [openai_tool_calls(("call_1", "work", "{}"), ("call_2", "work", "{}")),
                   openai_text("after the limit")]
        async with FakeServer(replies) as server:
            model = OpenAIChat("fake-model", base_url=server.openai_base_url, provider="fakeai")
            async with Agent(model, tools=[Tool("work", work)]) as agent:
                limited = await agent.run("go", limits=Limits(tool_calls=1))
                after = await agent.run("and now?")
            second = server.requests[1].json
        assert limited.outcome == "limit" and after.output == "after the limit"
        roles = [(m["role"], m.get("tool_call_id")) for m in second["messages"]]
        assert roles == [("user", None), ("assistant", None), ("tool", "call_1"),
                         ("tool", "call_2"), ("user", None)]
        assert second["messages"][3]["content"].startswith("Error: tool call limit reached")
    run(main)
