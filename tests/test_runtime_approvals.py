"""Approvals (specs/runtime.md RT25): a call of a tool that requires approval is held until the
application approves or denies it; pending approvals are listed and announced, durable in the
session log, and offered again after a crash and resume (a writer killed with SIGKILL while an
approval is pending, then resumed and approved); how approval composes with cancel, steer,
inject, dispose and the batch's other calls."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from scenario_helpers import at, obj

from machine.errors import ValidationError
from machine.events import Event
from machine.log import SessionLog
from machine.runtime import (
    Agent,
    ApprovalError,
    PersistentSession,
    ScriptedModel,
    Tool,
    ToolCall,
    calls_reply,
    text_reply,
    tool,
)
from machine.runtime.adapters.fake_server import FakeServer, openai_text
from machine.runtime.adapters.openai import OpenAIChat
from machine.store import JsonlStore
from machine.store.repair import closers

REPO = Path(__file__).resolve().parent.parent


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))


class Deploys:
    """A tool that records what it ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    async def body(self, call: ToolCall) -> str:
        self.ran.append(call.call_id)
        return f"deployed {call.arguments}"


def results(events: tuple[Event, ...] | list[Event]) -> list[tuple[str, str, str | None]]:
    """(call id, text, error code) of each tool result, in log order."""
    out = []
    for event in events:
        if event.type == "tool/result":
            block = obj(at(event.data, "message", "content", 0))
            error = event.data.get("error")
            out.append((str(block["toolCallId"]), str(at(block, "content", 0, "text")),
                        str(obj(error)["code"]) if error else None))
    return out


def decisions(events: tuple[Event, ...] | list[Event]) -> list[tuple[str, str, str | None]]:
    return [(str(e.data["callId"]), str(e.data["decision"]),
             None if e.data.get("reason") is None else str(e.data["reason"]))
            for e in events if e.type == "approval/decision"]


