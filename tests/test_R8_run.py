"""R8, the run: one turn and its retry chain (specs/core.md §8): R8.1 the start, R8.2 the turn
start, R8.3 the run-start sequence, R8.4 the step loop, R8.5 turn stopping, R8.6 a failure,
R8.7 the close, R8.8 what follows it.

Each test drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the
same inputs through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

import pytest
from scenario_helpers import L, aborts, at_running, both, msg, reason_kinds, scenario, tokens

from machine.checking.scripted import calls_reply, model_failure, ok_result
from machine.jsonvalue import FrozenDict, thaw
from machine.vocabulary import ErrorInfo

# --------------------------------------------------------------------------
# R8.1 start
# --------------------------------------------------------------------------


@both
def test_R8_1_each_run_gets_a_fresh_controller_the_next_turn_number_and_completed_reasons(
        impl: str) -> None:
    s = scenario(impl, "one", model_failure("overloaded", "E_BUSY"), "three")
    s.handle("request-error", lambda _e: ("resolve", {"kind": "retry"}))
    s.followup("one")
    s.followup("two")
    s.run()
    # turn 1 admitted (signals 1, 2); turn 2 admitted (3, 4), failed; its retry turn 3 (5)
    runs = [(e.payload["turn"], e.payload["signal"]) for e in s.effects("step")]
    assert runs == [(1, 2), (2, 4), (3, 5)]
    assert s.turn_numbers() == [1, 2, 3]
    assert reason_kinds(s) == ["completed", "error", "completed"]   # each run starts completed
    settled = [(p["turn"], thaw(p["reason"])["kind"]) for p in s.live("agent/settled")]
    assert settled == [(1, "completed"), (3, "completed")]


# --------------------------------------------------------------------------
# R8.2 turn start
# --------------------------------------------------------------------------


@both
def test_R8_2_turn_start_is_appended_first_with_the_turn_and_its_trigger(impl: str) -> None:
    s = scenario(impl)
    s.followup("go")
    s.run()
    first = s.events[0]
    assert first.type == "turn/start"
    assert thaw(first.data) == {"turn": 1, "trigger": {"kind": "message", "source": {"kind": "user"}}}


# --------------------------------------------------------------------------
# R8.3 run-start sequence
# --------------------------------------------------------------------------


@both
def test_R8_3_inherited_items_then_the_admitted_list_then_the_rest_drain(impl: str) -> None:
    s = scenario(impl)
    s.hold("step")
    s.followup("first")
    s.run()
    s.inject("retained")                          # staged, then spared by a keepInbox cancel
    s.cancel(keep_inbox=True)
    s.resolve("step")
    s.handle("prompt-submit", lambda _e: ("resolve", {
        "kind": "allow", "additionalContexts": [msg("decided", "plugin:d")]}))
    at_running(s, lambda: s.inject("at running"))
    s.observe("turn/start", lambda _d: s.inject("at turn start"))
    s.followup("go")
    s.run()
    turn = s.log()[s.log().index("TE(1,aborted)") + 1:]
    assert turn[:6] == L("TS(2,msg:user) UM('retained';plugin:test) UM('go') "
                         "UM('decided';plugin:d) UM('at running';plugin:test) "
                         "UM('at turn start';plugin:test)")


@both
@pytest.mark.parametrize("moment", ["turn/start", "user/message"])
def test_R8_3_a_cancel_at_turn_start_or_a_prompt_append_takes_effect_after_the_prompt(
        impl: str, moment: str) -> None:
    s = scenario(impl)
    s.handle("prompt-submit", lambda _e: ("resolve", {
        "kind": "allow", "additionalContexts": [msg("decided", "plugin:d")]}))
    s.observe(moment, lambda _d: s.cancel(), once=True)
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1,msg:user) UM('go') UM('decided';plugin:d) TE(1,aborted)")
    assert s.effects("step") == []


@both
def test_R8_3_a_retry_run_writes_turn_start_the_check_and_the_rest_drain_only(impl: str) -> None:
    s = scenario(impl, model_failure("overloaded", "E_BUSY"), "recovered")
    s.handle("request-error", lambda _e: ("resolve", {"kind": "retry"}))
    s.observe("agent/error", lambda _d: s.inject("retained"), once=True)
    s.followup("go")
    s.run()
    assert s.log()[s.log().index("TE(1,error)") + 1:][:3] == L(
        "TS(2,retry) UM('retained';plugin:test) SS(2.1)")
    assert s.user_texts() == ["go", "retained"]


# --------------------------------------------------------------------------
# R8.4 step loop
# --------------------------------------------------------------------------


@both
def test_R8_4_a_step_owing_a_continuation_leads_straight_to_the_next_step(impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), "done")
    s.followup("go")
    s.run()
    trace = [t for t in tokens(s) if t.startswith(("⟨step", "⟨turn-stopping", "[SE"))]
    assert trace == ["⟨step 1.1⟩", "[SE(1.1)]", "⟨step 1.2⟩", "[SE(1.2)]", "⟨turn-stopping 1⟩"]


@both
def test_R8_4_steering_staged_at_step_end_leads_to_the_next_step_skipping_turn_stopping(
        impl: str) -> None:
    s = scenario(impl, "one", "two")
    s.observe("step/end", lambda _d: s.steer("more"), once=True)
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                        "STM(1;'more';user) SS(1.2) CH… AM(1.2;'two') SE(1.2) TE(1,completed)")
    assert len(s.effects("turn-stopping")) == 1


@both
def test_R8_4_a_concluding_step_ends_the_loop_at_once_and_a_cancel_there_keeps_the_reason(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")))
    s.env.tool_results["c1"] = ok_result("final", concludesTurn=True)
    s.observe("step/end", lambda _d: s.cancel(), once=True)
    s.followup("go")
    s.run()
    assert s.log()[-3:] == L("TR(1.1;c1;ok) SE(1.1) TE(1,completed)")
    assert s.effects("turn-stopping") == [] and len(s.effects("step")) == 1
    assert aborts(s) == [{"signal": 2, "reason": {"kind": "user"}}]     # still effective


@both
def test_R8_4_a_completed_step_empties_the_failure_history(impl: str) -> None:
    s = scenario(impl, model_failure("first", "E1"), calls_reply(("c1", "t")),
                 model_failure("second", "E2"))
    s.handle("request-error", lambda _e: ("resolve", {"kind": "retry"}), times=1)
    s.followup("go")
    s.run()
    prior = [len(thaw(e.payload["priorFailures"])) for e in s.effects("request-error")]
    assert prior == [0, 0]          # the retry's completed step 1 emptied it before step 2 failed


# --------------------------------------------------------------------------
# R8.5 turn stopping
# --------------------------------------------------------------------------


@both
def test_R8_5_steering_staged_at_turn_stopping_makes_another_step(impl: str) -> None:
    s = scenario(impl, "one", "two")

    def steer(_e: object) -> None:
        s.steer("go on")
    s.handle("turn-stopping", steer, times=1)
    s.followup("go")
    s.run()
    assert s.log()[-7:] == L("SE(1.1) STM(1;'go on';user) SS(1.2) CH… AM(1.2;'two') SE(1.2) "
                             "TE(1,completed)")
    assert [e.payload["turn"] for e in s.effects("turn-stopping")] == [1, 1]


@both
def test_R8_5_context_staged_at_turn_stopping_is_written_after_the_final_step_end_without_a_step(
        impl: str) -> None:
    s = scenario(impl)

    def inject(_e: object) -> None:
        s.inject("late")
    s.handle("turn-stopping", inject)
    s.followup("go")
    s.run()
    assert s.log()[-3:] == L("SE(1.1) UM('late';plugin:test) TE(1,completed)")
    assert len(s.effects("step")) == 1


@both
def test_R8_5_a_raising_turn_stopping_is_a_generic_failure(impl: str) -> None:
    s = scenario(impl)
    s.handle("turn-stopping", lambda _e: ("raise", ErrorInfo("stop hook", "HookError", "E_HOOK")))
    s.followup("go")
    s.run()
    (end,) = s.of("turn/end")
    assert thaw(end.data["reason"]) == {"kind": "error", "step": 1, "message": "stop hook",
                                        "code": "E_HOOK"}
    assert s.effects("request-error") == []


@both
def test_R8_5_a_cancel_while_turn_stopping_is_outstanding_ends_the_turn_aborted(impl: str) -> None:
    s = scenario(impl)
    s.hold("turn-stopping")
    s.followup("go")
    s.run()
    s.cancel()
    s.resolve("turn-stopping")
    assert reason_kinds(s) == ["aborted"] and len(s.effects("step")) == 1


@both
def test_R8_5_a_cancel_at_an_output_of_the_final_drain_leaves_the_turns_reason(impl: str) -> None:
    s = scenario(impl)

    def inject(_e: object) -> None:
        s.inject("late")
    s.handle("turn-stopping", inject)
    s.observe("user/message", lambda d: s.cancel() if thaw(d)["content"][0]["text"] == "late"
              else None)
    s.followup("go")
    s.run()
    assert reason_kinds(s) == ["completed"]
    assert aborts(s) == [{"signal": 2, "reason": {"kind": "user"}}]


# --------------------------------------------------------------------------
# R8.6 failure
# --------------------------------------------------------------------------


@both
def test_R8_6_a_failure_in_an_open_step_closes_it_before_classification(impl: str) -> None:
    s = scenario(impl)
    s.handle("request", lambda _e: ("raise", ErrorInfo("no header")))
    s.followup("go")
    s.run()
    trace = [t for t in tokens(s) if t.startswith(("[SE", "error(", "[TE"))]
    assert trace == ["[SE(1.1)]", "error(1,1,'no header')", "[TE(1,error)]"]


# --------------------------------------------------------------------------
# R8.7 close
# --------------------------------------------------------------------------


@both
def test_R8_7_turn_end_is_observed_with_the_window_closed_and_the_run_owner_installed(
        impl: str) -> None:
    s = scenario(impl)
    seen: list[bool] = []

    def at_end(_d: FrozenDict) -> None:
        seen.append(s.core.accepts_next_step)
        s.cancel()
    s.observe("turn/end", at_end)
    s.followup("go")
    s.run()
    assert seen == [False]
    assert aborts(s) == [{"signal": 2, "reason": {"kind": "user"}}]
    assert reason_kinds(s) == ["completed"]


# --------------------------------------------------------------------------
# R8.8 after close
# --------------------------------------------------------------------------


@both
def test_R8_8_the_flush_settlement_and_continue_or_idle_follow_the_close(impl: str) -> None:
    s = scenario(impl)
    s.followup("go")
    s.run()
    assert tokens(s)[-4:] == ["[TE(1,completed)]", "flush(1)", "settled(1,completed)", "idle"]
