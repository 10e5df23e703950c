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
monitor and the meters of `machine.reach`). A state is made by copying its
parent's node (`AgentCore.copy`, R4.12; the other implementation's ``copy()``)
and applying one decision; with an implementation that cannot be copied (or
``copy_states=False``) a sequence is replayed from a fresh node. They are:

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
  flush), and ``settle`` runs to quiescence; the scenario macro-decisions
  (`SCENARIOS`: ``block-followup``, ``tool-contexts``) play a sequence that would
  otherwise cost a decision per answer, offered only while an effect of their kind
  is outstanding.

Pulling the next output is free: it does not count towards the depth, so
positions between any two outputs are explored.

States are deduplicated by a canonical key of everything the future of the
*whole node* depends on: the core (its log, queued outputs, outstanding effects,
buffered completions, the machines' states and contents, controller and retry
state, the loop's frames: its whole explicit state, R4), the other
implementation's complete state (its ``state_parts()``, or read generically: its
attributes and generator frames), and the invariant monitor's ledger. A key of
the core alone would be unsound: a core that drops an input lands on a state
some shorter path reached, and the node would be pruned before the model's
differing outputs were compared or the ledger polled at quiescence. Message ids
are renamed by first appearance — messages are distinguished only by identity
(symmetry reduction). Search is 0-1 breadth-first, so the first violation found
has a shortest decision sequence; it is reported as a ready-to-paste list of
input JSON objects.

Each run also reports its reach: which rule families (`machine.reach.FAMILIES`)
and which R19 rows × commands the explored paths exercised.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import importlib
import json
import logging
import operator
import re
import time
import types
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Protocol

from machine.core import AgentCore, CoreConfig, state_of
from machine.core.snapshot import STATIC_ATTRIBUTES
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
from machine.jsonvalue import FrozenDict, FrozenList, JsonLike, compact_json
from machine.log import SessionLog
from machine.reach import FamilyTracker, PositionTracker, command_kind
from machine.terminal import ProgressBar, progress_bar
from machine.vocabulary import FOLLOWUP, INJECT, STEER, ErrorInfo, LlmFailure

#: ("pull",) | ("drain",) | ("cmd", name) | ("ans", kind, variant) | ("macro", name)
Action = tuple[str, ...]
#: An input fed, an output pulled, or a note (JSON) of a path.
Step = Input | Output | dict[str, JsonLike]

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


@dataclass(frozen=True)
class Scenario:
    """A macro-decision that plays a whole sequence the explorer would otherwise need many
    decisions for, offered only while an effect of one of its *kinds* is outstanding: it
    answers the oldest such effect with *first*, issues *command* (if any), then pulls,
    answering with the defaults but for *answers*, until just after an output *until*
    names (or until nothing is left to do)."""

    kinds: tuple[str, ...]
    first: str
    until: Callable[[Output], bool]
    answers: dict[str, str] = field(default_factory=dict)
    command: str | None = None


