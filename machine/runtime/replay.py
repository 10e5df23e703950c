"""Replay a script (specs/scripts.md) or conformance vector through the asyncio `Agent`.

This is the runtime's equivalence proof (specs/runtime.md RT14): the same
inputs, applied through the asyncio runtime instead of directly to the core,
must give exactly the core's outputs.

The agent runs with a *puppet environment*: its prompt-submit, step,
turn-stopping and request-error handlers, its system prompt, its model
adapter (with request preparation), its tools and its session store all wait
for the script to say how they complete, and then return, raise or stream
exactly that. The script's inputs are applied where it says:

* an input with ``"when": PATTERN`` is applied by an output listener, at the
  first matching output (an observer position), and ``"when": "here"`` inputs
  after it at the same position;
* an input without ``when`` is applied from outside once the runtime has
  settled (the core waits for input and every task waits for the script);
* a command goes through the agent's command path; a completion is handed to
  the puppet handling that effect (ticks are held and released likewise).

`replay` returns the outputs (JSON, as ``turnstile run`` prints them) and
the refusal, if an input was refused; `compare` runs both and reports the
first difference.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

from machine.errors import TurnstileError
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
    Input,
    Output,
    Raise,
    Resolve,
    input_from_json,
)
from machine.runner import HERE, Script, ScriptError, ScriptInput, matches, parse_script, run_script
from machine.runtime.agent import Agent
from machine.runtime.failures import RaisedError
from machine.runtime.hooks import (
    Hooks,
    JsonValue,
    Next,
    PromptSubmit,
    RequestErrorContext,
    RetryAction,
    StepContext,
    TurnStopping,
)
from machine.runtime.model import ModelCall, RequestDraft
from machine.runtime.store import InMemorySessionStore
from machine.runtime.tools import Tool, ToolCall, ToolOutput, ToolRegistry, _Verbatim
from machine.vocabulary import ErrorInfo, PromptDecision, ToolResult

__all__ = ["Replay", "compare", "load_vector", "replay", "replay_script"]

#: Fields a conformance vector may carry beside a script's own fields.
VECTOR_EXTRAS: Final = ("outputs", "expected", "id", "name", "title", "rules", "notes")
_SETTLE_PASSES: Final = 10_000


@dataclass
class Replay:
    """The result of a replay: every output's JSON, and the refusal that stopped it (if any)."""

    outputs: list[dict[str, Any]] = field(default_factory=list)
    refused: str | None = None


class _Puppet:
    """The scripted environment: each effect's handler waits for the script's completion."""

    def __init__(self) -> None:
        self.unclaimed: dict[str, deque[int]] = defaultdict(deque)
        self.orders: dict[int, deque[tuple[str, object]]] = defaultdict(deque)
        self.waiters: dict[int, asyncio.Future[None]] = {}
        self.waiting = 0          # handlers waiting for an order
        self.pending = 0          # orders given and not yet taken
        self.ticks: set[int] = set()

    # -- bookkeeping -----------------------------------------------------------
    def requested(self, effect: Effect) -> None:
        if effect.kind != TICK:
            self.unclaimed[effect.kind].append(effect.id)

    def claim(self, kind: str) -> int:
        """Tasks start in request order, so the n-th handler of a kind serves the n-th effect."""
        return self.unclaimed[kind].popleft()

    def order(self, effect_id: int, kind: str, value: object) -> None:
        self.orders[effect_id].append((kind, value))
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
        """Serve the next effect of *kind*: its resolved value, or raise its error."""
        verb, value = await self.take(self.claim(kind))
        if verb == "raise":
            assert isinstance(value, ErrorInfo)
            raise RaisedError(value)
        return value

    # -- the environment ---------------------------------------------------------
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


class _PuppetStore(InMemorySessionStore):
    def __init__(self, puppet: _Puppet) -> None:
        super().__init__()
        self.puppet = puppet

    async def flush(self) -> None:
        await self.puppet.value(FLUSH)
        await super().flush()


