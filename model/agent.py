"""`ModelAgent`: a deliberately plain, rule-by-rule executable reading of the spec.

This is the *reference model* of the agent core. It is written from
``shared/reference/semantics.md`` (rules §0–§21, D1–D8; cited as "§x.y"),
``specs/differences.md`` (the decisions about the original: where this project
follows it, and D9–D12) and ``specs/protocol.md`` (rules P1–P14), never from
``machine/core/``. Speed does not matter here; obviousness does.

Each "§x.y" is followed by the project's id of the rule that restates it, as
``§10.9 (R10.9)``, so one grep for a rule id finds the spec, the machine, this
model and the tests. ``R<s>.<n>`` restates §<s>.<n> (``specs/core.md``) and
``R<s>.<n>.<k>`` is its step *k*; the data shapes of §1 and the event
catalog of §2 are V and E rules (``specs/vocabulary.md``); §3.5's environment
steps are effects (R3.2); resume (§23) is S18 (``specs/persistence.md``).
Rules the reference lacks are cited by their project id alone (R17.4, R20.4, D9).
``tests/test_model_citations.py`` checks all of this against ``specs/``.

Shape of the model
------------------
* All state is plain data on the instance: lists (``_queued``, ``_outbox``, the output
  queue ``_out``), a few flags, the abort controllers by signal, the effect records --
  and the loop's position.
* The loop's own work (wake, admission, run, flush, settlement, continue-or-idle) is a
  STACK OF FRAMES, ``_frames``: one small dataclass per activity (`_Wake`, `_Admission`,
  `_Chain`, `_Run`, `_Step`, `_Stream`, `_Batch`, `_Drain`, ...), each with a ``phase``
  naming the point of the spec's procedure where it resumes, and the activity's locals as
  fields. ``_resume`` runs the top frame's step function (one per frame class, dispatching
  on the phase) from that point to the next yield point: it pauses after it has queued an
  output ("deliver what I queued, then resume me": P8) and waits (`_Wait`) on the
  environment (a yield point, §0.4 (R0.4)); it is resumed with the completion it waited
  for (P6). A step may push a child frame (it runs at once; its result is what the
  caller resumes with) or finish its frame. No generator or closure holds state: the
  agent can be copied (`ModelAgent.copy`) and its state read (`ModelAgent.state_parts`).
* Commands (§5 (R5), §16 (R16), §17 (R17), P3) are plain methods that change
  state at once and queue their outputs; they never run the loop.
* ``next_output`` (P1) hands out queued outputs and only resumes the loop when the
  queue is empty (P8).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import TYPE_CHECKING, ClassVar, Final, Literal, Self, TypeAlias, TypeVar

from machine.core import CoreConfig
from machine.errors import (
    CoreFailedError,
    DisposedError,
    InvariantError,
    ProtocolError,
    TurnstileError,
    ValidationError,
)
from machine.events import (
    AGENT_CREATED,
    AGENT_DISPOSED,
    ASSISTANT_CHUNK,
    ASSISTANT_MESSAGE,
    CANCEL_REQUESTED,
    CONTEXT_DISCARD,
    ERROR,
    INBOX_DEQUEUE,
    INBOX_DISCARD,
    INBOX_ENQUEUE,
    REQUEST_HEADER,
    SESSION_CREATED,
    SESSION_DISPOSED,
    SESSION_START,
    SETTLED,
    STATUS,
    STEERING_MESSAGE,
    STEP_END,
    STEP_START,
    TOOL_CALL,
    TOOL_RESULT,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    WARNING,
    Event,
    LiveEvent,
)
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
    canonical_json,
    freeze,
    shown,
    snapshot,
)
from machine.log import SessionLog
from machine.vocabulary import (
    WHITESPACE,
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
    minted_id,
    retry_action_from_json,
    validate_chunk,
    validate_user_message,
)

logger = logging.getLogger("turnstile.model")

Completion: TypeAlias = Resolve | Raise | Chunk | End

_T = TypeVar("_T")


def _shallow(obj: _T) -> _T:
    """A shallow copy of a plain (non-slotted) object: a new object with the same fields."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    return new


def _json_copy(value: JsonLike) -> JsonLike:
    """A deep copy of a JSON value's lists and dicts (the rest is immutable)."""
    if isinstance(value, dict):
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_copy(item) for item in value]
    return value


# --------------------------------------------------------------------------
# Plain records
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Queued:
    """An item of ``queued`` (§4.1 (R4.1)): a message and its wakeup flag."""

    message: Message
    wakeup: bool


@dataclass(frozen=True)
class _Staged:
    """An item of the ``outbox`` (§4.1 (R4.1)): staged steering (True) or staged context (False)."""

    message: Message
    steering: bool


@dataclass(frozen=True)
class _EffectRecord:
    """What the model remembers about one effect request (P4, P10); replaced, never changed."""

    kind: str
    done: bool = False  # a terminal completion arrived, or the stream was released (P5, P10)
    abandoned: bool = False  # outstanding when the model stopped (P16): completions dropped


@dataclass
class _Reports:
    """The two pending discard reports of one cancel (§16.2 step 2 (R16.2.2), D6, P7)."""

    queued: list[Message] = field(default_factory=list)
    steering: list[Message] = field(default_factory=list)
    context: list[Message] = field(default_factory=list)


@dataclass
class _Scope:
    """One effective cancel, while what it queued is still being delivered (P7, D9): its
    reports (None for a keepInbox cancel, until a joined cancel clears something), its
    queued ``abort`` entry (None if it aborted nothing), and whether input was cleared into
    its reports at the position being observed."""

    reports: _Reports | None
    abort: _Entry | None = None
    fresh: int = 0


@dataclass
class _Entry:
    """One entry of the output queue: an output, or a pending report (P7)."""

    output: Output | None = None
    report: Literal["inbox", "context"] | None = None
    reports: _Reports | None = None  # for a report
    scope: _Scope | None = None  # for a cancel-requested: the cancel it announces


class _OutputsCopy:
    """`ModelAgent.copy` of the output queue and the cancel scope: the objects they share
    (a cancel's reports, its abort entry, the scope itself, P7) stay shared in the copy."""

    def __init__(self) -> None:
        self.entries: dict[int, _Entry] = {}
        self.scopes: dict[int, _Scope] = {}
        self.reports: dict[int, _Reports] = {}

    def entry(self, entry: _Entry) -> _Entry:
        new = self.entries.get(id(entry))
        if new is None:
            new = self.entries[id(entry)] = _Entry(entry.output, entry.report)
            new.reports = self.reports_of(entry.reports)
            new.scope = self.scope(entry.scope)
        return new

    def scope(self, scope: _Scope | None) -> _Scope | None:
        if scope is None:
            return None
        new = self.scopes.get(id(scope))
        if new is None:
            new = self.scopes[id(scope)] = _Scope(None, None, scope.fresh)
            new.reports = self.reports_of(scope.reports)
            new.abort = self.entry(scope.abort) if scope.abort is not None else None
        return new

    def reports_of(self, reports: _Reports | None) -> _Reports | None:
        if reports is None:
            return None
        new = self.reports.get(id(reports))
        if new is None:
            new = self.reports[id(reports)] = _Reports(
                list(reports.queued), list(reports.steering), list(reports.context))
        return new


class _OutputsParts:
    """`ModelAgent.state_parts` of the output queue and the cancel scope: a shared object is
    given in full where it first appears and by its number (``#n``) after that; a scope's
    abort entry by its place in the queue (``pulled`` once it left it)."""

    def __init__(self, out: list[_Entry]) -> None:
        self.out = out
        self.seen: dict[int, str] = {}

    def entry(self, entry: _Entry) -> tuple[object, ...]:
        return (entry.output, entry.report, self.reports_of(entry.reports), self.scope(entry.scope))

    def scope(self, scope: _Scope | None) -> object:
        if scope is None:
            return None
        number = self.seen.get(id(scope))
        if number is not None:
            return number
        number = self.seen[id(scope)] = f"#{len(self.seen)}"
        abort: object = None
        if scope.abort is not None:
            abort = next((i for i, e in enumerate(self.out) if e is scope.abort), "pulled")
        return (number, self.reports_of(scope.reports), abort, scope.fresh)

    def reports_of(self, reports: _Reports | None) -> object:
        if reports is None:
            return None
        number = self.seen.get(id(reports))
        if number is not None:
            return number
        number = self.seen[id(reports)] = f"#{len(self.seen)}"
        return (number, tuple(reports.queued), tuple(reports.steering), tuple(reports.context))


@dataclass(frozen=True)
class _Ending:
    """Something that ends a turn: an abort raised by a signal check (§0.7 (R0.7)), a request
    failure (§13.1 (R13.1)) or a generic failure (§15.3 (R15.3))."""

    kind: Literal["abort", "request", "generic"]
    error: ErrorInfo | None = None
    failure: LlmFailure | None = None


class _Stop(Exception):
    """An `_Ending` raised inside the loop: the run catches it (§8.6 (R8.6)), the step a
    request failure (§13.2 (R13.2)). Raised and caught within one resumption of the loop."""

    def __init__(self, kind: Literal["abort", "request", "generic"],
                 error: ErrorInfo | None = None, failure: LlmFailure | None = None) -> None:
        super().__init__(kind)
        self.ending = _Ending(kind, error, failure)


def _generic(message: str, name: str, code: str | None) -> _Stop:
    """A generic failure with a coded error (§15.3 (R15.3); project decision on names and codes)."""
    return _Stop("generic", ErrorInfo(message=message, name=name, code=code))


def _raised(error: ErrorInfo) -> _Stop:
    """A raised ErrorInfo is a generic failure (§13.1 (R13.1)), its code being the error's
    (§15.3 (R15.3))."""
    return _Stop("generic", error)


@dataclass(frozen=True)
class _StepOutcome:
    """The outcome of a completed step (§9.10 (R9.10))."""

    continue_turn: bool
    concluded: bool
    max_tokens: bool


@dataclass(frozen=True)
class _Answer:
    """What a model stream gave (§9.7 (R9.7), §9.8 (R9.8)): the folded content, the usage of
    the last usage chunk, the seqs of the chunks and the finish chunk."""

    content: tuple[Frozen, ...]
    usage: Frozen
    seqs: tuple[int, ...]
    finish: FrozenDict


@dataclass
class _Call:
    """One planned tool call of a batch and what happened to it (§10 (R10))."""

    call_id: str
    name: str
    arguments: Frozen
    state: Literal["unstarted", "inflight", "settled", "committed", "failed"] = "unstarted"
    call_seq: int = -1
    execute_effect: int | None = None
    dispatched: bool = False  # execute was requested: a late success becomes ABORTED (§10.11 (R10.11))
    taken: bool = False  # R10.2: a dispatched call counts as in flight until the batch takes it
    result: ToolResult | None = None  # what the call has so far (§10.3 (R10.3))
    final: bool = False  # the result skips finalize (from prepare, a prepare raise, R10.3)
    error: ErrorInfo | None = None  # why the call failed (§10.9 (R10.9))


ABORTED_BEFORE_DISPATCH_TEXT = "Error: tool call aborted before dispatch"
ABORTED_TEXT = "Error: tool call aborted"


def _aborted_result(code: str, text: str, contexts: Sequence[Message] = ()) -> ToolResult:
    """§10.10 (R10.10), §10.11 (R10.11): a canonical aborted result; when it stands in for
    a result, that result's additional contexts ride along."""
    return ToolResult.from_json({
        "content": [{"type": "text", "text": text}], "isError": True,
        "error": {"name": "AbortError", "code": code},
        "additionalContexts": [_message_json(m) for m in contexts]})


def _result_of_raise(error: ErrorInfo) -> ToolResult:
    """R10.12: a raising stage stands for the error result ``Error: <message>``, with
    ``error {name, code}`` for a coded error only."""
    value: dict[str, JsonLike] = {"content": [{"type": "text", "text": "Error: " + error.message}],
                                  "isError": True}
    if error.code is not None:
        value["error"] = {"name": error.name, "code": error.code}
    return ToolResult.from_json(value)


def _normal(result: ToolResult) -> ToolResult:
    """V16: an error result has no concludesTurn, a successful one no error."""
    value = result.to_json()
    if result.is_error:
        value.pop("concludesTurn", None)
    else:
        value.pop("error", None)
    return ToolResult.from_json(value)


def _default_mint(kind: str, seq: int) -> str:
    """Ids the loop mints: ``assistant-<seq>`` and ``tool-result-<seq>`` (P12, §1.5 (V5))."""
    return f"{kind}-{seq}"


def _message_json(message: Message) -> dict[str, JsonLike]:
    """A message's JSON form ``{id, role, content, source}`` (§1.1 (V5))."""
    return message.to_json()


def _plan_arguments(raw: str) -> Frozen:
    """§10.1 (R10.1): an empty string becomes ``{}``, valid JSON text becomes its value, and
    unparsable text is passed on as the raw string."""
    if raw == "":
        return FrozenDict({})

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    try:
        return freeze(json.loads(raw, parse_constant=refuse))
    except (ValueError, RecursionError):  # V1: nested too deeply is not JSON-compatible either
        return raw


def _header_problem(value: JsonLike) -> str | None:
    """P13: the request effect's value must be JSON of the shape ``{config, system?,
    tools?, retryPolicy?}`` with a mapping ``config``. (The texts are the project's; P13 does
    not state them.)"""
    try:
        header = freeze(value, "header")
    except ValidationError as exc:
        return str(exc)
    if not isinstance(header, FrozenDict) or not isinstance(header.get("config"), FrozenDict):
        return "the request header must be a mapping {config, system?, tools?}"
    extra = sorted(set(header) - {"config", "system", "tools", "retryPolicy"})
    if extra:
        return f"unexpected header field(s) {extra}"
    return None


