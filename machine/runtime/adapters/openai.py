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

* **history** → ``messages``: the system prompt first; user messages; injected
  context as user messages labelled by their source (``context_label``);
  assistant messages with their text and ``tool_calls`` (reasoning only with
  ``send_reasoning``); each tool result as a ``tool`` message. A tool call the
  history leaves unanswered (a failed batch) gets an error result, so later
  requests stay valid;
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
  ``providerRetryAfterMs`` and the request id.

The SDK's own retries are off (``max_retries=0``): retrying is the agent's
request-error point, with the adapter's ``retry_policy`` (RT16), and each retry
is a new turn. The turn's signal is honoured at once: an abort gives up the
pending request or read and closes the connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from machine.jsonvalue import Frozen, FrozenDict
from machine.runtime.adapters.common import (
    MISSING_RESULT,
    NO_KEY,
    Aborted,
    Labeller,
    SdkErrors,
    adapter_options,
    block_json,
    context_label,
    finish_chunks,
    label_text,
    missing_result_ids,
    race_abort,
    request_options,
    sdk_failure,
    system_text,
    text_of,
    tool_specs,
    until_aborted,
    usage,
)
from machine.runtime.adapters.common import api_key as api_key_for
from machine.runtime.hooks import JsonValue
from machine.runtime.model import Chunk, ModelCall
from machine.runtime.retry import RetryPolicy
from machine.vocabulary import Message

try:
    import openai
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
    * *include_usage*: ask for the usage chunk (``stream_options``); some servers refuse it.
    """

    def __init__(self, model: str, *, provider: str = "openai", base_url: str | None = None,
                 api_key: str | None = None, timeout: float | None = 600.0,
                 client: openai.AsyncOpenAI | None = None,
                 options: Mapping[str, JsonValue] | None = None,
                 retry_policy: RetryPolicy | None = None, send_reasoning: bool = False,
                 label: Labeller | None = context_label, include_usage: bool = True) -> None:
        self.options = adapter_options(model, provider, options, RESERVED_OPTIONS)
        self.model = model
        self.provider = provider
        if client is None:
            client = openai.AsyncOpenAI(base_url=base_url,
                                        api_key=api_key_for(api_key, "OPENAI_API_KEY", base_url),
                                        timeout=timeout, max_retries=0)
        self.client = client
        self.retry_policy = retry_policy if retry_policy is not None else RetryPolicy()
        self.send_reasoning = send_reasoning
        self.label = label
        self.include_usage = include_usage

    @property
    def default_config(self) -> dict[str, JsonValue]:
        """The seed config: ``{provider, model, **options}`` (P11, P13)."""
        return {"provider": self.provider, "model": self.model, **self.options}

    def request(self, call: ModelCall) -> dict[str, Any]:
        """The request body (without ``stream``) for *call*."""
        config = call.config
        options = request_options(config, RESERVED_OPTIONS)
        body: dict[str, Any] = {
            "model": str(config.get("model") or self.model),
            "messages": to_openai_messages(call.messages, system=system_text(call.system),
                                           send_reasoning=self.send_reasoning,
                                           label=self.label)}
        tools = to_openai_tools(call.tools)
        if tools:
            body["tools"] = tools
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        body.update(options)
        return body

    async def stream(self, call: ModelCall) -> AsyncIterator[Chunk]:
        """Stream one request as chunks (see the module docstring)."""
        body = self.request(call)
        extra = {key: body.pop(key) for key in list(body)
                 if key not in ("model", "messages", "tools", "stream_options")}
        calls: dict[int, _PendingCall] = {}
        finish: str | None = None
        figures: dict[str, int] | None = None
        received = False
        stream: openai.AsyncStream[Any] | None = None
        try:
            stream = opened = await race_abort(self.client.chat.completions.create(
                stream=True, extra_body=extra or None, **body), call.signal)
            async with contextlib.aclosing(until_aborted(aiter(opened), call.signal)) as chunks:
                async for chunk in chunks:
                    received = True
                    if chunk.usage is not None:
                        figures = _usage(chunk.usage)
                    for choice in chunk.choices:
                        if choice.index != 0:
                            continue
                        delta = choice.delta
                        reasoning = _reasoning(delta)
                        if reasoning:
                            yield {"type": "reasoning", "text": reasoning}
                        if delta.content:
                            yield {"type": "text", "text": delta.content}
                        for piece in delta.tool_calls or ():
                            pending = calls.setdefault(piece.index, _PendingCall())
                            if piece.id:
                                pending.id = piece.id
                            if piece.function is not None:
                                if piece.function.name:
                                    pending.name += piece.function.name
                                if piece.function.arguments:
                                    pending.arguments.append(piece.function.arguments)
                        if choice.finish_reason is not None:
                            finish = choice.finish_reason
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
        for index in sorted(calls):
            pending = calls[index]
            yield {"type": "tool-call", "id": pending.id or f"call-{call.turn}-{call.step}-{index}",
                   "name": pending.name, "arguments": "".join(pending.arguments)}
        for chunk in finish_chunks(self.provider, finish, figures, _FINISH, "content_filter"):
            yield chunk

# --------------------------------------------------------------------------
# Mapping
# --------------------------------------------------------------------------


def _reasoning(delta: Any) -> str | None:
    """DeepSeek's ``reasoning_content`` (or the ``reasoning`` some servers send)."""
    for name in ("reasoning_content", "reasoning"):
        value = getattr(delta, name, None)
        if value is None:
            extra = getattr(delta, "model_extra", None)
            value = extra.get(name) if isinstance(extra, dict) else None
        if isinstance(value, str) and value:
            return value
    return None


