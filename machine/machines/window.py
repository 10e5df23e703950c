"""The next-step acceptance window (spec R4.3, R5.2–R5.6, R12.1).

Theory of operation. The window decides routing: while it is open, next-step
input is staged in the outbox and reaches the next request; while it is
closed, steering is queued as a prompt and context is appended at once.
It opens at claim time (before ``running`` and before prompt admission), stays
open across an allowed admission into its turn, and closes when an admission
ends without a turn or before ``turn/end`` is appended. A retry run opens it
from closed. ``accepts_next_step`` reads it.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

from machine.machines.table import Row, compile_table, declared_machine, step

#: The window's triggers, as a type: mypy refuses a trigger the table does not declare
#: (tests/test_machines.py checks it names exactly the declared ones).
Trigger: TypeAlias = Literal["claim", "start_run", "reject", "end_run"]

NAME: Final = "window"
STATES: Final = ("closed", "admission", "turn")
INITIAL: Final = "closed"
ROWS: Final = (
    Row("claim", "closed", "admission"),      # R4.3 / R7.3
    Row("start_run", "admission", "turn"),    # R8.1 after an allowed admission
    Row("start_run", "closed", "turn"),       # R8.1 for a retry run (R13.3)
    Row("reject", "admission", "closed"),     # R7.10 step 1
    Row("end_run", "turn", "closed"),         # R8.7, before turn/end
)


def declared() -> object:
    return declared_machine(NAME, STATES, ROWS, INITIAL)


TABLE: Final = compile_table(declared())


class Window:
    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state: str = INITIAL

    def copy(self) -> Window:
        """An independent window in the same state (R4.12)."""
        copied = Window.__new__(Window)
        copied.state = self.state
        return copied

    def fire(self, trigger: Trigger) -> None:
        self.state = step(TABLE, NAME, self.state, trigger)

    @property
    def is_open(self) -> bool:
        return self.state != "closed"