def _route_problem(header: FrozenDict) -> str | None:
    """P13: provider and model, once present, must be strings (D5)."""
    config = header["config"]
    assert isinstance(config, FrozenDict)
    for key in ("provider", "model"):
        if not isinstance(config.get(key), str):
            return f"the request config's {key} must be a string"
    return None


#: §3.5 (R3.2), §9.6 (R9.6): a config without provider or model fails request preparation with an
#: uncoded error, as in the original; the text is the project's.
NO_ROUTE = ("the request config has no provider/model: set them in "
            "CoreConfig.request_options or return both from the request effect")


def _lacks_route(value: JsonLike) -> bool:
    """Whether a structurally sound header's config lacks provider or model: absent, or a
    value the original's ``!config.provider`` check counts as missing (null, false, 0, '')."""
    config = value.get("config") if isinstance(value, (dict, FrozenDict)) else None
    if not isinstance(config, (dict, FrozenDict)):
        return False
    for key in ("provider", "model"):
        item = config.get(key)
        if item is None or item is False or item == "" or (
                type(item) in (int, float) and item == 0):
            return True
    return False


def _chunk_problem(chunk: FrozenDict) -> str | None:
    """P12: the chunk types a stream may carry (§1.20 (V18) read with the original's closed chunk
    union; D5), no usage on a finish (usage is its own chunk), and the fields a
    content-carrying chunk must have (the texts are the project's; P12 does not state them)."""
    kind = chunk["type"]
    if kind not in ("text", "reasoning", "tool-call", "block", "usage", "finish"):
        return ("invalid chunk: " + repr(kind) + " is not a chunk type (one of block, finish, "
                "reasoning, text, tool-call, usage)")
    if kind == "finish" and "usage" in chunk:
        return "invalid chunk: a finish chunk carries no usage; usage is its own chunk"
    if kind in ("text", "reasoning"):
        if not isinstance(chunk.get("text"), str):
            return f"invalid chunk: a {kind} chunk needs a string 'text'"
    elif kind == "tool-call":
        call_id = chunk.get("id")
        if not isinstance(call_id, str) or not call_id:
            return "invalid chunk: a tool-call chunk needs a non-empty string 'id'"
        if not isinstance(chunk.get("name"), str):
            return "invalid chunk: a tool-call chunk needs a string 'name'"
        if not isinstance(chunk.get("arguments"), str):
            return "invalid chunk: a tool-call chunk needs 'arguments', JSON text (a string)"
    elif kind == "block":
        if "block" not in chunk:
            return "invalid chunk: a block chunk needs a 'block'"
        problem = block_problem(chunk["block"])
        if problem:
            return f"invalid chunk: {problem}"
    return None



def _planned(blocks: Sequence[FrozenDict]) -> list[_Call]:
    """§10.1 (R10.1): the batch's calls, in model order, with their planned arguments."""
    calls: list[_Call] = []
    for block in blocks:
        call_id, name, arguments = block["id"], block["name"], block["arguments"]
        assert isinstance(call_id, str) and isinstance(name, str)
        assert isinstance(arguments, str)
        calls.append(_Call(call_id, name, _plan_arguments(arguments)))
    return calls


def _plain(value: object) -> object:
    """A frame's field as a plain value (`ModelAgent.state_parts`): lists as tuples, a record
    of the model's as its class name and fields; other (immutable) values as they are."""
    if isinstance(value, list):
        return tuple(_plain(item) for item in value)
    if isinstance(value, (_Call, _Ending, _EffectRecord)):
        return (type(value).__name__, *(_plain(getattr(value, f.name)) for f in fields(value)))
    return value


# --------------------------------------------------------------------------
# The loop's frames
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Wait:
    """The loop waits on one of these effects (a yield point, §0.4 (R0.4); P6)."""

    effects: frozenset[int]


class _Yield(Enum):
    """What a step asks of `ModelAgent._resume` besides waiting (`_Wait`) or finishing its
    frame (`_Return`)."""

    PAUSE = "pause"  # outputs were queued: deliver them, then resume the top frame (P8)
    CALL = "call"  # a child frame was pushed: run it now (it resumes with no value)


PAUSE = _Yield.PAUSE


@dataclass(frozen=True)
class _Return:
    """The top frame finished (and was popped); its caller resumes with ``value``."""

    value: object = None


_Signal: TypeAlias = "_Wait | _Yield | _Return"


@dataclass
class _Frame:
    """One activity of the loop in progress. A subclass names its points of resumption in
    its ``phase`` field (a Literal: where its step function goes on when the frame is
    resumed) and holds the activity's arguments and locals as fields, nothing else."""

    def copy(self) -> Self:
        """An independent copy; a frame whose fields hold mutable containers copies them."""
        return _shallow(self)

    def parts(self) -> tuple[object, ...]:
        """The frame as plain values (`ModelAgent.state_parts`)."""
        return (type(self).__name__, *(_plain(getattr(self, f.name)) for f in fields(self)))


@dataclass
class _Wake(_Frame):
    """The wake (§6.2 (R6.2)), waiting for its tick."""

    tick: int
    phase: Literal["start", "await-tick", "done"] = "start"


@dataclass
class _ContinueOrIdle(_Frame):
    """Continue-or-idle (§12.7 (R12.7)): claim while a waking item is queued, then idle."""

    phase: Literal["claim", "idle-delivered"] = "claim"


@dataclass
class _Admission(_Frame):
    """One admission (§7 (R7)) of the claimed message."""

    claimed: Message
    phase: Literal["start", "running", "rejected-early", "rejected", "dequeue",
                   "prompt-submit-requested", "await-prompt-submit", "decided", "done"] = "start"
    signal: int = 0  # of the admission's controller (§7.3 (R7.3))
    inherited: int = 0  # how many outbox items were staged at the claim (§8.3 step 1 (R8.3.1))
    effect: int = -1  # the prompt-submit effect
    admitted: tuple[Message, ...] | None = None  # §7.7 (R7.7): None when rejected


@dataclass
class _RejectAdmission(_Frame):
    """§7.10 steps 1–2 (R7.10.1–R7.10.2): close the window, append staged context."""

    phase: Literal["close", "write", "done"] = "close"


@dataclass
class _RejectedTick(_Frame):
    """§7.10 step 3 (R7.10.3): one tick."""

    phase: Literal["start", "tick-requested", "await-tick"] = "start"
    tick: int = -1


@dataclass
class _Chain(_Frame):
    """The chain of runs of one admission (§8.8 (R8.8), §12.4–§12.6 (R12.4–R12.6))."""

    trigger: FrozenDict
    admitted: tuple[Message, ...]
    inherited: int
    phase: Literal["start", "run", "ran", "flushed", "settled"] = "start"


@dataclass
class _Flush(_Frame):
    """The flush barrier (§12.4 (R12.4))."""

    phase: Literal["start", "flush-requested", "await-flush", "warned", "reported"] = "start"
    effect: int = -1
    error: ErrorInfo | None = None  # the flush's failure, reported after the warning


@dataclass
class _Run(_Frame):
    """One turn (§8.1–§8.7 (R8.1–R8.7))."""

    #: the phases inside the try of §8.3–§8.5 (R8.3–R8.5): a failure raised there, by the run
    #: or by a frame it called, fails the turn (§8.6 (R8.6))
    GUARDED: ClassVar[frozenset[str]] = frozenset({"turn-started", "admit", "drained", "stepped"})

    trigger: FrozenDict
    admitted: tuple[Message, ...]
    inherited: int
    phase: Literal["start", "no-turn", "turn-started", "admit", "drained", "stepped", "failed",
                   "closed"] = "start"
    signal: int = 0  # of the run's controller (§8.1 (R8.1))
    next_admitted: int = 0  # §8.3 step 2 (R8.3.2): how many admitted messages are appended


@dataclass
class _Closing(_Frame):
    """P16: the ``step/end`` or ``turn/end`` that closes a step or the turn."""

    signal: int
    type: str  # STEP_END or TURN_END
    phase: Literal["append", "append-again", "closed"] = "append"


@dataclass
class _StepLoop(_Frame):
    """The steps of a turn (§8.4 (R8.4), §8.5 (R8.5))."""

    signal: int
    phase: Literal["step", "stepped", "turn-stopping-requested", "await-turn-stopping",
                   "drained"] = "step"
    effect: int = -1  # the turn-stopping effect


@dataclass
class _Fail(_Frame):
    """§8.6 (R8.6): close an open step, then classify."""

    signal: int
    ending: _Ending
    phase: Literal["start", "classify", "done"] = "start"


@dataclass
class _Classify(_Frame):
    """§15.1–§15.3 (R15.1–R15.3): the turn's reasons and its ``agent/error``."""

    signal: int
    ending: _Ending
    phase: Literal["classify", "reported"] = "classify"


@dataclass
class _Drain(_Frame):
    """A drain of the outbox (§11.1 (R11.1))."""

    limit: int | None  # the inherited drain takes at most this many (§8.3 step 1 (R8.3.1))
    phase: Literal["next", "dequeued"] = "next"
    taken: int = 0
    took_steering: bool = False
    message: Message | None = None  # the steering item whose dequeue notice was just queued


#: §9.6 (R9.6): a request resolution that named nothing beside its header.
_NOTHING_PREPARED: Final = FrozenDict()


@dataclass
class _Step(_Frame):
    """One step (§9.1–§9.10 (R9.1–R9.10))."""

    signal: int
    phase: Literal["start", "step-hook-requested", "await-step-hook", "drained",
                   "system-prompt-requested", "await-system-prompt", "step-started",
                   "request-built", "streamed", "answered", "tools-done", "drain",
                   "drained-after-tools", "ended", "request-failed"] = "start"
    turn: int = 0
    step: int = 0
    effect: int = -1  # the step hook's, then the system prompt's effect
    system: Frozen = None  # §9.3 (R9.3)
    history_end: int = 0  # §9.4 (R9.4)
    header: FrozenDict | None = None  # §9.6 (R9.6)
    # §9.6 (R9.6): the prepared request's {retryPolicy} when its preparation named one
    prepared: FrozenDict = _NOTHING_PREPARED
    calls: tuple[FrozenDict, ...] = ()  # the answer's tool-call blocks (§9.9 (R9.9))
    max_tokens: bool = False  # §9.8 (R9.8), §14.1 (R14.1)
    concluded: bool = False  # §10.6 (R10.6)
    took_steering: bool = False  # §9.10 (R9.10)


@dataclass
class _BuildRequest(_Frame):
    """The request of a step (§9.6 (R9.6), P13)."""

    signal: int
    system: Frozen
    phase: Literal["start", "request-requested", "await-request", "logged"] = "start"
    effect: int = -1
    header: FrozenDict | None = None
    prepared: FrozenDict = _NOTHING_PREPARED


@dataclass
class _Stream(_Frame):
    """The model stream of a step (§9.7 (R9.7), P5, P12)."""

    signal: int
    header: FrozenDict
    history_end: int
    phase: Literal["start", "next-chunk", "await-chunk", "fold", "released"] = "start"
    effect: int = -1
    content: list[Frozen] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    finish: FrozenDict | None = None
    usage: Frozen = None
    previous_type: str | None = None  # the type of the last content-carrying chunk
    chunk: FrozenDict | None = None  # the chunk appended, folded after its append (§9.7 (R9.7))
    stop: _Ending | None = None  # raised once the release is delivered (P5)
    interrupted: bool = False  # D15: the abort stopped the stream: keep what it delivered

    def copy(self) -> Self:
        new = _shallow(self)
        new.content = list(self.content)
        new.seqs = list(self.seqs)
        return new


@dataclass
class _RequestFailure(_Frame):
    """A request failure of a step (§13.2 (R13.2))."""

    signal: int
    ending: _Ending
    prepared: FrozenDict = _NOTHING_PREPARED
    phase: Literal["start", "step-ended", "request-error-requested", "await-request-error",
                   "record", "done"] = "start"
    effect: int = -1


@dataclass
class _Batch(_Frame):
    """A tool batch (§10.1–§10.11 (R10.1–R10.11)): its calls and its progress. The frames
    it calls (`_StartCall`, `_Commit`, `_AwaitStage`) work on it (`ModelAgent._tool_batch`)."""

    signal: int
    calls: list[_Call]
    phase: Literal["group", "fill", "started", "settle", "await-settlement", "take", "commit",
                   "committed", "finish", "abort-call", "abort-result"] = "group"
    next_start: int = 0
    next_commit: int = 0
    concluded: bool = False
    in_pool: bool = False  # the group is a pool of parallel-safe calls (§10.2 (R10.2))
    limit: int = 1  # how many calls of the group may be in flight
    group_start: int = 0
    group_open: bool = False
    next_synthetic: int = 0  # §10.7 (R10.7): the next unstarted call to get a synthetic pair

    def copy(self) -> Self:
        new = _shallow(self)
        new.calls = [_shallow(call) for call in self.calls]
        return new

    def inflight(self) -> int:
        """§10.2 (R10.2): calls in flight: dispatched and not yet taken by the batch (a call
        whose body has settled still counts until then, as the original's pool counts it)."""
        return sum(1 for call in self.calls if call.dispatched and not call.taken)

    def running(self) -> frozenset[int]:
        """The execute effects still waiting for their settlement."""
        return frozenset(call.execute_effect for call in self.calls
                         if call.state == "inflight" and call.execute_effect is not None)

    def failed_at(self) -> int | None:
        """§10.9 (R10.9): the first failing call in model order (its failure propagates, and it and
        every later call get no tool/result)."""
        for index, call in enumerate(self.calls):
            if call.state == "failed":
                return index
        return None


