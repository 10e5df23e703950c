"""R20 invariants. The R20.1 invariant monitor: the ledger starts at the command, and a claim
is followed to its dequeue. Each check is shown catching a bug planted in a copy of the core
(monkeypatch) that the output-only ledger let through, and staying silent on the real core;
each report names its rule and states the counts it found. R20.2: a direct append keeps its
envelope.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from scenario_helpers import plant_phase

from machine import events as ev
from machine.checking.invariants import AgentInvariantError, InvariantMonitor, conservation_problem
from machine.checking.search import CONFIGURATIONS
from machine.core import AgentCore, CoreConfig, admission, commands, drains, tools
from machine.core.loop import Action, ClaimFrame, goto
from machine.core.records import frozen_message
from machine.core.state import CoreState
from machine.events import Event, LiveEvent
from machine.io import Append, Cancel, Durable, Effect, Input, Live, Output, Resolve, Send
from machine.jsonvalue import FrozenDict, FrozenList, freeze
from machine.vocabulary import FOLLOWUP, INJECT, user_message

CONFIG = CoreConfig(request_options={"provider": "p", "model": "m"}, publish=False)


def msg(message_id: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "content": [{"type": "text", "text": message_id}],
            "source": {"kind": "user"}}


class Monitored:
    """A core whose every input and output goes through a monitor that sees the inputs."""

    def __init__(self) -> None:
        self.core = AgentCore(CONFIG)
        self.monitor = InvariantMonitor(self.core, self.core, sees_inputs=True)
        self.outputs: list[Output] = []

    def feed(self, item: Input) -> None:
        self.core.feed(item)
        self.monitor.input(item)
        self.monitor.poll()

    def pull(self, count: int | None = None) -> list[Output]:
        """Pull *count* outputs (all when None); a quiet poll when the core waits."""
        pulled: list[Output] = []
        while count is None or len(pulled) < count:
            output = self.core.next_output()
            if output is None:
                self.monitor.poll(quiet=True)
                break
            self.monitor.output(output)
            pulled.append(output)
        self.outputs += pulled
        return pulled

    def pull_until(self, predicate: Callable[[Output], bool]) -> Output:
        while True:
            output = self.pull(1)[0]
            if predicate(output):
                return output

    def answer(self, kind: str, value: Any = None) -> None:
        effect = next(e for e in self.core.outstanding() if e.kind == kind)
        self.feed(Resolve(effect.id, value))


def _is(kind: str) -> Callable[[Output], bool]:
    return lambda o: (isinstance(o, Effect) and o.kind == kind) or (
        isinstance(o, Live) and o.event.type == kind)


# --------------------------------------------------------------------------
# Accepted sends enter the ledger at the command (R20.1b, R20.1c, R5.2, R0.6, D4)
# --------------------------------------------------------------------------


def _inject_at_idle(run: Monitored) -> None:
    run.feed(Send(msg("c1"), INJECT, preset="inject"))
    run.pull()


def test_R20_1c_a_closed_window_inject_is_in_the_ledger() -> None:
    run = Monitored()
    _inject_at_idle(run)                      # appended at once: balanced, nothing raised
    assert run.monitor.injected == {"c1": 1} and run.monitor.logged == {"c1": 1}


def test_R20_1c_an_inject_of_a_message_object_is_in_the_ledger_by_its_id() -> None:
    """A Send may carry a `Message` (R5.1) rather than its JSON: the ledger takes its id."""
    run = Monitored()
    run.feed(Send(user_message("c1", "c1"), INJECT, preset="inject"))
    run.pull()
    assert run.monitor.injected == {"c1": 1} and run.monitor.logged == {"c1": 1}


def test_R20_1c_a_dropped_closed_window_inject_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: an inject with the window closed is accepted and never appended (the D4 bug
    at any position). No output is missing that the output ledger knew to expect."""
    route = commands.route

    def dropping(core: CoreState, message: Any, options: Any) -> None:
        if options.target == "next-step" and not options.wakeup and not core.window.is_open:
            return
        route(core, message, options)

    monkeypatch.setattr(commands, "route", dropping)
    run = Monitored()
    with pytest.raises(AgentInvariantError, match=r"\[R20\.1c\] inject 'c1': accepted 1 "
                       r"time\(s\), but appended 0, still staged 0, reported discarded 0"):
        _inject_at_idle(run)
    assert run.outputs == []                  # nothing at all came out of the drop


