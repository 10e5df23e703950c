"""Reference scenarios F (errors, retries, max-tokens, flush barrier), G6/G8 (resume and
publication order, as far as the core supports them) and H (further derived scenarios).

Observer failures (F7, F8) are the driver's business in the sans-I/O design: the harness
contains them the way a driver must (``observe(..., contained=True)`` records the failure
as a warning), and the tests assert that the core's outputs are unaffected.
"""

from __future__ import annotations

import json

import pytest
from scenario_helpers import L, Scenario, msg, reply_text

from machine.core import CoreConfig
from machine.errors import InvariantError, ValidationError
from machine.events import Event
from machine.jsonvalue import FrozenDict
from machine.log import SessionLog
from machine.scripted import calls_reply, model_failure, ok_result
from machine.vocabulary import ErrorInfo


def test_F1_model_failure_becomes_the_turn_error__R13_2_R15_2() -> None:
    s = Scenario(model_failure("model unavailable", "UNAVAILABLE"))
    s.followup("hi")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('hi') SS(1.1) RH(initial) SE(1.1) "
                        "TE(1, error{step:1, failure:{message:'model unavailable', code:'UNAVAILABLE'}})")
    (te,) = s.of("turn/end")
    assert te.data["reason"] == {"kind": "error", "step": 1, "failure": {
        "message": "model unavailable", "code": "UNAVAILABLE"}}
    trace = s.trace(durable=("SE", "TE"), effects=("request-error", "flush"))
    assert trace[trace.index("[SE(1.1)]"):] == L(
        "[SE(1.1)] ⟨request-error 1.1⟩ error(1,1,'model unavailable') "
        "[TE(1,error{step:1,failure:{message:'model unavailable',code:'UNAVAILABLE'}})] flush(1) "
        "settled(1,error) idle")
    assert s.errors() == [(1, 1, "model unavailable")]
    assert set(s.types()) <= {"turn/start", "user/message", "step/start", "request/header",
                              "step/end", "turn/end"}
    s.check()


F2_FAILURE = {"message": "provider 401", "code": "AUTH", "status": 401,
              "providerRetryAfterMs": 2000, "requestId": "req-1"}
F2_CASES = {
    "error-finish": ({"type": "finish", "kind": "error", "failure": F2_FAILURE}, F2_FAILURE),
    "aborted-finish-with-failure": (
        {"type": "finish", "kind": "aborted", "failure": {"message": "stopped", "code": "ABORTED"}},
        {"message": "stopped", "code": "ABORTED"}),
    "aborted-finish-without-failure": (
        {"type": "finish", "kind": "aborted"},
        {"message": "model request aborted", "code": "ABORTED"}),
}


@pytest.mark.parametrize("case", list(F2_CASES))
def test_F2_error_finish_chunk_durable_failure_no_assistant_message__R9_7_R15_2(case: str) -> None:
    finish, failure = F2_CASES[case]
    s = Scenario([finish])
    s.followup("go")
    s.run()
    te = f"TE(1,error{{step:1,failure:{_fmt_failure(failure)}}})"
    assert s.log() == L(f"TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… SE(1.1) {te}")
    assert len(s.of("assistant/chunk")) == 1
    assert s.of("turn/end")[0].data["reason"] == {"kind": "error", "step": 1, "failure": failure}
    assert s.of("assistant/message") == []
    s.check()


def _fmt_failure(failure: dict[str, object]) -> str:
    return "{" + ",".join(f"{k}:{v!r}" if isinstance(v, str) else f"{k}:{v}"
                          for k, v in failure.items()) + "}"


def test_F5_raising_recovery_handler_means_no_retry__R13_2() -> None:
    s = Scenario(model_failure("model unavailable", "UNAVAILABLE"))
    s.handle("request-error", lambda _e: ("raise", ErrorInfo("recovery exploded")))
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) "
                        "TE(1, error{step:1, failure:{message:'model unavailable', code:'UNAVAILABLE'}})")
    assert len(s.requests) == 1 and len(s.of("turn/start")) == 1
    assert s.warned("request recovery failed") and s.warned("recovery exploded")
    assert s.live_tokens("agent/settled") == ["settled(1,error)"]
    s.check()


def test_F6_request_extension_failures_are_not_request_failures__R13_1_R15_3() -> None:
    s = Scenario()
    s.handle("request", lambda _e: ("raise", ErrorInfo("middleware failed", code="MIDDLEWARE")))
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('go') SS(1.1) SE(1.1) "
                        "TE(1, error{step:1, message:'middleware failed', code:'MIDDLEWARE'})")
    assert s.effects("request-error") == [] and s.requests == [] and s.of("request/header") == []
    s.check()


