"""R10, the tool batch (specs/core.md §10), around its contexts and its aborts: R10.5 one FIFO
for contexts and routed input, R10.6 concluding, R10.7 an abort during the batch, R10.8 an
abort noticed after it, R10.10 the aborted-before-dispatch result, R10.11 the aborted result
of a dispatched call.

Planning, groups, stages, records, batch failures and the error results of raising stages are
in tests/test_R10_tools.py. Each test here drives the machine (`AgentCore`) and the reference
model (`ModelAgent`) with the same inputs through the scripted driver, and requires the
behaviour of the rule of both.
"""

from __future__ import annotations

import pytest
from scenario_helpers import L, Scenario, both, msg, reason_kinds, result_with_contexts, scenario

from machine.checking.scripted import calls_reply, ok_result
from machine.core import CoreConfig
from machine.jsonvalue import FrozenDict, thaw

ABORTED = {"content": [{"type": "text", "text": "Error: tool call aborted"}], "isError": True,
           "error": {"name": "AbortError", "code": "ABORTED"}}


def batch(s: Scenario) -> list[str]:
    """The log after step 1's assistant message, in the scenario notation."""
    log = s.log()
    return log[log.index(next(t for t in log if t.startswith("AM(1.1;"))) + 1:]


def held_execute(impl: str, *calls: str) -> Scenario:
    """A turn whose first call's `{tool-execute}` is held; the calls are exclusive."""
    s = scenario(impl, calls_reply(*[(c, "t") for c in calls]), "done")
    s.hold("tool-execute")
    s.followup("go")
    s.run()
    return s


# --------------------------------------------------------------------------
# R10.5 one FIFO
# --------------------------------------------------------------------------


