"""Typed views of event data and notification payloads (specs/vocabulary.md E5).

The durable shapes are the reference's and never change (E1, E3): a
``user/message`` event's data *is* the message, a ``steering/message``
event's data is ``{turn, message}``, and so on. A view reads one shape into a
typed, immutable object, so listener code needs neither key lookups nor casts:

    agent.on("turn/end", lambda event: print(event.data_as(TurnEndData).reason.kind))
    agent.on("*", lambda event: print(event.message.text) if event.is_surface else None)

    match event.view:
        case UserMessageData(message) | SteeringMessageData(_, message):
            ...
        case TurnEndData(turn, reason):
            ...

`Event.view` / `LiveEvent.view` give the view of their type (`ExtensionData`
for a type outside the catalog); `Event.data_as(View)` /
`LiveEvent.payload_as(View)` give the view of an expected type, or raise
`ValidationError` when the event is of another type; `Event.message` is the
message of each surface type, and `LiveEvent.message` that of an inbox
notice. Views are decoded at each access (keep the one you read).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Final, Self, TypeAlias, TypeVar

from machine.errors import ValidationError
from machine.jsonvalue import Frozen, FrozenDict, FrozenList
from machine.vocabulary import (
    CancelCause,
    ErrorInfo,
    Message,
    SettleReason,
    TurnEndReason,
    TurnTrigger,
)

__all__ = [
    "DURABLE_VIEWS",
    "LIVE_VIEWS",
    "AgentCreatedData",
    "AgentDisposedData",
    "AgentErrorData",
    "AssistantChunkData",
    "AssistantMessageData",
    "CancelRequestedData",
    "ContextDiscardData",
    "DurableData",
    "ExtensionData",
    "InboxDequeueData",
    "InboxDiscardData",
    "InboxEnqueueData",
    "LiveData",
    "RequestHeaderData",
    "SessionCreatedData",
    "SessionDisposedData",
    "SessionStartData",
    "SettledData",
    "StatusData",
    "SteeringMessageData",
    "StepEndData",
    "StepStartData",
    "TodoWriteData",
    "ToolCallData",
    "ToolResultData",
    "TurnEndData",
    "TurnStartData",
    "UserMessageData",
    "WarningData",
    "durable_view",
    "live_view",
]


def _field(data: FrozenDict, key: str, where: str) -> Frozen:
    if key not in data:
        raise ValidationError(f"{where}.{key}", "is missing")
    return data[key]


def _int(data: FrozenDict, key: str, where: str) -> int:
    value = _field(data, key, where)
    if type(value) is not int:
        raise ValidationError(f"{where}.{key}", f"must be an integer, not {value!r}")
    return value


def _str(data: FrozenDict, key: str, where: str) -> str:
    value = _field(data, key, where)
    if not isinstance(value, str):
        raise ValidationError(f"{where}.{key}", f"must be a string, not {value!r}")
    return value


def _mapping(data: FrozenDict, key: str, where: str, *, optional: bool = False
             ) -> FrozenDict | None:
    value = data.get(key) if optional else _field(data, key, where)
    if value is None and optional:
        return None
    if not isinstance(value, FrozenDict):
        raise ValidationError(f"{where}.{key}", f"must be a mapping, not {value!r}")
    return value


def _messages(data: FrozenDict, key: str, where: str) -> tuple[Message, ...]:
    value = _field(data, key, where)
    if not isinstance(value, FrozenList):
        raise ValidationError(f"{where}.{key}", "must be a list of messages")
    return tuple(Message.from_json(item, f"{where}.{key}[{i}]") for i, item in enumerate(value))


# --------------------------------------------------------------------------
# Durable events (E1)
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnStartData:
    """``turn/start {turn, trigger}``."""

    TYPE: ClassVar[str] = "turn/start"
    turn: int
    trigger: TurnTrigger

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "data") -> TurnStartData:
        return cls(_int(data, "turn", where),
                   TurnTrigger.from_json(_field(data, "trigger", where), f"{where}.trigger"))


@dataclass(frozen=True, slots=True)
class TurnEndData:
    """``turn/end {turn, reason}``."""

    TYPE: ClassVar[str] = "turn/end"
    turn: int
    reason: TurnEndReason

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "data") -> TurnEndData:
        return cls(_int(data, "turn", where),
                   TurnEndReason.from_json(_field(data, "reason", where), f"{where}.reason"))


@dataclass(frozen=True, slots=True)
class _TurnStep:
    turn: int
    step: int

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "data") -> Self:
        return cls(_int(data, "turn", where), _int(data, "step", where))


@dataclass(frozen=True, slots=True)
class StepStartData(_TurnStep):
    """``step/start {turn, step}``."""

    TYPE: ClassVar[str] = "step/start"


@dataclass(frozen=True, slots=True)
class StepEndData(_TurnStep):
    """``step/end {turn, step}``."""

    TYPE: ClassVar[str] = "step/end"


@dataclass(frozen=True, slots=True)
class UserMessageData:
    """``user/message``: the data is the user message itself."""

    TYPE: ClassVar[str] = "user/message"
    message: Message

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "data") -> UserMessageData:
        return cls(Message.from_json(data, where))


@dataclass(frozen=True, slots=True)
class SteeringMessageData:
    """``steering/message {turn, message}``."""

    TYPE: ClassVar[str] = "steering/message"
    turn: int
    message: Message

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "data") -> SteeringMessageData:
        return cls(_int(data, "turn", where),
                   Message.from_json(_field(data, "message", where), f"{where}.message"))


@dataclass(frozen=True, slots=True)
class AssistantChunkData:
    """``assistant/chunk {turn, step, chunk}`` (the chunk as the model streamed it, V18)."""

    TYPE: ClassVar[str] = "assistant/chunk"
    turn: int
    step: int
    chunk: FrozenDict

    @property
    def chunk_type(self) -> str:
        """The chunk's ``type`` (``text``, ``reasoning``, ``tool-call``, ``finish``, …)."""
        return str(self.chunk.get("type"))

    @property
    def text(self) -> str:
        """The text of a ``text`` or ``reasoning`` chunk ('' for other chunks)."""
        value = self.chunk.get("text") if self.chunk_type in ("text", "reasoning") else None
        return value if isinstance(value, str) else ""

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "data") -> AssistantChunkData:
        chunk = _mapping(data, "chunk", where)
        assert chunk is not None
        return cls(_int(data, "turn", where), _int(data, "step", where), chunk)


