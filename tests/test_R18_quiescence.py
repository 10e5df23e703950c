"""R18, quiescence and ``whenIdle()`` (specs/core.md §18): quiescent means not busy, no wake
pending and nothing waking queued; quiet items and retained input do not prevent it; a pending
flush holds it back; failures inside the activity do not reach it.

Each test drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the
same inputs through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

import pytest
from scenario_helpers import Scenario, both, scenario

from machine.checking.scripted import calls_reply, model_failure, ok_result
from machine.conformance.authoring import output_token
from machine.io import Output
from machine.jsonvalue import FrozenDict
from machine.vocabulary import ErrorInfo


def quiescent_at(s: Scenario) -> list[tuple[str, bool]]:
    """Record, at every output from now on, the output and whether the agent is quiescent."""
    seen: list[tuple[str, bool]] = []

    def record(output: Output) -> None:
        seen.append((output_token(output), s.core.is_quiescent))
    s.on_output(record)
    return seen


# --------------------------------------------------------------------------
# R18 quiescence
# --------------------------------------------------------------------------


@both
def test_R18_a_run_is_quiescent_first_at_its_idle_output(impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), "done")
    s.run()
    idle = s.core.is_quiescent  # a local: mypy would keep s.core.is_quiescent narrowed below
    assert idle                                           # idle: immediately
    seen = quiescent_at(s)
    s.followup("go")
    assert not s.core.is_quiescent                        # a wake pending, a waking item queued
    s.run()
    quiet = [token for token, quiescent in seen if quiescent]
    assert quiet == ["idle"] and seen[-1] == ("idle", True)


@both
def test_R18_a_pending_flush_holds_quiescence_back(impl: str) -> None:
    s = scenario(impl)
    s.hold("flush")
    s.followup("go")
    s.run()
    assert s.core.status == "running" and not s.core.is_quiescent
    s.resolve("flush")
    assert s.core.is_quiescent


@both
def test_R18_quiet_items_and_retained_input_do_not_prevent_quiescence(impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")))
    s.env.tool_results["c1"] = ok_result("final", concludesTurn=True)

    def retain(_d: FrozenDict) -> None:
        s.inject("retained")                               # after the concluding step's drain
        s.send("quiet", "next-turn", False)
    s.observe("step/end", retain, once=True)
    s.followup("go")
    s.run()
    assert (s.core.pending_context, s.core.pending_queued) == (1, 1)
    assert s.core.is_quiescent and not s.core.wake_pending


@both
@pytest.mark.parametrize("failing", ["prompt-submit", "model", "flush"])
def test_R18_a_failure_inside_the_activity_ends_in_quiescence_not_an_exception(
        impl: str, failing: str) -> None:
    s = scenario(impl, model_failure("overloaded", "E_BUSY"))
    if failing != "model":
        s.handle(failing, lambda _e: ("raise", ErrorInfo("boom")))
    s.followup("go")
    s.run()                                               # nothing raised to the caller
    assert s.core.is_quiescent and s.statuses() == ["running", "idle"]
