"""Replay scripts and conformance vectors through the asyncio `Agent` (specs/runtime.md RT14).

This is the runtime's equivalence proof: the same inputs, applied through the
asyncio runtime instead of directly to the core, give exactly the core's
outputs.

The agent runs with a *puppet environment*: its prompt-submit, step,
turn-stopping and request-error handlers, its system prompt, its model
adapter (with request preparation), its tools and its session store all wait
until the script says how they complete, then return, raise or stream exactly
that. Ticks are held likewise. Each input is applied where it is placed:

* at an *observer position*: by an output listener, when the output it
  follows is delivered — the n-th output (vectors: an input step after n
  output steps), or the first output matching a pattern (scripts:
  ``"when": PATTERN``); inputs placed at the same position (``"when":
  "here"``, consecutive input steps) follow in order;
* *after the runtime settles* (scripts: no ``when``; vectors: an input after
  ``{"out": "none"}``): from outside, once the core waits for input and every
  task waits for the script.

A command goes through the agent's own command path; a completion is handed
to the puppet serving that effect. `replay_script` and `check_vector` return
``None`` when the runtime's outputs are exactly the core's (the vector's), or
a description of the first difference.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias, cast

from machine.cli.runner import HERE, Script, ScriptError, matches, run_script
from machine.conformance import jsoncmp
from machine.conformance.subjects import fake_clock, raise_kind
from machine.conformance.vectors import COMPLETIONS, Vector, config_from_json, seed_events
from machine.core import CoreConfig
from machine.errors import TurnstileError
from machine.events import Event
from machine.io import (
    FLUSH,
    MODEL,
    PROMPT_SUBMIT,
    REQUEST,
    REQUEST_ERROR,
    STEP_HOOK,
    SYSTEM_PROMPT,
    TICK,
    TOOL_EXECUTE,
    TOOL_FINALIZE,
    TOOL_PREPARE,
    TURN_STOPPING,
    Chunk,
    Effect,
    End,
    Observer,
    Output,
    Raise,
    Resolve,
    input_from_json,
)
from machine.log import SessionLog
from machine.runtime.agent import Agent
from machine.runtime.failures import RaisedError
from machine.runtime.hooks import (
    Hooks,
    JsonValue,
    Next,
    PromptSubmit,
    RequestErrorContext,
    StepContext,
    TurnStopping,
)
from machine.runtime.model import ModelCall, RequestDraft
from machine.runtime.retry import RetryAction
from machine.runtime.sink import InMemorySink
from machine.runtime.tools import Tool, ToolCall, ToolMode, ToolOutput, ToolRegistry, _Verbatim
from machine.vocabulary import ErrorInfo, PromptDecision, ToolResult

__all__ = ["Placed", "Replay", "check_vector", "replay", "replay_script", "script_inputs",
           "vector_inputs"]

_SETTLE_PASSES: Final = 10_000
#: Where an input is applied: after exactly n outputs, at the first output matching a pattern,
#: at the same position as the previous input, or after the runtime settles.
Where: TypeAlias = "int | Mapping[str, JsonValue] | Literal['here'] | None"
#: A JSON object (an input or an output).
JsonObject: TypeAlias = dict[str, JsonValue]


class ObserverFailure(RuntimeError):
    """Raised by the replay's listener for an ``{"in":"observer","action":"throw"}`` input,
    so that the runtime's containment of listener failures (RT3) is what the vector checks."""


@dataclass(frozen=True, slots=True)
class Placed:
    """One input (P9 JSON; ``effect`` may be a selector object) and where it is applied."""

    value: Mapping[str, JsonValue]
    where: Where
    label: str


@dataclass
class Replay:
    """Every output's JSON, and how each input was taken: ``None`` (accepted) or
    ``(kind, message)`` with kind as vectors name it (``validation``, ``protocol``, ...)."""

    outputs: list[JsonObject] = field(default_factory=list)
    taken: list[tuple[str, str] | None] = field(default_factory=list)
    stopped: str | None = None


# --------------------------------------------------------------------------
# The puppet environment
# --------------------------------------------------------------------------


