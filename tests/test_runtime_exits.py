"""Exceptions that are not `Exception`s never leave the agent stuck (specs/runtime.md RT18), and
bounded waits (RT19)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from machine.errors import ValidationError
from machine.events import Event
from machine.jsonvalue import thaw
from machine.payloads import TurnEndData
from machine.runtime import (
    Agent,
    AgentTimeoutError,
    Chunk,
    ModelCall,
    ScriptedModel,
    StepContext,
    Tool,
    ToolCall,
    calls_reply,
    text_reply,
)


class Stop(BaseException):
    """A BaseException of the user's own."""


def _tool_model() -> ScriptedModel:
    return ScriptedModel([calls_reply(("c1", "boom", "{}")), text_reply("after")])


async def _tool_running(agent: Agent) -> None:
    """Prompt *agent* and return once its tool body has started."""
    started = asyncio.Event()
    agent.on("tool/call", lambda e: started.set())
    agent.followup("go")
    await asyncio.wait_for(started.wait(), 30)
    await asyncio.sleep(0)                          # the body's task has begun


def _reasons(events: list[Event]) -> list[str]:
    return [e.data_as(TurnEndData).reason.kind for e in events if e.type == "turn/end"]


def _tool_result_text(events: list[Event]) -> str:
    """The text of the first tool/result: a failing tool stage is an error result (R10.12)."""
    result = next(e for e in events if e.type == "tool/result")
    return str(thaw(result.data["message"])["content"][0]["content"][0]["text"])


def _error_text(events: list[Event]) -> str:
    reason = next(e.data_as(TurnEndData).reason for e in events if e.type == "turn/end")
    return str(reason.message)


@pytest.mark.parametrize("where", ["tool", "hook", "model"])
@pytest.mark.parametrize("exit_", [KeyboardInterrupt, SystemExit])
def test_RT18_an_exit_from_work_fails_its_turn_propagates_and_teardown_completes(
        exit_: type[BaseException], where: str) -> None:
    async def boom(call: ToolCall) -> str:
        raise exit_("stop now")

    async def step(context: StepContext) -> None:
        raise exit_("stop now")

    async def stream(call: ModelCall) -> AsyncIterator[Chunk]:
        yield {"type": "text", "text": "x"}
        raise exit_("stop now")

    agent = Agent(ScriptedModel([stream]) if where == "model" else _tool_model(),
                  tools=[Tool("boom", boom)])
    if where == "hook":
        agent.hooks.step.use(step)

    async def main() -> None:
        async with agent:
            agent.followup("go")
            await agent.when_idle()

    with pytest.raises(exit_):
        asyncio.run(main())
    events = list(agent.session.events)
    assert agent.disposed                       # asyncio.run's shutdown ran the async with
    if where == "tool":      # the stage's failure is the call's error result (R10.12)
        assert _tool_result_text(events) == "Error: stop now"
        assert _reasons(events) == ["disposed"]
    else:
        assert _reasons(events) == ["error"] and "stop now" in _error_text(events)


@pytest.mark.parametrize("where", ["tool", "hook", "model"])
def test_RT18_other_base_exceptions_are_contained_as_the_effects_error(where: str) -> None:
    async def body(call: ToolCall) -> str:
        raise Stop("tool stopped")

    async def step(context: StepContext) -> None:
        raise GeneratorExit("hook stopped")

    async def stream(call: ModelCall) -> AsyncIterator[Chunk]:
        yield {"type": "text", "text": "x"}
        raise Stop("model stopped")

    model = ScriptedModel([stream]) if where == "model" else _tool_model()
    agent = Agent(model, tools=[Tool("boom", body)])
    if where == "hook":
        agent.hooks.step.use(step)

    async def main() -> list[Event]:
        async with agent:
            agent.followup("go")
            await agent.when_idle(timeout=30)
            agent.followup("again")                 # the agent goes on
            await agent.when_idle(timeout=30)
            return list(agent.session.events)
    events = asyncio.run(main())
    if where == "tool":      # the stage's failure is the call's error result (R10.12)
        assert _tool_result_text(events) == "Error: tool stopped"
        assert _reasons(events)[0] == "completed"
    else:
        assert _reasons(events)[0] == "error"
        assert f"{where} stopped" in _error_text(events)
    assert len(_reasons(events)) == 2


def test_RT18_a_listeners_interrupt_reaches_the_command_after_the_delivery_completes() -> None:
    seen: list[str] = []

    def interrupting(event: Event) -> None:
        seen.append("first")
        raise KeyboardInterrupt

    async def main() -> list[Event]:
        agent = Agent(ScriptedModel([text_reply("hi")]))
        async with agent:
            await agent.when_idle()
            stop = agent.on("user/message", interrupting)
            agent.on("user/message", lambda e: seen.append("second"))
            with pytest.raises(KeyboardInterrupt):
                agent.inject("context")             # appended at once: its delivery raises
            assert seen == ["first", "second"]      # the output was delivered completely
            stop()
            agent.followup("go on")
            await agent.when_idle(timeout=30)
            return list(agent.session.events)
    events = asyncio.run(main())
    assert _reasons(events) == ["completed"]
    assert [e.type for e in events][:2] == ["user/message", "turn/start"]


