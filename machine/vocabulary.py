"""The message and value vocabulary (specs/vocabulary.md: rules V1–V21).

Every value here is immutable and validated at construction (rule V8, the
reference's D5): a malformed value raises a `ValidationError` naming the field
and the problem, and nothing half-built escapes. Each type has a JSON form
(`to_json` / `from_json`) used by the codec, scripts and conformance vectors
(rule E4).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from machine.errors import ValidationError
from machine.jsonvalue import (
    Frozen,
    FrozenDict,
    FrozenList,
    JsonLike,
    freeze,
    immutable_value,
    plain_text,
    scrub_text,
    shown,
    thaw,
)

Role: TypeAlias = Literal["user", "assistant", "system"]
ROLES: frozenset[str] = frozenset({"user", "assistant", "system"})

#: Error codes of the in-turn validation failures (reference §9.7, §10.9, §15.3).
INVALID_CHUNK: Final = "INVALID_CHUNK"
INVALID_TOOL_RESULT: Final = "INVALID_TOOL_RESULT"

#: R10.10 / R10.11: the texts of the canonical results of a tool call aborted before its
#: dispatch and of one aborted while it ran.
ABORTED_BEFORE_DISPATCH_TEXT: Final = "Error: tool call aborted before dispatch"
ABORTED_TEXT: Final = "Error: tool call aborted"

# --------------------------------------------------------------------------
# Decoding helpers shared by every from_json.
# --------------------------------------------------------------------------


def _rebase(exc: ValidationError, default: str, path: str,
            code: str | None = None) -> ValidationError:
    """*exc* with its leading *default* path segment replaced by *path* (and, if given,
    its code replaced by *code*). Keeps the exception class."""
    where = exc.path
    if path != default and (where == default or where.startswith((default + ".", default + "["))):
        where = path + where[len(default):]
    if where == exc.path and (code is None or code == exc.code):
        return exc
    return type(exc)(where, exc.problem, code=code or exc.code)


def _stored_fields(value: object, cls: type, path: str) -> dict[str, Any]:
    """The dataclass fields of *value* as stored (never through its own attribute lookup),
    for a value class that checks them again (`ErrorInfo.checked`, `LlmFailure.checked`)."""
    stored: dict[str, Any] = {}
    for item in dataclasses.fields(cls):
        try:
            stored[item.name] = object.__getattribute__(value, item.name)
        except AttributeError:
            raise ValidationError(f"{path}.{item.name}", f"is missing: this {cls.__name__} "
                                  "was built without its constructor") from None
    return stored


def _fields(value: JsonLike, path: str, shape: str, required: Sequence[str],
            optional: Sequence[str] = ()) -> dict[str, Any]:
    """A plain dict of a decoded mapping, after checking its key set."""
    if not isinstance(value, (dict, FrozenDict)):
        raise ValidationError(path, f"must be a mapping {shape}")
    return _mapping_fields(value, path, required, optional)


def _mapping_fields(value: dict[str, Any] | FrozenDict, path: str, required: Sequence[str],
                    optional: Sequence[str] = ()) -> dict[str, Any]:
    """`_fields` of a value known to be a mapping."""
    # Why: one pass over the (few) keys with tuple membership tests instead of building
    # three sets; the set difference is computed only to word the error, as before.
    for key in value:
        if key not in required and key not in optional:
            extra = set(value) - set(required) - set(optional)
            names = ", ".join(sorted(shown(k) for k in extra))
            raise ValidationError(path, f"unexpected field(s) {names}")
    for key in required:
        if key not in value:
            raise ValidationError(f"{path}.{key}", "is required")
    # Why: a FrozenDict's plain dict copies directly (no Mapping-protocol walk).
    return dict(value._data) if type(value) is FrozenDict else dict(value)


def _opt(fields: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """An optional field of a supplied value: absent and null both read as *default*."""
    item = fields.get(key)
    return default if item is None else item


# --------------------------------------------------------------------------
# Extension registries (rules V3, V4): users add block types and source kinds.
# A checker returns None when the value is fine, or a description of the problem.
# --------------------------------------------------------------------------

BlockCheck: TypeAlias = Callable[[FrozenDict], "str | None"]
_block_checks: dict[str, BlockCheck] = {}
_source_checks: dict[str, BlockCheck] = {}
#: Incremented by every registration: a verdict reached before one may no longer hold.
_registrations = 0


def registrations() -> int:
    """How many extension block types and source kinds have been registered so far."""
    return _registrations


def register_block_type(type_name: str, check: BlockCheck | None = None) -> None:
    """Declare an extension content-block type (rule V3) with an optional field check."""
    if not isinstance(type_name, str) or not type_name:
        raise ValidationError("type_name", "must be a non-empty string")
    if type_name in _CORE_BLOCKS:
        raise ValidationError("type_name", f"{shown(type_name)} is a core block type")
    global _registrations
    _block_checks[type_name] = check or (lambda _b: None)
    _registrations += 1
    _MAPPED.clear()  # a new check may refuse what was accepted: validate afresh


def register_source_kind(kind: str, check: BlockCheck | None = None) -> None:
    """Declare an extension source kind (rule V4) with an optional field check."""
    if not isinstance(kind, str) or not kind:
        raise ValidationError("kind", "must be a non-empty string")
    if kind in _CORE_SOURCES:
        raise ValidationError("kind", f"{shown(kind)} is a core source kind")
    global _registrations
    _source_checks[kind] = check or (lambda _s: None)
    _registrations += 1
    _MAPPED.clear()  # a new check may refuse what was accepted: validate afresh


def _str_field(value: FrozenDict, key: str, *, nonempty: bool = False) -> str | None:
    item = value.get(key)
    if not isinstance(item, str):
        return f"{shown(key)} must be a string"
    if nonempty and not item:
        return f"{shown(key)} must not be empty"
    return None


def _check_text(block: FrozenDict) -> str | None:
    return _str_field(block, "text")


def _check_tool_call(block: FrozenDict) -> str | None:
    return (_str_field(block, "id", nonempty=True) or _str_field(block, "name")
            or _str_field(block, "arguments"))


def _check_tool_result(block: FrozenDict) -> str | None:
    problem = _str_field(block, "toolCallId", nonempty=True)
    if problem:
        return problem
    content = block.get("content")
    if not isinstance(content, FrozenList):
        return "'content' must be a list of blocks"
    for i, inner in enumerate(content):
        inner_problem = block_problem(inner)
        if inner_problem:
            return f"content[{i}]: {inner_problem}"
    if "isError" in block and block["isError"] is not True:
        return "'isError' may only be present as true"
    return None


_CORE_BLOCKS: dict[str, BlockCheck] = {
    "text": _check_text,
    "reasoning": _check_text,
    "tool-call": _check_tool_call,
    "tool-result": _check_tool_result,
}


def block_problem(block: Frozen) -> str | None:
    """What is wrong with a frozen content block, or None (rule V3)."""
    if not isinstance(block, FrozenDict):
        return "a content block must be a mapping"
    kind = block.get("type")
    if not isinstance(kind, str) or not kind:
        return "a content block needs a non-empty string 'type'"
    core = _CORE_BLOCKS.get(kind)
    if core is not None:
        return core(block)
    check = _block_checks.get(kind)
    return _verdict_of(check, block, "block type", kind) if check else None


def _verdict_of(check: BlockCheck, value: FrozenDict, what: str, kind: str) -> str | None:
    """What an extension's *check* says of *value*. A check that raises, or answers with
    anything but None or a string, refuses the value (its failure is named): reading a
    value never lets a caller's exception escape (V3, V4)."""
    try:
        problem = check(value)
    except Exception as error:
        return (f"the check of {what} {shown(kind)} raised "
                f"{ErrorInfo.from_exception(error).rendered()!r}")
    if problem is None or type(problem) is str:
        return scrub_text(problem) if problem else None
    return (f"the check of {what} {shown(kind)} answered {type(problem).__name__}, not a "
            "problem text or None")


