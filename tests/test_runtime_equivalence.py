"""The asyncio runtime adds no semantics (specs/runtime.md RT14).

Three proofs:

* reference scenarios (A1, B4, C1, C3, D5, E11, F1, F9) run twice: through the
  synchronous scripted `Driver` with a scripted environment, and through the
  asyncio `Agent` with equivalent scripted hooks, model, tools and store; the
  output sequences (JSON) are identical;
* every conformance vector under ``specs/conformance`` (and every script
  under ``specs/examples``) replayed through the runtime, with commands issued
  from the observer positions the vector names, gives exactly its outputs;
* random interleavings of commands and completions, recorded from the core
  as scripts, replay identically through the runtime.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from scenario_helpers import at

from machine.checking.scripted import HOLD, Driver, ScriptedEnvironment, calls_reply, ok_result
from machine.checking.testing import interleavings
from machine.cli.runner import load_script, parse_script
from machine.conformance.vectors import find_vectors
from machine.core import AgentCore, CoreConfig, ToolMode
from machine.io import Output
from machine.jsonvalue import thaw
from machine.runtime import (
    Agent,
    Hang,
    InMemorySink,
    ModelFailure,
    RetryPolicy,
    ScriptedModel,
    Tool,
    ToolCall,
    ToolResult,
    text_reply,
)
from machine.runtime.replay import check_vector, replay_script
from machine.runtime.signal import AbortError
from machine.vocabulary import CancelCause, ErrorInfo

ROOT = Path(__file__).resolve().parents[1]
CONFORMANCE = ROOT / "specs" / "conformance"
EXAMPLES = ROOT / "specs" / "examples"
SEED = {"provider": "test", "model": "test-model"}
USAGE = {"inputTokens": 3, "outputTokens": 2}


def msg(id_: str, text: str, plugin: str | None = None) -> dict[str, Any]:
    source = {"kind": "plugin", "plugin": plugin} if plugin else {"kind": "user"}
    return {"id": id_, "role": "user", "content": [{"type": "text", "text": text}],
            "source": source}


def as_json(outputs: list[Output]) -> list[dict[str, Any]]:
    return [o.to_json() for o in outputs]


def driver_for(*, tools: dict[str, ToolMode] | None = None, replies: list[Any] | None = None,
               advertise: list[dict[str, Any]] | None = None) -> Driver:
    """A core and scripted driver; *advertise* = the tool specs the runtime's header carries.
    Its request resolutions name the runtime's default retry policy, as the agent's do (RT16)."""
    core = AgentCore(CoreConfig(request_options=SEED, tool_modes=tools or {}))
    env = ScriptedEnvironment(replies=list(replies or []))
    extra: dict[str, Any] = {"tools": advertise} if advertise else {}
    env.handlers["request"] = lambda e: ("resolve", {"config": thaw(e.payload["config"]), **extra,
                                                     "retryPolicy": RetryPolicy().to_json()})
    return Driver(core, env)


def finish(driver: Driver) -> list[dict[str, Any]]:
    driver.core.dispose()
    driver.run()
    return as_json(driver.outputs)


def agent_run(scenario: Callable[[Agent], Any], model: ScriptedModel, **options: Any
              ) -> list[dict[str, Any]]:
    """Run *scenario(agent)* (a coroutine function) inside ``async with``; every output."""
    async def main() -> list[Output]:
        outputs: list[Output] = []
        agent = Agent(model, request_options=SEED, **options)
        agent.observe(outputs.append)
        async with agent:
            await scenario(agent)
            await agent.when_idle()
        return outputs
    return as_json(asyncio.run(main()))


# --------------------------------------------------------------------------
# Scenarios, twice
# --------------------------------------------------------------------------


def test_A1_simple_prompt_turn() -> None:
    d = driver_for(replies=[text_reply("hello there", usage=USAGE, pieces=2)])
    d.core.followup(msg("p1", "hi"))
    d.run()
    expected = finish(d)

    async def scenario(agent: Agent) -> None:
        agent.followup(msg("p1", "hi"))

    got = agent_run(scenario, ScriptedModel([text_reply("hello there", usage=USAGE, pieces=2)]))
    assert got == expected
    assert [o["type"] for o in got if o.get("type") == "agent/status"] == ["agent/status"] * 2


def test_B4_inject_and_steer_during_an_allowed_admission() -> None:
    d = driver_for()
    d.env.handlers["prompt-submit"] = lambda e: HOLD
    d.core.followup(msg("P", "admitted prompt"))
    d.run()
    d.core.inject(msg("C", "attached context", "test"))
    d.core.steer(msg("S", "admission steering"))
    d.resolve("prompt-submit", {"kind": "allow"})
    d.run()
    expected = finish(d)

    async def scenario(agent: Agent) -> None:
        entered = asyncio.Event()
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def slow(submit: Any, next_: Any) -> Any:
            entered.set()
            await gate
            return await next_()

        agent.hooks.prompt_submit.use(slow)
        agent.followup(msg("P", "admitted prompt"))
        await entered.wait()
        assert agent.status == "running" and agent.accepts_next_step and not agent.session
        agent.inject(msg("C", "attached context", "test"))
        agent.steer(msg("S", "admission steering"))
        gate.set_result(None)

    assert agent_run(scenario, ScriptedModel([text_reply("ok")])) == expected


def test_C1_steering_during_a_tool_call() -> None:
    spec = [{"name": "slow"}]
    replies = [calls_reply(("c1", "slow")), text_reply("addressed the steering")]
    d = driver_for(replies=replies, advertise=spec)
    core = d.core

    def body(effect: Any) -> Any:
        core.steer(msg("S", "change of plans"))
        return ("resolve", ok_result("tool done"))
    d.env.handlers["tool-execute"] = body
    core.followup(msg("P", "start"))
    d.run()
    expected = finish(d)

    holder: list[Agent] = []

    async def slow(call: ToolCall) -> str:
        holder[0].steer(msg("S", "change of plans"))
        return "tool done"

    async def scenario(agent: Agent) -> None:
        holder.append(agent)
        agent.followup(msg("P", "start"))

    got = agent_run(scenario, ScriptedModel(replies), tools=[Tool("slow", slow)])
    assert got == expected


def test_C3_tool_contexts_come_after_all_results() -> None:
    spec = [{"name": "echo"}]
    replies = [calls_reply(("c1", "echo"), ("c2", "echo")), text_reply("done")]
    d = driver_for(replies=replies, advertise=spec)
    d.env.handlers["tool-finalize"] = lambda e: ("resolve", {
        **thaw(e.payload["result"]),
        "additionalContexts": [msg(f"x-{e.payload['callId']}", f"ctx-{e.payload['callId']}", "p")]})
    d.core.followup(msg("P", "go"))
    d.run()
    expected = finish(d)

    async def echo(call: ToolCall) -> str:
        return "ok"

    async def add_context(call: ToolCall, result: ToolResult) -> ToolResult:
        context = msg(f"x-{call.call_id}", f"ctx-{call.call_id}", "p")
        return ToolResult(result.content, additional_contexts=(context,))  # type: ignore[arg-type]

    async def scenario(agent: Agent) -> None:
        agent.followup(msg("P", "go"))

    got = agent_run(scenario, ScriptedModel(replies),
                    tools=[Tool("echo", echo, finalize=add_context)])
    assert got == expected


def test_D5_aborted_parallel_group_does_not_run_the_exclusive_call() -> None:
    modes: dict[str, ToolMode] = {"par": "parallel", "exc": "exclusive"}
    spec = [{"name": "par"}, {"name": "exc"}]
    replies = [calls_reply(("c1", "par"), ("c2", "par"), ("c3", "exc"))]
    d = driver_for(tools=modes, replies=replies, advertise=spec)
    d.env.handlers["tool-execute"] = lambda e: HOLD
    d.core.followup(msg("P", "go"))
    d.run()
    d.core.cancel({"kind": "user"})
    d.run()
    d.resolve("tool-execute", ok_result())
    d.resolve("tool-execute", ok_result())
    d.run()
    expected = finish(d)

    started: list[str] = []
    exclusive_ran: list[str] = []
    both = asyncio.Event()
    gate = asyncio.Event()

    async def par(call: ToolCall) -> str:
        started.append(call.call_id)
        if len(started) == 2:
            both.set()
        await gate.wait()
        return "ok"

    async def exc(call: ToolCall) -> str:
        exclusive_ran.append(call.call_id)
        return "ok"

    async def scenario(agent: Agent) -> None:
        agent.followup(msg("P", "go"))
        await both.wait()
        agent.cancel("user")
        gate.set()

    got = agent_run(scenario, ScriptedModel(replies),
                    tools=[Tool("par", par, "parallel"), Tool("exc", exc)])
    assert got == expected
    assert exclusive_ran == []


def test_E11_cancel_while_streaming_drops_the_queued_tail() -> None:
    chunks = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    d = driver_for()
    d.env.handlers["model"] = lambda e: HOLD
    d.core.followup(msg("P", "go"))
    d.run()
    model = d.take_held("model")
    d.stream(model, chunks, end=False)
    d.run()
    d.core.followup(msg("T", "queued tail"))
    d.core.cancel({"kind": "user"})
    d.run()
    d.core.fail(model.id, ErrorInfo.from_exception(AbortError(CancelCause("user"))))
    d.run()
    expected = finish(d)

    async def scenario(agent: Agent) -> None:
        two = asyncio.Event()
        agent.on("assistant/chunk", lambda e: two.set() if at(e.data, "chunk", "text") == "b" else None)
        agent.followup(msg("P", "go"))
        await two.wait()
        agent.followup(msg("T", "queued tail"))
        agent.cancel("user")

    got = agent_run(scenario, ScriptedModel([Hang(tuple(chunks))]))
    assert got == expected
    assert not any(o.get("type") == "agent/error" for o in got)
    # D15: what the model streamed before the cancel stays, marked interrupted
    (kept,) = [o for o in got if o.get("type") == "assistant/message"]
    assert kept["data"]["interrupted"] is True


def test_F1_model_failure_becomes_the_turns_error() -> None:
    failure = ModelFailure("model unavailable", "UNAVAILABLE", status=503)
    d = driver_for(replies=[ErrorInfo.from_exception(failure)])
    d.core.followup(msg("P", "hi"))
    d.run()
    expected = finish(d)

    async def scenario(agent: Agent) -> None:
        agent.followup(msg("P", "hi"))

    got = agent_run(scenario, ScriptedModel([failure]))
    assert got == expected
    ends = [o for o in got if o.get("type") == "turn/end"]
    assert ends[0]["data"]["reason"] == {"kind": "error", "step": 1, "failure": {
        "message": "model unavailable", "code": "UNAVAILABLE", "status": 503}}


class GatedStore(InMemorySink):
    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    # An async flush over InMemorySink's synchronous one: the sink protocol (SessionSink)
    # allows either, and the test keeps InMemorySink's bookkeeping.
    async def flush(self) -> None:  # type: ignore[override]
        if self.flushes == 0:
            self.entered.set()
            await self.gate.wait()
        super().flush()


class FailingStore(InMemorySink):
    async def flush(self) -> None:  # type: ignore[override]  # as GatedStore's
        if self.flushes == 0:
            self.flushes += 1
            raise RuntimeError("disk unavailable")
        super().flush()


def test_F9a_the_flush_is_a_barrier() -> None:
    d = driver_for(replies=[text_reply("one"), text_reply("two")])
    flushes: list[int] = []

    def flush(effect: Any) -> Any:
        flushes.append(effect.payload["turn"])
        return HOLD if len(flushes) == 1 else ("resolve", None)
    d.env.handlers["flush"] = flush
    d.core.followup(msg("P1", "first"))
    d.core.followup(msg("P2", "second"))
    d.run()
    d.resolve("flush")
    d.run()
    expected = finish(d)

    store = GatedStore()

    async def scenario(agent: Agent) -> None:
        agent.followup(msg("P1", "first"))
        agent.followup(msg("P2", "second"))
        await store.entered.wait()
        idle = asyncio.ensure_future(agent.when_idle())
        await asyncio.sleep(0)
        assert agent.status == "running" and not idle.done()
        assert [e.data["turn"] for e in agent.session.events if e.type == "turn/start"] == [1]
        store.gate.set()
        await idle

    got = agent_run(scenario, ScriptedModel([text_reply("one"), text_reply("two")]), sink=store)
    assert got == expected
    assert store.flushes == 2 and len(store.durable) == len(store.events)


def test_F9b_a_failed_flush_is_reported_and_work_continues(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    d = driver_for(replies=[text_reply("one"), text_reply("two")])
    failed: list[bool] = []

    def flush(effect: Any) -> Any:
        if not failed:
            failed.append(True)
            return ("raise", ErrorInfo.from_exception(RuntimeError("disk unavailable")))
        return ("resolve", None)
    d.env.handlers["flush"] = flush
    d.core.followup(msg("P1", "first"))
    d.core.followup(msg("P2", "second"))
    d.run()
    expected = finish(d)

    async def scenario(agent: Agent) -> None:
        agent.followup(msg("P1", "first"))
        agent.followup(msg("P2", "second"))

    with caplog.at_level(logging.WARNING, logger="turnstile"):
        got = agent_run(scenario, ScriptedModel([text_reply("one"), text_reply("two")]),
                        sink=FailingStore())
    assert got == expected
    assert "session flush failed at turn 1: disk unavailable" in caplog.text
    errors = [o for o in got if o.get("type") == "agent/error"]
    assert [(e["turn"], e["error"]["message"]) for e in errors] == [(1, "disk unavailable")]


# --------------------------------------------------------------------------
# Conformance vectors and scripts, through the runtime
# --------------------------------------------------------------------------

VECTOR_FILES = sorted(find_vectors([CONFORMANCE])) if CONFORMANCE.is_dir() else []


@pytest.mark.parametrize("path", VECTOR_FILES or [pytest.param(None, marks=pytest.mark.skip(
    reason=f"no conformance vectors under {CONFORMANCE}"))],
    ids=lambda p: p.stem if isinstance(p, Path) else "none")
def test_every_conformance_vector_replays_exactly_through_the_runtime(path: Path) -> None:
    from machine.conformance.vectors import load_vector
    assert check_vector(load_vector(path)) is None


SCRIPT_FILES = sorted(EXAMPLES.glob("*.json")) if EXAMPLES.is_dir() else []


@pytest.mark.parametrize("path", SCRIPT_FILES or [pytest.param(None, marks=pytest.mark.skip(
    reason=f"no scripts under {EXAMPLES}"))], ids=lambda p: p.stem if isinstance(p, Path) else "none")
def test_every_example_script_replays_exactly_through_the_runtime(path: Path) -> None:
    assert replay_script(load_script(path)) is None


def _m(id_: str, text: str) -> dict[str, Any]:
    return msg(id_, text)


OWN_SCRIPT = {"version": 1, "config": {"requestOptions": SEED, "toolModes": {"ls": "parallel"}},
              "inputs": [
    {"in": "followup", "message": _m("m1", "hi")},
    {"in": "resolve", "effect": {"kind": "tick"}},
    {"in": "steer", "when": {"out": "live", "type": "agent/inbox/dequeue"}, "message": _m("s1", "s")},
    {"in": "resolve", "effect": {"kind": "prompt-submit"}, "value": {"kind": "allow"}},
    {"in": "resolve", "effect": {"kind": "step"}},
    {"in": "resolve", "effect": {"kind": "system-prompt"}, "value": "be nice"},
    {"in": "resolve", "effect": {"kind": "request"}, "value": {"config": SEED, "system": "be nice"}},
    {"in": "chunk", "effect": {"kind": "model"},
     "chunk": {"type": "tool-call", "id": "c1", "name": "ls", "arguments": ""}},
    {"in": "chunk", "effect": {"kind": "model"},
     "chunk": {"type": "tool-call", "id": "c2", "name": "ls", "arguments": "{}"}},
    {"in": "inject", "when": {"out": "event", "type": "assistant/chunk"}, "message": _m("i1", "ctx")},
    {"in": "chunk", "effect": {"kind": "model"}, "chunk": {"type": "finish", "kind": "stop"}},
    {"in": "end", "effect": {"kind": "model"}},
    {"in": "resolve", "effect": {"kind": "tool-prepare"}, "value": None},
    {"in": "resolve", "effect": {"kind": "tool-prepare"}, "value": None},
    {"in": "cancel", "when": {"out": "effect", "kind": "tool-execute", "callId": "c2"},
     "cause": {"kind": "user"}},
    {"in": "resolve", "effect": {"kind": "tool-execute", "callId": "c2"}, "value": ok_result("two")},
    {"in": "resolve", "effect": {"kind": "tool-execute", "callId": "c1"}, "value": ok_result("one")},
    {"in": "resolve", "effect": {"kind": "tool-finalize"}, "value": ok_result("one")},
    {"in": "resolve", "effect": {"kind": "tool-finalize"}, "value": ok_result("two")},
    {"in": "resolve", "effect": {"kind": "step"}},
    {"in": "resolve", "effect": {"kind": "flush"}},
    {"in": "followup", "when": {"out": "live", "type": "agent/settled"}, "message": _m("m2", "x")},
    {"in": "resolve", "effect": {"kind": "prompt-submit"}, "value": {"kind": "block", "reason": "no"}},
    {"in": "resolve", "effect": {"kind": "tick"}},
    {"in": "resolve", "effect": 999},
]}


def test_a_script_with_observer_positions_and_a_refusal_replays_exactly() -> None:
    assert replay_script(parse_script(json.dumps(OWN_SCRIPT))) is None


@settings(max_examples=80, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(interleavings(tools=("echo", "pread"),
                     commands=("followup", "steer", "inject", "send", "cancel", "dispose")))
def test_random_interleavings_recorded_from_the_core_replay_exactly(run: Any) -> None:
    driver = run.run()
    try:
        script = driver.script()
    except ValueError:              # a position its pattern cannot name: not expressible
        assume(False)
        raise
    assert replay_script(parse_script(json.dumps(script))) is None
