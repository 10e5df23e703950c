"""What the provider adapters share (specs/runtime.md RT15): failure classification, usage,
the last chunks of a stream and prompt cancellation. The history helpers live in
`machine.providers.history` (with the requests they build, specs/providers.md) and are
named here too.

Nothing here imports a provider SDK.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from machine.errors import ValidationError
from machine.jsonvalue import FrozenDict, thaw
from machine.providers.history import (
    MISSING_RESULT,
    Labeller,
    block_json,
    context_label,
    label_text,
    parse_arguments,
    system_text,
    text_of,
    tool_specs,
)
from machine.runtime.failures import ModelFailure
from machine.runtime.hooks import JsonValue
from machine.runtime.model import Chunk
from machine.runtime.signal import Signal
from machine.vocabulary import LlmFailure

__all__ = [
    "AUTHENTICATION_FAILED", "BAD_REQUEST", "CONTENT_FILTERED", "CONTEXT_LENGTH_EXCEEDED",
    "MALFORMED_RESPONSE", "MISSING_RESULT", "NETWORK_ERROR", "NOT_FOUND", "NO_KEY", "OVERLOADED",
    "PERMISSION_DENIED", "PROVIDER_ERROR", "QUOTA_EXCEEDED", "RATE_LIMITED", "REQUEST_TOO_LARGE",
    "SERVER_ERROR", "STREAM_INTERRUPTED", "TIMEOUT", "Aborted", "Labeller", "MalformedEvent",
    "SdkErrors",
    "adapter_options", "api_key", "block_json", "classify_status", "closing_chunks",
    "context_label", "event_count", "event_index", "finish_chunks", "http_failure",
    "is_transport_error", "label_text",
    "parse_arguments", "race_abort", "refuse_reserved", "request_options",
    "retry_after_ms", "sdk_failure", "stream_failure", "system_text", "text_of", "tool_specs",
    "until_aborted", "usage",
]

T = TypeVar("T")

# The failure codes the adapters report (LlmFailure.code; RETRYABLE_CODES in retry.py are the
# transient ones).
RATE_LIMITED: Final = "RATE_LIMITED"
QUOTA_EXCEEDED: Final = "QUOTA_EXCEEDED"
OVERLOADED: Final = "OVERLOADED"
SERVER_ERROR: Final = "SERVER_ERROR"
AUTHENTICATION_FAILED: Final = "AUTHENTICATION_FAILED"
PERMISSION_DENIED: Final = "PERMISSION_DENIED"
NOT_FOUND: Final = "NOT_FOUND"
CONTEXT_LENGTH_EXCEEDED: Final = "CONTEXT_LENGTH_EXCEEDED"
REQUEST_TOO_LARGE: Final = "REQUEST_TOO_LARGE"
BAD_REQUEST: Final = "BAD_REQUEST"
NETWORK_ERROR: Final = "NETWORK_ERROR"
TIMEOUT: Final = "TIMEOUT"
STREAM_INTERRUPTED: Final = "STREAM_INTERRUPTED"
MALFORMED_RESPONSE: Final = "MALFORMED_RESPONSE"
CONTENT_FILTERED: Final = "CONTENT_FILTERED"
PROVIDER_ERROR: Final = "PROVIDER_ERROR"

_CONTEXT_CODES: Final = frozenset({"context_length_exceeded", "string_above_max_length",
                                   "model_context_window_exceeded"})
_CONTEXT_TEXT: Final = re.compile(r"context[ _-]?(length|window)|maximum context|prompt is too "
                                  r"long|too many (input )?tokens|reduce the length", re.I)
#: Provider error types and codes (OpenAI ``code``/``type``, Anthropic ``error.type``).
_BY_TYPE: Final = {
    "rate_limit_error": RATE_LIMITED, "rate_limit_exceeded": RATE_LIMITED,
    "insufficient_quota": QUOTA_EXCEEDED, "overloaded_error": OVERLOADED,
    "overloaded": OVERLOADED, "authentication_error": AUTHENTICATION_FAILED,
    "invalid_api_key": AUTHENTICATION_FAILED, "permission_error": PERMISSION_DENIED,
    "not_found_error": NOT_FOUND, "model_not_found": NOT_FOUND,
    "request_too_large": REQUEST_TOO_LARGE, "api_error": SERVER_ERROR,
    "server_error": SERVER_ERROR, "timeout_error": TIMEOUT,
}


# --------------------------------------------------------------------------
# Failures
# --------------------------------------------------------------------------


def _error_fields(body: object) -> tuple[str | None, str | None, str | None]:
    """(type, code, message) of a provider error body (``{error: {...}}`` or the inner
    object)."""
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        body = body["error"]
    if not isinstance(body, Mapping):
        return None, None, None
    kind, code, message = body.get("type"), body.get("code"), body.get("message")
    return (kind if isinstance(kind, str) else None,
            code if isinstance(code, str) else None,
            message if isinstance(message, str) else None)


def classify_status(status: int | None, body: object = None, message: str = "") -> str:
    """The failure code of an HTTP error (or of an error event, *status* 200 or None)."""
    kind, code, text = _error_fields(body)
    words = " ".join(part for part in (text, message) if part)
    if code in _CONTEXT_CODES or kind in _CONTEXT_CODES or (
            status in (400, 413, 422, None, 200) and _CONTEXT_TEXT.search(words)):
        return CONTEXT_LENGTH_EXCEEDED
    if status == 429:
        return QUOTA_EXCEEDED if _BY_TYPE.get(code or kind or "") == QUOTA_EXCEEDED \
            else RATE_LIMITED
    for name in (code, kind):
        if name is not None and name in _BY_TYPE:
            return _BY_TYPE[name]
    if status is None or status == 200:
        return PROVIDER_ERROR
    return {401: AUTHENTICATION_FAILED, 403: PERMISSION_DENIED, 404: NOT_FOUND, 408: TIMEOUT,
            413: REQUEST_TOO_LARGE, 503: OVERLOADED, 529: OVERLOADED}.get(
        status, SERVER_ERROR if status >= 500 else BAD_REQUEST if 400 <= status < 500
        else PROVIDER_ERROR)


def retry_after_ms(headers: Mapping[str, str] | None, *, now: float | None = None
                   ) -> float | None:
    """The wait a response asks for: ``retry-after-ms``, else ``retry-after`` (seconds, or an
    HTTP date), in milliseconds; None when absent or unreadable."""
    if not headers:
        return None
    lowered = {name.lower(): value for name, value in headers.items()}
    raw = lowered.get("retry-after-ms")
    if raw is not None:
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if 0 <= value < float("inf"):
            return value
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not 0 <= seconds < float("inf"):
        return 0.0 if seconds < 0 else None
    return seconds * 1000


def http_failure(provider: str, status: int | None, message: str, *, body: object = None,
                 headers: Mapping[str, str] | None = None, request_id: str | None = None
                 ) -> ModelFailure:
    """A `ModelFailure` for a provider error: its code (`classify_status`), status, the
    Retry-After wait as ``providerRetryAfterMs`` and the request id."""
    code = classify_status(status, body, message)
    _, _, text = _error_fields(body)
    detail = text or message or "request failed"
    where = f"{provider} {status}" if status not in (None, 200) else provider
    return ModelFailure(f"{where}: {detail}", code,
                        status=status if status not in (None, 200) else None,
                        retry_after_ms=retry_after_ms(headers), request_id=request_id)


def is_transport_error(exc: BaseException) -> bool:
    """Whether *exc* is the HTTP client's transport error (httpx, httpcore and their
    successors, which the SDKs let through mid-stream in some versions)."""
    module = type(exc).__module__.split(".")[0]
    return module.startswith(("httpx", "httpcore", "h11", "anyio")) or isinstance(
        exc, (ConnectionError, asyncio.IncompleteReadError))


@dataclass(frozen=True, slots=True)
class SdkErrors:
    """An SDK's exception classes (``openai`` and ``anthropic`` share their shapes)."""

    status: type[Exception]          # APIStatusError: status_code, message, body, response
    api: type[Exception]             # APIError: message, body
    timeout: type[Exception]         # APITimeoutError
    connection: type[Exception]      # APIConnectionError