def _check_plugin(source: FrozenDict) -> str | None:
    return _str_field(source, "plugin")


def _check_model(source: FrozenDict) -> str | None:
    return _str_field(source, "provider") or _str_field(source, "model")


def _check_tool(source: FrozenDict) -> str | None:
    return _str_field(source, "callId", nonempty=True)


_CORE_SOURCES: dict[str, BlockCheck] = {
    "user": lambda _s: None,
    "plugin": _check_plugin,
    "model": _check_model,
    "tool": _check_tool,
}


def source_problem(source: Frozen) -> str | None:
    """What is wrong with a frozen source, or None (rule V4)."""
    if not isinstance(source, FrozenDict):
        return "the source must be a mapping"
    kind = source.get("kind")
    if not isinstance(kind, str) or not kind:
        return "the source needs a non-empty string 'kind'"
    core = _CORE_SOURCES.get(kind)
    if core is not None:
        return core(source)
    check = _source_checks.get(kind)
    return _verdict_of(check, source, "source kind", kind) if check else None


def freeze_content(value: JsonLike, path: str) -> FrozenList:
    """Validate and freeze a list of content blocks."""
    if not isinstance(value, (list, FrozenList)):
        raise ValidationError(path, "must be a list of content blocks")
    frozen = freeze(value, path)
    assert isinstance(frozen, FrozenList)
    for i, block in enumerate(frozen):
        problem = block_problem(block)
        if problem:
            raise ValidationError(f"{path}[{i}]", problem)
    return frozen


def freeze_source(value: JsonLike, path: str) -> FrozenDict:
    """Validate and freeze a message source (rule V4). A source of a core kind whose fields
    are all strings is shared with the equal sources frozen before (`_shared_source_key`)."""
    if type(value) is FrozenDict and id(value) in _SHARED_IDS:   # shared: checked before
        return value
    if not isinstance(value, (dict, FrozenDict)):
        raise ValidationError(path, "must be a mapping with a non-empty string 'kind'")
    shared_key = _shared_source_key(value)
    if shared_key is not None:
        shared = _SHARED_SOURCES.get(shared_key)
        if shared is not None:
            return shared
    frozen = freeze(value, path)
    assert isinstance(frozen, FrozenDict)
    problem = source_problem(frozen)
    if problem:
        raise ValidationError(path, problem)
    if shared_key is not None:
        if len(_SHARED_SOURCES) >= _SHARED_SOURCES_LIMIT:
            _SHARED_SOURCES.clear()   # Why: unique sources (a tool call's) must not pin memory
            _SHARED_IDS.clear()
        _SHARED_SOURCES[shared_key] = frozen
        _SHARED_IDS.add(id(frozen))   # unique while the table holds the value
    return frozen


#: Sources frozen before, by their fields in order: a session's messages share a handful of
#: sources (the user's, the model's, a plugin's), and one shared frozen value instead of one
#: per message saves memory and the objects the cyclic collector walks over a long history.
_SHARED_SOURCES: dict[tuple[tuple[str, str], ...], FrozenDict] = {}
#: The identities of the values `_SHARED_SOURCES` holds.
_SHARED_IDS: set[int] = set()
_SHARED_SOURCES_LIMIT: Final = 1024


def _shared_source_key(value: Mapping[str, Any]) -> tuple[tuple[str, str], ...] | None:
    """The fields of *value* in order when a frozen source equal to it may be shared: a plain
    dict or a FrozenDict of at most four fields, every key and value an exact str (so
    comparing and hashing run no caller code, and equal keys mean equal JSON, order
    included), of a core kind (whose check never changes; an extension kind's check may be
    registered later)."""
    kind = type(value)
    data = value._data if kind is FrozenDict else value if kind is dict else None  # type: ignore[attr-defined]
    if data is None or len(data) > 4:
        return None
    source_kind = data.get("kind")
    if type(source_kind) is not str or source_kind not in _CORE_SOURCES:
        return None
    items = tuple(data.items())
    for key, item in items:
        if type(key) is not str or type(item) is not str:
            return None
    return items


# --------------------------------------------------------------------------
# Content-block and source constructors (plain data, validated on use).
# --------------------------------------------------------------------------


def text(value: str) -> dict[str, JsonLike]:
    return {"type": "text", "text": value}


def reasoning(value: str) -> dict[str, JsonLike]:
    return {"type": "reasoning", "text": value}


def tool_call(call_id: str, name: str, arguments: str = "{}") -> dict[str, JsonLike]:
    return {"type": "tool-call", "id": call_id, "name": name, "arguments": arguments}


