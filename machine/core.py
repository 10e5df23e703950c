"""AgentCore: the sans-I/O agent loop that wires the four machines (spec §R, §P).

Theory of operation
-------------------
Inputs are caller *commands* (``send`` and its presets, ``cancel``,
``dispose``, ``append``) and *completions* of effects the core requested.
Outputs are pulled one at a time with `next_output`: durable events (already
committed to the session log), live notifications, effect requests and
control notices. A driver pulls an output, delivers it to its observers (who
may issue commands), and pulls the next; that is how a command takes effect
exactly at the output its issuer observed (rule P2).

Who sees what:

* **Window** (`machine.machines.window`) decides routing of every send: open
  means next-step input is staged in the outbox; closed means steering is
  queued and context is appended at once (R5).
* **Inbox** (`machine.machines.inbox`) holds queued prompts; the wake and
  continue-or-idle claim its head (R6, R7, R12.7).
* **Outbox** (`machine.machines.outbox`) holds staged steering and context;
  drains take from its front at the drain points (R11).
* **Lifecycle** (`machine.machines.lifecycle`) is where the loop is; every
  phase change of the loop fires one of its triggers.

The loop itself is a generator (``_interval``) that yields outputs and waits
for completions. It advances only when every queued output has been pulled,
so the state a command sees is exactly the state at the last pulled output.
Commands never advance the loop: they change routing state synchronously and
queue their own outputs (rule P3). Completions are buffered and consumed when
the loop next waits for them (rule P6), so a command fed after a completion
still acts before the loop resumes, as an event loop would order them.

Cancel clears at once. Observers of ``agent/cancel-requested`` must see their
own queued or staged work cleared by the same cancel (R16.2), so while that
notification is the last one pulled, anything a command queues or stages is
moved into that cancel's pending discard reports, and the command's outputs
are placed before those reports (rule P7).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from machine import decisions
from machine import events as ev
from machine.errors import (
    EXITS,
    CoreFailedError,
    DisposedError,
    InvariantError,
    ProtocolError,
    TurnstileError,
    ValidationError,
)
from machine.events import Event, LiveEvent
from machine.io import (
    FLUSH,
    MODEL,
    PROMPT_SUBMIT,
    REQUEST,
    REQUEST_ERROR,
    STEP_HOOK,
    SYSTEM_PROMPT,
    TICK,
    TOOL_EXECUTE,
    TOOL_FINALIZE,
    TOOL_PREPARE,
    TURN_STOPPING,
    Append,
    Cancel,
    Chunk,
    Control,
    Dispose,
    Durable,
    Effect,
    End,
    Input,
    Live,
    Observer,
    Output,
    Raise,
    Resolve,
    Send,
)
from machine.jsonvalue import (
    Frozen,
    FrozenDict,
    FrozenList,
    JsonLike,
    freeze,
    same_json,
    shown,
    snapshot,
)
from machine.log import SessionLog
from machine.machines import Inbox, Lifecycle, Outbox, Window
from machine.vocabulary import (
    CHUNK_TYPES,
    DISPOSED_CAUSE,
    FOLLOWUP,
    INJECT,
    STEER,
    Allow,
    CancelCause,
    ErrorInfo,
    LlmFailure,
    Message,
    SendOptions,
    ToolResult,
    block_problem,
    decision_from_json,
    failure_text,
    internal_error,
    message_mapping,
    minted_id,
    validate_chunk,
    validate_user_message,
)

ToolMode: TypeAlias = Literal["exclusive", "parallel"]

COMPLETED: Final = FrozenDict({"kind": "completed"})
ABORTED: Final = FrozenDict({"kind": "aborted"})
DISPOSED: Final = FrozenDict({"kind": "disposed"})
MAX_TOKENS: Final = FrozenDict({"kind": "max-tokens"})
RETRY_TRIGGER: Final = FrozenDict({"kind": "retry"})
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


def _unset(value: object) -> bool:
    """R9.6: a provider or model the original counts as missing (absent, null, false, 0, '')."""
    return value is None or value is False or value == "" or (
        type(value) in (int, float) and value == 0)


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """Static configuration of one core (rule P11).

    ``request_options`` seeds this instance's first request (R9.6).
    ``tool_modes`` classifies each tool by name (unknown names are exclusive).
    ``session_start`` is reported by ``agent/session-start`` at publication.
    """

    request_options: Mapping[str, JsonLike] = field(default_factory=dict)
    tool_modes: Mapping[str, ToolMode] = field(default_factory=dict)
    max_parallel_tool_calls: int = 10
    session_start: Literal["startup", "resume"] = "startup"
    publish: bool = True

    def __post_init__(self) -> None:
        options = freeze(self.request_options, "config.request_options")
        if not isinstance(options, FrozenDict):
            raise ValidationError("config.request_options", "must be a mapping")
        object.__setattr__(self, "request_options", options)
        if not isinstance(self.tool_modes, Mapping):
            raise ValidationError("config.tool_modes", "must be a mapping of tool name to mode")
        for name, mode in self.tool_modes.items():
            if not isinstance(name, str) or mode not in ("exclusive", "parallel"):
                raise ValidationError(f"config.tool_modes.{name}",
                                      "must map a tool name to 'exclusive' or 'parallel'")
        object.__setattr__(self, "tool_modes", dict(self.tool_modes))
        limit = self.max_parallel_tool_calls
        if type(limit) is not int or limit < 1:
            raise ValidationError("config.max_parallel_tool_calls", "must be an integer >= 1")
        if self.session_start not in ("startup", "resume"):
            raise ValidationError("config.session_start", "must be 'startup' or 'resume'")
        if not isinstance(self.publish, bool):
            raise ValidationError("config.publish", "must be a bool")


# --------------------------------------------------------------------------
# Internal helpers of the loop
# --------------------------------------------------------------------------


@dataclass(slots=True)
class _Controller:
    """An abort controller: one per admission, one per run (R4.4)."""

    signal: int
    kind: Literal["admission", "run"]
    reason: CancelCause | None = None

    @property
    def aborted(self) -> bool:
        return self.reason is not None


@dataclass(frozen=True, slots=True)
class _Wait:
    """Yielded by the loop: suspend until a completion of one of *ids* is available."""

    ids: frozenset[int]


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
    kind: str
    payload: FrozenDict
    released: bool = False


class _Aborted(Exception):
    """Raised inside the loop by a signal check on an aborted signal (R0.7)."""


class _Failure(Exception):
    """A generic or request failure inside a turn (R15)."""

    def __init__(self, error: ErrorInfo, *, code: str | None = None,
                 request_failure: LlmFailure | None = None) -> None:
        super().__init__(error.rendered())
        self.error = error
        self.code = code if code is not None else error.code
        self.request_failure = request_failure


@dataclass(slots=True)
class _StepOutcome:
    request_failed: bool = False
    had_calls: bool = False
    took_steering: bool = False
    concluded: bool = False
    max_tokens: bool = False


@dataclass(slots=True)
class _Call:
    """One planned tool call of a batch (R10)."""

    index: int
    call_id: str
    name: str
    arguments: Frozen
    call_seq: int = -1
    #: pending: not started; running: executing; settled: has its result; failed: a stage's
    #: value did not validate (R10.9)
    outcome: Literal["pending", "running", "settled", "failed"] = "pending"
    result: ToolResult | None = None
    needs_finalize: bool = False     # R10.4.1: its result still goes through finalize
    dispatched: bool = False         # its execute was requested (R10.11 vs R10.10)
    error: ErrorInfo | None = None


@dataclass(slots=True)
class _Batch:
    """One tool batch in progress (R10): its calls, the dispatched calls not yet taken (by
    execute effect id, in start order), and how far starting and committing have come."""

    calls: list[_Call]
    in_flight: dict[int, _Call] = field(default_factory=dict)
    next_start: int = 0
    commit_from: int = 0
    failed_at: int | None = None
    concluded: bool = False

    def running(self) -> frozenset[int]:
        """The execute effects of dispatched calls still waiting for their settlement."""
        return frozenset(e for e, c in self.in_flight.items() if c.outcome == "running")

    def note(self, call: _Call) -> None:
        """R10.9: a failing call (the first in model order) stops the batch."""
        if call.outcome == "failed" and (self.failed_at is None or call.index < self.failed_at):
            self.failed_at = call.index


_Mail: TypeAlias = tuple[int, str, Any]
_Proc: TypeAlias = Generator["Output | _Wait", "_Mail | None", Any]
_Queued: TypeAlias = "Output | _DiscardSlot | _CancelRequested | _AbortNotice"


def _message_id(notice: Live) -> object:
    message = notice.event.payload.get("message")
    return message.get("id") if isinstance(message, FrozenDict) else None


def frozen_message(message: Message) -> FrozenDict:
    """The frozen JSON form of a message (no copying: its parts are already frozen)."""
    return message_mapping(message)


def frozen_json(value: CancelCause | ErrorInfo | LlmFailure | ToolResult) -> FrozenDict:
    # Why the envelope bound: the parts were checked on entry; the wrapping adds a level (V1).
    frozen = freeze(value.to_json(), "value", max_depth=None)
    assert isinstance(frozen, FrozenDict)
    return frozen


def plan_arguments(raw: str) -> Frozen:
    """R10.1: '' -> {}, valid JSON text -> its value, anything else -> the raw string."""
    if raw == "":
        return FrozenDict()

    def refuse(_constant: str) -> None:
        raise ValueError("not JSON")

    try:
        return freeze(json.loads(raw, parse_constant=refuse), "arguments")
    except (ValueError, ValidationError, RecursionError):  # too deep for the parser: unparsable
        return raw


def _canonical_result(error: FrozenDict, text: str,
                      contexts: tuple[Message, ...] = ()) -> ToolResult:
    """R10.10 / R10.11: a canonical aborted result, carrying *contexts* when it replaces a
    result that had some."""
    return ToolResult(content=FrozenList((FrozenDict({"type": "text", "text": text}),)),
                      is_error=True, error=error, additional_contexts=contexts)


ABD_RESULT: Final = _canonical_result(ABD_ERROR, ABD_TEXT)


def raised_result(error: ErrorInfo) -> ToolResult:
    """R10.12: the error result a raising tool stage stands for: the text ``Error: `` and the
    error's message, and ``error {name, code}`` only for a coded error."""
    info = FrozenDict({"name": error.name, "code": error.code}) if error.code is not None else None
    return ToolResult(content=FrozenList((FrozenDict({"type": "text",
                                                      "text": f"Error: {error.message}"}),)),
                      is_error=True, error=info)