def sdk_failure(provider: str, error: Exception, errors: SdkErrors, *, streamed: bool
                ) -> ModelFailure | None:
    """The `ModelFailure` for what a request or its stream raised (*streamed*: after the
    first event), or None when it is not a provider failure (then it is a bug: a generic
    failure of the turn)."""
    if isinstance(error, errors.status):
        headers = getattr(getattr(error, "response", None), "headers", None)
        return http_failure(provider, getattr(error, "status_code", None),
                            str(getattr(error, "message", error)), body=getattr(error, "body", None),
                            headers=dict(headers) if headers is not None else None,
                            request_id=getattr(error, "request_id", None))
    if isinstance(error, errors.timeout):
        return ModelFailure(f"{provider}: the request timed out", TIMEOUT)
    if isinstance(error, errors.connection):
        cause = error.__cause__
        detail = f": {cause}" if cause is not None else ""
        if streamed:
            return ModelFailure(f"{provider}: the stream was cut off{detail}", STREAM_INTERRUPTED)
        return ModelFailure(f"{provider}: connection failed{detail}", NETWORK_ERROR)
    if isinstance(error, errors.api):
        return http_failure(provider, None, str(getattr(error, "message", error)),
                            body=getattr(error, "body", None))
    return stream_failure(provider, error, streamed=streamed)


