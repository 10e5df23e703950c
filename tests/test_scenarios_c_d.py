"""Reference scenarios C (steps, steering, tool batches) and D (cancellation inside tool batches).

A tool body that calls steer/inject is an environment handler for ``tool-execute`` that
issues the command on the core and then returns (or holds) its answer; "request N contains
X" reads the model effect's message list.
"""

from __future__ import annotations

from scenario_helpers import L, Scenario, msg, result_with_contexts

from machine.jsonvalue import FrozenDict
from machine.scripted import HOLD, calls_reply, ok_result
from machine.vocabulary import ErrorInfo


def test_C1_steering_during_a_tool_call_continues_the_turn__R10_5_R9_10_P9() -> None:
    s = Scenario(calls_reply(("c1", "slow")), "addressed the steering")

    def body(_e: object) -> object:
        s.steer("change of plans")
        return ("resolve", ok_result("tool done"))
    s.handle("tool-execute", body)
    s.followup("start")
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('start') SS(1.1) RH(initial) CH… AM(1.1; call c1) TC(1.1; c1) "
        "TR(1.1; c1; ok) STM(1; 'change of plans'; user) SE(1.1) SS(1.2) CH… "
        "AM(1.2; 'addressed the steering') SE(1.2) TE(1, completed)")
    trace = s.trace(durable=("TR", "STM", "SS", "SE"), effects=("tool-execute", "turn-stopping"))
    assert trace[trace.index("⟨execute c1⟩"):] == L(
        "⟨execute c1⟩ enq(change of plans,s) [TR(1.1;c1;ok)] deq(change of plans,s) "
        "[STM(1;'change of plans';user)] [SE(1.1)] [SS(1.2)] [SE(1.2)] ⟨turn-stopping 1⟩ "
        "settled(1,completed) idle")
    types = s.types()
    assert types.index("steering/message") < [i for i, t in enumerate(types) if t == "step/start"][1]
    assert s.request(2)[-2:] == ["TR:c1", "'change of plans'"]
    assert len(s.effects("turn-stopping")) == 1
    s.check()


def test_C2_inject_during_a_tool_call_lands_after_the_result__R10_5_R5_2_R1_7() -> None:
    s = Scenario(calls_reply(("c1", "noticer"), text="calling"), "done")
    s.hold("tool-execute")
    s.followup("go")
    s.run()
    execute = s.take("tool-execute")
    notice = msg("mid-turn notice", "plugin:x")
    s.core.inject(notice)
    notice["content"][0]["text"] = "MUTATED"   # type: ignore[index]
    s.inject("second notice", "plugin:x")
    s.run()
    assert [e for e in s.of("user/message") if e.data["source"]["kind"] == "plugin"] == []
    s.core.resolve(execute.id, ok_result())
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; 'calling'+call c1) TC(1.1; c1) "
        "TR(1.1; c1; ok) UM('mid-turn notice'; plugin:x) UM('second notice'; plugin:x) SE(1.1) "
        "SS(1.2) CH… AM(1.2; 'done') SE(1.2) TE(1, completed)")
    assert [e.data["trigger"]["kind"] for e in s.of("turn/start")] == ["message"]
    assert s.request(2)[-3:] == ["TR:c1", "'mid-turn notice';plugin:x", "'second notice';plugin:x"]
    s.check()


def _ctx_finalize(*extra: str) -> object:
    def finalize(effect: object) -> object:
        call_id = effect.payload["callId"]  # type: ignore[attr-defined]
        contexts = [msg(f"ctx-{call_id}", "plugin:p")]
        if call_id == "c1":
            contexts += [msg(f"ctx-c1-{x}", "plugin:p") for x in extra]
        return ("resolve", result_with_contexts("ok", *contexts))
    return finalize


