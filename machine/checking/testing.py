"""Testing helpers: property-test your handlers, tools and observers against the real core.

If you write prompt-submit handlers, tools or observers, you want to know
that a property holds however commands and completions interleave — for
example that *a prompt my handler blocks never leaves a trace in the log*.
This module gives you:

* Hypothesis strategies for values (re-exported from `machine.checking.strategies`:
  `user_messages`, `sources`, `send_options`, `cancel_causes`, `chunks`,
  `tool_results`, `prompt_decisions`, ...), plus `prompts` (user text
  messages with fresh ids) and `model_replies`;
* `interleavings`: whole runs as data: commands (``followup``, ``steer``,
  ``inject``, ``send``, ``cancel``, optionally ``dispose``) interleaved with
  partial deliveries of outputs (so a command lands at an observer position)
  and with the environment's answers to pending effects, in any order;
* `environment`: a scripted environment that answers effects with the very
  handlers you give the asyncio `Agent` (a `Hooks` object, tools, a system
  prompt), run synchronously, and the model from scripted replies.

`Interleaving.run` applies one interleaving to a fresh `AgentCore` with the
synchronous scripted `Driver` and returns the driver (its ``outputs``,
``events`` and ``core``)::

    from hypothesis import HealthCheck, given, settings
    from machine.runtime import Block, Hooks
    from machine.checking.testing import environment, interleavings, message_ids

    @settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(interleavings())
    def test_blocked_prompts_leave_no_trace(run):
        blocked = set()

        async def guard(submit, next):
            if "secret" in submit.message.text:
                blocked.add(submit.message.id)
                return Block("contains a secret")
            return await next()

        hooks = Hooks()
        hooks.prompt_submit.use(guard)
        driver = run.run(environment(hooks=hooks))
        assert not blocked & message_ids(driver.core.log.events)

Handlers run synchronously here: they may ``await asyncio.sleep(0)`` but must
not wait for anything else (use the asyncio `Agent` for that). Each example runs the
real core, whose speed depends on the machine: the settings above (no deadline, no
``too_slow`` health check) keep a busy machine from failing the test. This module
imports Hypothesis, an optional dependency: install the ``testing`` extra,
``pip install 'turnstile-agent[testing]'`` (importing it without Hypothesis
raises an ImportError that says so). The library itself never imports it.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias, TypeVar

try:
    from hypothesis import strategies as st
except ImportError as missing:  # the library itself never needs Hypothesis
    raise ImportError(
        "machine.checking.testing needs Hypothesis, which is an optional dependency: install it with "
        "pip install 'turnstile-agent[testing]'", name=missing.name) from missing

from machine.checking.scripted import (
    HOLD,
    Answer,
    Driver,
    Reply,
    ScriptedEnvironment,
    _Hold,
    calls_reply,
    model_failure,
    ok_result,
    text_reply,
)
from machine.checking.strategies import (
    blocks,
    cancel_causes,
    chunks,
    error_infos,
    events,
    invalid_user_messages,
    json_values,
    live_events,
    llm_failures,
    messages,
    prompt_decisions,
    send_options,
    sources,
    tool_results,
    user_messages,
)
from machine.core import AgentCore, CoreConfig
from machine.errors import TurnstileError
from machine.events import Event
from machine.io import (
    MODEL,
    PRESETS,
    PROMPT_SUBMIT,
    REQUEST,
    REQUEST_ERROR,
    STEP_HOOK,
    SYSTEM_PROMPT,
    TOOL_EXECUTE,
    TOOL_FINALIZE,
    TOOL_PREPARE,
    TURN_STOPPING,
    Cancel,
    Chunk,
    Control,
    Dispose,
    Effect,
    End,
    Input,
    Output,
    Raise,
    Resolve,
    Send,
)
from machine.jsonvalue import FrozenDict, thaw
from machine.runtime.environment import Environment, SystemPrompt, perform
from machine.runtime.failures import error_info
from machine.runtime.hooks import Hooks, JsonValue
from machine.runtime.retry import RetryPolicy
from machine.runtime.signal import Signal
from machine.runtime.sink import InMemorySink, SessionSink
from machine.runtime.tools import Tool, ToolRegistry
from machine.vocabulary import CancelCause, ErrorInfo, SendOptions

__all__ = [
    "HOLD", "Deliver", "Driver", "HooksEnvironment", "Interleaving", "Issue", "Respond",
    "ScriptedEnvironment", "blocks", "calls_reply", "cancel_causes", "chunks", "environment",
    "error_infos", "events", "interleavings", "invalid_user_messages", "json_values",
    "live_events", "llm_failures", "message_ids", "messages", "model_failure", "model_replies",
    "ok_result", "prompt_decisions", "run_sync", "send_options", "sources",
    "text_reply", "tool_results", "user_messages",
]

T = TypeVar("T")

# --------------------------------------------------------------------------
# Running runtime handlers synchronously
# --------------------------------------------------------------------------


def run_sync(awaitable: Awaitable[T]) -> T:
    """Run *awaitable* to completion without an event loop. It may yield control
    (``await asyncio.sleep(0)``) but not wait for a future: that raises `RuntimeError`."""
    steps: Generator[object, None, T] = awaitable.__await__()
    for _ in range(10_000):
        try:
            yielded = steps.send(None)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        if yielded is not None:
            steps.close()
            raise RuntimeError("a handler run by machine.checking.testing waited for a future; handlers "
                               "must complete without waiting (use the asyncio Agent instead)")
    steps.close()
    raise RuntimeError("a handler run by machine.checking.testing did not complete")


class HooksEnvironment(ScriptedEnvironment):
    """A `ScriptedEnvironment` whose prompt-submit, step, system-prompt, request,
    request-error, turn-stopping, tool and flush effects are answered by the asyncio
    runtime's handlers (`machine.runtime.environment.perform`), run synchronously. The
    model is answered from ``replies`` as usual. Handlers receive a `Signal` that is
    aborted when the driver delivers the core's ``abort`` for it (``attach``)."""

    def __init__(self, *, hooks: Hooks | None = None, tools: Iterable[Tool] | ToolRegistry = (),
                 system: JsonValue | SystemPrompt = None, sink: SessionSink | None = None,
                 replies: Iterable[Reply] = (), retry_policy: RetryPolicy | None = None,
                 store: SessionSink | None = None) -> None:
        super().__init__(replies=list(replies))
        if store is not None:           # the deprecated spelling of sink=
            warnings.warn("environment(store=...) is deprecated: pass sink=...",
                          DeprecationWarning, stacklevel=2)
            sink = sink if sink is not None else store
        self.environment = Environment(
            hooks=hooks if hooks is not None else Hooks(),
            tools=tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools),
            system=system, sink=sink if sink is not None else InMemorySink(), preparer=None,
            retry_policy=retry_policy if retry_policy is not None else RetryPolicy())
        self.signals: dict[int, Signal] = {}

    @property
    def hooks(self) -> Hooks:
        return self.environment.hooks

    @property
    def tools(self) -> ToolRegistry:
        return self.environment.tools

    @property
    def sink(self) -> SessionSink:
        return self.environment.sink

    def attach(self, driver: Driver) -> None:
        """Abort the handlers' signals as the driver delivers ``abort`` outputs."""
        driver.on(self._observe)

    def _observe(self, output: Output) -> None:
        if isinstance(output, Control) and output.kind == "abort":
            signal_id = output.payload["signal"]
            assert isinstance(signal_id, int)
            reason = CancelCause.from_json(output.payload["reason"], allow_disposed=True)
            self._signal(signal_id)._abort(reason)

    def _signal(self, signal_id: int) -> Signal:
        if signal_id not in self.signals:
            self.signals[signal_id] = Signal(signal_id)
        return self.signals[signal_id]

    def default(self, effect: Effect) -> Answer | Reply | _Hold:
        if effect.kind == MODEL or effect.kind not in _PERFORMED:
            return super().default(effect)
        signal_id = effect.payload.get("signal")
        signal = self._signal(signal_id) if isinstance(signal_id, int) else None
        try:
            value = run_sync(perform(self.environment, effect, signal))
        except Exception as exc:
            return ("raise", error_info(exc))
        return ("resolve", value)


