"""What became of each accepted message (specs/runtime.md RT26), derived from the core's outputs.

Every message a caller hands the agent through ``send`` (``followup``, ``steer``,
``inject``) and the core accepts has exactly one *fate* (the R20.1 ledger, from the
caller's side). A `FateLedger` follows each acceptance through the outputs the core
already emits — ``agent/inbox/dequeue``, ``agent/inbox/discard``,
``agent/context/discard``, ``turn/start``, ``user/message``, ``steering/message``,
``step/start``, ``turn/end``, the ``{prompt-submit}`` effect and its answer, the
rejected admission's tick — and says, at any moment, where it stands:

* ``pending``: still queued as a prompt, staged for the next step, or being admitted;
* ``delivered``: in the log inside turn *turn*; *step* is the step whose request first
  carried it, or None when the turn made no request after it (it reaches the model
  with the next turn's first request); a prompt's turn is its own;
* ``appended``: appended between turns (an ``inject`` while the window was closed, or
  context a rejected admission wrote out); the model sees it at the next request;
* ``rejected``: a prompt whose admission was rejected (``blocked`` by a prompt-submit
  handler, ``failed`` when a handler raised or its turn could not open, ``invalid`` for
  a decision that is not one, ``aborted`` by a cancel during its admission): it never
  reached the log;
* ``discarded``: dropped by a cancel or by dispose (*cause*), as the core reported it.

The ledger is sans-I/O (no asyncio): the asyncio `Agent` keeps one, and the hostile-input
and differential tests run one beside the core and check it against the R20.1 ledger of
`machine.checking.invariants.InvariantMonitor`.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal, Protocol, TypeAlias

from machine import events as ev
from machine.errors import ValidationError
from machine.events import Event, LiveEvent
from machine.io import PROMPT_SUBMIT, TICK, Control, Durable, Effect, Live, Output
from machine.jsonvalue import Frozen, FrozenDict, FrozenList
from machine.vocabulary import (
    DISPOSED_CAUSE,
    Block,
    CancelCause,
    ErrorInfo,
    SendOptions,
    decision_from_json,
)

__all__ = ["FateKind", "FateLedger", "MessageFate", "Rejection", "Route"]

#: How an accepted message was placed: a prompt of its own turn (queued in the inbox),
#: steering for the next step, or context (staged for the next step, or appended at once).
Route: TypeAlias = Literal["prompt", "steering", "context"]
FateKind: TypeAlias = Literal["pending", "delivered", "appended", "rejected", "discarded"]
#: Why a prompt's admission was rejected (R7.7, R7.11).
Rejection: TypeAlias = Literal["blocked", "failed", "invalid", "aborted"]
#: Where a pending message waits.
Waiting: TypeAlias = Literal["queued", "staged", "admitting", "in-log"]

FINAL_KINDS: Final = frozenset({"delivered", "appended", "rejected", "discarded"})

@dataclass(frozen=True, slots=True)
class MessageFate:
    """The fate of one accepted message (see the module docstring).

    * ``message_id``, ``route`` (``prompt``, ``steering``, ``context``) and ``kind``;
    * ``waiting`` (pending only): ``queued``, ``staged``, ``admitting`` or ``in-log``
      (in the log, the step that will carry it not known yet);
    * ``turn``, ``step``, ``seq`` (delivered, appended): where it is in the log;
    * ``rejection`` and ``detail`` (rejected): why, and the block reason or error text;
    * ``cause`` (discarded; rejected ``aborted``): the cancel's cause (``disposed`` for
      dispose).
    """

    message_id: str
    route: Route
    kind: FateKind
    waiting: Waiting | None = None
    turn: int | None = None
    step: int | None = None
    seq: int | None = None
    rejection: Rejection | None = None
    detail: str | None = None
    cause: CancelCause | None = None

    @property
    def final(self) -> bool:
        """Whether the fate is decided (anything but ``pending``)."""
        return self.kind != "pending"

    def describe(self) -> str:
        """The fate in words, e.g. ``delivered at turn 3 step 2``."""
        if self.kind == "pending":
            return f"pending ({self.waiting})"
        if self.kind == "delivered":
            where = f"step {self.step}" if self.step is not None else "after its last request"
            return f"delivered in turn {self.turn}, {where}"
        if self.kind == "appended":
            return "appended between turns"
        if self.kind == "rejected":
            return f"rejected ({self.rejection}{': ' + self.detail if self.detail else ''})"
        return f"discarded by {self.cause.kind if self.cause else 'a cancel'}"


class _Entry:
    """One acceptance, followed through the outputs (mutable; `MessageFate` is its view)."""

    __slots__ = ("cause", "detail", "index", "inherited", "kind", "listeners", "message_id",
                 "rejection", "route", "run", "seq", "step", "turn", "waiting")

    def __init__(self, message_id: str, route: Route, waiting: Waiting, index: int) -> None:
        self.index = index          # the acceptance's number, from 1
        self.message_id = message_id
        self.route: Route = route
        self.kind: FateKind = "pending"
        self.waiting: Waiting | None = waiting
        self.turn: int | None = None
        self.step: int | None = None
        self.seq: int | None = None
        self.rejection: Rejection | None = None
        self.detail: str | None = None
        self.cause: CancelCause | None = None
        self.inherited = False      # staged before the claim in progress (R7.2 inherited)
        self.listeners: list[Callable[[MessageFate], object]] | None = None
        self.run: object = None     # the agent's run of this prompt (RT21), if any

    def view(self) -> MessageFate:
        return MessageFate(self.message_id, self.route, self.kind, self.waiting, self.turn,
                           self.step, self.seq, self.rejection, self.detail, self.cause)

    def on_final(self, listener: Callable[[MessageFate], object]) -> None:
        """Call *listener* with the final fate (now, if it is final already)."""
        if self.kind != "pending":
            listener(self.view())
            return
        if self.listeners is None:
            self.listeners = []
        self.listeners.append(listener)


class _State(Protocol):
    """What the ledger reads of the core besides its outputs: whether teardown has happened
    (its discards are dispose's)."""

    @property
    def disposed(self) -> bool: ...


class _Boxes(Protocol):
    def queued_ids(self) -> tuple[str, ...]: ...
    def staged(self) -> tuple[tuple[str, bool], ...]: ...


class FateLedger:
    """Follows every accepted message to its fate (see the module docstring).

    Tell it about each accepted send (`accept`), each direct append (`direct_append`) and
    each dispose (`dispose_requested`); feed it every output (`output`, or the agent's
    narrower entry points) and the answer of each ``{prompt-submit}`` (`completion`).
    *state* is the core (or anything with its read-only ``disposed``).

    *keep* bounds how many decided fates stay queryable by id (the oldest go first; a
    `MessageFate` already handed out, and what waits on one, are not affected; up to twice
    as many records are held between two queries); pending ones are always kept."""

    def __init__(self, state: _State, *, keep: int = 1_000,
                 entry_type: type[_Entry] | None = None) -> None:
        self._state = state
        self._keep = keep
        #: The class of the records `accept` makes (the agent's `Sent`, its public face).
        self._entry_type = entry_type if entry_type is not None else _Entry
        #: Decided records in the order they were decided (a decided record is never
        #: changed again), and an index of them by id (a tuple, oldest first, for an id
        #: accepted more than once) covering the first *_indexed*. Why lazy: deciding is
        #: one append, every turn; the index and the bound are brought up to date when
        #: asked (`_sync`), or once the list holds twice the bound. A pending record is in
        #: exactly one of the boxes below, so it needs no index.
        self._decided: list[_Entry] = []
        self._decided_by_id: dict[str, _Entry | tuple[_Entry, ...]] = {}
        self._indexed = 0
        self._queued: deque[_Entry] = deque()       # route prompt, in inbox order
        self._staged: deque[_Entry] = deque()       # steering and context, in outbox order
        self._admitting: _Entry | None = None       # claimed (dequeued), no outcome yet
        self._prompt: _Entry | None = None          # admitted, its user/message not seen yet
        self._steering_taken: _Entry | None = None  # dequeued steering, before its append
        self._in_log: list[_Entry] = []             # delivered, step not known yet
        self._admission_effect: int | None = None
        self._admission_signal: int | None = None
        self._decision: tuple[str, object] | None = None
        self._aborted: CancelCause | None = None    # the admission's own signal's abort
        self._last_abort: CancelCause | None = None
        self._cause: CancelCause = DISPOSED_CAUSE
        self._open_turn: int | None = None
        self._direct: set[int] = set()
        self._accepted = 0

    # -- inputs -----------------------------------------------------------------------

    def accept(self, message_id: str, options: SendOptions, window_open: bool,
               appended_seq: int | None = None) -> _Entry:
        """An accepted send (R5): *window_open* is the window as the core routed it
        (before the call); *appended_seq* the seq of the ``user/message`` an inject with
        the window closed appended at once (R5.2)."""
        if options.target != "next-step":
            return self.accept_prompt(message_id)
        if options.wakeup:
            return self.accept_steer(message_id, window_open)
        return self.accept_inject(message_id, window_open, appended_seq)

    def accept_prompt(self, message_id: str) -> _Entry:
        """`accept` of a follow-up (``next-turn``, R5.1): a queued prompt."""
        self._accepted = index = self._accepted + 1
        entry = self._entry_type(message_id, "prompt", "queued", index)
        self._queued.append(entry)
        return entry

    def accept_steer(self, message_id: str, window_open: bool) -> _Entry:
        """`accept` of a steer: staged steering (R5.3), or a queued prompt with the window
        closed."""
        if not window_open:
            return self.accept_prompt(message_id)
        self._accepted = index = self._accepted + 1
        entry = self._entry_type(message_id, "steering", "staged", index)
        self._staged.append(entry)
        return entry

    def accept_inject(self, message_id: str, window_open: bool,
                      appended_seq: int | None) -> _Entry:
        """`accept` of an inject: staged context, or context appended at once with the
        window closed (R5.2)."""
        self._accepted = index = self._accepted + 1
        if window_open:
            entry = self._entry_type(message_id, "context", "staged", index)
            self._staged.append(entry)
            return entry
        entry = self._entry_type(message_id, "context", "in-log", index)
        if appended_seq is not None:
            self._direct.add(appended_seq)
        self._finish(entry, "appended", seq=appended_seq)
        return entry

    def direct_append(self, seq: int) -> None:
        """A direct append (not an accepted message): its output is not a fate."""
        self._direct.add(seq)

    def dispose_requested(self) -> None:
        """dispose() was called: what its cancel discards is discarded by dispose (R17.1)."""
        self._cause = DISPOSED_CAUSE

    def completion(self, effect_id: int, kind: str, value: object) -> None:
        """An answer the core was fed: only that of the admission's ``{prompt-submit}``
        matters (why a rejected prompt was rejected). *kind* is ``resolve`` or ``raise``."""
        if effect_id == self._admission_effect and self._decision is None:
            self._decision = (kind, value)

    def watches(self, effect_id: int) -> bool:
        return effect_id == self._admission_effect

    @property
    def admitted(self) -> _Entry | None:
        """The prompt the last ``turn/start`` admitted, until its ``user/message``."""
        return self._prompt

    # -- outputs ----------------------------------------------------------------------

    def output(self, output: Output) -> None:
        """Feed one output (any kind)."""
        if isinstance(output, Durable):
            self.durable(output.event)
        elif isinstance(output, Live):
            self.live(output.event)
        elif isinstance(output, Effect):
            self.effect(output)
        elif isinstance(output, Control) and output.kind == "abort":
            self.abort(output.payload)

    def durable(self, event: Event) -> None:
        handler = _DURABLE.get(event.type)
        if handler is not None:
            handler(self, event)

    def live(self, event: LiveEvent) -> None:
        handler = _LIVE.get(event.type)
        if handler is not None:
            handler(self, event)

    def effect(self, effect: Effect) -> None:
        """``{prompt-submit}`` (a claim's admission asks for its decision) and the rejected
        admission's tick (R7.10 step 3)."""
        if effect.kind == PROMPT_SUBMIT:
            self.admission(effect)
        elif effect.kind == TICK and effect.payload._data.get("purpose") == "rejected-admission":
            self._rejected()

    def admission(self, effect: Effect) -> None:
        """``{prompt-submit}``: the claimed prompt's admission asks for its decision."""
        if self._staged:
            self._mark_claim()
        self._admission_effect = effect.id
        signal = effect.payload._data.get("signal")   # Why: a plain dict's get (every turn)
        self._admission_signal = signal if type(signal) is int else None
        self._decision = None
        self._aborted = None

    def abort(self, payload: FrozenDict) -> None:
        """``abort {signal, reason}``: an abort of the admission's signal rejects its prompt
        (R7.7); one before any ``{prompt-submit}`` did (R7.5), so the last abort is kept."""
        try:
            cause = CancelCause.from_json(payload.get("reason"), allow_disposed=True)
        except ValidationError:
            cause = DISPOSED_CAUSE
        self._last_abort = cause
        if self._admission_signal is not None and payload.get("signal") == self._admission_signal:
            self._aborted = cause

    # -- durable --------------------------------------------------------------------

    def _turn_start(self, event: Event) -> str | None:
        """A turn opens: the admitted prompt's, for a message trigger (R7.9). Returns the
        trigger's kind."""
        data = event.data._data              # (checked by the log: turn an int, trigger V13)
        turn = data.get("turn")
        self._open_turn = turn if type(turn) is int else None
        trigger = data.get("trigger")
        kind = trigger._data.get("kind") if type(trigger) is FrozenDict else None
        entry = self._admitting
        if entry is not None:
            if kind == "message":
                self._admitting = None
                self._prompt = entry
                entry.turn = self._open_turn
            self._admission_effect = self._admission_signal = None  # `_reset_admission`
            self._decision = self._aborted = None
        return kind if type(kind) is str else None

    def _user_message(self, event: Event) -> None:
        if event.seq in self._direct:
            self._direct.discard(event.seq)
            return
        if self._prompt is None and not self._staged:
            return                              # nothing of the ledger's can be this one
        message_id = event.data._data.get("id")
        prompt = self._prompt
        if prompt is not None and prompt.message_id == message_id:
            if self._staged:
                inherited = self._take(self._staged, message_id, "context", inherited=True)
                if inherited is not None:
                    self._logged(inherited, event.seq)
                    return
                self._clear_inherited()       # the inherited drain is over (R8.3.1)
            self._prompt = None
            prompt.turn = self._open_turn     # `_logged`, inline: every turn's prompt
            prompt.seq = event.seq
            prompt.waiting = "in-log"
            self._in_log.append(prompt)
            return
        staged = self._staged
        if not staged:
            return
        first = staged[0]                   # `_take`'s usual case, inline: drained in order
        if first.message_id == message_id and first.route == "context":
            entry = staged.popleft()
        else:
            found = self._take(staged, message_id, "context")
            if found is None:
                return
            entry = found
        turn = self._open_turn
        if turn is None:
            self._finish(entry, "appended", seq=event.seq)    # a rejected admission (R7.10)
        else:
            entry.turn = turn               # `_logged`, inline
            entry.seq = event.seq
            entry.waiting = "in-log"
            self._in_log.append(entry)

    def _steering_message(self, event: Event) -> None:
        if event.seq in self._direct:           # a direct append (at the dequeue's position,
            self._direct.discard(event.seq)     # say): the taken item's record is still to come
            return
        entry = self._steering_taken
        message = event.data._data.get("message")
        message_id = message._data.get("id") if type(message) is FrozenDict else None
        if entry is None or entry.message_id != message_id:
            entry = self._take(self._staged, message_id, "steering")
        self._steering_taken = None
        if entry is not None:
            self._logged(entry, event.seq)

    def _step_start(self, event: Event) -> None:
        if self._in_log:
            step = event.data._data.get("step")
            self._place(step if type(step) is int else None)

    def _turn_end(self, event: Event) -> None:
        if self._in_log:
            self._place(None)
        if self._prompt is not None:      # never appended (the core stopped, P16)
            self._reject(self._prompt, "failed", "the turn ended before its prompt was "
                         "written")
            self._prompt = None
        self._open_turn = None

    # -- live -------------------------------------------------------------------------

    def _dequeue(self, event: LiveEvent) -> None:
        payload = event.payload._data
        message = payload.get("message")
        message_id = message._data.get("id") if type(message) is FrozenDict else None
        if payload.get("placement") == "queued":                # the claimed item (R7.6)
            queued = self._queued
            if queued and queued[0].message_id == message_id:    # the head, as R7.2 claims
                entry: _Entry | None = queued.popleft()
            else:
                entry = self._take(queued, message_id, "prompt")
            if entry is not None:
                entry.waiting = "admitting"
                self._admitting = entry
        else:                                                   # steering drained (R11.1)
            self._steering_taken = self._take(self._staged, message_id, "steering")

    def _inbox_discard(self, event: LiveEvent) -> None:
        cause = DISPOSED_CAUSE if self._state.disposed else self._cause
        for message_id in _ids(event.payload.get("messages")):
            entry = self._take(self._queued, message_id, "prompt")
            if entry is None:
                entry = self._take(self._staged, message_id, "steering")
            if entry is not None:
                self._finish(entry, "discarded", cause=cause)

    def _context_discard(self, event: LiveEvent) -> None:
        cause = DISPOSED_CAUSE if self._state.disposed else self._cause
        for message_id in _ids(event.payload.get("messages")):
            entry = self._take(self._staged, message_id, "context")
            if entry is not None:
                self._finish(entry, "discarded", cause=cause)

    def _cancel_requested(self, event: LiveEvent) -> None:
        with contextlib.suppress(ValidationError):
            self._cause = CancelCause.from_json(event.payload.get("cause"), allow_disposed=True)

    def _error(self, event: LiveEvent) -> None:
        """``agent/error`` while a prompt is admitted but before its turn opens: the log
        refused the run's ``turn/start`` (P16.3) or the core stopped (P16.5); the prompt is
        never written."""
        entry = self._admitting
        if entry is None:
            return
        self._admitting = None
        error = event.payload.get("error")
        detail = None
        if isinstance(error, FrozenDict):
            try:
                detail = ErrorInfo.from_json(error).rendered()
            except ValidationError:
                detail = None
        self._reject(entry, "failed", detail or "the turn could not start")
        self._clear_inherited()
        self._reset_admission()

    def _disposed(self, event: LiveEvent) -> None:
        """Teardown (R17.4): nothing is queued or staged any more; a prompt the core was
        still admitting when it stopped (P16) never had an outcome."""
        for entry in (self._admitting, self._prompt):
            if entry is not None and entry.kind == "pending":
                self._reject(entry, "failed", "the agent stopped before its admission ended")
        self._admitting = self._prompt = None

    # -- helpers ----------------------------------------------------------------------

    def _mark_claim(self) -> None:
        """A claim takes the outbox as inherited (R7.2): what is staged now is drained
        ahead of the prompt, what is staged later after it. Marked at the claim's
        ``{prompt-submit}``: context staged at its ``running`` notice (R7.4), counted as
        inherited here, can only be told from the prompt by its id, so two messages sharing
        one id there may swap their seqs (their fates are the same)."""
        for entry in self._staged:
            entry.inherited = True

    def _rejected(self) -> None:
        entry = self._admitting
        self._admitting = None
        if entry is not None:
            kind, detail, cause = self._rejection()
            self._reject(entry, kind, detail, cause)
        self._clear_inherited()
        self._reset_admission()

    def _rejection(self) -> tuple[Rejection, str | None, CancelCause | None]:
        if self._aborted is not None:
            return "aborted", None, self._aborted
        if self._decision is None:          # R7.5: aborted before its {prompt-submit}
            return "aborted", None, self._last_abort
        kind, value = self._decision
        if kind == "raise":
            return "failed", value.rendered() if isinstance(value, ErrorInfo) else str(value), None
        try:
            decision = decision_from_json(value)
        except Exception as exc:          # R7.11: whatever the value, it is no decision
            return "invalid", str(exc), None
        if isinstance(decision, Block):
            return "blocked", decision.reason, None
        return "aborted", None, None

    def _clear_inherited(self) -> None:
        for entry in self._staged:
            entry.inherited = False

    def _reset_admission(self) -> None:
        self._admission_effect = None
        self._admission_signal = None
        self._decision = None
        self._aborted = None

    def _reject(self, entry: _Entry, rejection: Rejection, detail: str | None,
                cause: CancelCause | None = None) -> None:
        entry.rejection = rejection
        entry.detail = detail
        self._finish(entry, "rejected", cause=cause)

    def _logged(self, entry: _Entry, seq: int) -> None:
        entry.turn = self._open_turn
        entry.seq = seq
        entry.waiting = "in-log"
        self._in_log.append(entry)

    def _place(self, step: int | None) -> None:
        """The entries in the log since the last step boundary are carried by *step*'s
        request (R9.4: the history cut precedes ``step/start``), or by none (None)."""
        entries, self._in_log = self._in_log, []
        for entry in entries:           # `_finish`, inline: every message is delivered so
            entry.kind = "delivered"    # (its turn and seq are set, its cause is None)
            entry.waiting = None
            entry.step = step
            entry.inherited = False
            entry.run = None
        self._decided.extend(entries)   # decided together: then whoever waits is told
        for entry in entries:
            if entry.listeners:
                self._tell(entry)
        if len(self._decided) > 2 * self._keep:
            self._trim()

    @staticmethod
    def _take(box: deque[_Entry], message_id: object, route: Route, *,
              inherited: bool = False) -> _Entry | None:
        """Remove and return the first entry of *box* with this id and route (FIFO: a
        box is drained and discarded in order)."""
        if box:                         # Why: usually the box's first entry is the one
            first = box[0]
            if first.message_id == message_id and first.route == route \
                    and (first.inherited or not inherited):
                return box.popleft()
        for index, entry in enumerate(box):
            if entry.message_id == message_id and entry.route == route \
                    and (entry.inherited or not inherited):
                del box[index]
                return entry
        return None

    def _finish(self, entry: _Entry, kind: FateKind, turn: int | None = None,
                step: int | None = None, seq: int | None = None,
                cause: CancelCause | None = None) -> None:
        """Decide *entry*'s fate: the record itself is kept (a decided record is never
        changed again), the oldest decided one beyond *keep* forgotten."""
        entry.kind = kind
        entry.waiting = None
        entry.turn = turn
        entry.step = step
        entry.seq = seq
        entry.cause = cause           # (callers give one only for discarded and rejected)
        entry.inherited = False
        entry.run = None              # the run read it at its turn's start; no longer needed
        self._decide(entry)

    def _decide(self, entry: _Entry) -> None:
        """*entry*'s fate is decided: keep it and tell whoever waits for it."""
        decided = self._decided
        decided.append(entry)
        if entry.listeners:
            self._tell(entry)
        if len(decided) > 2 * self._keep:
            self._trim()

    @staticmethod
    def _tell(entry: _Entry) -> None:
        listeners, entry.listeners = entry.listeners, None
        fate = entry.view()
        for listener in listeners or ():
            listener(fate)

    def _trim(self) -> None:
        """Forget the decided records beyond the newest *keep* (the oldest go first)."""
        decided = self._decided
        excess = len(decided) - self._keep
        if excess <= 0:
            return
        by_id = self._decided_by_id
        for oldest in decided[:min(excess, self._indexed)]:    # those in the index leave it
            held = by_id[oldest.message_id]
            if isinstance(held, tuple):
                rest = tuple(entry for entry in held if entry is not oldest)
                by_id[oldest.message_id] = rest[0] if len(rest) == 1 else rest
            else:
                del by_id[oldest.message_id]
        del decided[:excess]
        self._indexed = max(0, self._indexed - excess)

    def _sync(self) -> None:
        """Bring the bound and the index by id up to date (before any query)."""
        self._trim()
        by_id = self._decided_by_id
        decided = self._decided
        for entry in decided[self._indexed:]:
            held = by_id.get(entry.message_id)
            if held is None:
                by_id[entry.message_id] = entry
            elif isinstance(held, tuple):
                by_id[entry.message_id] = (*held, entry)
            else:
                by_id[entry.message_id] = (held, entry)
        self._indexed = len(decided)

    # -- queries ----------------------------------------------------------------------

    def fate(self, message_id: str) -> MessageFate | None:
        """The fate of the latest acceptance of *message_id* (None: not accepted, or its
        fate was decided long enough ago to be forgotten)."""
        fates = self.fates(message_id)
        return fates[-1] if fates else None

    def fates(self, message_id: str | None = None) -> tuple[MessageFate, ...]:
        """Every remembered acceptance (of *message_id*), oldest first."""
        self._sync()
        entries = self._undecided()
        if message_id is None:
            entries.extend(self._decided)
        else:
            entries = [entry for entry in entries if entry.message_id == message_id]
            held = self._decided_by_id.get(message_id, ())
            entries.extend(held if isinstance(held, tuple) else (held,))
        entries.sort(key=lambda entry: entry.index)
        return tuple(entry.view() for entry in entries)

    def _undecided(self) -> list[_Entry]:
        """The pending records: each is in exactly one of the boxes."""
        entries = [*self._queued, *self._staged, *self._in_log]
        entries.extend(entry for entry in (self._admitting, self._prompt, self._steering_taken)
                       if entry is not None)
        return entries

    @property
    def accepted(self) -> int:
        """How many sends were accepted."""
        return self._accepted

    def pending(self) -> tuple[MessageFate, ...]:
        """The acceptances whose fate is not decided yet, oldest first."""
        entries = sorted(self._undecided(), key=lambda entry: entry.index)
        return tuple(entry.view() for entry in entries)

    # -- the R20.1 check ------------------------------------------------------------------

    def problems(self, boxes: _Boxes) -> list[str]:
        """At a quiet point (the core has no output to give): the fates that disagree with
        the core. Every pending fate must still be in the core's boxes as the ledger says
        (queued prompts in the inbox, staged steering and context in the outbox, in order),
        or be the prompt being admitted."""
        problems: list[str] = []
        queued = [e.message_id for e in self._queued]
        if tuple(queued) != boxes.queued_ids():
            problems.append(f"queued prompts {queued} but the inbox holds "
                            f"{list(boxes.queued_ids())}")
        staged = [(e.message_id, e.route == "steering") for e in self._staged]
        outbox = iter(boxes.staged())          # the ledger's staged items, in outbox order
        if not all(any(item == held for held in outbox) for item in staged):
            problems.append(f"staged {staged} but the outbox holds {list(boxes.staged())}")
        if self._steering_taken is not None or self._prompt is not None:
            problems.append("a dequeued steering item or an admitted prompt is not in the log "
                            "at a quiet point")
        return problems


def _ids(messages: Frozen) -> Iterable[object]:
    if isinstance(messages, FrozenList):
        for message in messages:
            if isinstance(message, FrozenDict):
                yield message.get("id")


_DURABLE: Final[dict[str, Callable[[FateLedger, Event], object]]] = {
    ev.TURN_START: FateLedger._turn_start,
    ev.USER_MESSAGE: FateLedger._user_message,
    ev.STEERING_MESSAGE: FateLedger._steering_message,
    ev.STEP_START: FateLedger._step_start,
    ev.TURN_END: FateLedger._turn_end,
}
_LIVE: Final[dict[str, Callable[[FateLedger, LiveEvent], None]]] = {
    ev.INBOX_DEQUEUE: FateLedger._dequeue,
    ev.INBOX_DISCARD: FateLedger._inbox_discard,
    ev.CONTEXT_DISCARD: FateLedger._context_discard,
    ev.CANCEL_REQUESTED: FateLedger._cancel_requested,
    ev.ERROR: FateLedger._error,
    ev.AGENT_DISPOSED: FateLedger._disposed,
}
