"""R4, the state (specs/core.md §4): R4.4 the abort owner, R4.5 the open turn and step, R4.6
the pending wake, R4.7 the turn counter, R4.8 the header flag, R4.9 the pending retry, R4.10
the one activity that every completion moves on.

The couplings of the state are checked by the invariant monitor (tests/test_invariants.py); the
state's own tests are tests/test_state.py. Each test here drives the machine (`AgentCore`) and
the reference model (`ModelAgent`) with the same inputs and requires the rule of both.
"""

from __future__ import annotations

import pytest
from scenario_helpers import Scenario, aborts, both, reason_kinds, scenario

from machine.checking.scripted import Answer, Reply, calls_reply, model_failure
from machine.core import CoreConfig
from machine.errors import NotJsonCompatibleError
from machine.events import Event
from machine.jsonvalue import thaw
from machine.vocabulary import ErrorInfo

# --------------------------------------------------------------------------
# R4.4 abort owner
# --------------------------------------------------------------------------


@both
@pytest.mark.parametrize(("moment", "signal"), [
    ("agent/inbox/dequeue", 1),      # admission: the admission controller
    ("turn/start", 2),               # run: a fresh run controller
    ("turn/end", 2),                 # still installed while turn/end is observed
    ("agent/settled", None),         # gone after turn/end: nothing to abort
])
def test_R4_4_the_owner_is_the_admission_then_the_run_controller_until_turn_end(
        impl: str, moment: str, signal: int | None) -> None:
    s = scenario(impl)
    s.observe(moment, lambda _d: s.cancel(), once=True)
    s.followup("go")
    s.run()
    assert aborts(s) == ([] if signal is None else [{"signal": signal, "reason": {"kind": "user"}}])


@both
def test_R4_4_the_owner_is_gone_while_the_flush_is_outstanding(impl: str) -> None:
    s = scenario(impl)
    s.hold("flush")
    s.followup("go")
    s.run()
    s.cancel()
    s.resolve("flush")
    assert aborts(s) == [] and s.live_tokens("agent/cancel-requested") == []


@both
def test_R4_4_cancelling_never_removes_the_owner(impl: str) -> None:
    s = scenario(impl)
    s.hold("step")
    s.followup("go")
    s.run()
    s.cancel()
    s.cancel("parent")              # effective only because the owner is still installed
    s.resolve("step")
    assert s.live_tokens("agent/cancel-requested") == ["cancel-req(user)", "cancel-req(parent)"]
    assert aborts(s) == [{"signal": 2, "reason": {"kind": "user"}}]


# --------------------------------------------------------------------------
# R4.5 open turn and step
# --------------------------------------------------------------------------


@both
@pytest.mark.parametrize(("failing", "log"), [
    ("step", "TS(1,msg:user) UM('go') TE(1,error)"),                    # before step/start
    ("request", "TS(1,msg:user) UM('go') SS(1.1) SE(1.1) TE(1,error)"),  # within the step
    ("turn-stopping", "TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'ok') SE(1.1) "
                      "TE(1,error)"),                                    # after step/end
])
def test_R4_5_a_failure_closes_the_step_only_while_it_is_open_and_the_turn_once(
        impl: str, failing: str, log: str) -> None:
    s = scenario(impl)
    s.handle(failing, lambda _e: ("raise", ErrorInfo("boom")))
    s.followup("go")
    s.run()
    assert s.render() == log


# --------------------------------------------------------------------------
# R4.6 wake pending
# --------------------------------------------------------------------------


@both
def test_R4_6_wake_pending_spans_from_the_wake_request_until_the_wake_runs(impl: str) -> None:
    s = scenario(impl)
    s.run()
    seen: dict[str, bool] = {}

    def at(name: str) -> None:
        seen.setdefault(name, s.core.wake_pending)
    s.observe("agent/inbox/enqueue", lambda _d: at("enqueue"))
    s.observe("agent/status", lambda _d: at("running"))

    def pending() -> bool:  # a call: mypy would keep an asserted s.core.wake_pending narrowed
        return s.core.wake_pending
    assert not pending()
    s.followup("go")
    assert pending()                                # requested by the send
    s.hold("tick")
    s.run()
    assert pending() and seen == {"enqueue": True}
    s.resolve("tick")                               # the wake runs: cleared before it claims
    assert seen == {"enqueue": True, "running": False}
    assert not pending()


# --------------------------------------------------------------------------
# R4.7 turn counter
# --------------------------------------------------------------------------


def _two_turns() -> list[Event]:
    s = Scenario()
    s.followup("one")
    s.followup("two")
    s.run()
    return s.events


@both
def test_R4_7_the_turn_counter_starts_at_the_seeded_logs_last_turn(impl: str) -> None:
    seed = _two_turns()
    s = scenario(impl, seed=seed)
    s.followup("three")
    s.run()
    assert s.turn_numbers() == [1, 2, 3]
    fresh = scenario(impl)
    fresh.followup("first")
    fresh.run()
    assert fresh.turn_numbers() == [1]


@both
def test_R4_7_a_turn_start_appended_directly_updates_the_counter(impl: str) -> None:
    s = scenario(impl)
    s.core.append("turn/start", {"turn": 1, "trigger": {"kind": "retry"}})
    s.core.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    s.followup("go")
    s.run()
    assert s.turn_numbers() == [1, 2] and s.errors() == []
    assert s.user_texts() == ["go"]


