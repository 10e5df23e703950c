"""Bounded exhaustive exploration of the core (spec ASSURANCE §2).

The explorer enumerates every sequence of *decisions* up to a depth over a
finite alphabet, and checks every state it reaches:

* the runtime invariants of R20.1 (`machine.invariants.InvariantMonitor`, which
  also sees the inputs, so its ledger starts at each accepted command);
* the session invariants (the log checks every append; a violation raises);
* optionally, that an independent implementation (the reference model)
  produces exactly the same outputs, exceptions and read-only state for the
  same inputs.

Decisions are operations on a `Node` (a core, the other implementation, the
monitor and the meters of `machine.reach`); a sequence of them is replayed
from a fresh node. They are:

* commands (`COMMANDS`: ``followup``, ``steer``, ``inject``, a quiet send,
  ``cancel`` with cause user or parent, ``cancel`` with keepInbox,
  ``dispose``), issued at any observer position;
* answers to outstanding effects (`ANSWERS`: each effect kind has a few
  variants: allow/block/raise, a text reply, a tool call, three calls, a
  max-tokens finish, a model failure, a tool result with a context, a retry,
  a failing flush, ...), offered only when the core waits (P6 makes earlier
  answers equivalent);
* macro-decisions (`MACROS`), so that depth buys behaviour rather than
  bookkeeping: ``defaults`` answers every outstanding effect with its default
  variant, ``to:<landmark>`` answers with defaults and pulls until just after
  the next landmark output (a model request, a ``step/end``, a ``turn/end``, a
  flush), and ``settle`` runs to quiescence.

Pulling the next output is free: it does not count towards the depth, so
positions between any two outputs are explored.

States are deduplicated by a canonical key of everything the future of the
*whole node* depends on: the core (its log, queued outputs, outstanding
effects, buffered completions, the machines' states and contents, controller
and retry state, the loop's generator frames), the other implementation's
complete state (read generically: its attributes and generator frames), and
the invariant monitor's ledger. A key of the core alone would be unsound: a
core that drops an input lands on a state some shorter path reached, and the
node would be pruned before the model's differing outputs were compared or
the ledger polled at quiescence. Message ids are renamed by first appearance —
messages are distinguished only by identity (symmetry reduction). Search is
0-1 breadth-first, so the first violation found has a shortest decision
sequence; it is reported as a ready-to-paste list of input JSON objects.

Each run also reports its reach: which rule families (`machine.reach.FAMILIES`)
and which R19 rows × commands the explored paths exercised.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import re
import sys
import time
import types
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from machine.core import AgentCore, CoreConfig
from machine.errors import TurnstileError
from machine.events import Event
from machine.invariants import InvariantMonitor
from machine.io import (
    Cancel,
    Chunk,
    Dispose,
    Durable,
    Effect,
    End,
    Input,
    Output,
    Raise,
    Resolve,
    Send,
)
from machine.jsonvalue import JsonLike
from machine.log import SessionLog
from machine.reach import FamilyTracker, PositionTracker, command_kind
from machine.vocabulary import FOLLOWUP, INJECT, STEER, ErrorInfo, LlmFailure

#: ("pull",) | ("drain",) | ("cmd", name) | ("ans", kind, variant) | ("macro", name)
Action = tuple[str, ...]

COMMANDS: dict[str, Callable[[str], Input]] = {
    "followup": lambda mid: Send(_msg(mid), FOLLOWUP, preset="followup"),
    "steer": lambda mid: Send(_msg(mid), STEER, preset="steer"),
    "inject": lambda mid: Send(_msg(mid), INJECT, preset="inject"),
    "quiet": lambda mid: Send(_msg(mid), {"target": "next-turn", "wakeup": False}),
    "cancel": lambda _mid: Cancel({"kind": "user"}),
    "cancel-parent": lambda _mid: Cancel({"kind": "parent"}),
    "cancel-keep": lambda _mid: Cancel({"kind": "user"}, keep_inbox=True),
    "dispose": lambda _mid: Dispose(),
}
#: Every command but dispose (which ends the run; `ALL_COMMANDS` adds it).
DEFAULT_COMMANDS = ("followup", "steer", "inject", "quiet", "cancel", "cancel-parent",
                    "cancel-keep")
ALL_COMMANDS = (*DEFAULT_COMMANDS, "dispose")
#: The alphabet of the first explorer (kept for comparable benchmark figures and for the
#: mutation runs' verdicts): these commands, no macro-decisions, three model answers.
CLASSIC_COMMANDS = ("followup", "steer", "inject", "cancel")

_FAIL = ErrorInfo("boom", "Error", "BOOM")
_MODEL_FAIL = ErrorInfo("unavailable", "ModelError", "UNAVAILABLE",
                        failure=LlmFailure("unavailable", "UNAVAILABLE"))
_STOP: dict[str, JsonLike] = {"type": "finish", "kind": "stop"}


def _calls(fresh: str, count: int) -> list[tuple[str, JsonLike]]:
    return [*(("chunk", {"type": "tool-call", "id": f"call-{fresh}-{n}" if count > 1 else
                         f"call-{fresh}", "name": "t", "arguments": "{}"})
              for n in range(1, count + 1)), ("chunk", _STOP), ("end", None)]


#: effect kind -> variant name -> answer builder (given the effect payload and a fresh id).
ANSWERS: dict[str, dict[str, Callable[[dict[str, Any], str], list[tuple[str, JsonLike]]]]] = {
    "tick": {"ok": lambda p, m: [("resolve", None)]},
    "prompt-submit": {
        "allow": lambda p, m: [("resolve", {"kind": "allow"})],
        "block": lambda p, m: [("resolve", {"kind": "block", "reason": "no"})],
        "raise": lambda p, m: [("raise", _FAIL)],
    },
    "step": {"ok": lambda p, m: [("resolve", None)], "raise": lambda p, m: [("raise", _FAIL)]},
    "system-prompt": {"ok": lambda p, m: [("resolve", "sys")]},
    "request": {"ok": lambda p, m: [("resolve", {"config": {"provider": "p", "model": "m"}})]},
    "model": {
        "text": lambda p, m: [("chunk", {"type": "text", "text": "x"}), ("chunk", _STOP),
                              ("end", None)],
        "call": lambda p, m: _calls(m, 1),
        "calls3": lambda p, m: _calls(m, 3),
        "max": lambda p, m: [("chunk", {"type": "text", "text": "x"}),
                             ("chunk", {"type": "finish", "kind": "max-tokens"}), ("end", None)],
        "fail": lambda p, m: [("raise", _MODEL_FAIL)],
    },
    "tool-prepare": {"ok": lambda p, m: [("resolve", None)]},
    "tool-execute": {
        "ok": lambda p, m: [("resolve", {"content": [{"type": "text", "text": "ok"}]})],
        "ctx": lambda p, m: [("resolve", {"content": [{"type": "text", "text": "ok"}],
                                          "additionalContexts": [_msg(m, "plugin")]})],
        "raise": lambda p, m: [("raise", _FAIL)],
    },
    "tool-finalize": {"ok": lambda p, m: [("resolve", p["result"])]},
    "turn-stopping": {"ok": lambda p, m: [("resolve", None)]},
    "request-error": {"none": lambda p, m: [("resolve", None)],
                      "retry": lambda p, m: [("resolve", {"kind": "retry"})]},
    "flush": {"ok": lambda p, m: [("resolve", None)], "raise": lambda p, m: [("raise", _FAIL)]},
}
#: The answer variants explored by default: all but the three-call reply (see `PARALLEL`).
DEFAULT_ANSWERS: dict[str, tuple[str, ...]] = {
    kind: tuple(v for v in variants if v != "calls3") for kind, variants in ANSWERS.items()}
#: The variant a macro-decision answers with: the well-behaved environment.
DEFAULTS: dict[str, str] = {kind: next(iter(variants)) for kind, variants in ANSWERS.items()}

#: Macro-decisions: ``defaults``; ``to:<landmark>`` (see `LANDMARKS`); ``settle``.
LANDMARKS: dict[str, Callable[[Output], bool]] = {
    "model": lambda o: isinstance(o, Effect) and o.kind == "model",
    "step/end": lambda o: isinstance(o, Durable) and o.event.type == "step/end",
    "turn/end": lambda o: isinstance(o, Durable) and o.event.type == "turn/end",
    "flush": lambda o: isinstance(o, Effect) and o.kind == "flush",
    "tool-execute": lambda o: isinstance(o, Effect) and o.kind == "tool-execute",
}
#: Every macro-decision; a prefix may use any of them.
MACROS = ("defaults", *(f"to:{name}" for name in LANDMARKS), "settle")
#: The macro-decisions a search offers by default (a tool body is reached by answering).
DEFAULT_MACROS = tuple(m for m in MACROS if m != "to:tool-execute")


def _msg(message_id: str, kind: str = "user") -> dict[str, JsonLike]:
    source: dict[str, JsonLike] = {"kind": "user"} if kind == "user" else {
        "kind": "plugin", "plugin": "p"}
    return {"id": message_id, "role": "user", "content": [{"type": "text", "text": message_id}],
            "source": source}


class Agentlike(Protocol):
    """What the explorer drives: `AgentCore` or an implementation with its interface."""

    @property
    def status(self) -> str: ...
    @property
    def accepts_next_step(self) -> bool: ...
    @property
    def pending_queued(self) -> int: ...
    @property
    def pending_steering(self) -> int: ...
    @property
    def pending_context(self) -> int: ...
    def feed(self, item: Input) -> None: ...
    def next_output(self) -> Output | None: ...


@dataclass
class Node:
    """What a decision acts on: a core, the other implementation (if any), the invariant
    monitor, the meters, and what happened so far."""

    core: AgentCore
    other: Agentlike | None
    monitor: InvariantMonitor
    families: FamilyTracker
    positions: PositionTracker
    inputs: list[Input] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    steps: list[dict[str, JsonLike]] = field(default_factory=list)
    other_outputs: list[Output] = field(default_factory=list)
    #: (R19 row, command kind) of the last decision, if it was a command at a classified position
    last_cell: tuple[int, str] | None = None
    fresh: int = 0


#: The old name of `Node` (a replayed decision sequence).
Replay = Node


class Divergence(TurnstileError):
    """A violation or a difference, with the steps that reproduce it: inputs (``{"in": …}``)
    interleaved with the outputs pulled before them (``{"out": …}``), in order."""

    code = "DIVERGENCE"

    def __init__(self, message: str, steps: Sequence[dict[str, JsonLike]]) -> None:
        self.steps = list(steps)
        super().__init__(message)


@dataclass
class ExploreResult:
    depth: int
    states: int
    transitions: int
    seconds: float
    failure: Divergence | None = None
    #: the rule families (machine.reach.FAMILIES) some explored path exercised
    families: set[str] = field(default_factory=set)
    #: (R19 row, command kind) -> how many explored paths issued that command there (paths
    #: whose state another path had reached are counted too: they did issue it)
    cells: dict[tuple[int, str], int] = field(default_factory=dict)
    exhausted: bool = True

    @property
    def states_per_second(self) -> float:
        return self.states / self.seconds if self.seconds else float("inf")


class Explorer:
    """See the module docstring.

    *seed* events start every path from a seeded log; *prefix* decisions are applied to
    every path before the search and do not count towards the depth (a configuration
    that starts, say, inside a tool batch); *macros* are the macro-decisions offered.
    """

    def __init__(self, *, config: CoreConfig | None = None,
                 commands: Sequence[str] = DEFAULT_COMMANDS,
                 answers: dict[str, Sequence[str]] | None = None,
                 other: Callable[[], Agentlike] | None = None,
                 max_outputs: int = 400, seed: Sequence[Event] = (),
                 prefix: Sequence[Action] = (), macros: Sequence[str] = DEFAULT_MACROS,
                 defaults: dict[str, str] | None = None) -> None:
        self.config = config if config is not None else CoreConfig(
            request_options={"provider": "p", "model": "m"}, publish=False)
        unknown = [c for c in commands if c not in COMMANDS]
        if unknown:
            raise ValueError(f"unknown command(s) {unknown}; known: {sorted(COMMANDS)}")
        bad_macros = [m for m in macros if m not in MACROS]
        if bad_macros:
            raise ValueError(f"unknown macro(s) {bad_macros}; known: {list(MACROS)}")
        self.commands = tuple(commands)
        chosen = answers if answers is not None else DEFAULT_ANSWERS
        self.answers = {kind: tuple(chosen.get(kind, DEFAULT_ANSWERS[kind])) for kind in ANSWERS}
        for kind, variants in self.answers.items():
            missing = [v for v in variants if v not in ANSWERS[kind]]
            if missing:
                raise ValueError(f"unknown {kind} answer(s) {missing}; known: {list(ANSWERS[kind])}")
        self.defaults = {**DEFAULTS, **(defaults or {})}
        self.other = other
        self.max_outputs = max_outputs
        self.seed = tuple(seed)
        self.prefix = tuple(prefix)
        self.macros = tuple(macros)

    # -- nodes and decisions ---------------------------------------------------------
    def root(self) -> Node:
        """A fresh node: a new core (over the seed, if any), the other implementation, the
        monitor and the meters."""
        core = AgentCore(self.config, log=SessionLog(self.seed, clock=_counter()))
        other = self.other() if self.other is not None else None
        return Node(core, other, InvariantMonitor(core, core, sees_inputs=True),
                    FamilyTracker(tool_modes=self.config.tool_modes,
                                  max_parallel=self.config.max_parallel_tool_calls),
                    PositionTracker(core))

    def replay(self, actions: Sequence[Action]) -> Node:
        node = self.root()
        for action in actions:
            self.apply(node, action)
        return node

    def apply(self, node: Node, action: Action) -> None:
        """Apply one decision to *node* (raises `Divergence` on a violation or difference)."""
        node.last_cell = None
        if action[0] == "pull":
            if self.pull(node) is None:
                raise Divergence("explorer bug: pull with no output", node.steps)
            return
        if action[0] == "drain":
            if self.pull(node) is not None:
                raise Divergence("explorer bug: a drain found an output", node.steps)
            return
        if action[0] == "cmd":
            node.fresh += 1
            item = COMMANDS[action[1]](f"m{node.fresh}")
            kind, row = command_kind(item), node.positions.row
            if kind is not None and row is not None:
                node.last_cell = (row, kind)
            self.feed(node, item)
        elif action[0] == "ans":
            self.answer(node, action[1], action[2])
        elif action[0] == "macro":
            self.macro(node, action[1])
        else:
            raise ValueError(f"unknown decision {action!r}")
        if node.other is not None:
            self._compare_state(node)

    def pull(self, node: Node) -> Output | None:
        """Pull the next output of both implementations and compare them."""
        output = node.core.next_output()
        if output is None:
            # A pull that finds nothing still lets an implementation consume buffered
            # completions (P6): the other one must be pulled too, and must wait as well.
            if node.other is not None:
                theirs = node.other.next_output()
                if theirs is not None:
                    raise Divergence(f"output #{len(node.outputs) + 1} differs:\n  machine: none "
                                     f"(waits)\n  other:   {theirs.to_json()}", node.steps)
            return None
        node.outputs.append(output)
        node.steps.append(output.to_json())
        node.monitor.output(output)
        node.families.output(output)
        node.positions.output(output)
        if node.other is not None:
            theirs = node.other.next_output()
            self._compare_output(output, theirs, node)
            if theirs is not None:
                node.other_outputs.append(theirs)
        return output

    def feed(self, node: Node, item: Input) -> None:
        """Feed one input to both implementations; they must agree on raising."""
        window_open = node.core.accepts_next_step
        node.inputs.append(item)
        node.steps.append(item.to_json())
        mine = _apply(node.core, item)
        if mine is not None and node.other is None:
            raise Divergence(f"input {item.to_json()} raised {mine!r}", node.steps)
        if node.other is not None:
            theirs = _apply(node.other, item)
            if (mine is None) != (theirs is None) or (
                    mine is not None and type(mine) is not type(theirs)):
                raise Divergence(f"input {item.to_json()} raised {mine!r} here but "
                                 f"{theirs!r} in the other implementation", node.steps)
        node.monitor.input(item, accepted=mine is None)
        if mine is None:
            node.families.input(item, window_open=window_open)
            node.positions.command(item)
        node.monitor.poll()

    def answer(self, node: Node, kind: str, variant: str) -> None:
        """Answer the oldest outstanding effect of *kind* with *variant*."""
        effect = next((e for e in node.core.outstanding() if e.kind == kind), None)
        if effect is None:
            raise Divergence(f"explorer bug: no outstanding {kind} effect", node.steps)
        node.fresh += 1
        for item in self._answer_inputs(effect, variant, f"m{node.fresh}"):
            self.feed(node, item)

    def macro(self, node: Node, name: str) -> None:
        """``defaults``: answer each outstanding effect once with its default variant;
        ``to:X``: pull, answering with defaults whenever the core waits, until just after
        the next X output (or until nothing is left to do); ``settle``: the same until the
        core waits with no effect outstanding."""
        if name == "defaults":
            for effect in node.core.outstanding():
                node.fresh += 1
                for item in self._answer_inputs(effect, self.defaults[effect.kind],
                                                f"m{node.fresh}"):
                    self.feed(node, item)
            return
        landmark = LANDMARKS[name[3:]] if name.startswith("to:") else None
        while len(node.outputs) < self.max_outputs:
            output = self.pull(node)
            if output is not None:
                if landmark is not None and landmark(output):
                    return
                continue
            node.monitor.poll(quiet=True)
            outstanding = node.core.outstanding()
            if not outstanding:
                return
            effect = outstanding[0]
            node.fresh += 1
            for item in self._answer_inputs(effect, self.defaults[effect.kind], f"m{node.fresh}"):
                self.feed(node, item)

    def _answer_inputs(self, effect: Effect, variant: str, fresh: str) -> list[Input]:
        inputs: list[Input] = []
        for verb, value in ANSWERS[effect.kind][variant](dict(effect.payload), fresh):
            if verb == "resolve":
                inputs.append(Resolve(effect.id, value))
            elif verb == "raise":
                assert isinstance(value, ErrorInfo)
                inputs.append(Raise(effect.id, value))
            elif verb == "chunk":
                inputs.append(Chunk(effect.id, value))
            else:
                inputs.append(End(effect.id))
        return inputs

    def _compare_output(self, mine: Output, theirs: Output | None, node: Node) -> None:
        if theirs is None or mine.to_json() != theirs.to_json():
            raise Divergence(
                f"output #{len(node.outputs)} differs:\n  machine: {mine.to_json()}\n"
                f"  other:   {None if theirs is None else theirs.to_json()}", node.steps)

    def _compare_state(self, node: Node) -> None:
        core, other = node.core, node.other
        for name in ("status", "accepts_next_step", "pending_queued", "pending_steering",
                     "pending_context"):
            if getattr(core, name) != getattr(other, name):
                raise Divergence(f"read-only state {name!r} differs: machine "
                                 f"{getattr(core, name)!r}, other {getattr(other, name)!r}",
                                 node.steps)

    # -- search ------------------------------------------------------------------------
    def key(self, node: Node) -> str:
        """The canonical key of a node: the core, the other implementation and the
        monitor's ledger, message ids renamed by first appearance."""
        text = repr((_core_parts(node.core),
                     implementation_parts(node.other) if node.other is not None else None,
                     node.monitor.ledger()))
        return _renamed(text)

    def children(self, node: Node, probe: Output | None, *,
                 silent_change: bool = False) -> list[tuple[Action, int]]:
        """The decisions offered at *node* (whose next output, already taken, is *probe*).
        *silent_change*: the pull that found no output let the core consume a buffered
        completion without producing an output (a wake that claims nothing): the position
        after that pull is a position of its own, offered as a free ``drain``."""
        core = node.core
        result: list[tuple[Action, int]] = []
        if not core.disposed:
            result.extend((("cmd", name), 1) for name in self.commands)
        if len(node.outputs) >= self.max_outputs:
            return result
        if probe is not None:
            result.insert(0, (("pull",), 0))
            return result
        if silent_change:
            result.insert(0, (("drain",), 0))
        outstanding = core.outstanding()
        seen: set[str] = set()
        for effect in outstanding:
            kind = effect.kind
            if kind in seen:
                continue
            seen.add(kind)
            for variant in self.answers.get(kind, ()):
                result.append((("ans", kind, variant), 1))
        if outstanding:
            result.extend((("macro", name), 1) for name in self.macros)
        return result

    def run(self, depth: int, *, progress: Callable[[int, int, float], None] | None = None,
            budget_seconds: float | None = None) -> ExploreResult:
        start = time.perf_counter()
        visited: set[str] = set()
        queue: deque[tuple[tuple[Action, ...], int]] = deque([(self.prefix, 0)])
        transitions = 0
        last_report = start
        result = ExploreResult(depth, 0, 0, 0.0)
        while queue:
            actions, cost = queue.popleft()
            try:
                node = self.replay(actions)
                key = self.key(node)
                buffered = len(node.core._mail)
                probe = node.core.next_output()
                if probe is None:           # quiescence checks before any pruning
                    node.monitor.poll(quiet=True)
                fresh = key not in visited
                children = self.children(
                    node, probe, silent_change=probe is None and len(node.core._mail) < buffered
                    and (not actions or actions[-1][0] != "drain")) if fresh else []
            except Divergence as failure:
                result.failure = failure
                break
            except TurnstileError as error:
                result.failure = Divergence(f"{type(error).__name__}: {error}",
                                            replay_steps(self, actions))
                break
            result.families |= node.families.reached
            if node.last_cell is not None:   # this path issued a command at a classified row
                result.cells[node.last_cell] = result.cells.get(node.last_cell, 0) + 1
            if not fresh:
                continue
            visited.add(key)
            now = time.perf_counter()
            if progress is not None and now - last_report > 0.5:
                progress(len(visited), len(queue), now - start)
                last_report = now
            if budget_seconds is not None and now - start > budget_seconds:
                result.exhausted = False
                break
            for action, step_cost in children:
                if cost + step_cost > depth:
                    continue
                transitions += 1
                if step_cost == 0:
                    queue.appendleft(((*actions, action), cost))
                else:
                    queue.append(((*actions, action), cost + step_cost))
        result.states = len(visited)
        result.transitions = transitions
        result.seconds = time.perf_counter() - start
        return result


