"""Scenarios E (cancellation windows, keepInbox, disposal) and F (errors, retries, max-tokens,
flush barrier) of scenarios.md."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from machine.conformance.authoring import Session, calls, durable, error, live, notation, result, scenario
from machine.conformance.corpus.common import ABORT, FAILURE, Variant, live_of, started, variants
from machine.errors import InvariantError
from machine.io import Control, Effect, Live
from machine.jsonvalue import thaw


def streaming() -> Session:
    """The prompt 'go'; the model yields two chunks, then hangs until its signal is aborted."""
    s = started(hold="model")
    s.stream([{"type": "text", "text": "partial "}, {"type": "text", "text": "answer"}], end=False)
    s.pump()
    return s


# --------------------------------------------------------------------------
# E
# --------------------------------------------------------------------------


@scenario("E1-cancel-observer-work-cleared",
          "E1. Cancel notifies before clearing: a prompt queued by an agent/cancel-requested "
          "observer is discarded by the same cancel, reported with the first prompt; the wake "
          "finds nothing; a later cancel with nothing pending emits nothing",
          ["R16.2", "R16.1", "R6.2", "R19", "R20.1", "P7"], ["scenario", "scenario:E1", "cancel"])
def e1() -> Session:
    s = Session()
    seen: list[str] = []

    def observer(o: object) -> None:
        assert isinstance(o, Live)
        seen.append(thaw(o.event.payload)["cause"]["kind"])
        s.followup("queued by cancel observer")
    s.on(live("agent/cancel-requested"), observer)
    s.followup("drop me")
    s.cancel()
    s.run()
    mark = len(s.outputs)
    s.cancel("parent")
    s.run()
    assert s.outputs[mark:] == []            # the second cancel emits nothing
    assert seen == ["user"]
    assert s.log() == []
    s.expect_live("enq(drop me,q) cancel-req(user) enq(queued by cancel observer,q) "
                  "disc[drop me,queued by cancel observer]")
    assert s.trace(durable=(), effects=("tick",)) == notation(
        "tick(wake) enq(drop me,q) cancel-req(user) enq(queued by cancel observer,q) "
        "disc[drop me,queued by cancel observer]")
    assert not s.effects("prompt-submit")
    return s


@scenario("E2-idle-cancel-no-op",
          "E2. A cancel on an idle agent with nothing pending is a no-op that emits nothing and "
          "arms nothing: the next prompt runs normally",
          ["R16.1", "R16.4"], ["scenario", "scenario:E2", "cancel"])
def e2() -> Session:
    s = Session("ok")
    s.pump()
    mark = len(s.outputs)
    s.cancel()
    s.pump()
    assert s.live() == [] and s.outputs[mark:] == []
    s.followup("real prompt")
    s.run()
    s.expect_log("TS(1,msg:user) UM('real prompt') SS(1.1) RH(initial) CH… AM(1.1;'ok') SE(1.1) "
                 "TE(1,completed)")
    return s


@scenario("E3-keep-inbox-idle-no-op",
          "E3. keepInbox with nothing active is a silent no-op: the parked quiet item survives "
          "and runs before the waking prompt",
          ["R16.1", "R16.5", "R5.7"], ["scenario", "scenario:E3", "cancel"])
def e3() -> Session:
    s = Session("a", "b")
    s.send("preserved", {"target": "next-turn", "wakeup": False})
    s.cancel(keep_inbox=True)
    s.followup("wake it")
    s.run()
    s.expect_log("TS(1,msg:user) UM('preserved') SS(1.1) RH(initial) CH… AM(1.1;'a') SE(1.1) "
                 "TE(1,completed) TS(2,msg:user) UM('wake it') SS(2.1) CH… AM(2.1;'b') SE(2.1) "
                 "TE(2,completed)")
    assert not live_of(s, "cancel-req", "disc", "ctxdisc")
    return s


@scenario("E4-cancel-parked-quiet-item",
          "E4. Cancelling a parked quiet item is effective: cancel-requested, then the discard "
          "report; nothing runs later",
          ["R16.1", "R16.2", "R5.7"], ["scenario", "scenario:E4", "cancel"])
def e4() -> Session:
    s = Session()
    s.send("quiet", {"target": "next-turn", "wakeup": False})
    s.cancel()
    s.run()
    assert s.log() == []
    s.expect_live("enq(quiet,q) cancel-req(user) disc[quiet]")
    assert s.core.is_quiescent
    mark = len(s.outputs)
    s.run()
    assert s.outputs[mark:] == [] and s.core.pending_queued == 0
    return s


@scenario("E6-prompt-after-same-tick-cancel-runs",
          "E6. A prompt queued after a same-tick cancel still runs: the cancel discards the first "
          "prompt, the pending wake claims the second",
          ["R16.4", "R4.6", "R6.1", "R6.2", "R16.2"], ["scenario", "scenario:E6", "cancel"])
def e6() -> Session:
    s = Session("ok")
    s.followup("first")
    assert not s.core.is_quiescent
    s.cancel()
    s.followup("second")
    assert not s.core.is_quiescent
    s.run()
    assert s.core.is_quiescent
    s.expect_log("TS(1,msg:user) UM('second') SS(1.1) RH(initial) CH… AM(1.1;'ok') SE(1.1) "
                 "TE(1,completed)")
    s.expect_live("enq(first,q) cancel-req(user) disc[first] enq(second,q) running deq(second,q) "
                  "settled(1,completed) idle")
    return s


@scenario("E7-cancel-from-running-notification",
          "E7. A cancel from the agent/status('running') observer aborts the admission before "
          "prompt-submit is invoked; the claimed item is still dequeued; no turn, no discard",
          ["R7.4", "R7.5", "R16.4", "R19", "P15"], ["scenario", "scenario:E7", "cancel"])
def e7() -> Session:
    s = Session()
    s.on(live("agent/status", status="running"), lambda o: s.cancel())
    s.followup("go")
    s.run()
    assert s.log() == []
    s.expect_live("enq(go,q) running cancel-req(user) deq(go,q) idle")
    assert not s.effects("prompt-submit")
    return s


@scenario("E9-dispose-from-running-notification",
          "E9. dispose() from the running observer: no cancel-requested, the admission is "
          "aborted, idle, then agent/disposed and session/disposed",
          ["R17.1", "R7.5", "R19", "P15"], ["scenario", "scenario:E9", "dispose"])
def e9() -> Session:
    s = Session()
    s.on(live("agent/status", status="running"), lambda o: s.dispose())
    s.followup("go")
    s.run()
    assert s.log() == [] and not s.effects("model")
    assert s.core.status == "idle" and s.core.disposed
    s.expect_live("enq(go,q) running deq(go,q) idle agent/disposed session/disposed")
    return s


@scenario("E10a-cancel-from-idle-observer",
          "E10a. A cancel from the first idle observer discards only the prompt that observer "
          "queued; a later prompt runs normally",
          ["R16.4", "R19", "R6.1"], ["scenario", "scenario:E10", "cancel"])
def e10a() -> Session:
    s = Session("one", "two")
    quiescent: list[bool] = []

    def on_idle(o: object) -> None:
        s.followup("cancelled replacement")
        quiescent.append(s.core.is_quiescent)    # W = whenIdle(): pending
        s.cancel()
    s.on(live("agent/status", status="idle"), on_idle)
    s.followup("first")
    s.run()
    assert s.trace(durable=(), effects=())[-3:] == notation(
        "enq(cancelled replacement,q) cancel-req(user) disc[cancelled replacement]")
    assert quiescent == [False]
    assert s.core.is_quiescent and s.core.status == "idle"      # W completes
    assert len(s.effects("model")) == 1 and len(s.of("turn/start")) == 1
    s.followup("later")
    s.run()
    assert live_of(s, "cancel-req", "disc") == [
        "cancel-req(user)", "disc[cancelled replacement]"]
    assert [d["content"][0]["text"] for d in s.data("user/message")] == ["first", "later"]
    return s


@scenario("E10b-idle-observer-cancel-then-send",
          "E10b. On the first idle: followup, cancel, followup; only the surviving replacement "
          "runs, in a second running interval",
          ["R16.4", "R19", "R6.1", "R4.2"], ["scenario", "scenario:E10", "cancel"])
def e10b() -> Session:
    s = Session("one", "two")

    def on_idle(o: object) -> None:
        s.followup("cancelled replacement")
        s.cancel()
        s.followup("surviving replacement")
    s.on(live("agent/status", status="idle"), on_idle)
    s.followup("first")
    s.run()
    assert len(s.effects("model")) == 2
    assert [d["content"][0]["text"] for d in s.data("user/message")] == [
        "first", "surviving replacement"]
    assert s.live("agent/status") == ["running", "idle", "running", "idle"]
    return s


@scenario("E11-cancel-while-streaming-drops-tail",
          "E11. A cancel while the model streams discards the queued tail, aborts the turn "
          "signal; the model honours it, what it streamed before is kept as the step's "
          "interrupted assistant message (D15), the open step is closed and the turn ends "
          "aborted with no agent/error",
          ["R16.2", "R9.7", "R8.6", "R15.1", "R0.7", "D15"],
          ["scenario", "scenario:E11", "cancel", "differs-from-original", "D15"])
def e11() -> Session:
    s = streaming()
    mark = len(s.outputs)
    s.followup("queued tail")
    s.cancel()
    s.run()
    s.fail_model(ABORT)
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH CH "
                 "AM(1.1;'partial answer';interrupted) SE(1.1) TE(1,aborted)")
    s.expect_live("enq(go,q) running deq(go,q) enq(queued tail,q) cancel-req(user) "
                  "disc[queued tail] settled(1,aborted) idle")
    assert s.trace(durable=("SE", "TE"), effects=("flush",), since=mark) == notation(
        "enq(queued tail,q) cancel-req(user) disc[queued tail] abort(user) [SE(1.1)] "
        "[TE(1,aborted)] flush(1) settled(1,aborted) idle")
    assert len(s.effects("model")) == 1
    return s


@scenario("E12-cancel-discards-running-steering",
          "E12. A cancel discards steering staged during the running turn: reported in the inbox "
          "discard, never appended; no second step or turn; what the model streamed stays as the "
          "step's interrupted message (D15)",
          ["R16.2", "R5.3", "R15.1", "D15"],
          ["scenario", "scenario:E12", "cancel", "differs-from-original", "D15"])
def e12() -> Session:
    s = streaming()
    s.steer("steer text")
    s.cancel()
    s.run()
    s.fail_model(ABORT)
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH CH "
                 "AM(1.1;'partial answer';interrupted) SE(1.1) TE(1,aborted)")
    s.expect_live("enq(go,q) running deq(go,q) enq(steer text,s) cancel-req(user) "
                  "disc[steer text] settled(1,aborted) idle")
    return s


def _e14(dispose: bool) -> Session:
    """E14: a cancel (or, with *dispose*, a disposal) from a step/start observer."""
    s = Session("never")
    s.on(durable("step/start"), lambda o: s.dispose() if dispose else s.cancel())
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) SE(1.1) TE(1,%s)"
                 % ("disposed" if dispose else "aborted"))
    assert not s.effects("request") and not s.effects("model")
    return s


variants(
    Variant("E14a-cancel-from-step-start",
            "E14. A cancel from a step/start observer is noticed right after step/start: no "
            "request header, no request; the step is closed and the turn ends aborted",
            ["R9.5", "R4.5", "R8.6", "R15.1", "R19"], ["scenario", "scenario:E14", "cancel"],
            lambda: _e14(False)),
    Variant("E14b-dispose-from-step-start",
            "E14 (variant). dispose() from a step/start observer: the turn ends disposed, then "
            "teardown",
            ["R9.5", "R17.1", "R15.1", "R19"], ["scenario", "scenario:E14", "dispose"],
            lambda: _e14(True)),
)


def _e16(seam: str, dispose: bool) -> Session:
    """E16: a cancel (or, with *dispose*, a disposal) while {*seam*} is outstanding; the seam
    then answers."""
    s = started("never", hold=seam)
    if dispose:
        s.dispose()
    else:
        s.cancel()
    s.run()
    s.resolve(seam, None)
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') TE(1,%s)" % ("disposed" if dispose else "aborted"))
    assert not s.effects("model")
    if dispose:
        assert s.trace()[-2:] == ["agent/disposed", "session/disposed"]
    return s


#: E16's four variants: (id, title, the pending seam's rule, the seam, by disposal).
_E16 = (
    ("E16a-cancel-during-system-prompt", "E16a. A cancel while system-prompt assembly is "
     "pending: the check after assembly ends the turn aborted before step/start", "R9.3",
     "system-prompt", False),
    ("E16b-cancel-during-step-hook", "E16b. A cancel while the step extension point is "
     "pending: the check after it ends the turn aborted before step/start", "R9.1", "step",
     False),
    ("E16c-dispose-during-system-prompt", "E16a (disposal). dispose() while system-prompt "
     "assembly is pending: the turn ends disposed", "R9.3", "system-prompt", True),
    ("E16d-dispose-during-step-hook", "E16b (disposal). dispose() while the step extension "
     "point is pending: the turn ends disposed", "R9.1", "step", True),
)
variants(*(Variant(name, title, [rule, "R17.1" if dispose else "R8.6", "R15.1"],
                   ["scenario", "scenario:E16", "dispose" if dispose else "cancel"],
                   partial(_e16, seam, dispose))
           for name, title, rule, seam, dispose in _E16))


@scenario("E18a-first-cause-wins",
          "E18a. The first cause wins: cancel(parent) then cancel(user) while the model hangs; "
          "both emit cancel-requested, the abort reason is parent, the turn ends aborted (what "
          "the model streamed stays as the step's interrupted message, D15)",
          ["R16.3", "R15.1", "P5", "D15"],
          ["scenario", "scenario:E18", "cancel", "differs-from-original", "D15"])
def e18a() -> Session:
    s = streaming()
    s.cancel("parent")
    s.cancel("user")
    s.run()
    reason = s.core.signal_reason(thaw(s.held("model").payload)["signal"])
    assert reason is not None and reason.to_json() == {"kind": "parent"}
    s.fail_model(ABORT)
    s.run()
    assert live_of(s, "cancel-req") == [
        "cancel-req(parent)", "cancel-req(user)"]
    aborts = [o.to_json() for o in s.outputs if o.to_json().get("out") == "abort"]
    assert aborts == [{"out": "abort", "signal": 2, "reason": {"kind": "parent"}}]
    assert s.reasons()[-1] == {"kind": "aborted"}
    return s


@scenario("E18b-user-cancel-beats-later-disposal",
          "E18b. A user cancel beats a later disposal: the turn ends aborted (not disposed), "
          "settles aborted, then idle and teardown (what the model streamed stays as the "
          "step's interrupted message, D15)",
          ["R16.3", "R17.1", "R15.1", "D15"],
          ["scenario", "scenario:E18", "cancel", "dispose", "differs-from-original", "D15"])
def e18b() -> Session:
    s = streaming()
    mark = len(s.outputs)
    s.cancel()
    s.dispose()
    s.run()
    s.fail_model(ABORT)
    s.run()
    assert s.reasons() == [{"kind": "aborted"}]
    assert s.live()[-4:] == ["settled(1,aborted)", "idle", "agent/disposed", "session/disposed"]
    assert s.trace(durable=(), effects=(), controls=False, since=mark) == notation(
        "cancel-req(user) settled(1,aborted) idle agent/disposed session/disposed")
    return s


def _e19(seam: str, replies: list[Any], expected: str, *, answer: Any = None) -> Session:
    """E19: a cancel while {*seam*} is outstanding; the seam then returns *answer* normally and
    the log reads *expected*; the turn's one signal is the one aborted."""
    s = started(*replies, hold=seam)
    s.cancel()
    s.run()
    s.resolve(seam, answer)
    s.run()
    s.expect_log(expected)
    signals = {e.payload["signal"] for e in s.effects()
               if e.kind not in ("tick", "flush", "prompt-submit") and "signal" in e.payload}
    (abort,) = [o for o in s.outputs if isinstance(o, Control) and o.kind == "abort"]
    assert signals == {abort.payload["signal"]} == {s.effects(seam)[0].payload["signal"]}
    assert s.effects("prompt-submit")[0].payload["signal"] != abort.payload["signal"]
    return s


