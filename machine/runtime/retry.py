"""The retry policy of request failures (specs/runtime.md RT16; reference §3.2, §13.2).

The core decides *whether* a failed request is retried only from the
request-error point's answer (``{kind:'retry'}`` or not, V21); *how* to retry
is the environment's business (specs/core.md R3.2). In the reference the
serving model adapter owns a ``retryPolicy`` and hands it to every
request-error handler; here that is `RetryPolicy`:

* the agent's policy (its ``retry_policy=`` option, else the model adapter's
  ``retry_policy`` attribute, else ``RetryPolicy()``) is named beside each
  request header as ``retryPolicy`` (`RetryPolicy.to_json`; a preparer that
  names its own keeps it), passes through the core, and each handler gets
  the policy of the request that failed as ``context.retry_policy``
  (`RetryPolicy.from_json`; a policy that is not one of these, or none, gives
  the agent's);
* `RetryPolicy.delay(failure, attempt)` says how long to wait before the
  retry, or ``None`` to give up: exponential backoff with jitter, at least the
  provider's ``Retry-After`` (``providerRetryAfterMs``), at most
  ``max_attempts`` requests per chain, only for transient failures;
* `retry_request` is a ready request-error handler applying it::

      agent.hooks.request_error.use(retry_request)

Each retry is a new turn: a turn is one run of the model loop (reference
§0), and the failed run has ended — its ``turn/end {kind:'error'}`` is
logged and flushed — before the retry run starts with ``turn/start
{trigger:{kind:'retry'}}`` (R13.3). The failure is therefore durable whatever
happens to the retry, and a cancel between the two turns drops the retry (D2).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from machine.errors import ValidationError
from machine.runtime.signal import Signal
from machine.vocabulary import LlmFailure

if TYPE_CHECKING:
    from machine.runtime.hooks import JsonValue, Next, RequestErrorContext

__all__ = ["RETRY", "RETRYABLE_CODES", "RETRYABLE_STATUSES", "RetryAction", "RetryPolicy",
           "retry_request", "sleep_unless_aborted"]

#: Failure codes worth retrying (the adapters' classification, specs/runtime.md RT15).
RETRYABLE_CODES: Final = frozenset({"RATE_LIMITED", "OVERLOADED", "SERVER_ERROR",
                                    "NETWORK_ERROR", "TIMEOUT", "STREAM_INTERRUPTED"})
#: HTTP statuses worth retrying: request timeout, conflict, rate limit and every 5xx.
RETRYABLE_STATUSES: Final = frozenset({408, 409, 429})


@dataclass(frozen=True, slots=True)
class RetryAction:
    """The request-error result that asks for a retry turn (``{kind:'retry'}``)."""

    def to_json(self) -> dict[str, str]:
        return {"kind": "retry"}


RETRY: Final = RetryAction()
#: The default source of jitter (`RetryPolicy.random`).
_UNIFORM: Final = random.random


def _positive(name: str, value: float, *, zero: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not zero):
        kind = "a non-negative" if zero else "a positive"
        raise ValidationError(f"retry_policy.{name}", f"must be {kind} finite number, not {value!r}")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How request failures are retried (see the module docstring).

    * ``max_attempts``: requests per chain, the first included (3: two retries);
    * the *n*-th retry waits ``min(max_delay, base_delay * multiplier**(n-1))``
      seconds, less a random fraction of up to ``jitter`` of it (``0``: no jitter;
      ``1``: "full jitter", anywhere in ``(0, delay]``), drawn from ``random``;
    * with ``honour_retry_after``, never less than the provider's
      ``providerRetryAfterMs``; a provider asking for more than
      ``max_retry_after`` seconds means no retry;
    * only failures whose ``code`` is in ``retry_codes`` or whose ``status`` is
      in ``retry_statuses`` or at least 500 are retried (the adapters map
      rate limits, overload, server and network failures to such codes;
      authentication, bad requests and context length are never retried).
    """

    max_attempts: int = 3
    base_delay: float = 0.5
    multiplier: float = 2.0
    max_delay: float = 30.0
    jitter: float = 0.5
    honour_retry_after: bool = True
    max_retry_after: float = 60.0
    retry_codes: frozenset[str] = RETRYABLE_CODES
    retry_statuses: frozenset[int] = RETRYABLE_STATUSES
    random: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if type(self.max_attempts) is not int or self.max_attempts < 1:
            raise ValidationError("retry_policy.max_attempts",
                                  f"must be an integer >= 1, not {self.max_attempts!r}")
        _positive("base_delay", self.base_delay)
        _positive("multiplier", self.multiplier, zero=False)
        _positive("max_delay", self.max_delay)
        _positive("max_retry_after", self.max_retry_after)
        _positive("jitter", self.jitter)
        if self.jitter > 1:
            raise ValidationError("retry_policy.jitter", f"must be at most 1, not {self.jitter!r}")
        if not isinstance(self.honour_retry_after, bool):
            raise ValidationError("retry_policy.honour_retry_after", "must be a bool")
        if not callable(self.random):
            raise ValidationError("retry_policy.random", "must be a function returning [0, 1)")
        object.__setattr__(self, "retry_codes", frozenset(self.retry_codes))
        object.__setattr__(self, "retry_statuses", frozenset(self.retry_statuses))

    def to_json(self) -> dict[str, JsonValue]:
        """The policy as JSON: what the runtime names beside each request header (R9.6) and
        gets back in a failed request's request-error payload (R13.2); ``random`` is not part
        of it."""
        return {"maxAttempts": self.max_attempts, "baseDelay": self.base_delay,
                "multiplier": self.multiplier, "maxDelay": self.max_delay, "jitter": self.jitter,
                "honourRetryAfter": self.honour_retry_after,
                "maxRetryAfter": self.max_retry_after,
                "retryCodes": sorted(self.retry_codes),
                "retryStatuses": sorted(self.retry_statuses)}

    @classmethod
    def from_json(cls, value: object, *,
                  random: Callable[[], float] = _UNIFORM) -> RetryPolicy:
        """The policy `to_json` wrote, drawing its jitter from *random*; a `ValidationError`
        names what is wrong otherwise."""
        if not isinstance(value, Mapping):
            raise ValidationError("retry_policy", f"must be a mapping, not {type(value).__name__}")
        unknown = sorted(set(value) - set(_JSON_FIELDS))
        if unknown:
            raise ValidationError("retry_policy", f"unexpected field(s) {unknown}")
        options: dict[str, Any] = {}
        for key, name in _JSON_FIELDS.items():
            if key not in value:
                continue
            item = value[key]
            if name in ("retry_codes", "retry_statuses"):
                kind = str if name == "retry_codes" else int
                if isinstance(item, (str, bytes)) or not isinstance(item, Iterable) or any(
                        type(element) is not kind for element in item):
                    raise ValidationError(f"retry_policy.{key}",
                                          f"must be a list of {kind.__name__}s")
                item = frozenset(item)
            options[name] = item
        return cls(**options, random=random)

    def retryable(self, failure: LlmFailure) -> bool:
        """Whether *failure* is transient: its code or status says a retry may succeed."""
        status = failure.status
        return failure.code in self.retry_codes or (
            status is not None and (status in self.retry_statuses or status >= 500))

    def backoff(self, retry: int) -> float:
        """The exponential delay before the *retry*-th retry (1, 2, …), before jitter."""
        exponent = max(retry - 1, 0)
        try:
            grown = self.base_delay * self.multiplier ** exponent
        except OverflowError:
            grown = math.inf
        return min(self.max_delay, grown)

    def delay(self, failure: LlmFailure, attempt: int) -> float | None:
        """Seconds to wait before retrying after the *attempt*-th consecutive failure of a
        chain (1 for the first), or ``None`` when the policy gives up: the attempts are used
        up, the failure is not transient, or the provider asks for too long a wait."""
        if type(attempt) is not int or attempt < 1:
            raise ValidationError("attempt", f"must be an integer >= 1, not {attempt!r}")
        if attempt >= self.max_attempts or not self.retryable(failure):
            return None
        wait = self.backoff(attempt)
        if self.jitter:
            wait -= wait * self.jitter * min(max(self.random(), 0.0), 1.0)
        after = failure.provider_retry_after_ms
        if self.honour_retry_after and after is not None:
            seconds = max(float(after), 0.0) / 1000
            if seconds > self.max_retry_after:
                return None
            wait = max(wait, seconds)
        return wait