def test_F7a_observer_cannot_veto_turn_start__D7_R20_2() -> None:
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


def test_F7b_direct_turn_start_append_inside_a_turn_raises__D7_R20_2() -> None:
    s = Scenario("one")
    raised: list[InvariantError] = []
    lengths: list[tuple[int, int]] = []

    def step(_e: object) -> None:
        before = len(s.core.log)
        try:
            s.core.append("turn/start", {"turn": 2, "trigger": {"kind": "retry"}})
        except InvariantError as error:
            raised.append(error)
        lengths.append((before, len(s.core.log)))
    s.handle("step", step, times=1)
    s.followup("first")
    s.run()
    assert len(raised) == 1 and "turn 1 is still open" in str(raised[0])
    assert lengths == [(2, 2)]
    assert s.log() == L("TS(1, msg:user) UM('first') SS(1.1) RH(initial) CH… AM(1.1; 'one') "
                        "SE(1.1) TE(1, completed)")
    s.check()


def test_F8_observer_cannot_veto_step_end__D7_R20_2() -> None:
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


def test_F9a_post_turn_flush_is_a_barrier__R12_4_D1() -> None:
    s = Scenario("one", "two")
    s.hold("flush", when=lambda e: e.payload["turn"] == 1)
    s.followup("first")
    s.followup("second")
    s.run()
    assert [e.payload["turn"] for e in s.effects("flush")] == [1]
    assert len(s.requests) == 1 and s.core.status == "running" and not s.core.is_quiescent
    assert s.turn_numbers() == [1]
    s.resolve("flush")
    assert len(s.requests) == 2 and [e.payload["turn"] for e in s.effects("flush")] == [1, 2]
    trace = s.trace(durable=("TE",), effects=("flush",))
    assert trace[trace.index("[TE(1,completed)]"):] == L(
        "[TE(1,completed)] flush(1) settled(1,completed) deq(second,q) [TE(2,completed)] flush(2) "
        "settled(2,completed) idle")
    s.check()


def test_F9b_flush_failure_is_reported_and_work_continues__R12_4() -> None:
    s = Scenario("one", "two")
    s.handle("flush", lambda _e: ("raise", ErrorInfo("disk unavailable")), times=1)
    s.followup("first")
    s.followup("second")
    s.run()
    assert len(s.requests) == 2 and len(s.effects("flush")) == 2
    assert s.errors() == [(1, 1, "disk unavailable")]
    assert s.warned("session flush failed at turn 1: disk unavailable")
    assert s.live_tokens("agent/settled") == ["settled(1,completed)", "settled(2,completed)"]
    assert s.reasons() == ["completed", "completed"]
    s.check()


def test_F10_max_tokens_in_a_single_step__R14() -> None:
    s = Scenario(reply_text("truncat", finish="max-tokens"))
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; 'truncat') "
                        "SE(1.1) TE(1, max-tokens)")
    assert len(s.requests) == 1 and len(s.effects("turn-stopping")) == 1
    assert s.live_tokens("agent/settled") == ["settled(1,completed)"]
    s.check()


def test_F12_max_tokens_never_dispatches_truncated_tool_calls__R14_1() -> None:
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
    assert (am.data["turn"], am.data["step"], am.data["usage"]) == (1, 1, usage)
    assert am.data["message"]["content"] == []
    s.check()


def test_F12_variant_text_before_a_truncated_call_is_kept__R14_1() -> None:
    s = Scenario([{"type": "text", "text": "partial"},
                  {"type": "tool-call", "id": "c1", "name": "t", "arguments": "{"},
                  {"type": "finish", "kind": "max-tokens"}])
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; 'partial') SE(1.1) "
                        "TE(1, max-tokens)")
    assert s.of("tool/call") == []
    s.check()


# ---------------------------------------------------------------------------
# G6 / G8 (resume and publication order, as supported by the core)
# ---------------------------------------------------------------------------


