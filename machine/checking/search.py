"""Bounded exhaustive exploration of the core (specs/ASSURANCE.md): the search.

The explorer enumerates every sequence of *decisions* up to a depth over a
finite alphabet, and checks every state it reaches:

* the runtime invariants of R20.1 (`machine.checking.invariants.InvariantMonitor`, which
  also sees the inputs, so its ledger starts at each accepted command);
* the session invariants (the log checks every append; a violation raises);
* optionally, that an independent implementation (the reference model)
  produces exactly the same outputs, exceptions and read-only state for the
  same inputs.

Decisions are operations on a `Node` (a core, the other implementation, the
monitor and the meters of `machine.checking.reach`). A state is made by copying its
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
*whole node* depends on (`machine.checking.key`): the core (its log, queued outputs, outstanding effects,
buffered completions, the machines' states and contents, controller and retry
state, the loop's frames: its whole explicit state, R4), the other
implementation's complete state (its ``state_parts()``, which `Agentlike` requires), and
the invariant monitor's ledger. A key of
the core alone would be unsound: a core that drops an input lands on a state
some shorter path reached, and the node would be pruned before the model's
differing outputs were compared or the ledger polled at quiescence. Message ids
are renamed by first appearance — messages are distinguished only by identity
(symmetry reduction). Search is 0-1 breadth-first, so the first violation found
has a shortest decision sequence; it is reported as a ready-to-paste list of
input JSON objects.

Each run also reports its reach: which rule families (`machine.checking.reach.FAMILIES`)
and which R19 rows × commands the explored paths exercised.
"""


from __future__ import annotations

import gc
import hashlib
import importlib
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from machine.checking.alphabet import (
    ALL_COMMANDS,
    ANSWERS,
    CLASSIC_COMMANDS,
    COMMANDS,
    DEFAULT_ANSWERS,
    DEFAULT_COMMANDS,
    DEFAULT_MACROS,
    DEFAULTS,
    LANDMARKS,
    MACROS,
    SCENARIOS,
    Action,
    Scenario,
)
from machine.checking.invariants import InvariantMonitor
from machine.checking.key import Emitter, Texts, filled, ranks
from machine.checking.reach import FamilyTracker, PositionTracker, command_kind
from machine.core import AgentCore, CoreConfig, state_of
from machine.errors import TurnstileError
from machine.events import Event
from machine.io import (
    Chunk,
    Effect,
    End,
    Input,
    Output,
    Raise,
    Resolve,
)
from machine.jsonvalue import JsonLike
from machine.log import SessionLog
from machine.vocabulary import ErrorInfo

#: An input fed, an output pulled, or a note (JSON) of a path.
Step = Input | Output | dict[str, JsonLike]


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
    def state_parts(self) -> tuple[object, ...]:
        """Everything its future depends on but its log, as plain values (the explorer's key
        holds them, `machine.checking.key`)."""
        ...


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
    #: the rule families (machine.checking.reach.FAMILIES) some explored path exercised
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
        self._texts = Texts()
        self._emitter = Emitter(self._texts)

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
        rest is a template and its ids' ranks (`Emitter`), which determine the renamed text
        (`key_text`) and are determined by it."""
        log_digest, tokens, template, ids = self._key_parts(node)
        text = template.encode("utf-8", "surrogatepass")
        digest = hashlib.sha256(b"%d:" % len(text))
        digest.update(text)
        digest.update(array("I", ranks(tokens, ids)).tobytes())
        return log_digest + digest.digest()

    def key_text(self, node: Node) -> tuple[bytes, str]:
        """What `key` digests, spelled out: the digest chain of the core's log (ids renamed),
        and the text ``repr((core parts, other parts, ledger))`` (`core_parts`,
        `implementation_parts`) with its ids renamed after the log's (`renamed`)."""
        log_digest, tokens, template, ids = self._key_parts(node)
        return log_digest, filled(template, ranks(tokens, ids))

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
            append("(None, ")
            write(other.state_parts())
            append(")")
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


def _apply(agent: AgentCore | Agentlike, item: Input) -> BaseException | None:
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