@both
def test_R10_5_tool_contexts_and_routed_input_share_the_outbox_in_arrival_order(impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t"), ("c2", "t")), "done")
    s.env.tool_results["c1"] = result_with_contexts("one", msg("ctx of c1", "plugin:t"))

    def execute(effect: FrozenDict) -> object:
        if effect["callId"] == "c2":
            s.inject("injected")
            s.steer("steered")
            return ("resolve", result_with_contexts("two", msg("ctx of c2", "plugin:t")))
        return None
    s.handle("tool-execute", lambda e: execute(e.payload))
    s.followup("go")
    s.run()
    assert batch(s)[:7] == L(
        "TC(1.1;c1) TR(1.1;c1;ok) TC(1.1;c2) TR(1.1;c2;ok) UM('ctx of c1';plugin:t) "
        "UM('injected';plugin:test) STM(1;'steered';user)")
    assert batch(s)[7:9] == L("UM('ctx of c2';plugin:t) SE(1.1)")


@both
def test_R10_5_R10_2_an_exclusive_call_after_a_pool_with_room_waits_for_the_pool_then_runs_alone(
        impl: str) -> None:
    """R10.2 (with R10.5 ordering): a pool of parallel calls with room for more (limit 3, two
    calls) ends at the first exclusive call; that call starts only once the pool's calls
    are taken, and every result is committed in model order."""
    config = CoreConfig(request_options={"provider": "p", "model": "m"}, publish=False,
                        tool_modes={"t": "parallel"}, max_parallel_tool_calls=3)
    s = scenario(impl, calls_reply(("c1", "t"), ("c2", "t"), ("c3", "u")), "done",
                 config=config)
    s.followup("go")
    s.run()
    executes = [str(e.payload["callId"]) for e in s.effects("tool-execute")]
    assert executes == ["c1", "c2", "c3"]
    assert batch(s)[:6] == L("TC(1.1;c1) TC(1.1;c2) TR(1.1;c1;ok) TR(1.1;c2;ok) "
                             "TC(1.1;c3) TR(1.1;c3;ok)")
    assert reason_kinds(s) == ["completed"]


@both
def test_R10_2_an_exclusive_call_after_a_pool_answered_at_prepare_starts_at_once(
        impl: str) -> None:
    """R10.2 / R10.3: pool calls that prepare answers with a final result are never in
    flight; the exclusive call after them starts as soon as the pool has none left."""
    config = CoreConfig(request_options={"provider": "p", "model": "m"}, publish=False,
                        tool_modes={"t": "parallel"}, max_parallel_tool_calls=3)
    s = scenario(impl, calls_reply(("c1", "t"), ("c2", "t"), ("c3", "u")), "done",
                 config=config)
    s.handle("tool-prepare", lambda e: (
        ("resolve", {"content": [{"type": "text", "text": "pre"}]})
        if e.payload["callId"] != "c3" else ("resolve", None)))
    s.followup("go")
    s.run()
    assert [str(e.payload["callId"]) for e in s.effects("tool-execute")] == ["c3"]
    assert [e.data["callId"] for e in s.of("tool/call")] == ["c1", "c2", "c3"]
    assert len(s.of("tool/result")) == 3 and reason_kinds(s) == ["completed"]


# --------------------------------------------------------------------------
# R10.6 concluding
# --------------------------------------------------------------------------


@both
@pytest.mark.parametrize(("is_error", "steps"), [(False, 1), (True, 2)])
def test_R10_6_only_a_successful_results_concludesTurn_ends_the_turn(
        impl: str, is_error: bool, steps: int) -> None:
    s = scenario(impl, calls_reply(("c1", "t"), ("c2", "t")), "done")
    s.env.tool_results["c1"] = ok_result("final", concludesTurn=True, isError=is_error)
    s.followup("go")
    s.run()
    assert len(s.of("step/start")) == steps
    assert len(s.of("tool/result")) == 2               # the other call still runs
    assert reason_kinds(s) == ["completed"]


# --------------------------------------------------------------------------
# R10.7 abort during the batch
# --------------------------------------------------------------------------


@both
def test_R10_7_after_an_abort_dispatched_calls_finish_and_unstarted_ones_get_synthetic_pairs(
        impl: str) -> None:
    s = held_execute(impl, "c1", "c2", "c3")
    s.cancel()
    s.resolve("tool-execute", ok_result("late body"))
    assert batch(s) == L("TC(1.1;c1) TR(1.1;c1;ERR ABORTED) TC(1.1;c2) TR(1.1;c2;ERR ABD) "
                            "TC(1.1;c3) TR(1.1;c3;ERR ABD) SE(1.1) TE(1,aborted)")
    assert [e.payload["callId"] for e in s.effects("tool-prepare")] == ["c1"]
    (finalize,) = s.effects("tool-finalize")
    assert thaw(finalize.payload["result"]) == ABORTED  # R10.11: finalize sees the aborted one


@both
def test_R10_7_a_batch_entered_aborted_gives_every_call_a_pair_and_requests_no_stage(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t"), ("c2", "t")))
    s.observe("assistant/message", lambda _d: s.cancel(), once=True)
    s.followup("go")
    s.run()
    assert batch(s) == L("TC(1.1;c1) TR(1.1;c1;ERR ABD) TC(1.1;c2) TR(1.1;c2;ERR ABD) "
                            "SE(1.1) TE(1,aborted)")
    assert [e for kind in ("tool-prepare", "tool-execute", "tool-finalize")
            for e in s.effects(kind)] == []


# --------------------------------------------------------------------------
# R10.8 abort noticed after the batch
# --------------------------------------------------------------------------


@both
def test_R10_8_an_abort_at_the_last_result_still_drains_and_ends_the_step_then_the_turn(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), "never")

    def at_result(_d: FrozenDict) -> None:
        s.cancel()
        s.inject("after the cancel")                 # kept: staged after the clear
    s.observe("tool/result", at_result, once=True)
    s.followup("go")
    s.run()
    assert batch(s) == L("TC(1.1;c1) TR(1.1;c1;ok) UM('after the cancel';plugin:test) SE(1.1) "
                            "TE(1,aborted)")
    assert [(e.payload["step"]) for e in s.effects("step")] == [1, 2]   # its check ends the turn
    assert len(s.of("step/start")) == 1


# --------------------------------------------------------------------------
# R10.10 aborted-before-dispatch result
# --------------------------------------------------------------------------


@both
def test_R10_10_a_call_aborted_at_its_tool_call_gets_the_aborted_before_dispatch_result(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")))
    s.observe("tool/call", lambda _d: s.cancel(), once=True)
    s.followup("go")
    s.run()
    (call,) = s.of("tool/call")
    (result,) = s.of("tool/result")
    assert thaw(result.data) == {
        "turn": 1, "step": 1,
        "message": {"id": f"tool-result-{result.seq}", "role": "user",
                    "content": [{"type": "tool-result", "toolCallId": "c1",
                                 "content": [{"type": "text",
                                              "text": "Error: tool call aborted before dispatch"}],
                                 "isError": True}],
                    "source": {"kind": "tool", "callId": "c1"}},
        "error": {"name": "AbortError", "code": "ABORTED_BEFORE_DISPATCH"}}
    assert list(result.source_event_seqs or ()) == [call.seq]
    assert s.effects("tool-prepare") == []


@both
def test_R10_10_an_undispatched_calls_finalized_result_becomes_the_canonical_one_with_its_contexts(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")))
    s.hold("tool-prepare")
    s.followup("go")
    s.run()
    s.handle("tool-finalize", lambda _e: ("resolve", result_with_contexts(
        "finalized", msg("kept", "plugin:t"))))
    s.cancel()
    s.resolve("tool-prepare", None)                  # dispatch, but the signal is aborted
    assert s.effects("tool-execute") == []
    (finalize,) = s.effects("tool-finalize")
    assert thaw(finalize.payload["result"])["error"] == {"name": "AbortError",
                                                          "code": "ABORTED_BEFORE_DISPATCH"}
    assert batch(s) == L("TC(1.1;c1) TR(1.1;c1;ERR ABD) UM('kept';plugin:t) SE(1.1) "
                            "TE(1,aborted)")


# --------------------------------------------------------------------------
# R10.11 aborted result of a dispatched call
# --------------------------------------------------------------------------


@both
def test_R10_11_a_successful_body_consumed_after_the_abort_is_replaced_carrying_its_contexts(
        impl: str) -> None:
    s = held_execute(impl, "c1")
    s.cancel()
    context = msg("from the body", "plugin:t")
    s.resolve("tool-execute", result_with_contexts("late", context))
    (finalize,) = s.effects("tool-finalize")
    assert thaw(finalize.payload["result"]) == {**ABORTED, "additionalContexts": [context]}
    assert batch(s) == L("TC(1.1;c1) TR(1.1;c1;ERR ABORTED) UM('from the body';plugin:t) "
                            "SE(1.1) TE(1,aborted)")


@both
def test_R10_11_an_error_body_keeps_its_own_result_after_the_abort(impl: str) -> None:
    s = held_execute(impl, "c1")
    s.cancel()
    s.resolve("tool-execute", {"content": [{"type": "text", "text": "failed"}], "isError": True,
                               "error": {"name": "ToolError", "code": "E_TOOL"}})
    assert batch(s)[:2] == L("TC(1.1;c1) TR(1.1;c1;ERR E_TOOL)")


@both
def test_R10_11_a_successful_finalized_result_after_the_abort_becomes_the_aborted_one_again(
        impl: str) -> None:
    s = held_execute(impl, "c1")
    s.handle("tool-finalize", lambda _e: ("resolve", ok_result("finalized ok")))
    s.cancel()
    s.resolve("tool-execute", {"content": [], "isError": True})
    assert batch(s)[:2] == L("TC(1.1;c1) TR(1.1;c1;ERR ABORTED)")


@both
def test_R10_11_a_final_result_from_prepare_keeps_its_own_after_the_abort(impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")))
    s.hold("tool-prepare")
    s.followup("go")
    s.run()
    s.cancel()
    s.resolve("tool-prepare", ok_result("prepared"))
    assert batch(s)[:2] == L("TC(1.1;c1) TR(1.1;c1;ok)")
    assert s.effects("tool-execute") == [] and s.effects("tool-finalize") == []


@both
def test_R10_11_concludesTurn_never_counts_on_the_aborted_result(impl: str) -> None:
    s = held_execute(impl, "c1")
    s.cancel()
    s.resolve("tool-execute", ok_result("late", concludesTurn=True))
    # counted, it would end the turn at once with its reason (R8.4); the check ends it aborted
    assert reason_kinds(s) == ["aborted"]
    assert [e.payload["step"] for e in s.effects("step")] == [1, 2]
