"""The reentrancy matrix (specs/core.md R19, refining semantics.md §19): one vector per row and
command.

Every vector issues one command (steer 'S', inject 'C' from plugin:test,
followup 'F', cancel, or dispose) at the row's position: as an observer of
the named output, or while the named effect is outstanding (an observer of
its request). The vector ids are ``M<row>-<command>`` with R19's row
numbers; the review asserts the cell, and `review_cell` what every cell of
the row states: the window column (`WINDOW`) where the command is issued, the
placement of a steer or followup, the teardown of a disposal, no agent/error
from a cancel, a quiescent end.
"""

from __future__ import annotations

import weakref
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
    text_of,
)
from machine.io import Effect

ROWS = {
    1: "anywhere while a wake is pending",
    2: "agent/status running",
    3: "{prompt-submit} outstanding; agent/inbox/dequeue queued",
    4: "agent/warning about a failed or invalid decision",
    5: "[turn/start]",
    6: "outputs of the inherited drain; the prompt's and decision contexts' user/messages",
    7: "outputs of the rest drain",
    8: "{step} outstanding",
    9: "outputs of the top-of-step drain",
    10: "{system-prompt} outstanding",
    11: "[step/start]; {request} outstanding",
    12: "[request/header]; {model} outstanding; [assistant/chunk]; release",
    13: "[assistant/message]; tool stages outstanding; [tool/call]; [tool/result]",
    14: "outputs of the end-of-step drain",
    15: "[step/end]",
    16: "{turn-stopping} outstanding; outputs of its drain",
    17: "{request-error} outstanding; its agent/warning",
    18: "agent/error during a turn",
    19: "[turn/end]",
    20: "{flush} outstanding; a failed flush's warning and error",
    21: "agent/settled",
    22: "the rejected tail: its user/messages; {tick rejected-admission} outstanding",
    23: "agent/status idle",
    24: "agent/cancel-requested",
    25: "agent/inbox/discard, agent/context/discard, abort",
    26: "session/created, agent/created, agent/session-start",
    27: "agent/disposed, session/disposed",
}

FAILURE = model_failure("model unavailable", "UNAVAILABLE")
ABORT = error("the signal was aborted", "AbortError")
RETRY: Any = ("resolve", {"kind": "retry"})
TWO_TURNS = ("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) TE(1,completed) "
             "TS(2,msg:user) UM('F') SS(2.1) CH… AM(2.1;'two') SE(2.1) TE(2,completed)")
ONE_TURN = "TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) TE(1,completed)"
TWO_STEPS = ("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') STM(1;'S';user) "
             "SE(1.1) SS(1.2) CH… AM(1.2;'two') SE(1.2) TE(1,completed)")
CONTEXT_AT_END = ("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') "
                  "UM('C';plugin:test) SE(1.1) TE(1,completed)")


#: R19's window column: whether the acceptance window is open where the row's commands land
#: (rows 24 and 25 are "as at that cancel", row 27 "torn down": no single value).
WINDOW: dict[int, bool] = {row: 2 <= row <= 18 for row in (*range(1, 24), 26)}

#: The commands each session's `at` observers issued, with the window at that moment.
FIRED: weakref.WeakKeyDictionary[Session, list[tuple[str, bool]]] = weakref.WeakKeyDictionary()


def cell(row: int, command: str, title: str, rules: Sequence[str], tags: Sequence[str] = ()
         ) -> Callable[[Callable[[], Session]], Callable[[], Session]]:
    """Register the cell *command* of *row*: the play's own review, then `review_cell`."""
    def register(play: Callable[[], Session]) -> Callable[[], Session]:
        def reviewed() -> Session:
            s = play()
            review_cell(s, row, command)
            return s
        scenario(f"M{row:02d}-{command}", f"R19 row {row} ({ROWS[row]}), {command}: {title}",
                 ["R19", "R0.5", *rules, "P2"], ["matrix", f"matrix:row{row}", *tags])(reviewed)
        return play
    return register


def review_cell(s: Session, row: int, command: str) -> None:
    """What holds of every cell: the command (issued once by an `at` observer) lands with the
    window of the row's column; a steer is enqueued as steering when the window is open, else
    queued, a followup queued (R5.3); a disposal tears down without cancel-requested (R17.1);
    a cancel or a disposal reports no agent/error unless the turn failed by itself; the agent
    ends quiescent."""
    base = command.split("-")[0]
    fired = FIRED.get(s, [])
    if fired:
        assert [c for c, _ in fired] == [base], fired
        window = fired[0][1]
        if row in WINDOW:
            assert window == WINDOW[row], f"the window is {'open' if window else 'closed'}"
        own = {"steer": "S", "followup": "F"}.get(base)
        if own is not None:
            placements = [p["placement"] for p in s.payloads("agent/inbox/enqueue")
                          if text_of(p["message"]) == own]
            assert placements == ["steering" if base == "steer" and window else "queued"], placements
    if base == "dispose":
        assert s.core.disposed and s.live()[-2:] == ["agent/disposed", "session/disposed"]
        assert "cancel-req(disposed)" not in s.live()
    if base in ("cancel", "dispose"):
        assert not s.live("agent/error") or any(t.startswith("TE(") and "error" in t
                                                for t in s.log()), s.live("agent/error")
    assert s.core.is_quiescent


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
    """Issue *command* at the *nth* output matching *predicate* (noted in `FIRED`)."""
    def fire(o: object) -> None:
        FIRED.setdefault(s, []).append((command, s.core.accepts_next_step))
        issue(s, command)
    s.on(predicate, fire, nth=nth)


def basic(position: Predicate, command: str, *replies: Any, nth: int = 1) -> Session:
    s = Session(*(replies or ("one", "two")))
    at(s, position, command, nth=nth)
    s.followup("go")
    s.run()
    return s


def teardown_ok(s: Session) -> None:
    assert s.live()[-2:] == ["agent/disposed", "session/disposed"], s.live()
    assert s.core.disposed


# --------------------------------------------------------------------------
# Row 1: a wake is pending
# --------------------------------------------------------------------------

ENQ_GO = live("agent/inbox/enqueue")


@cell(1, "steer", "queued; a turn of its own, in queue order", ["R5.3", "R6.1", "R6.3"])
def m01_steer() -> Session:
    s = basic(ENQ_GO, "steer")
    s.expect_log(TWO_TURNS.replace("'F'", "'S'"))
    assert s.live()[:2] == ["enq(go,q)", "enq(S,q)"] and len(s.effects("tick")) == 1
    assert s.live("agent/status") == ["running", "idle"]
    return s


@cell(1, "inject", "appended now, ahead of those turns", ["R5.2", "R6.3"])
def m01_inject() -> Session:
    s = basic(ENQ_GO, "inject")
    s.expect_log("UM('C';plugin:test) " + ONE_TURN)
    return s


@cell(1, "followup", "queued; a turn of its own", ["R5.3", "R6.1"])
def m01_followup() -> Session:
    s = basic(ENQ_GO, "followup")
    s.expect_log(TWO_TURNS)
    assert s.live("agent/status") == ["running", "idle"]
    return s


@cell(1, "cancel", "discards all queued items, the new one too; the wake claims nothing; no status "
      "output", ["R16.1", "R16.2", "R16.4", "R6.2"], ["cancel"])
def m01_cancel() -> Session:
    s = basic(ENQ_GO, "cancel")
    assert s.log() == []
    s.expect_live("enq(go,q) cancel-req(user) disc[go]")
    return s


@cell(1, "dispose", "discards the item without cancel-requested; the wake claims nothing; teardown",
      ["R17.1", "R17.4", "R16.2", "R6.2"], ["dispose"])
def m01_dispose() -> Session:
    s = basic(ENQ_GO, "dispose")
    assert s.log() == []
    s.expect_live("enq(go,q) disc[go] agent/disposed session/disposed")
    return s


