"""R17, ``dispose()`` (specs/core.md §17), from the call to teardown: R17.1 its steps, R17.2
results after the abort, R17.3 commands before and after teardown.

No new work while disposing and the teardown report are in tests/test_R17_dispose.py.
Each test here drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the
same inputs through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from scenario_helpers import L, Scenario, aborts, both, msg, result_with_contexts, scenario, tokens

from machine.checking.scripted import calls_reply, model_failure
from machine.core import AgentCore
from machine.errors import DisposedError
from machine.vocabulary import ErrorInfo


def streaming(impl: str) -> tuple[Scenario, int]:
    """Turn 1 waits on its held model call; the effect id."""
    s = scenario(impl)
    s.hold("model")
    s.followup("go")
    s.run()
    return s, s.take("model").id


# --------------------------------------------------------------------------
# R17.1 steps
# --------------------------------------------------------------------------


@both
def test_R17_1_dispose_cancels_at_once_as_disposed_and_tears_down_only_once_quiescent(
        impl: str) -> None:
    s, model = streaming(impl)
    s.send("quiet", "next-turn", False)
    s.pump()
    before = len(s.outputs)
    s.dispose()
    s.run()
    assert tokens(s, before) == ["disc[quiet]", "abort(disposed)"]   # no cancel-requested
    assert s.core.disposing and not s.core.disposed                 # the model call is awaited
    s.core.fail(model, ErrorInfo("the operation was aborted", "AbortError"))
    s.run()
    assert tokens(s)[-7:] == ["[SE(1.1)]", "[TE(1,disposed)]", "flush(1)", "settled(1,aborted)",
                              "idle", "agent/disposed", "session/disposed"]
    assert s.core.disposed


@both
def test_R17_1_a_turn_aborted_earlier_by_another_cause_keeps_that_reason(impl: str) -> None:
    s, model = streaming(impl)
    s.cancel("parent")
    s.dispose()
    s.core.fail(model, ErrorInfo("the operation was aborted", "AbortError"))
    s.run()
    assert s.reasons() == ["aborted"]
    assert aborts(s) == [{"signal": 2, "reason": {"kind": "parent"}}]


@both
def test_R17_1_calling_dispose_again_before_teardown_repeats_the_cancel(impl: str) -> None:
    s, model = streaming(impl)
    s.dispose()
    s.run()
    s.send("quiet", "next-turn", False)
    s.dispose()
    s.run()
    assert s.live_tokens("agent/inbox/discard") == ["disc[quiet]"]
    assert len(aborts(s)) == 1 and s.live("agent/cancel-requested") == []
    s.core.fail(model, ErrorInfo("the operation was aborted", "AbortError"))
    s.run()
    assert s.live_tokens("agent/disposed") == ["agent/disposed"]


# --------------------------------------------------------------------------
# R17.2 results after the abort
# --------------------------------------------------------------------------


@both
def test_R17_2_context_finalize_produces_after_the_disposal_abort_is_staged_and_drained(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")))
    s.hold("tool-execute")
    s.handle("tool-finalize", lambda e: ("resolve", result_with_contexts(
        "finalized", msg("from finalize", "plugin:t"))))
    s.followup("go")
    s.run()
    s.dispose()
    s.resolve("tool-execute", result_with_contexts("body"))
    log = s.log()
    assert log[log.index("TC(1.1;c1)"):] == L(
        "TC(1.1;c1) TR(1.1;c1;ERR ABORTED) UM('from finalize';plugin:t) SE(1.1) TE(1,disposed)")
    assert s.core.disposed


@both
def test_R17_2_disposing_during_a_failed_turns_flush_drops_its_retry(impl: str) -> None:
    s = scenario(impl, model_failure("overloaded", "E_BUSY"), "never")
    s.handle("request-error", lambda _e: ("resolve", {"kind": "retry"}))
    s.hold("flush")
    s.followup("go")
    s.run()
    assert s.core.retry_pending
    s.dispose()
    s.resolve("flush")
    assert s.turn_numbers() == [1] and s.effects("model")[1:] == []
    assert s.core.disposed and s.reasons()[0].startswith("error")


# --------------------------------------------------------------------------
# R17.3 commands before and after teardown
# --------------------------------------------------------------------------


@both
def test_R17_3_until_teardown_commands_behave_as_usual(impl: str) -> None:
    s, model = streaming(impl)
    s.dispose()
    s.inject("staged while disposing")                 # the window is still open
    s.core.append("x-test/mark", {"n": 1})
    assert s.core.pending_context == 1 and s.events[-1].type == "x-test/mark"
    s.core.fail(model, ErrorInfo("the operation was aborted", "AbortError"))
    s.run()
    assert s.live_tokens("agent/context/discard") == ["ctxdisc[staged while disposing]"]


COMMANDS: dict[str, Callable[[AgentCore], object]] = {
    "send": lambda core: core.send({"not": "a message"}, {"target": "nowhere"}),
    "followup": lambda core: core.followup(None),
    "steer": lambda core: core.steer(msg("fine")),
    "inject": lambda core: core.inject(msg("fine")),
    "cancel": lambda core: core.cancel({"kind": ""}, keep_inbox=True),
    "append": lambda core: core.append("x-test/mark", {"n": 1}),
}


@both
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_R17_3_after_teardown_every_command_but_dispose_raises_DisposedError_before_any_check(
        impl: str, command: str) -> None:
    s = scenario(impl)
    s.dispose()
    s.run()
    assert s.core.disposed
    before = (len(s.outputs), len(s.events))
    with pytest.raises(DisposedError):
        COMMANDS[command](s.core)
    s.core.dispose()                                   # does nothing
    s.run()
    assert (len(s.outputs), len(s.events)) == before
