"""R14, max tokens (specs/core.md §14): R14.1 what a max-tokens finish keeps, R14.2 no forced
continuation, R14.3 the turn's recorded reason.

Each test drives the machine (`AgentCore`) and the reference model (`ModelAgent`) with the
same inputs through the scripted driver, and requires the behaviour of the rule of both.
"""

from __future__ import annotations

from scenario_helpers import L, Scenario, both, scenario

from machine.checking.scripted import calls_reply, text_reply
from machine.jsonvalue import JsonLike, thaw
from machine.vocabulary import ErrorInfo

CUT: list[JsonLike] = [{"type": "text", "text": "partial answer"},
                       {"type": "finish", "kind": "max-tokens"}]


def reasons(s: Scenario) -> list[dict[str, JsonLike]]:
    return [thaw(e.data["reason"]) for e in s.of("turn/end")]


# --------------------------------------------------------------------------
# R14.1 the safe content stays; tool calls are removed and not dispatched
# --------------------------------------------------------------------------


@both
def test_R14_1_a_max_tokens_finish_keeps_the_text_and_drops_the_tool_calls_undispatched(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t"), text="before the cut", finish="max-tokens"))
    s.followup("go")
    s.run()
    (am,) = s.of("assistant/message")
    assert thaw(am.data["message"])["content"] == [{"type": "text", "text": "before the cut"}]
    assert s.of("tool/call") == [] and s.effects("tool-prepare") == []
    assert len(s.of("step/start")) == 1


@both
def test_R14_1_the_assistant_message_is_appended_even_when_nothing_is_left(impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t"), finish="max-tokens"))
    s.followup("go")
    s.run()
    (am,) = s.of("assistant/message")
    assert thaw(am.data["message"])["content"] == []
    assert len(s.of("assistant/chunk")) == 2           # the call's chunk and the finish


# --------------------------------------------------------------------------
# R14.2 no continuation is forced
# --------------------------------------------------------------------------


@both
def test_R14_2_a_max_tokens_step_reaches_turn_stopping_where_a_steer_goes_on(impl: str) -> None:
    s = scenario(impl, CUT, "rest of the answer")
    s.handle("turn-stopping", lambda _e: s.steer("continue"), times=1)
    s.followup("go")
    s.run()
    assert s.log() == L("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'partial answer') "
                        "SE(1.1) STM(1;'continue';user) SS(1.2) CH… AM(1.2;'rest of the answer') "
                        "SE(1.2) TE(1,max-tokens)")
    assert len(s.effects("turn-stopping")) == 2


@both
def test_R14_2_without_a_steer_the_turn_ends_after_the_cut_step(impl: str) -> None:
    s = scenario(impl, CUT)
    s.followup("go")
    s.run()
    assert len(s.of("step/start")) == 1 and len(s.effects("turn-stopping")) == 1


# --------------------------------------------------------------------------
# R14.3 the turn's recorded reason
# --------------------------------------------------------------------------


@both
def test_R14_3_max_tokens_stays_through_later_steps_settles_completed_and_resets_next_turn(
        impl: str) -> None:
    s = scenario(impl, CUT, calls_reply(("c1", "t")), "done", "next turn")
    s.handle("turn-stopping", lambda _e: s.steer("continue"), times=1)
    s.followup("go")
    s.run()
    s.followup("again")
    s.run()
    assert reasons(s) == [{"kind": "max-tokens"}, {"kind": "completed"}]
    assert s.live_tokens("agent/settled") == ["settled(1,completed)", "settled(2,completed)"]
    assert len(s.of("step/start")) == 4


@both
def test_R14_3_a_later_error_in_the_turn_replaces_max_tokens(impl: str) -> None:
    s = scenario(impl, CUT, "never")
    s.handle("turn-stopping", lambda _e: ("raise", ErrorInfo("stop hook")))
    s.followup("go")
    s.run()
    assert reasons(s) == [{"kind": "error", "step": 1, "message": "stop hook"}]


@both
def test_R14_3_a_later_abort_in_the_turn_replaces_max_tokens(impl: str) -> None:
    s = scenario(impl, CUT, text_reply("never"))
    s.hold("turn-stopping")
    s.followup("go")
    s.run()
    s.cancel()
    s.resolve("turn-stopping")
    assert reasons(s) == [{"kind": "aborted"}]
