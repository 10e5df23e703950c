"""Scenarios C (steps, steering, tool batches) and D (cancellation inside tool batches)."""

from __future__ import annotations

from typing import Any

from machine.conformance.authoring import (
    HOLD,
    Session,
    calls,
    durable,
    error,
    notation,
    result,
    scenario,
)
from machine.conformance.corpus.common import inject_during
from machine.io import Effect

PARALLEL: Any = "parallel"


@scenario("C1-steer-during-tool-continues",
          "C1. Steering sent by a tool body is staged and drained after the tool result, before "
          "step/end; it forces a second step of the same turn, and turn-stopping runs only after "
          "that step",
          ["R5.3", "R9.9", "R9.10", "R10.5", "R11.1", "R11.2", "R8.4", "R3.1"],
          ["scenario", "scenario:C1", "tools"])
def c1() -> Session:
    s = Session(calls(("c1", "slow")), "addressed the steering")

    def body(e: Effect) -> Any:
        s.steer("change of plans")
        return ("resolve", result("tool done"))
    s.handle("tool-execute", body)
    s.followup("start")
    s.run()
    s.expect_log("TS(1,msg:user) UM('start') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
                 "TR(1.1;c1;ok) STM(1;'change of plans';user) SE(1.1) SS(1.2) CH… "
                 "AM(1.2;'addressed the steering') SE(1.2) TE(1,completed)")
    trace = s.trace()
    assert trace.index("deq(change of plans,s)") + 1 == trace.index(
        "[STM(1;'change of plans';user)]")
    assert trace.index("⟨turn-stopping 1⟩") > trace.index("[SE(1.2)]")
    assert len(s.effects("turn-stopping")) == 1
    assert s.requests()[1] == ["'start'", "call c1", "TR:c1", "'change of plans'"]
    trace = s.trace(durable=("TR", "STM", "SS", "SE"), effects=("tool-execute", "turn-stopping"))
    assert trace[trace.index("⟨execute c1⟩"):] == notation(
        "⟨execute c1⟩ enq(change of plans,s) [TR(1.1;c1;ok)] deq(change of plans,s) "
        "[STM(1;'change of plans';user)] [SE(1.1)] [SS(1.2)] [SE(1.2)] ⟨turn-stopping 1⟩ "
        "settled(1,completed) idle")
    return s


@scenario("C2-inject-during-tool-after-result",
          "C2. Context injected by a tool body waits in the outbox and is appended after the "
          "tool result by the end-of-step drain, in order; it reaches the next request after "
          "the result",
          ["R5.2", "R10.5", "R11.1", "R9.10", "R11.2"], ["scenario", "scenario:C2", "tools"])
def c2() -> Session:
    s = Session(calls(("c1", "noticer"), text="calling"), "done")

    def body(e: Effect) -> Any:
        assert not any("plugin" in t for t in s.log())
        s.inject("mid-turn notice", "plugin:x")
        s.inject("second notice", "plugin:x")
        return ("resolve", result())
    s.handle("tool-execute", body)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'calling'+call c1) "
                 "TC(1.1;c1) TR(1.1;c1;ok) UM('mid-turn notice';plugin:x) "
                 "UM('second notice';plugin:x) SE(1.1) SS(1.2) CH… AM(1.2;'done') SE(1.2) "
                 "TE(1,completed)")
    assert s.requests()[1] == ["'go'", "'calling'+call c1", "TR:c1", "'mid-turn notice';plugin:x",
                               "'second notice';plugin:x"]
    return s


@scenario("C3-tool-contexts-after-all-results",
          "C3. Additional contexts from tool results are pushed to the outbox and appended after "
          "every tool/result of the step, in result order",
          ["R10.4", "R10.5", "R11.2", "R9.10"], ["scenario", "scenario:C3", "tools"])
def c3() -> Session:
    s = Session(calls(("c1", "echo"), ("c2", "echo")), "done")

    def finalize(e: Effect) -> Any:
        call_id = e.payload["callId"]
        return ("resolve", result(contexts=[s.msg(f"ctx-{call_id}", "plugin:p")]))
    s.handle("tool-finalize", finalize)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1+call c2) "
                 "TC(1.1;c1) TR(1.1;c1;ok) TC(1.1;c2) TR(1.1;c2;ok) UM('ctx-c1';plugin:p) "
                 "UM('ctx-c2';plugin:p) SE(1.1) SS(1.2) CH… AM(1.2;'done') SE(1.2) TE(1,completed)")
    return s


