"""R10, the tool batch (specs/core.md §10): planning, groups and the pool limit, the stages,
the tool/result record, batch failures and the error results of raising stages.

The scenarios of families C and D (tests/test_scenarios.py) run batches end to end;
these tests pin one rule each.
"""

from __future__ import annotations

from typing import Any

import pytest
from scenario_helpers import L, Scenario, at, obj, string

from machine.checking.scripted import HOLD, calls_reply, ok_result
from machine.core import CoreConfig
from machine.core.tools import normalized
from machine.jsonvalue import FrozenDict, FrozenList, thaw
from machine.vocabulary import ErrorInfo, Message, ToolResult

TOOL_ERROR = ErrorInfo("tool exploded", "ToolError", "E_TOOL")


def _tool_scenario(*calls: tuple[str, str] | tuple[str, str, str], modes: dict[str, str] | None = None,
                   max_parallel: int = 10, then: str = "done") -> Scenario:
    config = CoreConfig(tool_modes=dict(modes or {}), max_parallel_tool_calls=max_parallel)  # type: ignore[arg-type]
    return Scenario(calls_reply(*calls), then, config=config)


def _reason(s: Scenario) -> dict[str, object]:
    (turn_end,) = s.of("turn/end")
    reason: dict[str, object] = thaw(obj(turn_end.data["reason"]))
    return reason


def _call_ids(s: Scenario, type_: str) -> list[str]:
    if type_ == "tool/call":
        return [str(e.data["callId"]) for e in s.of("tool/call")]
    return [string(at(e.data, "message", "content", 0, "toolCallId")) for e in s.of(type_)]


def _result_text(s: Scenario, index: int) -> object:
    return thaw(at(s.of("tool/result")[index].data, "message", "content", 0, "content"))


def _resolve_held(s: Scenario, kind: str, call_id: str, value: Any) -> None:
    (effect,) = [e for e in s.driver.held if e.kind == kind and e.payload["callId"] == call_id]
    s.driver.held.remove(effect)
    s.core.resolve(effect.id, value)
    s.run()


# --------------------------------------------------------------------------
# R10.1 plan: the planned arguments
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
# R10.3 start: a final result from prepare
# --------------------------------------------------------------------------


def test_R10_3_prepare_final_result_is_committed_without_execute_or_finalize() -> None:
    s = _tool_scenario(("c1", "t"))
    s.handle("tool-prepare", lambda _e: ("resolve", ok_result("from prepare")))
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) "
                        "TC(1.1;c1) TR(1.1;c1;ok) SE(1.1) SS(1.2) CH… AM(1.2;'done') SE(1.2) "
                        "TE(1,completed)")
    (result,) = s.of("tool/result")
    assert thaw(at(result.data, "message", "content", 0, "content")) == [
        {"type": "text", "text": "from prepare"}]
    assert s.effects("tool-execute") == [] and s.effects("tool-finalize") == []
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
    assert at(result.data, "message", "content", 0, "isError") is True
    s.check()


# --------------------------------------------------------------------------
# R10.9 batch failure: a stage's value that is no tool result (R15.4)
# --------------------------------------------------------------------------


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


def test_R10_9_R15_4_invalid_execute_result_fails_with_InvalidToolResultError_saying_what_is_wrong() -> None:
    s = Scenario(calls_reply(("c1", "t"), ("c2", "t")), "done")
    s.handle("tool-execute", lambda _e: ("resolve", {"content": "not a list"}),
             when=lambda e: e.payload["callId"] == "c2")
    s.followup("go")
    s.run()
    message = "invalid tool result: result.content: must be a list of content blocks"
    (turn_end,) = s.of("turn/end")
    assert thaw(turn_end.data["reason"]) == {
        "kind": "error", "step": 1, "message": message, "code": "INVALID_TOOL_RESULT"}
    (error,) = s.live("agent/error")
    assert thaw(error["error"]) == {
        "name": "InvalidToolResultError", "message": message, "code": "INVALID_TOOL_RESULT"}
    assert [e.data["callId"] for e in s.of("tool/call")] == ["c1", "c2"]
    assert [e.payload["callId"] for e in s.effects("tool-finalize")] == ["c1"]
    assert len(s.of("tool/result")) == 1
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


def test_R10_9_prepare_failure_behind_running_calls_starts_nothing_more_whatever_settles_first() -> None:
    """R10.2, R10.9: earlier calls of the pool settle out of order after the failure; their
    results are committed in model order and no later call starts."""
    config = CoreConfig(tool_modes={"p": "parallel"})
    s = Scenario(calls_reply(("c1", "p"), ("c2", "p"), ("c3", "p"), ("c4", "p")), "done", config=config)
    s.handle("tool-execute", lambda _e: HOLD)
    s.handle("tool-prepare", lambda e: ("resolve", {"content": "not a list"})
             if e.payload["callId"] == "c3" else None)
    s.followup("go")
    s.run()

    def calls() -> list[object]:
        return [e.data["callId"] for e in s.of("tool/call")]
    assert calls() == ["c1", "c2", "c3"]
    _resolve_held(s, "tool-execute", "c2", ok_result("two"))    # the later one settles first
    assert calls() == ["c1", "c2", "c3"]                        # R10.9: nothing more starts
    assert [e.payload["callId"] for e in s.effects("tool-execute")] == ["c1", "c2"]
    _resolve_held(s, "tool-execute", "c1", ok_result("one"))
    assert calls() == ["c1", "c2", "c3"]
    assert [thaw(e.data["message"])["content"][0]["toolCallId"] for e in s.of("tool/result")] == [
        "c1", "c2"]
    (turn_end,) = s.of("turn/end")
    reason = thaw(turn_end.data["reason"])
    assert reason["code"] == "INVALID_TOOL_RESULT" and reason["step"] == 1, reason
    s.check()


# --------------------------------------------------------------------------
# R10.12 error result of a raising stage
# --------------------------------------------------------------------------


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


def test_R10_4_V16_normalizing_a_result_keeps_everything_but_the_field_it_drops() -> None:
    """R10.4 step 2 (V16): a successful result loses its ``error`` and an error result its
    ``concludesTurn``; content, contexts and meta stay as they were."""
    context = Message(id="ctx", role="user", content=FrozenList((FrozenDict(
        {"type": "text", "text": "c"}),)), source=FrozenDict({"kind": "plugin", "plugin": "t"}))
    content = FrozenList((FrozenDict({"type": "text", "text": "done"}),))
    success = ToolResult(content=content, error=FrozenDict({"name": "E", "code": "X"}),
                         additional_contexts=(context,), concludes_turn=True,
                         meta=FrozenDict({"m": 1}))
    kept = normalized(success)
    assert kept.error is None and not kept.is_error
    assert (kept.content, kept.additional_contexts, kept.concludes_turn, kept.meta) == (
        content, (context,), True, FrozenDict({"m": 1}))
    failure = ToolResult(content=content, is_error=True, concludes_turn=True,
                         error=FrozenDict({"name": "E", "code": "X"}),
                         additional_contexts=(context,), meta=FrozenDict({"m": 2}))
    kept = normalized(failure)
    assert not kept.concludes_turn and kept.is_error
    assert (kept.content, kept.error, kept.additional_contexts, kept.meta) == (
        content, FrozenDict({"name": "E", "code": "X"}), (context,), FrozenDict({"m": 2}))
