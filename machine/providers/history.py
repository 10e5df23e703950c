"""What both request mappings read from a message: its text, its blocks as text, the label of
injected context, a tool call's arguments and the header's tool specs (specs/providers.md W2).

Nothing here imports a provider SDK; the explorer and the conformance checks build requests
with these functions too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Final

from machine.jsonvalue import Frozen, FrozenDict, FrozenList, thaw
from machine.vocabulary import Message

__all__ = ["EMPTY_MESSAGE", "EMPTY_RESULT", "MISSING_RESULT", "OPENING", "Labeller", "block_json",
           "blocks_text", "call_text", "context_label", "label_text", "original_names",
           "parse_arguments", "result_block",
           "result_text", "system_text", "text_of", "tool_specs"]

#: The text of the error result an adapter sends for a call the history leaves unanswered
#: (W2.2).
MISSING_RESULT: Final = "Error: no result was recorded for this call"
#: The text a result with no text is sent with (W2.9: providers refuse empty content).
EMPTY_RESULT: Final = "(no output)"
#: The text a user message with no text is sent with (W2.9).
EMPTY_MESSAGE: Final = "(empty message)"
#: The user message a request opens with when the history gives it no first user message
#: (W2.8).
OPENING: Final = "(conversation so far)"

#: How an adapter labels injected context in a request (`context_label` is the default).
Labeller = Callable[[Message], "str | None"]


def text_of(blocks: Sequence[Frozen], *, kinds: tuple[str, ...] = ("text",)) -> str:
    """The concatenated text of the blocks of the given *kinds*."""
    return "".join(str(b.get("text", "")) for b in blocks
                   if isinstance(b, FrozenDict) and b.get("type") in kinds)


def block_json(block: Frozen) -> str:
    """A block the provider has no form for, as JSON text (so nothing is silently dropped)."""
    return json.dumps(thaw(block), ensure_ascii=False, separators=(",", ":"))


def blocks_text(blocks: Sequence[Frozen]) -> str:
    """Content as text: text blocks as their text, any other block as its JSON text."""
    return "".join(str(b.get("text", "")) if isinstance(b, FrozenDict) and b.get("type") == "text"
                   else block_json(b) for b in blocks)


def context_label(message: Message) -> str | None:
    """The default label of an injected context message in a provider request: ``[context
    from plugin:fs]`` for a plugin's, ``[context from <kind>]`` for any other non-user
    source; None for the user's own messages (steering included) and tool results."""
    source = message.source
    kind = str(source.get("kind"))
    if kind in ("user", "tool"):
        return None
    name = source.get("plugin") if kind == "plugin" else None
    return f"[context from {kind}:{name}]" if isinstance(name, str) else f"[context from {kind}]"


def label_text(label: str | None, text: str) -> str:
    return text if label is None else f"{label}\n{text}" if text else label


def result_block(message: Message) -> FrozenDict | None:
    """The tool-result block of a *tool-result message* (V5: source kind ``tool``, exactly one
    ``tool-result`` block), or None for any other message."""
    content = message.content
    if message.source.get("kind") != "tool" or len(content) != 1:
        return None
    block = content[0]
    return block if isinstance(block, FrozenDict) and block.get("type") == "tool-result" else None


def result_text(message: Message | None) -> tuple[str, bool]:
    """The text a tool-result message is sent with, and whether it is an error: its content's
    text (other blocks as JSON text); `MISSING_RESULT` for None (no result recorded, W2.2);
    `EMPTY_RESULT` for blank text (W2.9)."""
    if message is None:
        return MISSING_RESULT, True
    block = result_block(message)
    assert block is not None
    content = block.get("content")
    text = blocks_text(content) if isinstance(content, FrozenList) else ""
    return (text if text.strip() else EMPTY_RESULT), block.get("isError") is True


def call_text(name: str, call_id: str, arguments: str) -> str:
    """A tool call sent as text (W2.7)."""
    return f"[called tool {name} ({call_id}) with arguments {arguments or '{}'}]"


def parse_arguments(text: str) -> Any:
    """A tool call's argument text as a JSON object for providers that want one (Anthropic):
    the parsed object, ``{}`` for empty text, else ``{"_raw": text}``."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_raw": value}


def tool_specs(tools: Frozen) -> list[tuple[str, str | None, Any]]:
    """(name, description, JSON Schema of the parameters) of the header's tool specs."""
    out: list[tuple[str, str | None, Any]] = []
    for spec in tools if isinstance(tools, FrozenList) else ():
        if not isinstance(spec, FrozenDict) or not isinstance(spec.get("name"), str):
            continue
        description = spec.get("description")
        parameters = spec.get("parameters")
        out.append((str(spec["name"]), description if isinstance(description, str) else None,
                    thaw(parameters) if isinstance(parameters, FrozenDict)
                    else {"type": "object", "properties": {}}))
    return out


def original_names(tools: Frozen, wire_name: Callable[[str], str]) -> dict[str, str]:
    """The header's tool names a provider is sent in another form (W2.6), by that form: a
    call the model makes by the form it was sent is read back as the tool's own name."""
    out: dict[str, str] = {}
    for name, _, _ in tool_specs(tools):
        sent = wire_name(name)
        if sent != name:
            out[sent] = name
    return out


def system_text(system: Frozen) -> str | None:
    """The system prompt as text: a string as it is, text blocks joined, anything else as
    JSON; None when there is none."""
    if system is None:
        return None
    if isinstance(system, str):
        return system
    if isinstance(system, FrozenList) and all(
            isinstance(b, FrozenDict) and b.get("type") == "text" for b in system):
        return text_of(system)
    return block_json(system)