#: The scenario macro-decisions (`Scenario`), by name.
SCENARIOS: dict[str, Scenario] = {
    # R7.10, R8.3: a blocked admission followed by a second prompt, which the continue-or-
    # idle of the same busy interval claims (D1); it stops at that prompt's admission.
    "block-followup": Scenario(("prompt-submit",), "block",
                               lambda o: isinstance(o, Effect) and o.kind == "prompt-submit",
                               command="followup"),
    # R10.4: each tool body of the batch answers with a result carrying an additional
    # context; the stages run to the end of the step, whose drain takes the contexts.
    "tool-contexts": Scenario(("tool-prepare", "tool-execute", "tool-finalize"), "ok",
                              LANDMARKS["step/end"], answers={"tool-execute": "ctx"}),
}
#: Every macro-decision; a prefix may use any of them.
MACROS = ("defaults", *(f"to:{name}" for name in LANDMARKS), "settle", *SCENARIOS)
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
    #: the inputs fed and the outputs pulled, in order (as JSON in a `Divergence`)
    steps: list[Step] = field(default_factory=list)
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

    def __init__(self, message: str, steps: Sequence[Step]) -> None:
        # Why here: a step is written as JSON only when a violation reports it.
        self.steps: list[dict[str, JsonLike]] = [
            step if isinstance(step, dict) else step.to_json() for step in steps]
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
    #: family -> the fewest decisions of a path that exercised it (so the depth minus this
    #: is how many decisions after it the search explored)
    first_reached: dict[str, int] = field(default_factory=dict)
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
                 defaults: dict[str, str] | None = None, copy_states: bool = True) -> None:
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
        self.copy_states = copy_states
        self._texts = _Texts()
        self._emitter = _Emitter(self._texts)

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

    @property
    def copies(self) -> bool:
        """Whether the search copies states (the core always can, R4.12; the other
        implementation when it has a ``copy()``) instead of replaying each from the root
        (``copy_states=False`` asks for replay, to compare the two)."""
        return self.copy_states and (
            self.other is None or callable(getattr(self.root_other(), "copy", None)))

    def root_other(self) -> Agentlike | None:
        if not hasattr(self, "_other_sample"):
            self._other_sample = self.other() if self.other is not None else None
        return self._other_sample

    def copy(self, node: Node) -> Node:
        """An independent node in *node*'s state: the core restored from its state (R4.12),
        the other implementation's ``copy()``, the monitor and meters copied and bound to
        the new core."""
        core = node.core.copy()
        _own_clock(core.log)
        other = node.other.copy() if node.other is not None else None  # type: ignore[attr-defined]
        if other is not None:
            _own_clock(getattr(other, "log", None))
        return Node(core, other, _rebound(node.monitor, node.core, core),
                    _rebound(node.families, node.core, core),
                    _rebound(node.positions, node.core, core),
                    list(node.inputs), list(node.outputs), list(node.steps),
                    list(node.other_outputs), node.last_cell, node.fresh)

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
        self._observe(node, output)
        return output

    def _observe(self, node: Node, output: Output) -> None:
        """What follows the core's giving *output*: the meters see it, and the other
        implementation's next output must be the same."""
        node.outputs.append(output)
        node.steps.append(output)
        node.monitor.output(output)
        node.families.output(output)
        node.positions.output(output)
        if node.other is not None:
            theirs = node.other.next_output()
            self._compare_output(output, theirs, node)
            if theirs is not None:
                node.other_outputs.append(theirs)

    def feed(self, node: Node, item: Input) -> None:
        """Feed one input to both implementations; they must agree on raising."""
        window_open = node.core.accepts_next_step
        node.inputs.append(item)
        node.steps.append(item)
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
        scenario = SCENARIOS.get(name)
        if scenario is not None:
            self._scenario(node, scenario)
            return
        if name == "defaults":
            for effect in node.core.outstanding():
                node.fresh += 1
                for item in self._answer_inputs(effect, self.defaults[effect.kind],
                                                f"m{node.fresh}"):
                    self.feed(node, item)
            return
        self._run_until(node, LANDMARKS[name[3:]] if name.startswith("to:") else None,
                        self.defaults)

    def _run_until(self, node: Node, until: Callable[[Output], bool] | None,
                   answers: dict[str, str]) -> None:
        """Pull, answering the oldest outstanding effect with its variant in *answers*
        whenever the core waits, until just after an output *until* names (None: until the
        core waits with nothing outstanding)."""
        while len(node.outputs) < self.max_outputs:
            output = self.pull(node)
            if output is not None:
                if until is not None and until(output):
                    return
                continue
            node.monitor.poll(quiet=True)
            outstanding = node.core.outstanding()
            if not outstanding:
                return
            effect = outstanding[0]
            node.fresh += 1
            for item in self._answer_inputs(effect, answers[effect.kind], f"m{node.fresh}"):
                self.feed(node, item)

    def _scenario(self, node: Node, scenario: Scenario) -> None:
        """Play *scenario* (see `Scenario`)."""
        effect = next((e for e in node.core.outstanding() if e.kind in scenario.kinds), None)
        if effect is None:
            raise Divergence("explorer bug: a scenario with nothing to answer", node.steps)
        node.fresh += 1
        variant = scenario.first if effect.kind == scenario.kinds[0] else self.defaults[
            effect.kind]
        for item in self._answer_inputs(effect, scenario.answers.get(effect.kind, variant),
                                        f"m{node.fresh}"):
            self.feed(node, item)
        if scenario.command is not None:
            node.fresh += 1
            self.feed(node, COMMANDS[scenario.command](f"m{node.fresh}"))
        self._run_until(node, scenario.until, {**self.defaults, **scenario.answers})

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
    def key(self, node: Node) -> bytes:
        """The canonical key of a node: the core (its log, then the rest of its state), the
        other implementation and the monitor's ledger, message ids renamed by first
        appearance, as a digest. The log's part is a chain of digests made once per event
        (states share their parents' events, R4.12, L15), so a key costs what changed; the
        rest is a template and its ids' ranks (`_Emitter`), which determine the renamed text
        (`key_text`) and are determined by it."""
        log_digest, tokens, template, ids = self._key_parts(node)
        text = template.encode("utf-8", "surrogatepass")
        digest = hashlib.sha256(b"%d:" % len(text))
        digest.update(text)
        digest.update(array("I", _ranks(tokens, ids)).tobytes())
        return log_digest + digest.digest()

    def key_text(self, node: Node) -> tuple[bytes, str]:
        """What `key` digests, spelled out: the digest chain of the core's log (ids renamed),
        and the text ``repr((core parts, other parts, ledger))`` (`_core_parts`,
        `implementation_parts`) with its ids renamed after the log's (`_renamed`)."""
        log_digest, tokens, template, ids = self._key_parts(node)
        return log_digest, _filled(template, _ranks(tokens, ids))

    def _key_parts(self, node: Node) -> tuple[bytes, tuple[str, ...], str, list[str]]:
        texts, emitter = self._texts, self._emitter
        core = node.core
        raw_core, log_digest, tokens = texts.chain(core.log)
        emitter.begin()
        append, write = emitter.out.append, emitter.write
        emitter.state(core)
        other = node.other
        if other is None:
            append("None")
        else:
            other_log = getattr(other, "log", None)
            same_log: object = None
            if isinstance(other_log, SessionLog):
                # Its events are the core's while the outputs agree (they are compared as
                # they are pulled); the key says so, or holds the other log's own digest.
                raw_other = texts.chain(other_log)[0]
                same_log = "=core" if raw_other == raw_core else raw_other
            append("(")
            write(same_log)
            append(", ")
            parts = getattr(other, "state_parts", None)
            if callable(parts):
                append("(None, ")
                write(parts())
                append(")")
            else:
                emitter.text(repr(implementation_parts(other, texts, with_log=False)))
            append(")")
        append(", ")
        emitter.ledger(node.monitor.ledger())
        append(")")
        template, ids = emitter.finish()
        return log_digest, tokens, template, ids

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
            result.extend((("macro", name), 1) for name in self.macros
                          if name not in SCENARIOS or seen.intersection(SCENARIOS[name].kinds))
        return result

    def _probe(self, node: Node, actions: tuple[Action, ...]) -> list[tuple[Action, int]]:
        """The decisions offered at *node* (see `_expand`)."""
        return self._expand(node, actions)[0]

    def _expand(self, node: Node, actions: tuple[Action, ...]
                ) -> tuple[list[tuple[Action, int]], Node | None]:
        """The decisions offered at *node*, and its ``pull`` child when it has one and states
        are copied. The next output is pulled on a copy of the core (the node stays as it
        is, its other children's parent); that copy, the other implementation's copy pulled
        too, is the ``pull`` child. At quiescence the monitor checks the copy before anything
        is pruned."""
        if self.copies:
            core = node.core.copy()
            _own_clock(core.log)
            probing = Node(core, None, _rebound(node.monitor, node.core, core), node.families,
                           node.positions, outputs=node.outputs)
        else:
            probing = self.replay(actions)
            core = probing.core
        buffered = len(state_of(core)._mail)
        probe = core.next_output()
        if probe is None:               # quiescence checks before any pruning
            probing.monitor.poll(quiet=True)
        children = self.children(probing, probe, silent_change=probe is None
                                 and len(state_of(core)._mail) < buffered
                                 and (not actions or actions[-1][0] != "drain"))
        if probe is None or not self.copies or not children or children[0][0] != ("pull",):
            return children, None
        # Why: the copy has pulled already; the pull child is that copy, not one more.
        other = node.other.copy() if node.other is not None else None  # type: ignore[attr-defined]
        if other is not None:
            _own_clock(getattr(other, "log", None))
        child = Node(core, other, probing.monitor, _rebound(node.families, node.core, core),
                     _rebound(node.positions, node.core, core), list(node.inputs),
                     list(node.outputs), list(node.steps), list(node.other_outputs), None,
                     node.fresh)
        self._observe(child, probe)
        return children, child

    def run(self, depth: int, *, progress: Callable[[int, int, float], None] | None = None,
            budget_seconds: float | None = None) -> ExploreResult:
        """Explore every decision sequence of cost at most *depth* (0-1 breadth-first, so a
        violation found first has a shortest sequence). Each state is made by copying its
        parent's and applying one decision (R4.12); with an other implementation that cannot
        be copied, by replaying its decisions from the root."""
        # Why pause the cyclic collector: the search keeps a large, growing heap (the
        # frontier's states, the texts of every value met) and makes almost no cyclic garbage
        # (4,068 objects in 89,216 states of the classic search at depth 7), so the full
        # collections that the heap's growth triggers only re-walk it: 15 % of a depth-7 run.
        paused = gc.isenabled()
        gc.disable()
        try:
            return self._search(depth, progress, budget_seconds)
        finally:
            if paused:
                gc.enable()

    def _search(self, depth: int, progress: Callable[[int, int, float], None] | None,
                budget_seconds: float | None) -> ExploreResult:
        start = time.perf_counter()
        visited: set[bytes] = set()
        copies = self.copies
        # An entry: the parent (None: replay the sequence; a node: the state itself, made
        # already), the decision, the whole decision sequence, and its cost.
        queue: deque[tuple[_Parent | Node | None, Action | None, tuple[Action, ...], int]] = (
            deque([(None, None, self.prefix, 0)]))
        transitions = 0
        last_report = start
        result = ExploreResult(depth, 0, 0, 0.0)
        while queue:
            parent, decision, actions, cost = queue.popleft()
            try:
                if isinstance(parent, Node):
                    node = parent
                elif parent is None or decision is None:
                    node = self.replay(actions)
                else:
                    parent.pending -= 1
                    # Why: the parent's last child takes the parent itself, no copy.
                    node = parent.node if parent.pending == 0 else self.copy(parent.node)
                    self.apply(node, decision)
                key = self.key(node)
                fresh = key not in visited
                children: list[tuple[Action, int]] = []
                pulled: Node | None = None
                if fresh:
                    # A state with a key already visited has the same probe and quiescence
                    # verdict as the visited one (the key covers what both depend on).
                    children, pulled = self._expand(node, actions)
            except Divergence as failure:
                result.failure = failure
                break
            except TurnstileError as error:
                result.failure = Divergence(f"{type(error).__name__}: {error}",
                                            replay_steps(self, actions))
                break
            if not node.families.reached <= result.families:
                for family in node.families.reached - result.families:
                    result.first_reached[family] = cost
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
            offered = [(action, step_cost) for action, step_cost in children
                       if cost + step_cost <= depth]
            holder = _Parent(node, len(offered) - (pulled is not None)) if copies else None
            for action, step_cost in offered:
                transitions += 1
                entry: tuple[_Parent | Node | None, Action | None, tuple[Action, ...], int] = (
                    pulled if pulled is not None and action == ("pull",) else holder, action,
                    (*actions, action), cost + step_cost)
                if step_cost == 0:
                    queue.appendleft(entry)
                else:
                    queue.append(entry)
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
    macros: tuple[str, ...] = DEFAULT_MACROS
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
                                   "answers": self.answers, "macros": self.macros,
                                   "other": other}
        options.update(overrides)
        return Explorer(**options)


