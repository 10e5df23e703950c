"""Internal failures of the loop (P16) and the loop's own records (R20.4).

Issue 14.1: an accepted value later made the loop raise inside ``next_output()``; the core
was left running with a ``turn/start`` and no end, the message was nowhere, and
``dispose()`` never completed. Values are now checked where they enter (tests/
test_hostile_values.py); these tests inject failures into the loop itself, at every append
of a rich session, and check that the core either fails the turn in order or stops
cleanly: no exception escapes, no turn stays open after a single fault, nothing accepted is
lost (the R20.1 ledgers of `machine.checking.invariants`), and ``dispose()`` always completes. The
reference model is driven the same way and must produce the same outputs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from scenario_helpers import Scenario, at

from machine.checking.invariants import InvariantMonitor
from machine.core import AgentCore, CoreConfig, state_of
from machine.errors import CoreFailedError, InvariantError, ProtocolError, TurnstileError
from machine.events import SESSION_DISPOSED
from machine.io import Durable, Effect, Live, Output
from machine.jsonvalue import thaw
from machine.log import SessionLog
from machine.vocabulary import ErrorInfo
from model import ModelAgent

TOOL_MODES: Any = {"par": "parallel"}


def user(text: str, id: str) -> dict[str, Any]:
    return {"id": id, "role": "user", "content": [{"type": "text", "text": text}],
            "source": {"kind": "user"}}


def context(text: str, id: str) -> dict[str, Any]:
    return {"id": id, "role": "user", "content": [{"type": "text", "text": text}],
            "source": {"kind": "plugin", "plugin": "test"}}


class Run:
    """A rich session on one agent, driven deterministically: admission contexts, an inject
    while the window is open, steering during a tool batch, tool contexts, a blocked
    admission with context staged (the rejected tail), a retried request failure, an idle
    inject; commands the agent refuses are recorded, never raised."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.outputs: list[Output] = []
        self.refusals: list[str] = []
        self.refused_after_stop: list[str] = []
        self.monitor = InvariantMonitor(agent, agent) if hasattr(agent, "staged") else None
        self.model_calls = 0
        self.prompts = 0

    def command(self, action: Callable[[], object]) -> None:
        try:
            action()
        except TurnstileError as error:
            self.refusals.append(f"{type(error).__name__}: {error}")
            if getattr(self.agent, "failure", None) is not None:
                self.refused_after_stop.append(type(error).__name__)

    def pump(self) -> list[Effect]:
        effects: list[Effect] = []
        while (output := self.agent.next_output()) is not None:
            self.outputs.append(output)
            if self.monitor is not None:
                self.monitor.output(output)
            self.observe(output)
            if isinstance(output, Effect):
                effects.append(output)
        if self.monitor is not None:
            self.monitor.poll(quiet=True)
        return effects

    def observe(self, output: Output) -> None:
        if isinstance(output, Effect) and output.kind == "step" and output.payload["step"] == 1:
            self.command(lambda: self.agent.inject(context("staged in step", f"cs{len(self.outputs)}")))
        if isinstance(output, Effect) and output.kind == "tool-execute":
            self.command(lambda: self.agent.steer(user("steer", f"st{len(self.outputs)}")))

    def answer(self, effect: Effect) -> None:
        agent, kind = self.agent, effect.kind
        if kind == "prompt-submit":
            self.prompts += 1
            if self.prompts == 2:       # blocked, with a context staged while admitting
                self.command(lambda: agent.inject(context("for the rejected tail", "rt")))
                agent.resolve(effect.id, {"kind": "block", "reason": "no"})
            else:
                agent.resolve(effect.id, {"kind": "allow", "additionalContexts": [
                    context("decision context", f"dc{self.prompts}")]})
        elif kind == "request":
            agent.resolve(effect.id, {"config": {"provider": "p", "model": "m"}})
        elif kind == "model":
            self.model_calls += 1
            if self.model_calls == 1:
                for chunk in ({"type": "text", "text": "calling"},
                              {"type": "tool-call", "id": "c1", "name": "par", "arguments": "{}"},
                              {"type": "tool-call", "id": "c2", "name": "par", "arguments": "{}"},
                              {"type": "finish", "kind": "stop"}):
                    agent.chunk(effect.id, chunk)
                agent.end(effect.id)
            elif self.model_calls == 3:
                agent.fail(effect.id, ErrorInfo.from_exception(_model_failure()))
            else:
                agent.chunk(effect.id, {"type": "text", "text": f"reply {self.model_calls}"})
                agent.chunk(effect.id, {"type": "finish", "kind": "stop"})
                agent.end(effect.id)
        elif kind == "tool-execute":
            agent.resolve(effect.id, {"content": [{"type": "text", "text": "done"}],
                                      "additionalContexts": [
                                          context("tool context", f"tc{effect.id}")]})
        elif kind == "tool-finalize":
            agent.resolve(effect.id, thaw(effect.payload["result"]))
        elif kind == "request-error":
            agent.resolve(effect.id, {"kind": "retry"})
        else:
            agent.resolve(effect.id, None)

    def drive(self) -> None:
        for _ in range(10_000):
            effects = self.pump()
            if not effects:
                return
            for effect in effects:
                self.answer(effect)
        raise AssertionError("the run did not settle")

    def session(self) -> None:
        self.pump()
        self.command(lambda: self.agent.followup(user("first", "p1")))
        self.drive()
        self.command(lambda: self.agent.followup(user("blocked", "p2")))
        self.drive()
        self.command(lambda: self.agent.inject(context("idle inject", "ii")))
        self.command(lambda: self.agent.followup(user("third", "p3")))
        self.drive()
        self.command(lambda: self.agent.followup(user("fourth", "p4")))
        self.drive()
        self.command(self.agent.dispose)
        self.drive()

    def rendered(self) -> list[str]:
        return [json.dumps(o.to_json(), sort_keys=True) for o in self.outputs]


