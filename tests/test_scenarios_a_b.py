"""Reference scenarios A (idle routing and the wake) and B (prompt admission).

Each test encodes one scenario of ``shared/reference/scenarios.md``: the exact durable log
in the scenario notation (see `tests.scenario_helpers`), the live notifications in order
where the scenario gives them, and the scenario's Checks. Sans-I/O mapping: "whenIdle()
completes" is ``core.is_quiescent``; a pending extension point is a held effect; "yield one
tick" answers the held wake tick.
"""

from __future__ import annotations

import math

import pytest
from scenario_helpers import L, Scenario, msg, reply_text

from machine.errors import ValidationError
from machine.jsonvalue import FrozenDict


def test_A1_simple_prompt_turn__R5_R6_R7_R8_R9_R12_P1() -> None:
    usage = {"inputTokens": 3, "outputTokens": 2}
    s = Scenario(reply_text("hello there", usage=usage))
    boundaries: list[str] = []
    for type_ in ("turn/start", "step/start", "step/end", "turn/end"):
        s.observe(type_, lambda _d, t=type_: boundaries.append(t))
    s.followup("hi")
    s.run()

    assert s.log() == L("TS(1, msg:user) UM('hi') SS(1.1) RH(initial) CH… "
                        "AM(1.1; 'hello there') SE(1.1) TE(1, completed)")
    assert s.trace(durable=("TS", "UM", "TE"),
                   effects=("prompt-submit", "step", "request", "turn-stopping", "flush")) == L(
        "enq(hi,q) running ⟨prompt-submit⟩ deq(hi,q) [TS(1,msg:user)] [UM('hi')] ⟨step 1.1⟩ "
        "⟨request 1.1⟩ ⟨turn-stopping 1⟩ [TE(1,completed)] flush(1) settled(1,completed) idle")
    # Checks
    assert boundaries == ["turn/start", "step/start", "step/end", "turn/end"]
    assert s.types()[:2] == ["turn/start", "user/message"] and s.types()[-1] == "turn/end"
    (am,) = s.of("assistant/message")
    assert am.data["usage"] == usage
    chunk_seqs = [e.seq for e in s.of("assistant/chunk")]
    assert list(am.source_event_seqs or ()) == chunk_seqs and len(chunk_seqs) == 3  # text, usage, finish
    assert [m.role for m in s.core.log.derive_messages()] == ["user", "assistant"]
    assert s.statuses() == ["running", "idle"]
    s.check()


def test_A2_idle_inject_appends_one_event_only__R5_2_P3() -> None:
    s = Scenario()
    s.pump()
    before = len(s.outputs)
    s.inject("context", "plugin:p")
    assert s.core.is_quiescent            # whenIdle() completes at once
    s.run()
    assert s.log() == L("UM('context'; plugin:p)")
    assert s.types() == ["user/message"]
    assert s.trace(effects="*", since=before) == []   # no status, inbox, request, tick or flush
    assert s.requests == [] and s.effects("flush") == []
    assert s.core.is_quiescent and s.core.status == "idle"
    s.check()


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


INVALID_CALLS = {
    "a-inject-set": (lambda s: s.core.inject(_bad_inject_set()), "content"),
    "a-inject-nan": (lambda s: s.core.inject(_bad_inject_nan()), "content"),
    "b-inject-empty-id": (lambda s: s.core.inject(_empty_id()), "id"),
    "c-followup-assistant-role": (lambda s: s.core.followup(_assistant_role()), "role"),
    "d-steer-no-source": (lambda s: s.core.steer(_no_source()), "source"),
    "d-steer-source-without-kind": (lambda s: s.core.steer(_source_without_kind()), "kind"),
    "e-send-next-turn-without-wakeup": (
        lambda s: s.core.send(msg("x"), {"target": "next-turn"}), "wakeup"),
}


@pytest.mark.parametrize("case", sorted(INVALID_CALLS))
def test_A3_invalid_messages_refused_at_the_call__R5_1_D5(case: str) -> None:
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
def test_A3_invalid_message_during_a_running_turn_stages_nothing__R5_1_D5_H9(case: str) -> None:
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


def test_A4_idle_context_then_a_prompt__R5_2_R21_3() -> None:
    s = Scenario("ok")
    s.pump()
    context = msg("file changed: a.ts", "plugin:watcher")
    s.core.inject(context)
    s.run()
    # after the inject, before the followup
    assert s.core.status == "idle" and s.requests == [] and s.of("turn/start") == []
    last = s.events[-1]
    assert last.type == "user/message"
    assert last.data == FrozenDict(context)
    s.followup("go")
    s.run()
    assert s.log() == L("UM('file changed: a.ts'; plugin:watcher) TS(1, msg:user) UM('go') "
                        "SS(1.1) RH(initial) CH… AM(1.1; 'ok') SE(1.1) TE(1, completed)")
    request = s.request_messages(1)
    assert [m.to_json() for m in request] == [context, s.of("user/message")[1].data]
    assert s.request(1) == ["'file changed: a.ts';plugin:watcher", "'go'"]
    s.check()


