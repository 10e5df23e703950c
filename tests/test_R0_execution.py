"""R0, the execution model (specs/core.md §0): R0.1 terms, R0.2 names, R0.3 the model, R0.4
yield points, R0.5 observers acting in place, R0.6 nested appends, R0.7 cooperative
cancellation, R0.8 warnings, R0.9 errors.

Each test drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the
same inputs through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

import pytest
from scenario_helpers import Scenario, both, msg, scenario, tokens

from machine.checking.scripted import calls_reply, model_failure
from machine.errors import InvariantError
from machine.io import Control, Durable, Effect, Live, Output
from machine.jsonvalue import FrozenDict, JsonLike, thaw
from machine.vocabulary import ErrorInfo

# --------------------------------------------------------------------------
# R0.1 terms: an append commits with the next seq; the effect kinds
# --------------------------------------------------------------------------


@both
def test_R0_1_an_append_is_committed_with_the_next_seq_before_its_output_is_pulled(impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), "done")
    committed: list[bool] = []

    def pulled(output: Output) -> None:
        if isinstance(output, Durable):
            events = s.core.log.events
            committed.append(len(events) > output.event.seq and events[output.event.seq] == output.event)
    s.on_output(pulled)
    s.followup("go")
    s.inject("between turns")          # window closed: an append, not a staged item
    s.run()
    durable = [o for o in s.outputs if isinstance(o, Durable)]
    assert [o.event.seq for o in durable] == list(range(len(s.events)))
    assert committed == [True] * len(durable)
    assert [o.event for o in durable] == s.events


EFFECT_KINDS = {"tick", "prompt-submit", "step", "system-prompt", "request", "model",
                "tool-prepare", "tool-execute", "tool-finalize", "turn-stopping",
                "request-error", "flush"}


@both
def test_R0_1_each_extension_point_and_environment_step_is_one_of_the_listed_effect_kinds(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), model_failure("overloaded", "E_BUSY"), "done")
    s.handle("request-error", lambda _e: ("resolve", {"kind": "retry"}))
    s.handle("prompt-submit", lambda e: ("resolve", {"kind": "block", "reason": "no"})
             if thaw(e.payload["message"])["id"] == "blocked" else None)
    s.followup("go")
    s.followup(msg("refused", id="blocked"))
    s.run()
    kinds = {o.kind for o in s.outputs if isinstance(o, Effect)}
    assert kinds == EFFECT_KINDS
    ticks = [thaw(e.payload)["purpose"] for e in s.effects("tick")]
    assert sorted(set(ticks)) == ["rejected-admission", "wake"]
    assert [thaw(e.data["reason"])["kind"] for e in s.of("turn/end")] == ["error", "completed"]


# --------------------------------------------------------------------------
# R0.2 names: the spelling of output types, data keys, effect kinds; snake_case methods
# --------------------------------------------------------------------------


@both
def test_R0_2_outputs_spell_types_keys_and_kinds_as_the_specs_and_methods_are_snake_case(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), model_failure("overloaded", "E_BUSY"))
    s.followup("go")
    s.run()
    payload_keys = {o.kind: set(thaw(o.payload)) for o in s.outputs if isinstance(o, Effect)}
    assert payload_keys["model"] == {"turn", "step", "signal", "header", "historyEnd"}
    assert payload_keys["tool-execute"] == {"turn", "step", "signal", "callId", "name", "arguments"}
    assert payload_keys["tool-finalize"] == {"turn", "step", "signal", "callId", "name",
                                             "arguments", "result"}
    assert payload_keys["request-error"] == {"turn", "step", "signal", "error", "failure",
                                             "priorFailures"}
    live = [o.event.type for o in s.outputs if isinstance(o, Live)]
    assert live == ["session/created", "agent/created", "agent/session-start",
                    "agent/inbox/enqueue", "agent/status", "agent/inbox/dequeue", "agent/error",
                    "agent/settled", "agent/status"]
    (result,) = s.of("tool/result")
    assert set(thaw(result.data)) == {"turn", "step", "message"}
    assert result.to_json()["sourceEventSeqs"] == [s.of("tool/call")[0].seq]
    # the Python binding's spelling of the options and readable state
    s.core.followup(msg("again"))
    s.core.cancel({"kind": "user"}, keep_inbox=True)         # spares the queued item
    assert (s.core.accepts_next_step, s.core.wake_pending, s.core.retry_pending) == (
        False, True, False)
    assert s.core.pending_queued == 1


# --------------------------------------------------------------------------
# R0.3 the model: deterministic; a command returns complete and never advances the loop
# --------------------------------------------------------------------------


def _json_outputs(impl: str) -> list[dict[str, JsonLike]]:
    s = scenario(impl, calls_reply(("c1", "t")), "done")
    s.observe("turn/start", lambda _d: s.inject(msg("staged", "plugin:p", id="c1")), once=True)
    s.followup(msg("go", id="m1"))
    s.run()
    return [o.to_json() if not isinstance(o, Durable) else o.to_json(with_time=False)
            for o in s.outputs]


@both
def test_R0_3_the_same_inputs_give_the_same_outputs(impl: str) -> None:
    assert _json_outputs(impl) == _json_outputs(impl)


@both
def test_R0_3_a_command_is_complete_when_it_returns_and_the_loop_waits_for_its_completion(
        impl: str) -> None:
    core = scenario(impl).core
    core.drain_outputs()
    core.followup(msg("go"))
    assert core.pending_queued == 1 and core.wake_pending     # complete on return
    first = core.drain_outputs()
    assert [type(o).__name__ for o in first] == ["Effect", "Live"]     # tick, enqueue
    tick = first[0]
    assert isinstance(tick, Effect) and tick.kind == "tick"
    assert core.next_output() is None and core.status == "idle"   # nothing moves without it
    core.resolve(tick.id)
    assert [o.event.type for o in core.drain_outputs()[:1] if isinstance(o, Live)] == [
        "agent/status"]                                           # running: the loop moved on


# --------------------------------------------------------------------------
# R0.4 yield points: the only waits, and none in the unbroken stretches
# --------------------------------------------------------------------------


@both
def test_R0_4_effects_are_awaited_only_at_the_yield_points_and_never_inside_the_stretches(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), "done")
    s.followup("go")
    s.run()
    # yield points 1, 2, 4-8, 10, 11 in their order; nothing awaited from the allowed decision
    # to turn/start, from the final drain to turn/end, from turn/end to the flush
    assert tokens(s) == [
        "tick(wake)", "enq(go,q)", "running", "⟨prompt-submit⟩", "deq(go,q)", "[TS(1,msg:user)]",
        "[UM('go')]", "⟨step 1.1⟩", "⟨system-prompt 1.1⟩", "[SS(1.1)]", "⟨request 1.1⟩",
        "[RH(initial)]", "⟨model 1.1⟩", "[CH]", "[CH]", "[AM(1.1;call c1)]", "[TC(1.1;c1)]",
        "⟨prepare c1⟩", "⟨execute c1⟩", "⟨finalize c1⟩", "[TR(1.1;c1;ok)]", "[SE(1.1)]",
        "⟨step 1.2⟩", "⟨system-prompt 1.2⟩", "[SS(1.2)]", "⟨request 1.2⟩", "⟨model 1.2⟩", "[CH]",
        "[CH]", "[AM(1.2;'done')]", "[SE(1.2)]", "⟨turn-stopping 1⟩", "[TE(1,completed)]",
        "flush(1)", "settled(1,completed)", "idle"]
    # yield point 12: disposal waits for quiescence, and requests no effect
    effects = len(s.effects())
    s.dispose()
    s.run()
    assert len(s.effects()) == effects
    assert tokens(s)[-2:] == ["agent/disposed", "session/disposed"]


@both
def test_R0_4_a_rejected_admission_yields_at_its_tick_before_continue_or_idle(impl: str) -> None:
    s = scenario(impl)
    s.handle("prompt-submit", lambda _e: ("resolve", {"kind": "block", "reason": "no"}))
    s.hold("tick", when=lambda e: e.payload["purpose"] == "rejected-admission")
    s.followup("go")
    s.run()
    assert tokens(s)[-2:] == ["deq(go,q)", "tick(rejected-admission)"]
    assert s.core.is_quiescent is False                 # waiting there, inside the interval
    s.resolve("tick")
    assert tokens(s)[-1] == "idle" and s.events == [] and s.core.is_quiescent


# --------------------------------------------------------------------------
# R0.5 observers act in place
# --------------------------------------------------------------------------


@both
def test_R0_5_a_command_at_an_output_sees_the_state_there_and_its_outputs_come_next(
        impl: str) -> None:
    s = scenario(impl)
    seen: list[tuple[str, bool, str]] = []

    def at(type_: str, text: str) -> None:
        def observer(_data: FrozenDict) -> None:
            seen.append((type_, s.core.accepts_next_step, s.core.status))
            s.steer(text)
        s.observe(type_, observer, once=True)
    at("turn/start", "at start")
    at("turn/end", "at end")
    s.followup("go")
    s.run()
    assert seen == [("turn/start", True, "running"), ("turn/end", False, "running")]
    trace = tokens(s)
    # each steer's notice is the output right after the one it was issued at, and its placement
    # follows the window as it was there: steering in the turn, queued after it
    assert trace[trace.index("[TS(1,msg:user)]") + 1] == "enq(at start,s)"
    assert trace[trace.index("[TE(1,completed)]") + 1] == "enq(at end,q)"


# --------------------------------------------------------------------------
# R0.6 nested appends
# --------------------------------------------------------------------------


@both
def test_R0_6_an_append_made_while_event_n_is_observed_is_event_n_plus_1_and_pulled_next(
        impl: str) -> None:
    s = scenario(impl)
    s.observe("turn/end", lambda _d: s.inject("at turn end"), once=True)

    def mark(_data: FrozenDict) -> None:
        s.core.append("x-test/mark", {"n": 1})
    s.observe("assistant/message", mark, once=True)
    s.followup("go")
    s.run()
    events = s.events
    (am,) = s.of("assistant/message")
    (te,) = s.of("turn/end")
    assert events[am.seq + 1].type == "x-test/mark"
    assert events[te.seq + 1].type == "user/message" and s.user_texts()[-1] == "at turn end"
    durable = [o.event.seq for o in s.outputs if isinstance(o, Durable)]
    assert durable == sorted(durable)
    trace = tokens(s)
    assert trace[trace.index("[TE(1,completed)]") + 1] == "[UM('at turn end';plugin:test)]"
    assert trace[trace.index("[AM(1.1;'ok')]") + 1] == "[x-test/mark]"


@both
def test_R0_6_a_direct_append_that_breaks_an_invariant_raises_and_has_no_effect(impl: str) -> None:
    s = scenario(impl)
    s.run()
    before = len(s.outputs)
    with pytest.raises(InvariantError):
        s.core.append("step/end", {"turn": 1, "step": 1})      # no step is open
    s.run()
    assert s.events == [] and s.outputs[before:] == []


# --------------------------------------------------------------------------
# R0.7 cooperative cancellation: signal ids; abort; effects already requested stay
# --------------------------------------------------------------------------


@both
def test_R0_7_signal_ids_count_the_controllers_from_1_and_tick_and_flush_carry_none(impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), "done", "second")
    s.followup("one")
    s.run()
    s.followup("two")
    s.run()
    signals = [(e.kind, thaw(e.payload).get("signal")) for e in s.effects()]
    assert [k for k, sig in signals if sig == 1] == ["prompt-submit"]
    assert {k for k, sig in signals if sig == 2} == {
        "step", "system-prompt", "request", "model", "tool-prepare", "tool-execute",
        "tool-finalize", "turn-stopping"}
    assert [k for k, sig in signals if sig == 3] == ["prompt-submit"]
    assert {k for k, sig in signals if sig == 4} == {
        "step", "system-prompt", "request", "model", "turn-stopping"}
    assert all("signal" not in thaw(e.payload) for e in s.effects("tick") + s.effects("flush"))


@both
def test_R0_7_an_abort_is_an_output_and_the_outstanding_effect_is_still_awaited(impl: str) -> None:
    s = scenario(impl)
    s.hold("model")
    s.followup("go")
    s.run()
    model = s.take("model")
    s.cancel()
    s.run()
    aborts = [thaw(o.payload) for o in s.outputs if isinstance(o, Control) and o.kind == "abort"]
    assert aborts == [{"signal": 2, "reason": {"kind": "user"}}]
    assert model.id in s.core.outstanding_effects           # never broken off by the core
    assert s.of("turn/end") == [] and s.statuses() == ["running"]
    s.model_honours_abort(model)
    assert s.reasons() == ["aborted"] and s.statuses() == ["running", "idle"]


# --------------------------------------------------------------------------
# R0.8 warnings: the live output and its four texts
# --------------------------------------------------------------------------

BOOM = ErrorInfo("boom", "HookError", causes=("disk full",))


def _warned_by(impl: str, case: str) -> Scenario:
    s = scenario(impl, model_failure("overloaded", "E_BUSY") if case == "recovery" else "ok")
    if case == "admission":
        s.handle("prompt-submit", lambda _e: ("raise", BOOM))
    elif case == "invalid":
        s.handle("prompt-submit", lambda _e: ("resolve", {"kind": "maybe"}))
    elif case == "recovery":
        s.handle("request-error", lambda _e: ("raise", BOOM))
    else:
        s.handle("flush", lambda _e: ("raise", BOOM))
    s.followup("go")
    s.run()
    return s


@both
@pytest.mark.parametrize(("case", "text"), [
    ("admission", "prompt admission failed: boom: disk full"),
    ("invalid", "prompt admission returned an invalid decision: "),
    ("recovery", "request recovery failed: boom: disk full"),
    ("flush", "session flush failed at turn 1: boom: disk full"),
])
def test_R0_8_a_warning_is_the_live_output_agent_warning_with_its_text(
        impl: str, case: str, text: str) -> None:
    s = _warned_by(impl, case)
    warnings = [thaw(o.event.payload) for o in s.driver.live("agent/warning")]
    assert len(warnings) == 1 and set(warnings[0]) == {"text"}
    assert str(warnings[0]["text"]).startswith(text)
    if case == "invalid":
        assert len(str(warnings[0]["text"])) > len(text)          # it names the problem


# --------------------------------------------------------------------------
# R0.9 errors: the rendered text, coded errors
# --------------------------------------------------------------------------


@both
@pytest.mark.parametrize(("error", "rendered"), [
    (ErrorInfo("boom", "HookError"), "boom"),
    (ErrorInfo("", "HookError"), "HookError"),
    (ErrorInfo("boom", "HookError", causes=("inner", "")), "boom: inner: "),
    (ErrorInfo("", "HookError", causes=("inner",)), "HookError: inner"),
])
def test_R0_9_the_rendered_text_is_the_message_or_the_name_then_each_cause(
        impl: str, error: ErrorInfo, rendered: str) -> None:
    s = scenario(impl)
    s.handle("turn-stopping", lambda _e: ("raise", error))
    s.followup("go")
    s.run()
    (turn_end,) = s.of("turn/end")
    assert thaw(turn_end.data["reason"]) == {"kind": "error", "step": 1, "message": rendered}


@both
def test_R0_9_a_coded_error_carries_its_code_and_an_uncoded_one_none(impl: str) -> None:
    s = scenario(impl)
    s.handle("turn-stopping", lambda e: ("raise", ErrorInfo("busy", "HookError", "E_HOOK"))
             if e.payload["turn"] == 1 else ("raise", ErrorInfo("busy", "HookError")))
    s.followup("one")
    s.followup("two")
    s.run()
    reasons = [thaw(e.data["reason"]) for e in s.of("turn/end")]
    assert reasons == [{"kind": "error", "step": 1, "message": "busy", "code": "E_HOOK"},
                       {"kind": "error", "step": 1, "message": "busy"}]
    errors = [thaw(p["error"]) for p in s.live("agent/error")]
    assert errors == [{"name": "HookError", "message": "busy", "code": "E_HOOK"},
                      {"name": "HookError", "message": "busy"}]


def test_R0_3_pulling_through_output_puller_gives_what_next_output_gives() -> None:
    # A driver that pulls in a loop may hold AgentCore.output_puller() (the runtime's pump
    # does): the same outputs in the same order, None whenever the core waits for an input.
    from machine.core import AgentCore
    from machine.vocabulary import user_message

    calling, pulling = AgentCore(clock=lambda: 0.0), AgentCore(clock=lambda: 0.0)
    pull = pulling.output_puller()
    seen: list[list[Output]] = [[], []]
    for round_ in range(6):                  # the prompt, then its effects answered in turn
        for core, outputs, take in ((calling, seen[0], calling.next_output),
                                    (pulling, seen[1], pull)):
            batch: list[Output] = []
            while (output := take()) is not None:
                batch.append(output)
            outputs.extend(batch)
            if round_ == 0:
                core.followup(user_message("m1", "hi"))
            for effect in (o for o in batch if isinstance(o, Effect)):
                core.resolve(effect.id, {"kind": "allow"} if effect.kind == "prompt-submit"
                             else None)
    assert seen[0] == seen[1]
    assert [o.kind for o in seen[0] if isinstance(o, Effect)][:5] == [
        "tick", "prompt-submit", "step", "system-prompt", "request"]
    rest = [calling.drain_outputs(), []]
    while (output := pull()) is not None:
        rest[1].append(output)
    assert rest[0] == rest[1] and rest[0]
