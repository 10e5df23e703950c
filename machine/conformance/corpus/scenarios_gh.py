"""Scenarios G (session log through the core's append command, resume, publication) and H
(further scenarios derived from the rules) of scenarios.md.

G4 (fork) and G7 (loading a live session) concern persistence only and are not vectors.
"""

from __future__ import annotations

from typing import Any

from machine.conformance.authoring import Session, calls, live, result, scenario
from machine.conformance.corpus.common import (
    block,
    cancel_reports,
    failed_step_retaining,
    inject_during,
    started,
)
from machine.events import Event
from machine.io import Effect
from machine.jsonvalue import thaw

TS1 = {"turn": 1, "trigger": {"kind": "message", "source": {"kind": "user"}}}


def _append(s: Session, type_: str, data: dict[str, Any], *, surface: Any = None,
            sources: list[int] | None = None, refused: str | None = None) -> None:
    def command() -> None:
        s.core.append(type_, data, surface_op=surface, source_event_seqs=sources)
    problem = s.attempt(command)
    if refused is None:
        assert problem is None, problem
    else:
        assert problem is not None and refused in problem, problem


@scenario("G1a-enclosure-turn-still-open",
          "G1. turn/start while a turn is open is refused ('turn 1 is still open'), and a "
          "turn/end that does not name the open turn is refused; nothing is appended",
          ["R20.2", "R0.6", "L4", "L2"], ["scenario", "scenario:G1", "log"])
def g1a() -> Session:
    s = Session()
    s.pump()
    _append(s, "turn/start", TS1)
    _append(s, "turn/start", {**TS1, "turn": 2}, refused="turn 1 is still open")
    _append(s, "turn/end", {"turn": 2, "reason": {"kind": "completed"}},
            refused="does not match open turn 1")
    s.run()
    assert s.log() == ["TS(1,msg:user)"]
    return s


@scenario("G1b-enclosure-turn-numbering",
          "G1. Turn numbers are contiguous: after TS(1) and TE(1), turn/start{turn:3} is refused "
          "('expected turn 2, got 3')",
          ["R20.2", "L4"], ["scenario", "scenario:G1", "log"])
