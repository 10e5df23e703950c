"""Inbox: the FIFO of queued prompts with their wakeup flags (spec R4.1, R5.3–R5.7, R7.1–R7.2).

Theory of operation. ``send`` places an item here when its placement is
``queued`` (next-turn sends, and next-step sends while the window is closed).
The machine's state is coarse: whether the FIFO is empty, holds only quiet
items, or holds at least one waking item, which is what the lifecycle asks
("may I claim?"). Claims are strictly FIFO: the head is claimed even when it is
quiet, as long as some waking item is queued (R5.7). A cancel discards all.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from machine.machines.table import Row, compile_table, declared_machine, step
from machine.vocabulary import Message

NAME: Final = "inbox"
STATES: Final = ("empty", "quiet", "waking")
INITIAL: Final = "empty"
ROWS: Final = (
    Row("enqueue_quiet", "empty", "quiet"),
    Row("enqueue_quiet", "quiet", "quiet"),
    Row("enqueue_quiet", "waking", "waking"),
    Row("enqueue_waking", "empty", "waking"),
    Row("enqueue_waking", "quiet", "waking"),
    Row("enqueue_waking", "waking", "waking"),
    # R7.1: a claim needs a waking item; R7.2: it shifts the head, quiet or not.
    Row("claim", "waking", "empty", guards=("rest_empty",)),
    Row("claim", "waking", "waking", guards=("rest_has_waking",)),
    Row("claim", "waking", "quiet"),
    # R16.2: a cancel without keepInbox takes everything.
    Row("discard", "empty", "empty"),
    Row("discard", "quiet", "empty"),
    Row("discard", "waking", "empty"),
)


def declared() -> object:
    return declared_machine(NAME, STATES, ROWS, INITIAL)


TABLE: Final = compile_table(declared())


class Inbox:
    """The queued FIFO. O(1) per operation."""

    __slots__ = ("_items", "_waking", "state")

    def __init__(self) -> None:
        self.state: str = INITIAL
        self._items: deque[tuple[Message, bool]] = deque()
        self._waking = 0

    def copy(self) -> Inbox:
        """An independent inbox in the same state with the same items (R4.12). O(items)."""
        copied = Inbox.__new__(Inbox)
        copied.state, copied._items, copied._waking = self.state, self._items.copy(), self._waking
        return copied

    def enqueue(self, message: Message, wakeup: bool) -> None:
        self.state = step(TABLE, NAME, self.state, "enqueue_waking" if wakeup else "enqueue_quiet")
        self._items.append((message, wakeup))
        self._waking += wakeup

    def claim(self) -> tuple[Message, bool]:
        """Shift the head (R7.2). Only legal while a waking item is queued."""
        head = self._items[0] if self._items else None
        rest_waking = self._waking - (1 if head is not None and head[1] else 0)
        self.state = step(TABLE, NAME, self.state, "claim", {
            "rest_empty": len(self._items) <= 1, "rest_has_waking": rest_waking > 0})
        message, wakeup = self._items.popleft()
        self._waking -= wakeup
        return message, wakeup

    def discard(self) -> list[Message]:
        """Empty the FIFO and return what it held, in FIFO order (R16.2)."""
        self.state = step(TABLE, NAME, self.state, "discard")
        taken = [message for message, _ in self._items]
        self._items.clear()
        self._waking = 0
        return taken

    @property
    def has_waking(self) -> bool:
        return self._waking > 0

    def __len__(self) -> int:
        return len(self._items)

    def snapshot(self) -> tuple[tuple[str, bool], ...]:
        """(message id, wakeup) per item, FIFO order: for state keys and tests."""
        return tuple((m.id, w) for m, w in self._items)