# --------------------------------------------------------------------------
# Rows 2 and 3: admission
# --------------------------------------------------------------------------

RUNNING = live("agent/status", status="running")
DEQ_GO = live("agent/inbox/dequeue", placement="queued")
PROMPT_SUBMIT = effect("prompt-submit")
RUN_START_STEER = ("TS(1,msg:user) UM('go') STM(1;'S';user) SS(1.1) RH(initial) CH… AM(1.1;'one') "
                   "SE(1.1) TE(1,completed)")
RUN_START_INJECT = ("TS(1,msg:user) UM('go') UM('C';plugin:test) SS(1.1) RH(initial) CH… "
                    "AM(1.1;'one') SE(1.1) TE(1,completed)")


@cell(2, "steer", "steering; rest drain after the prompt", ["R5.3", "R7.3", "R7.4", "R8.3"])
def m02_steer() -> Session:
    s = basic(RUNNING, "steer")
    s.expect_log(RUN_START_STEER)
    assert "enq(S,s)" in s.live()
    return s


@cell(2, "inject", "staged; rest drain after the prompt", ["R5.2", "R7.3", "R8.3"])
def m02_inject() -> Session:
    s = basic(RUNNING, "inject")
    s.expect_log(RUN_START_INJECT)
    return s


@cell(2, "followup", "queued; a later turn of its own in the same interval", ["R5.3", "R12.7"])
def m02_followup() -> Session:
    s = basic(RUNNING, "followup")
    s.expect_log(TWO_TURNS)
    assert s.live("agent/status") == ["running", "idle"]
    return s


@cell(2, "cancel", "aborts ahead of {prompt-submit}, which is never requested; the dequeue is "
      "still emitted; rejected; no warning; no turn", ["R7.5", "R7.10", "R16.4", "P15"],
      ["cancel"])
def m02_cancel() -> Session:
    s = basic(RUNNING, "cancel")
    assert s.log() == [] and not s.effects("prompt-submit") and not s.effects("flush")
    s.expect_live("enq(go,q) running cancel-req(user) deq(go,q) idle")
    return s


@cell(2, "dispose", "aborts ahead of {prompt-submit}; no turn; teardown",
      ["R17.1", "R7.5", "P15"],
      ["dispose"])
def m02_dispose() -> Session:
    s = basic(RUNNING, "dispose")
    assert s.log() == [] and not s.effects("prompt-submit") and not s.effects("flush")
    s.expect_live("enq(go,q) running deq(go,q) idle agent/disposed session/disposed")
    return s


@cell(3, "steer", "(during prompt-submit) steering; rest drain after the prompt",
      ["R5.3", "R8.3", "R11.2"])
def m03_steer() -> Session:
    s = basic(PROMPT_SUBMIT, "steer")
    s.expect_log(RUN_START_STEER)
    return s


@cell(3, "inject", "(at the claimed item's dequeue) staged; appended after the prompt",
      ["R5.2", "R7.6", "R8.3"])
def m03_inject() -> Session:
    s = basic(DEQ_GO, "inject")
    s.expect_log(RUN_START_INJECT)
    return s


@cell(3, "followup", "(during prompt-submit) queued; its own turn after this one",
      ["R5.3", "R12.7"])
def m03_followup() -> Session:
    s = basic(PROMPT_SUBMIT, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(3, "cancel", "(during prompt-submit) aborts the admission; the decision is disregarded; "
      "rejected; no warning; no turn", ["R7.7", "R7.10", "R16.4"], ["cancel"])
def m03_cancel() -> Session:
    s = basic(PROMPT_SUBMIT, "cancel")
    assert s.log() == []
    s.expect_live("enq(go,q) running cancel-req(user) deq(go,q) idle")
    return s


@cell(3, "dispose", "(at the claimed item's dequeue) aborts the admission; no turn; teardown",
      ["R17.1", "R7.7"], ["dispose"])
def m03_dispose() -> Session:
    s = basic(DEQ_GO, "dispose")
    assert s.log() == []
    teardown_ok(s)
    assert s.live()[-4:] == ["deq(go,q)", "idle", "agent/disposed", "session/disposed"]
    assert s.live("agent/status") == ["running", "idle"]
    assert len(s.effects("prompt-submit")) == 1 and not s.live("agent/settled")
    assert not s.effects("flush")
    return s


# --------------------------------------------------------------------------
# Row 4: the warning of a failed admission
# --------------------------------------------------------------------------

WARNING = live("agent/warning")


def failed_admission(command: str, *replies: Any, second: bool = False) -> Session:
    s = Session(*(replies or ("one", "two")))
    s.handle("prompt-submit", lambda e: ("raise", error("admission broke")), times=1)
    at(s, WARNING, command)
    s.followup("go")
    if second:
        s.followup("second")
    s.run()
    assert "warn('prompt admission failed: admission broke')" in s.live()
    return s


@cell(4, "steer", "steering, retained (a rejected admission keeps an outbox that holds "
      "steering); the next admitted turn takes it ahead of its prompt",
      ["R7.8", "R7.10", "R11.3", "R8.3", "R0.8"])
def m04_steer() -> Session:
    s = failed_admission("steer")
    assert s.log() == [] and s.core.pending_steering == 1
    s.followup("later")
    s.run()
    assert s.log()[:3] == ["TS(1,msg:user)", "STM(1;'S';user)", "UM('later')"], s.log()
    return s


@cell(4, "inject", "staged; written between turns (no steering staged)",
      ["R7.8", "R7.10", "R11.2"])
def m04_inject() -> Session:
    s = failed_admission("inject")
    assert s.log() == ["UM('C';plugin:test)"]
    return s


@cell(4, "followup", "queued; claimed at continue-or-idle", ["R7.10", "R12.7"])
def m04_followup() -> Session:
    s = failed_admission("followup")
    s.expect_log("TS(1,msg:user) UM('F') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "TE(1,completed)")
    assert s.live("agent/status") == ["running", "idle"]
    return s


@cell(4, "cancel", "(a second prompt queued) discards it; aborts the admission controller; still "
      "rejected", ["R7.8", "R16.2", "R16.4"], ["cancel"])
def m04_cancel() -> Session:
    s = failed_admission("cancel", second=True)
    assert s.log() == []
    trace = s.trace()
    assert trace[trace.index("warn('prompt admission failed: admission broke')"):] == [
        "warn('prompt admission failed: admission broke')", "cancel-req(user)", "disc[second]",
        "abort(user)", "tick(rejected-admission)", "idle"], trace
    return s


# --------------------------------------------------------------------------
# Rows 5, 6, 7: turn/start and the run-start drains
# --------------------------------------------------------------------------

TURN_START = durable("turn/start")
PROMPT_UM = durable("user/message", id="m1")


@cell(5, "steer", "steering; rest drain, after the prompt", ["R8.3", "R11.2"])
def m05_steer() -> Session:
    s = basic(TURN_START, "steer")
    s.expect_log(RUN_START_STEER)
    return s


@cell(5, "steer-retry", "(at a retry's turn/start) steering; right after turn/start",
      ["R8.3", "R13.3", "R11.2"])
def m05_steer_retry() -> Session:
    s = Session(FAILURE, "ok")
    s.handle("request-error", lambda e: RETRY, times=1)
    at(s, TURN_START, "steer", nth=2)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,error) TS(2,retry) "
                 "STM(2;'S';user) SS(2.1) CH… AM(2.1;'ok') SE(2.1) TE(2,completed)")
    return s


@cell(5, "inject", "staged; rest drain, like steer", ["R8.3", "R11.2"])
def m05_inject() -> Session:
    s = basic(TURN_START, "inject")
    s.expect_log(RUN_START_INJECT)
    return s


@cell(5, "followup", "queued; a later turn of its own", ["R5.3"])
def m05_followup() -> Session:
    s = basic(TURN_START, "followup")
    s.expect_log(TWO_TURNS)
    assert s.live("agent/status") == ["running", "idle"]
    return s