def test_R20_1c_an_inject_accepted_more_often_than_it_has_fates_is_named_with_each_count() -> None:
    boxes = _Boxes()
    monitor = InvariantMonitor(_Agent("idle"), boxes, sees_inputs=True)
    for _ in range(2):
        monitor.input(Send(msg("c1"), INJECT, preset="inject"))
    boxes.staged_items = (("c1", False),)         # one of the two is staged, the other lost
    error = _monitor_error(lambda: monitor.poll(quiet=True))
    assert error.rule == "R20.1c"
    assert str(error) == ("[R20.1c] inject 'c1': accepted 2 time(s), but appended 0, "
                          "still staged 1, reported discarded 0")


def test_R20_1b_a_send_that_is_never_announced_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: a followup made while busy is accepted and silently dropped (no enqueue, not
    queued): the output-only conservation balances, the command ledger does not."""
    route = commands.route

    def dropping(core: CoreState, message: Any, options: Any) -> None:
        if options == FOLLOWUP and core.busy:
            return
        route(core, message, options)

    monkeypatch.setattr(commands, "route", dropping)
    run = Monitored()
    run.feed(Send(msg("go"), FOLLOWUP, preset="followup"))
    run.pull()
    run.answer("tick")
    run.pull_until(_is("prompt-submit"))
    run.feed(Send(msg("later"), FOLLOWUP, preset="followup"))
    assert conservation_problem(run.monitor.enqueued, run.monitor.dequeued,
                                run.monitor.discarded, ["go"]) is None
    with pytest.raises(AgentInvariantError, match=r"\[R20\.1b\] message 'later': accepted 1 "
                       r"time\(s\) by a send, but announced by 0 agent/inbox/enqueue"):
        run.pull()


# --------------------------------------------------------------------------
# A claimed item keeps its dequeue (R7.5, R7.6, R20.1b)
# --------------------------------------------------------------------------


def _cancel_at_running(run: Monitored) -> None:
    """followup from idle, the wake, and a cancel at `agent/status running` (R19 row 2)."""
    run.feed(Send(msg("go"), FOLLOWUP, preset="followup"))
    run.pull()
    run.answer("tick")
    run.pull_until(lambda o: isinstance(o, Live) and o.event.type == ev.STATUS)
    run.feed(Cancel({"kind": "user"}))
    run.pull()


def test_R7_5_an_admission_aborted_at_running_keeps_its_dequeue() -> None:
    run = Monitored()
    _cancel_at_running(run)
    assert run.monitor.dequeued == {"go": 1} and run.monitor.claimed is None


def _bent_claim(monkeypatch: pytest.MonkeyPatch,
                replace: Callable[[CoreState, Live], Live | None]) -> None:
    """Plant a claim whose dequeue, when the admission is already aborted (R7.5: the phase
    that gives it), is replaced by what *replace* returns (None: left out)."""
    def bent(core: CoreState, frame: ClaimFrame, _sent: object) -> Action:
        assert frame.dequeue is not None
        replacement = replace(core, frame.dequeue)
        if replacement is None:
            return goto(core, frame, admission.claim_tick)
        frame.phase = admission.claim_tick
        return replacement
    plant_phase(monkeypatch, admission, "claim_early_dequeue", bent)


def test_R20_1b_an_aborted_admission_without_its_dequeue_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the dequeue of an admission aborted before its decision is left out."""
    _bent_claim(monkeypatch, lambda core, dequeue: None)
    run = Monitored()
    with pytest.raises(AgentInvariantError, match=r"\[R20\.1b\] the claimed item 'go' got no "
                       r"agent/inbox/dequeue before the rejected admission's tick"):
        _cancel_at_running(run)


