"""R11, drains (specs/core.md §11): R11.1 the procedure, R11.2 the drain points, R11.3 retained
input.

Each test drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the
same inputs through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from scenario_helpers import L, Scenario, at_running, both, scenario, tokens

from machine.checking.scripted import calls_reply, ok_result
from machine.jsonvalue import FrozenDict


def held_step(impl: str) -> Scenario:
    """Turn 1 waits on its held `{step}` hook: the window is open, nothing drained yet."""
    s = scenario(impl)
    s.hold("step")
    s.followup("go")
    s.run()
    return s


# --------------------------------------------------------------------------
# R11.1 procedure
# --------------------------------------------------------------------------


@both
def test_R11_1_a_drain_takes_the_outbox_in_order_dequeuing_steering_just_before_its_record(
        impl: str) -> None:
    s = held_step(impl)
    s.steer("a")
    s.inject("b")
    s.steer("c")
    s.pump()                                           # their enqueue notices
    before = len(s.outputs)
    s.resolve("step")
    assert tokens(s, before)[:7] == [
        "deq(a,s)", "[STM(1;'a';user)]",
        "[UM('b';plugin:test)]", "deq(c,s)", "[STM(1;'c';user)]", "⟨system-prompt 1.1⟩",
        "[SS(1.1)]"]
    assert (s.core.pending_steering, s.core.pending_context) == (0, 0)


@both
def test_R11_1_input_staged_at_a_drains_own_outputs_is_taken_by_the_same_drain(impl: str) -> None:
    s = held_step(impl)
    s.steer("a")

    def at_steering(_d: FrozenDict) -> None:
        s.inject("staged there")
        s.steer("steered there")
    s.observe("steering/message", at_steering, once=True)
    s.resolve("step")
    assert s.log()[2:6] == L("STM(1;'a';user) UM('staged there';plugin:test) "
                             "STM(1;'steered there';user) SS(1.1)")


@both
def test_R11_1_a_cancel_mid_drain_reports_what_is_still_staged_and_the_taken_item_is_appended(
        impl: str) -> None:
    s = held_step(impl)
    s.steer("taken")
    s.inject("cleared")

    def at_dequeue(data: FrozenDict) -> None:
        if data["placement"] == "steering":
            s.cancel()
    s.observe("agent/inbox/dequeue", at_dequeue)
    s.observe("agent/context/discard", lambda _d: s.inject("staged after the clear"), once=True)
    s.resolve("step")
    assert s.live_tokens("agent/context/discard") == ["ctxdisc[cleared]"]
    assert s.log() == L("TS(1,msg:user) UM('go') STM(1;'taken';user) "
                        "UM('staged after the clear';plugin:test) TE(1,aborted)")


# --------------------------------------------------------------------------
# R11.2 drain points
# --------------------------------------------------------------------------


@both
def test_R11_2_each_drain_writes_its_input_at_its_place_in_the_turn(impl: str) -> None:
    s = held_step(impl)
    s.inject("retained")
    s.cancel(keep_inbox=True)                          # spares it: the next turn inherits it
    s.resolve("step")
    s.unhandle("step")

    def inject_at(text: str) -> Callable[[object], None]:
        def handler(_e: object) -> None:
            s.inject(text)
        return handler
    at_running(s, lambda: s.inject("rest"))
    s.handle("step", inject_at("top of step"), times=1)
    s.observe("assistant/message", lambda _d: s.inject("end of step"), once=True)
    s.handle("turn-stopping", inject_at("after turn-stopping"), times=1)
    s.followup("prompt")
    s.run()
    second = s.log()[s.log().index("TE(1,aborted)") + 1:]
    assert second == L(
        "TS(2,msg:user) UM('retained';plugin:test) UM('prompt') UM('rest';plugin:test) "
        "UM('top of step';plugin:test) SS(2.1) RH(initial) CH… AM(2.1;'ok') "
        "UM('end of step';plugin:test) SE(2.1) UM('after turn-stopping';plugin:test) "
        "TE(2,completed)")


@both
@pytest.mark.parametrize(("where", "steps"), [
    ("top of step", 1),             # steering there is not used
    ("end of step", 2),             # causes another step
    ("after turn-stopping", 2),     # causes another step
])
def test_R11_2_steering_taken_at_the_end_of_a_step_or_after_turn_stopping_causes_another_step(
        impl: str, where: str, steps: int) -> None:
    s = scenario(impl)

    def steer(_e: object) -> None:
        s.steer("steer")
    if where == "top of step":
        s.handle("step", steer, times=1)
    elif where == "end of step":
        s.observe("assistant/message", steer, once=True)
    else:
        s.handle("turn-stopping", steer, times=1)
    s.followup("go")
    s.run()
    assert len(s.of("step/start")) == steps and len(s.of("steering/message")) == 1


# --------------------------------------------------------------------------
# R11.3 retained input
# --------------------------------------------------------------------------


def concluded_with_retained_input(impl: str) -> Scenario:
    """Turn 1 concludes; context and steering staged at its step/end are retained."""
    s = scenario(impl, calls_reply(("c1", "t")))
    s.env.tool_results["c1"] = ok_result("final", concludesTurn=True)

    def at_step_end(_d: FrozenDict) -> None:
        s.inject("late context")
        s.steer("late steer")
    s.observe("step/end", at_step_end, once=True)
    s.followup("go")
    s.run()
    return s


@both
def test_R11_3_input_staged_after_a_concluding_steps_last_drain_is_retained_and_wakes_nothing(
        impl: str) -> None:
    s = concluded_with_retained_input(impl)
    assert s.log()[-2:] == L("SE(1.1) TE(1,completed)")
    assert (s.core.pending_context, s.core.pending_steering) == (1, 1)
    assert s.statuses() == ["running", "idle"] and s.core.is_quiescent
    assert [e.payload["purpose"] for e in s.effects("tick")] == ["wake"]
    s.followup("next")                                 # the next admitted turn takes it first
    s.run()
    assert s.log()[s.log().index("TE(1,completed)") + 1:][:4] == L(
        "TS(2,msg:user) UM('late context';plugin:test) STM(2;'late steer';user) UM('next')")


@both
def test_R11_3_a_cancel_without_keepInbox_removes_and_reports_retained_input(impl: str) -> None:
    s = concluded_with_retained_input(impl)
    s.cancel()
    s.run()
    assert s.live_tokens("agent/inbox/discard", "agent/context/discard") == [
        "disc[late steer]", "ctxdisc[late context]"]
    assert (s.core.pending_context, s.core.pending_steering) == (0, 0)