def g1b() -> Session:
    s = Session()
    s.pump()
    _append(s, "turn/start", TS1)
    _append(s, "turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    _append(s, "turn/start", {**TS1, "turn": 3}, refused="expected turn 2, got 3")
    s.run()
    assert s.log() == ["TS(1,msg:user)", "TE(1,completed)"]
    return s


@scenario("G1c-enclosure-context-between-turns",
          "G1. Context may sit between turns, execution may not: a user/message and an unknown "
          "extension event are committed on an empty session, a steering/message outside any "
          "turn is refused",
          ["R20.2", "L9", "L8", "L10"], ["scenario", "scenario:G1", "log"])
def g1c() -> Session:
    s = Session()
    s.pump()
    _append(s, "user/message", s.msg("idle context", "plugin:test"), surface="append")
    _append(s, "steering/message", {"turn": 1, "message": s.msg("go")}, surface="append",
            refused="outside any open turn")
    _append(s, "plugin/marker", {"note": "anything"})
    _append(s, "turn/start", TS1)
    s.run()
    assert s.log() == ["UM('idle context';plugin:test)", "plugin/marker", "TS(1,msg:user)"]
    return s


@scenario("G2a-rejected-append-leaves-no-trace",
          "G2. Checks run before commit: an invalid turn/start consumes no seq (the next valid "
          "append takes it); a fresh tool/result with no open step and a replacement tool/result "
          "outside any turn are refused",
          ["R20.2", "L2", "L7"], ["scenario", "scenario:G2", "log"])
def g2a() -> Session:
    s = Session()
    s.pump()
    _append(s, "turn/start", {"turn": 0, "trigger": {"kind": "retry"}}, refused="turn")
    _append(s, "user/message", s.msg("first"), surface="append")
    tr = {"turn": 1, "step": 1, "message": {
        "id": "tr-1", "role": "user", "source": {"kind": "tool", "callId": "c1"},
        "content": [{"type": "tool-result", "toolCallId": "c1",
                     "content": [{"type": "text", "text": "x"}]}]}}
    _append(s, "tool/result", tr, surface="append", refused="")
    _append(s, "tool/result", tr, surface={"op": "replace", "start": 0, "end": 0}, refused="")
    s.run()
    assert [e.seq for e in s.events()] == [0] and s.log() == ["UM('first')"]
    return s


@scenario("G2b-tool-results-per-step",
          "G2. Inside an open step an error tool/result with code TOOL_NOT_STARTED needs no "
          "tool/call; a step may end with an unresolved call, and a result in step 2 cannot "
          "answer a call of step 1",
          ["R20.2", "L5", "L7"], ["scenario", "scenario:G2", "log"])
def g2b() -> Session:
    s = Session()
    s.pump()

    def tool_result(call_id: str, step: int, code: str | None = None) -> dict[str, Any]:
        block: dict[str, Any] = {"type": "tool-result", "toolCallId": call_id,
                                 "content": [{"type": "text", "text": "x"}]}
        data: dict[str, Any] = {"turn": 1, "step": step, "message": {
            "id": f"tr-{call_id}-{step}", "role": "user",
            "source": {"kind": "tool", "callId": call_id}, "content": [block]}}
        if code is not None:
            block["isError"] = True
            data["error"] = {"name": "ToolNotStartedError", "code": code}
        return data
    _append(s, "turn/start", TS1)
    _append(s, "step/start", {"turn": 1, "step": 1})
    _append(s, "tool/result", tool_result("c0", 1, "TOOL_NOT_STARTED"), surface="append")
    _append(s, "tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "t", "arguments": {}})
    _append(s, "step/end", {"turn": 1, "step": 1})
    _append(s, "step/start", {"turn": 1, "step": 2})
    _append(s, "tool/result", tool_result("c1", 2), surface="append", refused="")
    s.run()
    assert s.log() == ["TS(1,msg:user)", "SS(1.1)", "TR(1.1;c0;ERR TOOL_NOT_STARTED)",
                       "TC(1.1;c1)", "SE(1.1)", "SS(1.2)"]
    return s


def lifecycle_one() -> list[Event]:
    first = Session("one")
    first.followup("first")
    first.run()
    return first.events()


@scenario("G6-resume-continues-numbering",
          "G6. A resumed instance continues turn numbering from the seeded log and re-anchors "
          "the request header with reason 'resume'; its first request starts with the earlier "
          "history",
          ["R4.7", "R9.6", "R4.8", "P11"], ["scenario", "scenario:G6"])
def g6() -> Session:
    seed = lifecycle_one()
    s = Session("two", seed=seed, session_start="resume")
    s.followup("second")
    s.run()
    s.expect_log("TS(1,msg:user) UM('first') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "TE(1,completed) TS(2,msg:user) UM('second') SS(2.1) RH(resume) CH… "
                 "AM(2.1;'two') SE(2.1) TE(2,completed)")
    assert s.requests() == [["'first'", "'one'", "'second'"]]
    assert [d["reason"] for d in s.data("request/header")] == ["initial", "resume"]
    history = s.effects("model")[0].history
    assert history is not None and history[0].to_json() == thaw(seed[1].data)  # the first prompt
    assert s.live(publication=True)[:3] == ["session/created", "agent/created",
                                            "session-start(resume)"]
    return s


@scenario("G8-publication-order-session-start",
          "G8. Publication order on resume: session/created, agent/created (idle), "
          "agent/session-start('resume'); a cancel from the session-start observer does not raise "
          "and, with nothing pending, does nothing",
          ["P11", "R3.1", "R19", "R16.1"], ["scenario", "scenario:G8"])
def g8() -> Session:
    s = Session(seed=lifecycle_one(), session_start="resume")
    status: list[str] = []
    s.on(live("agent/created"), lambda o: status.append(s.core.status))
    s.on(live("agent/session-start"), lambda o: s.cancel())
    s.run()
    assert s.live(publication=True) == ["session/created", "agent/created", "session-start(resume)"]
    assert s.trace(publication=True) == ["session/created", "agent/created", "session-start(resume)"]
    assert s.payloads("agent/created")[0]["status"] == "idle" and status == ["idle"]
    assert s.caught == []
    return s


# --------------------------------------------------------------------------
# H
# --------------------------------------------------------------------------


@scenario("H6-context-in-turn-stopping-stays-in-turn",
          "H6. Context injected from the turn-stopping extension point is drained inside the "
          "turn after the last step/end, without another step",
          ["R8.5", "R11.2"], ["scenario", "scenario:H6"])
def h6() -> Session:
    s = Session("x", "y")
    inject_during(s, "turn-stopping", "stop-time context")
    s.followup("go")
    s.run()
    s.followup("next")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'x') SE(1.1) "
                 "UM('stop-time context';plugin:test) TE(1,completed) TS(2,msg:user) UM('next') "
                 "SS(2.1) CH… AM(2.1;'y') SE(2.1) TE(2,completed)")
    assert s.requests()[1] == ["'go'", "'x'", "'stop-time context';plugin:test", "'next'"]
    assert [e.payload["turn"] for e in s.effects("model")] == [1, 2]
    return s


