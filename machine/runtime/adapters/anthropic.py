"""The Anthropic Messages adapter, over the official ``anthropic`` SDK (RT15).

``pip install 'turnstile-agent[anthropic]'``::

    from machine.runtime import Agent
    from machine.runtime.adapters.anthropic import AnthropicMessages

    model = AnthropicMessages("claude-sonnet-4-5", options={"max_tokens": 2048})
    async with Agent(model, tools=[...]) as agent:
        ...

The same mapping as the OpenAI-compatible adapter, in the Messages API's terms:

* **history** → ``system`` and ``messages`` (`machine.providers.messages`,
  specs/providers.md W2, W5): user messages and labelled context (``context_label``)
  as user text blocks; assistant messages as ``text``, ``thinking`` (when its signature
  was recorded) and ``tool_use`` blocks; tool results as ``tool_result`` blocks at the
  head of the next user message (consecutive messages of one role are merged). Every
  history makes a request the API accepts: unanswered calls get an error result, ids and
  names are sent in a valid form, and calls are sent as text when the request declares no
  tools (or, with thinking on, when their message has no thinking block);
* **tools** → ``tools`` with ``input_schema``;
* **config** → the request: ``model``, ``max_tokens`` (required by the API; the
  adapter's default is 4096) and every other option of the header's config;
* **the stream** → ``text_delta`` as ``text``, ``thinking_delta`` as
  ``reasoning`` (the block's signature follows as a ``block`` chunk of type
  ``anthropic/signature``, and ``redacted_thinking`` as
  ``anthropic/redacted-thinking``, so both can be sent back), each
  ``tool_use`` block as one ``tool-call`` chunk once its input is complete; the
  stop reason: ``end_turn``/``tool_use``/``stop_sequence``/``pause_turn`` →
  ``stop``, ``max_tokens``/``model_context_window_exceeded`` →
  ``max-tokens``, ``refusal`` → an ``error`` finish (``CONTENT_FILTERED``);
  usage from ``message_start`` and ``message_delta``;
* **failures** → `ModelFailure` with `LlmFailure` facts, classified as for the
  OpenAI adapter (``overloaded_error`` and 529 are ``OVERLOADED``; an ``error``
  event mid-stream is classified by its type; an event that is not JSON or not
  UTF-8, of a known type but missing a field or with one of the wrong type, or
  starting a block at an index already started, is ``MALFORMED_RESPONSE``;
  events, blocks and deltas of unknown types are passed over).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from machine.providers.history import original_names
from machine.providers.messages import (
    DEFAULT_MAX_TOKENS,
    REDACTED_THINKING,
    SIGNATURE,
    MessagesBodies,
    messages_request,
    to_anthropic_messages,
    wire_name,
)
from machine.providers.messages import messages_tools as to_anthropic_tools
from machine.runtime.adapters.common import (
    Aborted,
    Labeller,
    MalformedEvent,
    SdkErrors,
    adapter_options,
    context_label,
    event_count,
    event_index,
    finish_chunks,
    race_abort,
    request_options,
    sdk_failure,
    until_aborted,
    usage,
)
from machine.runtime.adapters.common import api_key as api_key_for
from machine.runtime.adapters.schemas import anthropic_format
from machine.runtime.hooks import JsonValue
from machine.runtime.model import Chunk, ModelCall
from machine.runtime.retry import RetryPolicy

try:
    import anthropic
    from anthropic.types import Message as AnthropicMessage
    from anthropic.types import RawMessageStreamEvent
except ImportError as missing:                # pragma: no cover - the extra is not installed
    raise ImportError("machine.runtime.adapters.anthropic needs the anthropic SDK: "
                      "pip install 'turnstile-agent[anthropic]'") from missing

__all__ = ["REDACTED_THINKING", "RESERVED_OPTIONS", "SIGNATURE", "AnthropicMessages",
           "to_anthropic_messages", "to_anthropic_tools"]

#: Request fields the adapter sets itself.
RESERVED_OPTIONS: Final = frozenset({"messages", "stream", "system", "tools"})
#: The SDK's exception classes, for the failure classification.
ERRORS: Final = SdkErrors(anthropic.APIStatusError, anthropic.APIError,
                          anthropic.APITimeoutError, anthropic.APIConnectionError)
_FINISH: Final = {"end_turn": "stop", "tool_use": "stop", "stop_sequence": "stop",
                  "pause_turn": "stop", "max_tokens": "max-tokens",
                  "model_context_window_exceeded": "max-tokens"}


@dataclass
class _Block:
    type: str
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)
    signature: str = ""


class AnthropicMessages:
    """A model adapter for the Messages streaming API (see the module docstring).

    *model*, *provider* (default ``anthropic``), *base_url*, *api_key* (default
    ``ANTHROPIC_API_KEY``; with a *base_url* and no key, a placeholder), *timeout*,
    *client*, *options* (``max_tokens`` defaults to 4096), *retry_policy*, *label* and
    *direct* as for `OpenAIChat` (direct by default for a plain ``AsyncAnthropic``).
    *native_output*: a run's structured output (RT23) as ``output_config.format``
    ``json_schema`` when the schema allows it (`output_options`), else the run uses a
    final-answer tool.
    """

    def __init__(self, model: str, *, provider: str = "anthropic", base_url: str | None = None,
                 api_key: str | None = None, timeout: float | None = 600.0,
                 client: anthropic.AsyncAnthropic | None = None,
                 options: Mapping[str, JsonValue] | None = None,
                 retry_policy: RetryPolicy | None = None,
                 label: Labeller | None = context_label, direct: bool | None = None,
                 native_output: bool = True) -> None:
        self.options = {"max_tokens": DEFAULT_MAX_TOKENS,
                        **adapter_options(model, provider, options, RESERVED_OPTIONS)}
        self.model = model
        self.provider = provider
        if client is None:
            client = anthropic.AsyncAnthropic(
                base_url=base_url, api_key=api_key_for(api_key, "ANTHROPIC_API_KEY", base_url),
                timeout=timeout, max_retries=0)
        self.client = client
        self.direct = type(client) is anthropic.AsyncAnthropic if direct is None else direct
        self.retry_policy = retry_policy if retry_policy is not None else RetryPolicy()
        self.label = label
        self._bodies = MessagesBodies(label=label)
        self.native_output = native_output

    def output_options(self, schema: Mapping[str, Any], name: str, description: str | None
                       ) -> dict[str, JsonValue] | None:
        """A run's structured output (RT23) as request options: ``output_config.format``;
        None without *native_output* or when the schema has what Anthropic's structured
        outputs refuse (an open object, recursion)."""
        if not self.native_output:
            return None
        format_ = anthropic_format(schema)
        return None if format_ is None else {"output_config": {"format": format_}}

    @property
    def default_config(self) -> dict[str, JsonValue]:
        """The seed config: ``{provider, model, max_tokens, **options}`` (P11, P13)."""
        return {"provider": self.provider, "model": self.model, **self.options}

    def request(self, call: ModelCall) -> dict[str, Any]:
        """The request body (without ``stream``) for *call*, as JSON values: what `stream`
        sends (specs/providers.md W5)."""
        return messages_request(call.header, call.messages, model=self.model,
                                options=self._options(call), label=self.label)

    def body(self, call: ModelCall) -> bytes:
        """The request body `stream` sends for *call*, as bytes: `request`'s body with
        ``stream``, each history message encoded once per adapter (W10)."""
        bodies = self._bodies
        if bodies.label is not self.label:
            bodies = self._bodies = MessagesBodies(label=self.label)
        return bodies.body(call.header, call.messages, model=self.model,
                           options=self._options(call))

    def _options(self, call: ModelCall) -> dict[str, Any]:
        options = request_options(call.config, RESERVED_OPTIONS)
        options.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        return options

    async def _open(self, call: ModelCall) -> anthropic.AsyncStream[Any]:
        """Send the request: `body`'s bytes through the client's transport (see
        `OpenAIChat._open`), or, for a client of another class (Bedrock's and Vertex's
        rewrite their requests), the SDK's own call."""
        if self.direct:
            return await self.client.post(
                "/v1/messages", cast_to=AnthropicMessage, content=self.body(call),
                options={"headers": {"Content-Type": "application/json"}}, stream=True,
                stream_cls=anthropic.AsyncStream[RawMessageStreamEvent])
        body = self.request(call)
        extra = {key: body.pop(key) for key in list(body)
                 if key not in ("model", "max_tokens", "messages", "system", "tools")}
        opened: anthropic.AsyncStream[Any] = await self.client.messages.create(
            stream=True, extra_body=extra or None, **body)
        return opened

    async def stream(self, call: ModelCall) -> AsyncIterator[Chunk]:
        """Stream one request as chunks (see the module docstring)."""
        reader = _Reader(names=original_names(call.tools, wire_name))
        received = False
        stream: anthropic.AsyncStream[Any] | None = None
        try:
            stream = opened = await race_abort(self._open(call), call.signal)
            async with contextlib.aclosing(until_aborted(aiter(opened), call.signal)) as events:
                async for event in events:
                    received = True
                    for chunk in reader.read(event):
                        yield chunk
        except Aborted:
            yield {"type": "finish", "kind": "aborted"}
            return
        except Exception as error:
            failure = sdk_failure(self.provider, error, ERRORS, streamed=received)
            if failure is None:
                raise
            raise failure from None
        finally:
            if stream is not None:
                await stream.close()
        tokens = reader.tokens
        # Anthropic's input_tokens are already the uncached input
        figures_out = usage(tokens.get("input"), tokens.get("output"),
                            cache_read_tokens=tokens.get("cache_read"),
                            cache_write_tokens=tokens.get("cache_write"))
        for chunk in finish_chunks(self.provider, reader.stop if reader.finished else None,
                                   figures_out, _FINISH, "refusal"):
            yield chunk


