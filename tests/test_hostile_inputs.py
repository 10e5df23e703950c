"""The hostile-input property suite (issue 14, "Done when"; V1, V2, V6, V23, P3, P6, P10, P16).

A Hypothesis state machine drives every public command (send and its presets, cancel,
dispose, append) and every completion (resolve, raise, chunk, end) with malformed, deeply
nested, aliased and later mutated values, against three agents:

* **A**, an `AgentCore` that gets every input;
* **B**, an `AgentCore` that gets only the inputs A accepted, each built afresh and never
  mutated afterwards;
* **M**, the reference `ModelAgent`, which gets every input A gets.

After every step it asserts that each entry point either accepted the input or raised a
typed error (a `TurnstileError`; nothing else ever escapes), that A and M raise alike and
produce the same outputs, that A and B produce the same outputs (so an input that was
refused changed nothing, and mutating a value after it was given changed nothing either),
that A never stops with an internal failure (no hostile input ever reaches the loop
unchecked: the core is never half-advanced), that the R20.1 ledgers of
`machine.invariants.InvariantMonitor` balance on A (nothing accepted is ever lost), and at
the end that ``dispose()`` completes.

Values are described by *specs* (small trees) and built by `build`, so that each agent gets
its own objects: aliasing (one object at two places of a value) and cycles are made inside
each build, and mutation after the call changes only the agents that were given the object.

`make test` runs the "hostile-ci" profile (small budget); ``TURNSTILE_PROFILE=deep``
(``make check-deep``) runs "hostile-deep".
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from machine.core import AgentCore, CoreConfig
from machine.errors import InvariantError, TurnstileError, ValidationError
from machine.invariants import InvariantMonitor
from machine.io import Durable, Effect, Output
from machine.jsonvalue import FrozenList, freeze
from machine.log import SessionLog
from machine.vocabulary import ErrorInfo, LlmFailure
from model import ModelAgent

settings.register_profile(
    "hostile-ci", max_examples=80, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much])
settings.register_profile(
    "hostile-deep", max_examples=1500, stateful_step_count=100, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much])
PROFILE = "hostile-deep" if os.environ.get("TURNSTILE_PROFILE") == "deep" else "hostile-ci"

Spec = tuple[Any, ...]

# --------------------------------------------------------------------------
# Hostile values: specs and their builders
# --------------------------------------------------------------------------


class IntSub(int):
    pass


class StrSub(str):
    pass


class FloatSub(float):
    pass


class SneakyDict(dict):  # type: ignore[type-arg]
    """A dict subclass whose own methods lie or raise: reading must not use them."""

    def items(self) -> Any:
        raise RuntimeError("SneakyDict.items was called")

    def keys(self) -> Any:
        raise RuntimeError("SneakyDict.keys was called")

    def __iter__(self) -> Any:
        raise RuntimeError("SneakyDict.__iter__ was called")

    def __len__(self) -> int:
        raise RuntimeError("SneakyDict.__len__ was called")


class SneakyList(list):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        raise RuntimeError("SneakyList.__iter__ was called")


class Opaque:
    def __repr__(self) -> str:
        raise RuntimeError("Opaque.__repr__ was called")


SCALARS: list[Any] = [None, True, False, 0, -1, 2**70, 1.5, -0.0, "", "a", "héllo", "\U0001F600",
                      math.nan, math.inf, -math.inf, "\ud800", "x\udfffy", "\udc80"]


@functools.cache
def scalars() -> st.SearchStrategy[Spec]:
    return st.sampled_from(SCALARS).map(lambda v: ("scalar", v))


@functools.cache
def odd_leaves() -> st.SearchStrategy[Spec]:
    return st.one_of(
        st.integers(-3, 3).map(lambda v: ("intsub", v)),
        st.sampled_from(["s", "\ud801"]).map(lambda v: ("strsub", v)),
        st.just(("floatsub", 1.0)),
        st.just(("bytes", b"raw")),
        st.just(("set",)),
        st.just(("object",)))


@functools.cache
def values(depth: int = 3) -> st.SearchStrategy[Spec]:
    """Any value: mostly JSON, often not (odd leaves, tuples, subclasses, frozen values,
    hand-built FrozenLists, cycles, aliases, deep nesting), nested up to about *depth*
    levels (a recursive strategy, so that its repr stays small)."""
    leaves = st.one_of(scalars(), scalars(), odd_leaves(), st.just(("cycle",)),
                       st.tuples(st.sampled_from([120, 126, 127, 128, 129, 200, 5000]),
                                 st.booleans()).map(lambda t: ("deep", t[0], t[1])))
    if depth <= 0:
        return leaves
    keys = st.one_of(st.sampled_from(["k", "type", "text", "x\ud800", ""]).map(lambda k: ("key", k)),
                     st.sampled_from([1, None, ("t",)]).map(lambda k: ("badkey", k)))

    def extend(inner: st.SearchStrategy[Spec]) -> st.SearchStrategy[Spec]:
        return st.one_of(
            st.lists(inner, max_size=3).map(lambda items: ("list", items)),
            st.lists(st.tuples(keys, inner), max_size=3).map(lambda pairs: ("dict", pairs)),
            st.lists(inner, max_size=2).map(lambda items: ("tuple", items)),
            inner.map(lambda item: ("frozen", item)),
            st.lists(inner, max_size=2).map(lambda items: ("rawfrozen", items)),
            st.lists(st.tuples(keys, inner), max_size=2).map(lambda pairs: ("sneakydict", pairs)),
            st.lists(inner, max_size=2).map(lambda items: ("sneakylist", items)),
            inner.map(lambda item: ("alias", item)))

    return st.recursive(leaves, extend, max_leaves=4 * depth)


def build(spec: Spec) -> Any:
    """A fresh object for *spec* (each call builds new containers)."""
    kind = spec[0]
    if kind == "scalar":
        return spec[1]
    if kind == "intsub":
        return IntSub(spec[1])
    if kind == "strsub":
        return StrSub(spec[1])
    if kind == "floatsub":
        return FloatSub(spec[1])
    if kind == "bytes":
        return bytes(spec[1])
    if kind == "set":
        return {1, 2}
    if kind == "object":
        return Opaque()
    if kind == "key":
        return spec[1]
    if kind == "badkey":
        return spec[1]
    if kind == "list":
        return [build(item) for item in spec[1]]
    if kind == "dict":
        return {_key(k): build(v) for k, v in spec[1]}
    if kind == "tuple":
        return tuple(build(item) for item in spec[1])
    if kind == "frozen":
        try:
            return freeze(build(spec[1]))
        except TurnstileError:
            return build(spec[1])
    if kind == "rawfrozen":
        return tuple.__new__(FrozenList, [build(item) for item in spec[1]])
    if kind == "sneakydict":
        value = SneakyDict()
        for k, v in spec[1]:
            dict.__setitem__(value, _key(k), build(v))
        return value
    if kind == "sneakylist":
        return SneakyList(build(item) for item in spec[1])
    if kind == "alias":
        shared = build(spec[1])
        return [shared, {"again": shared}]
    if kind == "cycle":
        loop: list[Any] = [1]
        loop.append({"back": loop})
        return loop
    if kind == "deep":
        depth, frozen = spec[1], spec[2]
        value: Any = FrozenList([]) if frozen else []
        for _ in range(depth):
            value = FrozenList([value]) if frozen else [value]
        return value
    if kind == "message":
        return _message(spec)
    if kind == "literal":
        return json.loads(spec[1])
    raise AssertionError(f"unknown spec {kind!r}")


def _key(spec: Spec) -> Any:
    return build(spec)


BLOCK_SPECS = st.one_of(
    st.sampled_from(['{"type": "text", "text": "hi"}', '{"type": "x-note", "n": 1}',
                     '{"type": "reasoning", "text": "r"}', '{"text": "untyped"}',
                     '{"type": "tool-call", "id": "c1", "name": "t", "arguments": "{}"}'])
    .map(lambda text: ("literal", text)),
    values(2))


GOOD_SOURCES = st.sampled_from(['{"kind": "user"}', '{"kind": "plugin", "plugin": "p"}',
                                 '{"kind": "x-ext", "x": [1]}']).map(lambda t: ("literal", t))
GOOD_IDS = st.sampled_from(["m1", "m2", "m3", "id-é"]).map(lambda v: ("scalar", v))


@functools.cache
def messages() -> st.SearchStrategy[Spec]:
    """A user message: often well formed, sometimes carrying a hostile value inside an
    extension block (accepted if it is JSON), sometimes with a hostile field."""
    good = st.fixed_dictionaries({
        "id": GOOD_IDS, "role": st.just(("scalar", "user")),
        "content": st.lists(st.sampled_from(['{"type": "text", "text": "hi"}',
                                             '{"type": "x-note", "n": 1}'])
                            .map(lambda t: ("literal", t)), max_size=2)
        .map(lambda b: ("list", b)),
        "source": GOOD_SOURCES}).map(lambda f: ("message", f))
    carrying = st.fixed_dictionaries({
        "id": GOOD_IDS, "role": st.just(("scalar", "user")),
        "content": values(2).map(lambda v: ("list", [("dict", [
            (("key", "type"), ("scalar", "x-carry")), (("key", "v"), v)])])),
        "source": GOOD_SOURCES}).map(lambda f: ("message", f))
    return st.one_of(good, good, good, carrying, carrying, _hostile_messages())


@functools.cache
def _hostile_messages() -> st.SearchStrategy[Spec]:
    fields = st.fixed_dictionaries({
        "id": st.one_of(st.sampled_from(["m1", "m2", "m3", "id-é"]).map(lambda v: ("scalar", v)),
                        values(1)),
        "role": st.one_of(st.just(("scalar", "user")), st.just(("scalar", "user")),
                          values(0)),
        "content": st.one_of(st.lists(BLOCK_SPECS, max_size=3).map(lambda b: ("list", b)),
                             values(2)),
        "source": st.one_of(
            st.sampled_from(['{"kind": "user"}', '{"kind": "plugin", "plugin": "p"}',
                             '{"kind": "x-ext", "x": [1]}']).map(lambda t: ("literal", t)),
            values(1)),
    }, optional={"extra": values(0)})
    return fields.map(lambda f: ("message", f))


GOOD_ANSWERS: dict[str, Any] = {
    "prompt-submit": {"kind": "allow"}, "request": {"config": {"provider": "p", "model": "m"}},
    "tool-execute": {"content": [{"type": "text", "text": "done"}]},
    "system-prompt": "be brief"}


#: The number of the input being built: well-formed message ids get it as a suffix, so
#: that every message is distinct (the R20.1 ledgers count by id) and A, B and M still get
#: the same ids.
_INPUT = [0]


def _message(spec: Spec) -> Any:
    value = {name: build(part) for name, part in spec[1].items()}
    if type(value.get("id")) is str and value["id"]:
        value["id"] = f"{value['id']}.{_INPUT[0]}"
    return value


@functools.cache
def decisions() -> st.SearchStrategy[Spec]:
    good = st.sampled_from(['{"kind": "allow"}', '{"kind": "block", "reason": "no"}',
                            '{"kind": "allow", "content": [{"type": "text", "text": "new"}]}'])
    return st.one_of(
        good.map(lambda t: ("literal", t)), good.map(lambda t: ("literal", t)),
        st.tuples(st.sampled_from(["allow", "block", "maybe"]), values(2), messages()).map(
            lambda t: ("dict", [(("key", "kind"), ("scalar", t[0])),
                                (("key", "content"), t[1]),
                                (("key", "additionalContexts"), ("list", [t[2]]))])),
        values(2))


@functools.cache
def tool_results() -> st.SearchStrategy[Spec]:
    good = st.sampled_from(['{"content": [{"type": "text", "text": "ok"}]}',
                            '{"content": [], "isError": true, "error": {"name": "E"}}',
                            '{"content": [], "meta": {"k": [1, 2]}, "concludesTurn": true}'])
    return st.one_of(
        good.map(lambda t: ("literal", t)), good.map(lambda t: ("literal", t)),
        st.tuples(values(2), values(2), messages()).map(
            lambda t: ("dict", [(("key", "content"), ("list", [t[0]])),
                                (("key", "meta"), t[1]),
                                (("key", "additionalContexts"), ("list", [t[2]]))])),
        values(2))


@functools.cache
def chunks() -> st.SearchStrategy[Spec]:
    good = st.sampled_from([
        '{"type": "text", "text": "hel"}', '{"type": "reasoning", "text": "hmm"}',
        '{"type": "tool-call", "id": "c1", "name": "exc", "arguments": "{}"}',
        '{"type": "tool-call", "id": "c2", "name": "par", "arguments": "[[[[[[[[1]]]]]]]]"}',
        '{"type": "finish", "kind": "stop"}', '{"type": "finish", "kind": "max-tokens"}',
        '{"type": "finish", "kind": "stop", "usage": {"in": 1}}',
        '{"type": "finish", "kind": "error", "failure": {"message": "m", "code": "C"}}',
        '{"type": "block", "block": {"type": "x-b", "v": 1}}'])
    deep_arguments = st.sampled_from([200, 5000]).map(lambda n: (
        "literal", json.dumps({"type": "tool-call", "id": "cd", "name": "exc",
                               "arguments": "[" * n + "]" * n})))
    return st.one_of(
        good.map(lambda t: ("literal", t)), good.map(lambda t: ("literal", t)),
        good.map(lambda t: ("literal", t)), deep_arguments,
        st.tuples(st.sampled_from(["text", "finish", "block", "tool-call"]), values(2)).map(
            lambda t: ("dict", [(("key", "type"), ("scalar", t[0])), (("key", "text"), t[1]),
                                (("key", "kind"), ("scalar", "stop")),
                                (("key", "block"), t[1])])),
        values(2))


@functools.cache
def headers() -> st.SearchStrategy[Spec]:
    good = st.sampled_from(['{"config": {"provider": "p", "model": "m"}}',
                            '{"config": {"provider": "p", "model": "m2"}, "system": "s"}'])
    return st.one_of(
        good.map(lambda t: ("literal", t)), good.map(lambda t: ("literal", t)),
        st.tuples(values(2)).map(lambda t: ("dict", [
            (("key", "config"), ("literal", '{"provider": "p", "model": "m"}')),
            (("key", "tools"), t[0])])),
        values(2))


ERRORS = [ErrorInfo("boom"), ErrorInfo("", "HookError", "E_CODE", ("cause",)),
          ErrorInfo("model down", "ModelError", failure=LlmFailure("down", "UNAVAILABLE", 503))]


def mutate(value: Any, seed: int) -> None:
    """Change *value* in place (its first mutable containers), as a caller might after
    handing it over."""
    pending = [value]
    seen: set[int] = set()
    changed = 0
    while pending and changed < 3:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if type(item) in (dict, SneakyDict):
            for key in list(dict.keys(item)):
                pending.append(dict.__getitem__(item, key))
            if seed % 3 == 0:
                dict.clear(item)
            else:
                dict.__setitem__(item, "mutated", seed)
                if "text" in dict.keys(item):
                    dict.__setitem__(item, "text", f"changed {seed}")
            changed += 1
        elif type(item) in (list, SneakyList):
            pending.extend(list.__iter__(item))
            list.append(item, {"type": "text", "text": f"appended {seed}"})
            changed += 1
        elif isinstance(item, tuple):
            pending.extend(tuple.__iter__(item))


# --------------------------------------------------------------------------
# The state machine
# --------------------------------------------------------------------------

TOOL_MODES: Any = {"par": "parallel"}


def counting_clock() -> Callable[[], float]:
    ticks = iter(range(1, 10**9))
    return lambda: next(ticks)


def rendered(output: Output) -> str:
    if isinstance(output, Durable):
        return json.dumps({"out": "event", **output.event.to_json(with_time=True)},
                          sort_keys=True)
    return json.dumps(output.to_json(), sort_keys=True)


def error_key(error: BaseException | None) -> tuple[str, str] | None:
    if error is None:
        return None
    if isinstance(error, (ValidationError, InvariantError)):
        return (type(error).__name__, str(error))
    return (type(error).__name__, "")


class HostileInputs(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.a: AgentCore
        self.b: AgentCore
        self.m: ModelAgent
        self.monitor: InvariantMonitor
        self.given: list[tuple[Any, Any]] = []   # (A's object, M's object) given so far
        self.steps: list[str] = []

    @initialize(parallel=st.sampled_from([1, 2]))
    def setup(self, parallel: int) -> None:
        config = CoreConfig(request_options={"provider": "p", "model": "m"},
                            tool_modes=TOOL_MODES, max_parallel_tool_calls=parallel)
        self.a = AgentCore(config, log=SessionLog(clock=counting_clock()))
        self.b = AgentCore(config, log=SessionLog(clock=counting_clock()))
        self.m = ModelAgent(config, log=SessionLog(clock=counting_clock()))
        self.monitor = InvariantMonitor(self.a, self.a)
        self.pull(1000)

    # -- applying one input to the three agents ------------------------------------

    def apply(self, what: str, call: Callable[[Any, Callable[[], Any]], Any],
              spec: Spec | None) -> None:
        """Give the input to A and M (each its own build of *spec*), and to B if A accepted
        it. Only typed errors may escape, and A and M must agree."""
        self.steps.append(what)
        _INPUT[0] = len(self.steps)
        note(f"step {len(self.steps)}: {what}")
        made: dict[str, Any] = {}

        def maker(name: str) -> Callable[[], Any]:
            def make() -> Any:
                made[name] = build(spec) if spec is not None else None
                return made[name]
            return make

        outcomes: list[BaseException | None] = []
        for name, agent in (("a", self.a), ("m", self.m)):
            try:
                call(agent, maker(name))
            except TurnstileError as error:
                outcomes.append(error)
            else:
                outcomes.append(None)
        assert error_key(outcomes[0]) == error_key(outcomes[1]), (what, outcomes)
        if outcomes[0] is None:
            call(self.b, maker("b"))             # B must accept what A accepted
            if "a" in made and "m" in made:
                self.given.append((made["a"], made["m"]))
        self.check_never_stopped()

    def pull(self, limit: int) -> None:
        for _ in range(limit):
            outputs = [agent.next_output() for agent in (self.a, self.b, self.m)]
            if outputs[0] is not None:
                self.monitor.output(outputs[0])
            shown = [None if o is None else rendered(o) for o in outputs]
            assert shown[0] == shown[1], ("A and B diverge", shown[0], shown[1])
            assert shown[0] == shown[2], ("machine and model diverge", shown[0], shown[2])
            if outputs[0] is None:
                self.monitor.poll(quiet=True)
                return

    def check_never_stopped(self) -> None:
        assert self.a.failure is None, f"an input stopped the core: {self.a.failure}"
        assert self.m.failure is None

    # -- commands --------------------------------------------------------------------

    @rule(command=st.sampled_from(["followup", "steer", "inject"]), message=messages())
    def route(self, command: str, message: Spec) -> None:
        self.apply(command, lambda agent, make: getattr(agent, command)(make()), message)

    @rule(message=messages(), where=st.sampled_from(["next-turn", "next-step", "later"]),
          wakeup=st.sampled_from([True, False, 1, None]))
    def send(self, message: Spec, where: str, wakeup: Any) -> None:
        options = {"target": where, "wakeup": wakeup}
        self.apply("send", lambda agent, make: agent.send(make(), dict(options)), message)

    @rule(cause=st.sampled_from(['{"kind": "user"}', '{"kind": "parent"}',
                                 '{"kind": "disposed"}', '{"kind": "user", "x": 1}', '"user"']),
          keep=st.sampled_from([False, True, 1]))
    def cancel(self, cause: str, keep: Any) -> None:
        self.apply("cancel", lambda agent, make: agent.cancel(make(), keep), ("literal", cause))

    @rule(kind=st.sampled_from(["user/message", "x-ext/mark", "turn/start", "step/end",
                                "tool/result", "todo/write", "x\ud800"]), data=values(2),
          message=messages())
    def append(self, kind: str, data: Spec, message: Spec) -> None:
        if kind == "user/message":
            self.apply("append", lambda agent, make: agent.append(kind, make(),
                                                                 surface_op="append"), message)
        elif kind == "turn/start":
            turn = self.a.log.last_turn + 1
            self.apply("append", lambda agent, make: agent.append(kind, {
                "turn": turn, "trigger": {"kind": "retry"}, "x": make()}), data)
        else:
            self.apply("append", lambda agent, make: agent.append(kind, {"v": make()}), data)

    @rule(seed=st.integers(0, 100))
    def mutate_given(self, seed: int) -> None:
        """Mutate what was handed over: nothing the agents accepted may change (V6)."""
        if not self.given:
            return
        a_value, m_value = self.given[seed % len(self.given)]
        mutate(a_value, seed)
        mutate(m_value, seed)
        self.steps.append(f"mutate {seed}")

    @precondition(lambda self: len(self.steps) > 25)
    @rule()
    def dispose(self) -> None:
        self.apply("dispose", lambda agent, _make: agent.dispose(), None)

    # -- completions -----------------------------------------------------------------

    def _effect(self, index: int, kinds: tuple[str, ...] | None = None) -> Effect | None:
        effects = [e for e in self.a.outstanding() if kinds is None or e.kind in kinds]
        return effects[index % len(effects)] if effects else None

    @rule(index=st.integers(0, 9), data=st.data())
    def resolve(self, index: int, data: st.DataObject) -> None:
        effect = self._effect(index)
        if effect is None or effect.kind == "model":
            return
        strategy = {"prompt-submit": decisions(), "tool-prepare": st.one_of(
            st.just(("scalar", None)), st.just(("scalar", None)), tool_results()),
            "tool-execute": tool_results(), "tool-finalize": tool_results(),
            "request": headers(), "system-prompt": st.one_of(st.just(("scalar", "sys")),
                                                             values(2)),
            "request-error": st.sampled_from([("literal", '{"kind": "retry"}'),
                                              ("scalar", None)])}.get(
            effect.kind, st.just(("scalar", None)))
        value = data.draw(strategy)
        self.apply(f"resolve {effect.kind}",
                   lambda agent, make: agent.resolve(effect.id, make()), value)

    @rule(index=st.integers(0, 9), error=st.sampled_from(ERRORS))
    def fail(self, index: int, error: ErrorInfo) -> None:
        effect = self._effect(index)
        if effect is not None:
            self.apply(f"raise {effect.kind}", lambda agent, _make: agent.fail(effect.id, error),
                       None)

    @rule(index=st.integers(0, 9), chunk=chunks(), end=st.booleans())
    def stream(self, index: int, chunk: Spec, end: bool) -> None:
        effect = self._effect(index, ("model",))
        if effect is None:
            return
        self.apply("chunk", lambda agent, make: agent.chunk(effect.id, make()), chunk)
        if end:
            self.apply("end", lambda agent, _make: agent.end(effect.id), None)

    @rule(effect=st.sampled_from([-1, 10**6, True, 1.0, "1", None]),
          verb=st.sampled_from(["resolve", "chunk", "end", "fail", "fail-not-error"]))
    def protocol_hostile(self, effect: Any, verb: str) -> None:
        """Completions that break the protocol (P10): refused, typed, changing nothing."""
        def call(agent: Any, _make: Callable[[], Any]) -> Any:
            if verb == "resolve":
                return agent.resolve(effect, None)
            if verb == "chunk":
                return agent.chunk(effect, {"type": "text", "text": "x"})
            if verb == "end":
                return agent.end(effect)
            if verb == "fail":
                return agent.fail(effect, ERRORS[0])
            outstanding = self.a.outstanding_effects
            return agent.fail(outstanding[0] if outstanding else 0, {"message": "not an error"})
        self.apply(f"{verb} {effect!r}", call, None)

    @rule(rounds=st.integers(1, 12), calls=st.booleans())
    def advance(self, rounds: int, calls: bool) -> None:
        """Answer the oldest outstanding effects well, so that turns get far: a model call
        gets a reply (with two tool calls when *calls*), a finalize gives back its result."""
        for _ in range(rounds):
            self.pull(10_000)
            effect = self._effect(0)
            if effect is None:
                return
            self.answer_well(effect, calls)
            calls = calls and effect.kind != "model"

    def answer_well(self, effect: Effect, calls: bool) -> None:
        number = effect.id
        if effect.kind == "model":
            reply = ([{"type": "text", "text": "using tools"},
                      {"type": "tool-call", "id": "t1", "name": "par", "arguments": "{}"},
                      {"type": "tool-call", "id": "t2", "name": "exc", "arguments": '{"a": 1}'}]
                     if calls else [{"type": "text", "text": "done"}])
            for chunk in [*reply, {"type": "finish", "kind": "stop"}]:
                self.apply("chunk", lambda agent, _make, c=chunk: agent.chunk(number, dict(c)),
                           None)
            self.apply("end", lambda agent, _make: agent.end(number), None)
            return
        if effect.kind == "tool-finalize":
            answer: Any = effect.payload["result"]
        else:
            answer = json.loads(json.dumps(GOOD_ANSWERS.get(effect.kind)))
        self.apply(f"resolve {effect.kind}",
                   lambda agent, _make: agent.resolve(number, answer), None)

    @rule(rounds=st.integers(4, 30), calls=st.booleans())
    def converse(self, rounds: int, calls: bool) -> None:
        """A well-formed prompt, then good answers: the runs reach steps, tool batches and
        drains, where the hostile inputs then land."""
        self.apply("followup", lambda agent, make: agent.followup(make()), (
            "literal", json.dumps({"id": f"p{len(self.steps)}", "role": "user",
                                   "content": [{"type": "text", "text": "go"}],
                                   "source": {"kind": "user"}})))
        self.advance(rounds, calls)

    @rule(rounds=st.integers(1, 12), calls=st.booleans())
    def advance_again(self, rounds: int, calls: bool) -> None:
        self.advance(rounds, calls)

    # -- pulling -----------------------------------------------------------------------

    @rule(k=st.integers(1, 20))
    def pull_some(self, k: int) -> None:
        self.pull(k)

    @invariant()
    def not_stopped(self) -> None:
        if hasattr(self, "a"):
            self.check_never_stopped()

    def teardown(self) -> None:
        if not hasattr(self, "a"):
            return
        stats = os.environ.get("TURNSTILE_HOSTILE_STATS")
        if stats:   # how far the runs got, for tuning the strategies
            types = [e.type for e in self.a.log.events]
            with open(stats, "a", encoding="utf-8") as file:
                file.write(json.dumps({"steps": len(self.steps), "events": len(types),
                                       "turns": types.count("turn/end"),
                                       "tools": types.count("tool/result"),
                                       "chunks": types.count("assistant/chunk")}) + "\n")
        self.pull(10_000)
        for agent in (self.a, self.b, self.m):
            agent.dispose()
        self.pull(10_000)
        # Answer whatever the teardown still waits for (an abort is cooperative, R16.6).
        for _ in range(200):
            if self.a.disposed:
                break
            effect = self._effect(0)
            if effect is None:
                break
            number = effect.id
            self.apply("raise", lambda agent, _make, n=number: agent.fail(n, ERRORS[0]), None)
            self.pull(10_000)
        assert self.a.disposed and self.b.disposed and self.m.disposed, "dispose() did not complete"
        self.monitor.poll(quiet=True)


HostileInputs.TestCase.settings = settings.get_profile(PROFILE)
TestHostileInputs = HostileInputs.TestCase
