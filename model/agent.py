"""`ModelAgent`: the agent loop of ``specs/`` read as code, rule by rule, in the order the
rules state it. It is the *reference model* the machine (``machine/core``) is compared with
(the differential test, the explorer); it shares none of the machine's code (specs/ASSURANCE.md
says what the two share, and why that is safe).

How to read it
--------------
* Commands (R5 send, R16 cancel, R17 dispose, R20.2 append; P3) and completions (P4-P6)
  are plain methods: they check their input, change the state at once, and queue their
  outputs (`ModelAgent._queue`). They never run the loop.
* The loop (R6.2 onwards) is ONE Python generator, started by the wake (`ModelAgent._interval`)
  and made of the rules' procedures, each a generator that calls the next with
  ``yield from``: admission (R7), the chain of runs (R8, R12, R13), a run (R8), its steps
  (R8.4), a step (R9), the tool batch (R10), drains (R11), the flush (R12.4), a request's
  recovery (R13.2), a failed turn (R8.6, R15). Each reads straight through, step by step,
  as its rule does. In it:

  - ``yield DELIVER`` means "deliver what I queued, then go on" (P8: the loop goes on
    only once every queued output has been pulled);
  - ``completion = yield Wait(effects)`` waits for the completion of one of *effects*
    (P6), and `ModelAgent._ask` requests an effect and waits for its completion;
  - a failure that ends a turn is an exception (`Stop`): the run catches it (R8.6), and
    the step catches a request failure of its stream (R13.2).

* ``next_output`` (P1) hands out queued outputs and resumes the loop only when none is
  left (P8).

Copying and keys (R4.12). The loop's position lives in the suspended generators, which
Python cannot copy: `ModelAgent.copy` makes a new agent and replays what this one was
given (its journal of inputs and pulls, with what its log and its id minting did each
time); `ModelAgent.state_parts` reads the generators' positions and locals. That replay is
what exploring with the model costs (specs/ASSURANCE.md, "The reference model's form").
"""

from __future__ import annotations

import functools
import json
import logging
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, ParamSpec, TypeAlias, TypeVar

from machine import errors, io
from machine import events as ev
from machine import vocabulary as vocab
from machine.events import Event, LiveEvent
from machine.io import Chunk, Control, Durable, Effect, End, Input, Live, Output, Raise, Resolve
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
from machine.vocabulary import CancelCause, ErrorInfo, LlmFailure, Message, SendOptions, ToolResult

logger = logging.getLogger("turnstile.model")

#: What the loop yields for "deliver what I queued, then go on" (P8).
DELIVER: Final[None] = None

#: A completion of an effect (P4), as the loop receives it.
Completion: TypeAlias = Resolve | Raise | Chunk | End

_P = ParamSpec("_P")
_R = TypeVar("_R")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Settings:
    """P11: the static configuration the agent is made with: the request options its first
    request starts from (R9.6), each tool's mode (R10.2: unknown names are exclusive), how
    many parallel calls may be in flight, the source of ``agent/session-start`` (S18) and
    whether the agent publishes its creation (R3.1)."""

    request_options: Mapping[str, JsonLike] = field(default_factory=dict)
    tool_modes: Mapping[str, str] = field(default_factory=dict)
    max_parallel_tool_calls: int = 10
    session_start: str = "startup"
    publish: bool = True

    @classmethod
    def of(cls, config: object) -> Settings:
        """The settings *config* names, read by name (a `machine.core.CoreConfig`, say);
        the defaults for None."""
        if config is None:
            return cls()
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})


# --------------------------------------------------------------------------
# Plain records
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Queued:
    """An item of the inbox (R4.1): a message and its wakeup flag."""

    message: Message
    wakeup: bool


@dataclass(frozen=True)
class Staged:
    """An item of the outbox (R4.1): staged steering, or staged context."""

    message: Message
    steering: bool


@dataclass
class Reports:
    """The discard reports of one cancel (R16.2 step 2, D6): what it took from the inbox
    (queued items, then steering) and from the outbox's context, filled until delivered (P7)."""

    queued: list[Message] = field(default_factory=list)
    steering: list[Message] = field(default_factory=list)
    context: list[Message] = field(default_factory=list)


@dataclass
class Entry:
    """One entry of the output queue: an output, or one of a cancel's reports, made into an
    output only when it is pulled (P7); a cancel's notice names its scope."""

    output: Output | None = None
    report: Literal["inbox", "context"] | None = None
    reports: Reports | None = None
    scope: Scope | None = None


@dataclass
class Scope:
    """One effective cancel while its notice is the last output pulled (P7, D9): its reports
    (none for a keepInbox cancel until a joined one clears something), its queued ``abort``
    (none if it aborted nothing), and how much input accepted at this position it swept."""

    reports: Reports | None
    abort: Entry | None = None
    fresh: int = 0


@dataclass(frozen=True)
class EffectRecord:
    """What the agent knows of an effect still outstanding (P4); gone once the effect has
    completed or its stream is released (P5, P10)."""

    kind: str
    abandoned: bool = False  # outstanding when the agent stopped: completions dropped (P16)


@dataclass(frozen=True)
class Ending:
    """What ends a turn early: an abort (R0.7), a request failure (R13.1) or any other
    failure (R15.3), with its error and, for a request failure, its facts."""

    kind: Literal["abort", "request", "generic"]
    error: ErrorInfo | None = None
    failure: LlmFailure | None = None


class Stop(Exception):
    """An `Ending`, raised inside the loop (R0.7, R8.6, R13.2)."""

    def __init__(self, kind: Literal["abort", "request", "generic"],
                 error: ErrorInfo | None = None, failure: LlmFailure | None = None) -> None:
        super().__init__(kind)
        self.ending = Ending(kind, error, failure)


def _failed(message: str, name: str, code: str | None) -> Stop:
    """R15.3: a failure with an error of the project's names and codes."""
    return Stop("generic", ErrorInfo(message=message, name=name, code=code))


def _raised(error: ErrorInfo) -> Stop:
    """R13.1, R15.3: an effect that raised fails the turn with its error."""
    return Stop("generic", error)


@dataclass(frozen=True)
class Wait:
    """What the loop yields to wait for a completion of one of *effects* (R0.4, P6)."""

    effects: frozenset[int]


@dataclass(frozen=True)
class Answer:
    """A finished model stream (R9.7, R9.8): its folded content, the last usage chunk's
    figures, the seqs of its chunks and its finish chunk."""

    content: tuple[Frozen, ...]
    usage: Frozen
    seqs: tuple[int, ...]
    finish: FrozenDict


@dataclass(frozen=True)
class StepOutcome:
    """How a step ended (R9.10): whether the turn goes on to another step on its own, and
    whether a result concluded it or the model ran out of tokens."""

    continues: bool
    concluded: bool
    max_tokens: bool


@dataclass
class Call:
    """One planned tool call of a batch (R10.1) and what has happened to it."""

    call_id: str
    name: str
    arguments: Frozen
    state: Literal["unstarted", "running", "settled", "committed", "failed"] = "unstarted"
    call_seq: int = -1
    execute: int | None = None   # its execute effect, once dispatched (R10.3 step 5)
    taken: bool = False          # R10.2: a dispatched call counts until the batch takes it
    result: ToolResult | None = None
    final: bool = False          # R10.3: a prepare's answer, or an abort's: no finalize
    error: ErrorInfo | None = None   # R10.9: why the call failed


@dataclass
class Batch:
    """A tool batch (R10): its calls, and how far starting and committing have come."""

    signal: int                  # the run's (R8.1)
    calls: list[Call]
    next_start: int = 0
    next_commit: int = 0
    concluded: bool = False

    def in_flight(self) -> int:
        """R10.2: dispatched calls the batch has not taken yet (settled or not)."""
        return sum(1 for call in self.calls if call.execute is not None and not call.taken)

    def running(self) -> frozenset[int]:
        """The execute effects still waiting for their settlement."""
        return frozenset(call.execute for call in self.calls
                         if call.state == "running" and call.execute is not None)

    def failed_at(self) -> int | None:
        """R10.9: the first failing call in model order."""
        return next((i for i, call in enumerate(self.calls) if call.state == "failed"), None)


#: The loop: a generator that yields None (deliver what I queued) or a `Wait`, and is sent
#: the completion it waited for.
Loop: TypeAlias = Generator[Wait | None, Completion | None, _T]