def tool_result_block(tool_call_id: str, content: Sequence[JsonLike],
                      is_error: bool = False) -> dict[str, JsonLike]:
    block: dict[str, JsonLike] = {"type": "tool-result", "toolCallId": tool_call_id,
                                  "content": list(content)}
    if is_error:
        block["isError"] = True
    return block


def user_source(**extra: JsonLike) -> FrozenDict:
    return freeze_source({"kind": "user", **extra}, "source")


def plugin_source(plugin: str) -> FrozenDict:
    return freeze_source({"kind": "plugin", "plugin": plugin}, "source")


def model_source(provider: str, model: str, replay_state: JsonLike = None) -> FrozenDict:
    data: dict[str, JsonLike] = {"kind": "model", "provider": provider, "model": model}
    if replay_state is not None:
        data["replayState"] = replay_state
    return freeze_source(data, "source")


def tool_source(call_id: str) -> FrozenDict:
    return freeze_source({"kind": "tool", "callId": call_id}, "source")


def custom_source(kind: str, **fields: JsonLike) -> FrozenDict:
    """A source of an extension kind (rule V4)."""
    return freeze_source({**fields, "kind": kind}, "source")


# --------------------------------------------------------------------------
# Messages (rules V5, V6, V7)
# --------------------------------------------------------------------------


@immutable_value
@dataclass(frozen=True, slots=True)
class Message:
    """An immutable message ``{id, role, content, source}`` (rule V5).

    Construction validates and deep-freezes: later changes to the caller's
    lists or dicts have no effect (rule V6).
    """

    id: str
    role: Role
    content: FrozenList
    source: FrozenDict

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValidationError("message.id", "must be a non-empty string")
        object.__setattr__(self, "id", plain_text(self.id, "message.id"))   # V23
        if not isinstance(self.role, str) or self.role not in ROLES:
            raise ValidationError("message.role",
                                  f"{shown(self.role)} is not one of user, assistant, system")
        object.__setattr__(self, "content", freeze_content(self.content, "message.content"))
        object.__setattr__(self, "source", freeze_source(self.source, "message.source"))

    def to_json(self) -> dict[str, JsonLike]:
        return {"id": self.id, "role": self.role, "content": thaw(self.content),
                "source": thaw(self.source)}

    @classmethod
    def from_json(cls, value: JsonLike, path: str = "message") -> Message:
        if isinstance(value, Message):
            return value
        mapped = _MAPPED.get(id(value))
        if mapped is not None and mapped[0] is value:  # made by message_mapping: see there
            return mapped[1]
        fields = _fields(value, path, "{id, role, content, source}",
                         ("id", "role", "content", "source"))
        try:
            return cls(id=fields["id"], role=fields["role"], content=fields["content"],
                       source=fields["source"])
        except ValidationError as exc:
            raise _rebase(exc, "message", path) from None

    @property
    def text(self) -> str:
        """The concatenated text of the text blocks (a convenience for tests and demos)."""
        return "".join(str(b.get("text", "")) for b in self.content
                       if isinstance(b, FrozenDict) and b.get("type") == "text")

    @property
    def tool_calls(self) -> tuple[FrozenDict, ...]:
        return tuple(b for b in self.content
                     if isinstance(b, FrozenDict) and b.get("type") == "tool-call")


#: Recently made message mappings, by identity: id(mapping) -> (mapping, message).
_MAPPED: dict[int, tuple[FrozenDict, Message]] = {}
_MAPPED_LIMIT: Final = 32


def message_mapping(message: Message) -> FrozenDict:
    """The frozen JSON form of a message (no copying: its parts are already frozen).

    Why (performance): the core builds a message (validating it), and the log then
    validates the mapping made from it once more when the event carrying it is
    appended. A `Message` is immutable and was validated when it was built, so the
    mapping made from it here is valid too: `Message.from_json` hands back the message
    for a mapping made by this function (matched by identity; the entry holds the
    mapping, so its id cannot be reused). Only the last few mappings are remembered,
    and registering a block type or source kind forgets them all. Every other check of
    the log (roles, source kinds, tool-result pairing, enclosure) still runs.
    """
    mapping = FrozenDict({"id": message.id, "role": message.role, "content": message.content,
                          "source": message.source})
    if len(_MAPPED) >= _MAPPED_LIMIT:
        _MAPPED.clear()
    _MAPPED[id(mapping)] = (mapping, message)
    return mapping


def user_message(id: str, content: str | Sequence[JsonLike],
                 source: Mapping[str, JsonLike] | None = None) -> Message:
    """A well-formed user message (rule V7). A str content becomes one text block."""
    blocks = [text(content)] if isinstance(content, str) else list(content)
    return Message(id=id, role="user", content=blocks,  # type: ignore[arg-type]
                   source=source if source is not None else {"kind": "user"})  # type: ignore[arg-type]


def validate_user_message(value: JsonLike, path: str = "message") -> Message:
    """Rule V7: a well-formed *user* message, snapshotted. Accepts a Message or its JSON form."""
    message = Message.from_json(value, path)
    if message.role != "user":
        raise ValidationError(f"{path}.role", f"must be 'user', not {shown(message.role)}")
    return message


def assistant_message(id: str, content: Sequence[JsonLike], source: Mapping[str, JsonLike]
                      ) -> Message:
    """An assistant message (rule V5): role assistant, source of kind model."""
    return validate_assistant_message(
        {"id": id, "role": "assistant", "content": list(content), "source": source})


def validate_assistant_message(value: JsonLike, path: str = "message") -> Message:
    """Rule V5: role 'assistant' and a source of kind 'model'."""
    message = Message.from_json(value, path)
    if message.role != "assistant":
        raise ValidationError(f"{path}.role", f"must be 'assistant', not {shown(message.role)}")
    if message.source["kind"] != "model":
        raise ValidationError(f"{path}.source.kind", "an assistant message's source is 'model'")
    return message


def tool_result_message(id: str, call_id: str, content: Sequence[JsonLike], *,
                        is_error: bool = False) -> Message:
    """A tool-result message (rule V5): one tool-result block, source {kind:'tool', callId}."""
    return validate_tool_result_message(
        {"id": id, "role": "user", "content": [tool_result_block(call_id, content, is_error)],
         "source": {"kind": "tool", "callId": call_id}})


