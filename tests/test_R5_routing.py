"""R5, ``send(message, options)``: routing (specs/core.md §5): R5.1 validation first, R5.2
inject, R5.3 placement, R5.4 the wake before the notice, R5.5 the notice, R5.6 the window
decides, not the status, R5.7 quiet items.

Each test drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the
same inputs through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

import pytest
from scenario_helpers import Scenario, both, idle, msg, scenario, tokens

from machine.errors import DisposedError, ValidationError
from machine.io import Durable
from machine.jsonvalue import JsonLike, thaw


def in_the_window(impl: str) -> Scenario:
    """A scenario whose turn 1 waits on its held `{step}`: the window is open."""
    s = scenario(impl)
    s.hold("step")
    s.followup(msg("go", id="go"))
    s.run()
    assert s.core.accepts_next_step
    return s


# --------------------------------------------------------------------------
# R5.1 validation comes first; snapshot; the presets
# --------------------------------------------------------------------------


@both
def test_R5_1_options_are_checked_before_the_message_and_a_failure_does_nothing(impl: str) -> None:
    s = idle(impl)
    bad_message = {**msg("x"), "role": "assistant"}
    with pytest.raises(ValidationError) as options_first:
        s.core.send(bad_message, {"target": "next-turn"})           # no wakeup: bad options
    assert "wakeup" in str(options_first.value)
    with pytest.raises(ValidationError) as message_next:
        s.core.send(bad_message, {"target": "next-turn", "wakeup": True})
    assert "role" in str(message_next.value)
    s.run()
    assert s.outputs[3:] == [] and s.events == []
    assert (s.core.pending_queued, s.core.pending_steering, s.core.pending_context) == (0, 0, 0)
    assert not s.core.wake_pending


@both
def test_R5_1_a_valid_message_is_snapshotted_when_sent(impl: str) -> None:
    s = idle(impl)
    message = msg("original")
    s.core.followup(message)
    message["content"][0]["text"] = "changed"
    message["id"] = "changed"
    s.run()
    assert s.user_texts() == ["original"]
    assert s.of("user/message")[0].data["id"] != "changed"


@both
@pytest.mark.parametrize(("preset", "options"), [
    ("followup", {"target": "next-turn", "wakeup": True}),
    ("steer", {"target": "next-step", "wakeup": True}),
    ("inject", {"target": "next-step", "wakeup": False}),
])
def test_R5_1_followup_steer_and_inject_are_send_with_their_preset_options(
        impl: str, preset: str, options: dict[str, JsonLike]) -> None:
    def run(use_preset: bool) -> list[dict[str, JsonLike]]:
        s = in_the_window(impl)

        def issue(text: str) -> None:
            message = msg(text, id=f"id-{text}")
            if use_preset:
                getattr(s.core, preset)(message)
            else:
                s.core.send(message, options)
        issue("during")                             # the window open
        s.resolve("step")
        issue("idle")                               # the window closed
        s.run()
        return [o.to_json(with_time=False) if isinstance(o, Durable) else o.to_json()
                for o in s.outputs]
    assert run(True) == run(False)


@both
def test_R5_1_once_torn_down_a_send_raises_DisposedError_before_any_check(impl: str) -> None:
    s = idle(impl)
    s.dispose()
    s.run()
    with pytest.raises(DisposedError):
        s.core.send({"not": "a message"}, {"target": "nowhere"})


# --------------------------------------------------------------------------
# R5.2 inject
# --------------------------------------------------------------------------


@both
def test_R5_2_inject_with_the_window_open_stages_context_silently(impl: str) -> None:
    s = in_the_window(impl)
    before = len(s.outputs)
    s.inject("context")
    s.run()
    assert s.outputs[before:] == [] and s.core.pending_context == 1
    s.resolve("step")
    assert s.log()[:3] == ["TS(1,msg:user)", "UM('go')", "UM('context';plugin:test)"]


@both
def test_R5_2_inject_with_the_window_closed_appends_a_user_message_and_nothing_else(
        impl: str) -> None:
    s = idle(impl)
    s.inject("context")
    s.run()
    assert tokens(s) == ["[UM('context';plugin:test)]"]
    (event,) = s.events
    assert event.surface_op == "append"
    assert s.core.status == "idle" and s.core.is_quiescent


# --------------------------------------------------------------------------
# R5.3 placement
# --------------------------------------------------------------------------


@both
@pytest.mark.parametrize(("target", "wakeup", "open_placement"), [
    ("next-step", True, "steering"),
    ("next-turn", True, "queued"),
    ("next-turn", False, "queued"),
])
def test_R5_3_steering_exactly_for_next_step_with_the_window_open_else_queued(
        impl: str, target: str, wakeup: bool, open_placement: str) -> None:
    s = in_the_window(impl)
    s.send("open", target, wakeup)
    s.resolve("step")
    s.send("closed", target, False if target == "next-turn" else wakeup)
    s.run()
    placements = {str(thaw(p["message"])["content"][0]["text"]): p["placement"]
                  for p in s.live("agent/inbox/enqueue")}
    assert placements["open"] == open_placement and placements["closed"] == "queued"
    if open_placement == "steering":
        assert s.of("steering/message") != []


@both
def test_R5_3_a_queued_item_keeps_its_wakeup_and_steering_goes_on_the_outbox(impl: str) -> None:
    s = in_the_window(impl)
    s.steer("steer")
    s.send("quiet", "next-turn", False)
    s.followup("waking")
    assert (s.core.pending_steering, s.core.pending_queued) == (1, 2)
    s.resolve("step")
    # the waking item keeps the interval going; the quiet one is claimed first, in queue order
    assert s.user_texts() == ["go", "quiet", "waking"]
    assert [str(thaw(e.data["message"])["content"][0]["text"]) for e in s.of("steering/message")] == [
        "steer"]


# --------------------------------------------------------------------------
# R5.4 wake before notice; R5.5 the notice
# --------------------------------------------------------------------------


@both
def test_R5_4_a_waking_queued_send_asks_for_the_wake_before_its_enqueue_output(impl: str) -> None:
    s = idle(impl)
    s.send("waking", "next-turn", True)
    s.pump()
    assert tokens(s) == ["tick(wake)", "enq(waking,q)"]


@both
def test_R5_5_every_stored_item_is_announced_quiet_items_included(impl: str) -> None:
    s = idle(impl)
    quiet = msg("quiet")
    s.core.send(quiet, {"target": "next-turn", "wakeup": False})
    s.run()
    assert tokens(s) == ["enq(quiet,q)"]                 # no wake asked
    (notice,) = s.live("agent/inbox/enqueue")
    assert thaw(notice) == {"message": quiet, "placement": "queued"}


# --------------------------------------------------------------------------
# R5.6 the window decides, not the status
# --------------------------------------------------------------------------


@both
@pytest.mark.parametrize("moment", ["turn/end", "flush", "agent/settled", "tick"])
def test_R5_6_a_steer_while_busy_with_the_window_closed_is_queued(impl: str, moment: str) -> None:
    s = scenario(impl)
    placed: list[tuple[str, bool, int]] = []

    def steer(_d: object = None) -> None:
        s.steer(msg("steer", id="late"))
        placed.append((s.core.status, s.core.accepts_next_step, s.core.pending_queued))
    if moment == "flush":
        s.handle("flush", lambda _e: steer(), times=1)
    elif moment == "tick":                          # a rejected admission's tail
        s.handle("prompt-submit", lambda _e: ("resolve", {"kind": "block", "reason": "no"}), times=1)
        s.handle("tick", lambda _e: steer(), times=1,
                 when=lambda e: e.payload["purpose"] == "rejected-admission")
    else:
        s.observe(moment, steer, once=True)
    s.followup("go")
    s.run()
    assert placed == [("running", False, 1)]
    (enqueue,) = [p for p in s.live("agent/inbox/enqueue") if thaw(p["message"])["id"] == "late"]
    assert enqueue["placement"] == "queued"
    assert s.of("steering/message") == [] and s.statuses() == ["running", "idle"]


# --------------------------------------------------------------------------
# R5.7 quiet items
# --------------------------------------------------------------------------


@both
def test_R5_7_a_quiet_item_asks_for_no_wake_and_runs_only_with_a_waking_one_behind_it(
        impl: str) -> None:
    s = idle(impl)
    s.send("quiet", "next-turn", False)
    s.run()
    assert s.effects() == [] and s.core.pending_queued == 1 and s.core.is_quiescent
    s.followup("waking")
    s.run()
    # claims follow queue order: the quiet item gets a turn of its own first
    assert [e.data["turn"] for e in s.of("turn/start")] == [1, 2]
    assert s.user_texts() == ["quiet", "waking"] and s.statuses() == ["running", "idle"]
