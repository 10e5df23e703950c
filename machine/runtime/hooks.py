"""Extension points of the asyncio runtime (reference §3.2–§3.4; specs/runtime.md RT8).

Two compositions:

* `Waterfall`: handlers run outermost-first in registration order (or
  prepended, ``use(handler, prepend=True)``); each receives the context and
  ``next``, an awaitable function that runs the rest of the chain and returns
  its result. A handler that does not call ``next`` replaces everything inside
  it; the innermost result is the default.
* `Serial`: handlers are awaited one by one in registration order.

The handler list is snapshotted when the point is invoked (by the agent: when
its effect is delivered). A handler's exception propagates into the loop (it
becomes the effect's raised error).

`Hooks` bundles the five points of an agent: ``prompt_submit`` (waterfall
over the `PromptDecision`), ``step`` and ``turn_stopping`` (serial),
``request`` (waterfall over the request config) and ``request_error``
(waterfall over `RetryAction | None`; its handlers also get the agent's
`RetryPolicy`, machine/runtime/retry.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Generic, TypeAlias, TypeVar

from machine.jsonvalue import Frozen, FrozenDict
from machine.runtime.retry import RETRY, RetryAction, RetryPolicy
from machine.runtime.signal import Signal
from machine.vocabulary import ErrorInfo, LlmFailure, Message, PromptDecision

__all__ = ["RETRY", "Hooks", "JsonValue", "Next", "PromptSubmit", "RequestContext",
           "RequestErrorContext", "RetryAction", "RetryPolicy", "Serial", "SerialHandler", "StepContext",
           "TurnStopping", "Unsubscribe", "Waterfall", "WaterfallHandler"]

#: A JSON value as plain or frozen data (rule V1), without ``Any``.
JsonValue: TypeAlias = "bool | int | float | str | Sequence[JsonValue] | Mapping[str, JsonValue] | None"
#: Calling it undoes a registration.
Unsubscribe: TypeAlias = Callable[[], None]

C = TypeVar("C")
T = TypeVar("T")

Next: TypeAlias = Callable[[], Awaitable[T]]
WaterfallHandler: TypeAlias = Callable[[C, Next[T]], Awaitable[T]]
SerialHandler: TypeAlias = Callable[[C], Awaitable[None]]


def _remover(handlers: list[object], handler: object) -> Unsubscribe:
    def remove() -> None:
        for index, item in enumerate(handlers):
            if item is handler:
                del handlers[index]
                return
    return remove


class Waterfall(Generic[C, T]):
    """A waterfall extension point (reference §3.3)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._handlers: list[WaterfallHandler[C, T]] = []

    def __len__(self) -> int:
        return len(self._handlers)

    def use(self, handler: WaterfallHandler[C, T], *, prepend: bool = False) -> Unsubscribe:
        """Register *handler* (outermost-last, or outermost-first with *prepend*)."""
        if prepend:
            self._handlers.insert(0, handler)
        else:
            self._handlers.append(handler)
        return _remover(self._handlers, handler)  # type: ignore[arg-type]

    def snapshot(self) -> tuple[WaterfallHandler[C, T], ...]:
        """The handlers now registered, outermost first (what an invocation runs)."""
        return tuple(self._handlers)

    async def run(self, context: C, default: T,
                  handlers: tuple[WaterfallHandler[C, T], ...] | None = None) -> T:
        """Run the chain over a snapshot of the handlers (taken now, or *handlers* taken
        earlier); *default* is the innermost result."""
        if handlers is None:
            handlers = tuple(self._handlers)

        async def call(index: int) -> T:
            if index == len(handlers):
                return default
            return await handlers[index](context, lambda: call(index + 1))

        return await call(0)


class Serial(Generic[C]):
    """A serial extension point (reference §3.4)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._handlers: list[SerialHandler[C]] = []

    def __len__(self) -> int:
        return len(self._handlers)

    def use(self, handler: SerialHandler[C], *, prepend: bool = False) -> Unsubscribe:
        if prepend:
            self._handlers.insert(0, handler)
        else:
            self._handlers.append(handler)
        return _remover(self._handlers, handler)  # type: ignore[arg-type]

    def snapshot(self) -> tuple[SerialHandler[C], ...]:
        """The handlers now registered, in order (what an invocation runs)."""
        return tuple(self._handlers)

    async def run(self, context: C, handlers: tuple[SerialHandler[C], ...] | None = None
                  ) -> None:
        """Await the handlers (a snapshot taken now, or *handlers* taken earlier) in order."""
        for handler in tuple(self._handlers) if handlers is None else handlers:
            await handler(context)


# --------------------------------------------------------------------------
# Contexts: what each point's handlers receive
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromptSubmit:
    """prompt-submit: the claimed queued message and the admission's signal."""

    message: Message
    signal: Signal


@dataclass(frozen=True, slots=True)
class StepContext:
    """step: before every step, before its top-of-step drain."""

    turn: int
    step: int
    signal: Signal


@dataclass(frozen=True, slots=True)
class TurnStopping:
    """turn-stopping: a completed step would end the turn."""

    turn: int
    signal: Signal


@dataclass(frozen=True, slots=True)
class RequestContext:
    """request: the seed config of this step's request and the assembled system prompt."""

    turn: int
    step: int
    signal: Signal
    config: FrozenDict
    system: Frozen


_DEFAULT_POLICY: Final = RetryPolicy()


@dataclass(frozen=True, slots=True)
class RequestErrorContext:
    """request-error: a final request failure (after the failed step's ``step/end``).

    ``prior_failures`` are the chain's earlier consecutive failures, oldest first;
    ``retry_policy`` is the agent's `RetryPolicy` (the reference's ``retryPolicy``)."""

    turn: int
    step: int
    signal: Signal
    error: ErrorInfo
    failure: LlmFailure
    prior_failures: tuple[LlmFailure, ...]
    retry_policy: RetryPolicy = _DEFAULT_POLICY


def _prompt_submit() -> Waterfall[PromptSubmit, PromptDecision]:
    return Waterfall("prompt-submit")


def _request() -> Waterfall[RequestContext, Mapping[str, JsonValue]]:
    return Waterfall("request")


def _request_error() -> Waterfall[RequestErrorContext, RetryAction | None]:
    return Waterfall("request-error")


def _step() -> Serial[StepContext]:
    return Serial("step")


def _turn_stopping() -> Serial[TurnStopping]:
    return Serial("turn-stopping")


@dataclass(slots=True)
class Hooks:
    """The extension points of one agent (reference §3.2)."""

    prompt_submit: Waterfall[PromptSubmit, PromptDecision] = field(default_factory=_prompt_submit)
    step: Serial[StepContext] = field(default_factory=_step)
    turn_stopping: Serial[TurnStopping] = field(default_factory=_turn_stopping)
    request: Waterfall[RequestContext, Mapping[str, JsonValue]] = field(default_factory=_request)
    request_error: Waterfall[RequestErrorContext, RetryAction | None] = field(
        default_factory=_request_error)
