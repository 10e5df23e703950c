"""Session stores: where the runtime persists the durable log (specs/runtime.md RT12).

The runtime appends every durable event to the store as it delivers it
(``append``, synchronous, in ``seq`` order), and the post-turn flush barrier
awaits ``flush()``: when it returns, everything appended so far must be
durable. A raising ``flush`` is reported by the core (``agent/warning`` and
``agent/error``) and the agent carries on (reference §12.4).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Protocol

from machine.events import Event

__all__ = ["InMemorySessionStore", "JsonlSessionStore", "SessionStore"]


class SessionStore(Protocol):
    def append(self, event: Event) -> None: ...

    async def flush(self) -> None: ...


class InMemorySessionStore:
    """The default store: keeps the events; ``durable`` is the prefix made durable by a flush."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.flushes = 0
        self._durable = 0

    def append(self, event: Event) -> None:
        self.events.append(event)

    async def flush(self) -> None:
        self.flushes += 1
        self._durable = len(self.events)

    @property
    def durable(self) -> list[Event]:
        return self.events[:self._durable]


class JsonlSessionStore:
    """Appends one JSON event per line to *path*; ``flush`` writes the pending lines and
    fsyncs (in a worker thread). The file is readable by ``turnstile log validate``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._pending: list[str] = []

    def append(self, event: Event) -> None:
        self._pending.append(json.dumps(event.to_json(), ensure_ascii=False,
                                        separators=(",", ":")) + "\n")

    async def flush(self) -> None:
        lines, self._pending = self._pending, []
        if not lines:
            return
        try:
            await asyncio.to_thread(self._write, "".join(lines))
        except BaseException:
            self._pending[:0] = lines        # not durable: retried by the next flush
            raise

    def _write(self, text: str) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
