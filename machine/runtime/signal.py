"""Cooperative cancellation signals for the asyncio runtime (specs/runtime.md RT6).

The core names an abort controller by an integer signal id in every effect it
requests and reports an abort as a ``Control('abort', {signal, reason})``
output. The runtime maps each id to one `Signal` object, hands it to the
hooks, model and tools of that effect, and aborts it exactly when the abort
output is delivered: its listeners run synchronously at that point (they are
the *abort observers* of the reference, §19), and `Signal.wait` wakes on a
later pass of the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from machine.vocabulary import CancelCause

__all__ = ["AbortError", "Signal"]

LOGGER: Final = logging.getLogger("turnstile")


class AbortError(Exception):
    """Raised by `Signal.raise_if_aborted` (and by scripted work that stops on abort)."""

    code = "ABORTED"

    def __init__(self, cause: CancelCause | None = None, message: str = "operation aborted") -> None:
        super().__init__(message)
        self.cause = cause


class Signal:
    """An abort signal for one admission or one run (one core controller).

    * `aborted` / `reason`: whether and why the signal was aborted (the cancel cause);
    * `add_listener`: a callback run synchronously when the abort is delivered
      (not called if the signal is already aborted: check `aborted` first);
    * `wait`: an awaitable that completes (with the cause) once aborted;
    * `raise_if_aborted`: raise `AbortError` if aborted.

    Only the runtime aborts a signal; environment code observes it. Nothing is
    interrupted by an abort: work that ignores the signal runs to completion
    (reference §0.7).
    """

    __slots__ = ("_listeners", "_reason", "_waiters", "id")

    def __init__(self, id: int) -> None:
        self.id = id
        self._reason: CancelCause | None = None
        self._listeners: list[Callable[[CancelCause], object]] = []
        self._waiters: list[asyncio.Future[CancelCause]] = []

    def __repr__(self) -> str:
        state = f"aborted={self._reason.kind!r}" if self._reason is not None else "live"
        return f"Signal({self.id}, {state})"

    @property
    def aborted(self) -> bool:
        return self._reason is not None

    @property
    def reason(self) -> CancelCause | None:
        return self._reason

    def add_listener(self, listener: Callable[[CancelCause], object]) -> Callable[[], None]:
        """Call *listener(cause)* when the signal is aborted; returns a remover."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)
        return remove

    def raise_if_aborted(self) -> None:
        if self._reason is not None:
            raise AbortError(self._reason, f"aborted ({self._reason.kind})")

    async def wait(self) -> CancelCause:
        """Wait until the signal is aborted; returns the cause (at once if already aborted)."""
        if self._reason is not None:
            return self._reason
        waiter: asyncio.Future[CancelCause] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _abort(self, reason: CancelCause) -> None:
        """Runtime only: abort once (first cause wins) and run the listeners in order.

        A listener's exception is contained: logged at WARNING, the next listener runs. A
        ``KeyboardInterrupt`` or ``SystemExit`` is raised again once every listener has run
        and every waiter is woken (specs/runtime.md RT18)."""
        if self._reason is not None:
            return
        self._reason = reason
        exit_: BaseException | None = None
        for listener in tuple(self._listeners):
            try:
                listener(reason)
            except BaseException as exc:
                if isinstance(exc, (KeyboardInterrupt, SystemExit)) and exit_ is None:
                    exit_ = exc
                    continue
                LOGGER.warning("abort listener of signal %d raised: %s: %s",
                               self.id, type(exc).__name__, exc)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(reason)
        if exit_ is not None:
            raise exit_
