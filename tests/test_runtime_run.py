"""The run API (specs/runtime.md RT21): ``agent.run`` returns a prompt's outcome as a value and
``agent.stream`` yields its events; what the result says when the prompt is blocked, rejected
or discarded, when its turn is cancelled, retried, fails or is disposed, and when other input
is queued or steered meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from machine.events import Event, LiveEvent
from machine.payloads import TurnEndData
from machine.runtime import (
    Agent,
    Allow,
    Block,
    Hang,
    ModelCall,
    ModelFailure,
    NoOutputError,
    PromptSubmit,
    RetryPolicy,
    RunEvent,
    ScriptedModel,
    StepContext,
    Tool,
    ToolCall,
    Usage,
    calls_reply,
    retry_request,
    text_reply,
)
from machine.runtime.adapters.fake_server import FakeServer, openai_text, openai_tool_calls
from machine.runtime.adapters.openai import OpenAIChat
from machine.runtime.hooks import Next
from machine.vocabulary import PromptDecision


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))     # a hang fails instead of blocking the suite


async def _read(call: ToolCall) -> str:
    return f"contents of {call.arguments}"


READ = Tool("read", _read)
USAGE_1 = {"inputTokens": 10, "outputTokens": 3, "cacheReadTokens": 4}
USAGE_2 = {"inputTokens": 20, "outputTokens": 5}


def test_RT21_a_completed_run_returns_its_turn_text_messages_usage_and_events() -> None:
    async def main() -> None:
        call = [*calls_reply(("c1", "read", '{"path": "a"}'))[:-1],
                {"type": "usage", "usage": USAGE_1}, {"type": "finish", "kind": "stop"}]
        model = ScriptedModel([text_reply("earlier"), call, text_reply("a says hi", usage=USAGE_2)])
        async with Agent(model, tools=[READ]) as agent:
            agent.followup("earlier")                  # turn 1: not this run's
            result = await agent.run("what is in a?")
            assert result.outcome == "completed" and result.ok
            assert result.turns == (2,) and result.turn == 2
            assert result.output == result.text == "a says hi"
            assert [m.role for m in result.messages] == ["user", "assistant", "user", "assistant"]
            assert result.messages[0].text == "what is in a?"
            assert result.usage == Usage(30, 8, 4, 0, 0, 2)
            assert result.usage.total_tokens == 42
            assert result.events[0].type == "turn/start" and result.events[-1].type == "turn/end"
            assert result.events == tuple(e for e in agent.session.events
                                          if result.events[0].seq <= e.seq)
            assert result.reason is not None and result.reason.kind == "completed"
            assert (result.fate.kind, result.fate.turn, result.fate.step) == ("delivered", 2, 1)
            assert result.prompt_id == result.fate.message_id == "user-2"
    run(main)


def _gate(decide: Callable[[PromptSubmit], PromptDecision | None]
          ) -> Callable[[PromptSubmit, Next[PromptDecision]], Awaitable[PromptDecision]]:
    async def handler(submit: PromptSubmit, next: Next[PromptDecision]) -> PromptDecision:
        decision = decide(submit)
        return decision if decision is not None else await next()
    return handler


def test_RT21_a_blocked_prompt_has_no_turn_and_its_output_says_why() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            agent.hooks.prompt_submit.use(_gate(
                lambda s: Block("destructive") if "rm" in s.message.text else None))
            result = await agent.run("rm -rf /")
            assert result.outcome == "blocked" and not result.ok
            assert result.turns == () and result.turn is None and result.events == ()
            assert result.reason is None and result.messages == ()
            assert (result.fate.kind, result.fate.rejection, result.fate.detail) == (
                "rejected", "blocked", "destructive")
            with pytest.raises(NoOutputError) as raised:
                _ = result.output
            assert raised.value.code == "PROMPT_BLOCKED" and raised.value.result is result
            assert "blocked: destructive" in str(raised.value)
            assert not [e for e in agent.session.events if e.type == "turn/start"]
            assert (await agent.run("ls")).outcome == "completed"   # the agent goes on
    run(main)


def test_RT21_an_admission_that_raises_or_decides_nonsense_is_rejected() -> None:
    async def main() -> None:
        async def raising(submit: PromptSubmit, next: Next[PromptDecision]) -> PromptDecision:
            if submit.message.text == "raise":
                raise RuntimeError("policy service down")
            if submit.message.text == "nonsense":
                return {"kind": "maybe"}               # type: ignore[return-value]
            return await next()
        async with Agent(ScriptedModel()) as agent:
            agent.hooks.prompt_submit.use(raising)
            failed = await agent.run("raise")
            assert failed.outcome == "rejected"
            assert (failed.fate.rejection, failed.fate.detail) == ("failed", "policy service down")
            invalid = await agent.run("nonsense")
            assert invalid.outcome == "rejected" and invalid.fate.rejection == "invalid"
            assert "maybe" in (invalid.fate.detail or "")
            with pytest.raises(NoOutputError) as raised:
                _ = invalid.output
            assert raised.value.code == "PROMPT_REJECTED"
    run(main)


def test_RT21_a_cancel_during_admission_rejects_the_prompt_as_aborted() -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def slow(submit: PromptSubmit, next: Next[PromptDecision]) -> PromptDecision:
            await release.wait()
            return Allow()
        async with Agent(ScriptedModel()) as agent:
            agent.hooks.prompt_submit.use(slow)
            waiting = asyncio.ensure_future(agent.run("hello"))
            while agent.core.status != "running" or not agent.core.outstanding_effects:
                await asyncio.sleep(0)
            agent.cancel()
            release.set()
            result = await waiting
            assert result.outcome == "rejected" and result.fate.rejection == "aborted"
            assert result.fate.cause is not None and result.fate.cause.kind == "user"
    run(main)


def test_RT21_a_cancelled_turn_ends_the_run_aborted_with_what_it_had() -> None:
    async def main() -> None:
        model = ScriptedModel([Hang(({"type": "text", "text": "part"},))])
        async with Agent(model) as agent:
            stream = agent.stream("go")
            seen: list[str] = []
            async for event in stream:
                seen.append(event.type)
                if event.type == "assistant/chunk":
                    agent.cancel()
            result = await stream.result()
            assert result.outcome == "aborted" and result.turns == (1,)
            assert result.reason is not None and result.reason.kind == "aborted"
            assert result.text == "part"               # what was streamed is kept (D15)
            with pytest.raises(NoOutputError) as raised:
                _ = result.output
            assert raised.value.code == "RUN_ABORTED"
            assert seen[0] == "turn/start" and seen[-1] == "agent/settled"
            assert "agent/cancel-requested" in seen and "turn/end" in seen
    run(main)


def test_RT21_a_prompt_discarded_while_queued_has_a_discarded_run() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel([Hang()])) as agent:
            first = asyncio.ensure_future(agent.run("busy"))
            while agent.core.status != "running":
                await asyncio.sleep(0)
            second = asyncio.ensure_future(agent.run("later"))
            await asyncio.sleep(0)
            agent.cancel()
            later, busy = await second, await first
            assert later.outcome == "discarded" and later.turns == ()
            assert later.fate.cause is not None and later.fate.cause.kind == "user"
            assert busy.outcome == "aborted"
            with pytest.raises(NoOutputError) as raised:
                _ = later.output
            assert raised.value.code == "PROMPT_DISCARDED"
    run(main)


def test_RT21_a_retried_turn_is_part_of_the_run_and_its_usage_counts() -> None:
    async def main() -> None:
        async def failing(call: ModelCall) -> AsyncIterator[dict[str, Any]]:
            yield {"type": "usage", "usage": USAGE_1}
            raise ModelFailure("overloaded", "OVERLOADED", status=529)
        model = ScriptedModel([failing, text_reply("second time", usage=USAGE_2)])
        async with Agent(model, retry_policy=RetryPolicy(base_delay=0.001, jitter=0)) as agent:
            agent.hooks.request_error.use(retry_request)
            result = await agent.run("hi")
            assert result.outcome == "completed" and result.turns == (1, 2)
            assert result.output == "second time"
            ends = [e.data_as(TurnEndData) for e in result.events if e.type == "turn/end"]
            assert [end.reason.kind for end in ends] == ["error", "completed"]
            # usage is that of the assistant messages: the failed request wrote none
            assert result.usage == Usage(20, 5, 0, 0, 0, 1)
    run(main)


def test_RT21_a_failed_turn_is_an_error_outcome_with_its_reason() -> None:
    async def main() -> None:
        model = ScriptedModel([ModelFailure("bad request", "BAD_REQUEST", status=400)])
        async with Agent(model) as agent:
            result = await agent.run("hi")
            assert result.outcome == "error" and result.turns == (1,)
            assert result.reason is not None and result.reason.failure is not None
            assert result.reason.failure.code == "BAD_REQUEST"
            with pytest.raises(NoOutputError, match="bad request"):
                _ = result.output
    run(main)


def test_RT21_max_tokens_is_an_outcome_with_an_output() -> None:
    async def main() -> None:
        model = ScriptedModel([[{"type": "text", "text": "cut"},
                                {"type": "finish", "kind": "max-tokens"}]])
        async with Agent(model) as agent:
            result = await agent.run("hi")
            assert (result.outcome, result.output) == ("max-tokens", "cut")
    run(main)


def test_RT21_input_queued_meanwhile_runs_apart_and_steering_is_part_of_the_turn() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel([calls_reply(("c1", "read")), text_reply("first done"),
                                        text_reply("second done")]),
                         tools=[READ]) as agent:
            async def steer_at_step_one(context: StepContext) -> None:
                if context.turn == 1 and context.step == 1:
                    agent.steer("also look at b")       # steering: this turn's next step
                    agent.followup("a later prompt")    # queued: a turn of its own
            agent.hooks.step.use(steer_at_step_one)
            first = await agent.run("look at a")
            assert first.turns == (1,) and first.output == "first done"
            texts = [m.text for m in first.messages if m.role == "user" and m.text]
            assert texts == ["look at a", "also look at b"]
            assert "a later prompt" not in texts
            later = agent.fate("user-3")
            assert later is not None
            await agent.when_idle()
            later = agent.fate("user-3")
            assert later is not None and later.kind == "delivered" and later.turn == 2
    run(main)


def test_RT21_concurrent_runs_each_get_their_own_turn() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel([text_reply("one"), text_reply("two")])) as agent:
            a, b = await asyncio.gather(agent.run("first"), agent.run("second"))
            assert (a.turns, a.output) == ((1,), "one")
            assert (b.turns, b.output) == ((2,), "two")
    run(main)


def test_RT21_dispose_ends_a_running_run_disposed_and_discards_a_queued_one() -> None:
    async def main() -> None:
        agent = Agent(ScriptedModel([Hang()]))
        async with agent:
            running = asyncio.ensure_future(agent.run("busy"))
            while agent.core.status != "running":
                await asyncio.sleep(0)
            queued = asyncio.ensure_future(agent.run("later"))
            await asyncio.sleep(0)
        busy, later = await running, await queued
        assert busy.outcome == "disposed"
        assert later.outcome == "discarded"
        assert later.fate.cause is not None and later.fate.cause.kind == "disposed"
    run(main)


def test_RT21_a_stream_yields_the_runs_events_in_delivery_order_then_ends() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel([calls_reply(("c1", "read")), text_reply("done")]),
                         tools=[READ]) as agent:
            delivered: list[RunEvent] = []
            agent.on("*", delivered.append)
            agent.on("agent/settled", delivered.append)
            stream = agent.stream("go")
            events = [event async for event in stream]
            result = await stream.result()
            durable = [e for e in events if isinstance(e, Event)]
            assert tuple(durable) == result.events
            assert [e.type for e in events] == [e.type for e in delivered]
            assert isinstance(events[-1], LiveEvent) and events[-1].type == "agent/settled"
            assert [e.type for e in events if e.type.startswith("tool/")] == [
                "tool/call", "tool/result"]
            assert result.output == "done"
            # a blocked prompt's stream yields nothing and ends
            agent.hooks.prompt_submit.use(_gate(lambda s: Block("no")))
            blocked = agent.stream("x")
            assert [e async for e in blocked] == []
            assert (await blocked.result()).outcome == "blocked"
    run(main)


def test_RT21_a_run_through_a_provider_adapter_against_the_fake_server() -> None:
    async def main() -> None:
        replies = [openai_tool_calls(("call_1", "read", '{"path": "a"}')),
                   openai_text("a says hi", pieces=3)]
        async with FakeServer(replies) as server:
            model = OpenAIChat("fake-model", base_url=server.openai_base_url, provider="fakeai")
            async with Agent(model, tools=[READ]) as agent:
                result = await agent.run("what is in a?")
        assert result.outcome == "completed" and result.output == "a says hi"
        assert result.usage.requests == 2 and result.usage.total_tokens > 0
        assert len(server.requests) == 2
    run(main)