class _Puppet:
    """Each effect's handler waits for the script's completion of that effect."""

    def __init__(self) -> None:
        self.unclaimed: dict[str, deque[int]] = defaultdict(deque)
        self.orders: dict[int, deque[tuple[str, object]]] = defaultdict(deque)
        self.waiters: dict[int, asyncio.Future[None]] = {}
        self.waiting = 0          # handlers waiting for an order
        self.pending = 0          # orders given and not yet taken
        self.ticks: set[int] = set()

    def requested(self, effect: Effect) -> None:
        if effect.kind != TICK:
            self.unclaimed[effect.kind].append(effect.id)

    def claim(self, kind: str) -> int:
        """Tasks start in request order, so the n-th handler of a kind serves the n-th effect."""
        return self.unclaimed[kind].popleft()

    def order(self, effect_id: int, verb: str, value: object) -> None:
        self.orders[effect_id].append((verb, value))
        self.pending += 1
        waiter = self.waiters.get(effect_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self, effect_id: int) -> tuple[str, object]:
        while not self.orders[effect_id]:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiters[effect_id] = waiter
            self.waiting += 1
            try:
                await waiter
            finally:
                self.waiting -= 1
                self.waiters.pop(effect_id, None)
        self.pending -= 1
        return self.orders[effect_id].popleft()

    async def value(self, kind: str) -> object:
        verb, value = await self.take(self.claim(kind))
        if verb == "raise":
            assert isinstance(value, ErrorInfo)
            raise RaisedError(value)
        return value

    async def prompt_submit(self, _context: PromptSubmit, _next: Next[PromptDecision]
                            ) -> PromptDecision:
        return cast(PromptDecision, await self.value(PROMPT_SUBMIT))

    async def step(self, _context: StepContext) -> None:
        await self.value(STEP_HOOK)

    async def turn_stopping(self, _context: TurnStopping) -> None:
        await self.value(TURN_STOPPING)

    async def request_error(self, _context: RequestErrorContext,
                            _next: Next[RetryAction | None]) -> RetryAction | None:
        return cast("RetryAction | None", await self.value(REQUEST_ERROR))

    async def system(self, _context: StepContext) -> JsonValue:
        return cast(JsonValue, await self.value(SYSTEM_PROMPT))

    #: RT16: the script's resolutions are exact; a retry policy is named only where they name one.
    names_retry_policy: Final = True

    async def prepare(self, _draft: RequestDraft) -> Mapping[str, JsonValue]:
        return cast("Mapping[str, JsonValue]", await self.value(REQUEST))

    def stream(self, _call: ModelCall) -> AsyncIterator[Mapping[str, JsonValue]]:
        return self._chunks(self.claim(MODEL))

    async def _chunks(self, effect_id: int) -> AsyncIterator[Mapping[str, JsonValue]]:
        while True:
            verb, value = await self.take(effect_id)
            if verb == "end":
                return
            if verb == "raise":
                assert isinstance(value, ErrorInfo)
                raise RaisedError(value)
            yield cast("Mapping[str, JsonValue]", value)

    async def tool_prepare(self, _call: ToolCall) -> ToolOutput | None:
        value = await self.value(TOOL_PREPARE)
        return None if value is None else _Verbatim(cast(JsonValue, value))

    async def tool_run(self, _call: ToolCall) -> ToolOutput:
        return _Verbatim(cast(JsonValue, await self.value(TOOL_EXECUTE)))

    async def tool_finalize(self, _call: ToolCall, _result: ToolResult) -> ToolOutput:
        return _Verbatim(cast(JsonValue, await self.value(TOOL_FINALIZE)))


class _PuppetSink:
    """Keeps the events (an `InMemorySink`); each flush waits for the script first."""

    def __init__(self, puppet: _Puppet) -> None:
        self.puppet = puppet
        self.kept = InMemorySink()

    def append(self, event: Event) -> None:
        self.kept.append(event)

    async def flush(self) -> None:
        await self.puppet.value(FLUSH)
        self.kept.flush()


def _agent(config: CoreConfig, puppet: _Puppet, session: SessionLog | None) -> Agent:
    hooks = Hooks()
    hooks.prompt_submit.use(puppet.prompt_submit)
    hooks.step.use(puppet.step)
    hooks.turn_stopping.use(puppet.turn_stopping)
    hooks.request_error.use(puppet.request_error)

    def puppet_tool(name: str, mode: ToolMode) -> Tool:
        return Tool(name, puppet.tool_run, mode, prepare=puppet.tool_prepare,
                    finalize=puppet.tool_finalize)

    registry = ToolRegistry([puppet_tool(name, mode) for name, mode in config.tool_modes.items()],
                            fallback=puppet_tool("*", "exclusive"))
    clock = itertools.count()
    agent = Agent(puppet, tools=registry, hooks=hooks, system=puppet.system,
                  request_options=dict(config.request_options),
                  max_parallel_tool_calls=config.max_parallel_tool_calls,
                  sink=_PuppetSink(puppet), session=session,
                  session_start=config.session_start, publish=config.publish,
                  clock=lambda: next(clock))
    agent._on_tick = puppet.ticks.add        # ticks wait for the script too
    return agent


# --------------------------------------------------------------------------
# The replay
# --------------------------------------------------------------------------


