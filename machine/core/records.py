"""The small records the core keeps besides its machines and frames: abort controllers, waits,
a cancel's scope and its pending reports (P7), effects, failures inside a turn (R15), a step's
outcome; and the frozen forms of the values its events carry."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from machine import events as ev
from machine.events import LiveEvent
from machine.io import Control, EffectKind, Live, Output
from machine.jsonvalue import FrozenDict, FrozenList, freeze
from machine.vocabulary import (
    END_ABORTED,
    END_COMPLETED,
    END_DISPOSED,
    END_MAX_TOKENS,
    RETRY_TRIGGER,
    SETTLE_ABORTED,
    SETTLE_COMPLETED,
    CancelCause,
    ErrorInfo,
    LlmFailure,
    Message,
    SettleReason,
    ToolResult,
    TurnEndReason,
    TurnTrigger,
    message_mapping,
)

#: E2: the surface operation of the surface events the loop appends.
APPEND: Final = "append"

#: R20.4: the event types the loop writes to structure its turns; while the core is busy a
#: direct append of one of them is refused.
LOOP_TYPES: Final = frozenset({ev.TURN_START, ev.TURN_END, ev.STEP_START, ev.STEP_END,
                               ev.ASSISTANT_CHUNK, ev.ASSISTANT_MESSAGE, ev.TOOL_CALL,
                               ev.TOOL_RESULT})

#: R9.7: the failure of a finish chunk of kind error or aborted that carries none.
DEFAULT_ABORT_FAILURE: Final = LlmFailure("model request aborted", "ABORTED")

#: R9.6: the text of the uncoded error for a request config without provider or model.
NO_ROUTE_MESSAGE: Final = ("the request config has no provider/model: set them in "
                           "CoreConfig.request_options or return both from the request effect")


@dataclass(slots=True)
class Controller:
    """An abort controller: one per admission, one per run (R4.4); *reason* is the cause of
    the first cancel that aborted it (R16.3)."""

    signal: int
    kind: Literal["admission", "run"]
    reason: CancelCause | None = None

    @property
    def aborted(self) -> bool:
        return self.reason is not None


class Wait:
    """What a phase of the loop gives to suspend until a completion of one of *ids* is
    available (P6). Never changed once made; a plain class because the loop makes one per
    wait."""

    __slots__ = ("ids",)

    def __init__(self, ids: frozenset[int]) -> None:
        self.ids = ids

    def __repr__(self) -> str:
        return f"Wait(ids={set(self.ids)!r})"


@dataclass(slots=True)
class DiscardSlot:
    """A discard report whose message lists may still grow (P7); materialised when pulled.

    The inbox report lists queued items, then steering items (R16.2), so input that
    observers of ``agent/cancel-requested`` queue lands before the steering it clears.
    """

    type: str
    queued: list[Message] = field(default_factory=list)
    steering: list[Message] = field(default_factory=list)

    @property
    def messages(self) -> list[Message]:
        return [*self.queued, *self.steering]

    def materialise(self) -> Live | None:
        if not self.queued and not self.steering:
            return None
        return Live(LiveEvent(self.type, FrozenDict({"messages": FrozenList(
            frozen_message(m) for m in self.messages)})))


@dataclass(slots=True)
class AbortNotice:
    """The ``abort`` output of a cancel, queued; its reason is the cause of whichever cancel of
    its scope aborts first (a joined cancel does, D9), so it is materialised when pulled."""

    signal: int
    reason: CancelCause

    def materialise(self) -> Control:
        return Control("abort", FrozenDict({"signal": self.signal,
                                            "reason": frozen_json(self.reason)}))


@dataclass(slots=True)
class CancelScope:
    """One effective cancel's scope (P7): its pending reports (none for a keepInbox cancel
    until a joined cancel clears something), its pending ``abort``, and how much input the
    current position of its delivery has swept into the reports (D9)."""

    inbox_slot: DiscardSlot | None
    context_slot: DiscardSlot | None
    abort: AbortNotice | None = None
    fresh: int = 0


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """A queued ``agent/cancel-requested`` notice: pulling it opens its cancel's delivery (P7)."""

    output: Live
    scope: CancelScope


@dataclass(slots=True)
class EffectRecord:
    """An outstanding effect (P4): in the core's effects from its request until it completes,
    is released (P5) or is abandoned (P16); a completion of an id no longer there is
    refused (P10) or, when abandoned, dropped."""

    kind: EffectKind
    payload: FrozenDict


class Aborted(Exception):
    """Raised inside the loop by a signal check on an aborted signal (R0.7)."""


class Failure(Exception):
    """A generic or request failure inside a turn (R15); its code is its error's."""

    def __init__(self, error: ErrorInfo, *, request_failure: LlmFailure | None = None) -> None:
        super().__init__(error.rendered())
        self.error = error
        self.code = error.code
        self.request_failure = request_failure

    def __reduce__(self) -> tuple[object, ...]:
        # Why: an exception pickles as its class called with its args (the rendered text
        # here, not the error); a pickled snapshot holds the failure of a turn (R4.12).
        return type(self), (self.error,), vars(self)


#: What ends a turn early: an abort or a failure (R8.6, R15).
TurnFailure: TypeAlias = "Aborted | Failure"


@dataclass(slots=True)
class StepOutcome:
    """What a step hands back to the step loop (R8.4, R8.5)."""

    request_failed: bool = False
    had_calls: bool = False
    took_steering: bool = False
    concluded: bool = False
    max_tokens: bool = False


#: A completion buffered until the loop takes it (P6): (effect id, kind, value).
Mail: TypeAlias = tuple[int, str, Any]

#: What the output queue holds: outputs, and a cancel's parts materialised when pulled (P7).
Queued: TypeAlias = "Output | DiscardSlot | CancelRequested | AbortNotice"


def warning(text: str) -> Live:
    """An ``agent/warning`` notice (R0.8)."""
    return Live(LiveEvent(ev.WARNING, FrozenDict({"text": text})))


def announced_id(notice: Live) -> object:
    """The id of the message an ``agent/inbox/enqueue`` notice announces."""
    message = notice.event.payload.get("message")
    return message.get("id") if isinstance(message, FrozenDict) else None


def frozen_message(message: Message) -> FrozenDict:
    """The frozen JSON form of a message (no copying: its parts are already frozen)."""
    return message_mapping(message)


def frozen_json(value: CancelCause | ErrorInfo | LlmFailure | ToolResult | TurnEndReason
                | SettleReason | TurnTrigger) -> FrozenDict:
    # Why the envelope bound: the parts were checked on entry; the wrapping adds a level (V1).
    frozen = freeze(value.to_json(), "value", max_depth=None)
    assert isinstance(frozen, FrozenDict)
    return frozen


#: The frozen JSON of the constant records, made once (they live as long as the module).
_CONSTANT_JSON: Final = {id(record): frozen_json(record) for record in (
    END_COMPLETED, END_ABORTED, END_DISPOSED, END_MAX_TOKENS, SETTLE_COMPLETED, SETTLE_ABORTED,
    RETRY_TRIGGER)}


def record_json(record: TurnEndReason | SettleReason | TurnTrigger) -> FrozenDict:
    """The frozen JSON form of a reason or trigger, as ``turn/start``, ``turn/end`` and
    ``agent/settled`` carry it."""
    cached = _CONSTANT_JSON.get(id(record))
    if cached is not None:
        return cached
    if type(record) is TurnTrigger and record.source is not None:
        # Why not to_json: it thaws the source, which is frozen already (V13).
        return FrozenDict._adopt({"kind": record.kind, "source": record.source}, 0)
    return frozen_json(record)
