"""Vectors for configurations and situations the rest of the corpus left blind (issue 19).

* several contexts staged at one rejected admission (R7.10 step 2, R26.3);
* parallel pools larger than ``maxParallelToolCalls`` (R10.2) under a limit of one, under a
  cancel, with a failure, and between groups;
* two consecutive failing chains, and a completed step inside a chain (``priorFailures``
  resetting, R13.4);
* the report order of D6 (R16.2 step 2) with every kind of pending input, with tool
  contexts, at teardown and after a keepInbox cancel;
* configurations no other vector used (``machine.conformance.coverage.DIMENSIONS``):
  publication off, and a resumed session with a parallel pool, a retry, a rejected
  admission and a cancel.

Ids ``BS-<topic>``.
"""

from __future__ import annotations

from typing import Any

from machine.conformance.authoring import Session, calls, error, model_failure, result, scenario
from machine.conformance.corpus.common import (
    admission_pending,
    block,
    failed_step_retaining,
    live_of,
    started,
)
from machine.conformance.corpus.scenarios_gh import lifecycle_one  # a finished session to resume (G6)
from machine.io import Effect
from machine.jsonvalue import thaw

PARALLEL: Any = "parallel"
EXCLUSIVE: Any = "exclusive"


# --------------------------------------------------------------------------
# Several contexts at one rejected admission (R7.10 step 2, R26.3)
# --------------------------------------------------------------------------


@scenario("BS-rejected-admission-appends-every-staged-context",
          "R7.10: two contexts injected while an admission is pending, which is then blocked, "
          "are both appended between turns, oldest first, before the rejected admission's tick; "
          "no turn opens and no context discard is reported",
          ["R7.10", "R5.2", "R11.2", "R20.1"], ["rule"])
def rejected_two_contexts() -> Session:
    s = admission_pending(Session("ok"), "blocked", "c1", "c2")
    assert s.core.pending_context == 2
    block(s)
    s.expect_log("UM('c1';plugin:test) UM('c2';plugin:test)")
    trace = s.trace()
    assert trace.index("[UM('c2';plugin:test)]") < trace.index("tick(rejected-admission)"), trace
    assert not live_of(s, "ctxdisc")
    s.followup("next")
    s.run()
    assert s.requests()[-1] == ["'c1';plugin:test", "'c2';plugin:test", "'next'"]
    return s


@scenario("BS-failed-admission-appends-contexts-after-its-warning",
          "R7.7, R7.10: an admission whose decision raises warns first ('prompt admission "
          "failed: …'), then appends the two contexts staged meanwhile, oldest first, between "
          "turns",
          ["R7.7", "R7.8", "R7.10", "R0.8"], ["rule"])
def failed_two_contexts() -> Session:
    s = admission_pending(Session("ok"), "refused", "c1", "c2")
    s.fail("prompt-submit", error("policy down", "HookError"))
    s.run()
    s.expect_log("UM('c1';plugin:test) UM('c2';plugin:test)")
    trace = s.trace()
    warning = trace.index("warn('prompt admission failed: policy down')")
    assert warning < trace.index("[UM('c1';plugin:test)]") < trace.index("[UM('c2';plugin:test)]")
    return s


@scenario("BS-rejected-admission-keeps-contexts-behind-steering",
          "R7.10, R26.3: a steering item staged between two contexts at a blocked admission "
          "keeps all three staged; the next admitted turn's inherited drain writes them ahead "
          "of its prompt in FIFO order, the steering as a steering/message of that turn",
          ["R7.10", "R8.3", "R11.1", "R11.3", "R20.1"], ["rule"])