@cell(5, "cancel", "the prompt is still written; turn/end aborted with no step",
      ["R8.3", "R15.1", "R16.4"], ["cancel"])
def m05_cancel() -> Session:
    s = basic(TURN_START, "cancel")
    s.expect_log("TS(1,msg:user) UM('go') TE(1,aborted)")
    assert s.live("agent/cancel-requested") == ["cancel-req(user)"]
    return s


@cell(5, "dispose", "the prompt is still written; turn/end disposed with no step; teardown",
      ["R8.3", "R17.1", "R15.1"], ["dispose"])
def m05_dispose() -> Session:
    s = basic(TURN_START, "dispose")
    s.expect_log("TS(1,msg:user) UM('go') TE(1,disposed)")
    assert s.live("agent/cancel-requested") == []
    teardown_ok(s)
    return s


@cell(6, "steer", "(at the prompt's user/message) taken by the rest drain",
      ["R8.3", "R11.1"])
def m06_steer() -> Session:
    s = basic(PROMPT_UM, "steer")
    s.expect_log(RUN_START_STEER)
    return s


@cell(6, "inject", "(at the prompt's user/message) taken by the rest drain",
      ["R8.3", "R11.1"])
def m06_inject() -> Session:
    s = basic(PROMPT_UM, "inject")
    s.expect_log(RUN_START_INJECT)
    return s


@cell(6, "followup", "queued", ["R5.3"])
def m06_followup() -> Session:
    s = basic(PROMPT_UM, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(6, "cancel", "(at the prompt, a decision context still to write) the remaining admitted "
      "messages are still written; turn/end aborted with no step",
      ["R8.3", "R7.7", "R15.1"], ["cancel"])
def m06_cancel() -> Session:
    s = Session("one")
    s.handle("prompt-submit", lambda e: ("resolve", {"kind": "allow", "additionalContexts": [
        s.msg("decision context", "plugin:gate")]}))
    at(s, PROMPT_UM, "cancel")
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') UM('decision context';plugin:gate) TE(1,aborted)")
    return s


def rest_drain(command: str, *replies: Any) -> Session:
    """Steering staged during admission is written by the rest drain; the command is issued at
    that steering/message."""
    s = Session(*(replies or ("one", "two")))
    def admission(e: Effect) -> None:
        s.steer("R")
    s.handle("prompt-submit", admission, times=1)
    at(s, durable("steering/message"), command)
    s.followup("go")
    s.run()
    return s


@cell(7, "steer", "(at the rest drain's steering/message) taken by this drain (D3)",
      ["R8.3", "R11.1", "D3"], ["differs-from-original", "D3"])
def m07_steer() -> Session:
    s = rest_drain("steer")
    s.expect_log("TS(1,msg:user) UM('go') STM(1;'R';user) STM(1;'S';user) SS(1.1) RH(initial) CH… "
                 "AM(1.1;'one') SE(1.1) TE(1,completed)")
    return s


@cell(7, "inject", "taken by this drain (D3)", ["R8.3", "R11.1", "D3"],
      ["differs-from-original", "D3"])
def m07_inject() -> Session:
    s = rest_drain("inject")
    s.expect_log("TS(1,msg:user) UM('go') STM(1;'R';user) UM('C';plugin:test) SS(1.1) RH(initial) "
                 "CH… AM(1.1;'one') SE(1.1) TE(1,completed)")
    return s


@cell(7, "followup", "queued", ["R5.3"])
def m07_followup() -> Session:
    s = rest_drain("followup")
    assert s.log()[-7:] == ["TS(2,msg:user)", "UM('F')", "SS(2.1)", "CH…", "AM(2.1;'two')",
                            "SE(2.1)", "TE(2,completed)"], s.log()
    return s


@cell(7, "cancel", "{step} is still requested; its check ends the turn aborted; no step/start",
      ["R9.1", "R8.3", "R15.1"], ["cancel"])
def m07_cancel() -> Session:
    s = rest_drain("cancel")
    s.expect_log("TS(1,msg:user) UM('go') STM(1;'R';user) TE(1,aborted)")
    assert len(s.effects("step")) == 1
    return s


# --------------------------------------------------------------------------
# Rows 8, 9, 10: the step hook, the top-of-step drain, the system prompt
# --------------------------------------------------------------------------

STEP = effect("step")


@cell(8, "steer", "top-of-step drain; this request; no extra step", ["R9.2", "R11.2"])
def m08_steer() -> Session:
    s = basic(STEP, "steer")
    s.expect_log(RUN_START_STEER)
    assert s.requests() == [["'go'", "'S'"]]
    return s


@cell(8, "inject", "top-of-step drain; this request", ["R9.2", "R11.2"])
def m08_inject() -> Session:
    s = basic(STEP, "inject")
    s.expect_log(RUN_START_INJECT)
    assert s.requests() == [["'go'", "'C';plugin:test"]]
    return s


@cell(8, "followup", "queued", ["R5.3"])
def m08_followup() -> Session:
    s = basic(STEP, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(8, "cancel", "R9.1's check ends the turn aborted; no step/start", ["R9.1", "R15.1"],
      ["cancel"])
def m08_cancel() -> Session:
    s = basic(STEP, "cancel")
    s.expect_log("TS(1,msg:user) UM('go') TE(1,aborted)")
    return s


@cell(8, "dispose", "the turn ends disposed with no step/start; teardown",
      ["R9.1", "R17.1", "R15.1"], ["dispose"])
def m08_dispose() -> Session:
    s = basic(STEP, "dispose")
    s.expect_log("TS(1,msg:user) UM('go') TE(1,disposed)")
    teardown_ok(s)
    return s


def top_drain(command: str, *replies: Any) -> Session:
    """Context injected during {step} is written by the top-of-step drain; the command is issued
    at that user/message."""
    s = Session(*(replies or ("one", "two")))
    def step_hook(e: Effect) -> None:
        s.inject("T", "plugin:top")
    s.handle("step", step_hook, times=1)
    at(s, durable("user/message", id="m2"), command)
    s.followup("go")
    s.run()
    return s


@cell(9, "steer", "(at the top drain's user/message) taken by this drain; this request",
      ["R9.2", "R11.1", "D3"], ["differs-from-original", "D3"])
def m09_steer() -> Session:
    s = top_drain("steer")
    s.expect_log("TS(1,msg:user) UM('go') UM('T';plugin:top) STM(1;'S';user) SS(1.1) RH(initial) "
                 "CH… AM(1.1;'one') SE(1.1) TE(1,completed)")
    assert s.requests() == [["'go'", "'T';plugin:top", "'S'"]]
    return s


@cell(9, "inject", "taken by this drain; this request", ["R9.2", "R11.1", "D3"],
      ["differs-from-original", "D3"])
def m09_inject() -> Session:
    s = top_drain("inject")
    s.expect_log("TS(1,msg:user) UM('go') UM('T';plugin:top) UM('C';plugin:test) SS(1.1) "
                 "RH(initial) CH… AM(1.1;'one') SE(1.1) TE(1,completed)")
    return s


@cell(9, "followup", "queued", ["R5.3"])
def m09_followup() -> Session:
    s = top_drain("followup")
    assert s.log()[-7:] == ["TS(2,msg:user)", "UM('F')", "SS(2.1)", "CH…", "AM(2.1;'two')",
                            "SE(2.1)", "TE(2,completed)"], s.log()
    return s


@cell(9, "cancel", "{system-prompt} is still requested; turn/end aborted; no step/start",
      ["R9.3", "R15.1"], ["cancel"])
def m09_cancel() -> Session:
    s = top_drain("cancel")
    s.expect_log("TS(1,msg:user) UM('go') UM('T';plugin:top) TE(1,aborted)")
    assert len(s.effects("system-prompt")) == 1
    return s


SYSTEM_PROMPT = effect("system-prompt")


@cell(10, "steer", "end-of-step drain (the next request); causes another step",
      ["R9.10", "R11.2", "R8.4"])
def m10_steer() -> Session:
    s = basic(SYSTEM_PROMPT, "steer")
    s.expect_log(TWO_STEPS)
    assert s.requests()[0] == ["'go'"]
    return s


@cell(10, "inject", "end-of-step drain (the next request); no extra step", ["R9.10", "R11.2"])
def m10_inject() -> Session:
    s = basic(SYSTEM_PROMPT, "inject")
    s.expect_log(CONTEXT_AT_END)
    return s


@cell(10, "followup", "queued", ["R5.3"])
def m10_followup() -> Session:
    s = basic(SYSTEM_PROMPT, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(10, "cancel", "R9.3's check ends the turn aborted; no step/start", ["R9.3", "R15.1"],
      ["cancel"])
def m10_cancel() -> Session:
    s = basic(SYSTEM_PROMPT, "cancel")
    s.expect_log("TS(1,msg:user) UM('go') TE(1,aborted)")
    return s


# --------------------------------------------------------------------------
# Rows 11 and 12: inside the step
# --------------------------------------------------------------------------


@cell(11, "steer", "(at step/start) end-of-step drain; causes another step",
      ["R9.10", "R11.2", "R8.4"])
def m11_steer() -> Session:
    s = basic(durable("step/start"), "steer")
    s.expect_log(TWO_STEPS)
    return s


@cell(11, "inject", "(during the request hook) end-of-step drain; no extra step",
      ["R9.10", "R11.2", "R9.6"])
def m11_inject() -> Session:
    s = basic(effect("request"), "inject")
    s.expect_log(CONTEXT_AT_END)
    return s


@cell(11, "followup", "(during the request hook) queued", ["R5.3"])
def m11_followup() -> Session:
    s = basic(effect("request"), "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(11, "cancel", "(during the request hook) step/end, turn/end aborted; no request/header",
      ["R9.6", "R8.6", "R15.1"], ["cancel"])
def m11_cancel() -> Session:
    s = basic(effect("request"), "cancel")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) SE(1.1) TE(1,aborted)")
    assert not s.effects("model")
    return s


@cell(11, "cancel-at-step-start", "step/end, turn/end aborted; no request", ["R9.5", "R15.1"],
      ["cancel"])
def m11_cancel_at_step_start() -> Session:
    s = basic(durable("step/start"), "cancel")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) SE(1.1) TE(1,aborted)")
    assert not s.effects("request")
    return s


@cell(12, "steer", "(at request/header) end-of-step drain; causes another step",
      ["R9.10", "R11.2", "R8.4"])
def m12_steer() -> Session:
    s = basic(durable("request/header"), "steer")
    s.expect_log(TWO_STEPS)
    return s


@cell(12, "inject", "(at the first assistant/chunk) end-of-step drain; no extra step",
      ["R9.10", "R11.2", "R9.7"])
def m12_inject() -> Session:
    s = basic(durable("assistant/chunk"), "inject")
    s.expect_log(CONTEXT_AT_END)
    return s


@cell(12, "followup", "(at the first assistant/chunk) queued", ["R5.3"])
def m12_followup() -> Session:
    s = basic(durable("assistant/chunk"), "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(12, "cancel", "(during the model call) the next chunk's check releases the stream; no "
      "assistant/message; step/end, turn/end aborted", ["R9.7", "R8.6", "R15.1", "P5"], ["cancel"])
def m12_cancel() -> Session:
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
    assert trace[trace.index("abort(user)"):trace.index("[SE(1.1)]")] == ["abort(user)", "release"], trace
    assert not s.driver.held
    return s


@cell(12, "cancel-model-failure", "(during the model call) a model failure after the abort skips "
      "recovery; turn/end aborted", ["R13.2", "R15.1", "R9.7"], ["cancel"])
def m12_cancel_model_failure() -> Session:
    s = Session()
    s.hold("model")
    at(s, effect("model"), "cancel")
    s.followup("go")
    s.run()
    s.fail_model(FAILURE)
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,aborted)")
    assert not s.effects("request-error")
    return s


