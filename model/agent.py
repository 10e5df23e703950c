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
* All routing state is plain data on the instance: two lists (``queued`` and
  ``outbox``), a few flags, the current abort owner.
* The loop's own work (wake, admission, run, flush, settlement,
  continue-or-idle) is ONE plain Python generator, ``_proc``. It yields
  ``None`` after it has queued an output ("deliver what I queued, then resume
  me": P8) and ``_Wait(ids)`` when it waits on the environment (a yield point,
  §0.4 (R0.4)); it is resumed with the completion it waited for (P6).
* Commands (§5 (R5), §16 (R16), §17 (R17), P3) are plain methods that change
  state at once and queue their outputs; they never run the loop.
* ``next_output`` (P1) hands out queued outputs and only resumes the
  generator when the queue is empty (P8).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias

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
    thaw,
)
from machine.log import SessionLog
from machine.vocabulary import (
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


@dataclass(frozen=True)
class _Wait:
    """The generator waits on one of these effects (a yield point, §0.4 (R0.4); P6)."""

    effects: frozenset[int]


Proc: TypeAlias = Generator["_Wait | None", "Completion | None", None]


# --------------------------------------------------------------------------
# Plain records
# --------------------------------------------------------------------------


@dataclass
class _Queued:
    """An item of ``queued`` (§4.1 (R4.1)): a message and its wakeup flag."""

    message: Message
    wakeup: bool


@dataclass
class _Staged:
    """An item of the ``outbox`` (§4.1 (R4.1)): staged steering (True) or staged context (False)."""

    message: Message
    steering: bool


@dataclass
class _Controller:
    """An abort controller (§4.4 (R4.4), §0.7 (R0.7)). ``reason`` is the first cause
    (§16.3 (R16.3))."""

    signal: int
    reason: CancelCause | None = None


@dataclass
class _EffectRecord:
    """What the model remembers about one effect request (P4, P10)."""

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


class _Stop(Exception):
    """Something that ends a turn: an abort raised by a signal check (§0.7 (R0.7)), a request
    failure (§13.1 (R13.1)) or a generic failure (§15.3 (R15.3))."""

    def __init__(self, kind: Literal["abort", "request", "generic"],
                 error: ErrorInfo | None = None, failure: LlmFailure | None = None) -> None:
        super().__init__(kind)
        self.kind = kind
        self.error = error
        self.failure = failure


def _generic(message: str, name: str, code: str | None) -> _Stop:
    """A generic failure with a coded error (§15.3 (R15.3); project decision on names and codes)."""
    return _Stop("generic", ErrorInfo(message=message, name=name, code=code))


def _raised(error: ErrorInfo) -> _Stop:
    """A raised ErrorInfo is a generic failure (§13.1 (R13.1)), its code being the error's
    (§15.3 (R15.3))."""
    return _Stop("generic", error)


@dataclass
class _StepOutcome:
    """The outcome of a completed step (§9.10 (R9.10))."""

    continue_turn: bool
    concluded: bool
    max_tokens: bool


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
    tools?}`` with a mapping ``config``. (The texts are the project's; P13 does not state
    them.)"""
    try:
        header = freeze(value, "header")
    except ValidationError as exc:
        return str(exc)
    if not isinstance(header, FrozenDict) or not isinstance(header.get("config"), FrozenDict):
        return "the request header must be a mapping {config, system?, tools?}"
    extra = sorted(set(header) - {"config", "system", "tools"})
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
        self._owner: _Controller | None = None
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
        self._controllers: dict[int, _Controller] = {}
        self._mail: list[tuple[int, Completion]] = []
        self._proc: Proc | None = None
        self._waiting: frozenset[int] | None = None
        if self.config.publish:
            self._queue(Live(LiveEvent(SESSION_CREATED, FrozenDict({}))))
            self._queue(Live(LiveEvent(AGENT_CREATED, FrozenDict({"status": "idle"}))))
            self._queue(Live(LiveEvent(SESSION_START,
                                       FrozenDict({"source": self.config.session_start}))))

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
        controller = self._controllers.get(signal)
        return controller.reason if controller is not None else None

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
        """Run the loop one yield further, if it can (P6, P8). Starts the wake (§6.2 (R6.2)) and
        the teardown of a quiescent disposing agent (R17.4, project decision for §17 (R17))."""
        if self._proc is None:
            if self._wake_tick is not None:
                tick = self._wake_tick
                self._wake_tick = None
                self._proc = self._wake(tick)
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
            yielded = self._proc.send(sent)
        except StopIteration:
            self._proc = None
            self._waiting = None
            return True
        except BaseException as error:  # P16: the loop cannot go on; the model stops
            self._stop(error)
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise  # P16: an exit goes on to the caller once the model has stopped
            return True
        self._waiting = yielded.effects if isinstance(yielded, _Wait) else None
        return True

    def _stop(self, error: BaseException) -> None:
        """P16: the loop failed outside any turn it could still fail in order: the model
        stops. Nothing is waited for any more (the outstanding effects are abandoned:
        their completions are accepted and dropped); a disposing agent discards what is
        queued (§17 (R17)); busy, the window and a pending wake or retry are cleared;
        ``agent/error`` names the failure, then ``idle`` if the agent was busy."""
        info = internal_error(error)
        self._failure = info
        self._proc = None
        self._waiting = None
        self._mail = []
        for record in self._effects.values():
            if not record.done:
                record.done = record.abandoned = True
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
            record.abandoned = False
            return
        if record.kind == MODEL:
            raise ProtocolError(f"effect {effect} is a model call: use chunk/end or raise")
        record.done = True
        self._mail.append((effect, Resolve(effect, snapshot(value))))  # V6: taken at the call

    def fail(self, effect: int, error: ErrorInfo) -> None:
        """P4, P6, P10: buffer a ``raise``; the error must be an ErrorInfo."""
        if not isinstance(error, ErrorInfo):
            raise ProtocolError("raise needs an ErrorInfo")
        error = ErrorInfo.checked(error)  # V2, V15: checked however it was built
        record = self._record(effect)
        if record.abandoned:  # P16
            record.abandoned = False
            return
        record.done = True
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
            record.abandoned = False
            return
        if record.kind != MODEL:
            raise ProtocolError(f"effect {effect} is not a model call")
        record.done = True
        self._mail.append((effect, End(effect)))

    def _release(self, effect: int) -> None:
        """P5: stop consuming a model stream: count the effect as completed, drop its
        buffered chunks and queue ``release`` -- unless the environment had already
        completed the stream (``end`` or ``raise`` received): then nothing is queued (P5)."""
        record = self._effects[effect]
        already_complete = record.done
        record.done = True
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
                        source_event_seqs=item.source_event_seqs)
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
        if owner is not None and owner.reason is None:  # §16.3 (R16.3): the first cause wins
            owner.reason = cause
            scope.abort = _Entry(output=self._abort_notice(owner.signal, cause))
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
            self._owner.reason = cause
            scope.abort.output = self._abort_notice(self._owner.signal, cause)

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
               source_event_seqs: Sequence[int] | None = None) -> Event:
        """P3: a direct append by extension code, checked before commit (§20.2 (R20.2), D7)."""
        self._check_not_disposed()
        if isinstance(type, str):
            type = str.__str__(type)
        if self._busy and isinstance(type, str) and type in (
                TURN_START, TURN_END, STEP_START, STEP_END, ASSISTANT_CHUNK, ASSISTANT_MESSAGE,
                TOOL_CALL, TOOL_RESULT):
            # R20.4: while busy, the loop alone writes the records of its turns; a refusal
            # of the log's own comes first.
            self.log.check(type, data, surface_op=surface_op, source_event_seqs=source_event_seqs)
            raise InvariantError("R20.4", f"{type} is written by the loop itself: a direct "
                                 "append of it is refused while the agent is busy")
        return self._command_append(type, data, surface_op, source_event_seqs)

    def _command_append(self, type_: str, data: JsonLike, surface_op: JsonLike = None,
                        source_event_seqs: Sequence[int] | None = None) -> Event:
        """P3, P16: a command's append; a failure of it other than the log's own refusal is
        raised as an InvariantError (nothing was appended)."""
        try:
            event = self.log.append(type_, data, surface_op=surface_op,
                                    source_event_seqs=source_event_seqs)
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

    def _new_controller(self) -> _Controller:
        """§4.4 (R4.4): a fresh controller with its own signal."""
        controller = _Controller(self._next_signal)
        self._next_signal += 1
        self._controllers[controller.signal] = controller
        return controller

    def _has_waking(self) -> bool:
        """§7.1 (R7.1): at least one waking item is queued."""
        return any(item.wakeup for item in self._queued)

    def _wake(self, tick: int) -> Proc:
        """§6.2 (R6.2): wait for the tick; clear ``wakePending``; claim if not busy and a waking
        item is queued, otherwise do nothing."""
        yield _Wait(frozenset({tick}))
        self._wake_pending = False
        yield from self._continue_or_idle()

    def _continue_or_idle(self) -> Proc:
        """§12.7 (R12.7) (and the wake's claim, §6.2 (R6.2)): claim the head of ``queued``
        while a waking item is queued, within one running interval; otherwise clear ``busy``
        and emit ``idle`` (only if busy). While disposing, never claim (R17.4, the project
        decision for §17.1 step 2 (R17.1.2)): a waking item found here is discarded by
        ``cancel(disposed)`` and the loop "then finds nothing" at once -- before that
        cancel's discard notifications are delivered."""
        while True:
            if self._disposing and self._has_waking():
                self._cancel(CancelCause("disposed"), keep_inbox=False)
            if self._has_waking():
                yield from self._admission()
                continue
            if self._busy:
                self._busy = False
                self._live(STATUS, status="idle")
                yield None
            return

    # -- admission (§7 (R7)) ---------------------------------------------------------------

    def _admission(self) -> Proc:
        """§7.2–§7.11 (R7.2–R7.11): claim the head of ``queued``, run prompt-submit, then the
        run (allowed) or the rejected path."""
        item = self._queued.pop(0)  # §7.2 (R7.2)
        inherited = len(self._outbox)
        controller = self._new_controller()  # §7.3 (R7.3)
        self._owner = controller
        self._window = True
        if not self._busy:  # §7.4 (R7.4)
            self._busy = True
            self._live(STATUS, status="running")
            yield None
        claimed = item.message
        admitted: list[Message] | None = None
        if controller.reason is not None:  # §7.5 (R7.5): rejected, prompt-submit not invoked
            # P15, as the original orders it: the admission body runs on to its yield (the
            # owner released, §7.8 (R7.8); §7.10 steps 1–2 (R7.10.1–R7.10.2)) before the
            # claim emits the dequeue notice, and the tick of that yield is requested after
            # the notice.
            self._owner = None
            yield from self._reject_admission()
            self._live(INBOX_DEQUEUE, message=_message_json(claimed), placement="queued")
            yield None
            yield from self._rejected_tick()
            return
        else:
            effect = self._request(PROMPT_SUBMIT, message=_message_json(claimed),
                                   signal=controller.signal)
            yield None
            self._live(INBOX_DEQUEUE, message=_message_json(claimed), placement="queued")  # §7.6 (R7.6)
            yield None
            completion = yield _Wait(frozenset({effect}))
            admitted = yield from self._decide(controller, claimed, completion)
        self._owner = None  # §7.8 (R7.8)
        if admitted is not None:  # §7.9 (R7.9)
            trigger = {"kind": "message", "source": thaw(claimed.source)}
            yield from self._chain(trigger, admitted, inherited)
        else:
            yield from self._rejected()

    def _decide(self, controller: _Controller, claimed: Message,
                completion: Completion | None) -> Generator[_Wait | None, Completion | None,
                                                            list[Message] | None]:
        """§7.7 (R7.7), §7.11 (R7.11): the admitted list ``[prompt] + additionalContexts``, or
        None when the outcome is rejected (aborted: no warning; raise or invalid decision: a
        warning)."""
        if controller.reason is not None:
            return None
        if isinstance(completion, Raise):
            self._warn(f"prompt admission failed: {completion.error.rendered()}")
            yield None
            return None
        assert isinstance(completion, Resolve)
        try:
            decision = decision_from_json(completion.value)
        except ValidationError as exc:
            self._warn(f"prompt admission returned an invalid decision: {exc}")
            yield None
            return None
        if not isinstance(decision, Allow):
            return None
        prompt = claimed
        if decision.content is not None:
            prompt = Message(id=claimed.id, role=claimed.role, content=decision.content,
                             source=claimed.source)
        return [prompt, *decision.additional_contexts]

    def _rejected(self) -> Proc:
        """§7.10 (R7.10): close the window; append staged context between turns unless any steering
        is staged; yield one tick; then continue-or-idle (in the caller)."""
        yield from self._reject_admission()
        yield from self._rejected_tick()

    def _reject_admission(self) -> Proc:
        """§7.10 steps 1–2 (R7.10.1–R7.10.2)."""
        self._window = False
        if not any(item.steering for item in self._outbox):
            while self._outbox:
                try:
                    self._append(USER_MESSAGE, _message_json(self._outbox[0].message))
                except Exception as error:  # P16: the context stays staged
                    self._warn("staged context could not be written: "
                               f"{failure_text(error)}")
                    yield None
                    break
                self._outbox.pop(0)
                yield None

    def _rejected_tick(self) -> Proc:
        """§7.10 step 3 (R7.10.3): one tick."""
        tick = self._request(TICK, purpose="rejected-admission")
        yield None
        yield _Wait(frozenset({tick}))

    # -- chain: run, flush, retry, settle (§8 (R8), §12.4–§12.6 (R12.4–R12.6), §13.3 (R13.3))

    def _chain(self, trigger: dict[str, JsonLike], admitted: list[Message], inherited: int) -> Proc:
        """§8.8 (R8.8), §12.4–§12.6 (R12.4–R12.6), §13.3 (R13.3): run the turn, flush; a
        pending retry starts the retry run (no settled, no status change); otherwise emit
        ``agent/settled``."""
        self._prior_failures = []
        while True:
            started = yield from self._run(trigger, admitted, inherited)
            if not started:  # P16: no turn, so nothing to flush or settle
                return
            yield from self._flush()
            if self._pending_retry:  # §12.5 (R12.5)
                self._pending_retry = False
                trigger, admitted, inherited = {"kind": "retry"}, [], 0
                continue
            self._live(SETTLED, turn=self._turn, reason=self._settle)
            yield None
            return

    def _flush(self) -> Proc:
        """§12.4 (R12.4): await the flush barrier; a failure is a warning plus ``agent/error`` and
        the work goes on."""
        effect = self._request(FLUSH, turn=self._turn)
        yield None
        completion = yield _Wait(frozenset({effect}))
        if isinstance(completion, Raise):
            self._warn(f"session flush failed at turn {self._turn}: {completion.error.rendered()}")
            yield None
            self._live(ERROR, turn=self._turn, step=self._step, error=completion.error.to_json())
            yield None

    def _run(self, trigger: dict[str, JsonLike], admitted: list[Message], inherited: int
             ) -> Generator[_Wait | None, Completion | None, bool]:
        """§8.1–§8.7 (R8.1–R8.7): one turn. False when its turn/start could not be written
        (P16)."""
        controller = self._new_controller()  # §8.1 (R8.1)
        self._owner = controller
        self._window = True
        self._turn = self.log.last_turn + 1
        self._reason = {"kind": "completed"}
        self._settle = {"kind": "completed"}
        self._step = 0
        self._step_open = False
        try:
            self._append(TURN_START, {"turn": self._turn, "trigger": trigger})  # §8.2 (R8.2)
        except Exception as error:
            # P16 case 3: the log refused the turn/start (a direct append left a turn open):
            # there is no turn; agent/error at step 0, and continue-or-idle as after a
            # rejected admission.
            self._window = False
            self._owner = None
            self._pending_retry = False
            self._live(ERROR, turn=self._turn, step=0, error=internal_error(error).to_json())
            yield None
            return False
        yield None
        try:
            limit = min(inherited, len(self._outbox))  # §8.3 step 1 (R8.3.1)
            yield from self._drain(limit)
            for message in admitted:  # §8.3 step 2 (R8.3.2)
                self._append(USER_MESSAGE, _message_json(message))
                yield None
            self._check(controller)  # §8.3 step 3 (R8.3.3)
            yield from self._drain(None)  # §8.3 step 4 (R8.3.4)
            yield from self._step_loop(controller)
        except _Stop as stop:
            yield from self._fail(controller, stop)
        except Exception as error:  # P16: an internal failure fails the turn (§15.3 (R15.3))
            yield from self._fail(controller, _Stop("generic", internal_error(error)))
        self._window = False  # §8.7 (R8.7)
        yield from self._closing(controller, TURN_END)
        self._owner = None
        return True

    def _closing(self, controller: _Controller, type_: str) -> Proc:
        """P16: ``step/end`` or ``turn/end`` closing the turn. A refusal by the log becomes
        the turn's failure (§15 (R15)) and the append is tried once more; a second refusal
        propagates (and stops the model)."""
        def data() -> dict[str, JsonLike]:
            if type_ == TURN_END:
                return {"turn": self._turn, "reason": self._reason}
            return {"turn": self._turn, "step": self._step}
        try:
            self._append(type_, data())
        except Exception as error:
            yield from self._classify(controller, _Stop("generic", internal_error(error)))
            self._append(type_, data())
        if type_ == STEP_END:
            self._step_open = False
        yield None

    def _check(self, controller: _Controller) -> None:
        """§0.7 (R0.7): a signal check on an aborted signal raises an abort inside the loop."""
        if controller.reason is not None:
            raise _Stop("abort")

    def _step_loop(self, controller: _Controller) -> Proc:
        """§8.4 (R8.4), §8.5 (R8.5): steps until the turn ends."""
        while True:
            self._step += 1
            outcome = yield from self._run_step(controller)
            if outcome is None:  # a request failure was handled (§13.2 step 5 (R13.2.5))
                return
            self._prior_failures = []  # §13.4 (R13.4)
            if outcome.max_tokens:  # §14.3 (R14.3)
                self._reason = {"kind": "max-tokens"}
            if outcome.concluded:
                # §8.4 (R8.4): a concluding result leaves the loop at once, with no signal check
                # (a cancel at that step/end does not change the reason, as in the original).
                return
            if outcome.continue_turn or any(item.steering for item in self._outbox):
                continue
            effect = self._request(TURN_STOPPING, turn=self._turn,  # §8.5 (R8.5)
                                   signal=controller.signal)
            yield None
            completion = yield _Wait(frozenset({effect}))
            if isinstance(completion, Raise):
                raise _raised(completion.error)
            self._check(controller)
            took_steering = yield from self._drain(None)
            if not took_steering:  # §8.5 (R8.5): leave the loop (no further check)
                return

    def _fail(self, controller: _Controller, stop: _Stop) -> Proc:
        """§8.6 (R8.6): close an open step, then classify (§15 (R15))."""
        if self._step_open:
            yield from self._closing(controller, STEP_END)
        yield from self._classify(controller, stop)

    def _classify(self, controller: _Controller, stop: _Stop) -> Proc:
        """§15.1–§15.3 (R15.1–R15.3): abort, request failure or other failure; set the durable
        and the settle reason and emit ``agent/error`` unless aborted."""
        if controller.reason is not None:  # §15.1 (R15.1)
            kind = "disposed" if controller.reason.kind == "disposed" else "aborted"
            self._reason = {"kind": kind}
            self._settle = {"kind": "aborted"}
            return
        error = stop.error
        assert error is not None
        if stop.kind == "request":  # §15.2 (R15.2)
            failure = stop.failure
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
        yield None

    # -- drains (§11 (R11)) ----------------------------------------------------------------

    def _drain(self, limit: int | None) -> Generator[_Wait | None, Completion | None, bool]:
        """§11.1 (R11.1): take outbox items from the front until it is empty (a fixed point, D3) or
        the limit is taken (the inherited drain, §8.3 step 1 (R8.3.1)). Steering: dequeue
        notification, then ``steering/message``; context: ``user/message``. Reports
        whether any steering item was taken."""
        took_steering = False
        taken = 0
        while self._outbox and (limit is None or taken < limit):
            staged = self._outbox[0]
            taken += 1
            if staged.steering:
                self._outbox.pop(0)
                took_steering = True
                self._live(INBOX_DEQUEUE, message=_message_json(staged.message),
                           placement="steering")
                yield None
                self._append(STEERING_MESSAGE, {"turn": self._turn,
                                                "message": _message_json(staged.message)})
                yield None
            else:
                self._append(USER_MESSAGE, _message_json(staged.message))
                self._outbox.pop(0)  # P16: taken once written (a refusal leaves it staged)
                yield None
        return took_steering

    # -- step (§9 (R9)) --------------------------------------------------------------------

    def _run_step(self, controller: _Controller) -> Generator[_Wait | None, Completion | None,
                                                             _StepOutcome | None]:
        """§9.1–§9.10 (R9.1–R9.10): one step. Returns None after a request failure was handled
        (§13.2 (R13.2))."""
        turn, step, signal = self._turn, self._step, controller.signal
        effect = self._request(STEP_HOOK, turn=turn, step=step, signal=signal)  # §9.1 (R9.1)
        yield None
        completion = yield _Wait(frozenset({effect}))
        if isinstance(completion, Raise):
            raise _raised(completion.error)
        self._check(controller)
        yield from self._drain(None)  # §9.2 (R9.2)
        effect = self._request(SYSTEM_PROMPT, turn=turn, step=step, signal=signal)  # §9.3 (R9.3)
        yield None
        completion = yield _Wait(frozenset({effect}))
        if isinstance(completion, Raise):
            raise _raised(completion.error)
        assert isinstance(completion, Resolve)
        try:
            system = freeze(completion.value, "system")
        except ValidationError as exc:
            raise _generic(str(exc), "InvalidSystemPromptError",
                           "INVALID_SYSTEM_PROMPT") from None
        self._check(controller)
        history_end = len(self.log)  # §9.4 (R9.4)
        self._append(STEP_START, {"turn": turn, "step": step})  # §9.5 (R9.5)
        self._step_open = True
        yield None
        self._check(controller)
        header = yield from self._build_request(controller, system)  # §9.6 (R9.6)
        try:
            content, usage, seqs, finish = yield from self._stream(controller, header,
                                                                   history_end)
        except _Stop as stop:
            if stop.kind != "request":
                raise
            yield from self._request_failure(controller, stop)
            return None
        finish_kind = finish["kind"]
        if finish_kind == "max-tokens":  # §9.8 (R9.8), §14.1 (R14.1)
            content = [b for b in content
                       if not (isinstance(b, FrozenDict) and b.get("type") == "tool-call")]
        config = header["config"]
        assert isinstance(config, FrozenDict)
        seq = len(self.log)
        source: dict[str, JsonLike] = {"kind": "model", "provider": config["provider"],
                                       "model": config["model"]}
        # §1.4 (V4), §9.8 (R9.8): the adapter's replay state rides the source
        if "replayState" in finish:
            source["replayState"] = finish["replayState"]
        frozen_source = freeze(source, "source")
        assert isinstance(frozen_source, FrozenDict)
        message = Message(id=minted_id(self._mint, "assistant", seq), role="assistant",
                          content=FrozenList(content), source=frozen_source)
        data: dict[str, JsonLike] = {"turn": turn, "step": step, "message": _message_json(message)}
        if usage is not None:
            data["usage"] = usage
        self._append(ASSISTANT_MESSAGE, data, source_event_seqs=seqs)
        yield None
        calls = [b for b in message.content
                 if isinstance(b, FrozenDict) and b.get("type") == "tool-call"]
        concluded = False
        if calls:  # §9.9 (R9.9)
            concluded = yield from self._batch(controller, calls)
        took_steering = yield from self._drain(None)  # §9.10 (R9.10)
        self._append(STEP_END, {"turn": turn, "step": step})
        self._step_open = False
        yield None
        return _StepOutcome(continue_turn=(bool(calls) and not concluded) or took_steering,
                            concluded=concluded, max_tokens=finish_kind == "max-tokens")

    def _build_request(self, controller: _Controller, system: Frozen
                       ) -> Generator[_Wait | None, Completion | None, FrozenDict]:
        """§9.6 (R9.6), P13: the seed config, the request effect (request extension point and
        preparation), validation of the header, and the ``request/header`` append."""
        if not self._header_logged:
            seed: JsonLike = dict(self.config.request_options)
        else:
            # A header appended by extension code may lack a config: the seed is then an
            # empty config (project choice; §9.6 (R9.6) assumes one).
            last = self.log.last_header
            seed = last.get("config", FrozenDict()) if last is not None else FrozenDict()
        effect = self._request(REQUEST, turn=self._turn, step=self._step,
                               signal=controller.signal, config=seed, system=system)
        yield None
        completion = yield _Wait(frozenset({effect}))
        if isinstance(completion, Raise):
            raise _raised(completion.error)
        assert isinstance(completion, Resolve)
        self._check(controller)
        problem = _header_problem(completion.value)
        if problem is not None:
            raise _generic(problem, "RequestConfigError", "INVALID_REQUEST_CONFIG")
        if _lacks_route(completion.value):
            raise _Stop("generic", ErrorInfo(message=NO_ROUTE, name="Error"))
        header = freeze(completion.value, "header")
        assert isinstance(header, FrozenDict)
        problem = _route_problem(header)
        if problem is not None:
            raise _generic(problem, "RequestConfigError", "INVALID_REQUEST_CONFIG")
        last_header = self.log.last_header
        if not self._header_logged:
            reason = "resume" if last_header is not None else "initial"
            self._header_logged = True
            self._append(REQUEST_HEADER, {"header": header, "reason": reason})
            yield None
        elif last_header is None or canonical_json(header) != canonical_json(last_header):
            self._append(REQUEST_HEADER, {"header": header, "reason": "change"})
            yield None
        return header

    def _stream(self, controller: _Controller, header: FrozenDict, history_end: int
                ) -> Generator[_Wait | None, Completion | None,
                               tuple[list[Frozen], Frozen, list[int], FrozenDict]]:
        """§9.7 (R9.7), P5, P12: consume the model stream chunk by chunk: check the signal,
        validate, append ``assistant/chunk``, fold. Returns the folded content, the usage
        (of the last usage chunk, §9.8 (R9.8)), the chunk seqs and the finish chunk; raises a
        request failure or a generic failure."""
        effect = self._request(MODEL, history_end=history_end, turn=self._turn, step=self._step,
                               signal=controller.signal, header=header, historyEnd=history_end)
        yield None
        content: list[Frozen] = []
        seqs: list[int] = []
        finish: FrozenDict | None = None
        usage: Frozen = None
        previous_type: str | None = None  # the type of the last content-carrying chunk
        chunk: FrozenDict | None = None
        while True:
            completion = yield _Wait(frozenset({effect}))
            if isinstance(completion, Raise):
                error = completion.error
                if error.failure is not None:
                    raise _Stop("request", error, error.failure)
                raise _raised(error)
            if isinstance(completion, End):
                if finish is None:
                    raise _generic("model stream ended without a finish chunk",
                                   "InvalidChunkError", "INVALID_CHUNK")
                break
            assert isinstance(completion, Chunk)
            if controller.reason is not None:  # §9.7 step 1 (R9.7.1)
                self._release(effect)
                yield None
                raise _Stop("abort")
            if finish is not None:
                self._release(effect)
                yield None
                raise _generic("a chunk arrived after the finish chunk", "InvalidChunkError",
                               "INVALID_CHUNK")
            try:  # §9.7 step 2 (R9.7.2)
                chunk = validate_chunk(completion.chunk)
                problem = _chunk_problem(chunk)
            except ValidationError as exc:
                problem = f"invalid chunk: {exc}"
            if problem is not None:
                self._release(effect)
                yield None
                raise _generic(problem, "InvalidChunkError", "INVALID_CHUNK")
            assert chunk is not None
            event = self._append(ASSISTANT_CHUNK, {"turn": self._turn, "step": self._step,
                                                   "chunk": chunk})  # §9.7 step 3 (R9.7.3)
            seqs.append(event.seq)
            yield None
            chunk_type = chunk["type"]  # §9.7 step 4 (R9.7.4): fold (P12)
            if chunk_type in ("text", "reasoning"):
                text = chunk["text"]
                assert isinstance(text, str)
                if previous_type == chunk_type:
                    last = content[-1]
                    assert isinstance(last, FrozenDict)
                    content[-1] = last.set("text", str(last["text"]) + text)
                else:
                    content.append(FrozenDict({"type": chunk_type, "text": text}))
            elif chunk_type == "tool-call":
                content.append(FrozenDict({"type": "tool-call", "id": chunk["id"],
                                           "name": chunk["name"],
                                           "arguments": chunk["arguments"]}))
            elif chunk_type == "block":
                content.append(chunk["block"])
            elif chunk_type == "usage":
                usage = chunk["usage"]
            elif chunk_type == "finish":
                finish = chunk
            assert isinstance(chunk_type, str)
            if chunk_type in ("text", "reasoning", "tool-call", "block"):
                previous_type = chunk_type  # chunks that carry no content do not break a run
        kind = finish["kind"]
        assert isinstance(kind, str)
        if kind in ("error", "aborted"):  # a request failure (§9.7 (R9.7), §13.1 (R13.1))
            raw = finish.get("failure")
            facts = (LlmFailure.from_json(raw) if raw is not None
                     else LlmFailure("model request aborted", "ABORTED"))
            raise _Stop("request", ErrorInfo(message=facts.message, name="ModelRequestError",
                                             code=facts.code, failure=facts), facts)
        return content, usage, seqs, finish

    def _request_failure(self, controller: _Controller, stop: _Stop) -> Proc:
        """§13.2 (R13.2): ``step/end``; request-error unless aborted; a retry only if still not
        aborted; a raise is a warning; classify (§15 (R15)); leave the step loop."""
        error, failure = stop.error, stop.failure
        assert error is not None and failure is not None
        self._append(STEP_END, {"turn": self._turn, "step": self._step})
        self._step_open = False
        yield None
        if controller.reason is None:
            effect = self._request(REQUEST_ERROR, turn=self._turn, step=self._step,
                                   signal=controller.signal, error=error.to_json(),
                                   failure=failure.to_json(),
                                   priorFailures=[f.to_json() for f in self._prior_failures])
            yield None
            completion = yield _Wait(frozenset({effect}))
            if isinstance(completion, Raise):
                self._warn(f"request recovery failed: {completion.error.rendered()}")
                yield None
            else:
                assert isinstance(completion, Resolve)
                if retry_action_from_json(completion.value) and controller.reason is None:
                    self._pending_retry = True
        self._prior_failures.append(failure)  # §13.3 (R13.3): the earlier failures, then this one
        yield from self._classify(controller, stop)

    # -- tool batch (§10 (R10)) ------------------------------------------------------------

    def _is_parallel(self, call: _Call) -> bool:
        """§10.2 (R10.2), P11: a call is parallel-safe when ``tool_modes`` says ``parallel``;
        unknown names are exclusive."""
        return self.config.tool_modes.get(call.name) == "parallel"

    def _batch(self, controller: _Controller, blocks: list[FrozenDict]
               ) -> Generator[_Wait | None, Completion | None, bool]:
        """§10.1–§10.11 (R10.1–R10.11) (with the project's effect realization): groups,
        ordered prepare, overlapping execute, model-ordered commit, abort pairs and batch
        failure. Returns whether a result concluded the turn."""
        calls: list[_Call] = []
        for block in blocks:  # §10.1 (R10.1)
            call_id, name, arguments = block["id"], block["name"], block["arguments"]
            assert isinstance(call_id, str) and isinstance(name, str)
            assert isinstance(arguments, str)
            calls.append(_Call(call_id, name, _plan_arguments(arguments)))
        state = _BatchState(calls)
        while (state.next_start < len(calls) and state.failed_at() is None
               and controller.reason is None):
            # §10.2 (R10.2): a new group. An exclusive call is a group of one; a parallel-safe call
            # opens a pool over the following calls while they stay parallel-safe.
            in_pool = self._is_parallel(calls[state.next_start])
            limit = self.config.max_parallel_tool_calls if in_pool else 1
            group_start = state.next_start
            group_open = True
            while True:
                # §10.2 (R10.2), §10.3 (R10.3): start calls up to the limit, committing what
                # can be committed after each start (as the original's pool does);
                # §10.7 (R10.7), §10.9 (R10.9): no start once aborted or failed.
                while (group_open and state.failed_at() is None and controller.reason is None
                       and state.inflight() < limit and state.next_start < len(calls)):
                    call = calls[state.next_start]
                    if state.next_start > group_start and not (in_pool and self._is_parallel(call)):
                        group_open = False
                        break
                    yield from self._start(controller, state)
                    if not in_pool:
                        group_open = False
                    yield from self._commit_ready(controller, state)
                if state.inflight() == 0:
                    if (state.failed_at() is not None or controller.reason is not None
                            or not group_open or state.next_start >= len(calls)):
                        break
                    continue
                yield from self._settle_one(controller, state)  # calls already dispatched are awaited
                yield from self._commit_ready(controller, state)
        failed_at = state.failed_at()
        if failed_at is not None:  # §10.9 (R10.9)
            error = calls[failed_at].error
            assert error is not None
            raise _Stop("generic", error)  # only an invalid value fails a batch (R10.9, D5)
        if controller.reason is not None:  # §10.7 (R10.7): synthetic pairs for every unstarted call
            for call in calls[state.next_start:]:
                call_event = self._append(TOOL_CALL, self._call_data(call))
                call.call_seq = call_event.seq
                yield None
                self._append_synthetic(call, "ABORTED_BEFORE_DISPATCH",
                                       ABORTED_BEFORE_DISPATCH_TEXT)
                yield None
        return state.concluded

    def _call_data(self, call: _Call) -> dict[str, JsonLike]:
        """§2 (E1): ``tool/call {turn, step, callId, name, arguments}``."""
        return {"turn": self._turn, "step": self._step, "callId": call.call_id,
                "name": call.name, "arguments": call.arguments}

    def _stage_payload(self, controller: _Controller, call: _Call) -> dict[str, JsonLike]:
        """P4: the payload of the tool stages."""
        return {"turn": self._turn, "step": self._step, "signal": controller.signal,
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

    def _start(self, controller: _Controller, state: _BatchState) -> Proc:
        """§10.3 (R10.3) read with the original: append ``tool/call``; if the signal is
        already aborted the call gets the aborted-before-dispatch result and no stage runs;
        otherwise prepare alone: a raise is the call's final error result, a value its final
        result, ``null`` goes on; then the signal check: aborted → not dispatched
        (aborted-before-dispatch, which finalize still sees), else execute."""
        call = state.calls[state.next_start]
        state.next_start += 1
        call_event = self._append(TOOL_CALL, self._call_data(call))
        call.call_seq = call_event.seq
        yield None
        if controller.reason is not None:
            call.result, call.final, call.state = (
                _aborted_result("ABORTED_BEFORE_DISPATCH", ABORTED_BEFORE_DISPATCH_TEXT),
                True, "settled")
            return
        effect = self._request(TOOL_PREPARE, **self._stage_payload(controller, call))
        yield None
        completion = yield from self._await_stage(controller, state, effect)
        if isinstance(completion, Raise):
            call.result, call.final, call.state = _result_of_raise(completion.error), True, "settled"
            return
        assert isinstance(completion, Resolve)
        if completion.value is not None:  # a final result from prepare
            result = self._validate_result(call, completion.value)
            if result is not None:
                call.result, call.final, call.state = result, True, "settled"
            return
        if controller.reason is not None:
            call.result = _aborted_result("ABORTED_BEFORE_DISPATCH", ABORTED_BEFORE_DISPATCH_TEXT)
            call.state = "settled"
            return
        call.execute_effect = self._request(TOOL_EXECUTE, **self._stage_payload(controller, call))
        call.dispatched = True
        call.state = "inflight"
        yield None

    def _settle_one(self, controller: _Controller, state: _BatchState) -> Proc:
        """§10.2 (R10.2), P6: take one dispatched call whose body has settled, the earliest
        started (as ``Promise.race`` over the pool picks the first settled in insertion order);
        if none has, wait for the next settlement, and take with it every settlement that has
        arrived (their calls settle before the batch goes on, as resolved promises do)."""
        if not any(c.dispatched and not c.taken and c.state != "inflight" for c in state.calls):
            completion = yield _Wait(state.running())
            assert completion is not None
            self._absorb(controller, state, completion)
            while (more := self._take_mail(state.running())) is not None:
                self._absorb(controller, state, more)
        call = next(c for c in state.calls if c.dispatched and not c.taken and c.state != "inflight")
        call.taken = True

    def _await_stage(self, controller: _Controller, state: _BatchState, effect: int
                     ) -> Generator[_Wait | None, Completion | None, Completion]:
        """Wait for a prepare or finalize completion. P6: a settlement of a dispatched call
        that arrives before it is taken first (its call settles), in arrival order."""
        while True:
            completion = yield _Wait(frozenset({effect}) | state.running())
            assert completion is not None
            if completion.effect == effect:
                return completion
            self._absorb(controller, state, completion)

    def _absorb(self, controller: _Controller, state: _BatchState, completion: Completion) -> None:
        """§10.11 (R10.11), R10.3.5: a body's settlement. A raise stands for an error result
        (R10.12); a valid success that settles while the signal is aborted is replaced by the
        aborted result before finalize sees it (the original replaces it at dispatch); an
        invalid value fails the call (D5)."""
        call = next(c for c in state.calls if c.execute_effect == completion.effect)
        if isinstance(completion, Raise):
            call.result, call.state = _result_of_raise(completion.error), "settled"
            return
        assert isinstance(completion, Resolve)
        result = self._validate_result(call, completion.value)
        if result is None:
            return
        if controller.reason is not None and not result.is_error:
            result = _aborted_result("ABORTED", ABORTED_TEXT, result.additional_contexts)
        call.result, call.state = result, "settled"

    def _commit_ready(self, controller: _Controller, state: _BatchState) -> Proc:
        """§10.4 (R10.4), §10.9 (R10.9): commit settled calls strictly in model order; stop at the first
        call that is not settled, and never commit the failing call or a later one."""
        while state.next_commit < state.next_start:
            failed_at = state.failed_at()
            if failed_at is not None and state.next_commit >= failed_at:
                return
            call = state.calls[state.next_commit]
            if call.state != "settled":
                return
            committed = yield from self._commit(controller, state, call)
            if not committed:
                return
            state.next_commit += 1

    def _commit(self, controller: _Controller, state: _BatchState, call: _Call
                ) -> Generator[_Wait | None, Completion | None, bool]:
        """§10.4 steps 1–5 (R10.4.1–R10.4.5) read with the original: finalize every result
        that is not final, handing it the normalized result; a raise there stands for an
        error result, a success finalized while the signal is aborted becomes the aborted
        result again (ABORTED if dispatched, else aborted-before-dispatch) with the finalized
        contexts; then append ``tool/result``, stage contexts, note ``concludesTurn``. False
        if the call failed."""
        result = call.result
        assert result is not None
        if not call.final:
            payload = self._stage_payload(controller, call)
            payload["result"] = _normal(result).to_json()
            effect = self._request(TOOL_FINALIZE, **payload)
            yield None
            completion = yield from self._await_stage(controller, state, effect)
            if isinstance(completion, Raise):
                result = _result_of_raise(completion.error)
            else:
                assert isinstance(completion, Resolve)
                finalized = self._validate_result(call, completion.value)
                if finalized is None:
                    return False
                result = finalized
                if controller.reason is not None and not result.is_error:
                    result = (_aborted_result("ABORTED", ABORTED_TEXT, result.additional_contexts)
                              if call.dispatched else
                              _aborted_result("ABORTED_BEFORE_DISPATCH",
                                              ABORTED_BEFORE_DISPATCH_TEXT,
                                              result.additional_contexts))
        result = _normal(result)
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
        yield None
        if result.concludes_turn and not result.is_error:  # §10.6 (R10.6)
            state.concluded = True
        for context in result.additional_contexts:  # §10.4 step 4 (R10.4.4)
            self._outbox.append(_Staged(context, steering=False))
        call.state = "committed"
        return True

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


@dataclass
class _BatchState:
    """The progress of one tool batch (§10 (R10))."""

    calls: list[_Call]
    next_start: int = 0
    next_commit: int = 0
    concluded: bool = False

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


if TYPE_CHECKING:
    from machine.explore import Agentlike

    def _drivable_by_the_explorer(agent: ModelAgent) -> Agentlike:
        """`machine.explore.reference_model` returns a ModelAgent as `Agentlike`: checked here."""
        return agent