# --------------------------------------------------------------------------
# Configurations: where an exploration starts
# --------------------------------------------------------------------------

_SEED_JSON: list[dict[str, JsonLike]] = [
    {"type": "user/message", "seq": 0, "time": 1, "surfaceOp": "append",
     "data": {"id": "old-0", "role": "user", "content": [{"type": "text", "text": "ctx"}],
              "source": {"kind": "plugin", "plugin": "old"}}},
    {"type": "turn/start", "seq": 1, "time": 2,
     "data": {"turn": 1, "trigger": {"kind": "message", "source": {"kind": "user"}}}},
    {"type": "user/message", "seq": 2, "time": 3, "surfaceOp": "append",
     "data": {"id": "old-1", "role": "user", "content": [{"type": "text", "text": "hi"}],
              "source": {"kind": "user"}}},
    {"type": "step/start", "seq": 3, "time": 4, "data": {"turn": 1, "step": 1}},
    {"type": "request/header", "seq": 4, "time": 5,
     "data": {"header": {"config": {"provider": "p", "model": "old"}}, "reason": "initial"}},
    {"type": "step/end", "seq": 5, "time": 6, "data": {"turn": 1, "step": 1}},
    {"type": "turn/end", "seq": 6, "time": 7, "data": {"turn": 1, "reason": {"kind": "completed"}}},
]
#: A finished earlier session (one turn with a request header) to resume from.
SEED_EVENTS: tuple[Event, ...] = tuple(Event.from_json(e) for e in _SEED_JSON)