@cell(12, "dispose", "(at request/header) step/end, turn/end disposed; teardown",
      ["R9.7", "R17.1", "R15.1"], ["dispose"])
def m12_dispose() -> Session:
    s = basic(durable("request/header"), "dispose")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,disposed)")
    teardown_ok(s)
    return s


# --------------------------------------------------------------------------
# Row 13: the tool batch
# --------------------------------------------------------------------------

TOOL_TURN = ("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
             "TR(1.1;c1;ok) {} SE(1.1) SS(1.2) CH… AM(1.2;'done') SE(1.2) TE(1,completed)")


@cell(13, "steer", "(during the tool body) end-of-step drain after the last result; causes "
      "another step", ["R10.5", "R9.10", "R8.4"], ["tools"])
def m13_steer() -> Session:
    s = basic(effect("tool-execute"), "steer", calls(("c1", "t")), "done")
    s.expect_log(TOOL_TURN.format("STM(1;'S';user)"))
    return s


@cell(13, "inject", "(at tool/result) end-of-step drain after the last result",
      ["R10.5", "R9.10"], ["tools"])
def m13_inject() -> Session:
    s = basic(durable("tool/result"), "inject", calls(("c1", "t")), "done")
    s.expect_log(TOOL_TURN.format("UM('C';plugin:test)"))
    return s


@cell(13, "followup", "(at tool/call) queued", ["R5.3"], ["tools"])
def m13_followup() -> Session:
    s = basic(durable("tool/call"), "followup", calls(("c1", "t")), "done", "two")
    s.expect_log(TOOL_TURN.format("") + " TS(2,msg:user) UM('F') SS(2.1) CH… AM(2.1;'two') "
                 "SE(2.1) TE(2,completed)")
    return s


@cell(13, "cancel", "(during the second call's body) the late body commits ABORTED; the tool "
      "context staged before is discarded and reported; the context finalized afterwards is "
      "kept; turn/end aborted", ["R10.7", "R10.11", "R16.2", "D6", "R10.4"],
      ["tools", "cancel", "differs-from-original", "D6"])
def m13_cancel() -> Session:
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


@cell(13, "dispose", "(at assistant/message) the call gets a synthetic pair; turn/end disposed; "
      "teardown", ["R10.7", "R10.10", "R17.1"], ["tools", "dispose"])
def m13_dispose() -> Session:
    s = basic(durable("assistant/message"), "dispose", calls(("c1", "t")))
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
                 "TR(1.1;c1;ERR ABD) SE(1.1) TE(1,disposed)")
    teardown_ok(s)
    return s


# --------------------------------------------------------------------------
# Row 14: outputs of the end-of-step drain
# --------------------------------------------------------------------------


def late_context(command: str, *replies: Any) -> Session:
    """Context injected during the request hook is written by the end-of-step drain; the command
    is issued at that user/message."""
    s = Session(*(replies or ("one", "two")))
    s.handle("request", lambda e: s.inject("late", "plugin:test"), times=1)
    at(s, durable("user/message", id="m2"), command)
    s.followup("go")
    s.run()
    return s


@cell(14, "steer", "taken by this drain (D3); causes another step",
      ["R11.1", "R9.10", "D3"], ["differs-from-original", "D3"])
def m14_steer() -> Session:
    s = late_context("steer")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "UM('late';plugin:test) STM(1;'S';user) SE(1.1) SS(1.2) CH… AM(1.2;'two') SE(1.2) "
                 "TE(1,completed)")
    return s


@cell(14, "inject", "taken by this drain (D3)", ["R11.1", "R9.10", "D3"],
      ["differs-from-original", "D3"])
def m14_inject() -> Session:
    s = late_context("inject")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "UM('late';plugin:test) UM('C';plugin:test) SE(1.1) TE(1,completed)")
    return s


