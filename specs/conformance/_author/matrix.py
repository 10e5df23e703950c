"""The reentrancy matrix (semantics.md §19): one vector per row and command.

Every vector issues one command (steer 'S', inject 'C' from plugin:test,
followup 'F', cancel, or dispose) at the row's position: as an observer of
the named output, or while the named extension point is pending (an
observer of its effect request). The review asserts the matrix cell.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from machine.conformance.authoring import (
    Predicate,
    Session,
    calls,
    control,
    durable,
    effect,
    error,
    live,
    model_failure,
    result,
    scenario,
)

ROWS = {
    1: "agent/inbox/enqueue of an idle waking send (wake pending)",
    2: "agent/status('running'), the claimed item's dequeue, the prompt-submit extension point",
    3: "turn/start observers",
    4: "observers of the run-start drains and of the prompt and context appends",
    5: "the step extension point",
    6: "system-prompt assembly, step/start, the request extension point, request/header, "
       "the model call and assistant/chunk",
    7: "assistant/message observers, tool stages, tool/call and tool/result observers",
    8: "observers of the end-of-step drain's outputs",
    9: "step/end observers",
    10: "the turn-stopping extension point",
    11: "the request-error extension point and agent/error observers inside a turn",
    12: "turn/end observers",
    13: "during the post-turn flush",
    14: "agent/settled observers",
    15: "the rejected-admission tail",
    16: "agent/status('idle') observers",
    17: "agent/cancel-requested observers",
    18: "agent/inbox/discard, agent/context/discard and abort-signal observers",
    19: "agent/session-start observers",
}

FAILURE = model_failure("model unavailable", "UNAVAILABLE")
ABORT = error("the signal was aborted", "AbortError")
RETRY: Any = ("resolve", {"kind": "retry"})
TWO_TURNS = ("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) TE(1,completed) "
             "TS(2,msg:user) UM('F') SS(2.1) CH… AM(2.1;'two') SE(2.1) TE(2,completed)")
ONE_TURN = "TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) TE(1,completed)"


def cell(row: int, command: str, title: str, rules: Sequence[str], tags: Sequence[str] = ()
         ) -> Callable[[Callable[[], Session]], Callable[[], Session]]:
    return scenario(f"M{row:02d}-{command}", f"§19 row {row} ({ROWS[row]}), {command}: {title}",
                    ["R19", *rules], ["matrix", f"matrix:row{row}", *tags])


def issue(s: Session, command: str) -> None:
    if command == "steer":
        s.steer("S")
    elif command == "inject":
        s.inject("C", "plugin:test")
    elif command == "followup":
        s.followup("F")
    elif command == "cancel":
        s.cancel()
    elif command == "dispose":
        s.dispose()
    else:  # pragma: no cover
        raise ValueError(command)


def at(s: Session, predicate: Predicate, command: str, *, nth: int = 1) -> None:
    s.on(predicate, lambda o: issue(s, command), nth=nth)


def basic(position: Predicate, command: str, *replies: Any, nth: int = 1) -> Session:
    s = Session(*(replies or ("one", "two")))
    at(s, position, command, nth=nth)
    s.followup("go")
    s.run()
    return s


def teardown_ok(s: Session) -> None:
    assert s.live()[-2:] == ["agent/disposed", "session/disposed"], s.live()
    assert not [t for t in s.live() if t.startswith("cancel-req(disposed")]
    assert s.core.disposed


# --------------------------------------------------------------------------
# Row 1: enqueue of an idle waking send
# --------------------------------------------------------------------------

ENQ_GO = live("agent/inbox/enqueue")


@cell(1, "steer", "queued; its own later turn", ["R5.3", "R6.1", "R6.3"])
def m01_steer() -> Session:
    s = basic(ENQ_GO, "steer")
    s.expect_log(TWO_TURNS.replace("'F'", "'S'"))
    assert s.live()[:2] == ["enq(go,q)", "enq(S,q)"] and len(s.effects("tick")) == 1
    return s


@cell(1, "inject", "appended at once, before that turn", ["R5.2", "R6.3"])
def m01_inject() -> Session:
    s = basic(ENQ_GO, "inject")
    s.expect_log("UM('C';plugin:test) " + ONE_TURN)
    return s


@cell(1, "followup", "queued; its own later turn", ["R5.3", "R6.1"])
def m01_followup() -> Session:
    s = basic(ENQ_GO, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(1, "cancel", "effective: discards the item just enqueued; the wake finds nothing",
      ["R16.1", "R16.2", "R16.4", "R6.2"], ["cancel"])
def m01_cancel() -> Session:
    s = basic(ENQ_GO, "cancel")
    assert s.log() == []
    s.expect_live("enq(go,q) cancel-req(user) disc[go]")
    return s


@cell(1, "dispose", "discards the item (no cancel-requested); the wake finds nothing; teardown",
      ["R17.1", "R16.2", "R6.2"], ["dispose"])
def m01_dispose() -> Session:
    s = basic(ENQ_GO, "dispose")
    assert s.log() == []
    s.expect_live("enq(go,q) disc[go] agent/disposed session/disposed")
    return s


# --------------------------------------------------------------------------
# Row 2: admission
# --------------------------------------------------------------------------

RUNNING = live("agent/status", status="running")
DEQ_GO = live("agent/inbox/dequeue", placement="queued")
PROMPT_SUBMIT = effect("prompt-submit")


@cell(2, "steer", "(at running) steering; drained after the prompt by the rest drain",
      ["R5.3", "R7.3", "R8.3", "R11.2"])
def m02_steer() -> Session:
    s = basic(RUNNING, "steer")
    s.expect_log("TS(1,msg:user) UM('go') STM(1;'S';user) SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "SE(1.1) TE(1,completed)")
    assert "enq(S,s)" in s.live()
    return s


@cell(2, "inject", "(at the claimed item's dequeue) staged; appended after the prompt",
      ["R5.2", "R7.6", "R8.3"])
def m02_inject() -> Session:
    s = basic(DEQ_GO, "inject")
    s.expect_log("TS(1,msg:user) UM('go') UM('C';plugin:test) SS(1.1) RH(initial) CH… "
                 "AM(1.1;'one') SE(1.1) TE(1,completed)")
    return s


@cell(2, "followup", "(during prompt-submit) queued; its own turn after this one",
      ["R5.3", "R12.7"])
def m02_followup() -> Session:
    s = basic(PROMPT_SUBMIT, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(2, "cancel", "(during prompt-submit) aborts the admission; its decision is ignored; no turn",
      ["R7.7", "R7.10", "R16.4"], ["cancel"])
def m02_cancel() -> Session:
    s = basic(PROMPT_SUBMIT, "cancel")
    assert s.log() == []
    s.expect_live("enq(go,q) running cancel-req(user) deq(go,q) idle")
    return s


@cell(2, "dispose", "(at the claimed item's dequeue) aborts the admission; no turn; teardown",
      ["R17.1", "R7.7"], ["dispose"])
def m02_dispose() -> Session:
    s = basic(DEQ_GO, "dispose")
    assert s.log() == []
    teardown_ok(s)
    return s


# --------------------------------------------------------------------------
# Rows 3 and 4: turn/start and the run-start appends
# --------------------------------------------------------------------------

TURN_START = durable("turn/start")
PROMPT_UM = durable("user/message", id="m1")


@cell(3, "steer", "steering; drained after the prompt", ["R8.3", "R11.2"])
def m03_steer() -> Session:
    s = basic(TURN_START, "steer")
    s.expect_log("TS(1,msg:user) UM('go') STM(1;'S';user) SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "SE(1.1) TE(1,completed)")
    return s


@cell(3, "inject", "staged; appended after the prompt", ["R8.3", "R11.2"])
def m03_inject() -> Session:
    s = basic(TURN_START, "inject")
    s.expect_log("TS(1,msg:user) UM('go') UM('C';plugin:test) SS(1.1) RH(initial) CH… "
                 "AM(1.1;'one') SE(1.1) TE(1,completed)")
    return s


@cell(3, "followup", "queued; its own turn", ["R5.3"])
def m03_followup() -> Session:
    s = basic(TURN_START, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(3, "cancel", "the prompt is still recorded; turn/end(aborted) with no step",
      ["R8.3", "R26.4", "R15.1"], ["cancel"])
def m03_cancel() -> Session:
    s = basic(TURN_START, "cancel")
    s.expect_log("TS(1,msg:user) UM('go') TE(1,aborted)")
    return s


@cell(3, "dispose", "the prompt is still recorded; turn/end(disposed) with no step; teardown",
      ["R8.3", "R17.1", "R15.1"], ["dispose"])
def m03_dispose() -> Session:
    s = basic(TURN_START, "dispose")
    s.expect_log("TS(1,msg:user) UM('go') TE(1,disposed)")
    teardown_ok(s)
    return s


@cell(4, "steer", "(at the prompt's append) joins the rest drain (D3)",
      ["R8.3", "R11.1", "D3"], ["differs-from-original", "D3"])
def m04_steer() -> Session:
    s = basic(PROMPT_UM, "steer")
    s.expect_log("TS(1,msg:user) UM('go') STM(1;'S';user) SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "SE(1.1) TE(1,completed)")
    return s


@cell(4, "inject", "(at the prompt's append) joins the rest drain (D3)",
      ["R8.3", "R11.1", "D3"], ["differs-from-original", "D3"])
def m04_inject() -> Session:
    s = basic(PROMPT_UM, "inject")
    s.expect_log("TS(1,msg:user) UM('go') UM('C';plugin:test) SS(1.1) RH(initial) CH… "
                 "AM(1.1;'one') SE(1.1) TE(1,completed)")
    return s


@cell(4, "followup", "queued", ["R5.3"])
def m04_followup() -> Session:
    s = basic(PROMPT_UM, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(4, "cancel", "the signal check after the appends ends the turn aborted with no step/start",
      ["R8.3", "R15.1"], ["cancel"])
def m04_cancel() -> Session:
    s = basic(PROMPT_UM, "cancel")
    s.expect_log("TS(1,msg:user) UM('go') TE(1,aborted)")
    return s


# --------------------------------------------------------------------------
# Row 5: the step extension point
# --------------------------------------------------------------------------

STEP = effect("step")


@cell(5, "steer", "taken by the top-of-step drain into the same request; no extra step",
      ["R9.2", "R11.2"])
def m05_steer() -> Session:
    s = basic(STEP, "steer")
    s.expect_log("TS(1,msg:user) UM('go') STM(1;'S';user) SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "SE(1.1) TE(1,completed)")
    assert s.requests() == [["'go'", "'S'"]]
    return s


@cell(5, "inject", "taken by the top-of-step drain into the same request", ["R9.2", "R11.2"])
def m05_inject() -> Session:
    s = basic(STEP, "inject")
    s.expect_log("TS(1,msg:user) UM('go') UM('C';plugin:test) SS(1.1) RH(initial) CH… "
                 "AM(1.1;'one') SE(1.1) TE(1,completed)")
    assert s.requests() == [["'go'", "'C';plugin:test"]]
    return s


@cell(5, "followup", "queued", ["R5.3"])
def m05_followup() -> Session:
    s = basic(STEP, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(5, "cancel", "the check after the step extension point ends the turn aborted; no step/start",
      ["R9.1", "R15.1"], ["cancel"])
def m05_cancel() -> Session:
    s = basic(STEP, "cancel")
    s.expect_log("TS(1,msg:user) UM('go') TE(1,aborted)")
    return s


@cell(5, "dispose", "the turn ends disposed with no step/start; teardown",
      ["R9.1", "R17.1", "R15.1"], ["dispose"])
def m05_dispose() -> Session:
    s = basic(STEP, "dispose")
    s.expect_log("TS(1,msg:user) UM('go') TE(1,disposed)")
    teardown_ok(s)
    return s


# --------------------------------------------------------------------------
# Row 6: inside the step, after the top-of-step drain
# --------------------------------------------------------------------------


@cell(6, "steer", "(at step/start) end-of-step drain; forces another step",
      ["R9.10", "R11.2", "R8.4"])
def m06_steer() -> Session:
    s = basic(durable("step/start"), "steer")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') STM(1;'S';user) "
                 "SE(1.1) SS(1.2) CH… AM(1.2;'two') SE(1.2) TE(1,completed)")
    assert s.requests()[0] == ["'go'"]
    return s


@cell(6, "inject", "(at the first assistant/chunk) end-of-step drain; no extra step",
      ["R9.10", "R11.2", "R9.7"])
def m06_inject() -> Session:
    s = basic(durable("assistant/chunk"), "inject")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "UM('C';plugin:test) SE(1.1) TE(1,completed)")
    return s


@cell(6, "followup", "(during the request extension point) queued", ["R5.3"])
def m06_followup() -> Session:
    s = basic(effect("request"), "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(6, "cancel", "(during the model call) the next chunk's signal check releases the stream; "
      "the open step is closed and the turn ends aborted", ["R9.7", "R8.6", "R15.1", "P5"],
      ["cancel"])
def m06_cancel() -> Session:
    s = Session()
    s.hold("model")
    at(s, effect("model"), "cancel")
    s.followup("go")
    s.run()
    model = s.held("model")
    s.core.chunk(model.id, {"type": "text", "text": "late"})
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,aborted)")
    trace = s.trace()
    assert trace[trace.index("abort"):trace.index("[SE(1.1)]")] == ["abort", "release"], trace
    assert not s.driver.held
    return s


@cell(6, "dispose", "(at request/header) the turn ends disposed after closing the step; teardown",
      ["R9.7", "R17.1", "R15.1"], ["dispose"])
def m06_dispose() -> Session:
    s = basic(durable("request/header"), "dispose")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,disposed)")
    teardown_ok(s)
    return s


# --------------------------------------------------------------------------
# Row 7: the tool batch
# --------------------------------------------------------------------------

TOOL_TURN = ("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
             "TR(1.1;c1;ok) {} SE(1.1) SS(1.2) CH… AM(1.2;'done') SE(1.2) TE(1,completed)")


@cell(7, "steer", "(during the tool body) after all results of the step; forces another step",
      ["R10.5", "R9.10", "R8.4"], ["tools"])
def m07_steer() -> Session:
    s = basic(effect("tool-execute"), "steer", calls(("c1", "t")), "done")
    s.expect_log(TOOL_TURN.format("STM(1;'S';user)"))
    return s


@cell(7, "inject", "(at tool/result) after all results of the step", ["R10.5", "R9.10"], ["tools"])
def m07_inject() -> Session:
    s = basic(durable("tool/result"), "inject", calls(("c1", "t")), "done")
    s.expect_log(TOOL_TURN.format("UM('C';plugin:test)"))
    return s


@cell(7, "followup", "(at tool/call) queued", ["R5.3"], ["tools"])
def m07_followup() -> Session:
    s = basic(durable("tool/call"), "followup", calls(("c1", "t")), "done", "two")
    s.expect_log(TOOL_TURN.format("") + " TS(2,msg:user) UM('F') SS(2.1) CH… AM(2.1;'two') "
                 "SE(2.1) TE(2,completed)")
    return s


@cell(7, "cancel", "(during the second call's body) the turn ends aborted; the tool context "
      "already accepted is dropped and reported; the context finalized afterwards survives",
      ["R10.7", "R10.11", "R16.2", "D6", "R10.4"], ["tools", "cancel", "differs-from-original", "D6"])
def m07_cancel() -> Session:
    s = Session(calls(("c1", "t"), ("c2", "t")))
    s.handle("tool-finalize", lambda e: ("resolve", result(contexts=[
        s.msg(f"ctx-{e.payload['callId']}", "plugin:p")])))
    at(s, effect("tool-execute", callId="c2"), "cancel")
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1+call c2) "
                 "TC(1.1;c1) TR(1.1;c1;ok) TC(1.1;c2) TR(1.1;c2;ERR ABORTED) UM('ctx-c2';plugin:p) "
                 "SE(1.1) TE(1,aborted)")
    assert "ctxdisc[ctx-c1]" in s.live()
    return s


@cell(7, "dispose", "(at assistant/message) the call gets a synthetic pair; the turn ends "
      "disposed; teardown", ["R10.7", "R17.1"], ["tools", "dispose"])
def m07_dispose() -> Session:
    s = basic(durable("assistant/message"), "dispose", calls(("c1", "t")))
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
                 "TR(1.1;c1;ERR ABD) SE(1.1) TE(1,disposed)")
    teardown_ok(s)
    return s


# --------------------------------------------------------------------------
# Row 8: observers of the end-of-step drain's outputs
# --------------------------------------------------------------------------


def late_context(command: str, *replies: Any) -> Session:
    """A context injected during the request hook is appended by the end-of-step drain; the
    command is issued by an observer of that append."""
    s = Session(*(replies or ("one", "two")))
    s.handle("request", lambda e: s.inject("late", "plugin:test"), times=1)
    at(s, durable("user/message", id="m2"), command)
    s.followup("go")
    s.run()
    return s


@cell(8, "steer", "joins the same drain (D3); forces another step",
      ["R11.1", "R9.10", "D3"], ["differs-from-original", "D3"])
def m08_steer() -> Session:
    s = late_context("steer")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "UM('late';plugin:test) STM(1;'S';user) SE(1.1) SS(1.2) CH… AM(1.2;'two') SE(1.2) "
                 "TE(1,completed)")
    return s


@cell(8, "inject", "joins the same drain (D3)", ["R11.1", "R9.10", "D3"],
      ["differs-from-original", "D3"])
def m08_inject() -> Session:
    s = late_context("inject")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "UM('late';plugin:test) UM('C';plugin:test) SE(1.1) TE(1,completed)")
    return s


@cell(8, "followup", "queued", ["R5.3"])
def m08_followup() -> Session:
    s = late_context("followup")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "UM('late';plugin:test) SE(1.1) TE(1,completed) TS(2,msg:user) UM('F') SS(2.1) "
                 "CH… AM(2.1;'two') SE(2.1) TE(2,completed)")
    return s


@cell(8, "cancel", "step/end is still appended; the turn ends aborted at the next check",
      ["R9.10", "R8.5", "R15.1"], ["cancel"])
def m08_cancel() -> Session:
    s = late_context("cancel")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "UM('late';plugin:test) SE(1.1) TE(1,aborted)")
    return s


# --------------------------------------------------------------------------
# Row 9: step/end observers
# --------------------------------------------------------------------------

STEP_END = durable("step/end")


@cell(9, "steer", "next step, without turn-stopping", ["R8.4", "R9.2"])
def m09_steer() -> Session:
    s = basic(STEP_END, "steer")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "STM(1;'S';user) SS(1.2) CH… AM(1.2;'two') SE(1.2) TE(1,completed)")
    assert len(s.effects("turn-stopping")) == 1
    trace = s.trace()
    assert trace.index("⟨turn-stopping 1⟩") > trace.index("[SE(1.2)]")
    return s


@cell(9, "inject", "the turn does not continue: taken by the turn-stopping drain, inside the turn",
      ["R8.5", "R11.2"])
def m09_inject() -> Session:
    s = basic(STEP_END, "inject")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "UM('C';plugin:test) TE(1,completed)")
    return s


@cell(9, "followup", "queued", ["R5.3"])
def m09_followup() -> Session:
    s = basic(STEP_END, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(9, "cancel", "the turn ends aborted at the next check", ["R8.5", "R15.1"], ["cancel"])
def m09_cancel() -> Session:
    s = basic(STEP_END, "cancel")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "TE(1,aborted)")
    return s


@cell(9, "steer-retained", "after a step that concluded the turn, the steering is retained and "
      "taken by the next admitted turn's inherited drain, before its prompt",
      ["R11.3", "R10.6", "R8.3", "R7.2", "R26.2"], ["tools"])
def m09_steer_retained() -> Session:
    s = Session(calls(("c1", "t")), "next reply")
    s.handle("tool-execute", lambda e: ("resolve", result(concludesTurn=True)))
    at(s, STEP_END, "steer")
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
                 "TR(1.1;c1;ok) SE(1.1) TE(1,completed)")
    assert s.core.pending_steering == 1 and not s.effects("turn-stopping")
    s.followup("next")
    s.run()
    assert s.log()[-8:] == ["TS(2,msg:user)", "STM(2;'S';user)", "UM('next')", "SS(2.1)", "CH…",
                            "AM(2.1;'next reply')", "SE(2.1)", "TE(2,completed)"]
    return s


# --------------------------------------------------------------------------
# Row 10: turn-stopping
# --------------------------------------------------------------------------

TURN_STOPPING = effect("turn-stopping")


@cell(10, "steer", "another step", ["R8.5"])
def m10_steer() -> Session:
    s = basic(TURN_STOPPING, "steer")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "STM(1;'S';user) SS(1.2) CH… AM(1.2;'two') SE(1.2) TE(1,completed)")
    return s


@cell(10, "inject", "inside the turn after the last step/end", ["R8.5", "D3"],
      ["differs-from-original", "D3"])
def m10_inject() -> Session:
    s = basic(TURN_STOPPING, "inject")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "UM('C';plugin:test) TE(1,completed)")
    return s


@cell(10, "followup", "queued", ["R5.3"])
def m10_followup() -> Session:
    s = basic(TURN_STOPPING, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(10, "cancel", "turn/end(aborted); no further step", ["R8.5", "R15.1"], ["cancel"])
def m10_cancel() -> Session:
    s = basic(TURN_STOPPING, "cancel")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "TE(1,aborted)")
    return s


# --------------------------------------------------------------------------
# Row 11: request-error and agent/error inside a turn
# --------------------------------------------------------------------------

FAILED_TURN = "TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,error)"


def failing(position: Predicate, command: str, *, retry: bool, replies: Sequence[Any] = ("ok",)
            ) -> Session:
    s = Session(FAILURE, *replies)
    if retry:
        s.handle("request-error", lambda e: RETRY, times=1)
    at(s, position, command)
    s.followup("go")
    s.run()
    return s


@cell(11, "steer", "(during request-error, retry authorized) staged and retained: taken by the "
      "retry turn's start", ["R13.3", "R11.3", "R11.2"])
def m11_steer() -> Session:
    s = failing(effect("request-error"), "steer", retry=True)
    s.expect_log(FAILED_TURN + " TS(2,retry) STM(2;'S';user) SS(2.1) CH… AM(2.1;'ok') SE(2.1) "
                 "TE(2,completed)")
    assert [t for t in s.live() if t.startswith("settled")] == ["settled(2,completed)"]
    return s


@cell(11, "inject", "(at agent/error, no retry) staged and retained: taken by the next admitted "
      "turn, before its prompt", ["R11.3", "R8.3", "R26.2"])
def m11_inject() -> Session:
    s = failing(live("agent/error"), "inject", retry=False)
    s.expect_log(FAILED_TURN)
    assert s.core.pending_context == 1
    s.followup("next")
    s.run()
    assert s.log()[6:9] == ["TS(2,msg:user)", "UM('C';plugin:test)", "UM('next')"], s.log()
    return s


@cell(11, "followup", "(during request-error, retry authorized) queued; claimed after the chain",
      ["R12.8", "R13.3", "D1"], ["differs-from-original", "D1"])
def m11_followup() -> Session:
    s = failing(effect("request-error"), "followup", retry=True, replies=("ok", "two"))
    s.expect_log(FAILED_TURN + " TS(2,retry) SS(2.1) CH… AM(2.1;'ok') SE(2.1) TE(2,completed) "
                 "TS(3,msg:user) UM('F') SS(3.1) CH… AM(3.1;'two') SE(3.1) TE(3,completed)")
    return s


@cell(11, "cancel", "(in recovery) no retry even though the handler authorizes one; "
      "turn/end(aborted)", ["R13.2", "R13.5", "R15.1", "D2"], ["cancel", "differs-from-original", "D2"])
def m11_cancel() -> Session:
    s = failing(effect("request-error"), "cancel", retry=True)
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,aborted)")
    assert "settled(1,aborted)" in s.live() and not [t for t in s.live() if t.startswith("error")]
    return s


@cell(11, "cancel-after-classification", "(at agent/error, retry authorized) the error reason "
      "stands and the retry is dropped", ["R13.5", "R16.2", "D2"],
      ["cancel", "differs-from-original", "D2"])
def m11_cancel_after_classification() -> Session:
    s = failing(live("agent/error"), "cancel", retry=True)
    s.expect_log(FAILED_TURN)
    assert s.reasons()[0]["kind"] == "error" and "settled(1,error)" in s.live()
    return s


# --------------------------------------------------------------------------
# Row 12: turn/end observers
# --------------------------------------------------------------------------

TURN_END = durable("turn/end")


@cell(12, "steer", "queued; claimed after the flush with no idle in between",
      ["R12.1", "R12.7", "D1"], ["differs-from-original", "D1"])
def m12_steer() -> Session:
    s = basic(TURN_END, "steer")
    s.expect_log(TWO_TURNS.replace("'F'", "'S'"))
    assert s.live("agent/status") == ["running", "idle"]
    return s


@cell(12, "inject", "appended right after turn/end (D4)", ["R12.3", "R5.2", "D4"],
      ["differs-from-original", "D4"])
def m12_inject() -> Session:
    s = basic(TURN_END, "inject")
    s.expect_log(ONE_TURN + " UM('C';plugin:test)")
    return s


@cell(12, "followup", "queued; claimed after the flush", ["R12.1", "R12.7"])
def m12_followup() -> Session:
    s = basic(TURN_END, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(12, "cancel", "(failed turn, retry authorized) effective: cancel-requested, the retry is "
      "dropped; the turn's reason is unchanged", ["R12.2", "R13.5", "D2"],
      ["cancel", "differs-from-original", "D2"])
def m12_cancel() -> Session:
    s = failing(TURN_END, "cancel", retry=True)
    s.expect_log(FAILED_TURN)
    assert "cancel-req(user)" in s.live() and "settled(1,error)" in s.live()
    return s


@cell(12, "dispose", "the turn's reason is unchanged and it settles completed; teardown",
      ["R12.2", "R17.1"], ["dispose"])
def m12_dispose() -> Session:
    s = basic(TURN_END, "dispose")
    s.expect_log(ONE_TURN)
    assert s.live()[-4:] == ["settled(1,completed)", "idle", "agent/disposed", "session/disposed"]
    return s


# --------------------------------------------------------------------------
# Row 13: the post-turn flush
# --------------------------------------------------------------------------

FLUSH = effect("flush")


@cell(13, "steer", "(retry pending) queued without a wake; claimed after the retry chain (D1)",
      ["R12.4", "R12.8", "R6.1", "D1"], ["differs-from-original", "D1"])
def m13_steer() -> Session:
    s = failing(FLUSH, "steer", retry=True, replies=("ok", "two"))
    s.expect_log(FAILED_TURN + " TS(2,retry) SS(2.1) CH… AM(2.1;'ok') SE(2.1) TE(2,completed) "
                 "TS(3,msg:user) UM('S') SS(3.1) CH… AM(3.1;'two') SE(3.1) TE(3,completed)")
    assert len(s.effects("tick")) == 1 and s.live("agent/status") == ["running", "idle"]
    return s


@cell(13, "inject", "appended at once", ["R12.4", "R5.2"])
def m13_inject() -> Session:
    s = basic(FLUSH, "inject")
    s.expect_log(ONE_TURN + " UM('C';plugin:test)")
    return s


@cell(13, "followup", "queued without a wake; claimed right after the flush",
      ["R12.4", "R6.1", "D1"], ["differs-from-original", "D1"])
def m13_followup() -> Session:
    s = basic(FLUSH, "followup")
    s.expect_log(TWO_TURNS)
    assert len(s.effects("tick")) == 1
    return s


def flush_with_queue(command: Callable[[Session], None]) -> Session:
    s = Session(FAILURE, "ok", "queued reply")
    s.handle("request-error", lambda e: RETRY, times=1)
    s.on(effect("model"), lambda o: s.followup("Q"))
    s.on(FLUSH, lambda o: command(s))
    s.followup("go")
    s.run()
    return s


@cell(13, "cancel", "(retry pending, a prompt queued) discards the prompt and drops the retry (D2)",
      ["R12.4", "R13.5", "R16.4", "D2"], ["cancel", "differs-from-original", "D2"])
def m13_cancel() -> Session:
    s = flush_with_queue(lambda s: s.cancel())
    s.expect_log(FAILED_TURN)
    assert s.live()[-4:] == ["cancel-req(user)", "disc[Q]", "settled(1,error)", "idle"], s.live()
    return s


@cell(13, "cancel-keep-inbox", "(retry pending, a prompt queued) keepInbox only drops the retry; "
      "the queued prompt runs next", ["R12.4", "R16.5", "D2"], ["cancel", "differs-from-original", "D2"])
def m13_cancel_keep_inbox() -> Session:
    s = flush_with_queue(lambda s: s.cancel(keep_inbox=True))
    s.expect_log(FAILED_TURN + " TS(2,msg:user) UM('Q') SS(2.1) CH… AM(2.1;'ok') SE(2.1) "
                 "TE(2,completed)")
    assert "settled(1,error)" in s.live() and not [t for t in s.live() if t.startswith("disc")]
    return s


@cell(13, "dispose", "(retry pending) disposal drops the retry; the failed turn settles; teardown",
      ["R17.2", "R13.5", "D2"], ["dispose", "differs-from-original", "D2"])
def m13_dispose() -> Session:
    s = failing(FLUSH, "dispose", retry=True)
    s.expect_log(FAILED_TURN)
    assert s.live()[-4:] == ["settled(1,error)", "idle", "agent/disposed", "session/disposed"]
    return s


# --------------------------------------------------------------------------
# Row 14: agent/settled observers
# --------------------------------------------------------------------------

SETTLED = live("agent/settled")


@cell(14, "steer", "queued; claimed at once by continue-or-idle", ["R12.7", "R6.1"])
def m14_steer() -> Session:
    s = basic(SETTLED, "steer")
    s.expect_log(TWO_TURNS.replace("'F'", "'S'"))
    assert s.live("agent/status") == ["running", "idle"] and len(s.effects("tick")) == 1
    return s


@cell(14, "inject", "appended at once", ["R5.2"])
def m14_inject() -> Session:
    s = basic(SETTLED, "inject")
    s.expect_log(ONE_TURN + " UM('C';plugin:test)")
    return s


@cell(14, "followup", "queued; claimed at once", ["R12.7"])
def m14_followup() -> Session:
    s = basic(SETTLED, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(14, "cancel", "(a second prompt queued) discards only", ["R16.4"], ["cancel"])
def m14_cancel() -> Session:
    s = Session("one")
    at(s, SETTLED, "cancel")
    s.followup("go")
    s.followup("second")
    s.run()
    s.expect_log(ONE_TURN)
    assert s.live()[-4:] == ["settled(1,completed)", "cancel-req(user)", "disc[second]", "idle"]
    return s


@cell(14, "dispose", "(a second prompt queued) discards it; idle; teardown", ["R17.1"],
      ["dispose"])
def m14_dispose() -> Session:
    s = Session("one")
    at(s, SETTLED, "dispose")
    s.followup("go")
    s.followup("second")
    s.run()
    s.expect_log(ONE_TURN)
    assert s.live()[-5:] == ["settled(1,completed)", "disc[second]", "idle", "agent/disposed",
                             "session/disposed"]
    return s


# --------------------------------------------------------------------------
# Row 15: the rejected-admission tail
# --------------------------------------------------------------------------

TAIL_TICK = effect("tick", purpose="rejected-admission")


def rejected(position: Predicate, command: str, *, second: bool = False) -> Session:
    s = Session("one", "two")
    s.hold("prompt-submit")
    at(s, position, command)
    s.followup("blocked")
    if second:
        s.followup("second")
    s.run()
    s.inject("staged", "plugin:test")
    s.resolve("prompt-submit", {"kind": "block", "reason": "no"})
    s.run()
    return s


@cell(15, "steer", "(during its tick) queued; claimed at continue-or-idle without a wake (D1)",
      ["R7.10", "R6.1", "D1"], ["differs-from-original", "D1"])
def m15_steer() -> Session:
    s = rejected(TAIL_TICK, "steer")
    s.expect_log("UM('staged';plugin:test) TS(1,msg:user) UM('S') SS(1.1) RH(initial) CH… "
                 "AM(1.1;'one') SE(1.1) TE(1,completed)")
    assert len(s.effects("tick", )) == 2 and s.live("agent/status") == ["running", "idle"]
    return s


@cell(15, "inject", "(at its context append) appended at once, right after that event",
      ["R7.10", "R5.2", "R0.6"])
def m15_inject() -> Session:
    s = rejected(durable("user/message"), "inject")
    assert s.log() == ["UM('staged';plugin:test)", "UM('C';plugin:test)"]
    return s


@cell(15, "followup", "(during its tick) queued; claimed at continue-or-idle", ["R7.10", "R12.7"])
def m15_followup() -> Session:
    s = rejected(TAIL_TICK, "followup")
    assert s.log()[:3] == ["UM('staged';plugin:test)", "TS(1,msg:user)", "UM('F')"]
    return s


@cell(15, "cancel", "(during its tick, a prompt queued) discards only", ["R16.4", "R7.10"],
      ["cancel"])
def m15_cancel() -> Session:
    s = rejected(TAIL_TICK, "cancel", second=True)
    assert s.log() == ["UM('staged';plugin:test)"]
    assert s.live()[-3:] == ["cancel-req(user)", "disc[second]", "idle"]
    return s


@cell(15, "dispose", "(during its tick, a prompt queued) discards it; idle; teardown",
      ["R17.1", "R7.10"], ["dispose"])
def m15_dispose() -> Session:
    s = rejected(TAIL_TICK, "dispose", second=True)
    assert s.log() == ["UM('staged';plugin:test)"]
    assert s.live()[-4:] == ["disc[second]", "idle", "agent/disposed", "session/disposed"]
    return s


# --------------------------------------------------------------------------
# Row 16: agent/status('idle') observers
# --------------------------------------------------------------------------

IDLE = live("agent/status", status="idle")


@cell(16, "steer", "queued plus a wake: a new running interval", ["R6.1", "R4.2"])
def m16_steer() -> Session:
    s = basic(IDLE, "steer")
    s.expect_log(TWO_TURNS.replace("'F'", "'S'"))
    assert s.live("agent/status") == ["running", "idle", "running", "idle"]
    assert len(s.effects("tick")) == 2
    return s


@cell(16, "inject", "appended at once", ["R5.2"])
def m16_inject() -> Session:
    s = basic(IDLE, "inject")
    s.expect_log(ONE_TURN + " UM('C';plugin:test)")
    return s


@cell(16, "followup", "queued plus a wake: a new running interval", ["R6.1", "R4.2"])
def m16_followup() -> Session:
    s = basic(IDLE, "followup")
    s.expect_log(TWO_TURNS)
    assert s.live("agent/status") == ["running", "idle", "running", "idle"]
    return s


@cell(16, "cancel", "with nothing pending: a no-op", ["R16.1"], ["cancel"])
def m16_cancel() -> Session:
    s = basic(IDLE, "cancel")
    s.expect_log(ONE_TURN)
    assert s.live()[-1] == "idle" and "cancel-req(user)" not in s.live()
    return s


@cell(16, "dispose", "teardown right after idle", ["R17.1"], ["dispose"])
def m16_dispose() -> Session:
    s = basic(IDLE, "dispose")
    s.expect_log(ONE_TURN)
    assert s.live()[-3:] == ["idle", "agent/disposed", "session/disposed"]
    return s


# --------------------------------------------------------------------------
# Row 17: agent/cancel-requested observers
# --------------------------------------------------------------------------

CANCEL_REQ = live("agent/cancel-requested")


def cancel_while_streaming(command: str) -> Session:
    s = Session()
    s.hold("model")
    at(s, CANCEL_REQ, command)
    s.followup("go")
    s.run()
    s.cancel()
    s.run()
    s.fail_model(ABORT)
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,aborted)")
    return s


@cell(17, "steer", "(window open) staged, then cleared by the same cancel", ["R16.2", "P7"],
      ["cancel"])
def m17_steer() -> Session:
    s = cancel_while_streaming("steer")
    assert "enq(S,s)" in s.live() and "disc[S]" in s.live()
    return s


@cell(17, "inject", "(window open) staged, then cleared and reported (D6)",
      ["R16.2", "P7", "D6"], ["cancel", "differs-from-original", "D6"])
def m17_inject() -> Session:
    s = cancel_while_streaming("inject")
    assert "ctxdisc[C]" in s.live()
    return s


@cell(17, "followup", "queued, then cleared by the same cancel", ["R16.2", "P7"], ["cancel"])
def m17_followup() -> Session:
    s = cancel_while_streaming("followup")
    assert "enq(F,q)" in s.live() and "disc[F]" in s.live()
    return s


@cell(17, "cancel", "the first cause stands; cancel-requested is emitted again",
      ["R16.3"], ["cancel"])
def m17_cancel() -> Session:
    s = Session()
    s.hold("model")
    s.on(CANCEL_REQ, lambda o: s.cancel("parent"), nth=1)
    s.followup("go")
    s.run()
    s.cancel()
    s.run()
    s.fail_model(ABORT)
    s.run()
    assert [t for t in s.live() if t.startswith("cancel-req")] == [
        "cancel-req(user)", "cancel-req(parent)"]
    aborts = [o.to_json() for o in s.outputs if o.to_json().get("out") == "abort"]
    assert [a["reason"] for a in aborts] == [{"kind": "user"}]
    return s


@cell(17, "inject-window-closed", "(idle, a quiet item parked) appended at once, not cleared",
      ["R16.2", "R5.2"], ["cancel"])
def m17_inject_window_closed() -> Session:
    s = Session()
    at(s, CANCEL_REQ, "inject")
    s.send("quiet", {"target": "next-turn", "wakeup": False})
    s.run()
    s.cancel()
    s.run()
    assert s.log() == ["UM('C';plugin:test)"]
    assert s.live() == ["enq(quiet,q)", "cancel-req(user)", "disc[quiet]"]
    return s


# --------------------------------------------------------------------------
# Row 18: discard and abort observers
# --------------------------------------------------------------------------

ABORT_SIGNAL = control("abort")


@cell(18, "steer", "(abort observer, during a tool body) survives: staged and drained by the "
      "end-of-step drain after the aborted batch", ["R16.2", "R10.8", "R11.1"], ["cancel", "tools"])
def m18_steer() -> Session:
    s = Session(calls(("c1", "t")))
    s.hold("tool-execute")
    at(s, ABORT_SIGNAL, "steer")
    s.followup("go")
    s.run()
    s.cancel()
    s.run()
    s.resolve("tool-execute", result())
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
                 "TR(1.1;c1;ERR ABORTED) STM(1;'S';user) SE(1.1) TE(1,aborted)")
    return s


@cell(18, "inject", "(inbox discard observer, while streaming) survives: staged, retained after "
      "the aborted turn, taken by the next admitted turn", ["R16.2", "R11.3"], ["cancel"])
def m18_inject() -> Session:
    s = Session("later reply")
    s.hold("model")
    at(s, live("agent/inbox/discard"), "inject")
    s.followup("go")
    s.run()
    s.followup("Q")
    s.cancel()
    s.run()
    s.fail_model(ABORT)
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,aborted)")
    assert "ctxdisc[C]" not in s.live() and s.core.pending_context == 1
    s.followup("later")
    s.run()
    assert s.log()[6:9] == ["TS(2,msg:user)", "UM('C';plugin:test)", "UM('later')"]
    return s


@cell(18, "followup", "(abort observer, while streaming) survives; queued and run next",
      ["R16.2", "R12.7"], ["cancel"])
def m18_followup() -> Session:
    s = Session("two")
    s.hold("model")
    at(s, ABORT_SIGNAL, "followup")
    s.followup("go")
    s.run()
    s.cancel()
    s.run()
    s.fail_model(ABORT)
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,aborted) "
                 "TS(2,msg:user) UM('F') SS(2.1) CH… AM(2.1;'two') SE(2.1) TE(2,completed)")
    return s


@cell(18, "cancel", "(inbox discard observer, idle) nothing is pending again: a no-op",
      ["R16.1"], ["cancel"])
def m18_cancel() -> Session:
    s = Session()
    at(s, live("agent/inbox/discard"), "cancel")
    s.send("quiet", {"target": "next-turn", "wakeup": False})
    s.cancel()
    s.run()
    assert s.live() == ["enq(quiet,q)", "cancel-req(user)", "disc[quiet]"]
    return s


# --------------------------------------------------------------------------
# Row 19: agent/session-start observers
# --------------------------------------------------------------------------

SESSION_START = live("agent/session-start")


def at_start(command: str) -> Session:
    s = Session("one")
    at(s, SESSION_START, command)
    s.run()
    return s


@cell(19, "steer", "queued plus a wake", ["R5.3", "R6.1"])
def m19_steer() -> Session:
    s = at_start("steer")
    s.expect_log(ONE_TURN.replace("'go'", "'S'"))
    return s


@cell(19, "inject", "appended at once, before the first turn", ["R5.2"])
def m19_inject() -> Session:
    s = at_start("inject")
    s.expect_log("UM('C';plugin:test)")
    return s


@cell(19, "followup", "queued plus a wake", ["R5.3", "R6.1"])
def m19_followup() -> Session:
    s = at_start("followup")
    s.expect_log(ONE_TURN.replace("'go'", "'F'"))
    return s


@cell(19, "cancel", "never raises; a no-op with nothing pending", ["R16.1", "R23.2"], ["cancel"])
def m19_cancel() -> Session:
    s = at_start("cancel")
    assert s.log() == [] and s.live() == [] and s.caught == []
    return s



