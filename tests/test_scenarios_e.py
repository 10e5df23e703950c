"""Reference scenarios E: cancellation windows, keepInbox, disposal.

"The model hangs after two chunks" holds the model effect, feeds two text chunks, and after
the cancel fails the effect with an AbortError (the model honouring its signal). "A seam
waits until the turn signal is aborted and then returns normally" holds that effect and
resolves it after the cancel. An ``agent/status`` or ``agent/cancel-requested`` observer is
a driver observer of that live output, which issues its command in place (rule P2).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from scenario_helpers import L, Scenario

from machine.io import Control, Effect
from machine.jsonvalue import FrozenDict
from machine.scripted import calls_reply, ok_result
from machine.vocabulary import ErrorInfo


def test_E1_cancel_notifies_before_clearing_observer_work_cleared_too__R16_2_P7() -> None:
    s = Scenario()
    seen: list[str] = []

    def first(payload: FrozenDict) -> None:
        seen.append(f"first:{payload['cause']['kind']}")  # type: ignore[index]
        s.followup("queued by cancel observer")
        raise RuntimeError("observer 1 failed")

    def second(payload: FrozenDict) -> None:
        seen.append(f"second:{payload['cause']['kind']}")  # type: ignore[index]
    s.observe("agent/cancel-requested", first, contained=True)
    s.observe("agent/cancel-requested", second)
    s.pump()
    s.followup("drop me")
    s.cancel("user")
    s.run()
    assert s.events == [] and s.requests == []
    assert s.trace(effects=("tick",)) == L(
        "tick(wake) enq(drop me,q) cancel-req(user) enq(queued by cancel observer,q) "
        "disc[drop me,queued by cancel observer]")
    mark = len(s.outputs)
    s.cancel("parent")
    s.run()
    assert s.outputs[mark:] == []            # the second cancel emits nothing
    assert seen == ["first:user", "second:user"]
    assert s.warned("agent/cancel-requested")
    assert s.statuses() == []
    s.check()


def test_E2_idle_cancel_is_a_no_op_and_arms_nothing__R16_1() -> None:
    s = Scenario("ok")
    s.pump()
    mark = len(s.outputs)
    s.cancel("user")
    s.run()
    assert s.outputs[mark:] == []
    s.followup("real prompt")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('real prompt') SS(1.1) RH(initial) CH… AM(1.1; 'ok') "
                        "SE(1.1) TE(1, completed)")
    s.check()


def test_E3_keep_inbox_with_nothing_active_is_a_silent_no_op__R16_1_R16_5() -> None:
    s = Scenario("a", "b")
    s.pump()
    s.send("preserved", "next-turn", wakeup=False)
    s.cancel("user", keep_inbox=True)
    s.followup("wake it")
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('preserved') SS(1.1) RH(initial) CH… AM(1.1; 'a') SE(1.1) TE(1, completed) "
        "TS(2, msg:user) UM('wake it') SS(2.1) CH… AM(2.1; 'b') SE(2.1) TE(2, completed)")
    assert s.live("agent/cancel-requested", "agent/inbox/discard", "agent/context/discard") == []
    assert s.user_texts() == ["preserved", "wake it"]
    s.check()


def test_E4_cancelling_a_parked_quiet_item__R16_1_R16_4_path16() -> None:
    s = Scenario()
    s.pump()
    s.send("quiet", "next-turn", wakeup=False)
    s.cancel("user")
    s.run()
    assert s.events == []
    assert s.trace() == L("enq(quiet,q) cancel-req(user) disc[quiet]")
    assert s.core.is_quiescent
    mark = len(s.outputs)
    s.run()
    assert s.outputs[mark:] == [] and s.core.pending_queued == 0
    s.check()


def test_E6_prompt_queued_after_same_tick_cancel_still_runs__R16_4_R6_2() -> None:
    s = Scenario("ok")
    s.pump()
    s.followup("first")
    w_done_at_once = s.core.is_quiescent
    s.cancel("user")
    s.followup("second")
    assert not w_done_at_once and not s.core.is_quiescent
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('second') SS(1.1) RH(initial) CH… AM(1.1; 'ok') "
                        "SE(1.1) TE(1, completed)")
    trace = s.trace()
    assert trace[:6] == L("enq(first,q) cancel-req(user) disc[first] enq(second,q) running deq(second,q)")
    assert trace[-2:] == L("settled(1,completed) idle")
    assert "first" not in s.user_texts()
    assert s.core.is_quiescent
    s.check()


def test_E7_cancel_from_running_notification_no_turn__R7_5_R19_admission() -> None:
    s = Scenario()
    s.observe("agent/status", lambda p: p["status"] == "running" and s.cancel("user"), once=True)
    s.followup("go")
    s.run()
    assert s.events == []
    assert s.trace() == L("enq(go,q) running cancel-req(user) deq(go,q) idle")
    assert s.effects("prompt-submit") == []
    assert s.of("assistant/chunk") == [] and s.warnings() == []
    assert s.live("agent/inbox/discard", "agent/context/discard") == []
    s.check()


def test_E9_disposal_from_running_notification__R17_R7_5() -> None:
    s = Scenario()
    s.observe("agent/status", lambda p: p["status"] == "running" and s.dispose(), once=True)
    s.followup("go")
    s.run()
    assert s.events == []
    assert s.trace() == L("enq(go,q) running deq(go,q) idle agent/disposed session/disposed")
    assert s.requests == [] and s.core.status == "idle" and s.core.disposed
    s.check()


def test_E10a_cancel_from_idle_notification_affects_only_its_window__R19_idle_R16_4() -> None:
    s = Scenario("r1", "r2")
    quiescent: list[bool] = []

    def at_idle(_payload: FrozenDict) -> None:
        s.followup("cancelled replacement")
        quiescent.append(s.core.is_quiescent)    # W = whenIdle(): pending
        s.cancel("user")
    s.observe("agent/status", _once_on_idle(at_idle))
    s.followup("first")
    s.run()
    assert s.trace()[-3:] == L("enq(cancelled replacement,q) cancel-req(user) "
                               "disc[cancelled replacement]")
    assert quiescent == [False]
    assert s.core.is_quiescent and s.core.status == "idle"      # W completes
    assert len(s.requests) == 1 and len(s.of("turn/start")) == 1
    s.followup("later")
    s.run()
    assert s.user_texts() == ["first", "later"]
    s.check()


def _once_on_idle(fn: Callable[[FrozenDict], None]) -> Callable[[FrozenDict], None]:
    state = {"done": False}

    def observer(payload: FrozenDict) -> None:
        if payload["status"] == "idle" and not state["done"]:
            state["done"] = True
            fn(payload)
    return observer


def test_E10b_replacement_after_idle_cancel_survives__R19_idle_R16_4() -> None:
    s = Scenario("r1", "r2")

    def at_idle(_payload: FrozenDict) -> None:
        s.followup("cancelled replacement")
        s.cancel("user")
        s.followup("surviving replacement")
    s.observe("agent/status", _once_on_idle(at_idle))
    s.followup("first")
    s.run()
    assert len(s.requests) == 2
    assert s.user_texts() == ["first", "surviving replacement"]
    assert s.statuses() == ["running", "idle", "running", "idle"]
    s.check()


def _hanging() -> tuple[Scenario, Effect]:
    s = Scenario()
    s.hold("model")
    s.followup("go")
    s.run()
    return s, s.hang_model()


HUNG_LOG = "TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH CH SE(1.1) TE(1, aborted)"


def test_E11_cancel_while_streaming_drops_queued_tail__R9_7_R16_2_path14() -> None:
    s, model = _hanging()
    mark = len(s.outputs)
    s.followup("queued tail")
    s.cancel("user")
    s.run()
    s.model_honours_abort(model)
    assert s.log() == L(HUNG_LOG)
    assert s.trace(durable=("SE", "TE"), effects=("flush",), since=mark) == L(
        "enq(queued tail,q) cancel-req(user) disc[queued tail] [SE(1.1)] [TE(1,aborted)] flush(1) "
        "settled(1,aborted) idle")
    assert s.of("assistant/message") == [] and s.reasons() == ["aborted"]
    assert s.user_texts() == ["go"] and len(s.of("turn/start")) == 1 and len(s.requests) == 1
    assert s.live("agent/error") == []
    s.check()


def test_E12_cancel_discards_running_turn_steering__R16_2_path14() -> None:
    s, model = _hanging()
    mark = len(s.outputs)
    s.steer("steer text")
    s.cancel("user")
    s.run()
    s.model_honours_abort(model)
    assert s.log() == L(HUNG_LOG)
    assert s.trace(since=mark) == L("enq(steer text,s) cancel-req(user) disc[steer text] "
                                    "settled(1,aborted) idle")
    assert s.of("steering/message") == [] and len(s.of("turn/start")) == 1
    s.check()


@pytest.mark.parametrize(("command", "reason"), [("cancel", "aborted"), ("dispose", "disposed")])
def test_E14_cancel_or_dispose_from_step_start_observer__R9_5_R17(command: str, reason: str) -> None:
    s = Scenario()
    s.observe("step/start", lambda _d: s.cancel("user") if command == "cancel" else s.dispose(),
              once=True)
    s.followup("go")
    s.run()
    assert s.log() == L(f"TS(1, msg:user) UM('go') SS(1.1) SE(1.1) TE(1, {reason})")
    assert s.of("request/header") == [] and s.of("assistant/chunk") == [] and s.requests == []
    assert s.effects("request") == []
    assert len(s.of("step/start")) == len(s.of("step/end"))
    s.check()


@pytest.mark.parametrize("seam", ["system-prompt", "step"])
@pytest.mark.parametrize(("command", "reason"), [("cancel", "aborted"), ("dispose", "disposed")])
def test_E16_cancel_during_assembly_or_pending_step_handler__R9_1_R9_3_R15_1(
        seam: str, command: str, reason: str) -> None:
    s = Scenario()
    s.hold(seam)
    s.followup("go")
    s.run()
    if command == "cancel":
        s.cancel("user")
    else:
        s.dispose()
    s.run()
    s.resolve(seam, None)
    assert s.log() == L(f"TS(1, msg:user) UM('go') TE(1, {reason})")
    assert s.of("step/start") == [] and s.of("assistant/chunk") == []
    assert s.of("assistant/message") == [] and s.requests == []
    assert len(s.of("turn/start")) == 1 and len(s.of("turn/end")) == 1
    if command == "dispose":
        assert s.trace()[-2:] == ["agent/disposed", "session/disposed"]
    s.check()


def test_E18a_first_cause_wins_and_is_a_detached_copy__R16_3() -> None:
    s, model = _hanging()
    cause = {"kind": "parent"}
    s.core.cancel(cause)
    cause["kind"] = "user"
    s.cancel("user")
    s.run()
    signal = model.payload["signal"]
    reason = s.core.signal_reason(signal)
    assert reason is not None and reason.to_json() == {"kind": "parent"}
    assert reason is not cause
    with pytest.raises(dataclasses.FrozenInstanceError):
        reason.kind = "user"  # type: ignore[misc]
    assert s.live_tokens("agent/cancel-requested") == ["cancel-req(parent)", "cancel-req(user)"]
    aborts = [o for o in s.outputs if isinstance(o, Control) and o.kind == "abort"]
    assert [a.payload["reason"] for a in aborts] == [{"kind": "parent"}]
    s.model_honours_abort(model)
    assert s.log()[-1] == "TE(1,aborted)"
    s.check()


def test_E18b_user_cancel_beats_later_disposal__R16_3_R17_1() -> None:
    s, model = _hanging()
    mark = len(s.outputs)
    s.cancel("user")
    s.dispose()
    s.run()
    s.model_honours_abort(model)
    assert s.log()[-1] == "TE(1,aborted)"
    assert s.trace(since=mark) == L(
        "cancel-req(user) settled(1,aborted) idle agent/disposed session/disposed")
    s.check()


def _answer_seam(s: Scenario, seam: str) -> None:
    if seam == "request":
        s.resolve(seam, {"config": {"provider": "test", "model": "test-model"}})
    elif seam == "tool-execute":
        s.resolve(seam, ok_result())
    else:
        s.resolve(seam, None)


E19_LOGS = {
    "system-prompt": "TS(1, msg:user) UM('go') TE(1, aborted)",
    "step": "TS(1, msg:user) UM('go') TE(1, aborted)",
    "request": "TS(1, msg:user) UM('go') SS(1.1) SE(1.1) TE(1, aborted)",
    "turn-stopping": "TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; 'x') SE(1.1) "
                     "TE(1, aborted)",
    "tool-execute": "TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; call c1) "
                    "TC(1.1; c1) TR(1.1; c1; ERR ABORTED) SE(1.1) TE(1, aborted)",
}


@pytest.mark.parametrize("seam", list(E19_LOGS))
def test_E19_every_cooperative_seam_observes_the_turn_signal__R0_7_R16_4(seam: str) -> None:
    reply = calls_reply(("c1", "t")) if seam == "tool-execute" else "x"
    s = Scenario(reply)
    s.hold(seam)
    s.followup("go")
    s.run()
    held = s.driver.held[0]
    s.cancel("user")
    s.run()
    _answer_seam(s, seam)
    assert s.log() == L(E19_LOGS[seam])
    (abort,) = [o for o in s.outputs if isinstance(o, Control) and o.kind == "abort"]
    turn_signals = {e.payload["signal"] for e in s.effects()
                    if "signal" in e.payload and e.kind != "prompt-submit"}
    assert turn_signals == {abort.payload["signal"]} == {held.payload["signal"]}
    admission = s.effects("prompt-submit")[0].payload["signal"]
    assert admission != abort.payload["signal"]
    s.check()


def test_E21_disposal_from_step_handler_then_raise_is_still_disposed__R15_1_R17() -> None:
    s = Scenario()

    def step(_e: object) -> object:
        s.dispose()
        return ("raise", ErrorInfo("after dispose"))
    s.handle("step", step)
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('go') TE(1, disposed)")
    assert s.of("step/start") == [] and s.live("agent/error") == []
    assert s.live_tokens("agent/settled") == ["settled(1,aborted)"]
    s.check()