@dataclass
class _StartCall(_Frame):
    """The start of the batch's next call (§10.3 (R10.3))."""

    signal: int
    phase: Literal["start", "called", "prepare-requested", "prepared", "dispatched"] = "start"
    index: int = -1  # the call's place in the batch
    effect: int = -1  # the prepare effect


@dataclass
class _AwaitStage(_Frame):
    """The wait for a prepare or finalize completion (P6)."""

    effect: int
    phase: Literal["wait", "arrived"] = "wait"


@dataclass
class _Commit(_Frame):
    """The commit of one settled call (§10.4 (R10.4))."""

    signal: int
    index: int  # the call's place in the batch
    phase: Literal["start", "finalize-requested", "finalized", "write", "written"] = "start"
    effect: int = -1  # the finalize effect
    result: ToolResult | None = None


# --------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------


class ModelAgent:
    """The reference model of `machine.core.AgentCore`: same commands, same completions,
    same outputs (P1–P15), written rule by rule from the spec."""

    # -- construction (P11, §23.2 (S18)) ---------------------------------------------------

    def __init__(self, config: CoreConfig | None = None, *, log: SessionLog | None = None,
                 clock: Callable[[], float] | None = None,
                 mint_id: Callable[[str, int], str] | None = None) -> None:
        """P11: queue ``session/created``, ``agent/created {status:'idle'}`` and
        ``agent/session-start {source}`` when publishing (§3.1 (R3.1), §23.2 (S18)).
        §4.7 (R4.7): ``lastTurn`` comes from the seeded log."""
        self.config = config if config is not None else CoreConfig()
        self.log = log if log is not None else SessionLog(clock=clock)
        self._mint = mint_id if mint_id is not None else _default_mint
        # Routing state (§4 (R4)).
        self._queued: list[_Queued] = []
        self._outbox: list[_Staged] = []
        self._busy = False
        self._window = False
        self._owner: int | None = None  # the signal of the current abort owner (§4.4 (R4.4))
        self._wake_pending = False
        self._wake_tick: int | None = None
        self._pending_retry = False
        self._header_logged = False  # §4.8 (R4.8)
        self._prior_failures: list[LlmFailure] = []
        self._disposing = False
        self._disposed = False
        self._failure: ErrorInfo | None = None  # P16: set when the loop stopped
        # The turn being run (§8.1 (R8.1)).
        self._turn = 0
        self._step = 0
        self._step_open = False
        self._reason: dict[str, JsonLike] = {"kind": "completed"}
        self._settle: dict[str, JsonLike] = {"kind": "completed"}
        # Protocol state (P1–P10).
        self._out: list[_Entry] = []
        self._cancel_scope: _Scope | None = None  # P7: the cancel whose notice is observed
        self._effects: dict[int, _EffectRecord] = {}
        self._next_effect = 0
        self._next_signal = 1  # P4 leaves signal ids open; the project numbers them from 1
        # The abort controllers (§4.4 (R4.4), §0.7 (R0.7)) by signal, each with the first
        # cause that aborted it (§16.3 (R16.3)), None while it is not aborted.
        self._aborts: dict[int, CancelCause | None] = {}
        self._mail: list[tuple[int, Completion]] = []
        # The loop's position: its one activity in progress (R4.10) as frames, innermost
        # last, and what the top one waits on.
        self._frames: list[_Frame] = []
        self._waiting: frozenset[int] | None = None
        if self.config.publish:
            self._queue(Live(LiveEvent(SESSION_CREATED, FrozenDict({}))))
            self._queue(Live(LiveEvent(AGENT_CREATED, FrozenDict({"status": "idle"}))))
            self._queue(Live(LiveEvent(SESSION_START,
                                       FrozenDict({"source": self.config.session_start}))))

    # -- copy and state --------------------------------------------------------------------

    def copy(self) -> ModelAgent:
        """R4.12: an independent agent whose future, given the same inputs, is this one's: the log
        forked (`SessionLog.fork`), every mutable container copied (the objects the output
        queue and the cancel scope share stay shared, `_OutputsCopy`), immutable values
        shared. O(state); nothing is replayed."""
        new = object.__new__(ModelAgent)
        new.__dict__.update(self.__dict__)  # the flags, counters and immutable values
        new.log = self.log.fork()
        new._queued = list(self._queued)  # the items are immutable
        new._outbox = list(self._outbox)
        new._prior_failures = list(self._prior_failures)
        new._reason = {key: _json_copy(value) for key, value in self._reason.items()}
        new._settle = {key: _json_copy(value) for key, value in self._settle.items()}
        outputs = _OutputsCopy()
        new._out = [outputs.entry(entry) for entry in self._out]
        new._cancel_scope = outputs.scope(self._cancel_scope)
        new._effects = dict(self._effects)  # the records are immutable
        new._aborts = dict(self._aborts)
        new._mail = list(self._mail)  # the completions are immutable
        new._frames = [frame.copy() for frame in self._frames]
        return new

    def state_parts(self) -> tuple[object, ...]:
        """R4.12: everything the agent's future depends on except its log, as plain values: named
        attributes, the output queue and cancel scope with their sharing spelled out
        (`_OutputsParts`), and the frames as tuples of their fields. Two agents whose futures
        are equal give equal parts (objects are never compared by identity)."""
        outputs = _OutputsParts(self._out)
        return (
            ("queued", tuple((item.message, item.wakeup) for item in self._queued)),
            ("outbox", tuple((item.message, item.steering) for item in self._outbox)),
            ("flags", self._busy, self._window, self._owner, self._wake_pending,
             self._wake_tick, self._pending_retry, self._header_logged, self._disposing,
             self._disposed, self._failure),
            ("prior_failures", tuple(self._prior_failures)),
            ("turn", self._turn, self._step, self._step_open, freeze(self._reason, max_depth=None),
             freeze(self._settle, max_depth=None)),
            ("out", tuple(outputs.entry(entry) for entry in self._out)),
            ("cancel_scope", outputs.scope(self._cancel_scope)),
            ("effects", tuple((i, _plain(record)) for i, record in self._effects.items()),
             self._next_effect),
            ("aborts", tuple(self._aborts.items()), self._next_signal),
            ("mail", tuple(self._mail)),
            ("frames", tuple(frame.parts() for frame in self._frames)),
            ("waiting", None if self._waiting is None else tuple(sorted(self._waiting))),
        )

    # -- read-only state (§4 (R4), §18 (R18), §20.1 (R20.1)) -------------------------------

    @property
    def status(self) -> str:
        """§4.2 (R4.2): ``running`` for the whole running interval, else ``idle``."""
        return "running" if self._busy else "idle"

    @property
    def accepts_next_step(self) -> bool:
        """§4.3 (R4.3): the next-step acceptance window."""
        return self._window

    @property
    def pending_queued(self) -> int:
        """§4.1 (R4.1): the number of items in ``queued``."""
        return len(self._queued)

    @property
    def pending_steering(self) -> int:
        """§4.1 (R4.1): the number of staged steering items in the outbox."""
        return sum(1 for item in self._outbox if item.steering)

    @property
    def pending_context(self) -> int:
        """§4.1 (R4.1): the number of staged context items in the outbox."""
        return sum(1 for item in self._outbox if not item.steering)

    @property
    def wake_pending(self) -> bool:
        """§4.6 (R4.6)."""
        return self._wake_pending

    @property
    def retry_pending(self) -> bool:
        """§4.9 (R4.9)."""
        return self._pending_retry

    @property
    def is_quiescent(self) -> bool:
        """§18 (R18) (project decision for R17, R17.4): not busy, no wake pending, no waking
        item queued."""
        return (not self._busy and not self._wake_pending
                and not any(item.wakeup for item in self._queued))

    @property
    def disposing(self) -> bool:
        """§17 (R17): ``dispose()`` was called and teardown has not completed."""
        return self._disposing and not self._disposed

    @property
    def disposed(self) -> bool:
        """§17.3 (R17.3): teardown has completed."""
        return self._disposed

    @property
    def failure(self) -> ErrorInfo | None:
        """P16: the internal failure that stopped the loop, or None."""
        return self._failure

    @property
    def outstanding_effects(self) -> tuple[int, ...]:
        """P4/P10: ids of effects requested and not yet completed or released."""
        return tuple(i for i, rec in self._effects.items() if not rec.done)

    def signal_reason(self, signal: int) -> CancelCause | None:
        """§16.3 (R16.3): the first cause that aborted a signal, or None."""
        return self._aborts.get(signal)

    # -- output queue (P1, P7, P8) ------------------------------------------------

    def _queue(self, output: Output) -> None:
        """P8: queue an output in FIFO order; P7: an output queued by a command while a
        cancel-requested with pending reports is the last output pulled goes before them."""
        self._insert(_Entry(output=output))

    def _insert(self, entry: _Entry) -> None:
        """P7/P8: the insertion point of a new queue entry."""
        scope = self._cancel_scope
        if scope is not None:  # P7: before what that cancel still has queued
            for index, queued in enumerate(self._out):
                if ((queued.report is not None and queued.reports is scope.reports)
                        or queued is scope.abort):
                    self._out.insert(index, entry)
                    return
        self._out.append(entry)

    def _live(self, type_: str, **payload: JsonLike) -> None:
        """Queue a live notification (§3.1 (R3.1))."""
        frozen = freeze(payload, "payload", max_depth=None)
        assert isinstance(frozen, FrozenDict)
        self._queue(Live(LiveEvent(type_, frozen)))

    def _warn(self, text: str) -> None:
        """§0.8 (R0.8) (project decision): a warning is logged and delivered as ``agent/warning``."""
        logger.warning("%s", text)
        self._live(WARNING, text=text)

    def _append(self, type_: str, data: JsonLike, *, source_event_seqs: Sequence[int] | None = None
                ) -> Event:
        """Append a durable event (§0.1 (R0.1)) and queue it (P1: committed when pulled). Surface
        types carry ``surfaceOp: 'append'`` (§1.21 (E2))."""
        surface = type_ in (USER_MESSAGE, STEERING_MESSAGE, ASSISTANT_MESSAGE, TOOL_RESULT)
        event = self.log.append(type_, data, surface_op="append" if surface else None,
                                source_event_seqs=source_event_seqs)
        self._queue(Durable(event))
        return event

    def _request(self, kind: str, history_end: int | None = None, **payload: JsonLike) -> int:
        """P4: request an effect with a fresh id (0, 1, 2, ... in request order)."""
        effect_id = self._next_effect
        self._next_effect += 1
        self._effects[effect_id] = _EffectRecord(kind)
        frozen = freeze(payload, "payload", max_depth=None)
        assert isinstance(frozen, FrozenDict)
        history = self.log.history(history_end) if history_end is not None else None
        self._queue(Effect(effect_id, kind, frozen, history))
        return effect_id

    def next_output(self) -> Output | None:
        """P1: the next output, or None when the model waits for an input. P8: the loop
        resumes only when every queued output has been pulled."""
        while True:
            if self._out:
                output = self._pull()
                if output is not None:
                    return output
                continue
            if not self._advance():
                return None

    def drain_outputs(self) -> list[Output]:
        """Every output available now (P1)."""
        outputs: list[Output] = []
        while (output := self.next_output()) is not None:
            outputs.append(output)
        return outputs

    def _pull(self) -> Output | None:
        """P1, P7: take the queue's head. A pending report is materialized now and
        dropped if empty. Pulling anything ends a P7 window; pulling a cancel-requested
        opens one for its cancel."""
        entry = self._out.pop(0)
        self._cancel_scope = None
        if entry.report is not None:
            reports = entry.reports
            assert reports is not None
            if entry.report == "inbox":
                messages = reports.queued + reports.steering
                if not messages:
                    return None
                return Live(LiveEvent(INBOX_DISCARD, self._messages_payload(messages)))
            if not reports.context:
                return None
            return Live(LiveEvent(CONTEXT_DISCARD, self._messages_payload(reports.context)))
        if entry.scope is not None:
            self._cancel_scope = entry.scope
            entry.scope.fresh = 0
        assert entry.output is not None
        return entry.output

    @staticmethod
    def _messages_payload(messages: list[Message]) -> FrozenDict:
        frozen = freeze({"messages": [_message_json(m) for m in messages]}, "payload",
                        max_depth=None)
        assert isinstance(frozen, FrozenDict)
        return frozen

    def _advance(self) -> bool:
        """Run the loop one yield point further, if it can (P6, P8). Starts the wake (§6.2 (R6.2))
        and the teardown of a quiescent disposing agent (R17.4, project decision for §17 (R17))."""
        if not self._frames:
            if self._wake_tick is not None:
                tick = self._wake_tick
                self._wake_tick = None
                self._frames = [_Wake(tick)]
                self._waiting = None
            elif self._disposing and not self._disposed and self.is_quiescent:
                self._cancel_scope = None  # P7: the loop moves on, the position is over
                self._teardown()
                return True
            else:
                return False
        sent: Completion | None = None
        if self._waiting is not None:
            found = self._take_mail(self._waiting)
            if found is None:
                return False
            sent = found
        # P7: a pull that finds nothing leaves the position (and a cancel's window) as it is;
        # the loop's next step moves past it
        self._cancel_scope = None
        try:
            yielded = self._resume(sent)
        except BaseException as error:  # P16: the loop cannot go on; the model stops
            self._stop(error)
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise  # P16: an exit goes on to the caller once the model has stopped
            return True
        self._waiting = yielded.effects if isinstance(yielded, _Wait) else None
        return True

    def _resume(self, sent: Completion | None) -> _Wait | None:
        """Run the loop to its next yield point: the top frame's step (`_transition`) with what it
        waited for, and on through the frames it calls and returns to. Returns the `_Wait`
        it stops at, or None when it paused after queuing outputs (P8) or when the last
        frame finished. An exception a step raises is offered to its frame and then to
        each caller in turn (`_catch`: the run and the step catch failures, §8.6 (R8.6),
        §13.2 (R13.2)); a frame that does not catch it ends. One that no frame catches
        goes on to `_advance` (P16)."""
        value: object = sent
        thrown: Exception | None = None
        while self._frames:
            frame = self._frames[-1]
            try:
                if thrown is None:
                    try:
                        signal = self._transition(frame, value)
                    except Exception as error:  # raised by the frame's own step
                        signal = self._catch(frame, error)
                else:  # raised by the frame it called
                    signal = self._catch(frame, thrown)
                    thrown = None
            except Exception as error:  # not caught: the frame ends and its caller gets it
                self._frames.pop()
                thrown = error
                continue
            if isinstance(signal, _Return):
                value = signal.value
            elif signal is _Yield.CALL:
                value = None
            elif signal is _Yield.PAUSE:
                return None
            else:
                assert isinstance(signal, _Wait)
                return signal
        if thrown is not None:
            raise thrown
        return None

    def _transition(self, frame: _Frame, sent: object) -> _Signal:
        """The step function of the frame's activity: it goes on from ``frame.phase`` with
        *sent* (the completion waited for, or the return value of the frame it called)."""
        match frame:
            case _Wake():
                return self._wake(frame, sent)
            case _ContinueOrIdle():
                return self._continue_or_idle(frame, sent)
            case _Admission():
                return self._admission(frame, sent)
            case _RejectAdmission():
                return self._reject_admission(frame, sent)
            case _RejectedTick():
                return self._rejected_tick(frame, sent)
            case _Chain():
                return self._chain(frame, sent)
            case _Flush():
                return self._flush(frame, sent)
            case _Run():
                return self._run(frame, sent)
            case _Closing():
                return self._closing(frame, sent)
            case _StepLoop():
                return self._step_loop(frame, sent)
            case _Fail():
                return self._fail(frame, sent)
            case _Classify():
                return self._classify(frame, sent)
            case _Drain():
                return self._drain(frame, sent)
            case _Step():
                return self._run_step(frame, sent)
            case _BuildRequest():
                return self._build_request(frame, sent)
            case _Stream():
                return self._stream(frame, sent)
            case _RequestFailure():
                return self._request_failure(frame, sent)
            case _Batch():
                return self._batch(frame, sent)
            case _StartCall():
                return self._start(frame, sent)
            case _AwaitStage():
                return self._await_stage(frame, sent)
            case _Commit():
                return self._commit(frame, sent)
        raise AssertionError(f"no step for {type(frame).__name__}")

    def _catch(self, frame: _Frame, error: Exception) -> _Signal:
        """Whether *frame*, in its phase, catches *error* (raised by its own step or by a frame
        it called): the run fails the turn (§8.6 (R8.6)), the step handles a request failure
        of its stream (§13.2 (R13.2)). Re-raises it otherwise."""
        if isinstance(frame, _Run) and frame.phase in _Run.GUARDED:
            ending = (error.ending if isinstance(error, _Stop)  # P16: an internal failure fails
                      else _Ending("generic", internal_error(error)))  # the turn (§15.3 (R15.3))
            frame.phase = "failed"
            return self._call(_Fail(frame.signal, ending))
        if (isinstance(frame, _Step) and frame.phase == "streamed" and isinstance(error, _Stop)
                and error.ending.kind == "request"):
            frame.phase = "request-failed"
            return self._call(_RequestFailure(frame.signal, error.ending, frame.prepared))
        raise error

    def _call(self, child: _Frame) -> _Signal:
        """Push *child*; it runs at once (its caller has set the phase it resumes at, with the
        child's return value)."""
        self._frames.append(child)
        return _Yield.CALL

    def _return(self, value: object = None) -> _Signal:
        """Finish the top frame; its caller resumes with *value*."""
        self._frames.pop()
        return _Return(value)

    def _tool_batch(self) -> _Batch:
        """The tool batch the top frames work for: the innermost `_Batch` frame."""
        for frame in reversed(self._frames):
            if isinstance(frame, _Batch):
                return frame
        raise AssertionError("no tool batch is running")

    def _stop(self, error: BaseException) -> None:
        """P16: the loop failed outside any turn it could still fail in order: the model
        stops. Nothing is waited for any more (the outstanding effects are abandoned:
        their completions are accepted and dropped); a disposing agent discards what is
        queued (§17 (R17)); busy, the window and a pending wake or retry are cleared;
        ``agent/error`` names the failure, then ``idle`` if the agent was busy."""
        info = internal_error(error)
        self._failure = info
        self._frames = []
        self._waiting = None
        self._mail = []
        for effect_id, record in list(self._effects.items()):
            if not record.done:
                self._effects[effect_id] = replace(record, done=True, abandoned=True)
        self._wake_pending = False
        self._wake_tick = None
        self._owner = None
        self._pending_retry = False
        self._cancel_scope = None  # P7: no cancel is being delivered any more
        if self._disposing:
            self._cancel(CancelCause("disposed"), keep_inbox=False)
        was_busy = self._busy
        self._busy = False
        self._window = False
        self._live(ERROR, turn=self._turn, step=self._step, error=info.to_json())
        if was_busy:
            self._live(STATUS, status="idle")

    def _take_mail(self, effects: frozenset[int]) -> Completion | None:
        """P6: buffered completions are consumed in arrival order among the effects the
        loop waits on; the others stay buffered."""
        for index, (effect_id, completion) in enumerate(self._mail):
            if effect_id in effects:
                del self._mail[index]
                return completion
        return None

    # -- completions (P4, P6, P10) --------------------------------------------------

    def _record(self, effect: int) -> _EffectRecord:
        """P10: the effect must have been requested and not be completed or released."""
        record = self._effects.get(effect) if type(effect) is int else None
        if record is None:
            raise ProtocolError(f"effect {shown(effect)} was never requested")
        if record.abandoned:
            return record
        if record.done:
            raise ProtocolError(f"effect {effect} was already completed or released")
        return record

    def resolve(self, effect: int, value: JsonLike = None) -> None:
        """P4, P6, P10: buffer a ``resolve``; refused for a model effect."""
        record = self._record(effect)
        if record.abandoned:  # P16: accepted and dropped
            self._effects[effect] = replace(record, abandoned=False)
            return
        if record.kind == MODEL:
            raise ProtocolError(f"effect {effect} is a model call: use chunk/end or raise")
        self._effects[effect] = replace(record, done=True)
        self._mail.append((effect, Resolve(effect, snapshot(value))))  # V6: taken at the call

    def fail(self, effect: int, error: ErrorInfo) -> None:
        """P4, P6, P10: buffer a ``raise``; the error must be an ErrorInfo."""
        if not isinstance(error, ErrorInfo):
            raise ProtocolError("raise needs an ErrorInfo")
        error = ErrorInfo.checked(error)  # V2, V15: checked however it was built
        record = self._record(effect)
        if record.abandoned:  # P16
            self._effects[effect] = replace(record, abandoned=False)
            return
        self._effects[effect] = replace(record, done=True)
        self._mail.append((effect, Raise(effect, error)))

    def chunk(self, effect: int, chunk: JsonLike) -> None:
        """P4, P6, P10: buffer a model chunk."""
        record = self._record(effect)
        if record.abandoned:  # P16: the stream goes on; its chunks are dropped
            return
        if record.kind != MODEL:
            raise ProtocolError(f"effect {effect} is not a model call")
        self._mail.append((effect, Chunk(effect, snapshot(chunk))))  # V6: taken at the call

    def end(self, effect: int) -> None:
        """P4, P6, P10: buffer the end of a model stream."""
        record = self._record(effect)
        if record.abandoned:  # P16
            self._effects[effect] = replace(record, abandoned=False)
            return
        if record.kind != MODEL:
            raise ProtocolError(f"effect {effect} is not a model call")
        self._effects[effect] = replace(record, done=True)
        self._mail.append((effect, End(effect)))

    def _release(self, effect: int) -> None:
        """P5: stop consuming a model stream: count the effect as completed, drop its
        buffered chunks and queue ``release`` -- unless the environment had already
        completed the stream (``end`` or ``raise`` received): then nothing is queued (P5)."""
        record = self._effects[effect]
        already_complete = record.done
        self._effects[effect] = replace(record, done=True)
        self._mail = [(i, c) for i, c in self._mail if i != effect]
        if not already_complete:
            self._queue(Control("release", FrozenDict({"effect": effect})))

    def feed(self, item: Input) -> None:
        """P9: apply one input."""
        if isinstance(item, Send):
            self.send(item.message, item.options)
        elif isinstance(item, Cancel):
            self.cancel(item.cause, item.keep_inbox)
        elif isinstance(item, Dispose):
            self.dispose()
        elif isinstance(item, Observer):
            pass  # P14, §0.1 (R0.1) "contained", D7: observers run after commit; nothing to do here
        elif isinstance(item, Append):
            self.append(item.type, item.data, surface_op=item.surface_op,
                        source_event_seqs=item.source_event_seqs, ignorable=item.ignorable)
        elif isinstance(item, Resolve):
            self.resolve(item.effect, item.value)
        elif isinstance(item, Raise):
            self.fail(item.effect, item.error)
        elif isinstance(item, Chunk):
            self.chunk(item.effect, item.chunk)
        elif isinstance(item, End):
            self.end(item.effect)
        else:  # P9, P10: only the inputs of P9
            raise ProtocolError(f"not an input: {shown(item)}")

    # -- commands (§5 (R5), §16 (R16), §17 (R17), P3, P7) ----------------------------------

    def _check_not_disposed(self) -> None:
        """§17.3 (R17.3), P10: after teardown every command but dispose raises."""
        if self._disposed:
            raise DisposedError("the agent is disposed")
        if self._failure is not None:  # P16
            raise CoreFailedError(f"the core stopped after an internal failure "
                                  f"({self._failure.message}); only dispose() may be called")

    def send(self, message: JsonLike, options: JsonLike) -> None:
        """§5 (R5): validate options then message (§5.1 (R5.1), D5), snapshot, route by the
        window only (§5.2 (R5.2), §5.3 (R5.3), §5.6 (R5.6)), request a wake before the
        enqueue notification (§5.4 (R5.4), §6.1 (R6.1)), announce (§5.5 (R5.5)). P7: input
        accepted while a cancel-requested is the last output pulled is moved into that
        cancel's pending reports."""
        self._check_not_disposed()
        opts = SendOptions.from_json(snapshot(options))  # V6: the arguments are taken first
        msg = validate_user_message(snapshot(message))
        if opts.target == "next-step" and not opts.wakeup:  # inject (§5.2 (R5.2))
            if self._window:
                self._outbox.append(_Staged(msg, steering=False))
                reports = self._scope_reports()
                if reports is not None:
                    self._outbox.pop()
                    reports.context.append(msg)
            else:
                self._command_append(USER_MESSAGE, _message_json(msg), "append")
            return
        placement = "steering" if opts.target == "next-step" and self._window else "queued"
        if placement == "steering":
            self._outbox.append(_Staged(msg, steering=True))
        else:
            self._queued.append(_Queued(msg, opts.wakeup))
            if opts.wakeup:
                self._request_wake()
        self._live(INBOX_ENQUEUE, message=_message_json(msg), placement=placement)
        reports = self._scope_reports()
        if reports is not None:
            if placement == "steering":
                self._outbox.pop()
                reports.steering.append(msg)
            else:
                self._queued.pop()
                reports.queued.append(msg)

    def _scope_reports(self) -> _Reports | None:
        """P7: while a cancel's notice with pending reports is observed, accepted input is
        cleared by that cancel (counted as fresh, D9)."""
        scope = self._cancel_scope
        if scope is None or scope.reports is None:
            return None
        scope.fresh += 1
        return scope.reports

    def followup(self, message: JsonLike) -> None:
        """§1.8 (V10): next-turn + wakeup."""
        self.send(message, SendOptions("next-turn", True))

    def steer(self, message: JsonLike) -> None:
        """§1.8 (V10): next-step + wakeup."""
        self.send(message, SendOptions("next-step", True))

    def inject(self, message: JsonLike) -> None:
        """§1.8 (V10): next-step without wakeup."""
        self.send(message, SendOptions("next-step", False))

    def _request_wake(self) -> None:
        """§6.1 (R6.1): ignored while busy or while a wake is pending; otherwise set
        ``wakePending`` and request the tick (P4 ``tick {purpose:'wake'}``)."""
        if self._busy or self._wake_pending:
            return
        self._wake_pending = True
        self._wake_tick = self._request(TICK, purpose="wake")

    def cancel(self, cause: JsonLike, keep_inbox: bool = False) -> None:
        """§16 (R16), §1.10 (V11): validate the cause ({kind:'user'} or {kind:'parent'}), then
        cancel."""
        self._check_not_disposed()
        parsed = CancelCause.from_json(snapshot(cause))
        if not isinstance(keep_inbox, bool):
            raise ValidationError("keepInbox", "must be a bool")
        self._cancel(parsed, keep_inbox)

    def _cancel(self, cause: CancelCause, keep_inbox: bool) -> None:
        """§16.1 (R16.1) effectiveness; §16.2 steps 1–4 (R16.2.1–R16.2.4) (P7: all at once,
        reports pending); §16.3 (R16.3) first cause wins; D2 drops a pending retry; D6
        context report; a cancel issued while another one's notice is observed joins it
        (P7, D9)."""
        if self._cancel_scope is not None:
            self._join(self._cancel_scope, cause, keep_inbox)
            return
        effective = (self._owner is not None or self._pending_retry
                     or (not keep_inbox and (bool(self._queued) or bool(self._outbox))))
        if not effective:
            return
        scope = _Scope(reports=None)
        if not keep_inbox:
            scope.reports = self._take_everything()
        if cause.kind != "disposed":
            self._insert(_Entry(output=self._cancel_notice(cause), scope=scope))
        if scope.reports is not None:
            self._insert(_Entry(report="inbox", reports=scope.reports))
            self._insert(_Entry(report="context", reports=scope.reports))
        self._pending_retry = False
        owner = self._owner
        if owner is not None and self._aborts[owner] is None:  # §16.3 (R16.3): the first cause wins
            self._aborts[owner] = cause
            scope.abort = _Entry(output=self._abort_notice(owner, cause))
            self._insert(scope.abort)

    def _join(self, scope: _Scope, cause: CancelCause, keep_inbox: bool) -> None:
        """§16.2 step 1 (R16.2.1) read literally (P7): a cancel issued by an observer of another
        cancel's notice runs before that cancel clears and aborts, so it is the one that
        aborts (its cause is the reason). D9: it does anything only if it has something new
        to clear: the input accepted at this position, when that cancel cleared (it is in
        its reports already), or whatever is queued or staged, when it kept the inbox."""
        if keep_inbox:
            return
        if scope.reports is not None:
            if scope.fresh == 0:
                return
            scope.fresh = 0
            if cause.kind != "disposed":
                self._insert(_Entry(output=self._cancel_notice(cause), scope=scope))
        else:
            if not (self._queued or self._outbox):
                return
            if cause.kind != "disposed":
                self._insert(_Entry(output=self._cancel_notice(cause), scope=scope))
            taken = self._take_everything()
            # its reports go where the first cancel's abort is still queued, but never ahead
            # of the enqueue notice of an item they list (accepted after the first cancel)
            listed = {m.id for m in taken.queued + taken.steering + taken.context}
            at = next((i for i, queued in enumerate(self._out) if queued is scope.abort),
                      len(self._out))
            for index, queued in enumerate(self._out):
                output = queued.output
                if isinstance(output, Live) and output.event.type == INBOX_ENQUEUE:
                    announced = output.event.payload.get("message")
                    if isinstance(announced, FrozenDict) and announced.get("id") in listed:
                        at = max(at, index + 1)
            self._out[at:at] = [_Entry(report="inbox", reports=taken),
                                _Entry(report="context", reports=taken)]
            scope.reports = taken
        self._pending_retry = False
        if scope.abort is not None and self._owner is not None:
            self._aborts[self._owner] = cause
            scope.abort.output = self._abort_notice(self._owner, cause)

    def _take_everything(self) -> _Reports:
        """§16.2 step 2 (R16.2.2): take every queued item, then the staged steering, then the staged
        context, each in FIFO order, and empty both lists."""
        reports = _Reports(
            queued=[item.message for item in self._queued],
            steering=[item.message for item in self._outbox if item.steering],
            context=[item.message for item in self._outbox if not item.steering])
        self._queued = []
        self._outbox = []
        return reports

    @staticmethod
    def _cancel_notice(cause: CancelCause) -> Output:
        payload = freeze({"cause": cause.to_json()}, "payload", max_depth=None)
        assert isinstance(payload, FrozenDict)
        return Live(LiveEvent(CANCEL_REQUESTED, payload))

    @staticmethod
    def _abort_notice(signal: int, cause: CancelCause) -> Output:
        return Control("abort", FrozenDict({"signal": signal,
                                            "reason": FrozenDict(cause.to_json())}))

    def dispose(self) -> None:
        """§17.1 step 1 (R17.1.1) (project decision): ``cancel({kind:'disposed'})`` at once, with no
        cancel-requested, and mark the agent disposing. A no-op after teardown (§17.3 (R17.3))."""
        if self._disposed:
            return
        self._disposing = True
        self._cancel(CancelCause("disposed"), keep_inbox=False)

    def append(self, type: str, data: JsonLike, *, surface_op: JsonLike = None,
               source_event_seqs: Sequence[int] | None = None, ignorable: bool = False) -> Event:
        """P3: a direct append by extension code, checked before commit (§20.2 (R20.2), D7);
        *ignorable* marks an extension event a resuming build may not read (D16)."""
        self._check_not_disposed()
        if isinstance(type, str):
            type = str.__str__(type)
        if self._busy and isinstance(type, str) and type in (
                TURN_START, TURN_END, STEP_START, STEP_END, ASSISTANT_CHUNK, ASSISTANT_MESSAGE,
                TOOL_CALL, TOOL_RESULT):
            # R20.4: while busy, the loop alone writes the records of its turns; a refusal
            # of the log's own comes first.
            self.log.check(type, data, surface_op=surface_op, source_event_seqs=source_event_seqs,
                           ignorable=ignorable)
            raise InvariantError("R20.4", f"{type} is written by the loop itself: a direct "
                                 "append of it is refused while the agent is busy")
        return self._command_append(type, data, surface_op, source_event_seqs, ignorable)

    def _command_append(self, type_: str, data: JsonLike, surface_op: JsonLike = None,
                        source_event_seqs: Sequence[int] | None = None,
                        ignorable: bool = False) -> Event:
        """P3, P16: a command's append; a failure of it other than the log's own refusal is
        raised as an InvariantError (nothing was appended)."""
        try:
            event = self.log.append(type_, data, surface_op=surface_op,
                                    source_event_seqs=source_event_seqs, ignorable=ignorable)
        except (TurnstileError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:
            raise InvariantError("L2", f"{type_}: nothing was appended: "
                                 f"{failure_text(error)}") from error
        self._queue(Durable(event))
        return event

    # -- teardown (§17 (R17), project decision R17.4) --------------------------------------

    def _teardown(self) -> None:
        """§17.1 step 3 (R17.1.3) (project decision, R17.4): report what the inbox and outbox
        still hold (inbox discard, then context discard; no cancel-requested), then
        ``agent/disposed`` and ``session/disposed``; from now on commands raise."""
        dropped = [item.message for item in self._queued] + \
            [item.message for item in self._outbox if item.steering]
        contexts = [item.message for item in self._outbox if not item.steering]
        self._queued = []
        self._outbox = []
        if dropped:
            self._queue(Live(LiveEvent(INBOX_DISCARD, self._messages_payload(dropped))))
        if contexts:
            self._queue(Live(LiveEvent(CONTEXT_DISCARD, self._messages_payload(contexts))))
        self._live(AGENT_DISPOSED)
        self._live(SESSION_DISPOSED)
        self._disposed = True

    # -- the loop: wake and continue-or-idle (§6 (R6), §7.1 (R7.1), §12.7 (R12.7)) ---------
    #
    # Each step function below goes on from its frame's phase to the next yield point:
    # ``return PAUSE`` after queuing outputs (P8), ``return _Wait(...)`` to wait on effects,
    # ``return self._call(child)`` to run a child frame (the phase set just before says
    # where the frame resumes, with the child's result), ``return self._return(value)`` to
    # finish. A phase's code that does not end in one of these falls through to the next
    # phase's code. A step sets its frame's phase only as it returns, so a failure raised
    # in its code leaves the phase where the step started (`_catch` reads it).

    def _new_controller(self) -> int:
        """§4.4 (R4.4): a fresh controller with its own signal."""
        signal = self._next_signal
        self._next_signal += 1
        self._aborts[signal] = None
        return signal

    def _aborted(self, signal: int) -> bool:
        """§0.7 (R0.7): whether the controller of *signal* is aborted."""
        return self._aborts[signal] is not None

    def _has_waking(self) -> bool:
        """§7.1 (R7.1): at least one waking item is queued."""
        return any(item.wakeup for item in self._queued)

    def _wake(self, frame: _Wake, sent: object) -> _Signal:
        """§6.2 (R6.2): wait for the tick; clear ``wakePending``; claim if not busy and a waking
        item is queued, otherwise do nothing."""
        if frame.phase == "start":
            frame.phase = "await-tick"
            return _Wait(frozenset({frame.tick}))
        if frame.phase == "await-tick":
            self._wake_pending = False
            frame.phase = "done"
            return self._call(_ContinueOrIdle())
        return self._return()  # "done"

    def _continue_or_idle(self, frame: _ContinueOrIdle, sent: object) -> _Signal:
        """§12.7 (R12.7) (and the wake's claim, §6.2 (R6.2)): claim the head of ``queued``
        while a waking item is queued, within one running interval; otherwise clear ``busy``
        and emit ``idle`` (only if busy). While disposing, never claim (R17.4, the project
        decision for §17.1 step 2 (R17.1.2)): a waking item found here is discarded by
        ``cancel(disposed)`` and the loop "then finds nothing" at once -- before that
        cancel's discard notifications are delivered."""
        if frame.phase == "idle-delivered":
            return self._return()
        # "claim": after each admission the loop comes back here
        if self._disposing and self._has_waking():
            self._cancel(CancelCause("disposed"), keep_inbox=False)
        if self._has_waking():
            frame.phase = "claim"
            return self._call(_Admission(self._queued.pop(0).message))  # §7.2 (R7.2): the claim
        if self._busy:
            self._busy = False
            self._live(STATUS, status="idle")
            frame.phase = "idle-delivered"
            return PAUSE
        return self._return()

    # -- admission (§7 (R7)) ---------------------------------------------------------------

    def _admission(self, frame: _Admission, sent: object) -> _Signal:
        """§7.2–§7.11 (R7.2–R7.11): with the head of ``queued`` claimed, run prompt-submit, then
        the run (allowed) or the rejected path."""
        if frame.phase == "start":
            frame.inherited = len(self._outbox)
            frame.signal = self._new_controller()  # §7.3 (R7.3)
            self._owner = frame.signal
            self._window = True
            frame.phase = "running"
            if not self._busy:  # §7.4 (R7.4)
                self._busy = True
                self._live(STATUS, status="running")
                return PAUSE
        if frame.phase == "running":
            if self._aborted(frame.signal):  # §7.5 (R7.5): rejected, prompt-submit not invoked
                # P15, as the original orders it: the admission body runs on to its yield (the
                # owner released, §7.8 (R7.8); §7.10 steps 1–2 (R7.10.1–R7.10.2)) before the
                # claim emits the dequeue notice, and the tick of that yield is requested after
                # the notice.
                self._owner = None
                frame.phase = "rejected-early"
                return self._call(_RejectAdmission())
            frame.effect = self._request(PROMPT_SUBMIT, message=_message_json(frame.claimed),
                                         signal=frame.signal)
            frame.phase = "dequeue"
            return PAUSE
        if frame.phase == "rejected-early":
            self._live(INBOX_DEQUEUE, message=_message_json(frame.claimed), placement="queued")
            frame.phase = "rejected"
            return PAUSE
        if frame.phase == "dequeue":
            self._live(INBOX_DEQUEUE, message=_message_json(frame.claimed),
                       placement="queued")  # §7.6 (R7.6)
            frame.phase = "prompt-submit-requested"
            return PAUSE
        if frame.phase == "prompt-submit-requested":
            frame.phase = "await-prompt-submit"
            return _Wait(frozenset({frame.effect}))
        if frame.phase == "await-prompt-submit":
            admitted, warned = self._decide(frame.signal, frame.claimed, sent)
            frame.admitted = admitted
            frame.phase = "decided"
            if warned:
                return PAUSE
        if frame.phase == "decided":
            self._owner = None  # §7.8 (R7.8)
            if frame.admitted is not None:  # §7.9 (R7.9)
                trigger = FrozenDict({"kind": "message", "source": frame.claimed.source})
                frame.phase = "done"
                return self._call(_Chain(trigger, frame.admitted, frame.inherited))
            frame.phase = "rejected"  # §7.10 (R7.10): steps 1–2, then the tick
            return self._call(_RejectAdmission())
        if frame.phase == "rejected":
            frame.phase = "done"
            return self._call(_RejectedTick())
        return self._return()  # "done"

    def _decide(self, signal: int, claimed: Message, completion: object
                ) -> tuple[tuple[Message, ...] | None, bool]:
        """§7.7 (R7.7), §7.11 (R7.11): the admitted list ``[prompt] + additionalContexts``, or
        None when the outcome is rejected (aborted: no warning; raise or invalid decision: a
        warning); and whether a warning was queued."""
        if self._aborted(signal):
            return None, False
        if isinstance(completion, Raise):
            self._warn(f"prompt admission failed: {completion.error.rendered()}")
            return None, True
        assert isinstance(completion, Resolve)
        try:
            decision = decision_from_json(completion.value)
        except ValidationError as exc:
            self._warn(f"prompt admission returned an invalid decision: {exc}")
            return None, True
        if not isinstance(decision, Allow):
            return None, False
        prompt = claimed
        if decision.content is not None:
            prompt = Message(id=claimed.id, role=claimed.role, content=decision.content,
                             source=claimed.source)
        return (prompt, *decision.additional_contexts), False

    def _reject_admission(self, frame: _RejectAdmission, sent: object) -> _Signal:
        """§7.10 steps 1–2 (R7.10.1–R7.10.2): close the window; append staged context between
        turns unless any steering is staged."""
        if frame.phase == "close":
            self._window = False
            if any(item.steering for item in self._outbox):
                return self._return()
            frame.phase = "write"
        if frame.phase == "write" and self._outbox:
            try:
                self._append(USER_MESSAGE, _message_json(self._outbox[0].message))
            except Exception as error:  # P16: the context stays staged
                self._warn("staged context could not be written: "
                           f"{failure_text(error)}")
                frame.phase = "done"
                return PAUSE
            self._outbox.pop(0)
            return PAUSE
        return self._return()  # "write" with nothing staged, or "done"

    def _rejected_tick(self, frame: _RejectedTick, sent: object) -> _Signal:
        """§7.10 step 3 (R7.10.3): one tick; then continue-or-idle (in the caller)."""
        if frame.phase == "start":
            frame.tick = self._request(TICK, purpose="rejected-admission")
            frame.phase = "tick-requested"
            return PAUSE
        if frame.phase == "tick-requested":
            frame.phase = "await-tick"
            return _Wait(frozenset({frame.tick}))
        return self._return()  # "await-tick"

    # -- chain: run, flush, retry, settle (§8 (R8), §12.4–§12.6 (R12.4–R12.6), §13.3 (R13.3))

    def _chain(self, frame: _Chain, sent: object) -> _Signal:
        """§8.8 (R8.8), §12.4–§12.6 (R12.4–R12.6), §13.3 (R13.3): run the turn, flush; a
        pending retry starts the retry run (no settled, no status change); otherwise emit
        ``agent/settled``."""
        if frame.phase == "start":
            self._prior_failures = []
            frame.phase = "run"
        if frame.phase == "ran":
            if not sent:  # P16: no turn, so nothing to flush or settle
                return self._return()
            frame.phase = "flushed"
            return self._call(_Flush())
        if frame.phase == "flushed":
            if self._pending_retry:  # §12.5 (R12.5)
                self._pending_retry = False
                frame.trigger, frame.admitted, frame.inherited = FrozenDict({"kind": "retry"}), (), 0
                frame.phase = "run"
            else:
                self._live(SETTLED, turn=self._turn, reason=self._settle)
                frame.phase = "settled"
                return PAUSE
        if frame.phase == "run":
            frame.phase = "ran"
            return self._call(_Run(frame.trigger, frame.admitted, frame.inherited))
        return self._return()  # "settled"

    def _flush(self, frame: _Flush, sent: object) -> _Signal:
        """§12.4 (R12.4): await the flush barrier; a failure is a warning plus ``agent/error`` and
        the work goes on."""
        if frame.phase == "start":
            frame.effect = self._request(FLUSH, turn=self._turn)
            frame.phase = "flush-requested"
            return PAUSE
        if frame.phase == "flush-requested":
            frame.phase = "await-flush"
            return _Wait(frozenset({frame.effect}))
        if frame.phase == "await-flush":
            if isinstance(sent, Raise):
                self._warn(f"session flush failed at turn {self._turn}: {sent.error.rendered()}")
                frame.error = sent.error
                frame.phase = "warned"
                return PAUSE
            return self._return()
        if frame.phase == "warned":
            assert frame.error is not None
            self._live(ERROR, turn=self._turn, step=self._step, error=frame.error.to_json())
            frame.error = None
            frame.phase = "reported"
            return PAUSE
        return self._return()  # "reported"

    def _run(self, frame: _Run, sent: object) -> _Signal:
        """§8.1–§8.7 (R8.1–R8.7): one turn; returns False when its turn/start could not be
        written (P16). Failures raised in the phases of `_Run.GUARDED` fail the turn (`_catch`)."""
        if frame.phase == "start":
            frame.signal = self._new_controller()  # §8.1 (R8.1)
            self._owner = frame.signal
            self._window = True
            self._turn = self.log.last_turn + 1
            self._reason = {"kind": "completed"}
            self._settle = {"kind": "completed"}
            self._step = 0
            self._step_open = False
            try:
                self._append(TURN_START, {"turn": self._turn, "trigger": frame.trigger})  # §8.2 (R8.2)
            except Exception as error:
                # P16 case 3: the log refused the turn/start (a direct append left a turn open):
                # there is no turn; agent/error at step 0, and continue-or-idle as after a
                # rejected admission.
                self._window = False
                self._owner = None
                self._pending_retry = False
                self._live(ERROR, turn=self._turn, step=0, error=internal_error(error).to_json())
                frame.phase = "no-turn"
                return PAUSE
            frame.phase = "turn-started"
            return PAUSE
        if frame.phase == "no-turn":
            return self._return(False)
        if frame.phase == "turn-started":
            limit = min(frame.inherited, len(self._outbox))  # §8.3 step 1 (R8.3.1)
            frame.phase = "admit"
            return self._call(_Drain(limit))
        if frame.phase == "admit":
            if frame.next_admitted < len(frame.admitted):  # §8.3 step 2 (R8.3.2)
                self._append(USER_MESSAGE, _message_json(frame.admitted[frame.next_admitted]))
                frame.next_admitted += 1
                return PAUSE
            self._check(frame.signal)  # §8.3 step 3 (R8.3.3)
            frame.phase = "drained"
            return self._call(_Drain(None))  # §8.3 step 4 (R8.3.4)
        if frame.phase == "drained":
            frame.phase = "stepped"
            return self._call(_StepLoop(frame.signal))
        if frame.phase in ("stepped", "failed"):  # the step loop returned, or _Fail did
            self._window = False  # §8.7 (R8.7)
            frame.phase = "closed"
            return self._call(_Closing(frame.signal, TURN_END))
        self._owner = None
        return self._return(True)

    def _closing(self, frame: _Closing, sent: object) -> _Signal:
        """P16: ``step/end`` or ``turn/end`` closing the turn. A refusal by the log becomes
        the turn's failure (§15 (R15)) and the append is tried once more; a second refusal
        propagates (and stops the model)."""
        if frame.phase == "closed":
            return self._return()
        if frame.phase == "append":
            try:
                self._append(frame.type, self._closing_data(frame.type))
            except Exception as error:
                frame.phase = "append-again"
                return self._call(_Classify(frame.signal,
                                            _Ending("generic", internal_error(error))))
        else:  # "append-again", once classified
            self._append(frame.type, self._closing_data(frame.type))
        if frame.type == STEP_END:
            self._step_open = False
        frame.phase = "closed"
        return PAUSE

    def _closing_data(self, type_: str) -> dict[str, JsonLike]:
        """The data of the closing ``turn/end`` or ``step/end``, as it is now."""
        if type_ == TURN_END:
            return {"turn": self._turn, "reason": self._reason}
        return {"turn": self._turn, "step": self._step}

    def _check(self, signal: int) -> None:
        """§0.7 (R0.7): a signal check on an aborted signal raises an abort inside the loop."""
        if self._aborted(signal):
            raise _Stop("abort")

    def _step_loop(self, frame: _StepLoop, sent: object) -> _Signal:
        """§8.4 (R8.4), §8.5 (R8.5): steps until the turn ends."""
        while True:
            if frame.phase == "step":
                self._step += 1
                frame.phase = "stepped"
                return self._call(_Step(frame.signal))
            if frame.phase == "stepped":
                outcome = sent
                if outcome is None:  # a request failure was handled (§13.2 step 5 (R13.2.5))
                    return self._return()
                assert isinstance(outcome, _StepOutcome)
                self._prior_failures = []  # §13.4 (R13.4)
                if outcome.max_tokens:  # §14.3 (R14.3)
                    self._reason = {"kind": "max-tokens"}
                if outcome.concluded:
                    # §8.4 (R8.4): a concluding result leaves the loop at once, with no signal
                    # check (a cancel at that step/end does not change the reason, as in the
                    # original).
                    return self._return()
                if outcome.continue_turn or any(item.steering for item in self._outbox):
                    frame.phase = "step"
                    continue
                frame.effect = self._request(TURN_STOPPING, turn=self._turn,  # §8.5 (R8.5)
                                             signal=frame.signal)
                frame.phase = "turn-stopping-requested"
                return PAUSE
            if frame.phase == "turn-stopping-requested":
                frame.phase = "await-turn-stopping"
                return _Wait(frozenset({frame.effect}))
            if frame.phase == "await-turn-stopping":
                if isinstance(sent, Raise):
                    raise _raised(sent.error)
                self._check(frame.signal)
                frame.phase = "drained"
                return self._call(_Drain(None))
            # "drained"
            if not sent:  # §8.5 (R8.5): no steering taken: leave the loop (no further check)
                return self._return()
            frame.phase = "step"

    def _fail(self, frame: _Fail, sent: object) -> _Signal:
        """§8.6 (R8.6): close an open step, then classify (§15 (R15))."""
        if frame.phase == "start":
            frame.phase = "classify"
            if self._step_open:
                return self._call(_Closing(frame.signal, STEP_END))
        if frame.phase == "classify":
            frame.phase = "done"
            return self._call(_Classify(frame.signal, frame.ending))
        return self._return()  # "done"

    def _classify(self, frame: _Classify, sent: object) -> _Signal:
        """§15.1–§15.3 (R15.1–R15.3): abort, request failure or other failure; set the durable
        and the settle reason and emit ``agent/error`` unless aborted."""
        if frame.phase == "reported":
            return self._return()
        reason = self._aborts[frame.signal]
        if reason is not None:  # §15.1 (R15.1)
            kind = "disposed" if reason.kind == "disposed" else "aborted"
            self._reason = {"kind": kind}
            self._settle = {"kind": "aborted"}
            return self._return()
        ending = frame.ending
        error = ending.error
        assert error is not None
        if ending.kind == "request":  # §15.2 (R15.2)
            failure = ending.failure
            assert failure is not None
            self._reason = {"kind": "error", "step": self._step,
                            "failure": failure.with_message(error.rendered()).to_json()}
            self._settle = {"kind": "error", "error": error.to_json(),
                            "failure": self._reason["failure"]}
        else:  # §15.3 (R15.3)
            self._reason = {"kind": "error", "step": self._step, "message": error.rendered()}
            if error.code is not None:
                self._reason["code"] = error.code
            self._settle = {"kind": "error", "error": error.to_json()}
        self._live(ERROR, turn=self._turn, step=self._step, error=error.to_json())
        frame.phase = "reported"
        return PAUSE

    # -- drains (§11 (R11)) ----------------------------------------------------------------

    def _drain(self, frame: _Drain, sent: object) -> _Signal:
        """§11.1 (R11.1): take outbox items from the front until it is empty (a fixed point, D3) or
        the limit is taken (the inherited drain, §8.3 step 1 (R8.3.1)). Steering: dequeue
        notification, then ``steering/message``; context: ``user/message``. Returns
        whether any steering item was taken."""
        if frame.phase == "dequeued":
            assert frame.message is not None
            self._append(STEERING_MESSAGE, {"turn": self._turn,
                                            "message": _message_json(frame.message)})
            frame.message = None
            frame.phase = "next"
            return PAUSE
        # "next"
        if self._outbox and (frame.limit is None or frame.taken < frame.limit):
            staged = self._outbox[0]
            frame.taken += 1
            if staged.steering:
                self._outbox.pop(0)
                frame.took_steering = True
                self._live(INBOX_DEQUEUE, message=_message_json(staged.message),
                           placement="steering")
                frame.message = staged.message
                frame.phase = "dequeued"
                return PAUSE
            self._append(USER_MESSAGE, _message_json(staged.message))
            self._outbox.pop(0)  # P16: taken once written (a refusal leaves it staged)
            return PAUSE
        return self._return(frame.took_steering)

    # -- step (§9 (R9)) --------------------------------------------------------------------

    def _run_step(self, frame: _Step, sent: object) -> _Signal:
        """§9.1–§9.10 (R9.1–R9.10): one step. Returns None after a request failure was handled
        (§13.2 (R13.2), `_catch`), else the step's `_StepOutcome`."""
        if frame.phase == "start":
            frame.turn, frame.step = self._turn, self._step
            frame.effect = self._request(STEP_HOOK, turn=frame.turn, step=frame.step,
                                         signal=frame.signal)  # §9.1 (R9.1)
            frame.phase = "step-hook-requested"
            return PAUSE
        if frame.phase == "step-hook-requested":
            frame.phase = "await-step-hook"
            return _Wait(frozenset({frame.effect}))
        if frame.phase == "await-step-hook":
            if isinstance(sent, Raise):
                raise _raised(sent.error)
            self._check(frame.signal)
            frame.phase = "drained"
            return self._call(_Drain(None))  # §9.2 (R9.2)
        if frame.phase == "drained":
            frame.effect = self._request(SYSTEM_PROMPT, turn=frame.turn, step=frame.step,
                                         signal=frame.signal)  # §9.3 (R9.3)
            frame.phase = "system-prompt-requested"
            return PAUSE
        if frame.phase == "system-prompt-requested":
            frame.phase = "await-system-prompt"
            return _Wait(frozenset({frame.effect}))
        if frame.phase == "await-system-prompt":
            if isinstance(sent, Raise):
                raise _raised(sent.error)
            assert isinstance(sent, Resolve)
            try:
                system = freeze(sent.value, "system")
            except ValidationError as exc:
                raise _generic(str(exc), "InvalidSystemPromptError",
                               "INVALID_SYSTEM_PROMPT") from None
            self._check(frame.signal)
            frame.system = system
            frame.history_end = len(self.log)  # §9.4 (R9.4)
            self._append(STEP_START, {"turn": frame.turn, "step": frame.step})  # §9.5 (R9.5)
            self._step_open = True
            frame.phase = "step-started"
            return PAUSE
        if frame.phase == "step-started":
            self._check(frame.signal)
            frame.phase = "request-built"
            return self._call(_BuildRequest(frame.signal, frame.system))  # §9.6 (R9.6)
        if frame.phase == "request-built":
            assert isinstance(sent, tuple)
            header, frame.prepared = sent
            assert isinstance(header, FrozenDict)
            frame.header = header
            # a request failure of the stream is handled by the step (`_catch`, §13.2 (R13.2))
            frame.phase = "streamed"
            return self._call(_Stream(frame.signal, header, frame.history_end))
        if frame.phase == "streamed":
            answer = sent
            assert isinstance(answer, _Answer) and frame.header is not None
            content = list(answer.content)
            finish_kind = answer.finish["kind"]
            if finish_kind == "max-tokens":  # §9.8 (R9.8), §14.1 (R14.1)
                content = [b for b in content
                           if not (isinstance(b, FrozenDict) and b.get("type") == "tool-call")]
            config = frame.header["config"]
            assert isinstance(config, FrozenDict)
            seq = len(self.log)
            source: dict[str, JsonLike] = {"kind": "model", "provider": config["provider"],
                                           "model": config["model"]}
            # §1.4 (V4), §9.8 (R9.8): the adapter's replay state rides the source
            if "replayState" in answer.finish:
                source["replayState"] = answer.finish["replayState"]
            frozen_source = freeze(source, "source")
            assert isinstance(frozen_source, FrozenDict)
            message = Message(id=minted_id(self._mint, "assistant", seq), role="assistant",
                              content=FrozenList(content), source=frozen_source)
            data: dict[str, JsonLike] = {"turn": frame.turn, "step": frame.step,
                                         "message": _message_json(message)}
            if answer.usage is not None:
                data["usage"] = answer.usage
            self._append(ASSISTANT_MESSAGE, data, source_event_seqs=list(answer.seqs))
            frame.max_tokens = finish_kind == "max-tokens"
            frame.calls = tuple(b for b in message.content
                                if isinstance(b, FrozenDict) and b.get("type") == "tool-call")
            frame.phase = "answered"
            return PAUSE
        if frame.phase == "answered":
            if frame.calls:  # §9.9 (R9.9)
                frame.phase = "tools-done"
                return self._call(_Batch(frame.signal, _planned(frame.calls)))
            frame.phase = "drain"
        if frame.phase == "tools-done":
            assert isinstance(sent, bool)
            frame.concluded = sent
            frame.phase = "drain"
        if frame.phase == "drain":
            frame.phase = "drained-after-tools"
            return self._call(_Drain(None))  # §9.10 (R9.10)
        if frame.phase == "drained-after-tools":
            assert isinstance(sent, bool)
            frame.took_steering = sent
            self._append(STEP_END, {"turn": frame.turn, "step": frame.step})
            self._step_open = False
            frame.phase = "ended"
            return PAUSE
        if frame.phase == "ended":
            return self._return(_StepOutcome(
                continue_turn=(bool(frame.calls) and not frame.concluded) or frame.took_steering,
                concluded=frame.concluded, max_tokens=frame.max_tokens))
        return self._return(None)  # "request-failed"

    def _build_request(self, frame: _BuildRequest, sent: object) -> _Signal:
        """§9.6 (R9.6), P13: the seed config, the request effect (request extension point and
        preparation), validation of its resolution, and the ``request/header`` append. Returns
        the header and what the resolution says of the prepared request beside it (its
        ``retryPolicy``, not part of the header; empty without one)."""
        if frame.phase == "start":
            if not self._header_logged:
                seed: JsonLike = dict(self.config.request_options)
            else:
                # A header appended by extension code may lack a config: the seed is then an
                # empty config (project choice; §9.6 (R9.6) assumes one).
                last = self.log.last_header
                seed = last.get("config", FrozenDict()) if last is not None else FrozenDict()
            frame.effect = self._request(REQUEST, turn=self._turn, step=self._step,
                                         signal=frame.signal, config=seed, system=frame.system)
            frame.phase = "request-requested"
            return PAUSE
        if frame.phase == "request-requested":
            frame.phase = "await-request"
            return _Wait(frozenset({frame.effect}))
        if frame.phase == "logged":
            return self._return((frame.header, frame.prepared))
        # "await-request"
        if isinstance(sent, Raise):
            raise _raised(sent.error)
        assert isinstance(sent, Resolve)
        self._check(frame.signal)
        problem = _header_problem(sent.value)
        if problem is not None:
            raise _generic(problem, "RequestConfigError", "INVALID_REQUEST_CONFIG")
        if _lacks_route(sent.value):
            raise _Stop("generic", ErrorInfo(message=NO_ROUTE, name="Error"))
        header = freeze(sent.value, "header")
        assert isinstance(header, FrozenDict)
        if "retryPolicy" in header:
            frame.prepared = FrozenDict({"retryPolicy": header["retryPolicy"]})
            header = FrozenDict({k: v for k, v in header.items() if k != "retryPolicy"})
        problem = _route_problem(header)
        if problem is not None:
            raise _generic(problem, "RequestConfigError", "INVALID_REQUEST_CONFIG")
        last_header = self.log.last_header
        frame.header = header
        if not self._header_logged:
            reason = "resume" if last_header is not None else "initial"
            self._header_logged = True
            self._append(REQUEST_HEADER, {"header": header, "reason": reason})
            frame.phase = "logged"
            return PAUSE
        if last_header is None or canonical_json(header) != canonical_json(last_header):
            self._append(REQUEST_HEADER, {"header": header, "reason": "change"})
            frame.phase = "logged"
            return PAUSE
        return self._return((header, frame.prepared))

    def _stream(self, frame: _Stream, sent: object) -> _Signal:
        """§9.7 (R9.7), P5, P12: consume the model stream chunk by chunk: check the signal,
        validate, append ``assistant/chunk``, fold. Returns the `_Answer` (the folded content,
        the usage of the last usage chunk (§9.8 (R9.8)), the chunk seqs and the finish
        chunk); raises a request failure or a generic failure."""
        if frame.phase == "start":
            frame.effect = self._request(MODEL, history_end=frame.history_end, turn=self._turn,
                                         step=self._step, signal=frame.signal,
                                         header=frame.header, historyEnd=frame.history_end)
            frame.phase = "next-chunk"
            return PAUSE
        if frame.phase == "released":  # the release is delivered (P5): now the failure
            assert frame.stop is not None
            if frame.interrupted:  # D15: first, what the stream delivered before the abort
                frame.interrupted = False
                if self._keep_interrupted(frame):
                    return PAUSE
            raise _Stop(frame.stop.kind, frame.stop.error, frame.stop.failure)
        if frame.phase == "fold":
            folded = frame.chunk
            assert folded is not None
            content = frame.content
            chunk_type = folded["type"]  # §9.7 step 4 (R9.7.4): fold (P12)
            if chunk_type in ("text", "reasoning"):
                text = folded["text"]
                assert isinstance(text, str)
                if frame.previous_type == chunk_type:
                    last = content[-1]
                    assert isinstance(last, FrozenDict)
                    content[-1] = last.set("text", str(last["text"]) + text)
                else:
                    content.append(FrozenDict({"type": chunk_type, "text": text}))
            elif chunk_type == "tool-call":
                content.append(FrozenDict({"type": "tool-call", "id": folded["id"],
                                           "name": folded["name"],
                                           "arguments": folded["arguments"]}))
            elif chunk_type == "block":
                content.append(folded["block"])
            elif chunk_type == "usage":
                frame.usage = folded["usage"]
            elif chunk_type == "finish":
                frame.finish = folded
            assert isinstance(chunk_type, str)
            if chunk_type in ("text", "reasoning", "tool-call", "block"):
                frame.previous_type = chunk_type  # chunks that carry no content do not break a run
            frame.chunk = None
            frame.phase = "next-chunk"
        if frame.phase == "next-chunk":
            frame.phase = "await-chunk"
            return _Wait(frozenset({frame.effect}))
        # "await-chunk"
        completion = sent
        if isinstance(completion, Raise):
            error = completion.error
            if error.failure is not None:
                raise _Stop("request", error, error.failure)
            return self._stopped(frame, _raised(error))
        if isinstance(completion, End):
            if frame.finish is None:
                return self._stopped(frame, _generic("model stream ended without a finish chunk",
                                                     "InvalidChunkError", "INVALID_CHUNK"))
            return self._finished(frame)
        assert isinstance(completion, Chunk)
        if self._aborted(frame.signal):  # §9.7 step 1 (R9.7.1)
            frame.interrupted = True  # D15
            return self._released(frame, _Ending("abort"))
        if frame.finish is not None:
            return self._released(frame, _generic("a chunk arrived after the finish chunk",
                                                  "InvalidChunkError", "INVALID_CHUNK").ending)
        chunk: FrozenDict | None = None
        try:  # §9.7 step 2 (R9.7.2)
            chunk = validate_chunk(completion.chunk)
            problem = _chunk_problem(chunk)
        except ValidationError as exc:
            problem = f"invalid chunk: {exc}"
        if problem is not None:
            return self._released(frame, _generic(problem, "InvalidChunkError",
                                                  "INVALID_CHUNK").ending)
        assert chunk is not None
        event = self._append(ASSISTANT_CHUNK, {"turn": self._turn, "step": self._step,
                                               "chunk": chunk})  # §9.7 step 3 (R9.7.3)
        frame.seqs.append(event.seq)
        frame.chunk = chunk
        frame.phase = "fold"
        return PAUSE

    def _stopped(self, frame: _Stream, stop: _Stop) -> _Signal:
        """The stream ended in a generic failure (§9.7 (R9.7)); if the signal is aborted, the
        cancel stopped it, and D15 keeps what it delivered before *stop* is raised."""
        if not self._aborted(frame.signal):
            raise stop
        frame.stop, frame.interrupted = stop.ending, True
        frame.phase = "released"
        return self._stream(frame, None)

    def _keep_interrupted(self, frame: _Stream) -> bool:
        """D15: the stream's text and reasoning blocks that are not blank, in stream order, as
        the step's ``assistant/message`` marked ``interrupted``; False when there are none."""
        kept = [b for b in frame.content if isinstance(b, FrozenDict)
                and b.get("type") in ("text", "reasoning")
                and str(b.get("text")).strip(WHITESPACE) != ""]
        if not kept:
            return False
        config = frame.header["config"]
        assert isinstance(config, FrozenDict)
        source = freeze({"kind": "model", "provider": config["provider"],
                         "model": config["model"]}, "source")
        assert isinstance(source, FrozenDict)
        seq = len(self.log)
        message = Message(id=minted_id(self._mint, "assistant", seq), role="assistant",
                          content=FrozenList(kept), source=source)
        data: dict[str, JsonLike] = {"turn": self._turn, "step": self._step,
                                     "message": _message_json(message), "interrupted": True}
        if frame.usage is not None:
            data["usage"] = frame.usage
        self._append(ASSISTANT_MESSAGE, data, source_event_seqs=list(frame.seqs))
        return True

    def _released(self, frame: _Stream, ending: _Ending) -> _Signal:
        """P5: release the stream; once the release is delivered, *ending* is raised."""
        self._release(frame.effect)
        frame.stop = ending
        frame.phase = "released"
        return PAUSE

    def _finished(self, frame: _Stream) -> _Signal:
        """The stream ended: its answer, or a request failure (§9.7 (R9.7), §13.1 (R13.1))."""
        finish = frame.finish
        if finish is None:
            raise _generic("model stream ended without a finish chunk",
                           "InvalidChunkError", "INVALID_CHUNK")
        kind = finish["kind"]
        assert isinstance(kind, str)
        if kind in ("error", "aborted"):  # a request failure (§9.7 (R9.7), §13.1 (R13.1))
            raw = finish.get("failure")
            facts = (LlmFailure.from_json(raw) if raw is not None
                     else LlmFailure("model request aborted", "ABORTED"))
            raise _Stop("request", ErrorInfo(message=facts.message, name="ModelRequestError",
                                             code=facts.code, failure=facts), facts)
        return self._return(_Answer(tuple(frame.content), frame.usage, tuple(frame.seqs), finish))

    def _request_failure(self, frame: _RequestFailure, sent: object) -> _Signal:
        """§13.2 (R13.2): ``step/end``; request-error unless aborted; a retry only if still not
        aborted; a raise is a warning; classify (§15 (R15)); leave the step loop."""
        error, failure = frame.ending.error, frame.ending.failure
        assert error is not None and failure is not None
        if frame.phase == "start":
            self._append(STEP_END, {"turn": self._turn, "step": self._step})
            self._step_open = False
            frame.phase = "step-ended"
            return PAUSE
        if frame.phase == "step-ended":
            if not self._aborted(frame.signal):
                frame.effect = self._request(
                    REQUEST_ERROR, None, turn=self._turn, step=self._step, signal=frame.signal,
                    error=error.to_json(), failure=failure.to_json(),
                    priorFailures=[f.to_json() for f in self._prior_failures],
                    **frame.prepared)  # §13.2 (R13.2): the request's retry policy, if named
                frame.phase = "request-error-requested"
                return PAUSE
            frame.phase = "record"
        if frame.phase == "request-error-requested":
            frame.phase = "await-request-error"
            return _Wait(frozenset({frame.effect}))
        if frame.phase == "await-request-error":
            if isinstance(sent, Raise):
                self._warn(f"request recovery failed: {sent.error.rendered()}")
                frame.phase = "record"
                return PAUSE
            assert isinstance(sent, Resolve)
            if retry_action_from_json(sent.value) and not self._aborted(frame.signal):
                self._pending_retry = True
            frame.phase = "record"
        if frame.phase == "record":
            self._prior_failures.append(failure)  # §13.3 (R13.3): the earlier failures, then this one
            frame.phase = "done"
            return self._call(_Classify(frame.signal, frame.ending))
        return self._return()  # "done"

    # -- tool batch (§10 (R10)) ------------------------------------------------------------

    def _is_parallel(self, call: _Call) -> bool:
        """§10.2 (R10.2), P11: a call is parallel-safe when ``tool_modes`` says ``parallel``;
        unknown names are exclusive."""
        return self.config.tool_modes.get(call.name) == "parallel"

    def _batch(self, frame: _Batch, sent: object) -> _Signal:
        """§10.1–§10.11 (R10.1–R10.11) (with the project's effect realization): groups,
        ordered prepare, overlapping execute, model-ordered commit, abort pairs and batch
        failure. Returns whether a result concluded the turn."""
        calls = frame.calls
        while True:
            if frame.phase == "group":
                if not (frame.next_start < len(calls) and frame.failed_at() is None
                        and not self._aborted(frame.signal)):
                    frame.phase = "finish"
                    continue
                # §10.2 (R10.2): a new group. An exclusive call is a group of one; a
                # parallel-safe call opens a pool over the following calls while they stay
                # parallel-safe.
                frame.in_pool = self._is_parallel(calls[frame.next_start])
                frame.limit = self.config.max_parallel_tool_calls if frame.in_pool else 1
                frame.group_start = frame.next_start
                frame.group_open = True
                frame.phase = "fill"
            elif frame.phase == "fill":
                # §10.2 (R10.2), §10.3 (R10.3): start calls up to the limit, committing what
                # can be committed after each start (as the original's pool does);
                # §10.7 (R10.7), §10.9 (R10.9): no start once aborted or failed.
                frame.phase = "settle"
                if (frame.group_open and frame.failed_at() is None
                        and not self._aborted(frame.signal)
                        and frame.inflight() < frame.limit and frame.next_start < len(calls)):
                    call = calls[frame.next_start]
                    if frame.next_start > frame.group_start and not (
                            frame.in_pool and self._is_parallel(call)):
                        frame.group_open = False
                    else:
                        frame.phase = "started"
                        return self._call(_StartCall(frame.signal))
            elif frame.phase == "started":
                if not frame.in_pool:
                    frame.group_open = False
                frame.phase = "commit"
            elif frame.phase == "settle":
                if frame.inflight() == 0:
                    if (frame.failed_at() is not None or self._aborted(frame.signal)
                            or not frame.group_open or frame.next_start >= len(calls)):
                        frame.phase = "group"
                    else:
                        frame.phase = "fill"
                    continue
                # §10.2 (R10.2), P6: take one dispatched call whose body has settled, the
                # earliest started (as ``Promise.race`` over the pool picks the first settled
                # in insertion order); if none has, wait for the next settlement, and take
                # with it every settlement that has arrived (their calls settle before the
                # batch goes on, as resolved promises do). Calls already dispatched are
                # awaited.
                frame.phase = "take"
                if not any(c.dispatched and not c.taken and c.state != "inflight" for c in calls):
                    frame.phase = "await-settlement"
                    return _Wait(frame.running())
            elif frame.phase == "await-settlement":
                assert sent is not None
                self._absorb(frame, sent)
                while (more := self._take_mail(frame.running())) is not None:
                    self._absorb(frame, more)
                frame.phase = "take"
            elif frame.phase == "take":
                call = next(c for c in calls if c.dispatched and not c.taken and c.state != "inflight")
                call.taken = True
                frame.phase = "commit"
            elif frame.phase == "commit":
                # §10.4 (R10.4), §10.9 (R10.9): commit settled calls strictly in model order;
                # stop at the first call that is not settled, and never commit the failing
                # call or a later one. Then start what can be started.
                frame.phase = "fill"
                if frame.next_commit < frame.next_start:
                    failed_at = frame.failed_at()
                    if (failed_at is None or frame.next_commit < failed_at) and \
                            calls[frame.next_commit].state == "settled":
                        frame.phase = "committed"
                        return self._call(_Commit(frame.signal, frame.next_commit))
            elif frame.phase == "committed":
                if sent:  # committed (not failed): on to the next call
                    frame.next_commit += 1
                    frame.phase = "commit"
                else:
                    frame.phase = "fill"
            elif frame.phase == "finish":
                failed_at = frame.failed_at()
                if failed_at is not None:  # §10.9 (R10.9)
                    error = calls[failed_at].error
                    assert error is not None
                    raise _Stop("generic", error)  # only an invalid value fails a batch (R10.9, D5)
                if not self._aborted(frame.signal):
                    return self._return(frame.concluded)
                # §10.7 (R10.7): synthetic pairs for every unstarted call
                frame.next_synthetic = frame.next_start
                frame.phase = "abort-call"
            elif frame.phase == "abort-call":
                if frame.next_synthetic >= len(calls):
                    return self._return(frame.concluded)
                call = calls[frame.next_synthetic]
                call_event = self._append(TOOL_CALL, self._call_data(call))
                call.call_seq = call_event.seq
                frame.phase = "abort-result"
                return PAUSE
            else:  # "abort-result"
                self._append_synthetic(calls[frame.next_synthetic], "ABORTED_BEFORE_DISPATCH",
                                       ABORTED_BEFORE_DISPATCH_TEXT)
                frame.next_synthetic += 1
                frame.phase = "abort-call"
                return PAUSE

    def _call_data(self, call: _Call) -> dict[str, JsonLike]:
        """§2 (E1): ``tool/call {turn, step, callId, name, arguments}``."""
        return {"turn": self._turn, "step": self._step, "callId": call.call_id,
                "name": call.name, "arguments": call.arguments}

    def _stage_payload(self, signal: int, call: _Call) -> dict[str, JsonLike]:
        """P4: the payload of the tool stages."""
        return {"turn": self._turn, "step": self._step, "signal": signal,
                "callId": call.call_id, "name": call.name, "arguments": call.arguments}

    @staticmethod
    def _validate_result(call: _Call, value: JsonLike) -> ToolResult | None:
        """§1.19 (V16), §10.9 (R10.9), D5: a tool result is validated when it is supplied; an invalid
        one fails the call (code ``INVALID_TOOL_RESULT``)."""
        try:
            return ToolResult.from_json(value)
        except ValidationError as exc:
            call.state = "failed"
            call.error = ErrorInfo(message=f"invalid tool result: {exc}",
                                   name="InvalidToolResultError", code="INVALID_TOOL_RESULT")
            return None

    def _start(self, frame: _StartCall, sent: object) -> _Signal:
        """§10.3 (R10.3) read with the original: append ``tool/call``; if the signal is
        already aborted the call gets the aborted-before-dispatch result and no stage runs;
        otherwise prepare alone: a raise is the call's final error result, a value its final
        result, ``null`` goes on; then the signal check: aborted → not dispatched
        (aborted-before-dispatch, which finalize still sees), else execute."""
        batch = self._tool_batch()
        if frame.phase == "start":
            frame.index = batch.next_start
            batch.next_start += 1
            call = batch.calls[frame.index]
            call_event = self._append(TOOL_CALL, self._call_data(call))
            call.call_seq = call_event.seq
            frame.phase = "called"
            return PAUSE
        call = batch.calls[frame.index]
        if frame.phase == "called":
            if self._aborted(frame.signal):
                call.result, call.final, call.state = (
                    _aborted_result("ABORTED_BEFORE_DISPATCH", ABORTED_BEFORE_DISPATCH_TEXT),
                    True, "settled")
                return self._return()
            frame.effect = self._request(TOOL_PREPARE, **self._stage_payload(frame.signal, call))
            frame.phase = "prepare-requested"
            return PAUSE
        if frame.phase == "prepare-requested":
            frame.phase = "prepared"
            return self._call(_AwaitStage(frame.effect))
        if frame.phase == "dispatched":
            return self._return()
        # "prepared"
        completion = sent
        if isinstance(completion, Raise):
            call.result, call.final, call.state = _result_of_raise(completion.error), True, "settled"
            return self._return()
        assert isinstance(completion, Resolve)
        if completion.value is not None:  # a final result from prepare
            result = self._validate_result(call, completion.value)
            if result is not None:
                call.result, call.final, call.state = result, True, "settled"
            return self._return()
        if self._aborted(frame.signal):
            call.result = _aborted_result("ABORTED_BEFORE_DISPATCH", ABORTED_BEFORE_DISPATCH_TEXT)
            call.state = "settled"
            return self._return()
        call.execute_effect = self._request(TOOL_EXECUTE, **self._stage_payload(frame.signal, call))
        call.dispatched = True
        call.state = "inflight"
        frame.phase = "dispatched"
        return PAUSE

    def _await_stage(self, frame: _AwaitStage, sent: object) -> _Signal:
        """Wait for a prepare or finalize completion, and return it. P6: a settlement of a
        dispatched call that arrives before it is taken first (its call settles), in arrival
        order."""
        batch = self._tool_batch()
        if frame.phase == "arrived":
            assert isinstance(sent, (Resolve, Raise, Chunk, End))
            if sent.effect == frame.effect:
                return self._return(sent)
            self._absorb(batch, sent)
        # "wait", or a settlement was absorbed: wait (again), for the stage or a settlement
        frame.phase = "arrived"
        return _Wait(frozenset({frame.effect}) | batch.running())

    def _absorb(self, batch: _Batch, completion: object) -> None:
        """§10.11 (R10.11), R10.3.5: a body's settlement. A raise stands for an error result
        (R10.12); a valid success that settles while the signal is aborted is replaced by the
        aborted result before finalize sees it (the original replaces it at dispatch); an
        invalid value fails the call (D5)."""
        assert isinstance(completion, (Resolve, Raise))
        call = next(c for c in batch.calls if c.execute_effect == completion.effect)
        if isinstance(completion, Raise):
            call.result, call.state = _result_of_raise(completion.error), "settled"
            return
        result = self._validate_result(call, completion.value)
        if result is None:
            return
        if self._aborted(batch.signal) and not result.is_error:
            result = _aborted_result("ABORTED", ABORTED_TEXT, result.additional_contexts)
        call.result, call.state = result, "settled"

    def _commit(self, frame: _Commit, sent: object) -> _Signal:
        """§10.4 steps 1–5 (R10.4.1–R10.4.5) read with the original: finalize every result
        that is not final, handing it the normalized result; a raise there stands for an
        error result, a success finalized while the signal is aborted becomes the aborted
        result again (ABORTED if dispatched, else aborted-before-dispatch) with the finalized
        contexts; then append ``tool/result``, stage contexts, note ``concludesTurn``. False
        if the call failed."""
        batch = self._tool_batch()
        call = batch.calls[frame.index]
        if frame.phase == "start":
            frame.result = call.result
            assert frame.result is not None
            frame.phase = "write"
            if not call.final:
                payload = self._stage_payload(frame.signal, call)
                payload["result"] = _normal(frame.result).to_json()
                frame.effect = self._request(TOOL_FINALIZE, **payload)
                frame.phase = "finalize-requested"
                return PAUSE
        if frame.phase == "finalize-requested":
            frame.phase = "finalized"
            return self._call(_AwaitStage(frame.effect))
        if frame.phase == "finalized":
            if isinstance(sent, Raise):
                frame.result = _result_of_raise(sent.error)
            else:
                assert isinstance(sent, Resolve)
                finalized = self._validate_result(call, sent.value)
                if finalized is None:
                    return self._return(False)
                frame.result = finalized
                if self._aborted(frame.signal) and not finalized.is_error:
                    frame.result = (
                        _aborted_result("ABORTED", ABORTED_TEXT, finalized.additional_contexts)
                        if call.dispatched else
                        _aborted_result("ABORTED_BEFORE_DISPATCH", ABORTED_BEFORE_DISPATCH_TEXT,
                                        finalized.additional_contexts))
            frame.phase = "write"
        if frame.phase == "write":
            assert frame.result is not None
            result = frame.result = _normal(frame.result)
            block: dict[str, JsonLike] = {"type": "tool-result", "toolCallId": call.call_id,
                                          "content": result.content}
            if result.is_error:
                block["isError"] = True
            data: dict[str, JsonLike] = {"turn": self._turn, "step": self._step,
                                         "message": self._tool_message(call, [block])}
            if result.error is not None:
                data["error"] = result.error
            if result.meta is not None:
                data["meta"] = result.meta
            self._append(TOOL_RESULT, data, source_event_seqs=[call.call_seq])
            frame.phase = "written"
            return PAUSE
        # "written"
        written = frame.result
        assert written is not None
        if written.concludes_turn and not written.is_error:  # §10.6 (R10.6)
            batch.concluded = True
        for context in written.additional_contexts:  # §10.4 step 4 (R10.4.4)
            self._outbox.append(_Staged(context, steering=False))
        call.state = "committed"
        return self._return(True)

    def _tool_message(self, call: _Call, content: list[dict[str, JsonLike]]) -> dict[str, JsonLike]:
        """§10.4 step 3 (R10.4.3): a new tool-result message, id ``tool-result-<seq>`` (P12)."""
        return {"id": minted_id(self._mint, "tool-result", len(self.log)), "role": "user",
                "content": content, "source": {"kind": "tool", "callId": call.call_id}}

    def _append_synthetic(self, call: _Call, code: str, text: str) -> None:
        """§10.10 (R10.10), §10.11 (R10.11): the synthetic aborted results (``AbortError``)."""
        block = {"type": "tool-result", "toolCallId": call.call_id,
                 "content": [{"type": "text", "text": text}], "isError": True}
        self._append(TOOL_RESULT, {"turn": self._turn, "step": self._step,
                                   "message": self._tool_message(call, [block]),
                                   "error": {"name": "AbortError", "code": code}},
                     source_event_seqs=[call.call_seq])





if TYPE_CHECKING:
    from machine.explore import Agentlike

    def _drivable_by_the_explorer(agent: ModelAgent) -> Agentlike:
        """`machine.explore.reference_model` returns a ModelAgent as `Agentlike`: checked here."""
        return agent