def test_C3_tool_contexts_come_after_all_results__R10_4_R10_5() -> None:
    s = Scenario(calls_reply(("c1", "echo"), ("c2", "echo")), "done")
    s.handle("tool-finalize", _ctx_finalize())
    s.followup("go")
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; call c1+call c2) TC(1.1; c1) "
        "TR(1.1; c1; ok) TC(1.1; c2) TR(1.1; c2; ok) UM('ctx-c1'; plugin:p) UM('ctx-c2'; plugin:p) "
        "SE(1.1) SS(1.2) CH… AM(1.2; 'done') SE(1.2) TE(1, completed)")
    s.check()


def test_C3_several_contexts_of_one_result_keep_list_order__R10_4_4() -> None:
    s = Scenario(calls_reply(("c1", "echo"), ("c2", "echo")), "done")
    s.handle("tool-finalize", _ctx_finalize("a", "b"))
    s.followup("go")
    s.run()
    log = s.log()
    start = log.index("TR(1.1;c2;ok)") + 1
    assert log[start:start + 5] == L("UM('ctx-c1';plugin:p) UM('ctx-c1-a';plugin:p) "
                                     "UM('ctx-c1-b';plugin:p) UM('ctx-c2';plugin:p) SE(1.1)")
    s.check()


def test_C5_direct_append_from_step_hook_lands_before_step_start__R9_1_R19_step_hook() -> None:
    s = Scenario("ok")
    s.handle("step", lambda _e: s.core.append(
        "user/message", msg("INJECTED-IN-PRE-STEP", "plugin:test"), surface_op="append") and None,
        times=1)
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('go') UM('INJECTED-IN-PRE-STEP'; plugin:test) SS(1.1) "
                        "RH(initial) CH… AM(1.1; 'ok') SE(1.1) TE(1, completed)")
    assert s.request(1) == ["'go'", "'INJECTED-IN-PRE-STEP';plugin:test"]
    assert s.of("user/message")[1].seq < s.of("step/start")[0].seq
    s.check()


def test_C7_inject_during_request_hook_misses_the_current_request__R9_6_R11_2_P8() -> None:
    s = Scenario("one", "two")
    s.handle("request", lambda _e: s.inject("[late context]", "plugin:test"), times=1)
    s.followup("first")
    s.run()
    s.followup("second")
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('first') SS(1.1) RH(initial) CH… AM(1.1; 'one') "
        "UM('[late context]'; plugin:test) SE(1.1) TE(1, completed) TS(2, msg:user) UM('second') "
        "SS(2.1) CH… AM(2.1; 'two') SE(2.1) TE(2, completed)")
    assert "'[late context]';plugin:test" not in s.request(1)
    assert "'[late context]';plugin:test" in s.request(2)
    assert [e.data["turn"] for e in s.of("step/start")] == [1, 2]
    assert len(s.of("request/header")) == 1
    s.check()


def test_C8_steering_from_turn_stopping_extends_the_turn__R8_5_P10() -> None:
    s = Scenario("step 1", "step 2", "step 3")

    def stopping(_e: object) -> None:
        if len(s.of("step/end")) < 3:
            s.steer("continue", "plugin:loop-test")
    s.handle("turn-stopping", stopping)
    s.followup("go")
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; 'step 1') SE(1.1) "
        "STM(1; 'continue'; plugin:loop-test) SS(1.2) CH… AM(1.2; 'step 2') SE(1.2) "
        "STM(1; 'continue'; plugin:loop-test) SS(1.3) CH… AM(1.3; 'step 3') SE(1.3) TE(1, completed)")
    trace = s.trace(durable=("STM",), effects=("turn-stopping", "step"))
    for k in (2, 3):
        i = trace.index(f"⟨step 1.{k}⟩")
        assert trace[i - 4:i] == L("⟨turn-stopping 1⟩ enq(continue,s) deq(continue,s) "
                                   "[STM(1;'continue';plugin:loop-test)]")
    assert len(s.of("step/end")) == 3 and len(s.requests) == 3
    s.check()


