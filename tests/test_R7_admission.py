"""R7, admission: claiming one queued item (specs/core.md §7): R7.1 who claims, R7.2 taking the
head, R7.3 opening, R7.4 running, R7.5 invoking, R7.6 the dequeue, R7.7 the decision, R7.8 the
release, R7.9 an allowed admission, R7.10 a rejected one, R7.11 an invalid decision.

Each test drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the
same inputs through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

import pytest
from scenario_helpers import Scenario, aborts, at_running, both, msg, scenario, tokens

from machine.checking.scripted import model_failure, text_reply
from machine.jsonvalue import FrozenDict, JsonLike, thaw
from machine.vocabulary import ErrorInfo

BLOCK = {"kind": "block", "reason": "not now"}


def retained_context(impl: str) -> Scenario:
    """A scenario whose turn 1 was cancelled with keepInbox while context was staged: the
    context ``old`` is retained (R11.3)."""
    s = scenario(impl)
    s.hold("step")
    s.followup("first")
    s.run()
    s.inject("old")
    s.cancel(keep_inbox=True)
    s.resolve("step")
    assert s.core.pending_context == 1 and s.reasons() == ["aborted"]
    return s


# --------------------------------------------------------------------------
# R7.1 who claims
# --------------------------------------------------------------------------


@both
def test_R7_1_a_waking_item_queued_during_a_turn_is_claimed_by_continue_or_idle_after_it(
        impl: str) -> None:
    s = scenario(impl)
    s.hold("model")
    s.followup("one")
    s.run()
    s.followup("two")                                 # busy: no wake, no claim now
    s.run()
    assert len(s.effects("prompt-submit")) == 1
    s.driver.stream(s.take("model"), text_reply("ok"))
    s.run()
    trace = tokens(s)
    assert [t for t in trace if t in ("tick(wake)", "⟨prompt-submit⟩", "flush(1)", "running")] == [
        "tick(wake)", "running", "⟨prompt-submit⟩", "flush(1)", "⟨prompt-submit⟩"]


@both
def test_R7_1_nothing_is_claimed_when_only_quiet_items_are_queued(impl: str) -> None:
    s = scenario(impl)
    at_running(s, lambda: s.send("quiet", "next-turn", False))
    s.followup("one")
    s.run()
    assert len(s.effects("prompt-submit")) == 1 and s.core.pending_queued == 1
    assert s.statuses() == ["running", "idle"]


# --------------------------------------------------------------------------
# R7.2 take the head; inherited
# --------------------------------------------------------------------------


@both
def test_R7_2_the_claimed_item_is_the_head_of_the_queue_quiet_or_not(impl: str) -> None:
    s = scenario(impl)
    s.send("quiet", "next-turn", False)
    s.followup("waking")
    s.run()
    assert [thaw(p["message"])["content"][0]["text"] for p in s.live("agent/inbox/dequeue")] == [
        "quiet", "waking"]
    assert s.user_texts() == ["quiet", "waking"]


@both
def test_R7_2_input_staged_before_the_claim_is_inherited_ahead_of_the_prompt_later_input_after(
        impl: str) -> None:
    s = retained_context(impl)
    at_running(s, lambda: s.inject("new"))
    s.followup("go")
    s.run()
    assert s.user_texts()[-3:] == ["old", "go", "new"]


# --------------------------------------------------------------------------
# R7.3 open: a fresh admission controller, the window open
# --------------------------------------------------------------------------


@both
def test_R7_3_each_claim_opens_the_window_with_a_fresh_admission_controller(impl: str) -> None:
    s = scenario(impl)
    s.handle("prompt-submit", lambda _e: ("resolve", BLOCK), times=1)
    windows: list[bool] = []
    s.observe("agent/inbox/dequeue", lambda _d: windows.append(s.core.accepts_next_step))
    s.followup("blocked")
    s.followup("allowed")
    s.run()
    assert windows == [True, True]
    signals = [e.payload["signal"] for e in s.effects("prompt-submit")]
    assert signals == [1, 2]                          # the first admission made no run
    assert {e.payload["signal"] for e in s.effects("step")} == {3}


# --------------------------------------------------------------------------
# R7.4 running
# --------------------------------------------------------------------------


@both
def test_R7_4_running_observers_find_the_window_open_and_the_admission_owner_installed(
        impl: str) -> None:
    s = scenario(impl)
    seen: list[tuple[str, bool]] = []

    def observe() -> None:
        seen.append((s.core.status, s.core.accepts_next_step))
        s.cancel()
    at_running(s, observe)
    s.followup("go")
    s.run()
    assert seen == [("running", True)]
    assert aborts(s) == [{"signal": 1, "reason": {"kind": "user"}}]


@both
def test_R7_4_a_chained_claim_emits_no_second_running(impl: str) -> None:
    s = scenario(impl)
    s.followup("one")
    s.followup("two")
    s.run()
    assert s.turn_numbers() == [1, 2] and s.statuses() == ["running", "idle"]


# --------------------------------------------------------------------------
# R7.5 invoke
# --------------------------------------------------------------------------


@both
def test_R7_5_an_admission_aborted_at_running_requests_no_decision_and_orders_its_tail(
        impl: str) -> None:
    s = scenario(impl)

    def cancel_keeping_context() -> None:
        s.inject("ctx")                               # staged: the window is open
        s.cancel(keep_inbox=True)
    at_running(s, cancel_keeping_context)
    s.followup("go")
    s.run()
    # R7.8 and R7.10 steps 1-2 (the context appended), then the dequeue, then the tick
    assert tokens(s) == ["tick(wake)", "enq(go,q)", "running", "cancel-req(user)", "abort(user)",
                         "[UM('ctx';plugin:test)]", "deq(go,q)", "tick(rejected-admission)",
                         "idle"]
    assert s.effects("prompt-submit") == []


@both
def test_R7_5_a_live_admission_requests_the_decision_before_the_dequeue_output(impl: str) -> None:
    s = scenario(impl)
    s.followup(msg("go", id="g1"))
    s.run()
    trace = tokens(s)
    assert trace[2:5] == ["running", "⟨prompt-submit⟩", "deq(go,q)"]
    (submit,) = s.effects("prompt-submit")
    assert thaw(submit.payload) == {"message": msg("go", id="g1"), "signal": 1}


# --------------------------------------------------------------------------
# R7.6 dequeue
# --------------------------------------------------------------------------


@both
def test_R7_6_the_claimed_item_is_out_of_the_inbox_for_good_and_never_discarded(impl: str) -> None:
    s = scenario(impl)
    s.observe("agent/inbox/dequeue", lambda _d: s.cancel(), once=True)
    s.followup("go")
    s.run()
    assert s.live("agent/inbox/discard") == [] and s.core.pending_queued == 0
    assert s.live_tokens("agent/inbox/dequeue") == ["deq(go,q)"]
    assert s.events == [] and aborts(s) == [{"signal": 1, "reason": {"kind": "user"}}]


# --------------------------------------------------------------------------
# R7.7 decision
# --------------------------------------------------------------------------


@both
@pytest.mark.parametrize("answer", [("resolve", {"kind": "allow"}),
                                    ("raise", ErrorInfo("boom"))])
def test_R7_7_a_decision_consumed_after_an_abort_is_disregarded_without_a_warning(
        impl: str, answer: tuple[str, JsonLike]) -> None:
    s = scenario(impl)
    s.hold("prompt-submit")
    s.followup("go")
    s.run()
    s.cancel()
    effect = s.take("prompt-submit")
    if answer[0] == "raise":
        s.core.fail(effect.id, ErrorInfo("boom"))
    else:
        s.core.resolve(effect.id, answer[1])
    s.run()
    assert s.events == [] and s.warnings() == [] and s.errors() == []
    assert tokens(s)[-2:] == ["tick(rejected-admission)", "idle"]


@both
def test_R7_7_a_raising_admission_is_rejected_with_a_warning_and_no_error(impl: str) -> None:
    s = scenario(impl)
    s.handle("prompt-submit", lambda _e: ("raise", ErrorInfo("boom", causes=("deep",))))
    s.followup("go")
    s.run()
    assert s.warnings() == ["prompt admission failed: boom: deep"]
    assert s.events == [] and s.errors() == [] and s.live("agent/settled") == []


@both
def test_R7_7_a_block_writes_no_part_of_the_decision(impl: str) -> None:
    s = scenario(impl)
    s.handle("prompt-submit", lambda _e: ("resolve", {"kind": "block", "reason": "secret"}))
    s.followup("go")
    s.run()
    assert s.events == [] and s.warnings() == [] and s.errors() == []
    assert tokens(s)[-2:] == ["tick(rejected-admission)", "idle"]


@both
def test_R7_7_allow_with_content_writes_a_fresh_prompt_with_the_claimed_identity_then_the_contexts(
        impl: str) -> None:
    claimed = msg("original", "plugin:p", id="claimed")
    contexts = [msg("ctx one", "plugin:a", id="c1"), msg("ctx two", "plugin:b", id="c2")]
    s = scenario(impl)
    s.handle("prompt-submit", lambda _e: ("resolve", {
        "kind": "allow", "content": [{"type": "text", "text": "rewritten"}],
        "additionalContexts": contexts}))
    s.steer(claimed)
    s.run()
    written = [thaw(e.data) for e in s.of("user/message")]
    assert written == [{"id": "claimed", "role": "user",
                        "content": [{"type": "text", "text": "rewritten"}],
                        "source": {"kind": "plugin", "plugin": "p"}}, *contexts]


@both
def test_R7_7_allow_without_content_writes_the_claimed_message_itself(impl: str) -> None:
    claimed = msg("original", id="claimed")
    s = scenario(impl)
    s.followup(claimed)
    s.run()
    assert [thaw(e.data) for e in s.of("user/message")] == [claimed]


# --------------------------------------------------------------------------
# R7.8 release
# --------------------------------------------------------------------------


@both
def test_R7_8_the_warning_comes_while_the_window_is_open_and_the_owner_installed(impl: str) -> None:
    s = scenario(impl)
    s.handle("prompt-submit", lambda _e: ("raise", ErrorInfo("boom")))
    seen: list[bool] = []

    def at_warning(_d: FrozenDict) -> None:
        seen.append(s.core.accepts_next_step)
        s.cancel()
    s.observe("agent/warning", at_warning)
    s.followup("go")
    s.run()
    assert seen == [True]
    assert aborts(s) == [{"signal": 1, "reason": {"kind": "user"}}]


@both
def test_R7_8_after_the_decision_is_handled_the_admission_owner_is_gone(impl: str) -> None:
    s = scenario(impl)
    s.handle("prompt-submit", lambda _e: ("resolve", BLOCK))
    s.hold("tick", when=lambda e: e.payload["purpose"] == "rejected-admission")
    s.followup("go")
    s.run()
    s.cancel()                                         # nothing to clear, no owner: a no-op
    s.resolve("tick")
    assert aborts(s) == [] and s.live("agent/cancel-requested") == []


# --------------------------------------------------------------------------
# R7.9 allowed
# --------------------------------------------------------------------------


@both
def test_R7_9_the_run_starts_at_once_with_the_claimed_items_source_as_trigger(impl: str) -> None:
    s = scenario(impl)
    s.steer(msg("go", "plugin:p"))
    s.run()
    trace = tokens(s)
    assert trace[trace.index("deq(go,q)") + 1] == "[TS(1,msg:plugin:p)]"
    (start,) = s.of("turn/start")
    assert thaw(start.data) == {"turn": 1, "trigger": {"kind": "message",
                                                       "source": {"kind": "plugin", "plugin": "p"}}}


@both
def test_R7_9_an_admitted_run_starts_with_an_empty_failure_history(impl: str) -> None:
    s = scenario(impl, model_failure("first", "E1"), model_failure("second", "E2"),
                 model_failure("third", "E3"))
    s.handle("request-error", lambda _e: ("resolve", {"kind": "retry"}), times=1)
    s.followup("go")
    s.run()
    s.followup("again")
    s.run()
    prior = [[f["message"] for f in thaw(e.payload["priorFailures"])] for e in s.effects("request-error")]
    assert prior == [[], ["first"], []]               # the chain's history, then a fresh one


# --------------------------------------------------------------------------
# R7.10 rejected
# --------------------------------------------------------------------------


@both
def test_R7_10_a_rejected_admission_writes_staged_context_between_turns_oldest_first(
        impl: str) -> None:
    s = scenario(impl)
    s.handle("prompt-submit", lambda _e: ("resolve", BLOCK))

    def stage() -> None:
        s.inject("one")
        s.inject("two")
    at_running(s, stage)
    s.followup("go")
    s.run()
    assert tokens(s)[-5:] == ["deq(go,q)", "[UM('one';plugin:test)]", "[UM('two';plugin:test)]",
                              "tick(rejected-admission)", "idle"]
    assert s.of("turn/start") == [] and s.live("agent/settled") == [] and s.effects("flush") == []


@both
def test_R7_10_a_staged_steering_item_keeps_everything_staged(impl: str) -> None:
    s = scenario(impl)
    s.handle("prompt-submit", lambda _e: ("resolve", BLOCK))

    def stage() -> None:
        s.inject("context")
        s.steer("steering")
    at_running(s, stage)
    s.followup("go")
    s.run()
    assert s.events == [] and (s.core.pending_steering, s.core.pending_context) == (1, 1)
    assert not s.core.accepts_next_step and s.statuses() == ["running", "idle"]


@both
def test_R7_10_a_waking_send_during_the_tail_is_queued_without_a_wake_and_claimed_next(
        impl: str) -> None:
    s = scenario(impl)
    s.handle("prompt-submit", lambda _e: ("resolve", BLOCK), times=1)
    s.hold("tick", when=lambda e: e.payload["purpose"] == "rejected-admission")
    s.followup("blocked")
    s.run()
    assert not s.core.accepts_next_step
    s.followup("next")
    assert not s.core.wake_pending
    s.resolve("tick")
    assert [e.payload["purpose"] for e in s.effects("tick")] == ["wake", "rejected-admission"]
    assert s.user_texts() == ["next"] and s.statuses() == ["running", "idle"]


# --------------------------------------------------------------------------
# R7.11 invalid decision
# --------------------------------------------------------------------------


@both
@pytest.mark.parametrize("decision", [
    None, "allow", {"kind": "maybe"}, {"kind": "allow", "extra": 1},
    {"kind": "block", "reason": 3}, {"kind": "allow", "content": "not blocks"},
    {"kind": "allow", "additionalContexts": [{"id": "x"}]},
    {"kind": "allow", "additionalContexts": [msg("nan", id="n") | {"meta": float("nan")}]},
])
def test_R7_11_an_invalid_decision_is_a_rejected_admission_with_a_warning_naming_the_problem(
        impl: str, decision: JsonLike) -> None:
    s = scenario(impl)
    s.handle("prompt-submit", lambda _e: ("resolve", decision), times=1)
    s.followup("go")
    s.run()
    (warning,) = s.warnings()
    prefix = "prompt admission returned an invalid decision: "
    assert warning.startswith(prefix) and len(warning) > len(prefix)
    assert s.events == [] and s.errors() == [] and s.live("agent/settled") == []
    assert tokens(s)[-2:] == ["tick(rejected-admission)", "idle"]