def validate_tool_result_message(value: JsonLike, path: str = "message") -> Message:
    """Rule V5: a user message whose content is exactly one tool-result block answering
    the call named by its ``{kind:'tool', callId}`` source."""
    message = validate_user_message(value, path)
    if message.source["kind"] != "tool":
        raise ValidationError(f"{path}.source.kind", "a tool-result message's source is 'tool'")
    content = message.content
    if len(content) != 1 or not isinstance(content[0], FrozenDict) \
            or content[0]["type"] != "tool-result":
        raise ValidationError(f"{path}.content", "must be exactly one tool-result block")
    if content[0]["toolCallId"] != message.source["callId"]:
        raise ValidationError(f"{path}.content[0].toolCallId", "must equal the source's callId")
    return message


# --------------------------------------------------------------------------
# Options, placements, status, causes (rules V10–V12)
# --------------------------------------------------------------------------

Target: TypeAlias = Literal["next-turn", "next-step"]
Placement: TypeAlias = Literal["queued", "steering"]
InboxPlacement: TypeAlias = Placement
PLACEMENTS: frozenset[str] = frozenset({"queued", "steering"})
AgentStatus: TypeAlias = Literal["idle", "running"]
AGENT_STATUSES: frozenset[str] = frozenset({"idle", "running"})
SessionStartSource: TypeAlias = Literal["startup", "resume", "clear", "compact"]
SESSION_START_SOURCES: frozenset[str] = frozenset({"startup", "resume", "clear", "compact"})
CauseKind: TypeAlias = Literal["user", "parent", "disposed"]


@immutable_value
@dataclass(frozen=True, slots=True)
class SendOptions:
    """``{target, wakeup}``; both required, nothing else (rule V10)."""

    target: Target
    wakeup: bool

    def __post_init__(self) -> None:
        if self.target not in ("next-turn", "next-step"):
            raise ValidationError("options.target",
                                  f"{shown(self.target)} is not 'next-turn' or 'next-step'")
        if not isinstance(self.wakeup, bool):
            raise ValidationError("options.wakeup", "must be a bool")

    def to_json(self) -> dict[str, JsonLike]:
        return {"target": self.target, "wakeup": self.wakeup}

    @classmethod
    def from_json(cls, value: JsonLike, path: str = "options") -> SendOptions:
        if isinstance(value, SendOptions):
            return value
        fields = _fields(value, path, "{target, wakeup}", ("target", "wakeup"))
        try:
            return cls(target=fields["target"], wakeup=fields["wakeup"])
        except ValidationError as exc:
            raise _rebase(exc, "options", path) from None


FOLLOWUP = SendOptions("next-turn", True)
STEER = SendOptions("next-step", True)
INJECT = SendOptions("next-step", False)


@immutable_value
@dataclass(frozen=True, slots=True)
class CancelCause:
    """``{kind}`` with kind user, parent or disposed (rule V11)."""

    kind: CauseKind

    def __post_init__(self) -> None:
        if self.kind not in ("user", "parent", "disposed"):
            raise ValidationError("cause.kind",
                                  f"{shown(self.kind)} is not 'user', 'parent' or 'disposed'")

    def to_json(self) -> dict[str, JsonLike]:
        return {"kind": self.kind}

    @classmethod
    def from_json(cls, value: JsonLike, path: str = "cause", *,
                  allow_disposed: bool = False) -> CancelCause:
        if isinstance(value, CancelCause):
            cause = value
        elif isinstance(value, (dict, FrozenDict)) and set(value) == {"kind"}:
            try:
                cause = cls(kind=value["kind"])  # type: ignore[arg-type]
            except ValidationError as exc:
                raise ValidationError(f"{path}.kind", exc.problem) from None
        else:
            raise ValidationError(path, "must be {kind: 'user'} or {kind: 'parent'}")
        if cause.kind == "disposed" and not allow_disposed:
            raise ValidationError(f"{path}.kind", "'disposed' is reserved for dispose()")
        return cause


USER_CAUSE = CancelCause("user")
PARENT_CAUSE = CancelCause("parent")
DISPOSED_CAUSE = CancelCause("disposed")


# --------------------------------------------------------------------------
# Failures and errors as data (rules V14, V15)
# --------------------------------------------------------------------------


def _is_finite_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value)


@immutable_value
@dataclass(frozen=True, slots=True)
class LlmFailure:
    """Model failure facts ``{message, code, status?, providerRetryAfterMs?, requestId?}`` (V14)."""

    message: str
    code: str
    status: int | None = None
    provider_retry_after_ms: int | float | None = None
    request_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.message, str):
            raise ValidationError("failure.message", "must be a string")
        if not isinstance(self.code, str):
            raise ValidationError("failure.code", "must be a string")
        if self.status is not None and (type(self.status) is not int):
            raise ValidationError("failure.status", "must be an integer")
        if self.provider_retry_after_ms is not None and not _is_finite_number(
                self.provider_retry_after_ms):
            raise ValidationError("failure.providerRetryAfterMs", "must be a finite number")
        if self.request_id is not None and not isinstance(self.request_id, str):
            raise ValidationError("failure.requestId", "must be a string")
        for name, attribute in (("message", "message"), ("code", "code"),
                                ("requestId", "request_id")):
            text = getattr(self, attribute)
            if text is not None:                                          # V23
                object.__setattr__(self, attribute, plain_text(text, f"failure.{name}"))

    @classmethod
    def checked(cls, value: object, path: str = "failure") -> LlmFailure:
        """V2, V14: *value*, an `LlmFailure` however it was built, checked again (see
        `ErrorInfo.checked`). Raises `ValidationError`."""
        if type(value) is not LlmFailure:
            raise ValidationError(path, f"must be an LlmFailure, not {type(value).__name__}")
        try:
            return cls(**_stored_fields(value, LlmFailure, path))
        except ValidationError as exc:
            raise _rebase(exc, "failure", path) from None

    def with_message(self, message: str) -> LlmFailure:
        return LlmFailure(message, self.code, self.status, self.provider_retry_after_ms,
                          self.request_id)

    def to_json(self) -> dict[str, JsonLike]:
        out: dict[str, JsonLike] = {"message": self.message, "code": self.code}
        if self.status is not None:
            out["status"] = self.status
        if self.provider_retry_after_ms is not None:
            out["providerRetryAfterMs"] = self.provider_retry_after_ms
        if self.request_id is not None:
            out["requestId"] = self.request_id
        return out

    @classmethod
    def from_json(cls, value: JsonLike, path: str = "failure") -> LlmFailure:
        if isinstance(value, LlmFailure):
            return value
        fields = _fields(value, path, "{message, code, ...}", ("message", "code"),
                         ("status", "providerRetryAfterMs", "requestId"))
        try:
            return cls(fields["message"], fields["code"], _opt(fields, "status"),
                       _opt(fields, "providerRetryAfterMs"), _opt(fields, "requestId"))
        except ValidationError as exc:
            raise _rebase(exc, "failure", path) from None


