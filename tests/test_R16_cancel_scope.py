"""R16, ``cancel(cause, {keepInbox})`` (specs/core.md §16), what a cancel reaches: R16.2 its
steps and the order of their outputs, R16.3 the first cause wins, R16.4 its effect by moment,
R16.5 keepInbox, R16.6 cooperative cancellation.

When a cancel is effective and the validation of its arguments are in tests/test_R16_cancel.py.
Each test here drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the
same inputs through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

import pytest
from scenario_helpers import Scenario, aborts, both, reason_kinds, scenario, tokens

from machine.checking.scripted import calls_reply, model_failure, ok_result
from machine.jsonvalue import FrozenDict, JsonLike, thaw


def held_step(impl: str) -> Scenario:
    """Turn 1 waits on its held `{step}`, with an item queued, one steering and one context
    staged."""
    s = scenario(impl)
    s.hold("step")
    s.followup("go")
    s.run()
    s.followup("q1")
    s.steer("s1")
    s.inject("c1")
    s.pump()
    return s


# --------------------------------------------------------------------------
# R16.2 steps
# --------------------------------------------------------------------------


@both
def test_R16_2_a_cancel_announces_reports_queued_steering_then_context_and_aborts_in_that_order(
        impl: str) -> None:
    s = held_step(impl)
    before = len(s.outputs)
    cause: dict[str, JsonLike] = {"kind": "user"}
    s.core.cancel(cause)
    cause["kind"] = "changed"                          # the reason is a frozen copy
    s.pump()
    assert tokens(s, before) == ["cancel-req(user)", "disc[q1,s1]", "ctxdisc[c1]", "abort(user)"]
    assert aborts(s) == [{"signal": 2, "reason": {"kind": "user"}}]
    assert (s.core.pending_queued, s.core.pending_steering, s.core.pending_context) == (0, 0, 0)
    s.resolve("step")
    assert reason_kinds(s) == ["aborted"]


@both
def test_R16_2_input_at_the_notice_joins_the_reports_input_at_a_report_is_kept(impl: str) -> None:
    s = held_step(impl)
    before = len(s.outputs)
    s.observe("agent/cancel-requested", lambda _d: s.followup("swept"), once=True)
    s.observe("agent/inbox/discard", lambda _d: s.steer("kept"), once=True)
    s.cancel()
    s.pump()
    assert tokens(s, before) == ["cancel-req(user)", "enq(swept,q)", "disc[q1,swept,s1]",
                                 "ctxdisc[c1]", "abort(user)", "enq(kept,s)"]
    assert s.core.pending_steering == 1


@both
def test_R16_2_a_cancel_drops_a_pending_retry(impl: str) -> None:
    s = scenario(impl, model_failure("overloaded", "E_BUSY"), "never")
    s.handle("request-error", lambda _e: ("resolve", {"kind": "retry"}))
    s.hold("flush")
    s.followup("go")
    s.run()
    s.cancel()
    assert not s.core.retry_pending
    s.resolve("flush")
    assert s.turn_numbers() == [1]


# --------------------------------------------------------------------------
# R16.3 first cause wins
# --------------------------------------------------------------------------


@both
def test_R16_3_a_later_effective_cancel_is_announced_but_keeps_the_reason_and_aborts_nothing(
        impl: str) -> None:
    s = held_step(impl)
    s.cancel("user")
    s.pump()
    s.followup("more")                                 # something to clear again
    s.cancel("parent")
    s.pump()
    assert s.live_tokens("agent/cancel-requested") == ["cancel-req(user)", "cancel-req(parent)"]
    assert aborts(s) == [{"signal": 2, "reason": {"kind": "user"}}]
    reason = s.core.signal_reason(2)
    assert reason is not None and reason.to_json() == {"kind": "user"}


@both
def test_R16_3_a_cancel_joined_at_the_notice_gives_its_cause_to_the_pending_abort(impl: str) -> None:
    s = held_step(impl)

    def join(data: FrozenDict) -> None:
        if thaw(data["cause"])["kind"] == "user":
            s.followup("swept")                       # something new to clear
            s.cancel("parent")
    s.observe("agent/cancel-requested", join)
    s.cancel("user")
    s.pump()
    assert s.live_tokens("agent/cancel-requested") == ["cancel-req(user)", "cancel-req(parent)"]
    assert aborts(s) == [{"signal": 2, "reason": {"kind": "parent"}}]


@both
def test_R16_3_D9_a_cancel_joined_at_a_keepInbox_notice_reports_new_input_after_its_enqueue(
        impl: str) -> None:
    """D9 (P7): at the notice of a keepInbox cancel (which cleared nothing queued), an
    observer queues 'late' and cancels again: the joined cancel clears the queue, and its
    discard report comes after the enqueue notice of the item it lists, and ahead of the
    pending abort, which carries the joined cancel's cause."""
    s = held_step(impl)

    def join(data: FrozenDict) -> None:
        if thaw(data["cause"])["kind"] == "user":
            s.followup("late")
            s.cancel("parent")
    s.observe("agent/cancel-requested", join)
    s.cancel("user", keep_inbox=True)
    s.pump()
    order = [(o.event.type, o.event.payload) for o in s.driver.live(
        "agent/inbox/enqueue", "agent/inbox/discard")]
    enqueued = [i for i, (t, p) in enumerate(order) if t == "agent/inbox/enqueue"
                and thaw(p["message"])["content"][0]["text"] == "late"]
    discarded = [i for i, (t, p) in enumerate(order) if t == "agent/inbox/discard"
                 and "late" in [m["content"][0]["text"] for m in thaw(p["messages"])]]
    assert len(enqueued) == 1 and len(discarded) == 1 and enqueued[0] < discarded[0]
    assert s.live_tokens("agent/cancel-requested") == ["cancel-req(user)", "cancel-req(parent)"]
    assert aborts(s) == [{"signal": 2, "reason": {"kind": "parent"}}]