def rejected_behind_steering() -> Session:
    s = admission_pending(Session("ok"), "blocked", "c1", "s1", "c2")
    block(s)
    assert s.log() == []
    assert (s.core.pending_steering, s.core.pending_context) == (1, 2)
    s.followup("next")
    s.run()
    s.expect_log("TS(1,msg:user) UM('c1';plugin:test) STM(1;'s1';user) UM('c2';plugin:test) "
                 "UM('next') SS(1.1) RH(initial) CH… AM(1.1;'ok') SE(1.1) TE(1,completed)")
    assert "deq(s1,s)" in s.live()
    return s


@scenario("BS-rejected-admission-appends-retained-and-new-contexts",
          "R11.3, R7.10: context retained from a failed turn and context injected during the "
          "next admission, which is blocked, are appended together between turns, the retained "
          "one first",
          ["R11.3", "R7.10", "R15.3"], ["rule"])
def rejected_retained_and_new() -> Session:
    s = failed_step_retaining("retained", "ok")
    assert s.core.pending_context == 1
    admission_pending(s, "blocked", "fresh")
    block(s)
    s.expect_log("TS(1,msg:user) UM('go') TE(1,error) UM('retained';plugin:test) "
                 "UM('fresh';plugin:test)")
    assert s.core.pending_context == 0
    return s


# --------------------------------------------------------------------------
# Parallel pools larger than maxParallelToolCalls (R10.2)
# --------------------------------------------------------------------------


@scenario("BS-pool-over-limit-of-one-runs-serially",
          "R10.2: with maxParallelToolCalls 1 a pool of three parallel calls has one call in "
          "flight at a time: each call starts (tool/call, prepare, execute) only once the "
          "previous one's result is committed",
          ["R10.2", "R10.3", "R10.4", "P11"], ["rule", "tools"])
def pool_limit_one() -> Session:
    s = Session(calls(("c1", "p"), ("c2", "p"), ("c3", "p")), "done",
                tool_modes={"p": PARALLEL}, max_parallel=1)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… "
                 "AM(1.1;call c1+call c2+call c3) TC(1.1;c1) TR(1.1;c1;ok) TC(1.1;c2) "
                 "TR(1.1;c2;ok) TC(1.1;c3) TR(1.1;c3;ok) SE(1.1) SS(1.2) CH… AM(1.2;'done') "
                 "SE(1.2) TE(1,completed)")
    trace = s.trace(durable=())
    stages = [t for t in trace if t.startswith(("⟨prepare", "⟨execute", "⟨finalize"))]
    assert stages == [f"⟨{stage} {c}⟩" for c in ("c1", "c2", "c3")
                      for stage in ("prepare", "execute", "finalize")], stages
    return s


@scenario("BS-pool-over-limit-cancelled-while-full",
          "R10.2, R10.7, R10.11: four parallel calls with maxParallelToolCalls 2, cancelled "
          "while the first two execute: nothing more starts; both bodies are awaited and, "
          "settling after the abort, committed as ABORTED; the two never started get synthetic "
          "aborted-before-dispatch pairs, in model order; the turn ends aborted",
          ["R10.2", "R10.7", "R10.10", "R10.11", "R16.4", "R19"], ["rule", "tools", "cancel"])
def pool_limit_cancelled() -> Session:
    s = Session(calls(("c1", "p"), ("c2", "p"), ("c3", "p"), ("c4", "p")),
                tool_modes={"p": PARALLEL}, max_parallel=2)
    s.hold("tool-execute", times=2)
    s.followup("go")
    s.run()
    assert [e.payload["callId"] for e in s.effects("tool-execute")] == ["c1", "c2"]
    s.cancel()
    s.run()
    assert s.log()[-2:] == ["TC(1.1;c1)", "TC(1.1;c2)"], s.log()
    execute = {e.payload["callId"]: e for e in s.effects("tool-execute")}
    for call_id in ("c2", "c1"):               # the later one settles first
        s.driver.held.remove(execute[call_id])
        s.core.resolve(execute[call_id].id, result(f"late {call_id}"))
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… "
                 "AM(1.1;call c1+call c2+call c3+call c4) TC(1.1;c1) TC(1.1;c2) "
                 "TR(1.1;c1;ERR ABORTED) TR(1.1;c2;ERR ABORTED) TC(1.1;c3) TR(1.1;c3;ERR ABD) "
                 "TC(1.1;c4) TR(1.1;c4;ERR ABD) SE(1.1) TE(1,aborted)")
    assert [e.payload["callId"] for e in s.effects("tool-execute")] == ["c1", "c2"]
    return s