@cell(14, "followup", "queued", ["R5.3"])
def m14_followup() -> Session:
    s = late_context("followup")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "UM('late';plugin:test) SE(1.1) TE(1,completed) TS(2,msg:user) UM('F') SS(2.1) "
                 "CH… AM(2.1;'two') SE(2.1) TE(2,completed)")
    return s


@cell(14, "cancel", "step/end is still written; turn/end aborted at the next check",
      ["R9.10", "R8.5", "R15.1"], ["cancel"])
def m14_cancel() -> Session:
    s = late_context("cancel")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "UM('late';plugin:test) SE(1.1) TE(1,aborted)")
    return s


# --------------------------------------------------------------------------
# Row 15: step/end
# --------------------------------------------------------------------------

STEP_END = durable("step/end")


@cell(15, "steer", "the next step, skipping turn-stopping", ["R8.4", "R9.2"])
def m15_steer() -> Session:
    s = basic(STEP_END, "steer")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "STM(1;'S';user) SS(1.2) CH… AM(1.2;'two') SE(1.2) TE(1,completed)")
    assert len(s.effects("turn-stopping")) == 1
    trace = s.trace()
    assert trace.index("⟨turn-stopping 1⟩") > trace.index("[SE(1.2)]")
    return s


@cell(15, "inject", "the turn does not go on: the turn-stopping drain, inside the turn",
      ["R8.5", "R11.2"])
def m15_inject() -> Session:
    s = basic(STEP_END, "inject")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "UM('C';plugin:test) TE(1,completed)")
    return s


@cell(15, "inject-continuing", "(a step with a tool call) the next step's top-of-step drain",
      ["R9.2", "R11.2"], ["tools"])
def m15_inject_continuing() -> Session:
    s = basic(STEP_END, "inject", calls(("c1", "t")), "done")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
                 "TR(1.1;c1;ok) SE(1.1) UM('C';plugin:test) SS(1.2) CH… AM(1.2;'done') SE(1.2) "
                 "TE(1,completed)")
    return s


@cell(15, "followup", "queued", ["R5.3"])
def m15_followup() -> Session:
    s = basic(STEP_END, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(15, "cancel", "aborts at the next check", ["R8.5", "R15.1"], ["cancel"])
def m15_cancel() -> Session:
    s = basic(STEP_END, "cancel")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "TE(1,aborted)")
    return s


@cell(15, "cancel-after-concluding", "(a step whose result concluded the turn) effective (its "
      "notice, its abort), but the turn ends at once, with no signal check: its reason stays "
      "completed, as in the original", ["R8.4", "R10.6", "R16.2"], ["tools", "cancel"])
def m15_cancel_after_concluding() -> Session:
    s = Session(calls(("c1", "t")))
    s.handle("tool-execute", lambda e: ("resolve", result(concludesTurn=True)))
    at(s, STEP_END, "cancel")
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
                 "TR(1.1;c1;ok) SE(1.1) TE(1,completed)")
    assert "cancel-req(user)" in s.live() and "settled(1,completed)" in s.live()
    return s


@cell(15, "steer-retained", "(a step whose result concluded the turn) retained; the next admitted "
      "turn's inherited drain takes it ahead of its prompt",
      ["R11.3", "R10.6", "R8.3", "R7.2", "R8.4"], ["tools"])
def m15_steer_retained() -> Session:
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
# Row 16: turn-stopping
# --------------------------------------------------------------------------

TURN_STOPPING = effect("turn-stopping")


@cell(16, "steer", "another step", ["R8.5"])
def m16_steer() -> Session:
    s = basic(TURN_STOPPING, "steer")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "STM(1;'S';user) SS(1.2) CH… AM(1.2;'two') SE(1.2) TE(1,completed)")
    return s


@cell(16, "inject", "written inside the turn after the final step/end; no step", ["R8.5"])
def m16_inject() -> Session:
    s = basic(TURN_STOPPING, "inject")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "UM('C';plugin:test) TE(1,completed)")
    return s


@cell(16, "followup", "queued", ["R5.3"])
def m16_followup() -> Session:
    s = basic(TURN_STOPPING, "followup")
    s.expect_log(TWO_TURNS)
    return s


@cell(16, "cancel", "turn/end aborted; no further step", ["R8.5", "R15.1"], ["cancel"])
def m16_cancel() -> Session:
    s = basic(TURN_STOPPING, "cancel")
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "TE(1,aborted)")
    return s


@cell(16, "cancel-in-drain", "(at an output of the turn-stopping drain that took no steering) "
      "effective, but no signal check follows that drain: the turn ends completed, as in the "
      "original", ["R8.5", "R16.2"], ["cancel"])
def m16_cancel_in_drain() -> Session:
    s = Session("one")
    s.handle("turn-stopping", lambda e: s.inject("stop-time", "plugin:test"), times=1)
    at(s, durable("user/message", id="m2"), "cancel")
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "UM('stop-time';plugin:test) TE(1,completed)")
    assert "cancel-req(user)" in s.live() and "settled(1,completed)" in s.live()
    return s


# --------------------------------------------------------------------------
# Rows 17 and 18: recovery and agent/error
# --------------------------------------------------------------------------

FAILED_TURN = "TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,error)"
REQUEST_ERROR = effect("request-error")
AGENT_ERROR = live("agent/error")


def failing(position: Predicate, command: str, *, retry: bool, replies: Sequence[Any] = ("ok",)
            ) -> Session:
    s = Session(FAILURE, *replies)
    if retry:
        s.handle("request-error", lambda e: RETRY, times=1)
    at(s, position, command)
    s.followup("go")
    s.run()
    return s


@cell(17, "steer", "(retry authorized) retained; taken when the retry starts",
      ["R13.3", "R11.3", "R11.2"])
def m17_steer() -> Session:
    s = failing(REQUEST_ERROR, "steer", retry=True)
    s.expect_log(FAILED_TURN + " TS(2,retry) STM(2;'S';user) SS(2.1) CH… AM(2.1;'ok') SE(2.1) "
                 "TE(2,completed)")
    assert [t for t in s.live() if t.startswith("settled")] == ["settled(2,completed)"]
    return s


@cell(17, "inject", "(no retry) retained; the next admitted turn takes it ahead of its prompt",
      ["R11.3", "R8.3", "R13.2"])
def m17_inject() -> Session:
    s = failing(REQUEST_ERROR, "inject", retry=False)
    s.expect_log(FAILED_TURN)
    assert s.core.pending_context == 1
    s.followup("next")
    s.run()
    assert s.log()[6:9] == ["TS(2,msg:user)", "UM('C';plugin:test)", "UM('next')"], s.log()
    return s


@cell(17, "followup", "(retry authorized) queued; claimed once the chain is over",
      ["R12.8", "R13.3"])
def m17_followup() -> Session:
    s = failing(REQUEST_ERROR, "followup", retry=True, replies=("ok", "two"))
    s.expect_log(FAILED_TURN + " TS(2,retry) SS(2.1) CH… AM(2.1;'ok') SE(2.1) TE(2,completed) "
                 "TS(3,msg:user) UM('F') SS(3.1) CH… AM(3.1;'two') SE(3.1) TE(3,completed)")
    return s


@cell(17, "cancel", "no retry even though recovery authorizes one; turn/end aborted",
      ["R13.2", "R13.5", "R15.1"], ["cancel"])
def m17_cancel() -> Session:
    s = failing(REQUEST_ERROR, "cancel", retry=True)
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,aborted)")
    assert "settled(1,aborted)" in s.live() and not [t for t in s.live() if t.startswith("error")]
    return s


@cell(17, "cancel-at-warning", "(at the 'request recovery failed' warning) turn/end aborted",
      ["R13.2", "R15.1", "R0.8"], ["cancel"])
