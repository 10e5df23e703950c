"""The asyncio `Agent`: a reference runtime over the sans-I/O core (specs/runtime.md).

The agent owns one `AgentCore` and runs a *pump*: it pulls the core's outputs
one at a time and delivers each one synchronously, before pulling the next:

* a durable event is appended to the session store, then given to the
  listeners of its type and of ``'*'`` / ``'session/event'``;
* a live notification is given to the listeners of its type
  (``agent/warning`` is also logged at WARNING on the ``turnstile`` logger);
* an effect starts its work (a hook chain, the model stream, a tool stage,
  the store's flush) as an asyncio task; a ``tick`` resolves on the next pass
  of the event loop;
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
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Literal, TypeAlias, overload

from machine import events as ev
from machine.core import AgentCore, CoreConfig
from machine.errors import ProtocolError
from machine.events import Event, LiveEvent
from machine.io import MODEL, TICK, Durable, Effect, Input, Live, Output
from machine.jsonvalue import FrozenDict, snapshot
from machine.log import SessionLog
from machine.runtime.environment import SystemPrompt, perform
from machine.runtime.failures import error_info
from machine.runtime.hooks import Hooks, JsonValue, Unsubscribe
from machine.runtime.model import Chunk, ModelAdapter, ModelCall, RequestPreparer
from machine.runtime.signal import Signal
from machine.runtime.store import InMemorySessionStore, SessionStore
from machine.runtime.tools import Tool, ToolRegistry
from machine.vocabulary import CancelCause, ErrorInfo, Message, Target, user_message

__all__ = ["ALL_EVENTS", "Agent", "DurableEventType", "LiveEventType", "MessageLike",
           "SystemPrompt"]

LOGGER: Final = logging.getLogger("turnstile")

#: Listener types that receive every durable event.
ALL_EVENTS: Final = frozenset({"*", "session/event"})

DurableEventType: TypeAlias = Literal[
    "turn/start", "turn/end", "step/start", "step/end", "user/message", "steering/message",
    "assistant/chunk", "assistant/message", "tool/call", "tool/result", "todo/write",
    "request/header", "*", "session/event"]
LiveEventType: TypeAlias = Literal[
    "agent/status", "agent/inbox/enqueue", "agent/inbox/dequeue", "agent/inbox/discard",
    "agent/context/discard", "agent/cancel-requested", "agent/settled", "agent/error",
    "agent/warning", "agent/session-start", "agent/created", "agent/disposed",
    "session/created", "session/disposed"]

#: A message argument: a `Message`, its JSON form, or a string (a user text message whose id
#: the agent mints: ``user-1``, ``user-2``, ...).
MessageLike: TypeAlias = "Message | Mapping[str, JsonValue] | str"
CauseLike: TypeAlias = "Literal['user', 'parent'] | CancelCause | Mapping[str, JsonValue]"

_Completion: TypeAlias = tuple[str, int, object]


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


class Agent:
    """An asyncio agent over `AgentCore`. See the module docstring and specs/runtime.md.

    Create it inside a running event loop (or at least use it there), register
    listeners and hooks, then send messages::

        async with Agent(ScriptedModel([text_reply("hello")])) as agent:
            agent.on("turn/end", lambda event: print(event.data["reason"]))
            agent.followup("hi")
            await agent.when_idle()
    """

    def __init__(self, model: ModelAdapter, *, tools: Iterable[Tool] | ToolRegistry = (),
                 hooks: Hooks | None = None, system: JsonValue | SystemPrompt = None,
                 request_options: Mapping[str, JsonValue] | None = None,
                 max_parallel_tool_calls: int = 10, store: SessionStore | None = None,
                 session: SessionLog | None = None,
                 session_start: Literal["startup", "resume"] = "startup", publish: bool = True,
                 clock: Callable[[], float] | None = None) -> None:
        self.model = model
        self.tools = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.hooks = hooks if hooks is not None else Hooks()
        self.system = system
        self.store: SessionStore = store if store is not None else InMemorySessionStore()
        seed: dict[str, JsonValue] = {}
        defaults = getattr(model, "default_config", None)
        if isinstance(defaults, Mapping):
            seed.update(defaults)
        seed.update(request_options or {})
        config = CoreConfig(request_options=seed, tool_modes=self.tools.modes(),
                            max_parallel_tool_calls=max_parallel_tool_calls,
                            session_start=session_start, publish=publish)
        self._core = AgentCore(config, log=session, clock=clock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._subs: list[_Subscription] = []
        self._signals: dict[int, Signal] = {}
        self._ready: deque[_Completion] = deque()
        self._scheduled = False
        self._delivering = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._model_tasks: dict[int, asyncio.Task[None]] = {}
        self._released: set[int] = set()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._dispose_waiters: list[asyncio.Future[None]] = []
        self._minted = 0
        #: How a tick is resolved: by default on the next pass of the event loop.
        self._on_tick: Callable[[int], None] = self._resolve_tick_soon

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

    def send(self, message: MessageLike, *, target: Target, wakeup: bool) -> None:
        """Route *message* (reference §5): ``target`` ``next-turn`` or ``next-step``."""
        self._bind()
        self._core.send(self._message(message), {"target": target, "wakeup": wakeup})
        self._commanded()

    def followup(self, message: MessageLike) -> None:
        """``send(target='next-turn', wakeup=True)``: a prompt of its own turn."""
        self._bind()
        self._core.followup(self._message(message))
        self._commanded()

    def steer(self, message: MessageLike) -> None:
        """``send(target='next-step', wakeup=True)``: steering if the window is open, else a
        queued prompt."""
        self._bind()
        self._core.steer(self._message(message))
        self._commanded()

    def inject(self, message: MessageLike) -> None:
        """``send(target='next-step', wakeup=False)``: staged context if the window is open,
        else appended at once (no turn)."""
        self._bind()
        self._core.inject(self._message(message))
        self._commanded()

    def cancel(self, cause: CauseLike = "user", keep_inbox: bool = False) -> None:
        """Cancel the current activity (and, unless *keep_inbox*, what is pending)."""
        self._bind()
        if isinstance(cause, str):
            cause = {"kind": cause}
        self._core.cancel(cause, keep_inbox)
        self._commanded()

    def append(self, type: str, data: Mapping[str, JsonValue], *,
               surface_op: JsonValue = None, source_event_seqs: Iterable[int] | None = None
               ) -> Event:
        """A direct append by extension code: checked, committed and delivered in order."""
        self._bind()
        event = self._core.append(type, data, surface_op=surface_op,
                                  source_event_seqs=None if source_event_seqs is None
                                  else list(source_event_seqs))
        self._commanded()
        return event

    def _feed(self, item: Input) -> None:
        """Apply a command given as data (rule P9), exactly as the command methods do."""
        self._bind()
        self._core.feed(item)
        self._commanded()

    def dispose(self) -> Awaitable[None]:
        """Dispose now (``cancel({kind:'disposed'})``); await the result for teardown
        (``agent/disposed``, ``session/disposed``). Idempotent."""
        loop = self._bind()
        if self._core.disposed and not self._dispose_waiters:
            done: asyncio.Future[None] = loop.create_future()
            done.set_result(None)
            return done
        self._core.dispose()
        waiter: asyncio.Future[None] = loop.create_future()
        self._dispose_waiters.append(waiter)
        self._commanded()
        self._settle_waiters()
        return loop.create_task(self._finish_disposal(waiter))

    def when_idle(self) -> Awaitable[None]:
        """Completes when the agent is quiescent: not busy, no wake pending, no waking item
        queued (reference §18). Never awaited from the agent's own work (it would not end)."""
        loop = self._bind()
        if not self._delivering:
            self._pump(feed=False)
        waiter: asyncio.Future[None] = loop.create_future()
        if self._core.is_quiescent or self._core.disposed:
            waiter.set_result(None)
        else:
            self._idle_waiters.append(waiter)
        return waiter

    async def __aenter__(self) -> Agent:
        self._bind()
        self._schedule_pump()           # publication: listeners registered now still see it
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.dispose()

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
        output. An exception is contained: logged at WARNING, the next listener still runs."""
        return self._subscribe(_Subscription(type, listener))

    def observe(self, listener: Callable[[Output], object]) -> Unsubscribe:
        """Call *listener* with every output (durable, live, effect and control), in order."""
        return self._subscribe(_Subscription(None, listener))

    def _subscribe(self, sub: _Subscription) -> Unsubscribe:
        self._subs.append(sub)

        def unsubscribe() -> None:
            sub.active = False
            if sub in self._subs:
                self._subs.remove(sub)
        return unsubscribe

    # ------------------------------------------------------------------
    # The pump
    # ------------------------------------------------------------------

    def _bind(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError("an Agent is used from a running asyncio event loop") from None
        return self._loop

    def _commanded(self) -> None:
        """After a command: deliver its outputs now, unless a delivery is in progress (then
        the running pump delivers them next)."""
        if not self._delivering:
            self._pump(feed=False)

    def _schedule_pump(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._bind().call_soon(self._scheduled_pump)

    def _scheduled_pump(self) -> None:
        self._scheduled = False
        self._pump(feed=True)

    def _pump(self, *, feed: bool) -> None:
        """Feed the finished work (*feed*), then pull and deliver until the core waits."""
        if self._delivering:
            return
        self._delivering = True
        try:
            if feed:
                self._feed_ready()
            while (output := self._core.next_output()) is not None:
                self._deliver(output)
        finally:
            self._delivering = False
        self._settle_waiters()

    def _feed_ready(self) -> None:
        core = self._core
        while self._ready:
            kind, effect_id, value = self._ready.popleft()
            try:
                if kind == "resolve":
                    core.resolve(effect_id, value)
                elif kind == "raise":
                    assert isinstance(value, ErrorInfo)
                    core.fail(effect_id, value)
                elif kind == "chunk":
                    core.chunk(effect_id, value)
                else:
                    core.end(effect_id)
            except ProtocolError as exc:       # a runtime bug: never expected
                LOGGER.error("turnstile runtime: completion refused by the core: %s", exc)

    def _settle_waiters(self) -> None:
        core = self._core
        if self._idle_waiters and (core.is_quiescent or core.disposed):
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if self._dispose_waiters and core.disposed:
            waiters, self._dispose_waiters = self._dispose_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _deliver(self, output: Output) -> None:
        if isinstance(output, Durable):
            try:
                self.store.append(output.event)
            except Exception as exc:
                LOGGER.warning("session store append of %s raised: %s", _describe(output),
                               error_info(exc).rendered())
            self._notify(output, output.event)
        elif isinstance(output, Live):
            if output.event.type == ev.WARNING:
                LOGGER.warning("agent warning: %s", output.event.payload.get("text", ""))
            self._notify(output, output.event)
        elif isinstance(output, Effect):
            self._notify(output, None)
            self._start(output)
        else:
            if output.kind == "abort":
                signal = self._signal(_int(output.payload, "signal"))
                signal._abort(CancelCause.from_json(output.payload["reason"], allow_disposed=True))
            else:
                self._release(_int(output.payload, "effect"))
            self._notify(output, None)

    def _notify(self, output: Output, event: Event | LiveEvent | None) -> None:
        durable = isinstance(output, Durable)
        for sub in tuple(self._subs):
            if not sub.active:
                continue
            if sub.type is None:
                argument: object = output
            elif event is not None and (sub.type == event.type
                                        or (durable and sub.type in ALL_EVENTS)):
                argument = event
            else:
                continue
            try:
                sub.listener(argument)
            except Exception as exc:
                LOGGER.warning("listener of %s raised: %s", _describe(output),
                               error_info(exc).rendered())

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

    def _complete(self, kind: str, effect_id: int, value: object) -> None:
        """Work finished: it enters the core on the next pass (RT5), as it was now (V6: an
        adapter may refill the dict it yielded before the core takes it)."""
        if effect_id in self._released:
            return
        self._ready.append((kind, effect_id, snapshot(value)))
        self._schedule_pump()

    def _resolve_tick_soon(self, effect_id: int) -> None:
        self._complete("resolve", effect_id, None)

    def _start(self, effect: Effect) -> None:
        if effect.kind == TICK:
            self._on_tick(effect.id)
            return
        loop = self._bind()
        if effect.kind == MODEL:
            task = loop.create_task(self._stream(effect), name=f"turnstile-model-{effect.id}")
            self._model_tasks[effect.id] = task
        else:
            task = loop.create_task(self._settle(effect),
                                    name=f"turnstile-{effect.kind}-{effect.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, effect: Effect) -> None:
        try:
            value = await self._work(effect)
        except asyncio.CancelledError as exc:
            if _cancelled_from_outside():
                raise
            self._complete("raise", effect.id, error_info(exc))   # the work's own CancelledError
        except Exception as exc:
            self._complete("raise", effect.id, error_info(exc))
        else:
            self._complete("resolve", effect.id, value)

    async def _work(self, effect: Effect) -> object:
        signal = self._signal(_int(effect.payload, "signal")) if "signal" in effect.payload else None
        preparer = self.model if isinstance(self.model, RequestPreparer) else None
        return await perform(effect, signal, hooks=self.hooks, tools=self.tools,
                             system=self.system, store=self.store, preparer=preparer)

    async def _stream(self, effect: Effect) -> None:
        payload, effect_id = effect.payload, effect.id
        header = payload["header"]
        assert isinstance(header, FrozenDict)
        call = ModelCall(_int(payload, "turn"), _int(payload, "step"),
                         self._signal(_int(payload, "signal")), header, effect.history or ())
        iterator: AsyncIterator[Chunk] | None = None
        try:
            iterator = aiter(self.model.stream(call))
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
                raise
            else:
                self._complete("raise", effect_id, error_info(exc))
        except Exception as exc:
            self._complete("raise", effect_id, error_info(exc))
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

    async def _finish_disposal(self, waiter: asyncio.Future[None]) -> None:
        await waiter
        current = asyncio.current_task()
        leftovers = [t for t in self._tasks if t is not current and not t.done()]
        for task in leftovers:           # nothing the core waits for: orphaned work
            task.cancel()
        if leftovers:
            await asyncio.gather(*leftovers, return_exceptions=True)

    # ------------------------------------------------------------------
    # Helpers
    # ------------------------------------------------------------------

    def _message(self, message: MessageLike) -> Message | Mapping[str, JsonValue]:
        if isinstance(message, str):
            self._minted += 1
            return user_message(f"user-{self._minted}", message)
        return message


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