@scenario("BS-pool-over-limit-failure-stops-the-pool",
          "R10.2, R10.9: three parallel calls with maxParallelToolCalls 2; the second body "
          "settles with an invalid result while the first still executes: the third never "
          "starts, the first is awaited and committed, the failing call gets no tool/result, "
          "and the turn ends in error (D5: the original has no batch failure)",
          ["R10.2", "R10.9", "R8.6", "R15.3", "D5"],
          ["rule", "tools", "differs-from-original", "D5"])
def pool_limit_failure() -> Session:
    s = Session(calls(("c1", "p"), ("c2", "p"), ("c3", "p")),
                tool_modes={"p": PARALLEL}, max_parallel=2)
    s.hold("tool-execute", times=2)
    s.followup("go")
    s.run()
    execute = {e.payload["callId"]: e for e in s.effects("tool-execute")}
    assert list(execute) == ["c1", "c2"]
    s.driver.held.remove(execute["c2"])
    s.core.resolve(execute["c2"].id, {"content": "not a list"})
    s.run()
    assert "TC(1.1;c3)" not in s.log()
    s.driver.held.remove(execute["c1"])
    s.core.resolve(execute["c1"].id, result("first"))
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… "
                 "AM(1.1;call c1+call c2+call c3) TC(1.1;c1) TC(1.1;c2) TR(1.1;c1;ok) SE(1.1) "
                 "TE(1,error)")
    assert s.reasons()[-1]["code"] == "INVALID_TOOL_RESULT"
    return s


@scenario("BS-pools-over-limit-around-an-exclusive-call",
          "R10.2: calls p1 p2 p3 (parallel) e1 (exclusive) p4 p5 (parallel) with "
          "maxParallelToolCalls 2 form three groups; each group begins only once every result "
          "of the one before is in the log, and neither pool ever has more than two in flight",
          ["R10.2", "R10.3", "R10.4"], ["rule", "tools"])
def pools_around_exclusive() -> Session:
    s = Session(calls(("p1", "p"), ("p2", "p"), ("p3", "p"), ("e1", "e"), ("p4", "p"),
                      ("p5", "p")), "done",
                tool_modes={"p": PARALLEL, "e": EXCLUSIVE}, max_parallel=2)
    in_flight: list[str] = []
    peak = {"n": 0}

    def watch(output: Any) -> None:
        if isinstance(output, Effect) and output.kind == "tool-execute":
            in_flight.append(str(output.payload["callId"]))
            peak["n"] = max(peak["n"], len(in_flight))
        elif isinstance(output, Effect) and output.kind == "tool-finalize":
            in_flight.remove(str(output.payload["callId"]))
    s.driver.on(watch)
    s.followup("go")
    s.run()
    tools = [t for t in s.log() if t.startswith(("TC", "TR"))]
    # p2 settled while p1 was being finalized: it is committed before p3 starts, and p3 starts
    # only once a settled call has been taken (a settled call counts in flight till then)
    assert tools == ["TC(1.1;p1)", "TC(1.1;p2)", "TR(1.1;p1;ok)", "TR(1.1;p2;ok)", "TC(1.1;p3)",
                     "TR(1.1;p3;ok)", "TC(1.1;e1)", "TR(1.1;e1;ok)", "TC(1.1;p4)", "TC(1.1;p5)",
                     "TR(1.1;p4;ok)", "TR(1.1;p5;ok)"], tools
    assert peak["n"] == 2
    return s


