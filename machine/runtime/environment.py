"""What the runtime does for each effect kind (reference §3.5; specs/runtime.md RT8-RT12).

`perform` maps one effect request (other than ``tick`` and ``model``) to the
agent's extension points, system prompt, request preparation, tools and
session store, and returns the value to resolve it with (an exception it
raises is the effect's raised error). The asyncio `Agent` awaits it in a task;
`machine.testing` runs it synchronously against the scripted driver, so the
same handlers can be property-tested against the core.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeAlias

from machine.errors import ProtocolError
from machine.io import (
    FLUSH,
    PROMPT_SUBMIT,
    REQUEST,
    REQUEST_ERROR,
    STEP_HOOK,
    SYSTEM_PROMPT,
    TOOL_EXECUTE,
    TOOL_FINALIZE,
    TOOL_PREPARE,
    TURN_STOPPING,
    Effect,
)
from machine.jsonvalue import Frozen, FrozenDict, FrozenList, thaw
from machine.runtime.hooks import (
    Hooks,
    JsonValue,
    PromptSubmit,
    RequestContext,
    RequestErrorContext,
    RetryAction,
    StepContext,
    TurnStopping,
)
from machine.runtime.model import RequestDraft, RequestPreparer, default_header
from machine.runtime.signal import Signal
from machine.runtime.store import SessionStore
from machine.runtime.tools import ToolCall, ToolRegistry, run_body, run_finalize, run_prepare
from machine.vocabulary import ALLOW, Allow, Block, ErrorInfo, LlmFailure, Message

__all__ = ["SystemPrompt", "perform"]

#: The system prompt: a JSON value, or an async function of the step.
SystemPrompt: TypeAlias = Callable[[StepContext], Awaitable[JsonValue]]


def _int(payload: FrozenDict, key: str) -> int:
    value = payload.get(key)
    assert isinstance(value, int), f"effect payload {key!r} is not an int"
    return value


async def perform(effect: Effect, signal: Signal | None, *, hooks: Hooks, tools: ToolRegistry,
                  system: JsonValue | SystemPrompt, store: SessionStore,
                  preparer: RequestPreparer | None) -> object:
    """The resolved value of *effect* (see the module docstring); *signal* is its signal."""
    payload, kind = effect.payload, effect.kind
    if kind == FLUSH:
        await store.flush()
        return None
    assert signal is not None, f"a {kind!r} effect carries a signal"
    if kind == PROMPT_SUBMIT:
        message = Message.from_json(payload["message"])
        decision = await hooks.prompt_submit.run(PromptSubmit(message, signal), ALLOW)
        return decision.to_json() if isinstance(decision, (Allow, Block)) else decision
    if kind == TURN_STOPPING:
        await hooks.turn_stopping.run(TurnStopping(_int(payload, "turn"), signal))
        return None
    turn, step = _int(payload, "turn"), _int(payload, "step")
    if kind == STEP_HOOK:
        await hooks.step.run(StepContext(turn, step, signal))
        return None
    if kind == SYSTEM_PROMPT:
        if callable(system):
            return await system(StepContext(turn, step, signal))
        return system
    if kind == REQUEST:
        seed = payload["config"]
        assert isinstance(seed, FrozenDict)
        prompt: Frozen = payload.get("system")
        config = await hooks.request.run(RequestContext(turn, step, signal, seed, prompt), seed)
        draft = RequestDraft(turn, step, signal, config, prompt, tuple(tools.specs()))
        if preparer is not None:
            return await preparer.prepare(draft)
        return default_header(draft)
    if kind == REQUEST_ERROR:
        prior = payload.get("priorFailures")
        context = RequestErrorContext(
            turn, step, signal, ErrorInfo.from_json(payload["error"]),
            LlmFailure.from_json(payload["failure"]),
            tuple(LlmFailure.from_json(f) for f in prior) if isinstance(prior, FrozenList) else ())
        action = await hooks.request_error.run(context, None)
        return action.to_json() if isinstance(action, RetryAction) else action
    call = ToolCall(str(payload["callId"]), str(payload["name"]), thaw(payload["arguments"]),
                    turn, step, signal)
    if kind == TOOL_PREPARE:
        return await run_prepare(tools, call)
    if kind == TOOL_EXECUTE:
        return await run_body(tools, call)
    if kind == TOOL_FINALIZE:
        return await run_finalize(tools, call, thaw(payload["result"]))
    raise ProtocolError(f"no runtime work for effect kind {kind!r}")