def _journaled(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """An input of the agent's (a command, a completion or a pull): recorded in its journal
    when called from outside (so that `ModelAgent.copy` can replay it), then applied."""
    @functools.wraps(method)
    def recorded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        agent = args[0]
        assert isinstance(agent, ModelAgent)
        if agent._depth:
            return method(*args, **kwargs)
        agent._journal.append((method.__name__, tuple(_kept(a) for a in args[1:]),
                               tuple((key, _kept(value)) for key, value in kwargs.items())))
        agent._depth += 1
        try:
            return method(*args, **kwargs)
        finally:
            agent._depth -= 1
    return recorded


def _kept(value: object) -> object:
    """An input as the journal keeps it: a JSON value frozen as it was at the call (V6),
    anything else as it is."""
    try:
        return freeze(value)
    except Exception:
        return value


# --------------------------------------------------------------------------
# The agent
# --------------------------------------------------------------------------


class ModelAgent:
    """The reference model of `machine.core.AgentCore`: the same commands, completions and
    outputs (P1-P16), written from the spec."""

    def __init__(self, config: object = None, *, log: SessionLog | None = None,
                 clock: Callable[[], float] | None = None,
                 mint_id: Callable[[str, int], str] | None = None) -> None:
        """P11: the agent starts idle over *log* (R4.7: its turns follow the log's); when it
        publishes, ``session/created``, ``agent/created`` and ``agent/session-start`` are its
        first outputs (R3.1, S18)."""
        self.config = Settings.of(config)
        self.log = log if log is not None else SessionLog(clock=clock)
        self._mint = mint_id if mint_id is not None else _minted
        # R4: the queues and the state of the routing rules.
        self._queued: list[Queued] = []
        self._outbox: list[Staged] = []
        self._busy = False                       # R4.2
        self._window = False                     # R4.3
        self._owner: int | None = None           # R4.4: the signal of the abort owner
        self._wake_tick: int | None = None       # R4.6, R6.1: the pending wake's tick
        self._header_logged = False              # R4.8
        self._pending_retry = False              # R4.9
        self._prior_failures: list[LlmFailure] = []   # R13.2
        self._disposal: Literal["none", "disposing", "torn down"] = "none"   # R17
        self._failure: ErrorInfo | None = None   # P16
        # The turn in progress (R8).
        self._turn = 0
        self._step = 0
        self._step_open = False                  # R4.5
        self._reason: dict[str, JsonLike] = {"kind": "completed"}   # V19
        self._settle: dict[str, JsonLike] = {"kind": "completed"}   # V20
        # The protocol's state (P1-P10): outputs, the cancel being delivered, effects,
        # controllers (by signal, with the first cause that aborted each, R16.3), mail.
        self._out: list[Entry] = []
        self._cancel_scope: Scope | None = None
        self._effects: dict[int, EffectRecord] = {}    # the outstanding ones
        self._next_effect = 0
        self._next_signal = 1
        self._aborts: dict[int, CancelCause | None] = {}
        self._mail: list[tuple[int, Completion]] = []
        # The loop (R4.10), and what it waits for.
        self._loop: Loop[None] | None = None
        self._waiting: frozenset[int] | None = None
        # What copy() replays (not state: the history that led to it).
        self._seed_length = len(self.log)
        self._journal: list[tuple[str, tuple[object, ...], tuple[tuple[str, object], ...]]] = []
        self._outcomes: list[object] = []        # each append's and id's outcome, in order
        self._replaying: deque[object] | None = None
        self._depth = 0
        if self.config.publish:
            self._live(ev.SESSION_CREATED)
            self._live(ev.AGENT_CREATED, status="idle")
            self._live(ev.SESSION_START, source=self.config.session_start)

    # -- read-only state (R4, R17, R18, P10, P16) --------------------------------------

    @property
    def status(self) -> str:
        """R4.2: ``running`` for the whole running interval, else ``idle``."""
        return "running" if self._busy else "idle"

    @property
    def accepts_next_step(self) -> bool:
        """R4.3: the next-step acceptance window."""
        return self._window

    @property
    def pending_queued(self) -> int:
        """R4.1: the items in the inbox."""
        return len(self._queued)

    @property
    def pending_steering(self) -> int:
        """R4.1: the staged steering items."""
        return self._count_staged(steering=True)

    @property
    def pending_context(self) -> int:
        """R4.1: the staged context items."""
        return self._count_staged(steering=False)

    def _count_staged(self, *, steering: bool) -> int:
        return [item.steering for item in self._outbox].count(steering)

    @property
    def wake_pending(self) -> bool:
        """R4.6: from a wake request until that wake runs."""
        return self._wake_tick is not None

    @property
    def retry_pending(self) -> bool:
        """R4.9: recovery authorized a retry that has not started."""
        return self._pending_retry

    @property
    def is_quiescent(self) -> bool:
        """R18, R17.4: not busy, no wake pending, no waking item queued."""
        return not (self._busy or self.wake_pending or self._has_waking())

    @property
    def disposing(self) -> bool:
        """R17: dispose() was called and the teardown has not happened yet."""
        return self._disposal == "disposing"

    @property
    def disposed(self) -> bool:
        """R17.3: the teardown has happened."""
        return self._disposal == "torn down"

    @property
    def failure(self) -> ErrorInfo | None:
        """P16: what stopped the loop, if it stopped."""
        return self._failure

    @property
    def outstanding_effects(self) -> tuple[int, ...]:
        """P4, P10: the effects requested and not yet completed or released."""
        return tuple(i for i, record in self._effects.items() if not record.abandoned)

    def signal_reason(self, signal: int) -> CancelCause | None:
        """R16.3: the first cause that aborted *signal*, or None."""
        return self._aborts.get(signal)

    def _has_waking(self) -> bool:
        """R7.1: a waking item is queued."""
        return any(item.wakeup for item in self._queued)

    # -- outputs (P1, P7, P8) -------------------------------------------------------------

    @_journaled
    def next_output(self) -> Output | None:
        """P1: the next output, or None when the agent waits for an input. P8: the loop goes
        on only when every queued output has been pulled."""
        while True:
            while self._out:
                output = self._pull()
                if output is not None:
                    return output
            if not self._advance():
                return None

    def drain_outputs(self) -> list[Output]:
        """P1: every output available now."""
        outputs: list[Output] = []
        while (output := self.next_output()) is not None:
            outputs.append(output)
        return outputs

    def _pull(self) -> Output | None:
        """P1, P7: take the queue's head. Pulling anything ends the delivery of a cancel's
        notice; pulling a notice begins it. A report is made now, and is nothing if empty."""
        entry = self._out.pop(0)
        self._cancel_scope = None
        if entry.report is not None:
            assert entry.reports is not None
            taken = (entry.reports.queued + entry.reports.steering if entry.report == "inbox"
                     else entry.reports.context)
            if not taken:
                return None
            kind = ev.INBOX_DISCARD if entry.report == "inbox" else ev.CONTEXT_DISCARD
            return Live(LiveEvent(kind, _payload(messages=[_json(m) for m in taken])))
        if entry.scope is not None:
            self._cancel_scope = entry.scope
            entry.scope.fresh = 0
        assert entry.output is not None
        return entry.output

    def _queue(self, output: Output) -> None:
        """P8: queue an output (see `_enter`)."""
        self._enter(Entry(output=output))

    def _enter(self, entry: Entry) -> None:
        """P7: an entry is queued last, but while a cancel's notice is being delivered,
        before what that cancel still has queued (its reports, its abort)."""
        scope = self._cancel_scope
        if scope is not None:
            for index, queued in enumerate(self._out):
                if queued is scope.abort or (queued.report is not None
                                             and queued.reports is scope.reports):
                    self._out.insert(index, entry)
                    return
        self._out.append(entry)

    def _live(self, type_: str, **payload: JsonLike) -> None:
        """R3.1: a live notification."""
        self._queue(Live(LiveEvent(type_, _payload(**payload))))

    def _warn(self, text: str) -> None:
        """R0.8: a warning, logged and delivered as ``agent/warning``."""
        logger.warning("%s", text)
        self._live(ev.WARNING, text=text)

    def _append(self, type_: str, data: JsonLike, *, sources: Sequence[int] | None = None
                ) -> Event:
        """R0.1: append one of the loop's events and queue it (P1: committed when pulled);
        a message it appends is a surface event (E2)."""
        surface = type_ in (ev.USER_MESSAGE, ev.STEERING_MESSAGE, ev.ASSISTANT_MESSAGE,
                            ev.TOOL_RESULT)
        event = self._log_append(type_, data, surface_op="append" if surface else None,
                                 source_event_seqs=sources)
        self._queue(Durable(event))
        return event

    def _request(self, kind: io.EffectKind, *, history_end: int | None = None,
                 **payload: JsonLike) -> int:
        """P4: request an effect, with the next id (0, 1, 2, ...), and queue it."""
        effect = self._next_effect
        self._next_effect += 1
        self._effects[effect] = EffectRecord(kind)
        history = self.log.history(history_end) if history_end is not None else None
        self._queue(Effect(effect, kind, _payload(**payload), history))
        return effect

    def _ask(self, kind: io.EffectKind, **payload: JsonLike) -> Loop[Completion]:
        """P4, P6, P8: request an effect, deliver the request, wait for its completion."""
        effect = self._request(kind, **payload)
        yield DELIVER
        completion = yield Wait(frozenset({effect}))
        assert completion is not None
        return completion

    @staticmethod
    def _value(completion: Completion) -> JsonLike:
        """An effect's resolution; one that raised fails the turn (R13.1, R15.3)."""
        if isinstance(completion, Raise):
            raise _raised(completion.error)
        assert isinstance(completion, Resolve)
        return completion.value

    # -- the loop's progress (P6, P8, P16) ----------------------------------------------

    def _advance(self) -> bool:
        """Move the loop on, if it can; whether it did. With no loop: the wake once its tick
        has completed (R6.2), or the teardown of a disposing agent that is quiescent (R17.4).
        A loop that waits goes on once a completion it waits for has arrived (P6). Moving on
        ends the delivery of a cancel's notice (P7)."""
        completion: Completion | None = None
        if self._loop is None:
            if self._wake_tick is not None:
                if self._take_mail(frozenset({self._wake_tick})) is None:
                    return False
                self._wake_tick = None              # R6.2: the wake runs
                self._loop = self._interval()
            elif self._disposal == "disposing" and self.is_quiescent:
                self._cancel_scope = None
                self._teardown()
                return True
            else:
                return False
        elif self._waiting is not None:
            completion = self._take_mail(self._waiting)
            if completion is None:
                return False
            self._waiting = None
        self._cancel_scope = None
        try:
            yielded = self._loop.send(completion)
        except StopIteration:
            self._loop = None
            return True
        except BaseException as error:              # P16: the loop cannot go on
            self._loop = None
            self._stop(error)
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise                               # an exit goes on, the agent stopped
            return True
        self._waiting = yielded.effects if yielded is not None else None
        return True

    def _take_mail(self, effects: frozenset[int]) -> Completion | None:
        """P6: the oldest buffered completion of one of *effects*, taken; the others wait."""
        for index, (effect, completion) in enumerate(self._mail):
            if effect in effects:
                del self._mail[index]
                return completion
        return None

    def _stop(self, error: BaseException) -> None:
        """P16: the loop failed outside any turn it could fail in order: the agent stops.
        It waits for nothing any more (what was outstanding is abandoned: its completions
        are accepted and dropped); a disposing agent reports what is queued (R17.4); busy,
        the window, the owner and a pending wake or retry are cleared; ``agent/error``
        names the failure, then ``idle`` if the agent was busy."""
        info = vocab.internal_error(error)
        self._failure = info
        self._waiting = None
        self._mail = []
        for effect, record in list(self._effects.items()):
            self._effects[effect] = EffectRecord(record.kind, abandoned=True)
        self._wake_tick = None
        self._owner = None
        self._pending_retry = False
        self._cancel_scope = None
        if self._disposal != "none":
            self._cancel(vocab.DISPOSED_CAUSE, keep_inbox=False)
        was_busy = self._busy
        self._busy = False
        self._window = False
        self._live(ev.ERROR, turn=self._turn, step=self._step, error=info.to_json())
        if was_busy:
            self._live(ev.STATUS, status="idle")

    # -- completions (P4-P6, P10) ---------------------------------------------------------

    def _record(self, effect: int) -> EffectRecord:
        """P10: a completion needs an effect that is outstanding (an abandoned one takes it
        and drops it, P16). Ids are issued in order from 0 (P4), so one below the next id
        that is not outstanding has completed, or its stream was released."""
        record = self._effects.get(effect) if type(effect) is int else None
        if record is None:
            if type(effect) is int and 0 <= effect < self._next_effect:
                raise errors.ProtocolError(f"effect {effect} was already completed or released")
            raise errors.ProtocolError(f"effect {shown(effect)} was never requested")
        return record

    def _complete(self, effect: int, completion: Completion, *, ends: bool) -> None:
        """P6: buffer *completion* until the loop waits for it; *ends* says it is the
        effect's last (not a chunk). An abandoned effect's completion is dropped (P16)."""
        record = self._record(effect)
        if ends:
            del self._effects[effect]
        if not record.abandoned:
            self._mail.append((effect, completion))

    @_journaled
    def resolve(self, effect: int, value: JsonLike = None) -> None:
        """P4: an effect resolved with *value* (V6: as it is now); a model stream is not."""
        record = self._record(effect)
        if record.kind == io.MODEL and not record.abandoned:
            raise errors.ProtocolError(f"effect {effect} is a model call: use chunk/end or raise")
        self._complete(effect, Resolve(effect, snapshot(value)), ends=True)

    @_journaled
    def fail(self, effect: int, error: ErrorInfo) -> None:
        """P4: an effect raised *error* (an ErrorInfo, checked however it was built, V2)."""
        if not isinstance(error, ErrorInfo):
            raise errors.ProtocolError("raise needs an ErrorInfo")
        self._complete(effect, Raise(effect, ErrorInfo.checked(error)), ends=True)

    @_journaled
    def chunk(self, effect: int, chunk: JsonLike) -> None:
        """P4, P12: a chunk of a model stream."""
        record = self._record(effect)
        if record.kind != io.MODEL and not record.abandoned:
            raise errors.ProtocolError(f"effect {effect} is not a model call")
        self._complete(effect, Chunk(effect, snapshot(chunk)), ends=False)

    @_journaled
    def end(self, effect: int) -> None:
        """P4, P12: the end of a model stream."""
        record = self._record(effect)
        if record.kind != io.MODEL and not record.abandoned:
            raise errors.ProtocolError(f"effect {effect} is not a model call")
        self._complete(effect, End(effect), ends=True)

    def _release(self, effect: int) -> None:
        """P5: stop consuming a model stream: it counts as completed, what is buffered for it
        is dropped, and ``release`` is queued, unless the stream had already ended."""
        outstanding = self._effects.pop(effect, None) is not None
        self._mail = [(i, c) for i, c in self._mail if i != effect]
        if outstanding:
            self._queue(Control("release", FrozenDict({"effect": effect})))

    def feed(self, item: Input) -> None:
        """P9: one input, as a value."""
        match item:
            case io.Send(message=message, options=options):
                self.send(message, options)
            case io.Cancel(cause=cause, keep_inbox=keep):
                self.cancel(cause, keep)
            case io.Dispose():
                self.dispose()
            case io.Observer():
                return          # P14: an observer's failure or veto is the driver's own
            case io.Append():
                self.append(item.type, item.data, surface_op=item.surface_op,
                            source_event_seqs=item.source_event_seqs, ignorable=item.ignorable)
            case Resolve(effect=effect, value=value):
                self.resolve(effect, value)
            case Raise(effect=effect, error=error):
                self.fail(effect, error)
            case Chunk(effect=effect, chunk=chunk):
                self.chunk(effect, chunk)
            case End(effect=effect):
                self.end(effect)
            case _:
                raise errors.ProtocolError(f"not an input: {shown(item)}")

    # -- commands (R5, R16, R17, R20.2, P3, P7) -------------------------------------------

    def _usable(self) -> None:
        """R17.3, P16: once torn down or stopped, only dispose() may be called."""
        if self.disposed:
            raise errors.DisposedError("the agent is disposed")
        if self._failure is not None:
            raise errors.CoreFailedError(f"the core stopped after an internal failure "
                                  f"({self._failure.message}); only dispose() may be called")

    @_journaled
    def send(self, message: JsonLike, options: JsonLike) -> None:
        """R5: the options are validated, then the message (R5.1), each as it is now (V6).
        R5.2: a next-step send without wakeup is context: staged while the window is open,
        appended at once while it is closed (D4). R5.3: a next-step send with wakeup is
        steering while the window is open; anything else is queued. R5.4: a queued waking
        item asks for the wake before it is announced. R5.5: queued and steering items are
        announced. R5.6: where a send goes depends on the window alone. P7: input accepted
        while a cancel's notice is being delivered is cleared by that cancel: it goes into
        its reports instead."""
        self._usable()
        target = SendOptions.from_json(snapshot(options))
        message_ = vocab.validate_user_message(snapshot(message))
        if target.target == "next-step" and not target.wakeup:       # context
            if not self._window:
                self._command_append(ev.USER_MESSAGE, _json(message_), "append")
                return
            reports = self._swept()
            if reports is not None:
                reports.context.append(message_)
            else:
                self._outbox.append(Staged(message_, steering=False))
            return
        steering = target.target == "next-step" and self._window
        reports = self._swept()
        if steering:
            if reports is None:
                self._outbox.append(Staged(message_, steering=True))
        else:
            if reports is None:
                self._queued.append(Queued(message_, target.wakeup))
            if target.wakeup:
                self._request_wake()
        self._live(ev.INBOX_ENQUEUE, message=_json(message_),
                   placement="steering" if steering else "queued")
        if reports is not None:
            (reports.steering if steering else reports.queued).append(message_)

    def _swept(self) -> Reports | None:
        """P7, D9: the reports of the cancel whose notice is being delivered, if it cleared
        the inbox: input accepted now goes there (and counts as new for a joined cancel)."""
        scope = self._cancel_scope
        if scope is None or scope.reports is None:
            return None
        scope.fresh += 1
        return scope.reports

    def followup(self, message: JsonLike) -> None:
        """V10: next turn, with wakeup."""
        self.send(message, {"target": "next-turn", "wakeup": True})

    def steer(self, message: JsonLike) -> None:
        """V10: next step, with wakeup."""
        self.send(message, {"target": "next-step", "wakeup": True})

    def inject(self, message: JsonLike) -> None:
        """V10: next step, without wakeup."""
        self.send(message, {"target": "next-step", "wakeup": False})

    def _request_wake(self) -> None:
        """R6.1: the wake's tick is requested, unless the agent is busy or a wake is pending."""
        if self._busy or self.wake_pending:
            return
        self._wake_tick = self._request(io.TICK, purpose="wake")

    @_journaled
    def cancel(self, cause: JsonLike, keep_inbox: bool = False) -> None:
        """R16, V11: the cause ({kind: user} or {kind: parent}) and keepInbox are checked,
        then the cancel."""
        self._usable()
        parsed = CancelCause.from_json(snapshot(cause))
        if not isinstance(keep_inbox, bool):
            raise errors.ValidationError("keepInbox", "must be a bool")
        self._cancel(parsed, keep_inbox)

    def _cancel(self, cause: CancelCause, keep_inbox: bool) -> None:
        """R16.1: a cancel does something when there is an owner to abort, a retry pending,
        or (without keepInbox) something queued or staged. R16.2, all at once (P7): its
        notice (none for dispose), then (without keepInbox) everything queued and staged
        taken into its reports (D6), the pending retry dropped (D2), and the owner aborted
        with its cause unless already aborted (R16.3). A cancel issued while another's
        notice is being delivered joins that one (D9)."""
        if self._cancel_scope is not None:
            self._join(self._cancel_scope, cause, keep_inbox)
            return
        if not (self._owner is not None or self._pending_retry
                or (not keep_inbox and (self._queued or self._outbox))):
            return
        scope = Scope(reports=None if keep_inbox else self._take_everything())
        if cause.kind != "disposed":
            self._enter(Entry(output=_cancel_notice(cause), scope=scope))
        if scope.reports is not None:
            self._enter(Entry(report="inbox", reports=scope.reports))
            self._enter(Entry(report="context", reports=scope.reports))
        self._pending_retry = False
        owner = self._owner
        if owner is not None and self._aborts[owner] is None:
            self._aborts[owner] = cause
            scope.abort = Entry(output=_abort_notice(owner, cause))
            self._enter(scope.abort)

    def _join(self, scope: Scope, cause: CancelCause, keep_inbox: bool) -> None:
        """D9, P7: a cancel issued by an observer of another cancel's notice runs before that
        cancel clears and aborts, so it is the one that aborts (its cause is the reason). It
        does anything only if it has something new to clear: when the first cancel cleared,
        the input accepted at this position (in its reports already); when it kept the
        inbox, whatever is queued or staged now, reported ahead of the first cancel's abort
        (but after the notice announcing an item the reports list)."""
        if keep_inbox:
            return
        new = scope.fresh if scope.reports is not None else len(self._queued) + len(self._outbox)
        if not new:
            return                                  # nothing new to clear: a no-op
        if cause.kind != "disposed":
            self._enter(Entry(output=_cancel_notice(cause), scope=scope))
        if scope.reports is not None:
            scope.fresh = 0
        else:
            taken = self._take_everything()
            listed = {m.id for m in taken.queued + taken.steering + taken.context}
            at = next((i for i, e in enumerate(self._out) if e is scope.abort), len(self._out))
            for index, entry in enumerate(self._out):
                if _announces(entry.output, listed):
                    at = max(at, index + 1)
            self._out[at:at] = [Entry(report="inbox", reports=taken),
                                Entry(report="context", reports=taken)]
            scope.reports = taken
        self._pending_retry = False
        owner = self._owner
        if scope.abort is not None and owner is not None:
            self._aborts[owner] = cause
            scope.abort.output = _abort_notice(owner, cause)

    def _take_everything(self) -> Reports:
        """R16.2 step 2: the queued items, the staged steering, the staged context, each in
        order; the inbox and the outbox are empty after."""
        reports = Reports(queued=[item.message for item in self._queued],
                          steering=[item.message for item in self._outbox if item.steering],
                          context=[item.message for item in self._outbox if not item.steering])
        self._queued = []
        self._outbox = []
        return reports

    @_journaled
    def dispose(self) -> None:
        """R17.1 steps 1-2: the agent is disposing and cancels with cause disposed at once
        (no notice). A no-op once torn down (R17.3)."""
        if self.disposed:
            return
        self._disposal = "disposing"
        self._cancel(vocab.DISPOSED_CAUSE, keep_inbox=False)

    @_journaled
    def append(self, type: str, data: JsonLike, *, surface_op: JsonLike = None,
               source_event_seqs: Sequence[int] | None = None, ignorable: bool = False) -> Event:
        """R20.2, P3: a direct append by extension code, checked by the log, committed and
        queued; R20.4: while busy, the loop's own event types are refused (after the log's
        own verdict); D16: *ignorable* marks an extension event."""
        self._usable()
        if isinstance(type, str):
            type = str.__str__(type)
            if self._busy and type in (ev.TURN_START, ev.TURN_END, ev.STEP_START, ev.STEP_END,
                                       ev.ASSISTANT_CHUNK, ev.ASSISTANT_MESSAGE, ev.TOOL_CALL,
                                       ev.TOOL_RESULT):
                self.log.check(type, data, surface_op=surface_op,
                               source_event_seqs=source_event_seqs, ignorable=ignorable)
                raise errors.InvariantError("R20.4", f"{type} is written by the loop itself: a direct "
                                     "append of it is refused while the agent is busy")
        return self._command_append(type, data, surface_op, source_event_seqs, ignorable)

    def _command_append(self, type_: str, data: JsonLike, surface_op: JsonLike = None,
                        source_event_seqs: Sequence[int] | None = None,
                        ignorable: bool = False) -> Event:
        """P3, P16: a command's append; any failure of it but the log's own refusal is an
        errors.InvariantError (nothing was appended)."""
        try:
            event = self._log_append(type_, data, surface_op=surface_op,
                                     source_event_seqs=source_event_seqs, ignorable=ignorable)
        except (errors.TurnstileError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:
            raise errors.InvariantError("L2", f"{type_}: nothing was appended: "
                                 f"{vocab.failure_text(error)}") from error
        self._queue(Durable(event))
        return event

    def _teardown(self) -> None:
        """R17.1 step 3, R17.4: what the inbox and the outbox still hold is reported (inbox,
        then context), then ``agent/disposed`` and ``session/disposed``."""
        reports = self._take_everything()
        dropped, contexts = reports.queued + reports.steering, reports.context
        if dropped:
            self._live(ev.INBOX_DISCARD, messages=[_json(m) for m in dropped])
        if contexts:
            self._live(ev.CONTEXT_DISCARD, messages=[_json(m) for m in contexts])
        self._live(ev.AGENT_DISPOSED)
        self._live(ev.SESSION_DISPOSED)
        self._disposal = "torn down"

    # -- the loop: the running interval (R6.2, R7.1, R12.7) -------------------------------

    def _new_controller(self) -> int:
        """R4.4: a fresh abort controller, by its signal."""
        signal = self._next_signal
        self._next_signal += 1
        self._aborts[signal] = None
        return signal

    def _aborted(self, signal: int) -> bool:
        """R0.7: whether *signal*'s controller is aborted."""
        return self._aborts[signal] is not None

    def _check(self, signal: int) -> None:
        """R0.7: a signal check: an aborted signal ends the turn."""
        if self._aborted(signal):
            raise Stop("abort")

    def _interval(self) -> Loop[None]:
        """R6.2, R12.7: the wake claims the head of the inbox while a waking item is queued,
        and each admission comes back here (continue-or-idle); then the running interval
        ends with ``idle``. R17.4: a disposing agent never claims: a waking item found is
        discarded by a cancel with cause disposed."""
        while True:
            if self._disposal != "none" and self._has_waking():
                self._cancel(vocab.DISPOSED_CAUSE, keep_inbox=False)
            if not self._has_waking():
                break
            yield from self._admission(self._queued.pop(0).message)    # R7.2: the claim
        if self._busy:
            self._busy = False
            self._live(ev.STATUS, status="idle")
            yield DELIVER

    # -- admission (R7) -----------------------------------------------------------------

    def _admission(self, claimed: Message) -> Loop[None]:
        """R7.3: the admission's controller owns the abort and the window opens. R7.4: a
        claim while not busy starts the running interval. R7.5: an admission aborted by then
        is rejected without asking (its rejected path runs up to its tick before the
        dequeue notice, P15). R7.6: the dequeue notice; R7.7: prompt-submit decides. R7.8:
        the owner goes away; R7.9: an allowed prompt runs; R7.10: a rejected one does not."""
        inherited = len(self._outbox)              # R8.3.1: what the run will inherit
        signal = self._new_controller()
        self._owner = signal
        self._window = True
        if not self._busy:
            self._busy = True
            self._live(ev.STATUS, status="running")
            yield DELIVER
        if self._aborted(signal):
            self._owner = None
            yield from self._rejected()
            self._live(ev.INBOX_DEQUEUE, message=_json(claimed), placement="queued")
            yield DELIVER
            yield from self._rejected_tick()
            return
        admitted = yield from self._prompt_submit(claimed, signal)
        self._owner = None
        if admitted is None:
            yield from self._rejected()
            yield from self._rejected_tick()
            return
        trigger: JsonLike = {"kind": "message", "source": claimed.source}
        yield from self._chain(trigger, admitted, inherited)

    def _prompt_submit(self, claimed: Message, signal: int
                       ) -> Loop[tuple[Message, ...] | None]:
        """R7.6-R7.7, R7.11: the dequeue notice is delivered after the request; the decision
        admits ``[prompt, *additionalContexts]`` (the prompt as the decision rewrote it), or
        rejects (None): a block, an aborted admission (its decision ignored), a raise or an
        invalid decision (these two with a warning)."""
        effect = self._request(io.PROMPT_SUBMIT, message=_json(claimed), signal=signal)
        yield DELIVER
        self._live(ev.INBOX_DEQUEUE, message=_json(claimed), placement="queued")
        yield DELIVER
        completion = yield Wait(frozenset({effect}))
        if self._aborted(signal):
            return None
        if isinstance(completion, Raise):
            self._warn(f"prompt admission failed: {completion.error.rendered()}")
            yield DELIVER
            return None
        assert isinstance(completion, Resolve)
        try:
            decision = vocab.decision_from_json(completion.value)
        except errors.ValidationError as problem:
            self._warn(f"prompt admission returned an invalid decision: {problem}")
            yield DELIVER
            return None
        if not isinstance(decision, vocab.Allow):
            return None
        prompt = claimed if decision.content is None else Message(
            id=claimed.id, role=claimed.role, content=decision.content, source=claimed.source)
        return (prompt, *decision.additional_contexts)

    def _rejected(self) -> Loop[None]:
        """R7.10.1: the window closes. R7.10.2: unless steering is staged, the staged context
        is appended between turns, item by item (P16: one the log refuses stays staged, with
        a warning, and the rest with it)."""
        self._window = False
        if any(item.steering for item in self._outbox):
            return
        while self._outbox:
            try:
                self._append(ev.USER_MESSAGE, _json(self._outbox[0].message))
            except Exception as error:
                self._warn(f"staged context could not be written: {vocab.failure_text(error)}")
                yield DELIVER
                return
            self._outbox.pop(0)
            yield DELIVER

    def _rejected_tick(self) -> Loop[None]:
        """R7.10.3: one tick, then continue-or-idle."""
        yield from self._ask(io.TICK, purpose="rejected-admission")

    # -- the chain of runs (R8.8, R12.4-R12.6, R13.3) -----------------------------------

    def _chain(self, trigger: JsonLike, admitted: tuple[Message, ...], inherited: int
               ) -> Loop[None]:
        """R8.8: the run of an admitted prompt and its retries. R12.4: after each turn, the
        flush. R12.5: a retry authorized by recovery starts a new run (no settlement, no
        status change; R13.3: its trigger is retry). R12.6: otherwise ``agent/settled``."""
        self._prior_failures = []                     # R13: a new chain of requests
        while True:
            if not (yield from self._run(trigger, admitted, inherited)):
                return                                # P16: no turn, nothing to flush
            yield from self._flush()
            if not self._pending_retry:
                break
            self._pending_retry = False
            trigger, admitted, inherited = {"kind": "retry"}, (), 0
        self._live(ev.SETTLED, turn=self._turn, reason=self._settle)
        yield DELIVER

    def _flush(self) -> Loop[None]:
        """R12.4: the flush barrier; a failure of it is a warning and ``agent/error``, and the
        work goes on."""
        completion = yield from self._ask(io.FLUSH, turn=self._turn)
        if isinstance(completion, Raise):
            self._warn(f"session flush failed at turn {self._turn}: "
                       f"{completion.error.rendered()}")
            yield DELIVER
            self._live(ev.ERROR, turn=self._turn, step=self._step,
                       error=completion.error.to_json())
            yield DELIVER

    # -- a run (R8.1-R8.7) --------------------------------------------------------------

    def _run(self, trigger: JsonLike, admitted: tuple[Message, ...], inherited: int
             ) -> Loop[bool]:
        """R8.1: a fresh run controller owns the abort and the window is open; the turn is
        the log's next (R4.7). R8.2: ``turn/start`` (P16: when the log refuses it there is no
        turn: ``agent/error`` at step 0, and False). R8.3: the inherited drain, the admitted
        messages, a signal check, the drain. R8.4-R8.5: the steps. R8.6: a failure in any of
        these fails the turn. R8.7: the window closes, ``turn/end``, the owner goes away."""
        signal = self._new_controller()
        self._owner = signal
        self._window = True
        self._turn = self.log.last_turn + 1
        self._reason = {"kind": "completed"}
        self._settle = {"kind": "completed"}
        self._step = 0
        self._step_open = False
        try:
            self._append(ev.TURN_START, {"turn": self._turn, "trigger": trigger})
        except Exception as error:
            self._window = False
            self._owner = None
            self._pending_retry = False
            self._live(ev.ERROR, turn=self._turn, step=0,
                       error=vocab.internal_error(error).to_json())
            yield DELIVER
            return False
        yield DELIVER
        failed: Ending | None = None
        try:
            yield from self._turn_body(signal, admitted, inherited)
        except Exception as error:
            failed = _ending_of(error)
        if failed is not None:
            yield from self._fail(signal, failed)
        self._window = False
        yield from self._closing(signal, ev.TURN_END)
        self._owner = None
        return True

    def _turn_body(self, signal: int, admitted: tuple[Message, ...], inherited: int
                   ) -> Loop[None]:
        """R8.3.1: a drain of the items staged before the admission (no more than are left);
        R8.3.2: the admitted messages; R8.3.3: a signal check; R8.3.4: a drain. Then the
        steps of the turn (R8.4, R8.5)."""
        yield from self._drain(min(inherited, len(self._outbox)))     # R8.3.1
        for message in admitted:                                      # R8.3.2
            self._append(ev.USER_MESSAGE, _json(message))
            yield DELIVER
        self._check(signal)                                           # R8.3.3
        yield from self._drain(None)                                  # R8.3.4
        while (yield from self._step_and_next(signal)):
            pass

    def _step_and_next(self, signal: int) -> Loop[bool]:
        """R8.4: the next step; whether the turn goes on to another one. R13.4: a step that
        completes ends the chain of failed requests; R14.3: a max-tokens finish is the
        turn's reason. A concluding result ends the turn with no signal check; a step with
        tool calls that did not conclude, or steering taken or staged, goes on. R8.5:
        otherwise turn-stopping, a signal check and a drain: steering taken goes on."""
        self._step += 1
        outcome = yield from self._one_step(signal)
        if outcome is None:                           # R13.2.5: a request failure was handled
            return False
        self._prior_failures = []
        if outcome.max_tokens:
            self._reason = {"kind": "max-tokens"}
        if outcome.concluded:
            return False
        if outcome.continues or any(item.steering for item in self._outbox):
            return True
        completion = yield from self._ask(io.TURN_STOPPING, turn=self._turn, signal=signal)
        self._value(completion)
        self._check(signal)
        return (yield from self._drain(None))

    def _closing(self, signal: int, type_: str) -> Loop[None]:
        """P16: the ``step/end`` or ``turn/end`` that closes a step or the turn. The log
        refusing it is the turn's failure (R15) and the append is tried once more; a second
        refusal goes on (the agent stops)."""
        refused: Ending | None = None
        try:
            self._append(type_, self._closing_data(type_))
        except Exception as error:
            refused = _ending_of(error)
        if refused is not None:
            yield from self._classify(signal, refused)
            self._append(type_, self._closing_data(type_))
        if type_ == ev.STEP_END:
            self._step_open = False
        yield DELIVER

    def _closing_data(self, type_: str) -> JsonLike:
        if type_ == ev.TURN_END:
            return {"turn": self._turn, "reason": self._reason}
        return {"turn": self._turn, "step": self._step}

    def _fail(self, signal: int, ending: Ending) -> Loop[None]:
        """R8.6: a failed turn closes its open step, then classifies its failure."""
        if self._step_open:
            yield from self._closing(signal, ev.STEP_END)
        yield from self._classify(signal, ending)

    def _classify(self, signal: int, ending: Ending) -> Loop[None]:
        """R15.1: aborted (the controller's cause): the reason is aborted (disposed for a
        dispose), settled aborted, nothing reported. R15.2: a request failure: the reason
        carries the failure's facts with the error's rendered message. R15.3: any other:
        the reason carries the rendered message and the error's code. Both are reported as
        ``agent/error``."""
        cause = self._aborts[signal]
        if cause is not None:
            self._reason = {"kind": "disposed" if cause.kind == "disposed" else "aborted"}
            self._settle = {"kind": "aborted"}
            return
        error = ending.error
        assert error is not None
        if ending.kind == "request":
            assert ending.failure is not None
            failure = ending.failure.with_message(error.rendered()).to_json()
            self._reason = {"kind": "error", "step": self._step, "failure": failure}
            self._settle = {"kind": "error", "error": error.to_json(), "failure": failure}
        else:
            self._reason = {"kind": "error", "step": self._step, "message": error.rendered()}
            if error.code is not None:
                self._reason["code"] = error.code
            self._settle = {"kind": "error", "error": error.to_json()}
        self._live(ev.ERROR, turn=self._turn, step=self._step, error=error.to_json())
        yield DELIVER

    # -- drains (R11) ---------------------------------------------------------------------

    def _drain(self, limit: int | None) -> Loop[bool]:
        """R11.1: take the outbox's front item until it is empty (D3: what observers stage
        meanwhile joins) or *limit* items are taken (R8.3.1). Steering: the dequeue notice,
        then ``steering/message``; context: ``user/message`` (P16: taken once written).
        Whether steering was taken."""
        taken, took_steering = 0, False
        while self._outbox and (limit is None or taken < limit):
            front = self._outbox[0]
            taken += 1
            if front.steering:
                self._outbox.pop(0)
                took_steering = True
                self._live(ev.INBOX_DEQUEUE, message=_json(front.message),
                           placement="steering")
                yield DELIVER
                self._append(ev.STEERING_MESSAGE, {"turn": self._turn,
                                                   "message": _json(front.message)})
                yield DELIVER
            else:
                self._append(ev.USER_MESSAGE, _json(front.message))
                self._outbox.pop(0)
                yield DELIVER
        return took_steering

    # -- a step (R9) ----------------------------------------------------------------------

    def _one_step(self, signal: int) -> Loop[StepOutcome | None]:
        """R9.1: the step hook; R9.2: a drain; R9.3: the system prompt; R9.4: the history
        ends here; R9.5: ``step/start``; R9.6: the request; R9.7: the model stream (a request
        failure of it is recovered, R13.2: None); R9.8: the assistant message; R9.9: the tool
        batch; R9.10: a drain and ``step/end``."""
        turn, step = self._turn, self._step
        self._value((yield from self._ask(io.STEP_HOOK, turn=turn, step=step, signal=signal)))
        self._check(signal)
        yield from self._drain(None)
        system = self._system(
            (yield from self._ask(io.SYSTEM_PROMPT, turn=turn, step=step, signal=signal)))
        self._check(signal)
        history_end = len(self.log)
        self._append(ev.STEP_START, {"turn": turn, "step": step})
        self._step_open = True
        yield DELIVER
        self._check(signal)
        header, prepared = yield from self._prepare_request(signal, system)
        failed: Ending | None = None
        try:
            answer = yield from self._stream(signal, header, history_end)
        except Stop as stop:
            if stop.ending.kind != "request":
                raise
            failed = stop.ending
        if failed is not None:
            yield from self._request_failure(signal, failed, prepared)
            return None
        calls = yield from self._assistant_message(answer, header)
        concluded = False
        if calls:
            concluded = yield from self._batch(Batch(signal, _planned(calls)))
        took_steering = yield from self._drain(None)
        self._append(ev.STEP_END, {"turn": turn, "step": step})
        self._step_open = False
        yield DELIVER
        return StepOutcome(continues=(bool(calls) and not concluded) or took_steering,
                           concluded=concluded,
                           max_tokens=answer.finish["kind"] == "max-tokens")

    def _system(self, completion: Completion) -> Frozen:
        """R9.3: the system prompt, a JSON value (else the turn fails with
        INVALID_SYSTEM_PROMPT)."""
        try:
            return freeze(self._value(completion), "system")
        except errors.ValidationError as problem:
            raise _failed(str(problem), "InvalidSystemPromptError",
                          "INVALID_SYSTEM_PROMPT") from None

    def _prepare_request(self, signal: int, system: Frozen
                         ) -> Loop[tuple[FrozenDict, FrozenDict]]:
        """R9.6, P13: the request is prepared from the configured options the first time
        this agent requests (R4.8), else from the log's last header's config; its resolution
        must be ``{config, system?, tools?, retryPolicy?}`` with a config naming provider and
        model as strings (an unset one is the original's uncoded error). The header is
        appended the first time (reason initial, or resume over a log that has one) and
        whenever it changes. Returns the header and the prepared request's ``retryPolicy``
        (R13.2 hands it to recovery; empty when none is named)."""
        if not self._header_logged:
            seed: JsonLike = dict(self.config.request_options)
        else:
            last = self.log.last_header
            seed = last.get("config", FrozenDict()) if last is not None else FrozenDict()
        value = self._value((yield from self._ask(
            io.REQUEST, turn=self._turn, step=self._step, signal=signal, config=seed,
            system=system)))
        self._check(signal)
        header, prepared = _header_of(value)
        last = self.log.last_header
        reason: str | None = None
        if not self._header_logged:
            reason = "resume" if last is not None else "initial"
            self._header_logged = True
        elif last is None or canonical_json(header) != canonical_json(last):
            reason = "change"
        if reason is not None:
            self._append(ev.REQUEST_HEADER, {"header": header, "reason": reason})
            yield DELIVER
        return header, prepared

    def _stream(self, signal: int, header: FrozenDict, history_end: int) -> Loop[Answer]:
        """R9.7: the model call over the history up to *history_end* (R9.4; its messages are
        the log's derived history, R20.3); then its chunks, one by one (`_next_chunk`). The
        stream ends with a finish chunk: a finish of kind error or aborted is a request
        failure (R13.1); an end without one, or a raise, fails the turn (a raise with
        failure facts is a request failure)."""
        effect = self._request(io.MODEL, history_end=history_end, turn=self._turn,
                               step=self._step, signal=signal, header=header,
                               historyEnd=history_end)
        yield DELIVER
        stream = _Fold()
        while not stream.ended:
            yield from self._next_chunk(signal, header, effect, stream)
        finish = stream.finish
        assert finish is not None
        if finish["kind"] in ("error", "aborted"):
            raw = finish.get("failure")
            facts = (LlmFailure.from_json(raw) if raw is not None
                     else LlmFailure("model request aborted", "ABORTED"))
            raise Stop("request", ErrorInfo(message=facts.message, name="ModelRequestError",
                                            code=facts.code, failure=facts), facts)
        return Answer(tuple(stream.content), stream.usage, tuple(stream.seqs), finish)

    def _next_chunk(self, signal: int, header: FrozenDict, effect: int, stream: _Fold
                    ) -> Loop[None]:
        """R9.7, the stream's next completion: R9.7.1, a signal check (an aborted signal
        releases the stream, P5, and ends the turn, first keeping what was streamed, D15);
        R9.7.2, the chunk's validation (P12, D5: an invalid one, or one after the finish,
        releases the stream and fails the turn); R9.7.3, ``assistant/chunk``; R9.7.4, the
        fold (P12)."""
        completion = yield Wait(frozenset({effect}))
        if isinstance(completion, Raise):
            if completion.error.failure is not None:
                raise Stop("request", completion.error, completion.error.failure)
            yield from self._stream_stopped(signal, header, stream, _raised(completion.error))
        if isinstance(completion, End):
            if stream.finish is None:
                yield from self._stream_stopped(signal, header, stream, _failed(
                    "model stream ended without a finish chunk", "InvalidChunkError",
                    "INVALID_CHUNK"))
            stream.ended = True
            return
        assert isinstance(completion, Chunk)
        if self._aborted(signal):                                      # R9.7.1
            self._release(effect)
            yield DELIVER
            yield from self._keep_interrupted(header, stream)         # D15
            raise Stop("abort")
        chunk, problem = _checked_chunk(completion.chunk, stream)      # R9.7.2
        if problem is not None:
            self._release(effect)
            yield DELIVER
            raise _failed(problem, "InvalidChunkError", "INVALID_CHUNK")
        assert chunk is not None
        stream.seqs.append(self._append(ev.ASSISTANT_CHUNK, {          # R9.7.3
            "turn": self._turn, "step": self._step, "chunk": chunk}).seq)
        yield DELIVER
        stream.fold(chunk)                                             # R9.7.4

    def _stream_stopped(self, signal: int, header: FrozenDict, stream: _Fold, stop: Stop
                        ) -> Loop[None]:
        """R9.7: the stream ended in a failure; with the signal aborted it is the cancel that
        stopped it, and what it streamed is kept first (D15)."""
        if self._aborted(signal):
            yield from self._keep_interrupted(header, stream)
        raise stop

    def _keep_interrupted(self, header: FrozenDict, stream: _Fold) -> Loop[None]:
        """D15: the stream's text and reasoning blocks that are not blank (R9.7.1), in stream
        order, become the step's ``assistant/message`` marked interrupted (usage so far, every
        chunk as its sources); nothing when there are none."""
        kept = [block for block in stream.content if isinstance(block, FrozenDict)
                and block.get("type") in ("text", "reasoning")
                and str(block.get("text")).strip(vocab.WHITESPACE) != ""]
        if not kept:
            return
        config = header["config"]
        assert isinstance(config, FrozenDict)
        source = _frozen({"kind": "model", "provider": config["provider"],
                          "model": config["model"]})
        message = Message(id=self._mint_id("assistant", len(self.log)), role="assistant",
                          content=FrozenList(kept), source=source)
        data: dict[str, JsonLike] = {"turn": self._turn, "step": self._step,
                                     "message": _json(message), "interrupted": True}
        if stream.usage is not None:
            data["usage"] = stream.usage
        self._append(ev.ASSISTANT_MESSAGE, data, sources=list(stream.seqs))
        yield DELIVER

    def _assistant_message(self, answer: Answer, header: FrozenDict
                           ) -> Loop[list[FrozenDict]]:
        """R9.8: the stream's content becomes the step's ``assistant/message`` (id
        ``assistant-<seq>``, P12; its source names the provider, the model and the finish's
        replay state, V4), with the last usage and every chunk as sources; R14.1: after a
        max-tokens finish, without its tool calls. Returns its tool-call blocks (R9.9)."""
        content = list(answer.content)
        if answer.finish["kind"] == "max-tokens":
            content = [block for block in content
                       if not (isinstance(block, FrozenDict) and block.get("type") == "tool-call")]
        config = header["config"]
        assert isinstance(config, FrozenDict)
        source: dict[str, JsonLike] = {"kind": "model", "provider": config["provider"],
                                       "model": config["model"]}
        if "replayState" in answer.finish:
            source["replayState"] = answer.finish["replayState"]
        message = Message(id=self._mint_id("assistant", len(self.log)), role="assistant",
                          content=FrozenList(content), source=_frozen(source))
        data: dict[str, JsonLike] = {"turn": self._turn, "step": self._step,
                                     "message": _json(message)}
        if answer.usage is not None:
            data["usage"] = answer.usage
        self._append(ev.ASSISTANT_MESSAGE, data, sources=list(answer.seqs))
        yield DELIVER
        return [block for block in message.content
                if isinstance(block, FrozenDict) and block.get("type") == "tool-call"]

    # -- a failed request (R13.2) ---------------------------------------------------------

    def _request_failure(self, signal: int, ending: Ending, prepared: FrozenDict
                         ) -> Loop[None]:
        """R13.2.1: ``step/end``. R13.2.2: recovery is asked (unless the signal is aborted)
        with the error, its facts, the chain's earlier failures and the request's retry
        policy when it named one. R13.2.3: only exactly ``{kind: retry}`` authorizes a retry,
        if the signal is still not aborted (a raise is a warning). R13.2.4: the failure joins
        the chain's and the turn is classified (R15). R13.2.5: the turn ends."""
        error, failure = ending.error, ending.failure
        assert error is not None and failure is not None
        self._append(ev.STEP_END, {"turn": self._turn, "step": self._step})
        self._step_open = False
        yield DELIVER
        if not self._aborted(signal):
            completion = yield from self._ask(
                io.REQUEST_ERROR, turn=self._turn, step=self._step, signal=signal,
                error=error.to_json(), failure=failure.to_json(),
                priorFailures=[f.to_json() for f in self._prior_failures], **prepared)
            if isinstance(completion, Raise):
                self._warn(f"request recovery failed: {completion.error.rendered()}")
                yield DELIVER
            elif (vocab.retry_action_from_json(self._value(completion))
                  and not self._aborted(signal)):
                self._pending_retry = True
        self._prior_failures.append(failure)
        yield from self._classify(signal, ending)

    # -- the tool batch (R10) -------------------------------------------------------------

    def _batch(self, batch: Batch) -> Loop[bool]:
        """R10.2: the calls in groups: an exclusive call alone, a parallel-safe call with the
        parallel-safe ones after it (at most max_parallel_tool_calls in flight, P11). Within
        a group, calls start in order while it takes them (R10.3), and after each start, and
        after each call the batch takes, settled calls are committed in model order (R10.4);
        a dispatched call is in flight until the batch takes it, the earliest started
        settled first, waiting for a settlement when none has come (P6). R10.7, R10.9: no
        start once aborted or failed. Then R10.9: a failed call fails the turn; R10.7: an
        aborted batch gives each call it never started its aborted-before-dispatch pair.
        Whether a result concluded the turn (R10.6)."""
        calls, signal = batch.calls, batch.signal
        while (batch.next_start < len(calls) and batch.failed_at() is None
               and not self._aborted(signal)):
            first = batch.next_start
            pool = self._parallel(calls[first])
            limit = self.config.max_parallel_tool_calls if pool else 1
            taking = True
            while True:
                if (taking and batch.failed_at() is None and not self._aborted(signal)
                        and batch.in_flight() < limit and batch.next_start < len(calls)):
                    if batch.next_start > first and not (pool and self._parallel(
                            calls[batch.next_start])):
                        taking = False
                    else:
                        yield from self._start_call(batch)
                        taking = taking and pool
                        yield from self._commit_ready(batch)
                        continue
                if batch.in_flight() == 0:
                    break
                yield from self._take_settled(batch)
                yield from self._commit_ready(batch)
        failed_at = batch.failed_at()
        if failed_at is not None:
            error = calls[failed_at].error
            assert error is not None
            raise Stop("generic", error)
        if self._aborted(signal):
            for call in calls[batch.next_start:]:
                call.call_seq = self._append(ev.TOOL_CALL, self._call_data(call)).seq
                yield DELIVER
                self._append(ev.TOOL_RESULT, self._tool_result_data(call, _aborted_result(
                    "ABORTED_BEFORE_DISPATCH", vocab.ABORTED_BEFORE_DISPATCH_TEXT)),
                    sources=[call.call_seq])
                yield DELIVER
        return batch.concluded

    def _parallel(self, call: Call) -> bool:
        """R10.2, P11: tool_modes says so (an unknown name is exclusive)."""
        return self.config.tool_modes.get(call.name) == "parallel"

    def _take_settled(self, batch: Batch) -> Loop[None]:
        """R10.2, P6: the batch takes the earliest started call whose body has settled; if
        none has, it waits for a settlement and takes every settlement that has arrived with
        it (their calls settle first)."""
        if _settled(batch) is None:
            completion = yield Wait(batch.running())
            assert completion is not None
            self._settle_body(batch, completion)
            while (more := self._take_mail(batch.running())) is not None:
                self._settle_body(batch, more)
        taken = _settled(batch)
        assert taken is not None
        taken.taken = True

    def _start_call(self, batch: Batch) -> Loop[None]:
        """R10.3.1: ``tool/call``. R10.3.2: an aborted signal gives the call its
        aborted-before-dispatch result and nothing runs. R10.3.3: prepare: a raise is the
        call's final error result (R10.12), a value its final result, nothing goes on.
        R10.3.4: an aborted signal: not dispatched (finalize still sees the aborted result).
        R10.3.5: execute is dispatched."""
        call, signal = batch.calls[batch.next_start], batch.signal
        batch.next_start += 1
        call.call_seq = self._append(ev.TOOL_CALL, self._call_data(call)).seq
        yield DELIVER
        if self._aborted(signal):
            call.result, call.final, call.state = _aborted_result(
                "ABORTED_BEFORE_DISPATCH", vocab.ABORTED_BEFORE_DISPATCH_TEXT), True, "settled"
            return
        effect = self._request(io.TOOL_PREPARE, **self._stage_payload(signal, call))
        yield DELIVER
        completion = yield from self._stage(batch, effect)
        if isinstance(completion, Raise):
            call.result, call.final, call.state = _raised_result(completion.error), True, "settled"
            return
        assert isinstance(completion, Resolve)
        if completion.value is not None:
            result = self._valid_result(call, completion.value)
            if result is not None:
                call.result, call.final, call.state = result, True, "settled"
            return
        if self._aborted(signal):
            call.result, call.state = _aborted_result(
                "ABORTED_BEFORE_DISPATCH", vocab.ABORTED_BEFORE_DISPATCH_TEXT), "settled"
            return
        call.execute = self._request(io.TOOL_EXECUTE, **self._stage_payload(signal, call))
        call.state = "running"
        yield DELIVER

    def _stage(self, batch: Batch, effect: int) -> Loop[Completion]:
        """P6: the completion of a prepare or finalize; a body's settlement that arrives
        first settles its call first."""
        while True:
            completion = yield Wait(frozenset({effect}) | batch.running())
            assert completion is not None
            if completion.effect == effect:
                return completion
            self._settle_body(batch, completion)

    def _settle_body(self, batch: Batch, completion: Completion) -> None:
        """R10.3.5, R10.11: a body's settlement: a raise is an error result (R10.12); a
        valid success settled while the signal is aborted is replaced by the aborted result
        (with its contexts); an invalid value fails the call (R10.9, D5)."""
        call = next(c for c in batch.calls if c.execute == completion.effect)
        if isinstance(completion, Raise):
            call.result, call.state = _raised_result(completion.error), "settled"
            return
        assert isinstance(completion, Resolve)
        result = self._valid_result(call, completion.value)
        if result is None:
            return
        if self._aborted(batch.signal) and not result.is_error:
            result = _aborted_result("ABORTED", vocab.ABORTED_TEXT, result.additional_contexts)
        call.result, call.state = result, "settled"

    def _commit_ready(self, batch: Batch) -> Loop[None]:
        """R10.4, R10.9: commit the settled calls in model order, up to the first one that is
        not settled and never the failing call or one after it."""
        while batch.next_commit < batch.next_start:
            failed_at = batch.failed_at()
            call = batch.calls[batch.next_commit]
            if (failed_at is not None and batch.next_commit >= failed_at) or \
                    call.state != "settled":
                return
            if not (yield from self._commit(batch, call)):
                return
            batch.next_commit += 1

    def _commit(self, batch: Batch, call: Call) -> Loop[bool]:
        """R10.4.1: a result that is not final goes through finalize, which sees it
        normalized (V16): a raise there is an error result (R10.12); a success finalized
        while the signal is aborted is the aborted result again (ABORTED if dispatched, else
        aborted-before-dispatch) with the finalized contexts; an invalid value fails the call
        (False). R10.4.2: the result normalized. R10.4.3: ``tool/result``. R10.4.4: its
        contexts staged. R10.6: a successful result may conclude the turn."""
        result, signal = call.result, batch.signal
        assert result is not None
        if not call.final:
            payload = self._stage_payload(signal, call)
            payload["result"] = _normal(result).to_json()
            effect = self._request(io.TOOL_FINALIZE, **payload)
            yield DELIVER
            completion = yield from self._stage(batch, effect)
            if isinstance(completion, Raise):
                result = _raised_result(completion.error)
            else:
                assert isinstance(completion, Resolve)
                finalized = self._valid_result(call, completion.value)
                if finalized is None:
                    return False
                result = finalized
                if self._aborted(signal) and not finalized.is_error:
                    result = (_aborted_result("ABORTED", vocab.ABORTED_TEXT,
                                              finalized.additional_contexts)
                              if call.execute is not None else
                              _aborted_result("ABORTED_BEFORE_DISPATCH",
                                              vocab.ABORTED_BEFORE_DISPATCH_TEXT,
                                              finalized.additional_contexts))
        result = _normal(result)
        self._append(ev.TOOL_RESULT, self._tool_result_data(call, result),
                     sources=[call.call_seq])
        yield DELIVER
        if result.concludes_turn and not result.is_error:
            batch.concluded = True
        for context in result.additional_contexts:
            self._outbox.append(Staged(context, steering=False))
        call.state = "committed"
        return True

    @staticmethod
    def _valid_result(call: Call, value: JsonLike) -> ToolResult | None:
        """V16, R10.9, D5: a tool result is checked when it is supplied; an invalid one fails
        the call."""
        try:
            return ToolResult.from_json(value)
        except errors.ValidationError as problem:
            call.state = "failed"
            call.error = ErrorInfo(message=f"invalid tool result: {problem}",
                                   name="InvalidToolResultError", code="INVALID_TOOL_RESULT")
            return None

    def _call_data(self, call: Call) -> JsonLike:
        """E1: ``tool/call {turn, step, callId, name, arguments}``."""
        return {"turn": self._turn, "step": self._step, "callId": call.call_id,
                "name": call.name, "arguments": call.arguments}

    def _stage_payload(self, signal: int, call: Call) -> dict[str, JsonLike]:
        """P4: what each tool stage is given."""
        return {"turn": self._turn, "step": self._step, "signal": signal,
                "callId": call.call_id, "name": call.name, "arguments": call.arguments}

    def _tool_result_data(self, call: Call, result: ToolResult) -> JsonLike:
        """R10.4 step 3: ``tool/result``: a user message (id ``tool-result-<seq>``, P12) with
        one tool-result block; the error and meta of the result beside it."""
        block: dict[str, JsonLike] = {"type": "tool-result", "toolCallId": call.call_id,
                                      "content": result.content}
        if result.is_error:
            block["isError"] = True
        message = {"id": self._mint_id("tool-result", len(self.log)), "role": "user",
                   "content": [block], "source": {"kind": "tool", "callId": call.call_id}}
        data: dict[str, JsonLike] = {"turn": self._turn, "step": self._step, "message": message}
        if result.error is not None:
            data["error"] = result.error
        if result.meta is not None:
            data["meta"] = result.meta
        return data

    # -- what copy() replays: the log's appends and the minted ids ------------------------

    def _log_append(self, type_: str, data: JsonLike, **options: Any) -> Event:
        """An append to the log, its outcome kept (the event, or what the log raised)."""
        if self._replaying is not None:
            outcome = self._replaying.popleft()
            assert outcome is None or isinstance(outcome, BaseException)
            if outcome is not None:
                raise outcome
            return self.log.append(type_, data, **options)
        try:
            event = self.log.append(type_, data, **options)
        except BaseException as error:
            self._outcomes.append(error)
            raise
        self._outcomes.append(None)
        return event

    def _mint_id(self, kind: str, seq: int) -> str:
        """P12: the id of a message the loop writes, minted at log position *seq* (V5); the
        outcome kept."""
        if self._replaying is not None:
            outcome = self._replaying.popleft()
            if isinstance(outcome, BaseException):
                raise outcome
            assert isinstance(outcome, str)
            return outcome
        try:
            minted = vocab.minted_id(self._mint, kind, seq)
        except BaseException as error:
            self._outcomes.append(error)
            raise
        self._outcomes.append(minted)
        return minted

    # -- copy and state (R4.12) -----------------------------------------------------------

    def copy(self) -> ModelAgent:
        """R4.12: an independent agent whose future, for the same inputs, is this one's. It
        is made by replaying: a new agent over this log's seed is given everything this one
        was given, in order, each append and minted id turning out as it did here (the time
        the log stamped, the refusal it raised); its log is then a fork of this one's.
        O(what this agent was given)."""
        original = self.log.events
        seed = original[:self._seed_length]
        stamps = _Stamps(original)
        scratch = SessionLog(seed, clock=stamps)
        stamps.log = scratch
        twin = ModelAgent(self.config, log=scratch, mint_id=self._mint)
        twin._replaying = deque(self._outcomes)
        twin._depth = 1                 # what it is given now is this agent's journal
        try:
            for name, args, kwargs in self._journal:
                try:
                    getattr(twin, name)(*args, **dict(kwargs))
                except BaseException as error:
                    if not isinstance(error, Exception) and error not in self._outcomes:
                        raise
        finally:
            twin._replaying = None
            twin._depth = 0
        twin._journal = list(self._journal)
        twin._outcomes = list(self._outcomes)
        if len(scratch) != len(self.log):
            raise RuntimeError("this agent's log was appended to behind its back: a replay "
                               "does not give it back")
        twin.log = self.log.fork()
        return twin

    def state_parts(self) -> tuple[object, ...]:
        """R4.12: everything the agent's future depends on but its log, as plain values: the
        state above, the output queue with the objects it shares numbered, and the loop's
        position: for each procedure in progress, outermost first, its name, where it is
        suspended and its locals. Equal parts, equal futures."""
        shared = _Numbering()
        return (
            ("queued", tuple((item.message, item.wakeup) for item in self._queued)),
            ("outbox", tuple((item.message, item.steering) for item in self._outbox)),
            ("flags", self._busy, self._window, self._owner,
             self._wake_tick, self._pending_retry, self._header_logged, self._disposal,
             self._failure),
            ("prior_failures", tuple(self._prior_failures)),
            ("turn", self._turn, self._step, self._step_open, _plain(self._reason, shared),
             _plain(self._settle, shared)),
            ("out", tuple(_plain(entry, shared) for entry in self._out)),
            ("cancel_scope", _plain(self._cancel_scope, shared)),
            ("effects", tuple((i, _plain(r, shared)) for i, r in self._effects.items()),
             self._next_effect),
            ("aborts", tuple(self._aborts.items()), self._next_signal),
            ("mail", tuple(self._mail)),
            ("loop", _positions(self._loop, shared)),
            ("waiting", None if self._waiting is None else tuple(sorted(self._waiting))),
        )


# --------------------------------------------------------------------------
# Helpers: values the rules build
# --------------------------------------------------------------------------


#: R9.6: the text of the uncoded error of a request config without provider or model.
NO_ROUTE = ("the request config has no provider/model: set them in "
            "CoreConfig.request_options or return both from the request effect")


def _minted(kind: str, seq: int) -> str:
    """P12: the ids the loop mints by default: ``assistant-<seq>``, ``tool-result-<seq>``."""
    return f"{kind}-{seq}"


def _ending_of(error: Exception) -> Ending:
    """R8.6, P16: what ends the turn: a `Stop`'s ending, or any other failure as a generic
    one with the internal error (R15.3)."""
    return error.ending if isinstance(error, Stop) else Ending(
        "generic", vocab.internal_error(error))


def _json(message: Message) -> FrozenDict:
    """V5: a message's JSON form ``{id, role, content, source}``, frozen."""
    return vocab.message_mapping(message)


def _frozen(value: JsonLike) -> FrozenDict:
    """A JSON object as a frozen value."""
    frozen = freeze(value, "value", max_depth=None)
    assert isinstance(frozen, FrozenDict)
    return frozen


def _payload(**values: JsonLike) -> FrozenDict:
    """The payload of a notification or an effect, frozen (V1: the parts were checked when
    they came in)."""
    return _frozen(values)


def _cancel_notice(cause: CancelCause) -> Output:
    """R16.2 step 1: ``agent/cancel-requested {cause}``."""
    return Live(LiveEvent(ev.CANCEL_REQUESTED, _payload(cause=cause.to_json())))


def _abort_notice(signal: int, cause: CancelCause) -> Output:
    """R16.2 step 4, P4: ``abort {signal, reason}``."""
    return Control("abort", _payload(signal=signal, reason=cause.to_json()))


def _announces(output: Output | None, ids: set[str]) -> bool:
    """Whether *output* is the ``agent/inbox/enqueue`` of one of the messages *ids*."""
    if not isinstance(output, Live) or output.event.type != ev.INBOX_ENQUEUE:
        return False
    message = output.event.payload.get("message")
    return isinstance(message, FrozenDict) and message.get("id") in ids


def _header_of(value: JsonLike) -> tuple[FrozenDict, FrozenDict]:
    """R9.6, P13: the request's resolution as its header and what it says of the prepared
    request (its retryPolicy); the turn fails on one it cannot be. (The texts are the
    project's.)"""
    try:
        resolution = freeze(value, "header")
    except errors.ValidationError as problem:
        raise _failed(str(problem), "RequestConfigError", "INVALID_REQUEST_CONFIG") from None
    if not isinstance(resolution, FrozenDict) or not isinstance(resolution.get("config"),
                                                                  FrozenDict):
        raise _failed("the request header must be a mapping {config, system?, tools?}",
                      "RequestConfigError", "INVALID_REQUEST_CONFIG")
    unexpected = sorted(set(resolution) - {"config", "system", "tools", "retryPolicy"})
    if unexpected:
        raise _failed(f"unexpected header field(s) {unexpected}", "RequestConfigError",
                      "INVALID_REQUEST_CONFIG")
    config = resolution["config"]
    assert isinstance(config, FrozenDict)
    # R9.6: a provider or model the original counts as missing (absent, null, false, 0, '')
    if any(config.get(key) in (None, False, "", 0) for key in ("provider", "model")):
        raise Stop("generic", ErrorInfo(message=NO_ROUTE, name="Error"))
    for key in ("provider", "model"):
        if not isinstance(config.get(key), str):
            raise _failed(f"the request config's {key} must be a string",
                          "RequestConfigError", "INVALID_REQUEST_CONFIG")
    prepared = FrozenDict({"retryPolicy": resolution["retryPolicy"]}) \
        if "retryPolicy" in resolution else FrozenDict()
    header = FrozenDict({k: v for k, v in resolution.items() if k != "retryPolicy"})
    return header, prepared


def _checked_chunk(value: JsonLike, stream: _Fold) -> tuple[FrozenDict | None, str | None]:
    """R9.7 step 2, P12, V18, D5: the chunk as a value, and what is wrong with it (None
    when nothing): one after the finish chunk; a type a stream cannot carry; a finish
    carrying usage; a text or reasoning chunk without its text, a tool call without id,
    name and its arguments as JSON text, a block chunk without a valid block."""
    if stream.finish is not None:
        return None, "a chunk arrived after the finish chunk"
    try:
        chunk = vocab.validate_chunk(value)
    except errors.ValidationError as invalid:
        return None, f"invalid chunk: {invalid}"
    kind = chunk["type"]
    if kind not in ("text", "reasoning", "tool-call", "block", "usage", "finish"):
        return None, (f"invalid chunk: {kind!r} is not a chunk type (one of block, finish, "
                      "reasoning, text, tool-call, usage)")
    if kind == "finish" and "usage" in chunk:
        return None, "invalid chunk: a finish chunk carries no usage; usage is its own chunk"
    if kind in ("text", "reasoning") and not isinstance(chunk.get("text"), str):
        return None, f"invalid chunk: a {kind} chunk needs a string 'text'"
    if kind == "tool-call":
        if not (isinstance(chunk.get("id"), str) and chunk.get("id")):
            return None, "invalid chunk: a tool-call chunk needs a non-empty string 'id'"
        if not isinstance(chunk.get("name"), str):
            return None, "invalid chunk: a tool-call chunk needs a string 'name'"
        if not isinstance(chunk.get("arguments"), str):
            return None, ("invalid chunk: a tool-call chunk needs 'arguments', JSON text "
                          "(a string)")
    if kind == "block":
        problem = (vocab.block_problem(chunk["block"]) if "block" in chunk
                   else "a block chunk needs a 'block'")
        if problem:
            return None, f"invalid chunk: {problem}"
    return chunk, None


@dataclass
class _Fold:
    """P12: what a model stream has delivered so far: consecutive text chunks (likewise
    reasoning) extend one block, a tool call or a block chunk adds one, the last usage
    chunk's figures are kept, and the finish chunk; the seqs of its chunks (R9.8)."""

    content: list[Frozen] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    usage: Frozen = None
    finish: FrozenDict | None = None
    run: str | None = None       # the kind of the last content-carrying chunk
    ended: bool = False          # the stream's end came

    def fold(self, chunk: FrozenDict) -> None:
        kind = chunk["type"]
        if kind in ("text", "reasoning"):
            text = str(chunk["text"])
            last = self.content[-1] if self.content else None
            if self.run == kind and isinstance(last, FrozenDict):
                self.content[-1] = FrozenDict({"type": kind, "text": str(last["text"]) + text})
            else:
                self.content.append(FrozenDict({"type": kind, "text": text}))
        elif kind == "tool-call":
            self.content.append(FrozenDict({"type": "tool-call", "id": chunk["id"],
                                            "name": chunk["name"],
                                            "arguments": chunk["arguments"]}))
        elif kind == "block":
            self.content.append(chunk["block"])
        elif kind == "usage":
            self.usage = chunk["usage"]
        elif kind == "finish":
            self.finish = chunk
        if kind in ("text", "reasoning", "tool-call", "block"):
            self.run = str(kind)     # a chunk carrying no content does not end a run


def _planned(blocks: Iterable[FrozenDict]) -> list[Call]:
    """R10.1: the batch's calls in model order; arguments that are '' are {}, valid JSON text
    its value, anything else the text as it is."""
    calls: list[Call] = []
    for block in blocks:
        raw = str(block["arguments"])
        arguments: Frozen = FrozenDict()
        if raw != "":
            try:
                arguments = freeze(json.loads(raw, parse_constant=_no_constant))
            except (ValueError, errors.ValidationError, RecursionError):
                arguments = raw
        calls.append(Call(str(block["id"]), str(block["name"]), arguments))
    return calls


def _settled(batch: Batch) -> Call | None:
    """R10.2: the earliest started call in flight whose body has settled (or failed)."""
    return next((c for c in batch.calls if c.execute is not None and not c.taken
                 and c.state != "running"), None)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _aborted_result(code: str, text: str, contexts: Sequence[Message] = ()) -> ToolResult:
    """R10.10, R10.11: the canonical aborted result; in place of a result, with that
    result's additional contexts."""
    return ToolResult.from_json({
        "content": [{"type": "text", "text": text}], "isError": True,
        "error": {"name": "AbortError", "code": code},
        "additionalContexts": [_json(m) for m in contexts]})


def _raised_result(error: ErrorInfo) -> ToolResult:
    """R10.12: a raising stage stands for ``Error: <message>``, with ``error {name, code}``
    for a coded error only."""
    value: dict[str, JsonLike] = {"content": [{"type": "text", "text": "Error: " + error.message}],
                                  "isError": True}
    if error.code is not None:
        value["error"] = {"name": error.name, "code": error.code}
    return ToolResult.from_json(value)


def _normal(result: ToolResult) -> ToolResult:
    """V16: an error result carries no concludesTurn, a successful one no error."""
    value = result.to_json()
    value.pop("concludesTurn" if result.is_error else "error", None)
    return ToolResult.from_json(value)


class _Stamps:
    """The clock of a replay's log: each event gets the time the original log gave the
    event at the same position."""

    def __init__(self, original: Sequence[Event]) -> None:
        self.original = original
        self.log: SessionLog | None = None

    def __call__(self) -> float:
        assert self.log is not None
        return self.original[len(self.log)].time


class _Numbering:
    """`state_parts` of objects the state shares (a cancel's reports, its abort entry, its
    scope): the first time in full, then by number."""

    def __init__(self) -> None:
        self.numbers: dict[int, str] = {}

    def seen(self, value: object) -> str | None:
        number = self.numbers.get(id(value))
        if number is None:
            self.numbers[id(value)] = f"#{len(self.numbers)}"
        return number


#: The types `_plain` gives back as they are (immutable values), found as they come.
_AS_IS: set[type] = {str, int, float, bool, type(None)}


def _plain(value: object, shared: _Numbering) -> object:
    """A value as plain data: lists, dicts and sets as tuples, a record of the model's as
    its class name and fields (one the state shares numbered after its first time), an
    exception as its class, arguments and attributes, other (immutable) values as they
    are."""
    kind = type(value)
    if kind in _AS_IS:
        return value
    if kind in (list, tuple, deque):
        return tuple([_plain(item, shared) for item in value])  # type: ignore[attr-defined]
    if kind is dict:
        return tuple([(key, _plain(item, shared))
                      for key, item in value.items()])  # type: ignore[attr-defined]
    if kind in (set, frozenset):
        return tuple(sorted(repr(_plain(item, shared)) for item in value))  # type: ignore[attr-defined]
    if isinstance(value, BaseException):
        return (kind.__name__, repr(value.args), _plain(vars(value), shared))
    if kind.__module__ != __name__ or not is_dataclass(value):
        _AS_IS.add(kind)               # a value of the library's: immutable
        return value
    if isinstance(value, (Entry, Scope, Reports)):
        number = shared.seen(value)
        if number is not None:
            return number
    return (kind.__name__, *[_plain(getattr(value, f.name), shared) for f in fields(value)])


def _positions(loop: Loop[None] | None, shared: _Numbering) -> tuple[object, ...]:
    """The loop's position: each procedure in progress, outermost first: its name, the
    instruction it is suspended at and its locals (but the agent itself)."""
    parts: list[object] = []
    generator: Any = loop
    while generator is not None:
        frame = generator.gi_frame
        if frame is None:
            parts.append("finished")
            break
        parts.append((generator.gi_code.co_qualname, frame.f_lasti,
                      *[item for name, value in frame.f_locals.items() if name != "self"
                        for item in (name, _plain(value, shared))]))
        generator = generator.gi_yieldfrom
    return tuple(parts)


if TYPE_CHECKING:
    from machine.checking.search import Agentlike

    def _drivable_by_the_explorer(agent: ModelAgent) -> Agentlike:
        """The explorer drives a ModelAgent as it drives a core: checked here."""
        return agent