@scenario("C5-direct-append-in-step-hook",
          "C5. A direct append made from the step extension point lands before step/start and "
          "reaches the same request",
          ["R9.1", "R9.4", "R0.6", "R20.2", "R20.3"], ["scenario", "scenario:C5"])
def c5() -> Session:
    s = Session("ok")

    def step_hook(e: Effect) -> Any:
        s.core.append("user/message", s.msg("INJECTED-IN-PRE-STEP", "plugin:test"),
                      surface_op="append")
        return ("resolve", None)
    s.handle("step", step_hook, times=1)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') UM('INJECTED-IN-PRE-STEP';plugin:test) SS(1.1) "
                 "RH(initial) CH… AM(1.1;'ok') SE(1.1) TE(1,completed)")
    assert s.requests() == [["'go'", "'INJECTED-IN-PRE-STEP';plugin:test"]]
    return s


@scenario("C7-inject-in-request-hook-misses-request",
          "C7. Context injected during the request extension point misses the current request: "
          "it is appended by the end-of-step drain (no extra step) and reaches the next turn; "
          "turn 2 logs no request header (same instance, same header)",
          ["R9.6", "R9.10", "R11.2", "R4.8"], ["scenario", "scenario:C7"])
def c7() -> Session:
    s = Session("one", "two")
    inject_during(s, "request", "[late context]")
    s.followup("first")
    s.run()
    s.followup("second")
    s.run()
    s.expect_log("TS(1,msg:user) UM('first') SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "UM('[late context]';plugin:test) SE(1.1) TE(1,completed) TS(2,msg:user) "
                 "UM('second') SS(2.1) CH… AM(2.1;'two') SE(2.1) TE(2,completed)")
    assert "'[late context]';plugin:test" not in s.requests()[0]
    assert "'[late context]';plugin:test" in s.requests()[1]
    return s


@scenario("C8-turn-stopping-steer-loops",
          "C8. Steering sent from the turn-stopping extension point is drained after the last "
          "step/end and runs another step of the same turn, until the handler stops steering",
          ["R8.5", "R11.2", "R5.3", "R3.2"], ["scenario", "scenario:C8"])
def c8() -> Session:
    s = Session("step 1", "step 2", "step 3")

    def stopping(e: Effect) -> Any:
        if s.types().count("step/end") < 3:
            s.steer("continue", "plugin:loop-test")
        return None
    s.handle("turn-stopping", stopping)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'step 1') SE(1.1) "
                 "STM(1;'continue';plugin:loop-test) SS(1.2) CH… AM(1.2;'step 2') SE(1.2) "
                 "STM(1;'continue';plugin:loop-test) SS(1.3) CH… AM(1.3;'step 3') SE(1.3) "
                 "TE(1,completed)")
    assert len(s.effects("model")) == 3
    trace = s.trace(durable=("STM",), effects=("turn-stopping", "step"))
    for k in (2, 3):
        i = trace.index(f"⟨step 1.{k}⟩")
        assert trace[i - 4:i] == notation("⟨turn-stopping 1⟩ enq(continue,s) deq(continue,s) "
                                          "[STM(1;'continue';plugin:loop-test)]")
    return s


@scenario("C10-steer-from-turn-end-observer",
          "C10. A steer issued by a turn/end observer sees the window closed: it is queued "
          "without a wake and claimed after the flush, with no idle between the turns",
          ["R12.1", "R4.3", "R5.3", "R6.1", "R12.7"], ["scenario", "scenario:C10"])
def c10() -> Session:
    s = Session("turn 1", "turn 2")
    seen: list[bool] = []

    def on_turn_end(o: object) -> None:
        seen.append(s.core.accepts_next_step)
        s.steer("too late for this turn")
    s.on(durable("turn/end"), on_turn_end)
    s.followup("go")
    s.run()
    assert seen == [False]
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'turn 1') SE(1.1) "
                 "TE(1,completed) TS(2,msg:user) UM('too late for this turn') SS(2.1) CH… "
                 "AM(2.1;'turn 2') SE(2.1) TE(2,completed)")
    s.expect_live("enq(go,q) running deq(go,q) enq(too late for this turn,q) settled(1,completed) "
                  "deq(too late for this turn,q) settled(2,completed) idle")
    assert len(s.effects("tick")) == 1
    trace = s.trace(durable=("TE",), effects=("flush",))
    assert trace[trace.index("[TE(1,completed)]"):] == notation(
        "[TE(1,completed)] enq(too late for this turn,q) flush(1) settled(1,completed) "
        "deq(too late for this turn,q) [TE(2,completed)] flush(2) settled(2,completed) idle")
    assert s.requests()[1][-1] == "'too late for this turn'"
    return s


