"""A request of the Messages API, built from a history (specs/providers.md W2, W5).

The mapping of `machine.runtime.adapters.anthropic.AnthropicMessages`, without the SDK:

* the system prompt as the top-level ``system``;
* the plan's units (W2), consecutive units of one role merged into one message (W5.3): an
  assistant message as its ``thinking`` blocks (when their signature was recorded),
  ``redacted_thinking``, non-blank ``text`` and ``tool_use`` blocks; each result as a
  ``tool_result`` block of the user message right after its calls, ahead of any text
  (W5.2); user messages, steering and labelled context (``context_label``) as text blocks;
  system messages as user text; an orphan result as labelled text;
* the header's tool specs as tools with ``input_schema``; ``max_tokens`` and the config's
  other options in the body.

`messages_request` builds the body as JSON values; `MessagesBodies` builds the same body as
bytes, encoding each message once (W10).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from machine.jsonvalue import Frozen, FrozenDict
from machine.providers.chat import orphan_text, result_as_text
from machine.providers.history import (
    EMPTY_MESSAGE,
    OPENING,
    Labeller,
    blocks_text,
    call_text,
    context_label,
    label_text,
    parse_arguments,
    result_text,
    system_text,
    tool_specs,
)
from machine.providers.ids import wire_form
from machine.providers.plan import (
    AssistantUnit,
    IncrementalEncoder,
    OpeningUnit,
    ResultUnit,
    Unit,
    dumps,
    plan_units,
)
from machine.vocabulary import Message

__all__ = ["DEFAULT_MAX_TOKENS", "ID_PATTERN", "NAME_PATTERN", "REDACTED_THINKING", "SIGNATURE",
           "MessagesBodies", "MessagesCodec", "messages_request", "messages_tools",
           "thinking_enabled", "to_anthropic_messages", "wire_name"]

#: Block types the adapter records so thinking can be sent back (extension blocks, V3).
SIGNATURE: Final = "anthropic/signature"
REDACTED_THINKING: Final = "anthropic/redacted-thinking"
#: ``max_tokens`` is required by the API (W5.1); the adapter's default.
DEFAULT_MAX_TOKENS: Final = 4096
#: A tool_use id the API accepts (W5.6).
ID_PATTERN: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_ID_INVALID: Final = re.compile(r"[^a-zA-Z0-9_-]+")
#: A tool name the API accepts (W5.7).
NAME_PATTERN: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def wire_name(name: str) -> str:
    """A tool name as the API accepts it (W2.6)."""
    return wire_form(name, 1, allowed=NAME_PATTERN, invalid=_ID_INVALID, max_length=64,
                     empty="tool")


def _text_block(text: str) -> list[dict[str, Any]]:
    """A text block, or none for text the API refuses as empty (W5.4)."""
    return [{"type": "text", "text": text}] if text.strip() else []


def _thinking_first(blocks: list[dict[str, Any]]) -> bool:
    return bool(blocks) and blocks[0]["type"] in ("thinking", "redacted_thinking")


class MessagesCodec:
    """The Messages API terms of the plan's units (see the module docstring).

    *tools*: the request declares tools, so calls and results can be sent as ``tool_use`` and
    ``tool_result`` blocks (W5.6; else as text, W2.7); *thinking*: the request enables
    thinking, so an assistant message's calls are sent as blocks only when the message opens
    with its thinking (W5.7; else as text)."""

    merges = True

    def __init__(self, *, label: Labeller | None = context_label, tools: bool = True,
                 thinking: bool = False) -> None:
        self.label = label
        self.tools = tools
        self.thinking = thinking

    def sendable(self, message: Message) -> bool:
        return bool(self._assistant(message, (), structured=True))

    def structured(self, message: Message, *, merged: bool = False) -> bool:
        return self.tools and (not self.thinking or (not merged and _thinking_first(
            self._assistant(message, (), structured=True))))

    def opens(self, role: str | None) -> bool:
        return role != "user"                # W5.3: the first message is the user's

    def wire_id(self, call_id: str, taken: int) -> str:
        return wire_form(call_id, taken, allowed=ID_PATTERN, invalid=_ID_INVALID,
                         max_length=64, empty="call")

    def role(self, unit: Unit) -> str:
        return "assistant" if isinstance(unit, AssistantUnit) else "user"

    def encode(self, unit: Unit) -> list[dict[str, Any]]:
        if isinstance(unit, AssistantUnit):
            return self._assistant(unit.message, unit.call_ids, structured=unit.structured)
        if isinstance(unit, ResultUnit):
            if not unit.structured:
                return _text_block(result_as_text(unit.call_id, unit.message))
            text, error = result_text(unit.message)
            out: dict[str, Any] = {"type": "tool_result", "tool_use_id": unit.call_id,
                                   "content": text}
            if error:
                out["is_error"] = True
            return [out]
        if isinstance(unit, OpeningUnit):
            return _text_block(OPENING)
        message = unit.message
        if unit.orphan:
            return _text_block(orphan_text(message))
        if message.role != "user":              # a system message: said only if it says something
            return _text_block(blocks_text(message.content))
        label = self.label(message) if self.label is not None else None
        text = label_text(label, blocks_text(message.content))
        return _text_block(text if text.strip() else EMPTY_MESSAGE)   # W2.9

    @staticmethod
    def _assistant(message: Message, call_ids: Sequence[str], *, structured: bool
                   ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        content = message.content
        calls = iter(call_ids)
        for index, block in enumerate(content):
            if not isinstance(block, FrozenDict):
                continue
            kind = block.get("type")
            if kind == "text":
                out.extend(_text_block(str(block.get("text", ""))))
            elif kind == "reasoning":
                after = content[index + 1] if index + 1 < len(content) else None
                if isinstance(after, FrozenDict) and after.get("type") == SIGNATURE:
                    out.append({"type": "thinking", "thinking": str(block.get("text", "")),
                                "signature": str(after.get("signature", ""))})
            elif kind == REDACTED_THINKING:
                out.append({"type": "redacted_thinking", "data": str(block.get("data", ""))})
            elif kind == "tool-call":
                # asked with no ids (sendable, structured): a call is something to send all
                # the same, under its own id
                wire = next(calls, str(block.get("id")))
                name = wire_name(str(block.get("name")))
                arguments = str(block.get("arguments", ""))
                out.append({"type": "tool_use", "id": wire, "name": name,
                            "input": parse_arguments(arguments)} if structured else
                           {"type": "text", "text": call_text(name, wire, arguments)})
        return out


def to_anthropic_messages(messages: Sequence[Message], *,
                          label: Labeller | None = context_label, tools: bool = True,
                          thinking: bool = False) -> list[dict[str, Any]]:
    """The request's history as Messages API messages (see the module docstring and
    `MessagesCodec` for *tools* and *thinking*)."""
    return plan_units(MessagesCodec(label=label, tools=tools, thinking=thinking), messages)


def messages_tools(tools: Frozen) -> list[dict[str, Any]]:
    """The header's tool specs as Messages API tools (names made valid, W2.6)."""
    out: list[dict[str, Any]] = []
    for name, description, parameters in tool_specs(tools):
        tool: dict[str, Any] = {"name": wire_name(name), "input_schema": parameters}
        if description:
            tool["description"] = description
        out.append(tool)
    return out