_PERFORMED = frozenset({PROMPT_SUBMIT, STEP_HOOK, SYSTEM_PROMPT, REQUEST, REQUEST_ERROR,
                        TURN_STOPPING, TOOL_PREPARE, TOOL_EXECUTE, TOOL_FINALIZE, "flush"})


def environment(*, hooks: Hooks | None = None, tools: Iterable[Tool] | ToolRegistry = (),
                system: JsonValue | SystemPrompt = None, sink: SessionSink | None = None,
                replies: Iterable[Reply] = (), retry_policy: RetryPolicy | None = None
                ) -> HooksEnvironment:
    """A scripted environment answered by runtime handlers (see `HooksEnvironment`);
    request-error handlers get *retry_policy* (default ``RetryPolicy()``)."""
    return HooksEnvironment(hooks=hooks, tools=tools, system=system, sink=sink,
                            replies=replies, retry_policy=retry_policy)


# --------------------------------------------------------------------------
# Interleavings
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Issue:
    """Issue a command now (at the current observer position)."""

    command: Input

    def __repr__(self) -> str:
        return f"Issue({self.command.to_json()})"


@dataclass(frozen=True, slots=True)
class Deliver:
    """Pull and deliver up to *count* outputs (observers run), without answering effects."""

    count: int


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer one pending effect through the environment: the *pick*-th pending one
    (modulo their number; 0 is the oldest). Nothing happens if none is pending."""

    pick: int = 0


Action: TypeAlias = Issue | Deliver | Respond


class InterleavingDriver(Driver):
    """A `Driver` that can also deliver some outputs and answer a chosen pending effect, and
    records the inputs it applies with their positions (`script`)."""

    refused: list[tuple[Input, TurnstileError]]
    #: (outputs pulled before it, whether a pull had just returned None, the input)
    applied: list[tuple[int, bool, Input]]
    #: a pull returned None since the last input: the core has advanced as far as it can (P6)
    drained: bool = False

    def _record(self, item: Input) -> None:
        self.applied.append((len(self.outputs), self.drained, item))
        self.drained = False

    def feed(self, item: Input) -> None:
        """Apply a command (or completion) now, recording it."""
        self._record(item)
        self.core.feed(item)

    def pump(self) -> None:
        super().pump()
        self.drained = True

    def _apply(self, effect: Effect, answer: Answer | Reply) -> None:
        if effect.kind == MODEL and isinstance(answer, ErrorInfo):
            self._record(Raise(effect.id, answer))
        elif effect.kind == MODEL:
            assert not isinstance(answer, ErrorInfo)
            for chunk in answer:
                self._record(Chunk(effect.id, chunk))
            self._record(End(effect.id))
        else:
            assert isinstance(answer, tuple)
            verb, value = answer
            self._record(Raise(effect.id, value) if verb == "raise" else Resolve(effect.id, value))
        super()._apply(effect, answer)

    def script(self) -> dict[str, JsonValue]:
        """The applied inputs as a script for ``turnstile run`` (specs/scripts.md): each input
        is placed at its exact position: ``when: {"pulled": N}`` (N outputs pulled before it;
        ``"here"`` for an input right after another at the same position),
        with ``"drained": true`` when a pull had just returned None (P6: that pull let the
        core consume buffered completions, so it is part of the position)."""
        config = self.core.config
        inputs: list[JsonValue] = []
        last: int | None = None
        for position, drained, item in self.applied:
            entry = dict(item.to_json())
            if position == last and not drained:
                entry["when"] = "here"          # issued right after the input before it
            else:
                entry["when"] = ({"pulled": position, "drained": True} if drained
                                 else {"pulled": position})
            last = position
            inputs.append(entry)
        return {"version": 1, "config": {
            "requestOptions": thaw(FrozenDict(config.request_options)), "toolModes": dict(config.tool_modes),
            "maxParallelToolCalls": config.max_parallel_tool_calls,
            "sessionStart": config.session_start, "publish": config.publish}, "inputs": inputs}

    def deliver(self, count: int) -> None:
        for _ in range(count):
            output = self.core.next_output()
            if output is None:
                self.drained = True
                return
            self.drained = False
            self._deliver(output)

    def respond(self, pick: int) -> None:
        while self.pending:
            effect = self.pending[pick % len(self.pending)]
            self.pending.remove(effect)
            answer = self.env.answer(effect)
            if isinstance(answer, _Hold):
                self.held.append(effect)
                continue
            self._apply(effect, answer)
            return


@dataclass(frozen=True)
class Interleaving:
    """One run as data: actions, and the model's replies in request order."""

    actions: tuple[Action, ...]
    replies: tuple[Reply, ...] = ()
    config: CoreConfig = field(default_factory=lambda: CoreConfig(
        request_options={"provider": "test", "model": "test-model"}))

    def run(self, env: ScriptedEnvironment | None = None, *,
            setup: Callable[[InterleavingDriver], object] | None = None,
            settle: bool = True) -> InterleavingDriver:
        """Apply the actions to a fresh core through *env* (default: a plain
        `ScriptedEnvironment`); the interleaving's replies are used when *env* has none.
        *setup* can register observers first. With *settle*, every output is then
        delivered and every pending effect answered. A command the core refuses (after a
        ``dispose``) is recorded in ``refused``."""
        env = env if env is not None else ScriptedEnvironment()
        if not env.replies:
            env.replies = list(self.replies)
        driver = InterleavingDriver(AgentCore(self.config, clock=itertools.count().__next__), env)
        driver.refused = []
        driver.applied = []
        if isinstance(env, HooksEnvironment):
            env.attach(driver)
        if setup is not None:
            setup(driver)
        for action in self.actions:
            if isinstance(action, Deliver):
                driver.deliver(action.count)
            elif isinstance(action, Respond):
                driver.respond(action.pick)
            else:
                try:
                    driver.feed(action.command)
                except TurnstileError as error:
                    driver.refused.append((action.command, error))
        if settle:
            driver.run()
        return driver

    def inputs(self) -> list[dict[str, JsonValue]]:
        """The commands as JSON inputs (rule P9), for reading a failing example."""
        return [a.command.to_json() for a in self.actions if isinstance(a, Issue)]


