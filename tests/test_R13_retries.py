"""R13, request errors and retries (specs/core.md §13): R13.1 what a request failure is, R13.2
the order of recovery, R13.3 the retry run, R13.4 the reset of the failure history, R13.5
cancelling a retry.

Each test drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the
same inputs through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from scenario_helpers import RETRY, L, Scenario, both, reason_kinds, scenario, tokens

from machine.checking.scripted import calls_reply, model_failure
from machine.io import Effect
from machine.jsonvalue import JsonLike, thaw
from machine.vocabulary import ErrorInfo


def prior_failures(s: Scenario) -> list[list[str]]:
    return [[str(f["code"]) for f in thaw(e.payload["priorFailures"])]
            for e in s.effects("request-error")]


# --------------------------------------------------------------------------
# R13.1 request failures
# --------------------------------------------------------------------------

FAILURE = {"message": "overloaded", "code": "E_BUSY"}


@both
@pytest.mark.parametrize(("case", "offered"), [
    ("model raise with failure", True),
    ("finish error", True),
    ("finish aborted", True),
    ("model raise without failure", False),
    ("request raise", False),
    ("bad header", False),
    ("bad chunk", False),
    ("end before finish", False),
    ("invalid tool result", False),
    ("step raise", False),
])
def test_R13_1_only_a_final_model_failure_is_offered_to_recovery(
        impl: str, case: str, offered: bool) -> None:
    replies: dict[str, Sequence[JsonLike] | ErrorInfo] = {
        "model raise with failure": model_failure("overloaded", "E_BUSY"),
        "finish error": [{"type": "finish", "kind": "error", "failure": FAILURE}],
        "finish aborted": [{"type": "finish", "kind": "aborted"}],
        "model raise without failure": ErrorInfo("socket closed", "NetError", "E_NET"),
        "bad chunk": [{"type": "ping"}],
        "end before finish": [{"type": "text", "text": "cut"}],
        "invalid tool result": calls_reply(("c1", "t")),
    }
    s = scenario(impl, replies.get(case, "ok"))
    if case == "request raise":
        s.handle("request", lambda _e: ("raise", ErrorInfo("no", code="E_REQ")))
    elif case == "bad header":
        s.handle("request", lambda _e: ("resolve", {"config": {"provider": 1, "model": "m"}}))
    elif case == "invalid tool result":
        s.handle("tool-execute", lambda _e: ("resolve", {"content": "not a list"}))
    elif case == "step raise":
        s.handle("step", lambda _e: ("raise", ErrorInfo("no")))
    s.followup("go")
    s.run()
    assert len(s.effects("request-error")) == (1 if offered else 0)
    (end,) = s.of("turn/end")
    assert ("failure" in thaw(end.data["reason"])) is offered


# --------------------------------------------------------------------------
# R13.2 order
# --------------------------------------------------------------------------


@both
def test_R13_2_step_end_then_recovery_then_the_error_then_the_close(impl: str) -> None:
    s = scenario(impl, model_failure("overloaded", "E_BUSY"))
    latest: list[str] = []

    def recover(_e: Effect) -> None:
        latest.append(s.core.log.events[-1].type)
    s.handle("request-error", recover)
    s.followup("go")
    s.run()
    trace = [t for t in tokens(s) if t.startswith(("[SE", "⟨request-error", "error(", "[TE", "flush"))]
    assert trace == ["[SE(1.1)]", "⟨request-error 1.1⟩", "error(1,1,'overloaded')",
                     "[TE(1,error)]", "flush(1)"]
    assert latest == ["step/end"]
    (effect,) = s.effects("request-error")
    payload = thaw(effect.payload)
    assert payload["failure"] == FAILURE and payload["priorFailures"] == []
    assert "retryPolicy" not in payload           # the request's preparation named none (R9.6)
    assert payload["error"] == {"name": "ModelError", "message": "overloaded", "code": "E_BUSY",
                                "failure": FAILURE}
    assert (payload["turn"], payload["step"], payload["signal"]) == (1, 1, 2)


POLICY = {"mode": "normal", "maxRetries": 2, "retryableCodes": ["E_BUSY"]}
CONFIG = {"provider": "p", "model": "m"}


@both
def test_R13_2_recovery_gets_the_retry_policy_of_the_request_that_failed(impl: str) -> None:
    # Each request's preparation may name its retry policy (R9.6); recovery gets the one of
    # the request that failed as it was given (null included), and none after a request
    # whose preparation named none.
    s = scenario(impl, model_failure("overloaded", "E_BUSY"), model_failure("again", "E_BUSY"),
                 [{"type": "finish", "kind": "error", "failure": FAILURE}])
    named: list[dict[str, JsonLike]] = [{"retryPolicy": POLICY}, {"retryPolicy": None}, {}]
    prepared: list[int] = []

    def prepare(effect: Effect) -> tuple[str, JsonLike]:
        extra = named[len(prepared)]
        prepared.append(effect.id)
        return ("resolve", {"config": thaw(effect.payload["config"]) or CONFIG, **extra})
    s.handle("request", prepare)
    s.handle("request-error", lambda _e: ("resolve", {"kind": "retry"}), times=2)
    s.followup("go")
    s.run()
    assert len(prepared) == 3
    assert [{k: v for k, v in thaw(e.payload).items() if k == "retryPolicy"}
            for e in s.effects("request-error")] == named
    # the policy is the request's, not the header's: no logged header carries it
    assert all("retryPolicy" not in thaw(e.data["header"]) for e in s.of("request/header"))
    assert all("retryPolicy" not in thaw(e.payload["header"]) for e in s.effects("model"))


@both
@pytest.mark.parametrize(("answer", "retried", "warning"), [
    (("resolve", {"kind": "retry"}), True, None),
    (("resolve", {"kind": "retry", "delay": 1}), False, None),
    (("resolve", "retry"), False, None),
    (("resolve", {"kind": "give-up"}), False, None),
    (("resolve", None), False, None),
    (("raise", ErrorInfo("hook broke", causes=("inner",))), False,
     "request recovery failed: hook broke: inner"),
])
def test_R13_2_exactly_kind_retry_authorizes_a_retry_and_a_raise_warns(
        impl: str, answer: tuple[str, JsonLike], retried: bool, warning: str | None) -> None:
    s = scenario(impl, model_failure("overloaded", "E_BUSY"), "recovered")
    s.handle("request-error", lambda _e: answer, times=1)
    s.followup("go")
    s.run()
    assert s.turn_numbers() == ([1, 2] if retried else [1])
    assert s.warnings() == ([] if warning is None else [warning])
    assert len(s.live("agent/error")) == 1


# --------------------------------------------------------------------------
# R13.3 retry run
# --------------------------------------------------------------------------


@both
def test_R13_3_the_retry_run_writes_retained_steering_under_its_own_turn_and_sees_the_failure(
        impl: str) -> None:
    s = scenario(impl, model_failure("first", "E1"), model_failure("second", "E2"))

    def recover(effect: Effect) -> object:
        if effect.payload["turn"] == 1:
            s.steer("retained steer")             # staged, retained past the failed turn
            return RETRY
        return None
    s.handle("request-error", recover)
    s.followup("go")
    s.run()
    log = s.log()
    assert log[log.index("TE(1,error)") + 1:][:3] == L("TS(2,retry) STM(2;'retained steer';user) "
                                                       "SS(2.1)")
    assert prior_failures(s) == [[], ["E1"]]
    trace = tokens(s)
    between = trace[trace.index("[TE(1,error)]") + 1:trace.index("[TS(2,retry)]")]
    assert between == ["flush(1)"]                 # neither agent/settled nor a status output
    assert s.live_tokens("agent/inbox/dequeue")[-1] == "deq(retained steer,s)"


@both
def test_R13_3_the_retry_run_drains_everything_retained_at_once_even_if_cancelled_meanwhile(
        impl: str) -> None:
    """R13.3 with R11.2: the retry run inherits nothing (``inherited`` 0), so the drain after
    its ``turn/start`` takes every retained item to a fixed point; a keepInbox cancel at the
    first one's dequeue leaves the rest staged (R16.2), and the same drain writes them."""
    s = scenario(impl, model_failure("first", "E1"), "never")

    def recover(effect: Effect) -> object:
        if effect.payload["turn"] == 1:
            s.steer("s1")
            s.steer("s2")
            return RETRY
        return None
    s.handle("request-error", recover)
    s.observe("agent/inbox/dequeue", lambda data: s.cancel(keep_inbox=True)
              if thaw(data["message"])["content"][0]["text"] == "s1" else None)
    s.followup("go")
    s.run()
    log = s.log()
    assert log[log.index("TS(2,retry)") + 1:][:2] == L("STM(2;'s1';user) STM(2;'s2';user)")
    assert reason_kinds(s) == ["error", "aborted"]