def normalized(result: ToolResult) -> ToolResult:
    """V16: an error result carries no concludesTurn and a successful one no error, as
    finalize sees it and as it is committed."""
    if result.is_error and result.concludes_turn:
        return ToolResult(content=result.content, is_error=True, error=result.error,
                          additional_contexts=result.additional_contexts, meta=result.meta)
    if not result.is_error and result.error is not None:
        return ToolResult(content=result.content, additional_contexts=result.additional_contexts,
                          concludes_turn=result.concludes_turn, meta=result.meta)
    return result


class AgentCore:
    """The deterministic sans-I/O agent core. See the module docstring."""

    def __init__(self, config: CoreConfig | None = None, *, log: SessionLog | None = None,
                 clock: Callable[[], float] | None = None,
                 mint_id: Callable[[str, int], str] | None = None) -> None:
        self.config = config if config is not None else CoreConfig()
        self.log = log if log is not None else SessionLog(clock=clock)
        self._mint = mint_id if mint_id is not None else (lambda kind, seq: f"{kind}-{seq}")
        self.inbox = Inbox()
        self.outbox = Outbox()
        self.window = Window()
        self.lifecycle = Lifecycle()
        self._out: deque[_Queued] = deque()
        self._retro: _Retro | None = None
        self._proc: _Proc | None = None
        self._wait: frozenset[int] | None = None
        self._effects: dict[int, _EffectRecord] = {}
        self._done_effects: set[int] = set()
        self._mail: deque[_Mail] = deque()
        self._next_effect = 0
        self._next_signal = 0
        self._wake_effect: int | None = None
        self._owner: _Controller | None = None
        self._ctrl: _Controller | None = None
        self._pending_retry = False
        self._prior_failures: list[FrozenDict] = []
        self._turn = 0
        self._step = 0
        self._reason: FrozenDict = COMPLETED
        self._settle: FrozenDict = COMPLETED
        self._header_logged = False
        self._disposing = False
        self._disposed = False
        self._failure: ErrorInfo | None = None    # P16: why the core stopped, once it has
        self._abandoned: set[int] = set()         # P16: effects requested before it stopped
        if self.config.publish:
            self._emit_live(ev.SESSION_CREATED)
            self._emit_live(ev.AGENT_CREATED, status="idle")
            self._emit_live(ev.SESSION_START, source=self.config.session_start)

    # ------------------------------------------------------------------
    # Read-only state (rule P10)
    # ------------------------------------------------------------------

    @property
    def status(self) -> Literal["idle", "running"]:
        return "running" if self.lifecycle.busy else "idle"

    @property
    def accepts_next_step(self) -> bool:
        return self.window.is_open

    @property
    def pending_queued(self) -> int:
        return len(self.inbox)

    @property
    def pending_steering(self) -> int:
        return self.outbox.steering_count

    @property
    def pending_context(self) -> int:
        return len(self.outbox) - self.outbox.steering_count

    @property
    def wake_pending(self) -> bool:
        return self.lifecycle.state == "wake_pending"

    @property
    def retry_pending(self) -> bool:
        return self._pending_retry

    @property
    def is_quiescent(self) -> bool:
        """R18: not busy, no wake pending, no waking item queued (what ``whenIdle`` waits for)."""
        return self.lifecycle.state == "idle" and not self.inbox.has_waking

    @property
    def disposing(self) -> bool:
        return self._disposing and not self._disposed

    @property
    def disposed(self) -> bool:
        return self._disposed

    @property
    def failure(self) -> ErrorInfo | None:
        """P16: the internal failure that stopped the core, or None while it works."""
        return self._failure

    def queued_ids(self) -> tuple[str, ...]:
        """Ids of the queued inbox items, FIFO order."""
        return tuple(message_id for message_id, _ in self.inbox.snapshot())

    def staged(self) -> tuple[tuple[str, bool], ...]:
        """(message id, is_steering) of the staged outbox items, FIFO order."""
        return self.outbox.snapshot()

    @property
    def outstanding_effects(self) -> tuple[int, ...]:
        """Ids of the effects requested and not yet completed, in request order."""
        return tuple(self._effects)

    def outstanding(self) -> tuple[Effect, ...]:
        """The outstanding effect requests (without the model history view)."""
        return tuple(Effect(effect_id, record.kind, record.payload)
                     for effect_id, record in self._effects.items())

    def signal_reason(self, signal: int) -> CancelCause | None:
        """The abort reason of the current controller if it has this signal id."""
        ctrl = self._ctrl
        return ctrl.reason if ctrl is not None and ctrl.signal == signal else None

    # ------------------------------------------------------------------
    # Commands (rules R5, R16, R17, P3)
    # ------------------------------------------------------------------

    def send(self, message: JsonLike, options: JsonLike) -> None:
        """R5: validate (options first, then the message), snapshot, route. (Each argument is
        taken first, V6, so validating it runs none of the caller's code.)"""
        self._check_live()
        opts = SendOptions.from_json(snapshot(options))
        self._route(validate_user_message(snapshot(message)), opts)

    def followup(self, message: JsonLike) -> None:
        self._check_live()
        self._route(validate_user_message(snapshot(message)), FOLLOWUP)

    def steer(self, message: JsonLike) -> None:
        self._check_live()
        self._route(validate_user_message(snapshot(message)), STEER)

    def inject(self, message: JsonLike) -> None:
        self._check_live()
        self._route(validate_user_message(snapshot(message)), INJECT)

    def cancel(self, cause: JsonLike, keep_inbox: bool = False) -> None:
        """R16: cancel the current activity and (unless *keep_inbox*) what is pending."""
        self._check_live()
        parsed = CancelCause.from_json(snapshot(cause))
        if not isinstance(keep_inbox, bool):
            raise ValidationError("keepInbox", "must be a bool")
        self._cancel(parsed, keep_inbox)

    def dispose(self) -> None:
        """R17: cancel(disposed) now; teardown outputs follow once the core is quiescent."""
        if self._disposed:
            return
        self._disposing = True
        self._cancel(DISPOSED_CAUSE, False)

    def append(self, type: str, data: JsonLike, *, surface_op: JsonLike = None,
               source_event_seqs: Sequence[int] | None = None) -> Event:
        """A direct append by extension code (R20.2): checked, committed, delivered in order."""
        self._check_live()
        if not isinstance(type, str):           # the log refuses it, typed (L3)
            return self._emit_appended(self._command_commit(type, data, surface_op=surface_op,
                                                            source_event_seqs=source_event_seqs))
        type = str.__str__(type)                # a str subclass runs no code of its own here
        if type in LOOP_TYPES and self.lifecycle.busy:          # R20.4
            self.log.check(type, data, surface_op=surface_op,    # the log's own verdict first
                           source_event_seqs=source_event_seqs)
            raise InvariantError("R20.4", f"{type} is written by the loop itself: a direct "
                                 "append of it is refused while the agent is busy")
        return self._emit_appended(self._command_commit(type, data, surface_op=surface_op,
                                                        source_event_seqs=source_event_seqs))

    def _emit_appended(self, event: Event) -> Event:
        self._emit(Durable(event))
        return event

    def _command_commit(self, type_: str, data: JsonLike | Message, *,
                        surface_op: JsonLike = None,
                        source_event_seqs: Sequence[int] | None = None) -> Event:
        """A command's append (P3, P16): the log's refusals as they are; any other failure of
        the append (nothing was appended, L2) raised as an `InvariantError`."""
        try:
            return self.log.commit(type_, data, surface_op=surface_op,
                                   source_event_seqs=source_event_seqs)
        except (TurnstileError, *EXITS):
            raise
        except BaseException as error:
            raise InvariantError("L2", f"{type_}: nothing was appended: "
                                 f"{failure_text(error)}") from error

    def _check_live(self) -> None:
        if self._disposed:
            raise DisposedError("the agent is disposed; only dispose() may be called")
        if self._failure is not None:                           # P16
            raise CoreFailedError(f"the core stopped after an internal failure "
                                  f"({self._failure.message}); only dispose() may be called")

    def _route(self, message: Message, options: SendOptions) -> None:
        retro = self._retro
        cleared = retro is not None and retro.inbox_slot is not None
        where = decisions.route(options.target, options.wakeup, self.window.is_open)  # R5.2-R5.3
        if where == "stage-context":                    # R5.2: staged, nothing emitted
            if cleared:                                 # P7: cleared by the same cancel
                assert retro is not None and retro.context_slot is not None
                retro.context_slot.queued.append(message)
                retro.fresh += 1
            else:
                self.outbox.stage(message, False)
            return
        if where == "append-now":                       # R5.2 / D4: appended at once
            self._emit(Durable(self._command_commit(ev.USER_MESSAGE, message, surface_op=APPEND)))
            return
        if where == "stage-steering":
            if not cleared:
                self.outbox.stage(message, True)
        else:
            if not cleared:
                self.inbox.enqueue(message, options.wakeup)
            if decisions.requests_wake(where, options.wakeup, self.lifecycle.busy,
                                       self.wake_pending):
                self._request_wake()                    # R5.4: before the enqueue notice
        self._emit_live(ev.INBOX_ENQUEUE, message=frozen_message(message),
                        placement="steering" if where == "stage-steering" else "queued")
        if cleared:                                     # P7: reported by the same cancel
            assert retro is not None and retro.inbox_slot is not None
            group = retro.inbox_slot.steering if where == "stage-steering" else retro.inbox_slot.queued
            group.append(message)
            retro.fresh += 1

    def _request_wake(self) -> None:
        """R6.1: ignored while busy or while a wake is pending."""
        if self.lifecycle.state != "idle":
            return
        self.lifecycle.fire("request_wake")
        effect = self._new_effect(TICK, FrozenDict({"purpose": "wake"}))
        self._wake_effect = effect.id
        self._emit(effect)

    def _cancel(self, cause: CancelCause, keep: bool) -> None:
        retro = self._retro
        if retro is not None:
            self._join(retro, cause, keep)
            return
        effective = decisions.cancel_effective(self._owner is not None, self._pending_retry, keep,
                                               len(self.inbox), len(self.outbox))     # R16.1
        if not effective:                               # R16.1: a no-op arms nothing
            return
        inbox_slot = _DiscardSlot(ev.INBOX_DISCARD) if not keep else None
        context_slot = _DiscardSlot(ev.CONTEXT_DISCARD) if not keep else None
        scope = _Retro(inbox_slot, context_slot)
        self._emit_cancel_requested(cause, scope)       # R16.2 step 1
        if inbox_slot is not None and context_slot is not None:   # R16.2 step 2
            self._clear_into(inbox_slot, context_slot)
            self._emit(inbox_slot)
            self._emit(context_slot)
        self._pending_retry = False                     # R16.2 step 3 (D2)
        owner = self._owner                             # R16.2 step 4
        if owner is not None and owner.reason is None:  # R16.3: the first cause wins
            owner.reason = cause
            scope.abort = _AbortNotice(owner.signal, cause)
            self._emit(scope.abort)

    def _join(self, scope: _Retro, cause: CancelCause, keep: bool) -> None:
        """P7, D9: a cancel issued while the ``agent/cancel-requested`` of *scope* is being
        delivered runs, as in the original, inside that cancel's observer phase: ahead of its
        clear and its abort. It does something only if it has something new to clear: when
        *scope* cleared the inbox, the input accepted at this position (already moved into its
        reports); when *scope* kept it, whatever is queued or staged. Then it queues its own
        notice, and it is the cancel that aborts the controller (its cause becomes the reason
        of the scope's pending ``abort``). A joined cancel with nothing new to clear is a
        no-op, so an observer that cancels on every notice ends."""
        if keep:
            return
        if scope.inbox_slot is not None:
            if scope.fresh == 0:
                return
            scope.fresh = 0
            self._emit_cancel_requested(cause, scope)
        else:
            if not (len(self.inbox) or len(self.outbox)):
                return
            self._emit_cancel_requested(cause, scope)
            inbox_slot, context_slot = _DiscardSlot(ev.INBOX_DISCARD), _DiscardSlot(ev.CONTEXT_DISCARD)
            self._clear_into(inbox_slot, context_slot)
            # Ahead of the scope's abort, as in the original, but never ahead of the notice
            # announcing an item they list (one accepted after the keepInbox cancel).
            listed = {m.id for m in (*inbox_slot.messages, *context_slot.queued)}
            at = len(self._out)
            for index, queued in enumerate(self._out):
                if queued is scope.abort:
                    at = index
                    break
            for index, queued in enumerate(self._out):
                if (isinstance(queued, Live) and queued.event.type == ev.INBOX_ENQUEUE
                        and _message_id(queued) in listed):
                    at = max(at, index + 1)
            self._out.insert(at, context_slot)
            self._out.insert(at, inbox_slot)
            scope.inbox_slot, scope.context_slot = inbox_slot, context_slot
        self._pending_retry = False
        owner = self._owner
        if scope.abort is not None and owner is not None:
            owner.reason = cause
            scope.abort.reason = cause

    def _emit_cancel_requested(self, cause: CancelCause, scope: _Retro) -> None:
        if cause.kind != "disposed":
            notice = Live(LiveEvent(ev.CANCEL_REQUESTED, FrozenDict({"cause": frozen_json(cause)})))
            self._emit(_CancelRequested(notice, scope))

    def _clear_into(self, inbox_slot: _DiscardSlot | None,
                    context_slot: _DiscardSlot | None) -> None:
        if inbox_slot is None or context_slot is None:
            return
        queued = self.inbox.discard() if len(self.inbox) else []
        steering, contexts = self.outbox.clear() if len(self.outbox) else ([], [])
        inbox_slot.queued.extend(queued)
        inbox_slot.steering.extend(steering)
        context_slot.queued.extend(contexts)

    # ------------------------------------------------------------------
    # Completions (rules P4, P6, C10)
    # ------------------------------------------------------------------

    def resolve(self, effect: int, value: JsonLike = None) -> None:
        self._complete(effect, "resolve", value)

    def fail(self, effect: int, error: ErrorInfo) -> None:
        if not isinstance(error, ErrorInfo):
            raise ProtocolError(f"effect {effect}: a raise needs an ErrorInfo, not {type(error).__name__}")
        self._complete(effect, "raise", error)

    def chunk(self, effect: int, chunk: JsonLike) -> None:
        self._complete(effect, "chunk", chunk)

    def end(self, effect: int) -> None:
        self._complete(effect, "end", None)

    def _complete(self, effect: int, kind: str, value: JsonLike) -> None:
        if type(effect) is not int:
            raise ProtocolError(f"effect id must be an integer, not {shown(effect)}")
        record = self._effects.get(effect)
        if record is None:
            if effect in self._abandoned:                       # P16: accepted, dropped
                if kind != "chunk":
                    self._abandoned.discard(effect)
                    self._done_effects.add(effect)
                return
            if effect in self._done_effects:
                raise ProtocolError(f"effect {effect} was already completed")
            raise ProtocolError(f"effect {effect} was never requested")
        if record.released:
            raise ProtocolError(f"effect {effect} ({record.kind}) was released: the core "
                                "stopped consuming it")
        if kind in ("chunk", "end") and record.kind != MODEL:
            raise ProtocolError(f"effect {effect} is a {record.kind!r} effect; only a model "
                                f"effect takes {kind!r}")
        if kind == "resolve" and record.kind == MODEL:
            raise ProtocolError(f"effect {effect} is a model stream: complete it with chunk, "
                                "end or raise")
        if kind != "raise" and value is not None:
            value = snapshot(value)     # V6, P6: the value as it is at the call
        if kind != "chunk":
            del self._effects[effect]
            self._done_effects.add(effect)
        self._mail.append((effect, kind, value))

    def feed(self, item: Input) -> None:
        """Apply one input value (rule P9)."""
        if isinstance(item, Send):
            self.send(item.message, item.options)
        elif isinstance(item, Cancel):
            self.cancel(item.cause, item.keep_inbox)
        elif isinstance(item, Dispose):
            self.dispose()
        elif isinstance(item, Observer):
            pass                        # P14: an observer's failure or veto never reaches the core
        elif isinstance(item, Append):
            self.append(item.type, item.data, surface_op=item.surface_op,
                        source_event_seqs=item.source_event_seqs)
        elif isinstance(item, Resolve):
            self.resolve(item.effect, item.value)
        elif isinstance(item, Raise):
            self.fail(item.effect, item.error)
        elif isinstance(item, Chunk):
            self.chunk(item.effect, item.chunk)
        elif isinstance(item, End):
            self.end(item.effect)
        else:  # pragma: no cover - the Input union is closed
            raise ProtocolError(f"unknown input {item!r}")

    # ------------------------------------------------------------------
    # Pulling outputs (rules P1, P2, P8)
    # ------------------------------------------------------------------

    def next_output(self) -> Output | None:
        """The next output, or None when the core waits for an input."""
        out = self._out
        while True:
            if out:
                self._retro = None      # the previous output's delivery has ended (P7)
                item = out.popleft()
                if isinstance(item, _DiscardSlot):
                    live = item.materialise()
                    if live is None:
                        continue
                    return live
                if isinstance(item, _CancelRequested):
                    self._retro = item.retro            # P7: its delivery opens the window
                    item.retro.fresh = 0
                    return item.output
                if isinstance(item, _AbortNotice):
                    return item.materialise()
                return item
            # Advance the loop by one step. Why inline (this runs once per output): one call
            # fewer, and an output yielded with nothing queued before it is handed out at
            # once rather than queued and taken back (the same output, in the same order).
            proc = self._proc
            if proc is None:
                try:
                    if not self._advance_idle():
                        return None
                except BaseException as error:  # P16: never escapes, never half-advanced
                    self._stop(error)
                    if isinstance(error, EXITS):
                        raise           # P16: the core has stopped; the exit goes on
                continue
            sent: _Mail | None = None
            if self._wait is not None:
                sent = self._take_mail(self._wait)
                if sent is None:
                    return None         # P7: nothing pulled, the position stays
                self._wait = None
            self._retro = None          # the loop moves on: the position is over (P7)
            try:
                yielded = proc.send(sent)
            except StopIteration:
                self._proc = None
                continue
            except BaseException as error:      # P16: the loop cannot go on
                self._stop(error)
                if isinstance(error, EXITS):
                    raise               # P16: the core has stopped; the exit goes on
                continue
            if isinstance(yielded, _Wait):
                self._wait = yielded.ids
            elif out:
                out.append(yielded)
            else:
                return yielded

    def drain_outputs(self) -> list[Output]:
        """Pull every output available now (no observers act in between)."""
        outputs: list[Output] = []
        while (output := self.next_output()) is not None:
            outputs.append(output)
        return outputs

    def _stop(self, error: BaseException) -> None:
        """P16: the loop failed where it could not fail a turn in order (a closing append
        refused twice, or a failure outside any turn): the core stops. Its machines are reset
        (so the status is idle), what it waited for is abandoned (later completions are
        accepted and dropped), pending input stays pending until dispose() reports it, and
        ``agent/error`` names the failure."""
        info = internal_error(error)
        self._failure = info
        self._proc = None
        self._wait = None
        self._mail.clear()
        self._abandoned.update(self._effects)
        self._effects.clear()
        self._wake_effect = None
        self._owner = None
        self._ctrl = None
        self._pending_retry = False
        self._retro = None              # P7: no cancel is being delivered any more
        if self._disposing:             # R17.4: no item is claimed any more; report them
            self._cancel(DISPOSED_CAUSE, False)
        was_busy = self.lifecycle.busy
        self.lifecycle = Lifecycle()
        self.window = Window()
        self._emit(Live(LiveEvent(ev.ERROR, FrozenDict({"turn": self._turn, "step": self._step,
                                                        "error": frozen_json(info)}))))
        if was_busy:
            self._emit_live(ev.STATUS, status="idle")

    def _emit(self, item: _Queued) -> None:
        retro = self._retro
        if retro is not None:
            # P7: before what the cancel being delivered still has pending (reports, abort)
            for index, queued in enumerate(self._out):
                if queued is retro.inbox_slot or queued is retro.abort:
                    self._out.insert(index, item)
                    return
        self._out.append(item)


    def _emit_live(self, type_: str, **payload: Frozen) -> None:
        self._emit(Live(LiveEvent(type_, FrozenDict(payload))))

    def _advance_idle(self) -> bool:
        wake = self._wake_effect
        if wake is not None:
            mail = self._take_mail(frozenset((wake,)))
            if mail is None:
                return False
            self._wake_effect = None
            self._retro = None          # the loop moves on (P7)
            self._wake()
            return True
        if self._disposing and not self._disposed and self.is_quiescent:
            self._retro = None
            self._teardown()
            return True
        return False

    def _take_mail(self, ids: frozenset[int]) -> _Mail | None:
        if self._mail and self._mail[0][0] in ids:  # Why: usually the oldest mail is the one
            return self._mail.popleft()
        for index, mail in enumerate(self._mail):
            if mail[0] in ids:
                del self._mail[index]
                return mail
        return None

    def _wake(self) -> None:
        """R6.2 (and R17.4: while disposing, a wake never claims)."""
        if self._disposing and self.inbox.has_waking:
            self._cancel(DISPOSED_CAUSE, False)
        if self.inbox.has_waking:
            self._proc = self._interval()
        else:
            self.lifecycle.fire("wake_empty")

    def _teardown(self) -> None:
        """R17.1 step 3: report anything still pending, then the two disposed notices."""
        if len(self.inbox) or len(self.outbox):
            inbox_slot, context_slot = _DiscardSlot(ev.INBOX_DISCARD), _DiscardSlot(ev.CONTEXT_DISCARD)
            self._clear_into(inbox_slot, context_slot)
            self._emit(inbox_slot)
            self._emit(context_slot)
        self._disposed = True
        self._emit_live(ev.AGENT_DISPOSED)
        self._emit_live(ev.SESSION_DISPOSED)

    def _new_effect(self, kind: str, payload: FrozenDict,
                    history: Sequence[Message] | None = None) -> Effect:
        effect_id = self._next_effect
        self._next_effect += 1
        self._effects[effect_id] = _EffectRecord(kind, payload)
        return Effect(effect_id, kind, payload, history)

    def _release(self, effect_id: int) -> Control | None:
        """P5: stop consuming a model stream; drop what is buffered for it. Returns the
        ``release`` notice, or None when the stream had already ended (nothing to stop)."""
        self._mail = deque(m for m in self._mail if m[0] != effect_id)
        record = self._effects.pop(effect_id, None)
        if record is None:
            return None
        record.released = True
        self._done_effects.add(effect_id)
        return Control("release", FrozenDict({"effect": effect_id}))

    def _commit(self, type_: str, data: Mapping[str, Frozen] | Message, *,
                surface: bool = False, sources: Sequence[int] | None = None) -> Durable:
        if isinstance(data, dict):
            # Why adopt, not FrozenDict(data): the loop builds *data* here from frozen values
            # (its type says so, and mypy --strict checks every call), so the copy and the
            # per-value check of the constructor would find nothing; the log's checks (L2)
            # still judge the event.
            data = FrozenDict._adopt(data)
        return Durable(self.log.commit(type_, data, surface_op=APPEND if surface else None,
                                       source_event_seqs=sources))

    def _await(self, effect_id: int) -> Generator[Output | _Wait, _Mail | None, _Mail]:
        mail = yield _Wait(frozenset((effect_id,)))
        assert mail is not None
        return mail

    def _check_signal(self) -> None:
        ctrl = self._ctrl
        if ctrl is not None and ctrl.aborted:
            raise _Aborted()

    def _new_controller(self, kind: Literal["admission", "run"]) -> _Controller:
        self._next_signal += 1
        ctrl = _Controller(self._next_signal, kind)
        self._ctrl = ctrl
        self._owner = ctrl
        return ctrl

    def _warn(self, text: str) -> Live:
        return Live(LiveEvent(ev.WARNING, FrozenDict({"text": text})))

    # ------------------------------------------------------------------
    # The running interval (R7, R12.7)
    # ------------------------------------------------------------------

    def _interval(self) -> _Proc:
        while True:
            yield from self._claim()
            # R12.7 continue-or-idle (R17.4: while disposing, nothing new is claimed)
            if self._disposing and self.inbox.has_waking:
                self._cancel(DISPOSED_CAUSE, False)   # its outputs precede the next yield
            if self.inbox.has_waking:
                continue
            self.lifecycle.fire("go_idle")
            yield Live(LiveEvent(ev.STATUS, FrozenDict({"status": "idle"})))
            return

    def _claim(self) -> _Proc:
        """R7: claim the head of the inbox and admit it."""
        message, _wakeup = self.inbox.claim()                    # R7.2
        inherited = len(self.outbox)
        was_busy = self.lifecycle.busy
        self.lifecycle.fire("claim")
        ctrl = self._new_controller("admission")                  # R7.3
        self.window.fire("claim")
        if not was_busy:                                          # R7.4
            yield Live(LiveEvent(ev.STATUS, FrozenDict({"status": "running"})))
        message_json = frozen_message(message)
        dequeue = Live(LiveEvent(ev.INBOX_DEQUEUE, FrozenDict({"message": message_json,
                                                               "placement": "queued"})))
        admitted: list[Message] | None = None
        if ctrl.aborted:                                          # R7.5
            # As in the original, the rejected path runs up to its tick before the dequeue
            # notice: the claim emits it once the admission has yielded (P15).
            self._owner = None                                    # R7.8
            yield from self._reject()
            yield dequeue
            yield from self._rejected_tick()
            return
        else:
            request = self._new_effect(PROMPT_SUBMIT, FrozenDict({
                "message": message_json, "signal": ctrl.signal}))
            yield request
            yield dequeue                                         # R7.6
            _, kind, value = yield from self._await(request.id)
            if ctrl.aborted:                                      # R7.7: ignored, no warning
                admitted = None
            elif kind == "raise":
                assert isinstance(value, ErrorInfo)
                yield self._warn(f"prompt admission failed: {value.rendered()}")
            else:
                try:
                    decision = decision_from_json(value)
                except ValidationError as problem:               # R7.11
                    yield self._warn(f"prompt admission returned an invalid decision: {problem}")
                else:
                    if isinstance(decision, Allow):
                        prompt = message if decision.content is None else Message(
                            id=message.id, role=message.role, content=decision.content,
                            source=message.source)
                        admitted = [prompt, *decision.additional_contexts]
        self._owner = None                                        # R7.8
        if admitted is not None:                                  # R7.9
            self.lifecycle.fire("admit")
            self._prior_failures = []
            yield from self._run(FrozenDict({"kind": "message", "source": message.source}),
                                 admitted, inherited)
        else:
            yield from self._rejected()

    def _rejected(self) -> _Proc:
        """R7.10: the rejected-admission tail."""
        yield from self._reject()
        yield from self._rejected_tick()

    def _reject(self) -> _Proc:
        """R7.10 steps 1-2: the window closes; staged context is appended unless steering is."""
        self.window.fire("reject")
        self.lifecycle.fire("reject")
        self._ctrl = None
        if decisions.rejected_flush_appends(self.outbox.has_steering, len(self.outbox)):
            while len(self.outbox) and not self.outbox.has_steering:
                context, _ = self.outbox.front
                try:
                    durable = self._commit(ev.USER_MESSAGE, context, surface=True)
                except Exception as error:              # P16: the context stays staged
                    yield self._warn(f"staged context could not be written: "
                                     f"{failure_text(error)}")
                    break
                self.outbox.take()
                yield durable

    def _rejected_tick(self) -> _Proc:
        """R7.10 step 3: the rejected-admission tick."""
        tick = self._new_effect(TICK, FrozenDict({"purpose": "rejected-admission"}))
        yield tick
        yield from self._await(tick.id)

    # ------------------------------------------------------------------
    # Run (R8), flush and settlement (R12), retry (R13)
    # ------------------------------------------------------------------

    def _run(self, trigger: FrozenDict, admitted: list[Message], inherited: int) -> _Proc:
        while True:
            self._new_controller("run")                           # R8.1
            self.window.fire("start_run")
            self._turn = self.log.last_turn + 1
            self._reason = COMPLETED
            self._settle = COMPLETED
            self._step = 0
            turn = self._turn
            try:
                started = self._commit(ev.TURN_START, {"turn": turn, "trigger": trigger})  # R8.2
            except Exception as error:                            # P16: no turn at all
                yield from self._not_started(error)
                return
            yield started
            try:
                yield from self._drain(                           # R8.3.1
                    limit=decisions.inherited_take(inherited, len(self.outbox)))
                for message in admitted:                          # R8.3.2
                    yield self._commit(ev.USER_MESSAGE, message, surface=True)
                self._check_signal()                              # R8.3.3
                yield from self._drain()                          # R8.3.4
                yield from self._steps()                          # R8.4-R8.5
            except (_Aborted, _Failure) as failure:               # R8.6
                yield from self._fail_turn(turn, failure)
            except Exception as error:                            # P16: fails the turn
                yield from self._fail_turn(turn, _Failure(internal_error(error)))
            self.window.fire("end_run")                           # R8.7
            self.lifecycle.fire("close")
            yield from self._closing(ev.TURN_END, turn)
            self._owner = None
            self._ctrl = None
            self.lifecycle.fire("flush")                          # R12.4
            flush = self._new_effect(FLUSH, FrozenDict({"turn": turn}))
            yield flush
            _, kind, value = yield from self._await(flush.id)
            if kind == "raise":
                assert isinstance(value, ErrorInfo)
                yield self._warn(f"session flush failed at turn {turn}: {value.rendered()}")
                yield Live(LiveEvent(ev.ERROR, FrozenDict({"turn": turn, "step": self._step,
                                                           "error": frozen_json(value)})))
            if self._pending_retry:                               # R12.5 / R13.3
                self._pending_retry = False
                self.lifecycle.fire("retry")
                trigger, admitted, inherited = RETRY_TRIGGER, [], 0
                continue
            yield Live(LiveEvent(ev.SETTLED, FrozenDict({"turn": turn, "reason": self._settle})))
            return

    def _fail_turn(self, turn: int, failure: _Aborted | _Failure) -> _Proc:
        """R8.6: close an open step, then classify the failure (R15)."""
        if self.log.open_step is not None:
            yield from self._closing(ev.STEP_END, turn)
        yield from self._classify(failure)

    def _closing(self, type_: str, turn: int) -> _Proc:
        """P16: an append that closes the turn (its step/end or turn/end). If the log refuses
        it, that refusal becomes the turn's failure (R15: agent/error, an error reason) and
        the append is tried once more, with the new reason; a second refusal stops the core."""
        try:
            durable = self._commit(type_, self._closing_data(type_, turn))
        except Exception as error:
            yield from self._classify(_Failure(internal_error(error)))
            durable = self._commit(type_, self._closing_data(type_, turn))
        yield durable

    def _closing_data(self, type_: str, turn: int) -> dict[str, Frozen]:
        if type_ == ev.TURN_END:
            return {"turn": turn, "reason": self._reason}
        return {"turn": turn, "step": self._step}

    def _not_started(self, error: Exception) -> _Proc:
        """P16 case 3: the log refused the run's turn/start (a direct append left a turn open,
        say): there is no turn; `agent/error` reports the refusal at step 0, the prompt and
        contexts stay unwritten, and continue-or-idle follows (as after a rejected admission).
        """
        self.window.fire("end_run")
        self.lifecycle.fire("close")
        self.lifecycle.fire("flush")
        self._owner = None
        self._ctrl = None
        self._pending_retry = False
        yield Live(LiveEvent(ev.ERROR, FrozenDict({"turn": self._turn, "step": 0,
                                                   "error": frozen_json(internal_error(error))})))

    def _classify(self, failure: _Aborted | _Failure) -> Generator[Output | _Wait, _Mail | None, None]:
        """R15: set the durable reason and settle reason; report errors."""
        ctrl = self._ctrl
        outcome = decisions.classify(
            ctrl.reason.kind if ctrl is not None and ctrl.reason is not None else None,
            isinstance(failure, _Failure) and failure.request_failure is not None)
        if not decisions.reports_error(outcome):                  # R15.1
            self._reason = DISPOSED if outcome == "disposed" else ABORTED
            self._settle = ABORTED
            return
        assert isinstance(failure, _Failure)
        error = failure.error
        yield Live(LiveEvent(ev.ERROR, FrozenDict({"turn": self._turn, "step": self._step,
                                                   "error": frozen_json(error)})))
        if failure.request_failure is not None:                   # R15.2
            facts = frozen_json(failure.request_failure.with_message(error.rendered()))
            self._reason = FrozenDict({"kind": "error", "step": self._step, "failure": facts})
            self._settle = FrozenDict({"kind": "error", "error": frozen_json(error),
                                       "failure": facts})
        else:                                                     # R15.3
            reason: dict[str, Frozen] = {"kind": "error", "step": self._step,
                                         "message": error.rendered()}
            if failure.code is not None:
                reason["code"] = failure.code
            self._reason = FrozenDict(reason)
            self._settle = FrozenDict({"kind": "error", "error": frozen_json(error)})

    def _steps(self) -> _Proc:
        """R8.4-R8.5: the step loop of one turn."""
        self.lifecycle.fire("begin_step")
        while True:
            self._step += 1
            outcome: _StepOutcome = yield from self._one_step()
            if outcome.request_failed:                            # R8.4 / R13
                return
            self._prior_failures = []                             # R13.4
            if outcome.max_tokens:                                # R14.3
                self._reason = MAX_TOKENS
            following = decisions.after_step(outcome.had_calls, outcome.concluded,
                                             outcome.took_steering, self.outbox.has_steering)
            if following == "close":                              # R8.4: no check here
                return
            if following == "next-step":
                self.lifecycle.fire("begin_step")
                continue
            self.lifecycle.fire("stop_turn")                      # R8.5
            stopping = self._new_effect(TURN_STOPPING, FrozenDict({
                "turn": self._turn, "signal": self._signal()}))
            yield stopping
            _, kind, value = yield from self._await(stopping.id)
            if kind == "raise":
                assert isinstance(value, ErrorInfo)
                raise _Failure(value)
            self._check_signal()
            took_steering = yield from self._drain()
            if not took_steering:                                 # R8.5: the turn ends
                return
            self.lifecycle.fire("begin_step")

    def _signal(self) -> int:
        assert self._ctrl is not None
        return self._ctrl.signal

    def _hook(self, kind: str, payload: FrozenDict) -> Generator[Output | _Wait, _Mail | None, Any]:
        """Request an effect, wait, and raise its failure as a generic failure."""
        effect = self._new_effect(kind, payload)
        yield effect
        _, mail_kind, value = yield from self._await(effect.id)
        if mail_kind == "raise":
            assert isinstance(value, ErrorInfo)
            raise _Failure(value)
        return value

    def _one_step(self) -> Generator[Output | _Wait, _Mail | None, _StepOutcome]:
        """R9: one step."""
        turn, step, signal = self._turn, self._step, self._signal()
        yield from self._hook(STEP_HOOK, FrozenDict({"turn": turn, "step": step,
                                                     "signal": signal}))   # R9.1
        self._check_signal()
        yield from self._drain()                                  # R9.2
        self.lifecycle.fire("assemble")
        system = yield from self._hook(SYSTEM_PROMPT, FrozenDict({
            "turn": turn, "step": step, "signal": signal}))        # R9.3
        try:
            frozen_system = freeze(system, "system")
        except ValidationError as bad_system:
            raise _Failure(ErrorInfo(str(bad_system), "InvalidSystemPromptError", "INVALID_SYSTEM_PROMPT"),
                           code="INVALID_SYSTEM_PROMPT") from None
        self._check_signal()
        self.lifecycle.fire("request")
        history_end = len(self.log)                               # R9.4
        yield self._commit(ev.STEP_START, {"turn": turn, "step": step})   # R9.5
        self._check_signal()
        seed = self.config.request_options if not self._header_logged else (
            self.log.last_header or FrozenDict()).get("config", FrozenDict())
        raw_header = yield from self._hook(REQUEST, FrozenDict({
            "turn": turn, "step": step, "signal": signal, "config": seed,
            "system": frozen_system}))                             # R9.6
        self._check_signal()
        header = self._validate_header(raw_header)
        header_reason = decisions.header_reason(
            self._header_logged, self.log.has_header,
            # Why: same_json compares as canonical JSON text would, without encoding twice.
            self._header_logged and not same_json(header, self.log.last_header))
        self._header_logged = True
        if header_reason is not None:
            yield self._commit(ev.REQUEST_HEADER, {"header": header, "reason": header_reason})
        self.lifecycle.fire("stream")                             # R9.7
        config = header["config"]
        assert isinstance(config, FrozenDict)
        model = self._new_effect(MODEL, FrozenDict({
            "turn": turn, "step": step, "signal": signal, "header": header,
            "historyEnd": history_end}), self.log.history(history_end))
        yield model
        folded: list[_Folded] = []
        open_kind: str | None = None      # P12: the run of text or reasoning chunks being folded
        chunk_seqs: list[int] = []
        finish: FrozenDict | None = None
        usage: Frozen = None              # R9.8: the last usage chunk's figures
        # Why one _Wait for the whole stream (what `_await` yields, without a generator per
        # chunk): the loop below runs once per chunk.
        awaiting = _Wait(frozenset((model.id,)))
        while True:
            mail = yield awaiting
            assert mail is not None
            _, kind, value = mail
            if kind == "raise":
                assert isinstance(value, ErrorInfo)
                if value.failure is None:                         # not a model failure
                    raise _Failure(value)
                return (yield from self._request_failed(value, value.failure))
            if kind == "end":
                if finish is None:
                    raise _Failure(ErrorInfo("model stream ended without a finish chunk",
                                             "InvalidChunkError", "INVALID_CHUNK"))
                break
            if self._ctrl is not None and self._ctrl.aborted:    # R9.7.1
                release = self._release(model.id)
                if release is not None:
                    yield release
                raise _Aborted()
            problem: str | None = None
            chunk: FrozenDict | None = None
            if finish is not None:
                problem = "a chunk arrived after the finish chunk"
            else:
                try:
                    chunk = validate_chunk(value)
                    problem = _chunk_content_problem(chunk)
                except ValidationError as error:
                    problem = f"invalid chunk: {error}"
            if problem is not None or chunk is None:              # R9.7 / D5
                release = self._release(model.id)
                if release is not None:
                    yield release
                raise _Failure(ErrorInfo(problem or "invalid chunk", "InvalidChunkError",
                                         "INVALID_CHUNK"))
            durable = self._commit(ev.ASSISTANT_CHUNK, {"turn": turn, "step": step, "chunk": chunk})
            chunk_seqs.append(durable.event.seq)
            yield durable
            chunk_type = chunk["type"]
            if chunk_type == "finish":
                finish = chunk
            elif chunk_type == "usage":
                usage = chunk["usage"]
            else:
                open_kind = _fold(folded, chunk, open_kind)
        finish_kind = finish["kind"]
        if finish_kind in ("error", "aborted"):                   # R9.7 request failure
            raw_failure = finish.get("failure")
            facts = (LlmFailure.from_json(raw_failure) if raw_failure is not None
                     else DEFAULT_ABORT_FAILURE)
            return (yield from self._request_failed(
                ErrorInfo(facts.message, "ModelRequestError", facts.code, failure=facts), facts))
        max_tokens = finish_kind == "max-tokens"
        blocks = _folded_blocks(folded)
        if max_tokens:                                            # R14.1
            blocks = [b for b in blocks if b.get("type") != "tool-call"]
        provider, model_name = config["provider"], config["model"]
        seq = len(self.log)
        source: dict[str, Frozen] = {"kind": "model", "provider": provider, "model": model_name}
        if "replayState" in finish:                               # P12
            source["replayState"] = finish["replayState"]
        message = Message(id=minted_id(self._mint, "assistant", seq), role="assistant",
                          content=FrozenList(blocks), source=FrozenDict(source))
        data: dict[str, Frozen] = {"turn": turn, "step": step, "message": frozen_message(message)}
        if usage is not None:
            data["usage"] = usage
        yield self._commit(ev.ASSISTANT_MESSAGE, data, surface=True, sources=chunk_seqs)  # R9.8
        calls = [b for b in message.content if isinstance(b, FrozenDict)
                 and b.get("type") == "tool-call"]
        concluded = False
        if calls:                                                 # R9.9
            self.lifecycle.fire("run_tools")
            concluded = yield from self._tool_batch(calls)
        self.lifecycle.fire("end_step")
        took_steering = yield from self._drain()                  # R9.10
        yield self._commit(ev.STEP_END, {"turn": turn, "step": step})
        return _StepOutcome(had_calls=bool(calls), took_steering=took_steering,
                            concluded=concluded, max_tokens=max_tokens)

    def _validate_header(self, value: JsonLike) -> FrozenDict:
        """R9.6: the prepared header {config, system?, tools?}; config names provider and model."""
        try:
            header = freeze(value, "header")
        except ValidationError as problem:
            raise _Failure(ErrorInfo(str(problem), "RequestConfigError", "INVALID_REQUEST_CONFIG"),
                           code="INVALID_REQUEST_CONFIG") from None
        problem_text: str | None = None
        if not isinstance(header, FrozenDict) or not isinstance(header.get("config"), FrozenDict):
            problem_text = "the request header must be a mapping {config, system?, tools?}"
        elif set(header) - {"config", "system", "tools"}:
            problem_text = f"unexpected header field(s) {sorted(set(header) - {'config', 'system', 'tools'})}"
        else:
            config = header["config"]
            assert isinstance(config, FrozenDict)
            if any(_unset(config.get(key)) for key in ("provider", "model")):
                # R9.6 step 3, as the original reports it: an uncoded error (R15.3).
                raise _Failure(ErrorInfo(NO_ROUTE_MESSAGE, "Error"))
            for key in ("provider", "model"):
                if not isinstance(config.get(key), str):
                    problem_text = f"the request config's {key} must be a string"
                    break
        if problem_text is not None:
            raise _Failure(ErrorInfo(problem_text, "RequestConfigError", "INVALID_REQUEST_CONFIG"),
                           code="INVALID_REQUEST_CONFIG")
        assert isinstance(header, FrozenDict)
        return header

    def _request_failed(self, error: ErrorInfo,
                        facts: LlmFailure) -> Generator[Output | _Wait, _Mail | None, _StepOutcome]:
        """R13.2: step/end, recovery, classification."""
        self.lifecycle.fire("request_failed")
        yield self._commit(ev.STEP_END, {"turn": self._turn, "step": self._step})
        ctrl = self._ctrl
        assert ctrl is not None
        failure_json = frozen_json(facts)
        if not ctrl.aborted:
            recovery = self._new_effect(REQUEST_ERROR, FrozenDict({
                "turn": self._turn, "step": self._step, "signal": ctrl.signal,
                "error": frozen_json(error), "failure": failure_json,
                "priorFailures": FrozenList(self._prior_failures)}))
            yield recovery
            _, kind, value = yield from self._await(recovery.id)
            if kind == "raise":
                assert isinstance(value, ErrorInfo)
                yield self._warn(f"request recovery failed: {value.rendered()}")
            elif _is_retry(value) and not ctrl.aborted:
                self._pending_retry = True
        self._prior_failures = [*self._prior_failures, failure_json]
        yield from self._classify(_Failure(error, request_failure=facts))
        return _StepOutcome(request_failed=True)

    # ------------------------------------------------------------------
    # Drains (R11)
    # ------------------------------------------------------------------

    def _drain(self, limit: int | None = None) -> Generator[Output | _Wait, _Mail | None, bool]:
        took_steering = False
        taken = 0
        while len(self.outbox) and (limit is None or taken < limit):
            message, steering = self.outbox.front
            taken += 1
            if steering:
                self.outbox.take()
                took_steering = True
                yield Live(LiveEvent(ev.INBOX_DEQUEUE, FrozenDict({
                    "message": frozen_message(message), "placement": "steering"})))
                yield self._commit(ev.STEERING_MESSAGE, {"turn": self._turn,
                                                         "message": frozen_message(message)},
                                   surface=True)
            else:
                # P16: taken once written, so a refused append leaves the context staged.
                durable = self._commit(ev.USER_MESSAGE, message, surface=True)
                self.outbox.take()
                yield durable
        return took_steering

    # ------------------------------------------------------------------
    # Tool batch (R10)
    # ------------------------------------------------------------------

    def _mode(self, call: _Call) -> ToolMode:
        return self.config.tool_modes.get(call.name, "exclusive")

    def _tool_batch(self, blocks: list[FrozenDict]) -> Generator[Output | _Wait, _Mail | None, bool]:
        batch = _Batch([_Call(i, str(b["id"]), str(b["name"]), plan_arguments(str(b["arguments"])))
                        for i, b in enumerate(blocks)])
        calls = batch.calls
        ctrl = self._ctrl
        assert ctrl is not None
        while batch.next_start < len(calls) and batch.failed_at is None and not ctrl.aborted:
            first = calls[batch.next_start]
            pool = self._mode(first) == "parallel"
            limit = self.config.max_parallel_tool_calls if pool else 1
            group_open = True
            batch.in_flight.clear()
            batch.commit_from = batch.next_start
            while True:
                # R10.2: start calls while fewer than the limit are in flight (dispatched and
                # not yet taken), committing what is committable after each start.
                while (group_open and batch.failed_at is None and not ctrl.aborted
                       and len(batch.in_flight) < limit and batch.next_start < len(calls)):
                    call = calls[batch.next_start]
                    if call is not first and (not pool or self._mode(call) != "parallel"):
                        group_open = False
                        break
                    batch.next_start += 1
                    yield from self._start_call(batch, call)            # R10.3
                    batch.note(call)
                    if not pool:
                        group_open = False
                    yield from self._commit_ready(batch)
                if not batch.in_flight:
                    if (batch.failed_at is not None or ctrl.aborted or not group_open
                            or batch.next_start >= len(calls)):
                        break
                    continue
                # R10.2: take a settled call (the earliest started), waiting for a settlement
                # if none has come; every settlement that has arrived is taken with it (P6).
                if not any(c.outcome != "running" for c in batch.in_flight.values()):
                    mail = yield _Wait(batch.running())
                    assert mail is not None
                    self._absorb(batch, mail)
                    while (more := self._take_mail(batch.running())) is not None:
                        self._absorb(batch, more)
                taken = next(e for e, c in batch.in_flight.items() if c.outcome != "running")
                del batch.in_flight[taken]
                yield from self._commit_ready(batch)
        if batch.failed_at is not None:                           # R10.9
            failed = calls[batch.failed_at]
            assert failed.error is not None
            raise _Failure(failed.error, code="INVALID_TOOL_RESULT")
        if ctrl.aborted:                                          # R10.7 synthetic pairs
            for call in calls[batch.next_start:]:
                call_event = self._commit(ev.TOOL_CALL, self._call_data(call))
                call.call_seq = call_event.event.seq
                yield call_event
                yield self._tool_result(call, ABD_RESULT)
        return batch.concluded

    def _absorb(self, batch: _Batch, mail: _Mail) -> None:
        """R10.3 step 5: a settlement of a dispatched call, taken (P6) when it arrives before
        what the batch waits for; the call stays in flight until the batch takes it."""
        effect_id, kind, value = mail
        ctrl = self._ctrl
        assert ctrl is not None
        call = batch.in_flight[effect_id]
        self._settle_call(call, kind, value, ctrl.aborted)
        batch.note(call)

    def _batch_await(self, batch: _Batch,
                     effect_id: int) -> Generator[Output | _Wait, _Mail | None, _Mail]:
        """Wait for a prepare or finalize completion; settlements of dispatched calls that
        arrive before it settle their calls first, in arrival order (P6)."""
        while True:
            mail = yield _Wait(frozenset((effect_id,)) | batch.running())
            assert mail is not None
            if mail[0] == effect_id:
                return mail
            self._absorb(batch, mail)

    def _commit_ready(self, batch: _Batch) -> Generator[Output | _Wait, _Mail | None, None]:
        """R10.4: commit settled calls in model order, up to the first unsettled or failed one."""
        calls = batch.calls
        while batch.commit_from < batch.next_start and (
                batch.failed_at is None or batch.commit_from < batch.failed_at):
            call = calls[batch.commit_from]
            if call.outcome in ("pending", "running"):
                break
            if (yield from self._commit_call(batch, call)):
                batch.concluded = True
            if call.outcome == "failed":
                batch.note(call)
                break
            batch.commit_from += 1

    def _call_data(self, call: _Call) -> dict[str, Frozen]:
        return {"turn": self._turn, "step": self._step, "callId": call.call_id,
                "name": call.name, "arguments": call.arguments}

    def _stage_payload(self, call: _Call, **extra: Frozen) -> FrozenDict:
        return FrozenDict({"turn": self._turn, "step": self._step, "signal": self._signal(),
                           "callId": call.call_id, "name": call.name,
                           "arguments": call.arguments, **extra})

    def _start_call(self, batch: _Batch,
                    call: _Call) -> Generator[Output | _Wait, _Mail | None, None]:
        """R10.3: tool/call, prepare, then dispatch (or not)."""
        call_event = self._commit(ev.TOOL_CALL, self._call_data(call))
        call.call_seq = call_event.event.seq
        yield call_event
        ctrl = self._ctrl
        assert ctrl is not None
        call.outcome = "settled"
        if ctrl.aborted:                                          # R10.3 step 2: not prepared
            call.result = ABD_RESULT
            return
        prepare = self._new_effect(TOOL_PREPARE, self._stage_payload(call))
        yield prepare
        _, kind, value = yield from self._batch_await(batch, prepare.id)
        if kind == "raise":                                       # a final error result
            assert isinstance(value, ErrorInfo)
            call.result = raised_result(value)
            return
        if value is not None:                                     # a final result
            try:
                call.result = ToolResult.from_json(value)
            except ValidationError as problem:
                call.outcome, call.error = "failed", _invalid_result(problem)
            return
        call.needs_finalize = True
        if ctrl.aborted:                                          # R10.3 step 4: not dispatched
            call.result = ABD_RESULT
            return
        execute = self._new_effect(TOOL_EXECUTE, self._stage_payload(call))
        batch.in_flight[execute.id] = call
        call.outcome, call.dispatched = "running", True
        yield execute

    def _settle_call(self, call: _Call, kind: str, value: Any, aborted: bool) -> None:
        """R10.3 step 5: the body's result (the R10.11 aborted result in place of a success
        settled while the signal is aborted), R10.12's for a raise, a failure if invalid."""
        if kind == "raise":
            assert isinstance(value, ErrorInfo)
            call.outcome, call.result = "settled", raised_result(value)
            return
        try:
            result = ToolResult.from_json(value)
        except ValidationError as problem:
            call.outcome, call.error = "failed", _invalid_result(problem)
            return
        if aborted and not result.is_error:
            result = _canonical_result(ABORTED_ERROR, ABORTED_TEXT, result.additional_contexts)
        call.outcome, call.result = "settled", result

    def _commit_call(self, batch: _Batch,
                     call: _Call) -> Generator[Output | _Wait, _Mail | None, bool]:
        """R10.4: finalize, validate, append the result, stage contexts; True if it concludes."""
        if call.outcome == "failed":
            return False
        result = call.result
        assert result is not None
        if call.needs_finalize:                                   # R10.4 step 1
            finalize = self._new_effect(TOOL_FINALIZE, self._stage_payload(
                call, result=frozen_json(normalized(result))))
            yield finalize
            _, kind, value = yield from self._batch_await(batch, finalize.id)
            if kind == "raise":
                assert isinstance(value, ErrorInfo)
                result = raised_result(value)
            else:
                try:
                    result = ToolResult.from_json(value)
                except ValidationError as problem:
                    call.outcome, call.error = "failed", _invalid_result(problem)
                    return False
                ctrl = self._ctrl
                if ctrl is not None and ctrl.aborted and not result.is_error:   # R10.4 step 1
                    result = (_canonical_result(ABORTED_ERROR, ABORTED_TEXT,
                                                result.additional_contexts) if call.dispatched
                              else _canonical_result(ABD_ERROR, ABD_TEXT,
                                                     result.additional_contexts))
        result = normalized(result)                               # R10.4 step 2 (V16)
        yield self._tool_result(call, result)                     # R10.4 step 3
        for context in result.additional_contexts:                # R10.4 step 4
            self.outbox.stage(context, False)
        return decisions.concludes(result.concludes_turn, result.is_error, False)  # R10.6

    def _tool_result(self, call: _Call, result: ToolResult) -> Durable:
        block: dict[str, Frozen] = {"type": "tool-result", "toolCallId": call.call_id,
                                    "content": result.content}
        if result.is_error:
            block["isError"] = True
        seq = len(self.log)
        message = Message(id=minted_id(self._mint, "tool-result", seq), role="user",
                          content=FrozenList((FrozenDict(block),)),
                          source=FrozenDict({"kind": "tool", "callId": call.call_id}))
        data: dict[str, Frozen] = {"turn": self._turn, "step": self._step,
                                   "message": frozen_message(message)}
        if result.error is not None:
            data["error"] = result.error
        if result.meta is not None:
            data["meta"] = result.meta
        return self._commit(ev.TOOL_RESULT, data, surface=True, sources=[call.call_seq])