@st.composite
def model_replies(draw: st.DrawFn, tools: Sequence[str] = ("echo",), *,
                  calls: st.SearchStrategy[int] | None = None) -> Reply:
    """One model reply: text, tool calls (fresh ids ``call-N``) to *tools*, max-tokens, an
    error finish, or a raised model failure."""
    kind = draw(st.sampled_from(["text", "text", "calls", "max-tokens", "error", "failure"]
                                if tools else ["text", "max-tokens", "error", "failure"]))
    if kind == "calls":
        count = draw(calls if calls is not None else st.integers(min_value=1, max_value=3))
        names = [draw(st.sampled_from(list(tools))) for _ in range(count)]
        return calls_reply(*((f"call-{index}", name) for index, name in enumerate(names, 1)))
    if kind == "max-tokens":
        return [{"type": "text", "text": "trunc"}, {"type": "finish", "kind": "max-tokens"}]
    if kind == "error":
        return [{"type": "finish", "kind": "error",
                 "failure": {"message": "overloaded", "code": "OVERLOADED", "status": 529}}]
    if kind == "failure":
        return model_failure("model unavailable", "UNAVAILABLE")
    return text_reply(draw(st.sampled_from(["ok", "hello", "done"])))

Command: TypeAlias = Literal["followup", "steer", "inject", "send", "cancel", "dispose"]
DEFAULT_COMMANDS: tuple[Command, ...] = ("followup", "steer", "inject", "send", "cancel")