def _message_of(exc: BaseException) -> str:
    """An exception's own message, lone surrogates replaced (V23: an exception's text, say
    an OSError's file name, is described, not refused)."""
    try:
        return scrub_text(str(exc))
    except Exception:  # a broken __str__ must not break the classification of a failure
        return ""


@immutable_value
@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An exception described as data (rule V15): what the environment raised.

    ``causes`` are the messages of the explicit cause chain; ``failure`` makes
    it a *model failure* (an exception carrying `LlmFailure` facts).
    """

    message: str = ""
    name: str = "Error"
    code: str | None = None
    causes: tuple[str, ...] = ()
    failure: LlmFailure | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.message, str):
            raise ValidationError("error.message", "must be a string")
        if not isinstance(self.name, str) or not self.name:
            raise ValidationError("error.name", "must be a non-empty string")
        if self.code is not None and not isinstance(self.code, str):
            raise ValidationError("error.code", "must be a string")
        causes = self.causes
        if isinstance(causes, list):
            causes = tuple(causes)
        if not isinstance(causes, tuple) or not all(isinstance(c, str) for c in causes):
            raise ValidationError("error.causes", "must be a list of strings")
        if self.failure is not None and not isinstance(self.failure, LlmFailure):
            raise ValidationError("error.failure", "must be an LlmFailure")
        object.__setattr__(self, "message", plain_text(self.message, "error.message"))  # V23
        object.__setattr__(self, "name", plain_text(self.name, "error.name"))
        if self.code is not None:
            object.__setattr__(self, "code", plain_text(self.code, "error.code"))
        object.__setattr__(self, "causes", tuple(
            plain_text(cause, f"error.causes[{i}]") for i, cause in enumerate(causes)))

    def rendered(self) -> str:
        """The rendered text (reference §0.9): the own message (the class name if it is
        empty), then ``": " + message`` for each explicit cause in turn."""
        return ": ".join((self.message or self.name, *self.causes))

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        """Describe *exc*: class name, message, ``code`` if it is a coded error, the
        messages of its ``__cause__`` chain, and its ``failure`` if it carries one."""
        causes: list[str] = []
        seen = {id(exc)}
        cur = exc.__cause__
        while cur is not None and id(cur) not in seen:
            seen.add(id(cur))
            causes.append(_message_of(cur))
            cur = cur.__cause__
        code = getattr(exc, "code", None)
        failure = getattr(exc, "failure", None)
        return cls(message=_message_of(exc), name=scrub_text(type(exc).__name__) or "Error",
                   code=scrub_text(code) if isinstance(code, str) else None,
                   causes=tuple(causes),
                   failure=failure if isinstance(failure, LlmFailure) else None)

    def to_json(self) -> dict[str, JsonLike]:
        out: dict[str, JsonLike] = {"name": self.name, "message": self.message}
        if self.code is not None:
            out["code"] = self.code
        if self.causes:
            out["causes"] = list(self.causes)
        if self.failure is not None:
            out["failure"] = self.failure.to_json()
        return out

    @classmethod
    def checked(cls, value: object, path: str = "error") -> ErrorInfo:
        """V2, V15: *value*, an `ErrorInfo` however it was built, checked again: its fields
        are read as stored and go through the constructor, so one built without it (with
        ``object.__new__``, a NaN message, a list subclass of causes) is refused here,
        typed, instead of failing later inside the loop. Raises `ValidationError`."""
        if type(value) is not ErrorInfo:
            raise ValidationError(path, f"must be an ErrorInfo, not {type(value).__name__}")
        fields = _stored_fields(value, ErrorInfo, path)
        causes = fields["causes"]
        if type(causes) not in (tuple, list):
            raise ValidationError(f"{path}.causes", "must be a list of strings")
        failure = fields["failure"]
        try:
            return cls(message=fields["message"], name=fields["name"], code=fields["code"],
                       causes=tuple(causes),
                       failure=None if failure is None
                       else LlmFailure.checked(failure, "error.failure"))
        except ValidationError as exc:
            raise _rebase(exc, "error", path) from None

    @classmethod
    def from_json(cls, value: JsonLike, path: str = "error") -> ErrorInfo:
        if isinstance(value, ErrorInfo):
            return cls.checked(value, path)
        fields = _fields(value, path, "{name?, message, code?, causes?, failure?}", (),
                         ("name", "message", "code", "causes", "failure"))
        causes = _opt(fields, "causes", ())
        if not isinstance(causes, (list, tuple)):
            raise ValidationError(f"{path}.causes", "must be a list of strings")
        failure = _opt(fields, "failure")
        try:
            return cls(message=_opt(fields, "message", ""), name=_opt(fields, "name", "Error"),
                       code=_opt(fields, "code"), causes=tuple(causes),
                       failure=None if failure is None
                       else LlmFailure.from_json(failure, "error.failure"))
        except ValidationError as exc:
            raise _rebase(exc, "error", path) from None


def minted_id(mint: Callable[[str, int], str], kind: str, seq: int) -> str:
    """P12: the id *mint* gives the message that the event at *seq* records. It must be a
    non-empty string (V23 applies); anything else, or a mint that raises, is an internal
    failure of the loop (P16): this raises a `ValidationError` naming ``mint_id``."""
    minted = mint(kind, seq)
    if type(minted) is not str and not isinstance(minted, str):
        raise ValidationError("mint_id", f"returned a {type(minted).__name__}, not a "
                              "non-empty string")
    if not minted:
        raise ValidationError("mint_id", "returned an empty string")
    return plain_text(minted, "mint_id")


def internal_error(error: BaseException) -> ErrorInfo:
    """P16: the error an internal failure of the loop is reported with: the exception as it
    is (its class name, message, ``code`` if it is coded), as R15.3 reports any failure and
    as the original reports whatever its loop throws."""
    return ErrorInfo.from_exception(error)


def failure_text(error: BaseException) -> str:
    """P16: an internal failure in words, for a warning or an error message:
    ``<class>: <rendered message>``."""
    described = ErrorInfo.from_exception(error)
    return f"{described.name}: {described.rendered()}"


# --------------------------------------------------------------------------
# Environment-supplied values (rules V16–V18, V21)
# --------------------------------------------------------------------------


@immutable_value
@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool stage supplies (rule V16); validated when supplied.

    A malformed result raises a `ValidationError` whose ``code`` is
    ``INVALID_TOOL_RESULT`` (reference §10.9)."""

    content: FrozenList
    is_error: bool = False
    error: FrozenDict | None = None
    additional_contexts: tuple[Message, ...] = ()
    concludes_turn: bool = False
    meta: Frozen = None

    def __post_init__(self) -> None:
        try:
            self._validate()
        except ValidationError as exc:
            raise _rebase(exc, "result", "result", INVALID_TOOL_RESULT) from None

    def _validate(self) -> None:
        object.__setattr__(self, "content", freeze_content(self.content, "result.content"))
        if not isinstance(self.is_error, bool):
            raise ValidationError("result.isError", "must be a bool")
        if self.error is not None:
            error = freeze(self.error, "result.error")
            if not isinstance(error, FrozenDict) or not isinstance(error.get("name"), str):
                raise ValidationError("result.error", "must be a mapping with a string 'name'")
            object.__setattr__(self, "error", error)
        contexts = self.additional_contexts
        if not isinstance(contexts, (list, tuple)):
            raise ValidationError("result.additionalContexts", "must be a list of user messages")
        object.__setattr__(self, "additional_contexts", tuple(
            validate_user_message(c, f"result.additionalContexts[{i}]")
            for i, c in enumerate(contexts)))
        if not isinstance(self.concludes_turn, bool):
            raise ValidationError("result.concludesTurn", "must be a bool")
        object.__setattr__(self, "meta", freeze(self.meta, "result.meta"))

    def to_json(self) -> dict[str, JsonLike]:
        out: dict[str, JsonLike] = {"content": thaw(self.content)}
        if self.is_error:
            out["isError"] = True
        if self.error is not None:
            out["error"] = thaw(self.error)
        if self.additional_contexts:
            out["additionalContexts"] = [m.to_json() for m in self.additional_contexts]
        if self.concludes_turn:
            out["concludesTurn"] = True
        if self.meta is not None:
            out["meta"] = thaw(self.meta)
        return out

    @classmethod
    def from_json(cls, value: JsonLike, path: str = "result") -> ToolResult:
        if isinstance(value, ToolResult):
            return value
        try:
            fields = _fields(value, "result", "{content, ...}", ("content",),
                             ("isError", "error", "additionalContexts", "concludesTurn",
                              "meta"))
            return cls(content=fields["content"], is_error=_opt(fields, "isError", False),
                       error=_opt(fields, "error"),
                       additional_contexts=_opt(fields, "additionalContexts", ()),
                       concludes_turn=_opt(fields, "concludesTurn", False),
                       meta=_opt(fields, "meta"))
        except ValidationError as exc:
            raise _rebase(exc, "result", path, INVALID_TOOL_RESULT) from None


