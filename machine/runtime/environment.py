"""What the runtime does for each effect kind (reference §3.5; specs/runtime.md RT5, RT8-RT12).

An `Environment` maps one effect request (other than ``tick`` and ``model``)
to the agent's extension points, system prompt, request preparation, tools,
retry policy and session sink. `Environment.start` begins the work when the
effect is delivered and returns either the coroutine to await (an exception it
raises is the effect's raised error) or, when no code of the user's would run,
the value itself as an `Immediate`:

* a hook point with no handlers (its default: ``{kind:'allow'}``, ``None``,
  the seed header, no retry);
* a system prompt that is a value rather than a function;
* a tool stage the tool does not define (prepare: dispatch; finalize: the
  body's result as it is), or a call naming no tool (the ``UNKNOWN_TOOL``
  result);
* a synchronous sink flush (``flush()`` returning ``None``, as the default
  `InMemorySink` and `PersistentSession` do): it runs at the delivery, like
  the sink's ``append``.

Either way the result enters the core on the next pass of the event loop
(RT5); an immediate value only saves the task. The asyncio `Agent` awaits the
coroutines in tasks; `machine.checking.testing` runs them synchronously against the
scripted driver (`perform`), so the same handlers can be property-tested
against the core.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final, TypeAlias

from machine.errors import ProtocolError, ValidationError
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
from machine.jsonvalue import Frozen, FrozenDict, FrozenList, freeze, thaw
from machine.runtime.approvals import Approvals, denied_result
from machine.runtime.control import RunControl, merge_options
from machine.runtime.hooks import (
    Hooks,
    JsonValue,
    PromptSubmit,
    RequestContext,
    RequestErrorContext,
    StepContext,
    TurnStopping,
)
from machine.runtime.model import RequestDraft, RequestPreparer, default_header
from machine.runtime.retry import RetryAction, RetryPolicy
from machine.runtime.signal import Signal
from machine.runtime.sink import SessionSink
from machine.runtime.tools import (
    Tool,
    ToolCall,
    ToolRegistry,
    result_json,
    run_body,
    unknown_tool_result,
)
from machine.vocabulary import ALLOW, Allow, Block, ErrorInfo, LlmFailure, Message, ToolResult

__all__ = ["Environment", "Immediate", "SystemPrompt", "perform"]

#: The system prompt: a JSON value, or an async function of the step.
SystemPrompt: TypeAlias = Callable[[StepContext], Awaitable[JsonValue]]
#: The work of one effect, not yet awaited.
Work: TypeAlias = Coroutine[Any, Any, object]

_ALLOW_JSON: Final = FrozenDict({"kind": "allow"})


class Immediate:
    """The value of an effect whose work runs none of the user's code (see the module
    docstring)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value


_NOTHING: Final = Immediate(None)


def _int(payload: FrozenDict, key: str) -> int:
    value = payload[key]
    assert type(value) is int, f"effect payload {key!r} is not an int"
    return value


