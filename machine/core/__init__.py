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
from machine.core.state import CoreState
from machine.core.tools import ABD_RESULT, normalized, plan_arguments, raised_result
from machine.log import SessionLog

__all__ = ["ABD_ERROR", "ABD_RESULT", "ABD_TEXT", "ABORTED", "ABORTED_ERROR", "ABORTED_TEXT",
           "COMPLETED", "DISPOSED", "LOOP_TYPES", "MAX_TOKENS", "NO_ROUTE_MESSAGE", "AgentCore",
           "CoreConfig", "CoreState", "ToolMode", "frozen_json", "frozen_message", "normalized",
           "plan_arguments", "raised_result"]


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