# --------------------------------------------------------------------------
# R4.8 header flag
# --------------------------------------------------------------------------


def test_R4_8_V1_request_options_that_are_not_json_are_refused_naming_the_option() -> None:
    with pytest.raises(NotJsonCompatibleError) as refused:
        CoreConfig(request_options={"provider": "p", "model": "m", "x": {1}})
    assert str(refused.value) == "config.request_options.x: a set is not JSON-compatible"


@both
def test_R4_8_each_instance_logs_its_first_header_and_seeds_it_from_the_config(impl: str) -> None:
    seed = _two_turns()
    logged = thaw(seed[[e.type for e in seed].index("request/header")].data["header"])["config"]
    assert logged == {"provider": "test", "model": "test-model"}
    config = CoreConfig(request_options={"provider": "p", "model": "m"})
    s = scenario(impl, calls_reply(("c1", "t")), "done", config=config, seed=seed)
    s.followup("three")
    s.run()
    # the first request of this instance is seeded from its config, not from the log; the next
    # from the header it logged
    seeds = [thaw(e.payload["config"]) for e in s.effects("request")]
    assert seeds == [{"provider": "p", "model": "m"}, {"provider": "p", "model": "m"}]
    headers = [thaw(e.data) for e in s.of("request/header")]
    # the seeded log's header was logged once (initial); this instance logs its first one as
    # resume and the same header of its second step not at all
    assert [h["reason"] for h in headers] == ["initial", "resume"]
    assert headers[-1]["header"] == {"config": {"provider": "p", "model": "m"}}


# --------------------------------------------------------------------------
# R4.9 pending retry
# --------------------------------------------------------------------------


@both
def test_R4_9_a_retry_is_pending_from_recovery_until_its_run_starts(impl: str) -> None:
    s = scenario(impl, model_failure("overloaded", "E_BUSY"), "recovered")
    s.handle("request-error", lambda _e: ("resolve", {"kind": "retry"}))
    seen: list[tuple[str, bool]] = []
    s.observe("agent/error", lambda _d: seen.append(("error", s.core.retry_pending)))
    s.observe("turn/start", lambda d: seen.append((str(thaw(d["trigger"])["kind"]),
                                                    s.core.retry_pending)))
    s.hold("flush")
    s.followup("go")
    s.run()
    assert s.core.retry_pending                     # set by recovery, through the flush
    s.resolve("flush")
    assert seen == [("message", False), ("error", True), ("retry", False)]
    assert reason_kinds(s) == ["error", "completed"]


@both
def test_R4_9_an_effective_cancel_clears_the_pending_retry(impl: str) -> None:
    s = scenario(impl, model_failure("overloaded", "E_BUSY"), "never")
    s.handle("request-error", lambda _e: ("resolve", {"kind": "retry"}))
    s.hold("flush")
    s.followup("go")
    s.run()
    pending = s.core.retry_pending  # a local: mypy would keep s.core.retry_pending narrowed below
    assert pending
    s.cancel()
    assert not s.core.retry_pending
    s.resolve("flush")
    assert s.turn_numbers() == [1] and s.statuses() == ["running", "idle"]


# --------------------------------------------------------------------------
# R4.10 one activity, which every completion moves on
# --------------------------------------------------------------------------

BOOM = ErrorInfo("boom", "HookError")
ANSWERS: list[tuple[str, Answer | Reply]] = [
    ("tick", ("resolve", {"any": "value"})),
    ("prompt-submit", ("raise", BOOM)), ("prompt-submit", ("resolve", "junk")),
    ("step", ("raise", BOOM)),
    ("system-prompt", ("raise", BOOM)), ("system-prompt", ("resolve", float("nan"))),
    ("request", ("raise", BOOM)), ("request", ("resolve", 3)),
    ("model", BOOM), ("model", [{"type": "ping"}]), ("model", [{"type": "text", "text": "cut"}]),
    ("tool-prepare", ("raise", BOOM)), ("tool-prepare", ("resolve", "junk")),
    ("tool-execute", ("raise", BOOM)), ("tool-execute", ("resolve", "junk")),
    ("tool-finalize", ("raise", BOOM)), ("tool-finalize", ("resolve", "junk")),
    ("turn-stopping", ("raise", BOOM)),
    ("request-error", ("raise", BOOM)), ("request-error", ("resolve", "junk")),
    ("flush", ("raise", BOOM)), ("flush", ("resolve", "junk")),
]


@both
@pytest.mark.parametrize(("kind", "answer"), ANSWERS,
                         ids=[f"{k}-{i}" for i, (k, _) in enumerate(ANSWERS)])
def test_R4_10_every_completion_raised_or_malformed_moves_the_activity_on_to_its_end(
        impl: str, kind: str, answer: Answer | Reply) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), model_failure("overloaded", "E_BUSY"))
    s.handle(kind, lambda _e: answer, times=1)
    s.followup("go")
    s.run()
    assert s.driver.held == [] and s.core.outstanding_effects == ()
    assert s.statuses() == ["running", "idle"] and s.core.is_quiescent
    assert len(s.of("turn/start")) == len(s.of("turn/end"))
    assert len(s.effects("prompt-submit")) == 1     # one activity; nothing ran twice
