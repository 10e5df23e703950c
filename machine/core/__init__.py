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

The loop itself is state: a stack of frames (``_frames``, one record per
activity in progress: interval, claim, run, steps, step, tool batch, ...), each
naming its phase; advancing the loop runs the top frame's phase, which gives
an output, waits for completions, starts a sub-activity or ends its own
(`machine.core.records.Frame`). So a core copies and compares as a value
(`snapshot`, `restore`, `copy`: R4.12). The loop advances only when every queued output has been pulled,
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

Where each concern lives
------------------------
The core is one class built in layers, each a module owning its rules, each layer
building on the one before it:

* `machine.core.state`: the whole state and the couplings of its machines (R4);
* `machine.core.outputs`: pulling outputs, effects, completions, mail (P1-P10);
* `machine.core.commands`: routing, wake requests, cancel, dispose, appends, the
  stop of P16 (R5, R6.1, R16, R17, P3);
* `machine.core.drains`: the outbox drains (R11);
* `machine.core.failures`: classification and closing of a failed turn (R8.6, R15);
* `machine.core.tools`: the tool batch (R10);
* `machine.core.step`: one step and the model stream (R9, R13.2, R14, P12, P13);
* `machine.core.run`: runs, turn-stopping, flush, settlement, retry (R8, R12, R13);
* `machine.core.admission`: the wake, claims, admissions, continue-or-idle (R6.2,
  R7, R12.7);
* this module: `AgentCore`, the public face: construction, publication and the
  read-only state (P10, P11).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

from machine import events as ev
from machine.core.admission import Admission
from machine.core.config import CoreConfig, ToolMode
from machine.core.records import (
    ABD_ERROR,
    ABD_TEXT,
    ABORTED,
    ABORTED_ERROR,
    ABORTED_TEXT,
    COMPLETED,
    DISPOSED,
    LOOP_TYPES,
    MAX_TOKENS,
    NO_ROUTE_MESSAGE,
    frozen_json,
    frozen_message,
)
from machine.core.snapshot import duplicate_state, log_parts, state_parts
from machine.core.state import CoreState
from machine.core.tools import ABD_RESULT, normalized, plan_arguments, raised_result
from machine.errors import NotPicklableError
from machine.jsonvalue import shown
from machine.log import LogMark, SessionLog

__all__ = ["ABD_ERROR", "ABD_RESULT", "ABD_TEXT", "ABORTED", "ABORTED_ERROR", "ABORTED_TEXT",
           "COMPLETED", "DISPOSED", "LOOP_TYPES", "MAX_TOKENS", "NO_ROUTE_MESSAGE", "AgentCore",
           "CoreConfig", "CoreSnapshot", "CoreState", "ToolMode", "frozen_json",
           "frozen_message", "normalized", "plan_arguments", "raised_result"]


class AgentCore(Admission):
    """The deterministic sans-I/O agent core. See the module docstring."""

    def __init__(self, config: CoreConfig | None = None, *, log: SessionLog | None = None,
                 clock: Callable[[], float] | None = None,
                 mint_id: Callable[[str, int], str] | None = None) -> None:
        super().__init__(config, log=log, clock=clock, mint_id=mint_id)
        if self.config.publish:
            self._emit_live(ev.SESSION_CREATED)
            self._emit_live(ev.AGENT_CREATED, status="idle")
            self._emit_live(ev.SESSION_START, source=self.config.session_start)

    # ------------------------------------------------------------------
    # Snapshots (rule R4.12)
    # ------------------------------------------------------------------

    def snapshot(self) -> CoreSnapshot:
        """The core's whole state now, as an immutable value (R4.12): its machines, queues,
        outstanding effects, buffered completions, queued outputs and the loop's position,
        with the session log by position. O(state); the log is not copied. Take it between
        outputs (any time the caller holds control)."""
        state = AgentCore.__new__(type(self))
        duplicate_state(self, state, self.log)
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
        core = AgentCore.__new__(type(snapshot._state))
        duplicate_state(snapshot._state, core, snapshot._log.fork(snapshot._mark))
        return core

    def copy(self) -> AgentCore:
        """An independent core in this core's state (`restore` of a `snapshot`, in one copy)."""
        core = AgentCore.__new__(type(self))
        duplicate_state(self, core, self.log.fork())
        return core


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

    def __init__(self, state: AgentCore, log: SessionLog, mark: LogMark) -> None:
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
            data = pickle.dumps((type(self._state), state, log), pickle.HIGHEST_PROTOCOL)
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
    kind, state, log = pickle.loads(data)
    if not (isinstance(kind, type) and issubclass(kind, AgentCore)):
        raise TypeError(f"a pickled snapshot holds a {shown(kind)}, not a core's class")
    core = kind.__new__(kind)
    vars(core).update(state)
    core.log = log
    return CoreSnapshot(core, log, log.mark())
