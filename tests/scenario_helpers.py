"""The test harness for scripted scenarios: the §19 reentrancy sweep, scenario variants, rule tests.

`Scenario` wraps one `AgentCore` with the scripted `Driver` and `ScriptedEnvironment`
and adds:

* message builders and command shortcuts (``followup('hi')``, ``inject('c', 'plugin:p')``);
* observer and hook helpers: ``observe(type, cb)`` registers an output observer (a log or
  live observer, which may issue commands at exactly that output); ``handle(kind, fn)``
  installs a hook point (an environment handler for that effect kind); ``hold(kind)``
  makes the environment hold an effect so the test answers it later;
* views in the scenario notation, rendered by `machine.conformance.authoring` (the one
  renderer, shared with the conformance corpus): ``log()`` renders the durable log as tokens
  such as ``TS(1,msg:user) UM('hi') SS(1.1) RH(initial) CH… AM(1.1;'hello there') SE(1.1)
  TE(1,completed)`` and ``trace()`` renders outputs in order (live notifications, and the
  durable events and effects asked for);
* `L` (`machine.conformance.authoring.notation`), which splits a notation string into tokens,
  so a test asserts ``s.log() == L("TS(1,msg:user) UM('hi') ...")``;
* ``check()``, which asserts the invariants that hold for every scenario (`check_log`:
  contiguous seqs, the ``sourceEventSeqs`` of every AM and TR, the canonical synthetic tool
  results, balanced steps; and status alternation, inbox conservation).

The reference scenarios themselves are written once, in ``machine/conformance/corpus/``
(``tests/test_scenarios.py`` plays them); this harness serves the tests that play other
scripts (``tests/test_scenario_variants.py``, ``tests/test_reentrancy.py``, the rule files).

The rule-family tests (``tests/test_R*_*.py``, the machine-and-model part of
``tests/test_protocol.py``) drive the machine (`AgentCore`) and the reference model
(`ModelAgent`) with the same inputs: ``@both`` parametrizes a test over `IMPLEMENTATIONS`,
``scenario(impl, ...)`` builds the `Scenario` over either, and the small readers they share
(``tokens``, ``aborts``, ``reason_kinds``, ``at_running``, ``idle``) are defined here once.

Observer failures are the driver's business in the sans-I/O design: the core never sees
them. ``observe(..., contained=True)`` contains a raising observer the way a driver would
(the failure is recorded in ``contained_warnings``), so a scenario can assert that the
core's outputs are unaffected.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import pytest

from machine.checking.scripted import HOLD, Driver, ScriptedEnvironment, ok_result, text_reply
from machine.conformance.authoring import (
    check_log,
    event_token,
    live_token,
    log_tokens,
    message_label,
    notation,
    reason_label,
    reply,
    source,
    text_of,
    trace_tokens,
)
from machine.core import AgentCore, CoreConfig
from machine.events import Event
from machine.io import Control, Effect, Output
from machine.jsonvalue import Frozen, FrozenDict, FrozenList, JsonLike, thaw
from machine.log import SessionLog
from machine.vocabulary import ErrorInfo, Message

if TYPE_CHECKING:
    # The same files: setup.py installs model/ as machine._model, which mypy cannot follow.
    from model import ModelAgent
else:
    from machine._model import ModelAgent

# --------------------------------------------------------------------------
# Frozen values read by a test: narrowed by an assertion (for the type checker too)
# --------------------------------------------------------------------------


def obj(value: object) -> FrozenDict:
    """*value*, asserted to be a JSON object (a `FrozenDict`), such as a field of an event's
    data the test reads further."""
    assert isinstance(value, FrozenDict), f"not a JSON object: {value!r}"
    return value


def arr(value: object) -> FrozenList:
    """*value*, asserted to be a JSON array (a `FrozenList`)."""
    assert isinstance(value, FrozenList), f"not a JSON array: {value!r}"
    return value


def at(value: Frozen, *path: str | int) -> Frozen:
    """``value[path[0]][path[1]]...``, asserting that each container on the way is a JSON
    object (for a ``str`` key) or a JSON array (for an ``int`` index)."""
    for key in path:
        value = arr(value)[key] if isinstance(key, int) else obj(value)[key]
    return value


def string(value: object) -> str:
    """*value*, asserted to be a string."""
    assert isinstance(value, str), f"not a string: {value!r}"
    return value


def integer(value: object) -> int:
    """*value*, asserted to be an integer (a `bool` is not one)."""
    assert isinstance(value, int) and not isinstance(value, bool), f"not an integer: {value!r}"
    return value


# --------------------------------------------------------------------------
# Messages; the notation is machine.conformance.authoring's (the one renderer)
# --------------------------------------------------------------------------

USER: dict[str, JsonLike] = {"kind": "user"}
L = notation
message_text = text_of
_ids = itertools.count(1)


def msg(text: str, src: str | Mapping[str, JsonLike] | None = None, *,
        id: str | None = None) -> dict[str, JsonLike]:
    """A plain (mutable) well-formed user message with one text block."""
    return {"id": id if id is not None else f"m{next(_ids)}", "role": "user",
            "content": [{"type": "text", "text": text}], "source": source(src)}


def as_msg(value: str | Mapping[str, JsonLike] | Message,
           src: str | Mapping[str, JsonLike] | None = None) -> JsonLike:
    if isinstance(value, str):
        return msg(value, src)
    return value


def reply_text(text: str, *, finish: str = "stop", usage: JsonLike = None) -> list[JsonLike]:
    """A text reply with the given finish kind (and a usage chunk before it, rule V18)."""
    return reply(text, finish=finish, usage=usage)


def result_with_contexts(text: str, *contexts: Mapping[str, JsonLike], **extra: JsonLike
                         ) -> dict[str, JsonLike]:
    return ok_result(text, additionalContexts=[dict(c) for c in contexts], **extra)


# --------------------------------------------------------------------------
# The scenario harness
# --------------------------------------------------------------------------

Handler = Callable[[Effect], Any]


class Scenario:
    """One agent over a fresh (or seeded) session, driven by the scripted driver."""

    def __init__(self, *replies: Sequence[JsonLike] | ErrorInfo | str,
                 config: CoreConfig | None = None, log: SessionLog | None = None,
                 tool_modes: Mapping[str, str] | None = None) -> None:
        if config is None:
            config = CoreConfig(tool_modes=dict(tool_modes or {}))  # type: ignore[arg-type]
        self.core = AgentCore(config, log=log)
        self.env = ScriptedEnvironment(replies=[text_reply(r) if isinstance(r, str) else r
                                                for r in replies])
        self.driver = Driver(self.core, self.env)
        self.contained_warnings: list[str] = []

    # -- commands ------------------------------------------------------------
    def followup(self, text: str | Mapping[str, JsonLike], src: str | None = None) -> None:
        self.core.followup(as_msg(text, src))

    def steer(self, text: str | Mapping[str, JsonLike], src: str | None = None) -> None:
        self.core.steer(as_msg(text, src))

    def inject(self, text: str | Mapping[str, JsonLike], src: str | None = "plugin:test") -> None:
        self.core.inject(as_msg(text, src))

    def send(self, text: str | Mapping[str, JsonLike], target: str, wakeup: bool,
             src: str | None = None) -> None:
        self.core.send(as_msg(text, src), {"target": target, "wakeup": wakeup})

    def cancel(self, kind: str = "user", keep_inbox: bool = False) -> None:
        self.core.cancel({"kind": kind}, keep_inbox)

    def dispose(self) -> None:
        self.core.dispose()

    # -- running -----------------------------------------------------------------
    def pump(self) -> None:
        self.driver.pump()

    def run(self) -> Scenario:
        self.driver.run()
        return self

    # -- observers and hook points -------------------------------------------------
    def observe(self, type_: str, callback: Callable[[FrozenDict], None], *, once: bool = False,
                contained: bool = False) -> None:
        """An observer of the durable event or live notification *type_* (data/payload)."""
        if contained:
            inner = callback

            def callback(data: FrozenDict) -> None:
                try:
                    inner(data)
                except Exception as exc:   # the driver contains observer failures (§0.1)
                    self.contained_warnings.append(f"observer of {type_} failed: {exc}")
        self.driver.on_event(type_, callback, once=once)

    def on_output(self, callback: Callable[[Output], None]) -> None:
        self.driver.on(callback)

    def handle(self, kind: str, fn: Handler, *, times: int | None = None,
               when: Callable[[Effect], bool] | None = None) -> None:
        """Install a hook point for *kind*. *fn* returns an answer (None = the default).
        With *times*, only the first *times* matching invocations reach *fn*."""
        count = {"n": 0}

        def handler(effect: Effect) -> Any:
            if when is not None and not when(effect):
                return None
            if times is not None and count["n"] >= times:
                return None
            count["n"] += 1
            return fn(effect)
        self.env.handlers[kind] = handler

    def unhandle(self, kind: str) -> None:
        self.env.handlers.pop(kind, None)

    def hold(self, kind: str, *, times: int | None = 1,
             when: Callable[[Effect], bool] | None = None) -> None:
        self.handle(kind, lambda _e: HOLD, times=times, when=when)

    def take(self, kind: str) -> Effect:
        return self.driver.take_held(kind)

    def resolve(self, kind: str, value: JsonLike = None) -> Scenario:
        self.driver.resolve(kind, value)
        return self.run()

    def fail(self, kind: str, error: ErrorInfo) -> Scenario:
        self.driver.fail(kind, error)
        return self.run()

    def hang_model(self) -> Effect:
        """The held model call yields two non-finish chunks and then hangs."""
        effect = self.take("model")
        self.core.chunk(effect.id, {"type": "text", "text": "partial "})
        self.core.chunk(effect.id, {"type": "text", "text": "reply"})
        self.run()
        return effect

    def model_honours_abort(self, effect: Effect) -> Scenario:
        """The hanging model call sees its signal aborted and raises."""
        self.core.fail(effect.id, ErrorInfo("the operation was aborted", "AbortError"))
        return self.run()

    # -- views ---------------------------------------------------------------------
    @property
    def outputs(self) -> list[Output]:
        return self.driver.outputs

    @property
    def events(self) -> list[Event]:
        return list(self.core.log.events)

    def types(self) -> list[str]:
        return [e.type for e in self.events]

    def of(self, type_: str) -> list[Event]:
        return [e for e in self.events if e.type == type_]

    def log(self, *, collapse_chunks: bool = True) -> list[str]:
        return log_tokens(self.events, collapse_chunks=collapse_chunks)

    def render(self) -> str:
        return " ".join(self.log())

    def trace(self, durable: Iterable[str] | str = (), effects: Iterable[str] | str = (),
              *, controls: bool = False, publication: bool = False,
              since: int = 0) -> list[str]:
        """Outputs in order (`machine.conformance.authoring.trace_tokens`): every live
        notification (publication notices only if asked), the durable events whose tags are in
        *durable* (``'*'`` for all), the effects whose kinds are in *effects* (``'*'`` for all)
        and, if asked, the control outputs."""
        return trace_tokens(self.outputs[since:], durable, effects, controls=controls,
                            publication=publication)

    def live(self, *types: str) -> list[FrozenDict]:
        return [o.event.payload for o in self.driver.live(*types)]

    def live_tokens(self, *types: str) -> list[str]:
        return [live_token(o) for o in self.driver.live(*types)]

    def statuses(self) -> list[str]:
        return [str(p["status"]) for p in self.live("agent/status")]

    def errors(self) -> list[tuple[int, int, str]]:
        return [(integer(p["turn"]), integer(p["step"]), str(obj(p["error"])["message"]))
                for p in self.live("agent/error")]

    def warnings(self) -> list[str]:
        """Warnings from the core (agent/warning) and contained observer failures."""
        return [str(p["text"]) for p in self.live("agent/warning")] + self.contained_warnings

    def warned(self, text: str) -> bool:
        return any(text in w for w in self.warnings())

    def effects(self, kind: str | None = None) -> list[Effect]:
        return self.driver.effects(kind)

    @property
    def requests(self) -> list[Effect]:
        return self.effects("model")

    def request(self, n: int) -> list[str]:
        """Request *n* (1-based) as message labels (see `message_label`)."""
        effect = self.requests[n - 1]
        assert effect.history is not None
        return [message_label(m) for m in effect.history]

    def request_messages(self, n: int) -> list[Message]:
        history = self.requests[n - 1].history
        assert history is not None
        return list(history)

    def user_texts(self) -> list[str]:
        return [message_text(e.data) for e in self.of("user/message")]

    def history(self) -> list[str]:
        return [message_label(m) for m in self.core.log.derive_messages()]

    def reasons(self) -> list[str]:
        return [reason_label(thaw(e.data["reason"])) for e in self.of("turn/end")]

    def turn_numbers(self) -> list[int]:
        return [integer(e.data["turn"]) for e in self.of("turn/start")]

    # -- invariants ----------------------------------------------------------------
    def check(self) -> None:
        check_log(self.events)
        statuses = self.statuses()
        for i, status in enumerate(statuses):
            assert status == ("running" if i % 2 == 0 else "idle"), f"status alternation: {statuses}"
        enq = len(self.live("agent/inbox/enqueue"))
        deq = len(self.live("agent/inbox/dequeue"))
        disc = sum(len(arr(p["messages"])) for p in self.live("agent/inbox/discard"))
        pending = self.core.pending_queued + self.core.pending_steering
        assert enq == deq + disc + pending, (
            f"inbox conservation: enq={enq} deq={deq} disc={disc} pending={pending}")
        if self.core.status == "idle":
            assert not self.core.accepts_next_step


__all__ = [
    "HOLD",
    "IMPLEMENTATIONS",
    "RETRY",
    "USER",
    "CoreConfig",
    "ErrorInfo",
    "L",
    "Scenario",
    "aborts",
    "arr",
    "at",
    "at_running",
    "both",
    "check_log",
    "core_on",
    "event_token",
    "idle",
    "integer",
    "live_token",
    "log_tokens",
    "message_label",
    "message_text",
    "msg",
    "obj",
    "ok_result",
    "reason_kinds",
    "reason_label",
    "reply_text",
    "result_with_contexts",
    "scenario",
    "source",
    "string",
    "text_reply",
    "tokens",
]


def assert_failed_step(s: Scenario, name: str, code: str, message: str) -> None:
    """R15.3 / R15.4: the turn ended with a generic failure of step 1, coded *code*, and the
    core reported the error it built (*name*, *message*) as ``agent/error`` and in
    ``agent/settled``."""
    (turn_end,) = s.of("turn/end")
    assert thaw(turn_end.data["reason"]) == {
        "kind": "error", "step": 1, "message": message, "code": code}
    (error,) = s.live("agent/error")
    assert thaw(error["error"]) == {"name": name, "message": message, "code": code}
    (settled,) = s.live("agent/settled")
    assert thaw(settled["reason"]) == {"kind": "error", "error": thaw(error["error"])}


# --------------------------------------------------------------------------
# The rule-family tests: the machine and the reference model driven alike
# --------------------------------------------------------------------------

#: The implementations a rule-family test drives: the machine (`AgentCore`) and the reference
#: model (`ModelAgent`); also the parametrization ids of `both`.
IMPLEMENTATIONS: tuple[str, str] = ("machine", "model")

#: ``@both``: the test runs once per implementation, its ``impl`` argument naming it.
both: pytest.MarkDecorator = pytest.mark.parametrize("impl", IMPLEMENTATIONS)

#: A ``request-error`` hook answer that authorizes a retry (R13).
RETRY = ("resolve", {"kind": "retry"})


def core_on(impl: str, config: CoreConfig | None = None, *,
            log: SessionLog | None = None) -> AgentCore:
    """A fresh agent of *impl*: the machine's `AgentCore` for ``"machine"``, the reference
    model's `ModelAgent` (typed as the core it stands in for) for ``"model"``; *config*
    defaults to ``CoreConfig()`` and *log* to a fresh log."""
    config = config if config is not None else CoreConfig()
    if impl == "machine":
        return AgentCore(config, log=log)
    return cast(AgentCore, ModelAgent(config, log=log))


def scenario(impl: str, *replies: Sequence[JsonLike] | ErrorInfo | str,
             config: CoreConfig | None = None, seed: Sequence[Event] | None = None) -> Scenario:
    """A `Scenario` over the machine or over the reference model (*impl*): the same scripted
    driver, environment and inputs. With *seed*, the agent's log is seeded with those events;
    without, it starts empty."""
    s = Scenario(*replies, config=config, log=None if seed is None else SessionLog(seed))
    if impl == "model":
        s.core = core_on(impl, s.core.config, log=None if seed is None else SessionLog(seed))
        s.driver = Driver(s.core, s.env)
    return s


def idle(impl: str) -> Scenario:
    """A scenario over *impl* whose publication notices are pulled: idle, nothing pending."""
    s = scenario(impl)
    s.run()
    return s


def tokens(s: Scenario, since: int = 0) -> list[str]:
    """Every output from output *since* on (publication notices left out), in order, in the
    scenario notation: live notifications, durable events, effects and control outputs."""
    return s.trace("*", "*", controls=True, since=since)


def aborts(s: Scenario) -> list[dict[str, JsonLike]]:
    """The payloads of the ``abort`` control outputs so far, in order."""
    return [thaw(o.payload) for o in s.outputs if isinstance(o, Control) and o.kind == "abort"]


def reason_kinds(s: Scenario) -> list[str]:
    """The ``kind`` of each ``turn/end`` reason, in log order."""
    return [str(thaw(e.data["reason"])["kind"]) for e in s.of("turn/end")]


def at_running(s: Scenario, action: Callable[[], object]) -> None:
    """Run *action* at the first ``agent/status running`` (once)."""
    def observer(data: FrozenDict) -> None:
        if data["status"] == "running":
            action()
    s.observe("agent/status", observer, once=True)


def plant_phase(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str,
                planted: Callable[..., Any]) -> None:
    """Plant a bug in a phase of the core's loop: *planted* replaces the function *name* of
    *module* (bound to a phase of `machine.core.loop`), in the module and in the declared
    graph's binding, so that the graph's check (R4.13) takes it as that phase; undone with
    *monkeypatch*. Several plants in one test compose."""
    from machine.core import loop
    original = getattr(module, name)
    kind, phase_name = next(key for key, function in loop._bound.items() if function is original)
    monkeypatch.setattr(module, name, planted)
    monkeypatch.setitem(loop._bound, (kind, phase_name), planted)   # so that plants compose
    monkeypatch.setattr(loop, "_graphs", loop.rebound(kind, phase_name, planted))