E19 = ["scenario", "scenario:E19", "cancel"]

variants(
    Variant("E19a-seam-system-prompt",
            "E19 (system-prompt assembly). A seam that waits for the abort and returns normally: "
            "the turn ends aborted before step/start",
            ["R0.7", "R9.3", "R16.4"], E19,
            lambda: _e19("system-prompt", ["x"], "TS(1,msg:user) UM('go') TE(1,aborted)")),
    Variant("E19b-seam-step-hook",
            "E19 (step handler). The step extension point returns normally after the abort: the "
            "turn ends aborted before step/start",
            ["R0.7", "R9.1", "R16.4"], E19,
            lambda: _e19("step", ["x"], "TS(1,msg:user) UM('go') TE(1,aborted)")),
    Variant("E19c-seam-request-hook",
            "E19 (request handler). The request extension point returns normally after the "
            "abort: no header, no model call; the open step is closed",
            ["R0.7", "R9.6", "R16.4"], E19,
            lambda: _e19("request", ["x"], "TS(1,msg:user) UM('go') SS(1.1) SE(1.1) TE(1,aborted)",
                         answer={"config": {"provider": "test", "model": "test-model"}})),
    Variant("E19d-seam-turn-stopping",
            "E19 (turn-stopping handler). turn-stopping returns normally after the abort: the "
            "check after it ends the turn aborted after the completed step",
            ["R0.7", "R8.5", "R16.4"], E19,
            lambda: _e19("turn-stopping", ["x"], "TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… "
                         "AM(1.1;'x') SE(1.1) TE(1,aborted)")),
    Variant("E19e-seam-tool-body",
            "E19 (tool body). A tool body that returns a success after the abort is committed "
            "with the aborted result; the turn ends aborted at the next step's check",
            ["R0.7", "R10.11", "R10.8", "R16.4"], [*E19, "tools"],
            lambda: _e19("tool-execute", [calls(("c1", "t"))],
                         "TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) "
                         "TC(1.1;c1) TR(1.1;c1;ERR ABORTED) SE(1.1) TE(1,aborted)",
                         answer=result())),
)


