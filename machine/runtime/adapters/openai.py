"""The OpenAI-compatible Chat Completions adapter, over the official ``openai`` SDK (RT15).

``pip install 'turnstile-agent[openai]'``. One adapter serves every provider that speaks
the Chat Completions streaming API — OpenAI, DeepSeek, vLLM, Ollama, llama.cpp,
LiteLLM and the like — through ``base_url``::

    from machine.runtime import Agent
    from machine.runtime.adapters.openai import OpenAIChat

    model = OpenAIChat("deepseek-chat", base_url="https://api.deepseek.com", provider="deepseek")
    async with Agent(model, tools=[...]) as agent:
        ...

What it maps (each in one place below):

* **history** → ``messages`` (`machine.providers.chat`, specs/providers.md W2, W4): the
  system prompt first; user messages; injected context as user messages labelled by their
  source (``context_label``); assistant messages with their text and ``tool_calls``
  (reasoning only with ``send_reasoning``); each tool result as a ``tool`` message right
  after its calls. Every history makes a request the API accepts: a call the history leaves
  unanswered gets an error result, a message between calls and their results is sent after
  them, and ids and names the API would refuse are sent in a valid form derived from them.
  Each message is encoded once per adapter, and the body is posted through the SDK's
  transport without its per-request transform (W10);
* **tools** → ``tools`` (``function`` specs with their JSON Schema);
* **config** → the request: ``model`` and every option of the header's config
  (``max_tokens``, ``temperature``, ...) in the body;
* **the stream** → chunks: ``content`` deltas as ``text``, ``reasoning_content``
  (DeepSeek) or ``reasoning`` deltas as ``reasoning``, tool-call deltas
  assembled into one ``tool-call`` chunk per call (emitted once the stream is
  complete), and the finish reason: ``stop``/``tool_calls`` → ``stop``,
  ``length`` → ``max-tokens``, ``content_filter`` → an ``error`` finish
  (``CONTENT_FILTERED``); the provider's usage chunk as a usage chunk (cache hits
  subtracted from the prompt count);
* **failures** → `ModelFailure` with `LlmFailure` facts: HTTP status, a code
  from the classification (``RATE_LIMITED``, ``CONTEXT_LENGTH_EXCEEDED``,
  ``AUTHENTICATION_FAILED``, ``SERVER_ERROR``, ``NETWORK_ERROR``,
  ``STREAM_INTERRUPTED``, ``MALFORMED_RESPONSE``, ...), ``Retry-After`` as
  ``providerRetryAfterMs`` and the request id. A chunk that is not JSON, or is
  JSON of the wrong shape (not an object, ``choices`` not a list, a ``delta``
  that is not an object, a tool-call delta without its integer ``index`` or with
  the ``index`` of a call of another ``id``, a field the adapter reads of the
  wrong type), or not UTF-8, is ``MALFORMED_RESPONSE``; fields
  the API may leave out or null (an empty ``choices`` on the usage chunk, a
  choice without ``delta``, a delta without ``content``) are read as absent, and
  fields the adapter does not read are passed over.

The SDK's own retries are off (``max_retries=0``): retrying is the agent's
request-error point, with the adapter's ``retry_policy`` (RT16), and each retry
is a new turn. The turn's signal is honoured at once: an abort gives up the
pending request or read and closes the connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from machine.providers.chat import ChatBodies, chat_request, to_openai_messages, wire_name
from machine.providers.chat import chat_tools as to_openai_tools
from machine.providers.history import original_names
from machine.runtime.adapters.common import (
    NO_KEY,
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
from machine.runtime.adapters.schemas import openai_format
from machine.runtime.hooks import JsonValue
from machine.runtime.model import Chunk, ModelCall
from machine.runtime.retry import RetryPolicy

try:
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
except ImportError as missing:                # pragma: no cover - the extra is not installed
    raise ImportError("machine.runtime.adapters.openai needs the openai SDK: "
                      "pip install 'turnstile-agent[openai]'") from missing

__all__ = ["NO_KEY", "RESERVED_OPTIONS", "OpenAIChat", "to_openai_messages", "to_openai_tools"]

#: The SDK's exception classes, for the failure classification.
ERRORS: Final = SdkErrors(openai.APIStatusError, openai.APIError, openai.APITimeoutError,
                          openai.APIConnectionError)
#: Request fields the adapter sets itself; a config option of these names is refused.
RESERVED_OPTIONS: Final = frozenset({"messages", "stream", "stream_options", "tools"})
_FINISH: Final = {"stop": "stop", "tool_calls": "stop", "function_call": "stop",
                  "length": "max-tokens"}


@dataclass
class _PendingCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIChat:
    """A model adapter for the Chat Completions streaming API (see the module docstring).

    * *model*: the model name; *provider*: how the log's ``request/header`` and the
      assistant messages' source name the provider (``openai``, ``deepseek``, ``vllm``...);
    * *base_url*, *api_key*, *timeout*: the client's (``api_key`` defaults to
      ``OPENAI_API_KEY``; with a *base_url* and no key, the placeholder ``NO_KEY``); or a ready
      ``openai.AsyncOpenAI`` as *client*;
    * *options*: request options logged in the header's config (``max_tokens``,
      ``temperature``, ...; changeable per step in the request waterfall);
    * *retry_policy*: handed to request-error handlers (default ``RetryPolicy()``);
    * *send_reasoning*: send earlier reasoning back as ``reasoning_content`` (DeepSeek's
      thinking mode with tool calls wants it; other providers refuse unknown fields);
    * *label*: how injected context is labelled (default `context_label`; None: not at all);
    * *include_usage*: ask for the usage chunk (``stream_options``); some servers refuse it;
    * *direct*: send the body this adapter encodes (W10) through the client's transport
      (default: for a plain ``AsyncOpenAI`` client) rather than through the SDK's
      ``chat.completions.create``, which transforms the whole history on every request.
    * *native_output*: a run's structured output (RT23) as ``response_format`` ``json_schema``
      (`output_options`); default: only when *provider* is ``openai`` (DeepSeek and most
      compatible servers take JSON mode at most), else the run uses a final-answer tool.
    """

    def __init__(self, model: str, *, provider: str = "openai", base_url: str | None = None,
                 api_key: str | None = None, timeout: float | None = 600.0,
                 client: openai.AsyncOpenAI | None = None,
                 options: Mapping[str, JsonValue] | None = None,
                 retry_policy: RetryPolicy | None = None, send_reasoning: bool = False,
                 label: Labeller | None = context_label, include_usage: bool = True,
                 direct: bool | None = None, native_output: bool | None = None) -> None:
        self.options = adapter_options(model, provider, options, RESERVED_OPTIONS)
        self.model = model
        self.provider = provider
        if client is None:
            client = openai.AsyncOpenAI(base_url=base_url,
                                        api_key=api_key_for(api_key, "OPENAI_API_KEY", base_url),
                                        timeout=timeout, max_retries=0)
        self.client = client
        self.direct = type(client) is openai.AsyncOpenAI if direct is None else direct
        self.retry_policy = retry_policy if retry_policy is not None else RetryPolicy()
        self.send_reasoning = send_reasoning
        self.label = label
        self.include_usage = include_usage
        self._bodies = ChatBodies(send_reasoning=send_reasoning, label=label)
        self.native_output = provider == "openai" if native_output is None else native_output

    def output_options(self, schema: Mapping[str, Any], name: str, description: str | None
                       ) -> dict[str, JsonValue] | None:
        """A run's structured output (RT23) as request options: ``response_format``
        ``json_schema`` (strict when the schema allows it); None without *native_output*."""
        if not self.native_output:
            return None
        return {"response_format": openai_format(schema, name, description)}

    @property
    def default_config(self) -> dict[str, JsonValue]:
        """The seed config: ``{provider, model, **options}`` (P11, P13)."""
        return {"provider": self.provider, "model": self.model, **self.options}

    def request(self, call: ModelCall) -> dict[str, Any]:
        """The request body (without ``stream``) for *call*, as JSON values: what `stream`
        sends (specs/providers.md W4)."""
        return chat_request(call.header, call.messages, model=self.model,
                            options=request_options(call.config, RESERVED_OPTIONS),
                            send_reasoning=self.send_reasoning, label=self.label,
                            include_usage=self.include_usage)

    def body(self, call: ModelCall) -> bytes:
        """The request body `stream` sends for *call*, as bytes: `request`'s body with
        ``stream``, each history message encoded once per adapter (W10)."""
        bodies = self._bodies
        if bodies.send_reasoning != self.send_reasoning or bodies.label is not self.label:
            bodies = self._bodies = ChatBodies(send_reasoning=self.send_reasoning,
                                               label=self.label)
        return bodies.body(call.header, call.messages, model=self.model,
                           options=request_options(call.config, RESERVED_OPTIONS),
                           include_usage=self.include_usage)

    async def _open(self, call: ModelCall) -> openai.AsyncStream[Any]:
        """Send the request. The direct path posts `body`'s bytes through the client, so the
        SDK's transport (auth, base URL, headers, timeout, error types, its streaming) is
        used without its per-request transform of the whole history (W10); a client of
        another class (Azure's rewrites its requests' URLs) gets the SDK's own call."""
        if self.direct:
            return await self.client.post(
                "/chat/completions", cast_to=ChatCompletion, content=self.body(call),
                options={"headers": {"Content-Type": "application/json"}}, stream=True,
                stream_cls=openai.AsyncStream[ChatCompletionChunk])
        body = self.request(call)
        extra = {key: body.pop(key) for key in list(body)
                 if key not in ("model", "messages", "tools", "stream_options")}
        opened: openai.AsyncStream[Any] = await self.client.chat.completions.create(
            stream=True, extra_body=extra or None, **body)
        return opened

    async def stream(self, call: ModelCall) -> AsyncIterator[Chunk]:
        """Stream one request as chunks (see the module docstring)."""
        reader = _Reader()
        received = False
        stream: openai.AsyncStream[Any] | None = None
        try:
            stream = opened = await race_abort(self._open(call), call.signal)
            async with contextlib.aclosing(until_aborted(aiter(opened), call.signal)) as chunks:
                async for chunk in chunks:
                    received = True
                    for out in reader.read(chunk):
                        yield out
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
        names = original_names(call.tools, wire_name)
        for index in sorted(reader.calls):
            pending = reader.calls[index]
            yield {"type": "tool-call", "id": pending.id or f"call-{call.turn}-{call.step}-{index}",
                   "name": names.get(pending.name, pending.name),
                   "arguments": "".join(pending.arguments)}
        for chunk in finish_chunks(self.provider, reader.finish, reader.figures, _FINISH,
                                   "content_filter"):
            yield chunk