def thinking_enabled(options: Mapping[str, Any]) -> bool:
    """Whether the request's options turn thinking on (W5.7)."""
    thinking = options.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")


def _head(header: FrozenDict, options: Mapping[str, Any], *, model: str,
          stream: bool) -> dict[str, Any]:
    config = header.get("config")
    config = config if isinstance(config, FrozenDict) else FrozenDict({})
    rest = dict(options)
    head: dict[str, Any] = {"model": str(config.get("model") or model),
                            "max_tokens": rest.pop("max_tokens", DEFAULT_MAX_TOKENS)}
    if stream:
        head["stream"] = True
    system = system_text(header.get("system"))
    if system is not None:
        head["system"] = system
    tools = messages_tools(header.get("tools"))
    if tools:
        head["tools"] = tools
    head.update(rest)
    return head


def messages_request(header: FrozenDict, messages: Sequence[Message], *, model: str = "",
                     options: Mapping[str, Any] | None = None,
                     label: Labeller | None = context_label, stream: bool = False
                     ) -> dict[str, Any]:
    """The body of a Messages API request for a header and a history, as JSON values
    (*options*: the header config's request options, checked by the caller)."""
    options = options or {}
    body = _head(header, options, model=model, stream=stream)
    body["messages"] = to_anthropic_messages(messages, label=label, tools="tools" in body,
                                             thinking=thinking_enabled(options))
    return body


class MessagesBodies:
    """`messages_request`'s body as the bytes sent, each history message encoded once
    (W10)."""

    def __init__(self, *, label: Labeller | None = context_label, lineages: int = 8) -> None:
        self.label = label
        self._lineages = lineages
        # one encoder per way of sending calls (with or without tools, thinking on or off)
        self._encoders: dict[tuple[bool, bool], IncrementalEncoder] = {}

    def body(self, header: FrozenDict, messages: Sequence[Message], *, model: str = "",
             options: Mapping[str, Any] | None = None, stream: bool = True) -> bytes:
        options = options or {}
        head = _head(header, options, model=model, stream=stream)
        mode = ("tools" in head, thinking_enabled(options))
        encoder = self._encoders.get(mode)
        if encoder is None:
            label = self.label
            encoder = self._encoders[mode] = IncrementalEncoder(
                lambda: MessagesCodec(label=label, tools=mode[0], thinking=mode[1]),
                lineages=self._lineages)
        return encoder.encode(messages, dumps(head)[:-1] + b',"messages":', b"}")