def test_A5_idle_steer_becomes_an_ordinary_prompt_turn__R5_3_R6_P2() -> None:
    s = Scenario("ok")
    s.steer("steer idle", "plugin:test")
    s.run()
    assert s.log() == L("TS(1, msg:plugin) UM('steer idle'; plugin:test) SS(1.1) RH(initial) CH… "
                        "AM(1.1; 'ok') SE(1.1) TE(1, completed)")
    assert s.of("turn/start")[0].data["trigger"] == {"kind": "message",
                                                     "source": {"kind": "plugin", "plugin": "test"}}
    assert s.of("steering/message") == []
    trace = s.trace()
    assert trace[:3] == L("enq(steer idle,q) running deq(steer idle,q)") and trace[-1] == "idle"
    assert [p["placement"] for p in s.live("agent/inbox/enqueue")] == ["queued"]
    assert len(s.requests) == 1
    s.check()


def test_A6_two_idle_steers_in_one_stack_make_two_turns__R6_3a_P2() -> None:
    s = Scenario("first", "second")
    s.steer("S1")
    s.steer("S2")
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('S1') SS(1.1) RH(initial) CH… AM(1.1; 'first') SE(1.1) TE(1, completed) "
        "TS(2, msg:user) UM('S2') SS(2.1) CH… AM(2.1; 'second') SE(2.1) TE(2, completed)")
    assert s.trace(effects=("flush",)) == L(
        "enq(S1,q) enq(S2,q) running deq(S1,q) flush(1) settled(1,completed) deq(S2,q) "
        "flush(2) settled(2,completed) idle")
    assert len(s.of("turn/start")) == 2 and s.of("steering/message") == []
    assert s.request(1) == ["'S1'"]
    assert "'S2'" in s.request(2)
    assert s.statuses() == ["running", "idle"]
    s.check()


def test_A8_quiet_send_stays_parked_until_woken__R5_7_R18() -> None:
    s = Scenario("reply", "ok")
    s.pump()
    s.send("quiet", "next-turn", wakeup=False)
    s.run()
    assert s.core.is_quiescent and s.core.status == "idle" and s.events == []
    s.followup("wake")
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('quiet') SS(1.1) RH(initial) CH… AM(1.1; 'reply') SE(1.1) TE(1, completed) "
        "TS(2, msg:user) UM('wake') SS(2.1) CH… AM(2.1; 'ok') SE(2.1) TE(2, completed)")
    assert s.trace() == L("enq(quiet,q) enq(wake,q) running deq(quiet,q) settled(1,completed) "
                          "deq(wake,q) settled(2,completed) idle")
    assert s.user_texts() == ["quiet", "wake"]
    s.check()


def test_A10_sends_one_tick_apart_keep_their_own_sources__R6_1_R7_9() -> None:
    s = Scenario("one", "two")
    s.hold("tick")
    s.followup("user message")
    s.run()
    s.driver.resolve("tick")          # one tick: the claim starts
    s.pump()
    assert s.core.status == "running"
    ticks = len(s.effects("tick"))
    s.followup("plugin message", "plugin:test")
    assert len(s.effects("tick")) == ticks and not s.core.wake_pending   # queued without a wake
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('user message') SS(1.1) RH(initial) CH… AM(1.1; 'one') SE(1.1) "
        "TE(1, completed) TS(2, msg:plugin) UM('plugin message'; plugin:test) SS(2.1) CH… "
        "AM(2.1; 'two') SE(2.1) TE(2, completed)")
    triggers = [e.data["trigger"] for e in s.of("turn/start")]
    assert triggers == [{"kind": "message", "source": {"kind": "user"}},
                        {"kind": "message", "source": {"kind": "plugin", "plugin": "test"}}]
    assert [e.data["source"] for e in s.of("user/message")] == [
        {"kind": "user"}, {"kind": "plugin", "plugin": "test"}]
    assert len(s.effects("tick")) == 1
    s.check()


