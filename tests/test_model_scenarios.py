"""Reference scenarios run against the reference model alone (model/, scenarios.md).

The model is driven by `machine.checking.scripted.Driver`, which is typed for `AgentCore`;
`ModelAgent` has the same interface, so it is passed through a cast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import pytest
from scenario_helpers import at, obj

from machine.checking.scripted import (
    HOLD,
    Driver,
    ScriptedEnvironment,
    calls_reply,
    model_failure,
    ok_result,
    text_reply,
)
from machine.core import AgentCore, CoreConfig
from machine.errors import DisposedError, ProtocolError, ValidationError
from machine.io import Durable, Effect, Live
from machine.jsonvalue import FrozenDict, thaw
from machine.vocabulary import ErrorInfo, user_message

if TYPE_CHECKING:
    # The same files: setup.py installs model/ as machine._model, which mypy cannot follow.
    from model import ModelAgent
else:
    from machine._model import ModelAgent

CONFIG = CoreConfig(request_options={"provider": "test", "model": "test-model"})


def counting_clock(start: int = 1000) -> Callable[[], float]:
    ticks = iter(range(start, 10**9))
    return lambda: next(ticks)


def make(env: ScriptedEnvironment | None = None, config: CoreConfig = CONFIG
         ) -> tuple[ModelAgent, Driver]:
    agent = ModelAgent(config, clock=counting_clock())
    driver = Driver(cast(AgentCore, agent), env)
    driver.pump()  # publication notices
    return agent, driver


def msg(text: str, id_: str | None = None, **source: Any) -> Any:
    return user_message(id_ or f"m-{text}", text, source or {"kind": "user"})


def types(driver: Driver) -> list[str]:
    return [o.event.type for o in driver.events]


def live(driver: Driver, *kinds: str) -> list[tuple[str, Any]]:
    """Live notifications as (type, short payload) pairs."""
    out: list[tuple[str, Any]] = []
    for o in driver.live(*kinds):
        p = thaw(o.event.payload)
        short: Any = p
        if "message" in p and isinstance(p["message"], dict):
            short = (p["message"]["content"][0]["text"], p.get("placement"))
        elif "messages" in p:
            short = [m["content"][0]["text"] for m in p["messages"]]
        elif "status" in p:
            short = p["status"]
        elif o.event.type == "agent/settled":
            short = (p["turn"], p["reason"]["kind"])
        elif o.event.type == "agent/cancel-requested":
            short = p["cause"]["kind"]
        elif o.event.type == "agent/error":
            short = (p["turn"], p["step"], p["error"]["message"])
        out.append((o.event.type, short))
    return out


def statuses(driver: Driver) -> list[str]:
    return [o.event.payload["status"] for o in driver.live("agent/status")]  # type: ignore[misc]


def turn_end_reasons(driver: Driver) -> list[Any]:
    return [thaw(o.event.data["reason"]) for o in driver.events if o.event.type == "turn/end"]


# --------------------------------------------------------------------------
# A. idle routing and the wake
# --------------------------------------------------------------------------


def test_a1_simple_prompt_turn() -> None:
    usage = {"inputTokens": 3, "outputTokens": 2}
    agent, driver = make(ScriptedEnvironment(replies=[text_reply("hello there", usage=usage,
                                                                 pieces=2)]))
    agent.followup(msg("hi"))
    driver.run()
    assert types(driver) == ["turn/start", "user/message", "step/start", "request/header",
                             "assistant/chunk", "assistant/chunk", "assistant/chunk",
                             "assistant/chunk", "assistant/message", "step/end", "turn/end"]
    events = [o.event for o in driver.events]
    am = events[8]
    assert thaw(am.data["usage"]) == usage           # from its own usage chunk (V18, P12)
    assert list(am.source_event_seqs or ()) == [4, 5, 6, 7]
    assert thaw(am.data["message"])["content"] == [{"type": "text", "text": "hello there"}]
    assert at(am.data, "message", "id") == "assistant-8"
    assert events[3].data["reason"] == "initial"
    assert turn_end_reasons(driver) == [{"kind": "completed"}]
    assert [m.role for m in agent.log.derive_messages()] == ["user", "assistant"]
    assert statuses(driver) == ["running", "idle"]
    assert live(driver, "agent/inbox/enqueue", "agent/inbox/dequeue", "agent/settled") == [
        ("agent/inbox/enqueue", ("hi", "queued")), ("agent/inbox/dequeue", ("hi", "queued")),
        ("agent/settled", (1, "completed"))]
    # P5/P4 order: tick → enq; running → prompt-submit → dequeue.
    kinds = [o.kind if isinstance(o, Effect) else o.event.type for o in driver.outputs
             if isinstance(o, (Effect, Live))]
    assert kinds[3:8] == ["tick", "agent/inbox/enqueue", "agent/status", "prompt-submit",
                          "agent/inbox/dequeue"]
    assert agent.is_quiescent and not agent.accepts_next_step


def test_a2_idle_inject_appends_one_event() -> None:
    agent, driver = make()
    agent.inject(msg("context", plugin="p", kind="plugin"))
    driver.run()
    assert types(driver) == ["user/message"]
    assert driver.live("agent/status", "agent/inbox/enqueue") == []
    assert driver.effects() == []


def test_a3_invalid_messages_raise_with_no_effect() -> None:
    agent, driver = make()
    with pytest.raises(ValidationError):
        agent.inject({"id": "", "role": "user", "content": [], "source": {"kind": "user"}})
    with pytest.raises(ValidationError):
        agent.followup({"id": "x", "role": "assistant", "content": [], "source": {"kind": "user"}})
    with pytest.raises(ValidationError):
        agent.send(msg("x"), {"target": "next-turn"})
    driver.run()
    assert types(driver) == [] and driver.effects() == []


def test_a6_two_idle_steers_make_two_turns() -> None:
    agent, driver = make(ScriptedEnvironment(replies=[text_reply("first"), text_reply("second")]))
    agent.steer(msg("S1"))
    agent.steer(msg("S2"))
    driver.run()
    assert types(driver).count("turn/start") == 2
    assert "steering/message" not in types(driver)
    assert statuses(driver) == ["running", "idle"]
    assert [e.event.data["reason"] for e in driver.events if e.event.type == "request/header"] \
        == ["initial"]


# --------------------------------------------------------------------------
# B. prompt admission
# --------------------------------------------------------------------------


def test_b3_block_nothing_durable() -> None:
    env = ScriptedEnvironment(handlers={"prompt-submit": lambda e: ("resolve", {
        "kind": "block", "reason": "blocked by policy"})})
    agent, driver = make(env)
    agent.followup(msg("do something"))
    driver.run()
    assert types(driver) == []
    assert live(driver, "agent/status", "agent/inbox/enqueue", "agent/inbox/dequeue",
                "agent/settled", "agent/error") == [
        ("agent/inbox/enqueue", ("do something", "queued")), ("agent/status", "running"),
        ("agent/inbox/dequeue", ("do something", "queued")), ("agent/status", "idle")]
    assert [e.kind for e in driver.effects()] == ["tick", "prompt-submit", "tick"]
    assert driver.effects()[-1].payload["purpose"] == "rejected-admission"


def test_b4_inject_and_steer_during_an_allowed_admission() -> None:
    env = ScriptedEnvironment(handlers={"prompt-submit": lambda e: HOLD})
    agent, driver = make(env)
    agent.followup(msg("admitted prompt"))
    driver.run()
    assert agent.status == "running" and agent.accepts_next_step and types(driver) == []
    agent.inject(msg("attached context", kind="plugin", plugin="test"))
    agent.steer(msg("admission steering"))
    driver.resolve("prompt-submit", {"kind": "allow"})
    driver.run()
    assert types(driver)[:4] == ["turn/start", "user/message", "user/message", "steering/message"]
    assert types(driver)[4:] == ["step/start", "request/header", "assistant/chunk",
                                 "assistant/chunk", "assistant/message", "step/end", "turn/end"]
    assert [p for _, (_, p) in live(driver, "agent/inbox/enqueue")] == ["queued", "steering"]
    model_call = driver.effects("model")[0]
    assert model_call.history is not None
    assert [m.text for m in model_call.history] == ["admitted prompt", "attached context",
                                                     "admission steering"]
    assert not agent.accepts_next_step


def test_b7_blocked_admission_context_only_is_appended() -> None:
    env = ScriptedEnvironment(handlers={"prompt-submit": lambda e: HOLD})
    agent, driver = make(env)
    agent.followup(msg("blocked prompt"))
    driver.run()
    agent.inject(msg("independent context", kind="plugin", plugin="test"))
    driver.resolve("prompt-submit", {"kind": "block", "reason": "no"})
    driver.run()
    assert types(driver) == ["user/message"]


def test_b10_raising_and_invalid_admission_warn() -> None:
    answers = iter([("raise", ErrorInfo("boom")), ("resolve", {"kind": "maybe"}),
                    ("resolve", {"kind": "allow"})])
    env = ScriptedEnvironment(handlers={"prompt-submit": lambda e: next(answers)})
    agent, driver = make(env)
    for text in ("first", "second", "third"):
        agent.followup(msg(text))
    driver.run()
    warnings = [o.event.payload["text"] for o in driver.live("agent/warning")]
    assert warnings[0] == "prompt admission failed: boom"
    assert str(warnings[1]).startswith("prompt admission returned an invalid decision: ")
    assert driver.live("agent/error") == []
    assert types(driver).count("turn/start") == 1
    assert statuses(driver) == ["running", "idle"]


# --------------------------------------------------------------------------
# C. steps, steering, tool batches
# --------------------------------------------------------------------------


def test_c1_steering_during_a_tool_call_continues_the_turn() -> None:
    agent: ModelAgent
    replies: list[Any] = [calls_reply(("c1", "slow")), text_reply("addressed the steering")]

    def execute(effect: Effect) -> Any:
        agent.steer(msg("change of plans"))
        return ("resolve", ok_result("tool done"))

    env = ScriptedEnvironment(replies=replies, handlers={"tool-execute": execute})
    agent, driver = make(env)
    agent.followup(msg("start"))
    driver.run()
    assert types(driver) == [
        "turn/start", "user/message", "step/start", "request/header", "assistant/chunk",
        "assistant/chunk", "assistant/message", "tool/call", "tool/result", "steering/message",
        "step/end", "step/start", "assistant/chunk", "assistant/chunk", "assistant/message",
        "step/end", "turn/end"]
    order = [o.kind if isinstance(o, Effect) else o.event.type for o in driver.outputs
             if isinstance(o, (Effect, Live))
             or (isinstance(o, Durable) and o.event.type == "steering/message")]
    assert order.index("agent/inbox/enqueue", 2) < order.index("agent/inbox/dequeue", 3)
    assert order.index("turn-stopping") > order.index("steering/message")
    assert len(driver.effects("turn-stopping")) == 1
    second = driver.effects("model")[1]
    assert second.history is not None
    assert [m.text for m in second.history][-1] == "change of plans"


def test_c3_tool_contexts_come_after_all_results() -> None:
    def finalize(effect: Effect) -> Any:
        call_id = effect.payload["callId"]
        return ("resolve", {**thaw(effect.payload["result"]), "additionalContexts": [
            msg(f"ctx-{call_id}", kind="plugin", plugin="p").to_json()]})

    env = ScriptedEnvironment(replies=[calls_reply(("c1", "echo"), ("c2", "echo")),
                                       text_reply("done")],
                              handlers={"tool-finalize": finalize})
    agent, driver = make(env)
    agent.followup(msg("go"))
    driver.run()
    t = types(driver)
    i = t.index("tool/call")
    assert t[i:i + 7] == ["tool/call", "tool/result", "tool/call", "tool/result", "user/message",
                          "user/message", "step/end"]


def test_d5_aborted_parallel_group_does_not_run_the_exclusive_call() -> None:
    config = CoreConfig(request_options={"provider": "p", "model": "m"},
                        tool_modes={"par": "parallel"})
    env = ScriptedEnvironment(replies=[calls_reply(("c1", "par"), ("c2", "par"), ("c3", "ex"))],
                              handlers={"tool-execute": lambda e: HOLD})
    agent, driver = make(env, config)
    agent.followup(msg("go"))
    driver.run()
    assert [e.payload["callId"] for e in driver.held] == ["c1", "c2"]
    agent.cancel({"kind": "user"})
    driver.resolve("tool-execute", ok_result())
    driver.resolve("tool-execute", ok_result())
    driver.run()
    t = [(o.event.type, o.event.data.get("callId") or
          (obj(at(o.event.data, "message", "source")).get("callId")
           if o.event.type == "tool/result" else None)) for o in driver.events]
    tail = [x for x in t if x[0] in ("tool/call", "tool/result")]
    assert tail == [("tool/call", "c1"), ("tool/call", "c2"), ("tool/result", "c1"),
                    ("tool/result", "c2"), ("tool/call", "c3"), ("tool/result", "c3")]
    codes = [at(o.event.data, "error", "code") for o in driver.events
             if o.event.type == "tool/result"]
    assert codes == ["ABORTED", "ABORTED", "ABORTED_BEFORE_DISPATCH"]
    assert turn_end_reasons(driver) == [{"kind": "aborted"}]
    assert [e.payload["callId"] for e in driver.effects("tool-prepare")] == ["c1", "c2"]


# --------------------------------------------------------------------------
# E. cancellation and disposal
# --------------------------------------------------------------------------


def test_e1_cancel_requested_observer_work_is_cleared_too() -> None:
    agent, driver = make()

    def observer(output: Any) -> None:
        if isinstance(output, Live) and output.event.type == "agent/cancel-requested":
            agent.followup(msg("queued by cancel observer"))

    driver.on(observer)
    agent.followup(msg("drop me"))
    agent.cancel({"kind": "user"})
    driver.run()
    assert live(driver, "agent/inbox/enqueue", "agent/cancel-requested", "agent/inbox/discard",
                "agent/status") == [
        ("agent/inbox/enqueue", ("drop me", "queued")), ("agent/cancel-requested", "user"),
        ("agent/inbox/enqueue", ("queued by cancel observer", "queued")),
        ("agent/inbox/discard", ["drop me", "queued by cancel observer"])]
    agent.cancel({"kind": "parent"})
    assert agent.next_output() is None
    assert types(driver) == []


def test_e7_cancel_from_the_running_notification() -> None:
    agent, driver = make()
    driver.on_event("agent/status", lambda p: agent.cancel({"kind": "user"})
                    if p["status"] == "running" else None, once=True)
    agent.followup(msg("go"))
    driver.run()
    assert types(driver) == []
    assert driver.effects("prompt-submit") == []
    assert live(driver, "agent/status", "agent/cancel-requested", "agent/inbox/dequeue") == [
        ("agent/status", "running"), ("agent/cancel-requested", "user"),
        ("agent/inbox/dequeue", ("go", "queued")), ("agent/status", "idle")]


def test_e11_cancel_while_streaming_drops_the_queued_tail_and_keeps_what_was_streamed() -> None:
    """E11, with D15: the text streamed before the cancel stays as the step's interrupted
    assistant message; the chunk after the cancel is released, not appended."""
    env = ScriptedEnvironment(handlers={"model": lambda e: HOLD})
    agent, driver = make(env)
    agent.followup(msg("go"))
    driver.run()
    model_call = driver.take_held("model")
    driver.stream(model_call, [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                  end=False)
    driver.run()
    agent.followup(msg("queued tail"))
    agent.cancel({"kind": "user"})
    agent.chunk(model_call.id, {"type": "text", "text": "c"})  # the model keeps going
    driver.run()
    assert types(driver) == ["turn/start", "user/message", "step/start", "request/header",
                             "assistant/chunk", "assistant/chunk", "assistant/message",
                             "step/end", "turn/end"]
    (kept,) = [thaw(o.event.data) for o in driver.outputs
               if isinstance(o, Durable) and o.event.type == "assistant/message"]
    assert kept["interrupted"] is True
    assert kept["message"]["content"] == [{"type": "text", "text": "ab"}]
    assert turn_end_reasons(driver) == [{"kind": "aborted"}]
    assert live(driver, "agent/inbox/enqueue", "agent/cancel-requested", "agent/inbox/discard",
                "agent/settled", "agent/status", "agent/error")[-5:] == [
        ("agent/inbox/enqueue", ("queued tail", "queued")), ("agent/cancel-requested", "user"),
        ("agent/inbox/discard", ["queued tail"]), ("agent/settled", (1, "aborted")),
        ("agent/status", "idle")]
    assert any(o.to_json() == {"out": "release", "effect": model_call.id} for o in driver.outputs)
    with pytest.raises(ProtocolError):
        agent.end(model_call.id)


def test_e14_dispose_from_a_step_start_observer_then_teardown() -> None:
    agent, driver = make()
    driver.on_event("step/start", lambda d: agent.dispose(), once=True)
    agent.followup(msg("go"))
    driver.run()
    assert types(driver) == ["turn/start", "user/message", "step/start", "step/end", "turn/end"]
    assert turn_end_reasons(driver) == [{"kind": "disposed"}]
    assert [o.event.type for o in driver.live()][-4:] == [
        "agent/settled", "agent/status", "agent/disposed", "session/disposed"]
    assert agent.disposed
    with pytest.raises(DisposedError):
        agent.followup(msg("late"))
    agent.dispose()  # a no-op


# --------------------------------------------------------------------------
# F. errors, retries
# --------------------------------------------------------------------------


def test_f1_a_model_failure_becomes_the_turn_error() -> None:
    env = ScriptedEnvironment(replies=[model_failure("model unavailable", "UNAVAILABLE")])
    agent, driver = make(env)
    agent.followup(msg("hi"))
    driver.run()
    assert types(driver) == ["turn/start", "user/message", "step/start", "request/header",
                             "step/end", "turn/end"]
    assert turn_end_reasons(driver) == [{"kind": "error", "step": 1, "failure": {
        "message": "model unavailable", "code": "UNAVAILABLE"}}]
    assert live(driver, "agent/error", "agent/settled") == [
        ("agent/error", (1, 1, "model unavailable")), ("agent/settled", (1, "error"))]
    request_error = driver.effects("request-error")
    assert len(request_error) == 1
    assert isinstance(driver.outputs[driver.outputs.index(request_error[0]) - 1], Durable)


def test_f_retry_chain_then_settles_once() -> None:
    env = ScriptedEnvironment(
        replies=[model_failure("flaky", "E"), text_reply("ok")],
        handlers={"request-error": lambda e: ("resolve", {"kind": "retry"})})
    agent, driver = make(env)
    agent.followup(msg("hi"))
    driver.run()
    starts = [thaw(o.event.data["trigger"]) for o in driver.events if o.event.type == "turn/start"]
    assert starts == [{"kind": "message", "source": {"kind": "user"}}, {"kind": "retry"}]
    assert live(driver, "agent/settled") == [("agent/settled", (2, "completed"))]
    assert statuses(driver) == ["running", "idle"]


def test_protocol_errors_change_nothing() -> None:
    agent, driver = make()
    with pytest.raises(ProtocolError):
        agent.resolve(99)
    agent.followup(msg("go"))
    tick = driver.core.next_output()
    assert isinstance(tick, Effect) and tick.kind == "tick"
    with pytest.raises(ProtocolError):
        agent.chunk(tick.id, {"type": "text", "text": "x"})
    agent.resolve(tick.id)
    with pytest.raises(ProtocolError):
        agent.resolve(tick.id)
    assert isinstance(FrozenDict(), FrozenDict)