def finish_chunks(provider: str, reason: str | None, figures: Mapping[str, int] | None,
                  kinds: Mapping[str, str], filtered: str) -> list[Chunk]:
    """The closing chunks for the provider's stop *reason* (None: the stream ended without
    one, a `STREAM_INTERRUPTED` failure): its finish kind in *kinds*, an ``error`` finish
    with `CONTENT_FILTERED` for *filtered*, ``UNKNOWN_FINISH`` for any other reason."""
    if reason is None:
        raise ModelFailure(f"{provider}: the stream ended without its finish", STREAM_INTERRUPTED)
    kind = kinds.get(reason)
    if kind is not None:
        return closing_chunks(kind, figures)
    code = CONTENT_FILTERED if reason == filtered else "UNKNOWN_FINISH"
    return closing_chunks("error", figures, LlmFailure(
        f"{provider}: the response stopped ({reason})", code))


def adapter_options(model: str, provider: str, options: Mapping[str, JsonValue] | None,
                    reserved: frozenset[str]) -> dict[str, JsonValue]:
    """Check an adapter's names and options (`ValidationError`); the options as a dict."""
    if not isinstance(model, str) or not model:
        raise ValidationError("model", "must be a non-empty string")
    if not isinstance(provider, str) or not provider:
        raise ValidationError("provider", "must be a non-empty string")
    out = dict(options or {})
    refuse_reserved(out, reserved | {"provider", "model"}, "options")
    return out


def request_options(config: FrozenDict, reserved: frozenset[str]) -> dict[str, Any]:
    """The request options of a header's config — everything but ``provider`` and
    ``model`` — as plain JSON; `ValidationError` for an option the adapter sets itself."""
    options = {key: thaw(value) for key, value in config.items()
               if key not in ("provider", "model")}
    refuse_reserved(options, reserved, "config")
    return options


def refuse_reserved(options: Mapping[str, object], reserved: frozenset[str], where: str) -> None:
    clash = reserved.intersection(options)
    if clash:
        raise ValidationError(where, f"{', '.join(sorted(clash))} may not be set as request "
                              "options (the adapter sets them)")


def api_key(given: str | None, variable: str, base_url: str | None) -> str:
    """The key to use: *given*, else the environment *variable*, else — for a *base_url*,
    a local server that may want none — the placeholder `NO_KEY`."""
    key = given if given is not None else os.environ.get(variable)
    if key is not None:
        return key
    if base_url is None:
        raise ValidationError("api_key", f"is required (or set {variable})")
    return NO_KEY


#: The key sent to a *base_url* when none is given (local servers ignore it; the SDKs need one).
NO_KEY: Final = "no-key"


class MalformedEvent(ValueError):
    """A stream event that is JSON but not of the provider's shape (a field missing or of
    the wrong type), found by an adapter as it reads the event: `MALFORMED_RESPONSE`."""


def event_count(value: object, name: str, where: str) -> int | None:
    """An optional token count read from a stream event (absent: None); `MalformedEvent`
    when it is there but not an integer."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise MalformedEvent(f"{where}: {name} is not an integer")
    return value


def event_index(value: object, where: str) -> int:
    """The ``index`` of a stream event's part (a block, a choice, a tool-call delta);
    `MalformedEvent` when it is missing or not an integer."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedEvent(f"{where}: index is missing or not an integer")
    return value