def test_G6_resume_continues_numbering_and_reanchors_header__R23_1_R9_6() -> None:
    first = Scenario("one")
    first.followup("first")
    first.run()
    stored = [json.dumps(e.to_json()) for e in first.events]          # persist
    seed = [Event.from_json(json.loads(line)) for line in stored]
    s = Scenario("two", config=CoreConfig(session_start="resume"), log=SessionLog(seed))
    s.followup("second")
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('first') SS(1.1) RH(initial) CH… AM(1.1; 'one') SE(1.1) TE(1, completed) "
        "TS(2, msg:user) UM('second') SS(2.1) RH(resume) CH… AM(2.1; 'two') SE(2.1) TE(2, completed)")
    assert [e.seq for e in s.events] == list(range(len(s.events)))
    assert s.turn_numbers() == [1, 2]
    assert [e.data["reason"] for e in s.of("request/header")] == ["initial", "resume"]
    first_request = first.request_messages(1)
    assert s.request_messages(1)[:len(first_request)] == first_request
    s.check()


def test_G8_publication_order_and_session_start__R23_2() -> None:
    order: list[str] = []
    order.append("setup:start")      # environment setup finishes while the agent is unpublished
    log = SessionLog()
    order.append("setup:end")
    s = Scenario(config=CoreConfig(session_start="resume"), log=log)
    raised: list[BaseException] = []

    def on_session_start(payload: FrozenDict) -> None:
        order.append(f"agent/session-start({payload['source']})")
        try:
            s.cancel("user")
        except Exception as error:  # pragma: no cover - the check is that it does not raise
            raised.append(error)
    s.observe("session/created", lambda _p: order.append("session/created"))
    s.observe("agent/created",
              lambda p: order.append(f"agent/created({p['status']},{s.core.status})"))
    s.observe("agent/session-start", on_session_start)
    s.run()
    assert order == ["setup:start", "setup:end", "session/created", "agent/created(idle,idle)",
                     "agent/session-start(resume)"]
    assert raised == []
    assert s.trace(publication=True, effects="*", controls=True) == L(
        "session/created agent/created session-start(resume)")


# ---------------------------------------------------------------------------
# H. Further scenarios derived from the rules
# ---------------------------------------------------------------------------


def test_H6_context_injected_in_turn_stopping_stays_inside_the_turn__R8_5_P10() -> None:
    s = Scenario("x", "y")
    s.handle("turn-stopping", lambda _e: s.inject("stop-time context", "plugin:test"), times=1)
    s.followup("go")
    s.run()
    s.followup("next")
    s.run()
    assert s.log() == L(
        "TS(1, msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1; 'x') SE(1.1) "
        "UM('stop-time context'; plugin:test) TE(1, completed) TS(2, msg:user) UM('next') SS(2.1) CH… "
        "AM(2.1; 'y') SE(2.1) TE(2, completed)")
    assert [r.payload["turn"] for r in s.requests] == [1, 2]
    assert s.request(2) == ["'go'", "'x'", "'stop-time context';plugin:test", "'next'"]
    s.check()


def test_H7_idle_cancel_with_retained_input_reports_both_kinds__R7_10_R16_2_D6() -> None:
    s = Scenario("ok")
    s.hold("prompt-submit")
    s.followup("blocked")
    s.run()
    s.inject("staged context", "plugin:test")
    s.steer("staged steering")
    s.resolve("prompt-submit", {"kind": "block", "reason": "no"})
    assert s.events == [] and s.core.status == "idle"
    assert (s.core.pending_steering, s.core.pending_context) == (1, 1)
    mark = len(s.outputs)
    s.cancel("user")
    s.run()
    assert s.trace(since=mark) == L("cancel-req(user) disc[staged steering] ctxdisc[staged context]")
    s.unhandle("prompt-submit")
    s.followup("later")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('later') SS(1.1) RH(initial) CH… AM(1.1; 'ok') SE(1.1) "
                        "TE(1, completed)")
    s.check()


def test_H7_variant_context_only_retained_after_failed_turn__R11_3_R16_2_D6() -> None:
    s = Scenario()

    def step(_e: object) -> object:
        s.inject("retained context", "plugin:test")
        return ("raise", ErrorInfo("step failed"))
    s.handle("step", step, times=1)
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1, msg:user) UM('go') TE(1, error{step:1, message:'step failed'})")
    assert s.core.pending_context == 1 and s.core.status == "idle"
    mark = len(s.outputs)
    s.cancel("user")
    s.run()
    assert s.trace(since=mark) == L("cancel-req(user) ctxdisc[retained context]")
    s.check()


def test_H9_invalid_context_during_tool_batch_refused_at_the_call__R5_1_D5() -> None:
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
    assert [e for e in s.of("user/message") if e.data["source"]["kind"] == "plugin"] == []
    assert s.live("agent/error") == [] and len(s.requests) == 2
    s.check()