@immutable_value
@dataclass(frozen=True, slots=True)
class Allow:
    """``{kind:'allow', content?, additionalContexts?}`` (rule V17)."""

    content: FrozenList | None = None
    additional_contexts: tuple[Message, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.content is not None:
            object.__setattr__(self, "content", freeze_content(self.content, "decision.content"))
        contexts = self.additional_contexts
        if not isinstance(contexts, (list, tuple)):
            raise ValidationError("decision.additionalContexts",
                                  "must be a list of user messages")
        object.__setattr__(self, "additional_contexts", tuple(
            validate_user_message(c, f"decision.additionalContexts[{i}]")
            for i, c in enumerate(contexts)))

    def to_json(self) -> dict[str, JsonLike]:
        out: dict[str, JsonLike] = {"kind": "allow"}
        if self.content is not None:
            out["content"] = thaw(self.content)
        if self.additional_contexts:
            out["additionalContexts"] = [m.to_json() for m in self.additional_contexts]
        return out


@immutable_value
@dataclass(frozen=True, slots=True)
class Block:
    """``{kind:'block', reason}`` (rule V17)."""

    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str):
            raise ValidationError("decision.reason", "must be a string")
        object.__setattr__(self, "reason", plain_text(self.reason, "decision.reason"))  # V23

    def to_json(self) -> dict[str, JsonLike]:
        return {"kind": "block", "reason": self.reason}


PromptDecision: TypeAlias = Allow | Block
ALLOW: Final = Allow()


def decision_from_json(value: JsonLike, path: str = "decision") -> PromptDecision:
    """Validate a prompt-submit result (rule V17); raises ValidationError saying what is wrong."""
    if isinstance(value, (Allow, Block)):
        return value
    if not isinstance(value, (dict, FrozenDict)):
        raise ValidationError(path, "must be {kind:'allow', ...} or {kind:'block', reason}")
    kind = value.get("kind")
    try:
        if kind == "allow":
            fields = _mapping_fields(value, "decision", ("kind",),
                                     ("content", "additionalContexts"))
            return Allow(content=_opt(fields, "content"),
                         additional_contexts=_opt(fields, "additionalContexts", ()))
        if kind == "block":
            fields = _mapping_fields(value, "decision", ("kind", "reason"))
            return Block(fields["reason"])
    except ValidationError as exc:
        raise _rebase(exc, "decision", path) from None
    raise ValidationError(f"{path}.kind", f"{shown(kind)} is not 'allow' or 'block'")


def retry_action_from_json(value: JsonLike) -> bool:
    """Rule V21: a request-error result asks for a retry only if it is exactly
    ``{kind:'retry'}``; any other value (None included) means no retry."""
    return (isinstance(value, (dict, FrozenDict)) and len(value) == 1
            and value.get("kind") == "retry")


FINISH_KINDS = frozenset({"stop", "max-tokens", "error", "aborted"})
#: The chunk types a model stream may carry (rules V18, P12). The set is closed, as the
#: original's stream-chunk union is: the core refuses a streamed chunk of any other type
#: (D5). The log (L6) accepts any string type, so logs of other implementations load.
CHUNK_TYPES = frozenset({"text", "reasoning", "tool-call", "block", "usage", "finish"})

