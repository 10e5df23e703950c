"""The Anthropic Messages adapter, over the official ``anthropic`` SDK (RT15).

``pip install 'turnstile-agent[anthropic]'``::

    from machine.runtime import Agent
    from machine.runtime.adapters.anthropic import AnthropicMessages

    model = AnthropicMessages("claude-sonnet-4-5", options={"max_tokens": 2048})
    async with Agent(model, tools=[...]) as agent:
        ...

The same mapping as the OpenAI-compatible adapter, in the Messages API's terms:

* **history** → ``system`` and ``messages``: user messages and labelled context
  (``context_label``) as user text blocks; assistant messages as ``text``,
  ``thinking`` (when its signature was recorded) and ``tool_use`` blocks; tool
  results as ``tool_result`` blocks of the next user message (consecutive
  messages of one role are merged, as the API wants); unanswered calls get an
  error result;
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
  event mid-stream is classified by its type).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from machine.jsonvalue import Frozen, FrozenDict, FrozenList
from machine.runtime.adapters.common import (
    MISSING_RESULT,
    Aborted,
    Labeller,
    SdkErrors,
    adapter_options,
    block_json,
    context_label,
    finish_chunks,
    label_text,
    missing_result_ids,
    parse_arguments,
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
    import anthropic
except ImportError as missing:                # pragma: no cover - the extra is not installed
    raise ImportError("machine.runtime.adapters.anthropic needs the anthropic SDK: "
                      "pip install 'turnstile-agent[anthropic]'") from missing

__all__ = ["REDACTED_THINKING", "RESERVED_OPTIONS", "SIGNATURE", "AnthropicMessages",
           "to_anthropic_messages", "to_anthropic_tools"]

#: Block types the adapter records so thinking can be sent back (extension blocks, V3).
SIGNATURE: Final = "anthropic/signature"
REDACTED_THINKING: Final = "anthropic/redacted-thinking"
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
    *client*, *options* (``max_tokens`` defaults to 4096), *retry_policy* and *label* as
    for `OpenAIChat`.
    """

    def __init__(self, model: str, *, provider: str = "anthropic", base_url: str | None = None,
                 api_key: str | None = None, timeout: float | None = 600.0,
                 client: anthropic.AsyncAnthropic | None = None,
                 options: Mapping[str, JsonValue] | None = None,
                 retry_policy: RetryPolicy | None = None,
                 label: Labeller | None = context_label) -> None:
        self.options = {"max_tokens": 4096,
                        **adapter_options(model, provider, options, RESERVED_OPTIONS)}
        self.model = model
        self.provider = provider
        if client is None:
            client = anthropic.AsyncAnthropic(
                base_url=base_url, api_key=api_key_for(api_key, "ANTHROPIC_API_KEY", base_url),
                timeout=timeout, max_retries=0)
        self.client = client
        self.retry_policy = retry_policy if retry_policy is not None else RetryPolicy()
        self.label = label

    @property
    def default_config(self) -> dict[str, JsonValue]:
        """The seed config: ``{provider, model, max_tokens, **options}`` (P11, P13)."""
        return {"provider": self.provider, "model": self.model, **self.options}

    def request(self, call: ModelCall) -> dict[str, Any]:
        """The request body (without ``stream``) for *call*."""
        config = call.config
        options = request_options(config, RESERVED_OPTIONS)
        body: dict[str, Any] = {"model": str(config.get("model") or self.model),
                                "max_tokens": options.pop("max_tokens", 4096),
                                "messages": to_anthropic_messages(call.messages,
                                                                  label=self.label)}
        system = system_text(call.system)
        if system is not None:
            body["system"] = system
        tools = to_anthropic_tools(call.tools)
        if tools:
            body["tools"] = tools
        body.update(options)
        return body

    async def stream(self, call: ModelCall) -> AsyncIterator[Chunk]:
        """Stream one request as chunks (see the module docstring)."""
        body = self.request(call)
        extra = {key: body.pop(key) for key in list(body)
                 if key not in ("model", "max_tokens", "messages", "system", "tools")}
        blocks: dict[int, _Block] = {}
        stop: str | None = None
        finished = False
        tokens: dict[str, int | None] = {}
        received = False
        stream: anthropic.AsyncStream[Any] | None = None
        try:
            stream = opened = await race_abort(self.client.messages.create(
                stream=True, extra_body=extra or None, **body), call.signal)
            async with contextlib.aclosing(until_aborted(aiter(opened), call.signal)) as events:
                async for event in events:
                    received = True
                    kind = event.type
                    if kind == "message_start":
                        figures = event.message.usage
                        tokens = {"input": figures.input_tokens,
                                  "output": figures.output_tokens,
                                  "cache_read": getattr(figures, "cache_read_input_tokens", None),
                                  "cache_write": getattr(figures,
                                                         "cache_creation_input_tokens", None)}
                    elif kind == "content_block_start":
                        block = event.content_block
                        started = _Block(block.type)
                        blocks[event.index] = started
                        if block.type == "tool_use":
                            started.id, started.name = block.id, block.name
                        elif block.type == "text" and block.text:
                            yield {"type": "text", "text": block.text}
                        elif block.type == "redacted_thinking":
                            yield {"type": "block", "block": {"type": REDACTED_THINKING,
                                                              "data": str(getattr(block, "data", ""))}}
                    elif kind == "content_block_delta":
                        delta = event.delta
                        current = blocks.setdefault(event.index, _Block("text"))
                        if delta.type == "text_delta":
                            yield {"type": "text", "text": delta.text}
                        elif delta.type == "thinking_delta":
                            yield {"type": "reasoning", "text": delta.thinking}
                        elif delta.type == "input_json_delta":
                            current.parts.append(delta.partial_json)
                        elif delta.type == "signature_delta":
                            current.signature += delta.signature
                    elif kind == "content_block_stop":
                        done = blocks.get(event.index)
                        if done is not None and done.type == "tool_use":
                            yield {"type": "tool-call", "id": done.id, "name": done.name,
                                   "arguments": "".join(done.parts)}
                        elif done is not None and done.type == "thinking" and done.signature:
                            yield {"type": "block", "block": {"type": SIGNATURE,
                                                              "signature": done.signature}}
                    elif kind == "message_delta":
                        if event.delta.stop_reason is not None:
                            stop = event.delta.stop_reason
                        output = getattr(event.usage, "output_tokens", None)
                        if output is not None:
                            tokens["output"] = output
                    elif kind == "message_stop":
                        finished = True
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
        # Anthropic's input_tokens are already the uncached input
        figures_out = usage(tokens.get("input"), tokens.get("output"),
                            cache_read_tokens=tokens.get("cache_read"),
                            cache_write_tokens=tokens.get("cache_write"))
        for chunk in finish_chunks(self.provider, stop if finished else None, figures_out,
                                   _FINISH, "refusal"):
            yield chunk