def _agent(script: Script, puppet: _Puppet) -> Agent:
    config = script.config
    hooks = Hooks()
    hooks.prompt_submit.use(puppet.prompt_submit)
    hooks.step.use(puppet.step)
    hooks.turn_stopping.use(puppet.turn_stopping)
    hooks.request_error.use(puppet.request_error)

    def puppet_tool(name: str, mode: Any) -> Tool:
        return Tool(name, puppet.tool_run, mode, prepare=puppet.tool_prepare,
                    finalize=puppet.tool_finalize)

    registry = ToolRegistry([puppet_tool(name, mode) for name, mode in config.tool_modes.items()],
                            fallback=puppet_tool("*", "exclusive"))
    clock = itertools.count()
    return Agent(puppet, tools=registry, hooks=hooks, system=puppet.system,
                 request_options=dict(config.request_options),
                 max_parallel_tool_calls=config.max_parallel_tool_calls,
                 store=_PuppetStore(puppet), session_start=config.session_start,
                 publish=config.publish, clock=lambda: next(clock))


async def replay(script: Script) -> Replay:
    """Run *script* through an `Agent` with a puppet environment (see the module docstring)."""
    puppet = _Puppet()
    agent = _agent(script, puppet)
    agent._on_tick = puppet.ticks.add        # ticks wait for the script too
    result = Replay()
    effects: dict[int, dict[str, Any]] = {}
    finished: set[int] = set()              # completed by the script (maybe not yet fed)
    inputs = script.inputs
    cursor = 0

    def refuse(item: ScriptInput, problem: str) -> None:
        nonlocal cursor
        if result.refused is None:
            result.refused = f"{item.path}: {problem}"
        cursor = len(inputs)

    def effect_of(item: ScriptInput) -> int | None:
        live = [e for e in agent.core.outstanding_effects if e not in finished]
        if item.selector is None:
            effect_id = item.value.get("effect")
            assert isinstance(effect_id, int)
            return effect_id
        return next((e for e in live if e in effects and matches(item.selector, effects[e])), None)

    def apply(item: ScriptInput) -> None:
        value = dict(item.value)
        if item.selector is not None:
            chosen = effect_of(item)
            if chosen is None:
                refuse(item, "no outstanding effect matches the selector")
                return
            value["effect"] = chosen
        applied: Input = input_from_json(value, item.path)
        if isinstance(applied, (Resolve, Raise, Chunk, End)):
            complete(item, applied)
            return
        try:
            agent._feed(applied)
        except TurnstileError as error:
            refuse(item, f"refused by the core ({type(error).__name__}): {error}")

    def complete(item: ScriptInput, applied: Resolve | Raise | Chunk | End) -> None:
        effect_id = applied.effect
        live = set(agent.core.outstanding_effects) - finished
        if effect_id not in live:
            refuse(item, f"effect {effect_id} is not outstanding")
            return
        kind = effects[effect_id]["kind"] if effect_id in effects else None
        is_model = kind == MODEL
        if isinstance(applied, (Chunk, End)) and not is_model:
            refuse(item, f"effect {effect_id} is not a model stream")
            return
        if isinstance(applied, Resolve) and is_model:
            refuse(item, f"effect {effect_id} is a model stream")
            return
        if not isinstance(applied, Chunk):
            finished.add(effect_id)
        verb, payload = _order(applied)
        if kind == TICK:
            puppet.ticks.discard(effect_id)
            agent._complete(verb, effect_id, payload)
        else:
            puppet.order(effect_id, verb, payload)

    def apply_from_cursor() -> None:
        """Apply the current input, then every ``here`` input after it."""
        nonlocal cursor
        apply(inputs[cursor])
        cursor = min(cursor + 1, len(inputs))
        while cursor < len(inputs) and inputs[cursor].when == HERE:
            apply(inputs[cursor])
            cursor = min(cursor + 1, len(inputs))

    def observer(output: Output) -> None:
        if result.refused is not None:
            return
        value = output.to_json()
        result.outputs.append(value)
        if isinstance(output, Effect):
            effects[output.id] = value
            puppet.requested(output)
        if cursor < len(inputs):
            when = inputs[cursor].when
            if isinstance(when, Mapping) and matches(when, value):
                apply_from_cursor()

    async def settled() -> None:
        for _ in range(_SETTLE_PASSES):
            await asyncio.sleep(0)
            busy = sum(1 for task in agent._tasks if not task.done())
            if (not agent._scheduled and not agent._ready and puppet.pending == 0
                    and busy == puppet.waiting):
                return
        raise ScriptError("", "the runtime did not settle")   # pragma: no cover

    stop = agent.observe(observer)
    await agent.__aenter__()
    try:
        while cursor < len(inputs):
            item = inputs[cursor]
            if item.when == HERE:            # before anything is pulled
                apply_from_cursor()
                continue
            await settled()
            if result.refused is not None or cursor >= len(inputs) or inputs[cursor] is not item:
                continue
            if isinstance(item.when, Mapping):
                refuse(item, f"the pattern {json.dumps(item.when)} never matched")
                break
            apply_from_cursor()
        await settled()
    finally:
        stop()
        for task in list(agent._tasks):
            task.cancel()
        await asyncio.gather(*agent._tasks, return_exceptions=True)
    return result


