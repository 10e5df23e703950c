"""R3, live outputs and effects (specs/core.md §3): R3.1 when each live output appears, R3.2
extension points as effects whose defaults and composition live in the environment.

Each test drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the
same inputs through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

import pytest
from scenario_helpers import Scenario, both, msg, scenario

from machine.checking.scripted import model_failure
from machine.errors import ProtocolError
from machine.io import Live
from machine.jsonvalue import thaw
from machine.vocabulary import ErrorInfo


def tokens(s: Scenario, since: int = 0) -> list[str]:
    return s.trace("*", "*", controls=True, publication=True, since=since)


def live_types(s: Scenario) -> list[str]:
    return [o.event.type for o in s.outputs if isinstance(o, Live)]


# --------------------------------------------------------------------------
# R3.1 when live outputs appear
# --------------------------------------------------------------------------


@both
def test_R3_1_a_turn_has_its_status_inbox_and_settled_outputs_at_their_moments(impl: str) -> None:
    s = scenario(impl)
    s.followup("go")
    s.run()
    assert [t for t in tokens(s) if not t.startswith("[")] == [
        "session/created", "agent/created", "session-start(startup)",   # construction (P11)
        "tick(wake)", "enq(go,q)",                  # stored as queued: enqueue
        "running",                                  # the claim made while not busy
        "⟨prompt-submit⟩", "deq(go,q)",             # dequeue just after {prompt-submit}
        "⟨step 1.1⟩", "⟨system-prompt 1.1⟩", "⟨request 1.1⟩", "⟨model 1.1⟩",
        "⟨turn-stopping 1⟩", "flush(1)",
        "settled(1,completed)",                     # the chain's last turn closed and flushed
        "idle"]                                     # continue-or-idle, nothing waking queued


@both
def test_R3_1_inject_produces_no_inbox_output_and_a_drained_steer_is_dequeued_before_its_record(
        impl: str) -> None:
    s = scenario(impl)
    s.inject("idle context")                        # appended at once: no live output
    s.run()
    assert live_types(s)[3:] == []
    s.hold("step")
    s.followup("go")
    s.run()
    s.inject("staged context")                      # window open: staged, still no live output
    s.steer("steering")
    s.resolve("step")
    trace = tokens(s)
    assert [t for t in trace if t.startswith(("enq", "deq"))] == [
        "enq(go,q)", "deq(go,q)", "enq(steering,s)", "deq(steering,s)"]
    steered = trace.index("deq(steering,s)")
    assert trace[steered + 1] == "[STM(1;'steering';user)]"
    assert "[UM('staged context';plugin:test)]" in trace


@both
def test_R3_1_cancel_and_teardown_report_only_non_empty_discards_then_the_disposed_notices(
        impl: str) -> None:
    s = scenario(impl)
    s.run()
    s.send("quiet", "next-turn", False)
    s.cancel()                                      # effective: queued item, no context
    s.run()
    assert tokens(s)[3:] == ["enq(quiet,q)", "cancel-req(user)", "disc[quiet]"]
    s.send("quiet again", "next-turn", False)
    s.dispose()                                     # no cancel-requested for `disposed`
    s.run()
    assert tokens(s)[6:] == ["enq(quiet again,q)", "disc[quiet again]", "agent/disposed",
                             "session/disposed"]


@both
def test_R3_1_agent_error_comes_from_a_failure_that_is_not_an_abort_and_from_a_failed_flush(
        impl: str) -> None:
    s = scenario(impl, model_failure("overloaded", "E_BUSY"))
    s.handle("flush", lambda _e: ("raise", ErrorInfo("disk full", "IOError")), times=1)
    s.followup("go")
    s.run()
    assert [(turn, step) for turn, step, _ in s.errors()] == [(1, 1), (1, 1)]
    assert [m for _, _, m in s.errors()] == ["overloaded", "disk full"]
    s.hold("model")
    s.followup("again")
    s.run()
    model = s.take("model")
    s.cancel()
    s.model_honours_abort(model)                    # the abort fails the turn: no agent/error
    assert len(s.errors()) == 2 and s.reasons()[-1] == "aborted"


# --------------------------------------------------------------------------
# R3.2 extension points are effects: defaults live in the environment
# --------------------------------------------------------------------------


@both
def test_R3_2_the_core_applies_no_default_a_null_decision_header_or_recovery_is_taken_as_given(
        impl: str) -> None:
    s = scenario(impl, model_failure("overloaded", "E_BUSY"))
    s.handle("prompt-submit", lambda _e: ("resolve", None), times=1)   # nobody decided: null
    s.followup("refused")
    s.run()
    assert s.warnings()[0].startswith("prompt admission returned an invalid decision: ")
    assert s.events == []
    s.handle("request", lambda _e: ("resolve", None), times=1)         # no header built
    s.followup("no header")
    s.run()
    (first,) = s.of("turn/end")
    assert thaw(first.data["reason"])["code"] == "INVALID_REQUEST_CONFIG"
    s.followup("no recovery")                                          # request-error: null
    s.run()
    assert len(s.effects("request-error")) == 1 and not s.core.retry_pending
    assert [thaw(e.data["trigger"])["kind"] for e in s.of("turn/start")] == ["message", "message"]


@both
def test_R3_2_one_request_and_one_completion_per_extension_point(impl: str) -> None:
    s = scenario(impl, "one", "two")
    s.followup("go")
    s.steer("more")
    s.run()
    counts = {kind: len(s.effects(kind)) for kind in ("prompt-submit", "step", "request", "model")}
    assert counts == {"prompt-submit": 2, "step": 2, "request": 2, "model": 2}


@both
def test_R3_2_a_completion_value_is_validated_when_consumed_not_when_fed(impl: str) -> None:
    s = scenario(impl)
    s.hold("prompt-submit")
    s.followup("go")
    s.run()
    decision = s.take("prompt-submit")
    s.core.resolve(decision.id, {"kind": "maybe"})      # accepted: its value is not checked here
    assert s.warnings() == []
    s.run()                                             # consumed: an invalid decision (R7.11)
    assert s.warnings()[0].startswith("prompt admission returned an invalid decision: ")
    assert s.events == []
    with pytest.raises(ProtocolError):                  # the envelope is checked at once (P10)
        s.core.chunk(decision.id, {"type": "text", "text": "x"})
    s.followup(msg("next"))
    s.run()
    assert s.reasons() == ["completed"]
