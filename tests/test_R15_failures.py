"""R15, failure classification (specs/core.md §15): R15.1 a failure while the controller is
aborted, R15.2 a request failure, R15.3 any other failure (its code and its step), R15.4 the
errors the core builds.

The failures themselves are tested with the rules that raise them (tests/test_R9_step.py,
tests/test_R10_tools.py, tests/test_protocol.py); here each class is pinned once. Each test
drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the same inputs
through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from scenario_helpers import Scenario, both, scenario

from machine.checking.scripted import calls_reply, model_failure
from machine.jsonvalue import JsonLike, thaw
from machine.vocabulary import ErrorInfo, LlmFailure


def turn_end_reason(s: Scenario) -> JsonLike:
    (end,) = s.of("turn/end")
    return thaw(end.data["reason"])


def settle_reason(s: Scenario) -> JsonLike:
    (settled,) = s.live("agent/settled")
    return thaw(settled["reason"])


# --------------------------------------------------------------------------
# R15.1 any failure while the controller is aborted
# --------------------------------------------------------------------------


@both
@pytest.mark.parametrize(("cancels", "recorded"), [
    (["user"], {"kind": "aborted"}),
    (["disposed"], {"kind": "disposed"}),
    (["user", "disposed"], {"kind": "aborted"}),      # the controller's first cause counts
])
def test_R15_1_a_failure_classified_while_aborted_ends_the_turn_aborted_or_disposed_without_error(
        impl: str, cancels: list[str], recorded: JsonLike) -> None:
    s = scenario(impl)
    s.hold("model")
    s.followup("go")
    s.run()
    model = s.take("model")
    for cause in cancels:
        if cause == "disposed":
            s.dispose()
        else:
            s.cancel(cause)
    s.core.fail(model.id, model_failure("overloaded", "E_BUSY"))   # a request failure, even
    s.run()
    assert turn_end_reason(s) == recorded
    assert s.live("agent/error") == [] and s.effects("request-error") == []
    assert settle_reason(s) == {"kind": "aborted"}


# --------------------------------------------------------------------------
# R15.2 a request failure
# --------------------------------------------------------------------------


@both
def test_R15_2_a_request_failure_records_its_failure_with_the_rendered_text_as_message(
        impl: str) -> None:
    failure = LlmFailure.from_json({"message": "provider busy", "code": "E_BUSY", "status": 503})
    error = ErrorInfo("overloaded", "ModelError", "E_BUSY", causes=("socket reset",),
                      failure=failure)
    s = scenario(impl, calls_reply(("c1", "t")), error)
    s.followup("go")
    s.run()
    recorded = {"message": "overloaded: socket reset", "code": "E_BUSY", "status": 503}
    assert turn_end_reason(s) == {"kind": "error", "step": 2, "failure": recorded}
    (reported,) = s.live("agent/error")
    assert (reported["turn"], reported["step"]) == (1, 2)
    assert thaw(reported["error"]) == error.to_json()
    assert settle_reason(s) == {"kind": "error", "error": error.to_json(), "failure": recorded}


# --------------------------------------------------------------------------
# R15.3 any other failure: its code and its step
# --------------------------------------------------------------------------


@both
@pytest.mark.parametrize(("error", "reason"), [
    (ErrorInfo("hook broke", "HookError", "E_HOOK", causes=("inner",)),
     {"message": "hook broke: inner", "code": "E_HOOK"}),     # the error's own code
    (ErrorInfo("hook broke", "HookError"), {"message": "hook broke"}),   # uncoded: none
])
def test_R15_3_a_generic_failure_records_the_rendered_text_and_the_errors_own_code(
        impl: str, error: ErrorInfo, reason: dict[str, JsonLike]) -> None:
    s = scenario(impl)
    s.handle("system-prompt", lambda _e: ("raise", error))
    s.followup("go")
    s.run()
    assert turn_end_reason(s) == {"kind": "error", "step": 1, **reason}
    (reported,) = s.live("agent/error")
    assert thaw(reported["error"]) == error.to_json()
    assert settle_reason(s) == {"kind": "error", "error": error.to_json()}


@both
def test_R15_3_a_value_the_core_rejected_records_the_cores_code(impl: str) -> None:
    s = scenario(impl, [{"type": "text", "text": 7}])
    s.followup("go")
    s.run()
    reason = turn_end_reason(s)
    assert isinstance(reason, dict) and reason["code"] == "INVALID_CHUNK" and reason["step"] == 1
    assert "failure" not in reason


@both
@pytest.mark.parametrize("kind", ["step", "system-prompt", "turn-stopping"])
def test_R15_3_the_step_is_the_step_counter_at_the_failure(impl: str, kind: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), "done")
    # step 2's {step} or {system-prompt}, or turn-stopping after step 2
    s.handle(kind, lambda _e: ("raise", ErrorInfo("boom")),
             when=lambda e: kind == "turn-stopping" or e.payload["step"] == 2)
    s.followup("go")
    s.run()
    assert turn_end_reason(s) == {"kind": "error", "step": 2, "message": "boom"}
    assert [(turn, step) for turn, step, _ in s.errors()] == [(1, 2)]


# --------------------------------------------------------------------------
# R15.4 errors the core builds
# --------------------------------------------------------------------------


@both
@pytest.mark.parametrize(("case", "name", "code"), [
    ("chunk", "InvalidChunkError", "INVALID_CHUNK"),
    ("tool result", "InvalidToolResultError", "INVALID_TOOL_RESULT"),
    ("header", "RequestConfigError", "INVALID_REQUEST_CONFIG"),
    ("system prompt", "InvalidSystemPromptError", "INVALID_SYSTEM_PROMPT"),
    ("finish", "ModelRequestError", "E_FINISH"),
    ("missing model", "Error", None),
])
def test_R15_4_the_core_names_and_codes_the_errors_it_builds(
        impl: str, case: str, name: str, code: str | None) -> None:
    replies: dict[str, Sequence[JsonLike]] = {
        "chunk": [{"type": "ping"}],
        "tool result": calls_reply(("c1", "t")),
        "finish": [{"type": "finish", "kind": "error",
                    "failure": {"message": "refused", "code": "E_FINISH"}}],
    }
    s = scenario(impl, replies.get(case, "ok"))
    if case == "tool result":
        s.handle("tool-execute", lambda _e: ("resolve", {"content": "not a list"}))
    elif case == "header":
        s.handle("request", lambda _e: ("resolve", {"config": {"provider": "p", "model": 4}}))
    elif case == "system prompt":
        s.handle("system-prompt", lambda _e: ("resolve", {"x": float("inf")}))
    elif case == "missing model":
        s.handle("request", lambda _e: ("resolve", {"config": {"provider": "p", "model": ""}}))
    s.followup("go")
    s.run()
    (reported,) = s.live("agent/error")
    error = thaw(reported["error"])
    assert error["name"] == name and error.get("code") == code
    assert isinstance(error["message"], str) and error["message"]
    if case == "finish":
        assert error["message"] == "refused" and error["failure"] == {
            "message": "refused", "code": "E_FINISH"}