# --------------------------------------------------------------------------
# R13.4 history reset
# --------------------------------------------------------------------------


@both
def test_R13_4_failures_accumulate_along_a_chain_until_a_step_completes(impl: str) -> None:
    s = scenario(impl, model_failure("first", "E1"), model_failure("second", "E2"),
                 calls_reply(("c1", "t")), model_failure("third", "E3"))
    s.handle("request-error", lambda _e: RETRY, times=2)
    s.followup("go")
    s.run()
    assert prior_failures(s) == [[], ["E1"], []]   # turn 3's completed step 1 emptied it
    assert [e.payload["step"] for e in s.effects("request-error")] == [1, 1, 2]


@both
def test_R13_4_an_admitted_run_starts_with_an_empty_history(impl: str) -> None:
    s = scenario(impl, model_failure("first", "E1"), model_failure("second", "E2"))
    s.followup("one")
    s.followup("two")
    s.run()
    assert prior_failures(s) == [[], []]


# --------------------------------------------------------------------------
# R13.5 cancelling a retry
# --------------------------------------------------------------------------


@both
def test_R13_5_a_cancel_while_recovery_is_outstanding_makes_the_turn_aborted_and_no_retry(
        impl: str) -> None:
    s = scenario(impl, model_failure("overloaded", "E_BUSY"), "never")
    s.hold("request-error")
    s.followup("go")
    s.run()
    s.cancel()
    s.resolve("request-error", {"kind": "retry"})
    assert s.turn_numbers() == [1] and reason_kinds(s) == ["aborted"]
    assert s.live("agent/error") == []
    assert s.live_tokens("agent/settled") == ["settled(1,aborted)"]


