"""Scenario variants: scripts no conformance vector plays, kept as hand-written tests.

The scenarios themselves (A-H of scenarios.md) are written once, in
``machine/conformance/corpus/``, and collected as tests by ``tests/test_scenarios.py``; every
assertion the former hand-written copies made on the same situation now lives there. What is
here plays a *different* script than the scenario's vector, for a reason a vector cannot
express:

* values JSON cannot carry (a set, NaN: A3, H9), or arguments that are not JSON (F12);
* a caller mutating what it passed after the call (R1.7: B1, C2) or the cause object (E18a);
* an observer that raises, contained by the driver (B8, E1, F7a, F8: the vectors state the
  protocol's P14 observer inputs instead);
* a different shape of the same rule (A3 during a running turn, C3 with several contexts).

Each name says the scenario, the variation and the rules.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
from scenario_helpers import L, Scenario, integer, msg, obj, reply_text, result_with_contexts

from machine.checking.scripted import calls_reply, ok_result
from machine.errors import ValidationError
from machine.io import Control, Effect
from machine.jsonvalue import FrozenDict, JsonLike, thaw


def _bad_inject_set() -> dict[str, object]:
    m = msg("x")
    m["content"] = [{"type": "text", "text": "x", "extra": {1, 2}}]
    return m


def _bad_inject_nan() -> dict[str, object]:
    m = msg("x")
    m["content"] = [{"type": "text", "text": "x", "score": math.nan}]
    return m


def _empty_id() -> dict[str, object]:
    return msg("x", id="")


def _assistant_role() -> dict[str, object]:
    m = msg("x")
    m["role"] = "assistant"
    return m


def _no_source() -> dict[str, object]:
    m = msg("x")
    del m["source"]
    return m


def _source_without_kind() -> dict[str, object]:
    m = msg("x")
    m["source"] = {"plugin": "p"}
    return m


INVALID_CALLS: dict[str, tuple[Callable[[Scenario], object], str]] = {
    "a-inject-set": (lambda s: s.core.inject(_bad_inject_set()), "content"),
    "a-inject-nan": (lambda s: s.core.inject(_bad_inject_nan()), "content"),
    "b-inject-empty-id": (lambda s: s.core.inject(_empty_id()), "id"),
    "c-followup-assistant-role": (lambda s: s.core.followup(_assistant_role()), "role"),
    "d-steer-no-source": (lambda s: s.core.steer(_no_source()), "source"),
    "d-steer-source-without-kind": (lambda s: s.core.steer(_source_without_kind()), "kind"),
    "e-send-next-turn-without-wakeup": (
        lambda s: s.core.send(msg("x"), {"target": "next-turn"}), "wakeup"),
}


#: Values JSON cannot carry (so no vector can): the A3 vector refuses the others at the call.
NON_JSON = ("a-inject-nan", "a-inject-set")


@pytest.mark.parametrize("case", NON_JSON)
def test_A3_variant_non_json_values_refused_at_the_call__R5_1_D5(case: str) -> None:
    call, named = INVALID_CALLS[case]
    s = Scenario("ok")
    s.pump()
    before = len(s.outputs)
    with pytest.raises(ValueError, match=named) as raised:
        call(s)
    assert isinstance(raised.value, ValidationError)
    s.run()
    assert s.events == []
    assert s.outputs[before:] == []             # no enqueue, no status, no wake
    assert s.core.is_quiescent and not s.core.wake_pending
    s.followup("ok")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('ok') SS(1.1) RH(initial) CH… AM(1.1; 'ok') "
                        "SE(1.1) TE(1, completed)")
    s.check()


@pytest.mark.parametrize("case", sorted(INVALID_CALLS))
def test_A3_variant_invalid_message_during_a_running_turn_stages_nothing__R5_1_D5_H9(case: str) -> None:
    call, named = INVALID_CALLS[case]
    s = Scenario("ok")
    s.hold("model")
    s.followup("go")
    s.run()
    assert s.core.accepts_next_step
    before = len(s.outputs)
    with pytest.raises(ValueError, match=named):
        call(s)
    assert (s.core.pending_context, s.core.pending_steering, s.core.pending_queued) == (0, 0, 0)
    assert s.outputs[before:] == []
    model = s.take("model")
    s.driver.stream(model, reply_text("ok"))
    s.run()
    assert s.user_texts() == ["go"]
    assert s.log()[-1] == "TE(1,completed)"
    s.check()


def test_B1_variant_plain_allow_records_the_snapshot_despite_mutation__R7_7_R1_7() -> None:
    s = Scenario("ok")
    s.hold("prompt-submit")
    original = msg("original", id="m1")
    snapshot = FrozenDict(original)
    s.core.followup(original)
    original["content"][0]["text"] = "mutated after followup"
    s.run()
    original["source"] = {"kind": "plugin", "plugin": "mutated"}  # while admission is pending
    original["id"] = "m2"
    s.resolve("prompt-submit", {"kind": "allow"})
    (um,) = s.of("user/message")
    assert um.data == snapshot
    assert s.request(1) == ["'original'"]
    assert s.live("agent/inbox/dequeue")[0]["message"] == snapshot
    s.check()


def test_B8_variant_a_raising_observer_contained_by_the_driver_changes_nothing__R7_10_D7() -> None:
    # The raising log observer is the driver's business: it is contained by the harness
    # (as a driver must), and the core's outputs are unaffected.
    s = Scenario("retried")

    def reject(_d: FrozenDict) -> None:
        raise RuntimeError("observer failed")
    s.observe("user/message", reject, once=True, contained=True)
    s.hold("prompt-submit")
    s.followup("blocked")
    s.run()
    s.inject("retained context", "plugin:test")
    s.resolve("prompt-submit", {"kind": "block", "reason": "no"})
    assert s.log() == L("UM('retained context'; plugin:test)")
    # neither removed nor delayed: appended at the rejected path, before continue-or-idle
    assert s.trace(durable=("UM",), effects=("tick",))[-3:] == L(
        "[UM('retained context';plugin:test)] tick(rejected-admission) idle")
    assert s.core.is_quiescent
    s.unhandle("prompt-submit")
    s.followup("resume")
    s.run()
    assert s.log() == L("UM('retained context'; plugin:test) TS(1, msg:user) UM('resume') SS(1.1) "
                        "RH(initial) CH… AM(1.1; 'retried') SE(1.1) TE(1, completed)")
    assert s.warned("observer failed") and s.live("agent/error") == []
    assert s.request(1) == ["'retained context';plugin:test", "'resume'"]
    s.check()


def test_C2_variant_context_mutated_after_inject_during_a_held_tool_body_lands_as_sent__R10_5_R1_7() -> None:
    s = Scenario(calls_reply(("c1", "noticer"), text="calling"), "done")
    s.hold("tool-execute")
    s.followup("go")
    s.run()
    execute = s.take("tool-execute")
    notice = msg("mid-turn notice", "plugin:x")
    s.core.inject(notice)
    notice["content"][0]["text"] = "MUTATED"
    s.inject("second notice", "plugin:x")
    s.run()
    assert [e for e in s.of("user/message") if obj(e.data["source"])["kind"] == "plugin"] == []
    s.core.resolve(execute.id, ok_result())
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; 'calling'+call c1) TC(1.1; c1) "
        "TR(1.1; c1; ok) UM('mid-turn notice'; plugin:x) UM('second notice'; plugin:x) SE(1.1) "
        "SS(1.2) CH… AM(1.2; 'done') SE(1.2) TE(1, completed)")
    assert [obj(e.data["trigger"])["kind"] for e in s.of("turn/start")] == ["message"]
    assert s.request(2)[-3:] == ["TR:c1", "'mid-turn notice';plugin:x", "'second notice';plugin:x"]
    s.check()


def _ctx_finalize(*extra: str) -> Callable[[Effect], tuple[str, dict[str, JsonLike]]]:
    def finalize(effect: Effect) -> tuple[str, dict[str, JsonLike]]:
        call_id = effect.payload["callId"]
        contexts = [msg(f"ctx-{call_id}", "plugin:p")]
        if call_id == "c1":
            contexts += [msg(f"ctx-c1-{x}", "plugin:p") for x in extra]
        return ("resolve", result_with_contexts("ok", *contexts))
    return finalize


def test_C3_variant_several_contexts_of_one_result_keep_list_order__R10_4_4() -> None:
    s = Scenario(calls_reply(("c1", "echo"), ("c2", "echo")), "done")
    s.handle("tool-finalize", _ctx_finalize("a", "b"))
    s.followup("go")
    s.run()
    log = s.log()
    start = log.index("TR(1.1;c2;ok)") + 1
    assert log[start:start + 5] == L("UM('ctx-c1';plugin:p) UM('ctx-c1-a';plugin:p) "
                                     "UM('ctx-c1-b';plugin:p) UM('ctx-c2';plugin:p) SE(1.1)")
    s.check()


def _hanging() -> tuple[Scenario, Effect]:
    s = Scenario()
    s.hold("model")
    s.followup("go")
    s.run()
    return s, s.hang_model()


def test_E1_variant_a_raising_cancel_observer_is_contained_and_the_next_still_runs__R16_2_P7() -> None:
    s = Scenario()
    seen: list[str] = []

    def first(payload: FrozenDict) -> None:
        seen.append(f"first:{obj(payload['cause'])['kind']}")
        s.followup("queued by cancel observer")
        raise RuntimeError("observer 1 failed")

    def second(payload: FrozenDict) -> None:
        seen.append(f"second:{obj(payload['cause'])['kind']}")
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


def test_E18a_variant_the_first_cause_is_a_detached_frozen_copy__R16_3() -> None:
    s, model = _hanging()
    cause = {"kind": "parent"}
    s.core.cancel(cause)
    cause["kind"] = "user"
    s.cancel("user")
    s.run()
    signal = integer(model.payload["signal"])
    reason = s.core.signal_reason(signal)
    assert reason is not None and reason.to_json() == {"kind": "parent"}
    assert reason is not cause  # type: ignore[comparison-overlap]  # what it states: not the caller's dict
    with pytest.raises(dataclasses.FrozenInstanceError):
        reason.kind = "user"  # type: ignore[misc]
    assert s.live_tokens("agent/cancel-requested") == ["cancel-req(parent)", "cancel-req(user)"]
    aborts = [o for o in s.outputs if isinstance(o, Control) and o.kind == "abort"]
    assert [a.payload["reason"] for a in aborts] == [{"kind": "parent"}]
    s.model_honours_abort(model)
    assert s.log()[-1] == "TE(1,aborted)"
    s.check()


def test_F7a_variant_a_raising_turn_start_observer_is_contained__D7_R20_2() -> None:
    s = Scenario("one", "two")

    def reject(_d: FrozenDict) -> None:
        raise RuntimeError("reject turn-start")
    s.observe("turn/start", reject, once=True, contained=True)
    s.followup("first")
    s.run()
    s.followup("go")
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('first') SS(1.1) RH(initial) CH… AM(1.1; 'one') SE(1.1) TE(1, completed) "
        "TS(2, msg:user) UM('go') SS(2.1) CH… AM(2.1; 'two') SE(2.1) TE(2, completed)")
    assert [w for w in s.warnings() if "reject turn-start" in w] != []
    assert len(s.warnings()) == 1 and s.live("agent/error") == []
    assert s.turn_numbers() == [1, 2] and s.user_texts() == ["first", "go"]
    assert len(s.requests) == 2
    s.check()


def test_F8_variant_a_raising_step_end_observer_is_contained__D7_R20_2() -> None:
    s = Scenario("ok")

    def reject(_d: FrozenDict) -> None:
        raise RuntimeError("reject first step-end")
    s.observe("step/end", reject, once=True, contained=True)
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; 'ok') SE(1.1) "
                        "TE(1, completed)")
    assert len(s.warnings()) == 1 and s.live("agent/error") == []
    for type_ in ("turn/start", "turn/end", "step/start", "step/end"):
        assert len(s.of(type_)) == 1
    assert s.reasons() == ["completed"]
    s.check()


def test_F12_variant_truncated_arguments_are_never_parsed_or_dispatched__R14_1() -> None:
    usage = {"outputTokens": 4096}
    s = Scenario([{"type": "tool-call", "id": "c1", "name": "t", "arguments": "{\"a\":"},
                  {"type": "usage", "usage": usage}, {"type": "finish", "kind": "max-tokens"}])
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; []) SE(1.1) "
                        "TE(1, max-tokens)")
    assert s.effects("tool-prepare") == [] and s.of("tool/call") == []
    assert s.history() == ["'go'"]
    (am,) = s.of("assistant/message")
    assert set(am.data) == {"turn", "step", "message", "usage"}
    assert (am.data["turn"], am.data["step"], thaw(am.data["usage"])) == (1, 1, usage)
    assert obj(am.data["message"])["content"] == []
    s.check()


def test_F12_variant_text_before_a_call_with_truncated_arguments_is_kept__R14_1() -> None:
    s = Scenario([{"type": "text", "text": "partial"},
                  {"type": "tool-call", "id": "c1", "name": "t", "arguments": "{"},
                  {"type": "finish", "kind": "max-tokens"}])
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; 'partial') SE(1.1) "
                        "TE(1, max-tokens)")
    assert s.of("tool/call") == []
    s.check()


def test_H9_variant_a_non_json_source_is_refused_at_the_call__R5_1_D5() -> None:
    s = Scenario(calls_reply(("c1", "noticer"), text="calling"), "done")
    refused: list[BaseException] = []

    def body(_e: object) -> object:
        bad = msg("bad context", {"kind": "plugin", "plugin": "x", "tags": {"a", "b"}})
        try:
            s.core.inject(bad)
        except ValidationError as error:
            refused.append(error)
        assert s.core.pending_context == 0
        return ("resolve", ok_result())
    s.handle("tool-execute", body)
    s.followup("go")
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; 'calling'+call c1) TC(1.1; c1) "
        "TR(1.1; c1; ok) SE(1.1) SS(1.2) CH… AM(1.2; 'done') SE(1.2) TE(1, completed)")
    assert len(refused) == 1 and isinstance(refused[0], ValueError)
    assert [e for e in s.of("user/message") if obj(e.data["source"])["kind"] == "plugin"] == []
    assert s.live("agent/error") == [] and len(s.requests) == 2
    s.check()
