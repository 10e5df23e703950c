"""The core's state, its one entry point, and every move of its machines (specs/core.md R4).

Read this page and the loop's declared graph (`machine.core.loop`) to understand the core;
the other modules are the rules' procedures, written over what is here.

Theory of operation
-------------------
Inputs are the caller's *commands* (``send`` and its presets, ``cancel``, ``dispose``,
``append``: `machine.core.commands`) and the *completions* of the effects the core
requested (`complete`). Outputs are pulled one at a time with `CoreState.next_output`:
durable events (already committed to the session log), live notifications, effect
requests and control notices. A driver pulls an output, delivers it to its observers (who
may issue commands), and pulls the next; that is how a command takes effect exactly at the
output its issuer observed (P2). Commands never advance the loop (P3); completions are
buffered and taken when the loop next waits for them (P6); the loop advances only when
every queued output has been pulled (P8).

Everything the core's future depends on is an attribute of `CoreState`, and only this
module writes them: the modules of the rules (`machine.core.admission`, ``run``, ``step``,
``tools``, ``drains``, ``failures``, ``commands``) read the state and change it through the
intention-level operations below (`claim`, `admit`, `reject`, `start_run`, `end_run`,
`request_wake`, `cancel`, `stop`, `tear_down`, ...), each of which moves every machine it
couples together. So the couplings are kept in one place and checked in one place
(`coupling_problems`, at every output).

The four declared machines (``machine.machines``, each with its table and diagram):

* **Inbox** (``inbox``): queued prompts with their wakeup flags (R4.1).
* **Outbox** (``outbox``): staged steering and context, in order (R4.1).
* **Window** (``window``): closed, open for an admission, open for a run (R4.3).
* **Lifecycle** (``lifecycle``): where the loop is, from idle through admission,
  the steps of a turn, closing and the flush (R4.2, R6-R15).

The implicit machines, each a few attributes:

* **Abort owner** (``_owner``, ``_ctrl``, ``_next_signal``): the controller that a
  cancel aborts, and the controller whose signal the loop checks (R4.4, R0.7).
* **Pending retry** (``_pending_retry``, ``_prior_failures``): a retry that recovery
  authorized, and the failures of the current chain (R4.9, R13).
* **Wake request** (``_wake_effect``): the tick the wake waits for (R4.6, R6).
* **Disposal** (``_disposing``, ``_disposed``): disposing, then torn down (R17).
* **Stop** (``_failure``, ``_abandoned``): the core stopped after an internal
  failure, and the effects it no longer waits for (P16).
* **Header flag** (``_header_logged``): this instance has handled a header (R4.8).
* **Cancel delivery** (``_retro``): the scope of the cancel whose notice is the last
  output pulled, into which input accepted at that position is swept (P7, D9).
* **Effects and mail** (``_effects``, ``_next_effect``, ``_mail``, ``_wait``): requested
  effects still outstanding, the next id (ids are issued in order from 0, so an issued id
  neither outstanding nor abandoned is completed, P10), completions buffered until the
  loop takes them (P4-P6), and what the loop waits for.
* **The loop** (``_frames``): the activities in progress, outermost first (R4.10): a
  running interval, the claim of a prompt, a run, its steps, one step, a tool batch, ...,
  each a record of its phase and locals (`machine.core.loop`, whose declared graph says
  where each phase may go, R4.13).
* **Outputs** (``_out``): what is queued to be pulled (P1, P2, P8).
* **Per-turn record** (``_turn``, ``_step``, ``_reason``, ``_settle``): the current
  turn and step numbers and the reasons its end and settlement will carry (R8, R15).

Couplings (R4.11), true at every output and checked there by `coupling_problems`
(the invariant monitor calls it, so every scripted run, the differential test and
the explorer check them):

1. The window is open for an admission exactly while the lifecycle is admitting,
   open for a run exactly while it is in a turn, and closed otherwise.
2. An abort owner exists exactly while the lifecycle is admitting, in a turn or
   closing, and it is the controller the loop checks.
3. A wake effect is outstanding exactly while the lifecycle is ``wake_pending``.
4. A pending retry exists only while recovering, closing or flushing.
5. A busy lifecycle has a loop to run (``_frames``); the loop waits only while it
   exists.
6. Torn down implies disposing, idle, and nothing queued or staged.
7. A stopped core waits for nothing: no loop, no wake, no owner, no retry, no
   effect it still consumes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Literal

from machine import events as ev
from machine.core import loop
from machine.core.config import CoreConfig
from machine.core.loop import DONE, Action, IntervalFrame
from machine.core.records import (
    APPEND,
    Aborted,
    AbortNotice,
    CancelRequested,
    CancelScope,
    Controller,
    DiscardSlot,
    EffectRecord,
    Mail,
    Queued,
    Wait,
    announced_id,
    frozen_json,
)
from machine.errors import EXITS, ProtocolError
from machine.events import LiveEvent
from machine.io import MODEL, TICK, Control, Durable, Effect, EffectKind, Live, Output
from machine.jsonvalue import Frozen, FrozenDict, JsonLike, shown, snapshot
from machine.log import SessionLog
from machine.machines import Inbox, Lifecycle, Outbox, Window
from machine.machines.lifecycle import IN_TURN
from machine.vocabulary import (
    DISPOSED_CAUSE,
    END_COMPLETED,
    SETTLE_COMPLETED,
    CancelCause,
    ErrorInfo,
    Message,
    SettleReason,
    TurnEndReason,
    internal_error,
    minted_id,
)

#: R4.11 (2): the lifecycle states in which an abort owner exists.
OWNED: Final = frozenset({"admitting", *IN_TURN, "closing"})
#: R4.11 (4): the lifecycle states in which a retry may be pending.
RETRY_STATES: Final = frozenset({"recovering", "closing", "flushing"})
#: The classes of the outputs a phase may give (machine.io's ``Output``).
OUTPUT_TYPES: Final = frozenset((Durable, Live, Effect, Control))


def default_mint_id(kind: str, seq: int) -> str:
    """The id a core given no `mint_id` mints (P12) for a message of *kind* at log position
    *seq*: ``{kind}-{seq}`` (a module function, not a lambda, so that a snapshot pickles,
    R4.12)."""
    return f"{kind}-{seq}"


class CoreState:
    """The core's whole state (see the module docstring), its entry point (`next_output`,
    `complete`) and the operations that change it."""

    def __init__(self, config: CoreConfig | None = None, *, log: SessionLog | None = None,
                 clock: Callable[[], float] | None = None,
                 mint_id: Callable[[str, int], str] | None = None) -> None:
        # Static: configuration, the session log, the id minting of P12.
        self.config = config if config is not None else CoreConfig()
        self.log = log if log is not None else SessionLog(clock=clock)
        self._mint = mint_id if mint_id is not None else default_mint_id
        # The four declared machines.
        self.inbox = Inbox()
        self.outbox = Outbox()
        self.window = Window()
        self.lifecycle = Lifecycle()
        # Outputs, effects and mail (P1-P8).
        self._out: deque[Queued] = deque()
        self._retro: CancelScope | None = None
        self._frames: list[loop.Frame] = []    # the loop: its activities in progress (R4.10)
        self._wait: frozenset[int] | None = None
        self._effects: dict[int, EffectRecord] = {}
        self._mail: deque[Mail] = deque()
        self._next_effect = 0
        # Abort owner, wake request, pending retry.
        self._next_signal = 0
        self._wake_effect: int | None = None
        self._owner: Controller | None = None
        self._ctrl: Controller | None = None
        self._pending_retry = False
        self._prior_failures: list[FrozenDict] = []
        # Per-turn record and the header flag.
        self._turn = 0
        self._step = 0
        self._reason: TurnEndReason = END_COMPLETED     # V19: what turn/end will carry
        self._settle: SettleReason = SETTLE_COMPLETED   # V20: what agent/settled will carry
        self._header_logged = False
        # Disposal and stop.
        self._disposing = False
        self._disposed = False
        self._failure: ErrorInfo | None = None    # P16: why the core stopped, once it has
        self._abandoned: set[int] = set()         # P16: effects requested before it stopped

    # ------------------------------------------------------------------
    # Read-only state (P10)
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

    @property
    def busy(self) -> bool:
        """R4.2: the core is in a running interval."""
        return self.lifecycle.busy

    @property
    def turn(self) -> int:
        """R8.1: the number of the current (or last) turn."""
        return self._turn

    @property
    def step(self) -> int:
        """R8.4: the number of the current (or last) step of the turn."""
        return self._step

    @property
    def reason(self) -> TurnEndReason:
        """V19: the reason the current turn's ``turn/end`` will carry."""
        return self._reason

    @property
    def settle_reason(self) -> SettleReason:
        """V20: the reason the current interval's ``agent/settled`` will carry."""
        return self._settle

    @property
    def header_logged(self) -> bool:
        """R4.8: this core has handled a request header."""
        return self._header_logged

    @property
    def prior_failures(self) -> tuple[FrozenDict, ...]:
        """R13.2: the failures of the current chain of requests, oldest first."""
        return tuple(self._prior_failures)

    @property
    def controller(self) -> Controller | None:
        """R0.7: the controller whose signal the loop checks."""
        return self._ctrl

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

    def coupling_problems(self) -> list[str]:
        """R4.11: the couplings of the module docstring that do not hold now (none between
        outputs). Cheap enough to call at every output; used by the invariant monitor."""
        problems: list[str] = []
        phase = self.lifecycle.state
        window = self.window.state
        expected = ("admission" if phase == "admitting" else
                    "turn" if phase in IN_TURN else "closed")
        if window != expected:
            problems.append(f"(1) the window is {window!r} while the lifecycle is {phase!r}")
        owner = self._owner
        if (owner is not None) != (phase in OWNED):
            problems.append(f"(2) an abort owner {'exists' if owner else 'is missing'} while "
                            f"the lifecycle is {phase!r}")
        if owner is not None and owner is not self._ctrl:
            problems.append("(2) the abort owner is not the controller the loop checks")
        if (self._wake_effect is not None) != (phase == "wake_pending"):
            state = "outstanding" if self._wake_effect is not None else "missing"
            problems.append(f"(3) a wake effect is {state} while the lifecycle is {phase!r}")
        if self._pending_retry and phase not in RETRY_STATES:
            problems.append(f"(4) a retry is pending while the lifecycle is {phase!r}")
        if self.lifecycle.busy and not self._frames:
            problems.append(f"(5) the lifecycle is {phase!r} with no loop to run")
        if self._wait is not None and not self._frames:
            problems.append("(5) the loop waits but does not exist")
        if self._disposed and not (self._disposing and phase == "idle" and not len(self.inbox)
                                   and not len(self.outbox)):
            problems.append("(6) torn down, but not disposing, not idle, or holding input")
        if self._failure is not None and (
                self._frames or self._wake_effect is not None or owner is not None
                or self._pending_retry or self._effects):
            problems.append("(7) the core stopped but still waits for something")
        return problems

    # ------------------------------------------------------------------
    # The entry point: outputs and completions (P1-P10)
    # ------------------------------------------------------------------

    def next_output(self) -> Output | None:
        """The next output, or None when the core waits for an input (P1)."""
        out = self._out
        while True:
            if out:
                self._retro = None      # the previous output's delivery has ended (P7)
                item = out.popleft()
                if isinstance(item, DiscardSlot):
                    live = item.materialise()
                    if live is None:
                        continue
                    return live
                if isinstance(item, CancelRequested):
                    self._retro = item.scope            # P7: its delivery opens the window
                    item.scope.fresh = 0
                    return item.output
                if isinstance(item, AbortNotice):
                    return item.materialise()
                return item
            # Advance the loop by one step. Why inline (this runs once per output): one call
            # fewer, and an output the loop gives with nothing queued before it is handed out
            # at once rather than queued and taken back (the same output, in the same order).
            frames = self._frames
            if not frames:
                try:
                    if not self._advance_idle():
                        return None
                except BaseException as error:  # P16: never escapes, never half-advanced
                    self.stop(error)
                    if isinstance(error, EXITS):
                        raise           # P16: the core has stopped; the exit goes on
                continue
            sent: object = None
            if self._wait is not None:
                sent = self.take_mail(self._wait)
                if sent is None:
                    return None         # P7: nothing pulled, the position stays
                self._wait = None
            self._retro = None          # the loop moves on: the position is over (P7)
            frame = frames[-1]
            checking = loop.CHECKING    # R4.13: the declared graph is being checked
            try:
                while True:             # run phases until one gives an output or waits
                    if checking:
                        loop.running(frame, frame.phase)
                    try:
                        action = frame.phase(self, frame, sent)
                    except Exception as error:
                        action = self._unwind(error)
                        frame = frames[-1]
                    kind = action.__class__
                    if kind in OUTPUT_TYPES or kind is Wait:   # the usual cases first
                        break
                    if action is DONE:                  # the activity ends; its caller goes on
                        if checking:
                            loop.check_end(frame)
                        frames.pop()
                        if not frames:
                            break
                        sent = frame.result
                        frame = frames[-1]
                    else:                               # a sub-activity starts
                        if checking:
                            loop.check_start(frame, action)
                        # Why not cast/isinstance: this runs several times per output; what
                        # is neither an output, a wait nor DONE is a frame (`Action`).
                        frame = action  # type: ignore[assignment]
                        frames.append(frame)
                        sent = None
            except BaseException as error:      # P16: the loop cannot go on
                self.stop(error)
                if isinstance(error, EXITS):
                    raise               # P16: the core has stopped; the exit goes on
                continue
            if kind is Wait:
                if checking:
                    loop.check_wait(frame)
                self._wait = action.ids  # type: ignore[union-attr]  # Why: as above, no cast
            elif action is DONE:                # the loop has ended
                continue
            elif out:
                out.append(action)  # type: ignore[arg-type]  # only an output is left
            else:
                return action  # type: ignore[return-value]  # only an output is left

    def drain_outputs(self) -> list[Output]:
        """Pull every output available now (no observers act in between)."""
        outputs: list[Output] = []
        while (output := self.next_output()) is not None:
            outputs.append(output)
        return outputs

    def complete(self, effect: int, kind: str, value: JsonLike) -> None:
        """A completion of effect *effect* (P4-P6, P10): checked against what the effect is
        and buffered until the loop waits for it (a ``chunk`` leaves a model stream open)."""
        if type(effect) is not int:
            raise ProtocolError(f"effect id must be an integer, not {shown(effect)}")
        record = self._effects.get(effect)
        if record is None:
            if effect in self._abandoned:                       # P16: accepted, dropped
                if kind != "chunk":
                    self._abandoned.discard(effect)
                return
            # Why no set of completed ids: ids are issued in order from 0, and each issued
            # one is outstanding, abandoned or completed, so an issued id found in neither
            # of the first two is completed (a set would grow with every effect, P10).
            if 0 <= effect < self._next_effect:
                raise ProtocolError(f"effect {effect} was already completed")
            raise ProtocolError(f"effect {effect} was never requested")
        if kind in ("chunk", "end") and record.kind != MODEL:
            raise ProtocolError(f"effect {effect} is a {record.kind!r} effect; only a model "
                                f"effect takes {kind!r}")
        if kind == "resolve" and record.kind == MODEL:
            raise ProtocolError(f"effect {effect} is a model stream: complete it with chunk, "
                                "end or raise")
        if kind != "raise" and value is not None:
            value = snapshot(value)     # V6, P6: the value as it is at the call
        if kind != "chunk":
            del self._effects[effect]                           # completed (P10)
        self._mail.append((effect, kind, value))

    def _unwind(self, error: Exception) -> Action:
        """A phase raised *error*: the frames above the nearest one with an armed handler are
        dropped, and that frame goes to its handler phase (disarmed first), which says what
        happens next (R8.6). With none, the error goes on (P16: the core stops)."""
        frames = self._frames
        while frames:
            frame = frames[-1]
            handler = frame.handler
            if handler is not None:
                # Why no guard around it: a handler only starts the failed turn's closing;
                # should it raise, no frame below it has a handler, so the core stops (P16).
                frame.handler = None
                if loop.CHECKING:
                    loop.running(frame, frame.phase)    # the frame resumes, at its handler
                frame.phase = handler
                if loop.CHECKING:
                    loop.running(frame, handler)
                return handler(self, frame, error)
            frames.pop()
        raise error

    def _advance_idle(self) -> bool:
        """With no activity in progress: the wake, once its tick has completed (R6.2), or the
        teardown of a disposing core once it is quiescent (R17.1 step 3, R17.4)."""
        wake = self._wake_effect
        if wake is not None:
            mail = self.take_mail(frozenset((wake,)))
            if mail is None:
                return False
            self._wake_effect = None
            self._retro = None          # the loop moves on (P7)
            if self._disposing and self.inbox.has_waking:   # R17.4: a wake never claims then
                self.cancel(DISPOSED_CAUSE, False)
            if self.inbox.has_waking:                       # R6.2
                self._frames.append(IntervalFrame(phase=loop.bound("interval", "claim")))
            else:
                self.lifecycle.fire("wake_empty")
            return True
        if self._disposing and not self._disposed and self.is_quiescent:
            self._retro = None
            self.tear_down()
            return True
        return False

    # ------------------------------------------------------------------
    # What the loop's phases use: outputs, effects, mail, appends, signals
    # ------------------------------------------------------------------

    def emit(self, item: Queued) -> None:
        """Queue an output; while a cancel's notice is being delivered, ahead of what that
        cancel still has queued (its reports, its abort: P7)."""
        retro = self._retro
        if retro is not None:
            for index, queued in enumerate(self._out):
                if queued is retro.inbox_slot or queued is retro.abort:
                    self._out.insert(index, item)
                    return
        self._out.append(item)

    def emit_live(self, type_: str, **payload: Frozen) -> None:
        self.emit(Live(LiveEvent(type_, FrozenDict(payload))))

    def take_mail(self, ids: frozenset[int]) -> Mail | None:
        """The oldest buffered completion of one of *ids*, taken (P6), or None."""
        if self._mail and self._mail[0][0] in ids:  # Why: usually the oldest mail is the one
            return self._mail.popleft()
        for index, mail in enumerate(self._mail):
            if mail[0] in ids:
                del self._mail[index]
                return mail
        return None

    def new_effect(self, kind: EffectKind, payload: FrozenDict,
                   history: Sequence[Message] | None = None) -> Effect:
        """Request an effect (P4): the next id, outstanding until it completes."""
        effect_id = self._next_effect
        self._next_effect += 1
        self._effects[effect_id] = EffectRecord(kind, payload)
        return Effect(effect_id, kind, payload, history)

    def release(self, effect_id: int) -> Control | None:
        """P5: stop consuming a model stream; drop what is buffered for it. Returns the
        ``release`` notice, or None when the stream had already ended (nothing to stop)."""
        self._mail = deque(m for m in self._mail if m[0] != effect_id)
        if self._effects.pop(effect_id, None) is None:
            return None                     # P10: a later completion is refused (`complete`)
        return Control("release", FrozenDict({"effect": effect_id}))

    def commit(self, type_: str, data: Mapping[str, Frozen] | Message, *,
               surface: bool = False, sources: Sequence[int] | None = None) -> Durable:
        """Append one of the loop's events to the log (it checks it, L2) as a durable output."""
        if isinstance(data, dict):
            # Why adopt, not FrozenDict(data): the loop builds *data* here from frozen values
            # (its type says so, and mypy --strict checks every call), so the copy and the
            # per-value check of the constructor would find nothing; the log's checks (L2)
            # still judge the event.
            data = FrozenDict._adopt(data)
        return Durable(self.log.commit(type_, data, surface_op=APPEND if surface else None,
                                       source_event_seqs=sources))

    def check_signal(self) -> None:
        """R0.7: a signal check; an aborted signal ends the turn."""
        ctrl = self._ctrl
        if ctrl is not None and ctrl.aborted:
            raise Aborted()

    @property
    def aborted(self) -> bool:
        """R0.7: the signal the loop checks is aborted."""
        ctrl = self._ctrl
        return ctrl is not None and ctrl.aborted

    def signal(self) -> int:
        """The signal id of the controller the loop checks (P4 payloads carry it)."""
        assert self._ctrl is not None
        return self._ctrl.signal

    def mint_id(self, kind: str, seq: int) -> str:
        """P12: the id of a message of *kind* the loop writes at log position *seq*."""
        return minted_id(self._mint, kind, seq)

    # ------------------------------------------------------------------
    # The intention-level operations: each moves the machines it couples together
    # ------------------------------------------------------------------

    def _new_controller(self, kind: Literal["admission", "run"]) -> Controller:
        self._next_signal += 1
        ctrl = Controller(self._next_signal, kind)
        self._ctrl = ctrl
        self._owner = ctrl
        return ctrl

    def request_wake(self) -> None:
        """R6.1: from idle, the wake's tick is requested and the lifecycle waits for it
        (ignored while busy or while a wake is pending)."""
        if self.lifecycle.state != "idle":
            return
        self.lifecycle.fire("request_wake")
        effect = self.new_effect(TICK, FrozenDict._adopt({"purpose": "wake"}))
        self._wake_effect = effect.id
        self.emit(effect)

    def claim(self) -> tuple[Message, Controller, bool]:
        """R7.2-R7.3: the inbox's head is claimed; the lifecycle admits it, a fresh admission
        controller owns the abort, the window opens. Returns the message, the controller and
        whether the core was busy already (else this claim starts an interval, R7.4)."""
        message, _wakeup = self.inbox.claim()
        was_busy = self.lifecycle.busy
        self.lifecycle.fire("claim")
        ctrl = self._new_controller("admission")
        self.window.fire("claim")
        return message, ctrl, was_busy

    def admit(self) -> None:
        """R7.8-R7.9: the admission's owner goes away and the lifecycle starts the run; a new
        chain of requests begins (R13)."""
        self._owner = None
        self.lifecycle.fire("admit")
        self._prior_failures = []

    def reject(self) -> None:
        """R7.8, R7.10 step 1: the admission's owner goes away, the window closes, and the
        lifecycle enters the rejected tail; the loop checks no signal."""
        self._owner = None
        self.window.fire("reject")
        self.lifecycle.fire("reject")
        self._ctrl = None

    def start_run(self) -> int:
        """R8.1: a fresh run controller owns the abort, the window is open for the run, the
        turn is the log's next (R4.7), its reasons start as completed and its step at 0.
        Returns the turn."""
        self._new_controller("run")
        self.window.fire("start_run")
        turn = self._turn = self.log.last_turn + 1
        self._reason = END_COMPLETED
        self._settle = SETTLE_COMPLETED
        self._step = 0
        return turn

    def run_not_started(self) -> None:
        """P16 case 3: the run's turn/start was refused: no turn, so the window closes, the
        lifecycle passes closing and the flush without either, the owner goes away and no
        retry is pending."""
        self.window.fire("end_run")
        self.lifecycle.fire("close")
        self.lifecycle.fire("flush")
        self._owner = None
        self._ctrl = None
        self._pending_retry = False

    def end_run(self) -> None:
        """R8.7: the window closes ahead of turn/end, and the lifecycle is closing."""
        self.window.fire("end_run")
        self.lifecycle.fire("close")

    def start_flush(self) -> None:
        """R8.7, R12.4: after turn/end the run's owner goes away and the lifecycle flushes."""
        self._owner = None
        self._ctrl = None
        self.lifecycle.fire("flush")

    def retry(self) -> None:
        """R12.5, R13.3: the pending retry is consumed and the lifecycle starts a new run."""
        self._pending_retry = False
        self.lifecycle.fire("retry")

    def go_idle(self) -> None:
        """R12.7: nothing waking is queued: the running interval ends."""
        self.lifecycle.fire("go_idle")

    def begin_step(self) -> None:
        """R8.4: the next step of the turn."""
        self.lifecycle.fire("begin_step")
        self._step += 1

    def enter_assembly(self) -> None:
        """R9.3: the step assembles its request."""
        self.lifecycle.fire("assemble")

    def enter_request(self) -> None:
        """R9.5: the step's request is being prepared."""
        self.lifecycle.fire("request")

    def enter_stream(self) -> None:
        """R9.7: the model stream is being consumed."""
        self.lifecycle.fire("stream")

    def enter_tools(self) -> None:
        """R9.9: the step runs its tool batch."""
        self.lifecycle.fire("run_tools")

    def end_step(self) -> None:
        """R9.10: the step ends."""
        self.lifecycle.fire("end_step")

    def enter_recovery(self) -> None:
        """R13.2: the model request failed; recovery decides."""
        self.lifecycle.fire("request_failed")

    def stop_turn(self) -> None:
        """R8.5: the turn asks whether to stop."""
        self.lifecycle.fire("stop_turn")

    def authorize_retry(self) -> None:
        """R13.2 step 3: recovery authorized a retry; it runs after the flush (R12.5)."""
        self._pending_retry = True

    def record_request_failure(self, failure: FrozenDict) -> None:
        """R13.2 step 4: the failure joins the chain's prior failures."""
        self._prior_failures = [*self._prior_failures, failure]

    def clear_request_failures(self) -> None:
        """R13.4: a step that completes ends the chain of failed requests."""
        self._prior_failures = []

    def set_reasons(self, reason: TurnEndReason, settle: SettleReason) -> None:
        """R15: the reasons the turn's end and the interval's settlement will carry."""
        self._reason, self._settle = reason, settle

    def set_reason(self, reason: TurnEndReason) -> None:
        """R14.3: the reason the turn's end will carry."""
        self._reason = reason

    def handled_header(self) -> None:
        """R4.8: this core has handled a request header."""
        self._header_logged = True

    # -- cancel, disposal and stop (R16, R17, P7, P16) ---------------------------

    def cancel(self, cause: CancelCause, keep: bool) -> None:
        """R16.1-R16.3: an effective cancel announces itself, clears what is queued and staged
        (unless *keep*) into its pending reports, drops a pending retry (D2) and aborts the
        owner (the first cause wins). All at once, its reports pending (P7); a cancel issued
        while another one's notice is being delivered joins it (D9)."""
        retro = self._retro
        if retro is not None:
            self._join(retro, cause, keep)
            return
        if not (self._owner is not None or self._pending_retry                    # R16.1
                or (not keep and (len(self.inbox) or len(self.outbox)))):
            return                                      # a no-op arms nothing
        inbox_slot = DiscardSlot(ev.INBOX_DISCARD) if not keep else None
        context_slot = DiscardSlot(ev.CONTEXT_DISCARD) if not keep else None
        scope = CancelScope(inbox_slot, context_slot)
        self._emit_cancel_requested(cause, scope)       # R16.2 step 1
        if inbox_slot is not None and context_slot is not None:   # R16.2 step 2
            self._clear_into(inbox_slot, context_slot)
            self.emit(inbox_slot)
            self.emit(context_slot)
        self._pending_retry = False                     # R16.2 step 3 (D2)
        owner = self._owner                             # R16.2 step 4
        if owner is not None and owner.reason is None:  # R16.3: the first cause wins
            owner.reason = cause
            scope.abort = AbortNotice(owner.signal, cause)
            self.emit(scope.abort)

    def _join(self, scope: CancelScope, cause: CancelCause, keep: bool) -> None:
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
            inbox_slot = DiscardSlot(ev.INBOX_DISCARD)
            context_slot = DiscardSlot(ev.CONTEXT_DISCARD)
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
                        and announced_id(queued) in listed):
                    at = max(at, index + 1)
            self._out.insert(at, context_slot)
            self._out.insert(at, inbox_slot)
            scope.inbox_slot, scope.context_slot = inbox_slot, context_slot
        self._pending_retry = False
        owner = self._owner
        if scope.abort is not None and owner is not None:
            owner.reason = cause
            scope.abort.reason = cause

    def _emit_cancel_requested(self, cause: CancelCause, scope: CancelScope) -> None:
        if cause.kind != "disposed":
            notice = Live(LiveEvent(ev.CANCEL_REQUESTED, FrozenDict({"cause": frozen_json(cause)})))
            self.emit(CancelRequested(notice, scope))

    def _clear_into(self, inbox_slot: DiscardSlot, context_slot: DiscardSlot) -> None:
        """R16.2 step 2: every queued item, then the staged steering, then the staged
        context, each in FIFO order, into the reports; the inbox and outbox are emptied."""
        queued = self.inbox.discard() if len(self.inbox) else []
        steering, contexts = self.outbox.clear() if len(self.outbox) else ([], [])
        inbox_slot.queued.extend(queued)
        inbox_slot.steering.extend(steering)
        context_slot.queued.extend(contexts)

    def sweep(self, message: Message, group: Literal["queued", "steering", "context"]) -> bool:
        """P7: input accepted while the notice of a cancel that cleared the inbox is being
        delivered is cleared by that cancel: put in its report (*group*), counted as new for
        a joined cancel (D9). False when no such delivery is open (nothing is done)."""
        retro = self._retro
        if retro is None or retro.inbox_slot is None or retro.context_slot is None:
            return False
        if group == "context":
            retro.context_slot.queued.append(message)
        elif group == "steering":
            retro.inbox_slot.steering.append(message)
        else:
            retro.inbox_slot.queued.append(message)
        retro.fresh += 1
        return True

    @property
    def sweeping(self) -> bool:
        """P7: a cancel that cleared the inbox is being delivered (`sweep` takes input)."""
        retro = self._retro
        return retro is not None and retro.inbox_slot is not None

    def dispose(self) -> None:
        """R17.1 steps 1-2: the core is disposing and cancels with cause disposed now; its
        teardown follows once it is quiescent (`tear_down`)."""
        self._disposing = True
        self.cancel(DISPOSED_CAUSE, False)

    def tear_down(self) -> None:
        """R17.1 step 3: report anything still pending, then the two disposed notices."""
        if len(self.inbox) or len(self.outbox):
            inbox_slot = DiscardSlot(ev.INBOX_DISCARD)
            context_slot = DiscardSlot(ev.CONTEXT_DISCARD)
            self._clear_into(inbox_slot, context_slot)
            self.emit(inbox_slot)
            self.emit(context_slot)
        self._disposed = True
        self.emit_live(ev.AGENT_DISPOSED)
        self.emit_live(ev.SESSION_DISPOSED)

    def stop(self, error: BaseException) -> None:
        """P16: the loop failed where it could not fail a turn in order (a closing append
        refused twice, or a failure outside any turn): the core stops. Its machines are reset
        (so the status is idle), what it waited for is abandoned (later completions are
        accepted and dropped), pending input stays pending until dispose() reports it, and
        ``agent/error`` names the failure."""
        info = internal_error(error)
        self._failure = info
        self._frames.clear()
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
            self.cancel(DISPOSED_CAUSE, False)
        was_busy = self.lifecycle.busy
        self.lifecycle = Lifecycle()
        self.window = Window()
        self.emit(Live(LiveEvent(ev.ERROR, FrozenDict({"turn": self._turn, "step": self._step,
                                                       "error": frozen_json(info)}))))
        if was_busy:
            self.emit_live(ev.STATUS, status="idle")