async def replay(placed: Sequence[Placed], config: CoreConfig, *,
                 session: SessionLog | None = None, stop_on_refusal: bool = False) -> Replay:
    """Apply *placed* inputs through an `Agent` with a puppet environment (module docstring)."""
    puppet = _Puppet()
    agent = _agent(config, puppet, session)
    result = Replay()
    effects: dict[int, JsonObject] = {}
    finished: set[int] = set()              # completed by the script (maybe not yet fed)
    throwing = [False]                      # the current observer fails when it returns (P14)
    cursor = 0

    def live_effects() -> list[int]:
        return [e for e in agent.core.outstanding_effects if e not in finished]

    def take(item: Placed) -> tuple[str, str] | None:
        value = dict(item.value)
        completion = value.get("in") in COMPLETIONS
        selector = value.get("effect") if completion else None
        if isinstance(selector, Mapping):
            chosen = next((e for e in live_effects()
                           if e in effects and matches(selector, effects[e])), None)
            if chosen is None:
                return "selector", f"no outstanding effect matches {json.dumps(selector)}"
            value["effect"] = chosen
        try:
            applied = input_from_json(value, item.label)
            if isinstance(applied, (Resolve, Raise, Chunk, End)):
                return complete(applied)
            if isinstance(applied, Observer):
                # P14: the listener delivering the last output fails when it returns
                throwing[0] = throwing[0] or (applied.action == "throw" and agent._delivering)
                # RT3 contains the failure; a veto has no counterpart in the runtime (D7)
                return None
            agent._feed(applied)
        except TurnstileError as error:
            kind = raise_kind(error, completion=completion) or "error"
            return kind, f"{type(error).__name__}: {error}"
        return None

    def complete(applied: Resolve | Raise | Chunk | End) -> tuple[str, str] | None:
        """A completion, checked as the core checks it (rule P10), then handed over."""
        effect_id = applied.effect
        if effect_id not in live_effects():
            return "protocol", f"effect {effect_id} is not outstanding"
        kind = effects.get(effect_id, {}).get("kind")
        if isinstance(applied, (Chunk, End)) and kind != MODEL:
            return "protocol", f"effect {effect_id} is not a model stream"
        if isinstance(applied, Resolve) and kind == MODEL:
            return "protocol", f"effect {effect_id} is a model stream"
        if not isinstance(applied, Chunk):
            finished.add(effect_id)
        verb, payload = _order(applied)
        if kind == TICK:
            puppet.ticks.discard(effect_id)
            agent._complete(verb, effect_id, payload)
        else:
            puppet.order(effect_id, verb, payload)
        return None

    def apply_from_cursor() -> None:
        """Apply the current input and every input placed with it, at the current position;
        from outside a delivery their outputs are delivered after the last one."""
        nonlocal cursor
        outside = not agent._delivering
        agent._delivering = True
        try:
            while cursor < len(placed):
                item = placed[cursor]
                cursor += 1
                taken = take(item)
                result.taken.append(taken)
                if taken is not None and (stop_on_refusal or taken[0] == "selector"):
                    result.stopped = f"{item.label}: {taken[1]}"
                    cursor = len(placed)
                if cursor >= len(placed) or placed[cursor].where != HERE:
                    break
        finally:
            if outside:
                agent._delivering = False
        if outside:
            agent._pump(feed=False)

    def due(where: Where, value: JsonObject) -> bool:
        if isinstance(where, int) and not isinstance(where, bool):
            return where == len(result.outputs)
        return isinstance(where, Mapping) and matches(where, value)

    def observer(output: Output) -> None:
        value = output.to_json()
        if isinstance(output, Effect):
            effects[output.id] = value
            puppet.requested(output)
        if result.stopped is not None:
            return
        result.outputs.append(value)
        if cursor < len(placed) and due(placed[cursor].where, value):
            apply_from_cursor()
        if throwing[0]:
            throwing[0] = False
            raise ObserverFailure(f"an observer of output {len(result.outputs) - 1} failed")

    async def settled() -> None:
        for _ in range(_SETTLE_PASSES):
            await asyncio.sleep(0)
            busy = sum(1 for task in agent._tasks if not task.done())
            if (not agent._scheduled and not agent._ready and puppet.pending == 0
                    and busy == puppet.waiting):
                return
        raise RuntimeError("the runtime did not settle")   # pragma: no cover

    stop = agent.observe(observer)
    await agent.__aenter__()
    try:
        while cursor < len(placed):
            item = placed[cursor]
            if item.where in (HERE, 0):                    # before anything is pulled
                apply_from_cursor()
                continue
            await settled()
            if cursor >= len(placed) or placed[cursor] is not item:
                continue                                   # applied by the listener
            if item.where is not None:
                result.stopped = f"{item.label}: its position was never reached " \
                                 f"({len(result.outputs)} outputs, then the core waits)"
                break
            apply_from_cursor()
        await settled()
    finally:
        stop()
        for task in list(agent._tasks):
            task.cancel()
        await asyncio.gather(*agent._tasks, return_exceptions=True)
    return result