@scenario("H7a-idle-cancel-reports-both-kinds",
          "H7. A blocked admission with steering staged keeps the whole outbox; an idle cancel "
          "then reports the steering in the inbox discard and the context in the context discard "
          "(D6); neither is ever appended",
          ["R7.10", "R16.1", "R16.2", "D6", "R11.3", "R20.1"],
          ["scenario", "scenario:H7", "cancel", "differs-from-original", "D6"])
def h7a() -> Session:
    s = started("ok", hold="prompt-submit", prompt="blocked")
    s.inject("staged context", "plugin:test")
    s.steer("staged steering")
    block(s)
    assert s.log() == [] and s.core.status == "idle"
    assert (s.core.pending_steering, s.core.pending_context) == (1, 1)
    cancel_reports(s, "cancel-req(user) disc[staged steering] ctxdisc[staged context]")
    s.followup("later")
    s.run()
    s.expect_log("TS(1,msg:user) UM('later') SS(1.1) RH(initial) CH… AM(1.1;'ok') SE(1.1) "
                 "TE(1,completed)")
    return s


@scenario("H7b-idle-cancel-context-only",
          "H7 (variant). Context staged by a raising step handler is retained after the failed "
          "turn; an idle cancel reports it in agent/context/discard only",
          ["R11.3", "R16.2", "D6", "R15.3"],
          ["scenario", "scenario:H7", "cancel", "differs-from-original", "D6"])
def h7b() -> Session:
    s = failed_step_retaining("C")
    assert s.reasons() == [{"kind": "error", "step": 1, "message": "step failed"}]
    assert s.core.pending_context == 1 and s.core.status == "idle"
    cancel_reports(s, "cancel-req(user) ctxdisc[C]")
    return s


@scenario("H9-invalid-context-in-tool-refused",
          "H9. An invalid message injected by a tool body is refused at the call and nothing is "
          "staged; the body returns normally and the turn continues (the scenario's non-JSON "
          "source is replaced by a source with an empty kind, which JSON can carry)",
          ["R5.1", "D5", "V7"], ["scenario", "scenario:H9", "tools", "differs-from-original", "D5"])
def h9() -> Session:
    s = Session(calls(("c1", "noticer"), text="calling"), "done")

    def body(e: Effect) -> Any:
        bad = {**s.msg("bad context"), "source": {"kind": ""}}
        assert s.attempt(lambda: s.core.inject(bad)) is not None
        assert s.core.pending_context == 0
        return ("resolve", result())
    s.handle("tool-execute", body)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'calling'+call c1) "
                 "TC(1.1;c1) TR(1.1;c1;ok) SE(1.1) SS(1.2) CH… AM(1.2;'done') SE(1.2) "
                 "TE(1,completed)")
    assert len(s.effects("model")) == 2 and not s.live("agent/error")
    return s
