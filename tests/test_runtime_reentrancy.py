"""Observers act in place through the runtime (reference §0.5, §19; specs/runtime.md RT2-RT6).

A listener runs synchronously at the output it observes, and a command it
issues takes effect at exactly that point: the runtime neither buffers nor
reorders outputs or commands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from scenario_helpers import at, string

from machine.events import Event
from machine.io import Control, Durable, Live, Output
from machine.runtime import (
    Agent,
    Hang,
    ScriptedModel,
    Signal,
    StepContext,
    calls_reply,
    text_reply,
)
from machine.runtime.tools import Tool, ToolCall
from machine.vocabulary import CancelCause


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))     # a hang fails instead of blocking the suite


def log(agent: Agent) -> list[str]:
    """The durable log as short tokens: TS1, UM'hi', STM1'x', SS1.1, TE1:completed ..."""
    out: list[str] = []
    for e in agent.session.events:
        d = e.data
        if e.type == "turn/start":
            out.append(f"TS{d['turn']}")
        elif e.type == "turn/end":
            out.append(f"TE{d['turn']}:{at(d, 'reason', 'kind')}")
        elif e.type == "user/message":
            out.append(f"UM'{at(d, 'content', 0, 'text')}'")
        elif e.type == "steering/message":
            out.append(f"STM{d['turn']}'{at(d, 'message', 'content', 0, 'text')}'")
        elif e.type in ("step/start", "step/end"):
            out.append(("SS" if e.type == "step/start" else "SE") + f"{d['turn']}.{d['step']}")
        elif e.type == "assistant/message":
            out.append("AM")
    return out


def output_name(output: Output) -> str:
    """An output's event type, or its kind (an effect's, a control's)."""
    return output.event.type if isinstance(output, (Durable, Live)) else output.kind


def test_steer_from_a_turn_end_listener_becomes_the_next_queued_prompt() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel([text_reply("one"), text_reply("two")])) as agent:
            placements: list[str] = []
            statuses: list[str] = []
            agent.on("agent/inbox/enqueue", lambda e: placements.append(string(e.payload["placement"])))
            agent.on("agent/status", lambda e: statuses.append(string(e.payload["status"])))

            def late(event: Event) -> None:
                if event.data["turn"] == 1:
                    assert not agent.accepts_next_step         # the window closed before turn/end
                    agent.steer("late steering")
            agent.on("turn/end", late)
            agent.followup("first")
            await agent.when_idle()
            assert placements == ["queued", "queued"]
            assert statuses == ["running", "idle"]             # no idle between the two turns
            assert log(agent) == ["TS1", "UM'first'", "SS1.1", "AM", "SE1.1", "TE1:completed",
                                  "TS2", "UM'late steering'", "SS2.1", "AM", "SE2.1",
                                  "TE2:completed"]
    run(main)


def test_inject_from_a_turn_end_listener_is_appended_right_after_turn_end() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            agent.on("turn/end", lambda e: agent.inject({
                "id": "ctx", "role": "user", "content": [{"type": "text", "text": "after"}],
                "source": {"kind": "plugin", "plugin": "p"}}))
            order: list[str] = []
            agent.on("*", lambda e: order.append(e.type))
            agent.followup("go")
            await agent.when_idle()
            end = next(e.seq for e in agent.session.events if e.type == "turn/end")
            assert agent.session.events[end + 1].data["id"] == "ctx"
            assert order[-2:] == ["turn/end", "user/message"]          # delivered in seq order
    run(main)


def test_cancel_from_a_turn_start_listener_still_records_the_prompt() -> None:
    async def main() -> None:
        model = ScriptedModel()
        async with Agent(model) as agent:
            agent.on("turn/start", lambda e: agent.cancel("user"))
            agent.followup("go")
            await agent.when_idle()
            assert log(agent) == ["TS1", "UM'go'", "TE1:aborted"]
            assert model.calls == []
    run(main)