# --------------------------------------------------------------------------
# priorFailures resetting (R13.2, R13.4)
# --------------------------------------------------------------------------


def _prior(s: Session) -> list[list[str]]:
    return [[f["message"] for f in thaw(e.payload)["priorFailures"]]
            for e in s.effects("request-error")]


@scenario("BS-two-failing-chains-reset-prior-failures",
          "R13.2–R13.4: two chains that both end in failure: within a chain priorFailures "
          "grows (the retry sees the failure before it); the second chain, started by a new "
          "admitted turn with no completed step in between, begins again with none",
          ["R13.2", "R13.3", "R13.4", "R4.9", "R12.5", "R12.6", "R7.9", "V21"], ["rule"])
def two_failing_chains() -> Session:
    s = Session(model_failure("one", "UNAVAILABLE"), model_failure("two", "UNAVAILABLE"),
                model_failure("three", "UNAVAILABLE"), model_failure("four", "UNAVAILABLE"))
    answers = iter([{"kind": "retry"}, None, {"kind": "retry"}, None])
    s.handle("request-error", lambda e: ("resolve", next(answers)))
    s.followup("first")
    s.run()
    s.followup("second")
    s.run()
    s.expect_log("TS(1,msg:user) UM('first') SS(1.1) RH(initial) SE(1.1) TE(1,error) "
                 "TS(2,retry) SS(2.1) SE(2.1) TE(2,error) "
                 "TS(3,msg:user) UM('second') SS(3.1) SE(3.1) TE(3,error) "
                 "TS(4,retry) SS(4.1) SE(4.1) TE(4,error)")
    assert _prior(s) == [[], ["one"], [], ["three"]], _prior(s)
    settled = live_of(s, "settled")
    assert settled == ["settled(2,error)", "settled(4,error)"]
    return s


@scenario("BS-completed-step-inside-a-chain-resets-prior-failures",
          "R13.4, R8.4: in a retry run whose first step completes (a tool call) and whose "
          "second step fails, the second recovery sees no prior failure; the retry after it "
          "sees only that failure",
          ["R13.4", "R8.4", "R13.2", "R13.3", "R10.4"], ["rule", "tools"])
def completed_step_resets() -> Session:
    s = Session(model_failure("one", "UNAVAILABLE"), calls(("c1", "t")),
                model_failure("two", "UNAVAILABLE"), model_failure("three", "UNAVAILABLE"))
    answers = iter([{"kind": "retry"}, {"kind": "retry"}, None])
    s.handle("request-error", lambda e: ("resolve", next(answers)))
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,error) "
                 "TS(2,retry) SS(2.1) CH… AM(2.1;call c1) TC(2.1;c1) TR(2.1;c1;ok) SE(2.1) "
                 "SS(2.2) SE(2.2) TE(2,error) TS(3,retry) SS(3.1) SE(3.1) TE(3,error)")
    assert _prior(s) == [[], [], ["two"]], _prior(s)
    return s


# --------------------------------------------------------------------------
# D6: what a cancel reports, in which order (R16.2 step 2)
# --------------------------------------------------------------------------


@scenario("BS-D6-cancel-reports-queued-then-steering-then-context",
          "R16.2, D6: a cancel during a turn with queued items (waking and quiet), steering and "
          "context all pending, interleaved: agent/inbox/discard lists the queued items then the "
          "steering, each oldest first; agent/context/discard follows with the contexts, oldest "
          "first",
          ["R16.2", "D6", "R20.1", "R19"], ["rule", "cancel", "differs-from-original", "D6"])
def d6_every_kind() -> Session:
    s = started("ok", hold="step")
    s.steer("s1")
    s.inject("c1", "plugin:test")
    s.followup("q1")
    s.inject("c2", "plugin:test")
    s.steer("s2")
    s.send("q2", {"target": "next-turn", "wakeup": False})
    s.cancel()
    s.run()
    reports = live_of(s, "cancel-req", "disc", "ctxdisc")
    assert reports == ["cancel-req(user)", "disc[q1,q2,s1,s2]", "ctxdisc[c1,c2]"], reports
    s.resolve("step")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') TE(1,aborted)")
    return s