def test_C10_steering_from_turn_end_observer_becomes_next_turn__R12_1_R19_turn_end() -> None:
    s = Scenario("turn 1", "turn 2")
    window: list[bool] = []

    def at_turn_end(_d: FrozenDict) -> None:
        window.append(s.core.accepts_next_step)
        s.steer("too late for this turn")
    s.observe("turn/end", at_turn_end, once=True)
    s.followup("go")
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; 'turn 1') SE(1.1) TE(1, completed) "
        "TS(2, msg:user) UM('too late for this turn') SS(2.1) CH… AM(2.1; 'turn 2') SE(2.1) "
        "TE(2, completed)")
    trace = s.trace(durable=("TE",), effects=("flush",))
    assert trace[trace.index("[TE(1,completed)]"):] == L(
        "[TE(1,completed)] enq(too late for this turn,q) flush(1) settled(1,completed) "
        "deq(too late for this turn,q) [TE(2,completed)] flush(2) settled(2,completed) idle")
    assert window == [False]
    assert s.turn_numbers() == [1, 2]
    assert s.request(2)[-1] == "'too late for this turn'"
    assert s.statuses() == ["running", "idle"]
    s.check()


def test_C13_raising_step_handler_fails_only_that_turn__R9_1_R15_3() -> None:
    s = Scenario("ok")
    s.handle("step", lambda _e: ("raise", ErrorInfo("boom in pre-step")), times=1)
    s.followup("first")
    s.followup("second")
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('first') TE(1, error{step:1, message:'boom in pre-step'}) "
        "TS(2, msg:user) UM('second') SS(2.1) RH(initial) CH… AM(2.1; 'ok') SE(2.1) TE(2, completed)")
    assert s.trace(durable=("TE",), effects=("step", "flush")) == L(
        "enq(first,q) enq(second,q) running deq(first,q) ⟨step 1.1⟩ error(1,1,'boom in pre-step') "
        "[TE(1,error{step:1,message:'boom in pre-step'})] flush(1) settled(1,error) deq(second,q) "
        "⟨step 2.1⟩ [TE(2,completed)] flush(2) settled(2,completed) idle")
    assert s.errors() == [(1, 1, "boom in pre-step")]
    assert [r.payload["turn"] for r in s.requests] == [2]
    assert len(s.of("step/start")) == len(s.of("step/end"))
    s.check()


# ---------------------------------------------------------------------------
# D. Cancellation inside tool batches
# ---------------------------------------------------------------------------


def test_D1_cancel_from_assistant_message_observer_synthetic_pair__R10_7_R10_10_path15() -> None:
    s = Scenario(calls_reply(("c1", "danger")), "recovered after cancellation")
    s.observe("assistant/message", lambda _d: s.cancel("user"), once=True)
    s.followup("go")
    s.run()
    s.followup("continue safely")
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; call c1) TC(1.1; c1) "
        "TR(1.1; c1; ERR ABD) SE(1.1) TE(1, aborted) TS(2, msg:user) UM('continue safely') SS(2.1) "
        "CH… AM(2.1; 'recovered after cancellation') SE(2.1) TE(2, completed)")
    trace = s.trace(durable=("AM", "TE"), effects=("step", "flush"))
    assert trace[trace.index("[AM(1.1;call c1)]"):trace.index("idle") + 1] == L(
        "[AM(1.1;call c1)] cancel-req(user) ⟨step 1.2⟩ [TE(1,aborted)] flush(1) "
        "settled(1,aborted) idle")
    assert s.effects("tool-execute") == [] and s.live("agent/error") == []
    assert s.reasons() == ["aborted", "completed"]
    assert s.request(2)[:4] == ["'go'", "call c1", "TR:c1", "'continue safely'"]
    s.check()