# --------------------------------------------------------------------------
# Mapping
# --------------------------------------------------------------------------


def to_anthropic_tools(tools: Frozen) -> list[dict[str, Any]]:
    """The header's tool specs as Messages API tools."""
    out: list[dict[str, Any]] = []
    for name, description, parameters in tool_specs(tools):
        tool: dict[str, Any] = {"name": name, "input_schema": parameters}
        if description:
            tool["description"] = description
        out.append(tool)
    return out


def _assistant_blocks(message: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    content = list(message.content)
    for index, block in enumerate(content):
        if not isinstance(block, FrozenDict):
            continue
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            out.append({"type": "text", "text": str(block["text"])})
        elif kind == "reasoning":
            after = content[index + 1] if index + 1 < len(content) else None
            if isinstance(after, FrozenDict) and after.get("type") == SIGNATURE:
                out.append({"type": "thinking", "thinking": str(block.get("text", "")),
                            "signature": str(after.get("signature", ""))})
        elif kind == REDACTED_THINKING:
            out.append({"type": "redacted_thinking", "data": str(block.get("data", ""))})
        elif kind == "tool-call":
            out.append({"type": "tool_use", "id": str(block.get("id")),
                        "name": str(block.get("name")),
                        "input": parse_arguments(str(block.get("arguments", "")))})
    return out


def _result_block(block: FrozenDict) -> dict[str, Any]:
    content = block.get("content")
    text = text_of(content) if isinstance(content, FrozenList) else ""
    out: dict[str, Any] = {"type": "tool_result", "tool_use_id": str(block.get("toolCallId")),
                           "content": text}
    if block.get("isError") is True:
        out["is_error"] = True
    return out


def to_anthropic_messages(messages: Iterable[Message], *,
                          label: Labeller | None = context_label) -> list[dict[str, Any]]:
    """The request's history as Messages API messages (see the module docstring)."""
    history: list[Message] = list(messages)
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for index, message in enumerate(history):
        if message.role == "assistant":
            add("assistant", _assistant_blocks(message))
            add("user", [{"type": "tool_result", "tool_use_id": missing,
                          "content": MISSING_RESULT, "is_error": True}
                         for missing in missing_result_ids(history, index)])
        elif message.source.get("kind") == "tool":
            add("user", [_result_block(b) for b in message.content
                         if isinstance(b, FrozenDict) and b.get("type") == "tool-result"])
        else:                                   # user text, context, or a system message
            text = "".join(str(b.get("text", "")) if isinstance(b, FrozenDict)
                           and b.get("type") == "text" else block_json(b)
                           for b in message.content)
            text = label_text(label(message) if label and message.role == "user" else None, text)
            if text:
                add("user", [{"type": "text", "text": text}])
    return out