@both
@pytest.mark.parametrize("moment", ["agent/error", "turn/end"])
def test_R13_5_a_cancel_after_recovery_drops_the_retry_and_keeps_the_error(
        impl: str, moment: str) -> None:
    s = scenario(impl, model_failure("overloaded", "E_BUSY"), "never")
    s.handle("request-error", lambda _e: RETRY)
    s.observe(moment, lambda _d: s.cancel(), once=True)
    s.followup("go")
    s.run()
    assert s.turn_numbers() == [1] and reason_kinds(s) == ["error"]
    (settled,) = s.live("agent/settled")
    reason = thaw(settled["reason"])
    assert set(reason) == {"kind", "error", "failure"} and reason["failure"] == FAILURE


@both
def test_R13_2_R15_1_a_model_failure_after_a_cancel_goes_to_no_recovery(impl: str) -> None:
    """R13.2 with R15.1: when a final model failure arrives after the run's signal was
    aborted, the step ends, no request-error is requested (recovery is for a live run), no
    retry can follow, and the turn and its settlement say aborted."""
    s = scenario(impl)

    def cancel_then_fail(_effect: Effect) -> ErrorInfo:
        s.cancel("user")
        return model_failure("overloaded", "E_BUSY")
    s.handle("model", cancel_then_fail)
    s.followup("go")
    s.run()
    assert s.effects("request-error") == []
    assert [e.type for e in s.core.log][-2:] == ["step/end", "turn/end"]
    assert thaw(s.of("turn/end")[0].data["reason"]) == {"kind": "aborted"}
    assert [thaw(r["reason"]) for r in s.live("agent/settled")] == [{"kind": "aborted"}]
    assert not s.core.retry_pending and s.live("agent/error") == []