def test_R20_1b_a_claimed_item_reported_discarded_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the aborted admission reports its claimed item in an inbox discard instead of
    its dequeue. The counts balance (enqueued once, discarded once), so only following the
    claim catches it."""
    def as_discard(core: CoreState, dequeue: Live) -> Live:
        message = dequeue.event.payload["message"]
        return Live(LiveEvent(ev.INBOX_DISCARD, FrozenDict({"messages": FrozenList([message])})))

    _bent_claim(monkeypatch, as_discard)
    run = Monitored()
    assert conservation_problem({"go": 1}, {}, {"go": 1}, []) is None
    with pytest.raises(AgentInvariantError, match=r"\[R20\.1b\] the claimed item 'go' is "
                       r"listed in a discard instead of its dequeue"):
        _cancel_at_running(run)


def test_R20_1b_a_dequeue_of_another_item_than_the_claimed_one_is_caught() -> None:
    run = Monitored()
    run.feed(Send(msg("go"), FOLLOWUP, preset="followup"))
    run.pull()
    run.answer("tick")
    run.pull_until(lambda o: isinstance(o, Live) and o.event.type == ev.STATUS)
    forged = Live(LiveEvent(ev.INBOX_DEQUEUE, FrozenDict({"message": FrozenDict(
        {"id": "other"}), "placement": "queued"})))
    with pytest.raises(AgentInvariantError, match=r"dequeue of 'other', but 'go' was claimed"):
        run.monitor.output(forged)


# --------------------------------------------------------------------------
# R20.1: the monitor names the rule and reports the counts it found
# --------------------------------------------------------------------------


class _Agent:
    def __init__(self, status: str = "running", accepts_next_step: bool = False) -> None:
        self.status = status
        self.accepts_next_step = accepts_next_step


class _Boxes:
    def __init__(self) -> None:
        self.queued: tuple[str, ...] = ()
        self.staged_items: tuple[tuple[str, bool], ...] = ()

    def queued_ids(self) -> tuple[str, ...]:
        return self.queued

    def staged(self) -> tuple[tuple[str, bool], ...]:
        return self.staged_items


def _status(status: str) -> Live:
    return Live(LiveEvent("agent/status", freeze({"status": status})))  # type: ignore[arg-type]


def _monitor_error(action: Any) -> AgentInvariantError:
    with pytest.raises(AgentInvariantError) as info:
        action()
    return info.value


def test_R20_1a_monitor_reports_a_repeated_or_idle_first_status_under_R20_1a() -> None:
    monitor = InvariantMonitor(_Agent(), _Boxes())
    monitor.output(_status("running"))
    error = _monitor_error(lambda: monitor.output(_status("running")))
    assert error.rule == "R20.1a"
    assert str(error) == "[R20.1a] agent/status 'running' after 'running'"
    error = _monitor_error(lambda: InvariantMonitor(_Agent(), _Boxes()).output(_status("idle")))
    assert error.rule == "R20.1a"


def test_R20_1b_monitor_error_names_its_rule() -> None:
    core = AgentCore()
    monitor = InvariantMonitor(core, core)
    bogus = Live(LiveEvent("agent/inbox/discard", freeze({"messages": [msg("x")]})))  # type: ignore[arg-type]
    with pytest.raises(AgentInvariantError) as caught:
        monitor.output(bogus)
    assert caught.value.rule == "R20.1b"
    assert str(caught.value).startswith("[R20.1b] ")


def test_R20_1b_conservation_problem_reports_a_lost_message_with_its_counts() -> None:
    assert conservation_problem({"m1": 2}, {"m1": 1}, {}, ["m1"]) is None
    assert conservation_problem({"m1": 1}, {}, {}, []) == (
        "message 'm1': enqueued 1 time(s), but dequeued 0, discarded 0, pending 0")
    assert conservation_problem({"m1": 3}, {"m1": 1}, {"m1": 1}, []) == (
        "message 'm1': enqueued 3 time(s), but dequeued 1, discarded 1, pending 0")


@pytest.mark.parametrize(("dequeued", "discarded", "counts"), [
    ({"m1": 1}, {}, "dequeued 1, discarded 0"),
    ({}, {"m1": 1}, "dequeued 0, discarded 1"),
])
def test_R20_1b_conservation_problem_reports_a_message_that_was_never_enqueued(
        dequeued: dict[str, int], discarded: dict[str, int], counts: str) -> None:
    assert conservation_problem({}, dequeued, discarded, []) == (
        f"message 'm1': enqueued 0 time(s), but {counts}, pending 0")


def test_R20_1c_monitor_reports_the_counts_of_a_context_logged_twice() -> None:
    boxes = _Boxes()
    monitor = InvariantMonitor(_Agent(), boxes)
    boxes.staged_items = (("c1", False),)
    monitor.poll()                      # c1 is staged once
    boxes.staged_items = ()
    data = {"id": "c1", "role": "user", "content": [{"type": "text", "text": "x"}],
            "source": {"kind": "user"}}
    logged = Durable(Event("user/message", 0, 0, freeze(data), "append"))  # type: ignore[arg-type]
    monitor.output(logged)              # ... and logged once: balanced
    error = _monitor_error(lambda: monitor.output(logged))
    assert error.rule == "R20.1c"
    assert str(error) == ("[R20.1c] context 'c1' staged 1 time(s) but logged 2, discarded 0, "
                          "still staged 0")


def test_R20_1e_monitor_reports_an_open_window_while_idle_under_R20_1e() -> None:
    agent = _Agent("running", accepts_next_step=True)
    monitor = InvariantMonitor(agent, _Boxes())
    monitor.poll()  # running with the window open: fine
    agent.status, agent.accepts_next_step = "idle", False
    monitor.poll()  # idle with the window closed: fine
    agent.accepts_next_step = True
    error = _monitor_error(monitor.poll)
    assert error.rule == "R20.1e"
    assert str(error) == "[R20.1e] accepts_next_step is true while idle"


def _execute(effect: int) -> Effect:
    return Effect(effect, "tool-execute", freeze({"call": {"id": f"c{effect}"}}))  # type: ignore[arg-type]


class _Pool(_Agent):
    """An agent whose tool-execute effects the test says are outstanding."""

    def __init__(self, limit: int) -> None:
        super().__init__("running")
        self.config = CoreConfig(request_options={"provider": "p", "model": "m"},
                                 max_parallel_tool_calls=limit)
        self.outstanding_effects: tuple[int, ...] = ()


def test_R20_1g_monitor_counts_the_calls_in_flight_against_the_pool_limit() -> None:
    """R20.1g (R10.2, P11): a completed call leaves the count; one over the limit is named
    with the effects in flight."""
    agent = _Pool(limit=2)
    monitor = InvariantMonitor(agent, _Boxes())
    for effect, outstanding in ((3, (3,)), (4, (3, 4)), (5, (4, 5))):   # 3 completed first
        agent.outstanding_effects = outstanding
        monitor.output(_execute(effect))
    agent.outstanding_effects = (4, 5, 6)
    error = _monitor_error(lambda: monitor.output(_execute(6)))
    assert error.rule == "R20.1g"
    assert str(error) == ("[R20.1g] 3 tool calls in flight (effects [4, 5, 6]), but "
                          "max_parallel_tool_calls is 2")


def test_R20_1g_a_pool_that_starts_one_call_over_its_limit_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the pool's limit off by one (a bug the model could share, ASSURANCE.md
    section 1: the differential test cannot see it). The explorer's parallel configuration
    (three parallel calls, limit 2) reports it as the third call is requested."""
    fill = tools.batch_fill

    def over(core: CoreState, frame: Any, sent: object) -> Action:
        if frame.pool:
            frame.limit = core.config.max_parallel_tool_calls + 1
        return fill(core, frame, sent)

    plant_phase(monkeypatch, tools, "batch_fill", over)
    with pytest.raises(AgentInvariantError, match=r"\[R20\.1g\] 3 tool calls in flight"):
        explorer = CONFIGURATIONS["parallel"].explorer(with_model=False)
        node = explorer.replay(explorer.prefix)     # the first call's execution requested
        for _ in range(20):                          # each next call prepared, none finished
            preparing = any(e.kind == "tool-prepare" for e in node.core.outstanding())
            explorer.apply(node, ("ans", "tool-prepare", "ok") if preparing else ("pull",))


