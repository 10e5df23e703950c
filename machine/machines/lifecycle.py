"""Turn lifecycle: where the loop is, from idle through admission, steps and flush (spec R6–R15).

Theory of operation. One running interval (``busy``) spans every state but
``idle`` and ``wake_pending``. A waking send from idle requests the wake
(``wake_pending``); the wake claims the head of the inbox (``admitting``).
An allowed admission starts a run (``run_start``: turn/start and the run-start
drains); each step passes through its phases (step hook, assembly,
request, streaming, tools, end of step); a completed step either continues,
or goes to turn-stopping; a request failure goes to ``recovering``. Any
failure or abort, and the normal end, go to ``closing`` (turn/end), then
``flushing`` (the post-turn barrier). After the flush a pending retry starts
a new run; otherwise the interval settles and continue-or-idle claims the next
waking item or goes idle. A rejected admission goes to ``rejected_tail``
(its context append and one tick) and then continue-or-idle (D1).
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

from machine.machines.table import Row, compile_table, declared_machine, step

#: The lifecycle's triggers, as a type: mypy refuses a trigger the table does not declare
#: (tests/test_machines.py checks it names exactly the declared ones).
Trigger: TypeAlias = Literal["request_wake", "wake_empty", "claim", "admit", "reject",
                             "begin_step", "assemble", "request", "stream", "run_tools",
                             "end_step", "request_failed", "stop_turn", "close", "flush",
                             "retry", "go_idle"]

NAME: Final = "lifecycle"
IN_TURN: Final = ("run_start", "step_hook", "assembly", "requesting", "streaming", "tools",
                  "end_of_step", "turn_stopping", "recovering")
STATES: Final = ("idle", "wake_pending", "admitting", "rejected_tail", *IN_TURN, "closing",
                 "flushing")
INITIAL: Final = "idle"
ROWS: Final = (
    Row("request_wake", "idle", "wake_pending"),       # R6.1
    Row("wake_empty", "wake_pending", "idle"),         # R6.2: nothing to claim
    Row("claim", "wake_pending", "admitting"),         # R6.2 -> R7
    Row("claim", "flushing", "admitting"),             # R12.7 continue after a turn
    Row("claim", "rejected_tail", "admitting"),        # R12.7 continue after a rejection
    Row("admit", "admitting", "run_start"),            # R7.9
    Row("reject", "admitting", "rejected_tail"),       # R7.10
    Row("begin_step", "run_start", "step_hook"),       # R8.4
    Row("begin_step", "end_of_step", "step_hook"),     # R8.4 continuation
    Row("begin_step", "turn_stopping", "step_hook"),   # R8.5 steering drained
    Row("assemble", "step_hook", "assembly"),          # R9.3
    Row("request", "assembly", "requesting"),          # R9.5-R9.6
    Row("stream", "requesting", "streaming"),          # R9.7
    Row("run_tools", "streaming", "tools"),            # R9.9
    Row("end_step", "streaming", "end_of_step"),       # R9.10 (no tool calls)
    Row("end_step", "tools", "end_of_step"),           # R9.10
    Row("request_failed", "streaming", "recovering"),  # R13.2
    Row("stop_turn", "end_of_step", "turn_stopping"),  # R8.5
    *(Row("close", state, "closing") for state in IN_TURN),  # R8.6-R8.7
    Row("flush", "closing", "flushing"),               # R12.4
    Row("retry", "flushing", "run_start"),             # R12.5 / R13.3
    Row("go_idle", "flushing", "idle"),                # R12.7
    Row("go_idle", "rejected_tail", "idle"),           # R12.7
)


def declared() -> object:
    return declared_machine(NAME, STATES, ROWS, INITIAL)


TABLE: Final = compile_table(declared())


class Lifecycle:
    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state: str = INITIAL

    def copy(self) -> Lifecycle:
        """An independent lifecycle in the same state (R4.12)."""
        copied = Lifecycle.__new__(Lifecycle)
        copied.state = self.state
        return copied

    def fire(self, trigger: Trigger) -> None:
        self.state = step(TABLE, NAME, self.state, trigger)

    @property
    def busy(self) -> bool:
        """R4.2: true for the whole running interval."""
        return self.state not in ("idle", "wake_pending")

    @property
    def in_turn(self) -> bool:
        return self.state in IN_TURN
