"""R9, one step (specs/core.md §9), in the order its parts come: R9.1 the step hook, R9.2 the
top-of-step drain, R9.4 the history cut, R9.5 the step start, R9.8 the assistant message,
R9.9 the tools, R9.10 the end of the step.

The system prompt, the request header and the stream are in tests/test_R9_step.py. Each test
here drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the same
inputs through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

import pytest
from scenario_helpers import L, at_running, both, msg, reason_kinds, scenario

from machine.checking.scripted import calls_reply, ok_result
from machine.jsonvalue import FrozenDict, JsonLike, thaw
from machine.log import derive_history
from machine.vocabulary import ErrorInfo

# --------------------------------------------------------------------------
# R9.1 step hook
# --------------------------------------------------------------------------


@both
def test_R9_1_the_step_hook_is_requested_even_on_an_aborted_signal_and_its_check_ends_the_turn(
        impl: str) -> None:
    s = scenario(impl)
    at_running(s, lambda: s.inject(msg("ctx", "plugin:p", id="ctx")))

    def at_rest_drain(data: FrozenDict) -> None:
        if data["id"] == "ctx":                      # an output of the rest drain
            s.cancel()
    s.observe("user/message", at_rest_drain)
    s.followup("go")
    s.run()
    (step,) = s.effects("step")
    assert (step.payload["turn"], step.payload["step"], step.payload["signal"]) == (1, 1, 2)
    assert s.log() == L("TS(1,msg:user) UM('go') UM('ctx';plugin:p) TE(1,aborted)")
    assert s.effects("system-prompt") == []


@both
def test_R9_1_a_raising_step_hook_is_a_generic_failure_of_that_step(impl: str) -> None:
    s = scenario(impl)
    s.handle("step", lambda _e: ("raise", ErrorInfo("step hook", "HookError", "E_STEP")))
    s.followup("go")
    s.run()
    (end,) = s.of("turn/end")
    assert thaw(end.data["reason"]) == {"kind": "error", "step": 1, "message": "step hook",
                                        "code": "E_STEP"}
    assert s.of("step/start") == [] and s.effects("request-error") == []


# --------------------------------------------------------------------------
# R9.2 top-of-step drain
# --------------------------------------------------------------------------


@both
def test_R9_2_input_staged_during_the_step_hook_reaches_this_steps_request(impl: str) -> None:
    s = scenario(impl)
    s.hold("step")
    s.followup("go")
    s.run()
    s.steer("steering")
    s.inject("context")
    s.resolve("step")
    assert s.log()[:5] == L("TS(1,msg:user) UM('go') STM(1;'steering';user) "
                            "UM('context';plugin:test) SS(1.1)")
    assert s.request(1) == ["'go'", "'steering'", "'context';plugin:test"]
    assert len(s.effects("step")) == 1               # taking steering here makes no extra step


# --------------------------------------------------------------------------
# R9.4 history cut
# --------------------------------------------------------------------------


@both
def test_R9_4_a_request_holds_the_history_below_its_step_start_and_later_appends_reach_later_ones(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), "done")
    s.hold("model", times=1)
    s.followup("go")
    s.run()
    first = s.take("model")
    s.core.append("user/message", msg("direct"), surface_op="append")   # after the cut
    s.driver.stream(first, calls_reply(("c1", "t")))
    s.run()
    starts = [e.seq for e in s.of("step/start")]
    assert [e.payload["historyEnd"] for e in s.requests] == starts
    for request, start in zip(s.requests, starts, strict=True):
        history = request.history
        assert history is not None
        assert [m.to_json() for m in history] == [
            m.to_json() for m in derive_history(s.events[:start])]
    assert "'direct'" not in s.request(1) and "'direct'" in s.request(2)


# --------------------------------------------------------------------------
# R9.5 step start
# --------------------------------------------------------------------------


@both
def test_R9_5_after_a_cancel_at_step_start_the_steps_only_further_event_is_its_step_end(
        impl: str) -> None:
    s = scenario(impl)
    s.observe("step/start", lambda _d: s.cancel(), once=True)
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1,msg:user) UM('go') SS(1.1) SE(1.1) TE(1,aborted)")
    assert s.effects("request") == [] and s.effects("model") == []


# --------------------------------------------------------------------------
# R9.8 assistant message
# --------------------------------------------------------------------------


@both
def test_R9_8_the_assistant_message_folds_the_stream_with_its_id_source_usage_and_chunk_seqs(
        impl: str) -> None:
    chunks: list[JsonLike] = [
        {"type": "text", "text": "hel"}, {"type": "usage", "usage": {"input": 1}},
        {"type": "text", "text": "lo"}, {"type": "usage", "usage": {"input": 5, "output": 2}},
        {"type": "finish", "kind": "stop", "replayState": {"k": [1]}}]
    s = scenario(impl, chunks)
    s.followup("go")
    s.run()
    (am,) = s.of("assistant/message")                  # exactly one
    assert thaw(am.data["message"]) == {
        "id": f"assistant-{am.seq}", "role": "assistant",
        "content": [{"type": "text", "text": "hello"}],
        "source": {"kind": "model", "provider": "test", "model": "test-model",
                   "replayState": {"k": [1]}}}
    assert thaw(am.data["usage"]) == {"input": 5, "output": 2}     # the last usage chunk
    assert list(am.source_event_seqs or ()) == [e.seq for e in s.of("assistant/chunk")]
    assert len(s.of("assistant/chunk")) == 5


@both
def test_R9_8_an_empty_reply_is_appended_too_and_left_out_of_history(impl: str) -> None:
    s = scenario(impl, [{"type": "finish", "kind": "stop"}])
    s.followup("go")
    s.run()
    (am,) = s.of("assistant/message")
    assert thaw(am.data["message"])["content"] == [] and "usage" not in am.data
    assert s.history() == ["'go'"]


# --------------------------------------------------------------------------
# R9.9 tools
# --------------------------------------------------------------------------


@both
def test_R9_9_a_message_with_tool_call_blocks_runs_a_batch_and_one_without_runs_none(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "a"), ("c2", "b"), text="calling"), "done")
    s.followup("go")
    s.run()
    assert [e.data["callId"] for e in s.of("tool/call")] == ["c1", "c2"]
    assert [(e.payload["step"], e.payload["callId"]) for e in s.effects("tool-prepare")] == [
        (1, "c1"), (1, "c2")]                       # step 1's calls; none for step 2's reply
    assert [e.payload["name"] for e in s.effects("tool-execute")] == ["a", "b"]
    assert len(s.of("tool/result")) == 2


# --------------------------------------------------------------------------
# R9.10 end of step
# --------------------------------------------------------------------------


@both
def test_R9_10_input_staged_during_the_batch_is_drained_after_the_results_before_step_end(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), "done")

    def inject(_e: object) -> object:
        s.inject("during")
        return ("resolve", ok_result())
    s.handle("tool-execute", inject)
    s.followup("go")
    s.run()
    assert s.log()[:9] == L("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) "
                            "TC(1.1;c1) TR(1.1;c1;ok) UM('during';plugin:test)")
    assert s.log()[9] == "SE(1.1)"


@both
@pytest.mark.parametrize(("reply", "staged", "steps"), [
    ("plain", None, 1),              # no tool calls, nothing drained: turn-stopping next
    ("plain", "steer", 2),           # the drain took steering: continueTurn
    ("plain", "inject", 1),          # context does not continue the turn
    ("calls", None, 2),              # tool calls, none concluded: continueTurn
    ("concluding", None, 1),         # a call concluded: the turn ends
])
def test_R9_10_the_step_continues_the_turn_for_unconcluded_calls_or_drained_steering(
        impl: str, reply: str, staged: str | None, steps: int) -> None:
    first = "plain" if reply == "plain" else calls_reply(("c1", "t"))
    s = scenario(impl, first, "second")
    if reply == "concluding":
        s.env.tool_results["c1"] = ok_result(concludesTurn=True)

    def stage(_d: FrozenDict) -> None:
        if staged == "steer":
            s.steer("steer")
        elif staged == "inject":
            s.inject("inject")
    s.observe("assistant/message", stage, once=True)
    s.followup("go")
    s.run()
    assert len(s.of("step/start")) == steps
    assert reason_kinds(s) == ["completed"]