@dataclass(frozen=True, slots=True)
class AssistantMessageData:
    """``assistant/message {turn, step, message, interrupted?, usage?}``: ``interrupted`` is
    true for what a stream delivered before a cancel stopped it (D15)."""

    TYPE: ClassVar[str] = "assistant/message"
    turn: int
    step: int
    message: Message
    usage: FrozenDict | None = None
    interrupted: bool = False

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "data") -> AssistantMessageData:
        interrupted = data.get("interrupted", False)
        if type(interrupted) is not bool:
            raise ValidationError(f"{where}.interrupted", "must be a bool")
        return cls(_int(data, "turn", where), _int(data, "step", where),
                   Message.from_json(_field(data, "message", where), f"{where}.message"),
                   _mapping(data, "usage", where, optional=True), interrupted)


@dataclass(frozen=True, slots=True)
class ToolCallData:
    """``tool/call {turn, step, callId, name, arguments}`` (arguments: the planned value,
    R10.1 — the parsed JSON, ``{}`` for empty text, or the raw string)."""

    TYPE: ClassVar[str] = "tool/call"
    turn: int
    step: int
    call_id: str
    name: str
    arguments: Frozen

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "data") -> ToolCallData:
        return cls(_int(data, "turn", where), _int(data, "step", where),
                   _str(data, "callId", where), _str(data, "name", where),
                   _field(data, "arguments", where))


@dataclass(frozen=True, slots=True)
class ToolResultData:
    """``tool/result {turn, step, message, error?, meta?}`` (the message is a tool-result
    message: one ``tool-result`` block)."""

    TYPE: ClassVar[str] = "tool/result"
    turn: int
    step: int
    message: Message
    error: FrozenDict | None = None
    meta: Frozen = None

    @property
    def result_block(self) -> FrozenDict:
        block = self.message.content[0]
        assert isinstance(block, FrozenDict)
        return block

    @property
    def call_id(self) -> str:
        """The id of the call this result answers."""
        return str(self.result_block.get("toolCallId"))

    @property
    def is_error(self) -> bool:
        return self.result_block.get("isError") is True

    @property
    def text(self) -> str:
        """The concatenated text blocks of the result's content."""
        content = self.result_block.get("content")
        return "".join(str(b.get("text", "")) for b in content
                       if isinstance(b, FrozenDict) and b.get("type") == "text") \
            if isinstance(content, FrozenList) else ""

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "data") -> ToolResultData:
        message = Message.from_json(_field(data, "message", where), f"{where}.message")
        if len(message.content) != 1 or not isinstance(message.content[0], FrozenDict):
            raise ValidationError(f"{where}.message.content", "must be one tool-result block")
        return cls(_int(data, "turn", where), _int(data, "step", where), message,
                   _mapping(data, "error", where, optional=True), data.get("meta"))