# --------------------------------------------------------------------------
# R16.4 by moment
# --------------------------------------------------------------------------


@both
def test_R16_4_while_a_wake_is_pending_the_queue_is_discarded_and_the_wake_claims_nothing(
        impl: str) -> None:
    s = scenario(impl)
    s.hold("tick")
    s.followup("go")
    s.run()
    s.cancel()
    s.resolve("tick")
    assert tokens(s) == ["tick(wake)", "enq(go,q)", "cancel-req(user)", "disc[go]"]
    assert aborts(s) == [] and s.statuses() == []


@both
def test_R16_4_during_admission_no_turn_and_the_claimed_item_keeps_its_dequeue(impl: str) -> None:
    s = scenario(impl)
    s.hold("prompt-submit")
    s.followup("go")
    s.run()
    s.cancel()
    s.resolve("prompt-submit", {"kind": "allow"})
    assert s.events == [] and s.live_tokens("agent/inbox/dequeue") == ["deq(go,q)"]
    assert s.live("agent/inbox/discard") == []
    assert aborts(s) == [{"signal": 1, "reason": {"kind": "user"}}]


@both
@pytest.mark.parametrize("moment", ["agent/settled", "agent/status"])
def test_R16_4_at_settled_or_idle_a_cancel_discards_and_does_nothing_more(
        impl: str, moment: str) -> None:
    s = scenario(impl)

    def cancel(data: FrozenDict) -> None:
        if moment == "agent/settled" or data["status"] == "idle":
            s.send("quiet", "next-turn", False)
            s.cancel()
    s.observe(moment, cancel, once=moment == "agent/settled")
    s.followup("go")
    s.run()
    assert s.live_tokens("agent/inbox/discard") == ["disc[quiet]"]
    assert aborts(s) == [] and reason_kinds(s) == ["completed"]
    assert s.statuses() == ["running", "idle"]


# --------------------------------------------------------------------------
# R16.5 keepInbox
# --------------------------------------------------------------------------


@both
def test_R16_5_keepInbox_aborts_the_activity_only_and_the_next_item_runs_without_idle_between(
        impl: str) -> None:
    s = held_step(impl)
    s.cancel(keep_inbox=True)
    s.resolve("step")
    assert s.live("agent/inbox/discard") == [] and s.live("agent/context/discard") == []
    assert reason_kinds(s) == ["aborted", "completed"]
    # the retained steering and context are inherited ahead of the next turn's prompt
    second = s.log()[s.log().index("TE(1,aborted)") + 1:]
    assert second[:4] == ["TS(2,msg:user)", "STM(2;'s1';user)", "UM('c1';plugin:test)", "UM('q1')"]
    assert s.statuses() == ["running", "idle"]


# --------------------------------------------------------------------------
# R16.6 cooperative
# --------------------------------------------------------------------------


@both
def test_R16_6_work_that_ignores_its_signal_keeps_running_and_quiescence_waits_for_it(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")))
    s.hold("tool-execute")
    s.followup("go")
    s.run()
    s.cancel()
    s.run()
    assert s.core.status == "running" and not s.core.is_quiescent
    assert s.of("turn/end") == [] and len(s.core.outstanding_effects) == 1
    s.resolve("tool-execute", ok_result("finished anyway"))
    assert reason_kinds(s) == ["aborted"] and s.core.is_quiescent


@both
def test_R16_6_a_stream_still_flowing_after_the_abort_is_released_at_its_next_chunk(
        impl: str) -> None:
    s = scenario(impl)
    s.hold("model")
    s.followup("go")
    s.run()
    model = s.take("model")
    s.cancel()
    s.run()
    assert model.id in s.core.outstanding_effects
    s.core.chunk(model.id, {"type": "text", "text": "still streaming"})
    s.run()
    trace = tokens(s)
    assert trace[trace.index("abort(user)"):][:4] == [
        "abort(user)", "release", "[SE(1.1)]", "[TE(1,aborted)]"]
    assert s.of("assistant/chunk") == [] and reason_kinds(s) == ["aborted"]