@dataclass
class _Reader:
    """The state of one Chat Completions stream: each chunk read as the chunks it makes.

    A chunk of the wrong shape (see the module docstring) raises `MalformedEvent`
    (``MALFORMED_RESPONSE``) rather than whatever reading it would raise; what the API may
    leave out or null is read as absent, and fields the adapter does not read are passed
    over."""

    calls: dict[int, _PendingCall] = field(default_factory=dict)
    finish: str | None = None
    figures: dict[str, int] | None = None

    def read(self, chunk: object) -> list[Chunk]:
        _require_object(chunk, "chunk", "the chunk")
        raw_usage = _optional_object(chunk, "usage", "chunk")
        if raw_usage is not None:
            self.figures = _usage(raw_usage)
        choices = _get(chunk, "choices")
        if not isinstance(choices, list):
            raise MalformedEvent("chunk: choices is missing or not a list")
        out: list[Chunk] = []
        for choice in choices:
            _require_object(choice, "choice", "a choice")
            if _index(choice, "choice") != 0:
                continue
            delta = _optional_object(choice, "delta", "choice")
            if delta is not None:
                reasoning = _reasoning(delta)
                if reasoning:
                    out.append({"type": "reasoning", "text": reasoning})
                content = _text(delta, "content", "delta")
                if content:
                    out.append({"type": "text", "text": content})
                self._tool_calls(delta)
            finish = _text(choice, "finish_reason", "choice")
            if finish is not None:
                self.finish = finish
        return out

    def _tool_calls(self, delta: object) -> None:
        pieces = _get(delta, "tool_calls")
        if pieces is None:
            return
        if not isinstance(pieces, list):
            raise MalformedEvent("delta: tool_calls is not a list")
        for piece in pieces:
            _require_object(piece, "tool call", "a tool call")
            index = _index(piece, "tool call")
            pending = self.calls.setdefault(index, _PendingCall())
            call_id = _text(piece, "id", "tool call")
            if call_id:
                if pending.id and call_id != pending.id:    # two calls would be merged
                    raise MalformedEvent(f"tool call: index {index} is reused by call "
                                         f"{call_id!r} while call {pending.id!r} holds it")
                pending.id = call_id
            function = _optional_object(piece, "function", "tool call")
            if function is not None:
                name = _text(function, "name", "function")
                if name:
                    pending.name += name
                arguments = _text(function, "arguments", "function")
                if arguments:
                    pending.arguments.append(arguments)


