"""The core's state, in one place (specs/core.md R4), and how its machines couple.

Theory of operation
-------------------
Everything the core's future depends on is an attribute of `CoreState`; the layers
above it (outputs, commands, drains, failures, tools, step, run, admission) only
read and change these attributes, and no other object holds core state. The loop's
position is state too: ``_frames``, a stack of records (`machine.core.records.Frame`),
one per activity in progress, each naming its phase and holding what the activity has
gathered (R4.10). So the whole state copies and compares as data (`AgentCore.snapshot`,
`restore`, R4.12; `machine.core.snapshot`).

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
  output pulled, into which commands issued at that position are swept (P7, D9).
* **Effects and mail** (``_effects``, ``_next_effect``, ``_mail``, ``_wait``): requested
  effects still outstanding, the next id (ids are issued in order from 0, so an issued id
  neither outstanding nor abandoned is completed, P10), completions buffered until the
  loop takes them (P4-P6), and what the loop waits for.
* **The loop** (``_frames``): the activities in progress, outermost first (R4.10): a
  running interval, the claim of a prompt, a run, its steps, one step (with its model
  stream and fold), a tool batch and its calls' starts and commits, drains, a failed
  turn's closing and classification, a rejected admission and its tick. Each frame's
  ``phase`` is the function that runs when the loop next advances it.
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
from collections.abc import Callable
from typing import Literal

from machine.core.config import CoreConfig
from machine.core.records import (
    COMPLETED,
    SETTLED_COMPLETED,
    Frame,
    _Controller,
    _EffectRecord,
    _Mail,
    _Queued,
    _Retro,
)
from machine.io import Effect
from machine.jsonvalue import FrozenDict
from machine.log import SessionLog
from machine.machines import Inbox, Lifecycle, Outbox, Window
from machine.machines.lifecycle import IN_TURN
from machine.vocabulary import CancelCause, ErrorInfo, SettleReason, TurnEndReason

#: R4.11 (2): the lifecycle states in which an abort owner exists.
OWNED = frozenset({"admitting", *IN_TURN, "closing"})
#: R4.11 (4): the lifecycle states in which a retry may be pending.
RETRY_STATES = frozenset({"recovering", "closing", "flushing"})


def default_mint_id(kind: str, seq: int) -> str:
    """The id a core given no `mint_id` mints (P12) for a message of *kind* at log position
    *seq*: ``{kind}-{seq}`` (a module function, not a lambda, so that a snapshot pickles,
    R4.12)."""
    return f"{kind}-{seq}"


class CoreState:
    """The core's whole state (see the module docstring); `AgentCore` is built on it."""

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
        self._out: deque[_Queued] = deque()
        self._retro: _Retro | None = None
        self._frames: list[Frame] = []    # the loop: its activities in progress (R4.10)
        self._wait: frozenset[int] | None = None
        self._effects: dict[int, _EffectRecord] = {}
        self._mail: deque[_Mail] = deque()
        self._next_effect = 0
        # Abort owner, wake request, pending retry.
        self._next_signal = 0
        self._wake_effect: int | None = None
        self._owner: _Controller | None = None
        self._ctrl: _Controller | None = None
        self._pending_retry = False
        self._prior_failures: list[FrozenDict] = []
        # Per-turn record and the header flag.
        self._turn = 0
        self._step = 0
        self._reason: TurnEndReason = COMPLETED        # V19: what turn/end will carry
        self._settle: SettleReason = SETTLED_COMPLETED  # V20: what agent/settled will carry
        self._header_logged = False
        # Disposal and stop.
        self._disposing = False
        self._disposed = False
        self._failure: ErrorInfo | None = None    # P16: why the core stopped, once it has
        self._abandoned: set[int] = set()         # P16: effects requested before it stopped

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