async def until(predicate: Callable[[], bool]) -> None:
    """Let the loop run until *predicate* holds (a bounded number of passes)."""
    for _ in range(10_000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def test_RT25_a_call_is_held_announced_and_listed_until_approved() -> None:
    async def main() -> None:
        deploys = Deploys()
        model = ScriptedModel([calls_reply(("c1", "deploy", '{"env": "prod"}')),
                               text_reply("done")])
        async with Agent(model, tools=[Tool("deploy", deploys.body, requires_approval=True)]
                         ) as agent:
            announced: list[Event] = []
            agent.on("approval/request", announced.append)
            running = asyncio.ensure_future(agent.run("deploy to prod"))
            await until(lambda: bool(agent.approvals))
            (approval,) = agent.approvals
            assert (approval.call_id, approval.name, approval.arguments) == (
                "c1", "deploy", {"env": "prod"})
            assert (approval.turn, approval.step, approval.resumed) == (1, 1, False)
            assert [e.seq for e in announced] == [approval.seq]
            assert announced[0].data == {"turn": 1, "step": 1, "callId": "c1", "name": "deploy",
                                         "arguments": {"env": "prod"}}
            types = [e.type for e in agent.session.events]
            assert types[types.index("assistant/message") + 1] == "approval/request"
            for _ in range(100):
                await asyncio.sleep(0)
            assert deploys.ran == [] and not running.done()     # held at its prepare
            agent.approve("c1")
            result = await running
            assert deploys.ran == ["c1"] and result.output == "done"
            assert agent.approvals == ()
            assert decisions(result.events) == [("c1", "approved", None)]
            assert results(result.events) == [("c1", "deployed {'env': 'prod'}", None)]
    run(main)


def test_RT25_a_denied_call_is_an_error_result_the_model_reads() -> None:
    async def main() -> None:
        deploys = Deploys()
        model = ScriptedModel([calls_reply(("c1", "deploy")), text_reply("ok, not deploying")])
        async with Agent(model, tools=[Tool("deploy", deploys.body, requires_approval=True)]
                         ) as agent:
            agent.on("approval/request",           # decided at once, from the listener
                     lambda e: agent.deny(str(e.data["callId"]), "not on a Friday"))
            result = await agent.run("deploy")
            assert deploys.ran == []
            assert results(result.events) == [
                ("c1", "Error: the tool call was denied: not on a Friday", "TOOL_CALL_DENIED")]
            assert decisions(result.events) == [("c1", "denied", "not on a Friday")]
            last = model.calls[-1].messages[-1]
            assert at(last.content[0], "content", 0, "text") == (
                "Error: the tool call was denied: not on a Friday")
    run(main)


def test_RT25_a_policy_decides_per_call_and_a_failing_policy_asks(
        caplog: pytest.LogCaptureFixture) -> None:
    def risky(call: ToolCall) -> bool:
        if call.arguments == {"env": "broken"}:
            raise RuntimeError("policy bug")
        return call.arguments == {"env": "prod"}

    async def main() -> None:
        deploys = Deploys()
        model = ScriptedModel([calls_reply(("c1", "deploy", '{"env": "dev"}'),
                                           ("c2", "deploy", '{"env": "prod"}'),
                                           ("c3", "deploy", '{"env": "broken"}')),
                               text_reply("ok")])
        async with Agent(model, tools=[Tool("deploy", deploys.body, requires_approval=risky)]
                         ) as agent:
            agent.on("approval/request", lambda e: agent.approve(str(e.data["callId"])))
            result = await agent.run("deploy")
            asked = [e.data["callId"] for e in result.events if e.type == "approval/request"]
            assert asked == ["c2", "c3"] and deploys.ran == ["c1", "c2", "c3"]
    with caplog.at_level(logging.WARNING, logger="turnstile"):
        run(main)
    assert "the approval policy of tool 'deploy' raised (approval asked): policy bug" in caplog.text


def test_RT25_a_typed_call_with_invalid_arguments_is_not_asked_for() -> None:
    @tool(requires_approval=True)
    async def deploy(env: str) -> str:
        return f"deployed {env}"

    async def main() -> None:
        model = ScriptedModel([calls_reply(("c1", "deploy", '{"env": 3}')), text_reply("ok")])
        async with Agent(model, tools=[deploy]) as agent:
            result = await agent.run("deploy")
            assert not [e for e in result.events if e.type.startswith("approval/")]
            assert results(result.events)[0][2] == "INVALID_TOOL_ARGUMENTS"
    run(main)


def test_RT25_the_batch_waits_in_model_order_and_its_results_stay_adjacent() -> None:
    async def main() -> None:
        deploys = Deploys()

        async def check(call: ToolCall) -> str:
            deploys.ran.append(call.call_id)
            return "checked"
        model = ScriptedModel([calls_reply(("a", "deploy"), ("b", "check"), ("c", "deploy")),
                               text_reply("ok")])
        tools = [Tool("deploy", deploys.body, "parallel", requires_approval=True),
                 Tool("check", check, "parallel")]
        async with Agent(model, tools=tools) as agent:
            running = asyncio.ensure_future(agent.run("go"))
            await until(lambda: len(agent.approvals) == 2)      # both asked at once
            agent.approve("c")                                  # decided before a is
            for _ in range(100):
                await asyncio.sleep(0)
            assert deploys.ran == []            # a holds the batch: prepares run in order
            agent.approve("a")
            result = await running
            assert deploys.ran == ["a", "b", "c"]
            assert [r[0] for r in results(result.events)] == ["a", "b", "c"]
            types = [e.type for e in result.events]
            batch = types[types.index("assistant/message") + 1:types.index("step/end")]
            assert set(batch) == {"approval/request", "approval/decision", "tool/call",
                                  "tool/result"}
    run(main)


def test_RT25_a_cancel_while_pending_cancels_the_approvals_and_the_calls() -> None:
    async def main() -> None:
        deploys = Deploys()
        model = ScriptedModel([calls_reply(("a", "deploy"), ("b", "deploy"))])
        async with Agent(model, tools=[Tool("deploy", deploys.body, requires_approval=True)]
                         ) as agent:
            running = asyncio.ensure_future(agent.run("go"))
            await until(lambda: len(agent.approvals) == 2)
            agent.cancel()
            result = await running
            assert result.outcome == "aborted" and deploys.ran == []
            assert agent.approvals == ()
            assert decisions(result.events) == [("a", "cancelled", "the turn was cancelled"),
                                                ("b", "cancelled", "the turn was cancelled")]
            assert [r[2] for r in results(result.events)] == ["ABORTED_BEFORE_DISPATCH"] * 2
            with pytest.raises(ApprovalError):
                agent.approve("a")
    run(main)


def test_RT25_steering_and_context_sent_while_pending_wait_for_the_batch() -> None:
    async def main() -> None:
        deploys = Deploys()
        model = ScriptedModel([calls_reply(("c1", "deploy")), text_reply("ok")])
        async with Agent(model, tools=[Tool("deploy", deploys.body, requires_approval=True)]
                         ) as agent:
            running = asyncio.ensure_future(agent.run("go"))
            await until(lambda: bool(agent.approvals))
            steered = agent.steer("also check the logs")
            injected = agent.inject("the build is green")
            assert steered.fate.waiting == injected.fate.waiting == "staged"
            for _ in range(100):
                await asyncio.sleep(0)
            assert agent.approvals and deploys.ran == []       # the approval is not skipped
            agent.approve("c1")
            result = await running
            types = [e.type for e in result.events]
            assert types.index("tool/result") < types.index("steering/message")
            assert steered.fate.kind == injected.fate.kind == "delivered"
            assert steered.fate.step == injected.fate.step == 2
    run(main)


def test_RT25_dispose_while_pending_cancels_the_approval_and_completes() -> None:
    async def main() -> None:
        deploys = Deploys()
        agent = Agent(ScriptedModel([calls_reply(("c1", "deploy"))]),
                      tools=[Tool("deploy", deploys.body, requires_approval=True)])
        async with agent:
            running = asyncio.ensure_future(agent.run("go"))
            await until(lambda: bool(agent.approvals))
        result = await running
        assert result.outcome == "disposed" and deploys.ran == []
        assert decisions(list(agent.session.events)) == [("c1", "cancelled",
                                                          "the turn was disposed")]
    run(main)


def test_RT25_deciding_what_is_not_pending_is_refused() -> None:
    async def main() -> None:
        deploys = Deploys()
        model = ScriptedModel([calls_reply(("c1", "deploy")), text_reply("ok")])
        async with Agent(model, tools=[Tool("deploy", deploys.body, requires_approval=True)]
                         ) as agent:
            with pytest.raises(ApprovalError, match="no pending approval for tool call 'x'"):
                agent.approve("x")
            running = asyncio.ensure_future(agent.run("go"))
            await until(lambda: bool(agent.approvals))
            with pytest.raises(ValidationError, match="reason"):
                agent.deny("c1", 42)  # type: ignore[arg-type]
            agent.approve("c1")
            with pytest.raises(ApprovalError):
                agent.approve("c1")
            await running
    run(main)


def test_RT25_a_pending_request_is_durable_before_the_decision() -> None:
    async def main(root: Path) -> None:
        deploys = Deploys()
        with JsonlStore(root) as store:
            store.create("s")
            model = ScriptedModel([calls_reply(("c1", "deploy")), text_reply("ok")])
            async with Agent(model, tools=[Tool("deploy", deploys.body, requires_approval=True)],
                             sink=PersistentSession(store, "s")) as agent:
                running = asyncio.ensure_future(agent.run("go"))
                await until(lambda: bool(agent.approvals))
                with JsonlStore(root) as other:             # what is on disk now
                    on_disk = [e.type for e in other.inspect("s").events]
                assert "approval/request" in on_disk
                agent.approve("c1")
                await running
            store.release("s")

    with tempfile.TemporaryDirectory() as root:
        run(lambda: main(Path(root)))


WRITER = textwrap.dedent("""
    import asyncio, sys
    from machine.runtime import Agent, ScriptedModel, Tool, calls_reply

    async def deploy(call):
        raise SystemExit("the killed writer never runs the tool")

    async def main():
        model = ScriptedModel([calls_reply(("call_1", "deploy", '{"env": "prod"}'))])
        agent = Agent.resume(JsonlStore(sys.argv[1]), "s", model, create=True,
                             tools=[Tool("deploy", deploy, requires_approval=True)])
        agent.on("approval/request", lambda e: print("PENDING", flush=True))
        async with agent:
            agent.followup("deploy to prod")
            await asyncio.Event().wait()          # wait for a decision that never comes

    from machine.store import JsonlStore
    asyncio.run(main())
""")


def test_RT25_kill_9_while_pending_then_resume_offers_it_again_and_approving_runs_it(
        tmp_path: Path) -> None:
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "PENDING\n", writer.stderr.read() if writer.stderr else ""
    finally:
        os.kill(writer.pid, signal.SIGKILL)          # no cleanup, no final flush
        writer.wait(timeout=60)
    assert writer.returncode == -signal.SIGKILL

    async def main() -> None:
        deploys = Deploys()
        replies = [openai_text("deployed, all green"), openai_text("hello again")]
        async with FakeServer(replies) as server:
            model = OpenAIChat("fake-model", base_url=server.openai_base_url, provider="fakeai")
            with JsonlStore(tmp_path) as store:
                agent = Agent.resume(store, "s", model,
                                     tools=[Tool("deploy", deploys.body, requires_approval=True)])
                assert agent.load_report is not None and agent.load_report.closers_appended == 3
                (approval,) = agent.approvals
                assert (approval.call_id, approval.arguments, approval.resumed) == (
                    "call_1", {"env": "prod"}, True)
                offered: list[Event] = []
                async with agent:
                    agent.on("approval/request", offered.append)
                    other = await agent.run("say hello")       # never blocked by the approval
                    assert other.output == "deployed, all green"
                    assert [e.data.get("reoffer") for e in offered] == [True]
                    assert agent.approvals[0].seq == offered[0].seq
                    agent.approve("call_1")
                    await agent.when_idle(timeout=30)
                    events = list(agent.session.events)
            requests = [r.json for r in server.requests]
        assert deploys.ran == ["call_1"] and agent.approvals == ()
        # the repair answers the held call as not started or of unknown outcome, depending on
        # whether its tool/call reached the file before the kill (S12); it never ran
        repaired = [e for e in events if e.type == "tool/result"]
        assert obj(repaired[0].data["error"])["code"] in ("TOOL_NOT_STARTED",
                                                          "TOOL_OUTCOME_UNKNOWN")
        assert decisions(events) == [("call_1", "approved", None)]
        last = requests[-1]["messages"]
        # the history a provider gets: no orphan tool output, the approved result as a message
        assert [(m["role"], m.get("tool_call_id")) for m in last] == [
            ("user", None), ("assistant", None), ("tool", "call_1"), ("user", None),
            ("assistant", None), ("user", None)]
        assert last[-1]["content"].startswith("[context from plugin:approvals]\nThe tool call "
                                              "call_1 to deploy with arguments {\"env\":\"prod\"}")
        assert last[-1]["content"].endswith("Its result:\ndeployed {'env': 'prod'}")
        turns = [e.data["turn"] for e in events if e.type == "turn/start"]
        assert turns == [1, 2, 3]
    run(main)


def test_RT25_a_resumed_approval_denied_reaches_the_model_as_context(tmp_path: Path) -> None:
    async def main() -> None:
        deploys = Deploys()
        with JsonlStore(tmp_path) as store:
            store.create("s")
            model = ScriptedModel([calls_reply(("c1", "deploy"))])
            first = Agent(model, tools=[Tool("deploy", deploys.body, requires_approval=True)],
                          sink=PersistentSession(store, "s"))
            async with first:
                first.followup("go")
                await until(lambda: bool(first.approvals))
                seeded = list(first.session.events)       # the session as a crash left it
                first.cancel()                            # (this agent goes away cleanly)
        tail = seeded[:[e.type for e in seeded].index("approval/request") + 1]
        log = SessionLog([*tail, *closers(tail)])
        second = Agent(ScriptedModel([text_reply("noted")]), session=log,
                       session_start="resume",
                       tools=[Tool("deploy", deploys.body, requires_approval=True)])
        async with second:
            assert [a.call_id for a in second.approvals] == ["c1"]
            second.deny("c1", "too risky")
            await second.when_idle()
            events = list(second.session.events)
        assert deploys.ran == [] and second.approvals == ()
        context = [e for e in events if e.type == "user/message"][-1]
        assert context.data["source"] == {"kind": "plugin", "plugin": "approvals"}
        assert str(at(context.data, "content", 0, "text")).endswith("was denied: too risky.")
    run(main)