def stream_failure(provider: str, exc: BaseException, *, streamed: bool) -> ModelFailure | None:
    """A failure for an exception that is not the SDK's own API error: a torn or malformed
    stream; None when *exc* is neither (it is then a bug, and a generic failure)."""
    if isinstance(exc, UnicodeDecodeError):     # the SDK decodes each SSE line as UTF-8
        return ModelFailure(f"{provider}: malformed stream event: it is not UTF-8 ({exc})",
                            MALFORMED_RESPONSE)
    if isinstance(exc, (json.JSONDecodeError, MalformedEvent)) or (
            type(exc).__name__ == "ValidationError" and "pydantic" in type(exc).__module__):
        return ModelFailure(f"{provider}: malformed stream event: {exc}", MALFORMED_RESPONSE)
    if is_transport_error(exc):
        if streamed:
            return ModelFailure(f"{provider}: the stream was cut off: {exc}", STREAM_INTERRUPTED)
        return ModelFailure(f"{provider}: connection failed: {exc}", NETWORK_ERROR)
    return None


# --------------------------------------------------------------------------
# The end of a stream: finish and usage
# --------------------------------------------------------------------------


def usage(uncached_input_tokens: int | None, output_tokens: int | None, *,
          cache_read_tokens: int | None = None, cache_write_tokens: int | None = None,
          reasoning_tokens: int | None = None) -> dict[str, int] | None:
    """The usage figures in the original's shape (its ``TokenUsage``): ``inputTokens``,
    ``outputTokens``, and when known ``cacheReadTokens``, ``cacheWriteTokens``,
    ``reasoningTokens``. The counts are disjoint: ``inputTokens`` is the *uncached* input,
    so a provider that folds cache hits into its prompt count has them subtracted by its
    adapter before they come here. None when the provider reported none."""
    if uncached_input_tokens is None and output_tokens is None:
        return None
    out: dict[str, int] = {"inputTokens": max(uncached_input_tokens or 0, 0),
                           "outputTokens": output_tokens or 0}
    for name, value in (("cacheReadTokens", cache_read_tokens),
                        ("cacheWriteTokens", cache_write_tokens),
                        ("reasoningTokens", reasoning_tokens)):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out[name] = value
    return out


def closing_chunks(kind: str, figures: Mapping[str, int] | None,
                   failure: LlmFailure | None = None) -> list[Chunk]:
    """The last chunks of a stream: a usage chunk ``{type:'usage', usage}`` when the provider
    reported figures (usage is its own chunk, V18, P12, as in the original), then the
    finish chunk."""
    chunks: list[Chunk] = []
    if figures:
        chunks.append({"type": "usage", "usage": dict(figures)})
    finish: dict[str, Any] = {"type": "finish", "kind": kind}
    if failure is not None:
        finish["failure"] = failure.to_json()
    chunks.append(finish)
    return chunks


# --------------------------------------------------------------------------
# Prompt cancellation: a read is given up as soon as the turn's signal is aborted
# --------------------------------------------------------------------------


class Aborted(Exception):
    """The turn's signal was aborted while the adapter waited for the provider."""


async def race_abort(awaitable: Awaitable[T], signal: Signal) -> T:
    """Await *awaitable*, unless *signal* is aborted first: then it is cancelled and
    `Aborted` is raised (the provider's connection is closed by the caller)."""
    if signal.aborted:
        close = getattr(awaitable, "close", None)
        if callable(close):
            close()                         # a coroutine that will never run
        raise Aborted
    task = asyncio.ensure_future(awaitable)
    aborted: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_cause: object) -> None:
        if not aborted.done():
            aborted.set_result(None)

    remove = signal.add_listener(wake)
    try:
        await asyncio.wait((task, aborted), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        remove()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait((task,))             # (a cancellation of our own still propagates)
    if not task.cancelled():
        task.exception()                    # what the given-up read raised no longer matters
    raise Aborted


async def until_aborted(source: AsyncIterator[T], signal: Signal) -> AsyncGenerator[T, None]:
    """The items of *source*, each read raced against *signal* (`race_abort`)."""
    while True:
        try:
            item = await race_abort(anext(source), signal)
        except StopAsyncIteration:
            return
        yield item