@dataclass(frozen=True, slots=True)
class TodoWriteData:
    """``todo/write {todos}``."""

    TYPE: ClassVar[str] = "todo/write"
    todos: FrozenList

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "data") -> TodoWriteData:
        todos = _field(data, "todos", where)
        if not isinstance(todos, FrozenList):
            raise ValidationError(f"{where}.todos", "must be a list")
        return cls(todos)


def header_config(header: FrozenDict) -> FrozenDict:
    """A request header's ``config`` (P13; empty if it has none)."""
    config = header.get("config")
    return config if isinstance(config, FrozenDict) else FrozenDict()


def header_tools(header: FrozenDict) -> FrozenList:
    """A request header's ``tools`` (empty if it has none)."""
    tools = header.get("tools")
    return tools if isinstance(tools, FrozenList) else FrozenList()


@dataclass(frozen=True, slots=True)
class RequestHeaderData:
    """``request/header {header: {config, system?, tools?}, reason}`` (reason ``initial``,
    ``resume`` or ``change``)."""

    TYPE: ClassVar[str] = "request/header"
    header: FrozenDict
    reason: str

    @property
    def config(self) -> FrozenDict:
        return header_config(self.header)

    @property
    def system(self) -> Frozen:
        return self.header.get("system")

    @property
    def tools(self) -> FrozenList:
        return header_tools(self.header)

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "data") -> RequestHeaderData:
        header = _mapping(data, "header", where)
        assert header is not None
        return cls(header, _str(data, "reason", where))


@dataclass(frozen=True, slots=True)
class ExtensionData:
    """An event or notification of a type outside the catalog: its type and data as they are."""

    type: str
    data: FrozenDict


DurableData: TypeAlias = (TurnStartData | TurnEndData | StepStartData | StepEndData
                          | UserMessageData | SteeringMessageData | AssistantChunkData
                          | AssistantMessageData | ToolCallData | ToolResultData | TodoWriteData
                          | RequestHeaderData)

# --------------------------------------------------------------------------
# Live notifications (E3)
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatusData:
    """``agent/status {status}`` (``idle`` or ``running``)."""

    TYPE: ClassVar[str] = "agent/status"
    status: str

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "payload") -> StatusData:
        return cls(_str(data, "status", where))


@dataclass(frozen=True, slots=True)
class _Placed:
    message: Message
    placement: str

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "payload") -> Self:
        return cls(Message.from_json(_field(data, "message", where), f"{where}.message"),
                   _str(data, "placement", where))


@dataclass(frozen=True, slots=True)
class InboxEnqueueData(_Placed):
    """``agent/inbox/enqueue {message, placement}`` (``queued`` or ``steering``)."""

    TYPE: ClassVar[str] = "agent/inbox/enqueue"


@dataclass(frozen=True, slots=True)
class InboxDequeueData(_Placed):
    """``agent/inbox/dequeue {message, placement}``."""

    TYPE: ClassVar[str] = "agent/inbox/dequeue"


@dataclass(frozen=True, slots=True)
class _Discarded:
    messages: tuple[Message, ...]

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "payload") -> Self:
        return cls(_messages(data, "messages", where))


@dataclass(frozen=True, slots=True)
class InboxDiscardData(_Discarded):
    """``agent/inbox/discard {messages}``: queued items, then steering items, each FIFO."""

    TYPE: ClassVar[str] = "agent/inbox/discard"


@dataclass(frozen=True, slots=True)
class ContextDiscardData(_Discarded):
    """``agent/context/discard {messages}``: dropped staged context, FIFO."""

    TYPE: ClassVar[str] = "agent/context/discard"


@dataclass(frozen=True, slots=True)
class CancelRequestedData:
    """``agent/cancel-requested {cause}``."""

    TYPE: ClassVar[str] = "agent/cancel-requested"
    cause: CancelCause

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "payload") -> CancelRequestedData:
        return cls(CancelCause.from_json(_field(data, "cause", where), f"{where}.cause",
                                         allow_disposed=True))


@dataclass(frozen=True, slots=True)
class SettledData:
    """``agent/settled {turn, reason}`` (reason: V20)."""

    TYPE: ClassVar[str] = "agent/settled"
    turn: int
    reason: SettleReason

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "payload") -> SettledData:
        return cls(_int(data, "turn", where),
                   SettleReason.from_json(_field(data, "reason", where), f"{where}.reason"))


