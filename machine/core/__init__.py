"""AgentCore: the sans-I/O agent loop over the four machines (specs/core.md, specs/protocol.md).

Inputs are caller *commands* (``send`` and its presets, ``cancel``, ``dispose``, ``append``)
and *completions* of the effects the core requested (``resolve``, ``fail``, ``chunk``,
``end``). Outputs are pulled one at a time with `AgentCore.next_output`: durable events
(already committed to the session log), live notifications, effect requests and control
notices. A driver pulls an output, delivers it to its observers (who may issue commands),
and pulls the next; that is how a command takes effect exactly at the output its issuer
observed (P2).

Where each part lives
---------------------
* `machine.core.state`: the whole state, its one entry point (``next_output``,
  ``complete``), every operation that moves its machines, and their couplings (R4). With
  `machine.core.loop`, the page to read first.
* `machine.core.loop`: the loop's activities as records, and each kind's declared graph
  of phases (R4.10, R4.13).
* `machine.core.commands`: routing of every send, cancel, dispose, direct appends (R5,
  R16, R17, R20.2-R20.4, P3);
* `machine.core.admission`: the running interval, claims and admissions, the rejected
  tail, continue-or-idle (R6.2, R7, R12.7);
* `machine.core.run`: runs, their steps and turn-stopping, flush, settlement, retry (R8,
  R12, R13);
* `machine.core.step`: one step, the model stream, a failed request's recovery (R9,
  R13.2, R14, P12, P13);
* `machine.core.tools`: the tool batch (R10);
* `machine.core.drains`: the outbox drains (R11);
* `machine.core.failures`: a failed turn's closing and classification (R8.6, R15, P16);
* `machine.core.snapshot`: copying and comparing a state (R4.12);
* this module: `AgentCore`, the public face over one `CoreState`: construction,
  publication, commands, completions, the read-only state (P9-P11), snapshots (R4.12).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Literal

from machine import events as ev
from machine.core import admission, commands, drains, failures, loop, run, step, tools
from machine.core.config import CoreConfig, ToolMode
from machine.core.snapshot import duplicate_state, log_parts, state_parts
from machine.core.state import CoreState
from machine.errors import NotPicklableError, ProtocolError
from machine.events import Event
from machine.io import (
    Append,
    Cancel,
    Chunk,
    Dispose,
    Effect,
    End,
    Input,
    Observer,
    Output,
    Raise,
    Resolve,
    Send,
)
from machine.jsonvalue import JsonLike, shown
from machine.log import LogMark, SessionLog
from machine.vocabulary import FOLLOWUP, INJECT, STEER, CancelCause, ErrorInfo

__all__ = ["AgentCore", "CoreConfig", "CoreSnapshot", "ToolMode"]

# Every phase of the loop is bound once its module is imported (above): check them against
# the declared graph now, so that a phase without a declaration fails at import.
del admission, drains, failures, run, step, tools
loop.verify()


class AgentCore:
    """The deterministic sans-I/O agent core. See the module docstring."""

    def __init__(self, config: CoreConfig | None = None, *, log: SessionLog | None = None,
                 clock: Callable[[], float] | None = None,
                 mint_id: Callable[[str, int], str] | None = None) -> None:
        state = self._state = CoreState(config, log=log, clock=clock, mint_id=mint_id)
        if state.config.publish:                                # P11
            state.emit_live(ev.SESSION_CREATED)
            state.emit_live(ev.AGENT_CREATED, status="idle")
            state.emit_live(ev.SESSION_START, source=state.config.session_start)

    @classmethod
    def _over(cls, state: CoreState) -> AgentCore:
        core = cls.__new__(cls)
        core._state = state
        return core

    # -- outputs (P1) ---------------------------------------------------------------------

    def next_output(self) -> Output | None:
        """The next output, or None when the core waits for an input (P1)."""
        return self._state.next_output()

    def output_puller(self) -> Callable[[], Output | None]:
        """`next_output` itself, for a driver that pulls in a loop: the same outputs, one
        call fewer for each."""
        return self._state.next_output

    def drain_outputs(self) -> list[Output]:
        """Pull every output available now (no observers act in between)."""
        outputs: list[Output] = []
        while (output := self.next_output()) is not None:
            outputs.append(output)
        return outputs

    # -- commands (R5, R16, R17, R20.2, P3) -------------------------------------------------

    def send(self, message: JsonLike, options: JsonLike) -> None:
        """R5: validate (options first, then the message), snapshot, route."""
        commands.send(self._state, message, options)

    def followup(self, message: JsonLike) -> None:
        commands.send_preset(self._state, message, FOLLOWUP)

    def steer(self, message: JsonLike) -> None:
        commands.send_preset(self._state, message, STEER)

    def inject(self, message: JsonLike) -> None:
        commands.send_preset(self._state, message, INJECT)

    def cancel(self, cause: JsonLike, keep_inbox: bool = False) -> None:
        """R16: cancel the current activity and (unless *keep_inbox*) what is pending."""
        commands.cancel(self._state, cause, keep_inbox)

    def dispose(self) -> None:
        """R17: cancel(disposed) now; teardown outputs follow once the core is quiescent."""
        commands.dispose(self._state)

    def append(self, type: str, data: JsonLike, *, surface_op: JsonLike = None,
               source_event_seqs: Sequence[int] | None = None, ignorable: bool = False) -> Event:
        """A direct append by extension code (R20.2): checked, committed, delivered in order.
        *ignorable* marks an extension event a build that does not read its type may resume
        past (D16)."""
        return commands.append(self._state, type, data, surface_op=surface_op,
                               source_event_seqs=source_event_seqs, ignorable=ignorable)

    # -- completions (P4-P6, P10) -----------------------------------------------------------

    def resolve(self, effect: int, value: JsonLike = None) -> None:
        self._state.complete(effect, "resolve", value)

    def fail(self, effect: int, error: ErrorInfo) -> None:
        if not isinstance(error, ErrorInfo):
            raise ProtocolError(f"effect {effect}: a raise needs an ErrorInfo, not "
                                f"{type(error).__name__}")
        self._state.complete(effect, "raise", ErrorInfo.checked(error))  # V2: however built

    def chunk(self, effect: int, chunk: JsonLike) -> None:
        self._state.complete(effect, "chunk", chunk)

    def end(self, effect: int) -> None:
        self._state.complete(effect, "end", None)

    def feed(self, item: Input) -> None:
        """Apply one input value (P9)."""
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
                        source_event_seqs=item.source_event_seqs, ignorable=item.ignorable)
        elif isinstance(item, Resolve):
            self.resolve(item.effect, item.value)
        elif isinstance(item, Raise):
            self.fail(item.effect, item.error)
        elif isinstance(item, Chunk):
            self.chunk(item.effect, item.chunk)
        elif isinstance(item, End):
            self.end(item.effect)
        else:                           # P9, P10: only the inputs of P9
            raise ProtocolError(f"not an input: {shown(item)}")

    # -- read-only state (P10) --------------------------------------------------------------

    @property
    def config(self) -> CoreConfig:
        return self._state.config

    @property
    def log(self) -> SessionLog:
        return self._state.log

    @property
    def status(self) -> Literal["idle", "running"]:
        return self._state.status

    @property
    def accepts_next_step(self) -> bool:
        return self._state.accepts_next_step

    @property
    def pending_queued(self) -> int:
        return self._state.pending_queued

    @property
    def pending_steering(self) -> int:
        return self._state.pending_steering

    @property
    def pending_context(self) -> int:
        return self._state.pending_context

    @property
    def wake_pending(self) -> bool:
        return self._state.wake_pending

    @property
    def retry_pending(self) -> bool:
        return self._state.retry_pending

    @property
    def is_quiescent(self) -> bool:
        """R18: not busy, no wake pending, no waking item queued (what ``whenIdle`` waits for)."""
        return self._state.is_quiescent

    @property
    def disposing(self) -> bool:
        return self._state.disposing

    @property
    def disposed(self) -> bool:
        return self._state.disposed

    @property
    def failure(self) -> ErrorInfo | None:
        """P16: the internal failure that stopped the core, or None while it works."""
        return self._state.failure

    @property
    def outstanding_effects(self) -> tuple[int, ...]:
        """Ids of the effects requested and not yet completed, in request order."""
        return self._state.outstanding_effects

    def outstanding(self) -> tuple[Effect, ...]:
        """The outstanding effect requests (without the model history view)."""
        return self._state.outstanding()

    def signal_reason(self, signal: int) -> CancelCause | None:
        """The abort reason of the current controller if it has this signal id."""
        return self._state.signal_reason(signal)

    def queued_ids(self) -> tuple[str, ...]:
        """Ids of the queued inbox items, FIFO order."""
        return self._state.queued_ids()

    def staged(self) -> tuple[tuple[str, bool], ...]:
        """(message id, is_steering) of the staged outbox items, FIFO order."""
        return self._state.staged()

    def coupling_problems(self) -> list[str]:
        """R4.11: the couplings that do not hold now (none between outputs)."""
        return self._state.coupling_problems()

    # -- snapshots (R4.12) ------------------------------------------------------------------

    def snapshot(self) -> CoreSnapshot:
        """The core's whole state now, as an immutable value (R4.12): its machines, queues,
        outstanding effects, buffered completions, queued outputs and the loop's position,
        with the session log by position. O(state); the log is not copied. Take it between
        outputs (any time the caller holds control)."""
        state = CoreState.__new__(CoreState)
        duplicate_state(self._state, state, self.log)
        return CoreSnapshot(state, self.log, self.log.mark())

    @classmethod
    def restore(cls, snapshot: CoreSnapshot) -> AgentCore:
        """A new core whose future, for the same inputs, is exactly that of the core the
        snapshot was taken from at that moment (R4.12): same outputs, appends, read-only
        state and errors. Its log is a fork of the snapshot's log at the snapshot's position
        (`SessionLog.fork`, L15): events appended to the original since are not in it, and
        nothing appended to either reaches the other. Log observers are not carried over.
        O(state), plus the copy of the log's event references; no input is replayed. A
        snapshot restores any number of times."""
        if not isinstance(snapshot, CoreSnapshot):
            raise TypeError(f"restore takes a CoreSnapshot, not {type(snapshot).__name__}")
        state = CoreState.__new__(CoreState)
        duplicate_state(snapshot._state, state, snapshot._log.fork(snapshot._mark))
        return cls._over(state)

    def copy(self) -> AgentCore:
        """An independent core in this core's state (`restore` of a `snapshot`, in one copy)."""
        state = CoreState.__new__(CoreState)
        duplicate_state(self._state, state, self.log.fork())
        return AgentCore._over(state)