def _invalid_result(problem: ValidationError) -> ErrorInfo:
    return ErrorInfo(f"invalid tool result: {problem}", "InvalidToolResultError",
                     "INVALID_TOOL_RESULT")


def _is_retry(value: JsonLike) -> bool:
    """R13.2: only exactly {kind:'retry'} authorizes a retry."""
    return (isinstance(value, (dict, FrozenDict)) and len(value) == 1
            and value.get("kind") == "retry")


def _chunk_content_problem(chunk: FrozenDict) -> str | None:
    """Rule P12: a streamed chunk's type is one of CHUNK_TYPES (D5), a finish carries no
    usage (usage is its own chunk), and a content-carrying chunk has the fields it needs."""
    kind = chunk["type"]
    if kind not in CHUNK_TYPES:
        return (f"invalid chunk: {kind!r} is not a chunk type (one of "
                f"{', '.join(sorted(CHUNK_TYPES))})")
    if kind == "finish" and "usage" in chunk:
        return "invalid chunk: a finish chunk carries no usage; usage is its own chunk"
    if kind in ("text", "reasoning") and not isinstance(chunk.get("text"), str):
        return f"invalid chunk: a {kind} chunk needs a string 'text'"
    if kind == "tool-call":
        if not isinstance(chunk.get("id"), str) or not chunk.get("id"):
            return "invalid chunk: a tool-call chunk needs a non-empty string 'id'"
        if not isinstance(chunk.get("name"), str):
            return "invalid chunk: a tool-call chunk needs a string 'name'"
        if not isinstance(chunk.get("arguments"), str):
            return "invalid chunk: a tool-call chunk needs 'arguments', JSON text (a string)"
    if kind == "block":
        block = chunk.get("block")
        problem = block_problem(block) if block is not None else "a block chunk needs a 'block'"
        if problem:
            return f"invalid chunk: {problem}"
    return None