#: The characters ECMAScript's ``String.prototype.trim`` removes (its WhiteSpace and
#: LineTerminator): text made only of these is blank, whatever the language of a port (D15).
WHITESPACE = ("\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
              "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff")


def validate_chunk(value: JsonLike, path: str = "chunk") -> FrozenDict:
    """Rule V18: a chunk is a JSON mapping with a string ``type``; a usage chunk carries a
    mapping ``usage``; a finish chunk has a valid kind, a failure when kind is error (valid
    wherever present) and an optional ``replayState``. Which types a stream may carry, and
    what a finish may not carry, is the stream's rule (P12), not the value's.

    A malformed chunk raises a `ValidationError` whose ``code`` is ``INVALID_CHUNK``."""
    global _last_chunk
    # Why (performance): the core validates each chunk it is fed, and the log validates the
    # same frozen chunk again when its assistant/chunk event is appended. A FrozenDict is
    # immutable and this check depends on nothing else, so the very object accepted last
    # (held here, so its identity cannot be reused) is accepted again without a second pass.
    if value is _last_chunk and value is not None:
        return value
    if type(value) is FrozenDict and len(value) == 2 and type(value.get("text")) is str \
            and value.get("type") == "text":
        # Why: the usual chunk, as the core's snapshot of it (P6) hands it over: a frozen
        # {type: 'text', text} needs no check beyond these.
        _last_chunk = value
        return value
    if type(value) is dict and len(value) == 2 and type(value.get("text")) is str \
            and value.get("type") == "text" and type(value["type"]) is str:
        # Why: the usual chunk of a stream, {type: 'text', text}, whose two exact strings
        # are all that `_validate_chunk` would check: the same frozen copy, at once.
        chunk = FrozenDict._adopt(value.copy())
        _last_chunk = chunk
        return chunk
    try:
        chunk = _validate_chunk(value, path)
    except ValidationError as exc:
        raise _rebase(exc, path, path, INVALID_CHUNK) from None
    _last_chunk = chunk
    return chunk


#: The chunk `validate_chunk` accepted last.
_last_chunk: FrozenDict | None = None


def _validate_chunk(value: JsonLike, path: str) -> FrozenDict:
    chunk = freeze(value, path)
    if not isinstance(chunk, FrozenDict) or not isinstance(chunk.get("type"), str):
        raise ValidationError(path, "must be a mapping with a string 'type'")
    kind = chunk["type"]
    if kind == "usage":
        if not isinstance(chunk.get("usage"), FrozenDict):
            raise ValidationError(f"{path}.usage", "a usage chunk needs a mapping 'usage'")
    elif kind == "finish":
        finish = chunk.get("kind")
        if finish not in FINISH_KINDS:
            raise ValidationError(f"{path}.kind",
                                  f"{shown(finish)} is not stop, max-tokens, error or aborted")
        if "usage" in chunk and not isinstance(chunk["usage"], FrozenDict):
            raise ValidationError(f"{path}.usage", "must be a mapping")
        if finish == "error" and "failure" not in chunk:
            raise ValidationError(f"{path}.failure", "is required for an error finish")
        if "failure" in chunk:
            LlmFailure.from_json(chunk["failure"], f"{path}.failure")
    return chunk


# --------------------------------------------------------------------------
# Loop-written records: triggers and reasons (rules V13, V19, V20).
# Their decoders accept exactly the documented field sets (no nulls).
# --------------------------------------------------------------------------

TriggerKind: TypeAlias = Literal["message", "retry", "injection"]
TRIGGER_KINDS: frozenset[str] = frozenset({"message", "retry", "injection"})


@immutable_value
@dataclass(frozen=True, slots=True)
class TurnTrigger:
    """Why a turn opened (rule V13): ``{kind:'message', source}``, ``{kind:'retry'}`` or
    the reserved ``{kind:'injection', source}``."""

    kind: TriggerKind
    source: FrozenDict | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in TRIGGER_KINDS:
            raise ValidationError("trigger.kind",
                                  f"{shown(self.kind)} is not 'message', 'retry' or 'injection'")
        if self.kind == "retry":
            if self.source is not None:
                raise ValidationError("trigger.source", "a retry trigger has no source")
        elif self.source is None:
            raise ValidationError("trigger.source", f"is required for a {shown(self.kind)} trigger")
        else:
            object.__setattr__(self, "source", freeze_source(self.source, "trigger.source"))

    @classmethod
    def for_message(cls, source: Mapping[str, JsonLike]) -> TurnTrigger:
        """The trigger of a prompt turn: the claimed prompt's source."""
        return cls("message", source)  # type: ignore[arg-type]

    @classmethod
    def _of_message(cls, message: Message) -> TurnTrigger:
        """`for_message` of a `Message`'s source, which the message checked and froze when
        it was made (V4), so nothing is checked again (internal to the library: the core
        makes one per turn)."""
        trigger = object.__new__(cls)
        object.__setattr__(trigger, "kind", "message")
        object.__setattr__(trigger, "source", message.source)
        return trigger

    def to_json(self) -> dict[str, JsonLike]:
        out: dict[str, JsonLike] = {"kind": self.kind}
        if self.source is not None:
            out["source"] = thaw(self.source)
        return out

    @classmethod
    def from_json(cls, value: JsonLike, path: str = "trigger") -> TurnTrigger:
        if isinstance(value, TurnTrigger):
            return value
        try:
            kind = value.get("kind") if isinstance(value, (dict, FrozenDict)) else None
            if kind == "retry":
                fields = _fields(value, "trigger", "{kind:'retry'}", ("kind",))
            else:
                fields = _fields(value, "trigger", "{kind, source}", ("kind", "source"))
            return cls(fields["kind"], fields.get("source"))
        except ValidationError as exc:
            raise _rebase(exc, "trigger", path) from None


RETRY_TRIGGER: Final = TurnTrigger("retry")

TurnEndKind: TypeAlias = Literal["completed", "aborted", "error", "disposed", "max-tokens",
                                 "interrupted"]
TURN_END_KINDS: frozenset[str] = frozenset({"completed", "aborted", "error", "disposed",
                                            "max-tokens", "interrupted"})