def answer_plainly(agent: Any, effect: Effect) -> None:
    """Allow, a header, a one-chunk text reply, or None."""
    if effect.kind == "model":
        agent.chunk(effect.id, {"type": "text", "text": "ok"})
        agent.chunk(effect.id, {"type": "finish", "kind": "stop"})
        agent.end(effect.id)
    elif effect.kind == "request":
        agent.resolve(effect.id, {"config": {"provider": "p", "model": "m"}})
    elif effect.kind == "prompt-submit":
        agent.resolve(effect.id, {"kind": "allow"})
    else:
        agent.resolve(effect.id, None)


def drive_plainly(agent: Any, answer: Callable[[Any, Effect], None] = answer_plainly
                  ) -> list[Output]:
    """Pull every output, answering each effect with *answer*, until the agent waits for
    nothing."""
    outputs: list[Output] = []
    while True:
        batch = agent.drain_outputs()
        outputs += batch
        effects = [o for o in batch if isinstance(o, Effect)]
        if not effects:
            return outputs
        for effect in effects:
            answer(agent, effect)


def _model_failure() -> Exception:
    from machine.vocabulary import LlmFailure
    error = RuntimeError("overloaded")
    error.failure = LlmFailure("overloaded", "OVERLOADED", status=529)  # type: ignore[attr-defined]
    return error


def new(agent_type: type) -> Any:
    ticks = iter(range(1, 10**9))
    return agent_type(CoreConfig(tool_modes=TOOL_MODES), clock=lambda: next(ticks))


class Injected(RuntimeError):
    """The failure the tests inject."""


@contextmanager
def failing_commits(at: set[int] | Callable[[int], bool]) -> Iterator[list[int]]:
    """Make `SessionLog.commit` raise `Injected` at the given call numbers (0-based)."""
    original = SessionLog.commit
    calls = [0]
    fails = at if callable(at) else at.__contains__

    def commit(self: SessionLog, *args: Any, **kwargs: Any) -> Any:
        number = calls[0]
        calls[0] += 1
        if fails(number):
            raise Injected(f"injected at commit {number}")
        return original(self, *args, **kwargs)

    SessionLog.commit = commit  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        SessionLog.commit = original  # type: ignore[method-assign]


def _commit_count() -> int:
    with failing_commits(set()) as calls:
        Run(new(AgentCore)).session()
    return calls[0]


COMMITS = _commit_count()


def _check_run(run: Run) -> None:
    agent = run.agent
    assert agent.disposed, "dispose() did not complete"
    last = run.outputs[-1]
    assert isinstance(last, Live) and last.event.type == SESSION_DISPOSED
    log = agent.log
    if agent.failure is None:
        assert log.open_turn is None, "a turn/start was left without its end"
    if run.monitor is not None:
        run.monitor.poll(quiet=True)        # R20.1b, R20.1c: nothing accepted is lost


