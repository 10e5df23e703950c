"""Session sinks: where the runtime persists the durable log (specs/runtime.md RT12).

A *sink* is what an `Agent` writes its session into. The runtime appends every
durable event to it as it delivers the event (``append``, synchronous, in
``seq`` order), and the post-turn flush barrier calls ``flush()`` — awaiting
what it returns when that is awaitable (an ``async def flush``): when it has
returned, everything appended so far must be durable. A raising ``flush`` is
reported by the core (``agent/warning`` and ``agent/error``) and the agent
carries on (reference §12.4). A sink may also have ``close()``, called once
after the agent's teardown.

A sink is not a *store*: `machine.store.SessionStore` (`JsonlStore`,
`SqliteStore`) holds many sessions and loads, repairs and forks them;
`PersistentSession` is the sink that writes one open session of a store.

* `InMemorySink` is the default: it keeps the events in memory;
* `PersistentSession(store, session_id)` writes into an open session of a
  `machine.store` backend (crash-safe JSONL or SQLite); `Agent.resume` builds
  one for you.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from machine.events import Event, EventRecord, event_from_record, event_record
from machine.store.types import SessionStore

__all__ = ["InMemorySink", "PersistentSession", "SessionSink"]


class SessionSink(Protocol):
    """Where an agent persists its session (see the module docstring).

    ``flush`` is synchronous (returns ``None``), like ``append``, or asynchronous (returns
    an awaitable, as ``async def flush`` does): a synchronous flush runs when the flush
    effect is delivered, an asynchronous one in a task."""

    def append(self, event: Event) -> None: ...

    def flush(self) -> Awaitable[None] | None: ...


class InMemorySink:
    """The default sink: keeps the events; ``durable`` is the prefix made durable by a flush.

    Events are kept in compact form (`machine.events.EventRecord`, as the session log keeps
    them), so a long session costs the garbage collector nothing per event; ``events`` and
    ``durable`` give back equal `Event` objects."""

    def __init__(self) -> None:
        self._records: list[EventRecord] = []
        self.flushes = 0
        self._durable = 0

    def append(self, event: Event) -> None:
        self._records.append(event_record(event))

    def flush(self) -> None:
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
    reports the turn's flush as failed.

    With *release* true (as `Agent.resume` makes it), ``close()`` — called by the agent after
    its teardown — releases the session in the store (S7: flushed, no longer live), so it can
    be loaded again; otherwise the session stays open and the caller releases it."""

    def __init__(self, store: SessionStore, session_id: str, *, release: bool = False) -> None:
        self.store = store
        self.session_id = session_id
        self.release = release
        self._failure: Exception | None = None

    def append(self, event: Event) -> None:
        try:
            self.store.append(self.session_id, event)
        except Exception as exc:
            self._failure = self._failure or exc
            raise

    def flush(self) -> None:
        """Make the session durable (the store's synchronous flush, S6)."""
        failure, self._failure = self._failure, None
        if failure is not None:
            raise RuntimeError(f"an append was refused: {failure}") from failure
        self.store.flush(self.session_id)

    def close(self) -> None:
        """Release the session in the store if this sink owns it (*release*)."""
        if self.release:
            self.store.release(self.session_id)