def test_A12_session_start_context_precedes_the_first_turn__R19_session_start_R23() -> None:
    s = Scenario("ok")
    s.observe("agent/session-start", lambda _p: s.inject("session preamble", "plugin:test"))
    s.pump()
    s.followup("go")
    s.run()
    assert s.log() == L("UM('session preamble'; plugin:test) TS(1, msg:user) UM('go') SS(1.1) "
                        "RH(initial) CH… AM(1.1; 'ok') SE(1.1) TE(1, completed)")
    assert s.request(1)[0] == "'session preamble';plugin:test"
    assert s.of("user/message")[0].data["source"] == {"kind": "plugin", "plugin": "test"}
    s.check()


# ---------------------------------------------------------------------------
# B. Prompt admission
# ---------------------------------------------------------------------------


def test_B1_allow_with_rewritten_content_keeps_identity__R7_7_R1_5() -> None:
    s = Scenario("ok")
    s.handle("prompt-submit", lambda _e: ("resolve", {
        "kind": "allow", "content": [{"type": "text", "text": "REWRITTEN"}]}))
    original = msg("original", id="m1")
    s.core.followup(original)
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('REWRITTEN') SS(1.1) RH(initial) CH… AM(1.1; 'ok') "
                        "SE(1.1) TE(1, completed)")
    (um,) = s.of("user/message")
    assert um.data["id"] == "m1" and um.data["source"] == {"kind": "user"}
    assert s.request(1) == ["'REWRITTEN'"]
    assert all("original" not in label for label in s.request(1))
    (deq,) = s.live("agent/inbox/dequeue")
    assert deq["message"] == FrozenDict(original)
    s.check()


def test_B1_variant_plain_allow_records_the_snapshot_despite_mutation__R7_7_R1_7() -> None:
    s = Scenario("ok")
    s.hold("prompt-submit")
    original = msg("original", id="m1")
    snapshot = FrozenDict(original)
    s.core.followup(original)
    original["content"][0]["text"] = "mutated after followup"   # type: ignore[index]
    s.run()
    original["source"] = {"kind": "plugin", "plugin": "mutated"}  # while admission is pending
    original["id"] = "m2"
    s.resolve("prompt-submit", {"kind": "allow"})
    (um,) = s.of("user/message")
    assert um.data == snapshot
    assert s.request(1) == ["'original'"]
    assert s.live("agent/inbox/dequeue")[0]["message"] == snapshot
    s.check()


def test_B2_allow_with_additional_contexts_prompt_first__R7_7_R8_3() -> None:
    s = Scenario("ok")
    context = msg("injected ctx", "plugin:test", id="ctx-1")
    s.handle("prompt-submit", lambda _e: ("resolve", {
        "kind": "allow", "content": [{"type": "text", "text": "REWRITTEN prompt"}],
        "additionalContexts": [context]}))
    seen: list[list[str]] = []
    s.handle("step", lambda _e: seen.append(s.history()), times=1)
    s.followup("ORIGINAL prompt")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('REWRITTEN prompt') UM('injected ctx'; plugin:test) "
                        "SS(1.1) RH(initial) CH… AM(1.1; 'ok') SE(1.1) TE(1, completed)")
    ctx_event = s.of("user/message")[1]
    assert ctx_event.data["id"] == "ctx-1" and ctx_event.data["source"] == context["source"]
    assert s.of("user/message")[0].data["id"] != "ctx-1"
    assert seen == [["'REWRITTEN prompt'", "'injected ctx';plugin:test"]]
    assert "'injected ctx';plugin:test" in s.request(1)
    s.check()


def test_B3_block_leaves_nothing_durable__R7_7_R7_10() -> None:
    s = Scenario()
    s.handle("prompt-submit", lambda _e: ("resolve", {"kind": "block", "reason": "blocked by policy"}))
    s.followup("do something")
    s.run()
    assert s.events == []
    assert s.trace(effects=("prompt-submit", "flush")) == L(
        "enq(do something,q) running ⟨prompt-submit⟩ deq(do something,q) idle")
    assert s.requests == [] and s.effects("flush") == []
    assert s.live("agent/settled") == [] and s.live("agent/error") == []
    assert not s.core.accepts_next_step
    s.check()


