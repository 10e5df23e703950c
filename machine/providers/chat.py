"""A request of the Chat Completions API, built from a history (specs/providers.md W2, W4).

The mapping of `machine.runtime.adapters.openai.OpenAIChat`, without the SDK:

* the system prompt first, as a ``system`` message;
* the plan's units (W2): an assistant message with its text (``content``, null when it only
  calls tools), its ``tool_calls`` and, with ``send_reasoning``, its reasoning as
  ``reasoning_content``; each result as a ``tool`` message right after its calls; user
  messages, steering and injected context (labelled by their source, ``context_label``) as
  ``user`` messages; system messages in place; an orphan result as a labelled user message;
* the header's tool specs as ``function`` tools; its config's options in the body.

`chat_request` builds the body as JSON values; `ChatBodies` builds the same body as bytes,
encoding each message once (W10).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from machine.jsonvalue import Frozen, FrozenDict
from machine.providers.history import (
    EMPTY_MESSAGE,
    OPENING,
    Labeller,
    blocks_text,
    context_label,
    label_text,
    result_block,
    result_text,
    system_text,
    text_of,
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

__all__ = ["CALL_ID_MAX", "NAME_PATTERN", "ChatBodies", "ChatCodec", "chat_request",
           "chat_tools", "orphan_text", "result_as_text", "to_openai_messages", "wire_name"]

#: A function name the API accepts (W4.4, W4.6).
NAME_PATTERN: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_NAME_INVALID: Final = re.compile(r"[^a-zA-Z0-9_-]+")
#: The longest tool call id the API accepts (W4.4).
CALL_ID_MAX: Final = 40
_ID_ALLOWED: Final = re.compile(r"[\x21-\x7e]{1,40}")
_ID_INVALID: Final = re.compile(r"[^\x21-\x7e]+")


#: An empty request opens with this (W2.8, W4.1: messages may not be empty).
_OPENING: Final = {"role": "user", "content": OPENING}


def wire_name(name: str) -> str:
    """A tool name as the API accepts it (W2.6)."""
    return wire_form(name, 1, allowed=NAME_PATTERN, invalid=_NAME_INVALID, max_length=64,
                     empty="tool")


def orphan_text(message: Message) -> str:
    """How a tool result that answers no call is sent: as text naming the call (W2.4)."""
    block = result_block(message)
    assert block is not None
    return result_as_text(str(block.get("toolCallId")), message)


def result_as_text(call_id: str, message: Message | None) -> str:
    """A call's result as text naming the call (W2.4, W2.7)."""
    text, error = result_text(message)
    return label_text(f"[result of tool call {call_id}{' (error)' if error else ''}]", text)


class ChatCodec:
    """The Chat Completions terms of the plan's units (see the module docstring)."""

    merges = False

    def __init__(self, *, send_reasoning: bool = False, label: Labeller | None = context_label
                 ) -> None:
        self.send_reasoning = send_reasoning
        self.label = label

    def sendable(self, message: Message) -> bool:
        # W2.1: an assistant message with no text and no calls has nothing the API takes
        return bool(text_of(message.content).strip() or message.tool_calls or (
            self.send_reasoning and text_of(message.content, kinds=("reasoning",))))

    def structured(self, message: Message, *, merged: bool = False) -> bool:
        return True

    def opens(self, role: str | None) -> bool:
        return False          # any role may come first; an empty request: `_opened`

    def wire_id(self, call_id: str, taken: int) -> str:
        return wire_form(call_id, taken, allowed=_ID_ALLOWED, invalid=_ID_INVALID,
                         max_length=CALL_ID_MAX, empty="call")

    def role(self, unit: Unit) -> str:
        if isinstance(unit, AssistantUnit):
            return "assistant"
        if isinstance(unit, ResultUnit):
            return "tool"
        if isinstance(unit, OpeningUnit):
            return "user"
        return "system" if unit.message.role == "system" and not unit.orphan else "user"

    def encode(self, unit: Unit) -> list[dict[str, Any]]:
        if isinstance(unit, AssistantUnit):
            return [self._assistant(unit)]
        if isinstance(unit, ResultUnit):
            return [{"role": "tool", "tool_call_id": unit.call_id,
                     "content": result_text(unit.message)[0]}]
        if isinstance(unit, OpeningUnit):
            return [dict(_OPENING)]
        message = unit.message
        if unit.orphan:
            return [{"role": "user", "content": orphan_text(message)}]
        if message.role == "system":
            text = blocks_text(message.content)
            return [{"role": "system", "content": text}] if text.strip() else []
        label = self.label(message) if self.label is not None else None
        text = label_text(label, blocks_text(message.content))
        # W2.9: the API refuses empty content, and the user did say something
        return [{"role": "user", "content": text if text.strip() else EMPTY_MESSAGE}]

    def _assistant(self, unit: AssistantUnit) -> dict[str, Any]:
        message = unit.message
        text = text_of(message.content)
        calls = message.tool_calls
        entry: dict[str, Any] = {"role": "assistant",
                                 "content": text if text.strip() else None if calls else ""}
        if calls:
            entry["tool_calls"] = [
                {"id": wire, "type": "function",
                 "function": {"name": wire_name(str(call.get("name"))),
                              "arguments": str(call.get("arguments", ""))}}
                for call, wire in zip(calls, unit.call_ids, strict=True)]
        reasoning = text_of(message.content, kinds=("reasoning",))
        if self.send_reasoning and reasoning:
            entry["reasoning_content"] = reasoning
        return entry