def _order(applied: Resolve | Raise | Chunk | End) -> tuple[str, object]:
    if isinstance(applied, Resolve):
        return "resolve", applied.value
    if isinstance(applied, Raise):
        return "raise", applied.error
    if isinstance(applied, Chunk):
        return "chunk", applied.chunk
    return "end", None


def replay_script(script: Script) -> Replay:
    """`replay` in a fresh event loop."""
    return asyncio.run(replay(script))


def core_outputs(script: Script) -> Replay:
    """The core's own run of *script* (``turnstile run``), in the same form as `replay`."""
    result = Replay()
    try:
        for value in run_script(script):
            result.outputs.append(value)
    except ScriptError as error:
        result.refused = str(error)
    return result


def compare(script: Script, expected: Sequence[Mapping[str, Any]] | None = None) -> str | None:
    """None if the runtime's outputs equal the core's (and *expected*, if given); otherwise a
    description of the first difference."""
    want = core_outputs(script)
    got = replay_script(script)
    if expected is not None and [dict(e) for e in expected] != want.outputs:
        return "the core's own outputs differ from the vector's expected outputs"
    for index, (a, b) in enumerate(zip(want.outputs, got.outputs, strict=False)):
        if a != b:
            return f"output {index}: core {json.dumps(a)[:300]} != runtime {json.dumps(b)[:300]}"
    if len(want.outputs) != len(got.outputs):
        shorter = min(len(want.outputs), len(got.outputs))
        extra = (want.outputs if len(want.outputs) > shorter else got.outputs)[shorter]
        return (f"the core produced {len(want.outputs)} outputs, the runtime {len(got.outputs)}; "
                f"first extra: {json.dumps(extra)[:300]}")
    if (want.refused is None) != (got.refused is None):
        return f"refusals differ: core {want.refused!r}, runtime {got.refused!r}"
    return None


def load_vector(path: str | Path) -> tuple[Script, list[dict[str, Any]] | None]:
    """A script file, or a conformance vector: a script's fields plus (optionally) its expected
    ``outputs`` (or ``expected``) and descriptive fields, or ``{script: {...}, outputs: [...]}``."""
    value = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise ScriptError("$", "a vector is a JSON object")
    body = value.get("script", value)
    if not isinstance(body, dict):
        raise ScriptError("script", "must be an object")
    expected = value.get("outputs", value.get("expected"))
    if isinstance(expected, list):      # outputs only (a vector may echo its inputs)
        expected = [e for e in expected if isinstance(e, dict) and "out" in e]
    else:
        expected = None
    script_fields = {k: v for k, v in body.items() if k not in VECTOR_EXTRAS}
    return parse_script(json.dumps(script_fields)), expected