@scenario("E21-dispose-then-raise-in-step-hook",
          "E21. A step handler that disposes and then raises: the failure is classified as the "
          "abort (disposed), with no agent/error; the turn settles aborted",
          ["R15.1", "R17.1", "R9.1"], ["scenario", "scenario:E21", "dispose"])
def e21() -> Session:
    s = Session()

    def step_hook(e: Effect) -> Any:
        s.dispose()
        return ("raise", error("after dispose"))
    s.handle("step", step_hook)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') TE(1,disposed)")
    assert not live_of(s, "error")
    assert s.live("agent/settled") == ["settled(1,aborted)"]
    return s


# --------------------------------------------------------------------------
# F
# --------------------------------------------------------------------------

@scenario("F1-model-failure-is-turn-error",
          "F1. A raised model failure is a request failure: step/end, the request-error "
          "extension point (default: no retry), one agent/error, turn/end with the failure facts, "
          "flush, settled error",
          ["R9.7", "R13.1", "R13.2", "R15.2", "V19"], ["scenario", "scenario:F1"])
def f1() -> Session:
    s = started(FAILURE, prompt="hi")
    s.expect_log("TS(1,msg:user) UM('hi') SS(1.1) RH(initial) SE(1.1) TE(1,error)")
    assert s.reasons() == [{"kind": "error", "step": 1, "failure": {
        "message": "model unavailable", "code": "UNAVAILABLE"}}]
    trace = s.trace()
    assert trace[trace.index("⟨model 1.1⟩"):] == [
        "⟨model 1.1⟩", "[SE(1.1)]", "⟨request-error 1.1⟩", "error(1,1,'model unavailable')",
        "[TE(1,error)]", "flush(1)", "settled(1,error)", "idle"], trace
    assert live_of(s, "error") == ["error(1,1,'model unavailable')"]
    return s