@dataclass(frozen=True)
class Configuration:
    """Where an exploration starts and what it may do: the core's configuration, a seeded
    log, a prefix of decisions applied before the search, the alphabet, and the depths of
    the CI run and of the deep profile."""

    name: str
    description: str
    config: CoreConfig
    seed: tuple[Event, ...] = ()
    prefix: tuple[Action, ...] = ()
    commands: tuple[str, ...] = DEFAULT_COMMANDS
    answers: dict[str, tuple[str, ...]] | None = None
    ci_depth: int = 4
    deep_depth: int = 6

    def explorer(self, *, with_model: bool = True, **overrides: Any) -> Explorer:
        """An explorer of this configuration (the reference model compared when asked)."""
        other: Callable[[], Agentlike] | None = None
        if with_model:
            config, seed = self.config, self.seed

            def other() -> Agentlike:
                return reference_model(config, SessionLog(seed, clock=_counter()))
        options: dict[str, Any] = {"config": self.config, "seed": self.seed,
                                   "prefix": self.prefix, "commands": self.commands,
                                   "answers": self.answers, "other": other}
        options.update(overrides)
        return Explorer(**options)


_PLAIN = CoreConfig(request_options={"provider": "p", "model": "m"}, publish=False)
CONFIGURATIONS: dict[str, Configuration] = {c.name: c for c in (
    Configuration("idle", "a fresh agent: routing, wake, admission, turns, cancels, retries",
                  _PLAIN, ci_depth=4, deep_depth=5),
    Configuration("turn", "inside a turn, the model request outstanding: every position of a "
                  "step, tool calls, request failures and retries, cancels of each kind",
                  _PLAIN, prefix=(("cmd", "followup"), ("macro", "to:model")),
                  ci_depth=3, deep_depth=4),
    Configuration("parallel", "a batch of three parallel calls with max_parallel_tool_calls 2: "
                  "the pool, its limit, aborts before and after dispatch",
                  CoreConfig(request_options={"provider": "p", "model": "m"}, publish=False,
                             tool_modes={"t": "parallel"}, max_parallel_tool_calls=2),
                  prefix=(("cmd", "followup"), ("macro", "to:model"), ("ans", "model", "calls3"),
                          ("macro", "to:tool-execute")),
                  commands=("steer", "inject", "cancel", "cancel-parent"),
                  answers={"model": ("text",), "tool-execute": ("ok", "raise")},
                  ci_depth=3, deep_depth=4),
    Configuration("seeded", "resuming a finished session (seeded log, session start resume), "
                  "dispose included",
                  CoreConfig(request_options={"provider": "p", "model": "m"}, publish=True,
                             session_start="resume"),
                  seed=SEED_EVENTS, commands=ALL_COMMANDS, ci_depth=3, deep_depth=5),
)}


