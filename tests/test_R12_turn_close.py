"""R12, turn close, flush, settlement, continue-or-idle (specs/core.md §12): R12.1 the window
closed at turn/end, R12.2 the owner at turn/end, R12.3 inject at turn/end, R12.4 the flush
barrier, R12.5 after the flush, R12.6 settled once per chain, R12.7 continue-or-idle, R12.8 the
consequences.

Each test drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the
same inputs through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

import pytest
from scenario_helpers import RETRY, Scenario, aborts, both, reason_kinds, scenario, tokens

from machine.checking.scripted import calls_reply, model_failure
from machine.jsonvalue import FrozenDict, thaw
from machine.vocabulary import ErrorInfo


def failed_with_retry(impl: str, *, hold_flush: bool = False) -> Scenario:
    """Turn 1 fails with a request failure and recovery authorizes a retry (turn 2 replies)."""
    s = scenario(impl, model_failure("overloaded", "E_BUSY"), "recovered")
    s.handle("request-error", lambda _e: RETRY, times=1)
    if hold_flush:
        s.hold("flush")
    return s


# --------------------------------------------------------------------------
# R12.1 closed at turn/end
# --------------------------------------------------------------------------


@both
def test_R12_1_steer_and_followup_at_turn_end_are_queued_without_a_wake_and_claimed_after_the_flush(
        impl: str) -> None:
    s = scenario(impl)

    def at_end(_d: FrozenDict) -> None:
        s.steer("steer")
        s.followup("followup")
    s.observe("turn/end", at_end, once=True)
    s.followup("go")
    s.run()
    assert [p["placement"] for p in s.live("agent/inbox/enqueue")][1:] == ["queued", "queued"]
    assert [e.payload["purpose"] for e in s.effects("tick")] == ["wake"]
    trace = [t for t in tokens(s) if t in ("flush(1)", "idle", "running") or t.startswith("[TS")]
    assert trace == ["running", "[TS(1,msg:user)]", "flush(1)", "[TS(2,msg:user)]",
                     "[TS(3,msg:user)]", "idle"]


# --------------------------------------------------------------------------
# R12.2 owner at turn/end
# --------------------------------------------------------------------------


@both
def test_R12_2_a_cancel_at_turn_end_is_effective_but_the_recorded_reason_and_settlement_stay(
        impl: str) -> None:
    s = failed_with_retry(impl)
    s.observe("turn/end", lambda _d: s.cancel(), once=True)
    s.followup("go")
    s.run()
    assert s.live_tokens("agent/cancel-requested") == ["cancel-req(user)"]
    assert aborts(s) == [{"signal": 2, "reason": {"kind": "user"}}]
    assert s.turn_numbers() == [1]                       # the pending retry was dropped
    assert reason_kinds(s) == ["error"]
    (settled,) = s.live("agent/settled")
    reason = thaw(settled["reason"])
    assert reason["kind"] == "error" and reason["failure"]["code"] == "E_BUSY"


# --------------------------------------------------------------------------
# R12.3 inject at turn/end
# --------------------------------------------------------------------------


@both
def test_R12_3_an_inject_at_turn_end_is_appended_right_after_it(impl: str) -> None:
    s = scenario(impl)
    s.observe("turn/end", lambda _d: s.inject("after the turn"), once=True)
    s.followup("go")
    s.run()
    assert s.log()[-2:] == ["TE(1,completed)", "UM('after the turn';plugin:test)"]
    assert s.events[-1].seq == s.of("turn/end")[0].seq + 1
    assert len(s.of("turn/start")) == 1


# --------------------------------------------------------------------------
# R12.4 flush barrier
# --------------------------------------------------------------------------


@both
def test_R12_4_a_failed_flush_warns_then_reports_an_error_with_the_last_step_and_carries_on(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), "done")
    s.handle("flush", lambda _e: ("raise", ErrorInfo("disk full", "IOError", causes=("EIO",))))
    s.followup("go")
    s.run()
    assert tokens(s)[-5:] == ["flush(1)", "warn('session flush failed at turn 1: disk full: EIO')",
                              "error(1,2,'disk full')", "settled(1,completed)", "idle"]
    (error,) = s.live("agent/error")
    assert thaw(error) == {"turn": 1, "step": 2, "error": {
        "name": "IOError", "message": "disk full", "causes": ["EIO"]}}


@both
def test_R12_4_while_the_flush_is_outstanding_sends_queue_without_a_wake_and_inject_appends(
        impl: str) -> None:
    s = scenario(impl)
    s.hold("flush")
    s.followup("go")
    s.run()
    assert s.core.status == "running" and not s.core.accepts_next_step
    s.followup("waiting")
    s.inject("now")
    s.run()
    assert not s.core.wake_pending and s.log()[-1] == "UM('now';plugin:test)"
    s.resolve("flush")
    assert s.turn_numbers() == [1, 2] and s.statuses() == ["running", "idle"]


@both
def test_R12_4_a_cancel_while_the_flush_is_outstanding_empties_the_queues_and_drops_the_retry(
        impl: str) -> None:
    s = failed_with_retry(impl, hold_flush=True)
    s.followup("go")
    s.run()
    s.followup("queued")
    s.cancel()
    s.resolve("flush")
    assert s.live_tokens("agent/inbox/discard") == ["disc[queued]"]
    assert s.turn_numbers() == [1] and aborts(s) == []       # no owner during the flush


# --------------------------------------------------------------------------
# R12.5 after the flush
# --------------------------------------------------------------------------


@both
def test_R12_5_a_pending_retry_starts_after_the_flush_with_no_settled_or_status_output(
        impl: str) -> None:
    s = failed_with_retry(impl)
    s.followup("go")
    s.run()
    trace = tokens(s)
    between = trace[trace.index("[TE(1,error)]") + 1:trace.index("[TS(2,retry)]")]
    assert between == ["flush(1)"]
    assert [(p["turn"], thaw(p["reason"])["kind"]) for p in s.live("agent/settled")] == [
        (2, "completed")]


# --------------------------------------------------------------------------
# R12.6 settled once per chain
# --------------------------------------------------------------------------


@both
def test_R12_6_only_the_chains_last_turn_settles_and_a_rejected_admission_never(impl: str) -> None:
    s = failed_with_retry(impl)
    s.handle("prompt-submit", lambda e: ("resolve", {"kind": "block", "reason": "no"})
             if thaw(e.payload["message"])["content"][0]["text"] == "blocked" else None)
    s.followup("go")
    s.followup("blocked")
    s.run()
    assert s.turn_numbers() == [1, 2]
    assert s.live_tokens("agent/settled") == ["settled(2,completed)"]


# --------------------------------------------------------------------------
# R12.7 continue-or-idle
# --------------------------------------------------------------------------


@both
@pytest.mark.parametrize(("wakeup", "turns"), [(True, [1, 2]), (False, [1])])
def test_R12_7_a_queued_waking_head_is_claimed_in_the_interval_otherwise_the_agent_goes_idle(
        impl: str, wakeup: bool, turns: list[int]) -> None:
    s = scenario(impl)
    s.observe("turn/start", lambda _d: s.send("next", "next-turn", wakeup), once=True)
    s.followup("go")
    s.run()
    assert s.turn_numbers() == turns
    assert s.statuses() == ["running", "idle"]
    trace = tokens(s)
    assert trace[trace.index("settled(1,completed)") + 1] == (
        "⟨prompt-submit⟩" if wakeup else "idle")


# --------------------------------------------------------------------------
# R12.8 consequences
# --------------------------------------------------------------------------


@both
def test_R12_8_no_admission_during_the_flush_and_queued_work_never_runs_ahead_of_a_retry(
        impl: str) -> None:
    s = failed_with_retry(impl, hold_flush=True)
    s.followup("go")
    s.run()
    s.followup("later")
    s.run()
    assert len(s.effects("prompt-submit")) == 1          # nothing admitted during the flush
    s.resolve("flush")
    assert [thaw(e.data["trigger"])["kind"] for e in s.of("turn/start")] == [
        "message", "retry", "message"]
    assert s.user_texts() == ["go", "later"]
    assert s.statuses() == ["running", "idle"]