def _finish_failure(kind: str, failure: dict[str, Any], *, carried: bool = True
                    ) -> Callable[[], Session]:
    """A finish chunk of *kind* (carrying *failure* if *carried*): the failure facts become the
    durable error reason."""
    def play() -> Session:
        finish: dict[str, Any] = {"type": "finish", "kind": kind}
        if carried:
            finish["failure"] = failure
        s = started([finish])
        s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH SE(1.1) TE(1,error)")
        assert s.reasons() == [{"kind": "error", "step": 1, "failure": failure}]
        return s
    return play


variants(
    Variant("F2a-error-finish-chunk",
            "F2. An error finish chunk is appended as a chunk; its failure facts become the "
            "durable error reason; no assistant message",
            ["R9.7", "R13.1", "R15.2", "V18"], ["scenario", "scenario:F2"],
            _finish_failure("error", {"message": "provider 401", "code": "AUTH", "status": 401,
                                      "providerRetryAfterMs": 2000, "requestId": "req-1"})),
    Variant("F2b-aborted-finish-with-failure",
            "F2 (variant). An aborted finish carrying a failure gives the same shape with that "
            "failure",
            ["R9.7", "R13.1", "R15.2"], ["scenario", "scenario:F2"],
            _finish_failure("aborted", {"message": "stopped upstream", "code": "ABORTED"})),
    Variant("F2c-aborted-finish-default-failure",
            "F2 (variant). An aborted finish without a failure uses {message:'model request "
            "aborted', code:'ABORTED'} and is a request failure (D12)",
            ["R9.7", "R13.1", "R15.2", "D12"],
            ["scenario", "scenario:F2", "differs-from-original", "D12"],
            _finish_failure("aborted", {"message": "model request aborted", "code": "ABORTED"},
                            carried=False)),
)