def classic_explorer(**options: Any) -> Explorer:
    """The first explorer's alphabet (`CLASSIC_COMMANDS`, every answer variant it had, no
    macro-decisions), for figures and verdicts comparable with earlier runs."""
    settings: dict[str, Any] = {"commands": CLASSIC_COMMANDS, "macros": (),
                                "answers": {"model": ("text", "call", "fail")}}
    settings.update(options)
    return Explorer(**settings)


def replay_steps(explorer: Explorer, actions: Sequence[Action]) -> list[dict[str, JsonLike]]:
    """The steps of a decision sequence, as far as they can be applied; the failing one last."""
    node = explorer.root()
    for index, action in enumerate(actions):
        try:
            explorer.apply(node, action)
        except TurnstileError:
            node.steps.append({"failing decision": list(actions[index])})
            return node.steps
    return node.steps


def _apply(agent: Agentlike, item: Input) -> BaseException | None:
    try:
        agent.feed(item)
    except TurnstileError as error:
        return error
    return None


def _counter() -> Callable[[], float]:
    state = [0]

    def clock() -> float:
        state[0] += 1
        return float(state[0])
    return clock


_ID = re.compile(r"\b(m\d+|call-m\d+(?:-\d+)?)\b")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _renamed(text: str) -> str:
    names: dict[str, str] = {}

    def rename(match: re.Match[str]) -> str:
        token = match.group(1)
        if token not in names:
            names[token] = f"#{len(names)}"
        return names[token]
    return _ID.sub(rename, text)