#: The JSON names of a policy's fields (`RetryPolicy.to_json`).
_JSON_FIELDS: Final = {"maxAttempts": "max_attempts", "baseDelay": "base_delay",
                       "multiplier": "multiplier", "maxDelay": "max_delay", "jitter": "jitter",
                       "honourRetryAfter": "honour_retry_after",
                       "maxRetryAfter": "max_retry_after", "retryCodes": "retry_codes",
                       "retryStatuses": "retry_statuses"}


async def sleep_unless_aborted(seconds: float, signal: Signal) -> bool:
    """Wait *seconds*, or less if *signal* is aborted first; True when the full wait passed
    (no wait at all, nor an event loop, for 0 seconds)."""
    if signal.aborted or seconds <= 0:
        return not signal.aborted
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()

    def wake(*_: object) -> None:
        if not woken.done():
            woken.set_result(None)

    timer = loop.call_later(seconds, wake)
    remove = signal.add_listener(wake)
    try:
        await woken
    finally:
        timer.cancel()
        remove()
    return not signal.aborted


async def retry_request(context: RequestErrorContext, next: Next[RetryAction | None]
                        ) -> RetryAction | None:
    """A request-error handler that retries as ``context.retry_policy`` says.

    The rest of the chain is asked first; if it decides nothing (``None``), the policy's
    `RetryPolicy.delay` for this failure is waited out — cut short, with no retry, if the
    turn's signal is aborted meanwhile — and a retry is requested."""
    decided = await next()
    if decided is not None:
        return decided
    wait = context.retry_policy.delay(context.failure, len(context.prior_failures) + 1)
    if wait is None:
        return None
    return RETRY if await sleep_unless_aborted(wait, context.signal) else None