@scenario("BS-D6-tool-contexts-and-injects-share-one-report",
          "R10.5, R16.2, D6: a tool result's context and an inject made during the batch share "
          "one FIFO; a cancel at the second call's tool/result reports both in arrival order; "
          "the second result's own context, staged after that cancel, is kept and written by "
          "the end-of-step drain",
          ["R10.5", "R10.4", "R16.2", "D6", "R19"],
          ["rule", "tools", "cancel", "differs-from-original", "D6"])
def d6_tool_contexts() -> Session:
    s = Session(calls(("c1", "t"), ("c2", "t")))

    def finalize(e: Effect) -> Any:
        call_id = e.payload["callId"]
        if call_id == "c2":
            s.inject("injected", "plugin:test")
        return ("resolve", result(contexts=[s.msg(f"ctx-{call_id}", "plugin:tool")]))
    s.handle("tool-finalize", finalize)
    s.on(lambda o: o.to_json().get("type") == "tool/result"
         and o.to_json()["data"]["message"]["content"][0]["toolCallId"] == "c2",
         lambda o: s.cancel())
    s.followup("go")
    s.run()
    reports = live_of(s, "cancel-req", "disc", "ctxdisc")
    assert reports == ["cancel-req(user)", "ctxdisc[ctx-c1,injected]"], reports
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1+call c2) "
                 "TC(1.1;c1) TR(1.1;c1;ok) TC(1.1;c2) TR(1.1;c2;ok) UM('ctx-c2';plugin:tool) "
                 "SE(1.1) TE(1,aborted)")
    return s


@scenario("BS-D6-teardown-reports-quiet-items-then-retained-context",
          "R17.4, D6: at teardown a quiet item still queued and context retained from a failed "
          "turn are reported, agent/inbox/discard then agent/context/discard, without "
          "agent/cancel-requested, and before agent/disposed",
          ["R17.4", "R17.1", "D6", "R11.3", "R20.1"],
          ["rule", "dispose", "differs-from-original", "D6"])
def d6_teardown() -> Session:
    s = failed_step_retaining("retained")
    s.send("quiet", {"target": "next-turn", "wakeup": False})
    s.run()
    assert (s.core.pending_queued, s.core.pending_context) == (1, 1)
    s.dispose()
    s.run()
    tail = s.live(publication=True)[-4:]
    assert tail == ["disc[quiet]", "ctxdisc[retained]", "agent/disposed", "session/disposed"], tail
    assert not live_of(s, "cancel-req")
    return s


@scenario("BS-D6-keep-inbox-cancel-then-idle-cancel",
          "R16.5, R16.2, D6: a keepInbox cancel during a turn aborts it and reports nothing; "
          "the steering and context it spared are retained; a later idle cancel reports them, "
          "the steering in agent/inbox/discard, then the context",
          ["R16.5", "R16.2", "R11.3", "D6", "R16.1"],
          ["rule", "cancel", "differs-from-original", "D6"])
def d6_keep_inbox_then_cancel() -> Session:
    s = started("ok", hold="step")
    s.inject("c1", "plugin:test")
    s.steer("s1")
    s.cancel(keep_inbox=True)
    s.resolve("step")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') TE(1,aborted)")
    assert not live_of(s, "disc", "ctxdisc")
    assert (s.core.pending_steering, s.core.pending_context) == (1, 1)
    s.cancel()
    s.run()
    assert s.live()[-3:] == ["cancel-req(user)", "disc[s1]", "ctxdisc[c1]"], s.live()
    return s


# --------------------------------------------------------------------------
# Configurations no other vector uses: publication off, a resumed session with tools
# --------------------------------------------------------------------------