def _core_parts(core: AgentCore) -> list[object]:
    parts: list[object] = [
        core.lifecycle.state, core.window.state, core.inbox.state, core.outbox.state,
        core.inbox.snapshot(), core.outbox.snapshot(),
        tuple((e.type, repr(e.data), repr(e.surface_op), repr(e.source_event_seqs))
              for e in core.log.events),
        tuple(repr(item) for item in core._out),
        tuple((k, v.kind) for k, v in core._effects.items()),
        tuple(repr(m) for m in core._mail), core._wake_effect, core._wait,
        repr(core._owner), repr(core._ctrl), core._pending_retry, repr(core._prior_failures),
        core._turn, core._step, repr(core._reason), repr(core._settle), core._header_logged,
        core._disposing, core._disposed, core._next_effect, core._next_signal,
        repr(core._retro),
    ]
    parts.append(_canonical(core._frames, 0))
    return parts


def state_key(core: AgentCore) -> str:
    """A canonical key of everything the core's future depends on (see the module docstring)."""
    return _renamed(repr(_core_parts(core)))


#: Attributes of an implementation that never change its future (the configuration, the
#: clock and id minting are fixed per explorer).
_FIXED_ATTRIBUTES = frozenset({"config", "_mint", "clock", "_clock"})


def implementation_parts(agent: object) -> tuple[object, ...]:
    """Everything an implementation's future may depend on, read generically: every attribute
    (its log as its events), generator frames followed through ``yield from`` and through
    generators held in locals, objects by their fields. For an implementation the explorer
    knows nothing about (the reference model), so that no state is pruned that differs."""
    state = vars(agent) if hasattr(agent, "__dict__") else {
        name: getattr(agent, name) for name in getattr(agent, "__slots__", ())}
    return tuple((name, _canonical(value, 0)) for name, value in sorted(state.items())
                 if name not in _FIXED_ATTRIBUTES)