def test_R20_1h_monitor_names_a_steering_record_before_its_dequeue() -> None:
    """R20.1h (R11.1, R3.1): a steering/message the loop writes follows its dequeue notice;
    a second record of the same message needs a second dequeue; a direct append of
    steering/message (extension code, R20.2) is not the loop's."""
    monitor = InvariantMonitor(_Agent("running"), _Boxes(), sees_inputs=True)
    message = freeze(msg("s1"))
    monitor.output(Live(LiveEvent(ev.INBOX_ENQUEUE, freeze(  # type: ignore[arg-type]
        {"message": message, "placement": "steering"}))))
    monitor.output(Live(LiveEvent(ev.INBOX_DEQUEUE, freeze(  # type: ignore[arg-type]
        {"message": message, "placement": "steering"}))))
    record = Durable(Event(ev.STEERING_MESSAGE, 4, 1.0, freeze(  # type: ignore[arg-type]
        {"turn": 1, "message": message})))
    monitor.output(record)                                   # after its dequeue: fine
    monitor.input(Append(ev.STEERING_MESSAGE, {"turn": 1, "message": msg("s1")}))
    monitor.output(record)                                   # the direct append's: fine
    error = _monitor_error(lambda: monitor.output(record))   # a third, with no dequeue
    assert error.rule == "R20.1h"
    assert str(error) == "[R20.1h] steering/message of 's1' (seq 4) before its agent/inbox/dequeue"