#: What `_fold` builds: content blocks, and for a run of text or reasoning chunks a list
#: [kind, piece, piece, ...] that `_folded_blocks` joins into one block at the end.
_Folded: TypeAlias = "FrozenDict | list[str]"


def _fold(content: list[_Folded], chunk: FrozenDict, open_kind: str | None) -> str | None:
    """Rule P12: how the core folds model chunks into content blocks.

    Consecutive ``text`` chunks extend one text block (likewise ``reasoning``):
    *open_kind* is the kind of the block the previous content chunk started, and the
    kind to pass next time is returned. ``tool-call`` chunks {id, name, arguments} add a
    call and ``block`` chunks add their ``block`` as is; both end a run of text. Other
    chunk types carry no content and leave the run as it is. (A run is kept as its
    pieces and joined once by `_folded_blocks`: joining at every chunk would copy the
    text so far each time.)
    """
    kind = chunk["type"]
    if kind in ("text", "reasoning"):
        piece = str(chunk["text"])
        if content and open_kind == kind:
            run = content[-1]
            assert type(run) is list
            run.append(piece)
        else:
            content.append([str(kind), piece])
        return str(kind)
    if kind == "tool-call":
        content.append(FrozenDict({"type": "tool-call", "id": chunk["id"],
                                   "name": chunk["name"], "arguments": chunk["arguments"]}))
        return None
    if kind == "block":
        block = chunk["block"]
        assert isinstance(block, FrozenDict)
        content.append(block)
        return None
    return open_kind


def _folded_blocks(content: list[_Folded]) -> list[FrozenDict]:
    """The content blocks `_fold` built, each run of text or reasoning joined into one."""
    return [FrozenDict({"type": item[0], "text": "".join(item[1:])}) if type(item) is list
            else item for item in content]  # type: ignore[misc]
