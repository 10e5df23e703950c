"""A message's fate (specs/runtime.md RT26): for every accepted message, what became of it —
delivered at turn T step S, a queued prompt, appended between turns, rejected at admission, or
discarded by a cancel or dispose — as a query on the agent and an awaitable, read off the
core's outputs. (The hostile-input and differential tests check the fates against the R20.1
ledger: tests/fate_checks.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from machine.checking.scripted import Driver, ScriptedEnvironment
from machine.core import AgentCore
from machine.events import Event, LiveEvent
from machine.runtime import (
    Agent,
    Block,
    Hang,
    MessageFate,
    PromptSubmit,
    ScriptedModel,
    Sent,
    StepContext,
    Tool,
    ToolCall,
    ToolResult,
    TurnStopping,
    calls_reply,
    text_reply,
    user_message,
)
from machine.runtime.fates import FateLedger
from machine.runtime.hooks import Next
from machine.vocabulary import FOLLOWUP, PromptDecision


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))


def where(fate: MessageFate | None) -> tuple[object, ...]:
    assert fate is not None
    return (fate.route, fate.kind, fate.turn, fate.step)


def test_RT26_a_prompt_goes_from_queued_to_delivered_at_its_turns_first_step() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            seen: list[str | None] = []
            sent = agent.followup("hi")
            assert (sent.fate.kind, sent.fate.waiting) == ("pending", "queued")
            agent.on("agent/inbox/dequeue", lambda e: seen.append(sent.fate.waiting))
            agent.on("turn/start", lambda e: seen.append(sent.fate.waiting))
            agent.on("user/message", lambda e: seen.append(sent.fate.waiting))
            fate = await sent.wait()
            assert seen == ["admitting", "admitting", "in-log"]
            assert where(fate) == ("prompt", "delivered", 1, 1) and fate.seq == 1
            assert agent.fate(sent.id) == fate and fate.describe() == "delivered in turn 1, step 1"
    run(main)


def test_RT26_steering_and_context_are_delivered_at_the_step_whose_request_carries_them() -> None:
    async def main() -> None:
        async def slow(call: ToolCall) -> str:
            return "done"
        model = ScriptedModel([calls_reply(("c1", "work")), text_reply("ok")])
        async with Agent(model, tools=[Tool("work", slow)]) as agent:
            sent: dict[str, Sent] = {}

            async def at_step(context: StepContext) -> None:
                if context.step == 1:
                    sent["steer"] = agent.steer("go faster")          # top-of-step drain
                    sent["inject"] = agent.inject("cwd is /tmp")
            agent.hooks.step.use(at_step)

            def at_call(event: Event) -> None:
                sent["mid"] = agent.inject("the build is green")   # after the batch: step 2
            agent.on("tool/call", at_call)
            await agent.run("work")
            fates = {name: agent.fate(s.id) for name, s in sent.items()}
            assert where(fates["steer"]) == ("steering", "delivered", 1, 1)
            assert where(fates["inject"]) == ("context", "delivered", 1, 1)
            assert where(fates["mid"]) == ("context", "delivered", 1, 2)
            # the model saw each at that step's request
            assert [m.text for m in model.calls[0].messages][-2:] == ["go faster", "cwd is /tmp"]
            assert model.calls[1].messages[-1].text == "the build is green"
    run(main)


def test_RT26_a_direct_steering_append_at_the_dequeue_leaves_the_steer_its_own_record() -> None:
    """An observer of a steering item's dequeue appends a steering/message of its own (R20.2,
    allowed while busy): the steer's fate is still decided by its own record, which follows
    (found by the differential test's fate check: the direct record had taken its place,
    and the steer stayed pending)."""
    async def main() -> None:
        async with Agent(ScriptedModel([text_reply("ok")])) as agent:
            sent: dict[str, Sent] = {}

            async def at_step(context: StepContext) -> None:
                if context.step == 1:
                    sent["steer"] = agent.steer("go faster")          # top-of-step drain

            def at_dequeue(event: Event | LiveEvent) -> None:
                if isinstance(event, LiveEvent) and event.payload.get("placement") == "steering":
                    agent.append("steering/message", {"turn": 1, "message": {
                        "id": "ext-1", "role": "user", "content": [{"type": "text", "text": "ext"}],
                        "source": {"kind": "plugin", "plugin": "ext"}}}, surface_op="append")
                    appended.append(True)
            appended: list[bool] = []
            agent.hooks.step.use(at_step)
            agent.on("agent/inbox/dequeue", at_dequeue)
            await agent.run("work")
            assert appended == [True]
            assert where(agent.fate(sent["steer"].id)) == ("steering", "delivered", 1, 1)
            assert agent.fate("ext-1") is None          # a direct append is not a fate
    run(main)


def test_RT26_context_after_the_last_request_is_delivered_with_no_step() -> None:
    async def main() -> None:
        model = ScriptedModel([text_reply("one"), text_reply("two")])
        async with Agent(model) as agent:
            late: list[Sent] = []

            async def stopping(context: TurnStopping) -> None:
                late.append(agent.inject("noted after the answer"))   # turn-stopping drain
            agent.hooks.turn_stopping.use(stopping)
            await agent.run("first")
            fate = agent.fate("user-2")
            assert where(fate) == ("context", "delivered", 1, None)
            assert fate is not None and fate.describe() == (
                "delivered in turn 1, after its last request")
            await agent.run("second")        # ... the model reads it at the next turn
            assert "noted after the answer" in [m.text for m in model.calls[1].messages]
    run(main)


def test_RT26_an_inject_while_idle_is_appended_at_once() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            sent = agent.inject("cwd is /home")
            assert (sent.fate.route, sent.fate.kind, sent.fate.turn, sent.fate.seq) == (
                "context", "appended", None, 0)
            assert (await sent.wait()).describe() == "appended between turns"
    run(main)


def test_RT26_a_steer_while_the_window_is_closed_becomes_a_prompt_of_its_own() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            sent = agent.steer("are you there?")
            assert (sent.fate.route, sent.fate.waiting) == ("prompt", "queued")
            assert where(await sent.wait()) == ("prompt", "delivered", 1, 1)
    run(main)


def test_RT26_rejected_prompts_say_why() -> None:
    async def main() -> None:
        async def gate(submit: PromptSubmit, next: Next[PromptDecision]) -> PromptDecision:
            text = submit.message.text
            if text == "block":
                return Block("not allowed")
            if text == "raise":
                raise ValueError("policy down")
            if text == "nonsense":
                return {"kind": "perhaps"}  # type: ignore[return-value]
            return await next()
        async with Agent(ScriptedModel()) as agent:
            agent.hooks.prompt_submit.use(gate)
            blocked, raised, invalid = (agent.followup(t) for t in ("block", "raise", "nonsense"))
            await agent.when_idle()
            assert (blocked.fate.rejection, blocked.fate.detail) == ("blocked", "not allowed")
            assert (raised.fate.rejection, raised.fate.detail) == ("failed", "policy down")
            assert invalid.fate.rejection == "invalid" and "perhaps" in str(invalid.fate.detail)
            assert {f.kind for f in (blocked.fate, raised.fate, invalid.fate)} == {"rejected"}
    run(main)


def test_RT26_cancel_and_dispose_discard_with_their_cause() -> None:
    async def main() -> None:
        agent = Agent(ScriptedModel([Hang(), Hang()]))
        async with agent:
            busy = agent.followup("busy")
            while agent.status != "running" or not agent.accepts_next_step:
                await asyncio.sleep(0)
            queued = agent.followup("queued")
            steered = agent.steer("steered")
            injected = agent.inject("injected")
            agent.cancel()
            for sent in (queued, steered, injected):
                assert sent.fate.kind == "discarded"
                assert sent.fate.cause is not None and sent.fate.cause.kind == "user"
            await agent.when_idle()
            assert where(busy.fate) == ("prompt", "delivered", 1, 1)   # its turn ran, aborted
            agent.followup("again")
            quiet = agent.send("quiet", target="next-turn", wakeup=False)
            while agent.status != "running":
                await asyncio.sleep(0)
        assert quiet.fate.kind == "discarded"
        assert quiet.fate.cause is not None and quiet.fate.cause.kind == "disposed"
    run(main)


def test_RT26_input_retained_by_a_turn_is_delivered_by_the_next_one() -> None:
    async def main() -> None:
        async def finish(call: ToolCall) -> ToolResult:
            return ToolResult.from_json({"content": [{"type": "text", "text": "done"}],
                                         "concludesTurn": True})
        model = ScriptedModel([calls_reply(("c1", "finish")), text_reply("next")])
        async with Agent(model, tools=[Tool("finish", finish)]) as agent:
            retained: list[Sent] = []

            def at_step_end(event: Event) -> None:
                if event.data.get("turn") == 1:
                    retained.append(agent.steer("one more thing"))   # R11.3: retained
            agent.on("step/end", at_step_end)
            await agent.run("first")
            fate = agent.fate("user-2")
            assert fate is not None and (fate.kind, fate.waiting) == ("pending", "staged")
            await agent.run("second")
            assert where(agent.fate("user-2")) == ("steering", "delivered", 2, 1)
    run(main)


def test_RT26_every_acceptance_of_one_id_has_its_own_fate_in_order() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            first = agent.followup(user_message("same", "one"))
            second = agent.followup(user_message("same", "two"))
            await agent.when_idle()
            assert [where(f) for f in agent.fates("same")] == [
                ("prompt", "delivered", 1, 1), ("prompt", "delivered", 2, 1)]
            assert first.fate.turn == 1 and second.fate.turn == 2
            assert agent.fate("same") == second.fate and agent.fate("unknown") is None
            assert len(agent.fates()) == 2
    run(main)


def test_RT26_contexts_from_tools_and_decisions_are_not_caller_messages() -> None:
    async def main() -> None:
        async def noting(call: ToolCall) -> ToolResult:
            return ToolResult.from_json({"content": [{"type": "text", "text": "ok"}],
                                         "additionalContexts": [
                                             user_message("tool-ctx", "from the tool").to_json()]})
        model = ScriptedModel([calls_reply(("c1", "note")), text_reply("ok")])
        async with Agent(model, tools=[Tool("note", noting)]) as agent:
            await agent.run("go")
            assert agent.fate("tool-ctx") is None and [f.message_id for f in agent.fates()] == [
                "user-1"]
    run(main)


def test_RT26_decided_fates_are_remembered_boundedly_and_a_sent_keeps_its_own() -> None:
    core = AgentCore()
    ledger = FateLedger(core, keep=2)                 # sans-I/O: beside any driver
    driver = Driver(core, ScriptedEnvironment())
    driver.on(ledger.output)
    kept = []
    for index in range(4):
        message = user_message(f"m{index}", "hi")
        core.followup(message)
        kept.append(ledger.accept(message.id, FOLLOWUP, False))
        driver.run()
    assert [f.message_id for f in ledger.fates()] == ["m2", "m3"]
    assert ledger.fate("m0") is None and kept[0].view().kind == "delivered"


def test_RT26_the_bound_forgets_the_oldest_record_even_of_an_id_accepted_again() -> None:
    # The ledger keeps its decided records by id (a tuple for an id accepted more than
    # once) and forgets the oldest decided one first, whichever id it has.
    core = AgentCore()
    ledger = FateLedger(core, keep=2)
    driver = Driver(core, ScriptedEnvironment())
    driver.on(ledger.output)
    kept = []
    for message_id in ("a", "b", "a"):
        message = user_message(message_id, "hi")
        core.followup(message)
        kept.append(ledger.accept(message.id, FOLLOWUP, False))
        driver.run()
    assert [(f.message_id, f.turn) for f in ledger.fates()] == [("b", 2), ("a", 3)]
    assert [f.turn for f in ledger.fates("a")] == [3] and ledger.fate("b") == kept[1].view()
    assert kept[0].view().turn == 1          # a record handed out keeps its fate

    # Pending and decided records of one id come oldest first; a pending one is never
    # forgotten, however many decided ones follow it.
    core.followup(user_message("a", "queued"))
    held = ledger.accept("a", FOLLOWUP, False)          # not run: it stays queued
    assert [(f.kind, f.turn) for f in ledger.fates("a")] == [("delivered", 3), ("pending", None)]
    assert ledger.pending() == (held.view(),) and held.view().waiting == "queued"
    driver.run()
    assert [(f.kind, f.turn) for f in ledger.fates("a")] == [("delivered", 3), ("delivered", 4)]
    assert [f.message_id for f in ledger.fates()] == ["a", "a"] and ledger.pending() == ()
