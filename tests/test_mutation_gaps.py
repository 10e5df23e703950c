"""Tests added to kill surviving mutants (specs/ASSURANCE.md, "Mutation score").

Each test asserts behaviour the specification states (specs/core.md, protocol.md,
log.md, vocabulary.md) and is named after the rule it checks. They complement the
scenario and unit tests where mutation testing showed that a rule was exercised but
its outcome was not asserted, or not exercised at all.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scenario_helpers import L, Scenario, msg

from machine.core import AgentCore, CoreConfig
from machine.errors import CodecError, InvariantError, ProtocolError, ValidationError
from machine.events import Event, LiveEvent
from machine.invariants import AgentInvariantError, InvariantMonitor
from machine.io import Control, Live
from machine.jsonvalue import FrozenDict, canonical_json, freeze, same_json, thaw
from machine.log import SessionLog
from machine.scripted import HOLD, calls_reply, ok_result
from machine.strategies import json_values
from machine.vocabulary import (
    ErrorInfo,
    LlmFailure,
    SettleReason,
    ToolResult,
    custom_source,
    model_source,
    plugin_source,
    register_block_type,
    register_source_kind,
    tool_result_message,
    tool_source,
    user_source,
)

TOOL_ERROR = ErrorInfo("tool exploded", "ToolError", "E_TOOL")


def _tool_scenario(*calls: tuple[str, str] | tuple[str, str, str], modes: dict[str, str] | None = None,
                   max_parallel: int = 10, then: str = "done") -> Scenario:
    config = CoreConfig(tool_modes=dict(modes or {}), max_parallel_tool_calls=max_parallel)  # type: ignore[arg-type]
    return Scenario(calls_reply(*calls), then, config=config)


def _reason(s: Scenario) -> dict[str, object]:
    (turn_end,) = s.of("turn/end")
    return thaw(turn_end.data["reason"])  # type: ignore[return-value]


def _call_ids(s: Scenario, type_: str) -> list[str]:
    if type_ == "tool/call":
        return [str(e.data["callId"]) for e in s.of("tool/call")]
    return [str(e.data["message"]["content"][0]["toolCallId"]) for e in s.of(type_)]  # type: ignore[index]


# --------------------------------------------------------------------------
# R10.1 planned arguments
# --------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "planned"), [
    ("", {}),
    ('{"path": "a.txt", "n": [1, 2]}', {"path": "a.txt", "n": [1, 2]}),
    ("[1, 2]", [1, 2]),
    ("not json", "not json"),
    ("NaN", "NaN"),
])
def test_R10_1_tool_call_and_stage_requests_carry_the_planned_arguments(raw: str, planned: object) -> None:
    s = _tool_scenario(("c1", "t", raw))
    s.followup("go")
    s.run()
    (call,) = s.of("tool/call")
    assert thaw(call.data["arguments"]) == planned
    for kind in ("tool-prepare", "tool-execute", "tool-finalize"):
        (effect,) = s.effects(kind)
        assert thaw(effect.payload["arguments"]) == planned
    s.check()


# --------------------------------------------------------------------------
# R10.3 / R10.9 stage failures
# --------------------------------------------------------------------------


def _result_text(s: Scenario, index: int) -> object:
    return thaw(s.of("tool/result")[index].data["message"]["content"][0]["content"])  # type: ignore[index]


def test_R10_12_a_raising_prepare_is_the_calls_final_error_result() -> None:
    s = _tool_scenario(("c1", "t"), ("c2", "t"))
    s.handle("tool-prepare", lambda e: ("raise", TOOL_ERROR) if e.payload["callId"] == "c1" else None)
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1+call c2) "
                        "TC(1.1;c1) TR(1.1;c1;ERR E_TOOL) TC(1.1;c2) TR(1.1;c2;ok) SE(1.1) SS(1.2) "
                        "CH… AM(1.2;'done') SE(1.2) TE(1,completed)")
    assert _result_text(s, 0) == [{"type": "text", "text": "Error: tool exploded"}]
    assert thaw(s.of("tool/result")[0].data["error"]) == {"name": "ToolError", "code": "E_TOOL"}
    # neither execute nor finalize runs for the call whose prepare raised
    assert [e.payload["callId"] for e in s.effects("tool-execute")] == ["c2"]
    assert [e.payload["callId"] for e in s.effects("tool-finalize")] == ["c2"]
    assert s.errors() == []
    s.check()


def test_R10_9_prepare_invalid_final_result_fails_with_INVALID_TOOL_RESULT() -> None:
    s = _tool_scenario(("c1", "t"))
    s.handle("tool-prepare", lambda _e: ("resolve", {"content": "not a list"}))
    s.followup("go")
    s.run()
    reason = _reason(s)
    assert reason["kind"] == "error" and reason["step"] == 1
    assert reason["code"] == "INVALID_TOOL_RESULT"
    assert str(reason["message"]).startswith("invalid tool result: ")
    assert "content" in str(reason["message"])
    assert _call_ids(s, "tool/result") == []
    assert s.effects("tool-execute") == []
    (error,) = s.live("agent/error")
    assert thaw(error["error"])["name"] == "InvalidToolResultError"
    assert thaw(error["error"])["code"] == "INVALID_TOOL_RESULT"
    s.check()


def test_R10_3_prepare_final_result_is_committed_without_execute_or_finalize() -> None:
    s = _tool_scenario(("c1", "t"))
    s.handle("tool-prepare", lambda _e: ("resolve", ok_result("from prepare")))
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) "
                        "TC(1.1;c1) TR(1.1;c1;ok) SE(1.1) SS(1.2) CH… AM(1.2;'done') SE(1.2) "
                        "TE(1,completed)")
    (result,) = s.of("tool/result")
    assert thaw(result.data["message"]["content"][0]["content"]) == [  # type: ignore[index]
        {"type": "text", "text": "from prepare"}]
    assert s.effects("tool-execute") == [] and s.effects("tool-finalize") == []
    s.check()


def test_R10_12_a_raising_body_is_an_error_result_that_finalize_sees() -> None:
    uncoded = ErrorInfo("no such file", "OSError", causes=("ENOENT",))
    s = _tool_scenario(("c1", "t"), ("c2", "t"))
    s.handle("tool-execute", lambda e: ("raise", TOOL_ERROR if e.payload["callId"] == "c1"
                                        else uncoded))
    s.followup("go")
    s.run()
    assert _reason(s) == {"kind": "completed"}
    assert _call_ids(s, "tool/result") == ["c1", "c2"]
    finalized = [thaw(e.payload["result"]) for e in s.effects("tool-finalize")]
    assert finalized == [
        {"content": [{"type": "text", "text": "Error: tool exploded"}], "isError": True,
         "error": {"name": "ToolError", "code": "E_TOOL"}},
        # an uncoded error has no error field, and its causes are not in the text
        {"content": [{"type": "text", "text": "Error: no such file"}], "isError": True}]
    assert "error" not in s.of("tool/result")[1].data
    s.check()


def test_R10_12_a_raising_finalize_replaces_the_result_and_the_batch_goes_on() -> None:
    s = _tool_scenario(("c1", "t"), ("c2", "t"), modes={"t": "parallel"})
    s.handle("tool-finalize", lambda _e: ("raise", TOOL_ERROR), when=lambda e: e.payload["callId"] == "c1")
    s.followup("go")
    s.run()
    assert _reason(s) == {"kind": "completed"}
    assert _call_ids(s, "tool/call") == ["c1", "c2"]
    assert _call_ids(s, "tool/result") == ["c1", "c2"]
    assert _result_text(s, 0) == [{"type": "text", "text": "Error: tool exploded"}]
    assert [e.payload["callId"] for e in s.effects("tool-finalize")] == ["c1", "c2"]
    s.check()


def test_R10_9_finalize_invalid_result_fails_with_INVALID_TOOL_RESULT_after_earlier_results() -> None:
    s = _tool_scenario(("c1", "t"), ("c2", "t"), ("c3", "t"))
    s.handle("tool-finalize", lambda _e: ("resolve", {"content": [], "isError": "yes"}),
             when=lambda e: e.payload["callId"] == "c2")
    s.followup("go")
    s.run()
    reason = _reason(s)
    assert reason["code"] == "INVALID_TOOL_RESULT" and reason["step"] == 1
    assert str(reason["message"]).startswith("invalid tool result: ")
    assert "isError" in str(reason["message"])
    assert _call_ids(s, "tool/call") == ["c1", "c2"]
    assert _call_ids(s, "tool/result") == ["c1"]
    s.check()


def test_R10_9_a_failed_settlement_in_a_pool_starts_nothing_more() -> None:
    s = _tool_scenario(("c1", "t"), ("c2", "t"), ("c3", "t"), modes={"t": "parallel"}, max_parallel=2)
    answers = {"c1": HOLD, "c2": ("resolve", {"content": "not a list"})}
    s.handle("tool-execute", lambda e: answers.get(str(e.payload["callId"])), times=2)
    s.followup("go")
    s.run()
    # c2 failed while c1 is still executing: c3 must not start (R10.9 "nothing more starts")
    assert _call_ids(s, "tool/call") == ["c1", "c2"]
    s.resolve("tool-execute", ok_result("c1 done"))
    assert _call_ids(s, "tool/call") == ["c1", "c2"]
    assert _call_ids(s, "tool/result") == ["c1"]
    assert _reason(s)["code"] == "INVALID_TOOL_RESULT"
    s.check()


def test_R10_9_prepare_failure_inside_a_parallel_pool_ends_the_batch() -> None:
    s = _tool_scenario(("c1", "t"), ("c2", "t"), ("c3", "t"), modes={"t": "parallel"})
    s.handle("tool-prepare", lambda e: ("resolve", {"content": "not a list"})
             if e.payload["callId"] == "c2" else None)
    s.followup("go")
    s.run()
    assert _call_ids(s, "tool/call") == ["c1", "c2"]
    assert _call_ids(s, "tool/result") == ["c1"]
    assert _reason(s)["code"] == "INVALID_TOOL_RESULT"
    s.check()


# --------------------------------------------------------------------------
# R10.2 groups and the pool limit
# --------------------------------------------------------------------------


def test_R10_2_a_pool_never_has_more_than_the_limit_in_flight() -> None:
    s = _tool_scenario(("c1", "p"), ("c2", "p"), ("c3", "p"), modes={"p": "parallel"}, max_parallel=2)
    s.hold("tool-execute", times=None)
    s.followup("go")
    s.run()
    assert [e.payload["callId"] for e in s.effects("tool-execute")] == ["c1", "c2"]
    s.resolve("tool-execute", ok_result("one"))          # c1 settles: c3 may start
    assert [e.payload["callId"] for e in s.effects("tool-execute")] == ["c1", "c2", "c3"]
    s.resolve("tool-execute", ok_result("two"))
    s.resolve("tool-execute", ok_result("three"))
    assert _call_ids(s, "tool/result") == ["c1", "c2", "c3"]
    s.check()


def test_R10_2_a_parallel_pool_followed_by_an_exclusive_call() -> None:
    s = _tool_scenario(("c1", "p"), ("c2", "p"), ("c3", "x"), modes={"p": "parallel"})
    s.hold("tool-execute", times=None)
    s.followup("go")
    s.run()
    # the pool runs c1 and c2 together; the exclusive c3 waits for both results
    assert [e.payload["callId"] for e in s.effects("tool-execute")] == ["c1", "c2"]
    s.resolve("tool-execute", ok_result("one"))
    s.resolve("tool-execute", ok_result("two"))
    assert [e.payload["callId"] for e in s.effects("tool-execute")] == ["c1", "c2", "c3"]
    assert _call_ids(s, "tool/result") == ["c1", "c2"]
    s.resolve("tool-execute", ok_result("three"))
    assert _call_ids(s, "tool/result") == ["c1", "c2", "c3"]
    assert s.log()[-1] == "TE(1,completed)"
    s.check()


# --------------------------------------------------------------------------
# R10.4 the tool/result record
# --------------------------------------------------------------------------


def test_R10_4_tool_result_carries_error_and_meta_of_the_result() -> None:
    s = _tool_scenario(("c1", "t"))
    s.handle("tool-execute", lambda _e: ("resolve", {
        "content": [{"type": "text", "text": "bad input"}], "isError": True,
        "error": {"name": "UsageError", "detail": "x"}, "meta": {"ms": 12}}))
    s.followup("go")
    s.run()
    (result,) = s.of("tool/result")
    assert thaw(result.data["error"]) == {"name": "UsageError", "detail": "x"}
    assert thaw(result.data["meta"]) == {"ms": 12}
    assert result.data["message"]["content"][0]["isError"] is True  # type: ignore[index]
    s.check()


# --------------------------------------------------------------------------
# P9 / R20.2 direct appends; P10 protocol errors; drain_outputs
# --------------------------------------------------------------------------


def test_R20_2_direct_append_keeps_its_source_event_seqs() -> None:
    core = AgentCore(CoreConfig(publish=False))
    core.append("user/message", msg("first"), surface_op="append")
    event = core.append("user/message", msg("second"), surface_op="append", source_event_seqs=[0])
    assert event.source_event_seqs == (0,)
    assert core.log.events[1].source_event_seqs == (0,)


def test_P10_a_completion_of_a_released_model_stream_is_refused() -> None:
    s = Scenario()
    s.hold("model")
    s.followup("go")
    s.run()
    model = s.take("model")
    s.core.chunk(model.id, {"type": "text"})           # invalid chunk: the stream is released
    s.run()
    assert "release" in [o.kind for o in s.outputs if isinstance(o, Control)]
    with pytest.raises(ProtocolError, match=r"already completed|released"):
        s.core.chunk(model.id, {"type": "text", "text": "late"})
    with pytest.raises(ProtocolError, match=r"already completed|released"):
        s.core.end(model.id)


def test_P1_drain_outputs_pulls_everything_available_in_order() -> None:
    core = AgentCore()
    outputs = core.drain_outputs()
    assert [o.event.type for o in outputs] == [  # type: ignore[union-attr]
        "session/created", "agent/created", "agent/session-start"]
    assert core.drain_outputs() == []
    core.followup(msg("hi"))
    kinds = [type(o).__name__ for o in core.drain_outputs()]
    assert kinds == ["Effect", "Live"]


# --------------------------------------------------------------------------
# §V vocabulary
# --------------------------------------------------------------------------


@pytest.mark.parametrize(("build", "path"), [
    (lambda: user_source(x=float("nan")), "source.x"),
    (lambda: plugin_source(5), "source"),  # type: ignore[arg-type]
    (lambda: model_source(1, "m"), "source"),  # type: ignore[arg-type]
    (lambda: tool_source(""), "source"),
    (lambda: custom_source("ext", x={1: 2}), "source.x"),
])
def test_V4_V8_source_constructors_name_the_offending_field(build: Any, path: str) -> None:
    with pytest.raises(ValidationError) as caught:
        build()
    assert caught.value.path == path
    assert str(caught.value) == f"{path}: {caught.value.problem}"


def test_V5_tool_result_message_is_not_an_error_by_default() -> None:
    message = tool_result_message("r1", "c1", [{"type": "text", "text": "x"}])
    (block,) = message.to_json()["content"]  # type: ignore[misc]
    assert "isError" not in block
    flagged = tool_result_message("r2", "c1", [], is_error=True)
    assert flagged.to_json()["content"][0]["isError"] is True  # type: ignore[index]


@pytest.mark.parametrize("register", [register_block_type, register_source_kind])
def test_V3_V4_V8_registration_errors_name_the_argument(register: Any) -> None:
    argument = "type_name" if register is register_block_type else "kind"
    core_name = "text" if register is register_block_type else "user"
    for bad in ("", 5):
        with pytest.raises(ValidationError) as caught:
            register(bad)
        assert caught.value.path == argument
        assert caught.value.problem == "must be a non-empty string"
    with pytest.raises(ValidationError) as caught:
        register(core_name)
    assert caught.value.path == argument
    assert core_name in caught.value.problem and "core" in caught.value.problem


def test_V15_from_exception_cuts_a_cause_cycle_that_does_not_reach_the_top() -> None:
    top, a, b = RuntimeError("top"), ValueError("a"), KeyError("b")
    top.__cause__ = a
    a.__cause__ = b
    b.__cause__ = a
    info = ErrorInfo.from_exception(top)
    assert info.causes == ("a", "'b'")
    assert info.rendered() == "top: a: 'b'"


def test_V15_from_exception_ignores_a_failure_attribute_that_is_not_an_LlmFailure() -> None:
    error = RuntimeError("boom")
    error.failure = {"message": "m", "code": "C"}  # type: ignore[attr-defined]
    assert ErrorInfo.from_exception(error).failure is None
    failure = LlmFailure("m", "C")
    error.failure = failure  # type: ignore[attr-defined]
    assert ErrorInfo.from_exception(error).failure == failure


def test_V20_V8_settle_reason_decoder_refuses_non_mappings_with_a_validation_error() -> None:
    for bad in ("completed", None, 3, ["kind"]):
        with pytest.raises(ValidationError):
            SettleReason.from_json(bad)  # type: ignore[arg-type]


def test_V20_V8_settle_reason_errors_are_rebased_onto_the_callers_path() -> None:
    with pytest.raises(ValidationError) as caught:
        SettleReason.from_json({"kind": "error", "error": {"name": "E", "message": 5}}, "payload.reason")
    assert caught.value.path.startswith("payload.reason.error")
    with pytest.raises(ValidationError) as caught:
        SettleReason.from_json({"kind": "nope"}, "payload.reason")
    assert caught.value.path.startswith("payload.reason")
    with pytest.raises(ValidationError) as caught:
        SettleReason.from_json({"kind": "error", "error": {"name": "E", "message": "m"}, "failure": None})
    assert caught.value.path == "reason.failure"
    assert caught.value.problem == "must be a mapping when present"


# --------------------------------------------------------------------------
# V2 frozen values; E1 codec paths
# --------------------------------------------------------------------------


def test_V2_frozen_list_inequality_with_other_types() -> None:
    frozen = freeze([1, 2])
    assert frozen != 5
    assert frozen != "12"
    assert frozen != (1, 3)
    assert (frozen != [1, 2]) is False
    assert frozen != [1, 3]


def test_E4_event_decoding_problem_is_stated() -> None:
    with pytest.raises(CodecError) as caught:
        Event.from_json({"type": "", "seq": 0, "time": 0, "data": {}}, "line7")
    assert caught.value.path == "line7.type"
    assert caught.value.problem == "must be a non-empty string"
    assert str(caught.value) == "line7.type: must be a non-empty string"


# --------------------------------------------------------------------------
# §L session log
# --------------------------------------------------------------------------


def test_L2_check_applies_the_surface_and_source_rules_of_commit() -> None:
    log = SessionLog()
    log.commit("user/message", msg("first"), surface_op="append")
    with pytest.raises(InvariantError):
        log.check("turn/start", {"turn": 1, "trigger": {"kind": "retry"}}, surface_op="append")
    with pytest.raises(InvariantError):
        log.check("turn/start", {"turn": 1, "trigger": {"kind": "retry"}}, source_event_seqs=[0])
    with pytest.raises(InvariantError):
        log.check("user/message", msg("x"), surface_op={"op": "replace", "start": 3, "end": 9})
    with pytest.raises(InvariantError):
        log.check("user/message", msg("x"), surface_op="append", source_event_seqs=[7])
    log.check("user/message", msg("x"), surface_op="append", source_event_seqs=[0])
    assert len(log.events) == 1   # check is pure


def test_L11_every_observer_receives_each_event_in_registration_order() -> None:
    log = SessionLog()
    seen: list[tuple[str, int]] = []
    unsubscribe = [log.subscribe(lambda e, n=n: seen.append((f"o{n}", e.seq))) for n in range(4)]
    log.append("user/message", msg("a"), surface_op="append")
    assert seen == [("o0", 0), ("o1", 0), ("o2", 0), ("o3", 0)]
    unsubscribe[2]()
    log.append("user/message", msg("b"), surface_op="append")
    assert seen[4:] == [("o0", 1), ("o1", 1), ("o3", 1)]


def test_L13_history_view_compares_by_content() -> None:
    log = SessionLog()
    for text in ("a", "b"):
        log.commit("user/message", msg(text), surface_op="append")
    view = log.history(len(log.events))
    messages = log.derive_messages()
    assert view == messages and view == list(messages)
    assert view != messages[:1] and view != (*messages, messages[0])
    assert view != (messages[1], messages[0])       # same length, other order
    assert view != 5 and view != "ab" and view != b"ab"
    assert log.history(1) == messages[:1]


# --------------------------------------------------------------------------
# R20.1 invariant monitor errors
# --------------------------------------------------------------------------


def test_R20_1b_monitor_error_names_its_rule() -> None:
    core = AgentCore()
    monitor = InvariantMonitor(core, core)
    bogus = Live(LiveEvent("agent/inbox/discard", freeze({"messages": [msg("x")]})))  # type: ignore[arg-type]
    with pytest.raises(AgentInvariantError) as caught:
        monitor.output(bogus)
    assert caught.value.rule == "R20.1b"
    assert str(caught.value).startswith("[R20.1b] ")


# --------------------------------------------------------------------------
# V8 / V16 / E4: decoders name the offending field and say what is wrong.
# The problem texts are pinned: they reach users through `turn/end` reasons,
# `agent/error` payloads and `turnstile log validate` verdicts.
# --------------------------------------------------------------------------

TOOL_RESULT_PROBLEMS = [
    ({"content": [], "isError": "yes"}, ".isError", "must be a bool"),
    ({"content": [], "error": {"name": "E", "v": float("nan")}}, ".error.v", "nan is not a finite number"),
    ({"content": [], "error": {"nom": "E"}}, ".error", "must be a mapping with a string 'name'"),
    ({"content": [], "error": "E"}, ".error", "must be a mapping with a string 'name'"),
    ({"content": [], "additionalContexts": {}}, ".additionalContexts", "must be a list of user messages"),
    ({"content": [], "concludesTurn": 1}, ".concludesTurn", "must be a bool"),
    ({"content": [], "meta": {1: 2}}, ".meta", "key 1 is not a string"),
    (5, "", "must be a mapping {content, ...}"),
    ({"content": [], "extra": 1}, "", "unexpected field(s) 'extra'"),
    ({}, ".content", "is required"),
]


@pytest.mark.parametrize(("value", "suffix", "problem"), TOOL_RESULT_PROBLEMS)
@pytest.mark.parametrize("path", ["result", "call.result"])
def test_V16_V8_tool_result_decoder_names_path_problem_and_code(value: Any, suffix: str, problem: str,
                                                                  path: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ToolResult.from_json(value, path)
    assert (caught.value.path, caught.value.problem) == (path + suffix, problem)
    assert caught.value.code == "INVALID_TOOL_RESULT"


def test_V6_tool_result_error_is_a_frozen_snapshot() -> None:
    error: dict[str, Any] = {"name": "E", "detail": ["a"]}
    result = ToolResult.from_json({"content": [], "error": error})
    error["detail"].append("b")
    error["name"] = "changed"
    assert result.error == {"name": "E", "detail": ["a"]}
    assert isinstance(result.error, FrozenDict)


EVENT_PROBLEMS = [
    (5, "", "must be an object {type, seq, time, data, ...}"),
    ({"type": "x", "seq": 0, "time": 0, "data": {}, "bogus": 1, "zz": 2}, "",
     "unexpected field(s) 'bogus', 'zz'"),
    ({"type": "x", "seq": 0, "time": 0}, ".data", "is missing"),
    ({"type": "user/message", "seq": 0, "time": 0, "data": {}, "surfaceOp": None}, ".surfaceOp",
     "must be omitted rather than null"),
    ({"type": "user/message", "seq": 0, "time": 0, "data": {}, "sourceEventSeqs": None},
     ".sourceEventSeqs", "must be omitted rather than null"),
    ({"type": "", "seq": 0, "time": 0, "data": {}}, ".type", "must be a non-empty string"),
]


@pytest.mark.parametrize(("value", "suffix", "problem"), EVENT_PROBLEMS)
def test_E4_V8_event_decoder_names_path_and_problem(value: Any, suffix: str, problem: str) -> None:
    with pytest.raises(CodecError) as caught:
        Event.from_json(value, "line2")
    assert (caught.value.path, caught.value.problem) == ("line2" + suffix, problem)
    assert str(caught.value) == f"line2{suffix}: {problem}"


LIVE_PROBLEMS = [
    (5, "", "must be an object with a string 'type'"),
    ({"type": 5}, "", "must be an object with a string 'type'"),
    ({"type": ""}, ".type", "must be a non-empty string"),
    ({"type": "x", "a": float("nan")}, ".a", "nan is not a finite number"),
    ({"type": "x", "a": [1, {2: 3}]}, ".a[1]", "key 2 is not a string"),
]


@pytest.mark.parametrize(("value", "suffix", "problem"), LIVE_PROBLEMS)
@pytest.mark.parametrize("path", [None, "out3"])
def test_E3_E4_live_decoder_names_path_and_problem(value: Any, suffix: str, problem: str,
                                                   path: str | None) -> None:
    with pytest.raises(CodecError) as caught:
        if path is None:
            LiveEvent.from_json(value)
        else:
            LiveEvent.from_json(value, path)
    assert (caught.value.path, caught.value.problem) == ((path or "live") + suffix, problem)


def test_V15_error_info_decoder_defaults_agree_with_the_constructor() -> None:
    assert ErrorInfo.from_json({"name": "E"}) == ErrorInfo(name="E")
    assert ErrorInfo.from_json({"message": "m"}) == ErrorInfo("m")
    assert ErrorInfo.from_json({}) == ErrorInfo()
    assert ErrorInfo().name == "Error" and ErrorInfo().message == ""


def test_V1_canonical_json_refuses_nan_and_sorts_keys_without_spaces() -> None:
    with pytest.raises(ValueError):
        canonical_json(float("nan"))
    with pytest.raises(ValueError):
        canonical_json({"a": float("inf")})
    assert canonical_json(freeze({"b": [1, {"d": None, "c": True}], "a": "x"})) == (
        '{"a":"x","b":[1,{"c":true,"d":null}]}')


def test_L10_V8_register_rule_errors_name_the_argument() -> None:
    log = SessionLog()
    for bad in ("", 5):
        with pytest.raises(ValidationError) as caught:
            log.register_rule(bad, lambda *_a: None)  # type: ignore[arg-type]
        assert (caught.value.path, caught.value.problem) == ("event_type", "must be a non-empty string")
    with pytest.raises(ValidationError) as caught:
        log.register_rule("turn/start", lambda *_a: None)
    assert caught.value.path == "event_type"
    assert caught.value.problem == "'turn/start' is a core event type; its rules cannot be overridden"


# --------------------------------------------------------------------------
# P12 chunk validation and folding
# --------------------------------------------------------------------------

BAD_CHUNKS = [
    ({"type": "reasoning"}, "invalid chunk: a reasoning chunk needs a string 'text'"),
    ({"type": "text", "text": 5}, "invalid chunk: a text chunk needs a string 'text'"),
    ({"type": "tool-call", "name": "t", "arguments": "{}"},
     "invalid chunk: a tool-call chunk needs a non-empty string 'id'"),
    ({"type": "tool-call", "id": "", "name": "t", "arguments": "{}"},
     "invalid chunk: a tool-call chunk needs a non-empty string 'id'"),
    ({"type": "tool-call", "id": "c1", "arguments": "{}"},
     "invalid chunk: a tool-call chunk needs a string 'name'"),
    ({"type": "tool-call", "id": "c1", "name": "t", "arguments": {}},
     "invalid chunk: a tool-call chunk needs 'arguments', JSON text (a string)"),
    ({"type": "tool-call", "id": "c1", "name": "t"},
     "invalid chunk: a tool-call chunk needs 'arguments', JSON text (a string)"),
    ({"type": "block", "block": {"type": ""}},
     "invalid chunk: a content block needs a non-empty string 'type'"),
    ({"type": "block"}, "invalid chunk: a block chunk needs a 'block'"),
]


@pytest.mark.parametrize(("chunk", "message"), BAD_CHUNKS)
def test_P12_R9_7_invalid_content_chunk_fails_the_turn_with_INVALID_CHUNK(chunk: Any, message: str) -> None:
    s = Scenario([chunk, {"type": "finish", "kind": "stop"}])
    s.followup("go")
    s.run()
    assert _reason(s) == {"kind": "error", "step": 1, "message": message, "code": "INVALID_CHUNK"}
    assert s.of("assistant/chunk") == [] and s.of("assistant/message") == []
    s.check()


def test_P12_only_block_chunks_add_their_block() -> None:
    s = Scenario([{"type": "text", "text": "hi", "block": {"type": "text", "text": "x"}},
                  {"type": "usage", "usage": {}, "block": {"type": "text", "text": "y"}},
                  {"type": "block", "block": {"type": "image", "url": "u"}},
                  {"type": "finish", "kind": "stop"}])
    s.followup("go")
    s.run()
    message = s.of("assistant/message")[0].data["message"]
    assert thaw(message["content"]) == [  # type: ignore[index]
        {"type": "text", "text": "hi"}, {"type": "image", "url": "u"}]
    s.check()


# --------------------------------------------------------------------------
# R9.6 header comparison: same_json agrees with canonical JSON text equality
# --------------------------------------------------------------------------

SAME_JSON_PAIRS = [
    ({"x": 1}, {"x": 1}, True),
    ({"x": 1}, {"x": 1.0}, False),
    ({"x": 1}, {"x": True}, False),
    ({"x": 1}, {"x": "1"}, False),
    (0.0, -0.0, False),
    (-0.0, -0.0, True),
    (1.5, 1.5, True),
    (1.5, 2.5, False),
    ([1, [2, {"a": None}]], [1, [2, {"a": None}]], True),
    ([1, [2]], [1, [3]], False),
    ([1, 2], [1, 2, 3], False),
    ([1, 2, 3], [1, 2], False),
    ({"a": 1}, {"b": 1}, False),
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}, True),
    ({"a": 1, "b": 2}, {"a": 1, "b": 3}, False),
    ({"a": 1}, {"a": 1, "b": 2}, False),
    ({}, [], False),
    ("s", "s", True),
    (None, None, True),
]


@pytest.mark.parametrize(("a", "b", "same"), SAME_JSON_PAIRS)
def test_R9_6_same_json_is_canonical_text_equality(a: Any, b: Any, same: bool) -> None:
    assert (canonical_json(a) == canonical_json(b)) is same
    assert same_json(freeze(a), freeze(b)) is same
    assert same_json(freeze(b), freeze(a)) is same


@settings(max_examples=300, deadline=None)
@given(json_values(), json_values(), st.booleans())
def test_R9_6_same_json_property(a: Any, b: Any, copy: bool) -> None:
    if copy:
        b = json.loads(json.dumps(a))
    assert same_json(freeze(a), freeze(b)) == (canonical_json(a) == canonical_json(b))


def test_R9_6_a_header_that_differs_only_in_number_type_is_logged_as_a_change() -> None:
    headers = iter([{"config": {"provider": "p", "model": "m", "t": 1}},
                    {"config": {"provider": "p", "model": "m", "t": 1.0}},
                    {"config": {"provider": "p", "model": "m", "t": 1.0}}])
    s = Scenario(calls_reply(("c1", "t")), calls_reply(("c2", "t")), "done")
    s.handle("request", lambda _e: ("resolve", next(headers)))
    s.followup("go")
    s.run()
    assert [e.data["reason"] for e in s.of("request/header")] == ["initial", "change"]
    s.check()