def test_D2_aborted_before_a_parallel_group_every_call_gets_a_pair__R10_7() -> None:
    s = Scenario(calls_reply(("c1", "p"), ("c2", "p")), tool_modes={"p": "parallel"})
    s.observe("assistant/message", lambda _d: s.cancel("user"), once=True)
    s.followup("go")
    s.run()
    assert s.log()[-7:] == L("AM(1.1; call c1+call c2) TC(1.1; c1) TR(1.1; c1; ERR ABD) "
                             "TC(1.1; c2) TR(1.1; c2; ERR ABD) SE(1.1) TE(1, aborted)")
    for kind in ("tool-prepare", "tool-execute", "tool-finalize"):
        assert s.effects(kind) == []
    assert [e.data["callId"] for e in s.of("tool/call")] == ["c1", "c2"]
    s.check()


def test_D3_abort_during_ordered_prepare_of_first_call__R10_3_R10_7() -> None:
    s = Scenario(calls_reply(("c1", "t"), ("c2", "t")))
    s.handle("tool-prepare", lambda _e: s.cancel("user"), times=1)   # then proceeds normally
    s.followup("go")
    s.run()
    assert s.log()[-6:] == L("TC(1.1; c1) TR(1.1; c1; ERR ABD) TC(1.1; c2) TR(1.1; c2; ERR ABD) "
                             "SE(1.1) TE(1, aborted)")
    assert s.effects("tool-execute") == []
    codes = [e.data["error"]["code"] for e in s.of("tool/result")]
    assert codes == ["ABORTED_BEFORE_DISPATCH"] * 2
    s.check()


def test_D5_aborted_parallel_group_skips_following_exclusive_call__R10_2_R10_7_R10_11() -> None:
    s = Scenario(calls_reply(("c1", "p"), ("c2", "p"), ("c3", "x")), tool_modes={"p": "parallel"})
    s.hold("tool-execute", times=2)
    s.followup("go")
    s.run()
    first, second = s.take("tool-execute"), s.take("tool-execute")
    s.cancel("user")
    s.run()
    s.core.resolve(first.id, ok_result())
    s.core.resolve(second.id, ok_result())
    s.run()
    assert s.log()[-8:] == L(
        "TC(1.1; c1) TC(1.1; c2) TR(1.1; c1; ERR ABORTED) TR(1.1; c2; ERR ABORTED) TC(1.1; c3) "
        "TR(1.1; c3; ERR ABD) SE(1.1) TE(1, aborted)")
    executed = [e.payload["callId"] for e in s.effects("tool-execute")]
    assert executed == ["c1", "c2"]
    assert [e.data["callId"] for e in s.of("tool/call")] == ["c1", "c2", "c3"]
    s.check()


def test_D8_disposal_during_a_tool_result_context_finalized_after_survives__R17_2_R10_11() -> None:
    s = Scenario(calls_reply(("c1", "t")))

    def body(_e: object) -> object:
        s.inject("accepted before disposal", "plugin:test")
        return HOLD
    s.handle("tool-execute", body, times=1)
    s.handle("tool-finalize", lambda _e: ("resolve", result_with_contexts(
        "ok", msg("accepted result context during disposal", "plugin:test"))))
    s.followup("go")
    s.run()
    execute = s.take("tool-execute")
    mark = len(s.outputs)
    s.dispose()
    s.run()
    s.core.resolve(execute.id, ok_result())    # the body sees its signal aborted and returns
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; call c1) TC(1.1; c1) "
        "TR(1.1; c1; ERR ABORTED) UM('accepted result context during disposal'; plugin:test) "
        "SE(1.1) TE(1, disposed)")
    assert s.trace(durable=("TE",), effects=("step", "flush"), controls=True, since=mark) == L(
        "ctxdisc[accepted before disposal] abort(disposed) ⟨step 1.2⟩ [TE(1,disposed)] flush(1) "
        "settled(1,aborted) idle agent/disposed session/disposed")
    assert s.live("agent/cancel-requested") == []
    plugin = [e for e in s.of("user/message") if e.data["source"]["kind"] == "plugin"]
    assert [e.data["content"][0]["text"] for e in plugin] == ["accepted result context during disposal"]
    assert s.reasons() == ["disposed"] and s.live("agent/error") == []
    s.check()