def test_RT18_an_interrupt_leaving_asyncio_run_leaves_an_agent_that_a_new_loop_disposes() -> None:
    agent_box: list[Agent] = []

    async def first() -> None:
        agent = Agent(ScriptedModel([text_reply("hi")]))
        agent_box.append(agent)

        def interrupting(event: Event) -> None:
            raise KeyboardInterrupt
        agent.on("step/start", interrupting)
        agent.followup("go")                        # no `async with`: nothing disposes it
        await agent.when_idle()

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(first())
    agent = agent_box[0]
    disposed = agent.disposed  # a local: mypy would keep agent.disposed narrowed below
    assert not disposed

    async def second() -> None:
        await agent.dispose(timeout=30)
    asyncio.run(second())
    assert agent.disposed
    assert _reasons(list(agent.session.events)) in (["completed"], ["disposed"], ["error"])


def test_RT18_an_exit_from_an_abort_listener_lets_every_abort_listener_run() -> None:
    ran: list[str] = []

    async def waits(call: ToolCall) -> str:
        def first(_cause: object) -> None:
            ran.append("first")
            _raise()
        call.signal.add_listener(first)
        call.signal.add_listener(lambda cause: ran.append("second"))
        await call.signal.wait()
        ran.append("woken")
        return "stopped"

    def _raise() -> None:
        raise SystemExit(3)

    async def main() -> list[Event]:
        agent = Agent(ScriptedModel([calls_reply(("c1", "wait", "{}"))]),
                      tools=[Tool("wait", waits)])
        async with agent:
            await _tool_running(agent)
            with pytest.raises(SystemExit):
                agent.cancel()
            await agent.when_idle(timeout=30)
            return list(agent.session.events)
    events = asyncio.run(main())
    assert ran == ["first", "second", "woken"]
    assert _reasons(events) == ["aborted"]


def test_RT18_a_task_cancelled_from_outside_fails_its_effect_with_cancelled() -> None:
    async def main() -> list[Event]:
        gate = asyncio.Event()

        async def slow(call: ToolCall) -> str:
            await gate.wait()
            return "never"

        agent = Agent(ScriptedModel([calls_reply(("c1", "slow", "{}")), text_reply("x")]),
                      tools=[Tool("slow", slow)])
        async with agent:
            await _tool_running(agent)
            tasks = [t for t in asyncio.all_tasks() if "tool-execute" in t.get_name()]
            assert len(tasks) == 1
            tasks[0].cancel()                       # a host cancels the work
            await agent.when_idle(timeout=30)
            return list(agent.session.events)
    events = asyncio.run(main())
    # the tool stage's failure (CANCELLED) is the call's error result (R10.12); the turn goes on
    assert "the work's task was cancelled" in _tool_result_text(events)
    assert _reasons(events) == ["completed"]


# --------------------------------------------------------------------------
# RT19: bounded waits
# --------------------------------------------------------------------------


def _stubborn(swallow: bool) -> Tool:
    async def ignores_its_signal(call: ToolCall) -> str:
        forever = asyncio.Event()
        while True:
            try:
                await forever.wait()
            except asyncio.CancelledError:
                if not swallow:
                    raise
    return Tool("stubborn", ignores_its_signal)


def test_RT19_when_idle_times_out_naming_the_work_and_changes_nothing() -> None:
    async def main() -> None:
        agent = Agent(ScriptedModel([calls_reply(("c1", "stubborn", "{}"))]),
                      tools=[_stubborn(swallow=False)])
        async with agent:
            agent.followup("go")
            with pytest.raises(AgentTimeoutError) as caught:
                await agent.when_idle(timeout=0.05)
            assert caught.value.code == "AGENT_TIMEOUT"
            assert any(p.startswith("tool-execute") and p.endswith("(stubborn)")
                       for p in caught.value.pending)
            assert isinstance(caught.value, TimeoutError)
            assert agent.status == "running"
            agent.cancel()                          # the tool ignores it: still running
            with pytest.raises(AgentTimeoutError):
                await agent.when_idle(timeout=0.05)
            await agent.dispose(timeout=0.05)       # cancels the stubborn work
            assert agent.disposed
    asyncio.run(main())


def test_RT19_dispose_with_a_timeout_cancels_work_that_ignores_its_signal(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> list[Event]:
        agent = Agent(ScriptedModel([calls_reply(("c1", "stubborn", "{}"))]),
                      tools=[_stubborn(swallow=False)])
        agent.followup("go")
        await asyncio.sleep(0.01)
        with caplog.at_level(logging.WARNING, logger="turnstile"):
            await agent.dispose(timeout=0.05)
        return list(agent.session.events)
    events = asyncio.run(main())
    assert _reasons(events) == ["disposed"]
    assert "cancelling the work still running: tool-execute" in caplog.text


def test_RT19_dispose_raises_when_the_work_swallows_its_cancellation_too() -> None:
    async def main() -> None:
        agent = Agent(ScriptedModel([calls_reply(("c1", "stubborn", "{}"))]),
                      tools=[_stubborn(swallow=True)])
        agent.followup("go")
        await asyncio.sleep(0.01)
        with pytest.raises(AgentTimeoutError, match="dispose"):
            await agent.dispose(timeout=0.05)
        assert not agent.disposed and agent.core.disposing
        for task in asyncio.all_tasks():
            if "tool-execute" in task.get_name():
                task.get_coro().close()             # end the stubborn coroutine for the test
    asyncio.run(main())


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), True, "1"])
def test_RT19_a_timeout_must_be_a_positive_finite_number(timeout: object) -> None:
    async def main() -> None:
        agent = Agent(ScriptedModel())
        with pytest.raises(ValidationError, match="timeout"):
            agent.when_idle(timeout=timeout)  # type: ignore[arg-type]
        with pytest.raises(ValidationError, match="timeout"):
            agent.dispose(timeout=timeout)  # type: ignore[arg-type]
        await agent.dispose()
    asyncio.run(main())