@scenario("F5-raising-recovery-no-retry",
          "F5. A raising request-error handler means no retry: the warning 'request recovery "
          "failed: <rendered>', one turn, settled error",
          ["R13.2", "R15.2"], ["scenario", "scenario:F5"])
def f5() -> Session:
    s = Session(FAILURE)
    s.handle("request-error", lambda e: ("raise", error("recovery broke")))
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,error)")
    assert "warn('request recovery failed: recovery broke')" in s.live()
    assert s.live("agent/settled") == ["settled(1,error)"]
    assert len(s.effects("model")) == 1
    return s


@scenario("F6-request-hook-failure-is-generic",
          "F6. A failure of the request extension point is a generic failure, not a request "
          "failure: no recovery, no model call, no header; reason error with message and code",
          ["R13.1", "R15.3", "R9.6", "R8.6"], ["scenario", "scenario:F6"])
def f6() -> Session:
    s = Session()
    s.handle("request", lambda e: ("raise", error("middleware failed", "MiddlewareError",
                                                  "MIDDLEWARE")))
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) SE(1.1) TE(1,error)")
    assert s.reasons() == [{"kind": "error", "step": 1, "message": "middleware failed",
                            "code": "MIDDLEWARE"}]
    assert not s.effects("request-error") and not s.effects("model")
    return s


