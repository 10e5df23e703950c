"""The hostile-input property suite (issue 14, "Done when"; V1, V2, V6, V23, P3, P6, P10, P16).

A Hypothesis state machine drives every public command (send and its presets, cancel,
dispose, append), every completion (resolve, raise, chunk, end) and ``feed()`` with
malformed, deeply nested, aliased and later mutated values, against three agents. Every
argument gets hostile values: the message, send's options, the cancel's cause and
keepInbox, append's type, data, ``surface_op`` and ``source_event_seqs``, the value of a
completion, the `ErrorInfo` of a raise (built with odd fields, or not an `ErrorInfo` at
all), effect ids, and `Input` objects whose fields are any of these. Between them, rules
answer outstanding effects well (`settle` with the defaults of
`machine.checking.scripted.ScriptedEnvironment`), so that runs finish turns and the hostile inputs
land in every phase of one. The agents:

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
`machine.checking.invariants.InvariantMonitor` balance on A (nothing accepted is ever lost), and at
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
from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any

import pytest
from fate_checks import LedgeredCore, fate_problems
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from machine.checking import strategies
from machine.checking.invariants import InvariantMonitor
from machine.checking.scripted import ScriptedEnvironment
from machine.core import AgentCore, CoreConfig
from machine.errors import InvariantError, ProtocolError, TurnstileError, ValidationError
from machine.io import (
    Append,
    Cancel,
    Chunk,
    Durable,
    Effect,
    End,
    Observer,
    Output,
    Raise,
    Resolve,
    Send,
)
from machine.jsonvalue import FrozenList, freeze
from machine.log import SessionLog
from machine.vocabulary import ErrorInfo, LlmFailure

if TYPE_CHECKING:
    # The same files: setup.py installs model/ as machine._model, which mypy cannot follow.
    from model import ModelAgent
else:
    from machine._model import ModelAgent

settings.register_profile(
    "hostile-ci", max_examples=80, stateful_step_count=60, deadline=None,
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
def keys() -> st.SearchStrategy[Spec]:
    """A mapping's key: mostly a string (one with a lone surrogate), sometimes not a string."""
    return st.one_of(st.sampled_from(["k", "type", "text", "x\ud800", ""]).map(lambda k: ("key", k)),
                     st.sampled_from([1, None, ("t",)]).map(lambda k: ("badkey", k)))


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

    def extend(inner: st.SearchStrategy[Spec]) -> st.SearchStrategy[Spec]:
        return st.one_of(
            st.lists(inner, max_size=3).map(lambda items: ("list", items)),
            st.lists(st.tuples(keys(), inner), max_size=3).map(lambda pairs: ("dict", pairs)),
            st.lists(inner, max_size=2).map(lambda items: ("tuple", items)),
            inner.map(lambda item: ("frozen", item)),
            st.lists(inner, max_size=2).map(lambda items: ("rawfrozen", items)),
            st.lists(st.tuples(keys(), inner), max_size=2).map(lambda pairs: ("sneakydict", pairs)),
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
        if frozen:
            return _deep_frozen(depth)
        nested: Any = []
        for _ in range(depth):
            nested = [nested]
        return nested
    if kind == "message":
        return _message(spec)
    if kind == "literal":
        return json.loads(spec[1])
    if kind == "lib":                   # a library value (immutable): the same object for all
        return spec[1]
    if kind == "iter":                  # an iterator where a sequence is expected
        return iter([build(item) for item in spec[1]])
    if kind == "exception":
        return RuntimeError(spec[1])
    if kind == "errorinfo":             # an ErrorInfo of these fields, or them if it refuses
        parts = {name: build(part) for name, part in spec[1].items()}
        try:
            return ErrorInfo(**parts)
        except Exception:               # refused (or a hostile part raised): not an ErrorInfo
            return parts
    if kind == "input":
        return INPUTS[spec[1]](**{name: build(part) for name, part in spec[2].items()})
    raise AssertionError(f"unknown spec {kind!r}")


@functools.cache
def _deep_frozen(depth: int) -> FrozenList:
    """``FrozenList([])`` wrapped *depth* times. Built once: it is immutable, so every agent
    may share it, and wrapping costs each time a walk down to V1's bound."""
    value = FrozenList([])
    for _ in range(depth):
        value = FrozenList([value])
    return value


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


#: The environment whose default answers `settle` and `advance` give (allow, the seed config,
#: an ok tool result, a finalize's own result, None otherwise), as the scripted driver does.
DEFAULTS = ScriptedEnvironment(config={"provider": "p", "model": "m"})


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


def _scalar(value: Any) -> Spec:
    return ("scalar", value)


def _literal(text: str) -> Spec:
    return ("literal", text)


def _lib(value: Any) -> Spec:
    return ("lib", value)


@functools.cache
def error_infos() -> st.SearchStrategy[Spec]:
    """The error of a raise: well formed (`ERRORS`, `machine.checking.strategies.error_infos`), built
    by `ErrorInfo` from odd fields (long, empty, subclassed or non-string text, odd causes,
    a failure that is not an `LlmFailure`), or not an `ErrorInfo` at all (a dict of those
    fields when the constructor refuses them, an exception, any value)."""
    texts = st.one_of(st.sampled_from(["", "boom", "x" * 300, "é\U0001F600"]).map(_scalar),
                      values(0))
    names = st.one_of(st.sampled_from(["Error", "ModelError", "HookError"]).map(_scalar),
                      values(0))
    codes = st.one_of(st.just(_scalar(None)), st.sampled_from(["E_CODE", "", "UNAVAILABLE"])
                      .map(_scalar), values(0))
    causes = st.one_of(st.lists(texts, max_size=3).map(lambda c: ("tuple", c)),
                       st.lists(texts, max_size=2).map(lambda c: ("list", c)), values(1))
    failures = st.one_of(st.just(_scalar(None)), strategies.llm_failures().map(_lib),
                         values(1))
    built = st.fixed_dictionaries({"message": texts, "name": names, "code": codes,
                                   "causes": causes, "failure": failures}).map(
        lambda parts: ("errorinfo", parts))
    return st.one_of(st.sampled_from(ERRORS).map(_lib), strategies.error_infos().map(_lib),
                     built, built, st.just(("exception", "not an ErrorInfo")), values(1))


CAUSE_LITERALS = ['{"kind": "user"}', '{"kind": "parent"}', '{"kind": "disposed"}',
                  '{"kind": "user", "x": 1}', '"user"']


@functools.cache
def causes() -> st.SearchStrategy[Spec]:
    """A cancel's cause: well formed (JSON, or `CancelCause` values from
    `machine.checking.strategies.cancel_causes`), a mapping whose kind or extra field is hostile (a
    `SneakyDict` too), or any value."""
    kinds = st.one_of(st.sampled_from(["user", "parent", "disposed", "x-ext", ""]).map(_scalar),
                      values(0))
    extra = st.lists(st.tuples(keys(), values(1)), max_size=1)
    return st.one_of(
        st.sampled_from(CAUSE_LITERALS).map(_literal), st.sampled_from(CAUSE_LITERALS[:2])
        .map(_literal), strategies.cancel_causes().map(_lib),
        st.tuples(kinds, extra).map(lambda t: ("dict", [(("key", "kind"), t[0]), *t[1]])),
        kinds.map(lambda kind: ("sneakydict", [(("key", "kind"), kind)])),
        values(2))


KEEPS = st.one_of(st.booleans().map(_scalar), st.booleans().map(_scalar),
                  st.sampled_from([1, 0, None, "true", 1.0]).map(_scalar), values(0))
TARGETS = ["next-turn", "next-step", "later"]


@functools.cache
def send_options() -> st.SearchStrategy[Spec]:
    """send's options: well formed (JSON, or `SendOptions` values from
    `machine.checking.strategies.send_options`), with a hostile target or wakeup, a field missing or
    one too many, a `SneakyDict`, or any value."""
    targets = st.one_of(st.sampled_from(TARGETS).map(_scalar),
                        st.sampled_from(["now", "", "Next-Turn"]).map(_scalar), values(0))
    wakeups = st.one_of(st.booleans().map(_scalar),
                        st.sampled_from([1, 0, None, "true"]).map(_scalar), values(0))
    good = st.tuples(st.sampled_from(TARGETS), st.booleans()).map(lambda t: ("dict", [
        (("key", "target"), _scalar(t[0])), (("key", "wakeup"), _scalar(t[1]))]))
    return st.one_of(
        good, good, good, strategies.send_options().map(_lib),
        st.tuples(targets, wakeups, st.lists(st.tuples(keys(), values(1)), max_size=1)).map(
            lambda t: ("dict", [(("key", "target"), t[0]), (("key", "wakeup"), t[1]), *t[2]])),
        st.tuples(targets, wakeups).map(lambda t: ("sneakydict", [
            (("key", "target"), t[0]), (("key", "wakeup"), t[1])])),
        targets.map(lambda target: ("dict", [(("key", "target"), target)])),
        values(2))


@functools.cache
def surface_ops() -> st.SearchStrategy[Spec]:
    """append's ``surface_op``: absent, ``"append"``, a replace range (good, reversed,
    negative, out of range, with an extra field, with hostile bounds), or any value."""
    ranges = st.sampled_from([
        '{"op": "replace", "start": 0, "end": 0}', '{"op": "replace", "start": 0, "end": 1}',
        '{"op": "replace", "start": 1, "end": 3}', '{"op": "replace", "start": 2, "end": 1}',
        '{"op": "replace", "start": -1, "end": 0}', '{"op": "replace", "start": 0, "end": 99}',
        '{"op": "replace", "start": 0, "end": 1, "x": 1}', '{"op": "insert"}', '"replace"'])
    return st.one_of(
        st.just(_scalar(None)), st.just(_scalar("append")), ranges.map(_literal),
        st.tuples(values(0), values(0)).map(lambda t: ("dict", [
            (("key", "op"), _scalar("replace")), (("key", "start"), t[0]), (("key", "end"), t[1])])),
        values(1))


@functools.cache
def source_event_seqs() -> st.SearchStrategy[Spec]:
    """append's ``source_event_seqs``: absent, a list or tuple of seqs (earlier, later,
    negative, huge, repeated), an iterator, a list of odd leaves, or any value."""
    seqs = st.lists(st.sampled_from([0, 1, 2, 3, 5, 40, -1, 2**70]).map(_scalar), max_size=3)
    return st.one_of(
        st.just(_scalar(None)), seqs.map(lambda s: ("list", s)), seqs.map(lambda s: ("tuple", s)),
        seqs.map(lambda s: ("iter", s)),
        st.lists(st.one_of(odd_leaves(), values(0)), min_size=1, max_size=2).map(
            lambda s: ("list", s)),
        values(1))


#: The input classes `feed` takes (`Dispose` aside: the `dispose` rule gives it late).
INPUTS: dict[str, Any] = {"send": Send, "cancel": Cancel, "append": Append, "observer": Observer,
                          "resolve": Resolve, "raise": Raise, "chunk": Chunk, "end": End}


@functools.cache
def input_fields(kind: str) -> st.SearchStrategy[dict[str, Spec]]:
    """The fields of an `Input` of *kind* (a completion's effect id aside), hostile as the
    arguments of the matching command or completion are."""
    return {
        "send": st.fixed_dictionaries({"message": messages(), "options": send_options()},
                                      optional={"preset": st.sampled_from(
                                          ["followup", "steer", None, "x"]).map(_scalar)}),
        "cancel": st.fixed_dictionaries({"cause": causes(), "keep_inbox": KEEPS}),
        "append": st.fixed_dictionaries({
            "type": st.one_of(st.sampled_from(["user/message", "x-ext/mark", "turn/end"])
                              .map(_scalar), values(0)),
            "data": st.one_of(messages(), values(2)), "surface_op": surface_ops(),
            "source_event_seqs": source_event_seqs()}),
        "observer": st.fixed_dictionaries({"action": st.one_of(
            st.sampled_from(["throw", "veto", "raise"]).map(_scalar), values(1))}),
        "resolve": st.fixed_dictionaries({"value": st.one_of(
            decisions(), tool_results(), headers(), values(2))}),
        "raise": st.fixed_dictionaries({"error": error_infos()}),
        "chunk": st.fixed_dictionaries({"chunk": chunks()}),
        "end": st.just({})}[kind]


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
        elif is_dataclass(item) and not isinstance(item, type):      # an Input, an ErrorInfo
            pending.extend(getattr(item, field.name) for field in fields(item))


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


#: An input as `HostileInputs.apply` gives it: called with an agent and its value's maker.
Call = Callable[[Any, Callable[[], Any]], Any]


def failing(number: int) -> Call:
    """The input failing effect *number* with the first of `ERRORS`."""
    return lambda agent, _make: agent.fail(number, ERRORS[0])


def chunking(number: int, chunk: dict[str, Any]) -> Call:
    """The input streaming (a fresh copy of) *chunk* to model effect *number*."""
    return lambda agent, _make: agent.chunk(number, dict(chunk))


class HostileInputs(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.a: LedgeredCore
        self.b: AgentCore
        self.m: ModelAgent
        self.monitor: InvariantMonitor
        self.given: list[tuple[Any, Any]] = []   # (A's object, M's object) given so far
        self.steps: list[str] = []
        self.rule_runs = 0                          # rules run (the invariant counts them)

    @initialize(parallel=st.sampled_from([1, 2]),
                opening=st.sampled_from(["mid-turn", "a turn", "mid-turn", "a turn", "idle"]),
                rounds=st.integers(1, 14), calls=st.booleans())
    def setup(self, parallel: int, opening: str, rounds: int, calls: bool) -> None:
        """Three fresh agents; then, unless *opening* is idle, a well-formed prompt answered
        well to its end ("a turn") or for *rounds* effects ("mid-turn"), so that the rules
        start from a finished turn or inside a running one."""
        config = CoreConfig(request_options={"provider": "p", "model": "m"},
                            tool_modes=TOOL_MODES, max_parallel_tool_calls=parallel)
        self.a = LedgeredCore(config, log=SessionLog(clock=counting_clock()))
        self.b = AgentCore(config, log=SessionLog(clock=counting_clock()))
        self.m = ModelAgent(config, log=SessionLog(clock=counting_clock()))
        self.monitor = InvariantMonitor(self.a, self.a)
        self.pull(1000)
        self.opening = opening
        if opening != "idle":
            self.converse(rounds, calls, to_the_end=opening == "a turn")

    # -- applying one input to the three agents ------------------------------------

    def apply(self, what: str, call: Call, spec: Spec | None) -> None:
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
                self.a.ledger.output(outputs[0])
            shown = [None if o is None else rendered(o) for o in outputs]
            assert shown[0] == shown[1], ("A and B diverge", shown[0], shown[1])
            assert shown[0] == shown[2], ("machine and model diverge", shown[0], shown[2])
            if outputs[0] is None:
                self.monitor.poll(quiet=True)
                problems = fate_problems(self.a, self.monitor)   # RT26: one fate each
                assert not problems, problems
                return

    def check_never_stopped(self) -> None:
        assert self.a.failure is None, f"an input stopped the core: {self.a.failure}"
        assert self.m.failure is None

    # -- commands --------------------------------------------------------------------

    @rule(command=st.sampled_from(["followup", "steer", "inject"]), message=messages())
    def route(self, command: str, message: Spec) -> None:
        self.apply(command, lambda agent, make: getattr(agent, command)(make()), message)

    @rule(message=messages(), options=send_options())
    def send(self, message: Spec, options: Spec) -> None:
        self.apply("send", lambda agent, make: agent.send(*make()), ("tuple", [message, options]))

    @rule(cause=causes(), keep=KEEPS)
    def cancel(self, cause: Spec, keep: Spec) -> None:
        self.apply("cancel", lambda agent, make: agent.cancel(*make()), ("tuple", [cause, keep]))

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

    @rule(kind=st.sampled_from(["user/message", "steering/message", "assistant/message",
                                "tool/result", "x-ext/mark", "todo/write"]),
          message=messages(), op=surface_ops(), seqs=source_event_seqs())
    def append_envelope(self, kind: str, message: Spec, op: Spec, seqs: Spec) -> None:
        """A direct append whose ``surface_op`` and ``source_event_seqs`` are hostile (L3)."""
        data = message if kind.endswith("/message") else ("dict", [(("key", "v"), message)])
        self.apply("append", lambda agent, make: (lambda value, surface, sources: agent.append(
            kind, value, surface_op=surface, source_event_seqs=sources))(*make()),
            ("tuple", [data, op, seqs]))

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

    @rule(index=st.integers(0, 9), error=error_infos())
    def fail(self, index: int, error: Spec) -> None:
        effect = self._effect(index)
        if effect is not None:
            self.apply(f"raise {effect.kind}", lambda agent, make: agent.fail(effect.id, make()),
                       error)

    @rule(kind=st.sampled_from(sorted(INPUTS)), index=st.integers(0, 9),
          hostile_id=st.sampled_from([None, -1, 10**6, True, 1.0, "1", "sub"]), data=st.data())
    def feed(self, kind: str, index: int, hostile_id: Any, data: st.DataObject) -> None:
        """``feed()`` with an `Input` object whose fields are hostile: each command's
        arguments as above, a completion's value, an effect id that is real, a subclass of
        a real one, or not an id at all."""
        effect = self._effect(index)
        if hostile_id is None and effect is not None:
            number: Spec = _scalar(effect.id)
        elif hostile_id == "sub":
            number = ("intsub", effect.id if effect is not None else 0)
        else:
            number = _scalar(hostile_id)
        parts = data.draw(input_fields(kind))
        if kind in ("resolve", "raise", "chunk", "end"):
            parts = {"effect": number, **parts}
        spec = ("input", kind, parts)
        self.apply(f"feed {kind}", lambda agent, make: agent.feed(make()), spec)

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
        gets a reply (with two tool calls when *calls*), anything else the environment's
        default (`DEFAULTS`). An effect still outstanding after its answer (a hostile input
        left it so) is raised; after that it ends the rounds."""
        tried: dict[int, int] = {}
        for _ in range(rounds):
            self.pull(10_000)
            effect = self._effect(0)
            if effect is None:
                return
            tries = tried[effect.id] = tried.get(effect.id, 0) + 1
            if tries == 1:
                self.answer_well(effect, calls)
            elif tries == 2:
                self.apply(f"raise {effect.kind}", failing(effect.id), None)
            else:
                return
            calls = calls and effect.kind != "model"

    @rule(calls=st.booleans())
    def settle(self, calls: bool) -> None:
        """Answer every outstanding effect well until the core waits for nothing: the turn
        in progress ends, and so do the turns queued behind it (a bound stops a run that
        keeps making work)."""
        self.advance(300, calls)

    def answer_well(self, effect: Effect, calls: bool) -> None:
        number = effect.id
        if effect.kind == "model":
            reply = ([{"type": "text", "text": "using tools"},
                      {"type": "tool-call", "id": "t1", "name": "par", "arguments": "{}"},
                      {"type": "tool-call", "id": "t2", "name": "exc", "arguments": '{"a": 1}'}]
                     if calls else [{"type": "text", "text": "done"}])
            for chunk in [*reply, {"type": "finish", "kind": "stop"}]:
                self.apply("chunk", chunking(number, chunk), None)
            self.apply("end", lambda agent, _make: agent.end(number), None)
            return
        verb, answer = DEFAULTS.default(effect)     # type: ignore[misc]
        assert verb == "resolve"
        self.apply(f"resolve {effect.kind}",
                   lambda agent, _make: agent.resolve(number, answer), None)

    @rule(rounds=st.integers(4, 30), calls=st.booleans(), to_the_end=st.booleans())
    def converse(self, rounds: int, calls: bool, to_the_end: bool) -> None:
        """A well-formed prompt, then good answers (*to_the_end*: until the core waits for
        nothing, as `settle`): the runs reach steps, tool batches and drains, where the
        hostile inputs then land, and finish turns."""
        self.apply("followup", lambda agent, make: agent.followup(make()), (
            "literal", json.dumps({"id": f"p{len(self.steps)}", "role": "user",
                                   "content": [{"type": "text", "text": "go"}],
                                   "source": {"kind": "user"}})))
        self.advance(300 if to_the_end else rounds, calls)

    @rule(rounds=st.integers(1, 12), calls=st.booleans())
    def advance_again(self, rounds: int, calls: bool) -> None:
        self.advance(rounds, calls)

    # -- pulling -----------------------------------------------------------------------

    @rule(k=st.integers(1, 20))
    def pull_some(self, k: int) -> None:
        self.pull(k)

    @invariant()
    def not_stopped(self) -> None:
        self.rule_runs += 1
        if hasattr(self, "a"):
            self.check_never_stopped()

    def teardown(self) -> None:
        if not hasattr(self, "a"):
            return
        self.pull(10_000)
        stats = os.environ.get("TURNSTILE_HOSTILE_STATS")
        if stats:   # how far the runs got, for tuning the strategies
            types = [e.type for e in self.a.log.events]
            with open(stats, "a", encoding="utf-8") as file:
                file.write(json.dumps({"opening": self.opening, "rules": self.rule_runs,
                                       "steps": len(self.steps), "events": len(types),
                                       "turns": types.count("turn/end"),
                                       "tools": types.count("tool/result"),
                                       "chunks": types.count("assistant/chunk")}) + "\n")
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
            self.apply("raise", failing(number), None)
            self.pull(10_000)
        assert self.a.disposed and self.b.disposed and self.m.disposed, "dispose() did not complete"
        self.monitor.poll(quiet=True)
        undecided = self.a.ledger.pending()                   # RT26: torn down, all decided
        assert not undecided, undecided


HostileInputs.TestCase.settings = settings.get_profile(PROFILE)
TestHostileInputs = HostileInputs.TestCase


# --------------------------------------------------------------------------
# Holes the suite found and leaves out of its rules (known failures, strict: when one is
# fixed its test passes, fails as XPASS, and its mark goes; then the rules take it in)
# --------------------------------------------------------------------------


def hand_built_error(**parts: Any) -> ErrorInfo:
    """An `ErrorInfo` made without its constructor, so its checks (V15, V23) never ran, as
    ``tuple.__new__`` makes a `FrozenList` (issue 14.1)."""
    error = object.__new__(ErrorInfo)
    for name, value in {"message": "m", "name": "E", "code": None, "causes": (),
                        "failure": None, **parts}.items():
        object.__setattr__(error, name, value)
    return error


def waiting_on(agent: Any, kind: str) -> int:
    """Run a well-formed prompt, answering by default, until *agent* waits on *kind*."""
    agent.followup({"id": "m1", "role": "user", "content": [], "source": {"kind": "user"}})
    effects: dict[int, Effect] = {}
    number: int
    for _ in range(100):
        while (output := agent.next_output()) is not None:
            if isinstance(output, Effect):
                effects[output.id] = output
        (number,) = agent.outstanding_effects
        if effects[number].kind == kind:
            return number
        agent.resolve(number, DEFAULTS.default(effects[number])[1])   # type: ignore[index]
    raise AssertionError(f"no {kind} effect")


@pytest.mark.parametrize("agent_type", [AgentCore, ModelAgent])
@pytest.mark.parametrize("kind", ["prompt-submit", "model", "request"])
def test_V2_V15_a_hand_built_ErrorInfo_is_refused_where_it_enters(agent_type: type,
                                                                  kind: str) -> None:
    """V2, V15, P10: ``fail()`` checks its error however it was built (`ErrorInfo.checked`):
    one made without its constructor (a NaN message) is refused with a ValidationError and
    changes nothing; the same error built properly is then taken, and the core never
    stops. (Before, it was accepted and failed later inside the loop: the core stopped at
    admission, and at a model call machine and model diverged.)"""
    agent = agent_type(CoreConfig(request_options={"provider": "p", "model": "m"}))
    number = waiting_on(agent, kind)
    with pytest.raises(ValidationError, match=r"error\.message"):
        agent.fail(number, hand_built_error(message=math.nan))
    assert agent.outstanding_effects == (number,) and agent.drain_outputs() == []
    agent.fail(number, ErrorInfo("refused properly", "Error"))
    while agent.next_output() is not None:
        pass
    assert agent.failure is None, f"the core stopped: {agent.failure}"


def test_V2_a_hand_built_ErrorInfo_or_LlmFailure_is_checked_field_by_field() -> None:
    """`ErrorInfo.checked` reads the fields as stored: a missing field, a list subclass of
    causes (whose own iterator would run) and a hand-built failure are refused, typed; a
    properly built value comes back equal."""
    good = ErrorInfo("m", "E", "C", ("a",), LlmFailure("f", "RATE_LIMIT", 429))
    assert ErrorInfo.checked(good) == good
    bare = object.__new__(ErrorInfo)
    with pytest.raises(ValidationError, match="built without its constructor"):
        ErrorInfo.checked(bare)

    class Causes(list[str]):
        def __iter__(self) -> Any:
            raise AssertionError("the caller's iterator ran")

    sneaky = hand_built_error(message="m")
    object.__setattr__(sneaky, "causes", Causes(["x"]))
    with pytest.raises(ValidationError, match="causes"):
        ErrorInfo.checked(sneaky)
    failure = object.__new__(LlmFailure)
    for name, value in (("message", "f"), ("code", math.nan), ("status", None),
                        ("provider_retry_after_ms", None), ("request_id", None)):
        object.__setattr__(failure, name, value)
    wrapped = hand_built_error(message="m")
    object.__setattr__(wrapped, "failure", failure)
    with pytest.raises(ValidationError, match=r"failure\.code"):
        ErrorInfo.checked(wrapped)


@pytest.mark.parametrize("agent_type", [AgentCore, ModelAgent])
@pytest.mark.parametrize("item", [None, "dispose", {"in": "dispose"}, ErrorInfo("x")],
                         ids=["None", "str", "dict", "ErrorInfo"])
def test_P9_P10_feeding_what_is_not_an_input_is_a_typed_refusal(agent_type: type,
                                                                item: Any) -> None:
    """P9, P10: ``feed()`` of a value that is not an `Input` raises `ProtocolError` and
    changes nothing, in machine and model alike."""
    agent = agent_type(CoreConfig())
    before = agent.drain_outputs()
    with pytest.raises(ProtocolError, match="not an input"):
        agent.feed(item)
    assert before and agent.drain_outputs() == [] and len(agent.log) == 0