def m17_cancel_at_warning() -> Session:
    s = Session(FAILURE)
    s.handle("request-error", lambda e: ("raise", error("recovery broke")))
    at(s, WARNING, "cancel")
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,aborted)")
    return s


@cell(18, "steer", "(no retry) retained; the next admitted turn takes it ahead of its prompt",
      ["R11.3", "R8.3"])
def m18_steer() -> Session:
    s = failing(AGENT_ERROR, "steer", retry=False)
    s.expect_log(FAILED_TURN)
    s.followup("next")
    s.run()
    assert s.log()[6:9] == ["TS(2,msg:user)", "STM(2;'S';user)", "UM('next')"], s.log()
    return s


@cell(18, "inject", "(retry authorized) retained; taken when the retry starts",
      ["R11.3", "R13.3"])
def m18_inject() -> Session:
    s = failing(AGENT_ERROR, "inject", retry=True)
    s.expect_log(FAILED_TURN + " TS(2,retry) UM('C';plugin:test) SS(2.1) CH… AM(2.1;'ok') SE(2.1) "
                 "TE(2,completed)")
    return s


@cell(18, "followup", "queued; claimed once the chain is over", ["R12.8", "R13.3"])
def m18_followup() -> Session:
    s = failing(AGENT_ERROR, "followup", retry=True, replies=("ok", "two"))
    s.expect_log(FAILED_TURN + " TS(2,retry) SS(2.1) CH… AM(2.1;'ok') SE(2.1) TE(2,completed) "
                 "TS(3,msg:user) UM('F') SS(3.1) CH… AM(3.1;'two') SE(3.1) TE(3,completed)")
    return s


@cell(18, "cancel", "(retry authorized) the error reason stays; the pending retry is dropped",
      ["R13.5", "R16.2"], ["cancel"])
def m18_cancel() -> Session:
    s = failing(AGENT_ERROR, "cancel", retry=True)
    s.expect_log(FAILED_TURN)
    assert s.reasons()[0]["kind"] == "error" and "settled(1,error)" in s.live()
    return s


# --------------------------------------------------------------------------
# Row 19: turn/end
# --------------------------------------------------------------------------

TURN_END = durable("turn/end")


@cell(19, "steer", "queued without a wake; claimed after the flush with no idle in between",
      ["R12.1", "R12.7"])
def m19_steer() -> Session:
    s = basic(TURN_END, "steer")
    s.expect_log(TWO_TURNS.replace("'F'", "'S'"))
    assert s.live("agent/status") == ["running", "idle"] and len(s.effects("tick")) == 1
    return s


@cell(19, "inject", "appended right after turn/end (D4)", ["R12.3", "R5.2", "R0.6", "D4"],
      ["differs-from-original", "D4"])
def m19_inject() -> Session:
    s = basic(TURN_END, "inject")
    s.expect_log(ONE_TURN + " UM('C';plugin:test)")
    return s


@cell(19, "followup", "queued; claimed after the flush", ["R12.1", "R12.7"])
def m19_followup() -> Session:
    s = basic(TURN_END, "followup")
    s.expect_log(TWO_TURNS)
    assert s.live("agent/status") == ["running", "idle"] and len(s.effects("tick")) == 1
    return s


@cell(19, "cancel", "(failed turn, retry authorized) effective: cancel-requested, the retry is "
      "dropped, abort for the finished controller; the reason stays",
      ["R12.2", "R13.5", "R4.4"], ["cancel"])
def m19_cancel() -> Session:
    s = failing(TURN_END, "cancel", retry=True)
    s.expect_log(FAILED_TURN)
    trace = s.trace()
    assert trace[trace.index("[TE(1,error)]"):] == [
        "[TE(1,error)]", "cancel-req(user)", "abort(user)", "flush(1)", "settled(1,error)", "idle"], trace
    return s


@cell(19, "dispose", "the reason stays; the turn settles completed; teardown",
      ["R12.2", "R17.1"], ["dispose"])
def m19_dispose() -> Session:
    s = basic(TURN_END, "dispose")
    s.expect_log(ONE_TURN)
    assert s.live()[-4:] == ["settled(1,completed)", "idle", "agent/disposed", "session/disposed"]
    assert s.live("agent/cancel-requested") == []
    return s


# --------------------------------------------------------------------------
# Row 20: the post-turn flush
# --------------------------------------------------------------------------

FLUSH = effect("flush")


@cell(20, "steer", "(retry pending) queued without a wake; claimed after the flush and the retry "
      "chain (D1)", ["R12.4", "R12.8", "R6.1", "D1"], ["differs-from-original", "D1"])
def m20_steer() -> Session:
    s = failing(FLUSH, "steer", retry=True, replies=("ok", "two"))
    s.expect_log(FAILED_TURN + " TS(2,retry) SS(2.1) CH… AM(2.1;'ok') SE(2.1) TE(2,completed) "
                 "TS(3,msg:user) UM('S') SS(3.1) CH… AM(3.1;'two') SE(3.1) TE(3,completed)")
    assert len(s.effects("tick")) == 1 and s.live("agent/status") == ["running", "idle"]
    return s


@cell(20, "inject", "appended now", ["R12.4", "R5.2"])
def m20_inject() -> Session:
    s = basic(FLUSH, "inject")
    s.expect_log(ONE_TURN + " UM('C';plugin:test)")
    return s


@cell(20, "followup", "queued without a wake; claimed right after the flush",
      ["R12.4", "R6.1", "D1"], ["differs-from-original", "D1"])
def m20_followup() -> Session:
    s = basic(FLUSH, "followup")
    s.expect_log(TWO_TURNS)
    assert len(s.effects("tick")) == 1
    return s


@cell(20, "followup-at-failed-flush", "(at a failed flush's agent/error) queued without a wake "
      "(D1); claimed right after the flush", ["R12.4", "R6.1", "D1"], ["differs-from-original", "D1"])
def m20_followup_at_failed_flush() -> Session:
    s = Session("one", "two")
    s.handle("flush", lambda e: ("raise", error("disk unavailable")), times=1)
    at(s, AGENT_ERROR, "followup")
    s.followup("go")
    s.run()
    s.expect_log(TWO_TURNS)
    return s


def flush_with_queue(command: Callable[[Session], None]) -> Session:
    s = Session(FAILURE, "ok", "queued reply")
    s.handle("request-error", lambda e: RETRY, times=1)
    s.on(effect("model"), lambda o: s.followup("Q"))
    s.on(FLUSH, lambda o: command(s))
    s.followup("go")
    s.run()
    return s


@cell(20, "cancel", "(retry pending, a prompt queued) discards the prompt and drops the retry (D2)",
      ["R12.4", "R13.5", "R16.4", "R4.9", "D2"], ["cancel", "differs-from-original", "D2"])
def m20_cancel() -> Session:
    s = flush_with_queue(lambda s: s.cancel())
    s.expect_log(FAILED_TURN)
    assert s.live()[-4:] == ["cancel-req(user)", "disc[Q]", "settled(1,error)", "idle"], s.live()
    return s


@cell(20, "cancel-keep-inbox", "(retry pending, a prompt queued) keepInbox only drops the retry; "
      "the queued prompt runs next", ["R12.4", "R16.5", "D2"],
      ["cancel", "differs-from-original", "D2"])
def m20_cancel_keep_inbox() -> Session:
    s = flush_with_queue(lambda s: s.cancel(keep_inbox=True))
    s.expect_log(FAILED_TURN + " TS(2,msg:user) UM('Q') SS(2.1) CH… AM(2.1;'ok') SE(2.1) "
                 "TE(2,completed)")
    assert "settled(1,error)" in s.live() and not [t for t in s.live() if t.startswith("disc")]
    return s


@cell(20, "dispose", "(retry pending) disposal drops the retry; the failed turn settles; teardown",
      ["R17.2", "R13.5", "D2"], ["dispose", "differs-from-original", "D2"])