@immutable_value
@dataclass(frozen=True, slots=True)
class TurnEndReason:
    """The durable reason of ``turn/end`` (rule V19).

    Every kind but ``error`` carries no other field. An ``error`` reason has a
    ``step`` (0 when no step began) and either a ``failure`` (a final request
    failure) or a ``message`` (the rendered text) with an optional ``code``.
    """

    kind: TurnEndKind
    step: int | None = None
    failure: LlmFailure | None = None
    message: str | None = None
    code: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in TURN_END_KINDS:
            raise ValidationError("reason.kind", f"{shown(self.kind)} is not a turn-end reason kind")
        if self.kind != "error":
            for name, item in (("step", self.step), ("failure", self.failure),
                               ("message", self.message), ("code", self.code)):
                if item is not None:
                    raise ValidationError(f"reason.{name}",
                                          f"is not allowed on a {shown(self.kind)} reason")
            return
        if type(self.step) is not int or self.step < 0:
            raise ValidationError("reason.step", "must be a non-negative integer")
        if self.failure is not None:
            if not isinstance(self.failure, LlmFailure):
                raise ValidationError("reason.failure", "must be an LlmFailure")
            for name, item in (("message", self.message), ("code", self.code)):
                if item is not None:
                    raise ValidationError(f"reason.{name}",
                                          "is not allowed beside a failure")
            return
        if not isinstance(self.message, str):
            raise ValidationError("reason.message",
                                  "an error reason needs a failure or a string message")
        if self.code is not None and not isinstance(self.code, str):
            raise ValidationError("reason.code", "must be a string")
        object.__setattr__(self, "message", plain_text(self.message, "reason.message"))  # V23
        if self.code is not None:
            object.__setattr__(self, "code", plain_text(self.code, "reason.code"))

    @classmethod
    def request_failure(cls, step: int, failure: LlmFailure) -> TurnEndReason:
        """``{kind:'error', step, failure}``: a final request failure."""
        return cls("error", step=step, failure=failure)

    @classmethod
    def failed(cls, step: int, message: str, code: str | None = None) -> TurnEndReason:
        """``{kind:'error', step, message, code?}``: any other failure."""
        return cls("error", step=step, message=message, code=code)

    def to_json(self) -> dict[str, JsonLike]:
        out: dict[str, JsonLike] = {"kind": self.kind}
        if self.kind == "error":
            out["step"] = self.step
            if self.failure is not None:
                out["failure"] = self.failure.to_json()
            else:
                out["message"] = self.message
                if self.code is not None:
                    out["code"] = self.code
        return out

    @classmethod
    def from_json(cls, value: JsonLike, path: str = "reason") -> TurnEndReason:
        if isinstance(value, TurnEndReason):
            return value
        try:
            kind = value.get("kind") if isinstance(value, (dict, FrozenDict)) else None
            if kind != "error":
                fields = _fields(value, "reason", "{kind}", ("kind",))
                return cls(fields["kind"])
            if isinstance(value, (dict, FrozenDict)) and "failure" in value:
                fields = _fields(value, "reason", "{kind:'error', step, failure}",
                                 ("kind", "step", "failure"))
                return cls("error", step=fields["step"],
                           failure=LlmFailure.from_json(fields["failure"], "reason.failure"))
            fields = _fields(value, "reason", "{kind:'error', step, message, code?}",
                             ("kind", "step", "message"), ("code",))
            if "code" in fields and fields["code"] is None:
                raise ValidationError("reason.code", "must be a string when present")
            return cls("error", step=fields["step"], message=fields["message"],
                       code=fields.get("code"))
        except ValidationError as exc:
            raise _rebase(exc, "reason", path) from None


END_COMPLETED: Final = TurnEndReason("completed")
END_ABORTED: Final = TurnEndReason("aborted")
END_DISPOSED: Final = TurnEndReason("disposed")
END_MAX_TOKENS: Final = TurnEndReason("max-tokens")
END_INTERRUPTED: Final = TurnEndReason("interrupted")

SettleKind: TypeAlias = Literal["completed", "aborted", "error"]
SETTLE_KINDS: frozenset[str] = frozenset({"completed", "aborted", "error"})


@immutable_value
@dataclass(frozen=True, slots=True)
class SettleReason:
    """How a chain settled (rule V20): ``{kind:'completed'}``, ``{kind:'aborted'}`` or
    ``{kind:'error', error, failure?}`` with the error described as data."""

    kind: SettleKind
    error: ErrorInfo | None = None
    failure: LlmFailure | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in SETTLE_KINDS:
            raise ValidationError("reason.kind",
                                  f"{shown(self.kind)} is not 'completed', 'aborted' or 'error'")
        if self.kind != "error":
            for name, item in (("error", self.error), ("failure", self.failure)):
                if item is not None:
                    raise ValidationError(f"reason.{name}",
                                          f"is not allowed on a {shown(self.kind)} reason")
            return
        if not isinstance(self.error, ErrorInfo):
            raise ValidationError("reason.error", "an error reason needs an ErrorInfo")
        if self.failure is not None and not isinstance(self.failure, LlmFailure):
            raise ValidationError("reason.failure", "must be an LlmFailure")

    def to_json(self) -> dict[str, JsonLike]:
        out: dict[str, JsonLike] = {"kind": self.kind}
        if self.error is not None:
            out["error"] = self.error.to_json()
        if self.failure is not None:
            out["failure"] = self.failure.to_json()
        return out

    @classmethod
    def from_json(cls, value: JsonLike, path: str = "reason") -> SettleReason:
        if isinstance(value, SettleReason):
            return value
        try:
            kind = value.get("kind") if isinstance(value, (dict, FrozenDict)) else None
            if kind != "error":
                fields = _fields(value, "reason", "{kind}", ("kind",))
                return cls(fields["kind"])
            fields = _fields(value, "reason", "{kind:'error', error, failure?}",
                             ("kind", "error"), ("failure",))
            failure = fields.get("failure", ...)
            if failure is None:
                raise ValidationError("reason.failure", "must be a mapping when present")
            return cls("error", error=ErrorInfo.from_json(fields["error"], "reason.error"),
                       failure=None if failure is ...
                       else LlmFailure.from_json(failure, "reason.failure"))
        except ValidationError as exc:
            raise _rebase(exc, "reason", path) from None


SETTLE_COMPLETED: Final = SettleReason("completed")
SETTLE_ABORTED: Final = SettleReason("aborted")