def _canonical(value: object, depth: int) -> object:
    if depth > 40:
        return _ADDRESS.sub("", repr(value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, SessionLog):
        return tuple((e.type, repr(e.data), repr(e.surface_op), repr(e.source_event_seqs))
                     for e in value.events)
    if isinstance(value, types.GeneratorType):
        return _frames(value, depth)
    if isinstance(value, (list, tuple, deque)):
        return (type(value).__name__, tuple(_canonical(v, depth + 1) for v in value))
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, tuple(sorted(repr(_canonical(v, depth + 1)) for v in value)))
    if isinstance(value, dict) and type(value) is dict:
        return ("dict", tuple((repr(k), _canonical(v, depth + 1)) for k, v in value.items()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, tuple(
            (f.name, _canonical(getattr(value, f.name), depth + 1))
            for f in dataclasses.fields(value)))
    if isinstance(value, BaseException):
        return (type(value).__name__, repr(value.args),
                tuple((k, _canonical(v, depth + 1)) for k, v in sorted(vars(value).items())))
    if isinstance(value, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return getattr(value, "__qualname__", "function")
    return _ADDRESS.sub("", repr(value))


def _frames(generator: Any, depth: int) -> tuple[object, ...]:
    frames: list[object] = []
    while generator is not None:
        frame = generator.gi_frame
        if frame is None:
            frames.append("finished")
            break
        frames.append((generator.gi_code.co_name, frame.f_lasti, tuple(
            (k, _canonical(v, depth + 1)) for k, v in sorted(frame.f_locals.items())
            if k != "self")))
        generator = generator.gi_yieldfrom
    return tuple(frames)


def reference_model(config: CoreConfig, log: SessionLog | None = None) -> Agentlike:
    """A fresh reference model, ``ModelAgent`` of the repository's ``model/`` folder, over
    *log* (a fresh one by default).

    It is installed as the private package ``machine._model`` (setup.py maps it), so a
    ``model`` module of the user's never shadows it. It is imported by name because the type
    checker sees the folder as ``model`` (model/agent.py states that it is `Agentlike`).
    """
    if log is None:
        log = SessionLog(clock=_counter())
    agent: Agentlike = importlib.import_module("machine._model").ModelAgent(config, log=log)
    return agent


def main_explore(depth: int | None = None, *, configuration: str = "idle",
                 commands: Sequence[str] | None = None, with_model: bool = False,
                 budget_seconds: float | None = None, quiet: bool = False,
                 as_json: bool = False) -> int:
    """``turnstile explore``: explore one configuration (or ``all``) and report its reach;
    returns an exit code (0 ok, 1 violation). With *as_json* the report is one JSON object
    per configuration on standard output (`result_json`)."""

    from machine.reach import FAMILIES
    names = list(CONFIGURATIONS) if configuration == "all" else [configuration]
    reached: set[str] = set()
    for name in names:
        chosen = CONFIGURATIONS[name]
        run_depth = chosen.ci_depth if depth is None else depth
        options: dict[str, Any] = {} if commands is None else {"commands": tuple(commands)}
        explorer = chosen.explorer(with_model=with_model, **options)

        def progress(states: int, frontier: int, seconds: float, run_depth: int = run_depth,
                     name: str = name) -> None:
            if not quiet:
                print(f"\r{name} depth {run_depth}: {states} states, frontier {frontier}, "
                      f"{states / seconds:,.0f} states/s", end="", file=sys.stderr, flush=True)

        logger = logging.getLogger("turnstile")
        level = logger.level
        logger.setLevel(logging.ERROR)  # the explored failures' own warnings are expected
        try:
            result = explorer.run(run_depth, progress=progress, budget_seconds=budget_seconds)
        finally:
            logger.setLevel(level)
        if not quiet:
            print("\r" + " " * 78 + "\r", end="", file=sys.stderr)
        budget_reached = not result.exhausted
        if as_json:
            print(json.dumps(result_json(result, commands=list(explorer.commands),
                                         with_model=with_model, budget_reached=budget_reached,
                                         configuration=name), ensure_ascii=False))
        else:
            print(f"{name} depth {run_depth}: {result.states} states, {result.transitions} "
                  f"transitions in {result.seconds:.1f} s "
                  f"({result.states_per_second:,.0f} states/s)"
                  + (" [budget reached]" if budget_reached else ""))
            print(f"  rule families reached: "
                  f"{', '.join(f for f in FAMILIES if f in result.families)}")
            rows = sorted({row for row, _ in result.cells})
            print(f"  commands issued at R19 rows: {', '.join(map(str, rows))}")
        reached |= result.families
        if result.failure is not None:
            if not as_json:
                print(f"VIOLATION: {result.failure}")
                print("shortest reproducing sequence (inputs with the outputs pulled before "
                      "them):")
                for step in result.failure.steps:
                    print(" ", json.dumps(step))
            return 1
    missing = [f for f in FAMILIES if f not in reached]
    if missing and not as_json:
        print(f"rule families not reached: {', '.join(missing)}")
    if not as_json:
        print("no violation")
    return 0


def result_json(result: ExploreResult, *, commands: Sequence[str], with_model: bool,
                budget_reached: bool, configuration: str = "idle") -> dict[str, JsonLike]:
    """An exploration's result as JSON (``turnstile explore --json``)."""
    from machine.reach import FAMILIES
    failure: JsonLike = None
    if result.failure is not None:
        failure = {"message": str(result.failure), "steps": list(result.failure.steps)}
    return {"configuration": configuration, "depth": result.depth, "commands": list(commands),
            "model": with_model, "states": result.states, "transitions": result.transitions,
            "seconds": round(result.seconds, 3), "budgetReached": budget_reached,
            "families": [f for f in FAMILIES if f in result.families],
            "ok": result.failure is None, "violation": failure}