def to_openai_messages(messages: Sequence[Message], *, system: str | None = None,
                       send_reasoning: bool = False, label: Labeller | None = context_label
                       ) -> list[dict[str, Any]]:
    """The request's history as Chat Completions messages (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if system is not None:
        out.append({"role": "system", "content": system})
    out.extend(plan_units(ChatCodec(send_reasoning=send_reasoning, label=label), messages))
    return out or [_OPENING]


def chat_tools(tools: Frozen) -> list[dict[str, Any]]:
    """The header's tool specs as Chat Completions ``function`` tools (names made valid,
    W2.6)."""
    out: list[dict[str, Any]] = []
    for name, description, parameters in tool_specs(tools):
        function: dict[str, Any] = {"name": wire_name(name), "parameters": parameters}
        if description:
            function["description"] = description
        out.append({"type": "function", "function": function})
    return out


def _head(header: FrozenDict, options: Mapping[str, Any], *, model: str, include_usage: bool,
          stream: bool) -> dict[str, Any]:
    """The body's fields but its messages (W4)."""
    config = header.get("config")
    config = config if isinstance(config, FrozenDict) else FrozenDict({})
    head: dict[str, Any] = {"model": str(config.get("model") or model)}
    if stream:
        head["stream"] = True
    tools = chat_tools(header.get("tools"))
    if tools:
        head["tools"] = tools
    if include_usage:
        head["stream_options"] = {"include_usage": True}
    head.update(options)
    return head


def chat_request(header: FrozenDict, messages: Sequence[Message], *, model: str = "",
                 options: Mapping[str, Any] | None = None, send_reasoning: bool = False,
                 label: Labeller | None = context_label, include_usage: bool = True,
                 stream: bool = False) -> dict[str, Any]:
    """The body of a Chat Completions request for a header and a history, as JSON values
    (*options*: the header config's request options, checked by the caller)."""
    body = _head(header, options or {}, model=model, include_usage=include_usage,
                 stream=stream)
    body["messages"] = to_openai_messages(messages, system=system_text(header.get("system")),
                                          send_reasoning=send_reasoning, label=label)
    return body


class ChatBodies:
    """`chat_request`'s body as the bytes sent, each history message encoded once (W10)."""

    def __init__(self, *, send_reasoning: bool = False, label: Labeller | None = context_label,
                 lineages: int = 8) -> None:
        self.send_reasoning = send_reasoning
        self.label = label
        self._encoder = IncrementalEncoder(
            lambda: ChatCodec(send_reasoning=send_reasoning, label=label), lineages=lineages)

    def body(self, header: FrozenDict, messages: Sequence[Message], *, model: str = "",
             options: Mapping[str, Any] | None = None, include_usage: bool = True,
             stream: bool = True) -> bytes:
        head = _head(header, options or {}, model=model, include_usage=include_usage,
                     stream=stream)
        system = system_text(header.get("system"))
        return self._encoder.encode(
            messages, dumps(head)[:-1] + b',"messages":', b"}",
            first=dumps({"role": "system", "content": system}) if system is not None else b"",
            empty=dumps(_OPENING))          # W4.1: never no message at all
