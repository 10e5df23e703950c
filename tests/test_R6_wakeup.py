"""R6, the deferred wakeup (specs/core.md §6): R6.1 the wake request, R6.2 the wake, R6.3 its
guarantees.

Each test drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the
same inputs through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

import pytest
from scenario_helpers import Scenario, both, idle, scenario, tokens


def wake_ticks(s: Scenario) -> int:
    return sum(1 for e in s.effects("tick") if e.payload["purpose"] == "wake")


# --------------------------------------------------------------------------
# R6.1 request: dropped while busy or while a wake is pending
# --------------------------------------------------------------------------


@both
def test_R6_1_a_second_waking_send_while_a_wake_is_pending_asks_for_none(impl: str) -> None:
    s = idle(impl)
    s.followup("one")
    s.followup("two")
    s.pump()
    assert tokens(s) == ["tick(wake)", "enq(one,q)", "enq(two,q)"]
    s.run()
    assert wake_ticks(s) == 1 and s.turn_numbers() == [1, 2]


@both
def test_R6_1_a_waking_send_while_busy_asks_for_no_wake_and_is_reached_by_the_interval(
        impl: str) -> None:
    s = scenario(impl)
    s.hold("flush")                                  # busy through the flush
    s.followup("one")
    s.run()
    s.followup("two")
    assert not s.core.wake_pending
    s.resolve("flush")
    assert wake_ticks(s) == 1 and s.turn_numbers() == [1, 2]
    assert s.statuses() == ["running", "idle"]


# --------------------------------------------------------------------------
# R6.2 wake: clears wakePending; claims only when not busy and something waking is queued
# --------------------------------------------------------------------------


@both
def test_R6_2_a_wake_that_finds_nothing_waking_queued_produces_nothing(impl: str) -> None:
    s = idle(impl)
    s.hold("tick")
    s.followup("go")
    s.run()
    s.cancel()                                        # discards the queued item
    s.send("quiet", "next-turn", False)              # quiet: the wake does not claim it
    s.run()
    before = len(s.outputs)
    s.resolve("tick")
    assert s.outputs[before:] == [] and not s.core.wake_pending
    assert s.core.pending_queued == 1 and s.statuses() == []


@both
def test_R6_2_the_wake_claims_the_queued_head_once_it_runs(impl: str) -> None:
    s = idle(impl)
    s.hold("tick")
    s.followup("go")
    s.run()
    assert s.statuses() == [] and s.core.wake_pending
    s.resolve("tick")
    assert s.statuses() == ["running", "idle"] and s.user_texts() == ["go"]
    assert not s.core.wake_pending


# --------------------------------------------------------------------------
# R6.3 guarantees
# --------------------------------------------------------------------------


@both
def test_R6_3_a_commands_before_the_wake_are_routed_against_one_pre_admission_state(impl: str) -> None:
    s = idle(impl)
    s.steer("first")
    s.inject("context")
    s.steer("second")
    s.run()
    # two steers from idle: two queued turns; the inject between them is appended at once
    assert s.log()[0] == "UM('context';plugin:test)"
    assert [str(t) for t in s.log() if t.startswith("TS")] == [
        "TS(1,msg:user)", "TS(2,msg:user)"]
    assert s.of("steering/message") == [] and s.user_texts() == ["context", "first", "second"]
    assert [p["placement"] for p in s.live("agent/inbox/enqueue")] == ["queued", "queued"]


@both
@pytest.mark.parametrize("moment", ["agent/inbox/enqueue", "agent/status"])
def test_R6_3_b_at_the_enqueue_or_running_output_a_cancel_takes_the_pending_work_into_account(
        impl: str, moment: str) -> None:
    s = idle(impl)
    seen: list[bool] = []

    def at(_d: object) -> None:
        seen.append(s.core.wake_pending or s.core.status == "running")
        seen.append(s.core.is_quiescent)
        s.cancel()
    s.observe(moment, at, once=True)
    s.followup("go")
    s.run()
    assert seen == [True, False]                     # whenIdle would wait; the cancel acts
    assert s.live_tokens("agent/cancel-requested") == ["cancel-req(user)"]
    assert s.of("turn/start") == []


@both
def test_R6_3_c_no_send_switches_the_status_to_running_by_itself(impl: str) -> None:
    s = idle(impl)
    s.hold("tick")
    s.followup("one")
    s.steer("two")
    s.send("three", "next-turn", True)
    s.run()
    assert s.core.status == "idle" and s.statuses() == []
    s.resolve("tick")
    assert s.statuses() == ["running", "idle"]