def test_P16_the_fault_free_session_covers_every_kind_of_append() -> None:
    run = Run(new(AgentCore))
    run.session()
    types = {o.event.type for o in run.outputs if isinstance(o, Durable)}
    assert {"turn/start", "turn/end", "step/start", "step/end", "user/message",
            "steering/message", "assistant/chunk", "assistant/message", "tool/call",
            "tool/result", "request/header"} <= types
    warnings = [o.event.payload["text"] for o in run.outputs
                if isinstance(o, Live) and o.event.type == "agent/warning"]
    assert warnings == [] and run.refusals == []
    assert COMMITS > 40
    _check_run(run)


@pytest.mark.parametrize("at", range(COMMITS))
def test_P16_a_failure_at_any_append_fails_the_turn_in_order(at: int) -> None:
    """One injected failure at append number *at*: no exception escapes, the turn it hit
    ends (with the internal error when it was inside a turn), nothing accepted is lost,
    dispose completes, and the model agrees output for output."""
    with failing_commits({at}):
        machine = Run(new(AgentCore))
        machine.session()
    with failing_commits({at}):
        model = Run(new(ModelAgent))
        model.session()
    _check_run(machine)
    assert machine.agent.failure is None, "a single fault never stops the core"
    assert machine.rendered() == model.rendered()
    assert machine.refusals == model.refusals
    errors = [o.event.payload for o in machine.outputs
              if isinstance(o, Live) and o.event.type == "agent/error"]
    warnings = [str(o.event.payload["text"]) for o in machine.outputs
                if isinstance(o, Live) and o.event.type == "agent/warning"]
    internal = [e for e in errors if e["error"].get("name") == "Injected"]  # type: ignore[union-attr]
    noticed = (internal or machine.refusals
               or any("could not" in w for w in warnings))
    assert noticed, "the injected failure went unreported"
    for error in internal:      # P16: reported as the exception it is, as the original does
        assert thaw(error["error"]) == {"name": "Injected",
                                        "message": f"injected at commit {at}"}