@scenario("F7a-turn-start-cannot-be-vetoed",
          "F7a. turn/start cannot be vetoed (D7): a pre-commit observer vetoes the next append, "
          "turn 1's turn/start (P14), and nothing changes: the prompt is recorded and the core "
          "runs both turns with turn numbers 1 and 2",
          ["D7", "R8.2", "L11", "P14"], ["scenario", "scenario:F7", "differs-from-original", "D7"])
def f7a() -> Session:
    s = Session("one", "two")
    s.on(live("agent/inbox/dequeue"), lambda _o: s.observer_vetoes())
    s.followup("first")
    s.run()
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('first') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "TE(1,completed) TS(2,msg:user) UM('go') SS(2.1) CH… AM(2.1;'two') SE(2.1) "
                 "TE(2,completed)")
    assert not s.live("agent/error") and len(s.effects("model")) == 2
    return s


@scenario("F7b-direct-turn-start-append-refused",
          "F7b. A direct append of turn/start{turn:2} during turn 1 (from the step extension "
          "point) is refused by the session invariants; nothing is appended, no seq is "
          "consumed, and the turn completes",
          ["R20.2", "R0.6", "L2", "L4"], ["scenario", "scenario:F7"])
def f7b() -> Session:
    s = Session("one")

    def step_hook(e: Effect) -> Any:
        before = len(s.core.log)
        try:
            s.core.append("turn/start", {"turn": 2, "trigger": {"kind": "retry"}})
        except InvariantError as exc:   # refused before commit (L2): the recorder records it
            s.caught.append(str(exc))
            assert "turn 1 is still open" in str(exc), exc
        else:
            raise AssertionError("a second turn/start was appended inside turn 1")
        assert len(s.core.log) == before == 2
        return None
    s.handle("step", step_hook, times=1)
    s.followup("first")
    s.run()
    s.expect_log("TS(1,msg:user) UM('first') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "TE(1,completed)")
    return s


@scenario("F8-step-end-cannot-be-vetoed",
          "F8. step/end cannot be vetoed (D7): a pre-commit observer vetoes the next append, the "
          "step's step/end (P14), and nothing changes: exactly one TS, SS, SE and TE, reason "
          "completed",
          ["D7", "R9.10", "L11", "P14"], ["scenario", "scenario:F8", "differs-from-original", "D7"])
def f8() -> Session:
    s = Session("ok")
    s.on(durable("assistant/message"), lambda _o: s.observer_vetoes())
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'ok') SE(1.1) "
                 "TE(1,completed)")
    assert not s.live("agent/error")
    return s