@scenario("C13-raising-step-hook-fails-turn",
          "C13. A raising step extension point fails only its turn: error reason with step 1 and "
          "the rendered message, one agent/error, no request; the queued prompt then runs and "
          "logs the initial header",
          ["R9.1", "R8.6", "R15.3", "R12.4", "R12.7", "R9.6"], ["scenario", "scenario:C13"])
def c13() -> Session:
    s = Session("ok")
    s.handle("step", lambda e: ("raise", error("boom in pre-step")), times=1)
    s.followup("first")
    s.followup("second")
    s.run()
    s.expect_log("TS(1,msg:user) UM('first') TE(1,error) TS(2,msg:user) UM('second') SS(2.1) "
                 "RH(initial) CH… AM(2.1;'ok') SE(2.1) TE(2,completed)")
    assert s.reasons()[0] == {"kind": "error", "step": 1, "message": "boom in pre-step"}
    s.expect_live("enq(first,q) enq(second,q) running deq(first,q) error(1,1,'boom in pre-step') "
                  "settled(1,error) deq(second,q) settled(2,completed) idle")
    assert s.trace(durable=("TE",), effects=("step", "flush")) == notation(
        "enq(first,q) enq(second,q) running deq(first,q) ⟨step 1.1⟩ error(1,1,'boom in pre-step') "
        "[TE(1,error)] flush(1) settled(1,error) deq(second,q) ⟨step 2.1⟩ [TE(2,completed)] "
        "flush(2) settled(2,completed) idle")
    assert [e.payload["turn"] for e in s.effects("model")] == [2]
    return s


# --------------------------------------------------------------------------
# D. Cancellation inside tool batches
# --------------------------------------------------------------------------


@scenario("D1-cancel-at-assistant-message",
          "D1. A cancel from an assistant/message observer: the call gets a synthetic "
          "aborted-before-dispatch pair, step/end is appended, the next step extension point's "
          "check ends the turn aborted; a later turn's request replays call and result",
          ["R10.7", "R10.10", "R10.8", "R15.1", "R16.4", "R19"],
          ["scenario", "scenario:D1", "tools", "cancel"])
def d1() -> Session:
    s = Session(calls(("c1", "danger")), "recovered after cancellation")
    s.on(durable("assistant/message"), lambda o: s.cancel())
    s.followup("go")
    s.run()
    s.followup("continue safely")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
                 "TR(1.1;c1;ERR ABD) SE(1.1) TE(1,aborted) TS(2,msg:user) UM('continue safely') "
                 "SS(2.1) CH… AM(2.1;'recovered after cancellation') SE(2.1) TE(2,completed)")
    assert not s.effects("tool-prepare") and not s.effects("tool-execute")
    assert not s.live("agent/error")
    assert [e.payload["step"] for e in s.effects("step")] == [1, 2, 1]
    trace = s.trace(durable=("AM", "TE"), effects=("step", "flush"))
    assert trace[trace.index("[AM(1.1;call c1)]"):trace.index("idle") + 1] == notation(
        "[AM(1.1;call c1)] cancel-req(user) abort(user) ⟨step 1.2⟩ [TE(1,aborted)] flush(1) "
        "settled(1,aborted) idle")
    assert s.requests()[1] == ["'go'", "call c1", "TR:c1", "'continue safely'"]
    tr = s.data("tool/result")[0]
    assert tr["error"] == {"name": "AbortError", "code": "ABORTED_BEFORE_DISPATCH"}
    assert tr["message"]["content"][0]["content"] == [
        {"type": "text", "text": "Error: tool call aborted before dispatch"}]
    return s