def state_of(core: AgentCore) -> CoreState:
    """The state under *core* (for checkers that read it whole: the explorer's keys)."""
    return core._state


class CoreSnapshot:
    """A core's whole state at one moment, as an immutable value (R4.12); made by
    `AgentCore.snapshot` and turned back into a core by `AgentCore.restore`.

    Two snapshots are equal when everything their futures depend on is equal: the state
    (machines, queues, effects, completions, queued outputs, the loop's frames) and the log's
    events up to the snapshot's position, compared by type, data, surface operation and
    sources (not by time), and the log's extension rules at the snapshot (L10, by identity).
    They hash alike then. `key(symmetric=True)` also equates states that differ only in the
    names of their messages (ids renamed in order of appearance), as a model checker's
    symmetry reduction does."""

    __slots__ = ("_key", "_log", "_mark", "_state")

    def __init__(self, state: CoreState, log: SessionLog, mark: LogMark) -> None:
        self._state = state
        self._log = log
        self._mark = mark
        self._key: tuple[object, ...] | None = None

    @property
    def log_length(self) -> int:
        """How many events of the log the snapshot includes."""
        return self._mark.length

    @property
    def status(self) -> str:
        """The read-only state of the core at the snapshot (P10)."""
        return self._state.status

    @property
    def pending_queued(self) -> int:
        return self._state.pending_queued

    @property
    def pending_steering(self) -> int:
        return self._state.pending_steering

    @property
    def pending_context(self) -> int:
        return self._state.pending_context

    def key(self, *, symmetric: bool = False) -> tuple[object, ...]:
        """A canonical value of the state and its log (see the class docstring); equal keys
        mean equal futures. O(state + log)."""
        if symmetric:
            ids: dict[str, str] = {}
            return (state_parts(self._state, ids), log_parts(self._log, self._mark, ids),
                    self._mark.rules)
        if self._key is None:
            self._key = (state_parts(self._state), log_parts(self._log, self._mark),
                         self._mark.rules)
        return self._key

    # -- a value: copying gives it back, pickling stores it (R4.12) ------------------

    def __copy__(self) -> CoreSnapshot:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> CoreSnapshot:
        return self

    def __reduce__(self) -> tuple[Callable[[bytes], CoreSnapshot], tuple[bytes]]:
        """Pickled as a checkpoint (R4.12): the state, and the log as a fork at the
        snapshot's position (its events, clock and extension rules, no observers), pickled
        at once so that a part that cannot be (a lambda as the clock, the id minting or a
        rule) is a `NotPicklableError` naming it, not the pickler's error about a lambda."""
        state = {name: value for name, value in vars(self._state).items() if name != "log"}
        log = self._log.fork(self._mark)
        try:
            data = pickle.dumps((state, log), pickle.HIGHEST_PROTOCOL)
        except Exception as error:
            raise NotPicklableError(
                f"a snapshot cannot be pickled: {_unpicklable_part(state, log)} cannot be "
                f"({type(error).__name__}: {error}); give the core module-level functions as "
                "its clock, mint_id and log rules, or keep the session in a store "
                "(machine.store) and resume it instead") from error
        return _unpickled_snapshot, (data,)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CoreSnapshot):
            return NotImplemented
        return self is other or self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        return (f"CoreSnapshot(status={self.status!r}, log_length={self.log_length}, "
                f"pending_queued={self.pending_queued})")


def _unpicklable_part(state: dict[str, object], log: SessionLog) -> str:
    """Which part of a snapshot being pickled cannot be pickled, in words."""
    parts: list[tuple[str, object]] = [("the log's clock", log._clock),
                                       ("the id minting (mint_id)", state.get("_mint"))]
    parts += [(f"the log rule of {event_type!r}", check) for event_type, check in log._rules.items()]
    parts += [(f"the core's {name}", value) for name, value in state.items()]
    parts.append(("the log", log))
    for where, value in parts:
        try:
            pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        except Exception:
            return f"{where} ({shown(value)})"
    return "a part of it"


def _unpickled_snapshot(data: bytes) -> CoreSnapshot:
    """A snapshot from what `CoreSnapshot.__reduce__` pickled."""
    state, log = pickle.loads(data)
    if not isinstance(state, dict):
        raise TypeError(f"a pickled snapshot holds a {shown(state)}, not a core's state")
    core = CoreState.__new__(CoreState)
    vars(core).update(state)
    core.log = log
    return CoreSnapshot(core, log, log.mark())