@scenario("F9a-flush-is-a-barrier",
          "F9a. The post-turn flush is a barrier: while it is pending the agent stays running "
          "and the queued second prompt waits; after the flush, settled, then the next claim",
          ["R12.4", "R12.5", "R12.8", "R4.2"],
          ["scenario", "scenario:F9"])
def f9a() -> Session:
    s = Session("one", "two")
    s.hold("flush")
    s.followup("first")
    s.followup("second")
    s.run()
    assert s.core.status == "running" and "TS(2,msg:user)" not in s.log()
    assert not s.core.is_quiescent and [e.payload["turn"] for e in s.effects("flush")] == [1]
    assert len(s.effects("model")) == 1
    s.resolve("flush")
    s.run()
    assert len(s.effects("model")) == 2
    trace = s.trace(durable=("TE",), effects=("flush",))
    assert trace[trace.index("[TE(1,completed)]"):] == notation(
        "[TE(1,completed)] flush(1) settled(1,completed) deq(second,q) [TE(2,completed)] flush(2) "
        "settled(2,completed) idle")
    s.expect_live("enq(first,q) enq(second,q) running deq(first,q) settled(1,completed) "
                  "deq(second,q) settled(2,completed) idle")
    assert [e.payload["turn"] for e in s.effects("flush")] == [1, 2]
    return s


@scenario("F9b-flush-failure-reported",
          "F9b. A failed flush is reported (warning and agent/error with the turn's last step) "
          "and work continues: settled completed, then the next turn",
          ["R12.4", "R12.5", "R3.1"], ["scenario", "scenario:F9"])
def f9b() -> Session:
    s = Session("one", "two")
    s.handle("flush", lambda e: ("raise", error("disk unavailable")), times=1)
    s.followup("first")
    s.followup("second")
    s.run()
    assert live_of(s, "error") == ["error(1,1,'disk unavailable')"]
    assert "warn('session flush failed at turn 1: disk unavailable')" in s.live()
    assert "settled(1,completed)" in s.live() and len(s.effects("flush")) == 2
    assert s.live("agent/settled") == ["settled(1,completed)", "settled(2,completed)"]
    assert s.reasons() == [{"kind": "completed"}, {"kind": "completed"}]
    assert len(s.effects("model")) == 2
    return s


@scenario("F10-max-tokens-single-step",
          "F10. A max-tokens finish keeps the text, runs turn-stopping, and the turn ends "
          "max-tokens while settling completed",
          ["R14.1", "R14.2", "R14.3", "V20"], ["scenario", "scenario:F10"])
def f10() -> Session:
    s = started([{"type": "text", "text": "truncat"}, {"type": "finish", "kind": "max-tokens"}])
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'truncat') SE(1.1) "
                 "TE(1,max-tokens)")
    assert len(s.effects("turn-stopping")) == 1 and len(s.effects("model")) == 1
    assert s.live("agent/settled") == ["settled(1,completed)"]
    return s


@scenario("F12a-max-tokens-drops-tool-calls",
          "F12. max-tokens never dispatches truncated tool calls: the assistant message is "
          "appended with empty content and the usage; no tool stage runs",
          ["R14.1", "R9.8", "L13"], ["scenario", "scenario:F12", "tools"])
def f12a() -> Session:
    usage = {"outputTokens": 4096}
    s = Session([{"type": "tool-call", "id": "c1", "name": "t", "arguments": "{}"},
                 {"type": "usage", "usage": usage}, {"type": "finish", "kind": "max-tokens"}], "next")
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;[]) SE(1.1) "
                 "TE(1,max-tokens)")
    am = s.data("assistant/message")[0]
    assert set(am) == {"turn", "step", "message", "usage"} and am["usage"] == usage
    assert (am["turn"], am["step"]) == (1, 1)
    assert am["message"]["content"] == []
    assert s.history() == ["'go'"]
    assert not [e for e in s.effects() if e.kind.startswith("tool-")]
    return s


@scenario("F12b-max-tokens-keeps-text-before-call",
          "F12 (variant). Text before a truncated call is kept; the call is dropped",
          ["R14.1", "R9.8"], ["scenario", "scenario:F12", "tools"])
def f12b() -> Session:
    s = Session([{"type": "text", "text": "partial"},
                 {"type": "tool-call", "id": "c1", "name": "t", "arguments": "{}"},
                 {"type": "finish", "kind": "max-tokens"}])
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'partial') SE(1.1) "
                 "TE(1,max-tokens)")
    return s

