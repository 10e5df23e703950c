"""Bounded exhaustive exploration of the core (spec ASSURANCE §2).

The explorer enumerates every sequence of *decisions* up to a depth over a
finite alphabet, and checks every state it reaches:

* the runtime invariants of R20.1 (`machine.invariants.InvariantMonitor`);
* the session invariants (the log checks every append; a violation raises);
* optionally, that an independent implementation (the reference model)
  produces exactly the same outputs and read-only state for the same inputs.

Decisions are commands (``followup``, ``steer``, ``inject``, a quiet send,
``cancel``, ``cancel`` with keepInbox, ``dispose``), issued at any observer
position, and answers to outstanding effects (each effect kind has a few
answer variants: allow/block/raise, a text reply, a tool call, an error
finish, a tool result with a context, a retry, a failing flush, ...). Pulling
the next output is free: it does not count towards the depth, so positions
between any two outputs are explored. Answers are offered only when the core
waits (P6 makes earlier answers equivalent).

States are deduplicated by a canonical key: everything the core's future
depends on (the log, queued outputs, outstanding effects, buffered
completions, the machines' states and contents, controller and retry state,
and the loop's generator frames), with message ids renamed by first
appearance — messages are distinguished only by identity (symmetry
reduction). Search is 0-1 breadth-first, so the first violation found has a
shortest decision sequence; it is reported as a ready-to-paste list of input
JSON objects.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from machine.core import AgentCore, CoreConfig
from machine.errors import TurnstileError
from machine.invariants import InvariantMonitor
from machine.io import (
    Cancel,
    Chunk,
    Dispose,
    End,
    Input,
    Output,
    Raise,
    Resolve,
    Send,
)
from machine.jsonvalue import JsonLike
from machine.vocabulary import FOLLOWUP, INJECT, STEER, ErrorInfo, LlmFailure

Action = tuple[str, ...]   # ("pull",) | ("cmd", name) | ("ans", kind, variant)

COMMANDS: dict[str, Callable[[str], Input]] = {
    "followup": lambda mid: Send(_msg(mid), FOLLOWUP, preset="followup"),
    "steer": lambda mid: Send(_msg(mid), STEER, preset="steer"),
    "inject": lambda mid: Send(_msg(mid), INJECT, preset="inject"),
    "quiet": lambda mid: Send(_msg(mid), {"target": "next-turn", "wakeup": False}),
    "cancel": lambda _mid: Cancel({"kind": "user"}),
    "cancel-keep": lambda _mid: Cancel({"kind": "user"}, keep_inbox=True),
    "dispose": lambda _mid: Dispose(),
}
DEFAULT_COMMANDS = ("followup", "steer", "inject", "cancel")

_FAIL = ErrorInfo("boom", "Error", "BOOM")
_MODEL_FAIL = ErrorInfo("unavailable", "ModelError", "UNAVAILABLE",
                        failure=LlmFailure("unavailable", "UNAVAILABLE"))

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
        "text": lambda p, m: [("chunk", {"type": "text", "text": "x"}),
                              ("chunk", {"type": "finish", "kind": "stop"}), ("end", None)],
        "call": lambda p, m: [("chunk", {"type": "tool-call", "id": f"call-{m}", "name": "t",
                                         "arguments": "{}"}),
                              ("chunk", {"type": "finish", "kind": "stop"}), ("end", None)],
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
class Replay:
    """The result of applying a decision sequence to a fresh core."""

    core: AgentCore
    inputs: list[Input] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    steps: list[dict[str, JsonLike]] = field(default_factory=list)
    other_outputs: list[Output] = field(default_factory=list)
    monitor: InvariantMonitor | None = None


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

    @property
    def states_per_second(self) -> float:
        return self.states / self.seconds if self.seconds else float("inf")


class Explorer:
    """See the module docstring."""

    def __init__(self, *, config: CoreConfig | None = None,
                 commands: Sequence[str] = DEFAULT_COMMANDS,
                 answers: dict[str, Sequence[str]] | None = None,
                 other: Callable[[], Agentlike] | None = None,
                 max_outputs: int = 400) -> None:
        self.config = config if config is not None else CoreConfig(
            request_options={"provider": "p", "model": "m"}, publish=False)
        unknown = [c for c in commands if c not in COMMANDS]
        if unknown:
            raise ValueError(f"unknown command(s) {unknown}; known: {sorted(COMMANDS)}")
        self.commands = tuple(commands)
        self.answers = {kind: tuple(answers.get(kind, variants) if answers else variants)
                        for kind, variants in ((k, tuple(v)) for k, v in ANSWERS.items())}
        self.other = other
        self.max_outputs = max_outputs

    # -- replay --------------------------------------------------------------
    def replay(self, actions: Sequence[Action]) -> Replay:
        core = AgentCore(self.config, clock=_counter())
        other = self.other() if self.other is not None else None
        monitor = InvariantMonitor(core, core)
        replay = Replay(core, monitor=monitor)
        fresh = 0
        for action in actions:
            if action[0] == "pull":
                output = core.next_output()
                if output is None:
                    raise Divergence("explorer bug: pull with no output", replay.steps)
                replay.outputs.append(output)
                replay.steps.append(output.to_json())
                monitor.output(output)
                if other is not None:
                    theirs = other.next_output()
                    self._compare_output(output, theirs, replay)
                    if theirs is not None:
                        replay.other_outputs.append(theirs)
                continue
            items: list[Input]
            if action[0] == "cmd":
                fresh += 1
                items = [COMMANDS[action[1]](f"m{fresh}")]
            else:
                fresh += 1
                items = self._answer(core, action[1], action[2], f"m{fresh}")
            for item in items:
                replay.inputs.append(item)
                replay.steps.append(item.to_json())
                mine = _apply(core, item)
                if mine is not None and other is None:
                    raise Divergence(f"input {item.to_json()} raised {mine!r}", replay.steps)
                if other is not None:
                    theirs_error = _apply(other, item)
                    if (mine is None) != (theirs_error is None) or (
                            mine is not None and type(mine) is not type(theirs_error)):
                        raise Divergence(f"input {item.to_json()} raised {mine!r} here but "
                                         f"{theirs_error!r} in the other implementation",
                                         replay.steps)
                monitor.poll()
            if other is not None:
                self._compare_state(core, other, replay)
        return replay

    def _answer(self, core: AgentCore, kind: str, variant: str, fresh: str) -> list[Input]:
        effect = self._oldest(core, kind)
        assert effect is not None
        payload = next(dict(e.payload) for e in core.outstanding() if e.id == effect)
        inputs: list[Input] = []
        for verb, value in ANSWERS[kind][variant](payload, fresh):
            if verb == "resolve":
                inputs.append(Resolve(effect, value))
            elif verb == "raise":
                assert isinstance(value, ErrorInfo)
                inputs.append(Raise(effect, value))
            elif verb == "chunk":
                inputs.append(Chunk(effect, value))
            else:
                inputs.append(End(effect))
        return inputs

    @staticmethod
    def _oldest(core: AgentCore, kind: str) -> int | None:
        for effect in core.outstanding():
            if effect.kind == kind:
                return effect.id
        return None

    def _compare_output(self, mine: Output, theirs: Output | None, replay: Replay) -> None:
        if theirs is None or mine.to_json() != theirs.to_json():
            raise Divergence(
                f"output #{len(replay.outputs)} differs:\n  machine: {mine.to_json()}\n"
                f"  other:   {None if theirs is None else theirs.to_json()}", replay.steps)

    def _compare_state(self, core: AgentCore, other: Agentlike, replay: Replay) -> None:
        for name in ("status", "accepts_next_step", "pending_queued", "pending_steering",
                     "pending_context"):
            if getattr(core, name) != getattr(other, name):
                raise Divergence(f"read-only state {name!r} differs: machine "
                                 f"{getattr(core, name)!r}, other {getattr(other, name)!r}",
                                 replay.steps)

    # -- search --------------------------------------------------------------
    def children(self, replay: Replay) -> list[tuple[Action, int]]:
        core = replay.core
        result: list[tuple[Action, int]] = []
        if not core.disposed:
            result.extend((("cmd", name), 1) for name in self.commands)
        if len(replay.outputs) >= self.max_outputs:
            return result
        probe = core.next_output()
        if probe is None and replay.monitor is not None:
            replay.monitor.poll(quiet=True)
        if probe is not None:
            result.insert(0, (("pull",), 0))
            return result
        seen: set[str] = set()
        for effect in core.outstanding():
            kind = effect.kind
            if kind in seen:
                continue
            seen.add(kind)
            for variant in self.answers.get(kind, ()):
                result.append((("ans", kind, variant), 1))
        return result

    def run(self, depth: int, *, progress: Callable[[int, int, float], None] | None = None,
            budget_seconds: float | None = None) -> ExploreResult:
        start = time.perf_counter()
        visited: set[str] = set()
        queue: deque[tuple[tuple[Action, ...], int]] = deque([((), 0)])
        transitions = 0
        last_report = start
        while queue:
            actions, cost = queue.popleft()
            try:
                replay = self.replay(actions)
                key = state_key(replay.core)
                children = [] if key in visited else self.children(replay)
            except Divergence as failure:
                return ExploreResult(depth, len(visited), transitions,
                                     time.perf_counter() - start, failure)
            except TurnstileError as error:
                return ExploreResult(depth, len(visited), transitions, time.perf_counter() - start,
                                     Divergence(f"{type(error).__name__}: {error}", replay_steps(
                                         self, actions)))
            if key in visited:
                continue
            visited.add(key)
            now = time.perf_counter()
            if progress is not None and now - last_report > 0.5:
                progress(len(visited), len(queue), now - start)
                last_report = now
            if budget_seconds is not None and now - start > budget_seconds:
                break
            for action, step_cost in children:
                if cost + step_cost > depth:
                    continue
                transitions += 1
                if step_cost == 0:
                    queue.appendleft(((*actions, action), cost))
                else:
                    queue.append(((*actions, action), cost + step_cost))
        return ExploreResult(depth, len(visited), transitions, time.perf_counter() - start)


def replay_steps(explorer: Explorer, actions: Sequence[Action]) -> list[dict[str, JsonLike]]:
    """The steps of a decision sequence, as far as they can be applied; the failing one last."""
    for cut in range(len(actions), -1, -1):
        try:
            steps = explorer.replay(actions[:cut]).steps
        except TurnstileError:
            continue
        if cut < len(actions):
            steps.append({"failing decision": list(actions[cut])})
        return steps
    return []


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


_ID = re.compile(r"\b(m\d+|call-m\d+)\b")


def state_key(core: AgentCore) -> str:
    """A canonical key of everything the core's future depends on (see the module docstring)."""
    parts: list[object] = [
        core.lifecycle.state, core.window.state, core.inbox.state, core.outbox.state,
        core.inbox.snapshot(), core.outbox.snapshot(),
        tuple((e.type, repr(e.data), repr(e.surface_op), repr(e.source_event_seqs))
              for e in core.log.events),
        tuple(repr(item) for item in core._out),
        tuple((k, v.kind, v.released) for k, v in core._effects.items()),
        tuple(repr(m) for m in core._mail), core._wake_effect, core._wait,
        repr(core._owner), repr(core._ctrl), core._pending_retry, repr(core._prior_failures),
        core._turn, core._step, repr(core._reason), repr(core._settle), core._header_logged,
        core._disposing, core._disposed, core._next_effect, core._next_signal,
        repr(core._retro),
    ]
    generator: Any = core._proc
    while generator is not None:
        frame = generator.gi_frame
        if frame is None:
            parts.append("finished")
            break
        parts.append((generator.gi_code.co_name, frame.f_lasti,
                      tuple(sorted((k, repr(v)) for k, v in frame.f_locals.items()
                                   if k != "self"))))
        generator = generator.gi_yieldfrom
    text = repr(parts)
    names: dict[str, str] = {}

    def rename(match: re.Match[str]) -> str:
        token = match.group(1)
        if token not in names:
            names[token] = f"#{len(names)}"
        return names[token]
    return _ID.sub(rename, text)