def _order(applied: Resolve | Raise | Chunk | End
           ) -> tuple[Literal["resolve", "raise", "chunk", "end"], object]:
    if isinstance(applied, Resolve):
        return "resolve", applied.value
    if isinstance(applied, Raise):
        return "raise", applied.error
    if isinstance(applied, Chunk):
        return "chunk", applied.chunk
    return "end", None


# --------------------------------------------------------------------------
# Scripts (specs/scripts.md)
# --------------------------------------------------------------------------


def script_inputs(script: Script) -> list[Placed]:
    placed: list[Placed] = []
    for item in script.inputs:
        value = dict(item.value)
        if item.selector is not None:
            value["effect"] = item.selector
        when = item.when
        if isinstance(when, Mapping) and "pulled" in when:
            # An exact position: after N outputs, as an observer of the N-th; "drained" means
            # after the pull that found nothing, which is where the runtime has settled.
            pulled = when["pulled"]
            assert isinstance(pulled, int)
            placed.append(Placed(value, None if when.get("drained") else pulled, item.path))
            continue
        placed.append(Placed(value, when, item.path))
    return placed


def replay_script(script: Script) -> str | None:
    """None if the runtime's outputs (and refusal) equal ``turnstile run``'s; else the first
    difference."""
    want: list[JsonObject] = []
    refused: str | None = None
    try:
        want.extend(run_script(script))
    except ScriptError as error:
        refused = str(error)
    try:
        got = asyncio.run(replay(script_inputs(script), script.config, stop_on_refusal=True))
    except Exception as error:          # a broken runtime: report, do not crash the caller
        return f"the replay failed: {type(error).__name__}: {error}"
    difference = _first_difference(want, got.outputs)
    if difference is not None:
        return difference
    if (refused is None) != (got.stopped is None):
        return f"refusals differ: core {refused!r}, runtime {got.stopped!r}"
    return None


# --------------------------------------------------------------------------
# Conformance vectors (specs/conformance)
# --------------------------------------------------------------------------


def vector_inputs(vector: Vector) -> tuple[list[Placed], list[tuple[int, JsonObject]]]:
    """The vector's inputs with their positions, and its expected outputs with their step
    indexes (``{"out": "none"}`` steps only place the following input)."""
    placed: list[Placed] = []
    expected: list[tuple[int, JsonObject]] = []
    outputs = 0
    after_none = False
    previous_in = False
    for index, step in enumerate(vector.steps):
        if step.kind == "out":
            previous_in = False
            if step.value.get("out") == "none":
                after_none = True
            else:
                expected.append((index, step.value))
                outputs += 1
                after_none = False
            continue
        where: Where = HERE if previous_in else (None if after_none else outputs)
        placed.append(Placed(step.value, where, f"step {index + 1}"))
        previous_in = True
    return placed, expected


def check_vector(vector: Vector) -> str | None:
    """None if the runtime, driven by the vector's inputs, produces exactly its outputs and
    takes its inputs as it says; otherwise the first difference."""
    placed, expected = vector_inputs(vector)
    session = SessionLog(seed_events(vector.seed), clock=fake_clock) if vector.seed else None
    try:
        got = asyncio.run(replay(placed, config_from_json(vector.config), session=session))
    except Exception as error:          # a broken runtime: report, do not crash the caller
        return f"the replay failed: {type(error).__name__}: {error}"
    if got.stopped is not None:
        return got.stopped
    raises = [s.raises for s in vector.steps if s.kind == "in"]
    for number, (want, taken) in enumerate(zip(raises, got.taken, strict=False)):
        kind = None if taken is None else taken[0]
        if kind != want:
            return (f"input {number + 1} ({placed[number].label}): expected "
                    f"{'acceptance' if want is None else want}, got "
                    f"{'acceptance' if taken is None else f'{taken[0]}: {taken[1]}'}")
    for (index, want_output), got_output in zip(expected, got.outputs, strict=False):
        step = vector.steps[index]
        difference = jsoncmp.first_difference(want_output, got_output, step.loose)
        if difference is not None:
            return (f"step {index + 1}: expected {jsoncmp.render(want_output, 240)}, "
                    f"runtime {jsoncmp.render(got_output, 240)} ({difference})")
    if len(expected) != len(got.outputs):
        return _first_difference([o for _, o in expected], got.outputs)
    return None


def _first_difference(want: list[JsonObject], got: list[JsonObject]) -> str | None:
    for index, (a, b) in enumerate(zip(want, got, strict=False)):
        if a != b:
            return f"output {index}: core {json.dumps(a)[:300]} != runtime {json.dumps(b)[:300]}"
    if len(want) != len(got):
        shorter = min(len(want), len(got))
        extra = (want if len(want) > shorter else got)[shorter]
        return (f"the core produced {len(want)} outputs, the runtime {len(got)}; first extra: "
                f"{json.dumps(extra)[:300]}")
    return None

