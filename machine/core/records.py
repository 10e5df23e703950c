"""The records the loop keeps and the constants it writes: controllers, waits, the
cancel scope and its pending reports (P7), effects, failures (R15), step outcomes."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from machine import events as ev
from machine.events import LiveEvent
from machine.io import (
    Control,
    EffectKind,
    Live,
    Output,
)
from machine.jsonvalue import (
    FrozenDict,
    FrozenList,
    freeze,
)
from machine.vocabulary import (
    END_ABORTED,
    END_COMPLETED,
    END_DISPOSED,
    END_MAX_TOKENS,
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
from machine.vocabulary import RETRY_TRIGGER as RETRY

#: The reasons and triggers the loop writes, as the vocabulary's typed records (V13, V19,
#: V20); `record_json` gives their frozen JSON form where an event or notice carries one.
COMPLETED: Final = END_COMPLETED
ABORTED: Final = END_ABORTED
DISPOSED: Final = END_DISPOSED
MAX_TOKENS: Final = END_MAX_TOKENS
SETTLED_COMPLETED: Final = SETTLE_COMPLETED
SETTLED_ABORTED: Final = SETTLE_ABORTED
RETRY_TRIGGER: Final = RETRY


APPEND: Final = "append"


#: R20.4: the event types the loop writes to structure its turns; while the core is busy a
#: direct append of one of them is refused.
LOOP_TYPES: Final = frozenset({ev.TURN_START, ev.TURN_END, ev.STEP_START, ev.STEP_END,
                               ev.ASSISTANT_CHUNK, ev.ASSISTANT_MESSAGE, ev.TOOL_CALL,
                               ev.TOOL_RESULT})


ABD_ERROR: Final = FrozenDict({"name": "AbortError", "code": "ABORTED_BEFORE_DISPATCH"})


ABD_TEXT: Final = "Error: tool call aborted before dispatch"


ABORTED_ERROR: Final = FrozenDict({"name": "AbortError", "code": "ABORTED"})


ABORTED_TEXT: Final = "Error: tool call aborted"


DEFAULT_ABORT_FAILURE: Final = LlmFailure("model request aborted", "ABORTED")


#: R9.6: the text of the uncoded error for a request config without provider or model.
NO_ROUTE_MESSAGE: Final = ("the request config has no provider/model: set them in "
                           "CoreConfig.request_options or return both from the request effect")


@dataclass(slots=True)
class _Controller:
    """An abort controller: one per admission, one per run (R4.4)."""

    signal: int
    kind: Literal["admission", "run"]
    reason: CancelCause | None = None

    @property
    def aborted(self) -> bool:
        return self.reason is not None


class _Wait:
    """Given by a phase of the loop: suspend until a completion of one of *ids* is available.
    (Never changed once made; a plain class because the loop makes one per wait.)"""

    __slots__ = ("ids",)

    def __init__(self, ids: frozenset[int]) -> None:
        self.ids = ids

    def __repr__(self) -> str:
        return f"_Wait(ids={set(self.ids)!r})"


@dataclass(slots=True)
class _DiscardSlot:
    """A discard report whose message lists may still grow (rule P7); materialised when pulled.

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
class _AbortNotice:
    """The ``abort`` output of a cancel, queued; its reason is the cause of whichever cancel of
    its scope aborts first (a joined cancel does, D9), so it is materialised when pulled."""

    signal: int
    reason: CancelCause

    def materialise(self) -> Control:
        return Control("abort", FrozenDict({"signal": self.signal,
                                            "reason": frozen_json(self.reason)}))


@dataclass(slots=True)
class _Retro:
    """One effective cancel's scope (rule P7): its pending reports (none for a keepInbox
    cancel until a joined cancel clears something), its pending ``abort``, and how much
    input the current position of its window has diverted into the reports (D9)."""

    inbox_slot: _DiscardSlot | None
    context_slot: _DiscardSlot | None
    abort: _AbortNotice | None = None
    fresh: int = 0


@dataclass(frozen=True, slots=True)
class _CancelRequested:
    output: Live
    retro: _Retro


@dataclass(slots=True)
class _EffectRecord:
    """An outstanding effect (P4): in ``_effects`` from its request until it completes,
    is released (P5) or is abandoned (P16); a completion of an id no longer there is
    refused (P10) or, when abandoned, dropped."""

    kind: EffectKind
    payload: FrozenDict


class _Aborted(Exception):
    """Raised inside the loop by a signal check on an aborted signal (R0.7)."""


class _Failure(Exception):
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


@dataclass(slots=True)
class _StepOutcome:
    request_failed: bool = False
    had_calls: bool = False
    took_steering: bool = False
    concluded: bool = False
    max_tokens: bool = False


_Mail: TypeAlias = tuple[int, str, Any]


#: What a phase of the loop does next (see `Frame`): hand out an output, wait for a
#: completion, start a sub-activity (its frame), or end its activity (`DONE`).
Action: TypeAlias = "Output | _Wait | Frame | _Done"

#: A phase of an activity: called with the core, the activity's frame and what the phase
#: receives (the completion waited for, a finished sub-activity's result, or None).
Phase: TypeAlias = Callable[[Any, Any, Any], Action]


class _Done:
    """The action of a phase that ends its activity; the frame's ``result`` is its value."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DONE"


DONE: Final = _Done()


@dataclass(slots=True, kw_only=True)
class Frame:
    """One activity of the loop in progress (R4.10), as data: where it is (``phase``, the
    function that runs when the loop next advances it), its locals (the subclass's fields),
    its result once done, and the handler of the failures it catches while one is armed.

    The loop is a stack of frames in `CoreState` (``_frames``): the top frame runs; a frame a
    phase returns is pushed and starts; `DONE` pops the top frame and hands its result to
    the frame below. A failure raised by a phase unwinds the stack to the nearest frame with
    a ``handler``, which is disarmed and called with the failure (R8.6). Nothing else holds
    the loop's position, so a frame stack copies and compares as data (R4.12)."""

    phase: Phase
    result: Any = None
    handler: Phase | None = None


_Queued: TypeAlias = "Output | _DiscardSlot | _CancelRequested | _AbortNotice"


def _message_id(notice: Live) -> object:
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
    COMPLETED, ABORTED, DISPOSED, MAX_TOKENS, SETTLED_COMPLETED, SETTLED_ABORTED, RETRY_TRIGGER)}


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