@pytest.mark.parametrize("start", [3, 12, COMMITS // 2, COMMITS - 6])
def test_P16_appends_that_fail_for_good_stop_the_core_cleanly(start: int) -> None:
    """From append *start* on every append fails (a broken clock, say): the core stops with
    agent/error, commands raise CoreFailedError, completions of what it waited for are
    accepted, and dispose() reports what is pending and completes."""
    with failing_commits(lambda n: n >= start):
        machine = Run(new(AgentCore))
        machine.session()
    with failing_commits(lambda n: n >= start):
        model = Run(new(ModelAgent))
        model.session()
    assert machine.rendered() == model.rendered()
    _check_run(machine)
    agent = machine.agent
    assert machine.refused_after_stop == model.refused_after_stop
    assert set(machine.refused_after_stop) <= {"CoreFailedError"}
    if agent.failure is not None:
        assert agent.failure.name == "Injected" and agent.status == "idle"
        assert agent.outstanding_effects == ()


def _commit_types() -> list[str]:
    """The type of each append of the fault-free session, in order."""
    original = SessionLog.commit
    types: list[str] = []

    def commit(self: SessionLog, type: str, *args: Any, **kwargs: Any) -> Any:
        types.append(type)
        return original(self, type, *args, **kwargs)

    SessionLog.commit = commit  # type: ignore[method-assign]
    try:
        Run(new(AgentCore)).session()
    finally:
        SessionLog.commit = original  # type: ignore[method-assign]
    return types


def test_P16_a_stopped_core_refuses_commands_and_accepts_late_completions() -> None:
    """Appends fail for good from the first tool/result on, while the second call of the
    parallel pair still executes: the turn fails, its turn/end is refused twice, the core
    stops; the late completion of that execute is accepted and dropped, a second one is a
    protocol error, and commands raise CoreFailedError until dispose()."""
    first_result = _commit_types().index("tool/result")
    core = new(AgentCore)
    run = Run(core)
    held: list[Effect] = []
    answer = run.answer

    def holding(effect: Effect) -> None:
        if effect.kind == "tool-execute" and not held:
            held.append(effect)          # c1 stays outstanding; c2 settles first
            return
        answer(effect)

    run.answer = holding  # type: ignore[method-assign]
    with failing_commits(lambda n: n >= first_result):
        run.pump()
        core.followup(user("first", "p1"))
        run.drive()
        failure = core.failure   # a local: mypy would keep core.failure narrowed to None below
        assert held and failure is None            # c1 still runs; nothing failed yet
        core.resolve(held[0].id, {"content": [{"type": "text", "text": "late"}]})
        run.drive()
    assert core.failure is not None and core.failure.code is None
    assert core.failure.name == "Injected" and "injected" in core.failure.message
    assert core.status == "idle" and core.outstanding_effects == ()
    assert core.log.open_turn == 1
    errors = [o.event.payload for o in run.outputs
              if isinstance(o, Live) and o.event.type == "agent/error"]
    assert len(errors) >= 2 and at(errors[-1], "error", "name") == "Injected"
    with pytest.raises(CoreFailedError, match="only dispose"):
        core.followup(user("more", "p9"))
    with pytest.raises(CoreFailedError):
        core.append("x-ext/marker", {})
    core.dispose()
    run.drive()
    assert core.disposed and isinstance(run.outputs[-1], Live)
    assert run.outputs[-1].event.type == SESSION_DISPOSED
    if run.monitor is not None:
        run.monitor.poll(quiet=True)


def test_P16_an_abandoned_model_stream_takes_late_chunks_until_its_end_once() -> None:
    """P16: a model stream outstanding when the core stops is abandoned: its late chunks
    are accepted and dropped, and so is its end, after which it is completed."""
    s = Scenario()
    s.hold("model")
    s.followup("go")
    s.run()
    model = s.hang_model()
    state_of(s.core).stop(RuntimeError("simulated"))      # the P16 stop, as the net calls it
    s.core.chunk(model.id, {"type": "text", "text": "late"})
    s.core.chunk(model.id, {"type": "text", "text": "later"})
    s.core.end(model.id)                          # accepted and dropped
    with pytest.raises(ProtocolError, match="already completed"):
        s.core.end(model.id)


def test_P16_completions_of_abandoned_effects_are_accepted_once() -> None:
    core = new(AgentCore)
    core.drain_outputs()
    core.followup(user("go", "p1"))
    effects = [o for o in core.drain_outputs() if isinstance(o, Effect)]
    (tick,) = effects
    state_of(core).stop(RuntimeError("simulated"))      # the P16 stop, as the net calls it
    core.resolve(tick.id, None)                  # accepted and dropped
    with pytest.raises(ProtocolError, match="already completed"):
        core.resolve(tick.id, None)
    tail = core.drain_outputs()
    assert [o.event.type for o in tail if isinstance(o, Live)] == ["agent/error"]
    assert core.pending_queued == 1              # still pending, reported at dispose
    core.dispose()
    tail = core.drain_outputs()
    discards = [o for o in tail if isinstance(o, Live) and o.event.type == "agent/inbox/discard"]
    assert len(discards) == 1 and at(discards[0].event.payload, "messages", 0, "id") == "p1"
    assert core.disposed


def test_P16_a_broken_clock_stops_the_core_and_dispose_still_completes() -> None:
    broken = {"now": False}

    def clock() -> float:
        if broken["now"]:
            raise OSError("clock gone")
        return 5

    for agent_type in (AgentCore, ModelAgent):
        agent = agent_type(clock=clock)
        broken["now"] = False
        agent.drain_outputs()
        agent.followup(user("go", "p1"))

        def answer(agent: Any, effect: Effect) -> None:
            if effect.kind == "model":
                broken["now"] = True        # from the first chunk on, nothing can be written
            answer_plainly(agent, effect)

        outputs = drive_plainly(agent, answer)
        assert agent.failure is not None, agent_type
        assert "clock gone" in agent.failure.message
        assert agent.log.open_turn == 1       # as after a crash: a store's load repairs it
        errors = [o for o in outputs if isinstance(o, Live) and o.event.type == "agent/error"]
        assert errors and thaw(errors[-1].event.payload["error"]) == {
            "name": "InvariantError", "code": "INVARIANT",
            "message": "[L3] step/end: the log's clock failed: clock gone"}
        statuses = [o.event.payload["status"] for o in outputs
                    if isinstance(o, Live) and o.event.type == "agent/status"]
        assert statuses == ["running", "idle"]
        with pytest.raises(CoreFailedError):
            agent.followup(user("more", "p2"))
        with pytest.raises(CoreFailedError):
            agent.cancel({"kind": "user"})
        agent.dispose()
        tail = agent.drain_outputs()
        assert [o.event.type for o in tail if isinstance(o, Live)][-2:] == [
            "agent/disposed", "session/disposed"]
        assert agent.disposed


@pytest.mark.parametrize("agent_type", [AgentCore, ModelAgent])
def test_P16_a_mint_function_that_misbehaves_fails_the_turn(agent_type: type) -> None:
    calls = {"n": 0}

    def mint(kind: str, seq: int) -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyError("no id for you")
        return 7  # type: ignore[return-value]

    agent = agent_type(mint_id=mint, clock=lambda: 1)
    agent.followup(user("go", "p1"))
    outputs = drive_plainly(agent)
    agent.followup(user("again", "p2"))
    outputs += drive_plainly(agent)
    reasons = [thaw(o.event.data["reason"]) for o in outputs
               if isinstance(o, Durable) and o.event.type == "turn/end"]
    assert reasons == [
        {"kind": "error", "step": 1, "message": "'no id for you'"},
        {"kind": "error", "step": 1, "code": "INVALID_VALUE",
         "message": "mint_id: returned a int, not a non-empty string"}]
    assert agent.failure is None and agent.status == "idle"


def test_P16_machine_and_model_agree_on_a_misbehaving_mint() -> None:
    def mint(kind: str, seq: int) -> str:
        return "" if seq % 2 else f"{kind}:{seq}"

    def outputs(agent_type: type) -> list[str]:
        run = Run(agent_type(CoreConfig(tool_modes=TOOL_MODES), mint_id=mint, clock=lambda: 1))
        run.session()
        return run.rendered()
    assert outputs(AgentCore) == outputs(ModelAgent)


@pytest.mark.parametrize("agent_type", [AgentCore, ModelAgent])
def test_P16_an_extension_rule_that_raises_refuses_the_append_typed(agent_type: type) -> None:
    log = SessionLog()

    def rule(_log: SessionLog, _type: str, _data: Any) -> str | None:
        raise ZeroDivisionError("rule bug")

    log.register_rule("x-ext/rated", rule)
    agent = agent_type(log=log)
    agent.drain_outputs()
    with pytest.raises(InvariantError, match=r"\[L10\] x-ext/rated: its rule raised rule bug"):
        agent.append("x-ext/rated", {"n": 1})
    assert len(log) == 0 and agent.drain_outputs() == []


@pytest.mark.parametrize("agent_type", [AgentCore, ModelAgent])
def test_R20_4_loop_records_are_refused_while_busy_and_the_log_judges_them_idle(
        agent_type: type) -> None:
    agent = agent_type(clock=lambda: 1)
    agent.drain_outputs()
    agent.followup(user("go", "p1"))
    seen: list[str] = []

    def answer(agent: Any, effect: Effect) -> None:
        if effect.kind == "request":
            for type_, data in (("step/end", {"turn": 1, "step": 1}),
                                ("assistant/chunk", {"turn": 1, "step": 1, "chunk": {
                                    "type": "text", "text": "forged"}})):
                with pytest.raises(InvariantError, match=r"\[R20\.4\]"):
                    agent.append(type_, data)
                seen.append(type_)
            with pytest.raises(InvariantError, match=r"\[L4\]"):   # the log's verdict first
                agent.append("turn/start", {"turn": 2, "trigger": {"kind": "retry"}})
        answer_plainly(agent, effect)

    drive_plainly(agent, answer)
    assert seen == ["step/end", "assistant/chunk"]
    types = [e.type for e in agent.log.events]
    assert types.count("step/end") == 1 and types.count("assistant/chunk") == 2   # ok, finish
    assert "forged" not in json.dumps([e.to_json() for e in agent.log.events])
    assert agent.status == "idle"
    event = agent.append("turn/start", {"turn": 2, "trigger": {"kind": "retry"}})   # idle
    assert event.seq == len(agent.log) - 1
    agent.append("turn/end", {"turn": 2, "reason": {"kind": "completed"}})


@pytest.mark.parametrize("agent_type", [AgentCore, ModelAgent])
def test_P16_a_turn_left_open_by_direct_appends_keeps_a_run_from_starting(
        agent_type: type) -> None:
    agent = agent_type(clock=lambda: 1)
    agent.drain_outputs()
    agent.append("turn/start", {"turn": 1, "trigger": {"kind": "retry"}})
    agent.followup(user("go", "p1"))

    def answer(agent: Any, effect: Effect) -> None:
        if effect.kind == "prompt-submit":
            agent.resolve(effect.id, {"kind": "allow", "additionalContexts": [
                context("lost?", "dc")]})
        else:
            answer_plainly(agent, effect)

    outputs = drive_plainly(agent, answer)
    assert not [o for o in outputs if isinstance(o, Live) and o.event.type == "agent/warning"]
    errors = [thaw(o.event.payload) for o in outputs
              if isinstance(o, Live) and o.event.type == "agent/error"]
    assert errors == [{"turn": 2, "step": 0, "error": {   # P16 case 3, as the original reports it
        "name": "InvariantError", "code": "INVARIANT",
        "message": "[L4] turn/start: turn 1 is still open"}}]
    assert [e.type for e in agent.log.events] == ["turn/start", "turn/start"][:1]
    assert agent.status == "idle" and agent.failure is None
    agent.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    agent.followup(user("now", "p2"))
    drive_plainly(agent)
    assert [e.type for e in agent.log.events][-1] == "turn/end"
    assert agent.log.last_turn == 2


@pytest.mark.parametrize("at", range(0, COMMITS, 3))
def test_P16_an_encoder_that_fails_at_an_append_is_a_typed_refusal_handled_in_order(
        at: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoder (run by every append, L1) raises RecursionError at one append: the log
    refuses that append with [L3] and changes nothing; the loop handles it as above."""
    import machine.events as events_module
    from machine.jsonvalue import compact_json as encode
    count = [0]

    def failing(value: Any) -> str:
        number = count[0]
        count[0] += 1
        if number == at:
            raise RecursionError("maximum recursion depth exceeded")
        return encode(value)

    runs = []
    for agent_type in (AgentCore, ModelAgent):
        count[0] = 0
        monkeypatch.setattr(events_module, "compact_json", failing)
        run = Run(new(agent_type))
        run.session()
        monkeypatch.setattr(events_module, "compact_json", encode)
        runs.append(run)
    machine, model = runs
    _check_run(machine)
    assert machine.rendered() == model.rendered()
    texts = " ".join(machine.rendered() + machine.refusals)
    assert "the event could not be encoded (RecursionError)" in texts


def test_P16_through_the_runtime_a_hostile_value_is_refused_and_a_failure_never_hangs() -> None:
    """Issue 14.1 through the asyncio runtime: the deep value is refused at the call (and
    when_idle completes); a clock that breaks in the middle of a turn fails it, then stops
    the core, and when_idle() and dispose() still complete."""
    import asyncio

    from machine.errors import NotJsonCompatibleError
    from machine.jsonvalue import FrozenList
    from machine.runtime import Agent, ScriptedModel, text_reply

    deep = FrozenList([])
    for _ in range(100_000):
        deep = FrozenList([deep])
    broken = {"now": False}

    def clock() -> float:
        if broken["now"]:
            raise OSError("clock gone")
        return 1

    async def main() -> None:
        agent = Agent(ScriptedModel([text_reply("hello"), text_reply("again")]), clock=clock)
        with pytest.raises(NotJsonCompatibleError, match="128 levels"):
            agent.followup({"id": "m1", "role": "user", "content": [
                {"type": "x", "v": deep}], "source": {"kind": "user"}})
        await agent.when_idle()
        agent.on("assistant/chunk", lambda _e: broken.__setitem__("now", True))
        agent.followup("go")
        await agent.when_idle()
        assert agent.core.failure is not None and "clock gone" in agent.core.failure.message
        await agent.dispose()
        assert agent.disposed

    asyncio.run(asyncio.wait_for(main(), 60))


class UserStop(BaseException):
    """A BaseException of the embedder's own (neither an Exception nor an exit)."""


def _clock_that_raises(error: BaseException, at: int) -> tuple[Callable[[], float], list[int]]:
    """A clock that raises *error* at its call number *at* (0-based) and works otherwise."""
    calls = [0]

    def clock() -> float:
        number = calls[0]
        calls[0] += 1
        if number == at:
            raise error
        return number + 1

    return clock, calls


def _pull_all(agent: Any) -> tuple[list[Output], BaseException | None]:
    """Drive *agent* plainly; the first exception out of next_output() stops the drive."""
    outputs: list[Output] = []
    try:
        outputs += drive_plainly(agent)
    except BaseException as error:      # what escaped next_output(), if anything
        return outputs, error
    return outputs, None


def _clock_calls_of_one_turn() -> int:
    clock, calls = _clock_that_raises(UserStop(), -1)
    core = AgentCore(clock=clock)
    core.drain_outputs()
    core.followup(user("go", "p1"))
    drive_plainly(core)
    return calls[0]


@pytest.mark.parametrize("exit_", [KeyboardInterrupt, SystemExit, UserStop])
@pytest.mark.parametrize("at", range(_clock_calls_of_one_turn()))
def test_P16_an_exception_that_is_not_an_Exception_stops_the_core_cleanly(
        exit_: type[BaseException], at: int) -> None:
    """Issue 14.1 by another road: the clock raises KeyboardInterrupt, SystemExit or a
    BaseException of the embedder's own at its call *at* of a turn. The core stops first
    (agent/error, idle, nothing waited for), then an exit goes on out of next_output() and
    another BaseException is contained; commands raise CoreFailedError, dispose() completes,
    and machine and model agree output for output."""
    runs = []
    for agent_type in (AgentCore, ModelAgent):
        clock, _ = _clock_that_raises(exit_("stop"), at)
        agent = agent_type(clock=clock)
        agent.drain_outputs()
        agent.followup(user("go", "p1"))
        outputs, escaped = _pull_all(agent)
        if exit_ is UserStop:
            assert escaped is None, agent_type
        else:
            assert isinstance(escaped, exit_), (agent_type, escaped)
        outputs += agent.drain_outputs()        # what the stop queued before the exit left
        assert agent.failure is not None and agent.failure.name == exit_.__name__
        assert agent.status == "idle" and agent.outstanding_effects == ()
        errors = [o for o in outputs if isinstance(o, Live) and o.event.type == "agent/error"]
        reported = thaw(errors[-1].event.payload["error"])
        assert (reported["name"], reported["message"]) == (exit_.__name__, "stop")
        with pytest.raises(CoreFailedError):
            agent.followup(user("more", "p2"))
        agent.dispose()
        outputs += agent.drain_outputs()
        assert agent.disposed
        assert [o.event.type for o in outputs if isinstance(o, Live)][-2:] == [
            "agent/disposed", "session/disposed"]
        runs.append([repr(o) for o in outputs])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("agent_type", [AgentCore, ModelAgent])
def test_P16_an_exit_during_a_commands_append_leaves_nothing_appended(agent_type: type) -> None:
    """A direct append (or an idle inject) whose clock raises KeyboardInterrupt: the exit
    goes on to the caller as it is, nothing was appended, and the agent works on; a
    BaseException of the embedder's own is the typed InvariantError of L2."""
    for error, expected in ((KeyboardInterrupt(), KeyboardInterrupt),
                            (UserStop("stop"), InvariantError)):
        clock, _ = _clock_that_raises(error, 0)
        agent = agent_type(clock=clock)
        agent.drain_outputs()
        with pytest.raises(expected):
            agent.inject(context("c", "c1"))
        assert len(agent.log) == 0 and agent.drain_outputs() == []
        agent.inject(context("c", "c1"))           # the clock works again
        assert len(agent.log) == 1


def test_P16_through_the_runtime_an_exit_from_the_clock_leaves_an_agent_that_disposes() -> None:
    """The runtime's clock raises KeyboardInterrupt in the middle of a turn: the core stops,
    the interrupt leaves asyncio.run, and a new loop disposes the agent (RT18)."""
    import asyncio

    from machine.runtime import Agent, ScriptedModel, text_reply

    armed = {"now": False}

    def clock() -> float:
        if armed["now"]:
            armed["now"] = False
            raise KeyboardInterrupt
        return 1

    box: list[Any] = []

    async def first() -> None:
        agent = Agent(ScriptedModel([text_reply("hello")]), clock=clock)
        box.append(agent)
        agent.on("step/start", lambda _e: armed.__setitem__("now", True))
        agent.followup("go")
        await asyncio.wait_for(agent.when_idle(), 60)

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(first())
    agent = box[0]

    async def second() -> None:
        await agent.when_idle(timeout=30)
        assert agent.core.failure is not None
        assert agent.core.failure.name == "KeyboardInterrupt"
        await agent.dispose(timeout=30)

    asyncio.run(second())
    assert agent.disposed