def m20_dispose() -> Session:
    s = failing(FLUSH, "dispose", retry=True)
    s.expect_log(FAILED_TURN)
    assert s.live()[-4:] == ["settled(1,error)", "idle", "agent/disposed", "session/disposed"]
    return s


# --------------------------------------------------------------------------
# Row 21: agent/settled
# --------------------------------------------------------------------------

SETTLED = live("agent/settled")


@cell(21, "steer", "queued without a wake (D1); claimed right away by continue-or-idle",
      ["R12.7", "R6.1", "D1"], ["differs-from-original", "D1"])
def m21_steer() -> Session:
    s = basic(SETTLED, "steer")
    s.expect_log(TWO_TURNS.replace("'F'", "'S'"))
    assert s.live("agent/status") == ["running", "idle"] and len(s.effects("tick")) == 1
    return s


@cell(21, "inject", "appended now", ["R5.2"])
def m21_inject() -> Session:
    s = basic(SETTLED, "inject")
    s.expect_log(ONE_TURN + " UM('C';plugin:test)")
    return s


@cell(21, "followup", "queued without a wake (D1); claimed right away", ["R12.7", "D1"],
      ["differs-from-original", "D1"])
def m21_followup() -> Session:
    s = basic(SETTLED, "followup")
    s.expect_log(TWO_TURNS)
    assert s.live("agent/status") == ["running", "idle"] and len(s.effects("tick")) == 1
    return s


@cell(21, "cancel", "(a second prompt queued) discards, nothing more", ["R16.4"], ["cancel"])
def m21_cancel() -> Session:
    s = Session("one")
    at(s, SETTLED, "cancel")
    s.followup("go")
    s.followup("second")
    s.run()
    s.expect_log(ONE_TURN)
    assert s.live()[-4:] == ["settled(1,completed)", "cancel-req(user)", "disc[second]", "idle"]
    return s


@cell(21, "dispose", "(a second prompt queued) discards it; idle; teardown", ["R17.1"],
      ["dispose"])
def m21_dispose() -> Session:
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
# Row 22: the rejected tail
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


@cell(22, "steer", "(during its tick) queued; claimed at continue-or-idle without a wake (D1)",
      ["R7.10", "R6.1", "D1"], ["differs-from-original", "D1"])
def m22_steer() -> Session:
    s = rejected(TAIL_TICK, "steer")
    s.expect_log("UM('staged';plugin:test) TS(1,msg:user) UM('S') SS(1.1) RH(initial) CH… "
                 "AM(1.1;'one') SE(1.1) TE(1,completed)")
    assert len(s.effects("tick")) == 2 and s.live("agent/status") == ["running", "idle"]
    return s


@cell(22, "inject", "(at its context append) appended now, right after that event (D4)",
      ["R7.10", "R5.2", "R0.6", "D4"], ["differs-from-original", "D4"])
def m22_inject() -> Session:
    s = rejected(durable("user/message"), "inject")
    assert s.log() == ["UM('staged';plugin:test)", "UM('C';plugin:test)"]
    return s


@cell(22, "followup", "(during its tick) queued without a wake (D1); claimed at continue-or-idle",
      ["R7.10", "R12.7", "D1"], ["differs-from-original", "D1"])
def m22_followup() -> Session:
    s = rejected(TAIL_TICK, "followup")
    assert s.log()[:3] == ["UM('staged';plugin:test)", "TS(1,msg:user)", "UM('F')"]
    return s


@cell(22, "cancel", "(during its tick, a prompt queued) discards, nothing more",
      ["R16.4", "R7.10"], ["cancel"])
def m22_cancel() -> Session:
    s = rejected(TAIL_TICK, "cancel", second=True)
    assert s.log() == ["UM('staged';plugin:test)"]
    assert s.live()[-3:] == ["cancel-req(user)", "disc[second]", "idle"]
    return s


@cell(22, "dispose", "(during its tick, a prompt queued) discards it; idle; teardown",
      ["R17.1", "R7.10"], ["dispose"])
def m22_dispose() -> Session:
    s = rejected(TAIL_TICK, "dispose", second=True)
    assert s.log() == ["UM('staged';plugin:test)"]
    assert s.live()[-4:] == ["disc[second]", "idle", "agent/disposed", "session/disposed"]
    return s


# --------------------------------------------------------------------------
# Row 23: agent/status idle
# --------------------------------------------------------------------------

IDLE = live("agent/status", status="idle")


@cell(23, "steer", "queued plus a wake: a new interval", ["R6.1", "R4.2"])
def m23_steer() -> Session:
    s = basic(IDLE, "steer")
    s.expect_log(TWO_TURNS.replace("'F'", "'S'"))
    assert s.live("agent/status") == ["running", "idle", "running", "idle"]
    assert len(s.effects("tick")) == 2
    return s


@cell(23, "inject", "appended now", ["R5.2"])
def m23_inject() -> Session:
    s = basic(IDLE, "inject")
    s.expect_log(ONE_TURN + " UM('C';plugin:test)")
    assert s.live("agent/status") == ["running", "idle"]
    return s


@cell(23, "followup", "queued plus a wake: a new interval", ["R6.1", "R4.2"])
def m23_followup() -> Session:
    s = basic(IDLE, "followup")
    s.expect_log(TWO_TURNS)
    assert s.live("agent/status") == ["running", "idle", "running", "idle"]
    return s


@cell(23, "cancel", "with nothing pending: a no-op", ["R16.1"], ["cancel"])
def m23_cancel() -> Session:
    s = basic(IDLE, "cancel")
    s.expect_log(ONE_TURN)
    assert s.live()[-1] == "idle" and "cancel-req(user)" not in s.live()
    return s


@cell(23, "dispose", "teardown right after idle", ["R17.1"], ["dispose"])
def m23_dispose() -> Session:
    s = basic(IDLE, "dispose")
    s.expect_log(ONE_TURN)
    assert s.live()[-3:] == ["idle", "agent/disposed", "session/disposed"]
    return s


# --------------------------------------------------------------------------
# Row 24: agent/cancel-requested
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


@cell(24, "steer", "swept into that cancel's reports (P7)", ["R16.2", "P7"], ["cancel"])
def m24_steer() -> Session:
    s = cancel_while_streaming("steer")
    assert s.live()[3:6] == ["cancel-req(user)", "enq(S,s)", "disc[S]"], s.live()
    return s


@cell(24, "inject", "(window open) staged, then swept into its context report (D6)",
      ["R16.2", "P7", "D6"], ["cancel", "differs-from-original", "D6"])
def m24_inject() -> Session:
    s = cancel_while_streaming("inject")
    assert s.live()[3:5] == ["cancel-req(user)", "ctxdisc[C]"], s.live()
    return s


@cell(24, "inject-window-closed", "(idle, a quiet item parked) appended now, kept",
      ["R16.2", "R5.2"], ["cancel"])
def m24_inject_window_closed() -> Session:
    s = Session()
    at(s, CANCEL_REQ, "inject")
    s.send("quiet", {"target": "next-turn", "wakeup": False})
    s.run()
    s.cancel()
    s.run()
    assert s.log() == ["UM('C';plugin:test)"]
    assert s.live() == ["enq(quiet,q)", "cancel-req(user)", "disc[quiet]"]
    return s


@cell(24, "followup", "swept into that cancel's reports (P7)", ["R16.2", "P7"], ["cancel"])
def m24_followup() -> Session:
    s = cancel_while_streaming("followup")
    assert s.live()[3:6] == ["cancel-req(user)", "enq(F,q)", "disc[F]"], s.live()
    return s


