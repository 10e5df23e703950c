"""The asyncio `Agent`: a reference runtime over the sans-I/O core (specs/runtime.md).

The agent owns one `AgentCore` and runs a *pump*: it pulls the core's outputs
one at a time and delivers each one synchronously, before pulling the next:

* a durable event is appended to the session sink, then given to the
  listeners of its type and of ``'*'`` / ``'session/event'``;
* a live notification is given to the listeners of its type
  (``agent/warning`` is also logged at WARNING on the ``turnstile`` logger);
* an effect starts its work (a hook chain, the model stream, a tool stage,
  the sink's flush) as an asyncio task, or answers at once when none of the
  user's code would run; a ``tick`` resolves on the next pass of the event loop;
* ``abort`` aborts the effect's `Signal` (its listeners run right there);
  ``release`` cancels the pending read of the model stream and closes it.

Listeners run synchronously at the output they observe, and a command they
issue takes effect at exactly that point: it changes the core's state at
once and only queues outputs, which the running pump delivers next. A
command issued from outside any delivery (user code, a hook, a tool body)
delivers its own outputs before it returns. Work finished by a task enters
the core on the next pass of the event loop, in the order it finished, and
the loop resumes from there (rules RT1-RT7).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, TypeVar, cast, overload

from machine import events as ev
from machine.core import AgentCore, CoreConfig
from machine.core.tools import plan_arguments
from machine.errors import DisposedError, ProtocolError, ValidationError
from machine.events import Event, LiveEvent
from machine.io import (
    MODEL,
    PROMPT_SUBMIT,
    TICK,
    Append,
    Control,
    Dispose,
    Durable,
    Effect,
    Input,
    Live,
    Output,
    Send,
)
from machine.jsonvalue import FrozenDict, snapshot, thaw
from machine.log import SessionLog
from machine.runtime.approvals import (
    APPROVAL_DECISION,
    APPROVAL_REQUEST,
    Approval,
    ApprovalError,
    Approvals,
    Decision,
    decision_data,
    pending_in,
    request_data,
)
from machine.runtime.control import Limits, RunControl
from machine.runtime.environment import Environment, Immediate, SystemPrompt, Work
from machine.runtime.failures import CANCELLED, EXITS, AgentTimeoutError, error_info
from machine.runtime.fates import _DURABLE, _LIVE, FateLedger, MessageFate
from machine.runtime.hooks import Hooks, JsonValue, Unsubscribe
from machine.runtime.model import (
    Chunk,
    ModelAdapter,
    ModelCall,
    RequestPreparer,
    StructuredOutput,
)
from machine.runtime.retry import RetryPolicy
from machine.runtime.run import RunResult, RunStream, Sent, _RunTracker, result_of
from machine.runtime.signal import Signal
from machine.runtime.sink import InMemorySink, PersistentSession, SessionSink
from machine.runtime.tools import Tool, ToolArgumentError, ToolCall, ToolRegistry, result_json
from machine.store.errors import SessionNotFoundError, UnreadableSessionError
from machine.store.resume import check_readable
from machine.store.types import LoadMode, LoadReport, SessionStore
from machine.vocabulary import (
    DISPOSED_CAUSE,
    CancelCause,
    ErrorInfo,
    Message,
    SendOptions,
    Target,
    ToolResult,
    user_message,
)

if TYPE_CHECKING:
    from machine.runtime.typed import OutputSpec

__all__ = ["ALL_EVENTS", "Agent", "DurableEventType", "LiveEventType", "MessageLike",
           "OutputMode", "SystemPrompt"]

OutputT = TypeVar("OutputT")
#: How a run's structured output reaches the model (RT23): the provider's native structured
#: output when the adapter has it, else a final-answer tool (``auto``), or one of them.
OutputMode: TypeAlias = Literal["auto", "native", "tool"]

LOGGER: Final = logging.getLogger("turnstile")

#: Listener types that receive every durable event.
ALL_EVENTS: Final = frozenset({"*", "session/event"})

DurableEventType: TypeAlias = Literal[
    "turn/start", "turn/end", "step/start", "step/end", "user/message", "steering/message",
    "assistant/chunk", "assistant/message", "tool/call", "tool/result", "todo/write",
    "request/header", "approval/request", "approval/decision", "*", "session/event"]
LiveEventType: TypeAlias = Literal[
    "agent/status", "agent/inbox/enqueue", "agent/inbox/dequeue", "agent/inbox/discard",
    "agent/context/discard", "agent/cancel-requested", "agent/settled", "agent/error",
    "agent/warning", "agent/session-start", "agent/created", "agent/disposed",
    "session/created", "session/disposed"]

#: A message argument: a `Message`, its JSON form, or a string (a user text message whose id
#: the agent mints: ``user-1``, ``user-2``, ...).
MessageLike: TypeAlias = "Message | Mapping[str, JsonValue] | str"
CauseLike: TypeAlias = "Literal['user', 'parent'] | CancelCause | Mapping[str, JsonValue]"

#: Finished work waiting for the next pass: the core's completion method and its arguments.
_Completion: TypeAlias = tuple[Callable[..., None], int, object]
E = TypeVar("E", Event, LiveEvent)
#: What a delivery of one output type goes through: the agent's own watcher (or None), then
#: the listeners.
_Route: TypeAlias = "tuple[Callable[[E], object] | None, tuple[_Subscription, ...]]"
#: How many decided fates the agent keeps queryable by message id (RT26).
FATE_HISTORY: Final = 1_000
#: The source of the messages that hand a resumed approval's outcome to the model (RT25).
APPROVAL_SOURCE: Final = {"kind": "plugin", "plugin": "approvals"}


@dataclass(eq=False, slots=True)
class _Subscription:
    type: str | None                           # None: every output (observe)
    listener: Callable[..., object]
    active: bool = True


def _int(payload: FrozenDict, key: str) -> int:
    value = payload.get(key)
    assert isinstance(value, int), f"effect payload {key!r} is not an int"
    return value


def _describe(output: Output) -> str:
    if isinstance(output, Durable):
        return f"{output.event.type} (seq {output.event.seq})"
    if isinstance(output, Live):
        return output.event.type
    if isinstance(output, Effect):
        return f"effect {output.id} ({output.kind})"
    return output.kind


def _describe_effect(effect: Effect) -> str:
    name = effect.payload.get("name")
    return f"{effect.kind} {effect.id}" + (f" ({name})" if isinstance(name, str) else "")


class Agent:
    """An asyncio agent over `AgentCore`. See the module docstring and specs/runtime.md.

    Create it inside a running event loop (or at least use it there), register
    listeners and hooks, then send messages::

        async with Agent(ScriptedModel([text_reply("hello")])) as agent:
            agent.on("turn/end", lambda event: print(event.data["reason"]))
            agent.followup("hi")
            await agent.when_idle()

    ``sink`` is where the session is written (default: `InMemorySink`); `Agent.resume`
    opens an agent on a stored session instead. ``retry_policy`` is handed to request-error
    handlers (default: the model adapter's ``retry_policy``, else ``RetryPolicy()``).
    """

    def __init__(self, model: ModelAdapter, *, tools: Iterable[Tool] | ToolRegistry = (),
                 hooks: Hooks | None = None, system: JsonValue | SystemPrompt = None,
                 request_options: Mapping[str, JsonValue] | None = None,
                 max_parallel_tool_calls: int = 10, sink: SessionSink | None = None,
                 session: SessionLog | None = None,
                 session_start: Literal["startup", "resume"] = "startup", publish: bool = True,
                 clock: Callable[[], float] | None = None,
                 retry_policy: RetryPolicy | None = None, limits: Limits | None = None) -> None:
        self._model = model
        if limits is not None and not isinstance(limits, Limits):
            raise TypeError(f"limits must be a Limits, not {type(limits).__name__}")
        #: The limits of every turn (RT24); a run's own limits override them field by field.
        self.limits = limits
        registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        if retry_policy is None:
            offered = getattr(model, "retry_policy", None)
            retry_policy = offered if isinstance(offered, RetryPolicy) else RetryPolicy()
        elif not isinstance(retry_policy, RetryPolicy):
            raise TypeError(f"retry_policy must be a RetryPolicy, not {type(retry_policy).__name__}")
        # Why decided here: the model never changes for an agent's life, and a check against a
        # runtime-checkable Protocol costs about 13 µs (it was paid for every effect).
        preparer = model if isinstance(model, RequestPreparer) else None
        self._env = Environment(hooks=hooks if hooks is not None else Hooks(), tools=registry,
                                system=system,
                                sink=sink if sink is not None else InMemorySink(),
                                preparer=preparer, retry_policy=retry_policy)
        seed: dict[str, JsonValue] = {}
        defaults = getattr(model, "default_config", None)
        if isinstance(defaults, Mapping):
            seed.update(defaults)
        seed.update(request_options or {})
        config = CoreConfig(request_options=seed, tool_modes=registry.modes(),
                            max_parallel_tool_calls=max_parallel_tool_calls,
                            session_start=session_start, publish=publish)
        self._core = core = AgentCore(config, log=session, clock=clock)
        self._next_output = core.output_puller()
        self._completers: dict[str, Callable[..., None]] = {
            "resolve": core.resolve, "raise": core.fail, "chunk": core.chunk,
            "end": lambda effect_id, _none: core.end(effect_id)}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._subs: list[_Subscription] = []
        #: The listeners of each durable and live type, and the observers (effects and
        #: controls), computed on first use and forgotten at every (un)subscription, so each
        #: delivery walks only the listeners it calls.
        #: Each entry also holds the agent's own watcher of that type (the fate ledger's,
        #: runs', limits', approvals'), so a delivery makes one look-up for both.
        self._durable_routes: dict[str, _Route[Event]] = {}
        self._live_routes: dict[str, _Route[LiveEvent]] = {}
        self._observers: tuple[_Subscription, ...] | None = None
        self._signals: dict[int, Signal] = {}
        self._ready: deque[_Completion] = deque()
        self._scheduled = False
        self._delivering = False
        self._exit: BaseException | None = None      # a KeyboardInterrupt/SystemExit to re-raise
        self._tasks: set[asyncio.Task[None]] = set()
        self._model_tasks: dict[int, asyncio.Task[None]] = {}
        self._released: set[int] = set()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._dispose_waiters: list[asyncio.Future[None]] = []
        self._sink_closed = False
        self._closers: list[Callable[[], Awaitable[object]]] = []
        self._append = self._env.sink.append      # the sink is fixed for the agent's life
        self._minted = 0
        #: Every accepted message's fate, read off the outputs (RT26), and the runs (RT21):
        #: those not ended yet, and the one whose chain is running.
        self._ledger = ledger = FateLedger(core, keep=FATE_HISTORY, entry_type=Sent)
        self._trackers: set[_RunTracker[Any]] = set()
        self._chain: _RunTracker[Any] | None = None
        self._durable_watch: dict[str, Callable[[Event], object]] = {
            type_: handler.__get__(ledger) for type_, handler in _DURABLE.items()}
        self._durable_watch[ev.TURN_START] = self._turn_started
        self._live_watch: dict[str, Callable[[LiveEvent], None]] = {
            type_: handler.__get__(ledger) for type_, handler in _LIVE.items()}
        self._live_watch[ev.SETTLED] = self._settled
        self._live_watch[ev.AGENT_DISPOSED] = self._torn_down
        self._live_watch[ev.ERROR] = self._agent_error
        #: Approvals (RT25): the book, the tools that ask for them, what a resumed session
        #: left pending (offered again at the first pump), the turn's signal for policies.
        self._approvals = Approvals(self._cancel_approval)
        self._gated = any(item.requires_approval for item in registry) or bool(
            registry.fallback is not None and registry.fallback.requires_approval)
        self._env.approvals = self._approvals if self._gated else None
        self._durable_watch[APPROVAL_REQUEST] = self._approval_written
        self._durable_watch[APPROVAL_DECISION] = self._approval_written
        if self._gated:
            self._durable_watch[ev.TOOL_RESULT] = self._tool_result
            self._durable_watch[ev.TURN_END] = self._turn_ended
            self._durable_watch[ev.ASSISTANT_MESSAGE] = self._assistant_message
        self._reoffer = pending_in(session.events) if session is not None else []
        for approval in self._reoffer:
            self._approvals.asked(approval, None)
        self._turn_signal: Signal | None = None
        self._resumed_signal = Signal(0)          # what a resumed approval's tool runs under
        self._approval_tasks: set[asyncio.Task[None]] = set()
        #: What `resume` found when it loaded the session (None: not resumed from a store).
        self.load_report: LoadReport | None = None
        #: How a tick is resolved: by default on the next pass of the event loop.
        self._on_tick: Callable[[int], None] = self._resolve_tick_soon

    @classmethod
    def resume(cls, store: SessionStore, session_id: str, model: ModelAdapter, *,
               mode: LoadMode = "strict", create: bool = False,
               tools: Iterable[Tool] | ToolRegistry = (), hooks: Hooks | None = None,
               system: JsonValue | SystemPrompt = None,
               request_options: Mapping[str, JsonValue] | None = None,
               max_parallel_tool_calls: int = 10, publish: bool = True,
               clock: Callable[[], float] | None = None,
               retry_policy: RetryPolicy | None = None, reads: Iterable[str] = (),
               limits: Limits | None = None) -> Agent:
        """An agent that continues the stored session *session_id* of *store* (RT17).

        The session is loaded in *mode* (``strict`` raises `DamageError` on damage;
        ``salvage`` keeps the intact prefix), so it is crash-repaired (S12) and open in the
        store; the agent's log is seeded with it (turn numbering and seqs continue, the first
        request logs ``request/header {reason:'resume'}``) and the agent writes into it
        (`PersistentSession`, released after the agent's teardown). What the load found is
        ``agent.load_report``; damage and repair are also logged at WARNING. With *create*, a
        session that does not exist yet is created instead (``load_report`` is then None).
        A session holding an event whose type is neither the core's nor in *reads* (the
        extension types the application reads), unless marked ignorable, is released again
        and refused with `UnreadableSessionError` (D16). The other options are the
        constructor's."""
        report: LoadReport | None = None
        log: SessionLog | None = None
        try:
            result = store.load(session_id, mode)
        except SessionNotFoundError:
            if not create:
                raise
            store.create(session_id)
        else:
            try:                    # the runtime reads its approval events (RT25)
                check_readable(session_id, result.events,
                               (*reads, APPROVAL_REQUEST, APPROVAL_DECISION))
            except UnreadableSessionError:
                store.release(session_id)
                raise
            report = result.report
            log = SessionLog(result.events, clock=clock)
            if not report.clean:
                LOGGER.warning("session %s resumed after repair: %s", session_id,
                               _report_text(report))
        agent = cls(model, tools=tools, hooks=hooks, system=system,
                    request_options=request_options,
                    max_parallel_tool_calls=max_parallel_tool_calls,
                    sink=PersistentSession(store, session_id, release=True), session=log,
                    session_start="startup" if log is None else "resume", publish=publish,
                    clock=clock, retry_policy=retry_policy, limits=limits)
        agent.load_report = report
        return agent

    # ------------------------------------------------------------------
    # State
    # ------------------------------------------------------------------

    @property
    def core(self) -> AgentCore:
        """The underlying sans-I/O core (read its state; do not feed it directly)."""
        return self._core

    @property
    def session(self) -> SessionLog:
        """The session log (every durable event so far)."""
        return self._core.log

    @property
    def model(self) -> ModelAdapter:
        """The model adapter (fixed for the agent's life)."""
        return self._model

    @property
    def tools(self) -> ToolRegistry:
        """The tools (fixed: the core was configured with their modes)."""
        return self._env.tools

    @property
    def hooks(self) -> Hooks:
        """The extension points; register handlers with ``agent.hooks.<point>.use(...)``."""
        return self._env.hooks

    @hooks.setter
    def hooks(self, hooks: Hooks) -> None:
        self._env.hooks = hooks

    @property
    def system(self) -> JsonValue | SystemPrompt:
        """The system prompt: a JSON value or an async function of a `StepContext`."""
        return self._env.system

    @system.setter
    def system(self, system: JsonValue | SystemPrompt) -> None:
        self._env.system = system

    @property
    def sink(self) -> SessionSink:
        """Where the session is written (RT12)."""
        return self._env.sink

    @property
    def retry_policy(self) -> RetryPolicy:
        """The policy request-error handlers receive (RT16)."""
        return self._env.retry_policy

    @property
    def status(self) -> Literal["idle", "running"]:
        return self._core.status

    @property
    def accepts_next_step(self) -> bool:
        """Whether the next-step acceptance window is open (steer/inject are staged)."""
        return self._core.accepts_next_step

    @property
    def disposed(self) -> bool:
        return self._core.disposed

    # ------------------------------------------------------------------
    # Commands (never block; each has fully taken effect when it returns)
    # ------------------------------------------------------------------

    def send(self, message: MessageLike, *, target: Target, wakeup: bool) -> Sent:
        """Route *message* (reference §5): ``target`` ``next-turn`` or ``next-step``.
        Returns the accepted message's `Sent` (its id and fate, RT26)."""
        self._bind()
        given = self._message(message)
        window, seq = self._core.accepts_next_step, len(self._core.log)
        self._core.send(given, {"target": target, "wakeup": wakeup})
        return self._accepted(given, SendOptions(target, wakeup), window, seq)

    # Each command tells the fate ledger of the acceptance (RT26; the core accepted it if
    # it returned), then delivers the command's outputs.

    def followup(self, message: MessageLike) -> Sent:
        """``send(target='next-turn', wakeup=True)``: a prompt of its own turn."""
        self._bind()
        given = self._message(message)
        self._core.followup(given)
        sent = self._ledger.accept_prompt(_message_id(given))
        if not self._delivering:
            self._pump(feed=False)
        return cast(Sent, sent)              # the ledger makes its records as `Sent`s

    def steer(self, message: MessageLike) -> Sent:
        """``send(target='next-step', wakeup=True)``: steering if the window is open, else a
        queued prompt."""
        self._bind()
        given = self._message(message)
        window = self._core.accepts_next_step
        self._core.steer(given)
        sent = self._ledger.accept_steer(_message_id(given), window)
        if not self._delivering:
            self._pump(feed=False)
        return cast(Sent, sent)              # the ledger makes its records as `Sent`s

    def inject(self, message: MessageLike) -> Sent:
        """``send(target='next-step', wakeup=False)``: staged context if the window is open,
        else appended at once (no turn)."""
        self._bind()
        given = self._message(message)
        core = self._core
        window = core.accepts_next_step
        seq = None if window else len(core.log)     # where it is appended, window closed
        core.inject(given)
        sent = self._ledger.accept_inject(_message_id(given), window, seq)
        if not self._delivering:
            self._pump(feed=False)
        return cast(Sent, sent)              # the ledger makes its records as `Sent`s

    def _accepted(self, message: Message | Mapping[str, JsonValue], options: SendOptions,
                  window: bool, seq: int) -> Sent:
        """The core accepted *message* (routed against *window*; an inject with the window
        closed appended it at *seq*): its fate is followed from here (RT26), then its
        outputs are delivered."""
        sent = self._ledger.accept(_message_id(message), options, window, seq)
        self._commanded()
        return cast(Sent, sent)              # the ledger makes its records as `Sent`s

    def cancel(self, cause: CauseLike = "user", keep_inbox: bool = False) -> None:
        """Cancel the current activity (and, unless *keep_inbox*, what is pending).

        It has taken effect when it returns; the work it aborted ends when that work honours
        its signal. To bound the wait for that, ``await agent.when_idle(timeout=...)``."""
        self._bind()
        if isinstance(cause, str):
            cause = {"kind": cause}
        self._core.cancel(cause, keep_inbox)
        self._commanded()

    def append(self, type: str, data: Mapping[str, JsonValue], *,
               surface_op: JsonValue = None, source_event_seqs: Iterable[int] | None = None,
               ignorable: bool = False) -> Event:
        """A direct append by extension code: checked, committed and delivered in order.
        With *ignorable*, a build that does not read this extension type may still resume the
        session (D16; by default a session holding it is refused on resume)."""
        self._bind()
        event = self._core.append(type, data, surface_op=surface_op,
                                  source_event_seqs=None if source_event_seqs is None
                                  else list(source_event_seqs), ignorable=ignorable)
        self._ledger.direct_append(event.seq)
        self._commanded()
        return event

    def _feed(self, item: Input) -> None:
        """Apply a command given as data (rule P9), exactly as the command methods do."""
        self._bind()
        core = self._core
        window, seq = core.accepts_next_step, len(core.log)
        if isinstance(item, Dispose):
            self._ledger.dispose_requested()
        core.feed(item)
        if isinstance(item, Send):
            message = Message.from_json(snapshot(item.message))
            self._ledger.accept(message.id, SendOptions.from_json(snapshot(item.options)),
                                window, seq)
        elif isinstance(item, Append):
            self._ledger.direct_append(seq)
        self._commanded()

    def dispose(self, *, timeout: float | None = None) -> Awaitable[None]:
        """Dispose now (``cancel({kind:'disposed'})``); await the result for teardown
        (``agent/disposed``, ``session/disposed``). Idempotent.

        With *timeout* (seconds), work still running after that long — work that ignores
        its signal — is cancelled (asyncio cancellation: its effect fails with
        ``CANCELLED``) so that teardown can complete; if it still has not after another
        *timeout*, the awaitable raises `AgentTimeoutError` and the agent stays disposing
        (RT19)."""
        loop = self._bind()
        _check_timeout(timeout)
        if self._core.disposed and not self._dispose_waiters:
            done: asyncio.Future[None] = loop.create_future()
            done.set_result(None)
            return done
        waiter: asyncio.Future[None] = loop.create_future()
        self._dispose_waiters.append(waiter)
        self._ledger.dispose_requested()
        self._core.dispose()
        try:
            self._resumed_signal._abort(DISPOSED_CAUSE)
        except BaseException as exc:      # only an exit is raised again (Signal._abort)
            self._contain(exc, "an abort listener")
        self._commanded()
        self._settle_waiters()
        return loop.create_task(self._finish_disposal(waiter, timeout))

    def close_on_dispose(self, close: Callable[[], Awaitable[object]]) -> None:
        """Await ``close()`` once the agent is torn down, before its `dispose` awaitable
        completes (the last registered is closed first; an exception is logged at WARNING):
        for what lives as long as the agent, such as an MCP server's connection (RT28)."""
        if not callable(close):
            raise TypeError(f"close_on_dispose takes an async function, not {close!r}")
        self._closers.append(close)

    def when_idle(self, *, timeout: float | None = None) -> Awaitable[None]:
        """Completes when the agent is quiescent: not busy, no wake pending, no waking item
        queued (reference §18). Never awaited from the agent's own work (it would not end).

        With *timeout* (seconds) it raises `AgentTimeoutError`, naming the outstanding work,
        if the agent is not quiescent by then; the agent itself is not affected (RT19)."""
        loop = self._bind()
        _check_timeout(timeout)
        if not self._delivering:
            self._pump(feed=False)
        waiter: asyncio.Future[None] = loop.create_future()
        if (self._core.is_quiescent and not self._approval_tasks) or self._core.disposed:
            waiter.set_result(None)
            return waiter
        self._idle_waiters.append(waiter)
        if timeout is None:
            return waiter
        return loop.create_task(self._bounded(waiter, timeout, "when_idle"))

    async def __aenter__(self) -> Agent:
        self._bind()
        self._schedule_pump()           # publication: listeners registered now still see it
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.dispose()

    # ------------------------------------------------------------------
    # Runs (RT21) and fates (RT26)
    # ------------------------------------------------------------------

    @overload
    async def run(self, prompt: MessageLike, *, output_type: None = None,
                  output_retries: int = 2, output_name: str = "final_result",
                  output_mode: OutputMode = "auto", limits: Limits | None = None
                  ) -> RunResult[str]: ...

    @overload
    async def run(self, prompt: MessageLike, *, output_type: type[OutputT],
                  output_retries: int = 2, output_name: str = "final_result",
                  output_mode: OutputMode = "auto", limits: Limits | None = None
                  ) -> RunResult[OutputT]: ...

    async def run(self, prompt: MessageLike, *, output_type: type[Any] | None = None,
                  output_retries: int = 2, output_name: str = "final_result",
                  output_mode: OutputMode = "auto", limits: Limits | None = None
                  ) -> RunResult[Any]:
        """Send *prompt* as a follow-up and return what it came to once its run has ended:
        its turn and the retry turns of its chain, or its admission's rejection, or its
        discard (RT21). Cancelling the awaiting task does not cancel the turn
        (``agent.cancel()`` does). Never awaited from the agent's own work.

        With *output_type* (a pydantic model, a dataclass, a TypedDict or any type pydantic
        describes; the ``[typed]`` extra) the run's output is that type's validated value
        (RT23): through the provider's native structured output when the adapter has it
        (``output_mode`` ``auto`` or ``native``), else through a final-answer tool named
        *output_name* (``tool``); an invalid answer is re-asked at most *output_retries*
        times, then the turn ends ``OUTPUT_INVALID`` and ``result.output`` raises
        `OutputValidationError`.

        *limits* bound the run's turns (RT24); a field left None is the agent's."""
        tracker = self._start_run(prompt, False, output_type, output_retries, output_name,
                                  output_mode, limits)
        return await tracker.done

    @overload
    def stream(self, prompt: MessageLike, *, output_type: None = None,
               output_retries: int = 2, output_name: str = "final_result",
               output_mode: OutputMode = "auto", limits: Limits | None = None
               ) -> RunStream[str]: ...

    @overload
    def stream(self, prompt: MessageLike, *, output_type: type[OutputT],
               output_retries: int = 2, output_name: str = "final_result",
               output_mode: OutputMode = "auto", limits: Limits | None = None
               ) -> RunStream[OutputT]: ...

    def stream(self, prompt: MessageLike, *, output_type: type[Any] | None = None,
               output_retries: int = 2, output_name: str = "final_result",
               output_mode: OutputMode = "auto", limits: Limits | None = None
               ) -> RunStream[Any]:
        """Send *prompt* as a follow-up and return its `RunStream`: ``async for event in
        stream`` yields the run's durable events and the notifications delivered while it
        runs, in order, until it has ended; ``await stream.result()`` is its `RunResult`.
        The options are `run`'s."""
        return RunStream(self._start_run(prompt, True, output_type, output_retries,
                                         output_name, output_mode, limits))

    def _start_run(self, prompt: MessageLike, streaming: bool, output_type: type[Any] | None,
                   output_retries: int, output_name: str, output_mode: OutputMode,
                   limits: Limits | None) -> _RunTracker[Any]:
        self._bind()
        if limits is not None and not isinstance(limits, Limits):
            raise TypeError(f"limits must be a Limits, not {type(limits).__name__}")
        spec, native = self._output(output_type, output_retries, output_name, output_mode)
        effective = limits.over(self.limits) if limits is not None else self.limits
        entry = self.followup(prompt)
        loop = self._loop
        assert loop is not None

        def finish(tracker: _RunTracker[Any]) -> RunResult[Any]:
            self._trackers.discard(tracker)
            return result_of(tracker, structured=spec is not None)

        tracker: _RunTracker[Any] = _RunTracker(entry, loop, streaming=streaming,
                                                finish=finish)
        if spec is not None or (effective is not None and effective.any):
            tracker.control = RunControl(tracker, spec, native, output_retries, self.steer,
                                         effective)
        entry.run = tracker
        self._trackers.add(tracker)

        def decided(fate: MessageFate) -> None:
            if fate.kind != "delivered" and not tracker.turns:
                tracker.end()       # blocked, rejected or discarded: no turn ran
        entry.on_final(decided)
        return tracker

    def _output(self, output_type: type[Any] | None, retries: int, name: str,
                mode: OutputMode) -> tuple[OutputSpec[Any] | None, Mapping[str, JsonValue] | None]:
        """The run's structured output (RT23): its spec and the adapter's native options
        (None: the final-answer tool). Checked before anything is sent."""
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValidationError("output_retries", f"must be a non-negative integer, not "
                                  f"{retries!r}")
        if mode not in ("auto", "native", "tool"):
            raise ValidationError("output_mode", f"{mode!r} is not 'auto', 'native' or 'tool'")
        if output_type is None:
            return None, None
        from machine.runtime.typed import OutputSpec  # the [typed] extra
        spec = OutputSpec(output_type, name=name)
        native: Mapping[str, JsonValue] | None = None
        if mode != "tool" and isinstance(self._model, StructuredOutput):
            native = self._model.output_options(spec.schema, spec.name, spec.description)
        if mode == "native" and native is None:
            raise ValidationError("output_mode", "the model adapter takes no native structured "
                                  f"output for {output_type!r}")
        if native is None and name in self.tools:
            raise ValidationError("output_name", f"{name!r} is the name of one of the agent's "
                                  "tools: the final-answer tool needs a name of its own")
        return spec, native

    def fate(self, message_id: str) -> MessageFate | None:
        """The fate of the latest accepted message with this id (RT26): ``pending`` until
        decided; None if no such message was accepted (or it was decided long ago)."""
        return self._ledger.fate(message_id)

    def fates(self, message_id: str | None = None) -> tuple[MessageFate, ...]:
        """The fates of every remembered accepted message (with this id), oldest first."""
        return self._ledger.fates(message_id)

    def _turn_started(self, event: Event) -> None:
        ledger = self._ledger
        kind = ledger._turn_start(event)
        if kind == "retry":                     # R13.3: the chain goes on
            if self._chain is not None:
                self._chain.turn_started(event)
            if self._env.control is not None:
                self._env.control.turn_started()
            return
        if self._chain is not None:             # never expected: a chain without settled
            self._end_chain()
        admitted = ledger.admitted
        tracker = admitted.run if admitted is not None else None
        if tracker is None and self._env.control is None and (
                self.limits is None or not self.limits.any):
            return                              # no run, no limits: nothing to install
        control: RunControl | None = None
        if isinstance(tracker, _RunTracker):
            self._chain = tracker
            self._routes_changed()
            tracker.turn_started(event)
            tracker.durable(event)
            if isinstance(tracker.control, RunControl):
                control = tracker.control
        elif self.limits is not None and self.limits.any:    # RT24: every turn's limits
            control = RunControl(None, None, None, 0, self.steer, self.limits)
        if control is not self._env.control:
            self._set_control(control)
        if control is not None:
            control.turn_started()

    def _set_control(self, control: RunControl | None) -> None:
        """Install what the running chain's run adds (or nothing): the environment asks it
        at the chain's effects, and the agent hands it each assistant message's usage (the
        watcher is there only while something needs it, approvals or a control)."""
        self._env.control = control
        wanted = control is not None or self._gated
        if wanted != (ev.ASSISTANT_MESSAGE in self._durable_watch):
            if wanted:
                self._durable_watch[ev.ASSISTANT_MESSAGE] = self._assistant_message
            else:
                del self._durable_watch[ev.ASSISTANT_MESSAGE]
            self._durable_routes.pop(ev.ASSISTANT_MESSAGE, None)

    def _assistant_message(self, event: Event) -> None:
        control = self._env.control
        if control is not None:                 # RT24 counts the turn's tokens
            control.add_usage(event.data.get("usage"))
        if self._gated:
            self._ask_approvals(event)

    # ------------------------------------------------------------------
    # Approvals (RT25)
    # ------------------------------------------------------------------

    @property
    def approvals(self) -> tuple[Approval, ...]:
        """The pending approvals (RT25), in the order they were asked: those of the running
        turn, and those a resumed session left (``resumed``)."""
        return self._approvals.pending()

    def approve(self, call_id: str) -> None:
        """Approve the pending call *call_id* (RT25): ``approval/decision {approved}`` is
        written and made durable, then the call runs. A resumed approval's tool runs at once
        and its result goes to the model as a follow-up of its own (a new turn)."""
        approval = self._pending_approval(call_id)
        self._write_decision(approval, "approved", None)
        if approval.resumed:
            self._start_resumed(approval)

    def deny(self, call_id: str, reason: str | None = None) -> None:
        """Deny the pending call *call_id* (RT25): ``approval/decision {denied, reason}`` is
        written; the call's result is the error ``Error: the tool call was denied: <reason>``
        (code ``TOOL_CALL_DENIED``), which the model reads. A resumed approval's denial
        reaches the model as injected context."""
        if reason is not None and not isinstance(reason, str):
            raise ValidationError("reason", f"must be a string or None, not {reason!r}")
        approval = self._pending_approval(call_id)
        self._write_decision(approval, "denied", reason)
        if approval.resumed:
            self.inject(user_message(
                f"approval-{approval.call_id}",
                f"The tool call {approval.call_id} to {approval.name} with arguments "
                f"{_json_text(approval.arguments)}, which was waiting for approval when the "
                f"session was interrupted, was denied{': ' + reason if reason else ''}.",
                APPROVAL_SOURCE))

    def _pending_approval(self, call_id: str) -> Approval:
        self._bind()
        if self._core.disposed:
            raise DisposedError("the agent is disposed; only dispose() may be called")
        approval = self._approvals.get(call_id) if isinstance(call_id, str) else None
        if approval is None:
            raise ApprovalError(f"no pending approval for tool call {call_id!r}")
        return approval

    def _write_decision(self, approval: Approval, decision: Decision, reason: str | None, *,
                        final: bool = False) -> None:
        """Write the decision (durable before the call goes on, `_approval_written`), then
        release the held call."""
        self._core.append(APPROVAL_DECISION, decision_data(approval, decision, reason),
                          ignorable=True)
        self._approvals.decide(approval.call_id, decision, reason, final=final)
        self._commanded()

    def _cancel_approval(self, call_id: str, reason: str) -> None:
        approval = self._approvals.get(call_id)
        if approval is not None and not self._core.disposed:
            self._write_decision(approval, "cancelled", reason, final=True)

    def _ask_approvals(self, event: Event) -> None:
        """The model's message asks for calls (R9.9): each call of a tool that requires
        approval is announced by an ``approval/request``, appended right after the message
        (R0.6), and held (the environment's prepare waits for its decision)."""
        message = event.message
        if message is None or not message.tool_calls:
            return
        turn, step = event.data.get("turn"), event.data.get("step")
        if type(turn) is not int or type(step) is not int:
            return
        signal = self._turn_signal if self._turn_signal is not None else Signal(0)
        control = self._env.control
        for block in message.tool_calls:
            name, call_id = str(block.get("name")), str(block.get("id"))
            found = self._env.tools.get(name)
            if found is None or not found.requires_approval or (
                    control is not None and control.tool(name) is not None):
                continue
            arguments = thaw(plan_arguments(str(block.get("arguments", ""))))
            if not self._needs_approval(found, ToolCall(call_id, name, arguments, turn, step,
                                                        signal)):
                continue
            approval = Approval(call_id, name, arguments, turn, step, len(self._core.log))
            self._core.append(APPROVAL_REQUEST, request_data(approval), ignorable=True)
            self._approvals.asked(approval, self._loop)

    @staticmethod
    def _needs_approval(found: Tool, call: ToolCall) -> bool:
        policy = found.requires_approval
        if policy is not True:
            try:
                if not policy(call):        # type: ignore[operator]
                    return False
            except Exception as exc:        # a failing policy asks: the safe side
                LOGGER.warning("the approval policy of tool %r raised (approval asked): %s",
                               found.name, error_info(exc).rendered())
        if found.validate_arguments is not None:
            try:
                found.validate_arguments(call.arguments)
            except ToolArgumentError:       # the call gets its validation error (RT22)
                return False
        return True

    def _approval_written(self, event: Event) -> None:
        """An approval event was delivered (so appended to the sink): flush the sink, so a
        pending approval survives a crash and a decision is durable before its call runs."""
        try:
            flushing = self._env.sink.flush()
        except BaseException as exc:
            self._contain(exc, f"the session sink's flush of {event.type} (seq {event.seq})")
            return
        if flushing is not None and self._loop is not None:
            self._approvals.flushing = self._loop.create_task(_flushed(flushing))

    def _tool_result(self, event: Event) -> None:
        """A call has its result: an approval it still waits for is cancelled (a limit
        refused the call, or the turn's abort left it unstarted)."""
        self._ledger.durable(event)
        message = event.message
        block = message.content[0] if message is not None and message.content else None
        call_id = block.get("toolCallId") if isinstance(block, FrozenDict) else None
        if isinstance(call_id, str) and self._approvals.forget(call_id):
            error = event.data.get("error")
            code = error.get("code") if isinstance(error, FrozenDict) else None
            self._cancel_approval(call_id, "the tool call limit was reached"
                                  if code == "TOOL_CALL_LIMIT" else "the turn was cancelled")

    def _turn_ended(self, event: Event) -> None:
        self._ledger._turn_end(event)
        turn = event.data.get("turn")
        if type(turn) is int:
            for call_id in self._approvals.of_turn(turn):
                if self._approvals.forget(call_id):
                    self._cancel_approval(call_id, "the turn ended before the call was "
                                          "prepared")

    def _reoffer_approvals(self) -> None:
        """A resumed session's pending approvals are offered again (RT25): one
        ``approval/request {reoffer: true}`` each, at the agent's first pump."""
        reoffer, self._reoffer = self._reoffer, []
        if self._core.disposed:
            return
        for approval in reoffer:
            if self._approvals.get(approval.call_id) is None:
                continue
            seq = len(self._core.log)
            self._core.append(APPROVAL_REQUEST, request_data(approval, reoffer=True),
                              ignorable=True)
            self._approvals.asked(dataclasses.replace(approval, seq=seq), None)

    def _start_resumed(self, approval: Approval) -> None:
        loop = self._loop
        assert loop is not None
        task = loop.create_task(self._run_resumed(approval),
                                name=f"turnstile-approved-{approval.call_id}")
        self._tasks.add(task)
        self._approval_tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_resumed(self, approval: Approval) -> None:
        """An approved resumed call (RT25): its turn was closed by the crash repair, so the
        tool runs here (prepare, body, finalize) and its result goes to the model as a
        follow-up, its contexts injected first."""
        try:
            found = self._env.tools.get(approval.name)
            call = ToolCall(approval.call_id, approval.name, approval.arguments, approval.turn,
                            approval.step, self._resumed_signal)
            text, contexts = await _run_tool(found, call)
            if self._core.disposed:
                return
            for context in contexts:
                self.inject(context)
            self.followup(user_message(
                f"approval-{approval.call_id}",
                f"The tool call {approval.call_id} to {approval.name} with arguments "
                f"{_json_text(approval.arguments)} was waiting for approval when the session "
                f"was interrupted. It was approved and has now run. Its result:\n{text}",
                APPROVAL_SOURCE))
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._approval_tasks.discard(task)
            self._settle_waiters()

    def _settled(self, event: LiveEvent) -> None:
        """``agent/settled``: the chain's last turn is closed and flushed (R12.5); the run's
        record has taken it already (its route, `_live_route`)."""
        if self._chain is not None:
            self._end_chain()
        elif self._env.control is not None:
            self._set_control(None)

    def _end_chain(self) -> None:
        chain, self._chain = self._chain, None
        if self._env.control is not None:
            self._set_control(None)
        if chain is not None:
            self._routes_changed()
            chain.end()

    def _torn_down(self, event: LiveEvent) -> None:
        self._ledger._disposed(event)
        self._end_runs()

    def _agent_error(self, event: LiveEvent) -> None:
        self._ledger._error(event)
        if self._core.failure is not None:     # P16: the core stopped; no run goes on
            self._end_runs()

    def _end_runs(self) -> None:
        self._end_chain()
        for tracker in list(self._trackers):
            tracker.end()

    # ------------------------------------------------------------------
    # Subscriptions
    # ------------------------------------------------------------------

    @overload
    def on(self, type: DurableEventType, listener: Callable[[Event], object]) -> Unsubscribe: ...

    @overload
    def on(self, type: LiveEventType, listener: Callable[[LiveEvent], object]) -> Unsubscribe: ...

    @overload
    def on(self, type: str, listener: Callable[[Event | LiveEvent], object]) -> Unsubscribe: ...

    def on(self, type: str, listener: Callable[..., object]) -> Unsubscribe:
        """Call *listener* synchronously with each durable `Event` of *type* (``'*'`` or
        ``'session/event'``: every durable event) or each `LiveEvent` of *type*.

        Listeners run in registration order; one registered during a delivery sees the next
        output. An exception is contained: logged at WARNING, the next listener still runs
        (a ``KeyboardInterrupt`` or ``SystemExit`` propagates after the delivery, RT18)."""
        return self._subscribe(_Subscription(type, listener))

    def observe(self, listener: Callable[[Output], object]) -> Unsubscribe:
        """Call *listener* with every output (durable, live, effect and control), in order."""
        return self._subscribe(_Subscription(None, listener))

    def _subscribe(self, sub: _Subscription) -> Unsubscribe:
        self._subs.append(sub)
        self._forget_routes()

        def unsubscribe() -> None:
            sub.active = False
            if sub in self._subs:
                self._subs.remove(sub)
                self._forget_routes()
        return unsubscribe

    def _forget_routes(self) -> None:
        self._durable_routes.clear()
        self._live_routes.clear()
        self._observers = None

    def _route(self, type_: str | None, durable: bool) -> tuple[_Subscription, ...]:
        """The subscriptions an output of *type_* (None: an effect or control) goes to, in
        registration order (the observers' are remembered until the next
        (un)subscription)."""
        subs = tuple(s for s in self._subs
                     if s.type is None or (type_ is not None and (
                         s.type == type_ or (durable and s.type in ALL_EVENTS))))
        if type_ is None:
            self._observers = subs
        return subs

    def _durable_route(self, type_: str) -> _Route[Event]:
        """The route of a durable type: the agent's watcher of it and, while a run's chain
        is running, that run's record of every event (RT21), then the listeners."""
        watch = self._durable_watch.get(type_)
        chain = self._chain
        if chain is not None:               # the run's record first (its end may follow)
            watch = chain.durable if watch is None else _both(chain.durable, watch)
        route = self._durable_routes[type_] = (watch, self._route(type_, True))
        return route

    def _live_route(self, type_: str) -> _Route[LiveEvent]:
        watch = self._live_watch.get(type_)
        chain = self._chain
        if chain is not None:
            watch = chain.live if watch is None else _both(chain.live, watch)
        route = self._live_routes[type_] = (watch, self._route(type_, False))
        return route

    def _routes_changed(self) -> None:
        """The watchers changed (a run's chain began or ended): routes are made again."""
        self._durable_routes.clear()
        self._live_routes.clear()

    # ------------------------------------------------------------------
    # The pump
    # ------------------------------------------------------------------

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None or loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError("an Agent is used from a running asyncio event loop") from None
            if loop is not None:
                self._rebind()
            self._loop = loop = running
        return loop

    def _rebind(self) -> None:
        """The agent's event loop was closed (for example by ``asyncio.run`` after an exception
        left it, RT18): forget what belonged to it, so the agent can go on (and be disposed)
        on the running loop. Completions already received are kept."""
        self._scheduled = False
        self._tasks.clear()
        self._model_tasks.clear()
        self._idle_waiters.clear()
        self._dispose_waiters.clear()
        if self._ready:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_pump)

    def _commanded(self) -> None:
        """After a command: deliver its outputs now, unless a delivery is in progress (then
        the running pump delivers them next)."""
        if not self._delivering:
            self._pump(feed=False)

    def _schedule_pump(self) -> None:
        if not self._scheduled:
            loop = self._loop
            if loop is None:
                return
            try:
                loop.call_soon(self._scheduled_pump)
            except RuntimeError:        # the loop is closed: `_bind` on the next one pumps
                return
            self._scheduled = True

    def _scheduled_pump(self) -> None:
        self._scheduled = False
        self._pump(feed=True)

    def _pump(self, *, feed: bool) -> None:
        """Feed the finished work (*feed*), then pull and deliver until the core waits.

        A ``KeyboardInterrupt`` or ``SystemExit`` raised while an output is delivered stops
        the pump once that output's delivery is complete; the next pass pumps on (RT18)."""
        if self._delivering:
            return
        if self._reoffer:
            self._reoffer_approvals()
        self._delivering = True
        core = self._core
        next_output = self._next_output
        try:
            if feed:
                self._feed_ready()
            while True:
                try:
                    output = next_output()
                except EXITS as exc:    # P16: the core stopped first; raised below (RT18)
                    if self._exit is None:
                        self._exit = exc
                    break
                if output is None:
                    break
                self._deliver(output)
                if self._exit is not None:
                    break
        finally:
            self._delivering = False
        if self._idle_waiters or self._dispose_waiters or core.disposed:
            self._settle_waiters()
        if self._exit is not None:
            exit_, self._exit = self._exit, None
            self._schedule_pump()
            raise exit_

    def _feed_ready(self) -> None:
        ready = self._ready
        while ready:
            complete, effect_id, value = ready.popleft()
            try:
                complete(effect_id, value)
            except ProtocolError as exc:       # a runtime bug: never expected
                LOGGER.error("turnstile runtime: completion refused by the core: %s", exc)

    def _settle_waiters(self) -> None:
        core = self._core
        disposed = core.disposed        # (setting a future's result runs nothing now)
        if self._idle_waiters and (disposed or (core.is_quiescent
                                                and not self._approval_tasks)):
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if disposed:
            if not self._sink_closed:
                self._sink_closed = True
                self._close_sink()
            if self._dispose_waiters:
                waiters, self._dispose_waiters = self._dispose_waiters, []
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)

    def _close_sink(self) -> None:
        close = getattr(self._env.sink, "close", None)
        if not callable(close):
            return
        try:
            close()
        except BaseException as exc:
            self._contain(exc, "closing the session sink")

    def _contain(self, exc: BaseException, what: str) -> None:
        """An exception of a listener, an abort listener, the sink's append or close: logged
        at WARNING; a ``KeyboardInterrupt``/``SystemExit`` is kept for the pump to raise once
        the output is delivered (RT3, RT18)."""
        if isinstance(exc, EXITS) and self._exit is None:
            self._exit = exc
            return
        LOGGER.warning("%s raised: %s", what, error_info(exc).rendered() or type(exc).__name__)

    def _deliver(self, output: Output) -> None:
        # Why exact types: the four output classes are final (and `type(x) is` narrows)
        if type(output) is Durable:
            event = output.event
            try:
                self._append(event)
            except BaseException as exc:
                self._contain(exc, f"session sink append of {_describe(output)}")
            route = self._durable_routes.get(event.type)
            if route is None:
                route = self._durable_route(event.type)
            watch, subs = route
            if watch is not None:
                watch(event)
            if subs:
                self._notify(subs, output, event)
        elif type(output) is Live:
            live = output.event
            if live.type == ev.WARNING:
                LOGGER.warning("agent warning: %s", live.payload.get("text", ""))
            live_route = self._live_routes.get(live.type)
            if live_route is None:
                live_route = self._live_route(live.type)
            live_watch, subs = live_route
            if live_watch is not None:
                live_watch(live)
            if subs:
                self._notify(subs, output, live)
        elif type(output) is Effect:
            observers = self._observers
            if observers is None:
                observers = self._route(None, False)
            if observers:
                self._notify(observers, output, None)
            self._start(output)
        else:
            assert isinstance(output, Control)
            if output.kind == "abort":
                self._ledger.abort(output.payload)
                signal = self._signal(_int(output.payload, "signal"))
                try:
                    signal._abort(CancelCause.from_json(output.payload["reason"],
                                                        allow_disposed=True))
                except BaseException as exc:     # only an exit is raised again (Signal._abort)
                    self._contain(exc, "an abort listener")
            else:
                self._release(_int(output.payload, "effect"))
            observers = self._observers
            if observers is None:
                observers = self._route(None, False)
            if observers:
                self._notify(observers, output, None)

    def _notify(self, subs: tuple[_Subscription, ...], output: Output,
                event: Event | LiveEvent | None) -> None:
        for sub in subs:
            if not sub.active:
                continue
            try:
                sub.listener(output if sub.type is None else event)
            except BaseException as exc:
                self._contain(exc, f"listener of {_describe(output)}")

    # ------------------------------------------------------------------
    # Effects
    # ------------------------------------------------------------------

    def _signal(self, signal_id: int) -> Signal:
        signal = self._signals.get(signal_id)
        if signal is None:
            if self._signals and signal_id > max(self._signals):
                self._signals.clear()       # older controllers are never aborted again
            signal = self._signals[signal_id] = Signal(signal_id)
        return signal

    def _complete(self, kind: Literal["resolve", "raise", "chunk", "end"], effect_id: int,
                  value: object) -> None:
        """Work finished: it enters the core on the next pass (RT5), as it was now (V6: an
        adapter may refill the dict it yielded before the core takes it). After teardown
        nothing is fed (the work was orphaned, RT7)."""
        core = self._core
        if effect_id in self._released or core.disposed:
            return
        if kind == "raise":
            assert isinstance(value, ErrorInfo)
        self._ready.append((self._completers[kind], effect_id, snapshot(value)))
        if not self._scheduled:
            self._schedule_pump()

    def _answer_now(self, complete: Callable[[int, Any], None], effect_id: int,
                    value: object) -> None:
        """Work that ran none of the user's code, or only a synchronous sink flush, is
        answered at its delivery: the pump goes on in the same pass (RT5)."""
        try:
            complete(effect_id, value)
        except ProtocolError as exc:           # a runtime bug: never expected
            LOGGER.error("turnstile runtime: completion refused by the core: %s", exc)

    def _resolve_tick_soon(self, effect_id: int) -> None:
        self._complete("resolve", effect_id, None)

    def _start(self, effect: Effect) -> None:
        kind = effect.kind
        if kind == TICK:
            if self._ledger._admitting is not None:    # the rejected admission's (RT26)
                self._ledger.effect(effect)
            self._on_tick(effect.id)
            return
        loop = self._loop
        assert loop is not None, "effects are delivered by a bound agent"
        if kind == MODEL:
            if self._gated:                       # the signal approval policies' calls get
                self._turn_signal = self._signal(_int(effect.payload, "signal"))
            task = loop.create_task(self._stream(effect), name=f"turnstile-model-{effect.id}")
            self._model_tasks[effect.id] = task
        else:
            signal_id = effect.payload._data.get("signal")
            signal = self._signals.get(signal_id) if type(signal_id) is int else None
            if signal is None and type(signal_id) is int:
                signal = self._signal(signal_id)
            try:
                work = self._env.start(effect, signal)
            except BaseException as exc:    # a synchronous flush failed (or a runtime bug)
                self._answer_now(self._core.fail, effect.id, error_info(exc))
                if isinstance(exc, EXITS):
                    self._contain(exc, "the session sink's flush")
                return
            if kind == PROMPT_SUBMIT:                  # the admission's answer (RT26)
                self._ledger.admission(effect)
                if not isinstance(work, Immediate):
                    work = _decided(work, self._ledger, effect.id)
            if isinstance(work, Immediate):     # `_answer_now`, inline (most effects)
                try:
                    self._core.resolve(effect.id, work.value)
                except ProtocolError as exc:    # a runtime bug: never expected
                    LOGGER.error("turnstile runtime: completion refused by the core: %s", exc)
                return
            task = loop.create_task(self._settle(effect.id, work),
                                    name=f"turnstile-{kind}-{effect.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, effect_id: int, work: Work) -> None:
        """Await *work* and complete its effect, whatever it raises (RT9, RT18)."""
        try:
            value = await work
        except asyncio.CancelledError as exc:
            if _cancelled_from_outside():
                self._complete("raise", effect_id, CANCELLED)
                raise
            self._complete("raise", effect_id, error_info(exc))   # the work's own CancelledError
        except BaseException as exc:
            self._complete("raise", effect_id, error_info(exc))
            if isinstance(exc, EXITS):
                raise
        else:
            self._complete("resolve", effect_id, value)

    async def _stream(self, effect: Effect) -> None:
        payload, effect_id = effect.payload, effect.id
        header = payload["header"]
        assert isinstance(header, FrozenDict)
        call = ModelCall(_int(payload, "turn"), _int(payload, "step"),
                         self._signal(_int(payload, "signal")), header, effect.history or ())
        iterator: AsyncIterator[Chunk] | None = None
        try:
            iterator = aiter(self._model.stream(call))
            while effect_id not in self._released:
                try:
                    chunk = await anext(iterator)
                except StopAsyncIteration:
                    self._complete("end", effect_id, None)
                    return
                self._complete("chunk", effect_id, chunk)
        except asyncio.CancelledError as exc:
            if effect_id in self._released:     # the release cancelled the pending read
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
            elif _cancelled_from_outside():
                self._complete("raise", effect_id, CANCELLED)
                raise
            else:
                self._complete("raise", effect_id, error_info(exc))
        except BaseException as exc:
            self._complete("raise", effect_id, error_info(exc))
            if isinstance(exc, EXITS):
                raise
        finally:
            self._model_tasks.pop(effect_id, None)
            self._released.discard(effect_id)
            await _close(iterator)

    def _release(self, effect_id: int) -> None:
        """The core stopped consuming this model stream: drop its unfed chunks, cancel the
        pending read and close the iterator (RT6)."""
        self._ready = deque(c for c in self._ready if c[1] != effect_id)
        task = self._model_tasks.get(effect_id)
        if task is None or task.done():
            return
        self._released.add(effect_id)
        if task is not asyncio.current_task():
            task.cancel()

    def _pending(self) -> list[str]:
        return [_describe_effect(effect) for effect in self._core.outstanding()]

    async def _bounded(self, waiter: asyncio.Future[None], timeout: float, what: str) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            raise AgentTimeoutError(f"{what}: not reached after {timeout:g} s",
                                    self._pending()) from None

    async def _finish_disposal(self, waiter: asyncio.Future[None], timeout: float | None
                               ) -> None:
        if timeout is None:
            await waiter
        else:
            try:
                await asyncio.wait_for(asyncio.shield(waiter), timeout)
            except TimeoutError:
                pending = self._pending()
                current = asyncio.current_task()
                stuck = [t for t in self._tasks if t is not current and not t.done()]
                LOGGER.warning("dispose: teardown not reached after %g s; cancelling the work "
                               "still running: %s", timeout, ", ".join(pending) or "none")
                for task in stuck:
                    task.cancel()
                await self._bounded(waiter, timeout, "dispose")
        current = asyncio.current_task()
        leftovers = [t for t in self._tasks if t is not current and not t.done()]
        for task in leftovers:           # nothing the core waits for: orphaned work
            task.cancel()
        if leftovers:
            await asyncio.gather(*leftovers, return_exceptions=True)
        closers, self._closers = self._closers, []
        for close in reversed(closers):
            try:
                await close()
            except Exception as exc:
                LOGGER.warning("closing %r after disposal raised: %s", close,
                               error_info(exc).rendered())

    # ------------------------------------------------------------------
    # Helpers
    # ------------------------------------------------------------------

    def _message(self, message: MessageLike) -> Message | Mapping[str, JsonValue]:
        if isinstance(message, str):
            self._minted += 1
            return user_message(f"user-{self._minted}", message)
        return message


def _message_id(message: Message | Mapping[str, JsonValue]) -> str:
    """The id of a message the core accepted (so a string), as a plain `str`."""
    raw_id = message.id if isinstance(message, Message) else message["id"]
    if type(raw_id) is str:
        return raw_id
    return str.__str__(raw_id) if isinstance(raw_id, str) else str(raw_id)


def _check_timeout(timeout: float | None) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not math.isfinite(timeout) or timeout <= 0:
        raise ValidationError("timeout", "must be a positive finite number of seconds or None, "
                              f"not {timeout!r}")


def _report_text(report: LoadReport) -> str:
    parts = [str(damage) for damage in report.damage]
    if report.truncated_bytes:
        parts.append(f"a torn final record of {report.truncated_bytes} bytes cut off")
    if report.closers_appended:
        parts.append(f"{report.closers_appended} repair closer(s) appended")
    if report.quarantine:
        parts.append(f"the damaged original moved to {report.quarantine}")
    return "; ".join(parts)


def _cancelled_from_outside() -> bool:
    """Whether the running task itself was cancelled (disposal, loop shutdown), rather than
    the work raising a `CancelledError` of its own."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _close(iterator: AsyncIterator[Chunk] | None) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception as exc:
        LOGGER.warning("closing a model stream raised: %s", error_info(exc).rendered())


async def _flushed(flushing: Awaitable[None]) -> None:
    try:
        await flushing
    except Exception as exc:
        LOGGER.warning("the session sink's flush of an approval event raised: %s",
                       error_info(exc).rendered())


def _json_text(value: JsonValue) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _result_text(result: ToolResult) -> str:
    """A tool result's content as text: its text blocks, any other block as JSON."""
    parts = []
    for block in result.content:
        if isinstance(block, FrozenDict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            parts.append(_json_text(thaw(block)))
    return "".join(parts)


async def _run_tool(found: Tool | None, call: ToolCall) -> tuple[str, tuple[Message, ...]]:
    """A call run outside any turn (a resumed approval, RT25): prepare, body and finalize as
    the batch would run them; a raise is the ``Error: <message>`` text (R10.12)."""
    if found is None:
        return f"Error: unknown tool {call.name!r}", ()
    try:
        prepared = await found.prepare(call) if found.prepare is not None else None
        if prepared is None:
            result = ToolResult.from_json(result_json(await found.run(call)))
            if found.finalize is not None:
                result = ToolResult.from_json(result_json(await found.finalize(call, result)))
        else:
            result = ToolResult.from_json(result_json(prepared))
    except Exception as exc:
        return f"Error: {error_info(exc).rendered()}", ()
    return _result_text(result), result.additional_contexts


def _both(first: Callable[[E], object], second: Callable[[E], object]) -> Callable[[E], None]:
    def both(event: E) -> None:
        first(event)
        second(event)
    return both


async def _decided(work: Work, ledger: FateLedger, effect_id: int) -> object:
    """A prompt-submit's work, its answer noted for the fate ledger (why a prompt is
    rejected, RT26)."""
    try:
        value = await work
    except BaseException as exc:
        ledger.completion(effect_id, "raise", error_info(exc))
        raise
    ledger.completion(effect_id, "resolve", snapshot(value))
    return value