_PLAIN = CoreConfig(request_options={"provider": "p", "model": "m"}, publish=False)
CONFIGURATIONS: dict[str, Configuration] = {c.name: c for c in (
    Configuration("idle", "a fresh agent: routing, wake, admission, turns, cancels, retries",
                  _PLAIN, ci_depth=5, deep_depth=6),
    Configuration("turn", "inside a turn, the model request outstanding: every position of a "
                  "step, tool calls, request failures and retries, cancels of each kind, "
                  "dispose included",
                  _PLAIN, prefix=(("cmd", "followup"), ("macro", "to:model")),
                  commands=ALL_COMMANDS, ci_depth=3, deep_depth=4),
    Configuration("recovering", "a failed turn's recovery, its request-error point "
                  "outstanding: the retry authorized or not, cancels and dispose before "
                  "and after it and through the flush (D2), the retry run failing again "
                  "(a chain of failures)",
                  _PLAIN, prefix=(("cmd", "followup"), ("macro", "to:model"),
                                  ("ans", "model", "fail")),
                  commands=("followup", "steer", "inject", "cancel", "dispose"),
                  ci_depth=3, deep_depth=4),
    Configuration("parallel", "a batch of three parallel calls with max_parallel_tool_calls 2: "
                  "the pool, its limit, aborts before and after dispatch",
                  CoreConfig(request_options={"provider": "p", "model": "m"}, publish=False,
                             tool_modes={"t": "parallel"}, max_parallel_tool_calls=2),
                  prefix=(("cmd", "followup"), ("macro", "to:model"), ("ans", "model", "calls3"),
                          ("macro", "to:tool-execute")),
                  commands=("steer", "inject", "cancel", "cancel-parent"),
                  answers={"model": ("text",), "tool-execute": ("ok", "raise")},
                  # tool contexts are explored in the idle and turn configurations
                  macros=tuple(m for m in DEFAULT_MACROS if m != "tool-contexts"),
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


@dataclass(slots=True)
class _Parent:
    """A state whose children are queued, and how many of them still need it."""

    node: Node
    pending: int


def _rebound(meter: Any, old: AgentCore, new: AgentCore) -> Any:
    """A copy of a monitor or meter whose containers are its own and which watches *new*
    where it watched *old*."""
    copied = object.__new__(type(meter))
    attributes = vars(meter).copy()
    for name, value in attributes.items():
        if value is old:
            attributes[name] = new
        elif isinstance(value, (dict, list, set)):
            attributes[name] = value.copy()
    vars(copied).update(attributes)
    return copied


def replay_steps(explorer: Explorer, actions: Sequence[Action]) -> list[dict[str, JsonLike]]:
    """The steps of a decision sequence, as far as they can be applied; the failing one last."""
    node = explorer.root()
    for index, action in enumerate(actions):
        try:
            explorer.apply(node, action)
        except TurnstileError:
            node.steps.append({"failing decision": list(actions[index])})
            return Divergence("", node.steps).steps
    return Divergence("", node.steps).steps


def _apply(agent: Agentlike, item: Input) -> BaseException | None:
    try:
        agent.feed(item)
    except TurnstileError as error:
        return error
    return None


class _Counter:
    """The explorer's clock: 1, 2, 3, ... per log. Copied with its log when a state is
    copied, so a copied state stamps its events as a replayed one would."""

    __slots__ = ("now",)

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> float:
        self.now += 1
        return float(self.now)

    def copy(self) -> _Counter:
        return _Counter(self.now)


def _counter() -> _Counter:
    return _Counter()


def _own_clock(log: object) -> None:
    """Give a forked log its own copy of the explorer's clock (a fork shares its clock)."""
    clock = getattr(log, "_clock", None)
    if isinstance(clock, _Counter):
        log._clock = clock.copy()  # type: ignore[attr-defined]


_ID = re.compile(r"\b(m\d+|call-m\d+(?:-\d+)?)\b")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _renamed(text: str, tokens: Sequence[str] = ()) -> str:
    """*text* with the message ids (and the call ids made from them) renamed in order of
    first appearance, after the *tokens* already named (in their order)."""
    return _renaming(text, {token: f"#{index}" for index, token in enumerate(tokens)})


def _renaming(text: str, names: dict[str, str]) -> str:
    """`_renamed` with the names given so far in *names* (which it extends)."""
    pieces = _ID.split(text)         # text, id, text, id, ..., text
    for index in range(1, len(pieces), 2):
        token = pieces[index]
        name = names.get(token)
        if name is None:
            name = names[token] = f"#{len(names)}"
        pieces[index] = name
    return "".join(pieces)


def _exact(value: object) -> str:
    """The text of an immutable value that tells apart exactly what its data tells apart:
    a record's class and fields, frozen JSON as compact JSON (so ``1``, ``1.0`` and ``true``
    differ, and so does key order), strings and numbers by ``repr``. Why not ``repr``: a
    value's repr thaws its JSON first, and every state makes new outputs."""
    kind = type(value)
    if kind is str or value is None or kind is int or kind is bool or kind is float:
        return repr(value)
    if kind is FrozenDict or kind is FrozenList:
        try:
            return compact_json(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):   # a value JSON cannot spell: its repr
            return _ADDRESS.sub("", repr(value))
    names = _EXACT_FIELDS.get(kind)
    if names is None:
        names = _EXACT_FIELDS[kind] = (
            tuple(f.name for f in dataclasses.fields(kind))
            if dataclasses.is_dataclass(kind) and kind.__module__ in _IMMUTABLE_MODULES else ())
    if names:
        return f"{kind.__name__}({', '.join([_exact(getattr(value, n)) for n in names])})"
    if kind is tuple:
        return f"({', '.join([_exact(item) for item in value])},)"  # type: ignore[attr-defined]
    return _ADDRESS.sub("", repr(value))


#: The fields `_exact` writes of each class (empty: written by ``repr``).
_EXACT_FIELDS: dict[type, tuple[str, ...]] = {}


_EMPTY_CHAIN: tuple[bytes, bytes, tuple[str, ...]] = (b"", b"", ())


class _Texts:
    """The canonical text of immutable values (frozen JSON, messages, outputs, a log's
    records), each made once per exploration: states share most of them (a copied state
    shares its parent's values, R4.12), so a key costs what changed. Each value is held
    while its text is cached, so an id is never reused for another value."""

    def __init__(self) -> None:
        self._texts: dict[int, tuple[object, str]] = {}
        self._chains: dict[int, tuple[object, tuple[bytes, bytes, tuple[str, ...]]]] = {}

    def text(self, value: object) -> str:
        hit = self._texts.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        text = _exact(value)
        self._texts[id(value)] = (value, text)
        return text

    def chain(self, log: SessionLog) -> tuple[bytes, bytes, tuple[str, ...]]:
        """Digests of the log's events as its future depends on them (`log`): one of their
        text as it is, one with message ids renamed in order of first appearance, and the
        ids met, in that order. Each event is digested once, after the events before it
        (a record is only ever shared by forks, so always after the same ones)."""
        records = log._records
        chains = self._chains
        start = len(records)
        state = _EMPTY_CHAIN
        while start > 0:
            hit = chains.get(id(records[start - 1]))
            if hit is not None and hit[0] is records[start - 1]:
                state = hit[1]
                break
            start -= 1
        for index in range(start, len(records)):
            record = records[index]
            raw_prev, renamed_prev, tokens = state
            text = f"{record[0]} {record[3]} {record[4]!r} {record[5]!r}"
            names = {token: f"#{n}" for n, token in enumerate(tokens)}
            renamed = _renaming(text, names)
            if len(names) != len(tokens):
                tokens = tuple(names)
            state = (hashlib.sha256(raw_prev + text.encode("utf-8", "surrogatepass")).digest(),
                     hashlib.sha256(renamed_prev + renamed.encode("utf-8",
                                                                  "surrogatepass")).digest(),
                     tokens)
            chains[id(record)] = (record, state)
        return state

    def log(self, log: SessionLog) -> str:
        """The log's events as its future depends on them: types, data, surface operations
        and sources (not times). Forks share their records, so each is written once."""
        texts = self._texts
        parts: list[str] = []
        for record in log._records:
            hit = texts.get(id(record))
            if hit is None or hit[0] is not record:
                text = f"{record[0]} {record[3]} {record[4]!r} {record[5]!r}"
                texts[id(record)] = hit = (record, text)
            parts.append(hit[1])
        return "\n".join(parts)


def _core_parts(core: AgentCore, texts: _Texts | None = None, *,
                with_log: bool = True) -> tuple[object, ...]:
    """Everything the core's future depends on (its whole explicit state, R4), canonical;
    the log first, unless *with_log* is false."""
    texts = texts if texts is not None else _Texts()
    state = vars(state_of(core))
    return (texts.log(core.log) if with_log else None,
            *[(name, _canonical(state[name], 0, texts)) for name in _state_names(core)])


#: The state attributes of a core class, in order (R4: the same for every instance).
_STATE_NAMES: dict[type, tuple[str, ...]] = {}


def _state_names(core: AgentCore) -> tuple[str, ...]:
    state = vars(state_of(core))
    names = _STATE_NAMES.get(type(core))
    if names is None or len(names) != len(state) - len(STATIC_ATTRIBUTES):
        names = _STATE_NAMES[type(core)] = tuple(sorted(set(state) - STATIC_ATTRIBUTES))
    return names


def state_key(core: AgentCore) -> str:
    """A canonical key of everything the core's future depends on (see the module docstring)."""
    return _renamed(repr(_core_parts(core)))


#: Attributes of an implementation that never change its future (the configuration, the
#: clock and id minting are fixed per explorer).
_FIXED_ATTRIBUTES = frozenset({"config", "_mint", "clock", "_clock"})


def implementation_parts(agent: object, texts: _Texts | None = None, *,
                         with_log: bool = True) -> tuple[object, ...]:
    """Everything an implementation's future may depend on: what its ``state_parts()`` gives
    (and its ``log``) when it has one, else read generically: every attribute (its log as its
    events), generator frames followed through ``yield from`` and through generators held in
    locals, objects by their fields. For an implementation the explorer knows nothing about
    (the reference model), so that no state is pruned that differs."""
    texts = texts if texts is not None else _Texts()
    parts = getattr(agent, "state_parts", None)
    if callable(parts):
        log = getattr(agent, "log", None)
        return (texts.log(log) if with_log and isinstance(log, SessionLog) else None,
                _canonical(parts(), 0, texts))
    state = vars(agent) if hasattr(agent, "__dict__") else {
        name: getattr(agent, name) for name in getattr(agent, "__slots__", ())}
    return tuple((name, _canonical(value, 0, texts)) for name, value in sorted(state.items())
                 if name not in _FIXED_ATTRIBUTES and (with_log or name != "log"))


_IMMUTABLE_MODULES = frozenset({"machine.jsonvalue", "machine.vocabulary", "machine.io",
                                "machine.events"})


#: How `_canonical` reads a class: "text" (immutable: its text, once), "fields" (a
#: dataclass: its fields, by name), "slots" (a machine: its slots), or another way (None).
_READERS: dict[type, tuple[str, tuple[str, ...]] | None] = {}


def _reader(kind: type) -> tuple[str, tuple[str, ...]] | None:
    if kind not in _READERS:
        reader: tuple[str, tuple[str, ...]] | None = None
        if kind.__module__ in _IMMUTABLE_MODULES:
            reader = ("text", ())
        elif dataclasses.is_dataclass(kind):
            reader = ("fields", tuple(f.name for f in dataclasses.fields(kind)))
        elif (kind.__dict__.get("__slots__") and not issubclass(kind, BaseException)
              and "__dict__" not in dir(kind)):
            reader = ("slots", tuple(kind.__dict__["__slots__"]))
        _READERS[kind] = reader
    return _READERS[kind]


def _canonical(value: object, depth: int, texts: _Texts) -> object:
    kind = type(value)
    if value is None or kind is int or kind is str or kind is bool or kind is float:
        return value
    if depth > 40:
        return _ADDRESS.sub("", repr(value))
    if kind is list or kind is tuple or kind is deque:
        return (kind.__name__, tuple([_canonical(v, depth + 1, texts)
                                      for v in value]))  # type: ignore[attr-defined]
    reader = _reader(kind)
    if reader is not None:
        how, names = reader
        if how == "text":                       # frozen values: their text, once
            return texts.text(value)
        return (kind.__name__, tuple([(name, _canonical(getattr(value, name), depth + 1, texts))
                                      for name in names]))
    if kind is set or kind is frozenset:
        return (kind.__name__, tuple(sorted(repr(_canonical(v, depth + 1, texts))
                                            for v in value)))  # type: ignore[attr-defined]
    if kind is dict:
        return ("dict", tuple([(repr(k), _canonical(v, depth + 1, texts))
                               for k, v in value.items()]))  # type: ignore[attr-defined]
    if kind is SessionLog:
        return texts.log(value)  # type: ignore[arg-type]
    if isinstance(value, types.GeneratorType):
        return _frames(value, depth, texts)
    if isinstance(value, BaseException):
        return (kind.__name__, repr(value.args),
                tuple((k, _canonical(v, depth + 1, texts)) for k, v in sorted(vars(value).items())))
    if isinstance(value, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return getattr(value, "__qualname__", "function")
    return _ADDRESS.sub("", repr(value))


def _frames(generator: Any, depth: int, texts: _Texts) -> tuple[object, ...]:
    frames: list[object] = []
    while generator is not None:
        frame = generator.gi_frame
        if frame is None:
            frames.append("finished")
            break
        frames.append((generator.gi_code.co_name, frame.f_lasti, tuple(
            (k, _canonical(v, depth + 1, texts)) for k, v in sorted(frame.f_locals.items())
            if k != "self")))
        generator = generator.gi_yieldfrom
    return tuple(frames)


# --------------------------------------------------------------------------
# The key's text, written piece by piece
# --------------------------------------------------------------------------
#
# Why: a key is the text `repr((core parts, other parts, ledger))` would give, message ids
# renamed by first appearance (`_renamed`). Building those nested tuples, writing them with
# `repr` (which quotes every cached text again) and scanning the whole text for ids cost
# two thirds of an exploration. `_Emitter` writes the same text directly as a template
# (each id replaced by NUL, which no repr contains) and the ids in order; each immutable
# value's quoted text is split so once per exploration. The renamed text is the template
# with the ids' ranks of first appearance put back (`_filled`), so the template and the
# ranks determine it and are determined by it: the key digests those two.
# `tests/test_explore.py` checks that `Explorer.key_text` is exactly the renamed text.

#: A value's text as a template (ids replaced by NUL) and its ids in order.
_Template = tuple[str, tuple[str, ...]]


def _template(text: str) -> _Template:
    pieces = _ID.split(text)
    return "\0".join(pieces[0::2]), tuple(pieces[1::2])


#: Writes one value: its template into its emitter's `out`, its ids into its ``ids``.
_Writer = Callable[[Any], None]


class _Emitter:
    """Writes the template of ``repr(_canonical(value))`` into `out`, its ids into `ids`.

    Why it is shaped so: a key writes a few hundred values, most of them scalars, names
    and immutable values met before. Those are known by identity (`_known`: the text of
    each value, held so that no other value ever takes its id; a string or an int: the
    first one of its value met), so a record's fields and a sequence's items are written
    inline by one look-up; only containers, mutable records and values not known cost a
    call, to the writer of their class (made once: a record's labels are written once, its
    fields read by one `operator.attrgetter` call). Mutable values are never known: they
    are written each time. The writers append to the emitter's own two lists (`begin`
    empties them, `finish` reads them).
    """

    def __init__(self, texts: _Texts) -> None:
        self.texts = texts
        self.out: list[str] = []
        self.ids: list[str] = []
        #: an immutable value (by identity) whose text has no id -> that text
        self._known: dict[int, str] = {}
        #: the same, each text after ``, `` (an item of a sequence but its first)
        self._known_after: dict[int, str] = {}
        #: an immutable value (by identity) whose text has ids -> its template
        self._known_templates: dict[int, _Template] = {}
        #: the values known by identity, held so that no other value ever takes their id
        self._held: list[object] = []
        #: a string -> the template of its repr (the first string of each value is known)
        self._strings: dict[str, _Template] = {}
        #: an int -> its repr (the first int of each value is known)
        self._integers: dict[int, str] = {}
        #: an immutable value's text (`_Texts.text`) -> the template of its repr
        self._quoted: dict[str, _Template] = {}
        #: a monitor's ledger -> the template of its repr
        self._ledgers: dict[tuple[object, ...], _Template] = {}
        #: class -> how to write its instances
        self._writers: dict[type, _Writer] = {}
        #: core class -> its state names and the writer of a state (its attributes' dict)
        self._states: dict[type, tuple[tuple[str, ...], _Writer]] = {}

    def begin(self) -> None:
        """Start a text: nothing written yet."""
        self.out.clear()
        self.ids.clear()

    def finish(self) -> tuple[str, list[str]]:
        """The template written since `begin`, and its ids in order."""
        return "".join(self.out), self.ids.copy()

    def write(self, value: Any) -> None:
        """Write *value*'s template (and its ids)."""
        text = self._known.get(id(value))
        if text is None:
            kind = type(value)
            (self._writers.get(kind) or self._writer(kind))(value)
        else:
            self.out.append(text)

    def state(self, core: AgentCore) -> None:
        """Write ``(None, *((name, value) for each state attribute))`` of *core* (see
        `_core_parts`), but its closing ``)``."""
        names = _state_names(core)
        known = self._states.get(type(core))
        if known is None or known[0] is not names:
            labels = [f"({name!r}, " for name in names]
            if not names or any(_ID.search(label) for label in labels):
                writer = self._named_values(names)
            else:
                writer = self._fields(
                    (f"((None, {labels[0]}", *(f"), {label}" for label in labels[1:])),
                    ")), ", _getter(operator.itemgetter, names))
            known = self._states[type(core)] = (names, writer)
        known[1](vars(state_of(core)))

    def _named_values(self, names: tuple[str, ...]) -> _Writer:
        """`state`'s writer when a name holds an id (or there is none): each name written as
        a value."""
        append, write = self.out.append, self.write

        def named_values(state: dict[str, Any]) -> None:
            append("((None")
            for name in names:
                append(", (")
                write(name)
                append(", ")
                write(state[name])
                append(")")
            append("), ")
        return named_values

    def ledger(self, ledger: tuple[object, ...]) -> None:
        """Write a monitor's ledger as ``repr`` writes it (ledgers recur: each once)."""
        found = self._ledgers.get(ledger)
        if found is None:
            found = self._ledgers[ledger] = _template(repr(ledger))
        self.out.append(found[0])
        self.ids.extend(found[1])

    def text(self, text: str) -> None:
        """Write *text* as it is (its ids found)."""
        template, found = _template(text)
        self.out.append(template)
        self.ids.extend(found)

    def _remember(self, value: object, template: _Template) -> None:
        """Know *value* (immutable) by identity from now on."""
        self._held.append(value)
        if template[1]:
            self._known_templates[id(value)] = template
        else:
            self._known[id(value)] = template[0]
            self._known_after[id(value)] = ", " + template[0]

    def _string(self, value: str) -> None:
        template = self._strings.get(value)
        if template is None:
            template = self._strings[value] = _template(repr(value))
            self._remember(value, template)     # the first string of its value met
        self.out.append(template[0])
        if template[1]:
            self.ids.extend(template[1])

    def _writer(self, kind: type) -> _Writer:
        writer = self._writers[kind] = self._writer_of(kind)
        return writer

    def _writer_of(self, kind: type) -> _Writer:
        write, texts = self.write, self.texts
        append, extend = self.out.append, self.ids.extend
        if kind is str:
            return self._string
        if kind is int:
            integers, remember = self._integers, self._remember

            def integer(value: int) -> None:
                text = integers.get(value)
                if text is None:
                    text = integers[value] = repr(value)
                    remember(value, (text, ()))     # the first int of its value met
                append(text)
            return integer
        if kind is type(None) or kind is bool:
            remember = self._remember

            def singleton(value: Any) -> None:
                remember(value, (repr(value), ()))
                append(repr(value))
            return singleton
        if kind is float:
            def real(value: float) -> None:
                append(repr(value))
            return real
        if kind is list or kind is tuple or kind is deque:
            return self._sequence(f"({kind.__name__!r}, (")
        if kind is dict:
            def mapping(value: Any) -> None:
                append("('dict', (")
                for index, (key, item) in enumerate(value.items()):
                    append(", (" if index else "(")
                    write(repr(key))
                    append(", ")
                    write(item)
                    append(")")
                append(",))" if len(value) == 1 else "))")
            return mapping
        if kind in (types.FunctionType, types.MethodType, types.BuiltinFunctionType):
            def function(value: Any) -> None:
                write(getattr(value, "__qualname__", "function"))  # a phase
            return function
        if kind is set or kind is frozenset:
            return self._collection(kind)
        reader = _reader(kind)
        if reader is not None and reader[0] == "text":
            known_templates, remember = self._known_templates, self._remember
            quoted = self._quoted

            def immutable(value: Any) -> None:
                template = known_templates.get(id(value))
                if template is None:
                    # Why by text too: the other implementation's parts are new values
                    # each time (frozen JSON made by its `state_parts`), of a few texts
                    text = texts.text(value)
                    template = quoted.get(text)
                    if template is None:
                        template = quoted[text] = _template(repr(text))
                    remember(value, template)
                append(template[0])
                extend(template[1])
            return immutable
        if reader is not None:
            names = reader[1]
            labels = [f"({name!r}, " for name in names]
            if any(_ID.search(label) for label in labels) or _ID.search(kind.__name__):
                return self._generic
            head = f"({kind.__name__!r}, ("
            if not names:
                def empty_record(value: Any) -> None:
                    append(head + "))")
                return empty_record
            return self._fields((head + labels[0], *(f"), {label}" for label in labels[1:])),
                                "),))" if len(names) == 1 else ")))",
                                _getter(operator.attrgetter, names))
        return self._generic

    # Why `_fields` and `_sequence` write their items inline (the same few lines in each):
    # most items are known by identity, and a call per item was most of a key's cost.

    def _fields(self, labels: tuple[str, ...], tail: str,
                get: Callable[[Any], tuple[Any, ...]]) -> _Writer:
        """A writer of the values *get* reads from a record, each after its label, then
        *tail*."""
        append, writer = self.out.append, self._writer
        known, writers = self._known, self._writers

        def record(value: Any) -> None:
            for label, item in zip(labels, get(value), strict=True):
                append(label)
                text = known.get(id(item))
                if text is None:
                    kind = type(item)
                    (writers.get(kind) or writer(kind))(item)
                else:
                    append(text)
            append(tail)
        return record

    def _sequence(self, head: str) -> _Writer:
        """A writer of a list, tuple or deque as ``(class name, (item, ...))``."""
        write, writer = self.write, self._writer
        append = self.out.append
        known_after, writers = self._known_after, self._writers
        empty = head + "))"

        def sequence(value: Any) -> None:
            if not value:
                append(empty)
                return
            append(head)
            items = iter(value)
            write(next(items))
            for item in items:
                text = known_after.get(id(item))
                if text is None:
                    append(", ")
                    kind = type(item)
                    (writers.get(kind) or writer(kind))(item)
                else:
                    append(text)
            append(",))" if len(value) == 1 else "))")
        return sequence

    def _collection(self, kind: type) -> _Writer:
        """A writer of a set or frozenset: its items' reprs, sorted (see `_canonical`)."""
        name = kind.__name__
        empty = f"({name!r}, ())"
        generic, text, append = self._generic, self.text, self.out.append

        def collection(value: Any) -> None:
            if not value:
                append(empty)
            elif _PLAIN_KINDS.issuperset(map(type, value)):
                # Why: a plain item is its own canonical value, so this is `_canonical`'s text
                items = ", ".join(map(repr, sorted(map(repr, value))))
                written = (f"({name!r}, ({items},))" if len(value) == 1
                           else f"({name!r}, ({items}))")
                if str in map(type, value):
                    text(written)           # a string may hold ids
                else:
                    append(written)
            else:
                generic(value)
        return collection

    def _generic(self, value: Any) -> None:
        self.text(repr(_canonical(value, 0, self.texts)))


#: The classes a value of which `_canonical` gives as it is.
_PLAIN_KINDS = frozenset({str, int, bool, float, type(None)})


def _getter(make: Callable[..., Callable[[Any], Any]], names: tuple[str, ...]
            ) -> Callable[[Any], tuple[Any, ...]]:
    """``make(*names)`` (`operator.attrgetter`, `operator.itemgetter`), giving a tuple for a
    single name too."""
    get = make(*names)
    if len(names) > 1:
        return get

    def single(value: Any) -> tuple[Any, ...]:
        return (get(value),)
    return single


def _ranks(tokens: Sequence[str], ids: Sequence[str]) -> list[int]:
    """Each of *ids* as its rank of first appearance in *tokens* then *ids*."""
    order = dict(zip(dict.fromkeys([*tokens, *ids]), count()))
    return [*map(order.__getitem__, ids)]


def _filled(template: str, ranks: Sequence[int]) -> str:
    """The renamed text: *template* with its NULs replaced by ``#rank`` in order."""
    pieces = template.split("\0")
    return pieces[0] + "".join(f"#{rank}{piece}" for rank, piece in zip(ranks, pieces[1:],
                                                                          strict=True))


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

        # A bar on standard error when it is a terminal, nothing when it is not (RT27).
        bar = progress_bar(f"{name} depth {run_depth}", enabled=False if quiet else None)

        def progress(states: int, frontier: int, seconds: float,
                     bar: ProgressBar = bar) -> None:
            bar.update(states, text=f"{states:,} states, frontier {frontier:,}, "
                                    f"{states / seconds:,.0f} states/s")

        logger = logging.getLogger("turnstile")
        level = logger.level
        logger.setLevel(logging.ERROR)  # the explored failures' own warnings are expected
        try:
            with bar:
                result = explorer.run(run_depth, progress=progress,
                                      budget_seconds=budget_seconds)
        finally:
            logger.setLevel(level)
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