def test_B4_inject_and_steer_during_an_allowed_admission__R7_R8_3_P4() -> None:
    s = Scenario("ok")
    s.hold("prompt-submit")
    s.followup("admitted prompt")
    s.run()
    s.inject("attached context", "plugin:test")
    s.steer("admission steering")
    # state while pending
    assert s.core.status == "running" and s.core.accepts_next_step and s.events == []
    s.resolve("prompt-submit", {"kind": "allow"})
    assert s.log() == L(
        "TS(1, msg:user) UM('admitted prompt') UM('attached context'; plugin:test) "
        "STM(1; 'admission steering'; user) SS(1.1) RH(initial) CH… AM(1.1; 'ok') SE(1.1) "
        "TE(1, completed)")
    assert s.trace(durable=("TS", "UM", "STM", "TE"),
                   effects=("prompt-submit", "step", "flush")) == L(
        "enq(admitted prompt,q) running ⟨prompt-submit⟩ deq(admitted prompt,q) "
        "enq(admission steering,s) [TS(1,msg:user)] [UM('admitted prompt')] "
        "[UM('attached context';plugin:test)] deq(admission steering,s) "
        "[STM(1;'admission steering';user)] ⟨step 1.1⟩ [TE(1,completed)] flush(1) "
        "settled(1,completed) idle")
    assert [p["placement"] for p in s.live("agent/inbox/enqueue")] == ["queued", "steering"]
    assert s.request(1) == ["'admitted prompt'", "'attached context';plugin:test",
                            "'admission steering'"]
    assert not s.core.accepts_next_step
    s.check()


def test_B7_blocked_admission_appends_context_only__R7_10_P5() -> None:
    s = Scenario()
    s.hold("prompt-submit")
    s.followup("blocked prompt")
    s.run()
    s.inject("independent context", "plugin:test")
    assert s.events == []
    s.resolve("prompt-submit", {"kind": "block", "reason": "no"})
    assert s.log() == L("UM('independent context'; plugin:test)")
    assert s.types() == ["user/message"]
    assert s.trace(durable=("UM",), effects=("flush",)) == L(
        "enq(blocked prompt,q) running deq(blocked prompt,q) "
        "[UM('independent context';plugin:test)] idle")
    assert s.requests == [] and s.live("agent/settled") == [] and s.effects("flush") == []
    s.check()


def test_B8_observer_failure_cannot_block_rejected_admission_append__R7_10_D7() -> None:
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


def test_B9_blocked_and_allowed_prompts_stay_independent__R7_10_R12_7() -> None:
    s = Scenario("ok")

    def decide(effect: object) -> object:
        text = effect.payload["message"]["content"][0]["text"]  # type: ignore[attr-defined]
        if text == "secret":
            return ("resolve", {"kind": "block", "reason": "secret"})
        return ("resolve", {"kind": "allow"})
    s.handle("prompt-submit", decide)
    s.followup("secret")
    s.followup("safe")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('safe') SS(1.1) RH(initial) CH… AM(1.1; 'ok') "
                        "SE(1.1) TE(1, completed)")
    assert s.trace(effects=("prompt-submit",)) == L(
        "enq(secret,q) enq(safe,q) running ⟨prompt-submit⟩ deq(secret,q) ⟨prompt-submit⟩ "
        "deq(safe,q) settled(1,completed) idle")
    assert s.user_texts() == ["safe"] and len(s.of("turn/start")) == 1
    assert s.reasons() == ["completed"]
    assert s.statuses() == ["running", "idle"]
    s.check()


def test_B10_raising_admission_handler_drops_only_that_prompt__R7_7_P7() -> None:
    from machine.vocabulary import ErrorInfo

    s = Scenario("ok")
    s.handle("prompt-submit", lambda _e: ("raise", ErrorInfo("handler exploded")), times=1)
    s.followup("first")
    s.followup("second")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('second') SS(1.1) RH(initial) CH… AM(1.1; 'ok') "
                        "SE(1.1) TE(1, completed)")
    assert s.warned("prompt admission failed") and s.warned("handler exploded")
    assert s.live("agent/error") == []
    assert len(s.of("turn/start")) == 1 and s.reasons() == ["completed"]
    assert s.statuses() == ["running", "idle"]
    assert len(s.requests) == 1 and s.request(1) == ["'second'"]
    s.check()


def test_B11_cancelling_a_cooperative_admission_leaves_no_turn__R7_7_R16_4_P13() -> None:
    s = Scenario()
    s.hold("prompt-submit")
    s.followup("go")
    s.run()
    admission = s.take("prompt-submit")
    s.cancel("user")
    s.run()
    s.core.resolve(admission.id, {"kind": "allow"})   # the handler delegates with next()
    s.run()
    assert s.events == []
    assert s.trace(effects=("prompt-submit",)) == L(
        "enq(go,q) running ⟨prompt-submit⟩ deq(go,q) cancel-req(user) idle")
    assert s.of("turn/end") == [] and s.warnings() == [] and s.live("agent/error") == []
    assert s.live("agent/inbox/discard") == [] and s.live("agent/context/discard") == []
    # admission has its own signal (distinct from any turn's)
    (abort,) = [o for o in s.outputs if getattr(o, "kind", None) == "abort"]
    assert abort.payload["signal"] == admission.payload["signal"]  # type: ignore[union-attr]
    s.check()