@dataclass(frozen=True, slots=True)
class AgentErrorData:
    """``agent/error {turn, step, error}`` (error: V15)."""

    TYPE: ClassVar[str] = "agent/error"
    turn: int
    step: int
    error: ErrorInfo

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "payload") -> AgentErrorData:
        return cls(_int(data, "turn", where), _int(data, "step", where),
                   ErrorInfo.from_json(_field(data, "error", where), f"{where}.error"))


@dataclass(frozen=True, slots=True)
class WarningData:
    """``agent/warning {text}``."""

    TYPE: ClassVar[str] = "agent/warning"
    text: str

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "payload") -> WarningData:
        return cls(_str(data, "text", where))


@dataclass(frozen=True, slots=True)
class SessionStartData:
    """``agent/session-start {source}`` (``startup``, ``resume``, ``clear``, ``compact``)."""

    TYPE: ClassVar[str] = "agent/session-start"
    source: str

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "payload") -> SessionStartData:
        return cls(_str(data, "source", where))


@dataclass(frozen=True, slots=True)
class AgentCreatedData:
    """``agent/created {status}``."""

    TYPE: ClassVar[str] = "agent/created"
    status: str | None = None

    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "payload") -> AgentCreatedData:
        status = data.get("status")
        return cls(status if isinstance(status, str) else None)


@dataclass(frozen=True, slots=True)
class _Bare:
    @classmethod
    def from_data(cls, data: FrozenDict, where: str = "payload") -> Self:
        return cls()


@dataclass(frozen=True, slots=True)
class AgentDisposedData(_Bare):
    """``agent/disposed`` (no payload)."""

    TYPE: ClassVar[str] = "agent/disposed"


@dataclass(frozen=True, slots=True)
class SessionCreatedData(_Bare):
    """``session/created`` (no payload)."""

    TYPE: ClassVar[str] = "session/created"


@dataclass(frozen=True, slots=True)
class SessionDisposedData(_Bare):
    """``session/disposed`` (no payload)."""

    TYPE: ClassVar[str] = "session/disposed"


LiveData: TypeAlias = (StatusData | InboxEnqueueData | InboxDequeueData | InboxDiscardData
                       | ContextDiscardData | CancelRequestedData | SettledData | AgentErrorData
                       | WarningData | SessionStartData | AgentCreatedData | AgentDisposedData
                       | SessionCreatedData | SessionDisposedData)

#: The view class of each durable type of the catalog (E1).
DURABLE_VIEWS: Final[dict[str, Callable[[FrozenDict, str], DurableData]]] = {
    view.TYPE: view.from_data for view in (
        TurnStartData, TurnEndData, StepStartData, StepEndData, UserMessageData,
        SteeringMessageData, AssistantChunkData, AssistantMessageData, ToolCallData,
        ToolResultData, TodoWriteData, RequestHeaderData)}
#: The view class of each live type of the catalog (E3).
LIVE_VIEWS: Final[dict[str, Callable[[FrozenDict, str], LiveData]]] = {
    view.TYPE: view.from_data for view in (
        StatusData, InboxEnqueueData, InboxDequeueData, InboxDiscardData, ContextDiscardData,
        CancelRequestedData, SettledData, AgentErrorData, WarningData, SessionStartData,
        AgentCreatedData, AgentDisposedData, SessionCreatedData, SessionDisposedData)}

V = TypeVar("V", bound="DurableData | LiveData")


def durable_view(type_: str, data: FrozenDict) -> DurableData | ExtensionData:
    """The view of a durable event's data (`ExtensionData` for an extension type)."""
    decode = DURABLE_VIEWS.get(type_)
    return ExtensionData(type_, data) if decode is None else decode(data, "data")


def live_view(type_: str, payload: FrozenDict) -> LiveData | ExtensionData:
    """The view of a live notification's payload (`ExtensionData` for an unknown type)."""
    decode = LIVE_VIEWS.get(type_)
    return ExtensionData(type_, payload) if decode is None else decode(payload, "payload")


def view_as(expected: type[V], type_: str, data: FrozenDict, what: str) -> V:
    """The *expected* view of data of *type_*; `ValidationError` if the type differs."""
    wanted = getattr(expected, "TYPE", None)
    if wanted != type_:
        raise ValidationError(what, f"a {type_!r} {'event' if what == 'data' else 'notice'} "
                              f"has no {expected.__name__} (that view reads {wanted!r})")
    view = expected.from_data(data, what)
    assert isinstance(view, expected)
    return view


#: The durable types whose data carries a message, and where (E2).
SURFACE_MESSAGE: Final = {"user/message": None, "steering/message": "message",
                          "assistant/message": "message", "tool/result": "message"}