class Environment:
    """The agent's side of every effect but ``tick`` and ``model`` (see the module docstring).

    *preparer* is the model adapter's ``prepare`` part (`RequestPreparer`) or ``None``;
    the agent decides it once, at construction."""

    __slots__ = ("approvals", "control", "hooks", "managed", "preparer", "retry_policy",
                 "retry_policy_json", "sink", "system", "tools")

    def __init__(self, *, hooks: Hooks, tools: ToolRegistry, system: JsonValue | SystemPrompt,
                 sink: SessionSink, preparer: RequestPreparer | None,
                 retry_policy: RetryPolicy) -> None:
        self.hooks = hooks
        self.tools = tools
        self.system = system
        self.sink = sink
        self.preparer = preparer
        self.retry_policy = retry_policy
        self.retry_policy_json = freeze(retry_policy.to_json(), "retry_policy")
        #: What the running chain's run adds to its turns (RT23, RT24); None: nothing.
        self.control: RunControl | None = None
        #: Request options a run added (RT23), taken back out of later requests.
        self.managed: dict[str, tuple[object, JsonValue]] = {}
        #: The agent's approvals (RT25): the calls whose prepare waits for a decision.
        self.approvals: Approvals | None = None

    def start(self, effect: Effect, signal: Signal | None) -> Work | Immediate:
        """Begin *effect*'s work: the coroutine to await, or its value (`Immediate`).

        Hook handler lists are snapshotted here, at the effect's delivery."""
        payload, kind = effect.payload, effect.kind
        if kind == FLUSH:
            flushing = self.sink.flush()        # synchronous like append, or an awaitable
            return _NOTHING if flushing is None else _awaited(flushing)
        assert signal is not None, f"a {kind!r} effect carries a signal"
        hooks = self.hooks
        if kind == PROMPT_SUBMIT:
            chain = hooks.prompt_submit.snapshot()
            if not chain:
                return Immediate(_ALLOW_JSON)
            return self._prompt_submit(Message.from_json(payload["message"]), signal, chain)
        control = self.control
        if kind == TURN_STOPPING:
            stopping = hooks.turn_stopping.snapshot()
            if control is not None and control.stops_turn:
                return self._turn_stopping(TurnStopping(_int(payload, "turn"), signal), stopping,
                                           control)
            if not stopping:
                return _NOTHING
            return hooks.turn_stopping.run(TurnStopping(_int(payload, "turn"), signal), stopping)
        turn, step = _int(payload, "turn"), _int(payload, "step")
        if kind == STEP_HOOK:
            if control is not None:
                control.check_step(turn, step)      # raises to end the turn (RT23, RT24)
            serial = hooks.step.snapshot()
            if not serial:
                return _NOTHING
            return hooks.step.run(StepContext(turn, step, signal), serial)
        if kind == SYSTEM_PROMPT:
            system = self.system
            if callable(system):
                return _stage_value(system, StepContext(turn, step, signal))
            return Immediate(system)
        if kind == REQUEST:
            seed = payload["config"]
            assert isinstance(seed, FrozenDict)
            prompt: Frozen = payload.get("system")
            request = hooks.request.snapshot()
            if not request and self.preparer is None:
                config: Mapping[str, JsonValue] = seed
                tools = self.tools.spec_tuple()
                if control is not None or self.managed:
                    config, tools = self._run_request(seed)
                return Immediate(self._with_policy(default_header(
                    RequestDraft(turn, step, signal, config, prompt, tools))))
            return self._request(RequestContext(turn, step, signal, seed, prompt), request)
        if kind == REQUEST_ERROR:
            recovery = hooks.request_error.snapshot()
            if not recovery:
                return _NOTHING
            prior = payload.get("priorFailures")
            context = RequestErrorContext(
                turn, step, signal, ErrorInfo.from_json(payload["error"]),
                LlmFailure.from_json(payload["failure"]),
                tuple(LlmFailure.from_json(f) for f in prior) if isinstance(prior, FrozenList)
                else (), self._policy_of(payload.get("retryPolicy")))
            return self._request_error(context, recovery)
        if kind in (TOOL_PREPARE, TOOL_EXECUTE, TOOL_FINALIZE):
            return self._tool_stage(kind, payload, turn, step, signal)
        raise ProtocolError(f"no runtime work for effect kind {kind!r}")

    # -- the work of each kind ------------------------------------------------

    async def _prompt_submit(self, message: Message, signal: Signal,
                             chain: tuple[Any, ...]) -> object:
        decision = await self.hooks.prompt_submit.run(PromptSubmit(message, signal), ALLOW, chain)
        return decision.to_json() if isinstance(decision, (Allow, Block)) else decision

    async def _request(self, context: RequestContext, chain: tuple[Any, ...]) -> object:
        config = await self.hooks.request.run(context, context.config, chain)
        config, tools = self._run_request(config)
        draft = RequestDraft(context.turn, context.step, context.signal, config, context.system,
                             tools)
        if self.preparer is not None:
            return self._with_policy(await self.preparer.prepare(draft))
        return self._with_policy(default_header(draft))

    def _with_policy(self, resolution: object) -> object:
        """RT16, R9.6: the agent's retry policy named beside the header, unless the preparer
        named one, or says its resolutions name it themselves (``names_retry_policy``); a
        value that is no mapping is the core's to refuse, as it is."""
        if isinstance(resolution, Mapping) and "retryPolicy" not in resolution and not getattr(
                self.preparer, "names_retry_policy", False):
            return {**resolution, "retryPolicy": self.retry_policy_json}
        return resolution

    def _policy_of(self, named: Frozen) -> RetryPolicy:
        """RT16, R13.2: the policy of the request that failed, as its preparation named it; the
        agent's when it named the agent's, none, or a value that is not a `RetryPolicy`."""
        if named is None or named == self.retry_policy_json:
            return self.retry_policy
        try:
            return RetryPolicy.from_json(named, random=self.retry_policy.random)
        except ValidationError:
            return self.retry_policy

    def _run_request(self, config: Mapping[str, JsonValue]
                     ) -> tuple[Mapping[str, JsonValue], tuple[JsonValue, ...]]:
        """The request config and tool specs with what the running chain's run adds
        (RT23: native structured-output options or the final-answer tool), and without
        the options an earlier run added (the seed is the last header's config, R9.6)."""
        control = self.control
        tools = self.tools.spec_tuple()
        if control is None and not self.managed:
            return config, tools
        native = control.native if control is not None else None
        config = merge_options(config, native or {}, self.managed)
        if control is not None and control.tool_specs:
            tools = tools + control.tool_specs
        return config, tools

    async def _approved(self, found: Tool, call: ToolCall, approvals: Approvals) -> JsonValue:
        """A held call's prepare (RT25): the application's decision first. Approved: the
        tool's own prepare, if any; denied: the error result the model reads; the turn's
        signal aborted first: the approval is cancelled and the call not dispatched (the
        core's check after prepare gives it the aborted-before-dispatch result, R10.3)."""
        decided = await approvals.take(call.call_id, call.signal)
        if decided is None:
            cause = call.signal.reason
            approvals.cancel(call.call_id, "the turn was "
                             + ("disposed" if cause is not None and cause.kind == "disposed"
                                else "cancelled"))
            return None
        flushing = approvals.flushing                 # the decision is durable before it runs
        if flushing is not None and not flushing.done():
            await asyncio.wait((flushing,))
        decision, reason = decided
        if decision != "approved":
            return denied_result(reason)
        if found.prepare is None:
            return None
        return result_json(await found.prepare(call))

    async def _turn_stopping(self, context: TurnStopping, chain: tuple[Any, ...],
                             control: RunControl) -> None:
        """The turn-stopping handlers, then the run's own check (RT23)."""
        if chain:
            await self.hooks.turn_stopping.run(context, chain)
        await control.turn_stopping(context)

    async def _request_error(self, context: RequestErrorContext, chain: tuple[Any, ...]
                             ) -> object:
        action = await self.hooks.request_error.run(context, None, chain)
        return action.to_json() if isinstance(action, RetryAction) else action

    def _tool_stage(self, kind: str, payload: FrozenDict, turn: int, step: int,
                    signal: Signal) -> Work | Immediate:
        name = str(payload["name"])
        control = self.control
        found = None
        if control is not None:
            if kind == TOOL_PREPARE:
                refused = control.refuse_call(name)      # RT24: one call too many
                if refused is not None:
                    return Immediate(refused)
            found = control.tool(name)
        if found is None:
            found = self.tools.get(name)
        if kind == TOOL_FINALIZE and (found is None or found.finalize is None):
            return Immediate(payload["result"])     # the body's result as it is
        if found is None:
            return Immediate(unknown_tool_result(name))
        approvals = self.approvals
        held = (kind == TOOL_PREPARE and approvals is not None
                and approvals.holds(str(payload["callId"])))
        if kind == TOOL_PREPARE and found.prepare is None and not held:
            return _NOTHING
        call = ToolCall(str(payload["callId"]), name, thaw(payload["arguments"]), turn, step,
                        signal)
        if kind == TOOL_EXECUTE:
            return run_body(found, call)
        if held:
            assert approvals is not None
            return self._approved(found, call, approvals)
        if kind == TOOL_PREPARE:
            assert found.prepare is not None
            return _stage(found.prepare, call)
        assert found.finalize is not None
        return _stage(found.finalize, call, ToolResult.from_json(payload["result"]))


async def _stage_value(function: SystemPrompt, context: StepContext) -> object:
    """Call the system prompt function in the task (never at delivery)."""
    return await function(context)


async def _awaited(awaitable: Awaitable[object]) -> object:
    return await awaitable


async def _stage(stage: Callable[..., Awaitable[Any]], *arguments: object) -> JsonValue:
    """Call a tool stage in the task (never at delivery) and take its output as JSON."""
    return result_json(await stage(*arguments))


async def perform(environment: Environment, effect: Effect, signal: Signal | None) -> object:
    """The resolved value of *effect* (an exception raised is its raised error)."""
    started = environment.start(effect, signal)
    if isinstance(started, Immediate):
        return started.value
    return await started
