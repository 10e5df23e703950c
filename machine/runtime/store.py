"""Session stores: where the runtime persists the durable log (specs/runtime.md RT12).

The runtime appends every durable event to the store as it delivers it
(``append``, synchronous, in ``seq`` order), and the post-turn flush barrier
awaits ``flush()``: when it returns, everything appended so far must be
durable. A raising ``flush`` is reported by the core (``agent/warning`` and
``agent/error``) and the agent carries on (reference §12.4).

`InMemorySessionStore` is the default; `PersistentSession` writes into a
session of a `machine.store` backend (crash-safe JSONL or SQLite).
"""

from __future__ import annotations

from typing import Protocol

from machine.events import Event, EventRecord, event_from_record, event_record
from machine.store.types import SessionStore as StoreBackend

__all__ = ["InMemorySessionStore", "PersistentSession", "SessionStore"]


class SessionStore(Protocol):
    def append(self, event: Event) -> None: ...

    async def flush(self) -> None: ...


class InMemorySessionStore:
    """The default store: keeps the events; ``durable`` is the prefix made durable by a flush.

    Events are kept in compact form (`machine.events.EventRecord`, as the session log keeps
    them), so a long session costs the garbage collector nothing per event; ``events`` and
    ``durable`` give back equal `Event` objects."""

    def __init__(self) -> None:
        self._records: list[EventRecord] = []
        self.flushes = 0
        self._durable = 0

    def append(self, event: Event) -> None:
        self._records.append(event_record(event))

    async def flush(self) -> None:
        self.flushes += 1
        self._durable = len(self._records)

    def __len__(self) -> int:
        return len(self._records)

    @property
    def events(self) -> list[Event]:
        """Every appended event, in order (a new list)."""
        return [event_from_record(record) for record in self._records]

    @property
    def durable(self) -> list[Event]:
        """The events appended before the last flush (a new list)."""
        return [event_from_record(record) for record in self._records[:self._durable]]


class PersistentSession:
    """Persists into one open session of a `machine.store` backend (`JsonlStore`,
    `SqliteStore`; specs/persistence.md): ``append`` writes the event, ``flush`` makes the
    session durable. An append the backend refused makes the next flush raise, so the core
    reports the turn's flush as failed."""

    def __init__(self, store: StoreBackend, session_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self._failure: Exception | None = None

    def append(self, event: Event) -> None:
        try:
            self.store.append(self.session_id, event)
        except Exception as exc:
            self._failure = self._failure or exc
            raise

    async def flush(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise RuntimeError(f"an append was refused: {failure}") from failure
        self.store.flush(self.session_id)