def cancelled_while_streaming(observer: Callable[[Session], None], *, times: int | None = 1,
                              keep_inbox: bool = False, steer: bool = False) -> Session:
    """A streaming turn cancelled (by a user cancel), *observer* acting at its
    agent/cancel-requested (the first *times* of them), then the stream aborting."""
    s = Session()
    s.hold("model")
    s.on(CANCEL_REQ, lambda o: observer(s), times=times)
    s.followup("go")
    s.run()
    if steer:
        s.steer("S")
    s.cancel(keep_inbox=keep_inbox)
    s.run()
    s.fail_model(ABORT)
    s.run()
    return s


@cell(24, "cancel", "joins that cancel (D9): with nothing new to clear it does nothing, so no "
      "second cancel-requested, and the first cause is the reason", ["R16.3", "P7", "D9"],
      ["cancel", "differs-from-original", "D9"])
def m24_cancel() -> Session:
    s = cancelled_while_streaming(lambda s: s.cancel("parent"))
    assert [t for t in s.live() if t.startswith("cancel-req")] == ["cancel-req(user)"]
    aborts = [o.to_json() for o in s.outputs if o.to_json().get("out") == "abort"]
    assert [a["reason"] for a in aborts] == [{"kind": "user"}]
    return s


@cell(24, "cancel-with-new-input", "joins that cancel with new input to clear: cancel-requested "
      "again, the input is swept into the same reports, and the joined cancel aborts first: its "
      "cause is the abort's reason and the turn's", ["R16.3", "P7", "R16.2"], ["cancel"])
def m24_cancel_with_new_input() -> Session:
    def queue_then_cancel(s: Session) -> None:
        s.followup("F")
        s.cancel("parent")
    s = cancelled_while_streaming(queue_then_cancel)
    assert [t for t in s.live() if t.startswith(("cancel-req", "enq", "disc"))] == [
        "enq(go,q)", "cancel-req(user)", "enq(F,q)", "cancel-req(parent)", "disc[F]"], s.live()
    aborts = [o.to_json() for o in s.outputs if o.to_json().get("out") == "abort"]
    assert [a["reason"] for a in aborts] == [{"kind": "parent"}]
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,aborted)")
    return s


@cell(24, "cancel-every-notice", "an observer that cancels on every cancel-requested stops (D9): "
      "its first cancel joins with nothing new to clear and does nothing; the same holds with "
      "keepInbox, and on an idle core with one quiet item", ["R16.1", "P7", "D9"],
      ["cancel", "differs-from-original", "D9"])
def m24_cancel_every_notice() -> Session:
    s = cancelled_while_streaming(lambda s: s.cancel("parent"), times=None)
    s.send("quiet", {"target": "next-turn", "wakeup": False})
    s.run()
    s.cancel()                                   # idle, the quiet item is pending: effective
    s.run()
    assert [t for t in s.live() if t.startswith("cancel-req")] == [
        "cancel-req(user)", "cancel-req(user)"], s.live()
    assert "disc[quiet]" in s.live()
    return s


@cell(24, "cancel-keep-inbox-every-notice", "(keepInbox cancels) an observer that cancels with "
      "keepInbox on every cancel-requested stops (D9): a joined keepInbox cancel clears nothing "
      "and does nothing; the staged steering is retained", ["R16.5", "P7", "D9"],
      ["cancel", "differs-from-original", "D9"])
def m24_cancel_keep_inbox_every_notice() -> Session:
    s = cancelled_while_streaming(lambda s: s.cancel("parent", keep_inbox=True), times=None,
                                  keep_inbox=True, steer=True)
    assert [t for t in s.live() if t.startswith(("cancel-req", "disc"))] == [
        "cancel-req(user)"], s.live()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,aborted)")
    assert s.core.pending_steering == 1
    return s


@cell(24, "cancel-joins-keep-inbox", "(a keepInbox cancel being announced) a joined cancel "
      "without keepInbox clears what is pending into reports queued ahead of the abort, and "
      "aborts first: its cause is the reason", ["R16.3", "R16.5", "P7"], ["cancel"])
def m24_cancel_joins_keep_inbox() -> Session:
    s = cancelled_while_streaming(lambda s: s.cancel("parent"), keep_inbox=True, steer=True)
    assert [t for t in s.live() if t.startswith(("cancel-req", "disc"))] == [
        "cancel-req(user)", "cancel-req(parent)", "disc[S]"], s.live()
    aborts = [o.to_json() for o in s.outputs if o.to_json().get("out") == "abort"]
    assert [a["reason"] for a in aborts] == [{"kind": "parent"}]
    assert s.core.pending_steering == 0
    return s


# --------------------------------------------------------------------------
# Row 25: discard and abort outputs
# --------------------------------------------------------------------------

ABORT_SIGNAL = control("abort")


@cell(25, "steer", "(at abort, during a tool body) kept: staged and written by the end-of-step "
      "drain after the aborted batch", ["R16.2", "R10.8", "R11.1"], ["cancel", "tools"])
def m25_steer() -> Session:
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


@cell(25, "inject", "(at the inbox discard, while streaming) kept: staged, retained after the "
      "aborted turn, taken by the next admitted turn", ["R16.2", "R11.3"], ["cancel"])
def m25_inject() -> Session:
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


@cell(25, "followup", "(at abort, while streaming) kept; queued and next to run",
      ["R16.2", "R12.7"], ["cancel"])
def m25_followup() -> Session:
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


@cell(25, "cancel", "(at the inbox discard, idle) nothing is pending again and no owner: a no-op",
      ["R16.1"], ["cancel"])
def m25_cancel() -> Session:
    s = Session()
    at(s, live("agent/inbox/discard"), "cancel")
    s.send("quiet", {"target": "next-turn", "wakeup": False})
    s.cancel()
    s.run()
    assert s.live() == ["enq(quiet,q)", "cancel-req(user)", "disc[quiet]"]
    return s


# --------------------------------------------------------------------------
# Row 26: publication
# --------------------------------------------------------------------------

SESSION_START = live("agent/session-start")


def at_start(command: str, position: Predicate = SESSION_START) -> Session:
    s = Session("one")
    at(s, position, command)
    s.run()
    return s


@cell(26, "steer", "queued plus a wake", ["R5.3", "R6.1", "P11"])
def m26_steer() -> Session:
    s = at_start("steer")
    s.expect_log(ONE_TURN.replace("'go'", "'S'"))
    return s


@cell(26, "inject", "(at agent/created) appended now, before the first turn", ["R5.2", "P11"])
def m26_inject() -> Session:
    s = at_start("inject", live("agent/created"))
    s.expect_log("UM('C';plugin:test)")
    return s


@cell(26, "followup", "(at session/created) queued plus a wake", ["R5.3", "R6.1", "P11"])
def m26_followup() -> Session:
    s = at_start("followup", live("session/created"))
    s.expect_log(ONE_TURN.replace("'go'", "'F'"))
    return s


@cell(26, "cancel", "never raises; does nothing with nothing pending", ["R16.1", "P11"], ["cancel"])
def m26_cancel() -> Session:
    s = at_start("cancel")
    assert s.log() == [] and s.live() == [] and s.caught == []
    return s


# --------------------------------------------------------------------------
# Row 27: after teardown
# --------------------------------------------------------------------------


@cell(27, "all", "every command but dispose raises DisposedError with no effect, ahead of "
      "validation; dispose() does nothing (D10)", ["R17.3", "P10", "D10"],
      ["dispose", "differs-from-original", "D10"])
def m27_all() -> Session:
    s = Session()
    s.dispose()
    s.run()
    assert s.live() == ["agent/disposed", "session/disposed"]
    for command in (lambda: s.steer("S"), lambda: s.inject("C"), lambda: s.followup("F"),
                    lambda: s.cancel(), lambda: s.core.followup({"not": "a message"}),
                    lambda: s.core.cancel({"kind": "bogus"})):
        problem = s.attempt(command)
        assert problem is not None and "disposed" in problem, problem
    s.dispose()
    s.run()
    assert s.live() == ["agent/disposed", "session/disposed"] and s.log() == []
    return s