def test_R20_1h_a_drain_that_records_steering_before_its_dequeue_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the drain gives a steering item's record first and its dequeue notice next
    (both outputs there, in the wrong order: a bug the model could share, ASSURANCE.md
    section 1). A steer while the model streams, drained when the turn goes on (R8.5)."""
    take = drains.take_front

    def record_first(core: CoreState, frame: Any, sent: object) -> Action:
        action = take(core, frame, sent)
        if isinstance(action, Live) and frame.steering is not None:
            return core.commit(ev.STEERING_MESSAGE, {"turn": core.turn, "message": (
                frozen_message(frame.steering))}, surface=True)
        return action

    def notice_next(core: CoreState, frame: Any, _sent: object) -> Action:
        message = frame.steering
        frame.steering = None
        frame.phase = drains.take_front
        return Live(LiveEvent(ev.INBOX_DEQUEUE, FrozenDict._adopt({
            "message": frozen_message(message), "placement": "steering"})))

    plant_phase(monkeypatch, drains, "take_front", record_first)
    plant_phase(monkeypatch, drains, "append_steering", notice_next)
    explorer = CONFIGURATIONS["turn"].explorer(with_model=False)
    node = explorer.replay(explorer.prefix)         # a followup, its model request outstanding
    with pytest.raises(AgentInvariantError, match=r"\[R20\.1h\] steering/message of 'm\d+'"):
        for action in (("cmd", "steer"), ("ans", "model", "text"), ("macro", "settle")):
            explorer.apply(node, action)


# --------------------------------------------------------------------------
# R20.2 session invariants: a direct append
# --------------------------------------------------------------------------


def test_R20_2_direct_append_keeps_its_source_event_seqs() -> None:
    core = AgentCore(CoreConfig(publish=False))
    core.append("user/message", msg("first"), surface_op="append")
    event = core.append("user/message", msg("second"), surface_op="append", source_event_seqs=[0])
    assert event.source_event_seqs == (0,)
    assert core.log.events[1].source_event_seqs == (0,)


# ---------------------------------------------------------------------------
# R20.5 provider requests
# ---------------------------------------------------------------------------


def _planted_core_steering_inside_the_batch(monitor: Callable[[AgentCore], InvariantMonitor]
                                            ) -> InvariantMonitor:
    """A core whose log gets a steering message between a call and its result, as a core
    that drained steering inside its tool batch would write it (direct appends stand in for
    the planted bug), watched by the monitor *monitor* makes, which sees each append."""
    core = AgentCore(CONFIG)
    log = core.log
    watching = monitor(core)
    log.subscribe(lambda event: watching.output(Durable(event)))
    log.append("turn/start", {"turn": 1, "trigger": {"kind": "message",
                                                     "source": {"kind": "user"}}})
    log.append("user/message", msg("u1"), surface_op="append")
    log.append("step/start", {"turn": 1, "step": 1})
    log.append("assistant/message", {"turn": 1, "step": 1, "message": {
        "id": "a1", "role": "assistant", "source": {"kind": "model", "provider": "p",
                                                    "model": "m"},
        "content": [{"type": "tool-call", "id": "k1", "name": "t", "arguments": "{}"}]}},
        surface_op="append", source_event_seqs=[])
    log.append("steering/message", {"turn": 1, "message": msg("s1")}, surface_op="append")
    return watching


def test_R20_5_the_monitor_checks_every_continuation_and_model_request() -> None:
    """R20.5: after each event that changes the history, the continuation of the log is
    built by both adapters and checked; the plan answers the call and sends the steer after
    it (specs/providers.md W2.2, W2.3), so nothing is refused; every model request is
    checked with its own header and history."""
    from machine.checking.scripted import Driver, ScriptedEnvironment, calls_reply, text_reply
    monitor = _planted_core_steering_inside_the_batch(lambda core: InvariantMonitor(core, core))
    assert monitor.requests is not None and monitor.requests.checked == 3
    fresh = AgentCore(CONFIG)
    driver = Driver(fresh, ScriptedEnvironment(replies=[calls_reply(("k1", "t")),
                                                        text_reply("done")]))
    fresh.followup(user_message("u", "go"))
    driver.run()
    checks = driver.monitor.requests if driver.monitor is not None else None
    assert checks is not None and checks.checked >= 4
    assert InvariantMonitor(fresh, fresh, requests=False).requests is None


def test_R20_5_a_request_the_provider_refuses_fails_the_monitor_naming_the_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """R20.5: with the plan's deferral planted away (specs/providers.md W2.3), the same log
    continues with a body that has the steer between the call and its result: the monitor
    names R20.5, the provider's rule and the position."""
    from machine.providers import plan
    from machine.providers.check import ProviderRuleError

    def eager(self: plan.Planner, message: Any) -> None:
        group, self.group = self.group, None
        if group is not None:
            self.group = group if message.source.get("kind") == "tool" else None
        original(self, message)
        if group is not None and self.group is None and message.role != "assistant":
            self.group = group

    original = plan.Planner.feed
    monkeypatch.setattr(plan.Planner, "feed", eager)
    failures: list[BaseException] = []

    def monitor(core: AgentCore) -> InvariantMonitor:
        inner = InvariantMonitor(core, core)
        output = inner.output

        def noting(item: Output) -> None:
            try:
                output(item)
            except ProviderRuleError as error:   # an observer's raise is contained (L11)
                failures.append(error)
        inner.output = noting  # type: ignore[method-assign, assignment]
        return inner
    _planted_core_steering_inside_the_batch(monitor)
    # the continuation's own new prompt is not deferred either: refused from seq 3 on
    assert [str(f).split(":")[0] for f in failures] == [
        "[R20.5] the log after seq 3 (assistant/message)",
        "[R20.5] the log after seq 4 (steering/message)"]
    assert all("chat: [W4.5] messages[1].role: An assistant message with 'tool_calls' must be "
               "followed by tool messages" in str(f) for f in failures)
    assert "[W4.5] messages[4].role: Invalid parameter: messages with role 'tool'" in str(
        failures[1])