def reference_model(config: CoreConfig) -> Agentlike:
    """A fresh reference model, ``ModelAgent`` of the repository's ``model/`` folder.

    It is installed as the private package ``machine._model`` (setup.py maps it), so a
    ``model`` module of the user's never shadows it. It is imported by name because the type
    checker sees the folder as ``model`` (model/agent.py states that it is `Agentlike`).
    """
    agent: Agentlike = importlib.import_module("machine._model").ModelAgent(
        config, clock=_counter())
    return agent


def main_explore(depth: int, *, commands: Sequence[str] = DEFAULT_COMMANDS, with_model: bool = False,
                 budget_seconds: float | None = None, quiet: bool = False,
                 as_json: bool = False) -> int:
    """``turnstile explore``: returns an exit code (0 ok, 1 violation).

    With *as_json* the result is one JSON object on standard output (`result_json`).
    """
    other: Callable[[], Agentlike] | None = None
    explorer_config = CoreConfig(request_options={"provider": "p", "model": "m"}, publish=False)
    if with_model:
        other = lambda: reference_model(explorer_config)  # noqa: E731
    explorer = Explorer(config=explorer_config, commands=commands, other=other)

    def progress(states: int, frontier: int, seconds: float) -> None:
        if not quiet:
            print(f"\rdepth {depth}: {states} states, frontier {frontier}, "
                  f"{states / seconds:,.0f} states/s", end="", file=sys.stderr, flush=True)

    logger = logging.getLogger("turnstile")
    level = logger.level
    logger.setLevel(logging.ERROR)  # the explored failures' own warnings are expected: not shown
    try:
        result = explorer.run(depth, progress=progress, budget_seconds=budget_seconds)
    finally:
        logger.setLevel(level)
    if not quiet:
        print("\r" + " " * 78 + "\r", end="", file=sys.stderr)
    budget_reached = bool(budget_seconds and result.seconds > budget_seconds)
    if as_json:
        print(json.dumps(result_json(result, commands=commands, with_model=with_model,
                                     budget_reached=budget_reached), ensure_ascii=False))
        return 1 if result.failure is not None else 0
    print(f"depth {depth}: {result.states} states, {result.transitions} transitions in "
          f"{result.seconds:.1f} s ({result.states_per_second:,.0f} states/s)"
          + (" [budget reached]" if budget_reached else ""))
    if result.failure is not None:
        print(f"VIOLATION: {result.failure}")
        print("shortest reproducing sequence (inputs with the outputs pulled before them):")
        for step in result.failure.steps:
            print(" ", json.dumps(step))
        return 1
    print("no violation")
    return 0


def result_json(result: ExploreResult, *, commands: Sequence[str], with_model: bool,
                budget_reached: bool) -> dict[str, JsonLike]:
    """An exploration's result as JSON (``turnstile explore --json``)."""
    failure: JsonLike = None
    if result.failure is not None:
        failure = {"message": str(result.failure), "steps": list(result.failure.steps)}
    return {"depth": result.depth, "commands": list(commands), "model": with_model,
            "states": result.states, "transitions": result.transitions,
            "seconds": round(result.seconds, 3), "budgetReached": budget_reached,
            "ok": result.failure is None, "violation": failure}