# --------------------------------------------------------------------------
# Reading chunks
# --------------------------------------------------------------------------


def _get(owner: object, name: str) -> Any:
    """The field *name* of a chunk part (the SDK's model, its extra fields, or a plain
    mapping), None if absent."""
    if isinstance(owner, Mapping):
        return owner.get(name)
    value = getattr(owner, name, None)
    if value is None:
        extra = getattr(owner, "model_extra", None)
        value = extra.get(name) if isinstance(extra, dict) else None
    return value


def _is_object(value: object) -> bool:
    """Whether *value* is a JSON object as the SDK hands it on: its model or a mapping."""
    return isinstance(value, (Mapping, openai.BaseModel))


def _require_object(value: object, where: str, what: str) -> None:
    if not _is_object(value):
        raise MalformedEvent(f"{where}: {what} is not an object")


def _optional_object(owner: object, name: str, where: str) -> Any:
    """The object field *name* of *owner*, None when absent or null; `MalformedEvent` when it
    is anything else."""
    value = _get(owner, name)
    if value is not None and not _is_object(value):
        raise MalformedEvent(f"{where}: {name} is not an object")
    return value


def _text(owner: object, name: str, where: str) -> str | None:
    """The optional string field *name* of *owner*."""
    value = _get(owner, name)
    if value is not None and not isinstance(value, str):
        raise MalformedEvent(f"{where}: {name} is not a string")
    return value