@scenario("BS-unpublished-agent-turn-cancel-and-teardown",
          "P11, R17.4: an agent made with publish false emits no publication notices; a turn, a "
          "cancel of the next turn at its step and a dispose behave as usual, teardown still "
          "ending with agent/disposed and session/disposed",
          ["P11", "R3.1", "R16.2", "R16.4", "R17.1", "R17.4", "R7.4"], ["rule", "cancel", "dispose"])
def unpublished() -> Session:
    s = Session("one", "two", publish=False)
    s.followup("first")
    s.run()
    s.on(lambda o: isinstance(o, Effect) and o.kind == "step", lambda o: s.cancel("parent"))
    s.followup("second")
    s.run()
    s.dispose()
    s.run()
    s.expect_log("TS(1,msg:user) UM('first') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "TE(1,completed) TS(2,msg:user) UM('second') TE(2,aborted)")
    every = s.live(publication=True)
    assert not {"session/created", "agent/created"} & set(every)
    assert not [t for t in every if t.startswith("session-start")]
    assert every[-2:] == ["agent/disposed", "session/disposed"], every
    assert "cancel-req(parent)" in every
    return s


@scenario("BS-resumed-session-parallel-batch-then-retry",
          "R4.7, R9.6, R10.2, R13.3: a resumed session (seeded log, session start resume) runs "
          "a pool of two parallel calls within its limit, then a request failure whose retry "
          "turn succeeds; turns continue the seeded numbering and the first header is 'resume'",
          ["R4.7", "R9.6", "R10.2", "R10.4", "R13.2", "R13.3", "P11"], ["rule", "tools"])
def resumed_parallel_retry() -> Session:
    s = Session(calls(("c1", "p"), ("c2", "p")), model_failure("down", "UNAVAILABLE"), "back",
                seed=lifecycle_one(), session_start="resume", tool_modes={"p": PARALLEL},
                max_parallel=2)
    s.handle("request-error", lambda e: ("resolve", {"kind": "retry"}), times=1)
    s.followup("second")
    s.run()
    s.expect_log("TS(1,msg:user) UM('first') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "TE(1,completed) TS(2,msg:user) UM('second') SS(2.1) RH(resume) CH… "
                 "AM(2.1;call c1+call c2) TC(2.1;c1) TC(2.1;c2) TR(2.1;c1;ok) TR(2.1;c2;ok) "
                 "SE(2.1) SS(2.2) SE(2.2) TE(2,error) TS(3,retry) SS(3.1) CH… AM(3.1;'back') "
                 "SE(3.1) TE(3,completed)")
    assert [e.payload["callId"] for e in s.effects("tool-execute")] == ["c1", "c2"]
    assert s.live(publication=True)[:3] == ["session/created", "agent/created",
                                            "session-start(resume)"]
    return s


@scenario("BS-resumed-session-cancel-reports-and-rejected-admission",
          "R7.10, R16.2, D6 on a resumed session: context staged at a blocked admission is "
          "appended between turns after the seeded turn; a later cancel during a turn reports "
          "its pending steering and context",
          ["R7.10", "R16.2", "D6", "R4.7", "P11"], ["rule", "cancel", "differs-from-original", "D6"])
def resumed_rejected_and_cancel() -> Session:
    s = admission_pending(Session("ok", seed=lifecycle_one(), session_start="resume"),
                          "blocked", "c1", "c2")
    block(s)
    s.hold("step")
    s.followup("go")
    s.run()
    s.steer("s1")
    s.inject("c3", "plugin:test")
    s.cancel()
    s.resolve("step")
    s.run()
    s.expect_log("TS(1,msg:user) UM('first') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "TE(1,completed) UM('c1';plugin:test) UM('c2';plugin:test) TS(2,msg:user) "
                 "UM('go') TE(2,aborted)")
    reports = live_of(s, "disc", "ctxdisc")
    assert reports == ["disc[s1]", "ctxdisc[c3]"], reports
    return s
