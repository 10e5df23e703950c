"""Outbox: staged steering and context in one FIFO (spec R4.1, R11).

Theory of operation. While the acceptance window is open, next-step input is
staged here instead of being written: steering (``steer``) and context
(``inject``, tool-result contexts). Drain points of the lifecycle take items
from the front one at a time, so items staged by observers of a drain's own
outputs join the same drain (D3). The state records whether any steering is
staged, because the rejected-admission flush (R7.10) and cancel effectiveness
depend on it.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from machine.machines.table import Row, compile_table, declared_machine, step
from machine.vocabulary import Message

NAME: Final = "outbox"
STATES: Final = ("empty", "contexts", "steering")
INITIAL: Final = "empty"
ROWS: Final = (
    Row("stage_context", "empty", "contexts"),
    Row("stage_context", "contexts", "contexts"),
    Row("stage_context", "steering", "steering"),
    Row("stage_steering", "empty", "steering"),
    Row("stage_steering", "contexts", "steering"),
    Row("stage_steering", "steering", "steering"),
    # R11.1: a drain removes the front item.
    Row("take", "contexts", "empty", guards=("rest_empty",)),
    Row("take", "contexts", "contexts"),
    Row("take", "steering", "empty", guards=("rest_empty",)),
    Row("take", "steering", "steering", guards=("rest_has_steering",)),
    Row("take", "steering", "contexts"),
    # R16.2: a cancel empties it (the rejected-admission append of R7.10 takes items one by one).
    Row("clear", "empty", "empty"),
    Row("clear", "contexts", "empty"),
    Row("clear", "steering", "empty"),
)


def declared() -> object:
    return declared_machine(NAME, STATES, ROWS, INITIAL)


TABLE: Final = compile_table(declared())


class Outbox:
    """The staged FIFO of ``(message, is_steering)``. O(1) per operation."""

    __slots__ = ("_items", "_steering", "state")

    def __init__(self) -> None:
        self.state: str = INITIAL
        self._items: deque[tuple[Message, bool]] = deque()
        self._steering = 0

    def copy(self) -> Outbox:
        """An independent outbox in the same state with the same items (R4.12). O(items)."""
        copied = Outbox.__new__(Outbox)
        copied.state, copied._items = self.state, self._items.copy()
        copied._steering = self._steering
        return copied

    def stage(self, message: Message, steering: bool) -> None:
        self.state = step(TABLE, NAME, self.state, "stage_steering" if steering else "stage_context")
        self._items.append((message, steering))
        self._steering += steering

    def take(self) -> tuple[Message, bool]:
        """Remove the front item (R11.1 step 1)."""
        head = self._items[0] if self._items else None
        rest_steering = self._steering - (1 if head is not None and head[1] else 0)
        self.state = step(TABLE, NAME, self.state, "take", {
            "rest_empty": len(self._items) <= 1, "rest_has_steering": rest_steering > 0})
        message, steering = self._items.popleft()
        self._steering -= steering
        return message, steering

    @property
    def front(self) -> tuple[Message, bool]:
        """The front item, left in place (a drain takes it once it is written)."""
        return self._items[0]

    def clear(self) -> tuple[list[Message], list[Message]]:
        """Empty it; return (steering, contexts), each in FIFO order (R16.2)."""
        self.state = step(TABLE, NAME, self.state, "clear")
        steering = [m for m, s in self._items if s]
        contexts = [m for m, s in self._items if not s]
        self._items.clear()
        self._steering = 0
        return steering, contexts

    @property
    def has_steering(self) -> bool:
        return self._steering > 0

    @property
    def steering_count(self) -> int:
        return self._steering

    def __len__(self) -> int:
        return len(self._items)

    def snapshot(self) -> tuple[tuple[str, bool], ...]:
        """(message id, is_steering) per item, FIFO order: for state keys and tests."""
        return tuple((m.id, s) for m, s in self._items)