def _count(owner: object, name: str, where: str) -> int | None:
    """The optional token count *name* of *owner*."""
    return event_count(_get(owner, name), name, where)


def _index(owner: object, where: str) -> int:
    """The ``index`` of a choice or a tool-call delta."""
    return event_index(_get(owner, "index"), where)

# --------------------------------------------------------------------------
# Mapping
# --------------------------------------------------------------------------


def _reasoning(delta: object) -> str | None:
    """DeepSeek's ``reasoning_content`` (or the ``reasoning`` some servers send); not part of
    the API, so a value that is not a string is passed over."""
    for name in ("reasoning_content", "reasoning"):
        value = _get(delta, name)
        if isinstance(value, str) and value:
            return value
    return None


def _usage(raw: object) -> dict[str, int] | None:
    """The usage chunk's figures (OpenAI details; DeepSeek's ``prompt_cache_hit_tokens``)."""
    prompt_details = _optional_object(raw, "prompt_tokens_details", "usage")
    completion_details = _optional_object(raw, "completion_tokens_details", "usage")
    cached = (_count(prompt_details, "cached_tokens", "prompt_tokens_details")
              if prompt_details is not None else None)
    if not cached:
        cached = _count(raw, "prompt_cache_hit_tokens", "usage")
    prompt = _count(raw, "prompt_tokens", "usage")
    # disjoint counts, as the original's usage: the prompt count includes the cache hits
    uncached = None if prompt is None else prompt - (cached or 0)
    return usage(uncached, _count(raw, "completion_tokens", "usage"), cache_read_tokens=cached,
                 reasoning_tokens=_count(completion_details, "reasoning_tokens",
                                         "completion_tokens_details")
                 if completion_details is not None else None)