@st.composite
def interleavings(draw: st.DrawFn, *, texts: st.SearchStrategy[str] | None = None,
                  commands: Sequence[Command] = DEFAULT_COMMANDS,
                  tools: Sequence[str] = ("echo",), max_actions: int = 24,
                  max_replies: int = 6,
                  config: CoreConfig | None = None) -> Interleaving:
    """A whole interleaving of commands, partial deliveries and effect answers.

    *texts* draws message texts (default: short text); each message gets a fresh id
    ``m1``, ``m2``, ... *commands* names the commands to draw from; *tools* are the tool
    names model replies call (they are parallel-safe in the default *config* when the
    name starts with ``p``)."""
    text = texts if texts is not None else st.sampled_from(
        ["hi", "do the thing", "status?", "secret plan", "more"])
    counter = itertools.count(1)

    def message() -> dict[str, JsonValue]:
        return {"id": f"m{next(counter)}", "role": "user",
                "content": [{"type": "text", "text": draw(text)}],
                "source": draw(st.sampled_from([{"kind": "user"},
                                                {"kind": "plugin", "plugin": "p"}]))}

    actions: list[Action] = []
    for _ in range(draw(st.integers(min_value=1, max_value=max_actions))):
        kind = draw(st.sampled_from(["command", "deliver", "respond"]))
        if kind == "deliver":
            actions.append(Deliver(draw(st.integers(min_value=1, max_value=6))))
        elif kind == "respond":
            actions.append(Respond(draw(st.integers(min_value=0, max_value=3))))
        else:
            name = draw(st.sampled_from(list(commands)))
            if name == "cancel":
                cause = draw(st.sampled_from(["user", "parent"]))
                actions.append(Issue(Cancel({"kind": cause}, draw(st.booleans()))))
            elif name == "dispose":
                actions.append(Issue(Dispose()))
            elif name == "send":
                options = draw(send_options())
                actions.append(Issue(Send(message(), SendOptions.to_json(options))))
            else:
                actions.append(Issue(Send(message(), PRESETS[name], preset=name)))
    replies = tuple(_renumbered(draw(st.lists(model_replies(tools), max_size=max_replies))))
    if config is None:
        config = CoreConfig(request_options={"provider": "test", "model": "test-model"},
                            tool_modes={name: "parallel" if name.startswith("p") else "exclusive"
                                        for name in tools}, max_parallel_tool_calls=2)
    return Interleaving(tuple(actions), replies, config)


def _renumbered(replies: list[Reply]) -> Iterable[Reply]:
    """Give every tool call of the run a distinct id (``call-1``, ``call-2``, ...)."""
    counter = itertools.count(1)
    for reply in replies:
        if isinstance(reply, ErrorInfo):
            yield reply
            continue
        out: list[JsonValue] = []
        for chunk in reply:
            if isinstance(chunk, dict) and chunk.get("type") == "tool-call":
                chunk = {**chunk, "id": f"call-{next(counter)}"}
            out.append(chunk)
        yield out


def message_ids(events: Iterable[Event]) -> set[str]:
    """Ids of every message recorded in *events* (user, steering, assistant, tool result)."""
    ids: set[str] = set()
    for event in events:
        data = event.data
        inner = data.get("message")
        record = inner if isinstance(inner, FrozenDict) else data
        message_id = record.get("id")
        if isinstance(message_id, str) and record.get("role") is not None:
            ids.add(message_id)
    return ids