@scenario("D2-aborted-before-parallel-group",
          "D2. Aborted before a parallel group starts: every call gets a synthetic pair back to "
          "back and no tool stage runs",
          ["R10.2", "R10.7", "R10.10"], ["scenario", "scenario:D2", "tools", "cancel"])
def d2() -> Session:
    s = Session(calls(("c1", "p"), ("c2", "p")), tool_modes={"p": PARALLEL})
    s.on(durable("assistant/message"), lambda o: s.cancel())
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1+call c2) "
                 "TC(1.1;c1) TR(1.1;c1;ERR ABD) TC(1.1;c2) TR(1.1;c2;ERR ABD) SE(1.1) TE(1,aborted)")
    assert not [e for e in s.effects() if e.kind.startswith("tool-")]
    return s


@scenario("D3-abort-during-prepare",
          "D3. A cancel issued by the first call's prepare stage: that call is not dispatched "
          "(checked after prepare) and every call gets the aborted-before-dispatch result",
          ["R10.3", "R10.7", "R10.10"], ["scenario", "scenario:D3", "tools", "cancel"])
def d3() -> Session:
    s = Session(calls(("c1", "t"), ("c2", "t")))

    def prepare(e: Effect) -> Any:
        s.cancel()
        return ("resolve", None)
    s.handle("tool-prepare", prepare, times=1)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1+call c2) "
                 "TC(1.1;c1) TR(1.1;c1;ERR ABD) TC(1.1;c2) TR(1.1;c2;ERR ABD) SE(1.1) TE(1,aborted)")
    assert not s.effects("tool-execute")
    return s


@scenario("D5-aborted-parallel-group-skips-exclusive",
          "D5. A cancel while two parallel bodies run: both bodies settle after the abort and get "
          "the aborted result; the following exclusive call never starts and gets a synthetic pair",
          ["R10.2", "R10.7", "R10.11", "R10.4", "R16.6"], ["scenario", "scenario:D5", "tools", "cancel"])
def d5() -> Session:
    s = Session(calls(("c1", "p"), ("c2", "p"), ("c3", "x")), tool_modes={"p": PARALLEL})
    s.hold("tool-execute", times=2)
    s.followup("go")
    s.run()
    s.cancel()
    s.run()
    for _ in range(2):
        s.resolve("tool-execute", result())
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1+call c2+call c3) "
                 "TC(1.1;c1) TC(1.1;c2) TR(1.1;c1;ERR ABORTED) TR(1.1;c2;ERR ABORTED) TC(1.1;c3) "
                 "TR(1.1;c3;ERR ABD) SE(1.1) TE(1,aborted)")
    assert [e.payload["callId"] for e in s.effects("tool-execute")] == ["c1", "c2"]
    return s


@scenario("D8-dispose-during-tool-keeps-finalized-context",
          "D8. Disposal while a tool body runs: context staged before is discarded (no "
          "cancel-requested), the body's late success becomes the aborted result, the context "
          "its finalize adds afterwards is still appended; the turn ends disposed, then teardown",
          ["R17.1", "R17.2", "R10.11", "R16.2", "R19", "R20.1", "D6"],
          ["scenario", "scenario:D8", "tools", "dispose", "differs-from-original", "D6"])
def d8() -> Session:
    s = Session(calls(("c1", "t")))

    def body(e: Effect) -> Any:
        s.inject("accepted before disposal", "plugin:test")
        return HOLD
    s.handle("tool-execute", body, times=1)
    s.handle("tool-finalize", lambda e: ("resolve", result(contexts=[
        s.msg("accepted result context during disposal", "plugin:test")])))
    s.followup("go")
    s.run()
    mark = len(s.outputs)
    s.dispose()
    s.run()
    s.resolve("tool-execute", result())
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
                 "TR(1.1;c1;ERR ABORTED) UM('accepted result context during disposal';plugin:test) "
                 "SE(1.1) TE(1,disposed)")
    assert s.trace(durable=("TE",), effects=("step", "flush"), since=mark) == notation(
        "ctxdisc[accepted before disposal] abort(disposed) ⟨step 1.2⟩ [TE(1,disposed)] flush(1) "
        "settled(1,aborted) idle agent/disposed session/disposed")
    s.expect_live("enq(go,q) running deq(go,q) ctxdisc[accepted before disposal] "
                  "settled(1,aborted) idle agent/disposed session/disposed")
    return s