def test_a_cancel_from_user_code_has_fully_taken_effect_when_it_returns() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel([Hang(({"type": "text", "text": "x"},))])) as agent:
            signals: list[Signal] = []
            streaming = asyncio.Event()

            async def step(context: StepContext) -> None:
                signals.append(context.signal)
            agent.hooks.step.use(step)
            agent.on("assistant/chunk", lambda e: streaming.set())
            seen: list[str] = []
            agent.observe(lambda o: seen.append(output_name(o)))
            agent.followup("go")
            agent.followup("queued tail")
            await streaming.wait()
            aborted_by: list[CancelCause] = []
            signals[0].add_listener(aborted_by.append)
            del seen[:]
            agent.cancel("user")
            assert seen == ["agent/cancel-requested", "agent/inbox/discard", "abort"]
            assert signals[0].aborted and aborted_by == [CancelCause("user")]
            assert agent.core.pending_queued == 0
            await agent.when_idle()
            assert log(agent)[-1] == "TE1:aborted"
    run(main)


def test_a_followup_from_an_abort_listener_survives_the_cancel() -> None:
    async def main() -> None:
        hang = Hang(({"type": "text", "text": "x"},))
        async with Agent(ScriptedModel([hang, text_reply("again")])) as agent:
            streaming = asyncio.Event()

            async def step(context: StepContext) -> None:
                if context.turn == 1:
                    context.signal.add_listener(lambda cause: agent.followup("retry it"))
            agent.hooks.step.use(step)
            agent.on("assistant/chunk", lambda e: streaming.set())
            agent.followup("go")
            await streaming.wait()
            agent.cancel("user")
            await agent.when_idle()
            assert log(agent) == ["TS1", "UM'go'", "SS1.1", "AM", "SE1.1", "TE1:aborted",
                                  "TS2", "UM'retry it'", "SS2.1", "AM", "SE2.1", "TE2:completed"]
    run(main)


def test_commands_from_a_listener_do_not_pump_reentrantly() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            order: list[str] = []

            def first(event: Event) -> None:
                order.append(f"first:{event.type}")
                if event.type == "turn/start":
                    agent.inject("staged at turn/start")
                    agent.append("x-note/mark", {"at": event.seq})
            agent.on("*", first)
            agent.on("*", lambda e: order.append(f"second:{e.type}"))
            agent.followup("go")
            await agent.when_idle()
            # every listener sees an event before any listener sees the next one
            assert order[:6] == ["first:turn/start", "second:turn/start",
                                 "first:x-note/mark", "second:x-note/mark",
                                 "first:user/message", "second:user/message"]
            assert log(agent)[:3] == ["TS1", "UM'go'", "UM'staged at turn/start'"]
    run(main)


def test_a_hook_command_takes_effect_where_the_hook_runs() -> None:
    """C5: a direct append from the step hook lands before step/start."""
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            async def step(context: StepContext) -> None:
                agent.append("x-note/mark", {"step": context.step})
            agent.hooks.step.use(step)
            agent.followup("go")
            await agent.when_idle()
            kinds = [e.type for e in agent.session.events]
            assert kinds.index("x-note/mark") == kinds.index("step/start") - 1
    run(main)


def test_cancel_from_an_assistant_message_listener_gives_synthetic_pairs() -> None:
    """D1: unstarted calls get aborted-before-dispatch pairs; no tool body runs."""
    async def main() -> None:
        ran: list[str] = []

        async def body(call: ToolCall) -> str:
            ran.append(call.call_id)
            return "ok"
        model = ScriptedModel([calls_reply(("c1", "t"), ("c2", "t"))])
        async with Agent(model, tools=[Tool("t", body)]) as agent:
            agent.on("assistant/message", lambda e: agent.cancel("user"))
            controls: list[Control] = []
            agent.observe(lambda o: controls.append(o) if isinstance(o, Control) else None)
            agent.followup("go")
            await agent.when_idle()
            results = [e.data for e in agent.session.events if e.type == "tool/result"]
            assert [at(r, "error", "code") for r in results] == ["ABORTED_BEFORE_DISPATCH"] * 2
            assert ran == [] and [c.kind for c in controls] == ["abort"]
    run(main)

