"""What the providers refuse, as code: the validators of a request body (specs/providers.md
W3–W5).

`chat_refusals` checks a Chat Completions body and `messages_refusals` a Messages API body.
Each returns the refusals in body order, each naming its rule (``W4.5``), its position in the
body and the provider's own wording; an empty list means the provider accepts the body as far
as these rules go. Where the provider's rule is uncertain (specs/providers.md says which),
the check is the stricter reading, so a body these validators accept is accepted whichever
reading is right. `error_body` turns a refusal into the provider's HTTP 400 body (the fake
servers answer with it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = ["CHAT", "MESSAGES", "Refusal", "chat_refusals", "error_body", "messages_refusals"]

CHAT: Final = "chat"
MESSAGES: Final = "messages"
Dialect = Literal["chat", "messages"]

_CHAT_ROLES: Final = ("developer", "system", "user", "assistant", "tool", "function")
_CHAT_NAME: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_CHAT_ID_MAX: Final = 40
_CHAT_MAX_TOOLS: Final = 128
_MESSAGES_ID: Final = re.compile(r"[a-zA-Z0-9_-]+")
_MESSAGES_NAME: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_MESSAGES_MAX: Final = 100_000
_THINKING_ON: Final = ("enabled", "adaptive")


@dataclass(frozen=True, slots=True)
class Refusal:
    """One reason a provider refuses a body: the rule (specs/providers.md), the position
    (field names and indexes from the body's root) and the provider's message."""

    rule: str
    path: tuple[str | int, ...]
    message: str

    def where(self, dialect: Dialect) -> str:
        """The position as the provider writes it: ``messages[3].tool_calls[0].id`` (Chat
        Completions), ``messages.3.content.0`` (Messages API)."""
        if dialect == MESSAGES:
            return ".".join(str(part) for part in self.path)
        out = ""
        for part in self.path:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out

    def __str__(self) -> str:
        return f"[{self.rule}] {self.where(CHAT)}: {self.message}"


def error_body(dialect: Dialect, refusal: Refusal) -> dict[str, Any]:
    """The provider's HTTP 400 body for *refusal* (W3)."""
    if dialect == CHAT:
        return {"error": {"message": refusal.message, "type": "invalid_request_error",
                          "param": refusal.where(CHAT) or None, "code": None}}
    where = refusal.where(MESSAGES)
    return {"type": "error", "error": {"type": "invalid_request_error",
                                       "message": f"{where}: {refusal.message}" if where
                                       else refusal.message}}


class _Found:
    def __init__(self) -> None:
        self.refusals: list[Refusal] = []

    def __call__(self, rule: str, path: tuple[str | int, ...], message: str) -> None:
        self.refusals.append(Refusal(rule, path, message))


# --------------------------------------------------------------------------
# Chat Completions (W4)
# --------------------------------------------------------------------------


def chat_refusals(body: object) -> list[Refusal]:
    """The refusals of a Chat Completions request body (W4), in body order."""
    refuse = _Found()
    if not isinstance(body, Mapping):
        refuse("W4.1", (), "The request body must be a JSON object.")
        return refuse.refusals
    model = body.get("model")
    if not isinstance(model, str) or not model:
        refuse("W4.1", ("model",), "you must provide a model parameter")
    if "stream_options" in body and body.get("stream") is not True:
        refuse("W4.1", ("stream_options",),
               "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
    messages = body.get("messages")
    if not isinstance(messages, list):
        refuse("W4.1", ("messages",), "Missing required parameter: 'messages'.")
    elif not messages:
        refuse("W4.1", ("messages",), "Invalid 'messages': empty array. Expected an array "
               "with minimum length 1, but got an empty array instead.")
    else:
        _chat_messages(messages, refuse)
    if "tools" in body:
        _chat_tools(body["tools"], refuse)
    return refuse.refusals


def _chat_messages(messages: list[Any], refuse: _Found) -> None:
    ids_seen: dict[str, int] = {}
    # the calls of the latest assistant message that still wait for their tool message
    waiting: dict[str, bool] | None = None
    caller = -1
    for index, message in enumerate(messages):
        at: tuple[str | int, ...] = ("messages", index)
        if not isinstance(message, Mapping):
            refuse("W4.2", at, f"Invalid type for 'messages[{index}]': expected an object.")
            continue
        role = message.get("role")
        if role not in _CHAT_ROLES:
            refuse("W4.2", (*at, "role"), f"Invalid value: '{role}'. Supported values are: "
                   "'system', 'assistant', 'user', 'function', 'tool', and 'developer'.")
            continue
        if role != "tool" and waiting is not None:
            _chat_unanswered(waiting, caller, refuse)
            waiting = None
        if role == "tool":
            call_id = message.get("tool_call_id")
            _chat_content(message, at, refuse, required=True)
            if not isinstance(call_id, str) or not call_id:
                refuse("W4.3", (*at, "tool_call_id"),
                       "Missing required parameter: 'messages[].tool_call_id'.")
            elif waiting is None:
                refuse("W4.5", (*at, "role"), "Invalid parameter: messages with role 'tool' "
                       "must be a response to a preceeding message with 'tool_calls'.")
            elif call_id not in waiting:
                refuse("W4.5", (*at, "tool_call_id"), "Invalid parameter: 'tool_call_id' of "
                       f"'{call_id}' not found in 'tool_calls' of previous message.")
            elif waiting[call_id]:
                refuse("W4.5", (*at, "tool_call_id"), "Invalid parameter: Duplicate value for "
                       f"'tool_call_id' of '{call_id}' in messages.")
            else:
                waiting[call_id] = True
            continue
        if role == "assistant":
            calls = message.get("tool_calls")
            has_calls = isinstance(calls, list) and bool(calls)
            _chat_content(message, at, refuse, required=not has_calls)
            if calls is not None:
                waiting = _chat_calls(calls, (*at, "tool_calls"), ids_seen, refuse)
                caller = index
            continue
        _chat_content(message, at, refuse, required=True)
    if waiting is not None:
        _chat_unanswered(waiting, caller, refuse)


def _chat_unanswered(waiting: dict[str, bool], caller: int, refuse: _Found) -> None:
    missing = [call_id for call_id, answered in waiting.items() if not answered]
    if missing:
        refuse("W4.5", ("messages", caller, "role"), "An assistant message with 'tool_calls' "
               "must be followed by tool messages responding to each 'tool_call_id'. The "
               f"following tool_call_ids did not have response messages: {', '.join(missing)}")


def _chat_calls(calls: object, at: tuple[str | int, ...], ids_seen: dict[str, int],
                refuse: _Found) -> dict[str, bool] | None:
    if not isinstance(calls, list) or not calls:
        refuse("W4.4", at, "Invalid 'tool_calls': expected a non-empty array.")
        return None
    waiting: dict[str, bool] = {}
    for number, call in enumerate(calls):
        here = (*at, number)
        if not isinstance(call, Mapping):
            refuse("W4.4", here, "Invalid type: expected an object.")
            continue
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            refuse("W4.4", (*here, "id"), "Missing required parameter: 'id'.")
        elif len(call_id) > _CHAT_ID_MAX:
            refuse("W4.4", (*here, "id"), "string too long. Expected a string with maximum "
                   f"length {_CHAT_ID_MAX}, but got a string with length {len(call_id)} "
                   "instead.")
        elif call_id in ids_seen:
            refuse("W4.4", (*here, "id"), f"Duplicate value for 'id' of '{call_id}'.")
        else:
            ids_seen[call_id] = 1
            waiting[call_id] = False
        if call.get("type") != "function":
            refuse("W4.4", (*here, "type"), "Invalid value: expected 'function'.")
        function = call.get("function")
        if not isinstance(function, Mapping):
            refuse("W4.4", (*here, "function"), "Missing required parameter: 'function'.")
            continue
        name = function.get("name")
        if not isinstance(name, str) or not _CHAT_NAME.fullmatch(name):
            refuse("W4.4", (*here, "function", "name"), "string does not match pattern. "
                   "Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.")
        if not isinstance(function.get("arguments"), str):
            refuse("W4.4", (*here, "function", "arguments"),
                   "Invalid type: expected a string, but got another type instead.")
    return waiting


def _chat_content(message: Mapping[str, Any], at: tuple[str | int, ...], refuse: _Found, *,
                  required: bool) -> None:
    """W4.3: a string or a non-empty array of parts; null only where not required."""
    content = message.get("content")
    if content is None:
        if required:
            refuse("W4.3", (*at, "content"),
                   "Invalid value for 'content': expected a string, got null.")
        return
    if isinstance(content, str):
        if not content and message.get("role") != "assistant":
            refuse("W4.3", (*at, "content"), "Invalid 'content': empty string.")
        return
    if not isinstance(content, list) or not content:
        refuse("W4.3", (*at, "content"), "Invalid type for 'content': expected one of a string "
               "or a non-empty array of objects.")
        return
    for number, part in enumerate(content):
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            refuse("W4.3", (*at, "content", number), "Invalid content part: expected an object "
                   "with a 'type'.")
        elif part.get("type") == "text" and not isinstance(part.get("text"), str):
            refuse("W4.3", (*at, "content", number, "text"), "Missing required parameter: "
                   "'text'.")


def _chat_tools(tools: object, refuse: _Found) -> None:
    if not isinstance(tools, list):
        refuse("W4.6", ("tools",), "Invalid type for 'tools': expected an array.")
        return
    if len(tools) > _CHAT_MAX_TOOLS:
        refuse("W4.6", ("tools",), "Invalid 'tools': array too long. Expected an array with "
               f"maximum length {_CHAT_MAX_TOOLS}, but got an array with length {len(tools)} "
               "instead.")
    names: set[str] = set()
    for index, tool in enumerate(tools):
        at: tuple[str | int, ...] = ("tools", index)
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(
                function, Mapping):
            refuse("W4.6", at, "Invalid tool: expected {type: 'function', function: {...}}.")
            continue
        name = function.get("name")
        if not isinstance(name, str) or not _CHAT_NAME.fullmatch(name):
            refuse("W4.6", (*at, "function", "name"), "string does not match pattern. Expected "
                   "a string that matches the pattern '^[a-zA-Z0-9_-]+$'.")
        elif name in names:
            refuse("W4.6", (*at, "function", "name"), f"Duplicate function name '{name}'.")
        else:
            names.add(name)
        parameters = function.get("parameters")
        if parameters is not None and not _object_schema(parameters):
            refuse("W4.6", (*at, "function", "parameters"), f"Invalid schema for function "
                   f"'{name}': schema must be a JSON Schema of 'type: \"object\"'.")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            refuse("W4.6", (*at, "function", "description"), "Invalid type: expected a string.")


def _object_schema(schema: object) -> bool:
    return isinstance(schema, Mapping) and schema.get("type", "object") == "object"


# --------------------------------------------------------------------------
# Messages API (W5)
# --------------------------------------------------------------------------


def messages_refusals(body: object) -> list[Refusal]:
    """The refusals of a Messages API request body (W5), in body order."""
    refuse = _Found()
    if not isinstance(body, Mapping):
        refuse("W5.1", (), "The request body must be a JSON object.")
        return refuse.refusals
    model = body.get("model")
    if not isinstance(model, str) or not model:
        refuse("W5.1", ("model",), "Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        refuse("W5.1", ("max_tokens",), "Field required" if max_tokens is None
               else "Input should be a valid positive integer")
    system = body.get("system")
    if system is not None and not _system_ok(system):
        refuse("W5.1", ("system",), "Input should be a valid string or a list of text blocks")
    tools = body.get("tools")
    declared = _messages_tools(tools, refuse) if tools is not None else 0
    messages = body.get("messages")
    if not isinstance(messages, list):
        refuse("W5.1", ("messages",), "Field required")
    elif not messages:
        refuse("W5.1", ("messages",), "messages: at least one message is required")
    elif len(messages) > _MESSAGES_MAX:
        refuse("W5.1", ("messages",), f"a request may hold at most {_MESSAGES_MAX} messages")
    else:
        thinking = body.get("thinking")
        thinking_on = isinstance(thinking, Mapping) and thinking.get("type") in _THINKING_ON
        _messages_list(messages, refuse, tools_declared=declared > 0, thinking=thinking_on)
    return refuse.refusals


def _system_ok(system: object) -> bool:
    if isinstance(system, str):
        return True
    return isinstance(system, list) and all(
        isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str)
        and b["text"].strip() for b in system)


def _messages_tools(tools: object, refuse: _Found) -> int:
    if not isinstance(tools, list):
        refuse("W5.8", ("tools",), "Input should be a valid list")
        return 0
    names: set[str] = set()
    for index, tool in enumerate(tools):
        at: tuple[str | int, ...] = ("tools", index)
        if not isinstance(tool, Mapping):
            refuse("W5.8", at, "Input should be a valid dictionary")
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not _MESSAGES_NAME.fullmatch(name):
            refuse("W5.8", (*at, "name"),
                   "String should match pattern '^[a-zA-Z0-9_-]{1,64}$'")
        elif name in names:
            refuse("W5.8", ("tools",), "Tool names must be unique.")
        else:
            names.add(name)
        schema = tool.get("input_schema")
        if not isinstance(schema, Mapping) or schema.get("type") != "object":
            refuse("W5.8", (*at, "input_schema"), "input_schema: Input should be an object "
                   "schema with type 'object'")
    return len(tools)


def _messages_list(messages: list[Any], refuse: _Found, *, tools_declared: bool,
                   thinking: bool) -> None:
    tool_ids: set[str] = set()
    previous_calls: list[str] = []       # the tool_use ids of the message before this one
    previous_role: str | None = None
    saw_tool_blocks = False
    last = len(messages) - 1
    for index, message in enumerate(messages):
        at: tuple[str | int, ...] = ("messages", index)
        if not isinstance(message, Mapping):
            refuse("W5.2", at, "Input should be a valid dictionary")
            previous_calls, previous_role = [], None
            continue
        role = message.get("role")
        if role not in ("user", "assistant"):
            refuse("W5.2", (*at, "role"), f"Unexpected role \"{role}\". Allowed roles are "
                   "\"user\" or \"assistant\"." if role != "system" else
                   "role 'system' is not supported in messages; use the top-level system "
                   "parameter")
            previous_calls, previous_role = [], None
            continue
        if index == 0 and role != "user":
            refuse("W5.3", (*at, "role"), "first message must use the \"user\" role")
        if index == last and role != "user":
            refuse("W5.3", (*at, "role"), "This model does not support assistant message "
                   "prefill. The conversation must end with a user message.")
        blocks = _blocks(message.get("content"), at, refuse)
        if blocks is None:
            previous_calls, previous_role = [], role
            continue
        kinds = [b.get("type") for b in blocks]
        if "tool_use" in kinds or "tool_result" in kinds:
            saw_tool_blocks = True
        if role == "assistant":
            if previous_calls:
                refuse("W5.5", ("messages", index - 1), "`tool_use` ids were found without "
                       "`tool_result` blocks immediately after: " + ", ".join(previous_calls)
                       + ". Each `tool_use` block must have a corresponding `tool_result` "
                       "block in the next message.")
            previous_calls = _assistant_blocks(blocks, at, refuse, tool_ids)
            if thinking and index == last - 1 and previous_calls and kinds and kinds[0] not in (
                    "thinking", "redacted_thinking"):
                refuse("W5.7", (*at, "content", 0, "type"), f"Expected `thinking` or "
                       f"`redacted_thinking`, but found `{kinds[0]}`. When `thinking` is "
                       "enabled, a final `assistant` message must start with a thinking block "
                       "(preceeding the lastmost set of `tool_use` and `tool_result` blocks).")
        else:
            _user_blocks(blocks, at, refuse, previous_calls if previous_role == "assistant"
                         else [])
            previous_calls = []
        previous_role = role
    if previous_calls:
        refuse("W5.5", ("messages", last), "`tool_use` ids were found without `tool_result` "
               "blocks immediately after: " + ", ".join(previous_calls) + ". Each `tool_use` "
               "block must have a corresponding `tool_result` block in the next message.")
    if saw_tool_blocks and not tools_declared:
        refuse("W5.6", (), "Requests which include `tool_use` or `tool_result` blocks must "
               "define tools.")


def _blocks(content: object, at: tuple[str | int, ...], refuse: _Found
            ) -> list[Mapping[str, Any]] | None:
    """W5.4: the message's content blocks (a string is one text block), or None when its
    content is refused."""
    if isinstance(content, str):
        if not content.strip():
            refuse("W5.4", at, "all messages must have non-empty content except for the "
                   "optional final assistant message")
            return None
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not content:
        refuse("W5.4", at, "all messages must have non-empty content except for the optional "
               "final assistant message")
        return None
    out: list[Mapping[str, Any]] = []
    for number, block in enumerate(content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            refuse("W5.4", (*at, "content", number), "Input should be a valid dictionary with "
                   "a 'type'")
            continue
        if block["type"] == "text":
            text = block.get("text")
            if not isinstance(text, str):
                refuse("W5.4", (*at, "content", number, "text"), "Field required")
                continue
            if not text:
                refuse("W5.4", (*at, "content", number),
                       "text content blocks must be non-empty")
            elif not text.strip():
                refuse("W5.4", (*at, "content", number),
                       "text content blocks must contain non-whitespace text")
        out.append(block)
    return out


def _assistant_blocks(blocks: Sequence[Mapping[str, Any]], at: tuple[str | int, ...],
                      refuse: _Found, tool_ids: set[str]) -> list[str]:
    calls: list[str] = []
    for number, block in enumerate(blocks):
        here = (*at, "content", number)
        kind = block.get("type")
        if kind == "tool_use":
            call_id = block.get("id")
            if not isinstance(call_id, str) or not _MESSAGES_ID.fullmatch(call_id):
                refuse("W5.5", (*here, "tool_use", "id"),
                       "String should match pattern '^[a-zA-Z0-9_-]+$'")
            elif call_id in tool_ids:
                refuse("W5.5", here, "`tool_use` ids must be unique")
            else:
                tool_ids.add(call_id)
                calls.append(call_id)
            name = block.get("name")
            if not isinstance(name, str) or not _MESSAGES_NAME.fullmatch(name):
                refuse("W5.5", (*here, "tool_use", "name"),
                       "String should match pattern '^[a-zA-Z0-9_-]{1,64}$'")
            if not isinstance(block.get("input"), Mapping):
                refuse("W5.5", (*here, "tool_use", "input"), "Input should be a valid dictionary")
        elif kind == "tool_result":
            refuse("W5.5", here, "tool_result blocks may only appear in user messages")
        elif kind == "thinking":
            signature = block.get("signature")
            if not isinstance(signature, str) or not signature:
                refuse("W5.7", (*here, "thinking", "signature"), "Field required")
            if not isinstance(block.get("thinking"), str):
                refuse("W5.7", (*here, "thinking", "thinking"), "Field required")
        elif kind == "redacted_thinking" and not isinstance(block.get("data"), str):
            refuse("W5.7", (*here, "redacted_thinking", "data"), "Field required")
    return calls


def _user_blocks(blocks: Sequence[Mapping[str, Any]], at: tuple[str | int, ...],
                 refuse: _Found, expected: list[str]) -> None:
    """W5.5: after an assistant message with tool_use blocks, this message begins with one
    tool_result per call (and answers nothing else); elsewhere it holds no tool_result."""
    answered: set[str] = set()
    leading = True
    for number, block in enumerate(blocks):
        here = (*at, "content", number)
        kind = block.get("type")
        if kind in ("tool_use", "thinking", "redacted_thinking"):
            refuse("W5.4", here, f"{kind} blocks may only appear in assistant messages")
            continue
        if kind != "tool_result":
            leading = False
            continue
        call_id = block.get("tool_use_id")
        if not leading:
            refuse("W5.5", at, f"Did not find {len(expected)} tool_result block(s) at the "
                   "beginning of this message. Messages following tool_use blocks must begin "
                   "with a matching number of tool_result blocks.")
        if not isinstance(call_id, str) or call_id not in expected:
            refuse("W5.5", here, f"unexpected `tool_use_id` found in `tool_result` blocks: "
                   f"{call_id}. Each `tool_result` block must have a corresponding `tool_use` "
                   "block in the previous message.")
        elif call_id in answered:
            refuse("W5.5", here, "each tool_use must have a single result. Found multiple "
                   f"`tool_result` blocks with id: {call_id}")
        else:
            answered.add(call_id)
        _result_content(block, here, refuse)
    missing = [call_id for call_id in expected if call_id not in answered]
    if missing:
        refuse("W5.5", ("messages", at[1] - 1) if isinstance(at[1], int) else at,
               "`tool_use` ids were found without `tool_result` blocks immediately after: "
               + ", ".join(missing) + ". Each `tool_use` block must have a corresponding "
               "`tool_result` block in the next message.")


def _result_content(block: Mapping[str, Any], here: tuple[str | int, ...],
                    refuse: _Found) -> None:
    content = block.get("content")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        refuse("W5.5", (*here, "is_error"), "Input should be a valid boolean")
    if content is None:
        empty = True
    elif isinstance(content, str):
        empty = not content.strip()
        if content and empty:
            refuse("W5.4", (*here, "content"),
                   "text content blocks must contain non-whitespace text")
    elif isinstance(content, list):
        empty = not content
        for number, inner in enumerate(content):
            if not isinstance(inner, Mapping) or inner.get("type") not in (
                    "text", "image", "document", "search_result"):
                refuse("W5.5", (*here, "content", number), "Input tag does not match any of "
                       "the expected tags: 'text', 'image', 'document', 'search_result'")
            elif inner.get("type") == "text" and not (
                    isinstance(inner.get("text"), str) and inner["text"].strip()):
                refuse("W5.4", (*here, "content", number),
                       "text content blocks must contain non-whitespace text")
    else:
        refuse("W5.5", (*here, "content"), "Input should be a valid string or list")
        return
    if empty and is_error is True:
        refuse("W5.5", (*here, "content"), "content cannot be empty if `is_error` is true")


def first_refusal_json(dialect: Dialect, body: object) -> str | None:
    """The provider's error body (JSON text) for the first refusal of *body*, or None."""
    found = chat_refusals(body) if dialect == CHAT else messages_refusals(body)
    return json.dumps(error_body(dialect, found[0])) if found else None