@dataclass
class _Reader:
    """The state of one Messages stream: each event read as the chunks it makes.

    An event of a known type whose fields are missing or of the wrong type raises
    `MalformedEvent` (``MALFORMED_RESPONSE``) rather than whatever reading it would raise;
    events, blocks and deltas of types the adapter does not know are passed over, as the
    API asks of clients."""

    #: tool names as sent (made valid, W2.6) -> as the agent knows them
    names: dict[str, str] = field(default_factory=dict)
    blocks: dict[int, _Block] = field(default_factory=dict)
    started: set[int] = field(default_factory=set)
    stop: str | None = None
    finished: bool = False
    tokens: dict[str, int | None] = field(default_factory=dict)

    def read(self, event: object) -> list[Chunk]:
        kind = _text(event, "type", "event")
        if kind == "message_start":
            figures = _get(_object(event, "message", kind), "usage")
            self.tokens = {} if figures is None else {
                "input": _count(figures, "input_tokens", kind),
                "output": _count(figures, "output_tokens", kind),
                "cache_read": _count(figures, "cache_read_input_tokens", kind),
                "cache_write": _count(figures, "cache_creation_input_tokens", kind)}
        elif kind == "content_block_start":
            index = _index(event, kind)
            if index in self.started:       # its deltas would join the earlier block's
                raise MalformedEvent(f"{kind}: index {index} is started a second time")
            self.started.add(index)
            block = _object(event, "content_block", kind)
            started = _Block(_text(block, "type", kind))
            self.blocks[index] = started
            if started.type == "tool_use":
                started.id, started.name = _text(block, "id", kind), _text(block, "name", kind)
            elif started.type == "text":
                text = _text(block, "text", kind, default="")
                if text:
                    return [{"type": "text", "text": text}]
            elif started.type == "redacted_thinking":
                return [{"type": "block", "block": {
                    "type": REDACTED_THINKING, "data": _text(block, "data", kind, default="")}}]
        elif kind == "content_block_delta":
            current = self.blocks.setdefault(_index(event, kind), _Block("text"))
            delta = _object(event, "delta", kind)
            delta_kind = _text(delta, "type", kind)
            if delta_kind == "text_delta":
                return [{"type": "text", "text": _text(delta, "text", delta_kind)}]
            if delta_kind == "thinking_delta":
                return [{"type": "reasoning", "text": _text(delta, "thinking", delta_kind)}]
            if delta_kind == "input_json_delta":
                current.parts.append(_text(delta, "partial_json", delta_kind))
            elif delta_kind == "signature_delta":
                current.signature += _text(delta, "signature", delta_kind)
        elif kind == "content_block_stop":
            done = self.blocks.get(_index(event, kind))
            if done is not None and done.type == "tool_use":
                return [{"type": "tool-call", "id": done.id,
                         "name": self.names.get(done.name, done.name),
                         "arguments": "".join(done.parts)}]
            if done is not None and done.type == "thinking" and done.signature:
                return [{"type": "block", "block": {"type": SIGNATURE,
                                                    "signature": done.signature}}]
        elif kind == "message_delta":
            delta = _object(event, "delta", kind)
            if _get(delta, "stop_reason") is not None:
                self.stop = _text(delta, "stop_reason", kind)
            output = _count(_get(event, "usage"), "output_tokens", kind)
            if output is not None:
                self.tokens["output"] = output
        elif kind == "message_stop":
            self.finished = True
        return []


def _get(owner: object, name: str) -> Any:
    """The field *name* of an event (the SDK's model, or a plain mapping), None if absent."""
    if isinstance(owner, Mapping):
        return owner.get(name)
    return getattr(owner, name, None)


def _object(owner: object, name: str, where: str) -> Any:
    """The object field *name* of *owner*; `MalformedEvent` when it is missing or not an
    object."""
    value = _get(owner, name)
    if value is None or isinstance(value, (str, int, float, list)):
        raise MalformedEvent(f"{where}: {name} is missing or not an object")
    return value


def _text(owner: object, name: str, where: str, *, default: str | None = None) -> str:
    """The string field *name* of *owner* (*default* when it is absent, if given)."""
    value = _get(owner, name)
    if value is None and default is not None:
        return default
    if not isinstance(value, str):
        raise MalformedEvent(f"{where}: {name} is missing or not a string")
    return value


def _count(owner: object, name: str, where: str) -> int | None:
    """The optional token count *name* of *owner*."""
    return event_count(_get(owner, name), name, where)


def _index(event: object, where: str) -> int:
    """The block index of a content block event."""
    return event_index(_get(event, "index"), where)