def _usage(raw: Any) -> dict[str, int] | None:
    """The usage chunk's figures (OpenAI details; DeepSeek's ``prompt_cache_hit_tokens``)."""
    def number(source: Any, name: str) -> int | None:
        value = getattr(source, name, None)
        if value is None:
            extra = getattr(source, "model_extra", None)
            value = extra.get(name) if isinstance(extra, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    prompt_details = getattr(raw, "prompt_tokens_details", None)
    completion_details = getattr(raw, "completion_tokens_details", None)
    cached = number(prompt_details, "cached_tokens") if prompt_details is not None else None
    if not cached:
        cached = number(raw, "prompt_cache_hit_tokens")
    prompt = number(raw, "prompt_tokens")
    # disjoint counts, as the original's usage: the prompt count includes the cache hits
    uncached = None if prompt is None else prompt - (cached or 0)
    return usage(uncached, number(raw, "completion_tokens"), cache_read_tokens=cached,
                 reasoning_tokens=number(completion_details, "reasoning_tokens")
                 if completion_details is not None else None)


def to_openai_tools(tools: Frozen) -> list[dict[str, Any]]:
    """The header's tool specs as Chat Completions ``function`` tools."""
    out: list[dict[str, Any]] = []
    for name, description, parameters in tool_specs(tools):
        function: dict[str, Any] = {"name": name, "parameters": parameters}
        if description:
            function["description"] = description
        out.append({"type": "function", "function": function})
    return out


def _user_content(message: Message, label: str | None) -> str:
    """A user message's content as text: its text blocks, any other block as JSON text,
    after the context *label* if there is one."""
    text = "".join(str(b.get("text", "")) if isinstance(b, FrozenDict) and b.get("type") == "text"
                   else block_json(b) for b in message.content)
    return label_text(label, text)


def to_openai_messages(messages: Iterable[Message], *, system: str | None = None,
                       send_reasoning: bool = False, label: Labeller | None = context_label
                       ) -> list[dict[str, Any]]:
    """The request's history as Chat Completions messages (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if system is not None:
        out.append({"role": "system", "content": system})
    history: list[Message] = list(messages)
    for index, message in enumerate(history):
        kind = message.source.get("kind")
        if message.role == "system":
            out.append({"role": "system", "content": text_of(message.content)})
        elif message.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant",
                                     "content": text_of(message.content) or None}
            calls = [{"id": str(b.get("id")), "type": "function",
                      "function": {"name": str(b.get("name")),
                                   "arguments": str(b.get("arguments", ""))}}
                     for b in message.content
                     if isinstance(b, FrozenDict) and b.get("type") == "tool-call"]
            if calls:
                entry["tool_calls"] = calls
            reasoning = text_of(message.content, kinds=("reasoning",))
            if send_reasoning and reasoning:
                entry["reasoning_content"] = reasoning
            out.append(entry)
            out.extend({"role": "tool", "tool_call_id": missing, "content": MISSING_RESULT}
                       for missing in missing_result_ids(history, index))
        elif kind == "tool":
            for block in message.content:
                if isinstance(block, FrozenDict) and block.get("type") == "tool-result":
                    content = block.get("content")
                    out.append({"role": "tool", "tool_call_id": str(block.get("toolCallId")),
                                "content": text_of(content) if isinstance(content, tuple)
                                else ""})
        else:
            out.append({"role": "user",
                        "content": _user_content(message, label(message) if label else None)})
    return out
